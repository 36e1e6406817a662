/* Unit tests of queue/cq: ring behaviour, arming semantics, completion
 * channels (fd readiness, blocking/non-blocking get, order) and ack counting. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "queue/cq.h"
#include "queue/event.h"
#include "util/time.h"

static struct diwarp_wc mkwc(uint64_t id, enum diwarp_wc_opcode op, enum diwarp_wc_status st)
{
        struct diwarp_wc wc = {0};

        wc.wr_id = id;
        wc.opcode = op;
        wc.status = st;
        return wc;
}

static int push_ok(struct dw_cq *cq, uint64_t id)
{
        struct diwarp_wc wc = mkwc(id, DIWARP_WC_SEND, DIWARP_WC_SUCCESS);

        return dw_cq_push(cq, &wc, false);
}

static bool readable(int fd)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};

        return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void set_nonblock(int fd)
{
        cr_assert_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

/* Drains the channel (non-blocking) and acks everything; returns how many
 * events were due for cq (all events must name cq). */
static int drain_events(struct dw_comp_channel *ch, struct dw_cq *cq)
{
        struct dw_cq *got;
        void *ctx;
        int n = 0;

        while (dw_comp_channel_get_event(ch, &got, &ctx) == 0) {
                cr_assert_eq(got, cq);
                dw_cq_ack_events(got, 1);
                n++;
        }
        return n;
}

Test(cq, init_rejects_bad_size)
{
        struct dw_cq cq;

        cr_assert_eq(dw_cq_init(&cq, 0, NULL, NULL), -EINVAL);
        cr_assert_eq(dw_cq_init(&cq, -3, NULL, NULL), -EINVAL);
}

Test(cq, pop_order_and_wraparound)
{
        struct dw_cq cq;
        struct diwarp_wc out[8];
        uint64_t next_push = 0, next_pop = 0;
        int round;

        cr_assert_eq(dw_cq_init(&cq, 4, NULL, NULL), 0);
        /* Many partial fill/drain rounds force head and tail around the ring
         * several times with different phases. */
        for (round = 0; round < 50; round++) {
                int npush = 1 + round % 4, npop = 1 + (round * 7) % 4, i, got;

                for (i = 0; i < npush && !dw_cq_full(&cq); i++)
                        cr_assert_eq(push_ok(&cq, next_push++), 0);
                got = dw_cq_pop(&cq, npop, out);
                cr_assert_leq(got, npop);
                for (i = 0; i < got; i++)
                        cr_assert_eq(out[i].wr_id, next_pop++, "round %d: order broken", round);
                cr_assert_eq(dw_cq_count(&cq), next_push - next_pop);
        }
        while ((round = dw_cq_pop(&cq, 8, out)) > 0)
                for (int i = 0; i < round; i++)
                        cr_assert_eq(out[i].wr_id, next_pop++);
        cr_assert_eq(next_pop, next_push);
        cr_assert_eq(dw_cq_pop(&cq, 8, out), 0);
        cr_assert(!cq.overflowed);
        dw_cq_fini(&cq);
}

/* A QP moved to RESET takes its completions out: the others stay, in order,
 * wherever head and tail are on the ring. */
Test(cq, purge_qp_keeps_others_in_order)
{
        for (int phase = 0; phase < 7; phase++) {
                struct dw_cq cq;
                struct diwarp_wc wc = mkwc(0, DIWARP_WC_SEND, DIWARP_WC_SUCCESS), out[8];

                cr_assert_eq(dw_cq_init(&cq, 7, NULL, NULL), 0);
                for (int i = 0; i < phase; i++) { /* move head and tail around */
                        cr_assert_eq(push_ok(&cq, 100), 0);
                        cr_assert_eq(dw_cq_pop(&cq, 1, out), 1);
                }
                for (uint64_t id = 0; id < 7; id++) {
                        wc.wr_id = id;
                        wc.qp_num = id % 3 == 1 ? 0x55 : 0x66;
                        cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
                }
                cr_assert_eq(dw_cq_purge_qp(&cq, 0x55), 2); /* ids 1 and 4 */
                cr_assert_eq(dw_cq_count(&cq), 5);
                cr_assert_eq(dw_cq_purge_qp(&cq, 0x77), 0);
                /* Room again for two, behind the survivors. */
                wc.wr_id = 7;
                cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
                wc.wr_id = 8;
                cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
                cr_assert_eq(dw_cq_pop(&cq, 8, out), 7);
                static const uint64_t want[] = {0, 2, 3, 5, 6, 7, 8};
                for (int i = 0; i < 7; i++)
                        cr_assert_eq(out[i].wr_id, want[i], "phase %d slot %d", phase, i);
                cr_assert_eq(dw_cq_purge_qp(&cq, 0x66), 0); /* empty */
                dw_cq_fini(&cq);
        }
}

