/* RD reliability sublayer: RFC 6298 arithmetic, SACK encoding (also across
 * PSN wrap-around), duplicate suppression, fast retransmit, ACK coalescing,
 * RNR, retry limit and silent-peer bound, and two peers exchanging messages
 * through a simulated lossy, duplicating, reordering channel. */
#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rel/rel.h"
#include "wire/dgram.h"

#define US 1000ull
#define MS 1000000ull
#define T0 (1000 * MS) /* simulations start at 1 s so 0 never means "now" */

/* ------------------------------------------------------------ helpers */

struct cc_rec;

struct rec {
        unsigned nacked, nretx, nacks;
        uint32_t acked_psn[256];
        uint64_t acked_cookie[256];
        uint32_t retx_psn[256];
        uint64_t retx_cookie[256];
        uint64_t retx_at[256];
        uint64_t now;
        int retx_rc;
        struct dw_rel_peer *peer; /* for send_ack */
        struct cc_rec *cc;
};

static void rec_acked(void *ctx, uint32_t psn, uint64_t cookie)
{
        struct rec *r = ctx;
        if (r->nacked < 256) {
                r->acked_psn[r->nacked] = psn;
                r->acked_cookie[r->nacked] = cookie;
        }
        r->nacked++;
}

static int rec_retx(void *ctx, uint32_t psn, uint64_t cookie)
{
        struct rec *r = ctx;
        if (r->retx_rc)
                return r->retx_rc;
        if (r->nretx < 256) {
                r->retx_psn[r->nretx] = psn;
                r->retx_cookie[r->nretx] = cookie;
                r->retx_at[r->nretx] = r->now;
        }
        r->nretx++;
        return 0;
}

static int rec_send_ack(void *ctx)
{
        struct rec *r = ctx;
        struct dw_dgram_hdr h = {0};
        r->nacks++;
        return dw_rel_build_ack(r->peer, &h, DW_DGRAM_MAX_SACK) < 0 ? -EINVAL : 0;
}

static const struct dw_rel_ops rec_ops = {
    .acked = rec_acked, .retransmit = rec_retx, .send_ack = rec_send_ack};

static struct dw_dgram_hdr ack_hdr(uint32_t ack, unsigned n, const uint32_t *blocks)
{
        struct dw_dgram_hdr h;
        memset(&h, 0, sizeof(h));
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK | (n ? DW_DGRAM_F_SACK : 0);
        h.ack_psn = ack;
        h.sack_count = (uint8_t)n;
        for (unsigned i = 0; i < n; i++) {
                h.sack[i].start = blocks[2 * i];
                h.sack[i].end = blocks[2 * i + 1];
        }
        return h;
}

/* Encodes and decodes h: every header rel builds must pass the wire rules. */
static void wire_roundtrip(const struct dw_dgram_hdr *h, struct dw_dgram_hdr *out)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        const char *why = NULL;
        ssize_t n = dw_dgram_encode(h, buf, sizeof(buf));
        cr_assert_gt(n, 0, "encode refused the header: %zd", n);
        ssize_t m = dw_dgram_decode(buf, (size_t)n, out, &why);
        cr_assert_eq(m, n, "decode: %zd (%s)", m, why ? why : "");
}

static struct dw_rel_params test_params(void)
{
        struct dw_rel_params p;
        dw_rel_params_default(&p);
        return p;
}

/* --------------------------------------------------------------- params */

Test(rel, params_defaults_and_check)
{
        struct dw_rel_params p = test_params();
        const char *why = NULL;
        cr_assert_eq(dw_rel_params_check(&p, &why), 0);
        p.window = 96;
        cr_assert_eq(dw_rel_params_check(&p, &why), -EINVAL);
        cr_assert_not_null(why);
        p = test_params();
        p.rto_min_us = p.rto_init_us + 1;
        cr_assert_eq(dw_rel_params_check(&p, &why), -EINVAL);
        p = test_params();
        p.rto_max_us = 5000000;
        cr_assert_eq(dw_rel_params_check(&p, &why), -EINVAL);

        struct dw_rel_peer r;
        struct dw_rel_txent ring[256];
        p = test_params();
        cr_assert_eq(dw_rel_peer_init(&r, &p, ring, 256, 0, 0), -EINVAL);
        cr_assert_eq(dw_rel_peer_init(&r, &p, ring, 48, 0, 0), -EINVAL);
        cr_assert_eq(dw_rel_peer_init(&r, &p, ring, 128, 0, 0), 0);
}

/* ------------------------------------------------------------- RFC 6298 */

Test(rel, rtt_rfc6298_hand_computed)
{
        struct dw_rel_params p = test_params();
        p.rto_min_us = 1;
        p.rto_init_us = 1000;
        p.rto_max_us = 4000000;
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        cr_assert_eq(dw_rel_peer_init(&r, &p, ring, 8, 0, 0), 0);
        cr_assert_eq(dw_rel_rto_ns(&r), 1000 * US, "(2.1) initial RTO");

        dw_rel_rtt_sample(&r, 100 * US); /* (2.2): SRTT=R, RTTVAR=R/2 */
        cr_assert_eq(r.srtt_ns, 100000);
        cr_assert_eq(r.rttvar_ns, 50000);
        cr_assert_eq(r.rto_ns, 300000); /* 100000 + 4*50000 */

        dw_rel_rtt_sample(&r, 200 * US);  /* (2.3) */
        cr_assert_eq(r.rttvar_ns, 62500); /* 3/4*50000 + 1/4*|100000-200000| */
        cr_assert_eq(r.srtt_ns, 112500);  /* 7/8*100000 + 1/8*200000 */
        cr_assert_eq(r.rto_ns, 362500);

        dw_rel_rtt_sample(&r, 50 * US);
        cr_assert_eq(r.rttvar_ns, 62500); /* 3/4*62500 + 1/4*62500 */
        cr_assert_eq(r.srtt_ns, 104687);  /* (7*112500 + 50000)/8 = 104687.5 */
        cr_assert_eq(r.rto_ns, 354687);

        dw_rel_rtt_sample(&r, 10 * MS);
        cr_assert_eq(r.rttvar_ns, 2520703); /* (3*62500 + 9895313)/4 */
        cr_assert_eq(r.srtt_ns, 1341601);   /* (7*104687 + 10000000)/8 */
        cr_assert_eq(r.rto_ns, 11424413);

        /* Constant RTT: RTTVAR decays to 0 and the clock granularity G is the floor. */
        for (int i = 0; i < 200; i++)
                dw_rel_rtt_sample(&r, 100 * US);
        cr_assert_eq(r.srtt_ns, 100000);
        cr_assert_eq(r.rttvar_ns, 0);
        cr_assert_eq(r.rto_ns, 100000 + DW_REL_CLOCK_G_NS);
}

Test(rel, rtt_min_max_clamp)
{
        struct dw_rel_params p = test_params();
        p.rto_min_us = 1000;
        p.rto_init_us = 1000;
        p.rto_max_us = 200000;
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        dw_rel_peer_init(&r, &p, ring, 8, 0, 0);
        dw_rel_rtt_sample(&r, 100 * US);
        cr_assert_eq(r.rto_ns, 1 * MS, "(2.4) RTO below the minimum is rounded up");
        dw_rel_peer_init(&r, &p, ring, 8, 0, 0);
        dw_rel_rtt_sample(&r, 300 * MS);
        cr_assert_eq(r.srtt_ns, 200 * MS, "samples are clamped to rto_max");
        cr_assert_eq(r.rto_ns, 200 * MS, "(2.5) maximum");
}

/* Timer backoff doubles (5.5), is capped at rto_max, and the retry limit ends
 * in -ETIMEDOUT when the channel drops everything. */
Test(rel, rto_backoff_and_retry_limit)
{
        struct dw_rel_params p = test_params();
        p.rto_init_us = 1000;
        p.rto_min_us = 1000;
        p.rto_max_us = 16000;
        p.retry_limit = 5;
        p.peer_timeout_ms = 0;
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        rc.peer = &r;
        dw_rel_peer_init(&r, &p, ring, 8, 77, 0);
        cr_assert(dw_rel_tx_can_send(&r, T0));
        cr_assert_eq(dw_rel_tx_sent(&r, 77, 0xC0FFEE, T0), 0);

        uint64_t expect[] = {1, 3, 7, 15, 31}; /* ms after T0: 1, +2, +4, +8, +16 (cap) */
        int rcode = 0;
        for (int guard = 0; guard < 100; guard++) {
                uint64_t d = dw_rel_next_deadline(&r);
                cr_assert_neq(d, UINT64_MAX);
                rc.now = d;
                rcode = dw_rel_timers(&r, d, &rec_ops, &rc);
                if (rcode)
                        break;
        }
        cr_assert_eq(rcode, -ETIMEDOUT);
        cr_assert_eq(r.fatal_reason, DW_REL_RETRY_EXCEEDED);
        cr_assert_eq(rc.nretx, 5, "exactly retry_limit retransmissions, got %u", rc.nretx);
        for (int i = 0; i < 5; i++) {
                cr_assert_eq(rc.retx_psn[i], 77);
                cr_assert_eq(rc.retx_at[i], T0 + expect[i] * MS, "retransmission %d at %llu", i,
                             (unsigned long long)(rc.retx_at[i] - T0));
        }
        cr_assert_eq(rc.now, T0 + 47 * MS, "fatal at the 6th expiry (31 + 16 ms)");
        /* Stays fatal; nothing more is sent. */
        cr_assert_eq(dw_rel_timers(&r, rc.now + 1 * MS, &rec_ops, &rc), -ETIMEDOUT);
        cr_assert_not(dw_rel_tx_can_send(&r, rc.now + 1 * MS));
        cr_assert_eq(dw_rel_tx_sent(&r, 78, 0, rc.now), -ETIMEDOUT);
        cr_assert_eq(rc.nretx, 5);
        cr_assert_str_eq(dw_rel_fatal_str(&r), "retransmission retry limit exceeded");
}

/* Default parameters, dead peer: fatal at DIWARP_PEER_TIMEOUT_MS, not at the
 * 13th RTO expiry (3.6 s here, 2 s after µs RTT samples): a peer whose
 * program was not scheduled or progressed that long is not gone. */
