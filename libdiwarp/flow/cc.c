/* Congestion control of one path: see cc.h and README.md. */
#include "flow/cc.h"

#include <string.h>

#define NS_PER_US 1000u
#define NS_PER_MS 1000000u
/* The standing RTT looks at least this far back: a process that was not
 * scheduled for a few hundred µs (a core shared with softirq work or another
 * busy poller) delays every ACK of that moment, which is no queue. */
#define STAND_MIN_NS (500u * NS_PER_US)

void dw_cc_params_default(struct dw_cc_params *p)
{
        memset(p, 0, sizeof(*p));
        p->target_ns = DW_CC_DEF_TARGET_US * NS_PER_US;
        p->min_rtt_win_ns = DW_CC_DEF_MIN_RTT_WIN * NS_PER_MS;
        p->burst_ns = DW_CC_DEF_BURST_US * NS_PER_US;
        p->init_segs = DW_CC_DEF_INIT_SEGS;
        p->beta = 819;    /* 0.8 */
        p->max_mdf = 512; /* 0.5 */
        p->loss_mdf = 512;
        p->noise_mdf = 64; /* 1/16 */
        p->pace_gain_ss = 2048;
        p->pace_gain_ca = 1280; /* 1.25 */
        p->drain_period_ns = DW_CC_DEF_DRAIN_MS * NS_PER_MS;
        p->enabled = true;
        p->pacing = true;
}

static uint32_t min_cwnd(const struct dw_cc *c)
{
        return c->seg / 16 ? c->seg / 16 : 1;
}

static void clamp_cwnd(struct dw_cc *c, uint64_t w)
{
        if (w < min_cwnd(c))
                w = min_cwnd(c);
        if (w > DW_CC_MAX_CWND)
                w = DW_CC_MAX_CWND;
        c->cwnd = (uint32_t)w;
}

static void update_pacing(struct dw_cc *c)
{
        const struct dw_cc_params *p = c->p;
        if (!p->pacing || !c->srtt) {
                c->pace_ps = 0;
                return;
        }
        uint64_t gain = c->cwnd < c->ssthresh ? p->pace_gain_ss : p->pace_gain_ca;
        uint64_t ps = (uint64_t)c->srtt * 1000u * DW_CC_ONE / (gain * c->cwnd);
        c->pace_ps = ps > UINT32_MAX ? UINT32_MAX : (ps ? (uint32_t)ps : 1);
}

void dw_cc_init(struct dw_cc *c, const struct dw_cc_params *p, uint32_t seg)
{
        memset(c, 0, sizeof(*c));
        c->p = p;
        c->seg = seg ? seg : 1;
        c->ssthresh = UINT32_MAX;
        c->min_rtt = c->min_cur = c->min_prev = UINT32_MAX;
        /* Spreads the flows' drain probes (splitmix64 of the state's address). */
        uint64_t z = (uint64_t)(uintptr_t)c + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        c->drain_jitter = (uint32_t)(z ^ (z >> 31));
        clamp_cwnd(c, (uint64_t)p->init_segs * c->seg);
}

static uint32_t standing_rtt(const struct dw_cc *c)
{
        return c->stand && c->stand < c->stand_cur ? c->stand : c->stand_cur;
}

/* The queueing delay now: the standing RTT over the path's minimum. */
static uint32_t queue_ns(const struct dw_cc *c)
{
        if (c->min_rtt == UINT32_MAX)
                return 0;
        uint32_t s = standing_rtt(c);
        return s > c->min_rtt ? s - c->min_rtt : 0;
}

/* The delay target in force: the configured one, or less when the path
 * dropped packets at a smaller queueing delay (a queue shallower than the
 * target), until that lesson is a second old. */
static uint32_t target_ns(const struct dw_cc *c, uint64_t now)
{
        uint64_t t = c->p->target_ns;
        if (c->loss_q && now - c->loss_q_at < DW_CC_LOSS_Q_TTL_NS && c->loss_q < t)
                t = c->loss_q;
        /* A window of a couple of datagrams cannot keep the queue shorter
         * than the time the bottleneck takes for one of them: at a receiver
         * that places data slowly, or with many flows sharing a link, aim at
         * least at two datagrams' worth at this flow's rate (cwnd / srtt),
         * or the window would shrink forever. */
        if (c->srtt && c->cwnd) {
                uint64_t two = 2ull * c->seg * c->srtt / c->cwnd;
                if (two > t)
                        t = two < DW_CC_MAX_TARGET_NS ? two : DW_CC_MAX_TARGET_NS;
        }
        return (uint32_t)t;
}

