/* Congestion control of a path (flow/cc): the window arithmetic, pacing, and
 * N flows through a simulated drop-tail bottleneck (a packet-level model
 * with a FIFO queue of fixed bytes, per-packet ACKs and SACK-style loss
 * detection). The simulations assert what the real-network benchmark asks
 * of the algorithm (bench/run.py, group contention): the link stays full,
 * flows share it fairly, a queue deeper than the target never overflows,
 * random loss costs little, and a latecomer gets its share.
 *
 * DIWARP_CC_TRACE=1 prints each simulation's per-flow results. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/cc.h"
#include "flow/path.h"

#define US 1000ull
#define MS 1000000ull

/* ---------------------------------------------------------------- unit */

/* The unit tests leave out the synchronised drain (its own test below). */
static struct dw_cc_params params(void)
{
        struct dw_cc_params p;
        dw_cc_params_default(&p);
        p.drain_period_ns = 0;
        return p;
}

Test(cc, initial_window_and_first_send)
{
        struct dw_cc_params p = params();
        struct dw_cc c;
        dw_cc_init(&c, &p, 1500);
        cr_assert_eq(c.cwnd, 10 * 1500);
        /* Nothing in flight: a send always may (no RTT yet: not paced). */
        cr_assert(dw_cc_can_send(&c, 0, 1500, 0));
        for (int i = 0; i < 10; i++)
                dw_cc_sent(&c, 1500, false, 0);
        cr_assert_eq(c.inflight, 15000);
        cr_assert_not(dw_cc_can_send(&c, 0, 1500, 0), "the window is full");
        cr_assert_eq(c.stats.cwnd_waits, 1);
        /* Slow start: the ACK grows the window by what it acknowledged. */
        dw_cc_acked(&c, 3000, 0);
        cr_assert_eq(c.inflight, 12000);
        cr_assert_eq(c.cwnd, 18000);
        /* Bytes built but not yet sent count against the window. */
        cr_assert(dw_cc_can_send(&c, 4500, 1500, 0));
        cr_assert_not(dw_cc_can_send(&c, 6000, 1500, 0));
}

/* The standing RTT is the least sample of the last half round (at least
 * 0.5 ms): these tests feed samples far enough apart to fill it. */
#define STAND (600 * US)

Test(cc, slow_start_doubles_then_delay_ends_it)
{
        struct dw_cc_params p = params();
        struct dw_cc c;
        uint64_t t = 1 * MS;
        dw_cc_init(&c, &p, 1000);
        dw_cc_rtt(&c, 50 * US, t);
        uint32_t w = c.cwnd;
        dw_cc_sent(&c, w, false, t);
        dw_cc_acked(&c, w, t);
        cr_assert_eq(c.cwnd, 2 * w, "a round of ACKs doubles the window");
        /* The queue grows past half the target: slow start ends. */
        dw_cc_rtt(&c, 50 * US + p.target_ns, t + STAND);
        dw_cc_rtt(&c, 50 * US + p.target_ns, t + 2 * STAND);
        dw_cc_acked(&c, 1000, t + 2 * STAND);
        cr_assert_eq(c.ssthresh, c.cwnd);
}

Test(cc, delay_over_target_takes_the_queue_share_once_per_round)
{
        struct dw_cc_params p = params();
        struct dw_cc c;
        uint64_t t = 1 * MS;
        dw_cc_init(&c, &p, 1000);
        c.ssthresh = c.cwnd = 100000;
        dw_cc_rtt(&c, 500 * US, t); /* the path's minimum */
        /* A queue of 1.5 × the target: the window loses its share of the
         * queue, q / RTT. */
        uint32_t q = p.target_ns + p.target_ns / 2;
        dw_cc_rtt(&c, 500 * US + q, t + STAND);
        dw_cc_rtt(&c, 500 * US + q, t + 2 * STAND);
        dw_cc_acked(&c, 1000, t + 2 * STAND);
        uint64_t f = (uint64_t)DW_CC_ONE * q / (500 * US + q);
        uint32_t want = 100000 - (uint32_t)(100000ull * f / DW_CC_ONE);
        cr_assert_eq(c.cwnd, want, "cwnd %u want %u", c.cwnd, want);
        cr_assert_eq(c.stats.md_delay, 1);
        dw_cc_acked(&c, 1000, t + 2 * STAND + 1 * US);
        cr_assert_eq(c.cwnd, want, "at most once per round");
        /* A queue far over the target: at most half per round. */
        dw_cc_rtt(&c, 500 * US + 10 * p.target_ns, t + 4 * STAND);
        dw_cc_rtt(&c, 500 * US + 10 * p.target_ns, t + 5 * STAND);
        dw_cc_acked(&c, 1000, t + 5 * STAND);
        cr_assert_eq(c.cwnd, want - want * p.max_mdf / DW_CC_ONE);
}

