/* See bcommon.h. */
#define _GNU_SOURCE
#include "bcommon.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarpdv.h>

uint64_t bc_now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *bc_transport_name(enum bc_transport t)
{
        return t == BC_RC ? "rc" : t == BC_RD ? "rd" : "ud";
}

static void bc_usage(const char *prog, const char *const *modes)
{
        fprintf(stderr,
                "usage: %s [--transport ud|rc|rd] [--size B] [--iters N] [--qps K] [--window W]\n"
                "          [--duration-ms MS] [--reps R] [--op read|write] [--bidir] [--block]\n"
                "          [--pool BYTES] [--port P] [--addr A] [--cpu C] [--timeout MS]",
                prog);
        if (modes && modes[0]) {
                fprintf(stderr, " [--mode");
                for (int i = 0; modes[i]; i++)
                        fprintf(stderr, "%s%s", i ? "|" : " ", modes[i]);
                fprintf(stderr, "]");
        }
        fprintf(stderr, " [HOST]\n  without HOST: serve one client; with HOST: drive the run.\n");
        exit(2);
}

static uint64_t bc_num(const char *s, const char *prog, const char *const *modes)
{
        char *end;
        errno = 0;
        uint64_t v = strtoull(s, &end, 0);
        if (errno || end == s)
                bc_usage(prog, modes);
        /* size suffixes keep the harness's command lines readable */
        if (*end == 'k' || *end == 'K')
                v <<= 10, end++;
        else if (*end == 'm' || *end == 'M')
                v <<= 20, end++;
        if (*end)
                bc_usage(prog, modes);
        return v;
}

void bc_parse(int argc, char **argv, struct bc_opts *o, const char *prog, const char *const *modes)
{
        static const struct option lo[] = {
            {"transport", required_argument, NULL, 't'},
            {"size", required_argument, NULL, 's'},
            {"iters", required_argument, NULL, 'n'},
            {"qps", required_argument, NULL, 'k'},
            {"window", required_argument, NULL, 'w'},
            {"duration-ms", required_argument, NULL, 'D'},
            {"reps", required_argument, NULL, 'r'},
            {"mode", required_argument, NULL, 'm'},
            {"op", required_argument, NULL, 'o'},
            {"bidir", no_argument, NULL, 'b'},
            {"block", no_argument, NULL, 'B'},
            {"pool", required_argument, NULL, 'P'},
            {"port", required_argument, NULL, 'p'},
            {"addr", required_argument, NULL, 'a'},
            {"cpu", required_argument, NULL, 'c'},
            {"timeout", required_argument, NULL, 'T'},
            {"help", no_argument, NULL, 'h'},
            {NULL, 0, NULL, 0},
        };
        memset(o, 0, sizeof(*o));
        o->size = 8;
        o->iters = 10000;
        o->qps = 1;
        o->window = 64;
        o->duration_ms = 1000;
        o->reps = 5;
        o->port = 18600;
        o->cpu = -1;
        o->timeout_ms = 10000;
        o->mode_name = modes && modes[0] ? modes[0] : "";
        int ch;
        while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
                switch (ch) {
                case 't':
                        if (!strcmp(optarg, "ud"))
                                o->transport = BC_UD;
                        else if (!strcmp(optarg, "rc"))
                                o->transport = BC_RC;
                        else if (!strcmp(optarg, "rd"))
                                o->transport = BC_RD;
                        else
                                bc_usage(prog, modes);
                        break;
                case 's':
                        o->size = bc_num(optarg, prog, modes);
                        break;
                case 'n':
                        o->iters = bc_num(optarg, prog, modes);
                        break;
                case 'k':
                        o->qps = (uint32_t)bc_num(optarg, prog, modes);
                        break;
                case 'w':
                        o->window = (uint32_t)bc_num(optarg, prog, modes);
                        break;
                case 'D':
                        o->duration_ms = (uint32_t)bc_num(optarg, prog, modes);
                        break;
                case 'r':
                        o->reps = (uint32_t)bc_num(optarg, prog, modes);
                        break;
                case 'm': {
                        int i = 0;
                        while (modes && modes[i] && strcmp(modes[i], optarg))
                                i++;
                        if (!modes || !modes[i])
                                bc_usage(prog, modes);
                        o->mode = (uint32_t)i;
                        o->mode_name = modes[i];
                        break;
                }
                case 'o':
                        if (!strcmp(optarg, "read"))
                                o->op = 0;
                        else if (!strcmp(optarg, "write"))
                                o->op = 1;
                        else
                                bc_usage(prog, modes);
                        break;
                case 'b':
                        o->bidir = 1;
                        break;
                case 'B':
                        o->block = 1;
                        break;
                case 'P':
                        o->pool = bc_num(optarg, prog, modes);
                        break;
                case 'p':
                        o->port = (uint16_t)bc_num(optarg, prog, modes);
                        break;
                case 'a':
                        o->addr = optarg;
                        break;
                case 'c':
                        o->cpu = atoi(optarg);
                        break;
                case 'T':
                        o->timeout_ms = atoi(optarg);
                        break;
                default:
                        bc_usage(prog, modes);
                }
        }
        if (optind < argc)
                o->host = argv[optind++];
        if (optind < argc || o->iters == 0 || o->qps == 0 || o->window == 0 || o->reps == 0)
                bc_usage(prog, modes);
}

