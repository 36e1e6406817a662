/* bench-flows: N flows from one client process to one server process (or
 * to several) through a bottleneck (bench/netns-topo.sh), to develop and
 * measure congestion control of the RD transport against N plain TCP
 * connections.
 *
 *   server: bench-flows [--port P] [--addr A] [--cpu C] [--timeout MS]
 *   client: bench-flows [--transport rd|rc|tcp] [--op write|send] [--flows N]
 *                       [--devices D] [--server-qps K] [--size B] [--window W]
 *                       [--duration-ms T] [--warmup-ms W] [--port P] [--addr A]
 *                       [--cpu C] [--timeout MS] [--tcp-cc ALG] [--validate]
 *                       [--block] HOST[:PORT]...
 *
 * The client's parameters travel to the server over the TCP side channel
 * (port P). Flow f uses client device f % D (each device has its own UDP
 * port: for RD, its own peer state at the server, so D devices are D
 * independent congestion controllers) and server QP f % K (RD only: one RD QP
 * serves many peers; K = 1 is an incast onto one QP).
 *
 * Several HOST[:PORT] (rd, rc): S server processes, each serving its own
 * side channel; flow f goes to server f % S, where it is flow f / S of that
 * server's share of the run (its flows, one client GID per flow, at most K
 * QPs). A slow receiver (DIWARP_FAULT=slowrx) is then one server among
 * others.
 *
 * --validate (send): every message carries its flow, its number in the flow
 * and a pattern derived from both in every 64-bit word; the server checks
 * each one (length, flow, order, every byte) before it reposts the receive.
 * The client keeps W source buffers per flow for it.
 *
 * --block: the client waits on its devices' completion channels (their
 * progress threads move the data) instead of busy-polling, so several
 * clients can share a machine's cores.
 *
 * write: each flow streams signaled RDMA Writes of B bytes into its own
 *        region of the server's buffer, at most W outstanding; goodput counts
 *        the client's send completions.
 * send:  each flow streams Sends; the server keeps W + 2 receives posted per
 *        flow, reposts each before it is counted, and returns a 16-byte credit
 *        (cumulative count) every W/2 messages, so a flow never has more than
 *        W messages the server has not consumed (RC over TCP has no RNR: a
 *        Send without a receive would end the connection). Goodput counts the
 *        server's receive completions.
 * tcp:   N plain TCP connections (no diwarp) to port P + 1, nonblocking, one
 *        epoll thread each side, each streaming B-byte messages back to back
 *        (--window and --devices do not apply); goodput counts the bytes the
 *        server reads. --tcp-cc sets the senders' congestion control
 *        (TCP_CONGESTION; default: the system's, which RESULT names).
 *
 * Only what completes between warmup-ms and duration-ms after the start
 * counts. Then the client stops posting and waits (at most --timeout) for
 * what it has outstanding, so the counters include the tail.
 *
 * Progress: the client busy-polls the CQs of its devices round robin from
 * one thread (a CQ serves only its own device's QPs, so D devices mean D
 * CQs, one poller). The server never spins: it waits in poll() on its
 * completion channel and the side channel, and the device's progress thread
 * (started with the channel) moves the data; with --op write the main thread
 * just sleeps there until the client ends the run.
 *
 * Output of the client: one `FLOW i ...` line per flow, then `RESULT ...`
 * (fields in bench/README.md). The server prints `RESULT role=server ...`.
 * Exit 0 ok, 1 failed, 2 usage, 3 unsupported (-EOPNOTSUPP).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bcommon.h"

#include <diwarp/diwarpdv.h>

#define CREDIT_MAGIC 0x4352454449542121ull /* "CREDIT!!" */
#define CREDIT_LEN   16
#define CSLOT_LEN    64 /* a credit and room for a UD-style GRH */
#define MAX_BUF      (1ull << 30)

enum { TR_RD, TR_RC, TR_TCP };
enum { OP_WRITE, OP_SEND };
enum { T_DATA = 1, T_CREDIT = 2, T_RECV = 3 };
enum { F_VALIDATE = 1 };
#define VALID_MAGIC 0x44574652464c4f57ull /* "DWFRFLOW" */
#define VALID_HDR   24                    /* magic, flow, message number */
static const char *const tr_names[] = {"rd", "rc", "tcp", NULL};
static const char *const op_names[] = {"write", "send", NULL};

/* What the client sends the server after bc_oob_open's own options. */
struct params {
        uint32_t transport, op, flows, devices, server_qps, window, duration_ms, warmup_ms;
        uint64_t size;
        uint32_t flags; /* F_VALIDATE */
};

struct fopts {
        struct params p;
        uint16_t port;
        int cpu, timeout_ms;
        const char *addr;
        const char *tcp_cc; /* tcp: the senders' congestion control (NULL: the system's) */
        bool block;         /* client: wait on completion channels, do not spin */
};

/* A server process and its side channel. The client drives nsrv of them
 * (HOST[:PORT] each), with p its share of the run; a server has one, srv[0],
 * with host NULL. */
struct srv_info {
        const char *host;
        uint16_t port;
        struct params p;
        struct bc_ctx side;
};

struct flow {
        uint32_t dev, qi, sqp; /* client device, index in its q[], server QP */
        uint32_t srv, sidx;    /* client: its server, and its index there */
        uint32_t cqpn;         /* the client QP's number */
        uint64_t posted, done, credited, consumed, credit_at;
        uint64_t bytes, msgs; /* completed inside the measured interval */
        uint64_t last_ns;     /* last completion or write (stall check) */
        uint64_t sent, retx, rnr;
        int fd;     /* tcp */
        size_t off; /* tcp: bytes of the current message written */
};

static struct fopts o;
static const struct params *P = &o.p;
static bool server;
static struct srv_info *srv;
static uint32_t nsrv;
static struct bc_ctx *dv; /* devices: D on the client, one on the server */
static uint32_t ndv;
static struct flow *fl;
static struct diwarp_ah **sah; /* server, RD: one AH per client device */
static uint32_t *slot_base;    /* server, send: first receive slot of each QP */
/* Server, send: receive slots whose repost found the RQ full, per QP (at
 * slot_base[k] in pend), and how many. An RD QP serving several peers
 * completes receives out of order, but its ring frees slots only from the
 * oldest WQE on: behind one peer's unfinished message, a completed receive
 * cannot be reposted yet. */
static uint32_t *pend, *npend;
static size_t slot_len;
static uint32_t cslots; /* client, send: credit receives per flow */
static uint64_t srv_rx, srv_dup, srv_checked;
static struct pollfd *cpf; /* client, --block: one per device */

static void usage(void)
{
        fprintf(stderr,
                "usage: bench-flows [--transport rd|rc|tcp] [--op write|send] [--flows N]\n"
                "                   [--devices D] [--server-qps K] [--size B] [--window W]\n"
                "                   [--duration-ms T] [--warmup-ms W] [--port P] [--addr A]\n"
                "                   [--cpu C] [--timeout MS] [--tcp-cc ALG] [--validate]\n"
                "                   [--block] [HOST[:PORT]...]\n"
                "  without HOST: serve one client; with HOST: drive the run (several: one\n"
                "  server process each, flow f to the (f %% S)-th).\n");
        exit(2);
}

static uint64_t num(const char *s)
{
        char *end;
        errno = 0;
        uint64_t v = strtoull(s, &end, 0);
        if (errno || end == s)
                usage();
        if (*end == 'k' || *end == 'K')
                v <<= 10, end++;
        else if (*end == 'm' || *end == 'M')
                v <<= 20, end++;
        if (*end)
                usage();
        return v;
}

static uint32_t pick(const char *s, const char *const *names)
{
        for (uint32_t i = 0; names[i]; i++)
                if (!strcmp(s, names[i]))
                        return i;
        usage();
        return 0;
}

