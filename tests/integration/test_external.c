/* The public calls a program uses to run the engine from a loop of its own
 * (include/diwarp/diwarpdv.h), as the host daemon does: their argument and
 * state checks, and a UD Send between two devices that only
 * diwarpdv_external_run drives (no progress thread exists, and no call here
 * but diwarpdv_external_run makes progress before the completion is
 * polled); and the time slice a thread that arms a CQ asks for.
 * Criterion runs each test in a process of its own. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>
#include "ud_rts.h"

#define QKEY 0x3131u
#define GRH  40

/* No device here may get a progress thread from the environment. */
__attribute__((constructor)) static void app_driven_progress(void)
{
        setenv("DIWARP_PROGRESS", "app", 1);
}

static uint64_t now_ms(void)
{
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

Test(external, null_arguments)
{
        int64_t ns = 7;
        cr_assert_eq(diwarpdv_external_progress(NULL), -EINVAL);
        cr_assert_eq(diwarpdv_external_timeout(NULL, &ns), -EINVAL);
        cr_assert_eq(diwarpdv_external_run(NULL), -EINVAL);
        struct diwarp_device *dev;
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        cr_assert_eq(diwarpdv_external_timeout(dev, NULL), -EINVAL);
        cr_assert_eq(ns, 7, "a refused call wrote its output");
        cr_assert_eq(diwarp_device_close(dev), 0);
}

/* _timeout and _run on a device nobody took: -EINVAL, nothing written. */
Test(external, not_taken)
{
        struct diwarp_device *dev;
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        int64_t ns = 7;
        cr_assert_eq(diwarpdv_external_timeout(dev, &ns), -EINVAL);
        cr_assert_eq(ns, 7);
        cr_assert_eq(diwarpdv_external_run(dev), -EINVAL);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

/* A device whose progress thread runs cannot be taken. */
Test(external, thread_runs)
{
        struct diwarp_device *dev;
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        cr_assert_eq(diwarp_progress_thread_start(dev), 0);
        cr_assert_eq(diwarpdv_external_progress(dev), -EBUSY);
        cr_assert_eq(diwarpdv_external_run(dev), -EINVAL);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

/* Once taken: the same fd again, and nothing starts a thread beside it. */
Test(external, taken_keeps_no_thread)
{
        struct diwarp_device *dev;
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        int fd = diwarpdv_external_progress(dev);
        cr_assert_geq(fd, 0);
        cr_assert_eq(diwarpdv_external_progress(dev), fd);
        cr_assert_eq(diwarp_progress_thread_start(dev), -EBUSY);
        struct diwarp_comp_channel *ch = NULL;
        cr_assert_eq(diwarp_comp_channel_create(dev, &ch), -EBUSY);
        int64_t ns = -2;
        cr_assert_eq(diwarpdv_external_timeout(dev, &ns), 0);
        cr_assert_geq(ns, -1);
        cr_assert_geq(diwarpdv_external_run(dev), 0);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t buf[256 + GRH];
        uint32_t lkey;
        int fd;
};

static void side_open(struct side *s)
{
        memset(s, 0, sizeof(*s));
        cr_assert_eq(diwarp_device_open(NULL, &s->dev), 0);
        s->fd = diwarpdv_external_progress(s->dev);
        cr_assert_geq(s->fd, 0);
        cr_assert_eq(diwarp_pd_alloc(s->dev, &s->pd), 0);
        cr_assert_eq(diwarp_cq_create(s->dev, 8, NULL, NULL, &s->cq), 0);
        s->qp = ud_qp_make(s->pd, s->cq, 4, 1);
        s->lkey = ud_mr_local(s->pd, s->buf, sizeof(s->buf), &s->mr);
        ud_qp_to_rts(s->qp, QKEY);
}

static void side_close(struct side *s)
{
        cr_expect_eq(diwarp_qp_destroy(s->qp), 0);
        cr_expect_eq(diwarp_mr_dereg(s->mr), 0);
        cr_expect_eq(diwarp_cq_destroy(s->cq), 0);
        cr_expect_eq(diwarp_pd_dealloc(s->pd), 0);
        cr_expect_eq(diwarp_device_close(s->dev), 0);
}

/* A's Send wakes B's set, and diwarpdv_external_run(B) delivers it. */
Test(external, drives_a_send)
{
        struct side a, b;
        side_open(&a);
        side_open(&b);
        struct diwarp_sge rsg = {(uintptr_t)b.buf, sizeof(b.buf), b.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 77, .sg_list = &rsg, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);

        union diwarp_gid g;
        cr_assert_eq(diwarp_device_gid(b.dev, &g), 0);
        struct diwarp_ah *ah;
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);
        memcpy(a.buf, "external progress", 18);
        struct diwarp_sge sg = {(uintptr_t)a.buf, 18, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 5,
                                    .sg_list = &sg,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = diwarp_qp_num(b.qp);
        wr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(a.qp, &wr, &bad), 0);

        /* B's set turns readable: the datagram is waiting on its socket. */
        uint64_t t0 = now_ms();
        struct pollfd p = {.fd = b.fd, .events = POLLIN};
        for (;;) {
                cr_assert_geq(diwarpdv_external_run(a.dev), 0);
                int r = poll(&p, 1, 10);
                cr_assert_geq(r, 0);
                if (r == 1)
                        break;
                cr_assert_lt(now_ms() - t0, 5000, "B's progress fd never turned readable");
        }
        int events = 0;
        struct diwarp_wc wc;
        int n = 0;
        while (n == 0) {
                int r = diwarpdv_external_run(b.dev);
                cr_assert_geq(r, 0);
                events += r;
                n = diwarp_cq_poll(b.cq, 1, &wc);
                cr_assert_geq(n, 0);
                cr_assert_lt(now_ms() - t0, 5000, "no receive completion");
        }
        cr_assert_gt(events, 0, "the receive came without an event of B's set");
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wc.opcode, DIWARP_WC_RECV);
        cr_assert_eq(wc.wr_id, 77u);
        cr_assert_eq(wc.byte_len, 18u + GRH);
        cr_assert_str_eq((const char *)b.buf + GRH, "external progress");
        cr_assert_eq(diwarp_ah_destroy(ah), 0);
        side_close(&a);
        side_close(&b);
}

/* A thread whose policy is not SCHED_OTHER has no slice to shorten. */
Test(external, short_time_slice)
{
        int r = diwarpdv_short_time_slice();
        cr_assert(r == 0 || r == -EOPNOTSUPP, "returned %d", r);
        struct sched_param sp = {0};
        cr_assert_eq(sched_setscheduler(0, SCHED_BATCH, &sp), 0);
        cr_assert_eq(diwarpdv_short_time_slice(), -EOPNOTSUPP);
}

/* The calling thread's scheduling attributes (sched_getattr(2)). */
struct thread_sched {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
};

/* The time slice the calling thread asked for (ns; 0: none reported). */
static uint64_t thread_slice(void)
{
        struct thread_sched a;
        memset(&a, 0, sizeof(a));
        cr_assert_eq(syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0), 0);
        return a.runtime;
}