Test(cc, one_late_ack_is_not_a_queue)
{
        struct dw_cc_params p = params();
        struct dw_cc c;
        uint64_t t = 1 * MS;
        dw_cc_init(&c, &p, 1000);
        c.ssthresh = c.cwnd = 100000;
        dw_cc_rtt(&c, 100 * US, t);
        /* A stall of 2 ms (the receiver was not scheduled) among samples
         * that show no queue: no decrease. */
        dw_cc_rtt(&c, 100 * US, t + STAND);
        dw_cc_rtt(&c, 2 * MS, t + STAND + 100 * US);
        dw_cc_rtt(&c, 110 * US, t + STAND + 200 * US);
        dw_cc_acked(&c, 1000, t + STAND + 200 * US);
        cr_assert_eq(c.stats.md_delay, 0);
        cr_assert_geq(c.cwnd, 100000);
}

Test(cc, loss_with_queue_halves_noise_loss_trims)
{
        struct dw_cc_params p = params();
        struct dw_cc c;
        uint64_t t = 1 * MS;
        dw_cc_init(&c, &p, 1000);
        c.ssthresh = c.cwnd = 80000;
        dw_cc_rtt(&c, 100 * US, t);
        dw_cc_lost(&c, DW_CC_LOSS_FAST, t + 10 * US);
        cr_assert_eq(c.cwnd, 80000 - 80000 * p.noise_mdf / DW_CC_ONE,
                     "no queue seen: a random loss costs 1/16");
        dw_cc_lost(&c, DW_CC_LOSS_FAST, t + 20 * US);
        cr_assert_eq(c.stats.md_loss, 1, "the same round counts once");
        t += 5 * MS;
        dw_cc_rtt(&c, 100 * US + p.target_ns / 2, t);
        dw_cc_rtt(&c, 100 * US + p.target_ns / 2, t + STAND);
        uint32_t w = c.cwnd;
        dw_cc_lost(&c, DW_CC_LOSS_FAST, t + STAND);
        cr_assert_eq(c.cwnd, w - w * p.loss_mdf / DW_CC_ONE, "a queue was building: halve");
        /* That loss came at half the target: the target drops under it. */
        cr_assert_eq(c.loss_q, p.target_ns / 2 - p.target_ns / 8);
        dw_cc_lost(&c, DW_CC_LOSS_RTO, t + STAND + 1 * US);
        cr_assert_eq(c.cwnd, 1000, "RTO: one datagram");
        cr_assert_eq(c.stats.rto, 1);
        /* A probe's verdict decreases but teaches no target. */
        c.loss_q = 0;
        dw_cc_lost(&c, DW_CC_LOSS_PROBE, t + 10 * MS);
        cr_assert_eq(c.loss_q, 0);
}