Test(cq, full_returns_eoverflow_and_keeps_contents)
{
        struct dw_cq cq;
        struct diwarp_wc out[4];
        int i;

        cr_assert_eq(dw_cq_init(&cq, 3, NULL, NULL), 0);
        for (i = 0; i < 3; i++)
                cr_assert_eq(push_ok(&cq, 10 + i), 0);
        cr_assert(dw_cq_full(&cq));
        cr_assert_eq(push_ok(&cq, 99), -EOVERFLOW);
        cr_assert(cq.overflowed);
        cr_assert_eq(dw_cq_pop(&cq, 4, out), 3);
        for (i = 0; i < 3; i++)
                cr_assert_eq(out[i].wr_id, 10 + (uint64_t)i);
        dw_cq_fini(&cq);
}

Test(cq, pop_copies_all_fields)
{
        struct dw_cq cq;
        struct diwarp_wc in = mkwc(7, DIWARP_WC_RECV_RDMA_WITH_IMM, DIWARP_WC_SUCCESS), out;

        in.byte_len = 1234;
        in.imm_data = 0xdeadbeef;
        in.qp_num = 0x123456;
        in.src_qp = 42;
        in.wc_flags = DIWARP_WC_WITH_IMM | DIWARP_WC_GRH;
        cr_assert_eq(dw_cq_init(&cq, 2, NULL, NULL), 0);
        cr_assert_eq(dw_cq_push(&cq, &in, false), 0);
        cr_assert_eq(dw_cq_pop(&cq, 1, &out), 1);
        cr_assert_eq(memcmp(&in, &out, sizeof(in)), 0);
        dw_cq_fini(&cq);
}

/* With timestamps on, each completion gets the time it was pushed (between
 * the clock reads around the push, in order); a ts_ns the caller left in
 * the completion is never kept. Off again: 0. */
Test(cq, timestamps_stamp_push_time)
{
        struct dw_cq cq;
        struct diwarp_wc in = mkwc(1, DIWARP_WC_SEND, DIWARP_WC_SUCCESS), out[3];

        cr_assert_eq(dw_cq_init(&cq, 4, NULL, NULL), 0);
        in.ts_ns = 12345;
        cr_assert_eq(dw_cq_push(&cq, &in, false), 0);
        cq.timestamps = true;
        uint64_t t0 = dw_now_ns();
        cr_assert_eq(dw_cq_push(&cq, &in, false), 0);
        uint64_t t1 = dw_now_ns();
        cq.timestamps = false;
        cr_assert_eq(dw_cq_push(&cq, &in, false), 0);
        cr_assert_eq(dw_cq_pop(&cq, 3, out), 3);
        cr_expect_eq(out[0].ts_ns, 0u);
        cr_expect(out[1].ts_ns >= t0 && out[1].ts_ns <= t1, "ts %llu outside [%llu, %llu]",
                  (unsigned long long)out[1].ts_ns, (unsigned long long)t0, (unsigned long long)t1);
        cr_expect_eq(out[2].ts_ns, 0u);
        dw_cq_fini(&cq);
}