/* False when this kernel keeps no slice for a SCHED_OTHER thread. */
static bool set_thread_slice(uint64_t ns)
{
        struct thread_sched a;
        memset(&a, 0, sizeof(a));
        cr_assert_eq(syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0), 0);
        a.size = sizeof(a);
        a.flags = 0;
        a.runtime = ns;
        return syscall(SYS_sched_setattr, 0, &a, 0) == 0 && thread_slice() == ns;
}

/* What a thread does before it sleeps on its completion channel. */
static void arm_a_cq(void)
{
        struct diwarp_device *dev;
        struct diwarp_comp_channel *ch;
        struct diwarp_cq *cq;
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        cr_assert_eq(diwarp_comp_channel_create(dev, &ch), 0);
        cr_assert_eq(diwarp_cq_create(dev, 8, NULL, ch, &cq), 0);
        cr_assert_eq(diwarp_cq_req_notify(cq, false), 0);
        cr_assert_eq(diwarp_cq_destroy(cq), 0);
        cr_assert_eq(diwarp_comp_channel_destroy(ch), 0);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

/* A thread that arms a CQ asks for the short time slice, so that its
 * wake-up from the channel preempts a busy core (libdiwarp/api/README.md). */
Test(external, arm_asks_short_slice)
{
        if (!set_thread_slice(3000000))
                cr_skip_test("this kernel keeps no time slice for a SCHED_OTHER thread");
        arm_a_cq();
        cr_assert_eq(thread_slice(), 100000, "the arming thread's slice is %llu ns",
                     (unsigned long long)thread_slice());
}

/* DIWARP_WAITER_SLICE=0: the application's threads are left alone. */
Test(external, arm_slice_left_alone)
{
        setenv("DIWARP_WAITER_SLICE", "0", 1);
        if (!set_thread_slice(3000000))
                cr_skip_test("this kernel keeps no time slice for a SCHED_OTHER thread");
        arm_a_cq();
        cr_assert_eq(thread_slice(), 3000000, "the arming thread's slice is %llu ns",
                     (unsigned long long)thread_slice());
}
