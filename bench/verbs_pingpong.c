/* bench-verbs-pingpong / bench-native-pingpong: one RC Send ping-pong, built
 * twice from this file: against libibverbs (run under `diwarp run`) and, with
 * VP_NATIVE, against the native API. bench/provider-vs-native.sh compares the
 * two, so their ratio is the cost of the verbs provider and nothing else.
 *
 *   server: bench-X-pingpong [-d DEV] [--port P]
 *   client: bench-X-pingpong [-d DEV] [--port P] [--size B] [--iters N]
 *                            [--loop example|perftest] [--wr] HOST
 *
 * Only the set-up and the three calls of the loop (post a Send, post a
 * receive, poll one completion) differ between the builds; the loops are the
 * same lines. Two loops (the client's --loop is used by both sides):
 *   example   what examples/pingpong.c (run_send) does: one CQ for sends and
 *             receives, two receive slots posted ahead, every Send signaled
 *             and not inline, the slot reposted after the Send, so off the
 *             round trip.
 *   perftest  what perftest's ib_send_lat does per message: separate send
 *             and receive CQs, the receive reposted as soon as a message
 *             arrives (before the answer is sent, so on the round trip),
 *             Sends inline (size <= 64) and signaled every 100th, the
 *             program then waiting for that completion on the send CQ.
 * --wr (verbs build, both sides): the QP comes from ibv_create_qp_ex with
 * send_ops_flags and each Send is posted with ibv_wr_start / ibv_wr_send /
 * ibv_wr_set_sge (or _set_inline_data) / ibv_wr_complete instead of
 * ibv_post_send: beside a run without it, the cost of the extended QP API.
 * lat_us is half the average round trip; the last line printed is the RESULT
 * line, in the format of diwarp-pingpong.
 */
#define _GNU_SOURCE
#ifdef VP_NATIVE
#include <diwarp/diwarp.h>
#else
#include <infiniband/verbs.h>
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* the sizes and wr_id tags of examples/common.h */
#define VP_CREDIT_SLOTS 16
#define VP_WRID_RECV    0x1000000000000000ull
#define VP_WRID_SEND    0x3000000000000000ull
#define VP_WRID_MASK    0xf000000000000000ull
#define VP_NRECV        2
/* perftest: a signaled Send every cq_mod (100) messages; inline up to 64 B */
#define VP_CQ_MOD 100
#define VP_INLINE 64

/* The API the loops call: the types, flags and calls that differ by name. */
#ifdef VP_NATIVE
#define VP_API           "native"
#define vp_sge           diwarp_sge
#define vp_recv_wr       diwarp_recv_wr
#define vp_send_wr       diwarp_send_wr
#define vp_wc            diwarp_wc
#define VP_WC_SUCCESS    DIWARP_WC_SUCCESS
#define VP_WR_SEND       DIWARP_WR_SEND
#define VP_SIGNALED      DIWARP_SEND_SIGNALED
#define VP_SEND_INLINE   DIWARP_SEND_INLINE
#define vp_status_str    diwarp_wc_status_str
#define vp_post_send_    diwarp_post_send
#define vp_post_recv_    diwarp_post_recv
#define vp_poll_cq(c, w) diwarp_cq_poll(c, 1, w)
#else
#define VP_API           "verbs"
#define vp_sge           ibv_sge
#define vp_recv_wr       ibv_recv_wr
#define vp_send_wr       ibv_send_wr
#define vp_wc            ibv_wc
#define VP_WC_SUCCESS    IBV_WC_SUCCESS
#define VP_WR_SEND       IBV_WR_SEND
#define VP_SIGNALED      IBV_SEND_SIGNALED
#define VP_SEND_INLINE   IBV_SEND_INLINE
#define vp_status_str    ibv_wc_status_str
#define vp_post_send_    ibv_post_send
#define vp_post_recv_    ibv_post_recv
#define vp_poll_cq(c, w) ibv_poll_cq(c, 1, w)
#endif

