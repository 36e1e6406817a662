/* See common.h. */
#define _GNU_SOURCE
#include "common.h"

#include <diwarp/diwarpdv.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

uint64_t ex_now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *ex_transport_name(enum ex_transport t)
{
        return t == EX_RC ? "rc" : t == EX_RD ? "rd" : "ud";
}

const char *ex_op_name(enum ex_op op)
{
        return op == EX_WRITE ? "write" : op == EX_READ ? "read" : "send";
}

static void ex_usage(const char *prog, bool bw)
{
        fprintf(stderr,
                "usage: %s [--transport ud|rc|rd] [--op send|write|read] [--size BYTES]\n"
                "          [--iters N] [--validate] [--port P] [--addr A]%s [--timeout MS] "
                "[HOST]\n"
                "  without HOST: serve one client; with HOST: connect to its side channel.\n"
                "  The client's transport/op/size/iters/validate are used by both sides.\n",
                prog, bw ? " [--window W]" : "");
        exit(2);
}

void ex_parse(int argc, char **argv, struct ex_opts *o, const char *prog, bool bw)
{
        static const struct option lo[] = {
            {"transport", required_argument, NULL, 't'},
            {"op", required_argument, NULL, 'o'},
            {"size", required_argument, NULL, 's'},
            {"iters", required_argument, NULL, 'n'},
            {"validate", no_argument, NULL, 'v'},
            {"port", required_argument, NULL, 'p'},
            {"addr", required_argument, NULL, 'a'},
            {"window", required_argument, NULL, 'w'},
            {"timeout", required_argument, NULL, 'T'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0},
        };
        memset(o, 0, sizeof(*o));
        o->prog = prog;
        o->size = bw ? 65536 : 64;
        o->iters = bw ? 1000 : 1000;
        o->port = 18515;
        o->timeout_ms = 5000;
        int ch;
        char *end;
        while ((ch = getopt_long(argc, argv, "t:o:s:n:vp:a:w:T:h", lo, NULL)) != -1) {
                switch (ch) {
                case 't':
                        if (!strcmp(optarg, "ud"))
                                o->transport = EX_UD;
                        else if (!strcmp(optarg, "rc"))
                                o->transport = EX_RC;
                        else if (!strcmp(optarg, "rd"))
                                o->transport = EX_RD;
                        else
                                ex_usage(prog, bw);
                        break;
                case 'o':
                        if (!strcmp(optarg, "send"))
                                o->op = EX_SEND;
                        else if (!strcmp(optarg, "write"))
                                o->op = EX_WRITE;
                        else if (!strcmp(optarg, "read"))
                                o->op = EX_READ;
                        else
                                ex_usage(prog, bw);
                        break;
                case 's':
                        o->size = strtoull(optarg, &end, 0);
                        if (*end || optarg[0] == '-')
                                ex_usage(prog, bw);
                        if (o->size > EX_MAX_SIZE) {
                                fprintf(stderr,
                                        "%s: --size %s: larger than one message can be "
                                        "(%llu bytes)\n",
                                        prog, optarg, (unsigned long long)EX_MAX_SIZE);
                                exit(2);
                        }
                        break;
                case 'n':
                        o->iters = strtoull(optarg, &end, 0);
                        if (*end || o->iters == 0)
                                ex_usage(prog, bw);
                        break;
                case 'v':
                        o->validate = true;
                        break;
                case 'p':
                        o->port = (uint16_t)strtoul(optarg, &end, 0);
                        if (*end)
                                ex_usage(prog, bw);
                        break;
                case 'a':
                        o->addr = optarg;
                        break;
                case 'w':
                        o->window = (uint32_t)strtoul(optarg, NULL, 0);
                        break;
                case 'T':
                        o->timeout_ms = atoi(optarg);
                        break;
                default:
                        ex_usage(prog, bw);
                }
        }
        if (optind < argc)
                o->host = argv[optind++];
        if (optind < argc)
                ex_usage(prog, bw);
        if (o->transport == EX_UD && o->op != EX_SEND) {
                fprintf(stderr, "%s: UD supports only --op send\n", prog);
                exit(2);
        }
}

/* ---- side channel ------------------------------------------------------- */