Test(rel, dead_peer_defaults_bounded)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer r;
        struct dw_rel_txent ring[128];
        struct rec rc = {0};
        rc.peer = &r;
        dw_rel_peer_init(&r, &p, ring, 128, 0, 0);
        for (uint32_t i = 0; i < 10; i++)
                cr_assert_eq(dw_rel_tx_sent(&r, i, i, T0), 0);
        int rcode = 0;
        while (!rcode) {
                rc.now = dw_rel_next_deadline(&r);
                rcode = dw_rel_timers(&r, rc.now, &rec_ops, &rc);
        }
        cr_assert_eq(rcode, -ETIMEDOUT);
        cr_assert_eq(r.fatal_reason, DW_REL_PEER_TIMEOUT);
        cr_assert_eq(rc.now - T0, (uint64_t)p.peer_timeout_ms * MS);
        /* 5+10+20+40+80+160+320 ms then 500 ms: 15 expiries by 5 s. */
        cr_assert_eq(r.stats.rto_expiries, 15, "expiries %u", r.stats.rto_expiries);
        cr_assert_gt(r.retries, p.retry_limit);
}

Test(rel, peer_vanished_bound)
{
        struct dw_rel_params p = test_params();
        p.rto_max_us = 10000;
        p.retry_limit = 255;
        p.peer_timeout_ms = 100;
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        rc.peer = &r;
        dw_rel_peer_init(&r, &p, ring, 8, 0, 0);
        /* Idle peers never time out. */
        cr_assert_eq(dw_rel_timers(&r, T0 + 10000 * MS, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_next_deadline(&r), UINT64_MAX);

        cr_assert_eq(dw_rel_tx_sent(&r, 0, 0, T0), 0);
        int rcode = 0;
        while (!rcode) {
                rc.now = dw_rel_next_deadline(&r);
                rcode = dw_rel_timers(&r, rc.now, &rec_ops, &rc);
        }
        cr_assert_eq(rcode, -ETIMEDOUT);
        cr_assert_eq(r.fatal_reason, DW_REL_PEER_TIMEOUT);
        cr_assert_eq(rc.now, T0 + 100 * MS);
        cr_assert_gt(rc.nretx, 5);
}

/* Karn: no sample from a retransmitted packet, and the backoff stays until a
 * packet sent once is acknowledged. */
Test(rel, karn_rule)
{
        struct dw_rel_params p = test_params();
        p.rto_init_us = 1000;
        p.rto_min_us = 1;
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        rc.peer = &r;
        dw_rel_peer_init(&r, &p, ring, 8, 0, 0);
        dw_rel_tx_sent(&r, 0, 0, T0);
        rc.now = T0 + 1 * MS;
        cr_assert_eq(dw_rel_timers(&r, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 1);
        struct dw_dgram_hdr h = ack_hdr(1, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&r, &h, T0 + 1 * MS + 30 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacked, 1);
        cr_assert_not(r.flags & DW_REL_F_HAVE_RTT, "no RTT sample from a retransmission");
        cr_assert_eq(dw_rel_rto_ns(&r), 2 * MS, "backoff kept");
        cr_assert_eq(r.rto_deadline, 0, "nothing outstanding: timer stopped");

        dw_rel_tx_sent(&r, 1, 1, T0 + 2 * MS);
        h = ack_hdr(2, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&r, &h, T0 + 2 * MS + 30 * US, &rec_ops, &rc), 0);
        cr_assert(r.flags & DW_REL_F_HAVE_RTT);
        cr_assert_eq(r.srtt_ns, 30000);
        cr_assert_eq(r.backoff, 0);
        cr_assert_eq(dw_rel_rto_ns(&r), 30000 + 4 * 15000);
}

/* ------------------------------------------------------- receive / SACK */

Test(rel, duplicate_suppression)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        enum dw_rel_verdict v;
        dw_rel_peer_init(&r, &p, ring, 8, 0, 1000);

        cr_assert_eq(dw_rel_rx_data(&r, 1000, false, T0, &v), 1);
        cr_assert_eq(v, DW_REL_NEW);
        cr_assert_eq(dw_rel_rx_data(&r, 1001, false, T0, &v), 1);
        cr_assert_eq(dw_rel_rx_data(&r, 1000, false, T0, &v), 0);
        cr_assert_eq(v, DW_REL_DUPLICATE);
        cr_assert_eq(dw_rel_rx_data(&r, 1005, false, T0, &v), 0);
        cr_assert_eq(v, DW_REL_NEW);
        cr_assert_eq(dw_rel_rx_classify(&r, 1005), DW_REL_DUPLICATE);
        cr_assert_eq(dw_rel_rx_data(&r, 1005, false, T0, &v), 0);
        cr_assert_eq(v, DW_REL_DUPLICATE);
        cr_assert_eq(dw_rel_rx_classify(&r, 1004), DW_REL_NEW, "classify changes nothing");
        cr_assert_eq(dw_rel_rx_classify(&r, 1004), DW_REL_NEW);
        cr_assert_eq(dw_rel_rx_classify(&r, 1002 + 127), DW_REL_NEW);
        cr_assert_eq(dw_rel_rx_data(&r, 1002 + 128, false, T0, &v), 0);
        cr_assert_eq(v, DW_REL_OUT_OF_WINDOW);
        cr_assert_eq(dw_rel_rx_data(&r, 1002 - 100000, false, T0, &v), 0);
        cr_assert_eq(v, DW_REL_DUPLICATE);
        cr_assert_eq(r.stats.rx_dup, 3);
        cr_assert_eq(r.stats.rx_oow, 1);
        /* Filling the holes advances the cursor over the stored PSN. */
        cr_assert_eq(dw_rel_rx_data(&r, 1003, false, T0, &v), 0);
        cr_assert_eq(dw_rel_rx_data(&r, 1004, false, T0, &v), 0);
        cr_assert_eq(dw_rel_rx_data(&r, 1002, false, T0, &v), 4);
        cr_assert_eq(dw_rel_rx_cursor(&r), 1006);
        cr_assert_eq(r.rx_map[0] | r.rx_map[1], 0);
        /* Every PSN of a long run is new exactly once. */
        for (uint32_t i = 0; i < 1000; i++) {
                uint32_t psn = 1006 + (i ^ 1); /* pairwise swapped */
                dw_rel_rx_data(&r, psn, false, T0, &v);
                cr_assert_eq(v, DW_REL_NEW);
                dw_rel_rx_data(&r, psn, false, T0, &v);
                cr_assert_eq(v, DW_REL_DUPLICATE);
        }
        cr_assert_eq(dw_rel_rx_cursor(&r), 2006);
}

/* ACK + SACK across 2^32: ack_psn 0xFFFFFFFE, blocks [0xFFFFFFFF, 2) and [3, 16). */
Test(rel, sack_wraparound)
{
        struct dw_rel_params p = test_params();
        const uint32_t isn = 0xFFFFFFF0u;
        struct dw_rel_peer rx, tx;
        struct dw_rel_txent rxring[8], ring[32];
        enum dw_rel_verdict v;
        dw_rel_peer_init(&rx, &p, rxring, 8, 0, isn);
        dw_rel_peer_init(&tx, &p, ring, 32, isn, 0);

        for (uint32_t i = 0; i < 32; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, isn + i, i, T0), 0);
        for (uint32_t i = 0; i < 32; i++) {
                uint32_t psn = isn + i;
                if (psn == 0xFFFFFFFEu || psn == 2)
                        continue;
                dw_rel_rx_data(&rx, psn, false, T0 + 10 * US, &v);
                cr_assert_eq(v, DW_REL_NEW);
        }
        cr_assert_eq(dw_rel_rx_cursor(&rx), 0xFFFFFFFEu);
        struct dw_dgram_hdr h = {0}, d;
        cr_assert_eq(dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK), 2);
        wire_roundtrip(&h, &d);
        cr_assert_eq(d.ack_psn, 0xFFFFFFFEu);
        cr_assert_eq(d.sack_count, 2);
        cr_assert_eq(d.sack[0].start, 0xFFFFFFFFu);
        cr_assert_eq(d.sack[0].end, 2);
        cr_assert_eq(d.sack[1].start, 3);
        cr_assert_eq(d.sack[1].end, 16);

        struct rec rc = {0};
        rc.peer = &tx;
        rc.now = T0 + 20 * US;
        cr_assert_eq(dw_rel_on_ack(&tx, &d, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacked, 30);
        cr_assert_eq(tx.snd_una, 0xFFFFFFFEu);
        cr_assert_eq(tx.sack_high, 16);
        cr_assert_eq(tx.srtt_ns, 20000, "RTT sampled (newest packet above the old sack_high)");
        /* Both holes have ≥ 3 SACKed PSNs above them. */
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 2);
        cr_assert_eq(rc.retx_psn[0], 0xFFFFFFFEu);
        cr_assert_eq(rc.retx_psn[1], 2);
        /* The retransmissions arrive: everything acked, the window is empty. */
        dw_rel_rx_data(&rx, 0xFFFFFFFEu, false, rc.now, &v);
        cr_assert_eq(dw_rel_rx_data(&rx, 2, false, rc.now, &v), 14);
        memset(&h, 0, sizeof(h));
        cr_assert_eq(dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK), 0);
        wire_roundtrip(&h, &d);
        cr_assert_eq(d.ack_psn, 16);
        cr_assert_eq(dw_rel_on_ack(&tx, &d, rc.now + 20 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacked, 32);
        cr_assert_eq(dw_rel_tx_inflight(&tx), 0);
        cr_assert_eq(tx.rto_deadline, 0);
}

/* More runs than blocks: the 8 lowest, so the blocks describe every hole
 * below the last one (a higher run reported alone would make the runs between
 * look lost). */
Test(rel, sack_block_selection)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer rx;
        struct dw_rel_txent ring[8];
        enum dw_rel_verdict v;
        dw_rel_peer_init(&rx, &p, ring, 8, 0, 100);
        for (uint32_t psn = 102; psn <= 140; psn += 2)
                dw_rel_rx_data(&rx, psn, false, T0, &v);
        dw_rel_rx_data(&rx, 100 + 127, false, T0, &v); /* edge of the window */
        struct dw_dgram_hdr h = {0}, d;
        cr_assert_eq(dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK), 8);
        wire_roundtrip(&h, &d);
        cr_assert_eq(d.ack_psn, 100);
        for (int i = 0; i < 8; i++) {
                cr_assert_eq(d.sack[i].start, 102 + 2 * (uint32_t)i);
                cr_assert_eq(d.sack[i].end, 103 + 2 * (uint32_t)i);
        }
        /* A limit (room left in a data packet) is honoured. */
        memset(&h, 0, sizeof(h));
        cr_assert_eq(dw_rel_build_ack(&rx, &h, 2), 2);
        cr_assert_eq(h.sack[0].start, 102);
        cr_assert_eq(h.sack[1].start, 104);
        memset(&h, 0, sizeof(h));
        cr_assert_eq(dw_rel_build_ack(&rx, &h, 0), 0);
        cr_assert_eq(h.flags & DW_DGRAM_F_SACK, 0);
        /* A run touching the window's end, rotated across the bitmap words. */
        dw_rel_peer_init(&rx, &p, ring, 8, 0, 0xFFFFFFC0u);
        for (uint32_t i = 1; i < 128; i++)
                dw_rel_rx_data(&rx, 0xFFFFFFC0u + i, false, T0, &v);
        memset(&h, 0, sizeof(h));
        cr_assert_eq(dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK), 1);
        wire_roundtrip(&h, &d);
        cr_assert_eq(d.sack[0].start, 0xFFFFFFC1u);
        cr_assert_eq(d.sack[0].end, 0xFFFFFFC0u + 128);
        /* A NAK header cannot also carry an ACK. */
        dw_rel_build_rnr_nak(&h, 5, 0);
        cr_assert_eq(dw_rel_build_ack(&rx, &h, 8), -EINVAL);
}