Test(cq, unarmed_generates_no_event)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&cq, 16, &ch, NULL), 0);
        for (int i = 0; i < 5; i++)
                cr_assert_eq(push_ok(&cq, i), 0);
        cr_assert(!readable(dw_comp_channel_fd(&ch)));
        cr_assert_eq(drain_events(&ch, &cq), 0);
        dw_cq_fini(&cq);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, armed_fires_once_then_disarms)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;
        struct dw_cq *got = NULL;
        void *ctx = NULL;
        int marker;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&cq, 16, &ch, &marker), 0);
        /* Completions already queued when arming do not fire. */
        cr_assert_eq(push_ok(&cq, 1), 0);
        cr_assert_eq(dw_cq_arm(&cq, false), 0);
        cr_assert(!readable(dw_comp_channel_fd(&ch)));
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), -EAGAIN);

        cr_assert_eq(push_ok(&cq, 2), 0);
        cr_assert(readable(dw_comp_channel_fd(&ch)));
        cr_assert(!cq.armed);
        cr_assert_eq(push_ok(&cq, 3), 0);
        cr_assert_eq(push_ok(&cq, 4), 0);

        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), 0);
        cr_assert_eq(got, &cq);
        cr_assert_eq(ctx, &marker);
        cr_assert(!readable(dw_comp_channel_fd(&ch)), "fd must go quiet once drained");
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), -EAGAIN);
        dw_cq_ack_events(&cq, 1);

        /* Re-arm: exactly one more. */
        cr_assert_eq(dw_cq_arm(&cq, false), 0);
        cr_assert_eq(push_ok(&cq, 5), 0);
        cr_assert_eq(push_ok(&cq, 6), 0);
        cr_assert_eq(drain_events(&ch, &cq), 1);
        dw_cq_fini(&cq);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, solicited_only_semantics)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;
        struct diwarp_wc wc;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&cq, 64, &ch, NULL), 0);
        cr_assert_eq(dw_cq_arm(&cq, true), 0);

        /* Successful send, unsolicited receive, RDMA write: nothing. */
        wc = mkwc(1, DIWARP_WC_SEND, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
        wc = mkwc(2, DIWARP_WC_RECV, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
        wc = mkwc(3, DIWARP_WC_RDMA_WRITE, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
        /* "solicited" on a non-receive completion means nothing. */
        wc = mkwc(4, DIWARP_WC_SEND, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, true), 0);
        cr_assert(!readable(dw_comp_channel_fd(&ch)));
        cr_assert(cq.armed);

        /* Solicited receive: one event. */
        wc = mkwc(5, DIWARP_WC_RECV, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, true), 0);
        cr_assert(readable(dw_comp_channel_fd(&ch)));
        wc = mkwc(6, DIWARP_WC_RECV, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, true), 0); /* disarmed: no second */
        cr_assert_eq(drain_events(&ch, &cq), 1);

        /* Error completion fires a solicited-only arm. */
        cr_assert_eq(dw_cq_arm(&cq, true), 0);
        wc = mkwc(7, DIWARP_WC_SEND, DIWARP_WC_REM_ACCESS_ERR);
        cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
        cr_assert_eq(drain_events(&ch, &cq), 1);

        /* Flushed receive (error) also fires. */
        cr_assert_eq(dw_cq_arm(&cq, true), 0);
        wc = mkwc(8, DIWARP_WC_RECV, DIWARP_WC_WR_FLUSH_ERR);
        cr_assert_eq(dw_cq_push(&cq, &wc, false), 0);
        cr_assert_eq(drain_events(&ch, &cq), 1);

        /* Solicited write-with-immediate receive fires. */
        cr_assert_eq(dw_cq_arm(&cq, true), 0);
        wc = mkwc(9, DIWARP_WC_RECV_RDMA_WITH_IMM, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&cq, &wc, true), 0);
        cr_assert_eq(drain_events(&ch, &cq), 1);

        /* Arming for any completion widens a solicited-only arm. */
        cr_assert_eq(dw_cq_arm(&cq, true), 0);
        cr_assert_eq(dw_cq_arm(&cq, false), 0);
        cr_assert_eq(push_ok(&cq, 10), 0);
        cr_assert_eq(drain_events(&ch, &cq), 1);

        dw_cq_fini(&cq);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, events_counted_exactly_over_many_rounds)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;
        struct diwarp_wc out[8];
        int fired = 0, expected = 0;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&cq, 8, &ch, NULL), 0);
        for (int r = 0; r < 100; r++) {
                bool arm = r % 3 != 0;

                if (arm)
                        dw_cq_arm(&cq, false);
                for (int i = 0; i < 1 + r % 3; i++)
                        cr_assert_eq(push_ok(&cq, r), 0);
                expected += arm;
                fired += drain_events(&ch, &cq);
                while (dw_cq_pop(&cq, 8, out) > 0)
                        ;
        }
        cr_assert_eq(fired, expected);
        cr_assert_eq(cq.events_reported, (unsigned)expected);
        cr_assert_eq(cq.events_completed, (unsigned)expected);
        dw_cq_fini(&cq);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, several_cqs_on_one_channel_deliver_in_order)
{
        struct dw_comp_channel ch;
        struct dw_cq cq[3];
        struct dw_cq *got;
        void *ctx;
        int tags[3];
        int order[] = {2, 0, 1, 0, 2};

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        for (int i = 0; i < 3; i++)
                cr_assert_eq(dw_cq_init(&cq[i], 4, &ch, &tags[i]), 0);
        /* A CQ may appear twice when re-armed before the first event is read. */
        for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
                dw_cq_arm(&cq[order[k]], false);
                cr_assert_eq(push_ok(&cq[order[k]], k), 0);
        }
        cr_assert(readable(dw_comp_channel_fd(&ch)));
        for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
                cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), 0);
                cr_assert_eq(got, &cq[order[k]], "event %zu from the wrong CQ", k);
                cr_assert_eq(ctx, &tags[order[k]]);
                if (k + 1 < sizeof(order) / sizeof(order[0]))
                        cr_assert(readable(dw_comp_channel_fd(&ch)));
        }
        cr_assert(!readable(dw_comp_channel_fd(&ch)));
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), -EAGAIN);
        dw_cq_ack_events(&cq[0], 2);
        dw_cq_ack_events(&cq[1], 1);
        dw_cq_ack_events(&cq[2], 2);
        cr_assert_eq(dw_comp_channel_fini(&ch), -EBUSY);
        for (int i = 0; i < 3; i++)
                dw_cq_fini(&cq[i]);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, destroy_drops_undelivered_events)
{
        struct dw_comp_channel ch;
        struct dw_cq a, b;
        struct dw_cq *got;
        void *ctx;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&a, 4, &ch, NULL), 0);
        cr_assert_eq(dw_cq_init(&b, 4, &ch, NULL), 0);
        dw_cq_arm(&a, false);
        push_ok(&a, 1);
        cr_assert(readable(dw_comp_channel_fd(&ch)));
        dw_cq_fini(&a); /* undelivered: no ack needed, must not block */
        cr_assert(!readable(dw_comp_channel_fd(&ch)));
        dw_cq_arm(&b, false);
        push_ok(&b, 2);
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), 0);
        cr_assert_eq(got, &b);
        dw_cq_ack_events(&b, 1);
        dw_cq_fini(&b);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, excess_pending_events_coalesce)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&cq, 64, &ch, NULL), 0);
        for (int i = 0; i < DW_CQ_MAX_PENDING_EVENTS + 3; i++) {
                dw_cq_arm(&cq, false);
                push_ok(&cq, i);
        }
        cr_assert_eq(ch.coalesced, 3);
        cr_assert_eq(drain_events(&ch, &cq), DW_CQ_MAX_PENDING_EVENTS);
        dw_cq_fini(&cq);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