static void parse(int argc, char **argv)
{
        static const struct option lo[] = {
            {"transport", required_argument, NULL, 't'},
            {"op", required_argument, NULL, 'o'},
            {"flows", required_argument, NULL, 256},
            {"devices", required_argument, NULL, 257},
            {"server-qps", required_argument, NULL, 258},
            {"window", required_argument, NULL, 259},
            {"duration-ms", required_argument, NULL, 260},
            {"warmup-ms", required_argument, NULL, 261},
            {"size", required_argument, NULL, 's'},
            {"port", required_argument, NULL, 'p'},
            {"addr", required_argument, NULL, 'a'},
            {"cpu", required_argument, NULL, 'c'},
            {"timeout", required_argument, NULL, 'T'},
            {"tcp-cc", required_argument, NULL, 'C'},
            {"validate", no_argument, NULL, 'V'},
            {"block", no_argument, NULL, 'B'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0},
        };
        o = (struct fopts){.p = {.transport = TR_RD,
                                 .op = OP_WRITE,
                                 .flows = 1,
                                 .devices = 1,
                                 .window = 4,
                                 .duration_ms = 5000,
                                 .warmup_ms = 1000,
                                 .size = 1 << 20},
                           .port = 18600,
                           .cpu = -1,
                           .timeout_ms = 10000};
        struct params *p = &o.p;
        /* the numeric options from 256 on, in the order of lo[] */
        uint32_t *const u32[] = {&p->flows,  &p->devices,     &p->server_qps,
                                 &p->window, &p->duration_ms, &p->warmup_ms};
        int ch;
        while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
                switch (ch) {
                case 't':
                        p->transport = pick(optarg, tr_names);
                        break;
                case 'o':
                        p->op = pick(optarg, op_names);
                        break;
                case 's':
                        p->size = num(optarg);
                        break;
                case 'p':
                        o.port = (uint16_t)num(optarg);
                        break;
                case 'a':
                        o.addr = optarg;
                        break;
                case 'c':
                        o.cpu = atoi(optarg);
                        break;
                case 'T':
                        o.timeout_ms = atoi(optarg);
                        break;
                case 'C':
                        o.tcp_cc = optarg;
                        break;
                case 'V':
                        p->flags |= F_VALIDATE;
                        break;
                case 'B':
                        o.block = true;
                        break;
                default:
                        if (ch < 256 || ch >= 256 + (int)(sizeof(u32) / sizeof(u32[0])))
                                usage();
                        *u32[ch - 256] = (uint32_t)num(optarg);
                }
        }
        if (p->server_qps == 0)
                p->server_qps = p->flows;
        if (p->flows == 0 || p->devices == 0 || p->devices > p->flows || p->server_qps > p->flows ||
            p->window == 0 || p->size == 0 || p->size > (1u << 31) ||
            p->warmup_ms >= p->duration_ms || o.timeout_ms <= 0 || o.port == 0 || o.port == 65535)
                usage();
        if (p->transport == TR_RC && p->server_qps != p->flows) {
                fprintf(stderr, "bench-flows: --server-qps applies to rd only (rc is connected)\n");
                exit(2);
        }
        if ((p->flags & F_VALIDATE) &&
            (p->op != OP_SEND || p->transport == TR_TCP || p->size < VALID_HDR)) {
                fprintf(stderr,
                        "bench-flows: --validate needs --op send (rd, rc) of at least "
                        "%d bytes\n",
                        VALID_HDR);
                exit(2);
        }
        nsrv = optind < argc ? (uint32_t)(argc - optind) : 1;
        srv = calloc(nsrv, sizeof(*srv));
        if (!srv) {
                fprintf(stderr, "bench-flows: out of memory\n");
                exit(1);
        }
        for (uint32_t s = 0; s < nsrv; s++) {
                srv[s].port = o.port;
                srv[s].side.oob = -1;
                if (optind + (int)s >= argc)
                        continue;
                /* HOST[:PORT]: the host part is copied (argv stays intact) */
                char *h = strdup(argv[optind + s]), *c = h ? strrchr(h, ':') : NULL;
                if (!h)
                        usage();
                if (c) {
                        *c = '\0';
                        uint64_t v = num(c + 1);
                        if (v == 0 || v >= 65535)
                                usage();
                        srv[s].port = (uint16_t)v;
                }
                srv[s].host = h;
        }
        if (nsrv > 1 && (p->transport == TR_TCP || p->flows < nsrv)) {
                fprintf(stderr, "bench-flows: several servers need --transport rd or rc and at "
                                "least one flow each\n");
                exit(2);
        }
}

__attribute__((format(printf, 1, 2))) static bool fail(const char *fmt, ...)
{
        va_list ap;
        fprintf(stderr, "%s: ", server ? "server" : "client");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        return false;
}

static bool unsupported(void)
{
        for (uint32_t d = 0; d < ndv; d++)
                if (dv[d].unsupported)
                        return true;
        return false;
}