Test(cc, pacing_spaces_sends)
{
        struct dw_cc_params p = params();
        p.burst_ns = 50 * US;
        struct dw_cc c;
        uint64_t t = 1 * MS;
        dw_cc_init(&c, &p, 1000);
        c.ssthresh = c.cwnd = 10000;
        dw_cc_rtt(&c, 100 * US, t);
        /* 10 000 bytes per 100 µs × 1.25: 125 MB/s, 8 ns per byte. */
        cr_assert_eq(c.pace_ps, 8000);
        cr_assert_eq(dw_cc_rate(&c), 125000000ull);
        /* Idle: a burst of burst_ns at the rate goes at once (50 µs here,
         * below the window: 6250 B, each 1000-byte datagram 8 µs of it). */
        int n = 0;
        while (dw_cc_can_send(&c, 0, 1000, t) && n < 100) {
                dw_cc_sent(&c, 1000, false, t);
                n++;
        }
        cr_assert_eq(n, 7, "sent %d", n);
        uint64_t next = dw_cc_next_send(&c, t);
        cr_assert(next > t && next <= t + 8 * US, "next %llu", (unsigned long long)(next - t));
        cr_assert(dw_cc_can_send(&c, 0, 1000, next));
}

Test(cc, drain_is_quiet_then_one_probe_at_the_shared_phase)
{
        struct dw_cc_params p = params();
        p.drain_period_ns = 100 * MS;
        p.clock_offset_ns = 30 * MS; /* this host's wall clock is 30 ms ahead */
        struct dw_cc c;
        dw_cc_init(&c, &p, 1000);
        c.ssthresh = c.cwnd = 80000;
        uint64_t t = 1070 * MS; /* wall clock 1100 ms: a period starts */
        dw_cc_rtt(&c, 50 * US, t - 5 * MS);
        /* The drain lasts 2 (target + min RTT) = 700 µs, at least 1 ms. */
        cr_assert(dw_cc_can_send(&c, 0, 1000, t - 1 * US));
        cr_assert_not(dw_cc_can_send(&c, 0, 1000, t), "quiet: nothing leaves");
        cr_assert_not(dw_cc_can_send(&c, 0, 1000, t + 499 * US));
        uint64_t probe = dw_cc_next_send(&c, t);
        cr_assert(probe >= t + 500 * US && probe <= t + 750 * US, "probe at +%llu µs",
                  (unsigned long long)(probe - t) / 1000);
        cr_assert(dw_cc_can_send(&c, 0, 1000, probe), "one probe");
        dw_cc_sent(&c, 1000, false, probe);
        cr_assert_not(dw_cc_can_send(&c, 0, 1000, probe), "only one");
        uint32_t w = c.cwnd;
        dw_cc_acked(&c, 1000, probe + 60 * US);
        cr_assert_eq(c.cwnd, w, "no growth while draining");
        cr_assert(dw_cc_can_send(&c, 0, 1000, t + 1 * MS), "after it: the whole window");
        cr_assert_gt(c.stats.drain_waits, 0);
}

Test(cc, disabled_never_holds)
{
        struct dw_cc_params p = params();
        p.enabled = false;
        struct dw_cc c;
        dw_cc_init(&c, &p, 1000);
        for (int i = 0; i < 1000; i++) {
                cr_assert(dw_cc_can_send(&c, 0, 1000, 0));
                dw_cc_sent(&c, 1000, false, 0);
        }
        dw_cc_lost(&c, DW_CC_LOSS_RTO, 1);
        cr_assert_eq(c.stats.rto, 0);
}

Test(cc, paths_are_shared_per_address)
{
        struct dw_cc_params p = params();
        struct dw_flow_paths t;
        dw_flow_paths_init(&t, &p);
        struct dw_flow_path *a = dw_flow_path_get(&t, 0x0100000a, 100, 1500);
        struct dw_flow_path *b = dw_flow_path_get(&t, 0x0100000a, 100, 9000);
        struct dw_flow_path *c = dw_flow_path_get(&t, 0x0100000a, 101, 1500);
        cr_assert_eq(a, b, "same address: same path");
        cr_assert_neq(a, c);
        cr_assert_eq(a->refs, 2);
        cr_assert_eq(a->cc.seg, 1500, "the first stream sizes it");
        for (int i = 0; i < 200; i++)
                cr_assert_not_null(dw_flow_path_get(&t, 0x0200000a + i, 7, 1500));
        cr_assert_eq(t.n, 202);
        dw_flow_path_put(&t, b);
        dw_flow_path_put(&t, a);
        dw_flow_path_put(&t, c);
        cr_assert_eq(t.n, 200);
        dw_flow_paths_fini(&t);
}

