/* The SQD and SQE QP states, in process between two devices on loopback:
 * RTS->SQD holds new send WRs while WRs under way finish, SQ_DRAINED fires
 * once the send queue is drained (when asked for), SQD->RTS releases the held
 * WRs; a UD send error moves the QP to SQE (receives go on, new sends flush)
 * and SQE->RTS recovers; illegal transitions and attribute masks fail with
 * -EINVAL. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <diwarp/diwarp.h>

#define QKEY   0x22222222u
#define BUFLEN (16u << 20)
#define ALL_ACCESS                                                                                 \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC)

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        struct diwarp_ah *ah; /* UD: to the other side's device */
        uint8_t *buf;
        uint32_t lkey, rkey;
};

/* The cases assert what one step left under way (SQD with a Write and a
 * Read in flight): the devices run without a progress thread, which would
 * finish them behind the test's back. */
__attribute__((constructor)) static void app_driven_progress(void)
{
        setenv("DIWARP_PROGRESS", "app", 0);
}
static struct side A, B;

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void side_init(struct side *s, enum diwarp_qp_type type)
{
        memset(s, 0, sizeof(*s));
        cr_assert_eq(diwarp_device_open(NULL, &s->dev), 0);
        cr_assert_eq(diwarp_pd_alloc(s->dev, &s->pd), 0);
        cr_assert_eq(diwarp_cq_create(s->dev, 256, NULL, NULL, &s->cq), 0);
        struct diwarp_qp_init_attr ia = {
            .send_cq = s->cq,
            .recv_cq = s->cq,
            .qp_type = type,
            .cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2, .max_recv_sge = 2}};
        cr_assert_eq(diwarp_qp_create(s->pd, &ia, &s->qp), 0);
        s->buf = aligned_alloc(4096, BUFLEN);
        cr_assert_not_null(s->buf);
        memset(s->buf, 0, BUFLEN);
        cr_assert_eq(diwarp_mr_reg(s->pd, s->buf, BUFLEN, (uintptr_t)s->buf, ALL_ACCESS, &s->mr),
                     0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(s->mr, &mi);
        s->lkey = mi.lkey;
        s->rkey = mi.rkey;
}

static void side_fini(struct side *s)
{
        if (!s->dev)
                return;
        if (s->ah)
                cr_expect_eq(diwarp_ah_destroy(s->ah), 0);
        cr_expect_eq(diwarp_qp_destroy(s->qp), 0);
        cr_expect_eq(diwarp_mr_dereg(s->mr), 0);
        cr_expect_eq(diwarp_cq_destroy(s->cq), 0);
        cr_expect_eq(diwarp_pd_dealloc(s->pd), 0);
        cr_expect_eq(diwarp_device_close(s->dev), 0);
        free(s->buf);
        memset(s, 0, sizeof(*s));
}

static void fini_both(void)
{
        side_fini(&A);
        side_fini(&B);
}

static void progress_both(void)
{
        diwarp_progress(A.dev, 64);
        diwarp_progress(B.dev, 64);
}

static int modify(struct diwarp_qp *qp, enum diwarp_qp_state st, int mask)
{
        struct diwarp_qp_attr a = {.qp_state = st, .qkey = QKEY, .en_sqd_async_notify = 1};
        return diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | mask);
}

static struct diwarp_wc wait_wc(struct side *s, int timeout_ms)
{
        struct diwarp_wc wc;
        uint64_t end = now_ms() + (uint64_t)timeout_ms;
        for (;;) {
                int n = diwarp_cq_poll(s->cq, 1, &wc);
                cr_assert_geq(n, 0);
                if (n == 1)
                        return wc;
                progress_both();
                cr_assert_lt(now_ms(), end, "no completion within %d ms", timeout_ms);
        }
}