/* The pacing clock of the next byte once `pending` bytes have left. */
static uint64_t pace_clock(const struct dw_cc *c, uint32_t pending, uint64_t now)
{
        uint64_t floor = now > c->p->burst_ns ? now - c->p->burst_ns : 0;
        uint64_t t = c->pace_at > floor ? c->pace_at : floor;
        return t + (uint64_t)pending * c->pace_ps / 1000u;
}

/* Delay-based windows are fair only when every flow through a queue agrees
 * on the path's minimum RTT; a flow that starts while others keep a queue
 * standing takes that queue for part of the path, aims higher and crowds
 * them out (and a threshold amplifies any disagreement: the flow that sees
 * the queue over its target first backs off, the queue drops, the others
 * never do). So every flow, on every host, drains at the same wall-clock
 * phase of each drain period: first it sends nothing (the queues empty),
 * then one datagram at a moment of its own within the second half (so the
 * flows' probes seldom meet in a queue): its RTT sample shows the true
 * minimum. It costs the link about half a drain's length per period. */
struct drain {
        bool on;
        bool quiet;      /* nothing may leave yet */
        uint64_t resume; /* when the quiet part ends for this flow (ns) */
};

static struct drain drain_at(const struct dw_cc *c, uint64_t now)
{
        const struct dw_cc_params *p = c->p;
        struct drain d = {false, false, 0};
        if (!p->drain_period_ns)
                return d;
        uint64_t base = c->min_rtt == UINT32_MAX ? 0 : c->min_rtt;
        uint64_t len = 2 * (p->target_ns + base);
        if (len < DW_CC_DRAIN_MIN_NS)
                len = DW_CC_DRAIN_MIN_NS;
        if (len > p->drain_period_ns / 8)
                len = p->drain_period_ns / 8;
        uint64_t phase = (now + p->clock_offset_ns) % p->drain_period_ns;
        if (phase >= len)
                return d;
        /* The probe goes somewhere in the second half, keeping a quarter of
         * the drain for its ACK to come back. */
        uint64_t quiet = len / 2 + c->drain_jitter % (len / 4 + 1);
        d.on = true;
        d.quiet = phase < quiet;
        d.resume = now - phase + quiet;
        return d;
}

bool dw_cc_can_send(struct dw_cc *c, uint32_t pending, uint32_t bytes, uint64_t now)
{
        if (!c->p->enabled)
                return true;
        uint64_t out = (uint64_t)c->inflight + pending;
        struct drain d = drain_at(c, now);
        if (d.on && (d.quiet || out)) {
                c->stats.drain_waits++;
                return false;
        }
        if (out && out + bytes > c->cwnd) {
                c->stats.cwnd_waits++;
                return false;
        }
        if (c->pace_ps && pace_clock(c, pending, now) > now) {
                c->stats.pace_waits++;
                return false;
        }
        return true;
}

bool dw_cc_full_after(const struct dw_cc *c, uint32_t pending)
{
        return c->p->enabled && (uint64_t)c->inflight + pending + c->seg > c->cwnd;
}

uint64_t dw_cc_next_send(const struct dw_cc *c, uint64_t now)
{
        if (!c->p->enabled)
                return 0;
        struct drain d = drain_at(c, now);
        if (d.on && d.quiet)
                return d.resume;
        if (!c->pace_ps)
                return 0;
        uint64_t t = pace_clock(c, 0, now);
        return t > now ? t : 0;
}

void dw_cc_sent(struct dw_cc *c, uint32_t bytes, bool retx, uint64_t now)
{
        if (!retx)
                c->inflight += bytes;
        if (c->pace_ps)
                c->pace_at = pace_clock(c, bytes, now);
}

void dw_cc_forget(struct dw_cc *c, uint32_t bytes)
{
        c->inflight = bytes < c->inflight ? c->inflight - bytes : 0;
}

/* Multiplicative decrease by mdf/1024, at most once per round. */
static void decrease(struct dw_cc *c, uint32_t mdf, uint64_t now)
{
        clamp_cwnd(c, (uint64_t)c->cwnd - (uint64_t)c->cwnd * mdf / DW_CC_ONE);
        c->ssthresh = c->cwnd;
        c->md_at = now + (c->srtt ? c->srtt : c->p->target_ns);
        c->ai_carry = 0;
        update_pacing(c);
}

