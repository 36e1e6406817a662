/* A thread blocked in diwarp_comp_channel_get_event drives its device while
 * it waits (libdiwarp/progress/README.md, "Event-driven programs"): it spins
 * first (DIWARP_WAIT_SPIN_US), then sleeps. Both are cancellation points. A
 * waiter cancelled in either must leave no driver role behind: the next
 * waiter on the channel gets the next completion's event. Were the role left
 * to the dead thread, the next waiter would sleep beside it on the channel
 * fd and the progress thread would stay yielded to it, so nobody would read
 * the datagram and the event would never come.
 *
 * Device b waits (its CQ on a channel, which brings its progress thread up);
 * device a sends it one UD message after the cancellation. Criterion runs
 * each test in its own process, so each sets DIWARP_WAIT_SPIN_US before it
 * opens b. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "ud_rts.h"

#define QKEY  0x3131u
#define SLOT  256
#define GRH   40
#define MSG   64
#define WR_ID 0x77u

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_comp_channel *ch; /* b only */
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t buf[SLOT + GRH];
        uint32_t lkey;
};

static void side_open(struct side *s, bool channel)
{
        memset(s, 0, sizeof(*s));
        struct diwarp_open_opts o = {0};
        cr_assert_eq(diwarp_device_open(&o, &s->dev), 0);
        cr_assert_eq(diwarp_pd_alloc(s->dev, &s->pd), 0);
        if (channel)
                cr_assert_eq(diwarp_comp_channel_create(s->dev, &s->ch), 0);
        cr_assert_eq(diwarp_cq_create(s->dev, 16, NULL, s->ch, &s->cq), 0);
        s->qp = ud_qp_make(s->pd, s->cq, 4, 1);
        s->lkey = ud_mr_local(s->pd, s->buf, sizeof(s->buf), &s->mr);
        ud_qp_to_rts(s->qp, QKEY);
}

static void side_close(struct side *s)
{
        cr_expect_eq(diwarp_qp_destroy(s->qp), 0);
        cr_expect_eq(diwarp_mr_dereg(s->mr), 0);
        cr_expect_eq(diwarp_cq_destroy(s->cq), 0);
        if (s->ch)
                cr_expect_eq(diwarp_comp_channel_destroy(s->ch), 0);
        cr_expect_eq(diwarp_pd_dealloc(s->pd), 0);
        cr_expect_eq(diwarp_device_close(s->dev), 0);
}

struct waiter {
        struct diwarp_comp_channel *ch;
        struct diwarp_cq *cq; /* the event's CQ */
        int rc;
        atomic_bool done;
};

static void *wait_event(void *arg)
{
        struct waiter *w = arg;
        void *ctx;
        w->rc = diwarp_comp_channel_get_event(w->ch, &w->cq, &ctx);
        atomic_store(&w->done, true);
        return NULL;
}

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* cancel_after_us: how long the first waiter waits before it is cancelled
 * (inside its spin or its sleep, as DIWARP_WAIT_SPIN_US makes it). */
static void cancelled_waiter_leaves_no_role(const char *spin_us, unsigned cancel_after_us)
{
        cr_assert_eq(setenv("DIWARP_WAIT_SPIN_US", spin_us, 1), 0);
        struct side a, b;
        side_open(&a, false);
        side_open(&b, true);

        struct diwarp_sge rsg = {(uintptr_t)b.buf, sizeof(b.buf), b.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = WR_ID, .sg_list = &rsg, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);
        cr_assert_eq(diwarp_cq_req_notify(b.cq, false), 0);

        /* The first waiter blocks (no completion is due) and is cancelled. */
        struct waiter w1 = {.ch = b.ch};
        pthread_t t1;
        cr_assert_eq(pthread_create(&t1, NULL, wait_event, &w1), 0);
        usleep(cancel_after_us);
        cr_assert_not(atomic_load(&w1.done), "get_event returned with nothing due (%d)", w1.rc);
        cr_assert_eq(pthread_cancel(t1), 0);
        void *res;
        cr_assert_eq(pthread_join(t1, &res), 0);
        cr_assert_eq(res, PTHREAD_CANCELED, "the waiter was not cancelled");

        /* The next waiter gets the event of the next completion. */
        struct waiter w2 = {.ch = b.ch};
        pthread_t t2;
        cr_assert_eq(pthread_create(&t2, NULL, wait_event, &w2), 0);
        usleep(2000);
        memset(a.buf, 0x5a, MSG);
        union diwarp_gid g;
        cr_assert_eq(diwarp_device_gid(b.dev, &g), 0);
        struct diwarp_ah *ah;
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);
        struct diwarp_sge ssg = {(uintptr_t)a.buf, MSG, a.lkey};
        struct diwarp_send_wr swr = {.wr_id = 1,
                                     .sg_list = &ssg,
                                     .num_sge = 1,
                                     .opcode = DIWARP_WR_SEND,
                                     .send_flags = DIWARP_SEND_SIGNALED};
        swr.wr.ud.ah = ah;
        swr.wr.ud.remote_qpn = diwarp_qp_num(b.qp);
        swr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *sbad;
        cr_assert_eq(diwarp_post_send(a.qp, &swr, &sbad), 0);
        uint64_t end = now_ms() + 5000;
        struct diwarp_wc wc;
        while (!atomic_load(&w2.done) && now_ms() < end) {
                diwarp_cq_poll(a.cq, 1, &wc); /* a's send completion; drives a */
                usleep(200);
        }
        bool got = atomic_load(&w2.done);
        if (!got)
                pthread_cancel(t2);
        cr_assert_eq(pthread_join(t2, NULL), 0);
        cr_assert(got, "no event within 5 s after the first waiter was cancelled (spin %s us)",
                  spin_us);
        cr_assert_eq(w2.rc, 0);
        cr_assert_eq(w2.cq, b.cq);
        diwarp_cq_ack_events(b.cq, 1);
        cr_assert_eq(diwarp_cq_poll(b.cq, 1, &wc), 1);
        cr_assert_eq(wc.wr_id, WR_ID);
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wc.byte_len, (uint32_t)(GRH + MSG));
        cr_assert_eq(b.buf[GRH], 0x5a);
        cr_assert_eq(b.buf[GRH + MSG - 1], 0x5a);

        cr_expect_eq(diwarp_ah_destroy(ah), 0);
        side_close(&a);
        side_close(&b);
}

/* A 10 ms spin (the most DIWARP_WAIT_SPIN_US allows): the cancellation,
 * 3 ms into the wait, lands in it. */
Test(channel_cancel, in_the_spin, .timeout = 30)
{
        cancelled_waiter_leaves_no_role("10000", 3000);
}

/* No spin: the cancellation lands in the sleep. */
Test(channel_cancel, in_the_sleep, .timeout = 30)
{
        cancelled_waiter_leaves_no_role("0", 20000);
}
