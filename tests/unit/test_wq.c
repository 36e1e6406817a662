/* Unit tests of queue/wq: work queue rings, posting helpers, inline data and
 * shared receive queues with their limit event. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "queue/wq.h"

static void post_id(struct dw_wq *wq, uint64_t id)
{
        struct dw_wqe *w = dw_wq_reserve(wq);

        cr_assert_not_null(w);
        w->wr_id = id;
        dw_wq_commit(wq);
}

Test(wq, init_validates)
{
        struct dw_wq wq;

        cr_assert_eq(dw_wq_init(&wq, 0, 1, 0), -EINVAL);
        cr_assert_eq(dw_wq_init(&wq, 4, DW_MAX_SGE + 1, 0), -EINVAL);
        cr_assert_eq(dw_wq_init(&wq, 4, 1, DW_MAX_INLINE + 1), -EINVAL);
        cr_assert_eq(dw_wq_init(&wq, 4, DW_MAX_SGE, DW_MAX_INLINE), 0);
        dw_wq_fini(&wq);
}

Test(wq, full_reserve_returns_null)
{
        struct dw_wq wq;

        cr_assert_eq(dw_wq_init(&wq, 3, 1, 0), 0);
        cr_assert(dw_wq_empty(&wq));
        cr_assert_null(dw_wq_head(&wq));
        for (int i = 0; i < 3; i++)
                post_id(&wq, i);
        cr_assert(dw_wq_full(&wq));
        cr_assert_null(dw_wq_reserve(&wq));
        cr_assert_eq(dw_wq_count(&wq), 3);
        dw_wq_pop(&wq);
        cr_assert_not_null(dw_wq_reserve(&wq));
        dw_wq_fini(&wq);
}

Test(wq, uncommitted_reservation_is_invisible)
{
        struct dw_wq wq;
        struct dw_wqe *w;

        cr_assert_eq(dw_wq_init(&wq, 2, 1, 0), 0);
        w = dw_wq_reserve(&wq);
        w->wr_id = 77;
        cr_assert_eq(dw_wq_count(&wq), 0);
        cr_assert_null(dw_wq_head(&wq));
        /* The same slot comes back, cleared. */
        cr_assert_eq(dw_wq_reserve(&wq), w);
        cr_assert_eq(w->wr_id, 0);
        dw_wq_fini(&wq);
}

Test(wq, fifo_order_with_wraparound)
{
        struct dw_wq wq;
        uint64_t next_post = 0, next_pop = 0;

        cr_assert_eq(dw_wq_init(&wq, 5, 1, 0), 0);
        for (int r = 0; r < 60; r++) {
                for (int i = 0; i < 1 + r % 5 && !dw_wq_full(&wq); i++)
                        post_id(&wq, next_post++);
                for (int i = 0; i < 1 + (r * 3) % 4 && !dw_wq_empty(&wq); i++) {
                        cr_assert_eq(dw_wq_head(&wq)->wr_id, next_pop++, "round %d", r);
                        dw_wq_pop(&wq);
                }
                cr_assert_eq(dw_wq_count(&wq), next_post - next_pop);
                /* dw_wq_at walks the same order as the pops will. */
                for (uint32_t i = 0; i < dw_wq_count(&wq); i++)
                        cr_assert_eq(dw_wq_at(&wq, i)->wr_id, next_pop + i);
                cr_assert_null(dw_wq_at(&wq, dw_wq_count(&wq)));
        }
        dw_wq_fini(&wq);
}

Test(wq, cursor_tracks_started_wqes)
{
        struct dw_wq wq;

        cr_assert_eq(dw_wq_init(&wq, 4, 1, 0), 0);
        for (int i = 0; i < 3; i++)
                post_id(&wq, i);
        cr_assert_eq(dw_wq_next(&wq)->wr_id, 0);
        dw_wq_advance(&wq);
        cr_assert(dw_wq_head(&wq)->flags & DW_WQE_STARTED);
        dw_wq_advance(&wq);
        cr_assert_eq(dw_wq_next(&wq)->wr_id, 2);
        dw_wq_pop(&wq); /* completion of wr 0 */
        cr_assert_eq(dw_wq_next(&wq)->wr_id, 2);
        dw_wq_advance(&wq);
        cr_assert_null(dw_wq_next(&wq));
        dw_wq_advance(&wq); /* nothing to advance: no change */
        post_id(&wq, 3);
        cr_assert_eq(dw_wq_next(&wq)->wr_id, 3);
        /* Flushing pops unstarted WQEs too. */
        while (!dw_wq_empty(&wq))
                dw_wq_pop(&wq);
        cr_assert_eq(wq.started, 0);
        cr_assert_null(dw_wq_next(&wq));
        dw_wq_fini(&wq);
}