struct waiter {
        struct dw_comp_channel *ch;
        struct dw_cq *got;
        int rc;
};

static void *blocking_get(void *arg)
{
        struct waiter *w = arg;
        void *ctx;

        w->rc = dw_comp_channel_get_event(w->ch, &w->got, &ctx);
        return NULL;
}

Test(cq, blocking_get_event_waits_for_completion)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;
        struct waiter w = {.ch = &ch, .rc = 1};
        pthread_t t;

        cr_assert_eq(dw_comp_channel_init(&ch), 0); /* fd left blocking */
        cr_assert_eq(dw_cq_init(&cq, 4, &ch, NULL), 0);
        dw_cq_arm(&cq, false);
        cr_assert_eq(pthread_create(&t, NULL, blocking_get, &w), 0);
        usleep(50 * 1000);
        cr_assert_eq(__atomic_load_n(&w.rc, __ATOMIC_SEQ_CST), 1, "returned with no event due");
        push_ok(&cq, 1);
        pthread_join(t, NULL);
        cr_assert_eq(w.rc, 0);
        cr_assert_eq(w.got, &cq);
        dw_cq_ack_events(&cq, 1);
        dw_cq_fini(&cq);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

struct acker {
        struct dw_cq *cq;
        int acked;
};

static void *late_ack(void *arg)
{
        struct acker *a = arg;

        usleep(50 * 1000);
        __atomic_store_n(&a->acked, 1, __ATOMIC_SEQ_CST);
        dw_cq_ack_events(a->cq, 1);
        return NULL;
}