static int ex_write_all(int fd, const void *p, size_t n)
{
        const uint8_t *b = p;
        while (n) {
                ssize_t w = write(fd, b, n);
                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return -1;
                b += w;
                n -= (size_t)w;
        }
        return 0;
}

static int ex_read_all(int fd, void *p, size_t n)
{
        uint8_t *b = p;
        while (n) {
                ssize_t r = read(fd, b, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return -1;
                b += r;
                n -= (size_t)r;
        }
        return 0;
}

static int ex_oob_serve(const struct ex_opts *o)
{
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(o->port)};
        int one = 1;
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lfd < 0)
                return -1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (o->addr)
                inet_pton(AF_INET, o->addr, &sin.sin_addr);
        if (bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 1) < 0) {
                fprintf(stderr, "side channel: bind/listen port %u: %s\n", o->port,
                        strerror(errno));
                close(lfd);
                return -1;
        }
        int fd = accept(lfd, NULL, NULL);
        close(lfd);
        if (fd >= 0)
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

static int ex_oob_connect(const struct ex_opts *o)
{
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
        char port[16];
        int one = 1;
        snprintf(port, sizeof(port), "%u", o->port);
        if (getaddrinfo(o->host, port, &hints, &ai) != 0) {
                fprintf(stderr, "side channel: cannot resolve %s\n", o->host);
                return -1;
        }
        /* The server may still be starting: retry for a while. */
        uint64_t deadline = ex_now_ns() + 10ull * 1000000000ull;
        int fd = -1;
        while (ex_now_ns() < deadline) {
                fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        break;
                if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
                        break;
                close(fd);
                fd = -1;
                usleep(50000);
        }
        freeaddrinfo(ai);
        if (fd < 0)
                fprintf(stderr, "side channel: cannot connect to %s:%u\n", o->host, o->port);
        else
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

struct ex_wire_params {
        uint32_t transport, op, validate, window;
        uint64_t size, iters;
};

struct ex_wire_info {
        uint32_t qpn, rkey;
        uint8_t gid[16];
        uint64_t addr, recv_addr;
};

int ex_exchange_u64(struct ex_ctx *c, uint64_t mine, uint64_t *theirs)
{
        uint64_t w = htobe64(mine), r;
        if (ex_write_all(c->oob, &w, sizeof(w)) < 0 || ex_read_all(c->oob, &r, sizeof(r)) < 0)
                return -1;
        if (theirs)
                *theirs = be64toh(r);
        return 0;
}

int ex_sync(struct ex_ctx *c)
{
        return ex_exchange_u64(c, 0, NULL);
}

/* ---- setup ------------------------------------------------------------------ */

static int ex_fail(const char *what, int err)
{
        fprintf(stderr, "%s: %s\n", what, strerror(-err));
        return -1;
}

static int ex_connect_qp(struct ex_ctx *c)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT, .port_num = 1, .qkey = EX_QKEY};
        int err;
        if (c->o.transport == EX_UD) {
                err = diwarp_qp_modify(c->qp, &a,
                                       DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                           DIWARP_QP_QKEY);
                if (err)
                        return ex_fail("modify to INIT", err);
                a.qp_state = DIWARP_QPS_RTR;
                if ((err = diwarp_qp_modify(c->qp, &a, DIWARP_QP_STATE)))
                        return ex_fail("modify to RTR", err);
                a.qp_state = DIWARP_QPS_RTS;
                if ((err = diwarp_qp_modify(c->qp, &a, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN)))
                        return ex_fail("modify to RTS", err);
                if ((err = diwarp_ah_create(c->pd, &c->peer_gid, &c->ah)))
                        return ex_fail("AH create", err);
                return 0;
        }
        if (c->o.transport == EX_RD) {
                /* RD (diwarpdv): UD-like states, a Q_Key, remote access for
                 * RDMA Write/Read; no connection, an AH per WR. */
                a.qp_access_flags = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                    DIWARP_ACCESS_REMOTE_READ;
                err = diwarp_qp_modify(c->qp, &a,
                                       DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                           DIWARP_QP_QKEY | DIWARP_QP_ACCESS_FLAGS);
                if (err)
                        return ex_fail("modify to INIT", err);
                a.qp_state = DIWARP_QPS_RTR;
                if ((err = diwarp_qp_modify(c->qp, &a, DIWARP_QP_STATE)))
                        return ex_fail("modify to RTR", err);
                a.qp_state = DIWARP_QPS_RTS;
                a.max_rd_atomic = 16;
                if ((err = diwarp_qp_modify(c->qp, &a,
                                            DIWARP_QP_STATE | DIWARP_QP_SQ_PSN |
                                                DIWARP_QP_MAX_QP_RD_ATOMIC)))
                        return ex_fail("modify to RTS", err);
                if ((err = diwarp_ah_create(c->pd, &c->peer_gid, &c->ah)))
                        return ex_fail("AH create", err);
                return 0;
        }
        a.qp_access_flags =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        err = diwarp_qp_modify(c->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                   DIWARP_QP_ACCESS_FLAGS);
        if (err)
                return ex_fail("modify to INIT", err);
        /* IB-style connect: RTR with the peer's GID and QPN (docs/PROTOCOL.md). */
        a.qp_state = DIWARP_QPS_RTR;
        a.dgid = c->peer_gid;
        a.sgid_index = c->sgid_index;
        a.dest_qp_num = c->peer_qpn;
        a.path_mtu = 4096;
        a.max_dest_rd_atomic = 16;
        err = diwarp_qp_modify(c->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN |
                                   DIWARP_QP_PATH_MTU | DIWARP_QP_RQ_PSN |
                                   DIWARP_QP_MAX_DEST_RD_ATOMIC | DIWARP_QP_MIN_RNR_TIMER);
        if (err)
                return ex_fail("modify to RTR", err);
        a.qp_state = DIWARP_QPS_RTS;
        a.max_rd_atomic = 16;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        err = diwarp_qp_modify(c->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_TIMEOUT |
                                   DIWARP_QP_RETRY_CNT | DIWARP_QP_RNR_RETRY |
                                   DIWARP_QP_MAX_QP_RD_ATOMIC);
        if (err)
                return ex_fail("modify to RTS", err);
        return 0;
}