struct moved_log {
        int n;
        uint64_t ids[8];
        const struct dw_wqe *from[8];
        struct dw_wqe *to[8];
};

static void log_moved(void *ctx, const struct dw_wqe *from, struct dw_wqe *to)
{
        struct moved_log *m = ctx;

        cr_assert_lt(m->n, 8);
        m->ids[m->n] = to->wr_id;
        m->from[m->n] = from;
        m->to[m->n] = to;
        m->n++;
}

Test(wq, drop_done_keeps_order_and_frees_the_slots)
{
        struct dw_wq wq;
        struct moved_log m = {0};

        cr_assert_eq(dw_wq_init(&wq, 5, 1, 0), 0);
        /* Wrap the ring first: head at slot 3. */
        for (int i = 0; i < 3; i++)
                post_id(&wq, 100 + i);
        for (int i = 0; i < 3; i++)
                dw_wq_pop(&wq);
        for (int i = 0; i < 5; i++)
                post_id(&wq, i);
        cr_assert(dw_wq_full(&wq));
        dw_wq_advance(&wq);
        dw_wq_advance(&wq);
        dw_wq_advance(&wq);
        /* 1 and 3 finish behind 0, which is still under way. */
        dw_wq_at(&wq, 1)->flags |= DW_WQE_DONE;
        dw_wq_at(&wq, 3)->flags |= DW_WQE_DONE;
        struct dw_wqe *two = dw_wq_at(&wq, 2), *four = dw_wq_at(&wq, 4);

        cr_assert_eq(dw_wq_drop_done(&wq, log_moved, &m), 2);
        cr_assert_eq(dw_wq_count(&wq), 3);
        uint64_t expect[] = {0, 2, 4};
        for (uint32_t i = 0; i < 3; i++)
                cr_assert_eq(dw_wq_at(&wq, i)->wr_id, expect[i], "position %u", i);
        /* Three were started, one of them (1) is gone: 0 and 2 remain started. */
        cr_assert_eq(wq.started, 2);
        cr_assert_eq(dw_wq_next(&wq)->wr_id, 4);
        /* Only the WQEs that changed slot are reported, with both slots. */
        cr_assert_eq(m.n, 2);
        cr_assert_eq(m.ids[0], 2);
        cr_assert_eq(m.from[0], two);
        cr_assert_eq(m.to[0], dw_wq_at(&wq, 1));
        cr_assert_eq(m.ids[1], 4);
        cr_assert_eq(m.from[1], four);
        cr_assert_eq(m.to[1], dw_wq_at(&wq, 2));
        /* The freed slots take posts again, after the kept ones. */
        post_id(&wq, 5);
        post_id(&wq, 6);
        cr_assert(dw_wq_full(&wq));
        uint64_t after[] = {0, 2, 4, 5, 6};
        for (int i = 0; i < 5; i++) {
                cr_assert_eq(dw_wq_head(&wq)->wr_id, after[i], "pop %d", i);
                dw_wq_pop(&wq);
        }
        cr_assert(dw_wq_empty(&wq));
        /* Nothing done: nothing moves. */
        post_id(&wq, 7);
        m.n = 0;
        cr_assert_eq(dw_wq_drop_done(&wq, log_moved, &m), 0);
        cr_assert_eq(m.n, 0);
        cr_assert_eq(dw_wq_count(&wq), 1);
        dw_wq_fini(&wq);
}