/* Drives both devices for ms; true if s got no completion meanwhile. */
static bool poll_none(struct side *s, int ms)
{
        struct diwarp_wc wc;
        uint64_t end = now_ms() + (uint64_t)ms;
        while (now_ms() < end) {
                if (diwarp_cq_poll(s->cq, 1, &wc) != 0)
                        return false;
                progress_both();
        }
        return true;
}

/* Drives both devices until s's QP has sent at least bytes (its WRs are
 * under way), for at most ms. */
static void started(struct side *s, uint64_t bytes, int ms)
{
        uint64_t end = now_ms() + (uint64_t)ms;
        for (;;) {
                struct diwarp_counters c;
                cr_assert_eq(diwarp_qp_counters(s->qp, &c), 0);
                if (c.tx_bytes >= bytes)
                        return;
                cr_assert_lt(now_ms(), end, "QP sent %llu bytes in %d ms, not %llu",
                             (unsigned long long)c.tx_bytes, ms, (unsigned long long)bytes);
                progress_both();
        }
}

/* Waits up to ms for an async event of type on s's QP; other events are
 * skipped. */
static bool got_async(struct side *s, enum diwarp_event_type type, int ms)
{
        int fd = diwarp_async_fd(s->dev);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        uint64_t end = now_ms() + (uint64_t)ms;
        do {
                struct diwarp_async_event ev;
                if (diwarp_get_async_event(s->dev, &ev) == 0 && ev.event_type == type &&
                    ev.element.qp == s->qp)
                        return true;
                progress_both();
        } while (now_ms() < end);
        return false;
}

static void post_recv(struct side *s, uint64_t id, size_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + off, len, s->lkey};
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        cr_assert_eq(diwarp_post_recv(s->qp, &wr, &bad), 0);
}

/* RC: op with rdma fields; UD: a Send to the other side's QP. */
static int post_send(struct side *s, struct side *to, enum diwarp_wr_opcode op, uint64_t id,
                     size_t off, uint32_t len, uint32_t lkey, uint64_t raddr)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + off, len, lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        if (s->ah) {
                wr.wr.ud.ah = s->ah;
                wr.wr.ud.remote_qpn = diwarp_qp_num(to->qp);
                wr.wr.ud.remote_qkey = QKEY;
        } else {
                wr.wr.rdma.remote_addr = raddr;
                wr.wr.rdma.rkey = to->rkey;
        }
        struct diwarp_send_wr *bad;
        return diwarp_post_send(s->qp, &wr, &bad);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
        uint32_t x = seed * 2654435761u + 1;
        for (size_t i = 0; i < n; i++) {
                x = x * 1103515245u + 12345u;
                p[i] = (uint8_t)(x >> 16);
        }
}

static void ud_pair(void)
{
        side_init(&A, DIWARP_QPT_UD);
        side_init(&B, DIWARP_QPT_UD);
        union diwarp_gid g;
        cr_assert_eq(diwarp_device_gid(B.dev, &g), 0);
        cr_assert_eq(diwarp_ah_create(A.pd, &g, &A.ah), 0);
        cr_assert_eq(diwarp_device_gid(A.dev, &g), 0);
        cr_assert_eq(diwarp_ah_create(B.pd, &g, &B.ah), 0);
        struct side *s[2] = {&A, &B};
        for (int i = 0; i < 2; i++) {
                cr_assert_eq(modify(s[i]->qp, DIWARP_QPS_INIT, DIWARP_QP_QKEY), 0);
                cr_assert_eq(modify(s[i]->qp, DIWARP_QPS_RTR, 0), 0);
                cr_assert_eq(modify(s[i]->qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), 0);
        }
}