void dw_cc_acked(struct dw_cc *c, uint32_t bytes, uint64_t now)
{
        const struct dw_cc_params *p = c->p;
        c->inflight = bytes < c->inflight ? c->inflight - bytes : 0;
        if (!p->enabled)
                return;
        uint32_t q = queue_ns(c), target = target_ns(c, now);
        if (drain_at(c, now).on)
                return; /* the window comes back as it was */
        if (c->cwnd < c->ssthresh) {
                /* Slow start: double per round until the queue starts to
                 * build (half the target: the exit overshoots by a round). */
                if (q > target / 2)
                        c->ssthresh = c->cwnd;
                else
                        clamp_cwnd(c, (uint64_t)c->cwnd + bytes);
        } else if (q <= target) {
                /* Additive increase: one datagram per round, a quarter of
                 * one while the window is below a datagram (paced), the same
                 * for every flow so that the decreases converge to fairness. */
                uint64_t ai = c->cwnd >= c->seg ? c->seg : c->seg / 4;
                uint64_t carry = c->ai_carry + ai * bytes;
                clamp_cwnd(c, (uint64_t)c->cwnd + carry / c->cwnd);
                c->ai_carry = (uint32_t)(carry % c->cwnd);
        } else if (now >= c->md_at) {
                /* Over the target: take this flow's share of the queue out
                 * of the window (cwnd × q / RTT), at most max_mdf per round:
                 * if every flow did, the queue would empty while the link
                 * stays full (what is left in flight is the path's
                 * bandwidth-delay product). The decrease is multiplicative,
                 * the increase additive and equal for all: shares converge,
                 * as long as the flows agree on the path's minimum RTT (see
                 * drain_cap). */
                uint64_t f = (uint64_t)DW_CC_ONE * q / standing_rtt(c);
                decrease(c, f > p->max_mdf ? p->max_mdf : (uint32_t)f, now);
                c->stats.md_delay++;
                return;
        }
        update_pacing(c);
}

void dw_cc_rtt(struct dw_cc *c, uint32_t rtt, uint64_t now)
{
        if (!rtt)
                rtt = 1;
        if (now >= c->min_rot_at) {
                c->min_prev = c->min_cur;
                c->min_cur = UINT32_MAX;
                c->min_rot_at = now + c->p->min_rtt_win_ns / 2;
        }
        if (rtt < c->min_cur)
                c->min_cur = rtt;
        c->min_rtt = c->min_cur < c->min_prev ? c->min_cur : c->min_prev;
        c->srtt = c->srtt ? c->srtt - c->srtt / 8 + rtt / 8 : rtt;
        if (now >= c->stand_at || !c->stand_cur) {
                c->stand = c->stand_cur;
                c->stand_cur = rtt;
                uint64_t half = c->srtt / 2 > STAND_MIN_NS ? c->srtt / 2 : STAND_MIN_NS;
                c->stand_at = now + half;
        } else if (rtt < c->stand_cur) {
                c->stand_cur = rtt;
        }
        update_pacing(c);
}

void dw_cc_lost(struct dw_cc *c, enum dw_cc_loss kind, uint64_t now)
{
        const struct dw_cc_params *p = c->p;
        if (!p->enabled)
                return;
        if (kind == DW_CC_LOSS_RTO) {
                /* Most of a window went missing: start over from one datagram. */
                c->ssthresh = c->cwnd / 2 > 2 * c->seg ? c->cwnd / 2 : 2 * c->seg;
                clamp_cwnd(c, c->seg);
                c->md_at = now + (c->srtt ? c->srtt : p->target_ns);
                c->stats.rto++;
                update_pacing(c);
                return;
        }
        if (now < c->md_at)
                return; /* the same round's losses count once */
        /* A loss while the queue was building is congestion; one with no
         * queue in sight is more likely corruption or a lossy link, where
         * halving would only cost throughput. A congestion loss below the
         * delay target also tells how deep the path's queue is: the target
         * drops under it for a while (target_ns); only a hole that SACKs
         * exposed teaches it, a probe's verdict is too easily fooled by a
         * late ACK. */
        uint32_t q = queue_ns(c);
        bool queue = q >= target_ns(c, now) / 4 || kind == DW_CC_LOSS_ECN;
        if (queue && kind == DW_CC_LOSS_FAST && q < p->target_ns) {
                uint32_t t = q - q / 4;
                c->loss_q = t > DW_CC_MIN_TARGET_NS ? t : DW_CC_MIN_TARGET_NS;
                c->loss_q_at = now;
        }
        decrease(c, queue ? p->loss_mdf : p->noise_mdf, now);
        c->stats.md_loss++;
}

uint64_t dw_cc_rate(const struct dw_cc *c)
{
        return c->pace_ps ? 1000000000000ull / c->pace_ps : 0;
}