Test(wq, drop_done_moves_inline_bytes_with_the_wqe)
{
        struct dw_wq wq;
        char text[3][8] = {"first", "second", "third"};

        cr_assert_eq(dw_wq_init(&wq, 3, 1, 16), 0);
        for (int i = 0; i < 3; i++) {
                struct diwarp_sge sg = {.addr = (uintptr_t)text[i],
                                        .length = (uint32_t)strlen(text[i])};
                struct diwarp_send_wr wr = {.wr_id = (uint64_t)i,
                                            .sg_list = &sg,
                                            .num_sge = 1,
                                            .opcode = DIWARP_WR_SEND,
                                            .send_flags = DIWARP_SEND_INLINE};
                struct dw_wqe *w = dw_wq_reserve(&wq);

                cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), 0);
                dw_wq_commit(&wq);
        }
        dw_wq_at(&wq, 0)->flags |= DW_WQE_DONE;
        cr_assert_eq(dw_wq_drop_done(&wq, NULL, NULL), 1);
        for (uint32_t i = 0; i < 2; i++) {
                struct dw_wqe *w = dw_wq_at(&wq, i);
                const char *want = text[i + 1];

                /* Each WQE keeps the inline area of the slot it sits in now,
                 * and that area holds its own bytes. */
                cr_assert_eq(w->inline_buf, wq.inline_area + (size_t)(wq.head + i) % 3 * 16);
                cr_assert_eq(w->sge[0].addr, (uint64_t)(uintptr_t)w->inline_buf);
                cr_assert_eq(w->sge[0].length, strlen(want));
                cr_assert_eq(memcmp(w->inline_buf, want, strlen(want)), 0, "wqe %u", i);
        }
        /* The freed slot's area is the next reservation's. */
        struct dw_wqe *w = dw_wq_reserve(&wq);

        cr_assert_not_null(w);
        cr_assert_neq(w->inline_buf, dw_wq_at(&wq, 0)->inline_buf);
        cr_assert_neq(w->inline_buf, dw_wq_at(&wq, 1)->inline_buf);
        dw_wq_fini(&wq);
}

Test(wq, send_wr_fields_copied)
{
        struct dw_wq wq;
        struct dw_wqe *w;
        struct diwarp_sge sg[2] = {{.addr = 0x1000, .length = 100, .lkey = 0x101},
                                   {.addr = 0x2000, .length = 28, .lkey = 0x202}};
        struct diwarp_send_wr wr = {.wr_id = 9,
                                    .sg_list = sg,
                                    .num_sge = 2,
                                    .opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .imm_data = 0x11223344};

        wr.wr.rdma.remote_addr = 0xabcdef;
        wr.wr.rdma.rkey = 0x5501;
        cr_assert_eq(dw_wq_init(&wq, 2, 2, 64), 0);
        w = dw_wq_reserve(&wq);
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), 0);
        cr_assert_eq(w->wr_id, 9);
        cr_assert_eq(w->opcode, DIWARP_WR_RDMA_WRITE_WITH_IMM);
        cr_assert_eq(w->imm_data, 0x11223344);
        cr_assert_eq(w->remote_addr, 0xabcdef);
        cr_assert_eq(w->rkey, 0x5501);
        cr_assert_eq(w->num_sge, 2);
        cr_assert_eq(w->sge[1].lkey, 0x202);
        cr_assert_eq(w->total_len, 128);
        cr_assert(!(w->flags & DW_WQE_INLINE));

        wr.opcode = DIWARP_WR_ATOMIC_CMP_AND_SWP;
        wr.num_sge = 1;
        wr.wr.atomic.remote_addr = 0x8000;
        wr.wr.atomic.rkey = 0x77;
        wr.wr.atomic.compare_add = 5;
        wr.wr.atomic.swap = 6;
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), 0);
        cr_assert_eq(w->remote_addr, 0x8000);
        cr_assert_eq(w->rkey, 0x77);
        cr_assert_eq(w->compare_add, 5);
        cr_assert_eq(w->swap, 6);

        wr.num_sge = 3; /* beyond max_sge */
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), -EINVAL);
        wr.num_sge = -1;
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), -EINVAL);
        dw_wq_fini(&wq);
}