/* ------------------------------------------------------------ simulation */

#define SIM_MAX_FLOWS 64
#define SIM_QCAP      (1 << 16)

struct sim_pkt {
        int flow;
        uint32_t bytes;
        uint64_t sent;
        uint64_t seq;
        bool retx;
};

struct sim_ack {
        int flow;
        uint32_t bytes;
        uint64_t at;   /* arrival at the sender */
        uint64_t sent; /* for the RTT sample */
        uint64_t seq;
        bool retx;
};

struct sim_flow {
        struct dw_cc c;
        uint64_t start, stop;
        uint64_t next_seq;
        uint64_t acked_bytes, acked_in_window;
        uint64_t sent_pkts, retx_pkts;
        uint64_t highest_acked;
        /* lost sequence numbers waiting for their detection / resend */
        uint64_t lost[4096];
        uint64_t lost_at[4096];
        unsigned nlost;
        uint64_t max_rate; /* bytes per µs the sender can produce (CPU); 0 = unlimited */
        uint64_t last_ack;
        uint64_t budget;
};

struct sim {
        struct dw_cc_params p;
        int nflows;
        struct sim_flow f[SIM_MAX_FLOWS];
        uint64_t rate_bpus; /* link bytes per µs */
        uint64_t qcap;      /* queue bytes */
        uint64_t prop;      /* one-way propagation, ns (each direction) */
        double random_loss;
        uint64_t seed;
        /* bottleneck queue */
        struct sim_pkt q[SIM_QCAP];
        unsigned qh, qn;
        uint64_t qbytes;
        uint64_t credit; /* bytes the link may serve now */
        /* ACKs in flight back */
        struct sim_ack *acks;
        unsigned ah, an, acap;
        uint64_t drops, random_drops, sent, delivered_bytes;
        uint64_t qdelay_sum, qdelay_n;
        uint64_t measure_from, measure_to;
        uint32_t seg;
};

static double rnd(struct sim *s)
{
        s->seed = s->seed * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(s->seed >> 11) / 9007199254740992.0;
}

static void sim_init(struct sim *s, int nflows, uint64_t mbps, uint64_t qbytes, uint64_t rtt_us)
{
        memset(s, 0, sizeof(*s));
        dw_cc_params_default(&s->p); /* with the drain */
        s->nflows = nflows;
        s->rate_bpus = mbps / 8; /* Mbit/s = bits per µs */
        s->qcap = qbytes;
        s->prop = rtt_us * US / 2;
        s->seed = 42;
        s->seg = 1500;
        s->acap = 1 << 20;
        s->acks = calloc(s->acap, sizeof(*s->acks));
        for (int i = 0; i < nflows; i++) {
                s->f[i].stop = UINT64_MAX;
                dw_cc_init(&s->f[i].c, &s->p, s->seg);
        }
}

static void sim_fini(struct sim *s)
{
        free(s->acks);
}

static void enqueue(struct sim *s, int fl, uint64_t seq, bool retx, uint64_t now)
{
        struct sim_flow *f = &s->f[fl];
        f->sent_pkts++;
        if (retx)
                f->retx_pkts++;
        s->sent++;
        bool drop = s->qbytes + s->seg > s->qcap || s->qn >= SIM_QCAP;
        bool rdrop = !drop && s->random_loss > 0 && rnd(s) < s->random_loss;
        if (drop || rdrop) {
                if (drop)
                        s->drops++;
                else
                        s->random_drops++;
                cr_assert(f->nlost < 4096);
                f->lost[f->nlost] = seq;
                f->lost_at[f->nlost] = 0;
                f->nlost++;
                return;
        }
        struct sim_pkt *p = &s->q[(s->qh + s->qn) % SIM_QCAP];
        *p = (struct sim_pkt){fl, s->seg, now, seq, retx};
        s->qn++;
        s->qbytes += s->seg;
}

