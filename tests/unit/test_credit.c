/* flow/credit: the credit-based mailbox receive ring (libdiwarp/flow/README.md,
 * "Credits", names the thesis it follows; tables, figures and sections below
 * are that thesis's).
 *
 * - The threshold function against Table 5.1, and the two formulas the thesis
 *   rejects failing as it says (a literal model of the thesis's static
 *   protocol: delta credits, one credit-region entry per credit packet).
 * - Unit tests of the static and dynamic protocols and of misuse.
 * - Property tests: one receiver and up to 16 senders (and replies back),
 *   driven by thousands of seeded random schedules over links that deliver
 *   data in order, stand-alone credits in order or not (and duplicated) and ACK-borne
 *   credit values with loss, duplication and reordering. After every step:
 *   no ring overflow, credits conserved (every credit accounted for; the
 *   intended quotas add up to the ring), no
 *   send without credit; at the end every schedule drains.
 *
 * DIWARP_CREDIT_TRACE=1 prints a summary of the property runs (and the state
 * of a schedule that does not drain); DIWARP_CREDIT_FROM=i starts the
 * property runs at schedule i, to replay a failing one. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/credit.h"

/* ---------------------------------------------------------------- PRNG */

static uint64_t rng_state;

static uint64_t rnd(void)
{
        uint64_t x = rng_state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        rng_state = x;
        return x * 0x2545F4914F6CDD1Dull;
}

static uint32_t below(uint32_t n)
{
        return n ? (uint32_t)(rnd() % n) : 0;
}

static bool chance(uint32_t percent)
{
        return below(100) < percent;
}

static bool trace(void)
{
        const char *e = getenv("DIWARP_CREDIT_TRACE");
        return e && *e == '1';
}

/* ------------------------------------------------------- Table 5.1 */

static uint32_t formula_a(uint32_t q, uint32_t c)
{
        return q / c + 1;
}

static uint32_t formula_b(uint32_t q, uint32_t c)
{
        return q / c;
}

static const struct {
        uint32_t q, c, eq51, a, b;
} table51[] = {
    {100, 1, 51, 101, 100}, {100, 2, 34, 51, 50}, {100, 3, 26, 34, 33}, {100, 4, 21, 26, 25},
    {100, 5, 17, 21, 20},   {60, 2, 21, 31, 30},  {40, 2, 14, 21, 20},  {20, 2, 7, 11, 10},
    {10, 2, 4, 6, 5},       {3, 2, 2, 2, 1},
};

Test(credit_threshold, table_5_1)
{
        for (size_t i = 0; i < sizeof(table51) / sizeof(table51[0]); i++) {
                uint32_t q = table51[i].q, c = table51[i].c;
                cr_assert_eq(dw_credit_threshold(q, c), table51[i].eq51, "Eq. 5.1 q=%u c=%u", q, c);
                cr_assert_eq(formula_a(q, c), table51[i].a, "formula (a) q=%u c=%u", q, c);
                cr_assert_eq(formula_b(q, c), table51[i].b, "formula (b) q=%u c=%u", q, c);
        }
        /* Eq. 5.1 never exceeds the quota (no deadlock) and returns at most
         * credit_slots packets' worth per quota (no overflow). */
        for (uint32_t q = 1; q <= 300; q++)
                for (uint32_t c = 1; c <= 8; c++) {
                        uint32_t t = dw_credit_threshold(q, c);
                        cr_assert(t >= 1 && t <= q, "q=%u c=%u t=%u", q, c, t);
                        cr_assert_leq(q / t, c, "q=%u c=%u t=%u", q, c, t);
                }
}

/* The thesis's static protocol, literally: one sender, one receiver, delta
 * credit packets that each take one entry of the sender's credit region (FIFO,
 * in order) until the sender reads them. Returns 0 if every schedule drained
 * with the region never over credit_slots, 1 on an overflow, 2 on a deadlock. */
static int thesis_model(uint32_t q, uint32_t c, uint32_t thr, uint32_t schedules)
{
        for (uint32_t sc = 0; sc < schedules; sc++) {
                uint32_t credit = q, backlog = 3 * q + below(4 * q), inflight = 0, unread = 0;
                uint32_t retrieved = 0, region[64], rlen = 0, wire[64], wlen = 0;
                uint32_t delivered = 0, total = backlog;
                for (uint32_t step = 0; step < 100000 && delivered < total; step++) {
                        switch (below(5)) {
                        case 0: /* the sender sends what its credits allow */
                                while (credit && backlog && chance(70)) {
                                        credit--;
                                        backlog--;
                                        inflight++;
                                }
                                break;
                        case 1: /* data arrives in the receiver's mailbox */
                                if (inflight) {
                                        inflight--;
                                        unread++;
                                }
                                break;
                        case 2: /* the receiver retrieves a data packet */
                                if (unread) {
                                        unread--;
                                        delivered++;
                                        if (++retrieved == thr) {
                                                if (wlen == 64)
                                                        return 1;
                                                wire[wlen++] = thr;
                                                retrieved = 0;
                                        }
                                }
                                break;
                        case 3: /* a credit packet reaches the sender's region */
                                if (wlen) {
                                        if (rlen == c)
                                                return 1; /* no entry left */
                                        region[rlen++] = wire[0];
                                        memmove(wire, wire + 1, --wlen * sizeof(wire[0]));
                                }
                                break;
                        case 4: /* the sender reads its mailbox: seldom while it has credits */
                                if (rlen && (credit == 0 || chance(10))) {
                                        credit += region[0];
                                        memmove(region, region + 1, --rlen * sizeof(region[0]));
                                }
                                break;
                        }
                }
                if (delivered < total)
                        return 2;
        }
        return 0;
}

Test(credit_threshold, rejected_formulas_fail_as_the_thesis_says)
{
        rng_state = 0x5eed0051;
        /* Eq. 5.1: no overflow, no deadlock, over the whole table. */
        for (size_t i = 0; i < sizeof(table51) / sizeof(table51[0]); i++)
                cr_assert_eq(thesis_model(table51[i].q, table51[i].c, table51[i].eq51, 200), 0,
                             "Eq. 5.1 q=%u c=%u", table51[i].q, table51[i].c);
        /* (a): threshold 101 > quota 100 with one credit slot: deadlock. */
        cr_assert_eq(thesis_model(100, 1, formula_a(100, 1), 5), 2);
        cr_assert_eq(thesis_model(1, 1, formula_a(1, 1), 5), 2);
        cr_assert_eq(thesis_model(2, 1, formula_a(2, 1), 5), 2);
        /* (b): quota 3, two credit slots, threshold 1: three credit packets
         * for two entries. */
        cr_assert_eq(thesis_model(3, 2, formula_b(3, 2), 200), 1);

        /* The library refuses (a) outright... */
        struct dw_credit cr;
        struct dw_credit_cfg cfg;
        char why[200] = "";
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 1, 100);
        cfg.credit_slots = 1;
        cfg.threshold = formula_a(100, 1);
        cr_assert_eq(dw_credit_init(&cr, &cfg, why, sizeof(why)), -EINVAL);
        cr_assert(strstr(why, "threshold 101") && strstr(why, "deadlock"), "%s", why);
        /* ...and shows (b)'s overflow as merges of its credit region, which
         * Eq. 5.1 never needs (the property tests check it at scale). */
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 1, 3);
        cfg.threshold = formula_b(3, 2);
        cr_assert_eq(dw_credit_init(&cr, &cfg, why, sizeof(why)), 0, "%s", why);
        struct dw_credit tx;
        struct dw_credit_cfg tcfg;
        dw_credit_cfg_default(&tcfg, DW_CREDIT_STATIC, 1, 3);
        cr_assert_eq(dw_credit_init(&tx, &tcfg, why, sizeof(why)), 0, "%s", why);
        uint32_t pos[3];
        cr_assert_eq(dw_credit_tx_take(&tx, 0, 3), 3);
        for (int i = 0; i < 3; i++)
                cr_assert_eq(dw_credit_rx_arrive(&cr, 0, 1, &pos[i]), 0);
        struct dw_credit_ctl ctl;
        for (int i = 0; i < 3; i++) {
                cr_assert_eq(dw_credit_rx_release(&cr, pos[i], 1), 0);
                cr_assert_eq(dw_credit_next_ctl(&cr, &ctl), 1);
                cr_assert_eq(ctl.type, DW_CREDIT_CTL_CREDIT);
                cr_assert_eq(dw_credit_cr_arrive(&tx, 0, ctl.value), i == 2 ? 1 : 0);
        }
        cr_assert_eq(tx.stats.cr_merged, 1);
        /* Merged, not lost: the sender gets all three credits back. */
        cr_assert_eq(dw_credit_cr_consume(&tx, 0), 1);
        cr_assert_eq(dw_credit_tx_avail(&tx, 0), 3);
        dw_credit_fini(&cr);
        dw_credit_fini(&tx);
}