/* A side channel read that waits longer than this means the peer is stuck. */
static void oob_timeout(struct bc_ctx *c, int ms)
{
        struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
        setsockopt(c->oob, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static uint32_t flows_on(uint32_t i, uint32_t of)
{
        return (P->flows - i + of - 1) / of; /* flows f with f % of == i */
}

/* Server s's share of the client's run (all of it with one server): the
 * flows f with f % S == s, one client GID per flow, at most K QPs. */
static struct params share(uint32_t s)
{
        struct params p = o.p;
        if (nsrv > 1) {
                p.flows = flows_on(s, nsrv);
                p.devices = p.flows;
                p.server_qps = P->server_qps < p.flows ? P->server_qps : p.flows;
        }
        return p;
}

static bool exchange_params(void)
{
        for (uint32_t s = 0; s < nsrv; s++) {
                struct srv_info *v = &srv[s];
                struct bc_opts bo = {
                    .transport = P->transport == TR_RD ? BC_RD : BC_RC,
                    .size = P->size,
                    .iters = 1,
                    .qps = P->flows,
                    .window = P->window,
                    .duration_ms = P->duration_ms,
                    .reps = 1,
                    /* the server (and a --block client) waits on its completion channel */
                    .block = server || o.block,
                    .port = v->port,
                    .cpu = o.cpu,
                    .timeout_ms = o.timeout_ms,
                    .addr = o.addr,
                    .host = v->host,
                };
                if (bc_oob_open(&v->side, &bo))
                        return fail("side channel %s:%u failed", v->host ? v->host : "*", v->port);
                oob_timeout(&v->side, o.timeout_ms + (int)P->duration_ms);
                struct params *p = server ? &o.p : &v->p;
                if (!server)
                        *p = share(s);
                uint32_t w[10] = {htonl(p->transport),      htonl(p->op),
                                  htonl(p->flows),          htonl(p->devices),
                                  htonl(p->server_qps),     htonl(p->window),
                                  htonl(p->duration_ms),    htonl(p->warmup_ms),
                                  htonl((uint32_t)p->size), htonl(p->flags)};
                if (!server) {
                        if (bc_write_all(v->side.oob, w, sizeof(w)))
                                return fail("side channel write");
                        continue;
                }
                if (bc_read_all(v->side.oob, w, sizeof(w)) < 0)
                        return fail("no parameters from the client");
                *p = (struct params){ntohl(w[0]), ntohl(w[1]), ntohl(w[2]), ntohl(w[3]),
                                     ntohl(w[4]), ntohl(w[5]), ntohl(w[6]), ntohl(w[7]),
                                     ntohl(w[8]), ntohl(w[9])};
                if (P->transport > TR_TCP || P->op > OP_SEND || !P->flows || !P->devices ||
                    !P->server_qps || P->server_qps > P->flows || !P->window || !P->size ||
                    P->warmup_ms >= P->duration_ms || (P->flags & ~(uint32_t)F_VALIDATE) ||
                    ((P->flags & F_VALIDATE) && P->size < VALID_HDR))
                        return fail("bad parameters from the client");
        }
        return true;
}

/* ---- diwarp flows -------------------------------------------------------------- */

/* --validate: word k of message m of a server's flow j. */
static inline uint64_t pattern(uint64_t j, uint64_t m, uint64_t k)
{
        return ((j << 48) ^ (m << 20) ^ k) * 0x9e3779b97f4a7c15ull;
}

/* Fills a message of len bytes: magic, flow, number, then the pattern (the
 * bytes after the last whole word are the low bytes of the next word's). */
static void fill_msg(uint8_t *b, size_t len, uint64_t j, uint64_t m)
{
        uint64_t h[3] = {VALID_MAGIC, j, m};
        memcpy(b, h, sizeof(h));
        size_t k = 3;
        for (; (k + 1) * 8 <= len; k++) {
                uint64_t v = pattern(j, m, k);
                memcpy(b + k * 8, &v, 8);
        }
        uint64_t v = pattern(j, m, k);
        memcpy(b + k * 8, &v, len - k * 8);
}

/* The server's check of message m of its flow j: names the first bad byte. */
static bool check_msg(const uint8_t *b, size_t len, uint64_t j, uint64_t m)
{
        uint64_t h[3];
        if (len != P->size)
                return fail("flow %llu: message %llu has %zu bytes, not %llu",
                            (unsigned long long)j, (unsigned long long)m, len,
                            (unsigned long long)P->size);
        memcpy(h, b, sizeof(h));
        if (h[0] != VALID_MAGIC || h[1] != j || h[2] != m)
                return fail("flow %llu: message %llu arrived as (magic %#llx, flow %llu, "
                            "message %llu)",
                            (unsigned long long)j, (unsigned long long)m, (unsigned long long)h[0],
                            (unsigned long long)h[1], (unsigned long long)h[2]);
        size_t k = 3;
        for (; k * 8 < len; k++) {
                uint64_t v = pattern(j, m, k), got = 0;
                size_t n = len - k * 8 < 8 ? len - k * 8 : 8;
                memcpy(&got, b + k * 8, n);
                if (memcmp(&got, &v, n))
                        return fail("flow %llu: message %llu: bytes %zu..%zu differ "
                                    "(%#llx, expected %#llx)",
                                    (unsigned long long)j, (unsigned long long)m, k * 8,
                                    k * 8 + n - 1, (unsigned long long)got, (unsigned long long)v);
        }
        srv_checked++;
        return true;
}

/* Client: bytes of source buffers of a device with nf flows (--validate: W
 * per flow, one message each; else one message all flows send from). */
static size_t src_len(uint32_t nf)
{
        return (P->flags & F_VALIDATE) ? (size_t)nf * P->window * P->size : P->size;
}

static int post_data(uint32_t fi)
{
        struct flow *f = &fl[fi];
        struct bc_ctx *c = &dv[f->dev];
        struct bc_qp *q = &c->q[f->qi];
        uint8_t *src = c->buf;
        if (P->flags & F_VALIDATE) {
                /* slot posted % W: its earlier message has completed (in SQ order) */
                src += ((size_t)f->qi * P->window + f->posted % P->window) * P->size;
                fill_msg(src, P->size, f->sidx, f->posted);
        }
        struct diwarp_sge sge = {(uintptr_t)src, (uint32_t)P->size, c->lkey};
        struct diwarp_send_wr wr = {.wr_id = BC_WR(T_DATA, fi, 0),
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode =
                                        P->op == OP_WRITE ? DIWARP_WR_RDMA_WRITE : DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED},
                              *bad;
        if (P->op == OP_WRITE) {
                wr.wr.rdma.remote_addr = q->peer_base + (uint64_t)f->sidx * P->size;
                wr.wr.rdma.rkey = q->peer_rkey;
        }
        if (P->transport == TR_RD) {
                struct diwarpdv_rd_dest d = {q->ah, q->peer_qpn, BC_QKEY};
                return diwarpdv_post_send_rd(q->qp, &wr, &d, &bad);
        }
        return diwarp_post_send(q->qp, &wr, &bad);
}

static uint8_t *credit_slot(uint32_t fi, uint32_t s)
{
        return dv[fl[fi].dev].buf + src_len(flows_on(fl[fi].dev, P->devices)) +
               ((size_t)fl[fi].qi * cslots + s) * CSLOT_LEN;
}

static int post_credit_recv(uint32_t fi, uint32_t s)
{
        return bc_post_recv(&dv[fl[fi].dev], fl[fi].qi, BC_WR(T_CREDIT, fi, s), credit_slot(fi, s),
                            CSLOT_LEN);
}

static uint8_t *recv_slot(uint32_t k, uint32_t s)
{
        return dv[0].buf + ((size_t)slot_base[k] + s) * slot_len;
}

static int post_recv(uint32_t k, uint32_t s)
{
        return bc_post_recv(&dv[0], k, BC_WR(T_RECV, k, s), recv_slot(k, s), (uint32_t)slot_len);
}

static int post_credit(uint32_t fi)
{
        struct flow *f = &fl[fi];
        struct bc_qp *q = &dv[0].q[f->sqp];
        uint64_t m[2] = {htobe64(CREDIT_MAGIC), htobe64(f->consumed)};
        struct diwarp_sge sge = {(uintptr_t)m, sizeof(m), dv[0].lkey};
        struct diwarp_send_wr wr = {.wr_id = BC_WR(T_CREDIT, fi, 0),
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED | DIWARP_SEND_INLINE},
                              *bad;
        int e;
        if (P->transport == TR_RD) {
                struct diwarpdv_rd_dest d = {sah[f->dev], f->cqpn, BC_QKEY};
                e = diwarpdv_post_send_rd(q->qp, &wr, &d, &bad);
        } else {
                e = diwarp_post_send(q->qp, &wr, &bad);
        }
        if (e == 0)
                f->credit_at = f->consumed;
        return e;
}

/* q to RTS, then n receives posted with post(idx, slot). */
static bool qp_ready(struct bc_ctx *c, struct bc_qp *q, const char *what, uint32_t idx, uint32_t n,
                     int (*post)(uint32_t, uint32_t))
{
        if (bc_qp_rts(c, q))
                return fail("%s %u: QP to RTS failed", what, idx);
        for (uint32_t s = 0; s < n; s++)
                if (post(idx, s))
                        return fail("%s %u: post receive failed", what, idx);
        return true;
}

struct wire_info {
        uint8_t gid[16];
        uint32_t rkey, nqp;
        uint64_t base;
};

static bool alloc_ctx(uint32_t n)
{
        ndv = n;
        dv = calloc(n, sizeof(*dv));
        if (!dv)
                return fail("out of memory");
        for (uint32_t d = 0; d < n; d++) {
                dv[d].o = srv[0].side.o;
                dv[d].server = server;
                dv[d].oob = -1;
        }
        return true;
}

static bool client_setup(void)
{
        const uint32_t N = P->flows, D = P->devices, W = P->window, S = nsrv;
        cslots = P->op == OP_SEND ? W + 4 : 0;
        if (!alloc_ctx(D))
                return false;
        for (uint32_t d = 0; d < D; d++) {
                uint32_t nf = flows_on(d, D);
                size_t len = src_len(nf) + (size_t)nf * cslots * CSLOT_LEN;
                if (bc_open(&dv[d], nf * (W + 8 + cslots) + 64, len))
                        return fail("device %u: setup failed", d);
                dv[d].q = calloc(nf, sizeof(*dv[d].q));
                if (!dv[d].q)
                        return fail("out of memory");
                dv[d].nqp = nf;
        }
        if (o.block && !(cpf = calloc(D, sizeof(*cpf))))
                return fail("out of memory");
        /* a server's flows, QPs and GIDs are at most N each */
        uint32_t *qpn = calloc(N, sizeof(uint32_t));
        uint8_t *gids = calloc(N, 16);
        bool ok = false;
        if (!qpn || !gids) {
                fail("out of memory");
                goto out;
        }
        for (uint32_t i = 0; i < N; i++) {
                struct flow *f = &fl[i];
                f->dev = i % D;
                f->qi = i / D;
                f->srv = i % S;
                f->sidx = i / S;
                f->sqp = f->sidx % srv[f->srv].p.server_qps;
                if (bc_qp_create(&dv[f->dev], W + 8, cslots ? cslots : 1,
                                 &dv[f->dev].q[f->qi].qp)) {
                        fail("flow %u: QP create failed", i);
                        goto out;
                }
                f->cqpn = diwarp_qp_num(dv[f->dev].q[f->qi].qp);
        }
        for (uint32_t s = 0; s < S; s++) {
                const struct params *sp = &srv[s].p;
                const int oob = srv[s].side.oob;
                /* one GID per device with one server, else one per flow of its share */
                for (uint32_t g = 0; g < sp->devices; g++)
                        diwarp_device_gid(dv[S == 1 ? g : fl[s + g * S].dev].dev,
                                          (union diwarp_gid *)(gids + 16 * g));
                for (uint32_t j = 0; j < sp->flows; j++)
                        qpn[j] = htonl(fl[s + j * S].cqpn);
                struct wire_info si;
                if (bc_write_all(oob, gids, 16 * sp->devices) < 0 ||
                    bc_write_all(oob, qpn, sp->flows * sizeof(uint32_t)) < 0 ||
                    bc_read_all(oob, &si, sizeof(si)) < 0 || ntohl(si.nqp) != sp->server_qps ||
                    bc_read_all(oob, qpn, sp->server_qps * sizeof(uint32_t)) < 0) {
                        fail("side channel exchange with %s:%u failed (see the server's output)",
                             srv[s].host, srv[s].port);
                        goto out;
                }
                for (uint32_t j = 0; j < sp->flows; j++) {
                        uint32_t i = s + j * S;
                        struct bc_qp *q = &dv[fl[i].dev].q[fl[i].qi];
                        memcpy(q->peer_gid.raw, si.gid, 16);
                        q->peer_qpn = ntohl(qpn[fl[i].sqp]);
                        q->peer_rkey = ntohl(si.rkey);
                        q->peer_base = be64toh(si.base);
                        if (!qp_ready(&dv[fl[i].dev], q, "flow", i, cslots, post_credit_recv))
                                goto out;
                }
        }
        ok = true;
out:
        free(qpn);
        free(gids);
        return ok;
}

static bool server_setup(void)
{
        const uint32_t N = P->flows, D = P->devices, K = P->server_qps, W = P->window;
        const bool send = P->op == OP_SEND;
        if (!alloc_ctx(1))
                return false;
        slot_len = P->size + BC_GRH;
        uint64_t len = send ? (uint64_t)N * (W + 2) * slot_len : (uint64_t)N * P->size;
        if (len > MAX_BUF)
                return fail("%llu MiB of buffers: use fewer flows, a smaller window or size",
                            (unsigned long long)(len >> 20));
        struct bc_ctx *c = &dv[0];
        if (bc_open(c, N * (W + 2) + N * (W + 4) + 16 * K + 64, len))
                return fail("device setup failed");
        /* The main thread sleeps: data needs the progress thread (the channel
         * starts it too; this says why it must be there). */
        int e = diwarp_progress_thread_start(c->dev);
        if (e) {
                bc_fail(c, "progress thread", e);
                return false;
        }
        c->q = calloc(K, sizeof(*c->q));
        slot_base = calloc(K, sizeof(uint32_t));
        npend = calloc(K, sizeof(uint32_t));
        pend = calloc((size_t)N * (W + 2), sizeof(uint32_t));
        sah = calloc(D, sizeof(*sah));
        if (!c->q || !slot_base || !npend || !pend || !sah)
                return fail("out of memory");
        c->nqp = K;
        for (uint32_t k = 0, base = 0; k < K; k++) {
                uint32_t nf = flows_on(k, K);
                slot_base[k] = base;
                base += nf * (W + 2);
                /* room beyond the posted receives for completions the ring
                 * cannot free yet (pend above) */
                uint32_t rq = nf * (W + 2) * (nf > 1 ? 4 : 1);
                if (bc_qp_create(c, nf * (W + 4) + 16, send ? (rq < 16384 ? rq : 16384) : 1,
                                 &c->q[k].qp))
                        return fail("QP %u: create failed", k);
        }
        uint32_t *qpn = calloc(N > K ? N : K, sizeof(uint32_t));
        uint8_t *gids = calloc(D, 16);
        bool ok = false;
        if (!qpn || !gids) {
                fail("out of memory");
                goto out;
        }
        if (bc_read_all(srv[0].side.oob, gids, 16 * D) < 0 ||
            bc_read_all(srv[0].side.oob, qpn, N * sizeof(uint32_t)) < 0) {
                fail("side channel exchange failed (see the client's output)");
                goto out;
        }
        for (uint32_t i = 0; i < N; i++) {
                fl[i].dev = i % D;
                fl[i].sqp = i % K;
                fl[i].cqpn = ntohl(qpn[i]);
        }
        union diwarp_gid gid;
        diwarp_device_gid(c->dev, &gid);
        struct wire_info si = {
            .rkey = htonl(c->rkey), .nqp = htonl(K), .base = htobe64((uintptr_t)c->buf)};
        memcpy(si.gid, gid.raw, 16);
        for (uint32_t k = 0; k < K; k++)
                qpn[k] = htonl(diwarp_qp_num(c->q[k].qp));
        if (bc_write_all(srv[0].side.oob, &si, sizeof(si)) < 0 ||
            bc_write_all(srv[0].side.oob, qpn, K * sizeof(uint32_t)) < 0) {
                fail("side channel write failed");
                goto out;
        }
        for (uint32_t d = 0; P->transport == TR_RD && d < D; d++) {
                if ((e = diwarp_ah_create(c->pd, (union diwarp_gid *)(gids + 16 * d), &sah[d]))) {
                        bc_fail(c, "AH create", e);
                        goto out;
                }
        }
        for (uint32_t k = 0; k < K; k++) {
                /* RC: QP k is flow k's; RD: only the AH of bc_qp_rts uses it */
                struct bc_qp *q = &c->q[k];
                memcpy(q->peer_gid.raw, gids + 16 * (k % D), 16);
                q->peer_qpn = fl[k].cqpn;
                if (!qp_ready(c, q, "QP", k, send ? flows_on(k, K) * (W + 2) : 0, post_recv))
                        goto out;
        }
        ok = true;
out:
        free(qpn);
        free(gids);
        return ok;
}

static const char *flow_op(void)
{
        return P->op == OP_WRITE ? "RDMA Write" : "Send";
}

/* --block, when a round found no completion: the first time arms every CQ
 * (the caller then polls once more, as a completion may have come before the
 * arming), after that sleeps on the devices' channels for at most max_ms. */
static bool client_wait(bool *armed, int max_ms)
{
        struct pollfd *pf = cpf;
        if (!*armed) {
                for (uint32_t d = 0; d < ndv; d++) {
                        int e = diwarp_cq_req_notify(dv[d].cq, false);
                        if (e)
                                return fail("dev %u: req_notify: %s", d, strerror(-e));
                }
                *armed = true;
                return true;
        }
        for (uint32_t d = 0; d < ndv; d++)
                pf[d] = (struct pollfd){.fd = diwarp_comp_channel_fd(dv[d].ch), .events = POLLIN};
        int n = poll(pf, ndv, max_ms);
        if (n < 0 && errno != EINTR)
                return fail("poll: %s", strerror(errno));
        for (uint32_t d = 0; n > 0 && d < ndv; d++) {
                struct diwarp_cq *cq;
                void *ctx;
                if ((pf[d].revents & POLLIN) &&
                    diwarp_comp_channel_get_event(dv[d].ch, &cq, &ctx) == 0) {
                        diwarp_cq_ack_events(cq, 1);
                        *armed = false;
                }
        }
        return true;
}

/* The client's run: busy-polls every device's CQ (--block: sleeps on their
 * channels when nothing came); stops posting at the end and waits (at most
 * --timeout) for what is outstanding. */
static bool client_run(void)
{
        const uint32_t N = P->flows, W = P->window;
        const uint64_t ms = 1000000ull, tmo = (uint64_t)o.timeout_ms * ms;
        struct diwarp_wc wc[64];
        for (uint32_t s = 0; s < nsrv; s++)
                if (bc_sync(&srv[s].side))
                        return fail("server %s:%u did not start the run (see its output)",
                                    srv[s].host, srv[s].port);
        bool armed = false;
        uint64_t t0 = bc_now_ns(), t_warm = t0 + P->warmup_ms * ms,
                 t_end = t0 + P->duration_ms * ms, next_check = t0 + ms;
        for (uint32_t i = 0; i < N; i++)
                fl[i].last_ns = t0;
        for (;;) {
                uint64_t now = bc_now_ns();
                bool posting = now < t_end;
                for (uint32_t i = 0; posting && i < N; i++) {
                        struct flow *f = &fl[i];
                        while (f->posted - f->done < W &&
                               (P->op == OP_WRITE || f->posted - f->credited < W)) {
                                int e = post_data(i);
                                if (e == -ENOMEM)
                                        break; /* SQ full until a completion */
                                if (e)
                                        return fail("flow %u (dev %u): post %s: %s", i, f->dev,
                                                    flow_op(), strerror(-e));
                                f->posted++;
                        }
                }
                bool any = false;
                for (uint32_t d = 0; d < ndv; d++) {
                        int got = diwarp_cq_poll(dv[d].cq, 64, wc);
                        if (got < 0)
                                return fail("dev %u: poll CQ: %s", d, strerror(-got));
                        any |= got > 0;
                        for (int j = 0; j < got; j++) {
                                uint32_t i = BC_WR_QP(wc[j].wr_id);
                                if (i >= N)
                                        return fail("dev %u: completion of unknown WR %#llx", d,
                                                    (unsigned long long)wc[j].wr_id);
                                struct flow *f = &fl[i];
                                bool data = BC_WR_TYPE(wc[j].wr_id) == T_DATA;
                                if (wc[j].status != DIWARP_WC_SUCCESS)
                                        return fail("flow %u (dev %u, server QP %u): %s "
                                                    "completion: %s after %llu messages",
                                                    i, f->dev, f->sqp,
                                                    data ? flow_op() : "credit receive",
                                                    diwarp_wc_status_str(wc[j].status),
                                                    (unsigned long long)f->done);
                                f->last_ns = now;
                                if (data) {
                                        f->done++;
                                        if (now >= t_warm && now < t_end) {
                                                f->bytes += P->size;
                                                f->msgs++;
                                        }
                                        continue;
                                }
                                uint32_t s = BC_WR_SLOT(wc[j].wr_id);
                                uint64_t m[2];
                                memcpy(m, credit_slot(i, s) + bc_wc_hdr(&wc[j]), sizeof(m));
                                if (post_credit_recv(i, s))
                                        return fail("flow %u: repost credit receive", i);
                                uint64_t v = be64toh(m[1]);
                                if (be64toh(m[0]) == CREDIT_MAGIC && v > f->credited &&
                                    v <= f->posted)
                                        f->credited = v;
                        }
                }
                if (o.block && !any && !client_wait(&armed, 5))
                        return false;
                if (now < next_check)
                        continue;
                next_check = now + ms;
                bool outstanding = false;
                for (uint32_t i = 0; i < N; i++) {
                        struct flow *f = &fl[i];
                        bool credits = posting && P->op == OP_SEND && f->posted - f->credited >= W;
                        if (f->posted == f->done && !credits)
                                continue; /* waits for nothing: cannot be stalled */
                        outstanding |= f->posted != f->done;
                        if (now - f->last_ns > tmo)
                                return fail("flow %u (dev %u, server QP %u): no completion for "
                                            "%d ms, %llu of %llu %ss done",
                                            i, f->dev, f->sqp, o.timeout_ms,
                                            (unsigned long long)f->done,
                                            (unsigned long long)f->posted, flow_op());
                }
                if (!posting && !outstanding)
                        return true;
                if (!posting && now > t_end + tmo)
                        return fail("%s still outstanding %d ms after the end", flow_op(),
                                    o.timeout_ms);
        }
}

static bool server_handle(struct diwarp_wc *wc, uint64_t now, uint64_t t_warm, uint64_t t_end)
{
        const uint32_t K = P->server_qps;
        uint32_t type = BC_WR_TYPE(wc->wr_id), k = BC_WR_QP(wc->wr_id);
        if (type == T_CREDIT) {
                if (wc->status != DIWARP_WC_SUCCESS)
                        return fail("flow %u: credit send completion: %s", k,
                                    diwarp_wc_status_str(wc->status));
                return true;
        }
        if (type != T_RECV || k >= K)
                return fail("completion of unknown WR %#llx", (unsigned long long)wc->wr_id);
        uint32_t i = k;
        if (P->transport == TR_RD)
                for (i = k; i < P->flows && fl[i].cqpn != wc->src_qp; i += K)
                        ;
        if (wc->status != DIWARP_WC_SUCCESS)
                return fail("QP %u (flow %s%u): receive completion: %s", k,
                            i < P->flows ? "" : "of client QPN ", i < P->flows ? i : wc->src_qp,
                            diwarp_wc_status_str(wc->status));
        if (i >= P->flows)
                return fail("QP %u: a Send from unknown QPN %#x", k, wc->src_qp);
        struct flow *f = &fl[i];
        /* before the repost hands the slot back to the engine */
        if ((P->flags & F_VALIDATE) &&
            !check_msg(recv_slot(k, BC_WR_SLOT(wc->wr_id)) + bc_wc_hdr(wc),
                       wc->byte_len - bc_wc_hdr(wc), i, f->consumed))
                return false;
        int e = npend[k] ? -ENOMEM : post_recv(k, BC_WR_SLOT(wc->wr_id));
        if (e == -ENOMEM)
                pend[slot_base[k] + npend[k]++] = BC_WR_SLOT(wc->wr_id);
        else if (e)
                return fail("QP %u: repost receive: %s", k, strerror(-e));
        f->consumed++;
        if (now >= t_warm && now < t_end) {
                f->bytes += wc->byte_len - bc_wc_hdr(wc);
                f->msgs++;
        }
        return true;
}

/* The server's run: sleeps in poll() on the completion channel and the side
 * channel until the client ends the run. With Sends, the client's end names
 * the Sends it completed per flow (want); the run goes on until each has
 * arrived, as a receive completion can come after the Send's (the ACK). */
static bool server_loop(uint64_t *want)
{
        struct bc_ctx *c = &dv[0];
        const uint32_t N = P->flows, every = P->window / 2 ? P->window / 2 : 1;
        const uint64_t ms = 1000000ull;
        struct diwarp_wc wc[64];
        if (bc_sync(&srv[0].side))
                return fail("client did not start the run (see its output)");
        uint64_t t0 = bc_now_ns(), t_warm = t0 + P->warmup_ms * ms,
                 t_end = t0 + P->duration_ms * ms,
                 deadline = t_end + 2 * o.timeout_ms * ms + 1000 * ms;
        bool armed = false, ending = false;
        for (;;) {
                int got = diwarp_cq_poll(c->cq, 64, wc);
                if (got < 0)
                        return fail("poll CQ: %s", strerror(-got));
                uint64_t now = bc_now_ns();
                for (int j = 0; j < got; j++)
                        if (!server_handle(&wc[j], now, t_warm, t_end))
                                return false;
                for (uint32_t k = 0; k < P->server_qps; k++) {
                        uint32_t *q = pend + slot_base[k], n = 0, e = 0;
                        while (n < npend[k] && (e = (uint32_t)-post_recv(k, q[n])) == 0)
                                n++;
                        if (e && e != ENOMEM)
                                return fail("QP %u: repost receive: %s", k, strerror((int)e));
                        memmove(q, q + n, (npend[k] - n) * sizeof(*q));
                        npend[k] -= n;
                }
                for (uint32_t i = 0; i < N; i++) {
                        struct flow *f = &fl[i];
                        if (f->consumed - f->credit_at < every)
                                continue;
                        int e = post_credit(i);
                        if (e && e != -ENOMEM) /* SQ full: a credit completion wakes us */
                                return fail("flow %u: post credit: %s", i, strerror(-e));
                }
                if (ending) {
                        uint32_t i = 0;
                        while (i < N && fl[i].consumed >= want[i])
                                i++;
                        if (i == N)
                                return true;
                        if (now > deadline)
                                return fail(
                                    "flow %u: the client completed %llu Sends, %llu arrived", i,
                                    (unsigned long long)want[i],
                                    (unsigned long long)fl[i].consumed);
                }
                if (got > 0) {
                        armed = false;
                        continue;
                }
                if (!armed) {
                        /* arm, then look once more: a completion may have
                         * slipped in before the arming */
                        int e = diwarp_cq_req_notify(c->cq, false);
                        if (e)
                                return fail("req_notify: %s", strerror(-e));
                        armed = true;
                        continue;
                }
                if (now > deadline && !ending)
                        return fail("the client never ended the run");
                struct pollfd pf[2] = {{.fd = diwarp_comp_channel_fd(c->ch), .events = POLLIN},
                                       {.fd = ending ? -1 : srv[0].side.oob, .events = POLLIN}};
                if (poll(pf, 2, 100) < 0 && errno != EINTR)
                        return fail("poll: %s", strerror(errno));
                if (pf[0].revents & POLLIN) {
                        struct diwarp_cq *cq;
                        void *ctx;
                        if (diwarp_comp_channel_get_event(c->ch, &cq, &ctx) == 0)
                                diwarp_cq_ack_events(cq, 1);
                        armed = false;
                }
                if (pf[1].revents) {
                        uint8_t b;
                        if (bc_read_all(srv[0].side.oob, &b, 1) < 0 ||
                            (P->op == OP_SEND &&
                             bc_read_all(srv[0].side.oob, want, N * sizeof(*want)) < 0))
                                return fail("the client closed the side channel (see its output)");
                        if (P->op != OP_SEND)
                                return true;
                        for (uint32_t i = 0; i < N; i++)
                                want[i] = be64toh(want[i]);
                        ending = true;
                        deadline = bc_now_ns() + (uint64_t)o.timeout_ms * ms;
                        armed = false;
                }
        }
}

static bool server_run(void)
{
        uint64_t *want = calloc(P->flows, sizeof(*want));
        bool ok = want ? server_loop(want) : fail("out of memory");
        free(want);
        return ok;
}

/* ---- tcp flows ----------------------------------------------------------------- */

static int nonblock(int fd)
{
        int f = fcntl(fd, F_GETFL);
        return f < 0 ? -1 : fcntl(fd, F_SETFL, f | O_NONBLOCK);
}

/* An epoll set of every flow's socket (data.u32 = flow) for events, and
 * extra (data.u32 = N) for reading when >= 0. -1 after a message. */
static int flows_epoll(uint32_t events, int extra)
{
        int ep = epoll_create1(EPOLL_CLOEXEC);
        for (uint32_t i = 0; ep >= 0 && i <= P->flows; i++) {
                struct epoll_event ev = {.events = i < P->flows ? events : EPOLLIN, .data.u32 = i};
                int fd = i < P->flows ? fl[i].fd : extra;
                if (fd >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) {
                        close(ep);
                        ep = -1;
                }
        }
        if (ep < 0)
                fail("epoll: %s", strerror(errno));
        return ep;
}

static bool tcp_server(void)
{
        const uint32_t N = P->flows;
        const uint64_t ms = 1000000ull;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o.port + 1)};
        int one = 1, ep = -1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        uint8_t *buf = malloc(1 << 18);
        bool ok = false;
        if (lfd < 0 || !buf) {
                fail("socket: %s", strerror(errno));
                goto out;
        }
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (o.addr)
                inet_pton(AF_INET, o.addr, &sa.sin_addr);
        if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, (int)N)) {
                fail("bind/listen port %u: %s", o.port + 1, strerror(errno));
                goto out;
        }
        if (bc_sync(&srv[0].side)) {
                fail("the client went away before connecting");
                goto out;
        }
        bool watch = true; /* the side channel, until the client's next sync word */
        for (uint32_t n = 0; n < N;) {
                /* EOF on the side channel: the client left */
                struct pollfd pf[2] = {{.fd = lfd, .events = POLLIN},
                                       {.fd = watch ? srv[0].side.oob : -1, .events = POLLIN}};
                uint8_t b;
                if (poll(pf, 2, o.timeout_ms) < 1 ||
                    (pf[1].revents && recv(srv[0].side.oob, &b, 1, MSG_PEEK | MSG_DONTWAIT) <= 0)) {
                        fail("%u of %u connections%s", n, N,
                             pf[1].revents ? ": the client went away (see its output)"
                                           : " before the timeout");
                        goto out;
                }
                watch &= !pf[1].revents;
                if (!(pf[0].revents & POLLIN))
                        continue;
                int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
                uint32_t idx;
                struct timeval tv = {.tv_sec = o.timeout_ms / 1000,
                                     .tv_usec = (o.timeout_ms % 1000) * 1000};
                if (fd >= 0)
                        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
                if (fd < 0 || bc_read_all(fd, &idx, sizeof(idx)) < 0 || (idx = ntohl(idx)) >= N ||
                    fl[idx].fd >= 0) {
                        fail("connection %u: accept or flow number failed", n);
                        if (fd >= 0)
                                close(fd);
                        goto out;
                }
                fl[idx].fd = fd;
                nonblock(fd);
                n++;
        }
        if ((ep = flows_epoll(EPOLLIN, srv[0].side.oob)) < 0)
                goto out;
        if (bc_sync(&srv[0].side)) {
                fail("the client did not start the run (see its output)");
                goto out;
        }
        uint64_t t0 = bc_now_ns(), t_warm = t0 + P->warmup_ms * ms,
                 t_end = t0 + P->duration_ms * ms, deadline = t_end + 2 * o.timeout_ms * ms;
        for (;;) {
                struct epoll_event evs[64];
                int n = epoll_wait(ep, evs, 64, 100);
                if (n < 0 && errno != EINTR) {
                        fail("epoll_wait: %s", strerror(errno));
                        goto out;
                }
                uint64_t now = bc_now_ns();
                for (int j = 0; j < n; j++) {
                        uint32_t i = evs[j].data.u32;
                        if (i == N) {
                                uint8_t b;
                                if (bc_read_all(srv[0].side.oob, &b, 1) < 0) {
                                        fail("the client closed the side channel (see its "
                                             "output)");
                                        goto out;
                                }
                                for (i = 0; i < N; i++)
                                        fl[i].msgs = fl[i].bytes / P->size;
                                ok = true;
                                goto out;
                        }
                        ssize_t r = read(fl[i].fd, buf, 1 << 18);
                        if (r > 0 && now >= t_warm && now < t_end)
                                fl[i].bytes += (uint64_t)r;
                        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                                fail("flow %u: connection %s", i, r ? strerror(errno) : "closed");
                                goto out;
                        }
                }
                if (now > deadline) {
                        fail("the client never ended the run");
                        goto out;
                }
        }
