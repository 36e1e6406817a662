/* The extended QP and CQ of a plain ibverbs program (linked against
 * libibverbs only) run under `diwarp run`: ibv_create_qp_ex with send_ops_flags
 * and every ibv_wr_* builder and setter diwarp offers, on RC (two contexts
 * connected over loopback) and UD; batches, a batch with a faulty WR, too
 * many WRs, wr_abort; ibv_create_cq_ex polled with start/next/end_poll and
 * every read_* the CQ was created with, a completion channel on it and
 * ibv_poll_cq on it. Each transfer's data and completions are checked.
 * Exit 0 = all checks passed; each failure prints its line.
 */
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

enum { BUF = 4096, GRH = 40, QKEY = 0x11111111, DEPTH = 8 };

#define RC_OPS                                                                                     \
        (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_SEND_WITH_INV |       \
         IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |                          \
         IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |                            \
         IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV)
#define WC_FLAGS ((uint64_t)IBV_WC_STANDARD_FLAGS)

/* One completion, every field read through the cq_ex iterator. */
struct wcx {
        uint64_t wr_id;
        enum ibv_wc_status status;
        enum ibv_wc_opcode opcode;
        uint32_t vendor_err, byte_len, imm, qp_num, src_qp, slid;
        unsigned wc_flags;
        uint8_t sl, dlid_path_bits;
        uint64_t ts, wall; /* read on the CQ created with timestamps only */
};

static struct ibv_cq_ex *ts_cq; /* the one CQ created with timestamps */

static void read_wcx(struct ibv_cq_ex *cq, struct wcx *w)
{
        w->wr_id = cq->wr_id;
        w->status = cq->status;
        w->opcode = ibv_wc_read_opcode(cq);
        w->vendor_err = ibv_wc_read_vendor_err(cq);
        w->byte_len = ibv_wc_read_byte_len(cq);
        w->wc_flags = ibv_wc_read_wc_flags(cq);
        w->imm = (w->wc_flags & IBV_WC_WITH_INV) ? ibv_wc_read_invalidated_rkey(cq)
                                                 : ntohl(ibv_wc_read_imm_data(cq));
        w->qp_num = ibv_wc_read_qp_num(cq);
        w->src_qp = ibv_wc_read_src_qp(cq);
        w->slid = ibv_wc_read_slid(cq);
        w->sl = ibv_wc_read_sl(cq);
        w->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
        if (cq == ts_cq) {
                w->ts = ibv_wc_read_completion_ts(cq);
                w->wall = ibv_wc_read_completion_wallclock_ns(cq);
        }
}

static long now_ms(void)
{
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000L + t.tv_nsec / 1000000;
}

/* Up to max completions within ms milliseconds: the first by start_poll, the
 * rest by next_poll, then end_poll. Returns how many. */
static int poll_ex(struct ibv_cq_ex *cq, struct wcx *w, int max, int ms)
{
        struct ibv_poll_cq_attr pa = {0};
        long end = now_ms() + ms;
        int n = 0;
        while (n < max && now_ms() < end) {
                int r = ibv_start_poll(cq, &pa);
                if (r == ENOENT)
                        continue;
                CHECK(r == 0);
                if (r)
                        return n;
                read_wcx(cq, &w[n++]);
                while (n < max && (r = ibv_next_poll(cq)) == 0)
                        read_wcx(cq, &w[n++]);
                CHECK(r == 0 || r == ENOENT);
                ibv_end_poll(cq);
        }
        return n;
}

/* Exactly one completion within 5 s. */
static struct wcx one(struct ibv_cq_ex *cq)
{
        struct wcx w;
        memset(&w, 0, sizeof(w));
        w.status = (enum ibv_wc_status) - 1;
        CHECK(poll_ex(cq, &w, 1, 5000) == 1);
        return w;
}

/* Nothing arrives within ms. */
static int quiet(struct ibv_cq_ex *cq, int ms)
{
        struct wcx w;
        return poll_ex(cq, &w, 1, ms) == 0;
}

struct side {
        struct ibv_context *ctx;
        struct ibv_pd *pd;
        struct ibv_cq_ex *cq;
        struct ibv_qp *qp;
        struct ibv_qp_ex *qpx;
        struct ibv_mr *mr;
        uint8_t *buf;
        union ibv_gid gid;
};