Test(rel, ack_rejects_unsent_psns)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        dw_rel_peer_init(&tx, &p, ring, 8, 10, 0);
        for (uint32_t i = 10; i < 14; i++)
                dw_rel_tx_sent(&tx, i, i, T0);
        struct dw_dgram_hdr h = ack_hdr(15, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0, &rec_ops, &rc), -EBADMSG);
        uint32_t b[] = {12, 15};
        h = ack_hdr(11, 1, b);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0, &rec_ops, &rc), -EBADMSG);
        cr_assert_eq(rc.nacked, 0, "nothing changed");
        cr_assert_eq(tx.snd_una, 10);
        /* A stale ACK (behind snd_una) is harmless. */
        h = ack_hdr(12, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0, &rec_ops, &rc), 0);
        h = ack_hdr(11, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacked, 2);
        cr_assert_eq(tx.snd_una, 12);
        /* The window is enforced. */
        for (uint32_t i = 14; i < 20; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, i, i, T0), 0);
        cr_assert_not(dw_rel_tx_can_send(&tx, T0));
        cr_assert_eq(dw_rel_tx_sent(&tx, 20, 0, T0), -EAGAIN);
        cr_assert_eq(dw_rel_tx_sent(&tx, 99, 0, T0), -EINVAL);
}

/* ------------------------------------------------------ fast retransmit */

Test(rel, fast_retransmit_once_per_hole)
{
        struct dw_rel_params p = test_params();
        p.rto_min_us = 1000;
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[16];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 16, 0, 0);
        for (uint32_t i = 0; i < 12; i++)
                dw_rel_tx_sent(&tx, i, i, T0);
        rc.now = T0 + 10 * US;

        /* Two SACKed above the hole at 0: below dupthresh. */
        uint32_t b1[] = {1, 3};
        struct dw_dgram_hdr h = ack_hdr(0, 1, b1);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 0);
        /* The third makes it lost: one retransmission. */
        uint32_t b2[] = {1, 4};
        h = ack_hdr(0, 1, b2);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_next_deadline(&tx), 0, "retransmission due at once");
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 1);
        cr_assert_eq(rc.retx_psn[0], 0);
        /* More SACKs keep naming the hole: no second fast retransmit. */
        uint32_t b3[] = {1, 6};
        h = ack_hdr(0, 1, b3);
        dw_rel_on_ack(&tx, &h, rc.now + 1 * US, &rec_ops, &rc);
        dw_rel_timers(&tx, rc.now + 1 * US, &rec_ops, &rc);
        cr_assert_eq(rc.nretx, 1);
        /* A second hole at 6: 2 above (7, 8) is not enough, 3 (7, 8, 9) is. */
        uint32_t b4[] = {1, 6, 7, 9};
        h = ack_hdr(0, 2, b4);
        dw_rel_on_ack(&tx, &h, rc.now + 2 * US, &rec_ops, &rc);
        dw_rel_timers(&tx, rc.now + 2 * US, &rec_ops, &rc);
        cr_assert_eq(rc.nretx, 1);
        uint32_t b5[] = {1, 6, 7, 10};
        h = ack_hdr(0, 2, b5);
        dw_rel_on_ack(&tx, &h, rc.now + 3 * US, &rec_ops, &rc);
        dw_rel_timers(&tx, rc.now + 3 * US, &rec_ops, &rc);
        cr_assert_eq(rc.nretx, 2);
        cr_assert_eq(rc.retx_psn[1], 6);
        uint32_t b6[] = {1, 6, 7, 12};
        h = ack_hdr(0, 2, b6);
        dw_rel_on_ack(&tx, &h, rc.now + 4 * US, &rec_ops, &rc);
        dw_rel_timers(&tx, rc.now + 4 * US, &rec_ops, &rc);
        cr_assert_eq(rc.nretx, 2, "still once per hole");
        cr_assert_eq(tx.stats.fast_retransmits, 2);
        /* If the fast retransmissions are lost too, the tail loss probe (or the
         * RTO) recovers them: it sends one probe (the oldest hole), and the
         * ACK that only the probe got through sends the other hole at once. */
        uint64_t d = dw_rel_next_deadline(&tx);
        rc.now = d;
        cr_assert_eq(dw_rel_timers(&tx, d, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 3, "one probe, not every un-SACKed PSN");
        cr_assert_eq(rc.retx_psn[2], 0);
        cr_assert_eq(tx.stats.tail_probes, 1, "2 SRTT + ACK delay, before the RTO");
        cr_assert_eq(tx.stats.rto_expiries, 0);
        uint32_t b7[] = {7, 12};
        h = ack_hdr(6, 1, b7);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now + 20 * US, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_next_deadline(&tx), 0, "the other hole is due at once");
        /* Back-pressure from the socket leaves it pending. */
        rc.retx_rc = -ENOBUFS;
        cr_assert_eq(dw_rel_timers(&tx, rc.now + 20 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 3);
        cr_assert_eq(dw_rel_next_deadline(&tx), 0);
        rc.retx_rc = 0;
        cr_assert_eq(dw_rel_timers(&tx, rc.now + 21 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 4);
        cr_assert_eq(rc.retx_psn[3], 6);
        cr_assert_eq(tx.stats.retransmits, 4);
}

/* ------------------------------------------------------------- lanes */

/* dw_rel_tx_rename: only an outstanding PSN, only lanes 0..3; later
 * callbacks name the packet by its new cookie. */
Test(rel, tx_rename_outstanding_only)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[16];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 16, 50, 0);
        cr_assert_eq(dw_rel_tx_rename(&tx, 50, 7, 0), -EINVAL, "nothing sent yet");
        for (uint32_t i = 0; i < 4; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, 50 + i, i, T0), 0);
        cr_assert_eq(dw_rel_tx_rename(&tx, 50, 0xA0, DW_REL_MAX_LANES), -EINVAL, "lane 4");
        cr_assert_eq(dw_rel_tx_rename(&tx, 50, 0xA0, 99), -EINVAL);
        cr_assert_eq(dw_rel_tx_rename(&tx, 54, 0xA4, 0), -EINVAL, "not sent yet");
        cr_assert_eq(dw_rel_tx_rename(&tx, 49, 0xA9, 0), -EINVAL, "before the first PSN");
        cr_assert_eq(dw_rel_tx_rename(&tx, 50, 0xA0, 3), 0);
        cr_assert_eq(dw_rel_tx_rename(&tx, 53, 0xA3, 1), 0);
        struct dw_dgram_hdr h = ack_hdr(52, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0 + 10 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacked, 2);
        cr_assert_eq(rc.acked_psn[0], 50);
        cr_assert_eq(rc.acked_cookie[0], 0xA0, "acked under its new name");
        cr_assert_eq(rc.acked_cookie[1], 1, "a packet not renamed keeps its cookie");
        cr_assert_eq(dw_rel_tx_rename(&tx, 51, 0xA1, 0), -EINVAL, "already acknowledged");
        cr_assert_eq(dw_rel_tx_rename(&tx, 52, 0xA2, 2), 0);
        h = ack_hdr(54, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0 + 20 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacked, 4);
        cr_assert_eq(rc.acked_cookie[2], 0xA2);
        cr_assert_eq(rc.acked_cookie[3], 0xA3);
        cr_assert_eq(dw_rel_tx_rename(&tx, 53, 0xA3, 0), -EINVAL, "nothing outstanding");
        /* A receive-only peer has no ring. */
        struct dw_rel_peer rx;
        dw_rel_peer_init(&rx, &p, NULL, 8, 0, 0);
        cr_assert_eq(dw_rel_tx_rename(&rx, 0, 1, 0), -EINVAL);
}

/* 12 packets 0..11, even PSNs on lane `even`, odd ones on lane `odd`,
 * renamed 0x100 + psn. Then an ACK holding only the odd PSNs (6 SACKed
 * above the hole at 0, twice dupthresh), then one holding 1..7 and the odd
 * PSNs above: 2, 4, 6 SACKed above the hole. Returns the recorder after
 * the timers ran once after each ACK; *after_first: retransmissions after
 * the first. */
static struct rec lane_scenario(unsigned even, unsigned odd, unsigned *after_first)
{
        struct dw_rel_params p = test_params();
        p.rto_min_us = 1000;
        cr_assert_eq(p.dupthresh, 3, "the scenario assumes dupthresh 3");
        static struct dw_rel_peer tx;
        static struct dw_rel_txent ring[16];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 16, 0, 0);
        for (uint32_t i = 0; i < 12; i++) {
                cr_assert_eq(dw_rel_tx_sent(&tx, i, i, T0), 0);
                cr_assert_eq(dw_rel_tx_rename(&tx, i, 0x100 + i, (i & 1) ? odd : even), 0);
        }
        rc.now = T0 + 10 * US;
        uint32_t b1[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
        struct dw_dgram_hdr h = ack_hdr(0, 6, b1);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        *after_first = rc.nretx;
        uint32_t b2[] = {1, 8, 9, 10, 11, 12};
        h = ack_hdr(0, 3, b2);
        rc.now += 1 * US;
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        return rc;
}

/* Lanes of different delays reorder: SACKs from another lane above a hole
 * are no evidence of its loss, SACKs from its own lane are. */
Test(rel, fast_retransmit_counts_the_holes_own_lane)
{
        static const unsigned lanes[][2] = {{0, 1}, {1, 0}, {3, 2}};
        for (size_t k = 0; k < sizeof(lanes) / sizeof(lanes[0]); k++) {
                unsigned first;
                struct rec rc = lane_scenario(lanes[k][0], lanes[k][1], &first);
                cr_assert_eq(first, 0, "lanes %u/%u: 6 SACKed on the other lane marked a hole",
                             lanes[k][0], lanes[k][1]);
                /* 2, 4, 6 on the hole's lane: 0 is lost; 8 and 10 have none of
                 * theirs above. */
                cr_assert_eq(rc.nretx, 1, "lanes %u/%u: %u retransmissions", lanes[k][0],
                             lanes[k][1], rc.nretx);
                cr_assert_eq(rc.retx_psn[0], 0);
                cr_assert_eq(rc.retx_cookie[0], 0x100, "the retransmission has the new name");
        }
}