/* ------------------------------------------------------------ misuse */

static void init_ok(struct dw_credit *c, enum dw_credit_mode m, uint32_t n, uint32_t ring,
                    uint32_t cs)
{
        struct dw_credit_cfg cfg;
        char why[200] = "";
        dw_credit_cfg_default(&cfg, m, n, ring);
        cfg.credit_slots = cs;
        int rc = dw_credit_init(c, &cfg, why, sizeof(why));
        cr_assert_eq(rc, 0, "init: %d %s", rc, why);
}

static void expect_einval(const struct dw_credit_cfg *cfg, const char *word)
{
        struct dw_credit c;
        char why[200] = "";
        cr_assert_eq(dw_credit_init(&c, cfg, why, sizeof(why)), -EINVAL, "expected -EINVAL (%s)",
                     word);
        cr_assert(strstr(why, word), "the reason names \"%s\": %s", word, why);
        cr_assert(strstr(why, "credit ring"), "%s", why);
}

Test(credit_misuse, bad_config)
{
        struct dw_credit_cfg cfg;

        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 64);
        cfg.mode = 7;
        expect_einval(&cfg, "mode 7");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 0, 64);
        expect_einval(&cfg, "0 peers");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 0);
        expect_einval(&cfg, "0 slots");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, DW_CREDIT_MAX_SLOTS + 1);
        expect_einval(&cfg, "slots");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 64);
        cfg.slot_size = 1000;
        expect_einval(&cfg, "slot size 1000");
        cfg.slot_size = 32;
        expect_einval(&cfg, "slot size 32");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 64);
        cfg.credit_slots = 0;
        expect_einval(&cfg, "0 credit slots");
        cfg.credit_slots = 65;
        expect_einval(&cfg, "65 credit slots");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 65, 64);
        expect_einval(&cfg, "each of 65 peers one slot");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 64);
        cfg.threshold = 17;
        expect_einval(&cfg, "threshold 17");
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 64);
        cfg.min_quota = 3;
        expect_einval(&cfg, "dynamic protocol only");
        dw_credit_cfg_default(&cfg, DW_CREDIT_DYNAMIC, 4, 64);
        cfg.min_quota = 17;
        expect_einval(&cfg, "minimum quota of 17");
        dw_credit_cfg_default(&cfg, DW_CREDIT_DYNAMIC, 4, 64);
        cfg.max_quota = 15;
        expect_einval(&cfg, "maximum quota 15");
        dw_credit_cfg_default(&cfg, DW_CREDIT_DYNAMIC, 4, 64);
        cfg.threshold = 3;
        expect_einval(&cfg, "computes its thresholds");
        /* Messages that cannot be cut: dynamic only, and within the floor. */
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 4, 64);
        cfg.msg_slots = 2;
        expect_einval(&cfg, "dynamic protocol only");
        dw_credit_cfg_default(&cfg, DW_CREDIT_DYNAMIC, 4, 64);
        cfg.msg_slots = 3; /* the floor is credit_slots, 2 */
        expect_einval(&cfg, "messages of 3 slots above the floor of 2");
        /* The edges that are fine. */
        struct dw_credit c;
        dw_credit_cfg_default(&cfg, DW_CREDIT_DYNAMIC, 4, 64);
        cfg.min_quota = 16;
        cfg.max_quota = 16;
        cr_assert_eq(dw_credit_init(&c, &cfg, NULL, 0), 0);
        dw_credit_fini(&c);
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 64, 64);
        cfg.slot_size = 64;
        cfg.threshold = 1;
        cr_assert_eq(dw_credit_init(&c, &cfg, NULL, 0), 0);
        cr_assert_eq(dw_credit_slots_for(&c, 0), 1);
        cr_assert_eq(dw_credit_slots_for(&c, 64), 1);
        cr_assert_eq(dw_credit_slots_for(&c, 65), 2);
        cr_assert_eq(dw_credit_slots_for(&c, 2048 + 16), 33);
        dw_credit_fini(&c);
}

Test(credit_misuse, bad_calls)
{
        struct dw_credit c;
        uint32_t pos, pos2, lim;
        struct dw_credit_ctl ctl;

        init_ok(&c, DW_CREDIT_STATIC, 2, 16, 2); /* quota 8, threshold 3 */
        cr_assert_eq(dw_credit_rx_arrive(&c, 2, 1, &pos), -EINVAL, "no peer 2");
        cr_assert_eq(dw_credit_rx_arrive(&c, 0, 0, &pos), -EINVAL, "empty message");
        cr_assert_eq(dw_credit_rx_arrive(&c, 0, 17, &pos), -EINVAL, "larger than the ring");
        cr_assert_eq(dw_credit_rx_arrive(&c, 0, 9, &pos), -EPROTO, "beyond the quota");
        cr_assert_eq(c.stats.refused, 1);
        cr_assert_eq(dw_credit_rx_arrive(&c, 0, 8, &pos), 0);
        cr_assert_eq(dw_credit_rx_arrive(&c, 0, 1, &pos2), -EPROTO, "no credit left");
        cr_assert_eq(c.head - c.tail, 8, "a refused message takes nothing");
        cr_assert_eq(dw_credit_rx_arrive(&c, 1, 3, &pos2), 0);
        cr_assert_eq(pos2, 8);
        cr_assert_eq(dw_credit_rx_release(&c, pos + 1, 7), -EINVAL, "not a message's start");
        cr_assert_eq(dw_credit_rx_release(&c, pos, 7), -EINVAL, "not its size");
        cr_assert_eq(dw_credit_rx_release(&c, 16, 1), -EINVAL, "outside the ring");
        cr_assert_eq(dw_credit_rx_release(&c, pos2, 3), 0);
        cr_assert_eq(dw_credit_rx_release(&c, pos2, 3), -EALREADY);
        /* Released out of order: nothing retrieved until the older one goes. */
        struct dw_credit_view v;
        cr_assert_eq(dw_credit_view(&c, 1, &v), 0);
        cr_assert_eq(v.rx_inring, 3);
        cr_assert_eq(dw_credit_next_ctl(&c, &ctl), 0);
        cr_assert_eq(dw_credit_rx_release(&c, pos, 8), 0);
        cr_assert_eq(c.head, c.tail);
        cr_assert_eq(dw_credit_rx_release(&c, pos, 8), -EINVAL, "retired: no message there");
        /* Sender role. */
        cr_assert_eq(dw_credit_tx_avail(&c, 5), 0);
        cr_assert_eq(dw_credit_tx_update(&c, 5, 10), -EINVAL);
        cr_assert_eq(dw_credit_tx_update(&c, 0, 8), 0, "not newer: stale");
        cr_assert_eq(dw_credit_tx_update(&c, 0, 4), 0, "older: ignored");
        cr_assert_eq(dw_credit_tx_avail(&c, 0), 8);
        cr_assert_eq(dw_credit_tx_update(&c, 0, 8 + DW_CREDIT_MAX_SLOTS + 1), -EPROTO);
        cr_assert_eq(dw_credit_cr_arrive(&c, 0, 8 + DW_CREDIT_MAX_SLOTS + 1), -EPROTO);
        cr_assert_eq(dw_credit_cr_consume(&c, 0), -ENOENT, "releasing more than arrived");
        cr_assert_eq(dw_credit_cr_consume(&c, 9), -EINVAL);
        cr_assert_eq(dw_credit_on_request(&c, 0), -EPROTO, "static has no requests");
        cr_assert_eq(dw_credit_on_response(&c, 0, 1), -EPROTO);
        cr_assert_eq(dw_credit_piggyback(&c, 7, &lim), -EINVAL);
        cr_assert_eq(dw_credit_view(&c, 7, &v), -EINVAL);
        dw_credit_fini(&c);

        init_ok(&c, DW_CREDIT_DYNAMIC, 2, 16, 2);
        cr_assert_eq(dw_credit_on_response(&c, 0, 0), -EPROTO, "no request outstanding");
        c.peer[0].flags |= DW_CREDIT_F_BLOCKED; /* as a steal that asked would */
        cr_assert_eq(dw_credit_on_response(&c, 0, 3), -EPROTO, "gives back more than it held");
        cr_assert_eq(dw_credit_on_response(&c, 0, UINT32_MAX), -EPROTO, "shrinks");
        cr_assert(c.peer[0].flags & DW_CREDIT_F_BLOCKED, "nothing changed");
        cr_assert_eq(dw_credit_on_response(&c, 0, 1), 0);
        cr_assert_not(c.peer[0].flags & DW_CREDIT_F_BLOCKED);
        struct dw_credit_view dv;
        cr_assert_eq(dw_credit_view(&c, 0, &dv), 0);
        cr_assert_eq(dv.rx_current, 1);
        cr_assert_eq(c.available, 16 - 4, "below its floor: the slot stays the sender's");
        cr_assert_eq(dw_credit_on_response(&c, 2, 0), -EINVAL);
        cr_assert_eq(dw_credit_on_request(&c, 2), -EINVAL);
        dw_credit_fini(&c);
}