static struct ibv_qp *make_qp(struct side *s, enum ibv_qp_type type, uint64_t ops, uint32_t depth)
{
        struct ibv_qp_init_attr_ex a = {
            .send_cq = ibv_cq_ex_to_cq(s->cq),
            .recv_cq = ibv_cq_ex_to_cq(s->cq),
            .cap = {.max_send_wr = depth,
                    .max_recv_wr = depth,
                    .max_send_sge = 2,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
            .qp_type = type,
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            .pd = s->pd,
            .send_ops_flags = ops,
        };
        struct ibv_qp *qp = ibv_create_qp_ex(s->ctx, &a);
        if (qp)
                CHECK(a.cap.max_send_wr >= depth && a.cap.max_inline_data >= 64);
        return qp;
}

static void side_open(struct side *s, struct ibv_device *dev, struct ibv_comp_channel **ch,
                      uint64_t more_wc_flags)
{
        memset(s, 0, sizeof(*s));
        s->ctx = ibv_open_device(dev);
        REQUIRE(s->ctx);
        s->pd = ibv_alloc_pd(s->ctx);
        REQUIRE(s->pd);
        s->buf = calloc(1, BUF);
        REQUIRE(s->buf);
        s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
        REQUIRE(s->mr);
        if (ch) {
                *ch = ibv_create_comp_channel(s->ctx);
                REQUIRE(*ch);
        }
        struct ibv_cq_init_attr_ex ca = {.cqe = 64,
                                         .cq_context = s,
                                         .channel = ch ? *ch : NULL,
                                         .wc_flags = WC_FLAGS | more_wc_flags};
        s->cq = ibv_create_cq_ex(s->ctx, &ca);
        REQUIRE(s->cq);
        REQUIRE(ibv_query_gid(s->ctx, 1, 0, &s->gid) == 0);
}

static void side_close(struct side *s, struct ibv_comp_channel *ch)
{
        CHECK(ibv_destroy_qp(s->qp) == 0);
        CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(s->cq)) == 0);
        if (ch)
                CHECK(ibv_destroy_comp_channel(ch) == 0);
        CHECK(ibv_dereg_mr(s->mr) == 0);
        CHECK(ibv_dealloc_pd(s->pd) == 0);
        CHECK(ibv_close_device(s->ctx) == 0);
        free(s->buf);
}

/* IB-style connect of an RC QP to its peer (GID + QP number). */
static void rc_connect(struct side *s, const struct side *peer)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                                .port_num = 1,
                                .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                                   IBV_ACCESS_REMOTE_READ |
                                                   IBV_ACCESS_REMOTE_ATOMIC};
        REQUIRE(ibv_modify_qp(s->qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS) == 0);
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = peer->qp->qp_num;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = peer->gid;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = 1;
        REQUIRE(ibv_modify_qp(s->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER) == 0);
}