out:
        free(buf);
        if (ep >= 0)
                close(ep);
        if (lfd >= 0)
                close(lfd);
        return ok;
}

static bool tcp_connect(uint32_t i, const struct sockaddr_in *to)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return fail("flow %u: socket: %s", i, strerror(errno));
        fl[i].fd = fd;
        if (o.addr) {
                struct sockaddr_in me = {.sin_family = AF_INET};
                inet_pton(AF_INET, o.addr, &me.sin_addr);
                if (bind(fd, (struct sockaddr *)&me, sizeof(me)))
                        return fail("flow %u: bind %s: %s", i, o.addr, strerror(errno));
        }
        if (o.tcp_cc &&
            setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, o.tcp_cc, (socklen_t)strlen(o.tcp_cc)))
                return fail("flow %u: congestion control %s: %s (net.ipv4.tcp_available_"
                            "congestion_control)",
                            i, o.tcp_cc, strerror(errno));
        if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) && errno != EINPROGRESS)
                return fail("flow %u: connect: %s", i, strerror(errno));
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof(err);
        if (poll(&pf, 1, o.timeout_ms) != 1)
                return fail("flow %u: connect: no answer in %d ms", i, o.timeout_ms);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) || err)
                return fail("flow %u: connect: %s", i, strerror(err));
        /* 4 bytes into an empty socket buffer: never EAGAIN */
        uint32_t idx = htonl(i);
        if (send(fd, &idx, sizeof(idx), MSG_NOSIGNAL) != (ssize_t)sizeof(idx))
                return fail("flow %u: send: %s", i, strerror(errno));
        return true;
}