/* -------------------------------------------------- static, by hand */

/* The thesis's worked example (Fig. 5.2): quota 20, two credit slots,
 * threshold 7. */
Test(credit_static, figure_5_2)
{
        struct dw_credit rx, tx;
        struct dw_credit_cfg cfg;
        struct dw_credit_ctl ctl;
        struct dw_credit_view v;
        uint32_t pos[20];

        init_ok(&rx, DW_CREDIT_STATIC, 1, 20, 2);
        dw_credit_cfg_default(&cfg, DW_CREDIT_STATIC, 1, 8);
        cfg.init_credits = 20;
        cr_assert_eq(dw_credit_init(&tx, &cfg, NULL, 0), 0);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.threshold, 7);
        /* The sender has more than 20 packets: it sends 20 and stalls. */
        cr_assert_eq(dw_credit_tx_take(&tx, 0, 25), 20);
        cr_assert_eq(tx.stats.tx_stalls, 1);
        cr_assert_eq(dw_credit_tx_take(&tx, 0, 1), 0);
        for (int i = 0; i < 20; i++)
                cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 1, &pos[i]), 0);
        /* Two crossings of 7, then 6 retrieved that cannot cross. */
        uint32_t values[3], nv = 0;
        for (int i = 0; i < 20; i++) {
                cr_assert_eq(dw_credit_rx_release(&rx, pos[i], 1), 0);
                while (dw_credit_next_ctl(&rx, &ctl) == 1) {
                        cr_assert_eq(ctl.type, DW_CREDIT_CTL_CREDIT);
                        cr_assert_lt(nv, 3);
                        values[nv++] = ctl.value;
                        cr_assert(i == 6 || i == 13, "crossing at retrieval %d", i + 1);
                }
        }
        cr_assert_eq(nv, 2);
        cr_assert_eq(values[0], 27);
        cr_assert_eq(values[1], 34);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_retrieved, 6);
        /* Both credit packets wait in the two credit slots, and the sender
         * gets 14 credits from them. */
        cr_assert_eq(dw_credit_cr_arrive(&tx, 0, values[0]), 0);
        cr_assert_eq(dw_credit_cr_arrive(&tx, 0, values[1]), 0);
        cr_assert_eq(tx.peer[0].cr_used, 2);
        cr_assert_eq(dw_credit_cr_consume(&tx, 0), 1);
        cr_assert_eq(tx.peer[0].cr_used, 0, "the newest covers both");
        cr_assert_eq(dw_credit_cr_consume(&tx, 0), -ENOENT);
        cr_assert_eq(dw_credit_tx_avail(&tx, 0), 14);
        /* A packet going back carries the 6 early (piggyback). */
        uint32_t lim;
        cr_assert_eq(dw_credit_piggyback(&rx, 0, &lim), 1);
        cr_assert_eq(lim, 40);
        cr_assert_eq(dw_credit_piggyback(&rx, 0, &lim), 0, "nothing new");
        cr_assert_eq(dw_credit_tx_update(&tx, 0, lim), 1);
        cr_assert_eq(dw_credit_tx_update(&tx, 0, lim), 0, "duplicate");
        cr_assert_eq(dw_credit_tx_update(&tx, 0, values[0]), 0, "reordered, older");
        cr_assert_eq(dw_credit_tx_avail(&tx, 0), 20);
        cr_assert_eq(rx.stats.early_slots, 6);
        dw_credit_fini(&rx);
        dw_credit_fini(&tx);
}

Test(credit_static, multi_slot_messages_wrap_and_free_in_ring_order)
{
        struct dw_credit rx;
        uint32_t a, b, d;
        struct dw_credit_view v;

        init_ok(&rx, DW_CREDIT_STATIC, 2, 10, 1); /* quota 5, threshold 3 */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 4, &a), 0);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 5, &b), 0);
        cr_assert_eq(a, 0);
        cr_assert_eq(b, 4);
        cr_assert_eq(dw_credit_rx_release(&rx, a, 4), 0);
        cr_assert_eq(rx.tail, 4);
        /* Peer 0's 4 slots count one by one: one crossing returns 3, 1 waits. */
        cr_assert_eq(rx.peer[0].rx_granted, 8);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_retrieved, 1);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 5, &d), -EPROTO, "only 4 credits");
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 4, &d), 0);
        cr_assert_eq(d, 9, "slots 9, 0, 1, 2: it wraps");
        cr_assert_eq(rx.head - rx.tail, 9);
        cr_assert_eq(dw_credit_rx_release(&rx, d, 4), 0);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 4, "behind peer 1's unreleased message");
        cr_assert_eq(dw_credit_rx_release(&rx, b, 5), 0);
        cr_assert_eq(rx.head, rx.tail);
        dw_credit_fini(&rx);
}

/* A stream that starts over (RD's stream restart, or a freed stream's
 * index handed to a new one): the peer's counters are as after init, its
 * messages still in the ring leave it in order without crediting anyone,
 * and the other peers' are untouched. The dynamic protocol refuses. */
Test(credit_static, peer_reset_starts_over_and_orphans_its_ring_slots)
{
        struct dw_credit rx;
        uint32_t a, b, c, d;
        struct dw_credit_view v;

        init_ok(&rx, DW_CREDIT_STATIC, 2, 10, 1);            /* quota 5, threshold 3 */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 2, &a), 0); /* holds the tail */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 2, &b), 0);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 1, &c), 0);
        cr_assert_eq(dw_credit_rx_release(&rx, b, 2), 0); /* done, behind peer 1's */
        cr_assert_eq(dw_credit_tx_take(&rx, 0, 4), 4);
        cr_assert_eq(dw_credit_peer_reset(&rx, 0), 0);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 0);
        cr_assert_eq(v.tx_credits, 5, "our credits in its ring: the quota again");
        cr_assert_eq(dw_credit_limit(&rx, 0), 5);
        /* The new start may use its whole quota beside the old slots. */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 5, &d), 0);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 1, NULL), -EPROTO, "quota 5");
        /* The old messages leave in order and credit nobody; peer 1's do. */
        cr_assert_eq(dw_credit_rx_release(&rx, a, 2), 0);
        cr_assert_eq(dw_credit_rx_release(&rx, c, 1), 0);
        cr_assert_eq(rx.tail, 5);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 5, "only the new start's slots are its own");
        cr_assert_eq(dw_credit_limit(&rx, 0), 5, "the old slots returned nothing");
        cr_assert_eq(dw_credit_view(&rx, 1, &v), 0);
        cr_assert_eq(v.rx_inring, 0);
        cr_assert_eq(dw_credit_rx_release(&rx, d, 5), 0);
        cr_assert_eq(rx.head, rx.tail);
        cr_assert_eq(dw_credit_limit(&rx, 0), 8, "its own 5 slots: one threshold of 3");
        cr_assert_eq(dw_credit_peer_reset(&rx, 2), -EINVAL);
        dw_credit_fini(&rx);

        init_ok(&rx, DW_CREDIT_DYNAMIC, 2, 16, 2);
        cr_assert_eq(dw_credit_peer_reset(&rx, 0), -EOPNOTSUPP);
        dw_credit_fini(&rx);
}

/* After a reset the old messages may fill the ring: a message the peer had
 * credits for, placed without a slot, still counts and gives its credits
 * back; one beyond its credits is refused as ever. */
Test(credit_static, pass_counts_a_message_the_full_ring_has_no_room_for)
{
        struct dw_credit rx;
        uint32_t a, b;
        struct dw_credit_view v;

        init_ok(&rx, DW_CREDIT_STATIC, 2, 10, 1);            /* quota 5, threshold 3 */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 4, &a), 0); /* parked, old start */
        cr_assert_eq(dw_credit_peer_reset(&rx, 0), 0);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 5, &b), 0);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 2, NULL), -EPROTO, "1 slot free of 10");
        cr_assert_eq(dw_credit_rx_pass(&rx, 0, 2), 0);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 0, "passed, not in the ring");
        cr_assert_eq(v.rx_retrieved, 2, "below the threshold of 3: kept for now");
        cr_assert_eq(dw_credit_rx_pass(&rx, 0, 3), 0, "its last 3 credits");
        cr_assert_eq(dw_credit_limit(&rx, 0), 8, "5 retrieved: one threshold back");
        cr_assert_eq(dw_credit_rx_pass(&rx, 0, 4), -EPROTO, "3 credits, not 4");
        cr_assert_eq(dw_credit_rx_pass(&rx, 2, 1), -EINVAL);
        cr_assert_eq(dw_credit_rx_pass(&rx, 0, 0), -EINVAL);
        cr_assert_eq(dw_credit_rx_release(&rx, a, 4), 0);
        cr_assert_eq(dw_credit_rx_release(&rx, b, 5), 0);
        cr_assert_eq(rx.head, rx.tail);
        dw_credit_fini(&rx);
}