Test(cq, fini_waits_for_acks)
{
        struct dw_comp_channel ch;
        struct dw_cq cq;
        struct dw_cq *got;
        void *ctx;
        struct acker a = {.cq = &cq};
        pthread_t t;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        cr_assert_eq(dw_cq_init(&cq, 4, &ch, NULL), 0);
        dw_cq_arm(&cq, false);
        push_ok(&cq, 1);
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), 0);
        cr_assert_eq(pthread_create(&t, NULL, late_ack, &a), 0);
        dw_cq_fini(&cq); /* must block until late_ack acknowledged */
        cr_assert_eq(__atomic_load_n(&a.acked, __ATOMIC_SEQ_CST), 1);
        pthread_join(t, NULL);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

Test(cq, armed_without_channel_is_harmless)
{
        struct dw_cq cq;

        cr_assert_eq(dw_cq_init(&cq, 2, NULL, NULL), 0);
        cr_assert_eq(dw_cq_arm(&cq, false), 0);
        cr_assert_eq(push_ok(&cq, 1), 0);
        cr_assert(!cq.armed);
        dw_cq_fini(&cq);
}

/* ---- async event queue (queue/event.c) ---- */

Test(async, push_get_order_and_fd_readiness)
{
        struct dw_async_queue q;
        struct diwarp_async_event ev = {0}, out;
        int objs[3];

        cr_assert_eq(dw_async_queue_init(&q, 4), 0);
        set_nonblock(dw_async_queue_fd(&q));
        cr_assert(!readable(dw_async_queue_fd(&q)));
        cr_assert_eq(dw_async_queue_get(&q, &out), -EAGAIN);
        for (int i = 0; i < 3; i++) {
                ev.event_type = DIWARP_EVENT_QP_FATAL + i;
                ev.element.qp = (struct diwarp_qp *)&objs[i];
                cr_assert_eq(dw_async_queue_push(&q, &ev), 0);
        }
        cr_assert(readable(dw_async_queue_fd(&q)));
        for (int i = 0; i < 3; i++) {
                cr_assert_eq(dw_async_queue_get(&q, &out), 0);
                cr_assert_eq(out.event_type, DIWARP_EVENT_QP_FATAL + i);
                cr_assert_eq((void *)out.element.qp, &objs[i]);
        }
        cr_assert(!readable(dw_async_queue_fd(&q)));
        cr_assert_eq(dw_async_queue_get(&q, &out), -EAGAIN);
        dw_async_queue_fini(&q);
}

Test(async, full_drops_newest_and_counts)
{
        struct dw_async_queue q;
        struct diwarp_async_event ev = {0}, out;

        cr_assert_eq(dw_async_queue_init(&q, 3), 0);
        set_nonblock(dw_async_queue_fd(&q));
        for (int i = 0; i < 5; i++) {
                ev.event_type = (enum diwarp_event_type)i;
                cr_assert_eq(dw_async_queue_push(&q, &ev), i < 3 ? 0 : -EOVERFLOW);
        }
        cr_assert_eq(q.dropped, 2);
        for (int i = 0; i < 3; i++) {
                cr_assert_eq(dw_async_queue_get(&q, &out), 0);
                cr_assert_eq(out.event_type, (enum diwarp_event_type)i, "oldest kept");
        }
        cr_assert_eq(dw_async_queue_get(&q, &out), -EAGAIN);
        /* Room again after draining, including across the wrap. */
        for (int i = 0; i < 3; i++)
                cr_assert_eq(dw_async_queue_push(&q, &ev), 0);
        cr_assert_eq(q.dropped, 2);
        dw_async_queue_fini(&q);
}