/* One µs of the world. */
static void sim_step(struct sim *s, uint64_t now)
{
        /* the link */
        s->credit += s->rate_bpus;
        while (s->qn && s->credit >= s->q[s->qh].bytes) {
                struct sim_pkt *p = &s->q[s->qh];
                s->credit -= p->bytes;
                s->qh = (s->qh + 1) % SIM_QCAP;
                s->qn--;
                s->qbytes -= p->bytes;
                if (now >= s->measure_from && now < s->measure_to) {
                        s->delivered_bytes += p->bytes;
                        s->qdelay_sum += now > p->sent + s->prop ? now - p->sent - s->prop : 0;
                        s->qdelay_n++;
                }
                cr_assert(s->an < s->acap);
                s->acks[(s->ah + s->an) % s->acap] =
                    (struct sim_ack){p->flow, p->bytes, now + s->prop, p->sent, p->seq, p->retx};
                s->an++;
        }
        if (!s->qn && s->credit > 2 * s->seg)
                s->credit = 2 * s->seg; /* an idle link banks no more than a burst */
        /* ACKs reaching their sender */
        while (s->an && s->acks[s->ah].at <= now) {
                struct sim_ack *a = &s->acks[s->ah];
                struct sim_flow *f = &s->f[a->flow];
                s->ah = (s->ah + 1) % s->acap;
                s->an--;
                if (!a->retx)
                        dw_cc_rtt(&f->c, (uint32_t)(now - a->sent), now);
                dw_cc_acked(&f->c, a->bytes, now);
                f->acked_bytes += a->bytes;
                f->last_ack = now;
                if (now >= s->measure_from && now < s->measure_to)
                        f->acked_in_window += a->bytes;
                if (a->seq > f->highest_acked)
                        f->highest_acked = a->seq;
                /* SACK: a hole 3 packets below the highest delivered is lost. */
                for (unsigned i = 0; i < f->nlost; i++)
                        if (!f->lost_at[i] && f->highest_acked >= f->lost[i] + 3) {
                                f->lost_at[i] = now;
                                dw_cc_lost(&f->c, DW_CC_LOSS_FAST, now);
                        }
        }
        /* senders */
        for (int i = 0; i < s->nflows; i++) {
                struct sim_flow *f = &s->f[i];
                if (now < f->start || now >= f->stop)
                        continue;
                if (f->max_rate) {
                        f->budget += f->max_rate;
                        if (f->budget > 4 * s->seg)
                                f->budget = 4 * s->seg;
                }
                /* A retransmission timeout when nothing came back for a while:
                 * every loss is then known. */
                uint64_t rto = 4ull * f->c.srtt > 1 * MS ? 4ull * f->c.srtt : 1 * MS;
                if (f->nlost && now - (f->last_ack > f->start ? f->last_ack : f->start) > rto) {
                        for (unsigned j = 0; j < f->nlost; j++)
                                f->lost_at[j] = now;
                        dw_cc_lost(&f->c, DW_CC_LOSS_RTO, now);
                        f->last_ack = now;
                }
                /* retransmissions first, not held by the window */
                uint64_t resend[4096];
                unsigned nr = 0, k = 0;
                for (unsigned j = 0; j < f->nlost; j++) {
                        if (f->lost_at[j]) {
                                resend[nr++] = f->lost[j];
                                continue;
                        }
                        f->lost[k] = f->lost[j];
                        f->lost_at[k] = 0;
                        k++;
                }
                f->nlost = k;
                for (unsigned j = 0; j < nr; j++) {
                        dw_cc_sent(&f->c, s->seg, true, now);
                        enqueue(s, i, resend[j], true, now);
                }
                while ((!f->max_rate || f->budget >= s->seg) &&
                       dw_cc_can_send(&f->c, 0, s->seg, now)) {
                        dw_cc_sent(&f->c, s->seg, false, now);
                        enqueue(s, i, f->next_seq++, false, now);
                        if (f->max_rate)
                                f->budget -= s->seg;
                }
        }
}

struct sim_result {
        double util; /* delivered / link capacity over the window */
        double jain; /* over the flows active during the whole window */
        double loss; /* dropped by the queue / sent */
        double retx; /* retransmitted / sent */
        double qdelay_us;
        double share[SIM_MAX_FLOWS];
};

