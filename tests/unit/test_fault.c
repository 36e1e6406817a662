/* Fault injection: spec parsing and the statistical behaviour of each fault
 * with a fixed seed. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "util/fault.h"

#define REC_MAX   256
#define REC_SLOTS 25000

struct rec {
        uint8_t data[REC_MAX];
        size_t len;
        struct sockaddr_in addr;
        socklen_t addrlen;
};

struct sink {
        struct rec *r;
        size_t n;
        int fail_with; /* nonzero: every send returns this */
};

static int sink_send(void *ctx, const struct iovec *iov, int iovcnt, const void *addr,
                     socklen_t addrlen)
{
        struct sink *s = ctx;
        struct rec *r;
        size_t off = 0;

        if (s->fail_with)
                return s->fail_with;
        cr_assert_lt(s->n, REC_SLOTS, "sink overflow");
        r = &s->r[s->n++];
        for (int i = 0; i < iovcnt; i++) {
                cr_assert_leq(off + iov[i].iov_len, REC_MAX);
                memcpy(r->data + off, iov[i].iov_base, iov[i].iov_len);
                off += iov[i].iov_len;
        }
        r->len = off;
        r->addrlen = addrlen;
        if (addr && addrlen == sizeof(r->addr))
                memcpy(&r->addr, addr, addrlen);
        return (int)off;
}

static struct sink *sink_new(void)
{
        struct sink *s = calloc(1, sizeof(*s));

        s->r = calloc(REC_SLOTS, sizeof(*s->r));
        cr_assert(s && s->r);
        return s;
}

static void sink_free(struct sink *s)
{
        free(s->r);
        free(s);
}

/* A 32-byte packet whose first 4 bytes are its sequence number. */
static void make_pkt(uint8_t *buf, uint32_t seq)
{
        memcpy(buf, &seq, 4);
        for (int i = 4; i < 32; i++)
                buf[i] = (uint8_t)(seq * 31 + (uint32_t)i);
}

static uint32_t rec_seq(const struct rec *r)
{
        uint32_t seq;

        memcpy(&seq, r->data, 4);
        return seq;
}

static struct sockaddr_in dst(void)
{
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7471)};

        a.sin_addr.s_addr = htonl(0x7f000001);
        return a;
}

/* Sends n packets (seq 0..n-1) at now_ns = i * step_ns; returns the counters. */
static struct diwarp_counters run(struct dw_fault *f, struct sink *s, uint32_t n, uint64_t step_ns)
{
        struct diwarp_counters c = {0};
        struct sockaddr_in a = dst();
        uint8_t buf[32];

        for (uint32_t i = 0; i < n; i++) {
                struct iovec v = {.iov_base = buf, .iov_len = sizeof(buf)};

                make_pkt(buf, i);
                int rc =
                    dw_fault_tx(f, &v, 1, &a, sizeof(a), (uint64_t)i * step_ns, sink_send, s, &c);
                cr_assert_eq(rc, 32, "tx of packet %u returned %d", i, rc);
        }
        return c;
}

/* ---- parsing ------------------------------------------------------------ */

Test(fault_parse, full_spec)
{
        struct dw_fault_params p;
        char why[160];

        cr_assert_eq(dw_fault_parse("drop:0.01,dup:1%,reorder:0.1,corrupt:0.25,delay:200", &p, why,
                                    sizeof(why)),
                     0, "%s", why);
        cr_assert_float_eq(p.drop, 0.01, 1e-12);
        cr_assert_float_eq(p.dup, 0.01, 1e-12);
        cr_assert_float_eq(p.reorder, 0.1, 1e-12);
        cr_assert_float_eq(p.corrupt, 0.25, 1e-12);
        cr_assert_eq(p.delay_us, 200);
}

Test(fault_parse, boundaries_and_off)
{
        struct dw_fault_params p;

        cr_assert_eq(dw_fault_parse("drop:0,dup:1,corrupt:100%,reorder:0%", &p, NULL, 0), 0);
        cr_assert_float_eq(p.dup, 1.0, 1e-12);
        cr_assert_float_eq(p.corrupt, 1.0, 1e-12);
        cr_assert_eq(dw_fault_parse("", &p, NULL, 0), 0);
        cr_assert_eq(dw_fault_parse(NULL, &p, NULL, 0), 0);
        cr_assert_eq(dw_fault_parse("off", &p, NULL, 0), 0);
        cr_assert_float_eq(p.drop, 0.0, 0);
        cr_assert_eq(p.delay_us, 0);
}