/* What this process may still allocate: the host's available memory
 * (MemAvailable), or the address-space / data-segment limit if lower. *what
 * names the bound. 0: unknown (no check). */
static uint64_t ex_mem_available(const char **what)
{
        uint64_t avail = 0;
        FILE *f = fopen("/proc/meminfo", "r");
        if (f) {
                char line[128];
                unsigned long long kb;
                while (fgets(line, sizeof(line), f))
                        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                                avail = (uint64_t)kb * 1024;
                                *what = "the host has available (MemAvailable)";
                                break;
                        }
                fclose(f);
        }
        static const struct {
                int res;
                const char *what;
        } lims[] = {{RLIMIT_AS, "the address-space limit allows (ulimit -v)"},
                    {RLIMIT_DATA, "the data-segment limit allows (ulimit -d)"}};
        for (size_t i = 0; i < sizeof(lims) / sizeof(lims[0]); i++) {
                struct rlimit rl;
                if (getrlimit(lims[i].res, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
                    (avail == 0 || rl.rlim_cur < avail)) {
                        avail = rl.rlim_cur;
                        *what = lims[i].what;
                }
        }
        return avail;
}

/* Bytes of the one registered buffer: send area, receive slots, credit slots. */
static uint64_t ex_buf_need(const struct ex_opts *o, struct ex_layout l)
{
        uint64_t slot = o->size + (o->transport == EX_UD ? EX_GRH : 0);
        return (l.send_len ? l.send_len : 1) + (uint64_t)l.nrecv * slot + EX_CREDIT_SLOTS * 64 + 64;
}

static double ex_gib(uint64_t b)
{
        return (double)b / (double)(1ull << 30);
}

/* 0 if need fits; else prints why (naming the size) and returns the bytes
 * available (at least 1). */
static uint64_t ex_check_fits(const struct ex_opts *o, struct ex_layout l, uint64_t need)
{
        const char *what = "";
        uint64_t avail = ex_mem_available(&what);
        if (!avail || need <= avail)
                return 0;
        fprintf(stderr,
                "%s: refused: --size %llu (%s %s, %u receive slot%s) needs %.2f GiB of buffers, "
                "more than the %.2f GiB %s; use a smaller --size%s\n",
                o->prog ? o->prog : "diwarp", (unsigned long long)o->size,
                ex_transport_name(o->transport), ex_op_name(o->op), l.nrecv,
                l.nrecv == 1 ? "" : "s", ex_gib(need), ex_gib(avail), what,
                l.nrecv > 2 ? " or --window" : "");
        return avail;
}