static struct sim_result sim_run(struct sim *s, const char *name, uint64_t until, uint64_t from)
{
        s->measure_from = from;
        s->measure_to = until;
        const char *tr = getenv("DIWARP_CC_TRACE");
        for (uint64_t t = 1; t < until; t += US) {
                sim_step(s, t);
                if (tr && *tr == '2' && t % (5 * MS) == 1) {
                        fprintf(stderr, "%s t=%llu q=%llu:", name, (unsigned long long)(t / MS),
                                (unsigned long long)s->qbytes);
                        for (int i = 0; i < s->nflows && i < 8; i++)
                                fprintf(stderr, " %u/%u/%u", s->f[i].c.cwnd,
                                        s->f[i].c.min_rtt / 1000, s->f[i].c.srtt / 1000);
                        fprintf(stderr, "\n");
                }
        }
        struct sim_result r = {0};
        double win_us = (double)(until - from) / US;
        r.util = (double)s->delivered_bytes / ((double)s->rate_bpus * win_us);
        double sum = 0, sq = 0, total = 0;
        uint64_t retx = 0, sent = 0;
        int n = 0;
        for (int i = 0; i < s->nflows; i++) {
                total += (double)s->f[i].acked_in_window;
                retx += s->f[i].retx_pkts;
                sent += s->f[i].sent_pkts;
                if (s->f[i].start > from || s->f[i].stop < until)
                        continue;
                double x = (double)s->f[i].acked_in_window;
                sum += x;
                sq += x * x;
                n++;
        }
        r.jain = sq > 0 ? sum * sum / (n * sq) : 0;
        r.loss = s->sent ? (double)s->drops / (double)s->sent : 0;
        r.retx = sent ? (double)retx / (double)sent : 0;
        r.qdelay_us = s->qdelay_n ? (double)s->qdelay_sum / (double)s->qdelay_n / US : 0;
        for (int i = 0; i < s->nflows; i++)
                r.share[i] = total > 0 ? (double)s->f[i].acked_in_window / total : 0;
        if (tr && *tr) {
                fprintf(stderr,
                        "%s: util %.3f jain %.3f loss %.4f%% retx %.4f%% qdelay %.0f us "
                        "(random drops %llu)\n",
                        name, r.util, r.jain, 100 * r.loss, 100 * r.retx, r.qdelay_us,
                        (unsigned long long)s->random_drops);
                for (int i = 0; i < s->nflows && i < 8; i++)
                        fprintf(stderr,
                                "  flow %d: share %.3f cwnd %u min_rtt %u md_delay %llu md_loss "
                                "%llu\n",
                                i, r.share[i], s->f[i].c.cwnd, s->f[i].c.min_rtt,
                                (unsigned long long)s->f[i].c.stats.md_delay,
                                (unsigned long long)s->f[i].c.stats.md_loss);
        }
        return r;
}

/* N flows through a 1 Gbit/s link with a 2 ms queue (250 kB: the tbf of
 * the benchmark), 60 µs base RTT. */
static void bottleneck(int n, uint64_t mbps, const char *name)
{
        static struct sim s;
        uint64_t qbytes = mbps * 2000 / 8; /* 2 ms at the rate */
        sim_init(&s, n, mbps, qbytes, 60);
        for (int i = 0; i < n; i++)
                s.f[i].start = 1 + (uint64_t)i * 10 * US; /* nearly together */
        struct sim_result r = sim_run(&s, name, 2000 * MS, 500 * MS);
        /* The drains cost about half a millisecond per 200 ms period, and
         * very small windows (32 flows share 60 kB) some more. */
        cr_expect_geq(r.util, 0.95, "%s: utilisation %.3f", name, r.util);
        cr_expect_geq(r.jain, 0.95, "%s: Jain %.3f", name, r.jain);
        cr_expect_leq(r.retx, 0.01, "%s: retransmitted %.4f", name, r.retx);
        cr_expect_lt(r.qdelay_us, 2000.0 * 0.8, "%s: queueing %.0f µs", name, r.qdelay_us);
        sim_fini(&s);
}

Test(cc_sim, one_flow_1g, .timeout = 60)
{
        bottleneck(1, 1000, "1 flow 1G");
}