/* A message placed straight into a receive WR: its credits come back at
 * once when nothing older is in the ring, behind the older messages when
 * something is, and passed when the ring is full. */
Test(credit_static, consumed_returns_credits_in_ring_order)
{
        struct dw_credit rx;
        uint32_t a;
        struct dw_credit_view v;

        init_ok(&rx, DW_CREDIT_STATIC, 2, 10, 1); /* quota 5, threshold 3 */
        uint32_t head = rx.head;
        cr_assert_eq(dw_credit_rx_consumed(&rx, 0, 3), 0);
        cr_assert_eq(rx.head, head, "an empty ring: no slot written");
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 0);
        cr_assert_eq(dw_credit_limit(&rx, 0), 8, "3 retrieved: one threshold back");
        /* An older message of peer 1 is parked: peer 0's next one waits
         * behind it for its credits. */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 2, &a), 0);
        cr_assert_eq(dw_credit_rx_consumed(&rx, 0, 2), 0);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 2, "in the ring behind peer 1's message");
        cr_assert_eq(v.rx_retrieved, 0);
        cr_assert_eq(dw_credit_rx_release(&rx, a, 2), 0);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 0, "retired with the older message");
        cr_assert_eq(v.rx_retrieved, 2);
        cr_assert_eq(rx.head, rx.tail);
        /* No credit for it: refused, nothing changes. */
        cr_assert_eq(dw_credit_rx_consumed(&rx, 0, 4), -EPROTO, "3 credits left, not 4");
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_retrieved, 2);
        cr_assert_eq(dw_credit_rx_consumed(&rx, 2, 1), -EINVAL);
        cr_assert_eq(dw_credit_rx_consumed(&rx, 0, 0), -EINVAL);
        /* A full ring (a restarted peer's old slots): passed. */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 3, &a), 0);
        cr_assert_eq(dw_credit_peer_reset(&rx, 1), 0);
        uint32_t b;
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 5, &b), 0);
        cr_assert_eq(dw_credit_rx_consumed(&rx, 0, 3), 0, "2 slots free of 10, passed");
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.rx_inring, 0);
        cr_assert_eq(dw_credit_rx_release(&rx, a, 3), 0);
        cr_assert_eq(dw_credit_rx_release(&rx, b, 5), 0);
        cr_assert_eq(rx.head, rx.tail);
        dw_credit_fini(&rx);
}

/* The 16-bit credit field of the datagram header: a value widens to the
 * 32-bit limit nearest the newest one known, across the wrap of either, and
 * credits taken for a datagram that never left come back. */
Test(credit_static, wire_values_widen_and_untake_gives_back)
{
        struct dw_credit tx;
        init_ok(&tx, DW_CREDIT_STATIC, 2, 64, 2); /* quota 32 */
        cr_assert_eq(dw_credit_peer_bytes(&tx), 48, "a static peer costs 48 bytes");
        cr_assert_null(tx.dyn);
        cr_assert_eq(dw_credit_tx_avail(&tx, 1), 32);
        cr_assert_eq(dw_credit_tx_take(&tx, 1, 20), 20);
        dw_credit_tx_untake(&tx, 1, 5);
        cr_assert_eq(dw_credit_tx_avail(&tx, 1), 17);
        dw_credit_tx_untake(&tx, 7, 5); /* a bad peer is ignored */
        cr_assert_eq(dw_credit_widen16(&tx, 1, 40), 40);
        cr_assert_eq(dw_credit_tx_update(&tx, 1, dw_credit_widen16(&tx, 1, 40)), 1);
        cr_assert_eq(dw_credit_tx_avail(&tx, 1), 25);
        /* Around 2^16 and 2^32: the nearest value, ahead or behind. */
        static const uint32_t refs[] = {40, 0xfff0, 0x1fffe, 0xfffffff0u, 5};
        for (size_t i = 0; i < sizeof(refs) / sizeof(refs[0]); i++) {
                tx.peer[1].tx_limit = refs[i];
                for (int32_t d = -32768; d < 32768; d += 1021) {
                        uint32_t want = refs[i] + (uint32_t)d;
                        cr_assert_eq(dw_credit_widen16(&tx, 1, (uint16_t)want), want,
                                     "ref %#x delta %d", refs[i], d);
                }
        }
        dw_credit_fini(&tx);
}

/* A message of more slots than the sender holds while the receiver sits on
 * fewer than a threshold: the probe's flush gives back what was retrieved. */
Test(credit_static, flush_frees_a_sender_short_of_a_whole_message)
{
        struct dw_credit rx;
        uint32_t pos;
        init_ok(&rx, DW_CREDIT_STATIC, 2, 12, 2); /* quota 6, threshold 3 */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 5, &pos), 0);
        cr_assert_eq(dw_credit_rx_release(&rx, pos, 5), 0);
        /* 3 returned at the threshold, 2 retrieved and kept: 1 + 3 = 4 held. */
        cr_assert_eq(dw_credit_limit(&rx, 0), 9);
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 5, &pos), -EPROTO, "4 credits, not 5");
        cr_assert_eq(dw_credit_flush(&rx, 0), 1);
        cr_assert_eq(dw_credit_limit(&rx, 0), 11);
        cr_assert_eq(dw_credit_flush(&rx, 0), 0, "nothing more retrieved");
        cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 6, &pos), 0, "the whole quota again");
        cr_assert_eq(dw_credit_flush(&rx, 5), -EINVAL);
        dw_credit_fini(&rx);
}

/* ------------------------------------------------- dynamic, by hand */

Test(credit_dynamic, initial_state_and_first_returns)
{
        struct dw_credit rx;
        struct dw_credit_view v;
        struct dw_credit_ctl ctl;
        uint32_t pos;

        init_ok(&rx, DW_CREDIT_DYNAMIC, 3, 31, 2);
        /* Every sender starts at its floor (= credit slots), the rest of the
         * ring is available, intended quotas split the ring (+1 to the first
         * one), all in LOW, thresholds 1. */
        cr_assert_eq(rx.available, 31 - 3 * 2);
        for (uint32_t s = 0; s < 3; s++) {
                cr_assert_eq(dw_credit_view(&rx, s, &v), 0);
                cr_assert_eq(v.rx_current, 2);
                cr_assert_eq(v.intended, s == 0 ? 11 : 10);
                cr_assert_eq(v.act, DW_CREDIT_LOW);
                cr_assert_eq(v.threshold, 1);
        }
        /* Static: 48 bytes a peer; dynamic: the dynamic part and the FIFO beside. */
        cr_assert_eq(sizeof(struct dw_credit_peer), 48);
        cr_assert_eq(dw_credit_peer_bytes(&rx),
                     sizeof(struct dw_credit_peer) + sizeof(struct dw_credit_dyn) + 3 * 4);
        /* The first retrieved packet crosses threshold 1 and returns
         * T = intended div 3 + 1 = 4. */
        cr_assert_eq(dw_credit_rx_arrive(&rx, 1, 1, &pos), 0);
        cr_assert_eq(dw_credit_rx_release(&rx, pos, 1), 0);
        cr_assert_eq(dw_credit_next_ctl(&rx, &ctl), 1);
        cr_assert_eq(ctl.type, DW_CREDIT_CTL_CREDIT);
        cr_assert_eq(ctl.peer, 1);
        cr_assert_eq(ctl.value, 2 + 4);
        cr_assert_eq(dw_credit_view(&rx, 1, &v), 0);
        cr_assert_eq(v.rx_current, 5);
        cr_assert_eq(rx.available, 25 - 3);
        dw_credit_fini(&rx);
}

/* Thesis Sec. 6.6 (Fig. 6.4, blocks 5-7): credits piggybacked early are
 * not returned twice; a deficit is made up at the threshold, an excess delays
 * the next one. */