static bool tcp_client(void)
{
        const uint32_t N = P->flows;
        const uint64_t ms = 1000000ull, tmo = (uint64_t)o.timeout_ms * ms;
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        uint8_t *src = calloc(1, P->size);
        int ep = -1;
        bool ok = false;
        if (bc_pin(o.cpu) || !src)
                goto out;
        if (bc_sync(&srv[0].side)) {
                fail("the server is not listening (see its output)");
                goto out;
        }
        if (getaddrinfo(srv[0].host, NULL, &hints, &ai) || !ai) {
                fail("cannot resolve %s", srv[0].host);
                goto out;
        }
        struct sockaddr_in to = *(struct sockaddr_in *)ai->ai_addr;
        to.sin_port = htons(o.port + 1);
        for (uint32_t i = 0; i < N; i++)
                if (!tcp_connect(i, &to))
                        goto out;
        if ((ep = flows_epoll(EPOLLOUT, -1)) < 0)
                goto out;
        if (bc_sync(&srv[0].side)) {
                fail("the server did not start the run (see its output)");
                goto out;
        }
        uint64_t t0 = bc_now_ns(), t_end = t0 + P->duration_ms * ms, next_check = t0 + 100 * ms;
        for (uint32_t i = 0; i < N; i++)
                fl[i].last_ns = t0;
        for (uint64_t now = t0; now < t_end; now = bc_now_ns()) {
                struct epoll_event evs[64];
                int wait = (int)((t_end - now) / ms) + 1;
                int n = epoll_wait(ep, evs, 64, wait < 100 ? wait : 100);
                if (n < 0 && errno != EINTR) {
                        fail("epoll_wait: %s", strerror(errno));
                        goto out;
                }
                now = bc_now_ns();
                for (int j = 0; j < n; j++) {
                        struct flow *f = &fl[evs[j].data.u32];
                        /* one send per flow and wake-up: no flow starves the others */
                        ssize_t w = send(f->fd, src + f->off, P->size - f->off,
                                         MSG_NOSIGNAL | MSG_DONTWAIT);
                        if (w < 0 && errno != EAGAIN && errno != EINTR) {
                                fail("flow %u: send: %s", evs[j].data.u32, strerror(errno));
                                goto out;
                        }
                        if (w <= 0)
                                continue;
                        f->last_ns = now;
                        f->off += (size_t)w;
                        if (f->off == P->size) {
                                f->off = 0;
                                f->posted++;
                        }
                }
                if (now < next_check)
                        continue;
                next_check = now + 100 * ms;
                for (uint32_t i = 0; i < N; i++)
                        if (now - fl[i].last_ns > tmo) {
                                fail("flow %u: could not send for %d ms", i, o.timeout_ms);
                                goto out;
                        }
        }
        for (uint32_t i = 0; i < N; i++) {
                struct tcp_info ti;
                socklen_t len = sizeof(ti);
                memset(&ti, 0, sizeof(ti));
                if (getsockopt(fl[i].fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0) {
                        fl[i].retx = ti.tcpi_total_retrans;
                        /* data segments, retransmissions included, as RD's count */
                        fl[i].sent = len >= offsetof(struct tcp_info, tcpi_data_segs_out) + 4
                                         ? ti.tcpi_data_segs_out
                                         : ti.tcpi_segs_out;
                }
        }
        ok = true;
out:
        if (ai)
                freeaddrinfo(ai);
        if (ep >= 0)
                close(ep);
        free(src);
        return ok;
}

/* ---- results ------------------------------------------------------------------- */

/* After the run: the client says it is done, each server answers with what
 * it counted (bytes and messages per flow of its share, its datagram
 * counters, the messages it validated). */
static bool results(bool ok)
{
        const uint32_t N = P->flows, S = nsrv;
        uint64_t *w = calloc(2 * (size_t)N + 3, sizeof(uint64_t));
        if (!w)
                return fail("out of memory");
        if (!ok)
                goto out;
        if (server) {
                for (uint32_t i = 0; i < N; i++) {
                        w[2 * i] = htobe64(fl[i].bytes);
                        w[2 * i + 1] = htobe64(fl[i].msgs);
                }
                struct diwarp_counters ctr = {0};
                if (ndv)
                        diwarp_device_counters(dv[0].dev, &ctr);
                w[2 * N] = htobe64(ctr.rx_packets);
                w[2 * N + 1] = htobe64(ctr.rx_dropped_duplicate);
                w[2 * N + 2] = htobe64(srv_checked);
                ok =
                    bc_write_all(srv[0].side.oob, w, (2 * (size_t)N + 3) * sizeof(uint64_t)) == 0 ||
                    fail("side channel write");
                goto out;
        }
        for (uint32_t s = 0; s < S; s++) {
                const uint32_t n = srv[s].p.flows;
                uint8_t b = 1;
                /* Sends (rd, rc): with the Sends each flow completed, which
                 * the server awaits before it answers */
                for (uint32_t j = 0; P->op == OP_SEND && P->transport != TR_TCP && j < n; j++)
                        w[j] = htobe64(fl[s + j * S].done);
                if (bc_write_all(srv[s].side.oob, &b, 1) < 0 ||
                    (P->op == OP_SEND && P->transport != TR_TCP &&
                     bc_write_all(srv[s].side.oob, w, n * sizeof(*w)) < 0) ||
                    bc_read_all(srv[s].side.oob, w, (2 * (size_t)n + 3) * sizeof(uint64_t)) < 0) {
                        ok = fail("no results from the server %s:%u (see its output)", srv[s].host,
                                  srv[s].port);
                        goto out;
                }
                /* the receiver counts what was sent; the writer what was written */
                for (uint32_t j = 0; (P->op == OP_SEND || P->transport == TR_TCP) && j < n; j++) {
                        fl[s + j * S].bytes = be64toh(w[2 * j]);
                        fl[s + j * S].msgs = be64toh(w[2 * j + 1]);
                }
                srv_rx += be64toh(w[2 * n]);
                srv_dup += be64toh(w[2 * n + 1]);
                srv_checked += be64toh(w[2 * n + 2]);
        }
out:
        free(w);
        return ok;
}

/* The congestion-control state of a flow's path (RD and RC over RD). */
static int flow_path(const struct flow *f, struct diwarpdv_rd_path *out)
{
        const struct bc_qp *q = &dv[f->dev].q[f->qi];
        if (P->transport != TR_RD)
                return diwarpdv_query_rd_path(q->qp, NULL, out);
        struct diwarpdv_rd_dest d = {
            .ah = q->ah, .remote_qpn = q->peer_qpn, .remote_qkey = BC_QKEY};
        return diwarpdv_query_rd_path(q->qp, &d, out);
}

static void print_client(const char *status)
{
        const uint32_t N = P->flows;
        const bool tcp = P->transport == TR_TCP;
        double secs = (double)(P->duration_ms - P->warmup_ms) / 1e3;
        double sum = 0, sq = 0, mn = -1, mx = 0;
        uint64_t sent = 0, retx = 0, rnr = 0, bp = 0, iw = 0;
        for (uint32_t i = 0; i < N; i++) {
                struct flow *f = &fl[i];
                if (!tcp && dv && dv[f->dev].q && dv[f->dev].q[f->qi].qp) {
                        struct diwarp_counters ctr = {0};
                        diwarp_qp_counters(dv[f->dev].q[f->qi].qp, &ctr);
                        /* tx_packets of a QP counts first transmissions only */
                        f->sent = ctr.tx_packets + ctr.retransmits;
                        f->retx = ctr.retransmits;
                        f->rnr = ctr.rnr_naks;
                }
                double g = (double)f->bytes * 8 / secs / 1e9;
                sum += g;
                sq += g * g;
                mn = mn < 0 || g < mn ? g : mn;
                mx = g > mx ? g : mx;
                sent += f->sent;
                retx += f->retx;
                rnr += f->rnr;
                char dev[16] = "-", sqp[16] = "-";
                if (!tcp) {
                        snprintf(dev, sizeof(dev), "%u", f->dev);
                        snprintf(sqp, sizeof(sqp), "%u", f->sqp);
                }
                char cc[256] = "";
                struct diwarpdv_rd_path path;
                if (!tcp && dv && dv[f->dev].q && dv[f->dev].q[f->qi].qp &&
                    flow_path(f, &path) == 0)
                        snprintf(cc, sizeof(cc),
                                 " cwnd=%u inflight=%u min_rtt_us=%.1f srtt_us=%.1f cc_delay=%llu "
                                 "cc_loss=%llu cc_rto=%llu tlp=%u rto=%u fast=%u",
                                 path.cwnd, path.inflight, path.min_rtt_ns / 1e3,
                                 path.srtt_ns / 1e3, (unsigned long long)path.cc_decrease_delay,
                                 (unsigned long long)path.cc_decrease_loss,
                                 (unsigned long long)path.cc_rto, path.tail_probes,
                                 path.rto_expiries, path.fast_retransmits);
                printf("FLOW %u dev=%s sqp=%s gbps=%.4f msgs=%llu bytes=%llu sent_dgrams=%llu "
                       "retx=%llu rnr=%llu srv=%u done=%llu%s\n",
                       i, dev, sqp, g, (unsigned long long)f->msgs, (unsigned long long)f->bytes,
                       (unsigned long long)f->sent, (unsigned long long)f->retx,
                       (unsigned long long)f->rnr, f->srv,
                       (unsigned long long)(tcp ? f->posted : f->done), cc);
        }
        for (uint32_t d = 0; !tcp && d < ndv; d++) {
                struct diwarp_counters ctr = {0};
                if (dv[d].dev && diwarp_device_counters(dv[d].dev, &ctr) == 0) {
                        bp += ctr.tx_backpressure;
                        iw += ctr.inflight_waits;
                }
        }
        char devices[16] = "-", extra[64] = "", cc[32] = "";
        socklen_t cl = sizeof(cc) - 1;
        if (tcp && fl[0].fd >= 0 && getsockopt(fl[0].fd, IPPROTO_TCP, TCP_CONGESTION, cc, &cl) == 0)
                snprintf(extra, sizeof(extra), " tcp_cc=%s", cc);
        if (!tcp)
                snprintf(devices, sizeof(devices), "%u", P->devices);
        if (P->transport == TR_RC) {
                const char *rt = getenv("DIWARP_RC_TRANSPORT");
                snprintf(extra, sizeof(extra), " rc_transport=%s", rt && *rt ? rt : "tcp");
        }
        printf("RESULT transport=%s%s op=%s flows=%u devices=%s server_qps=%u size=%llu "
               "window=%u duration_ms=%u warmup_ms=%u status=%s gbps=%.4f jain=%.4f "
               "min_gbps=%.4f max_gbps=%.4f sent_dgrams=%llu retx=%llu retx_pct=%.3f rnr=%llu "
               "backpressure=%llu srv_rx_dgrams=%llu srv_dup=%llu servers=%u validated=%llu "
               "inflight_waits=%llu\n",
               tr_names[P->transport], extra, tcp ? "stream" : op_names[P->op], N, devices,
               tcp ? 0 : P->server_qps, (unsigned long long)P->size, tcp ? 0 : P->window,
               P->duration_ms, P->warmup_ms, status, sum, sq > 0 ? sum * sum / (N * sq) : 0,
               mn < 0 ? 0 : mn, mx, (unsigned long long)sent, (unsigned long long)retx,
               sent ? 100.0 * (double)retx / (double)sent : 0, (unsigned long long)rnr,
               (unsigned long long)bp, (unsigned long long)srv_rx, (unsigned long long)srv_dup,
               nsrv, (unsigned long long)srv_checked, (unsigned long long)iw);
}

static void teardown(void)
{
        for (uint32_t d = 0; sah && d < P->devices; d++)
                if (sah[d])
                        diwarp_ah_destroy(sah[d]);
        free(sah);
        for (uint32_t d = 0; d < ndv; d++)
                bc_teardown(&dv[d]);
        free(dv);
        for (uint32_t i = 0; fl && i < P->flows; i++)
                if (fl[i].fd >= 0)
                        close(fl[i].fd);
        free(fl);
        free(slot_base);
        free(pend);
        free(npend);
        free(cpf);
        for (uint32_t s = 0; s < nsrv; s++) {
                bc_teardown(&srv[s].side);
                free((char *)srv[s].host);
        }
        free(srv);
}

int main(int argc, char **argv)
{
        parse(argc, argv);
        server = srv[0].host == NULL;
        signal(SIGPIPE, SIG_IGN); /* a peer that went away is an error return */
        bool ok = exchange_params();
        if (ok) {
                fl = calloc(P->flows, sizeof(*fl));
                ok = fl != NULL || fail("out of memory");
                for (uint32_t i = 0; ok && i < P->flows; i++)
                        fl[i].fd = -1;
        }
        bool ran = false;
        if (ok && P->transport == TR_TCP) {
                ok = server ? tcp_server() : tcp_client();
                ran = true;
        } else if (ok) {
                ok = server ? server_setup() : client_setup();
                if (ok) {
                        ok = server ? server_run() : client_run();
                        ran = true;
                }
        }
        ok = results(ok);
        for (uint32_t s = 0; s < nsrv; s++)
                ok = bc_finish(&srv[s].side, ok);
        bool unsupp = unsupported();
        const char *status = unsupp ? "unsupported" : ok ? "ok" : "failed";
        if (server) {
                struct diwarp_counters ctr = {0};
                if (ndv && dv[0].dev)
                        diwarp_device_counters(dv[0].dev, &ctr);
                printf("RESULT role=server transport=%s op=%s flows=%u status=%s validated=%llu "
                       "rx_dgrams=%llu dup=%llu pulls=%llu slowrx_waits=%llu retx=%llu "
                       "cc_delay=%llu cc_loss=%llu cc_rto=%llu cc_window_waits=%llu "
                       "cc_pacing_waits=%llu\n",
                       tr_names[P->transport], P->transport == TR_TCP ? "stream" : op_names[P->op],
                       P->flows, status, (unsigned long long)srv_checked,
                       (unsigned long long)ctr.rx_packets,
                       (unsigned long long)ctr.rx_dropped_duplicate, (unsigned long long)ctr.pulls,
                       (unsigned long long)ctr.fault_slowrx_waits,
                       (unsigned long long)ctr.retransmits,
                       (unsigned long long)ctr.cc_decrease_delay,
                       (unsigned long long)ctr.cc_decrease_loss, (unsigned long long)ctr.cc_rto,
                       (unsigned long long)ctr.cc_window_waits,
                       (unsigned long long)ctr.cc_pacing_waits);
        } else if (fl && (ran || !ok)) {
                print_client(status);
        } else {
                printf("RESULT transport=%s op=%s flows=%u status=%s\n", tr_names[P->transport],
                       op_names[P->op], P->flows, status);
        }
        teardown();
        return unsupp ? BC_EXIT_UNSUPP : ok ? 0 : 1;
}