Test(fault_parse, rejects_malformed)
{
        static const char *const bad[] = {
            "drop:2",
            "drop:x",
            "bogus:0.1",
            "drop:0.1,,dup:0.1",
            ",drop:0.1",
            "drop:0.1,",
            ",",
            "drop",
            "drop:",
            "drop:-0.1",
            "drop:nan",
            "drop:inf",
            "drop:101%",
            "drop:%",
            "drop:0.1%x",
            "delay:1.5",
            "delay:-1",
            "delay:x",
            "delay:20000000",
            "drop:0.1,drop:0.2",
            "drop :0.1",
            "drop:0x1p-2",
            "drop:1e-3",
            "slowrx:0",
            "slowrx:",
            "slowrx:k",
            "slowrx:1.5m",
            "slowrx:-5",
            "slowrx:2000g",
            "slowrx:10x",
            "slowrx:1m,slowrx:2m",
        };

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct dw_fault_params p;
                char why[160] = "";

                cr_assert_eq(dw_fault_parse(bad[i], &p, why, sizeof(why)), -EINVAL,
                             "spec '%s' accepted", bad[i]);
                cr_assert(strncmp(why, "DIWARP_FAULT", 12) == 0, "no reason for '%s': '%s'", bad[i],
                          why);
        }
}

Test(fault_parse, slowrx_rates)
{
        struct dw_fault_params p;
        char why[160];

        cr_assert_eq(dw_fault_parse("slowrx:15625000", &p, why, sizeof(why)), 0, "%s", why);
        cr_assert_eq(p.slowrx_bps, 15625000);
        cr_assert_eq(dw_fault_parse("slowrx:125k", &p, NULL, 0), 0);
        cr_assert_eq(p.slowrx_bps, 125000);
        cr_assert_eq(dw_fault_parse("drop:0.01,slowrx:2M", &p, NULL, 0), 0);
        cr_assert_eq(p.slowrx_bps, 2000000);
        cr_assert_eq(dw_fault_parse("slowrx:1000g", &p, NULL, 0), 0);
        cr_assert_eq(p.slowrx_bps, 1000000000000ull);
}

/* slowrx on its own is no transmit fault (the transmit path keeps GSO), and
 * its bucket lets a receiver read at the rate: 1 MB/s, 1 ms of burst. */
Test(fault_rx, slowrx_paces_reads)
{
        struct dw_fault f;
        cr_assert_eq(dw_fault_init(&f, "slowrx:1m", 1, NULL), 0);
        cr_assert_not(dw_fault_enabled(&f));
        cr_assert(dw_fault_rx_throttled(&f));
        uint64_t t = 5000000000ull;
        cr_assert_eq(dw_fault_rx_wait(&f, t), 0);
        /* 1000 bytes banked as a burst (1 ms at 1 MB/s), then 1 ms per 1000. */
        dw_fault_rx_took(&f, 1000, t);
        cr_assert_eq(dw_fault_rx_wait(&f, t), 0);
        dw_fault_rx_took(&f, 2000, t);
        cr_assert_eq(dw_fault_rx_wait(&f, t), t + 2000000);
        cr_assert_eq(dw_fault_rx_wait(&f, t + 2000000), 0);
        /* A receiver that read nothing for a second banks only the burst. */
        t += 1000000000ull;
        dw_fault_rx_took(&f, 3000, t);
        cr_assert_eq(dw_fault_rx_wait(&f, t), t + 2000000);
        dw_fault_destroy(&f);
        cr_assert_eq(dw_fault_init(&f, "drop:0.5", 1, NULL), 0);
        cr_assert_eq(dw_fault_rx_wait(&f, t), 0, "no throttle without slowrx");
        dw_fault_destroy(&f);
}

Test(fault_parse, reason_names_the_item)
{
        struct dw_fault f;
        const char *why = NULL;

        cr_assert_eq(dw_fault_init(&f, "dup:0.1,drop:2", 1, &why), -EINVAL);
        cr_assert_not_null(why);
        cr_assert_not_null(strstr(why, "drop:2"), "reason: %s", why);
        cr_assert_eq(dw_fault_init(&f, "bogus:0.1", 1, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "bogus:0.1"), "reason: %s", why);
        cr_assert_eq(dw_fault_init(&f, "drop:0.1,,dup:0.1", 1, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "empty item"), "reason: %s", why);
}