static void rc_rts(struct side *s)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS,
                                .timeout = 14,
                                .retry_cnt = 7,
                                .rnr_retry = 7,
                                .sq_psn = 0,
                                .max_rd_atomic = 4};
        REQUIRE(ibv_modify_qp(s->qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void post_recv(struct side *s, uint64_t id, size_t off, uint32_t len)
{
        struct ibv_sge sge = {(uintptr_t)(s->buf + off), len, s->mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
        CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

static void fill(uint8_t *p, size_t n, int seed)
{
        for (size_t i = 0; i < n; i++)
                p[i] = (uint8_t)(i * 13 + seed);
}

static int same(const uint8_t *p, size_t n, int seed)
{
        for (size_t i = 0; i < n; i++)
                if (p[i] != (uint8_t)(i * 13 + seed))
                        return 0;
        return 1;
}

/* Creation: what is offered, what is refused and with which errno. */
static void creation(struct ibv_device *dev)
{
        struct ibv_context *ctx = ibv_open_device(dev);
        REQUIRE(ctx);
        struct ibv_device_attr_ex dax;
        REQUIRE(ibv_query_device_ex(ctx, NULL, &dax) == 0);
        /* Completion timestamps count nanoseconds (hca_core_clock in kHz). */
        CHECK(dax.hca_core_clock == 1000000 && dax.completion_timestamp_mask == UINT64_MAX);
        struct ibv_values_ex rt = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK};
        CHECK(ibv_query_rt_values_ex(ctx, &rt) == 0 && rt.raw_clock.tv_sec > 0);
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        REQUIRE(pd);
        /* The device's command FD is no kernel device's: nothing to import
         * (the real libibverbs would take it for one). */
        CHECK(ibv_import_device(ctx->cmd_fd) == NULL && errno == EOPNOTSUPP);

        struct ibv_cq_init_attr_ex ca = {.cqe = 8, .wc_flags = WC_FLAGS};
        struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
        REQUIRE(cq && cq->cqe >= 8);
        struct ibv_poll_cq_attr pa = {0};
        CHECK(ibv_start_poll(cq, &pa) == ENOENT); /* empty; no end_poll after an error */
        CHECK(ibv_start_poll(cq, &pa) == ENOENT);
        ibv_end_poll(cq); /* one anyway (pyverbs does): it ends nothing */
        CHECK(ibv_start_poll(cq, &pa) == ENOENT);
        static const uint64_t refused_wc[] = {IBV_WC_EX_WITH_CVLAN, IBV_WC_EX_WITH_FLOW_TAG,
                                              IBV_WC_EX_WITH_TM_INFO};
        for (size_t i = 0; i < sizeof(refused_wc) / sizeof(refused_wc[0]); i++) {
                ca.wc_flags = WC_FLAGS | refused_wc[i];
                errno = 0;
                CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP);
        }
        ca.wc_flags = 0;
        ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
        ca.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP);
        ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
        struct ibv_cq_ex *cq1 = ibv_create_cq_ex(ctx, &ca);
        CHECK(cq1 && ibv_destroy_cq(ibv_cq_ex_to_cq(cq1)) == 0);
        ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD; /* parent domains: not offered */
        ca.parent_domain = pd;
        CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP);
        ca.comp_mask = 0;
        ca.comp_vector = 5;
        CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL);
        ca.comp_vector = 0;
        ca.cqe = (uint32_t)dax.orig_attr.max_cqe + 1;
        CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EINVAL);

        struct ibv_qp_init_attr_ex qa = {
            .send_cq = ibv_cq_ex_to_cq(cq),
            .recv_cq = ibv_cq_ex_to_cq(cq),
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC,
            .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            .pd = pd,
        };
        static const uint64_t refused_ops[] = {IBV_QP_EX_WITH_TSO, IBV_QP_EX_WITH_ATOMIC_WRITE,
                                               1ull << 11 /* flush */};
        for (size_t i = 0; i < sizeof(refused_ops) / sizeof(refused_ops[0]); i++) {
                qa.send_ops_flags = IBV_QP_EX_WITH_SEND | refused_ops[i];
                errno = 0;
                CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP);
        }
        qa.qp_type = IBV_QPT_UD; /* UD carries Sends only */
        qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
        CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP);
        qa.qp_type = IBV_QPT_UC; /* UC: no RDMA Read */
        qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ;
        CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP);
        qa.qp_type = IBV_QPT_RC;
        qa.send_ops_flags = RC_OPS;
        qa.comp_mask |= IBV_QP_INIT_ATTR_XRCD;
        CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP);
        qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        qa.create_flags = IBV_QP_CREATE_SCATTER_FCS;
        CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP);
        qa.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS; /* no PD */
        CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EINVAL);
        /* Created through the extended call without send ops: no wr_* API. */
        qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        qa.create_flags = 0;
        struct ibv_qp *plain = ibv_create_qp_ex(ctx, &qa);
        REQUIRE(plain);
        CHECK(ibv_qp_to_qp_ex(plain) == NULL);
        CHECK(ibv_destroy_qp(plain) == 0);
        qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        struct ibv_qp *qp = ibv_create_qp_ex(ctx, &qa);
        REQUIRE(qp);
        struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
        REQUIRE(qpx && &qpx->qp_base == qp);
        /* Completing or aborting with no batch open: refused, no harm. */
        CHECK(ibv_wr_complete(qpx) == EINVAL);
        ibv_wr_abort(qpx);
        /* In RESET (reported INIT: Idle) a batch is refused whole. */
        uint64_t word = 0;
        ibv_wr_start(qpx);
        qpx->wr_id = 1;
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(qpx);
        ibv_wr_set_sge(qpx, 0, (uintptr_t)&word, 8);
        CHECK(ibv_wr_complete(qpx) == EINVAL);
        CHECK(quiet(cq, 50));
        CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == EBUSY);
        CHECK(ibv_destroy_qp(qp) == 0);
        CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
        CHECK(ibv_dealloc_pd(pd) == 0);
        CHECK(ibv_close_device(ctx) == 0);
}