Test(credit_dynamic, piggyback_deficit_and_excess)
{
        struct dw_credit rx;
        struct dw_credit_view v;
        uint32_t pos, lim, g;

        init_ok(&rx, DW_CREDIT_DYNAMIC, 2, 20, 2); /* intended 10: T = 4 */
#define ONE()                                                                                      \
        do {                                                                                       \
                cr_assert_eq(dw_credit_rx_arrive(&rx, 0, 1, &pos), 0);                             \
                cr_assert_eq(dw_credit_rx_release(&rx, pos, 1), 0);                                \
        } while (0)
        /* The first three retrieved packets each cross a threshold of 1 and
         * return 4; the third is a monitoring point (LOW -> MEDIUM). */
        ONE();
        ONE();
        ONE();
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(rx.peer[0].rx_granted, 2 + 3 * 4);
        cr_assert_eq(v.threshold, 4);
        cr_assert_eq(v.act, DW_CREDIT_MEDIUM);
        /* Deficit: 3 go back early, the crossing returns the 1 missing. */
        ONE();
        g = rx.peer[0].rx_granted;
        cr_assert_eq(dw_credit_piggyback(&rx, 0, &lim), 1);
        cr_assert_eq(lim, g + 1);
        ONE();
        ONE();
        cr_assert_eq(dw_credit_piggyback(&rx, 0, &lim), 1);
        cr_assert_eq(lim, g + 3);
        cr_assert_eq(rx.dyn[0].piggybacked, 3);
        ONE(); /* retrieved 1 + piggybacked 3 = 4: the regular way */
        cr_assert_eq(rx.peer[0].rx_granted, g + 4, "4 in all, not 3 + 4");
        cr_assert_eq(rx.dyn[0].piggybacked, 0);
        struct dw_credit_ctl ctl;
        cr_assert_eq(dw_credit_next_ctl(&rx, &ctl), 1);
        cr_assert_eq(ctl.value, g + 4);
        while (dw_credit_next_ctl(&rx, &ctl) == 1)
                ;
        /* Excess: the quota shrinks (as a steal would) to 4, T = 2; 3 were
         * piggybacked when the piggyback way crosses: nothing goes back and
         * the next threshold is later by 1. */
        rx.peer[0].intended -= 6;
        rx.peer[1].intended += 6;
        ONE();
        ONE();
        ONE();
        g = rx.peer[0].rx_granted;
        cr_assert_eq(dw_credit_piggyback(&rx, 0, &lim), 1);
        cr_assert_eq(lim, g + 3);
        uint32_t next = rx.fifo[0 * 3 + (rx.dyn[0].events + 1) % 3];
        ONE();
        cr_assert_eq(dw_credit_piggyback(&rx, 0, &lim), 0, "no credits: an excess");
        cr_assert_eq(lim, g + 3);
        cr_assert_eq(dw_credit_view(&rx, 0, &v), 0);
        cr_assert_eq(v.threshold, next + 1);
        cr_assert_eq(rx.dyn[0].piggybacked, 0);
#undef ONE
        dw_credit_fini(&rx);
}

/* ------------------------------------------------- property model */

/* Endpoint 0 is the receiver R, with one peer per sender; endpoints 1..ns are
 * the senders, each with one peer (R). Each direction of each pair is a link:
 * a reliable in-order data channel (data, compulsory requests and
 * responses), a reliable channel of stand-alone credit messages (in order,
 * or in any order), and a bag of ACK-borne credit values that may be lost,
 * duplicated and reordered. */
#define MAXS   16
#define MAXE   (MAXS + 1)
#define CHCAP  4096
#define ACKCAP 32
#define UCAP   4096

enum { K_DATA = 1, K_REQ, K_RESP };

struct mmsg {
        uint8_t kind, pb, last;
        uint32_t n, val;
};

struct chan {
        struct mmsg m[CHCAP];
        uint32_t head, len;
};

struct link {
        struct chan data, cred;
        uint32_t ack[ACKCAP], nack;
        uint32_t inflight; /* slots on the data channel */
        uint32_t sent;     /* slots ever put on the data channel */
};

struct unrel {
        uint32_t pos, n;
        uint8_t kind, last;
};

struct mparams {
        enum dw_credit_mode mode;
        uint32_t ns, ring, cs, minq, maxq, sring, msgmax, piece;
        /* Messages go whole (as RD Send segments do): msgmax <= the floor,
         * set as the model's msg_slots. */
        bool whole;
        bool ctl_free; /* requests and responses outside the ring (RD) */
        uint32_t w_gen, w_send, w_ctl, w_data, w_cred, w_consume, w_release, w_ack, w_ackdel;
        uint32_t reply_pct; /* share of generated messages R sends back */
        uint32_t ack_loss, ack_dup;
        uint32_t cr_dup; /* % of stand-alone credit deliveries that stay to come again */
        bool cr_reorder, piggyback, fifo_release;
        uint32_t steps, phase;
};

struct model {
        struct mparams p;
        struct dw_credit ep[MAXE];
        struct link link[MAXE][MAXE]; /* [from][to] */
        uint32_t backlog[MAXE][MAXS]; /* messages queued, [endpoint][peer] */
        uint32_t rem[MAXE][MAXS];     /* slots left of the message being sent */
        struct unrel un[MAXE][UCAP];
        uint32_t nun[MAXE];
        bool active[MAXE];
        uint64_t generated, delivered, steps;
};

static struct model M;

static uint32_t nep(void)
{
        return M.p.ns + 1;
}

static uint32_t npeers_of(uint32_t e)
{
        return e ? 1 : M.p.ns;
}

static uint32_t other(uint32_t e, uint32_t p)
{
        return e ? 0 : p + 1;
}

/* Index of endpoint e among the peers of endpoint b. */
static uint32_t idx_at(uint32_t b, uint32_t e)
{
        return b ? 0 : e - 1;
}

static void chan_push(struct chan *c, struct mmsg m)
{
        cr_assert_lt(c->len, CHCAP, "model channel full");
        c->m[(c->head + c->len++) % CHCAP] = m;
}

static struct mmsg chan_take(struct chan *c, uint32_t i)
{
        /* Removes element i (0 = oldest) keeping the others' order. */
        struct mmsg m = c->m[(c->head + i) % CHCAP];
        for (uint32_t k = i; k > 0; k--)
                c->m[(c->head + k) % CHCAP] = c->m[(c->head + k - 1) % CHCAP];
        c->head = (c->head + 1) % CHCAP;
        c->len--;
        return m;
}

static void model_init(const struct mparams *p)
{
        char why[200] = "";
        memset(&M, 0, sizeof(M));
        M.p = *p;
        uint32_t fl = p->minq ? p->minq : p->cs;
        for (uint32_t e = 0; e < nep(); e++) {
                struct dw_credit_cfg cfg;
                dw_credit_cfg_default(&cfg, p->mode, npeers_of(e), e ? p->sring : p->ring);
                cfg.credit_slots = p->cs;
                if (p->mode == DW_CREDIT_DYNAMIC) {
                        cfg.min_quota = p->minq;
                        cfg.max_quota = e ? 0 : p->maxq;
                        cfg.init_credits = fl;
                        cfg.msg_slots = p->whole ? p->msgmax : 0;
                        cfg.ctl_free = p->ctl_free;
                } else {
                        /* What the other side's ring grants one sender. */
                        cfg.init_credits = e ? p->ring / p->ns : p->sring;
                }
                int rc = dw_credit_init(&M.ep[e], &cfg, why, sizeof(why));
                cr_assert_eq(rc, 0, "endpoint %u: %s", e, why);
        }
        for (uint32_t e = 0; e < nep(); e++)
                M.active[e] = true;
}

static void model_fini(void)
{
        for (uint32_t e = 0; e < nep(); e++)
                dw_credit_fini(&M.ep[e]);
}

/* Invariants, after every step. */
static void check_pair(uint32_t x, uint32_t y)
{
        /* x receives from y. */
        struct dw_credit *X = &M.ep[x], *Y = &M.ep[y];
        uint32_t px = idx_at(x, y), py = idx_at(y, x);
        const struct dw_credit_peer *r = &X->peer[px], *t = &Y->peer[py];
        const struct link *l = &M.link[y][x];
        int32_t credits = (int32_t)(t->tx_limit - t->tx_used);
        int32_t transit = (int32_t)(r->rx_granted - t->tx_limit);
        int32_t gb = (int32_t)(t->tx_skip - r->rx_skip);

        /* A sender never holds (or used) more than it was granted. */
        cr_assert_geq(credits, 0, "%u->%u: negative credits", y, x);
        cr_assert_geq(transit, 0, "%u->%u: the sender believes in credits never granted", y, x);
        cr_assert_geq(gb, 0, "%u->%u", y, x);
        /* What it used is what went on the wire, plus what it gave back. */
        cr_assert_eq(t->tx_used - t->tx_skip, l->sent, "%u->%u: used %u skip %u sent %u", y, x,
                     t->tx_used, t->tx_skip, l->sent);
        cr_assert_eq(l->sent - l->inflight, r->rx_arrived, "%u->%u", y, x);
        /* Conservation: every credit is at the sender, in flight, unread in
         * the ring, retrieved and not returned, in transit back, or (dynamic)
         * given back. */
        uint32_t cur = r->rx_granted - r->rx_retired - r->rx_skip;
        uint32_t sum = (uint32_t)credits + l->inflight + (r->rx_arrived - r->rx_retired) +
                       (uint32_t)transit + (uint32_t)gb;
        cr_assert_eq(cur, sum, "%u->%u: current %u != %u", y, x, cur, sum);
        if (X->cfg.mode == DW_CREDIT_STATIC) {
                uint32_t quota = X->cfg.ring_slots / X->cfg.npeers;
                cr_assert_eq(sum + r->retrieved, quota, "%u->%u: static identity", y, x);
        }
        cr_assert_leq(t->cr_used, Y->cfg.credit_slots);
}