/* Everything on one lane: today's counting, every SACKed PSN above counts. */
Test(rel, fast_retransmit_one_lane_counts_every_sack)
{
        unsigned first;
        struct rec rc = lane_scenario(0, 0, &first);
        /* After the first ACK: 0 (6 above), 2 (5), 4 (4), 6 (3); not 8, 10. */
        cr_assert_eq(first, 4);
        cr_assert_eq(rc.nretx, 4, "once per hole");
        for (uint32_t i = 0; i < 4; i++) {
                cr_assert_eq(rc.retx_psn[i], 2 * i);
                cr_assert_eq(rc.retx_cookie[i], 0x100 + 2 * i);
        }
}

/* A probe held back by local back-pressure (the caller paces its sends) is
 * not a silent network: further RTO expiries while it waits count no retry
 * and do not back off, so the retry limit is not spent without a packet
 * leaving; the silent-peer bound still ends a stream that never gets out. */
Test(rel, rto_while_probe_held_counts_no_retry)
{
        struct dw_rel_params p = test_params();
        p.retry_limit = 2;
        p.peer_timeout_ms = 50;
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 8, 0, 0);
        cr_assert_eq(dw_rel_tx_sent(&tx, 0, 0, T0), 0);
        rc.retx_rc = -EAGAIN;
        uint64_t now = T0;
        for (int i = 0; i < 40; i++) { /* 40 ms: several RTOs (5 ms, 10 ms) */
                now += 1 * MS;
                cr_assert_eq(dw_rel_timers(&tx, now, &rec_ops, &rc), 0, "at %d ms", i + 1);
        }
        cr_assert_eq(tx.stats.rto_expiries, 1, "only the first expiry counts");
        cr_assert_eq(tx.retries, 1);
        cr_assert_eq(tx.backoff, 1);
        rc.retx_rc = 0;
        cr_assert_eq(dw_rel_timers(&tx, now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 1, "the held probe goes once room comes");
        /* Never getting out still ends at the silent-peer bound. */
        rc.retx_rc = -EAGAIN;
        int r = 0;
        for (int i = 0; i < 1000 && r == 0; i++) {
                now += 1 * MS;
                r = dw_rel_timers(&tx, now, &rec_ops, &rc);
        }
        cr_assert_eq(r, -ETIMEDOUT);
        cr_assert_eq(tx.fatal_reason, DW_REL_PEER_TIMEOUT);
}

/* An RTO that fires while the packets were only delayed (the receiver was not
 * scheduled) costs one probe: the ACK holding original packets undoes it. */
Test(rel, spurious_rto_one_probe)
{
        struct dw_rel_params p = test_params();
        p.rto_min_us = 1000;
        p.rto_init_us = 1000;
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[32];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 32, 100, 0);
        for (uint32_t i = 0; i < 32; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, 100 + i, i, T0), 0);
        rc.now = dw_rel_next_deadline(&tx);
        cr_assert_eq(rc.now, T0 + 1 * MS);
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 1, "one probe");
        cr_assert_eq(rc.retx_psn[0], 100);
        cr_assert_eq(dw_rel_rto_ns(&tx), 2 * MS, "backed off");
        /* Everything had arrived: the ACK holds originals. */
        struct dw_dgram_hdr h = ack_hdr(132, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now + 10 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 1);
        cr_assert_eq(dw_rel_tx_inflight(&tx), 0);
        cr_assert_eq(tx.backoff, 0, "spurious RTO: backoff undone");
        cr_assert_eq(dw_rel_next_deadline(&tx), UINT64_MAX);

        /* Whole window lost: the probe's ACK holds only the probe, so the rest
         * goes at once, without one RTO per packet. */
        uint64_t t1 = rc.now + 1 * MS;
        for (uint32_t i = 0; i < 8; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, 132 + i, i, t1), 0);
        rc.now = dw_rel_next_deadline(&tx);
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 2);
        cr_assert_eq(rc.retx_psn[1], 132);
        h = ack_hdr(133, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now + 10 * US, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_timers(&tx, rc.now + 10 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 9, "the 7 others, each once");
        for (uint32_t i = 0; i < 7; i++)
                cr_assert_eq(rc.retx_psn[2 + i], 133 + i);
        cr_assert_eq(tx.stats.rto_expiries + tx.stats.tail_probes, 2, "two probe episodes");
}

/* What congestion control hears: one RTT callback per sample the RTO
 * estimator takes, one loss callback per ACK that exposes holes, a timeout
 * only when an RTO episode was real, nothing for a spurious one. */
struct cc_rec {
        unsigned nrtt, nfast, nrto;
        uint32_t rtt;
        uint32_t rtt_psn; /* the packet of the last sample, and its cookie */
        uint64_t rtt_cookie;
};

static void cc_rtt(void *ctx, uint32_t psn, uint64_t cookie, uint32_t rtt_ns, uint64_t now)
{
        struct cc_rec *c = ((struct rec *)ctx)->cc;
        c->nrtt++;
        c->rtt = rtt_ns;
        c->rtt_psn = psn;
        c->rtt_cookie = cookie;
}

static void cc_lost(void *ctx, enum dw_rel_loss how, uint64_t now)
{
        struct cc_rec *c = ((struct rec *)ctx)->cc;
        if (how == DW_REL_LOSS_RTO)
                c->nrto++;
        else
                c->nfast++;
}

static const struct dw_rel_ops cc_ops = {.acked = rec_acked,
                                         .retransmit = rec_retx,
                                         .send_ack = rec_send_ack,
                                         .rtt = cc_rtt,
                                         .lost = cc_lost};

Test(rel, congestion_callbacks)
{
        struct dw_rel_params p = test_params();
        p.rto_min_us = 1000;
        p.rto_init_us = 1000;
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[32];
        struct cc_rec cc = {0};
        struct rec rc = {0};
        rc.peer = &tx;
        rc.cc = &cc;
        dw_rel_peer_init(&tx, &p, ring, 32, 0, 0);
        for (uint32_t i = 0; i < 8; i++)
                dw_rel_tx_sent(&tx, i, i, T0);
        struct dw_dgram_hdr h = ack_hdr(2, 0, NULL);
        dw_rel_on_ack(&tx, &h, T0 + 40 * US, &cc_ops, &rc);
        cr_assert_eq(cc.nrtt, 1);
        cr_assert_eq(cc.rtt, 40 * US);
        /* A hole at 2 with 3 SACKed above: one loss callback for the ACK. */
        uint32_t b[] = {3, 6};
        h = ack_hdr(2, 1, b);
        dw_rel_on_ack(&tx, &h, T0 + 50 * US, &cc_ops, &rc);
        cr_assert_eq(cc.nfast, 1);
        cr_assert_eq(cc.nrto, 0);
        dw_rel_timers(&tx, T0 + 50 * US, &cc_ops, &rc); /* the fast retransmission */
        h = ack_hdr(8, 0, NULL);
        dw_rel_on_ack(&tx, &h, T0 + 60 * US, &cc_ops, &rc);
        cr_assert_eq(cc.nfast, 1, "no new hole");

        /* A spurious RTO (everything had arrived): no loss. */
        uint64_t t = T0 + 1 * MS;
        for (uint32_t i = 8; i < 16; i++)
                dw_rel_tx_sent(&tx, i, i, t);
        for (int i = 0; i < 10 && !tx.stats.rto_expiries; i++) {
                rc.now = dw_rel_next_deadline(&tx);
                dw_rel_timers(&tx, rc.now, &cc_ops, &rc);
        }
        cr_assert_eq(tx.stats.rto_expiries, 1);
        h = ack_hdr(16, 0, NULL);
        dw_rel_on_ack(&tx, &h, rc.now + 10 * US, &cc_ops, &rc);
        cr_assert_eq(cc.nrto, 0, "spurious");
        cr_assert_eq(cc.nfast, 1);

        /* A real one: only the probe got through. */
        t = rc.now + 1 * MS;
        for (uint32_t i = 16; i < 24; i++)
                dw_rel_tx_sent(&tx, i, i, t);
        unsigned rto0 = tx.stats.rto_expiries;
        for (int i = 0; i < 10 && tx.stats.rto_expiries == rto0; i++) {
                rc.now = dw_rel_next_deadline(&tx);
                dw_rel_timers(&tx, rc.now, &cc_ops, &rc);
        }
        cr_assert_eq(tx.stats.rto_expiries, rto0 + 1);
        h = ack_hdr(17, 0, NULL);
        dw_rel_on_ack(&tx, &h, rc.now + 10 * US, &cc_ops, &rc);
        cr_assert_eq(cc.nrto, 1, "a real timeout");
}

/* The RTT callback names the packet sampled, by its cookie as renamed. */
Test(rel, rtt_callback_names_the_sampled_packet)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[16];
        struct cc_rec cc = {0};
        struct rec rc = {0};
        rc.peer = &tx;
        rc.cc = &cc;
        dw_rel_peer_init(&tx, &p, ring, 16, 10, 0);
        for (uint32_t i = 0; i < 4; i++) {
                cr_assert_eq(dw_rel_tx_sent(&tx, 10 + i, i, T0 + i * US), 0);
                cr_assert_eq(dw_rel_tx_rename(&tx, 10 + i, 0xB00 + i, i & 1), 0);
        }
        /* The cumulative ACK of all four: the newest (13) gives the sample. */
        struct dw_dgram_hdr h = ack_hdr(14, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0 + 40 * US, &cc_ops, &rc), 0);
        cr_assert_eq(cc.nrtt, 1);
        cr_assert_eq(cc.rtt, 37 * US);
        cr_assert_eq(cc.rtt_psn, 13);
        cr_assert_eq(cc.rtt_cookie, 0xB03);
        /* A SACK above a hole: the sample is the SACKed packet's, not the
         * cumulative point's. */
        uint64_t t = T0 + 100 * US;
        for (uint32_t i = 4; i < 8; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, 10 + i, i, t + i * US), 0);
        cr_assert_eq(dw_rel_tx_rename(&tx, 15, 0xC05, 2), 0);
        uint32_t b[] = {15, 16};
        h = ack_hdr(14, 1, b);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, t + 30 * US, &cc_ops, &rc), 0);
        cr_assert_eq(cc.nrtt, 2);
        cr_assert_eq(cc.rtt, 25 * US);
        cr_assert_eq(cc.rtt_psn, 15);
        cr_assert_eq(cc.rtt_cookie, 0xC05);
}

/* Congestion control times the network: the sample runs to the ACK's
 * kernel arrival, less the receiver's reported ACK delay, for the packet that
 * delay names; the RTO estimator keeps the whole sample to now. */