/* IB-style RC connect, then one Send each way so the stream is up. */
static void rc_pair(void)
{
        side_init(&A, DIWARP_QPT_RC);
        side_init(&B, DIWARP_QPT_RC);
        struct side *s[2] = {&A, &B};
        for (int i = 0; i < 2; i++) {
                struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                           .qp_access_flags = DIWARP_ACCESS_REMOTE_WRITE |
                                                              DIWARP_ACCESS_REMOTE_READ};
                cr_assert_eq(
                    diwarp_qp_modify(s[i]->qp, &a, DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS), 0);
        }
        for (int i = 0; i < 2; i++) {
                struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTR,
                                           .dest_qp_num = diwarp_qp_num(s[1 - i]->qp),
                                           .max_dest_rd_atomic = 16};
                cr_assert_eq(diwarp_device_gid(s[1 - i]->dev, &a.dgid), 0);
                cr_assert_eq(diwarp_qp_modify(s[i]->qp, &a,
                                              DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN |
                                                  DIWARP_QP_MAX_DEST_RD_ATOMIC),
                             0);
        }
        for (int i = 0; i < 2; i++) {
                struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTS, .max_rd_atomic = 16};
                cr_assert_eq(
                    diwarp_qp_modify(s[i]->qp, &a, DIWARP_QP_STATE | DIWARP_QP_MAX_QP_RD_ATOMIC),
                    0);
        }
        post_recv(&B, 1, 0, 64);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 1, 0, 8, A.lkey, 0), 0);
        struct diwarp_wc wc = wait_wc(&A, 5000);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        wc = wait_wc(&B, 5000);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
}

static enum diwarp_qp_state state_of(struct diwarp_qp *qp, bool *draining)
{
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(qp, &a, &ia), 0);
        cr_assert_eq(a.qp_state, diwarp_qp_state(qp));
        if (draining)
                *draining = a.sq_draining;
        return a.qp_state;
}

TestSuite(qp_states, .fini = fini_both, .timeout = 60);

/* UD: nothing is ever under way, so SQD is drained at once; sends posted in
 * SQD are accepted and go out only after SQD->RTS. */
Test(qp_states, ud_sqd_holds_sends_until_rts)
{
        ud_pair();
        cr_assert_eq(modify(A.qp, DIWARP_QPS_SQD, DIWARP_QP_EN_SQD_ASYNC_NOTIFY), 0);
        bool draining = true;
        cr_assert_eq(state_of(A.qp, &draining), DIWARP_QPS_SQD);
        cr_assert(got_async(&A, DIWARP_EVENT_SQ_DRAINED, 1000), "no SQ_DRAINED event");
        cr_expect_not(draining);
        for (int i = 0; i < 3; i++) {
                post_recv(&B, 10 + i, (size_t)i * 4096, 4096);
                fill(A.buf + i * 100, 100, i);
                cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 20 + i, i * 100, 100, A.lkey, 0), 0,
                             "a send posted in SQD is accepted");
        }
        cr_assert(poll_none(&A, 150), "a send completed in SQD");
        cr_assert(poll_none(&B, 50), "a send went out in SQD");
        /* Receives still work in SQD. */
        post_recv(&A, 30, 8192, 4096);
        cr_assert_eq(post_send(&B, &A, DIWARP_WR_SEND, 31, 0, 10, B.lkey, 0), 0);
        struct diwarp_wc wc = wait_wc(&B, 2000);
        cr_assert_eq(wc.wr_id, 31);
        wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 30);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);

        cr_assert_eq(modify(A.qp, DIWARP_QPS_RTS, 0), 0);
        for (int i = 0; i < 3; i++) {
                wc = wait_wc(&A, 2000);
                cr_expect_eq(wc.wr_id, 20u + i, "send completions in order");
                cr_expect_eq(wc.status, DIWARP_WC_SUCCESS);
                wc = wait_wc(&B, 2000);
                cr_expect_eq(wc.wr_id, 10u + i);
                cr_expect_eq(wc.byte_len, 140u);
                cr_expect_arr_eq(B.buf + i * 4096 + 40, A.buf + i * 100, 100);
        }
        cr_expect_eq(state_of(A.qp, NULL), DIWARP_QPS_RTS);
}