int ex_setup(struct ex_ctx *c, const struct ex_opts *o, ex_layout_fn layout)
{
        int err;
        memset(c, 0, sizeof(*c));
        c->o = *o;
        c->server = o->host == NULL;
        c->oob = -1;
        /* The client refuses what it cannot hold before it involves the server. */
        if (!c->server && ex_check_fits(o, layout(o, false), ex_buf_need(o, layout(o, false))))
                return -1;
        c->oob = c->server ? ex_oob_serve(o) : ex_oob_connect(o);
        if (c->oob < 0)
                return -1;
        /* 1. the client's parameters; the server's verdict on them (0, or the
         * bytes its buffers would need and the bytes it has) */
        struct ex_wire_params wp;
        uint64_t verdict[2] = {0, 0};
        if (!c->server) {
                wp = (struct ex_wire_params){htonl(o->transport), htonl(o->op),
                                             htonl(o->validate),  htonl(o->window),
                                             htobe64(o->size),    htobe64(o->iters)};
                if (ex_write_all(c->oob, &wp, sizeof(wp)) < 0 ||
                    ex_read_all(c->oob, verdict, sizeof(verdict)) < 0)
                        return ex_fail("side channel: parameters", -EPIPE);
                if (verdict[0]) {
                        fprintf(stderr,
                                "%s: refused by the server: --size %llu (%s %s) needs %.2f GiB "
                                "of buffers there, more than the %.2f GiB it can allocate\n",
                                o->prog ? o->prog : "diwarp", (unsigned long long)o->size,
                                ex_transport_name(o->transport), ex_op_name(o->op),
                                ex_gib(be64toh(verdict[0])), ex_gib(be64toh(verdict[1])));
                        return -1;
                }
        } else {
                if (ex_read_all(c->oob, &wp, sizeof(wp)) < 0)
                        return -1;
                c->o.transport = ntohl(wp.transport);
                c->o.op = ntohl(wp.op);
                c->o.validate = ntohl(wp.validate);
                c->o.window = ntohl(wp.window);
                c->o.size = be64toh(wp.size);
                c->o.iters = be64toh(wp.iters);
                if (c->o.transport > EX_RD || c->o.op > EX_READ || c->o.size > EX_MAX_SIZE) {
                        fprintf(stderr, "%s: side channel: parameters out of range\n",
                                o->prog ? o->prog : "diwarp");
                        return -1;
                }
                struct ex_layout l = layout(&c->o, true);
                uint64_t need = ex_buf_need(&c->o, l);
                uint64_t avail = ex_check_fits(&c->o, l, need);
                if (avail) {
                        verdict[0] = htobe64(need);
                        verdict[1] = htobe64(avail);
                }
                if (ex_write_all(c->oob, verdict, sizeof(verdict)) < 0 || avail)
                        return -1;
        }
        o = &c->o;
        /* 2. resources */
        struct diwarp_open_opts oo = {.addr = o->addr};
        if ((err = diwarp_device_open(&oo, &c->dev)))
                return ex_fail("device open", err);
        if ((err = diwarp_pd_alloc(c->dev, &c->pd)))
                return ex_fail("PD alloc", err);
        struct ex_layout l = layout(o, c->server);
        uint32_t depth = l.nrecv + EX_CREDIT_SLOTS + 64;
        if ((err = diwarp_cq_create(c->dev, (int)(depth * 2 + 64), NULL, NULL, &c->cq)))
                return ex_fail("CQ create", err);
        c->nrecv = l.nrecv;
        c->slot_len = o->size + (o->transport == EX_UD ? EX_GRH : 0);
        size_t send_len = l.send_len ? l.send_len : 1;
        c->buf_len = ex_buf_need(o, l);
        c->buf = aligned_alloc(4096, (c->buf_len + 4095) & ~(size_t)4095);
        if (!c->buf)
                return ex_fail("buffer", -ENOMEM);
        memset(c->buf, 0, c->buf_len);
        c->send_area = c->buf;
        c->recv_area = l.nrecv ? c->buf + send_len : c->buf;
        c->credit_area = c->buf + send_len + (size_t)l.nrecv * c->slot_len;
        err = diwarp_mr_reg(c->pd, c->buf, c->buf_len, (uintptr_t)c->buf,
                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                DIWARP_ACCESS_REMOTE_READ,
                            &c->mr);
        if (err)
                return ex_fail("MR register", err);
        struct diwarp_mr_info mi;
        diwarp_mr_info(c->mr, &mi);
        c->lkey = mi.lkey;
        struct diwarp_qp_init_attr ia = {
            .send_cq = c->cq,
            .recv_cq = c->cq,
            .qp_type = o->transport == EX_UD ? DIWARP_QPT_UD : DIWARP_QPT_RC,
            .cap = {.max_send_wr = 256,
                    .max_recv_wr = l.nrecv + EX_CREDIT_SLOTS + 1,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
        };
        err = o->transport == EX_RD ? diwarpdv_create_qp(c->pd, &ia, &c->qp)
                                    : diwarp_qp_create(c->pd, &ia, &c->qp);
        if (err)
                return ex_fail("QP create", err);
        /* 3. exchange QPN, GID, rkey, address */
        union diwarp_gid gid;
        /* The GID of the address the side channel left from, as rdma_cm's
         * route resolution picks it: a peer reached at 127.0.0.1 is talked to
         * there (GID 0, the default route's address, costs the kernel an
         * uncached route per datagram between two ends on one host). */
        err = diwarp_device_gid_of_socket(c->dev, c->oob, &gid);
        if (err < 0)
                return ex_fail("device GID", err);
        c->sgid_index = (uint8_t)err;
        struct ex_wire_info mine = {.qpn = htonl(diwarp_qp_num(c->qp)),
                                    .rkey = htonl(mi.rkey),
                                    .addr = htobe64((uintptr_t)c->send_area),
                                    .recv_addr = htobe64((uintptr_t)c->recv_area)},
                            peer;
        memcpy(mine.gid, gid.raw, 16);
        if (ex_write_all(c->oob, &mine, sizeof(mine)) < 0 ||
            ex_read_all(c->oob, &peer, sizeof(peer)) < 0)
                return ex_fail("side channel exchange", -EPIPE);
        c->peer_qpn = ntohl(peer.qpn);
        c->peer_rkey = ntohl(peer.rkey);
        c->peer_addr = be64toh(peer.addr);
        c->peer_recv_addr = be64toh(peer.recv_addr);
        memcpy(c->peer_gid.raw, peer.gid, 16);
        /* 4. connect */
        return ex_connect_qp(c);
}

void ex_teardown(struct ex_ctx *c)
{
        if (c->qp)
                diwarp_qp_destroy(c->qp);
        if (c->ah)
                diwarp_ah_destroy(c->ah);
        if (c->mr)
                diwarp_mr_dereg(c->mr);
        if (c->cq)
                diwarp_cq_destroy(c->cq);
        if (c->pd)
                diwarp_pd_dealloc(c->pd);
        if (c->dev)
                diwarp_device_close(c->dev);
        free(c->buf);
        if (c->oob >= 0)
                close(c->oob);
}

/* ---- posting ------------------------------------------------------------------ */

int ex_post_recv_slot(struct ex_ctx *c, uint32_t i)
{
        struct diwarp_sge sge = {(uintptr_t)(c->recv_area + (size_t)i * c->slot_len),
                                 (uint32_t)c->slot_len, c->lkey};
        struct diwarp_recv_wr wr = {.wr_id = EX_WRID_RECV | i, .sg_list = &sge, .num_sge = 1}, *bad;
        return diwarp_post_recv(c->qp, &wr, &bad);
}

int ex_post_credit_recv(struct ex_ctx *c, uint32_t i)
{
        struct diwarp_sge sge = {(uintptr_t)(c->credit_area + (size_t)i * 64), 64, c->lkey};
        struct diwarp_recv_wr wr = {.wr_id = EX_WRID_CREDIT | i, .sg_list = &sge, .num_sge = 1},
                              *bad;
        return diwarp_post_recv(c->qp, &wr, &bad);
}

int ex_post_send(struct ex_ctx *c, uint64_t wr_id, void *addr, uint32_t len, bool signaled,
                 enum diwarp_wr_opcode op, uint32_t imm)
{
        struct diwarp_sge sge = {(uintptr_t)addr, len, c->lkey};
        struct diwarp_send_wr wr = {.wr_id = wr_id,
                                    .sg_list = &sge,
                                    .num_sge = len ? 1 : 0,
                                    .opcode = op,
                                    .send_flags = signaled ? DIWARP_SEND_SIGNALED : 0,
                                    .imm_data = htonl(imm)},
                              *bad;
        if (c->o.transport == EX_UD || c->o.transport == EX_RD) {
                wr.wr.ud.ah = c->ah;
                wr.wr.ud.remote_qpn = c->peer_qpn;
                wr.wr.ud.remote_qkey = EX_QKEY;
        }
        return diwarp_post_send(c->qp, &wr, &bad);
}

int ex_post_rdma(struct ex_ctx *c, uint64_t wr_id, bool read, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)(read ? c->recv_area : c->send_area), len, c->lkey};
        struct diwarp_send_wr wr = {.wr_id = wr_id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = read ? DIWARP_WR_RDMA_READ : DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED},
                              *bad;
        wr.wr.rdma.remote_addr = read ? c->peer_addr : c->peer_recv_addr;
        wr.wr.rdma.rkey = c->peer_rkey;
        if (c->o.transport == EX_RD) {
                struct diwarpdv_rd_dest d = {c->ah, c->peer_qpn, EX_QKEY};
                return diwarpdv_post_send_rd(c->qp, &wr, &d, &bad);
        }
        return diwarp_post_send(c->qp, &wr, &bad);
}