Test(rel, cc_sample_goes_by_arrival_and_ack_delay)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[16];
        struct cc_rec cc = {0};
        struct rec rc = {0};
        rc.peer = &tx;
        rc.cc = &cc;
        dw_rel_peer_init(&tx, &p, ring, 16, 10, 0);
        for (uint32_t i = 0; i < 2; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, 10 + i, i, T0 + i * US), 0);
        /* Read 5 ms after it came (this thread waited for a core), 300 µs
         * of which the receiver held the newest packet (11). */
        struct dw_dgram_hdr h = ack_hdr(12, 0, NULL);
        h.xflags2 = DW_DGRAM_X2_ACKDELAY;
        h.ack_delay_us = 300;
        cr_assert_eq(dw_rel_on_ack_at(&tx, &h, T0 + 6 * MS, T0 + 1 * MS, &cc_ops, &rc), 0);
        cr_assert_eq(cc.nrtt, 1);
        cr_assert_eq(cc.rtt_psn, 11);
        cr_assert_eq(cc.rtt, 699 * US, "cc sample %u ns", cc.rtt);
        cr_assert_eq(tx.srtt_ns, 6 * MS - 1 * US, "the RTO estimator keeps the whole sample");
        /* A delay for a packet the sample is not (the ACK reports 14, the
         * newest packet sent once is 13: 14 was resent) is not subtracted. */
        uint64_t t = T0 + 10 * MS;
        for (uint32_t i = 2; i < 5; i++)
                cr_assert_eq(dw_rel_tx_sent(&tx, 10 + i, i, t + i * US), 0);
        tx.ring[14 & tx.ring_mask].retx = 1;
        h = ack_hdr(15, 0, NULL);
        h.xflags2 = DW_DGRAM_X2_ACKDELAY;
        h.ack_delay_us = 300;
        cr_assert_eq(dw_rel_on_ack_at(&tx, &h, t + 2 * MS, t + 1 * MS, &cc_ops, &rc), 0);
        cr_assert_eq(cc.nrtt, 2);
        cr_assert_eq(cc.rtt_psn, 13);
        cr_assert_eq(cc.rtt, 997 * US, "cc sample %u ns", cc.rtt);
        /* A delay longer than the sample (clocks disagree) is not taken. */
        t = T0 + 20 * MS;
        cr_assert_eq(dw_rel_tx_sent(&tx, 15, 5, t), 0);
        h = ack_hdr(16, 0, NULL);
        h.xflags2 = DW_DGRAM_X2_ACKDELAY;
        h.ack_delay_us = 900;
        cr_assert_eq(dw_rel_on_ack_at(&tx, &h, t + 500 * US, t + 400 * US, &cc_ops, &rc), 0);
        cr_assert_eq(cc.rtt, 500 * US);
}

/* The receiver reports how long it held the ACK of the newest packet it
 * acknowledges since it read it (rd/ gives dw_rel_rx_arrived its read clock),
 * only for that packet and only when it is worth a version-2 header. */
Test(rel, ack_delay_names_the_newest_packet)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer rx;
        struct dw_dgram_hdr h, out;
        enum dw_rel_verdict v;
        dw_rel_peer_init(&rx, &p, NULL, 8, 0, 40);
        /* Nothing received yet: no delay. */
        memset(&h, 0, sizeof(h));
        dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK);
        dw_rel_ack_delay(&rx, &h, T0);
        cr_assert_eq(h.xflags2, 0);
        dw_rel_rx_data(&rx, 40, false, T0, &v);
        dw_rel_rx_arrived(&rx, 40, T0);
        dw_rel_rx_data(&rx, 41, false, T0, &v);
        dw_rel_rx_arrived(&rx, 41, T0 + 100 * US);
        memset(&h, 0, sizeof(h));
        dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK);
        dw_rel_ack_delay(&rx, &h, T0 + 110 * US);
        cr_assert_eq(h.xflags2, 0, "10 µs is below DW_REL_ACK_DELAY_MIN_US");
        dw_rel_ack_delay(&rx, &h, T0 + 2100 * US);
        cr_assert_eq(h.xflags2, DW_DGRAM_X2_ACKDELAY);
        cr_assert(h.ack_delay_us >= 1984 && h.ack_delay_us <= 2016, "%u", h.ack_delay_us);
        wire_roundtrip(&h, &out);
        cr_assert_eq(out.ack_delay_us, h.ack_delay_us);
        /* Out of order: 44 beyond a hole is the newest; an ACK that reports
         * it names its arrival, a late 42 does not move it. */
        dw_rel_rx_data(&rx, 44, false, T0 + 3 * MS, &v);
        dw_rel_rx_arrived(&rx, 44, T0 + 3 * MS);
        dw_rel_rx_data(&rx, 42, false, T0 + 4 * MS, &v);
        dw_rel_rx_arrived(&rx, 42, T0 + 4 * MS);
        cr_assert_eq(dw_rel_rx_highest(&rx), 44);
        memset(&h, 0, sizeof(h));
        dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK);
        cr_assert_eq(dw_rel_ack_top(&h), 44);
        dw_rel_ack_delay(&rx, &h, T0 + 5 * MS);
        cr_assert(h.ack_delay_us >= 1984 && h.ack_delay_us <= 2016, "%u", h.ack_delay_us);
        /* An ACK that cannot report it (no SACK room) says nothing. */
        memset(&h, 0, sizeof(h));
        dw_rel_build_ack(&rx, &h, 0);
        dw_rel_ack_delay(&rx, &h, T0 + 5 * MS);
        cr_assert_eq(h.xflags2, 0);
        cr_assert_eq(h.ack_delay_us, 0);
}

/* A duplicate is reported once, first among the SACK blocks (RFC 2883), and
 * a D-SACK for a packet sent before a probe episode ends it as spurious: no
 * loss reported, the backoff undone. */
Test(rel, dsack_reports_a_duplicate_and_ends_a_spurious_probe)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer rx;
        dw_rel_peer_init(&rx, &p, NULL, 8, 0, 40);
        enum dw_rel_verdict v;
        dw_rel_rx_data(&rx, 40, false, T0, &v);
        dw_rel_rx_data(&rx, 42, false, T0, &v); /* a hole at 41 */
        dw_rel_rx_data(&rx, 40, false, T0, &v);
        cr_assert_eq(v, DW_REL_DUPLICATE);
        struct dw_dgram_hdr h = {0}, out;
        cr_assert_eq(dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK), 2);
        cr_assert(h.xflags & DW_DGRAM_X_DSACK);
        cr_assert_eq(h.sack[0].start, 40);
        cr_assert_eq(h.sack[0].end, 41);
        cr_assert_eq(h.sack[1].start, 42);
        wire_roundtrip(&h, &out);
        cr_assert_eq(out.xflags, DW_DGRAM_X_DSACK);
        struct dw_dgram_hdr h2 = {0};
        dw_rel_build_ack(&rx, &h2, DW_DGRAM_MAX_SACK);
        cr_assert_not(h2.xflags & DW_DGRAM_X_DSACK, "reported once");

        /* The sender: a tail loss probe, then the D-SACK of the probed PSN. */
        p.rto_min_us = 1000;
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[16];
        struct cc_rec cc = {0};
        struct rec rc = {0};
        rc.peer = &tx;
        rc.cc = &cc;
        dw_rel_peer_init(&tx, &p, ring, 16, 0, 0);
        for (uint32_t i = 0; i < 4; i++)
                dw_rel_tx_sent(&tx, i, i, T0);
        struct dw_dgram_hdr a = ack_hdr(1, 0, NULL);
        dw_rel_on_ack(&tx, &a, T0 + 40 * US, &cc_ops, &rc);
        rc.now = dw_rel_next_deadline(&tx);
        dw_rel_timers(&tx, rc.now, &cc_ops, &rc);
        cr_assert_eq(tx.stats.tail_probes, 1);
        cr_assert_eq(rc.retx_psn[0], 1);
        /* Everything had arrived; the ACK that the probe's duplicate draws
         * says so. */
        a = ack_hdr(4, 0, NULL);
        a.flags |= DW_DGRAM_F_SACK;
        a.xflags = DW_DGRAM_X_DSACK;
        a.sack_count = 1;
        a.sack[0].start = 1;
        a.sack[0].end = 2;
        cr_assert_eq(dw_rel_on_ack(&tx, &a, rc.now + 20 * US, &cc_ops, &rc), 0);
        cr_assert_eq(tx.stats.spurious, 1);
        cr_assert_eq(cc.nfast + cc.nrto, 0, "no loss reported");
        cr_assert_not(tx.flags & DW_REL_F_RTO_PROBE);
        cr_assert_eq(dw_rel_tx_inflight(&tx), 0);
}

/* A fresh stream of params p: one packet sent at t and acknowledged 100 µs
 * later (SRTT 100 µs), then one sent at t + 200 µs that stays unanswered. */
static void quiet_after_one_sample(struct dw_rel_peer *r, const struct dw_rel_params *p,
                                   struct dw_rel_txent ring[16], uint64_t t)
{
        struct rec rc = {0};
        rc.peer = r;
        dw_rel_peer_init(r, p, ring, 16, 0, 0);
        dw_rel_tx_sent(r, 0, 0, t);
        struct dw_dgram_hdr a = ack_hdr(1, 0, NULL);
        dw_rel_on_ack(r, &a, t + 100 * US, &rec_ops, &rc);
        cr_assert_eq(r->srtt_ns, 100 * US);
        dw_rel_tx_sent(r, 1, 1, t + 200 * US);
}

/* A peer slower than 2 SRTT at times (a program that is not scheduled, or
 * places data slowly): the ACK that shows a probe was needless gives an RTT
 * sample (how late the original was), and teaches every stream of the same
 * params to wait that long: the next stream to go quiet probes no earlier
 * than 5/4 of it (its RTO stays its own: an RTO due earlier goes first); a
 * second later half of it is left. The RTO minimum is 50 ms here, so that
 * the probes are what the timers do. */