/* ---- behaviour ---------------------------------------------------------- */

Test(fault_tx, disabled_is_passthrough)
{
        struct dw_fault f;
        struct sink *s = sink_new();

        cr_assert_eq(dw_fault_init(&f, NULL, 1, NULL), 0);
        cr_assert_not(dw_fault_enabled(&f));
        struct diwarp_counters c = run(&f, s, 100, 1000);
        cr_assert_eq(s->n, 100);
        for (uint32_t i = 0; i < 100; i++)
                cr_assert_eq(rec_seq(&s->r[i]), i);
        cr_assert_eq(c.fault_dropped + c.fault_duplicated + c.fault_corrupted, 0);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, drop_rate)
{
        struct dw_fault f;
        struct sink *s = sink_new();

        cr_assert_eq(dw_fault_init(&f, "drop:0.2", 42, NULL), 0);
        cr_assert(dw_fault_enabled(&f));
        struct diwarp_counters c = run(&f, s, 10000, 1000);
        cr_assert(c.fault_dropped >= 1800 && c.fault_dropped <= 2200, "dropped %lu",
                  (unsigned long)c.fault_dropped);
        cr_assert_eq(s->n + c.fault_dropped, 10000);
        /* Survivors keep their order and content. */
        for (size_t i = 1; i < s->n; i++)
                cr_assert_lt(rec_seq(&s->r[i - 1]), rec_seq(&s->r[i]));
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, deterministic_per_seed)
{
        struct dw_fault a, b, d;
        struct sink *sa = sink_new(), *sb = sink_new(), *sd = sink_new();

        cr_assert_eq(dw_fault_init(&a, "drop:0.3", 7, NULL), 0);
        cr_assert_eq(dw_fault_init(&b, "drop:0.3", 7, NULL), 0);
        cr_assert_eq(dw_fault_init(&d, "drop:0.3", 8, NULL), 0);
        run(&a, sa, 2000, 1000);
        run(&b, sb, 2000, 1000);
        run(&d, sd, 2000, 1000);
        cr_assert_eq(sa->n, sb->n);
        for (size_t i = 0; i < sa->n; i++)
                cr_assert_eq(rec_seq(&sa->r[i]), rec_seq(&sb->r[i]));
        bool differs = sa->n != sd->n;
        for (size_t i = 0; !differs && i < sa->n; i++)
                differs = rec_seq(&sa->r[i]) != rec_seq(&sd->r[i]);
        cr_assert(differs, "seeds 7 and 8 gave the same drop pattern");
        dw_fault_destroy(&a);
        dw_fault_destroy(&b);
        dw_fault_destroy(&d);
        sink_free(sa);
        sink_free(sb);
        sink_free(sd);
}

static int popcount_diff(const uint8_t *x, const uint8_t *y, size_t n)
{
        int bits = 0;

        for (size_t i = 0; i < n; i++)
                bits += __builtin_popcount((unsigned)(x[i] ^ y[i]));
        return bits;
}