Test(async, purge_removes_events_of_destroyed_object)
{
        struct dw_async_queue q;
        struct diwarp_async_event ev = {0}, out;
        int a, b;

        cr_assert_eq(dw_async_queue_init(&q, 0), 0);
        set_nonblock(dw_async_queue_fd(&q));
        ev.element.cq = (struct diwarp_cq *)&a;
        dw_async_queue_push(&q, &ev);
        ev.element.cq = (struct diwarp_cq *)&b;
        dw_async_queue_push(&q, &ev);
        ev.element.cq = (struct diwarp_cq *)&a;
        dw_async_queue_push(&q, &ev);
        cr_assert_eq(dw_async_queue_purge(&q, &a), 2);
        cr_assert(readable(dw_async_queue_fd(&q)));
        cr_assert_eq(dw_async_queue_get(&q, &out), 0);
        cr_assert_eq((void *)out.element.cq, &b);
        cr_assert_eq(dw_async_queue_purge(&q, &b), 0);
        ev.element.cq = (struct diwarp_cq *)&a;
        dw_async_queue_push(&q, &ev);
        cr_assert_eq(dw_async_queue_purge(&q, &a), 1);
        cr_assert(!readable(dw_async_queue_fd(&q)));
        dw_async_queue_fini(&q);
}

/* ibv_resize_cq: waiting completions survive in order, wherever the ring's
 * head stood; never below what is waiting. */
Test(cq, resize_keeps_waiting_completions_in_order)
{
        struct dw_cq cq;
        struct diwarp_wc out[16];

        cr_assert_eq(dw_cq_init(&cq, 4, NULL, NULL), 0);
        /* head at slot 3: the waiting ones wrap around the end of the ring */
        for (uint64_t i = 0; i < 3; i++)
                cr_assert_eq(push_ok(&cq, i), 0);
        cr_assert_eq(dw_cq_pop(&cq, 3, out), 3);
        for (uint64_t i = 10; i < 13; i++)
                cr_assert_eq(push_ok(&cq, i), 0);
        cr_assert_eq(dw_cq_resize(&cq, 2), -EINVAL, "3 waiting do not fit in 2");
        cr_assert_eq(dw_cq_resize(&cq, 0), -EINVAL);
        cr_assert_eq(dw_cq_resize(&cq, 3), 0);
        cr_assert(dw_cq_full(&cq));
        cr_assert_eq(push_ok(&cq, 99), -EOVERFLOW);
        cq.overflowed = false;
        cr_assert_eq(dw_cq_resize(&cq, 16), 0);
        for (uint64_t i = 13; i < 26; i++)
                cr_assert_eq(push_ok(&cq, i), 0);
        cr_assert(dw_cq_full(&cq));
        cr_assert_eq(dw_cq_pop(&cq, 16, out), 16);
        for (int i = 0; i < 16; i++)
                cr_assert_eq(out[i].wr_id, 10u + (unsigned)i, "slot %d", i);
        dw_cq_fini(&cq);
}

/* Another thread's notification while a thread has the channel quiet. */
struct quiet_push {
        struct dw_cq *cq;
        int rc;
};

static void *quiet_other_push(void *arg)
{
        struct quiet_push *q = arg;

        q->rc = push_ok(q->cq, 9);
        return NULL;
}

