/* DIWARP_* environment variables -> struct dw_config. See config.h and the
 * table in docs/USAGE.md (keep both in step). */
#include "util/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"

#define DW_MAX_MSG_PULL 2147483648ull /* the largest RD message */

void dw_config_defaults(struct dw_config *cfg)
{
        memset(cfg, 0, sizeof(*cfg));
        snprintf(cfg->addr, sizeof(cfg->addr), "%s", DW_CONFIG_DEFAULT_ADDR);
        cfg->port_base = DW_CONFIG_DEFAULT_PORT_BASE;
        cfg->log_level = DW_LOG_DEFAULT;
        cfg->progress_thread = true;
        cfg->io = DW_IO_PLAIN;
        cfg->rc_crc = true;
        cfg->rd_direct = true;
        cfg->rd_late_shared = true;
        cfg->rc_transport = DW_RC_TCP;
        cfg->peer_timeout_ms = DW_CONFIG_DEFAULT_PEER_TIMEOUT_MS;
        cfg->connect_timeout_ms = DW_CONFIG_DEFAULT_CONNECT_TIMEOUT_MS;
        cfg->fault_spec[0] = '\0';
        cfg->fault_seed = DW_CONFIG_DEFAULT_FAULT_SEED;
        cfg->udp_mtu = DW_CONFIG_DEFAULT_UDP_MTU;
        cfg->inflight_qp = DW_CONFIG_DEFAULT_INFLIGHT_QP;
        cfg->inflight_proc = DW_CONFIG_DEFAULT_INFLIGHT_PROC;
        cfg->inflight_host = DW_CONFIG_DEFAULT_INFLIGHT_HOST;
        cfg->inflight_shm[0] = '\0';
        cfg->cc = true;
        cfg->cc_pacing = true;
        cfg->cc_target_us = DW_CONFIG_DEFAULT_CC_TARGET_US;
        cfg->rd_crc = true;
        cfg->pull_min = DW_CONFIG_DEFAULT_PULL_MIN;
        cfg->pull_chunk = DW_CONFIG_DEFAULT_PULL_CHUNK;
        cfg->pull_depth = DW_CONFIG_DEFAULT_PULL_DEPTH;
        cfg->credit = DW_CREDIT_ON_STATIC;
        cfg->credit_slot = DW_CONFIG_DEFAULT_CREDIT_SLOT;
        cfg->credit_ring = DW_CONFIG_DEFAULT_CREDIT_RING;
        cfg->credit_peers = DW_CONFIG_DEFAULT_CREDIT_PEERS;
        cfg->rd_max_peers = DW_CONFIG_DEFAULT_RD_MAX_PEERS;
        cfg->rd_dev_peers = DW_CONFIG_DEFAULT_RD_DEV_PEERS;
        cfg->rd_idle_ms = DW_CONFIG_DEFAULT_RD_IDLE_MS;
        cfg->wait_spin_us = DW_CONFIG_DEFAULT_WAIT_SPIN_US;
        cfg->shared_nap_after = DW_CONFIG_DEFAULT_SHARED_NAP_AFTER;
        cfg->credit_cslots = DW_CONFIG_DEFAULT_CREDIT_CSLOTS;
        cfg->local_copy = -1;
        cfg->stripe_min = DW_CONFIG_DEFAULT_STRIPE_MIN;
}

int dw_config_parse_addrs(const char *s, struct in_addr *out, const char **why)
{
        int n = 0;
        const char *p = s;
        for (;;) {
                const char *end = strchr(p, ',');
                size_t len = end ? (size_t)(end - p) : strlen(p);
                char one[16];
                if (n == DW_CONFIG_MAX_RAILS) {
                        *why = "expected at most 4 addresses (rails)";
                        return -EINVAL;
                }
                if (len == 0 || len >= sizeof(one)) {
                        *why = "expected dotted IPv4 addresses separated by commas";
                        return -EINVAL;
                }
                memcpy(one, p, len);
                one[len] = '\0';
                if (inet_pton(AF_INET, one, &out[n]) != 1) {
                        *why = n ? "expected dotted IPv4 addresses separated by commas"
                                 : "expected a dotted IPv4 address";
                        return -EINVAL;
                }
                if (out[n].s_addr == htonl(INADDR_ANY)) {
                        *why = "0.0.0.0 cannot name a device (its GID is derived from it)";
                        return -EINVAL;
                }
                for (int i = 0; i < n; i++)
                        if (out[i].s_addr == out[n].s_addr) {
                                *why = "an address appears twice (each rail has its own)";
                                return -EINVAL;
                        }
                n++;
                if (!end)
                        return n;
                p = end + 1;
        }
}