Test(rel, late_acks_teach_every_stream)
{
        struct dw_rel_stall stall = {0};
        struct dw_rel_params p = test_params();
        p.stall = &stall;
        p.rto_min_us = 50000;
        struct dw_rel_peer tx, other;
        struct dw_rel_txent ring[16], ring2[16];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 16, 0, 0);
        dw_rel_peer_init(&other, &p, ring2, 16, 0, 0);
        dw_rel_tx_sent(&tx, 0, 0, T0);
        struct dw_dgram_hdr a = ack_hdr(1, 0, NULL);
        dw_rel_on_ack(&tx, &a, T0 + 100 * US, &rec_ops, &rc); /* SRTT 100 µs */
        cr_assert_eq(tx.srtt_ns, 100 * US);
        uint64_t t = T0 + 1 * MS;
        for (uint32_t i = 1; i < 4; i++)
                dw_rel_tx_sent(&tx, i, i, t);
        uint64_t d1 = dw_rel_next_deadline(&tx);
        cr_assert_eq(d1, t + 250 * US, "tail loss probe at 2 SRTT + the ACK delay");
        rc.now = d1;
        dw_rel_timers(&tx, d1, &rec_ops, &rc);
        cr_assert_eq(tx.stats.tail_probes, 1);
        /* 5 ms late, every original arrives: spurious, and a 5 ms sample. */
        a = ack_hdr(4, 0, NULL);
        dw_rel_on_ack(&tx, &a, t + 5 * MS, &rec_ops, &rc);
        cr_assert_not(tx.flags & DW_REL_F_RTO_PROBE);
        cr_assert_gt(tx.srtt_ns, 100 * US + (5 * MS - 100 * US) / 8 - 1 * US, "srtt %u",
                     tx.srtt_ns);
        cr_assert_eq(stall.wait_ns, 5 * MS, "the wait since the last ACK progress is learned");
        cr_assert_eq(stall.seen_at, t + 5 * MS);

        /* Another stream of the same params, which never probed: one RTT
         * sample of 100 µs, then a packet that goes unanswered. */
        dw_rel_tx_sent(&other, 0, 0, t + 6 * MS);
        a = ack_hdr(1, 0, NULL);
        dw_rel_on_ack(&other, &a, t + 6 * MS + 100 * US, &rec_ops, &rc);
        uint64_t t2 = t + 7 * MS;
        dw_rel_tx_sent(&other, 1, 1, t2);
        cr_assert_eq(other.rto_deadline, t2 + 50 * MS, "the RTO is the stream's own");
        cr_assert_eq(dw_rel_next_deadline(&other) - t2, 5 * MS + 5 * MS / 4,
                     "probe at 5/4 of the wait");

        /* A second after it was seen, half the wait is left. */
        a = ack_hdr(2, 0, NULL);
        dw_rel_on_ack(&other, &a, t2 + 100 * US, &rec_ops, &rc);
        cr_assert_eq(other.srtt_ns, 100 * US);
        uint64_t t3 = t + 5 * MS + 1000 * MS;
        dw_rel_tx_sent(&other, 2, 2, t3);
        cr_assert_eq(dw_rel_next_deadline(&other) - t3, 5 * MS / 2 + 5 * MS / 8);

        /* A stream whose RTO comes before the learned probe: the RTO goes
         * first (at 1 ms), the probe does not go before it. */
        p.rto_min_us = 1000;
        struct dw_rel_peer quick, lone;
        struct dw_rel_txent ring3[16], ring4[16];
        quiet_after_one_sample(&quick, &p, ring4, t3);
        cr_assert_eq(quick.rto_deadline, t3 + 200 * US + 1 * MS);
        cr_assert_eq(dw_rel_next_deadline(&quick), quick.rto_deadline);

        /* Without a shared record nothing is learned: each stream alone. */
        p.stall = NULL;
        quiet_after_one_sample(&lone, &p, ring3, t3);
        cr_assert_eq(dw_rel_next_deadline(&lone), t3 + 200 * US + 250 * US);
}

/* ------------------------------------------------------- ACK coalescing */