static void rc(struct ibv_device *dev)
{
        struct side a, b;
        struct ibv_comp_channel *bch;
        side_open(&a, dev, NULL, 0);
        side_open(&b, dev, &bch, 0);
        a.qp = make_qp(&a, IBV_QPT_RC, RC_OPS, DEPTH);
        b.qp = make_qp(&b, IBV_QPT_RC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW, DEPTH);
        REQUIRE(a.qp && b.qp);
        a.qpx = ibv_qp_to_qp_ex(a.qp);
        b.qpx = ibv_qp_to_qp_ex(b.qp);
        REQUIRE(a.qpx && b.qpx);
        rc_connect(&a, &b);
        rc_connect(&b, &a);
        rc_rts(&a);
        rc_rts(&b);
        struct ibv_qp_ex *q = a.qpx;
        struct wcx w;

        /* Send with one SGE; B's completion through its channel. */
        fill(a.buf, 100, 1);
        post_recv(&b, 0x100, 0, 256);
        CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(b.cq), 0) == 0);
        ibv_wr_start(q);
        q->wr_id = 0xa1;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 100);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0xa1 && w.opcode == IBV_WC_SEND);
        CHECK(w.qp_num == a.qp->qp_num);
        struct pollfd pfd = {.fd = bch->fd, .events = POLLIN};
        CHECK(poll(&pfd, 1, 5000) == 1);
        struct ibv_cq *ecq = NULL;
        void *ectx = NULL;
        CHECK(ibv_get_cq_event(bch, &ecq, &ectx) == 0);
        CHECK(ecq == ibv_cq_ex_to_cq(b.cq) && ectx == &b);
        ibv_ack_cq_events(ecq, 1);
        w = one(b.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0x100 && w.opcode == IBV_WC_RECV);
        CHECK(w.byte_len == 100 && w.qp_num == b.qp->qp_num && w.wc_flags == 0);
        CHECK(w.vendor_err == 0 && w.slid == 0 && w.sl == 0 && w.dlid_path_bits == 0);
        CHECK(same(b.buf, 100, 1));

        /* Send with immediate, two SGEs; B polled with ibv_poll_cq. */
        fill(a.buf + 1000, 300, 2);
        post_recv(&b, 0x101, 0, 512);
        ibv_wr_start(q);
        q->wr_id = 0xa2;
        ibv_wr_send_imm(q, htonl(0x12345678));
        struct ibv_sge two[2] = {{(uintptr_t)(a.buf + 1000), 100, a.mr->lkey},
                                 {(uintptr_t)(a.buf + 1100), 200, a.mr->lkey}};
        ibv_wr_set_sge_list(q, 2, two);
        CHECK(ibv_wr_complete(q) == 0);
        CHECK(one(a.cq).wr_id == 0xa2);
        struct ibv_wc wc;
        int k = 0;
        for (long end = now_ms() + 5000; k == 0 && now_ms() < end;)
                k = ibv_poll_cq(ibv_cq_ex_to_cq(b.cq), 1, &wc);
        CHECK(k == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 0x101);
        CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == 300 && (wc.wc_flags & IBV_WC_WITH_IMM));
        CHECK(ntohl(wc.imm_data) == 0x12345678 && same(b.buf, 300, 2));

        /* RDMA Write with immediate into B, then a plain Write. */
        post_recv(&b, 0x102, 0, 16);
        fill(a.buf, 64, 4);
        ibv_wr_start(q);
        q->wr_id = 0xa4;
        ibv_wr_rdma_write_imm(q, b.mr->rkey, (uintptr_t)(b.buf + 3072), htonl(0xcafe));
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 64);
        CHECK(ibv_wr_complete(q) == 0);
        CHECK(one(a.cq).opcode == IBV_WC_RDMA_WRITE);
        w = one(b.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0x102);
        CHECK(w.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (w.wc_flags & IBV_WC_WITH_IMM));
        CHECK(w.imm == 0xcafe && w.byte_len == 64);
        fill(a.buf, 512, 3);
        ibv_wr_start(q);
        q->wr_id = 0xa3;
        ibv_wr_rdma_write(q, b.mr->rkey, (uintptr_t)(b.buf + 2048));
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 512);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0xa3 && w.opcode == IBV_WC_RDMA_WRITE);
        CHECK(same(b.buf + 3072, 64, 4));

        /* RDMA Read back what the plain Write placed (which also shows it
         * landed). */
        memset(a.buf, 0, 512);
        ibv_wr_start(q);
        q->wr_id = 0xa5;
        ibv_wr_rdma_read(q, b.mr->rkey, (uintptr_t)(b.buf + 2048));
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 512);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RDMA_READ && w.byte_len == 512);
        CHECK(same(a.buf, 512, 3));

        /* Atomics on a word of B: compare-and-swap, then fetch-and-add. */
        uint64_t *word = (uint64_t *)(b.buf + 1024), *old = (uint64_t *)(a.buf + 8);
        *word = 41;
        ibv_wr_start(q);
        q->wr_id = 0xa6;
        ibv_wr_atomic_cmp_swp(q, b.mr->rkey, (uintptr_t)word, 41, 1000);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)old, 8);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_COMP_SWAP && w.wr_id == 0xa6);
        CHECK(*old == 41 && *word == 1000);
        ibv_wr_start(q);
        q->wr_id = 0xa7;
        ibv_wr_atomic_fetch_add(q, b.mr->rkey, (uintptr_t)word, 5);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)old, 8);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_FETCH_ADD);
        CHECK(*old == 1000 && *word == 1005);

        /* Inline data: copied by the setter, so the source may change before
         * wr_complete; a list of two buffers into one Write. */
        char msg[40];
        memset(msg, 'x', sizeof(msg));
        post_recv(&b, 0x103, 0, 64);
        ibv_wr_start(q);
        q->wr_id = 0xa8;
        ibv_wr_send(q);
        ibv_wr_set_inline_data(q, msg, sizeof(msg));
        memset(msg, 'y', sizeof(msg));
        struct ibv_data_buf parts[2] = {{msg, 10}, {msg + 20, 20}};
        q->wr_id = 0xa9;
        ibv_wr_rdma_write(q, b.mr->rkey, (uintptr_t)(b.buf + 512));
        ibv_wr_set_inline_data_list(q, 2, parts);
        memset(msg, 'z', sizeof(msg));
        CHECK(ibv_wr_complete(q) == 0);
        struct wcx two_w[2];
        CHECK(poll_ex(a.cq, two_w, 2, 5000) == 2);
        CHECK(two_w[0].wr_id == 0xa8 && two_w[1].wr_id == 0xa9);
        w = one(b.cq);
        CHECK(w.wr_id == 0x103 && w.byte_len == 40);
        int xs = 0, ys = 0;
        for (int i = 0; i < 40; i++) {
                xs += b.buf[i] == 'x';
                ys += b.buf[512 + i] == 'y' && i < 30;
        }
        CHECK(xs == 40 && ys == 30);
        /* Inline data longer than max_inline_data: the batch is refused. */
        char big[4096];
        ibv_wr_start(q);
        q->wr_id = 0xaa;
        ibv_wr_send(q);
        ibv_wr_set_inline_data(q, big, sizeof(big));
        CHECK(ibv_wr_complete(q) == EINVAL);

        /* A batch of three (Write, unsignaled; Send; Send) posted together,
         * completing in order; the unsignaled one gives no completion. */
        fill(a.buf, 64, 5);
        post_recv(&b, 0x104, 0, 64);
        post_recv(&b, 0x105, 64, 64);
        ibv_wr_start(q);
        q->wr_id = 0xb0;
        q->wr_flags = 0;
        ibv_wr_rdma_write(q, b.mr->rkey, (uintptr_t)(b.buf + 256));
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 64);
        q->wr_id = 0xb1;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 10);
        q->wr_id = 0xb2;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 20);
        CHECK(ibv_wr_complete(q) == 0);
        struct wcx ws[3];
        CHECK(poll_ex(a.cq, ws, 3, 1000) == 2);
        CHECK(ws[0].wr_id == 0xb1 && ws[1].wr_id == 0xb2);
        CHECK(poll_ex(b.cq, ws, 2, 5000) == 2);
        CHECK(ws[0].wr_id == 0x104 && ws[0].byte_len == 10);
        CHECK(ws[1].wr_id == 0x105 && ws[1].byte_len == 20);
        CHECK(same(b.buf + 256, 64, 5));

        /* A batch whose second WR is faulty (three SGEs, max_send_sge is 2):
         * wr_complete returns EINVAL and posts nothing, not even the first. */
        post_recv(&b, 0x106, 0, 64);
        struct ibv_sge three[3] = {{(uintptr_t)a.buf, 1, a.mr->lkey},
                                   {(uintptr_t)a.buf, 1, a.mr->lkey},
                                   {(uintptr_t)a.buf, 1, a.mr->lkey}};
        ibv_wr_start(q);
        q->wr_id = 0xc0;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        q->wr_id = 0xc1;
        ibv_wr_send(q);
        ibv_wr_set_sge_list(q, 3, three);
        CHECK(ibv_wr_complete(q) == EINVAL);
        /* More WRs than the send queue holds: ENOMEM, nothing posted. */
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qi;
        REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi) == 0 && qa.cap.max_send_wr >= DEPTH);
        ibv_wr_start(q);
        for (uint32_t i = 0; i <= qa.cap.max_send_wr; i++) {
                q->wr_id = 0xd0 + i;
                ibv_wr_send(q);
                ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        }
        CHECK(ibv_wr_complete(q) == ENOMEM);
        /* An opcode the QP was not created for (B: Sends only). */
        ibv_wr_start(b.qpx);
        b.qpx->wr_id = 0xe0;
        ibv_wr_rdma_write(b.qpx, a.mr->rkey, (uintptr_t)a.buf);
        ibv_wr_set_sge(b.qpx, b.mr->lkey, (uintptr_t)b.buf, 8);
        CHECK(ibv_wr_complete(b.qpx) == EINVAL);
        /* A setter with no builder before it. */
        ibv_wr_start(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        CHECK(ibv_wr_complete(q) == EINVAL);
        /* wr_abort discards what was built. */
        ibv_wr_start(q);
        q->wr_id = 0xf0;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        ibv_wr_abort(q);
        CHECK(quiet(a.cq, 200) && quiet(b.cq, 1));
        /* An empty batch is fine; the QP still works: the receive posted
         * above gets this Send, not any refused one. */
        ibv_wr_start(q);
        CHECK(ibv_wr_complete(q) == 0);
        /* A second wr_start in the same thread discards the open batch (it
         * would otherwise wait for itself) and starts another. */
        ibv_wr_start(q);
        q->wr_id = 0xef;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 7);
        ibv_wr_start(q);
        q->wr_id = 0xf1;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 33);
        CHECK(ibv_wr_complete(q) == 0);
        CHECK(one(a.cq).wr_id == 0xf1);
        w = one(b.cq);
        CHECK(w.wr_id == 0x106 && w.byte_len == 33);
        CHECK(quiet(a.cq, 100)); /* nothing of the discarded batch */

        /* Send with Invalidate of B's region: B's completion names the rkey;
         * then Local Invalidate of A's own region. */
        struct ibv_mr *inv =
            ibv_reg_mr(b.pd, b.buf + 3500, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        REQUIRE(inv);
        post_recv(&b, 0x107, 0, 64);
        ibv_wr_start(q);
        q->wr_id = 0xf2;
        ibv_wr_send_inv(q, inv->rkey);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 16);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0xf2 && w.opcode == IBV_WC_SEND);
        w = one(b.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0x107 && w.opcode == IBV_WC_RECV);
        CHECK((w.wc_flags & IBV_WC_WITH_INV) && w.imm == inv->rkey && w.byte_len == 16);
        struct ibv_mr *own = ibv_reg_mr(a.pd, a.buf + 3500, 64, IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(own);
        ibv_wr_start(q);
        q->wr_id = 0xf3;
        ibv_wr_local_inv(q, own->rkey);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0xf3 && w.opcode == IBV_WC_LOCAL_INV);

        /* A type 2 window B binds with wr_bind_mw over part of its buffer:
         * it takes the new key byte, and A writes through it. */
        struct ibv_mr *bind_mr =
            ibv_reg_mr(b.pd, b.buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
        struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
        REQUIRE(bind_mr && mw);
        uint32_t old_rkey = mw->rkey;
        struct ibv_mw_bind_info bi = {.mr = bind_mr,
                                      .addr = (uintptr_t)b.buf + 2048,
                                      .length = 1024,
                                      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
        ibv_wr_start(b.qpx);
        b.qpx->wr_id = 0xb1;
        b.qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_bind_mw(b.qpx, mw, ibv_inc_rkey(old_rkey), &bi);
        CHECK(ibv_wr_complete(b.qpx) == 0);
        w = one(b.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0xb1 && w.opcode == IBV_WC_BIND_MW);
        CHECK(mw->rkey == ibv_inc_rkey(old_rkey));
        fill(a.buf, 512, 9);
        ibv_wr_start(q);
        q->wr_id = 0xf5;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(q, mw->rkey, (uintptr_t)b.buf + 2048 + 256);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 512);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0xf5);
        CHECK(same(b.buf + 2048 + 256, 512, 9));
        /* A type 1 window is bound by ibv_bind_mw, not in a batch. */
        struct ibv_mw *mw1 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
        REQUIRE(mw1);
        ibv_wr_start(b.qpx);
        ibv_wr_bind_mw(b.qpx, mw1, ibv_inc_rkey(mw1->rkey), &bi);
        CHECK(ibv_wr_complete(b.qpx) == EINVAL);
        CHECK(ibv_dealloc_mw(mw1) == 0);
        CHECK(ibv_dealloc_mw(mw) == 0);
        CHECK(ibv_dereg_mr(bind_mr) == 0);

        /* Last, an RDMA Read from a key B does not have: a remote access
         * error, with the Terminate's layer, type and code as vendor_err. (A
         * Write completes once TCP has it, as on iWARP RNICs: its error
         * reaches the requester as the QP's, not the WR's.) */
        ibv_wr_start(q);
        q->wr_id = 0xf4;
        ibv_wr_rdma_read(q, b.mr->rkey ^ 0x5500, (uintptr_t)b.buf);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        CHECK(ibv_wr_complete(q) == 0);
        w = one(a.cq);
        CHECK(w.wr_id == 0xf4 && w.status == IBV_WC_REM_ACCESS_ERR);
        /* RDMAP layer (0), Remote Protection Error (1), Invalid STag (0):
         * RFC 5040 §7.1. RC over RD reports the error by an RD NAK, which
         * carries no Terminate: 0. */
        const char *tr = getenv("DIWARP_RC_TRANSPORT");
        CHECK(w.vendor_err == (tr && !strcmp(tr, "rd") ? 0u : 0x100u));

        CHECK(ibv_dereg_mr(inv) == 0);
        CHECK(ibv_dereg_mr(own) == 0);
        side_close(&a, NULL);
        side_close(&b, bch);
}