Test(cc_sim, two_flows_1g, .timeout = 60)
{
        bottleneck(2, 1000, "2 flows 1G");
}

Test(cc_sim, eight_flows_1g, .timeout = 60)
{
        bottleneck(8, 1000, "8 flows 1G");
}

Test(cc_sim, thirtytwo_flows_1g, .timeout = 60)
{
        bottleneck(32, 1000, "32 flows 1G");
}

Test(cc_sim, eight_flows_5g, .timeout = 60)
{
        bottleneck(8, 5000, "8 flows 5G");
}

Test(cc_sim, thirtytwo_flows_5g, .timeout = 60)
{
        bottleneck(32, 5000, "32 flows 5G");
}

/* A flow that starts while another fills the queue must still get its
 * share: its first RTT samples include the other's standing queue. */
Test(cc_sim, latecomer_gets_its_share, .timeout = 60)
{
        static struct sim s;
        sim_init(&s, 2, 1000, 250000, 60);
        s.f[1].start = 1000 * MS;
        struct sim_result r = sim_run(&s, "latecomer", 4000 * MS, 2000 * MS);
        cr_expect_geq(r.jain, 0.9, "Jain %.3f (shares %.3f %.3f)", r.jain, r.share[0], r.share[1]);
        cr_expect_geq(r.util, 0.95, "utilisation %.3f", r.util);
        sim_fini(&s);
}

/* A queue shallower than the delay target: loss, not delay, is the signal;
 * the link must stay well used and the loss low. */
Test(cc_sim, shallow_queue, .timeout = 60)
{
        static struct sim s;
        sim_init(&s, 1, 1000, 20000, 60); /* 160 µs of queue */
        struct sim_result r = sim_run(&s, "shallow", 2000 * MS, 500 * MS);
        cr_expect_geq(r.util, 0.9, "utilisation %.3f", r.util);
        cr_expect_leq(r.retx, 0.01, "retransmitted %.4f", r.retx);
        sim_fini(&s);
}

/* 1 % random loss on a path whose limit is the sender's CPU (a fast link
 * with nothing queued): the window must not collapse below what the CPU
 * can fill. */
Test(cc_sim, random_loss_costs_little, .timeout = 60)
{
        static struct sim s, base;
        sim_init(&base, 1, 400000, 4000000, 40);
        base.seg = 65000; /* loopback datagrams */
        dw_cc_init(&base.f[0].c, &base.p, base.seg);
        base.f[0].max_rate = 6000; /* 48 Gbit/s of CPU */
        struct sim_result r0 = sim_run(&base, "lossless cpu-bound", 1000 * MS, 200 * MS);
        sim_init(&s, 1, 400000, 4000000, 40);
        s.seg = 65000;
        dw_cc_init(&s.f[0].c, &s.p, s.seg);
        s.f[0].max_rate = 6000;
        s.random_loss = 0.01;
        struct sim_result r1 = sim_run(&s, "1% loss cpu-bound", 1000 * MS, 200 * MS);
        cr_expect_geq(r1.util, 0.9 * r0.util, "lossy %.3f lossless %.3f", r1.util, r0.util);
        sim_fini(&s);
        sim_fini(&base);
}

/* A receiver that places 2 MB/s behind 64 KiB datagrams (a slow memory
 * over loopback): one datagram is 32 ms of its time, so the queue can never
 * be shorter than that. The target follows (two datagrams at the flow's
 * rate) and the flow keeps the receiver busy instead of shrinking forever. */
Test(cc_sim, slow_receiver_big_datagrams, .timeout = 60)
{
        static struct sim s;
        sim_init(&s, 1, 16, 4000000, 40);
        s.seg = 65000;
        dw_cc_init(&s.f[0].c, &s.p, s.seg);
        struct sim_result r = sim_run(&s, "slow receiver", 20000 * MS, 5000 * MS);
        cr_expect_geq(r.util, 0.9, "utilisation %.3f", r.util);
        cr_expect_eq(s.drops, 0, "drops %llu", (unsigned long long)s.drops);
        sim_fini(&s);
}