/* Without EN_SQD_ASYNC_NOTIFY no event is raised. */
Test(qp_states, sqd_without_notify_raises_nothing)
{
        ud_pair();
        cr_assert_eq(modify(A.qp, DIWARP_QPS_SQD, 0), 0);
        cr_expect_not(got_async(&A, DIWARP_EVENT_SQ_DRAINED, 100));
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(A.qp, &a, &ia), 0);
        cr_expect_eq(a.en_sqd_async_notify, 0);
        cr_expect_eq(a.sq_draining, 0);
        /* Attributes may change in SQD once drained. */
        struct diwarp_qp_attr q = {.qp_state = DIWARP_QPS_SQD, .qkey = 0x1234};
        cr_expect_eq(diwarp_qp_modify(A.qp, &q, DIWARP_QP_STATE | DIWARP_QP_QKEY), 0);
        cr_assert_eq(diwarp_qp_query(A.qp, &a, &ia), 0);
        cr_expect_eq(a.qkey, 0x1234u);
        cr_expect_eq(modify(A.qp, DIWARP_QPS_RTS, 0), 0);
}

/* RC: a Read (its request sent, the response not yet in) and a large Write
 * (partly sent) are under way when the QP enters SQD; both finish, then
 * SQ_DRAINED comes; a Send and a Write posted in SQD wait for
 * SQD->RTS. */
Test(qp_states, rc_sqd_finishes_started_wrs_then_drains)
{
        rc_pair();
        const uint32_t wlen = 8u << 20, rlen = 1u << 20;
        fill(A.buf, wlen, 7);
        fill(B.buf + wlen, rlen, 8);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_RDMA_READ, 101, wlen, rlen, A.lkey,
                               (uintptr_t)B.buf + wlen),
                     0);
        cr_assert_eq(
            post_send(&A, &B, DIWARP_WR_RDMA_WRITE, 100, 0, wlen, A.lkey, (uintptr_t)B.buf), 0);
        /* SQD finishes the WRs the QP has started and holds the rest until
         * RTS, as InfiniBand's does. The post usually starts both; when it
         * does not (its step found no room to send, the RD path paces or
         * the host took the core), step until a Write segment has gone, so
         * that both WRs are under way when SQD comes. */
        started(&A, 64 * 1024, 5000);
        cr_assert_eq(modify(A.qp, DIWARP_QPS_SQD, DIWARP_QP_EN_SQD_ASYNC_NOTIFY), 0);
        bool draining = false;
        cr_assert_eq(state_of(A.qp, &draining), DIWARP_QPS_SQD);
        cr_expect(draining, "the Write and the Read are still under way");
        /* Attributes cannot change while draining. */
        struct diwarp_qp_attr q = {.qp_state = DIWARP_QPS_SQD, .timeout = 10};
        cr_expect_eq(diwarp_qp_modify(A.qp, &q, DIWARP_QP_STATE | DIWARP_QP_TIMEOUT), -EINVAL);

        post_recv(&B, 200, wlen + rlen, 4096);
        fill(A.buf + wlen + rlen, 64, 9);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 102, wlen + rlen, 64, A.lkey, 0), 0);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_RDMA_WRITE, 103, wlen + rlen, 64, A.lkey,
                               (uintptr_t)B.buf + BUFLEN - 64),
                     0);

        struct diwarp_wc wc = wait_wc(&A, 10000);
        cr_assert_eq(wc.wr_id, 101);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wc.byte_len, rlen);
        wc = wait_wc(&A, 10000);
        cr_assert_eq(wc.wr_id, 100);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert(got_async(&A, DIWARP_EVENT_SQ_DRAINED, 2000), "no SQ_DRAINED event");
        cr_assert_eq(state_of(A.qp, &draining), DIWARP_QPS_SQD);
        cr_expect_not(draining);
        cr_expect_arr_eq(A.buf + wlen, B.buf + wlen, rlen, "Read data");
        cr_assert(poll_none(&A, 200), "a WR posted in SQD completed");
        cr_assert(poll_none(&B, 50), "a Send posted in SQD arrived");
        cr_expect_eq(B.buf[BUFLEN - 1], 0, "a Write posted in SQD was placed");

        cr_assert_eq(modify(A.qp, DIWARP_QPS_RTS, 0), 0);
        wc = wait_wc(&A, 5000);
        cr_expect_eq(wc.wr_id, 102);
        cr_expect_eq(wc.status, DIWARP_WC_SUCCESS);
        wc = wait_wc(&A, 5000);
        cr_expect_eq(wc.wr_id, 103);
        cr_expect_eq(wc.status, DIWARP_WC_SUCCESS);
        wc = wait_wc(&B, 5000);
        cr_expect_eq(wc.wr_id, 200);
        cr_expect_eq(wc.byte_len, 64u);
        cr_expect_arr_eq(B.buf + wlen + rlen, A.buf + wlen + rlen, 64);
        /* The Send arrived after the big Write on the same stream. */
        cr_expect_arr_eq(B.buf, A.buf, wlen, "Write data");
        cr_expect_arr_eq(B.buf + BUFLEN - 64, A.buf + wlen + rlen, 64);
        cr_expect_eq(state_of(B.qp, NULL), DIWARP_QPS_RTS, "the peer saw nothing wrong");
}