struct vp {
        const char *dev, *host;
        uint16_t port;
        uint64_t size, iters;
        int timeout_ms;
        bool server;
        int oob;
        bool perftest_loop;
        bool wr_api; /* --wr: ibv_wr_* posting (verbs build) */
#ifdef VP_NATIVE
        struct diwarp_device *ctx;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq, *rcq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
#else
        struct ibv_context *ctx;
        struct ibv_pd *pd;
        struct ibv_cq *cq, *rcq;
        struct ibv_qp *qp;
        struct ibv_qp_ex *qpx;
        struct ibv_mr *mr;
#endif
        uint8_t *buf, *send_area, *recv_area;
        size_t slot_len;
        uint32_t lkey;
};

static struct vp v = {.port = 18515, .size = 64, .iters = 1000, .timeout_ms = 5000, .oob = -1};

static uint64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int io_all(int fd, void *p, size_t n, bool wr)
{
        uint8_t *b = p;
        while (n) {
                ssize_t r = wr ? write(fd, b, n) : read(fd, b, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return -1;
                b += r;
                n -= (size_t)r;
        }
        return 0;
}

/* Both sides write first, then read: a barrier that also swaps a value. */
static int swap_bytes(void *mine, void *theirs, size_t n)
{
        return io_all(v.oob, mine, n, true) || io_all(v.oob, theirs, n, false) ? -1 : 0;
}

static int oob_open(void)
{
        int one = 1, fd = -1;
        if (v.server) {
                struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(v.port)};
                int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (lfd < 0)
                        return -1;
                setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 1) < 0) {
                        fprintf(stderr, "side channel: port %u: %s\n", v.port, strerror(errno));
                        close(lfd);
                        return -1;
                }
                fd = accept(lfd, NULL, NULL);
                close(lfd);
        } else {
                struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
                char port[16];
                snprintf(port, sizeof(port), "%u", v.port);
                if (getaddrinfo(v.host, port, &hints, &ai) != 0) {
                        fprintf(stderr, "side channel: cannot resolve %s\n", v.host);
                        return -1;
                }
                uint64_t deadline = now_ns() + 10ull * 1000000000ull;
                while (now_ns() < deadline) {
                        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                        if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
                                break;
                        close(fd);
                        fd = -1;
                        usleep(50000);
                }
                freeaddrinfo(ai);
        }
        if (fd < 0) {
                fprintf(stderr, "side channel: no connection on port %u\n", v.port);
                return -1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
}

static int fail(const char *what, int err)
{
        fprintf(stderr, "%s: %s\n", what, strerror(err < 0 ? -err : err ? err : errno));
        return -1;
}

/* Buffer layout and sizes of examples/common.c (ex_setup with 2 slots). */
static size_t layout(void)
{
        v.slot_len = v.size;
        size_t send_len = v.size ? v.size : 1;
        size_t len = send_len + VP_NRECV * v.slot_len + VP_CREDIT_SLOTS * 64 + 64;
        v.buf = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
        if (!v.buf)
                return 0;
        memset(v.buf, 0, len);
        v.send_area = v.buf;
        v.recv_area = v.buf + send_len;
        return len;
}

#define VP_CQE   ((VP_NRECV + VP_CREDIT_SLOTS + 64) * 2 + 64)
#define VP_MAXRX (VP_NRECV + VP_CREDIT_SLOTS + 1)

#ifdef VP_NATIVE
static int open_qp(void)
{
        int err;
        struct diwarp_open_opts oo = {0};
        if ((err = diwarp_device_open(&oo, &v.ctx)))
                return fail("device open", err);
        if ((err = diwarp_pd_alloc(v.ctx, &v.pd)))
                return fail("PD alloc", err);
        if ((err = diwarp_cq_create(v.ctx, VP_CQE, NULL, NULL, &v.cq)))
                return fail("CQ create", err);
        if (v.perftest_loop && (err = diwarp_cq_create(v.ctx, VP_CQE, NULL, NULL, &v.rcq)))
                return fail("CQ create", err);
        size_t len = layout();
        if (!len)
                return fail("buffer", ENOMEM);
        err = diwarp_mr_reg(v.pd, v.buf, len, (uintptr_t)v.buf,
                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                DIWARP_ACCESS_REMOTE_READ,
                            &v.mr);
        if (err)
                return fail("MR register", err);
        struct diwarp_mr_info mi;
        diwarp_mr_info(v.mr, &mi);
        v.lkey = mi.lkey;
        struct diwarp_qp_init_attr ia = {
            .send_cq = v.cq,
            .recv_cq = v.rcq ? v.rcq : v.cq,
            .qp_type = DIWARP_QPT_RC,
            .cap = {.max_send_wr = 256,
                    .max_recv_wr = VP_MAXRX,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = VP_INLINE},
        };
        if ((err = diwarp_qp_create(v.pd, &ia, &v.qp)))
                return fail("QP create", err);
        return 0;
}