static void ud(struct ibv_device *dev)
{
        struct side a, b;
        side_open(&a, dev, NULL,
                  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
        ts_cq = a.cq;
        side_open(&b, dev, NULL, 0);
        a.qp = make_qp(&a, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 4);
        b.qp = make_qp(&b, IBV_QPT_UD, IBV_QP_EX_WITH_SEND, 4);
        REQUIRE(a.qp && b.qp);
        a.qpx = ibv_qp_to_qp_ex(a.qp);
        REQUIRE(a.qpx);
        for (struct side *s = &a; s; s = s == &a ? &b : NULL) {
                struct ibv_qp_attr at = {
                    .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY};
                REQUIRE(ibv_modify_qp(s->qp, &at,
                                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                          IBV_QP_QKEY) == 0);
                at.qp_state = IBV_QPS_RTR;
                REQUIRE(ibv_modify_qp(s->qp, &at, IBV_QP_STATE) == 0);
                at.qp_state = IBV_QPS_RTS;
                at.sq_psn = 0;
                REQUIRE(ibv_modify_qp(s->qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
        }
        struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1};
        aa.grh.dgid = b.gid;
        aa.grh.hop_limit = 64;
        struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
        REQUIRE(ah);
        struct ibv_qp_ex *q = a.qpx;

        /* Send with immediate and inline data, addressed by wr_set_ud_addr. */
        post_recv(&b, 0x200, 0, GRH + 64);
        char msg[48];
        memset(msg, 'u', sizeof(msg));
        ibv_wr_start(q);
        q->wr_id = 0x20;
        q->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send_imm(q, htonl(77));
        ibv_wr_set_inline_data(q, msg, sizeof(msg));
        ibv_wr_set_ud_addr(q, ah, b.qp->qp_num, QKEY);
        /* A's CQ stamps its completions: in the device's clock (ns, the raw
         * clock of ibv_query_rt_values_ex) and as wall-clock time. */
        struct ibv_values_ex t0 = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK}, t1 = t0;
        struct timespec r0, r1;
        CHECK(ibv_query_rt_values_ex(a.ctx, &t0) == 0);
        clock_gettime(CLOCK_REALTIME, &r0);
        CHECK(ibv_wr_complete(q) == 0);
        struct wcx w = one(a.cq);
        CHECK(ibv_query_rt_values_ex(a.ctx, &t1) == 0);
        clock_gettime(CLOCK_REALTIME, &r1);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0x20 && w.opcode == IBV_WC_SEND);
        uint64_t c0 = (uint64_t)t0.raw_clock.tv_sec * 1000000000u + t0.raw_clock.tv_nsec;
        uint64_t c1 = (uint64_t)t1.raw_clock.tv_sec * 1000000000u + t1.raw_clock.tv_nsec;
        CHECK(w.ts >= c0 && w.ts <= c1);
        uint64_t w0 = (uint64_t)r0.tv_sec * 1000000000u + r0.tv_nsec;
        uint64_t w1 = (uint64_t)r1.tv_sec * 1000000000u + r1.tv_nsec;
        CHECK(w.wall + 1000000 >= w0 && w.wall <= w1 + 1000000); /* within 1 ms */
        w = one(b.cq);
        CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 0x200 && w.opcode == IBV_WC_RECV);
        CHECK(w.byte_len == GRH + 48 && (w.wc_flags & IBV_WC_GRH) &&
              (w.wc_flags & IBV_WC_WITH_IMM));
        CHECK(w.imm == 77 && w.src_qp == a.qp->qp_num && w.qp_num == b.qp->qp_num);
        int us = 0;
        for (int i = 0; i < 48; i++)
                us += b.buf[GRH + i] == 'u';
        CHECK(us == 48);

        /* Two Sends in one batch with SGEs. */
        fill(a.buf, 200, 6);
        post_recv(&b, 0x201, 0, GRH + 200);
        post_recv(&b, 0x202, 512, GRH + 200);
        ibv_wr_start(q);
        q->wr_id = 0x21;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 200);
        ibv_wr_set_ud_addr(q, ah, b.qp->qp_num, QKEY);
        q->wr_id = 0x22;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 100);
        ibv_wr_set_ud_addr(q, ah, b.qp->qp_num, QKEY);
        CHECK(ibv_wr_complete(q) == 0);
        struct wcx ws[2];
        CHECK(poll_ex(a.cq, ws, 2, 5000) == 2 && ws[0].wr_id == 0x21 && ws[1].wr_id == 0x22);
        CHECK(poll_ex(b.cq, ws, 2, 5000) == 2);
        CHECK(ws[0].wr_id == 0x201 && ws[0].byte_len == GRH + 200 && same(b.buf + GRH, 200, 6));
        CHECK(ws[1].wr_id == 0x202 && ws[1].byte_len == GRH + 100);

        /* No address, or an AH of another context: refused whole. */
        ibv_wr_start(q);
        q->wr_id = 0x23;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        CHECK(ibv_wr_complete(q) == EINVAL);
        struct ibv_ah *bah = ibv_create_ah(b.pd, &aa);
        REQUIRE(bah);
        ibv_wr_start(q);
        q->wr_id = 0x24;
        ibv_wr_send(q);
        ibv_wr_set_sge(q, a.mr->lkey, (uintptr_t)a.buf, 8);
        ibv_wr_set_ud_addr(q, bah, b.qp->qp_num, QKEY);
        CHECK(ibv_wr_complete(q) == EINVAL);
        CHECK(quiet(a.cq, 100));

        CHECK(ibv_destroy_ah(bah) == 0);
        CHECK(ibv_destroy_ah(ah) == 0);
        side_close(&a, NULL);
        side_close(&b, NULL);
}

int main(void)
{
        int n = 0;
        struct ibv_device **list = ibv_get_device_list(&n);
        REQUIRE(list && n >= 1);
        REQUIRE(!strcmp(ibv_get_device_name(list[0]), "diwarp0"));
        creation(list[0]);
        rc(list[0]);
        ud(list[0]);
        ibv_free_device_list(list);
        if (failures) {
                fprintf(stderr, "%d check(s) failed\n", failures);
                return 1;
        }
        printf("ok\n");
        return 0;
}