/* Records "NAME='value': expectation" in cfg->why_buf. The value is cut short
 * so a huge variable cannot hide the variable name. */
static int bad(struct dw_config *cfg, const char *name, const char *value, const char *expect)
{
        snprintf(cfg->why_buf, sizeof(cfg->why_buf), "%s='%.64s'%s: %s", name, value,
                 strlen(value) > 64 ? "..." : "", expect);
        return -EINVAL;
}

/* DIWARP_AUTH=file:PATH: the key file holds 16 or 32 raw bytes, or 32 or 64
 * hex digits (a trailing newline and surrounding blanks allowed). It must be
 * a regular file that neither group nor others can read or write (a key
 * others can read is no secret). The key lands in cfg->auth_key. */
static int load_auth_key(struct dw_config *cfg, const char *v, const char *path)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
        if (fd < 0) {
                char e[96];
                snprintf(e, sizeof(e), "cannot open the key file: %s", strerror(errno));
                return bad(cfg, "DIWARP_AUTH", v, e);
        }
        struct stat st;
        uint8_t buf[130];
        ssize_t n = -1;
        const char *err = NULL;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                err = "the key file is not a regular file";
        else if (st.st_mode & (S_IRWXG | S_IRWXO))
                err = "the key file can be read or written by group or others (chmod 600 it)";
        else if ((n = read(fd, buf, sizeof(buf))) < 0)
                err = "cannot read the key file";
        close(fd);
        if (err)
                return bad(cfg, "DIWARP_AUTH", v, err);
        size_t len = (size_t)n;
        if (len == 16 || len == 32) {
                memcpy(cfg->auth_key, buf, len);
                cfg->auth_key_len = (uint8_t)len;
                memset(buf, 0, sizeof(buf));
                return 0;
        }
        /* Hex: blanks around it are not part of the key. */
        size_t a = 0, b = len;
        while (a < b && isspace(buf[a]))
                a++;
        while (b > a && isspace(buf[b - 1]))
                b--;
        size_t hex = b - a;
        bool ok = hex == 32 || hex == 64;
        for (size_t i = 0; ok && i < hex; i++)
                ok = isxdigit(buf[a + i]);
        if (!ok) {
                memset(buf, 0, sizeof(buf));
                return bad(cfg, "DIWARP_AUTH", v,
                           "the key file must hold 16 or 32 raw bytes, or 32 or 64 hex digits");
        }
        for (size_t i = 0; i < hex / 2; i++) {
                char two[3] = {(char)buf[a + 2 * i], (char)buf[a + 2 * i + 1], 0};
                cfg->auth_key[i] = (uint8_t)strtoul(two, NULL, 16);
        }
        cfg->auth_key_len = (uint8_t)(hex / 2);
        memset(buf, 0, sizeof(buf));
        return 0;
}

/* An unsigned number in base `base` (0: C prefixes) in [lo, hi]; no sign, no trailing junk. */
static bool parse_u64(const char *s, int base, uint64_t lo, uint64_t hi, uint64_t *out)
{
        char *end;
        unsigned long long v;

        if (!*s || *s == '-' || *s == '+' || *s == ' ')
                return false;
        errno = 0;
        v = strtoull(s, &end, base);
        if (errno || *end != '\0' || v < lo || v > hi)
                return false;
        *out = v;
        return true;
}

/* Picks one of names[]; returns the index or -1. */
static int parse_choice(const char *s, const char *const *names, int n)
{
        for (int i = 0; i < n; i++)
                if (strcasecmp(s, names[i]) == 0)
                        return i;
        return -1;
}

/* A POSIX shm name: one path component of portable characters, so it can
 * neither escape /dev/shm nor be "." or "..". */