Test(wq, inline_data_copied_at_post_time)
{
        struct dw_wq wq;
        struct dw_wqe *w;
        char a[] = "hello, ", b[] = "inline world";
        char expect[64];
        struct diwarp_sge sg[2] = {
            {.addr = (uintptr_t)a, .length = (uint32_t)strlen(a), .lkey = 0xbad},
            {.addr = (uintptr_t)b, .length = (uint32_t)strlen(b), .lkey = 0xbad}};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = sg,
                                    .num_sge = 2,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_INLINE};

        snprintf(expect, sizeof(expect), "%s%s", a, b);
        cr_assert_eq(dw_wq_init(&wq, 2, 1 /* inline may use more sges */, 32), 0);
        w = dw_wq_reserve(&wq);
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), 0);
        dw_wq_commit(&wq);
        /* The application reuses its buffers right after posting. */
        memset(a, 'X', strlen(a));
        memset(b, 'Y', strlen(b));
        w = dw_wq_head(&wq);
        cr_assert(w->flags & DW_WQE_INLINE);
        cr_assert_eq(w->num_sge, 1);
        cr_assert_eq(w->total_len, strlen(expect));
        cr_assert_eq(w->sge[0].length, strlen(expect));
        cr_assert_eq(w->sge[0].addr, (uint64_t)(uintptr_t)w->inline_buf);
        cr_assert_eq(memcmp(w->inline_buf, expect, strlen(expect)), 0);

        /* A second slot's inline area is distinct from the first. */
        {
                char c[] = "second";
                struct diwarp_sge s2 = {.addr = (uintptr_t)c, .length = 6};
                struct dw_wqe *w2 = dw_wq_reserve(&wq);

                wr.sg_list = &s2;
                wr.num_sge = 1;
                cr_assert_eq(dw_wqe_from_send_wr(&wq, w2, &wr), 0);
                dw_wq_commit(&wq);
                cr_assert_neq(w2->inline_buf, w->inline_buf);
                cr_assert_eq(memcmp(w->inline_buf, expect, strlen(expect)), 0);
                cr_assert_eq(memcmp(w2->inline_buf, "second", 6), 0);
        }
        dw_wq_fini(&wq);
}

Test(wq, inline_too_large_rejected)
{
        struct dw_wq wq;
        struct dw_wqe *w;
        char buf[17] = {0};
        struct diwarp_sge sg = {.addr = (uintptr_t)buf, .length = 17};
        struct diwarp_send_wr wr = {.sg_list = &sg,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_INLINE};

        cr_assert_eq(dw_wq_init(&wq, 2, 1, 16), 0);
        w = dw_wq_reserve(&wq);
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), -EINVAL);
        sg.length = 16;
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), 0);
        dw_wq_fini(&wq);

        /* No inline area at all: any inline byte is too many. */
        cr_assert_eq(dw_wq_init(&wq, 2, 1, 0), 0);
        w = dw_wq_reserve(&wq);
        cr_assert_null(w->inline_buf);
        sg.length = 1;
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), -EINVAL);
        dw_wq_fini(&wq);
}

Test(wq, inline_flag_ignored_for_rdma_read)
{
        struct dw_wq wq;
        struct dw_wqe *w;
        struct diwarp_sge sg = {.addr = 0x4000, .length = 4096, .lkey = 0x99};
        struct diwarp_send_wr wr = {.sg_list = &sg,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_READ,
                                    .send_flags = DIWARP_SEND_INLINE};

        cr_assert_eq(dw_wq_init(&wq, 2, 1, 16), 0);
        w = dw_wq_reserve(&wq);
        cr_assert_eq(dw_wqe_from_send_wr(&wq, w, &wr), 0);
        cr_assert(!(w->flags & DW_WQE_INLINE));
        cr_assert_eq(w->sge[0].addr, 0x4000);
        cr_assert_eq(w->sge[0].lkey, 0x99);
        dw_wq_fini(&wq);
}