Test(cq, channel_quiet_for_its_own_thread_only)
{
        struct dw_comp_channel ch;
        struct dw_cq a, b, *got;
        void *ctx;
        int fd;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        fd = dw_comp_channel_fd(&ch);
        cr_assert_eq(dw_cq_init(&a, 16, &ch, NULL), 0);
        cr_assert_eq(dw_cq_init(&b, 16, &ch, NULL), 0);

        /* The quiet thread's own event: taken without the fd turning readable. */
        dw_comp_channel_quiet(&ch, true);
        cr_assert_eq(dw_cq_arm(&a, false), 0);
        cr_assert_eq(push_ok(&a, 1), 0);
        cr_assert(!readable(fd), "the quiet thread's own event must not signal the fd");
        cr_assert_eq(dw_comp_channel_take(&ch, &got, &ctx), 0);
        cr_assert_eq(got, &a);
        cr_assert_eq(dw_comp_channel_take(&ch, &got, &ctx), -EAGAIN);
        dw_cq_ack_events(&a, 1);

        /* Two of its own, one taken: the other is signalled when quiet ends. */
        cr_assert_eq(dw_cq_arm(&a, false), 0);
        cr_assert_eq(dw_cq_arm(&b, false), 0);
        cr_assert_eq(push_ok(&a, 2), 0);
        cr_assert_eq(push_ok(&b, 3), 0);
        cr_assert(!readable(fd));
        cr_assert_eq(dw_comp_channel_take(&ch, &got, &ctx), 0);
        cr_assert_eq(got, &a);
        dw_cq_ack_events(&a, 1);
        dw_comp_channel_quiet(&ch, false);
        cr_assert(readable(fd), "an event still due must signal the fd when quiet ends");
        cr_assert_eq(dw_comp_channel_take(&ch, &got, &ctx), 0);
        cr_assert_eq(got, &b);
        cr_assert(!readable(fd));
        dw_cq_ack_events(&b, 1);

        /* Another thread's event signals the fd even while quiet. */
        dw_comp_channel_quiet(&ch, true);
        cr_assert_eq(dw_cq_arm(&b, false), 0);
        struct quiet_push q = {.cq = &b, .rc = -1};
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, quiet_other_push, &q), 0);
        pthread_join(t, NULL);
        cr_assert_eq(q.rc, 0);
        cr_assert(readable(fd), "another thread's event must signal the fd");
        cr_assert_eq(dw_comp_channel_take(&ch, &got, &ctx), 0);
        cr_assert_eq(got, &b);
        cr_assert(!readable(fd));
        dw_cq_ack_events(&b, 1);
        dw_comp_channel_quiet(&ch, false);
        cr_assert(!readable(fd));

        dw_cq_fini(&a);
        dw_cq_fini(&b);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}

/* The owner's count of armed CQs (the device's, which tells its parked
 * progress thread whether a program may be about to sleep on a channel):
 * up once per arm of an unarmed CQ, down when the arm fires; a widened or
 * repeated arm, and a completion that does not fire a solicited-only arm,
 * leave it alone. */
Test(cq, armed_count_follows_arm_and_fire)
{
        struct dw_comp_channel ch;
        struct dw_cq a, b;
        uint32_t armed = 0;

        cr_assert_eq(dw_comp_channel_init(&ch), 0);
        set_nonblock(dw_comp_channel_fd(&ch));
        cr_assert_eq(dw_cq_init(&a, 16, &ch, NULL), 0);
        cr_assert_eq(dw_cq_init(&b, 16, &ch, NULL), 0);
        a.armed_count = b.armed_count = &armed;

        cr_assert_eq(dw_cq_arm(&a, true), 0);
        cr_expect_eq(armed, 1);
        cr_assert_eq(dw_cq_arm(&a, false), 0); /* widened: still one arm */
        cr_assert_eq(dw_cq_arm(&a, false), 0);
        cr_expect_eq(armed, 1);
        cr_assert_eq(dw_cq_arm(&b, true), 0);
        cr_expect_eq(armed, 2);

        /* b is solicited-only: a plain successful send completion does not
         * fire it. */
        struct diwarp_wc wc = mkwc(1, DIWARP_WC_SEND, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&b, &wc, false), 0);
        cr_expect_eq(armed, 2);
        cr_assert_eq(push_ok(&a, 2), 0); /* fires a */
        cr_expect_eq(armed, 1);
        cr_assert_eq(push_ok(&a, 3), 0); /* a is no longer armed */
        cr_expect_eq(armed, 1);
        wc = mkwc(4, DIWARP_WC_RECV, DIWARP_WC_SUCCESS);
        cr_assert_eq(dw_cq_push(&b, &wc, true), 0); /* a solicited receive fires b */
        cr_expect_eq(armed, 0);
        cr_assert_eq(dw_cq_arm(&a, false), 0);
        cr_expect_eq(armed, 1, "re-armed");

        /* One event each, a's first; the CQs can then go. */
        struct dw_cq *got;
        void *ctx;
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), 0);
        cr_expect_eq(got, &a);
        dw_cq_ack_events(got, 1);
        cr_assert_eq(dw_comp_channel_get_event(&ch, &got, &ctx), 0);
        cr_expect_eq(got, &b);
        dw_cq_ack_events(got, 1);
        cr_expect_eq(dw_comp_channel_get_event(&ch, &got, &ctx), -EAGAIN);
        dw_cq_fini(&a);
        dw_cq_fini(&b);
        cr_assert_eq(dw_comp_channel_fini(&ch), 0);
}