static void check_endpoint(uint32_t x)
{
        struct dw_credit *X = &M.ep[x];
        uint32_t n = X->cfg.npeers, ring = X->cfg.ring_slots;
        uint64_t inring = 0;

        cr_assert_leq(X->head - X->tail, ring, "endpoint %u: ring overflow", x);
        for (uint32_t p = 0; p < n; p++) {
                inring += X->peer[p].rx_arrived - X->peer[p].rx_retired;
                check_pair(x, other(x, p));
        }
        cr_assert_eq(inring, X->head - X->tail, "endpoint %u", x);
        if (X->cfg.mode != DW_CREDIT_DYNAMIC)
                return;
        uint32_t fl = X->cfg.min_quota ? X->cfg.min_quota : X->cfg.credit_slots;
        uint64_t cur = 0, res = 0, intended = 0, lists = 0;
        for (uint32_t p = 0; p < n; p++) {
                const struct dw_credit_peer *r = &X->peer[p];
                uint32_t c = r->rx_granted - r->rx_retired - r->rx_skip;
                cur += c;
                res += c < fl ? fl - c : 0;
                intended += r->intended;
                cr_assert_geq(r->intended, fl,
                              "intended quota below the floor: endpoint %u peer %u", x, p);
                if (X->cfg.max_quota)
                        cr_assert_leq(r->intended, X->cfg.max_quota);
        }
        for (int l = 0; l < 4; l++)
                lists += X->llen[l];
        cr_assert_eq(cur + res + X->available, ring,
                     "current + floor reserve + available != ring: endpoint %u", x);
        cr_assert_eq(intended, ring, "intended quotas != ring: endpoint %u", x);
        cr_assert_eq(lists, n, "senders not each on one activity list: endpoint %u", x);
}

/* An event touches R and one sender s: check both (R's check covers every
 * pair's receiving side at R and its global invariants). */
static void check_step(uint32_t s)
{
        check_endpoint(0);
        check_endpoint(s);
}

/* ---- events */

static void ev_gen(void)
{
        uint32_t e, p;
        if (chance(M.p.reply_pct)) {
                e = 0;
                p = below(M.p.ns);
                if (!M.active[p + 1])
                        return;
        } else {
                e = 1 + below(M.p.ns);
                p = 0;
                if (!M.active[e])
                        return;
        }
        if (M.backlog[e][p] < 4) {
                M.backlog[e][p]++;
                M.generated++;
        }
}

static void ev_send(uint32_t e, uint32_t p)
{
        if (!M.rem[e][p]) {
                if (!M.backlog[e][p])
                        return;
                M.backlog[e][p]--;
                M.rem[e][p] = 1 + below(M.p.msgmax);
        }
        uint32_t want = M.rem[e][p] < M.p.piece ? M.rem[e][p] : 1 + below(M.p.piece);
        if (M.p.whole) {
                want = M.rem[e][p];
                if (dw_credit_tx_avail(&M.ep[e], p) < want) {
                        M.ep[e].stats.tx_stalls++;
                        return;
                }
        }
        uint32_t k = dw_credit_tx_take(&M.ep[e], p, want);
        if (!k)
                return;
        struct link *l = &M.link[e][other(e, p)];
        struct mmsg m = {.kind = K_DATA, .n = k};
        if (M.p.piggyback && dw_credit_piggyback(&M.ep[e], p, &m.val) >= 0)
                m.pb = 1;
        M.rem[e][p] -= k;
        m.last = M.rem[e][p] == 0;
        chan_push(&l->data, m);
        l->inflight += k;
        l->sent += k;
}

static void ev_ctl(uint32_t e)
{
        struct dw_credit_ctl ctl;
        for (int i = 0; i < 4 && dw_credit_next_ctl(&M.ep[e], &ctl) == 1; i++) {
                cr_assert_lt(ctl.peer, npeers_of(e));
                struct link *l = &M.link[e][other(e, ctl.peer)];
                struct mmsg m = {.n = 1, .val = ctl.value};
                if (ctl.type == DW_CREDIT_CTL_CREDIT) {
                        chan_push(&l->cred, m);
                        continue;
                }
                m.kind = ctl.type == DW_CREDIT_CTL_REQUEST ? K_REQ : K_RESP;
                cr_assert_eq(M.ep[e].cfg.mode, DW_CREDIT_DYNAMIC);
                if (M.p.ctl_free) {
                        m.n = 0; /* in order with the data, but no slot */
                        chan_push(&l->data, m);
                        continue;
                }
                chan_push(&l->data, m);
                l->inflight++;
                l->sent++;
        }
}

static void ev_data(uint32_t y, uint32_t x)
{
        struct link *l = &M.link[y][x];
        if (!l->data.len)
                return;
        struct mmsg m = chan_take(&l->data, 0);
        uint32_t px = idx_at(x, y), pos;
        if (m.n == 0) {
                if (m.kind == K_REQ)
                        cr_assert_eq(dw_credit_on_request(&M.ep[x], px), 0);
                else
                        cr_assert_eq(dw_credit_on_response(&M.ep[x], px, m.val), 0);
                return;
        }
        int rc = dw_credit_rx_arrive(&M.ep[x], px, m.n, &pos);
        cr_assert_eq(rc, 0, "%u->%u: a message of %u slots refused (%d): sent without credit", y, x,
                     m.n, rc);
        l->inflight -= m.n;
        cr_assert_lt(M.nun[x], UCAP);
        M.un[x][M.nun[x]++] = (struct unrel){pos, m.n, m.kind, m.last};
        if (m.kind == K_DATA && m.pb)
                cr_assert_geq(dw_credit_tx_update(&M.ep[x], px, m.val), 0);
        else if (m.kind == K_REQ)
                cr_assert_eq(dw_credit_on_request(&M.ep[x], px), 0);
        else if (m.kind == K_RESP)
                cr_assert_eq(dw_credit_on_response(&M.ep[x], px, m.val), 0);
}

static void ev_cred(uint32_t y, uint32_t x)
{
        struct link *l = &M.link[y][x];
        if (!l->cred.len)
                return;
        uint32_t i = M.p.cr_reorder ? below(l->cred.len) : 0;
        struct mmsg m = l->cred.m[(l->cred.head + i) % CHCAP];
        if (!chance(M.p.cr_dup))
                chan_take(&l->cred, i); /* else delivered twice (or more) */
        cr_assert_geq(dw_credit_cr_arrive(&M.ep[x], idx_at(x, y), m.val), 0);
}

static void ev_consume(uint32_t e, uint32_t p)
{
        if (M.ep[e].peer[p].cr_used)
                cr_assert_geq(dw_credit_cr_consume(&M.ep[e], p), 0);
}

static void ev_release(uint32_t x)
{
        if (!M.nun[x])
                return;
        uint32_t i = M.p.fifo_release ? 0 : below(M.nun[x]);
        struct unrel u = M.un[x][i];
        if (M.p.fifo_release)
                memmove(&M.un[x][0], &M.un[x][1], (M.nun[x] - 1) * sizeof(u));
        else
                M.un[x][i] = M.un[x][M.nun[x] - 1];
        M.nun[x]--;
        cr_assert_eq(dw_credit_rx_release(&M.ep[x], u.pos, u.n), 0);
        if (u.kind == K_DATA && u.last)
                M.delivered++;
}

static void ev_ack(uint32_t x, uint32_t p)
{
        struct link *l = &M.link[x][other(x, p)];
        if (l->nack < ACKCAP)
                l->ack[l->nack++] = dw_credit_limit(&M.ep[x], p);
}

static void ev_ackdel(uint32_t x, uint32_t y)
{
        struct link *l = &M.link[x][y];
        if (!l->nack)
                return;
        uint32_t i = below(l->nack), v = l->ack[i];
        if (!chance(M.p.ack_dup))
                l->ack[i] = l->ack[--l->nack];
        if (chance(M.p.ack_loss))
                return;
        cr_assert_geq(dw_credit_tx_update(&M.ep[y], idx_at(y, x), v), 0);
}

