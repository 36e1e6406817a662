/* Memory windows through plain ibverbs (linked against libibverbs only), run
 * under `diwarp run`: RC QP pairs inside one process (IB-style connect).
 * Type 1 (ibv_bind_mw) and type 2 (IBV_WR_BIND_MW) windows over a region
 * that grants no remote right itself: remote Write/Read inside the window's
 * bounds and rights succeed; outside, or after unbind/invalidation, the
 * requester gets IBV_WC_REM_ACCESS_ERR and its QP goes to error, and the
 * target's memory outside the window is untouched; Send with Invalidate
 * reports IBV_WC_WITH_INV and the rkey; type 1 refuses invalidation; a
 * rebind with ibv_inc_rkey kills the old rkey; a type 2 window serves only
 * the QP it was bound on; a region with bound windows cannot be
 * deregistered. Exit 0 = all checks passed; each failure prints its line.
 */
#include <infiniband/verbs.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

enum { BUF = 4096, WOFF = 512, WLEN = 1024, CANARY = 0x5a };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static unsigned char *tbuf;  /* target memory, behind the windows */
static unsigned char *lbuf;  /* requester's sources and sinks */
static struct ibv_mr *tmr;   /* LOCAL_WRITE | MW_BIND: no remote right of its own */
static struct ibv_mr *lmr;   /* requester's region */
static struct ibv_mr *plain; /* LOCAL_WRITE | REMOTE_WRITE, no MW_BIND */

/* One connected RC pair: a = requester, b = target (binds, invalidates). */
struct pair {
        struct ibv_cq *cqa, *cqb;
        struct ibv_qp *a, *b;
};

static struct ibv_qp *rc_qp(struct ibv_cq *cq)
{
        struct ibv_qp_init_attr ia = {
            .send_cq = cq,
            .recv_cq = cq,
            .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC,
        };
        struct ibv_qp *qp = ibv_create_qp(pd, &ia);
        REQUIRE(qp);
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                                .port_num = 1,
                                .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                                   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS) == 0);
        return qp;
}

static void rc_connect(struct ibv_qp *qp, uint32_t dest)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                                .path_mtu = IBV_MTU_1024,
                                .dest_qp_num = dest,
                                .max_dest_rd_atomic = 4,
                                .min_rnr_timer = 12};
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.hop_limit = 1;
        a.ah_attr.port_num = 1;
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER) == 0);
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void pair_up(struct pair *p)
{
        p->cqa = ibv_create_cq(ctx, 32, NULL, NULL, 0);
        p->cqb = ibv_create_cq(ctx, 32, NULL, NULL, 0);
        REQUIRE(p->cqa && p->cqb);
        p->a = rc_qp(p->cqa);
        p->b = rc_qp(p->cqb);
        rc_connect(p->a, p->b->qp_num);
        rc_connect(p->b, p->a->qp_num);
}

static void pair_down(struct pair *p)
{
        CHECK(ibv_destroy_qp(p->a) == 0);
        CHECK(ibv_destroy_qp(p->b) == 0);
        CHECK(ibv_destroy_cq(p->cqa) == 0);
        CHECK(ibv_destroy_cq(p->cqb) == 0);
}

/* One completion within 5 s (the test's own timeout, not a hang). */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc)
{
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
                int n = ibv_poll_cq(cq, 1, wc);
                if (n != 0)
                        return n;
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (t.tv_sec - t0.tv_sec > 5) {
                        fprintf(stderr, "no completion within 5 s\n");
                        return 0;
                }
        }
}