/* ---- side channel --------------------------------------------------------- */

int bc_write_all(int fd, const void *p, size_t n)
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

int bc_read_all(int fd, void *p, size_t n)
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

static int bc_oob_serve(const struct bc_opts *o)
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
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, o->timeout_ms > 0 ? o->timeout_ms * 3 : -1) != 1) {
                fprintf(stderr, "side channel: no client on port %u\n", o->port);
                close(lfd);
                return -1;
        }
        int fd = accept(lfd, NULL, NULL);
        close(lfd);
        if (fd >= 0)
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

static int bc_oob_connect(const struct bc_opts *o)
{
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
        char port[16];
        int one = 1;
        snprintf(port, sizeof(port), "%u", o->port);
        if (getaddrinfo(o->host, port, &hints, &ai) != 0) {
                fprintf(stderr, "side channel: cannot resolve %s\n", o->host);
                return -1;
        }
        /* the server may still be starting */
        uint64_t deadline = bc_now_ns() + 10ull * 1000000000ull;
        int fd = -1;
        while (bc_now_ns() < deadline) {
                fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        break;
                if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
                        break;
                close(fd);
                fd = -1;
                usleep(20000);
        }
        freeaddrinfo(ai);
        if (fd < 0)
                fprintf(stderr, "side channel: cannot connect to %s:%u\n", o->host, o->port);
        else
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

struct bc_wire_opts {
        uint32_t transport, qps, window, duration_ms, reps, mode, op, bidir;
        uint64_t size, iters, pool;
};

int bc_oob_open(struct bc_ctx *c, const struct bc_opts *o)
{
        memset(c, 0, sizeof(*c));
        c->oob = -1;
        c->o = *o;
        c->server = o->host == NULL;
        c->oob = c->server ? bc_oob_serve(o) : bc_oob_connect(o);
        if (c->oob < 0)
                return -1;
        struct bc_wire_opts w;
        if (!c->server) {
                w = (struct bc_wire_opts){htonl(o->transport),   htonl(o->qps),   htonl(o->window),
                                          htonl(o->duration_ms), htonl(o->reps),  htonl(o->mode),
                                          htonl(o->op),          htonl(o->bidir), htobe64(o->size),
                                          htobe64(o->iters),     htobe64(o->pool)};
                return bc_write_all(c->oob, &w, sizeof(w));
        }
        if (bc_read_all(c->oob, &w, sizeof(w)) < 0)
                return -1;
        c->o.transport = ntohl(w.transport);
        c->o.qps = ntohl(w.qps);
        c->o.window = ntohl(w.window);
        c->o.duration_ms = ntohl(w.duration_ms);
        c->o.reps = ntohl(w.reps);
        c->o.mode = ntohl(w.mode);
        c->o.op = ntohl(w.op);
        c->o.bidir = ntohl(w.bidir);
        c->o.size = be64toh(w.size);
        c->o.iters = be64toh(w.iters);
        c->o.pool = be64toh(w.pool);
        return 0;
}

int bc_exchange_u64(struct bc_ctx *c, uint64_t mine, uint64_t *theirs)
{
        uint64_t w = htobe64(mine), r;
        if (bc_write_all(c->oob, &w, sizeof(w)) < 0 || bc_read_all(c->oob, &r, sizeof(r)) < 0)
                return -1;
        if (theirs)
                *theirs = be64toh(r);
        return 0;
}

int bc_sync(struct bc_ctx *c)
{
        return bc_exchange_u64(c, 0, NULL);
}

bool bc_finish(struct bc_ctx *c, bool ok)
{
        uint64_t peer = 0;
        /* A failed side says nothing: it closes the side channel, so a peer
         * blocked anywhere in an exchange sees EOF instead of a stray word. */
        if (!ok || c->oob < 0 || bc_exchange_u64(c, 1, &peer) < 0)
                return false;
        return ok && peer == 1;
}

int bc_pin(int cpu)
{
        if (cpu < 0)
                return 0;
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        int e = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
        if (e)
                fprintf(stderr, "pin to cpu %d: %s\n", cpu, strerror(e));
        return e ? -1 : 0;
}

/* ---- setup -------------------------------------------------------------------- */

int bc_fail(struct bc_ctx *c, const char *what, int err)
{
        if (err == -EOPNOTSUPP)
                c->unsupported = true;
        fprintf(stderr, "%s: %s\n", what, strerror(-err));
        return -1;
}

struct bc_wire_info {
        uint8_t gid[16];
        uint32_t rkey, nqp;
        uint64_t base;
};

int bc_qp_rts(struct bc_ctx *c, struct bc_qp *q)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT, .port_num = 1, .qkey = BC_QKEY};
        int err;
        if (c->o.transport != BC_RC) {
                a.qp_access_flags = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                    DIWARP_ACCESS_REMOTE_READ;
                int mask = DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT | DIWARP_QP_QKEY;
                if (c->o.transport == BC_RD)
                        mask |= DIWARP_QP_ACCESS_FLAGS;
                if ((err = diwarp_qp_modify(q->qp, &a, mask)))
                        return bc_fail(c, "modify to INIT", err);
                a.qp_state = DIWARP_QPS_RTR;
                if ((err = diwarp_qp_modify(q->qp, &a, DIWARP_QP_STATE)))
                        return bc_fail(c, "modify to RTR", err);
                a.qp_state = DIWARP_QPS_RTS;
                if ((err = diwarp_qp_modify(q->qp, &a, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN)))
                        return bc_fail(c, "modify to RTS", err);
                if ((err = diwarp_ah_create(c->pd, &q->peer_gid, &q->ah)))
                        return bc_fail(c, "AH create", err);
                return 0;
        }
        a.qp_access_flags =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        err = diwarp_qp_modify(q->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                   DIWARP_QP_ACCESS_FLAGS);
        if (err)
                return bc_fail(c, "modify to INIT", err);
        /* IB-style connect (docs/PROTOCOL.md, "RC over TCP: IB-style connect"): RTR with the peer's
         * GID and QPN */
        a.qp_state = DIWARP_QPS_RTR;
        a.dgid = q->peer_gid;
        a.sgid_index = c->sgid_index;
        a.dest_qp_num = q->peer_qpn;
        a.path_mtu = 4096;
        a.max_dest_rd_atomic = 16;
        err = diwarp_qp_modify(q->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN |
                                   DIWARP_QP_PATH_MTU | DIWARP_QP_RQ_PSN |
                                   DIWARP_QP_MAX_DEST_RD_ATOMIC | DIWARP_QP_MIN_RNR_TIMER);
        if (err)
                return bc_fail(c, "modify to RTR", err);
        a.qp_state = DIWARP_QPS_RTS;
        a.max_rd_atomic = 16;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        err = diwarp_qp_modify(q->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_TIMEOUT |
                                   DIWARP_QP_RETRY_CNT | DIWARP_QP_RNR_RETRY |
                                   DIWARP_QP_MAX_QP_RD_ATOMIC);
        if (err)
                return bc_fail(c, "modify to RTS", err);
        return 0;
}