static int connect_qp(uint32_t qpn, const uint8_t *gid)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .port_num = 1,
                                   .qp_access_flags = DIWARP_ACCESS_LOCAL_WRITE |
                                                      DIWARP_ACCESS_REMOTE_WRITE |
                                                      DIWARP_ACCESS_REMOTE_READ};
        int err = diwarp_qp_modify(v.qp, &a,
                                   DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                       DIWARP_QP_ACCESS_FLAGS);
        if (err)
                return fail("modify to INIT", err);
        a.qp_state = DIWARP_QPS_RTR;
        memcpy(a.dgid.raw, gid, 16);
        a.dest_qp_num = qpn;
        a.path_mtu = 4096;
        a.max_dest_rd_atomic = 16;
        err = diwarp_qp_modify(v.qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN |
                                   DIWARP_QP_PATH_MTU | DIWARP_QP_RQ_PSN |
                                   DIWARP_QP_MAX_DEST_RD_ATOMIC | DIWARP_QP_MIN_RNR_TIMER);
        if (err)
                return fail("modify to RTR", err);
        a.qp_state = DIWARP_QPS_RTS;
        a.max_rd_atomic = 16;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        err = diwarp_qp_modify(v.qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_TIMEOUT |
                                   DIWARP_QP_RETRY_CNT | DIWARP_QP_RNR_RETRY |
                                   DIWARP_QP_MAX_QP_RD_ATOMIC);
        if (err)
                return fail("modify to RTS", err);
        return 0;
}

static uint32_t qp_num(void)
{
        return diwarp_qp_num(v.qp);
}

static int local_gid(uint8_t *gid)
{
        union diwarp_gid g;
        int err = diwarp_device_gid(v.ctx, &g);
        memcpy(gid, g.raw, 16);
        return err;
}