int ex_poll1(struct ex_ctx *c, struct diwarp_wc *wc)
{
        uint64_t deadline = ex_now_ns() + (uint64_t)c->o.timeout_ms * 1000000ull;
        for (unsigned spin = 0;; spin++) {
                int n = diwarp_cq_poll(c->cq, 1, wc);
                if (n < 0) {
                        fprintf(stderr, "poll CQ: %s\n", strerror(-n));
                        return -1;
                }
                if (n == 1)
                        return 1;
                if ((spin & 255) == 255 && ex_now_ns() > deadline)
                        return 0;
        }
}

void ex_fill(uint8_t *p, uint64_t len, uint64_t s)
{
        for (uint64_t i = 0; i < len; i++)
                p[i] = ex_pat(i, s);
}

int64_t ex_check(const uint8_t *p, uint64_t len, uint64_t s)
{
        for (uint64_t i = 0; i < len; i++)
                if (p[i] != ex_pat(i, s))
                        return (int64_t)i;
        return -1;
}

int ex_serve_until_done(struct ex_ctx *c)
{
        struct pollfd p = {.fd = c->oob, .events = POLLIN};
        for (unsigned spin = 0;; spin++) {
                int n = diwarp_progress(c->dev, 64);
                if (n < 0)
                        return -1;
                if ((spin & 63) == 0 && poll(&p, 1, 0) == 1)
                        break;
        }
        uint64_t v;
        return ex_read_all(c->oob, &v, sizeof(v));
}

int ex_done(struct ex_ctx *c)
{
        uint64_t v = 0;
        return ex_write_all(c->oob, &v, sizeof(v));
}

int ex_finish(struct ex_ctx *c, bool ok, uint64_t val, bool *peer_ok, uint64_t *peer_val)
{
        uint64_t w[2] = {htobe64(ok), htobe64(val)}, r[2];
        if (ex_write_all(c->oob, w, sizeof(w)) < 0)
                return -1;
        /* The device keeps making progress while the peer finishes: our last
         * message may still be on its way (an RD Send waiting for the
         * receiver's credits, a retransmission), and with application-driven
         * progress nothing else moves it. */
        struct pollfd pfd = {.fd = c->oob, .events = POLLIN};
        while (poll(&pfd, 1, 1) == 0 || (pfd.revents == 0))
                if (c->dev)
                        diwarp_progress(c->dev, 64);
        if (ex_read_all(c->oob, r, sizeof(r)) < 0)
                return -1;
        if (peer_ok)
                *peer_ok = be64toh(r[0]) != 0;
        if (peer_val)
                *peer_val = be64toh(r[1]);
        return 0;
}