int bc_open(struct bc_ctx *c, uint32_t cqe, size_t buf_len)
{
        int err;
        const struct bc_opts *o = &c->o;
        struct diwarp_open_opts oo = {.addr = o->addr};
        if ((err = diwarp_device_open(&oo, &c->dev)))
                return bc_fail(c, "device open", err);
        /* after the open: a progress thread keeps the launch mask (taskset) */
        if (bc_pin(o->cpu))
                return -1;
        if ((err = diwarp_pd_alloc(c->dev, &c->pd)))
                return bc_fail(c, "PD alloc", err);
        if (o->block && (err = diwarp_comp_channel_create(c->dev, &c->ch)))
                return bc_fail(c, "completion channel", err);
        if ((err = diwarp_cq_create(c->dev, (int)cqe, NULL, c->ch, &c->cq)))
                return bc_fail(c, "CQ create", err);
        c->buf_len = buf_len ? buf_len : 4096;
        c->buf = mmap(NULL, c->buf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c->buf == MAP_FAILED) {
                c->buf = NULL;
                return bc_fail(c, "buffer", -ENOMEM);
        }
        memset(c->buf, 0, c->buf_len);
        err = diwarp_mr_reg(c->pd, c->buf, c->buf_len, (uintptr_t)c->buf,
                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                DIWARP_ACCESS_REMOTE_READ,
                            &c->mr);
        if (err)
                return bc_fail(c, "MR register", err);
        struct diwarp_mr_info mi;
        diwarp_mr_info(c->mr, &mi);
        c->lkey = mi.lkey;
        c->rkey = mi.rkey;
        return 0;
}