static bool pair_busy(uint32_t s)
{
        const struct link *u = &M.link[s][0], *d = &M.link[0][s];
        return M.backlog[s][0] || M.rem[s][0] || M.backlog[0][s - 1] || M.rem[0][s - 1] ||
               u->data.len || d->data.len || u->cred.len || d->cred.len || M.nun[s] ||
               M.ep[0].peer[s - 1].cr_used || M.ep[s].peer[0].cr_used ||
               (M.ep[0].peer[s - 1].flags | M.ep[s].peer[0].flags) &
                   (DW_CREDIT_F_REQ | DW_CREDIT_F_RESP | DW_CREDIT_F_DUE);
}

static void do_event(uint32_t ev, uint32_t s, bool up)
{
        uint32_t from = up ? s : 0, to = up ? 0 : s; /* R's index for sender s: s - 1 */
        switch (ev) {
        case 0:
                ev_gen();
                break;
        case 1:
                ev_send(from, idx_at(from, to));
                break;
        case 2:
                ev_ctl(chance(50) ? 0 : s);
                break;
        case 3:
                ev_data(from, to);
                break;
        case 4:
                ev_cred(to, from);
                break;
        case 5:
                ev_consume(from, idx_at(from, to));
                break;
        case 6:
                ev_release(chance(70) ? 0 : s);
                break;
        case 7:
                ev_ack(to, idx_at(to, from));
                break;
        case 8:
                ev_ackdel(to, from);
                break;
        }
}

/* One random event, then the invariants. */
static void step(void)
{
        const struct mparams *p = &M.p;
        uint32_t w[9] = {p->w_gen,     p->w_send,    p->w_ctl, p->w_data,  p->w_cred,
                         p->w_consume, p->w_release, p->w_ack, p->w_ackdel};
        uint32_t tot = 0;
        for (int i = 0; i < 9; i++)
                tot += w[i];
        uint32_t r = below(tot), ev = 0;
        while (r >= w[ev])
                r -= w[ev++];
        uint32_t who = 1 + below(p->ns);
        do_event(ev, who, !chance(p->reply_pct ? 25 : 5));
        M.steps++;
        check_step(who);
}

/* Draining: every pair that still has work gets each kind of event (except
 * generation) in a random order, some skipped; the invariants after each. */
static void sweep(void)
{
        uint32_t busy[MAXS], nb = 0;
        for (uint32_t i = 1; i <= M.p.ns; i++)
                if (pair_busy(i))
                        busy[nb++] = i;
        if (!nb) /* what is left is R's own: its ring, its control queue */
                for (uint32_t i = 1; i <= M.p.ns; i++)
                        busy[nb++] = i;
        for (uint32_t k = nb; k > 1; k--) {
                uint32_t j = below(k), t = busy[k - 1];
                busy[k - 1] = busy[j];
                busy[j] = t;
        }
        for (uint32_t b = 0; b < nb; b++)
                for (uint32_t n = 0; n < 12; n++) {
                        if (chance(25))
                                continue;
                        uint32_t ev = 1 + below(8);
                        if ((ev == 7 || ev == 8) && !M.p.w_ack)
                                continue; /* no ACK-borne credits in this schedule */
                        do_event(ev, busy[b], chance(50));
                        M.steps++;
                        check_step(busy[b]);
                }
}

static void set_phase(void)
{
        /* All senders active, half, an eighth, or one. */
        uint32_t k = M.p.ns;
        switch (below(4)) {
        case 1:
                k = (M.p.ns + 1) / 2;
                break;
        case 2:
                k = M.p.ns / 8 ? M.p.ns / 8 : 1;
                break;
        case 3:
                k = 1;
                break;
        }
        uint32_t first = below(M.p.ns);
        for (uint32_t s = 0; s < M.p.ns; s++)
                M.active[s + 1] = (s + M.p.ns - first) % M.p.ns < k;
}

static bool drained(void)
{
        for (uint32_t e = 0; e < nep(); e++) {
                if (M.nun[e] || M.ep[e].head != M.ep[e].tail)
                        return false;
                for (uint32_t p = 0; p < npeers_of(e); p++)
                        if (M.backlog[e][p] || M.rem[e][p] || M.link[e][other(e, p)].data.len ||
                            (M.ep[e].peer[p].flags &
                             (DW_CREDIT_F_REQ | DW_CREDIT_F_RESP | DW_CREDIT_F_BLOCKED)))
                                return false;
        }
        return true;
}

static void dump(void)
{
        for (uint32_t e = 0; e < nep(); e++) {
                struct dw_credit *X = &M.ep[e];
                fprintf(stderr, "ep %u: head %u tail %u avail %u nun %u q_head %d\n", e, X->head,
                        X->tail, X->available, M.nun[e], (int)X->q_head);
                for (uint32_t p = 0; p < npeers_of(e); p++) {
                        struct dw_credit_view v;
                        const struct dw_credit_peer *r = &X->peer[p];
                        dw_credit_view(X, p, &v);
                        fprintf(stderr,
                                "  peer %u: tx cr %u lim %u used %u skip %u | rx gr %u arr %u "
                                "ret %u skip %u cur %u retr %u pb %u int %u thr %u act %d fl %x "
                                "cr_used %u | backlog %u rem %u data %u cred %u\n",
                                p, v.tx_credits, r->tx_limit, r->tx_used, r->tx_skip, r->rx_granted,
                                r->rx_arrived, r->rx_retired, r->rx_skip, v.rx_current,
                                r->retrieved, M.ep[e].dyn ? M.ep[e].dyn[p].piggybacked : 0,
                                r->intended, v.threshold, v.act, r->flags, r->cr_used,
                                M.backlog[e][p], M.rem[e][p], M.link[e][other(e, p)].data.len,
                                M.link[e][other(e, p)].cred.len);
                }
        }
}

/* Runs one schedule; returns false on a deadlock (the drain did not end). */
static bool run_schedule(void)
{
        for (uint32_t i = 0; i < M.p.steps; i++) {
                if (M.p.phase && i % M.p.phase == 0)
                        set_phase();
                step();
        }
        /* Stop generating: everything queued must still get through. */
        for (uint32_t i = 0; i < 100000; i++) {
                if (drained()) {
                        cr_assert_eq(M.delivered, M.generated);
                        return true;
                }
                sweep();
        }
        if (trace())
                dump();
        return false;
}

static void random_params(struct mparams *p, enum dw_credit_mode mode)
{
        memset(p, 0, sizeof(*p));
        p->mode = mode;
        p->ns = 1 + below(MAXS);
        p->cs = 1 + below(5);
        if (mode == DW_CREDIT_STATIC) {
                uint32_t q = 1 + below(40);
                p->ring = p->ns * q + below(p->ns); /* leftover slots stay unused */
                p->sring = 1 + below(16);
        } else {
                p->minq = chance(50) ? 0 : 1 + below(3);
                uint32_t fl = p->minq ? p->minq : p->cs;
                p->ring = p->ns * (fl + below(chance(30) ? 1 : 24)) + below(p->ns);
                if (chance(20))
                        p->maxq = p->ring / p->ns + 1 + below(p->ring);
                p->sring = fl + below(12);
        }
        p->msgmax = 1 + below(chance(50) ? 4 : 40);
        p->piece = 1 + below(8);
        p->w_gen = 2 + below(10);
        p->w_send = 5 + below(20);
        p->w_ctl = 2 + below(10);
        p->w_data = 5 + below(20);
        p->w_cred = 1 + below(10);
        p->w_consume = 1 + below(10);
        p->w_release = 1 + below(20); /* the consumer's rate */
        p->reply_pct = chance(50) ? 0 : below(40);
        p->cr_reorder = chance(50);
        p->cr_dup = chance(30) ? below(30) : 0;
        p->piggyback = chance(60);
        p->fifo_release = chance(30);
        if (chance(60)) {
                p->w_ack = 1 + below(5);
                p->w_ackdel = 1 + below(5);
                p->ack_loss = below(50);
                p->ack_dup = below(30);
        }
        p->steps = 150 + below(800);
        p->phase = chance(60) ? 50 + below(300) : 0;
}

struct summary {
        uint64_t schedules, steps, generated, credit_msgs, piggybacks, merged, thesis_merged,
            thesis_runs, requests, responses, steals, stalls;
};

static bool run_many_whole, run_many_ctl_free;