static bool valid_shm_name(const char *s)
{
        size_t n;

        if (*s == '/')
                s++;
        n = strlen(s);
        if (n == 0 || n > DW_CONFIG_MAX_SHM_NAME || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
                return false;
        return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

struct env_view {
        const char *(*get)(void *ctx, const char *name);
        void *ctx;
};

/* Unset and empty both mean "use the default", as shells make them hard to tell apart. */
static const char *var(const struct env_view *env, const char *name)
{
        const char *v = env->get(env->ctx, name);

        return v && *v ? v : NULL;
}

/* One DIWARP_* variable: its name, the function that reads its value, and
 * what that function needs (the field of struct dw_config it sets, a
 * number's range, a choice's words and the values they stand for, and the
 * expectation an error names). parse_all reads the variables in table
 * order, so the first bad one is the one reported; an entry without a name
 * is a check across the settings above it. */
struct setting {
        const char *name;
        int (*parse)(struct dw_config *cfg, const struct setting *s, const char *v);
        size_t off, size; /* the field (SET_FIELD) */
        uint64_t lo, hi;  /* a number's range */
        const char *const *words;
        const uint8_t *values; /* words[i] stores values[i] */
        int nwords;
        const char *expect;
};

#define SET_FIELD(f)                                                                               \
        .off = offsetof(struct dw_config, f), .size = sizeof(((struct dw_config *)0)->f)
#define SET_WORDS(w, vals) .words = w, .values = vals, .nwords = (int)(sizeof(w) / sizeof(w[0]))

/* Stores v into the setting's field, whatever its width (bool, int8_t,
 * uint16_t, uint32_t, int or enum, uint64_t). */
static void store(struct dw_config *cfg, const struct setting *s, uint64_t v)
{
        char *field = (char *)cfg + s->off;
        uint8_t u8 = (uint8_t)v;
        uint16_t u16 = (uint16_t)v;
        uint32_t u32 = (uint32_t)v;

        switch (s->size) {
        case 1:
                memcpy(field, &u8, 1);
                break;
        case 2:
                memcpy(field, &u16, 2);
                break;
        case 4:
                memcpy(field, &u32, 4);
                break;
        default:
                memcpy(field, &v, sizeof(v));
                break;
        }
}

/* A decimal number in [lo, hi] into *u, or the setting's error. */
static int read_number(struct dw_config *cfg, const struct setting *s, const char *v, uint64_t *u)
{
        if (!parse_u64(v, 10, s->lo, s->hi, u))
                return bad(cfg, s->name, v, s->expect);
        return 0;
}

/* A decimal number in [lo, hi], stored as it is. */
static int set_number(struct dw_config *cfg, const struct setting *s, const char *v)
{
        uint64_t u;
        int rc = read_number(cfg, s, v, &u);

        if (!rc)
                store(cfg, s, u);
        return rc;
}

/* One of the setting's words (any case), stored as the value it stands for. */
static int set_choice(struct dw_config *cfg, const struct setting *s, const char *v)
{
        int i = parse_choice(v, s->words, s->nwords);

        if (i < 0)
                return bad(cfg, s->name, v, s->expect);
        store(cfg, s, s->values[i]);
        return 0;
}

static int set_addr(struct dw_config *cfg, const struct setting *s, const char *v)
{
        struct in_addr a[DW_CONFIG_MAX_RAILS];
        const char *why = NULL;

        if (strlen(v) >= sizeof(cfg->addr))
                return bad(cfg, s->name, v, "expected at most 4 dotted IPv4 addresses (rails)");
        if (dw_config_parse_addrs(v, a, &why) < 0)
                return bad(cfg, s->name, v, why);
        snprintf(cfg->addr, sizeof(cfg->addr), "%s", v);
        return 0;
}

static int set_log(struct dw_config *cfg, const struct setting *s, const char *v)
{
        int i = dw_log_level_parse(v);

        if (i < 0)
                return bad(cfg, s->name, v, "expected error, warn, info or debug");
        cfg->log_level = i;
        return 0;
}

static int set_inflight_shm(struct dw_config *cfg, const struct setting *s, const char *v)
{
        if (!valid_shm_name(v))
                return bad(cfg, s->name, v,
                           "expected a shm name of 1..100 characters A-Z a-z 0-9 . _ - "
                           "(one leading / allowed)");
        snprintf(cfg->inflight_shm, sizeof(cfg->inflight_shm), "/%s", v + (*v == '/'));
        return 0;
}

static int set_auth(struct dw_config *cfg, const struct setting *s, const char *v)
{
        cfg->auth_key_len = 0;
        cfg->auth_conn = false;
        if (strncmp(v, "file:", 5) == 0 && v[5]) {
                int e = load_auth_key(cfg, v, v + 5);
                if (e < 0)
                        return e;
                cfg->auth_conn = true;
        } else if (strcmp(v, "connection") == 0) {
                cfg->auth_conn = true;
        } else if (strcmp(v, "off") != 0) {
                return bad(cfg, s->name, v,
                           "expected off, connection, or file:PATH (a key file of 16 or "
                           "32 bytes, raw or hex)");
        }
        return 0;
}

/* The largest message itself cannot be pulled: the threshold is one below. */
static int set_pull_min(struct dw_config *cfg, const struct setting *s, const char *v)
{
        uint64_t u;
        int rc = read_number(cfg, s, v, &u);

        if (!rc)
                cfg->pull_min = (uint32_t)(u == DW_MAX_MSG_PULL ? u - 1 : u);
        return rc;
}

static int set_credit_slot(struct dw_config *cfg, const struct setting *s, const char *v)
{
        uint64_t u;
        int rc = read_number(cfg, s, v, &u);

        if (!rc && (u & (u - 1)))
                rc = bad(cfg, s->name, v, s->expect);
        if (!rc)
                cfg->credit_slot = (uint32_t)u;
        return rc;
}

/* Base 0: decimal, or 0x-prefixed hex as seeds are often printed. */
static int set_fault_seed(struct dw_config *cfg, const struct setting *s, const char *v)
{
        uint64_t u;

        if (!parse_u64(v, 0, 0, UINT64_MAX, &u))
                return bad(cfg, s->name, v,
                           "expected an unsigned 64-bit integer (decimal or 0x hex)");
        cfg->fault_seed = u;
        return 0;
}

static int set_fault(struct dw_config *cfg, const struct setting *s, const char *v)
{
        struct dw_fault_params p;
        char reason[160];

        if (strlen(v) >= sizeof(cfg->fault_spec))
                return bad(cfg, s->name, v, "spec longer than 255 characters");
        /* Validate now so a typo fails at device open, not silently later. */
        if (dw_fault_parse(v, &p, reason, sizeof(reason)) < 0)
                return bad(cfg, s->name, v,
                           reason + (strncmp(reason, "DIWARP_FAULT: ", 14) ? 0 : 14));
        snprintf(cfg->fault_spec, sizeof(cfg->fault_spec), "%s", v);
        return 0;
}

/* The credit settings checked together, once each one has been read alone
 * (an entry of the table without a name: it runs whatever is set). */
static int check_credit(struct dw_config *cfg, const struct setting *s, const char *v)
{
        uint32_t floor = cfg->credit_min_quota ? cfg->credit_min_quota : cfg->credit_cslots;

        (void)s;
        (void)v;

        if (cfg->credit == DW_CREDIT_ON_DYNAMIC &&
            (uint64_t)floor * cfg->credit_peers > cfg->credit_ring) {
                snprintf(cfg->why_buf, sizeof(cfg->why_buf),
                         "DIWARP_CREDIT_RING=%u is smaller than DIWARP_CREDIT_PEERS=%u times the "
                         "floor of %u slots (DIWARP_CREDIT_MIN_QUOTA, else DIWARP_CREDIT_CSLOTS): "
                         "the dynamic protocol never lends a sender's floor",
                         cfg->credit_ring, cfg->credit_peers, floor);
                return -EINVAL;
        }
        if (cfg->credit != DW_CREDIT_OFF && cfg->credit_ring < cfg->credit_peers) {
                snprintf(cfg->why_buf, sizeof(cfg->why_buf),
                         "DIWARP_CREDIT_RING=%u is smaller than DIWARP_CREDIT_PEERS=%u: the "
                         "static protocol gives every sender at least one slot",
                         cfg->credit_ring, cfg->credit_peers);
                return -EINVAL;
        }
        return 0;
}

static const char *const zero_one[] = {"0", "1"};
static const uint8_t zero_one_v[] = {0, 1};
/* daemon: client mode (client/), decided before any engine device opens; an
 * engine that reads it is the daemon's own. */
static const char *const progress_w[] = {"app", "thread", "daemon"};
static const uint8_t progress_v[] = {0, 1, 0};
static const char *const io_w[] = {"plain", "uring"};
static const uint8_t io_v[] = {DW_IO_PLAIN, DW_IO_URING};
static const char *const rc_transport_w[] = {"tcp", "rd"};
static const uint8_t rc_transport_v[] = {DW_RC_TCP, DW_RC_RD};
static const char *const cc_w[] = {"off", "on", "0", "1"};
static const uint8_t cc_v[] = {0, 1, 0, 1};
static const char *const credit_w[] = {"off", "static", "dynamic"};
static const uint8_t credit_v[] = {DW_CREDIT_OFF, DW_CREDIT_ON_STATIC, DW_CREDIT_ON_DYNAMIC};
static const char *const credit_rc_w[] = {"rnr", "park"};
static const char *const late_w[] = {"stream", "device"};

#define INFLIGHT_EXPECT "expected messages 0..1000000 (0 = no cap)"

/* The table's entries, by the function that reads them: */
#define NUMBER(var, f, min, max, why)                                                              \
        {                                                                                          \
                .name = var, .parse = set_number, SET_FIELD(f), .lo = min, .hi = max,              \
                .expect = why                                                                      \
        }
#define CHOICE(var, f, w, vals, why)                                                               \
        {                                                                                          \
                .name = var, .parse = set_choice, SET_FIELD(f), SET_WORDS(w, vals), .expect = why  \
        }
#define CUSTOM(var, fn, min, max, why)                                                             \
        {                                                                                          \
                .name = var, .parse = fn, .lo = min, .hi = max, .expect = why                      \
        }
#define CHECK(fn)                                                                                  \
        {                                                                                          \
                .parse = fn                                                                        \
        }

static const struct setting settings[] = {
    CUSTOM("DIWARP_ADDR", set_addr, 0, 0, NULL),
    NUMBER("DIWARP_STRIPE_MIN", stripe_min, 0, DW_MAX_MSG_PULL,
           "expected bytes 0..2147483648 (0: never stripe)"),
    NUMBER("DIWARP_PORT_BASE", port_base, 1, 65535, "expected a port 1..65535"),
    CUSTOM("DIWARP_LOG", set_log, 0, 0, NULL),
    CHOICE("DIWARP_PROGRESS", progress_thread, progress_w, progress_v,
           "expected app, thread or daemon"),
    NUMBER("DIWARP_WAIT_SPIN_US", wait_spin_us, 0, DW_CONFIG_MAX_WAIT_SPIN_US,
           "expected microseconds 0..10000 (0: never spin)"),
    NUMBER("DIWARP_SHARED_NAP_AFTER", shared_nap_after, 0, DW_CONFIG_MAX_SHARED_NAP_AFTER,
           "expected a count 0..64 (0: nap at the first empty poll)"),
    CHOICE("DIWARP_IO", io, io_w, io_v, "expected plain or uring"),
    CHOICE("DIWARP_RC_CRC", rc_crc, zero_one, zero_one_v, "expected 0 or 1"),
    NUMBER("DIWARP_RC_FPDU", rc_fpdu, 0, 65535,
           "expected bytes 0..65535 (0: an FPDU fills one TCP segment)"),
    CHOICE("DIWARP_RD_DIRECT", rd_direct, zero_one, zero_one_v, "expected 0 or 1"),
    CHOICE("DIWARP_RD_LATE_ACKS", rd_late_shared, late_w, zero_one_v, "expected device or stream"),
    CHOICE("DIWARP_RC_TRANSPORT", rc_transport, rc_transport_w, rc_transport_v,
           "expected tcp or rd"),
    NUMBER("DIWARP_PEER_TIMEOUT_MS", peer_timeout_ms, 1, DW_CONFIG_MAX_TIMEOUT_MS,
           "expected milliseconds 1..3600000"),
    NUMBER("DIWARP_CONNECT_TIMEOUT_MS", connect_timeout_ms, 1, DW_CONFIG_MAX_TIMEOUT_MS,
           "expected milliseconds 1..3600000"),
    NUMBER("DIWARP_UDP_MTU", udp_mtu, DW_CONFIG_MIN_UDP_MTU, DW_CONFIG_MAX_UDP_MTU,
           "expected bytes 512..65507"),
    /* In-flight caps in messages; 0 means no cap at that level. */
    NUMBER("DIWARP_INFLIGHT_QP", inflight_qp, 0, DW_CONFIG_MAX_INFLIGHT, INFLIGHT_EXPECT),
    NUMBER("DIWARP_INFLIGHT_PROC", inflight_proc, 0, DW_CONFIG_MAX_INFLIGHT, INFLIGHT_EXPECT),
    NUMBER("DIWARP_INFLIGHT_HOST", inflight_host, 0, DW_CONFIG_MAX_INFLIGHT, INFLIGHT_EXPECT),
    CUSTOM("DIWARP_INFLIGHT_SHM", set_inflight_shm, 0, 0, NULL),
    CHOICE("DIWARP_CC", cc, cc_w, cc_v, "expected on or off"),
    CHOICE("DIWARP_CC_PACING", cc_pacing, zero_one, zero_one_v, "expected 0 or 1"),
    NUMBER("DIWARP_CC_TARGET_US", cc_target_us, 1, DW_CONFIG_MAX_CC_TARGET_US,
           "expected microseconds 1..1000000"),
    CUSTOM("DIWARP_AUTH", set_auth, 0, 0, NULL),
    CHOICE("DIWARP_RD_CRC", rd_crc, zero_one, zero_one_v, "expected 0 or 1"),
    CUSTOM("DIWARP_RD_PULL_MIN", set_pull_min, 0, DW_MAX_MSG_PULL,
           "expected bytes 0..2147483648 (0: Sends are never pulled)"),
    NUMBER("DIWARP_RD_PULL_CHUNK", pull_chunk, DW_CONFIG_MIN_PULL_CHUNK, DW_CONFIG_MAX_PULL_CHUNK,
           "expected bytes 1024..67108864"),
    NUMBER("DIWARP_RD_PULL_DEPTH", pull_depth, 1, DW_CONFIG_MAX_PULL_DEPTH, "expected Reads 1..8"),
    CHOICE("DIWARP_CREDIT", credit, credit_w, credit_v, "expected static, dynamic or off"),
    CUSTOM("DIWARP_CREDIT_SLOT", set_credit_slot, 64, 65536,
           "expected bytes, a power of two 64..65536"),
    NUMBER("DIWARP_CREDIT_RING", credit_ring, 1, DW_CONFIG_MAX_CREDIT_RING,
           "expected slots 1..32767"),
    NUMBER("DIWARP_CREDIT_PEERS", credit_peers, 1, DW_CONFIG_MAX_CREDIT_RING,
           "expected senders 1..32767"),
    NUMBER("DIWARP_RD_MAX_PEERS", rd_max_peers, 1, DW_CONFIG_MAX_RD_PEERS,
           "expected streams 1..1000000"),
    NUMBER("DIWARP_RD_DEV_PEERS", rd_dev_peers, 1, DW_CONFIG_MAX_RD_PEERS,
           "expected streams 1..1000000"),
    NUMBER("DIWARP_RD_IDLE_MS", rd_idle_ms, DW_CONFIG_MIN_RD_IDLE_MS, DW_CONFIG_MAX_TIMEOUT_MS,
           "expected milliseconds 100..3600000"),
    NUMBER("DIWARP_CREDIT_CSLOTS", credit_cslots, 1, 64, "expected entries 1..64"),
    CHOICE("DIWARP_CREDIT_RC", credit_rc_park, credit_rc_w, zero_one_v, "expected rnr or park"),
    CHOICE("DIWARP_LOCAL_COPY", local_copy, zero_one, zero_one_v, "expected 0 or 1"),
    NUMBER("DIWARP_CREDIT_MIN_QUOTA", credit_min_quota, 0, DW_CONFIG_MAX_CREDIT_RING,
           "expected slots 0..32767 (0: DIWARP_CREDIT_CSLOTS)"),
    CHECK(check_credit),
    CUSTOM("DIWARP_FAULT_SEED", set_fault_seed, 0, 0, NULL),
    CUSTOM("DIWARP_FAULT", set_fault, 0, 0, NULL),
};

/* Every setting that is set, and the checks across settings, in table
 * order. */
static int parse_all(struct dw_config *cfg, const struct env_view *env)
{
        for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
                const struct setting *s = &settings[i];
                const char *v = s->name ? var(env, s->name) : NULL;
                int rc = v || !s->name ? s->parse(cfg, s, v) : 0;

                if (rc)
                        return rc;
        }
        return 0;
}

int dw_config_from_getenv(struct dw_config *cfg,
                          const char *(*getenv_fn)(void *ctx, const char *name), void *ctx,
                          const char **why)
{
        struct env_view env = {getenv_fn, ctx};
        char reason[sizeof(cfg->why_buf)];
        int rc;

        dw_config_defaults(cfg);
        rc = parse_all(cfg, &env);
        if (rc) {
                /* Leave defaults behind, not a half-applied environment. */
                memcpy(reason, cfg->why_buf, sizeof(reason));
                dw_config_defaults(cfg);
                memcpy(cfg->why_buf, reason, sizeof(reason));
                if (why)
                        *why = cfg->why_buf;
        }
        return rc;
}

static const char *process_getenv(void *ctx, const char *name)
{
        (void)ctx;
        return getenv(name);
}

int dw_config_from_env(struct dw_config *cfg, const char **why)
{
        return dw_config_from_getenv(cfg, process_getenv, NULL, why);
}