Test(rel, ack_coalescing_counts)
{
        struct dw_rel_params p = test_params(); /* every 2 packets / 50 µs */
        struct dw_rel_peer rx;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        enum dw_rel_verdict v;
        rc.peer = &rx;
        dw_rel_peer_init(&rx, &p, ring, 8, 0, 0);

        unsigned acks = 0;
        uint64_t now = T0;
        for (uint32_t psn = 0; psn < 10; psn++) {
                dw_rel_rx_data(&rx, psn, false, now, &v);
                cr_assert(dw_rel_ack_owed(&rx));
                cr_assert_eq(dw_rel_ack_due(&rx, now), psn % 2 == 1, "psn %u", psn);
                cr_assert_eq(dw_rel_timers(&rx, now, &rec_ops, &rc), 0);
                now += 1 * US;
        }
        acks = rc.nacks;
        cr_assert_eq(acks, 5, "one ACK per 2 packets, got %u", acks);
        cr_assert_not(dw_rel_ack_owed(&rx));

        /* A lone packet waits 50 µs for a piggyback, then gets its own ACK. */
        dw_rel_rx_data(&rx, 10, false, now, &v);
        cr_assert_not(dw_rel_ack_due(&rx, now));
        cr_assert_eq(dw_rel_next_deadline(&rx), now + 50 * US);
        cr_assert_eq(dw_rel_timers(&rx, now + 49 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 5);
        cr_assert_eq(dw_rel_timers(&rx, now + 50 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 6);
        now += 100 * US;

        /* Piggybacking clears the owed ACK: nothing left for the timer. */
        dw_rel_rx_data(&rx, 11, false, now, &v);
        struct dw_dgram_hdr h = {0};
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA;
        cr_assert_eq(dw_rel_build_ack(&rx, &h, DW_DGRAM_MAX_SACK), 0);
        cr_assert_eq(h.ack_psn, 12);
        cr_assert_eq(dw_rel_timers(&rx, now + 1 * MS, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 6);

        /* Immediate: ACKREQ, duplicate, out of order. */
        dw_rel_rx_data(&rx, 12, true, now, &v);
        cr_assert(dw_rel_ack_due(&rx, now), "ACKREQ");
        dw_rel_build_ack(&rx, &h, 8);
        dw_rel_rx_data(&rx, 5, false, now, &v);
        cr_assert(dw_rel_ack_due(&rx, now), "duplicate");
        dw_rel_build_ack(&rx, &h, 8);
        dw_rel_rx_data(&rx, 15, false, now, &v);
        cr_assert(dw_rel_ack_due(&rx, now), "out of order");
        dw_rel_build_ack(&rx, &h, 8);
        dw_rel_rx_data(&rx, 13, false, now, &v);
        cr_assert(dw_rel_ack_due(&rx, now), "holes remain");
        dw_rel_build_ack(&rx, &h, 8);
        cr_assert_eq(dw_rel_rx_data(&rx, 14, false, now, &v), 2);
        cr_assert(dw_rel_ack_due(&rx, now), "hole filled");

        /* ack_every 4 */
        p.ack_every = 4;
        dw_rel_peer_init(&rx, &p, ring, 8, 0, 0);
        rc.nacks = 0;
        for (uint32_t psn = 0; psn < 40; psn++) {
                dw_rel_rx_data(&rx, psn, false, now, &v);
                dw_rel_timers(&rx, now, &rec_ops, &rc);
        }
        cr_assert_eq(rc.nacks, 10);
}

/* A request (ACKREQ) is acked at once until our data answers requests within
 * the ACK delay; then the response carries the ACK and no ACK datagram goes.
 * A request left without a response gets its ACK after the delay and ends
 * the deferral. */
Test(rel, ackreq_deferred_for_responses)
{
        struct dw_rel_params p = test_params(); /* 50 µs ACK delay */
        struct dw_rel_peer r;
        struct dw_rel_txent ring[8];
        struct rec rc = {0};
        struct dw_dgram_hdr h;
        enum dw_rel_verdict v;
        uint64_t now = T0;
        rc.peer = &r;
        dw_rel_peer_init(&r, &p, ring, 8, 0, 0);

        /* First request: nothing learnt yet, ACK at once. */
        dw_rel_rx_data(&r, 0, true, now, &v);
        cr_assert(dw_rel_ack_due(&r, now));
        cr_assert_eq(dw_rel_timers(&r, now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 1);
        /* Our response goes 5 µs later: requests are answered. */
        cr_assert_eq(dw_rel_tx_sent(&r, 0, 0, now + 5 * US), 0);
        cr_assert(r.flags & DW_REL_F_INTERACTIVE);
        now += 10 * US;

        /* Second request: the ACK waits for the response... */
        dw_rel_rx_data(&r, 1, true, now, &v);
        cr_assert(dw_rel_ack_owed(&r));
        cr_assert_not(dw_rel_ack_due(&r, now));
        cr_assert_eq(dw_rel_next_deadline(&r) <= now + 50 * US, true);
        cr_assert_eq(dw_rel_timers(&r, now + 2 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 1, "no ACK datagram while the response may come");
        /* ...which carries it. */
        memset(&h, 0, sizeof(h));
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA;
        cr_assert_geq(dw_rel_build_ack(&r, &h, DW_DGRAM_MAX_SACK), 0);
        cr_assert_eq(h.ack_psn, 2);
        cr_assert_eq(dw_rel_tx_sent(&r, 1, 1, now + 3 * US), 0);
        cr_assert_eq(dw_rel_timers(&r, now + 1 * MS, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 1);
        cr_assert(r.flags & DW_REL_F_INTERACTIVE);
        now += 2 * MS;

        /* A request nobody answers: its ACK goes after the delay, and the
         * next request is acked at once again. */
        dw_rel_rx_data(&r, 2, true, now, &v);
        cr_assert_not(dw_rel_ack_due(&r, now));
        cr_assert_eq(dw_rel_timers(&r, now + 49 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 1);
        cr_assert_eq(dw_rel_timers(&r, now + 50 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nacks, 2, "the ACK goes alone after the delay");
        cr_assert_not(r.flags & DW_REL_F_INTERACTIVE);
        now += 1 * MS;
        dw_rel_rx_data(&r, 3, true, now, &v);
        cr_assert(dw_rel_ack_due(&r, now), "no responses lately: immediate again");

        /* A response later than the ACK delay does not make the flow interactive. */
        cr_assert_eq(dw_rel_timers(&r, now, &rec_ops, &rc), 0);
        cr_assert_eq(dw_rel_tx_sent(&r, 2, 2, now + 60 * US), 0);
        cr_assert_not(r.flags & DW_REL_F_INTERACTIVE);
}

Test(rel, ackreq_hint)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_peer tx;
        struct dw_rel_txent ring[16];
        dw_rel_peer_init(&tx, &p, ring, 16, 0, 0);
        for (uint32_t i = 0; i < 15; i++) {
                cr_assert_not(dw_rel_tx_want_ackreq(&tx), "at %u in flight", i);
                dw_rel_tx_sent(&tx, i, i, T0);
        }
        cr_assert(dw_rel_tx_want_ackreq(&tx), "the packet that fills the window asks");
}

/* ------------------------------------------------------------------ RNR */

Test(rel, rnr_backoff_and_limit)
{
        struct dw_rel_params p = test_params();
        p.rnr_retry_limit = 2;
        struct dw_rel_peer tx, rx;
        struct dw_rel_txent ring[8], rxring[8];
        struct rec rc = {0};
        rc.peer = &tx;
        dw_rel_peer_init(&tx, &p, ring, 8, 40, 0);
        dw_rel_peer_init(&rx, &p, rxring, 8, 0, 40);
        dw_rel_tx_sent(&tx, 40, 1, T0);

        /* Receiver: no receive posted, refuse without accepting. */
        cr_assert_eq(dw_rel_rx_classify(&rx, 40), DW_REL_NEW);
        struct dw_dgram_hdr h = {0}, d;
        dw_rel_build_rnr_nak(&h, 40, 1000);
        wire_roundtrip(&h, &d);
        cr_assert_eq(d.rnr_delay, 100);
        cr_assert_eq(dw_rel_rx_classify(&rx, 40), DW_REL_NEW, "still new for the retry");

        rc.now = T0 + 10 * US;
        cr_assert_eq(dw_rel_on_ack(&tx, &d, rc.now, &rec_ops, &rc), 0);
        cr_assert_not(dw_rel_tx_can_send(&tx, rc.now), "back off: no new data");
        cr_assert_eq(dw_rel_next_deadline(&tx), rc.now + 1 * MS);
        cr_assert_eq(dw_rel_timers(&tx, rc.now + 999 * US, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 0);
        cr_assert_eq(dw_rel_timers(&tx, rc.now + 1 * MS, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 1);
        cr_assert(dw_rel_tx_can_send(&tx, rc.now + 1 * MS));

        /* Second RNR with no hint: own back-off, rnr_min_us × 2^(n-1). */
        rc.now += 2 * MS;
        dw_rel_build_rnr_nak(&h, 40, 0);
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(tx.rnr_until, rc.now + 2 * p.rnr_min_us * US);
        /* A NAK for the same episode does not count again. */
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now + 1 * US, &rec_ops, &rc), 0);
        cr_assert_eq(tx.rnr_retries, 2);
        rc.now = tx.rnr_until;
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), 0);
        cr_assert_eq(rc.nretx, 2);
        /* Third episode: over the limit of 2. */
        rc.now += 1 * MS;
        cr_assert_eq(dw_rel_on_ack(&tx, &h, rc.now, &rec_ops, &rc), -EREMOTEIO);
        cr_assert_eq(tx.fatal_reason, DW_REL_RNR_EXCEEDED);
        cr_assert_eq(dw_rel_timers(&tx, rc.now, &rec_ops, &rc), -EREMOTEIO);

        /* Success after an RNR resets the count. */
        dw_rel_peer_init(&tx, &p, ring, 8, 40, 0);
        rc = (struct rec){0};
        rc.peer = &tx;
        dw_rel_tx_sent(&tx, 40, 1, T0);
        dw_rel_build_rnr_nak(&h, 40, 10);
        dw_rel_on_ack(&tx, &h, T0, &rec_ops, &rc);
        dw_rel_on_ack(&tx, &h, T0 + 1 * MS, &rec_ops, &rc);
        cr_assert_eq(tx.rnr_retries, 2);
        dw_rel_timers(&tx, T0 + 2 * MS, &rec_ops, &rc);
        struct dw_dgram_hdr a = ack_hdr(41, 0, NULL);
        cr_assert_eq(dw_rel_on_ack(&tx, &a, T0 + 2 * MS, &rec_ops, &rc), 0);
        cr_assert_eq(tx.rnr_retries, 0);
        /* RNR for an already acked PSN is stale and ignored. */
        cr_assert_eq(dw_rel_on_ack(&tx, &h, T0 + 3 * MS, &rec_ops, &rc), 0);
        cr_assert_eq(tx.rnr_retries, 0);
        cr_assert_eq(tx.stats.rnr_naks, 2);
}

/* ------------------------------------------------------------ simulation */

#define SIM_MSGS 3000
#define SIM_WIN  64
#define SIM_QCAP 4096

struct pkt {
        uint64_t at;
        int to;
        uint32_t tag; /* the "payload": message index */
        size_t len;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
};

struct sim;
struct side {
        struct dw_rel_peer rel;
        struct dw_rel_txent ring[SIM_WIN];
        struct sim *sim;
        int id;
        uint32_t tx_base, rx_base;
        uint32_t next_msg, acked_cnt, delivered;
        uint8_t got[SIM_MSGS], acked[SIM_MSGS];
        unsigned data_pkts, ack_pkts;
};

struct sim {
        uint64_t now, rng, link_free[2];
        double drop, dup, reorder;
        struct pkt q[SIM_QCAP];
        size_t nq;
        struct side s[2];
        struct dw_rel_params p;
        unsigned dropped, duplicated, reordered;
};

static uint64_t rnd64(struct sim *m) /* splitmix64 */
{
        uint64_t z = (m->rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
}

static double rnd01(struct sim *m)
{
        return (double)(rnd64(m) >> 11) / 9007199254740992.0;
}

static void channel_send(struct side *s, const struct dw_dgram_hdr *h, uint32_t tag)
{
        struct sim *m = s->sim;
        struct pkt pk;
        ssize_t n = dw_dgram_encode(h, pk.buf, sizeof(pk.buf));
        cr_assert_gt(n, 0, "encode: %zd", n);
        pk.len = (size_t)n;
        pk.tag = tag;
        pk.to = 1 - s->id;
        if (rnd01(m) < m->drop) {
                m->dropped++;
                return;
        }
        int copies = rnd01(m) < m->dup ? 2 : 1;
        m->duplicated += (unsigned)copies - 1;
        for (int c = 0; c < copies; c++) {
                uint64_t start = m->now > m->link_free[s->id] ? m->now : m->link_free[s->id];
                m->link_free[s->id] = start + 1 * US; /* serialisation */
                pk.at = start + 10 * US;              /* one-way latency */
                /* As util/fault.h: a reordered packet is overtaken by 1..3
                 * later ones (when the link is busy). */
                if (rnd01(m) < m->reorder) {
                        pk.at += (1 + rnd64(m) % 3) * US + US / 2;
                        m->reordered++;
                }
                cr_assert_lt(m->nq, SIM_QCAP);
                m->q[m->nq++] = pk;
        }
}

static void send_data(struct side *s, uint32_t psn, uint32_t msg)
{
        struct dw_dgram_hdr h;
        memset(&h, 0, sizeof(h));
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA;
        if (dw_rel_tx_want_ackreq(&s->rel))
                h.flags |= DW_DGRAM_F_ACKREQ;
        h.dst_qpn = 0x100u + (uint32_t)(1 - s->id);
        h.src_qpn = 0x100u + (uint32_t)s->id;
        h.psn = psn;
        if (dw_rel_ack_owed(&s->rel)) /* piggyback */
                cr_assert_geq(dw_rel_build_ack(&s->rel, &h, DW_DGRAM_MAX_SACK), 0);
        s->data_pkts++;
        channel_send(s, &h, msg);
}

static void sim_acked(void *ctx, uint32_t psn, uint64_t cookie)
{
        struct side *s = ctx;
        cr_assert_lt(cookie, SIM_MSGS);
        cr_assert_eq(psn - s->tx_base, (uint32_t)cookie);
        cr_assert_not(s->acked[cookie], "side %d: message %llu acked twice", s->id,
                      (unsigned long long)cookie);
        s->acked[cookie] = 1;
        s->acked_cnt++;
}

static int sim_retx(void *ctx, uint32_t psn, uint64_t cookie)
{
        struct side *s = ctx;
        send_data(s, psn, (uint32_t)cookie);
        return 0;
}

static int sim_send_ack(void *ctx)
{
        struct side *s = ctx;
        struct dw_dgram_hdr h;
        memset(&h, 0, sizeof(h));
        h.dst_qpn = 0x100u + (uint32_t)(1 - s->id);
        h.src_qpn = 0x100u + (uint32_t)s->id;
        h.psn = dw_rel_tx_next_psn(&s->rel);
        cr_assert_geq(dw_rel_build_ack(&s->rel, &h, DW_DGRAM_MAX_SACK), 0);
        s->ack_pkts++;
        channel_send(s, &h, UINT32_MAX);
        return 0;
}

static const struct dw_rel_ops sim_ops = {
    .acked = sim_acked, .retransmit = sim_retx, .send_ack = sim_send_ack};

static void deliver(struct sim *m, const struct pkt *pk)
{
        struct side *s = &m->s[pk->to];
        struct dw_dgram_hdr h;
        const char *why = NULL;
        ssize_t n = dw_dgram_decode(pk->buf, pk->len, &h, &why);
        cr_assert_eq(n, (ssize_t)pk->len, "decode: %s", why ? why : "");
        if (h.flags & DW_DGRAM_F_DATA) {
                enum dw_rel_verdict v;
                uint32_t adv =
                    dw_rel_rx_data(&s->rel, h.psn, h.flags & DW_DGRAM_F_ACKREQ, m->now, &v);
                cr_assert_neq(v, DW_REL_OUT_OF_WINDOW, "side %d: psn %u out of window", s->id,
                              h.psn);
                if (v == DW_REL_NEW) {
                        uint32_t msg = h.psn - s->rx_base;
                        cr_assert_lt(msg, SIM_MSGS);
                        cr_assert_eq(pk->tag, msg, "payload matches its PSN");
                        cr_assert_not(s->got[msg], "side %d: message %u delivered twice", s->id,
                                      msg);
                        s->got[msg] = 1;
                }
                for (uint32_t i = 0; i < adv; i++) {
                        cr_assert(s->got[s->delivered], "cursor passed an undelivered message");
                        s->delivered++;
                }
                cr_assert_eq(dw_rel_rx_cursor(&s->rel) - s->rx_base, s->delivered);
        }
        if (h.flags & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK)) {
                int rc = dw_rel_on_ack(&s->rel, &h, m->now, &sim_ops, s);
                cr_assert_eq(rc, 0, "side %d: on_ack %d", s->id, rc);
        }
}

static bool side_done(const struct side *s)
{
        return s->acked_cnt == SIM_MSGS && s->delivered == SIM_MSGS;
}

static void run_sim(double drop, double dup, double reorder, uint64_t seed)
{
        struct sim *m = calloc(1, sizeof(*m));
        cr_assert_not_null(m);
        m->drop = drop;
        m->dup = dup;
        m->reorder = reorder;
        m->rng = seed;
        m->now = T0;
        dw_rel_params_default(&m->p);
        m->p.window = SIM_WIN;
        const uint32_t isn[2] = {0xFFFFFF00u, 0x7FFFFFF0u}; /* cross 2^32 and 2^31 */
        for (int i = 0; i < 2; i++) {
                struct side *s = &m->s[i];
                s->sim = m;
                s->id = i;
                s->tx_base = isn[i];
                s->rx_base = isn[1 - i];
                cr_assert_eq(
                    dw_rel_peer_init(&s->rel, &m->p, s->ring, SIM_WIN, s->tx_base, s->rx_base), 0);
        }

        unsigned long steps = 0;
        while (!(side_done(&m->s[0]) && side_done(&m->s[1]))) {
                cr_assert_lt(++steps, 20000000ul, "simulation does not converge");
                cr_assert_lt(m->now - T0, 600000 * MS, "simulated time limit");
                /* deliver everything due */
                for (;;) {
                        size_t best = SIZE_MAX;
                        for (size_t i = 0; i < m->nq; i++)
                                if (m->q[i].at <= m->now &&
                                    (best == SIZE_MAX || m->q[i].at < m->q[best].at))
                                        best = i;
                        if (best == SIZE_MAX)
                                break;
                        struct pkt pk = m->q[best];
                        m->q[best] = m->q[--m->nq];
                        deliver(m, &pk);
                }
                for (int i = 0; i < 2; i++) {
                        struct side *s = &m->s[i];
                        /* New data first, so owed ACKs ride on it; then the
                         * timers (retransmissions, ACKs still owed). */
                        while (s->next_msg < SIM_MSGS && dw_rel_tx_can_send(&s->rel, m->now)) {
                                uint32_t psn = dw_rel_tx_next_psn(&s->rel);
                                send_data(s, psn, s->next_msg);
                                cr_assert_eq(dw_rel_tx_sent(&s->rel, psn, s->next_msg, m->now), 0);
                                s->next_msg++;
                        }
                        int rc = dw_rel_timers(&s->rel, m->now, &sim_ops, s);
                        cr_assert_eq(rc, 0, "side %d fatal %d (%s) at %llu ms", i, rc,
                                     dw_rel_fatal_str(&s->rel),
                                     (unsigned long long)((m->now - T0) / MS));
                }
                uint64_t next = UINT64_MAX;
                for (size_t i = 0; i < m->nq; i++)
                        if (m->q[i].at < next)
                                next = m->q[i].at;
                for (int i = 0; i < 2; i++) {
                        uint64_t d = dw_rel_next_deadline(&m->s[i].rel);
                        if (d < next)
                                next = d;
                }
                if (next == UINT64_MAX) {
                        cr_assert(side_done(&m->s[0]) && side_done(&m->s[1]),
                                  "deadlock: nothing scheduled");
                        break;
                }
                m->now = next > m->now ? next : m->now + 1;
        }
        for (int i = 0; i < 2; i++) {
                struct side *s = &m->s[i];
                cr_assert_eq(s->rel.fatal, 0);
                for (uint32_t k = 0; k < SIM_MSGS; k++)
                        cr_assert(s->got[k] && m->s[1 - i].acked[k]);
                if (drop == 0 && dup == 0 && reorder == 0)
                        cr_assert_eq(s->rel.stats.retransmits, 0, "lossless: no retransmission");
        }
        cr_log_info("drop %.2f dup %.2f reorder %.2f seed %llu: %.1f ms simulated, data %u+%u, "
                    "acks %u+%u, retx %u+%u (fast %u+%u, rto %u+%u), dups rx %u+%u; channel "
                    "dropped %u duplicated %u reordered %u",
                    drop, dup, reorder, (unsigned long long)seed, (double)(m->now - T0) / MS,
                    m->s[0].data_pkts, m->s[1].data_pkts, m->s[0].ack_pkts, m->s[1].ack_pkts,
                    m->s[0].rel.stats.retransmits, m->s[1].rel.stats.retransmits,
                    m->s[0].rel.stats.fast_retransmits, m->s[1].rel.stats.fast_retransmits,
                    m->s[0].rel.stats.rto_expiries, m->s[1].rel.stats.rto_expiries,
                    m->s[0].rel.stats.rx_dup, m->s[1].rel.stats.rx_dup, m->dropped, m->duplicated,
                    m->reordered);
        free(m);
}

Test(rel_sim, lossless)
{
        run_sim(0, 0, 0, 1);
}

Test(rel_sim, drop_1pct)
{
        for (uint64_t seed = 1; seed <= 3; seed++)
                run_sim(0.01, 0, 0, seed);
}

Test(rel_sim, drop_5pct)
{
        for (uint64_t seed = 1; seed <= 3; seed++)
                run_sim(0.05, 0, 0, seed);
}

Test(rel_sim, drop_20pct)
{
        for (uint64_t seed = 1; seed <= 3; seed++)
                run_sim(0.20, 0, 0, seed);
}

Test(rel_sim, dup_1pct)
{
        for (uint64_t seed = 1; seed <= 3; seed++)
                run_sim(0, 0.01, 0, seed);
}

Test(rel_sim, reorder_10pct)
{
        for (uint64_t seed = 1; seed <= 3; seed++)
                run_sim(0, 0, 0.10, seed);
}

Test(rel_sim, combined)
{
        for (uint64_t seed = 1; seed <= 3; seed++) {
                run_sim(0.05, 0.01, 0.10, seed);
                run_sim(0.20, 0.01, 0.10, seed + 100);
        }
}

/* --------------------------------------------------------------- memory */

/* 10 000 peers, each with its state and a send ring of the default window.
 * mallinfo2 is meaningful without AddressSanitizer (which replaces malloc). */
Test(rel, heap_10k_peers)
{
        enum { N = 10000 };
        struct dw_rel_params p = test_params();
        struct dw_rel_peer **peers = calloc(N, sizeof(*peers));
        struct dw_rel_txent **rings = calloc(N, sizeof(*rings));
        cr_assert(peers && rings);
        struct mallinfo2 before = mallinfo2();
        for (int i = 0; i < N; i++) {
                peers[i] = malloc(sizeof(struct dw_rel_peer));
                rings[i] = malloc(p.window * sizeof(struct dw_rel_txent));
                cr_assert(peers[i] && rings[i]);
                cr_assert_eq(dw_rel_peer_init(peers[i], &p, rings[i], p.window, (uint32_t)i, 0), 0);
        }
        struct mallinfo2 after = mallinfo2();
        size_t used = after.uordblks - before.uordblks;
        size_t ideal = N * (sizeof(struct dw_rel_peer) + p.window * sizeof(struct dw_rel_txent));
        fprintf(stderr,
                "rel: sizeof(struct dw_rel_peer) = %zu, txent = %zu, window %u: %zu peers "
                "heap %zu bytes (%.2f MiB; ideal %zu)\n",
                sizeof(struct dw_rel_peer), sizeof(struct dw_rel_txent), p.window, (size_t)N, used,
                (double)used / (1024 * 1024), ideal);
        if (used) /* 0 under ASan */
                cr_assert_lt(used, ideal + (size_t)N * 64, "malloc overhead per peer < 64 B");
        for (int i = 0; i < N; i++) {
                free(peers[i]);
                free(rings[i]);
        }
        free(peers);
        free(rings);
        cr_assert_leq(sizeof(struct dw_rel_peer), 256);
}

/* An RD stream learns the peer's first PSN from its START descriptor after
 * the peer state exists: the receive side starts over there, and a PSN of
 * the old position is no longer in its window. */
Test(rel, rx_start_moves_the_receive_side)
{
        struct dw_rel_params p = test_params();
        struct dw_rel_txent ring[16];
        struct dw_rel_peer r;
        cr_assert_eq(dw_rel_peer_init(&r, &p, ring, 16, 500, 0), 0);
        dw_rel_rx_start(&r, 0xfffffff0u);
        cr_assert_eq(dw_rel_rx_cursor(&r), 0xfffffff0u);
        cr_assert_eq(dw_rel_rx_classify(&r, 0), DW_REL_NEW, "16 ahead, across the wrap");
        cr_assert_eq(dw_rel_rx_classify(&r, 0x70), DW_REL_OUT_OF_WINDOW, "past the window");
        enum dw_rel_verdict v;
        cr_assert_eq(dw_rel_rx_data(&r, 0xfffffff0u, false, T0, &v), 1);
        cr_assert_eq(v, DW_REL_NEW);
        cr_assert_eq(dw_rel_rx_classify(&r, 0xfffffff0u), DW_REL_DUPLICATE);
        /* The send side is untouched. */
        cr_assert_eq(dw_rel_tx_next_psn(&r), 500);
}

/* A data packet sent while no ACK is owed repeats the cumulative point, but
 * only once an ACK was built since the receive side (re)started, never with
 * SACK blocks, and without touching the owed-ACK state. */
Test(rel, ack_repeat_after_first_ack)
{
        struct dw_rel_params p;
        struct dw_rel_txent ring[8];
        struct dw_rel_peer r;
        dw_rel_params_default(&p);
        cr_assert_eq(dw_rel_peer_init(&r, &p, ring, 8, 0, 500), 0);
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA};
        cr_assert_not(dw_rel_ack_repeat(&r, &h), "no ACK built yet: the cursor is unproven");
        cr_assert_eq(h.flags, DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        cr_assert_eq(dw_rel_rx_data(&r, 500, false, 1000, NULL), 1u);
        cr_assert_eq(dw_rel_rx_data(&r, 502, false, 1000, NULL), 0u); /* a hole at 501 */
        cr_assert(dw_rel_ack_owed(&r));
        struct dw_dgram_hdr a = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA};
        cr_assert_eq(dw_rel_build_ack(&r, &a, DW_DGRAM_MAX_SACK), 1);
        cr_assert_not(dw_rel_ack_owed(&r));
        uint32_t built = r.stats.acks_built;
        h = (struct dw_dgram_hdr){.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA};
        cr_assert(dw_rel_ack_repeat(&r, &h));
        cr_assert_eq(h.flags, DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK);
        cr_assert_eq(h.ack_psn, 501u);
        cr_assert_eq(h.sack_count, 0);
        cr_assert_not(dw_rel_ack_owed(&r), "a repeat leaves the owed-ACK state alone");
        cr_assert_eq(r.stats.acks_built, built);
        /* A NAK is not an ACK. */
        struct dw_dgram_hdr n = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_NAK, .ack_psn = 7};
        cr_assert_not(dw_rel_ack_repeat(&r, &n));
        cr_assert_eq(n.ack_psn, 7u);
        /* The peer's stream starts over: nothing is repeated until an ACK of
         * the new start was built. */
        dw_rel_rx_start(&r, 9000);
        h = (struct dw_dgram_hdr){.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA};
        cr_assert_not(dw_rel_ack_repeat(&r, &h));
        cr_assert_eq(dw_rel_rx_data(&r, 9000, false, 2000, NULL), 1u);
        dw_rel_build_ack(&r, &a, 0);
        cr_assert(dw_rel_ack_repeat(&r, &h));
        cr_assert_eq(h.ack_psn, 9001u);
}