static void run_many(enum dw_credit_mode mode, uint32_t n, uint64_t seed, struct summary *sum)
{
        struct mparams p;
        memset(sum, 0, sizeof(*sum));
        const char *from = getenv("DIWARP_CREDIT_FROM");
        for (uint32_t i = from ? (uint32_t)atoi(from) : 0; i < n; i++) {
                rng_state = seed + 0x9E3779B97F4A7C15ull * (i + 1);
                random_params(&p, mode);
                if (run_many_whole) {
                        uint32_t fl = p.minq ? p.minq : p.cs;
                        p.whole = true;
                        p.msgmax = 1 + below(fl);
                        p.ctl_free = run_many_ctl_free;
                }
                /* One schedule in five keeps the thesis's conditions: credit
                 * messages in order, no piggyback, no ACK-borne values. */
                bool thesis = i % 5 == 0;
                if (thesis) {
                        p.cr_reorder = p.piggyback = false;
                        p.cr_dup = 0;
                        p.w_ack = p.w_ackdel = 0;
                }
                model_init(&p);
                bool ok = run_schedule();
                cr_assert(ok,
                          "schedule %u (seed %llu) deadlocked: mode %d ns %u ring %u cs %u "
                          "minq %u maxq %u",
                          i, (unsigned long long)seed, mode, p.ns, p.ring, p.cs, p.minq, p.maxq);
                sum->schedules++;
                sum->steps += M.steps;
                sum->generated += M.generated;
                for (uint32_t e = 0; e < nep(); e++) {
                        const struct dw_credit_stats *st = &M.ep[e].stats;
                        sum->credit_msgs += st->credit_msgs;
                        sum->piggybacks += st->piggybacks;
                        sum->merged += st->cr_merged;
                        sum->requests += st->requests;
                        sum->responses += st->responses;
                        sum->steals += st->steals;
                        sum->stalls += st->tx_stalls;
                        if (thesis)
                                sum->thesis_merged += st->cr_merged;
                }
                sum->thesis_runs += thesis;
                model_fini();
        }
        if (trace())
                fprintf(stderr,
                        "credit %s: %llu schedules, %llu steps, %llu messages, %llu credit msgs, "
                        "%llu piggybacks, %llu merges (%llu in %llu thesis-condition runs), "
                        "%llu requests, %llu responses, %llu steals, %llu stalls\n",
                        mode == DW_CREDIT_STATIC ? "static" : "dynamic",
                        (unsigned long long)sum->schedules, (unsigned long long)sum->steps,
                        (unsigned long long)sum->generated, (unsigned long long)sum->credit_msgs,
                        (unsigned long long)sum->piggybacks, (unsigned long long)sum->merged,
                        (unsigned long long)sum->thesis_merged,
                        (unsigned long long)sum->thesis_runs, (unsigned long long)sum->requests,
                        (unsigned long long)sum->responses, (unsigned long long)sum->steals,
                        (unsigned long long)sum->stalls);
}

Test(credit_property, static_protocol, .timeout = 60)
{
        struct summary s;
        run_many(DW_CREDIT_STATIC, 1000, 0x57A71C, &s);
        cr_assert_gt(s.stalls, 0, "the schedules do run out of credits");
        cr_assert_gt(s.credit_msgs, 0);
        cr_assert_gt(s.piggybacks, 0);
        /* Eq. 5.1 keeps the credit region within credit_slots under the
         * thesis's conditions. */
        cr_assert_eq(s.thesis_merged, 0);
}

/* Dynamic as RD runs it: messages that cannot be cut (Send segments), each
 * taking up to the floor at once, and compulsory requests and responses
 * outside the ring. No schedule stalls for ever, although a sender may be
 * left holding fewer credits than its next message needs, or have all of
 * them in flight when a request comes. */
Test(credit_property, dynamic_protocol_whole_messages, .timeout = 60)
{
        struct summary s;
        run_many_whole = run_many_ctl_free = true;
        run_many(DW_CREDIT_DYNAMIC, 1000, 0x3A01E5, &s);
        run_many_whole = run_many_ctl_free = false;
        cr_assert_gt(s.stalls, 0);
        cr_assert_gt(s.requests, 0);
        cr_assert_eq(s.requests, s.responses, "every request answered");
}

Test(credit_property, dynamic_protocol, .timeout = 60)
{
        struct summary s;
        run_many(DW_CREDIT_DYNAMIC, 1000, 0xD1A4A1C, &s);
        cr_assert_gt(s.stalls, 0);
        cr_assert_gt(s.steals, 0, "quotas moved");
        cr_assert_gt(s.requests, 0, "compulsory returns happened");
        cr_assert_eq(s.requests, s.responses, "every request answered");
}

/* The dynamic protocol's adaptive range, reclaiming idle senders and their
 * return, on one deterministic schedule: 8 senders share a
 * ring of 16 slots each. When only one stays active it ends up with every slot
 * but the others' floors, the idle ones end at the floor and give back what
 * they held above it (compulsory return); when they all come back they take
 * quota back. */
Test(credit_dynamic, one_active_sender_takes_the_ring_and_idle_ones_come_back, .timeout = 60)
{
        struct mparams p = {
            .mode = DW_CREDIT_DYNAMIC,
            .ns = 8,
            .ring = 8 * 16,
            .cs = 2,
            .sring = 8,
            .msgmax = 8,
            .piece = 8,
            .w_gen = 10,
            .w_send = 20,
            .w_ctl = 10,
            .w_data = 20,
            .w_cred = 10,
            .w_consume = 10,
            .w_release = 20,
        };
        struct dw_credit_view v;
        const uint32_t fl = 2, max = 8 * 16 - 7 * fl;

        rng_state = 0xC4ED17;
        model_init(&p);
        for (int i = 0; i < 4000; i++) /* everybody sends */
                step();
        for (uint32_t s = 2; s <= 8; s++)
                M.active[s] = false;
        uint32_t monitoring = 0;
        for (int i = 0; i < 60000; i++) {
                step();
                cr_assert_eq(dw_credit_view(&M.ep[0], 0, &v), 0);
                if (v.intended == max) {
                        monitoring = i;
                        break;
                }
        }
        cr_assert_eq(v.intended, max, "the active sender's quota reaches the maximum (%u)",
                     v.intended);
        /* Let the compulsory returns complete. */
        for (int i = 0; i < 4000; i++)
                step();
        for (uint32_t s = 1; s < 8; s++) {
                cr_assert_eq(dw_credit_view(&M.ep[0], s, &v), 0);
                cr_assert_eq(v.intended, fl, "idle sender %u at the floor", s + 1);
                cr_assert_leq(v.rx_current, fl, "idle sender %u gave back its credits (%u)", s + 1,
                              v.rx_current);
        }
        cr_assert_gt(M.ep[0].stats.requests, 0);
        /* Everybody again: each idle one takes quota back (a sender in NULL
         * is treated as HIGH at its monitoring points and steals). */
        for (uint32_t s = 2; s <= 8; s++)
                M.active[s] = true;
        uint32_t most[8] = {0};
        for (int i = 0; i < 30000; i++) {
                step();
                for (uint32_t s = 1; s < 8; s++)
                        if (M.ep[0].peer[s].intended > most[s])
                                most[s] = M.ep[0].peer[s].intended;
        }
        for (uint32_t s = 1; s < 8; s++)
                cr_assert_gt(most[s], fl, "sender %u took quota back", s + 1);
        cr_assert(run_schedule());
        if (trace())
                fprintf(stderr, "one active sender: maximum quota after %u steps\n", monitoring);
        model_fini();
}

/* With no dynamic region (every sender at its floor) the
 * dynamic protocol behaves as the static one with the same ring: the same
 * seeded schedule gives the same credit messages, stalls and deliveries. */
Test(credit_dynamic, no_dynamic_region_behaves_as_static)
{
        for (uint32_t run = 0; run < 20; run++) {
                uint64_t st[2][4];
                for (int m = 0; m < 2; m++) {
                        struct mparams p = {
                            .mode = m ? DW_CREDIT_DYNAMIC : DW_CREDIT_STATIC,
                            .ns = 1 + run % 8,
                            .cs = 1 + run % 3,
                            .msgmax = 6,
                            .piece = 3,
                            .w_gen = 5,
                            .w_send = 20,
                            .w_ctl = 10,
                            .w_data = 20,
                            .w_cred = 10,
                            .w_consume = 10,
                            .w_release = 10,
                            .steps = 2000,
                        };
                        p.ring = p.ns * p.cs;
                        p.sring = p.cs;
                        rng_state = 0xE0 + run;
                        model_init(&p);
                        cr_assert(run_schedule());
                        const struct dw_credit_stats *s = &M.ep[0].stats;
                        st[m][0] = s->credit_msgs;
                        st[m][1] = M.ep[1].stats.tx_stalls;
                        st[m][2] = M.delivered;
                        st[m][3] = M.steps;
                        cr_assert_eq(s->requests, 0);
                        model_fini();
                }
                for (int k = 0; k < 4; k++)
                        cr_assert_eq(st[0][k], st[1][k],
                                     "run %u, measure %d: static %llu dynamic %llu", run, k,
                                     (unsigned long long)st[0][k], (unsigned long long)st[1][k]);
        }
}