static void teardown(void)
{
        if (v.qp)
                diwarp_qp_destroy(v.qp);
        if (v.mr)
                diwarp_mr_dereg(v.mr);
        if (v.rcq)
                diwarp_cq_destroy(v.rcq);
        if (v.cq)
                diwarp_cq_destroy(v.cq);
        if (v.pd)
                diwarp_pd_dealloc(v.pd);
        if (v.ctx)
                diwarp_device_close(v.ctx);
}
#else
static int open_qp(void)
{
        int n;
        struct ibv_device **list = ibv_get_device_list(&n), *dev = NULL;
        for (int i = 0; list && i < n && !dev; i++)
                if (!v.dev || !strcmp(ibv_get_device_name(list[i]), v.dev))
                        dev = list[i];
        if (!dev) {
                fprintf(stderr, "no RDMA device%s%s\n", v.dev ? " named " : "", v.dev ? v.dev : "");
                ibv_free_device_list(list);
                return -1;
        }
        v.ctx = ibv_open_device(dev);
        ibv_free_device_list(list);
        if (!v.ctx)
                return fail("open device", 0);
        if (!(v.pd = ibv_alloc_pd(v.ctx)))
                return fail("PD alloc", 0);
        if (!(v.cq = ibv_create_cq(v.ctx, VP_CQE, NULL, NULL, 0)))
                return fail("CQ create", 0);
        if (v.perftest_loop && !(v.rcq = ibv_create_cq(v.ctx, VP_CQE, NULL, NULL, 0)))
                return fail("CQ create", 0);
        size_t len = layout();
        if (!len)
                return fail("buffer", ENOMEM);
        v.mr =
            ibv_reg_mr(v.pd, v.buf, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        if (!v.mr)
                return fail("MR register", 0);
        v.lkey = v.mr->lkey;
        struct ibv_qp_init_attr ia = {
            .send_cq = v.cq,
            .recv_cq = v.rcq ? v.rcq : v.cq,
            .qp_type = IBV_QPT_RC,
            .cap = {.max_send_wr = 256,
                    .max_recv_wr = VP_MAXRX,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = VP_INLINE},
        };
        if (v.wr_api) {
                struct ibv_qp_init_attr_ex ix;
                memset(&ix, 0, sizeof(ix));
                memcpy(&ix, &ia, sizeof(ia));
                ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
                ix.pd = v.pd;
                ix.send_ops_flags = IBV_QP_EX_WITH_SEND;
                if (!(v.qp = ibv_create_qp_ex(v.ctx, &ix)) || !(v.qpx = ibv_qp_to_qp_ex(v.qp)))
                        return fail("QP create (send ops)", 0);
                return 0;
        }
        if (!(v.qp = ibv_create_qp(v.pd, &ia)))
                return fail("QP create", 0);
        return 0;
}

static int connect_qp(uint32_t qpn, const uint8_t *gid)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                                .port_num = 1,
                                .qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
                                                   IBV_ACCESS_REMOTE_WRITE |
                                                   IBV_ACCESS_REMOTE_READ};
        int err = ibv_modify_qp(
            v.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        if (err)
                return fail("modify to INIT", err);
        /* IB-style connect, as the native set-up: the peer's GID and QPN */
        a.qp_state = IBV_QPS_RTR;
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
        a.ah_attr.port_num = 1;
        a.dest_qp_num = qpn;
        a.path_mtu = IBV_MTU_4096;
        a.max_dest_rd_atomic = 16;
        err = ibv_modify_qp(v.qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_PATH_MTU |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        if (err)
                return fail("modify to RTR", err);
        a.qp_state = IBV_QPS_RTS;
        a.max_rd_atomic = 16;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        err = ibv_modify_qp(v.qp, &a,
                            IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
        if (err)
                return fail("modify to RTS", err);
        return 0;
}

static uint32_t qp_num(void)
{
        return v.qp->qp_num;
}

static int local_gid(uint8_t *gid)
{
        union ibv_gid g;
        int err = ibv_query_gid(v.ctx, 1, 0, &g);
        memcpy(gid, g.raw, 16);
        return err;
}

static void teardown(void)
{
        if (v.qp)
                ibv_destroy_qp(v.qp);
        if (v.mr)
                ibv_dereg_mr(v.mr);
        if (v.rcq)
                ibv_destroy_cq(v.rcq);
        if (v.cq)
                ibv_destroy_cq(v.cq);
        if (v.pd)
                ibv_dealloc_pd(v.pd);
        if (v.ctx)
                ibv_close_device(v.ctx);
}
#endif

static int setup(void)
{
        if ((v.oob = oob_open()) < 0)
                return -1;
        /* the client's size, iteration count and loop are used by both sides */
        uint64_t params[3] = {htobe64(v.size), htobe64(v.iters), htobe64(v.perftest_loop)}, peer[3];
        if (swap_bytes(params, peer, sizeof(params)))
                return fail("side channel", EPIPE);
        if (v.server) {
                v.size = be64toh(peer[0]);
                v.iters = be64toh(peer[1]);
                v.perftest_loop = be64toh(peer[2]) != 0;
        }
        if (open_qp())
                return -1;
        struct {
                uint32_t qpn;
                uint8_t gid[16];
        } mine = {.qpn = htonl(qp_num())}, theirs;
        if (local_gid(mine.gid))
                return fail("query GID", 0);
        if (swap_bytes(&mine, &theirs, sizeof(mine)))
                return fail("side channel", EPIPE);
        return connect_qp(ntohl(theirs.qpn), theirs.gid);
}

/* ---- the loops: from here on, both builds run the same lines ---------------- */

static int post_recv_slot(uint32_t i)
{
        struct vp_sge sge = {(uintptr_t)(v.recv_area + (size_t)i * v.slot_len),
                             (uint32_t)v.slot_len, v.lkey};
        struct vp_recv_wr wr = {.wr_id = VP_WRID_RECV | i, .sg_list = &sge, .num_sge = 1}, *bad;
        return vp_post_recv_(v.qp, &wr, &bad);
}

static int post_send(uint64_t wr_id, void *addr, uint32_t len, unsigned flags)
{
#ifndef VP_NATIVE
        if (v.qpx) {
                struct ibv_qp_ex *q = v.qpx;
                ibv_wr_start(q);
                q->wr_id = wr_id;
                q->wr_flags = flags & ~(unsigned)IBV_SEND_INLINE;
                ibv_wr_send(q);
                if (flags & IBV_SEND_INLINE)
                        ibv_wr_set_inline_data(q, addr, len);
                else
                        ibv_wr_set_sge(q, v.lkey, (uintptr_t)addr, len);
                return ibv_wr_complete(q);
        }
#endif
        struct vp_sge sge = {(uintptr_t)addr, len, v.lkey};
        struct vp_send_wr wr = {.wr_id = wr_id,
                                .sg_list = &sge,
                                .num_sge = len ? 1 : 0,
                                .opcode = VP_WR_SEND,
                                .send_flags = flags},
                          *bad;
        return vp_post_send_(v.qp, &wr, &bad);
}

/* One completion of cq (the examples' ex_poll1): 1, 0 on timeout, -1. */
static int poll1(__typeof__(v.cq) cq, struct vp_wc *wc)
{
        uint64_t deadline = now_ns() + (uint64_t)v.timeout_ms * 1000000ull;
        for (unsigned spin = 0;; spin++) {
                int n = vp_poll_cq(cq, wc);
                if (n < 0) {
                        fprintf(stderr, "poll CQ: %d\n", n);
                        return -1;
                }
                if (n == 1)
                        return 1;
                if ((spin & 255) == 255 && now_ns() > deadline)
                        return 0;
        }
}

static bool wc_ok(int r, const struct vp_wc *wc)
{
        if (r <= 0) {
                fprintf(stderr, "timeout waiting for a completion\n");
                return false;
        }
        if (wc->status != VP_WC_SUCCESS) {
                fprintf(stderr, "completion wr_id %#llx: %s\n", (unsigned long long)wc->wr_id,
                        vp_status_str(wc->status));
                return false;
        }
        return true;
}

/* The next receive completion; send completions are dropped. Slot or -1. */
static int wait_recv(__typeof__(v.cq) cq)
{
        struct vp_wc wc;
        for (;;) {
                if (!wc_ok(poll1(cq, &wc), &wc))
                        return -1;
                if ((wc.wr_id & VP_WRID_MASK) == VP_WRID_RECV) {
                        if (wc.byte_len != (uint32_t)v.size) {
                                fprintf(stderr, "received %u bytes, expected %llu\n", wc.byte_len,
                                        (unsigned long long)v.size);
                                return -1;
                        }
                        return (int)(wc.wr_id & 0xffffffffu);
                }
        }
}

static bool run_example(void)
{
        const uint64_t n = v.iters;
        uint32_t len = (uint32_t)v.size;
        for (uint64_t k = 0; k < n; k++) {
                if (v.server) {
                        int s = wait_recv(v.cq);
                        if (s < 0)
                                return false;
                        if (post_send(VP_WRID_SEND | k, v.send_area, len, VP_SIGNALED) ||
                            post_recv_slot((uint32_t)s))
                                return false;
                } else {
                        if (post_send(VP_WRID_SEND | k, v.send_area, len, VP_SIGNALED))
                                return false;
                        /* the slot of answer k-1 goes back after send k */
                        if (k > 0 && post_recv_slot((uint32_t)((k - 1) & 1)))
                                return false;
                        if (wait_recv(v.cq) < 0)
                                return false;
                }
        }
        return true;
}

static bool run_perftest(void)
{
        const uint64_t n = v.iters;
        uint32_t len = (uint32_t)v.size;
        unsigned inl = len <= VP_INLINE ? VP_SEND_INLINE : 0;
        uint64_t sent = 0, got = 0;
        struct vp_wc wc;
        while (sent < n || got < n) {
                /* the client sends first */
                if (got < n && (v.server || sent > 0)) {
                        int s = wait_recv(v.rcq);
                        if (s < 0)
                                return false;
                        got++;
                        if (got + VP_NRECV <= n && post_recv_slot((uint32_t)s))
                                return false;
                }
                if (sent < n) {
                        sent++;
                        bool sig = sent % VP_CQ_MOD == 0 || sent == n;
                        if (post_send(VP_WRID_SEND | sent, v.send_area, len,
                                      inl | (sig ? VP_SIGNALED : 0)))
                                return false;
                        if (sig && !wc_ok(poll1(v.cq, &wc), &wc))
                                return false;
                }
        }
        return true;
}

static bool run(double *lat_us)
{
        uint64_t sync = 0, peer;
        if (post_recv_slot(0) || post_recv_slot(1) || swap_bytes(&sync, &peer, sizeof(sync)))
                return false;
        memset(v.send_area, 0x5a, v.size);
        uint64_t t0 = now_ns();
        bool ok = v.perftest_loop ? run_perftest() : run_example();
        uint64_t t1 = now_ns();
        *lat_us = (double)(t1 - t0) / 1e3 / (double)v.iters / 2.0;
        return ok;
}

static void usage(void)
{
        fprintf(stderr,
                "usage: bench-%s-pingpong [-d DEV] [--port P] [--size B] [--iters N] "
                "[--loop example|perftest] [--timeout MS] [--wr (verbs)] [HOST]\n",
                VP_API);
        exit(2);
}

int main(int argc, char **argv)
{
        static const struct option lo[] = {
            {"ib-dev", required_argument, NULL, 'd'}, {"port", required_argument, NULL, 'p'},
            {"size", required_argument, NULL, 's'},   {"iters", required_argument, NULL, 'n'},
            {"loop", required_argument, NULL, 'l'},   {"timeout", required_argument, NULL, 'T'},
            {"wr", no_argument, NULL, 'w'},           {NULL, 0, NULL, 0},
        };
        int ch;
        char *end;
        while ((ch = getopt_long(argc, argv, "d:p:s:n:l:T:w", lo, NULL)) != -1) {
                switch (ch) {
                case 'd':
                        v.dev = optarg;
                        break;
                case 'p':
                        v.port = (uint16_t)strtoul(optarg, &end, 0);
                        if (*end)
                                usage();
                        break;
                case 's':
                        v.size = strtoull(optarg, &end, 0);
                        if (*end || v.size > (1ull << 31))
                                usage();
                        break;
                case 'n':
                        v.iters = strtoull(optarg, &end, 0);
                        if (*end || !v.iters)
                                usage();
                        break;
                case 'l':
                        if (!strcmp(optarg, "perftest"))
                                v.perftest_loop = true;
                        else if (strcmp(optarg, "example"))
                                usage();
                        break;
                case 'T':
                        v.timeout_ms = atoi(optarg);
                        break;
                case 'w':
#ifdef VP_NATIVE
                        usage();
#endif
                        v.wr_api = true;
                        break;
                default:
                        usage();
                }
        }
        if (optind < argc)
                v.host = argv[optind++];
        if (optind < argc)
                usage();
        v.server = v.host == NULL;
        double lat = 0;
        bool ok = setup() == 0 && run(&lat);
        uint64_t mine = htobe64(ok), theirs = 0;
        if (v.oob < 0 || swap_bytes(&mine, &theirs, sizeof(mine)) || !theirs)
                ok = false;
        teardown();
        free(v.buf);
        if (v.oob >= 0)
                close(v.oob);
        printf("RESULT api=%s transport=rc op=send loop=%s size=%llu iters=%llu status=%s "
               "lat_us=%.2f\n",
               v.wr_api ? VP_API "-wr" : VP_API, v.perftest_loop ? "perftest" : "example",
               (unsigned long long)v.size, (unsigned long long)v.iters, ok ? "ok" : "fail", lat);
        return ok ? 0 : 1;
}
