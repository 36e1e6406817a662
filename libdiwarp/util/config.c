/* DIWARP_* environment variables -> struct dw_config. See config.h and the
 * table in docs/USAGE.md (keep both in step). */
#include "util/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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

/* Decimal unsigned in [lo, hi]; no sign, no trailing junk. */
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

/* An in-flight cap in messages; 0 means no cap at that level. */
static int parse_cap(struct dw_config *cfg, const struct env_view *env, const char *name,
                     uint32_t *out)
{
        const char *v = var(env, name);
        uint64_t u;

        if (!v)
                return 0;
        if (!parse_u64(v, 10, 0, DW_CONFIG_MAX_INFLIGHT, &u))
                return bad(cfg, name, v, "expected messages 0..1000000 (0 = no cap)");
        *out = (uint32_t)u;
        return 0;
}

static int parse_all(struct dw_config *cfg, const struct env_view *env)
{
        const char *v;
        uint64_t u;
        int i, rc;

        if ((v = var(env, "DIWARP_ADDR"))) {
                struct in_addr a[DW_CONFIG_MAX_RAILS];
                const char *why = NULL;

                if (strlen(v) >= sizeof(cfg->addr))
                        return bad(cfg, "DIWARP_ADDR", v,
                                   "expected at most 4 dotted IPv4 addresses (rails)");
                if (dw_config_parse_addrs(v, a, &why) < 0)
                        return bad(cfg, "DIWARP_ADDR", v, why);
                snprintf(cfg->addr, sizeof(cfg->addr), "%s", v);
        }
        if ((v = var(env, "DIWARP_STRIPE_MIN"))) {
                if (!parse_u64(v, 10, 0, DW_MAX_MSG_PULL, &u))
                        return bad(cfg, "DIWARP_STRIPE_MIN", v,
                                   "expected bytes 0..2147483648 (0: never stripe)");
                cfg->stripe_min = u > UINT32_MAX ? UINT32_MAX : (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_PORT_BASE"))) {
                if (!parse_u64(v, 10, 1, 65535, &u))
                        return bad(cfg, "DIWARP_PORT_BASE", v, "expected a port 1..65535");
                cfg->port_base = (uint16_t)u;
        }
        if ((v = var(env, "DIWARP_LOG"))) {
                i = dw_log_level_parse(v);
                if (i < 0)
                        return bad(cfg, "DIWARP_LOG", v, "expected error, warn, info or debug");
                cfg->log_level = i;
        }
        if ((v = var(env, "DIWARP_PROGRESS"))) {
                /* daemon: client mode (client/), decided before any engine
                 * device opens; an engine that reads it is the daemon's own. */
                static const char *const names[] = {"app", "thread", "daemon"};

                i = parse_choice(v, names, 3);
                if (i < 0)
                        return bad(cfg, "DIWARP_PROGRESS", v, "expected app, thread or daemon");
                cfg->progress_thread = i == 1;
        }
        if ((v = var(env, "DIWARP_WAIT_SPIN_US"))) {
                if (!parse_u64(v, 10, 0, DW_CONFIG_MAX_WAIT_SPIN_US, &u))
                        return bad(cfg, "DIWARP_WAIT_SPIN_US", v,
                                   "expected microseconds 0..10000 (0: never spin)");
                cfg->wait_spin_us = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_IO"))) {
                static const char *const names[] = {"plain", "uring"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_IO", v, "expected plain or uring");
                cfg->io = i == 1 ? DW_IO_URING : DW_IO_PLAIN;
        }
        if ((v = var(env, "DIWARP_RC_CRC"))) {
                static const char *const names[] = {"0", "1"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_RC_CRC", v, "expected 0 or 1");
                cfg->rc_crc = i == 1;
        }
        if ((v = var(env, "DIWARP_RD_DIRECT"))) {
                static const char *const names[] = {"0", "1"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_RD_DIRECT", v, "expected 0 or 1");
                cfg->rd_direct = i == 1;
        }
        if ((v = var(env, "DIWARP_RC_TRANSPORT"))) {
                static const char *const names[] = {"tcp", "rd"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_RC_TRANSPORT", v, "expected tcp or rd");
                cfg->rc_transport = i == 1 ? DW_RC_RD : DW_RC_TCP;
        }
        if ((v = var(env, "DIWARP_PEER_TIMEOUT_MS"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_TIMEOUT_MS, &u))
                        return bad(cfg, "DIWARP_PEER_TIMEOUT_MS", v,
                                   "expected milliseconds 1..3600000");
                cfg->peer_timeout_ms = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_CONNECT_TIMEOUT_MS"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_TIMEOUT_MS, &u))
                        return bad(cfg, "DIWARP_CONNECT_TIMEOUT_MS", v,
                                   "expected milliseconds 1..3600000");
                cfg->connect_timeout_ms = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_UDP_MTU"))) {
                if (!parse_u64(v, 10, DW_CONFIG_MIN_UDP_MTU, DW_CONFIG_MAX_UDP_MTU, &u))
                        return bad(cfg, "DIWARP_UDP_MTU", v, "expected bytes 512..65507");
                cfg->udp_mtu = (uint32_t)u;
        }
        if ((rc = parse_cap(cfg, env, "DIWARP_INFLIGHT_QP", &cfg->inflight_qp)) ||
            (rc = parse_cap(cfg, env, "DIWARP_INFLIGHT_PROC", &cfg->inflight_proc)) ||
            (rc = parse_cap(cfg, env, "DIWARP_INFLIGHT_HOST", &cfg->inflight_host)))
                return rc;
        if ((v = var(env, "DIWARP_INFLIGHT_SHM"))) {
                if (!valid_shm_name(v))
                        return bad(cfg, "DIWARP_INFLIGHT_SHM", v,
                                   "expected a shm name of 1..100 characters A-Z a-z 0-9 . _ - "
                                   "(one leading / allowed)");
                snprintf(cfg->inflight_shm, sizeof(cfg->inflight_shm), "/%s", v + (*v == '/'));
        }
        if ((v = var(env, "DIWARP_CC"))) {
                static const char *const names[] = {"off", "on", "0", "1"};

                i = parse_choice(v, names, 4);
                if (i < 0)
                        return bad(cfg, "DIWARP_CC", v, "expected on or off");
                cfg->cc = i & 1;
        }
        if ((v = var(env, "DIWARP_CC_PACING"))) {
                static const char *const names[] = {"0", "1"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_CC_PACING", v, "expected 0 or 1");
                cfg->cc_pacing = i == 1;
        }
        if ((v = var(env, "DIWARP_CC_TARGET_US"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_CC_TARGET_US, &u))
                        return bad(cfg, "DIWARP_CC_TARGET_US", v,
                                   "expected microseconds 1..1000000");
                cfg->cc_target_us = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_AUTH"))) {
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
                        return bad(cfg, "DIWARP_AUTH", v,
                                   "expected off, connection, or file:PATH (a key file of 16 or "
                                   "32 bytes, raw or hex)");
                }
        }
        if ((v = var(env, "DIWARP_RD_CRC"))) {
                static const char *const names[] = {"0", "1"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_RD_CRC", v, "expected 0 or 1");
                cfg->rd_crc = i == 1;
        }
        if ((v = var(env, "DIWARP_RD_PULL_MIN"))) {
                if (!parse_u64(v, 10, 0, DW_MAX_MSG_PULL, &u))
                        return bad(cfg, "DIWARP_RD_PULL_MIN", v,
                                   "expected bytes 0..2147483648 (0: Sends are never pulled)");
                cfg->pull_min = (uint32_t)(u == DW_MAX_MSG_PULL ? u - 1 : u);
        }
        if ((v = var(env, "DIWARP_RD_PULL_CHUNK"))) {
                if (!parse_u64(v, 10, DW_CONFIG_MIN_PULL_CHUNK, DW_CONFIG_MAX_PULL_CHUNK, &u))
                        return bad(cfg, "DIWARP_RD_PULL_CHUNK", v, "expected bytes 1024..67108864");
                cfg->pull_chunk = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_RD_PULL_DEPTH"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_PULL_DEPTH, &u))
                        return bad(cfg, "DIWARP_RD_PULL_DEPTH", v, "expected Reads 1..8");
                cfg->pull_depth = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_CREDIT"))) {
                static const char *const names[] = {"off", "static", "dynamic"};

                i = parse_choice(v, names, 3);
                if (i < 0)
                        return bad(cfg, "DIWARP_CREDIT", v, "expected static, dynamic or off");
                cfg->credit = (enum dw_credit_setting)i;
        }
        if ((v = var(env, "DIWARP_CREDIT_SLOT"))) {
                if (!parse_u64(v, 10, 64, 65536, &u) || (u & (u - 1)))
                        return bad(cfg, "DIWARP_CREDIT_SLOT", v,
                                   "expected bytes, a power of two 64..65536");
                cfg->credit_slot = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_CREDIT_RING"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_CREDIT_RING, &u))
                        return bad(cfg, "DIWARP_CREDIT_RING", v, "expected slots 1..32767");
                cfg->credit_ring = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_CREDIT_PEERS"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_CREDIT_RING, &u))
                        return bad(cfg, "DIWARP_CREDIT_PEERS", v, "expected senders 1..32767");
                cfg->credit_peers = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_RD_MAX_PEERS"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_RD_PEERS, &u))
                        return bad(cfg, "DIWARP_RD_MAX_PEERS", v, "expected streams 1..1000000");
                cfg->rd_max_peers = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_RD_DEV_PEERS"))) {
                if (!parse_u64(v, 10, 1, DW_CONFIG_MAX_RD_PEERS, &u))
                        return bad(cfg, "DIWARP_RD_DEV_PEERS", v, "expected streams 1..1000000");
                cfg->rd_dev_peers = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_RD_IDLE_MS"))) {
                if (!parse_u64(v, 10, DW_CONFIG_MIN_RD_IDLE_MS, DW_CONFIG_MAX_TIMEOUT_MS, &u))
                        return bad(cfg, "DIWARP_RD_IDLE_MS", v,
                                   "expected milliseconds 100..3600000");
                cfg->rd_idle_ms = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_CREDIT_CSLOTS"))) {
                if (!parse_u64(v, 10, 1, 64, &u))
                        return bad(cfg, "DIWARP_CREDIT_CSLOTS", v, "expected entries 1..64");
                cfg->credit_cslots = (uint32_t)u;
        }
        if ((v = var(env, "DIWARP_CREDIT_RC"))) {
                static const char *const names[] = {"rnr", "park"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_CREDIT_RC", v, "expected rnr or park");
                cfg->credit_rc_park = i == 1;
        }
        if ((v = var(env, "DIWARP_LOCAL_COPY"))) {
                static const char *const names[] = {"0", "1"};

                i = parse_choice(v, names, 2);
                if (i < 0)
                        return bad(cfg, "DIWARP_LOCAL_COPY", v, "expected 0 or 1");
                cfg->local_copy = (int8_t)i;
        }
        if ((v = var(env, "DIWARP_CREDIT_MIN_QUOTA"))) {
                if (!parse_u64(v, 10, 0, DW_CONFIG_MAX_CREDIT_RING, &u))
                        return bad(cfg, "DIWARP_CREDIT_MIN_QUOTA", v,
                                   "expected slots 0..32767 (0: DIWARP_CREDIT_CSLOTS)");
                cfg->credit_min_quota = (uint32_t)u;
        }
        uint32_t floor = cfg->credit_min_quota ? cfg->credit_min_quota : cfg->credit_cslots;
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
        if ((v = var(env, "DIWARP_FAULT_SEED"))) {
                /* Base 0: decimal, or 0x-prefixed hex as seeds are often printed. */
                if (!parse_u64(v, 0, 0, UINT64_MAX, &u))
                        return bad(cfg, "DIWARP_FAULT_SEED", v,
                                   "expected an unsigned 64-bit integer (decimal or 0x hex)");
                cfg->fault_seed = u;
        }
        if ((v = var(env, "DIWARP_FAULT"))) {
                struct dw_fault_params p;
                char reason[160];

                if (strlen(v) >= sizeof(cfg->fault_spec))
                        return bad(cfg, "DIWARP_FAULT", v, "spec longer than 255 characters");
                /* Validate now so a typo fails at device open, not silently later. */
                if (dw_fault_parse(v, &p, reason, sizeof(reason)) < 0)
                        return bad(cfg, "DIWARP_FAULT", v,
                                   reason + (strncmp(reason, "DIWARP_FAULT: ", 14) ? 0 : 14));
                snprintf(cfg->fault_spec, sizeof(cfg->fault_spec), "%s", v);
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