Test(fault_tx, corrupt_flips_one_bit_in_a_copy)
{
        struct dw_fault f;
        struct sink *s = sink_new();
        struct diwarp_counters c = {0};
        struct sockaddr_in a = dst();

        cr_assert_eq(dw_fault_init(&f, "corrupt:1", 3, NULL), 0);
        for (uint32_t i = 0; i < 1000; i++) {
                /* Split over three iovecs so the gather path is exercised too. */
                uint8_t buf[32], orig[32];
                struct iovec v[3] = {{buf, 5}, {buf + 5, 0}, {buf + 5, 27}};

                make_pkt(buf, i);
                memcpy(orig, buf, sizeof(buf));
                cr_assert_eq(dw_fault_tx(&f, v, 3, &a, sizeof(a), i, sink_send, s, &c), 32);
                cr_assert_eq(memcmp(buf, orig, sizeof(buf)), 0, "caller buffer modified");
                cr_assert_eq(s->n, i + 1);
                cr_assert_eq(s->r[i].len, 32);
                cr_assert_eq(popcount_diff(s->r[i].data, orig, 32), 1, "packet %u", i);
        }
        cr_assert_eq(c.fault_corrupted, 1000);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, corrupt_rate)
{
        struct dw_fault f;
        struct sink *s = sink_new();

        cr_assert_eq(dw_fault_init(&f, "corrupt:10%", 11, NULL), 0);
        struct diwarp_counters c = run(&f, s, 10000, 1000);
        size_t bad = 0;
        for (size_t i = 0; i < s->n; i++) {
                uint8_t orig[32];

                make_pkt(orig, (uint32_t)i);
                bad += memcmp(orig, s->r[i].data, 32) != 0;
        }
        cr_assert_eq(s->n, 10000);
        cr_assert_eq(bad, c.fault_corrupted);
        cr_assert(bad >= 850 && bad <= 1150, "corrupted %zu", bad);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, dup_sends_twice)
{
        struct dw_fault f;
        struct sink *s = sink_new();

        cr_assert_eq(dw_fault_init(&f, "dup:1", 5, NULL), 0);
        struct diwarp_counters c = run(&f, s, 500, 1000);
        cr_assert_eq(s->n, 1000);
        cr_assert_eq(c.fault_duplicated, 500);
        for (uint32_t i = 0; i < 500; i++) {
                cr_assert_eq(rec_seq(&s->r[2 * i]), i);
                cr_assert_eq(memcmp(s->r[2 * i].data, s->r[2 * i + 1].data, 32), 0);
                cr_assert_eq(s->r[2 * i + 1].addr.sin_port, htons(7471));
        }
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, dup_rate)
{
        struct dw_fault f;
        struct sink *s = sink_new();

        cr_assert_eq(dw_fault_init(&f, "dup:0.3", 9, NULL), 0);
        struct diwarp_counters c = run(&f, s, 10000, 1000);
        cr_assert(c.fault_duplicated >= 2700 && c.fault_duplicated <= 3300, "dup %lu",
                  (unsigned long)c.fault_duplicated);
        cr_assert_eq(s->n, 10000 + c.fault_duplicated);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, reorder_releases_later_and_never_loses)
{
        struct dw_fault f;
        struct sink *s = sink_new();
        const uint32_t n = 10000;

        cr_assert_eq(dw_fault_init(&f, "reorder:0.2", 13, NULL), 0);
        struct diwarp_counters c = run(&f, s, n, 1000);
        cr_assert(c.fault_reordered >= 1800 && c.fault_reordered <= 2200, "reordered %lu",
                  (unsigned long)c.fault_reordered);
        cr_assert_geq(dw_fault_flush_all(&f, sink_send, s), 0);
        cr_assert_eq(dw_fault_held_count(&f), 0);
        cr_assert_eq(s->n, n, "sent %zu of %u", s->n, n);

        /* Every packet exactly once, and packets really were overtaken. */
        uint8_t *seen = calloc(n, 1);
        size_t inversions = 0;
        uint32_t max_seen = 0;
        for (size_t i = 0; i < s->n; i++) {
                uint32_t q = rec_seq(&s->r[i]);

                cr_assert_lt(q, n);
                cr_assert_eq(seen[q], 0, "packet %u twice", q);
                seen[q] = 1;
                if (i > 0 && q < max_seen)
                        inversions++;
                if (q > max_seen)
                        max_seen = q;
                cr_assert_eq(s->r[i].addr.sin_addr.s_addr, htonl(0x7f000001));
        }
        cr_assert(inversions >= c.fault_reordered / 2, "only %zu late packets for %lu held",
                  inversions, (unsigned long)c.fault_reordered);
        free(seen);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, reorder_time_bound_when_idle)
{
        struct dw_fault f;
        struct sink *s = sink_new();
        struct sockaddr_in a = dst();
        uint8_t buf[32];
        struct iovec v = {buf, sizeof(buf)};

        cr_assert_eq(dw_fault_init(&f, "reorder:1", 1, NULL), 0);
        make_pkt(buf, 0);
        cr_assert_eq(dw_fault_tx(&f, &v, 1, &a, sizeof(a), 1000, sink_send, s, NULL), 32);
        cr_assert_eq(s->n, 0, "reordered packet went out at once");
        cr_assert_eq(dw_fault_held_count(&f), 1);
        cr_assert_eq(dw_fault_next_due_ns(&f), 1000 + DW_FAULT_REORDER_MAX_NS);
        cr_assert_eq(dw_fault_flush_due(&f, 1000 + DW_FAULT_REORDER_MAX_NS - 1, sink_send, s), 0);
        cr_assert_eq(s->n, 0);
        cr_assert_eq(dw_fault_flush_due(&f, 1000 + DW_FAULT_REORDER_MAX_NS, sink_send, s), 1);
        cr_assert_eq(s->n, 1);
        cr_assert_eq(rec_seq(&s->r[0]), 0);
        cr_assert_eq(dw_fault_next_due_ns(&f), UINT64_MAX);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, delay_releases_after_the_delay)
{
        struct dw_fault f;
        struct sink *s = sink_new();
        struct diwarp_counters c = {0};
        struct sockaddr_in a = dst();
        const uint64_t t0 = 5000000;

        cr_assert_eq(dw_fault_init(&f, "delay:500", 1, NULL), 0);
        for (uint32_t i = 0; i < 10; i++) {
                uint8_t buf[32];
                struct iovec v = {buf, sizeof(buf)};

                make_pkt(buf, i);
                /* 10 us apart: packet i is due at t0 + 500 us + 10 us * i. */
                cr_assert_eq(
                    dw_fault_tx(&f, &v, 1, &a, sizeof(a), t0 + i * 10000ull, sink_send, s, &c), 32);
        }
        cr_assert_eq(s->n, 0);
        cr_assert_eq(c.fault_delayed, 10);
        cr_assert_eq(dw_fault_next_due_ns(&f), t0 + 500000);
        cr_assert_eq(dw_fault_flush_due(&f, t0 + 499999, sink_send, s), 0);
        cr_assert_eq(dw_fault_flush_due(&f, t0 + 500000, sink_send, s), 1);
        cr_assert_eq(dw_fault_flush_due(&f, t0 + 500000 + 45000, sink_send, s), 4);
        cr_assert_eq(dw_fault_flush_due(&f, t0 + 10000000, sink_send, s), 5);
        cr_assert_eq(s->n, 10);
        for (uint32_t i = 0; i < 10; i++) {
                cr_assert_eq(rec_seq(&s->r[i]), i, "delay changed the order");
                cr_assert_eq(s->r[i].addrlen, sizeof(a));
                cr_assert_eq(s->r[i].addr.sin_port, htons(7471));
        }
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, full_hold_queue_releases_oldest_early)
{
        struct dw_fault f;
        struct sink *s = sink_new();
        const uint32_t n = DW_FAULT_HOLD_SLOTS + 36;

        cr_assert_eq(dw_fault_init(&f, "delay:1000000", 1, NULL), 0);
        run(&f, s, n, 0); /* all at t=0, nothing due */
        cr_assert_eq(s->n, 36, "queue of %d slots let %zu out early", DW_FAULT_HOLD_SLOTS, s->n);
        cr_assert_eq(dw_fault_held_count(&f), DW_FAULT_HOLD_SLOTS);
        cr_assert_eq(dw_fault_flush_all(&f, sink_send, s), DW_FAULT_HOLD_SLOTS);
        cr_assert_eq(s->n, n);
        for (uint32_t i = 0; i < n; i++)
                cr_assert_eq(rec_seq(&s->r[i]), i);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, transient_send_error_keeps_packet_held)
{
        struct dw_fault f;
        struct sink *s = sink_new();

        cr_assert_eq(dw_fault_init(&f, "delay:10", 1, NULL), 0);
        run(&f, s, 3, 0);
        s->fail_with = -EAGAIN;
        cr_assert_eq(dw_fault_flush_due(&f, 1000000, sink_send, s), -EAGAIN);
        cr_assert_eq(dw_fault_held_count(&f), 3);
        s->fail_with = 0;
        cr_assert_eq(dw_fault_flush_due(&f, 1000000, sink_send, s), 3);
        cr_assert_eq(s->n, 3);
        cr_assert_eq(dw_fault_held_count(&f), 0);
        dw_fault_destroy(&f);
        sink_free(s);
}

Test(fault_tx, combined_spec_conserves_packets)
{
        struct dw_fault f;
        struct sink *s = sink_new();
        const uint32_t n = 5000;

        cr_assert_eq(
            dw_fault_init(&f, "drop:0.05,dup:0.05,reorder:0.1,corrupt:0.05,delay:50", 21, NULL), 0);
        struct diwarp_counters c = run(&f, s, n, 20000);
        cr_assert_geq(dw_fault_flush_all(&f, sink_send, s), 0);
        cr_assert_eq(s->n, n - c.fault_dropped + c.fault_duplicated);
        cr_assert_eq(c.fault_delayed, n - c.fault_dropped);
        dw_fault_destroy(&f);
        sink_free(s);
}