int bc_qp_create(struct bc_ctx *c, uint32_t send_wr, uint32_t recv_wr, struct diwarp_qp **out)
{
        struct diwarp_qp_init_attr ia = {
            .send_cq = c->cq,
            .recv_cq = c->cq,
            .qp_type = c->o.transport == BC_RC   ? DIWARP_QPT_RC
                       : c->o.transport == BC_RD ? DIWARP_QPT_RD
                                                 : DIWARP_QPT_UD,
            .cap = {.max_send_wr = send_wr,
                    .max_recv_wr = recv_wr,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
        };
        int err = c->o.transport == BC_RD ? diwarpdv_create_qp(c->pd, &ia, out)
                                          : diwarp_qp_create(c->pd, &ia, out);
        return err ? bc_fail(c, "QP create", err) : 0;
}

int bc_setup(struct bc_ctx *c, uint32_t nqp, size_t buf_len, uint32_t send_wr, uint32_t recv_wr)
{
        if (bc_open(c, nqp * (send_wr + recv_wr) + 64, buf_len))
                return -1;
        c->nqp = nqp;
        c->q = calloc(nqp, sizeof(*c->q));
        uint32_t *qpns = calloc(nqp, sizeof(uint32_t));
        if (!c->q || !qpns) {
                free(qpns);
                return bc_fail(c, "QP table", -ENOMEM);
        }
        for (uint32_t i = 0; i < nqp; i++) {
                if (bc_qp_create(c, send_wr, recv_wr, &c->q[i].qp)) {
                        free(qpns);
                        return -1;
                }
                qpns[i] = htonl(diwarp_qp_num(c->q[i].qp));
        }
        /* exchange: GID, rkey and buffer base once, then every QPN */
        union diwarp_gid gid;
        /* the GID of the side channel's local address (examples/common.c) */
        int sgid = diwarp_device_gid_of_socket(c->dev, c->oob, &gid);
        if (sgid < 0) {
                free(qpns);
                return bc_fail(c, "device GID", sgid);
        }
        c->sgid_index = (uint8_t)sgid;
        struct bc_wire_info mine = {.rkey = htonl(c->rkey),
                                    .nqp = htonl(nqp),
                                    .base = htobe64((uintptr_t)c->buf)},
                            peer;
        memcpy(mine.gid, gid.raw, 16);
        if (bc_write_all(c->oob, &mine, sizeof(mine)) < 0 ||
            bc_read_all(c->oob, &peer, sizeof(peer)) < 0 || ntohl(peer.nqp) != nqp ||
            bc_write_all(c->oob, qpns, nqp * sizeof(uint32_t)) < 0 ||
            bc_read_all(c->oob, qpns, nqp * sizeof(uint32_t)) < 0) {
                free(qpns);
                return bc_fail(c, "side channel exchange", -EPIPE);
        }
        for (uint32_t i = 0; i < nqp; i++) {
                struct bc_qp *q = &c->q[i];
                q->peer_qpn = ntohl(qpns[i]);
                q->peer_rkey = ntohl(peer.rkey);
                q->peer_base = be64toh(peer.base);
                memcpy(q->peer_gid.raw, peer.gid, 16);
        }
        free(qpns);
        for (uint32_t i = 0; i < nqp; i++)
                if (bc_qp_rts(c, &c->q[i]))
                        return -1;
        return 0;
}

void bc_teardown(struct bc_ctx *c)
{
        for (uint32_t i = 0; c->q && i < c->nqp; i++) {
                if (c->q[i].qp)
                        diwarp_qp_destroy(c->q[i].qp);
                if (c->q[i].ah)
                        diwarp_ah_destroy(c->q[i].ah);
        }
        free(c->q);
        c->q = NULL;
        if (c->mr)
                diwarp_mr_dereg(c->mr);
        if (c->cq)
                diwarp_cq_destroy(c->cq);
        if (c->ch)
                diwarp_comp_channel_destroy(c->ch);
        if (c->pd)
                diwarp_pd_dealloc(c->pd);
        if (c->dev)
                diwarp_device_close(c->dev);
        if (c->buf)
                munmap(c->buf, c->buf_len);
        if (c->oob >= 0)
                close(c->oob);
        c->mr = NULL, c->cq = NULL, c->ch = NULL, c->pd = NULL, c->dev = NULL, c->buf = NULL;
        c->oob = -1;
}

/* ---- posting and polling ------------------------------------------------------------ */

size_t bc_hdr(const struct bc_ctx *c)
{
        return c->o.transport == BC_RC ? 0 : BC_GRH;
}

int bc_post_recv(struct bc_ctx *c, uint32_t qi, uint64_t wr_id, void *addr, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)addr, len, c->lkey};
        struct diwarp_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
        return diwarp_post_recv(c->q[qi].qp, &wr, &bad);
}