Test(wq, recv_wr)
{
        struct dw_wq wq;
        struct dw_wqe *w;
        struct diwarp_sge sg[3] = {
            {.addr = 1, .length = 10}, {.addr = 2, .length = 20}, {.addr = 3, .length = 30}};
        struct diwarp_recv_wr wr = {.wr_id = 5, .sg_list = sg, .num_sge = 3};

        cr_assert_eq(dw_wq_init(&wq, 2, 2, 0), 0);
        w = dw_wq_reserve(&wq);
        cr_assert_eq(dw_wqe_from_recv_wr(&wq, w, &wr), -EINVAL);
        wr.num_sge = 2;
        cr_assert_eq(dw_wqe_from_recv_wr(&wq, w, &wr), 0);
        cr_assert_eq(w->wr_id, 5);
        cr_assert_eq(w->total_len, 30);
        wr.sg_list = NULL;
        cr_assert_eq(dw_wqe_from_recv_wr(&wq, w, &wr), -EINVAL);
        wr.num_sge = 0; /* zero-length receive is legal */
        cr_assert_eq(dw_wqe_from_recv_wr(&wq, w, &wr), 0);
        cr_assert_eq(w->total_len, 0);
        dw_wq_fini(&wq);
}

/* ---- SRQ ---- */

static void srq_post(struct dw_srq *srq, uint64_t id)
{
        post_id(&srq->wq, id);
}

Test(srq, limit_event_fires_once_below_limit)
{
        struct dw_srq srq;
        struct dw_wqe out;
        bool ev;
        int fired = 0;

        cr_assert_eq(dw_srq_init(&srq, 8, 1, NULL), 0);
        cr_assert_eq(dw_srq_arm_limit(&srq, 9), -EINVAL);
        for (int i = 0; i < 6; i++)
                srq_post(&srq, i);
        cr_assert_eq(dw_srq_arm_limit(&srq, 3), 0);
        /* 6 -> 5 -> 4 -> 3: not below 3 yet. */
        for (int i = 0; i < 3; i++) {
                cr_assert_eq(dw_srq_take(&srq, &out, &ev), 0);
                cr_assert_eq(out.wr_id, (uint64_t)i);
                cr_assert(!ev, "fired at count %u", dw_wq_count(&srq.wq));
        }
        /* 3 -> 2: below the limit: fires, and disarms. */
        cr_assert_eq(dw_srq_take(&srq, &out, &ev), 0);
        cr_assert(ev);
        cr_assert(!srq.limit_armed);
        fired++;
        /* Further drops do not fire again, even after refilling. */
        while (dw_srq_take(&srq, &out, &ev) == 0)
                fired += ev;
        for (int i = 0; i < 5; i++)
                srq_post(&srq, 100 + i);
        while (dw_srq_take(&srq, &out, &ev) == 0)
                fired += ev;
        cr_assert_eq(fired, 1);
        cr_assert_eq(dw_srq_take(&srq, &out, &ev), -ENOENT);
        cr_assert(!ev);

        /* Re-arming allows exactly one more. */
        for (int i = 0; i < 4; i++)
                srq_post(&srq, 200 + i);
        cr_assert_eq(dw_srq_arm_limit(&srq, 2), 0);
        fired = 0;
        while (dw_srq_take(&srq, &out, &ev) == 0) {
                if (ev)
                        cr_assert_eq(dw_wq_count(&srq.wq), 1);
                fired += ev;
        }
        cr_assert_eq(fired, 1);
        dw_srq_fini(&srq);
}

Test(srq, limit_zero_disarms)
{
        struct dw_srq srq;
        struct dw_wqe out;
        bool ev;

        cr_assert_eq(dw_srq_init(&srq, 4, 1, NULL), 0);
        for (int i = 0; i < 4; i++)
                srq_post(&srq, i);
        cr_assert_eq(dw_srq_arm_limit(&srq, 4), 0);
        cr_assert_eq(dw_srq_arm_limit(&srq, 0), 0);
        while (dw_srq_take(&srq, &out, &ev) == 0)
                cr_assert(!ev);
        dw_srq_fini(&srq);
}