/* UD: a send that fails locally (bad lkey) completes in error and moves the
 * QP to SQE; WRs behind it and sends posted in SQE flush, receives still
 * complete, SQE->RTS sends again. */
Test(qp_states, ud_send_error_to_sqe_and_back)
{
        ud_pair();
        post_recv(&B, 1, 0, 4096);
        post_recv(&B, 2, 4096, 4096);
        cr_assert_eq(modify(A.qp, DIWARP_QPS_SQD, 0), 0); /* queue the three together */
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 10, 0, 16, A.lkey, 0), 0);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 11, 0, 16, A.lkey ^ 0x5a5a00, 0), 0);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 12, 0, 16, A.lkey, 0), 0);
        cr_assert_eq(modify(A.qp, DIWARP_QPS_RTS, 0), 0);
        struct diwarp_wc wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 10);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 11);
        cr_assert_eq(wc.status, DIWARP_WC_LOC_PROT_ERR);
        wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 12);
        cr_assert_eq(wc.status, DIWARP_WC_WR_FLUSH_ERR);
        cr_assert_eq(state_of(A.qp, NULL), DIWARP_QPS_SQE);
        wc = wait_wc(&B, 2000);
        cr_assert_eq(wc.wr_id, 1, "WR 10 went out before the error");
        cr_expect_not(got_async(&A, DIWARP_EVENT_QP_FATAL, 50), "SQE is no QP error");

        /* A send posted in SQE is accepted and flushed. */
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 13, 0, 16, A.lkey, 0), 0);
        wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 13);
        cr_assert_eq(wc.status, DIWARP_WC_WR_FLUSH_ERR);
        /* The receive side works in SQE. */
        post_recv(&A, 20, 8192, 4096);
        cr_assert_eq(post_send(&B, &A, DIWARP_WR_SEND, 21, 0, 5, B.lkey, 0), 0);
        wc = wait_wc(&B, 2000);
        cr_assert_eq(wc.wr_id, 21);
        wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 20);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wc.byte_len, 45u);

        /* Only RTS, RESET or ERR leave SQE. */
        cr_expect_eq(modify(A.qp, DIWARP_QPS_SQD, 0), -EINVAL);
        cr_expect_eq(modify(A.qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), -EINVAL);
        cr_assert_eq(modify(A.qp, DIWARP_QPS_RTS, DIWARP_QP_QKEY), 0);
        cr_assert_eq(state_of(A.qp, NULL), DIWARP_QPS_RTS);
        fill(A.buf, 16, 3);
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 14, 0, 16, A.lkey, 0), 0);
        wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 14);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        wc = wait_wc(&B, 2000);
        cr_assert_eq(wc.wr_id, 2);
        cr_expect_arr_eq(B.buf + 4096 + 40, A.buf, 16);
}