int bc_post_send(struct bc_ctx *c, uint32_t qi, uint64_t wr_id, const void *addr, uint32_t len,
                 unsigned flags)
{
        struct diwarp_sge sge = {(uintptr_t)addr, len, c->lkey};
        struct diwarp_send_wr wr = {.wr_id = wr_id,
                                    .sg_list = &sge,
                                    .num_sge = len ? 1 : 0,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = flags},
                              *bad;
        if (c->o.transport != BC_RC) {
                wr.wr.ud.ah = c->q[qi].ah;
                wr.wr.ud.remote_qpn = c->q[qi].peer_qpn;
                wr.wr.ud.remote_qkey = BC_QKEY;
        }
        return diwarp_post_send(c->q[qi].qp, &wr, &bad);
}

int bc_post_rdma(struct bc_ctx *c, uint32_t qi, uint64_t wr_id, bool read, void *addr, uint32_t len,
                 uint64_t roff)
{
        struct diwarp_sge sge = {(uintptr_t)addr, len, c->lkey};
        struct diwarp_send_wr wr = {.wr_id = wr_id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = read ? DIWARP_WR_RDMA_READ : DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED},
                              *bad;
        /* RD names its peer with an address handle on every WR, and the native
         * API has no RDMA-with-AH form yet: report "unsupported", not a guess */
        if (c->o.transport != BC_RC)
                return -EOPNOTSUPP;
        wr.wr.rdma.remote_addr = c->q[qi].peer_base + roff;
        wr.wr.rdma.rkey = c->q[qi].peer_rkey;
        return diwarp_post_send(c->q[qi].qp, &wr, &bad);
}

int bc_poll(struct bc_ctx *c, struct diwarp_wc *wc, int n)
{
        uint64_t deadline = bc_now_ns() + (uint64_t)c->o.timeout_ms * 1000000ull;
        for (unsigned spin = 0;; spin++) {
                int got = diwarp_cq_poll(c->cq, n, wc);
                if (got < 0) {
                        fprintf(stderr, "poll CQ: %s\n", strerror(-got));
                        return -1;
                }
                if (got > 0)
                        return got;
                if (c->ch) {
                        /* arm, re-check (a completion may have slipped in), sleep */
                        int e = diwarp_cq_req_notify(c->cq, false);
                        if (e) {
                                fprintf(stderr, "req_notify: %s\n", strerror(-e));
                                return -1;
                        }
                        got = diwarp_cq_poll(c->cq, n, wc);
                        if (got != 0)
                                return got < 0 ? -1 : got;
                        int64_t left = (int64_t)(deadline - bc_now_ns()) / 1000000;
                        if (left <= 0)
                                return 0;
                        struct pollfd p = {.fd = diwarp_comp_channel_fd(c->ch), .events = POLLIN};
                        if (poll(&p, 1, (int)left) == 1) {
                                struct diwarp_cq *cq;
                                void *ctx;
                                if (diwarp_comp_channel_get_event(c->ch, &cq, &ctx) == 0)
                                        diwarp_cq_ack_events(cq, 1);
                        }
                        continue;
                }
                if ((spin & 255) == 255 && bc_now_ns() > deadline)
                        return 0;
        }
}