static int rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t loff, uint32_t len,
                uint64_t raddr, uint32_t rkey)
{
        struct ibv_sge sge = {.addr = (uintptr_t)lbuf + loff, .length = len, .lkey = lmr->lkey};
        struct ibv_send_wr wr = {.wr_id = op,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = op,
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        struct ibv_send_wr *bad;
        return ibv_post_send(qp, &wr, &bad);
}

/* Status of one RDMA Read of len bytes at raddr through rkey into lbuf. */
static int read_status(struct pair *p, uint64_t raddr, uint32_t len, uint32_t rkey)
{
        struct ibv_wc wc;
        if (rdma(p->a, IBV_WR_RDMA_READ, 0, len, raddr, rkey) != 0 || poll1(p->cqa, &wc) != 1)
                return -1;
        return wc.status;
}

/* An RDMA Write then a Read on the same QP, posted as one list (both are
 * queued before any reply is processed): the Read's response follows the
 * Write's placement in the stream, and a Terminate for a refused Write
 * finds the Read outstanding if the Write has completed already (over TCP
 * a Write completes once the stream has it). Returns the first non-success
 * status of the two (SUCCESS only if both succeeded). */
static int write_then_read(struct pair *p, uint64_t raddr, uint32_t len, uint32_t rkey,
                           uint64_t read_addr, uint32_t read_rkey)
{
        struct ibv_sge ws = {.addr = (uintptr_t)lbuf, .length = len, .lkey = lmr->lkey};
        struct ibv_sge rs = {.addr = (uintptr_t)lbuf + BUF / 2, .length = 8, .lkey = lmr->lkey};
        struct ibv_send_wr rd = {.wr_id = 2,
                                 .sg_list = &rs,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_READ,
                                 .send_flags = IBV_SEND_SIGNALED};
        struct ibv_send_wr wr = {.wr_id = 1,
                                 .next = &rd,
                                 .sg_list = &ws,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        rd.wr.rdma.remote_addr = read_addr;
        rd.wr.rdma.rkey = read_rkey;
        struct ibv_send_wr *bad;
        if (ibv_post_send(p->a, &wr, &bad) != 0)
                return -1;
        struct ibv_wc wc[2];
        int st = IBV_WC_SUCCESS;
        for (int i = 0; i < 2; i++) {
                if (poll1(p->cqa, &wc[i]) != 1)
                        return -1;
                if (wc[i].status != IBV_WC_SUCCESS && st == IBV_WC_SUCCESS)
                        st = wc[i].status;
        }
        return st;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
        struct ibv_qp_attr a;
        struct ibv_qp_init_attr ia;
        if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
                return (enum ibv_qp_state) - 1;
        return a.qp_state;
}

static int canary_intact(void)
{
        for (int i = 0; i < BUF; i++)
                if ((i < WOFF || i >= WOFF + WLEN) && tbuf[i] != CANARY)
                        return 0;
        return 1;
}

static int bind1(struct ibv_qp *qp, struct ibv_mw *mw, uint64_t addr, uint64_t len, int access,
                 int *status)
{
        struct ibv_mw_bind b = {.wr_id = 0xb1, .send_flags = IBV_SEND_SIGNALED};
        b.bind_info.mr = tmr;
        b.bind_info.addr = addr;
        b.bind_info.length = len;
        b.bind_info.mw_access_flags = access;
        int err = ibv_bind_mw(qp, mw, &b);
        if (err)
                return err;
        struct ibv_wc wc;
        if (poll1(qp->send_cq, &wc) != 1)
                return -1;
        *status = wc.status;
        return wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 0xb1 ? 0 : -1;
}

static int bind2(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t rkey, struct ibv_mr *mr,
                 uint64_t addr, uint64_t len, int access, int *status)
{
        struct ibv_send_wr wr = {
            .wr_id = 0xb2, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
        wr.bind_mw.mw = mw;
        wr.bind_mw.rkey = rkey;
        wr.bind_mw.bind_info.mr = mr;
        wr.bind_mw.bind_info.addr = addr;
        wr.bind_mw.bind_info.length = len;
        wr.bind_mw.bind_info.mw_access_flags = access;
        struct ibv_send_wr *bad;
        int err = ibv_post_send(qp, &wr, &bad);
        if (err)
                return err;
        struct ibv_wc wc;
        if (poll1(qp->send_cq, &wc) != 1)
                return -1;
        *status = wc.status;
        return wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 0xb2 ? 0 : -1;
}

static int post_recv(struct ibv_qp *qp)
{
        struct ibv_sge sge = {.addr = (uintptr_t)lbuf + BUF / 2, .length = 64, .lkey = lmr->lkey};
        struct ibv_recv_wr wr = {.wr_id = 0x77, .sg_list = &sge, .num_sge = 1}, *bad;
        return ibv_post_recv(qp, &wr, &bad);
}

static int send_inv(struct ibv_qp *qp, uint32_t rkey)
{
        struct ibv_sge sge = {.addr = (uintptr_t)lbuf, .length = 8, .lkey = lmr->lkey};
        struct ibv_send_wr wr = {.wr_id = 0x55,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_SEND_WITH_INV,
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.invalidate_rkey = rkey;
        struct ibv_send_wr *bad;
        return ibv_post_send(qp, &wr, &bad);
}

int main(void)
{
        int n = 0;
        struct ibv_device **list = ibv_get_device_list(&n);
        REQUIRE(list && n >= 1 && !strcmp(ibv_get_device_name(list[0]), "diwarp0"));
        ctx = ibv_open_device(list[0]);
        REQUIRE(ctx);
        REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);

        struct ibv_device_attr da;
        CHECK(ibv_query_device(ctx, &da) == 0);
        CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
        CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
        CHECK(da.max_mw > 0);

        pd = ibv_alloc_pd(ctx);
        REQUIRE(pd);
        tbuf = aligned_alloc(4096, BUF);
        lbuf = aligned_alloc(4096, BUF);
        REQUIRE(tbuf && lbuf);
        memset(tbuf, CANARY, BUF);
        tmr = ibv_reg_mr(pd, tbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
        lmr = ibv_reg_mr(pd, lbuf, BUF, IBV_ACCESS_LOCAL_WRITE);
        plain = ibv_reg_mr(pd, tbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        REQUIRE(tmr && lmr && plain);
        uint64_t wbase = (uintptr_t)tbuf + WOFF;

        CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL);
        struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
        struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
        REQUIRE(mw1 && mw2 && mw1->type == IBV_MW_TYPE_1 && mw2->type == IBV_MW_TYPE_2);
        CHECK(mw1->pd == pd && mw1->context == ctx && mw1->rkey != mw2->rkey);

        /* ---- type 1 ---------------------------------------------------- */
        struct pair p;
        pair_up(&p);
        int st = -1;
        uint32_t before = mw1->rkey;
        CHECK(bind1(p.b, mw1, wbase, WLEN, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &st) ==
                  0 &&
              st == IBV_WC_SUCCESS);
        CHECK(mw1->rkey == ibv_inc_rkey(before));
        uint32_t k1 = mw1->rkey;
        /* The region itself grants nothing remote. */
        CHECK(read_status(&p, wbase, 8, tmr->rkey) == IBV_WC_REM_ACCESS_ERR);
        CHECK(qp_state(p.a) == IBV_QPS_ERR);
        pair_down(&p);

        /* Type 1 serves any QP of its PD: a new pair uses the same key. */
        pair_up(&p);
        for (int i = 0; i < WLEN; i++)
                lbuf[i] = (unsigned char)(i * 7 + 1);
        CHECK(write_then_read(&p, wbase, WLEN, k1, wbase + WLEN - 8, k1) == IBV_WC_SUCCESS);
        CHECK(!memcmp(tbuf + WOFF, lbuf, WLEN));
        CHECK(!memcmp(lbuf + BUF / 2, tbuf + WOFF + WLEN - 8, 8));
        CHECK(read_status(&p, wbase + 100, 200, k1) == IBV_WC_SUCCESS);
        CHECK(!memcmp(lbuf, tbuf + WOFF + 100, 200));
        /* One byte past the end: refused, QP to error, nothing placed. */
        CHECK(write_then_read(&p, wbase + WLEN - 8, 16, k1, wbase, k1) == IBV_WC_REM_ACCESS_ERR);
        CHECK(qp_state(p.a) == IBV_QPS_ERR);
        CHECK(canary_intact());
        pair_down(&p);

        pair_up(&p);
        CHECK(read_status(&p, wbase - 1, 2, k1) == IBV_WC_REM_ACCESS_ERR);
        CHECK(canary_intact());
        pair_down(&p);

        /* Rights: a read-only window refuses a Write. */
        pair_up(&p);
        CHECK(bind1(p.b, mw1, wbase, WLEN, IBV_ACCESS_REMOTE_READ, &st) == 0 &&
              st == IBV_WC_SUCCESS);
        uint32_t k2 = mw1->rkey;
        CHECK(k2 == ibv_inc_rkey(k1));
        CHECK(read_status(&p, wbase, 16, k2) == IBV_WC_SUCCESS);
        CHECK(read_status(&p, wbase, 16, k1) == IBV_WC_REM_ACCESS_ERR); /* the stale key */
        pair_down(&p);
        pair_up(&p);
        CHECK(write_then_read(&p, wbase, 16, k2, wbase, k2) == IBV_WC_REM_ACCESS_ERR);
        pair_down(&p);

        /* Type 1 refuses invalidation, local or remote; the window stays. */
        pair_up(&p);
        {
                struct ibv_send_wr wr = {.wr_id = 0x11,
                                         .opcode = IBV_WR_LOCAL_INV,
                                         .send_flags = IBV_SEND_SIGNALED},
                                   *bad;
                wr.invalidate_rkey = k2;
                CHECK(ibv_post_send(p.b, &wr, &bad) == 0);
                struct ibv_wc wc;
                CHECK(poll1(p.cqb, &wc) == 1 && wc.status != IBV_WC_SUCCESS);
        }
        pair_down(&p);
        pair_up(&p);
        CHECK(post_recv(p.b) == 0);
        CHECK(send_inv(p.a, k2) == 0);
        {
                struct ibv_wc wc;
                CHECK(poll1(p.cqb, &wc) == 1 && wc.status == IBV_WC_REM_INV_REQ_ERR);
        }
        pair_down(&p);
        pair_up(&p);
        CHECK(read_status(&p, wbase, 16, k2) == IBV_WC_SUCCESS);
        /* Bound windows keep their region: no deregistration. */
        CHECK(ibv_dereg_mr(tmr) == EBUSY);
        /* Unbind (zero length): the key changes, every access fails. */
        {
                struct ibv_mw_bind b = {.wr_id = 0xb1, .send_flags = IBV_SEND_SIGNALED};
                CHECK(ibv_bind_mw(p.b, mw1, &b) == 0);
                struct ibv_wc wc;
                CHECK(poll1(p.cqb, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
                      wc.opcode == IBV_WC_BIND_MW);
        }
        CHECK(mw1->rkey == ibv_inc_rkey(k2));
        CHECK(read_status(&p, wbase, 16, mw1->rkey) == IBV_WC_REM_ACCESS_ERR);
        pair_down(&p);
        pair_up(&p);
        CHECK(read_status(&p, wbase, 16, k2) == IBV_WC_REM_ACCESS_ERR);
        pair_down(&p);

        /* A region without MW_BIND: the bind completes in error. */
        pair_up(&p);
        {
                struct ibv_mw_bind b = {.wr_id = 0xb1, .send_flags = IBV_SEND_SIGNALED};
                b.bind_info.mr = plain;
                b.bind_info.addr = (uintptr_t)tbuf;
                b.bind_info.length = 64;
                b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
                CHECK(ibv_bind_mw(p.b, mw1, &b) == 0);
                struct ibv_wc wc;
                CHECK(poll1(p.cqb, &wc) == 1 && wc.status == IBV_WC_MW_BIND_ERR);
                CHECK(qp_state(p.b) == IBV_QPS_ERR);
        }
        pair_down(&p);

        /* ---- type 2 ---------------------------------------------------- */
        pair_up(&p);
        {
                /* Type 1 takes ibv_bind_mw only, type 2 the work request only. */
                struct ibv_mw_bind b = {.wr_id = 1};
                CHECK(ibv_bind_mw(p.b, mw2, &b) == EINVAL);
                struct ibv_send_wr wr = {.opcode = IBV_WR_BIND_MW}, *bad;
                wr.bind_mw.mw = mw1;
                wr.bind_mw.rkey = ibv_inc_rkey(mw1->rkey);
                CHECK(ibv_post_send(p.b, &wr, &bad) == EINVAL && bad == &wr);
        }
        uint32_t r1 = ibv_inc_rkey(mw2->rkey);
        CHECK(bind2(p.b, mw2, r1, tmr, wbase, WLEN,
                    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, &st) == 0 &&
              st == IBV_WC_SUCCESS);
        CHECK(mw2->rkey == r1);
        for (int i = 0; i < 64; i++)
                lbuf[i] = (unsigned char)(0xc0 + i);
        CHECK(write_then_read(&p, wbase + WLEN - 64, 64, r1, wbase, r1) == IBV_WC_SUCCESS);
        CHECK(!memcmp(tbuf + WOFF + WLEN - 64, lbuf, 64));
        /* Remote invalidation: the receive reports the rkey. */
        CHECK(post_recv(p.b) == 0);
        CHECK(send_inv(p.a, r1) == 0);
        {
                struct ibv_wc wc;
                CHECK(poll1(p.cqa, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
                      wc.opcode == IBV_WC_SEND);
                CHECK(poll1(p.cqb, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
                      wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_INV) &&
                      wc.invalidated_rkey == r1);
        }
        CHECK(read_status(&p, wbase, 8, r1) == IBV_WC_REM_ACCESS_ERR);
        CHECK(canary_intact());
        pair_down(&p);

        /* Rebind with the next key; Local Invalidate; the QP it serves. */
        struct pair q;
        pair_up(&p);
        pair_up(&q);
        uint32_t r2 = ibv_inc_rkey(r1);
        CHECK(bind2(p.b, mw2, r2, tmr, wbase, WLEN, IBV_ACCESS_REMOTE_READ, &st) == 0 &&
              st == IBV_WC_SUCCESS);
        CHECK(read_status(&p, wbase, 8, r2) == IBV_WC_SUCCESS);
        CHECK(read_status(&q, wbase, 8, r2) == IBV_WC_REM_ACCESS_ERR); /* not its QP */
        CHECK(ibv_dereg_mr(tmr) == EBUSY);
        {
                int st2 = -1;
                CHECK(bind2(p.b, mw2, ibv_inc_rkey(r2), tmr, wbase, 8, IBV_ACCESS_REMOTE_READ,
                            &st2) == 0 &&
                      st2 == IBV_WC_MW_BIND_ERR); /* still bound */
        }
        pair_down(&q);
        pair_down(&p);
        pair_up(&p);
        uint32_t r3 = ibv_inc_rkey(ibv_inc_rkey(r2));
        CHECK(bind2(p.b, mw2, r3, tmr, wbase, WLEN, IBV_ACCESS_REMOTE_READ, &st) == 0 &&
              st == IBV_WC_SUCCESS);
        CHECK(read_status(&p, wbase, 8, r3) == IBV_WC_SUCCESS);
        {
                struct ibv_send_wr wr = {.wr_id = 0x12,
                                         .opcode = IBV_WR_LOCAL_INV,
                                         .send_flags = IBV_SEND_SIGNALED},
                                   *bad;
                wr.invalidate_rkey = r3;
                CHECK(ibv_post_send(p.b, &wr, &bad) == 0);
                struct ibv_wc wc;
                CHECK(poll1(p.cqb, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
                      wc.opcode == IBV_WC_LOCAL_INV);
        }
        CHECK(read_status(&p, wbase, 8, r3) == IBV_WC_REM_ACCESS_ERR);
        pair_down(&p);

        /* No window bound: the region goes; then the windows. */
        CHECK(ibv_dealloc_mw(mw1) == 0);
        CHECK(ibv_dealloc_mw(mw2) == 0);
        CHECK(ibv_dereg_mr(tmr) == 0);
        CHECK(ibv_dereg_mr(lmr) == 0);
        CHECK(ibv_dereg_mr(plain) == 0);
        CHECK(ibv_dealloc_pd(pd) == 0);
        CHECK(ibv_close_device(ctx) == 0);
        ibv_free_device_list(list);
        free(tbuf);
        free(lbuf);
        if (failures)
                fprintf(stderr, "%d check(s) failed\n", failures);
        else
                printf("mw_api: all checks passed\n");
        return failures ? 1 : 0;
}