/* RC send errors still move the QP to ERR (a Terminate ends the stream). */
Test(qp_states, rc_send_error_goes_to_err)
{
        rc_pair();
        cr_assert_eq(post_send(&A, &B, DIWARP_WR_SEND, 5, 0, 16, A.lkey ^ 0x5a5a00, 0), 0);
        struct diwarp_wc wc = wait_wc(&A, 2000);
        cr_assert_eq(wc.wr_id, 5);
        cr_assert_eq(wc.status, DIWARP_WC_LOC_PROT_ERR);
        cr_assert_eq(state_of(A.qp, NULL), DIWARP_QPS_ERR);
}

Test(qp_states, illegal_transitions_and_masks)
{
        ud_pair();
        struct diwarp_qp *qp = B.qp;
        /* From RTS: SQE is entered by an error only. */
        cr_expect_eq(modify(qp, DIWARP_QPS_SQE, 0), -EINVAL);
        /* EN_SQD_ASYNC_NOTIFY belongs to RTS->SQD only. */
        cr_expect_eq(modify(qp, DIWARP_QPS_RTS, DIWARP_QP_EN_SQD_ASYNC_NOTIFY), -EINVAL);
        /* RTS->SQD takes no other attribute. */
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, DIWARP_QP_QKEY), -EINVAL);
        cr_expect_eq(state_of(qp, NULL), DIWARP_QPS_RTS);
        cr_assert_eq(modify(qp, DIWARP_QPS_SQD, 0), 0);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, 0), 0, "SQD->SQD is allowed");
        cr_expect_eq(modify(qp, DIWARP_QPS_INIT, 0), -EINVAL);
        cr_expect_eq(modify(qp, DIWARP_QPS_RTR, 0), -EINVAL);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQE, 0), -EINVAL);
        cr_expect_eq(modify(qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), -EINVAL);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, DIWARP_QP_DEST_QPN), -EINVAL);
        struct diwarp_qp_attr cs = {.qp_state = DIWARP_QPS_RTS, .cur_qp_state = DIWARP_QPS_RTS};
        cr_expect_eq(diwarp_qp_modify(qp, &cs, DIWARP_QP_STATE | DIWARP_QP_CUR_STATE), -EINVAL,
                     "CUR_STATE must name SQD");
        cs.cur_qp_state = DIWARP_QPS_SQD;
        cr_expect_eq(diwarp_qp_modify(qp, &cs, DIWARP_QP_STATE | DIWARP_QP_CUR_STATE), 0);
        /* Not from INIT or RTR either. */
        cr_assert_eq(modify(qp, DIWARP_QPS_RESET, 0), 0);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, 0), -EINVAL);
        cr_assert_eq(modify(qp, DIWARP_QPS_INIT, DIWARP_QP_QKEY), 0);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, 0), -EINVAL);
        cr_assert_eq(modify(qp, DIWARP_QPS_RTR, 0), 0);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, 0), -EINVAL);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQE, 0), -EINVAL);
        cr_expect_eq(state_of(qp, NULL), DIWARP_QPS_RTR);
        /* SQD and ERR: SQD->ERR flushes the held sends. */
        cr_assert_eq(modify(qp, DIWARP_QPS_RTS, DIWARP_QP_SQ_PSN), 0);
        cr_assert_eq(modify(qp, DIWARP_QPS_SQD, 0), 0);
        cr_assert_eq(post_send(&B, &A, DIWARP_WR_SEND, 7, 0, 8, B.lkey, 0), 0);
        cr_assert_eq(modify(qp, DIWARP_QPS_ERR, 0), 0);
        struct diwarp_wc wc = wait_wc(&B, 2000);
        cr_expect_eq(wc.wr_id, 7);
        cr_expect_eq(wc.status, DIWARP_WC_WR_FLUSH_ERR);
        cr_expect_eq(modify(qp, DIWARP_QPS_SQD, 0), -EINVAL);
}