Test(srq, take_copies_so_slot_can_be_reused)
{
        struct dw_srq srq;
        struct dw_wqe out;
        struct dw_wqe *w;
        struct diwarp_sge sg = {.addr = 0x1234, .length = 64, .lkey = 7};
        struct diwarp_recv_wr wr = {.wr_id = 42, .sg_list = &sg, .num_sge = 1};

        cr_assert_eq(dw_srq_init(&srq, 1, 1, NULL), 0);
        w = dw_wq_reserve(&srq.wq);
        cr_assert_eq(dw_wqe_from_recv_wr(&srq.wq, w, &wr), 0);
        dw_wq_commit(&srq.wq);
        cr_assert_eq(dw_srq_take(&srq, &out, NULL), 0);
        srq_post(&srq, 43); /* overwrites the only slot */
        cr_assert_eq(out.wr_id, 42);
        cr_assert_eq(out.sge[0].addr, 0x1234);
        cr_assert_eq(out.total_len, 64);
        dw_srq_fini(&srq);
}

/* The send WR opcode table: every verbs opcode classified once, as the RC,
 * RD and UD send paths and the post-time checks read it. */
Test(wq, send_wr_opcode_table)
{
        struct expect {
                int opcode;
                enum dw_wr_kind kind;
                bool payload, response, imm, inval, consumes_recv;
                enum diwarp_wc_opcode wc;
        } e[] = {
            {DIWARP_WR_RDMA_WRITE, DW_WR_WRITE, true, false, false, false, false,
             DIWARP_WC_RDMA_WRITE},
            {DIWARP_WR_RDMA_WRITE_WITH_IMM, DW_WR_WRITE, true, false, true, false, true,
             DIWARP_WC_RDMA_WRITE},
            {DIWARP_WR_SEND, DW_WR_SEND, true, false, false, false, true, DIWARP_WC_SEND},
            {DIWARP_WR_SEND_WITH_IMM, DW_WR_SEND, true, false, true, false, true, DIWARP_WC_SEND},
            {DIWARP_WR_SEND_WITH_INV, DW_WR_SEND, true, false, false, true, true, DIWARP_WC_SEND},
            {DIWARP_WR_RDMA_READ, DW_WR_READ, false, true, false, false, false,
             DIWARP_WC_RDMA_READ},
            {DIWARP_WR_ATOMIC_CMP_AND_SWP, DW_WR_ATOMIC, false, true, false, false, false,
             DIWARP_WC_COMP_SWAP},
            {DIWARP_WR_ATOMIC_FETCH_AND_ADD, DW_WR_ATOMIC, false, true, false, false, false,
             DIWARP_WC_FETCH_ADD},
            {DIWARP_WR_LOCAL_INV, DW_WR_LOCAL, false, false, false, false, false,
             DIWARP_WC_LOCAL_INV},
            {DIWARP_WR_BIND_MW, DW_WR_LOCAL, false, false, false, false, false, DIWARP_WC_BIND_MW},
        };
        cr_assert_eq(sizeof(e) / sizeof(e[0]), DW_WR_NOPS, "every opcode has a row");
        for (size_t i = 0; i < sizeof(e) / sizeof(e[0]); i++) {
                const struct dw_wr_op *o = dw_wr_op(e[i].opcode);
                cr_expect_eq(o->kind, e[i].kind, "opcode %d: kind", e[i].opcode);
                cr_expect_eq(o->payload, e[i].payload, "opcode %d: payload", e[i].opcode);
                cr_expect_eq(o->response, e[i].response, "opcode %d: response", e[i].opcode);
                cr_expect_eq(o->imm, e[i].imm, "opcode %d: imm", e[i].opcode);
                cr_expect_eq(o->inval, e[i].inval, "opcode %d: inval", e[i].opcode);
                cr_expect_eq(o->consumes_recv, e[i].consumes_recv, "opcode %d: consumes_recv",
                             e[i].opcode);
                cr_expect_eq(o->wc, e[i].wc, "opcode %d: completion opcode", e[i].opcode);
                cr_expect_eq(dw_wr_is_send(e[i].opcode), e[i].kind == DW_WR_SEND);
        }
        /* Values outside the enum: invalid, never an out-of-bounds read. */
        int bad[] = {-1, DW_WR_NOPS, 0x7fffffff, (int)0x80000000u};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                cr_expect_eq(dw_wr_op(bad[i])->kind, DW_WR_INVALID, "opcode %d", bad[i]);
                cr_expect_not(dw_wr_is_send(bad[i]));
        }
}
