/* Congestion control of one path: the window and pacing of everything a
 * device sends to one peer device (all pseudo-streams to that address share
 * it). A pure state machine like rel/: no sockets, no clock, no allocation;
 * the caller passes `now` (ns) and reports what it sent, what was
 * acknowledged, RTT samples and losses. See flow/README.md for the algorithm
 * and the measurements that chose it.
 *
 * Units: bytes (datagram bytes on the wire, headers included) and ns.
 */
#ifndef DW_FLOW_CC_H
#define DW_FLOW_CC_H

#include <stdbool.h>
#include <stdint.h>

/* Defaults (docs/USAGE.md, DIWARP_CC_*). */
#define DW_CC_DEF_TARGET_US   300u   /* queueing delay aimed at, over the path's min RTT */
#define DW_CC_DEF_INIT_SEGS   10u    /* initial window, in full datagrams (RFC 6928) */
#define DW_CC_DEF_MIN_RTT_WIN 10000u /* ms: the min-RTT filter's window */
#define DW_CC_DEF_BURST_US    200u   /* pacing: what may leave at once, in time at the rate */
#define DW_CC_MAX_CWND        (64u << 20)
#define DW_CC_DEF_DRAIN_MS    200u /* ms between synchronised drains (drain_cap in cc.c) */
#define DW_CC_DRAIN_MIN_NS    1000000u
/* A target learnt from a loss (below the configured one) lasts this long,
 * and is never below the floor (software RTTs jitter by tens of µs). */
#define DW_CC_LOSS_Q_TTL_NS 1000000000ull
#define DW_CC_MIN_TARGET_NS 20000u
#define DW_CC_MAX_TARGET_NS 1000000000ull /* a target that follows a slow flow stops here */

/* Fixed-point factors are in 1/1024. */
#define DW_CC_ONE 1024u

struct dw_cc_params {
        uint32_t target_ns;       /* queueing delay the window aims for */
        uint32_t min_rtt_win_ns;  /* the min-RTT estimate forgets older samples after this */
        uint32_t burst_ns;        /* pacing burst allowance, as time at the pacing rate */
        uint16_t init_segs;       /* initial window, datagrams */
        uint16_t beta;            /* delay decrease gain (Swift's β), /1024 */
        uint16_t max_mdf;         /* largest decrease per round, /1024 */
        uint16_t loss_mdf;        /* decrease on a loss while the queue was building, /1024 */
        uint16_t noise_mdf;       /* decrease on a loss with no queue seen (corruption...), /1024 */
        uint16_t pace_gain_ss;    /* pacing rate over cwnd/srtt in slow start, /1024 */
        uint16_t pace_gain_ca;    /* the same afterwards, /1024 */
        uint32_t drain_period_ns; /* 0: never drain */
        int64_t clock_offset_ns;  /* wall clock - `now` clock: drains align across hosts */
        bool enabled;             /* false: no window, no pacing (the counters still run) */
        bool pacing;
};

void dw_cc_params_default(struct dw_cc_params *p);

enum dw_cc_loss {
        DW_CC_LOSS_FAST = 0,  /* a hole SACKs exposed (or a lost retransmission) */
        DW_CC_LOSS_RTO = 1,   /* a retransmission timeout that was not spurious */
        DW_CC_LOSS_PROBE = 3, /* a tail loss probe found the tail lost */
        DW_CC_LOSS_ECN = 2,   /* the receiver echoed Congestion Experienced (not yet on the wire) */
};

struct dw_cc_stats {
        uint64_t md_delay;    /* decreases: the queue rose above the target */
        uint64_t md_loss;     /* decreases: a loss (FAST or ECN) */
        uint64_t rto;         /* collapses after a genuine RTO */
        uint64_t cwnd_waits;  /* sends held: window full */
        uint64_t pace_waits;  /* sends held: pacing */
        uint64_t drain_waits; /* sends held: a synchronised drain */
};

struct dw_cc {
        const struct dw_cc_params *p;
        uint32_t seg;      /* bytes of a full datagram on this path */
        uint32_t cwnd;     /* bytes allowed in flight */
        uint32_t ssthresh; /* slow start below it */
        uint32_t inflight; /* bytes sent and not yet acknowledged */
        /* RTT (ns): the path's min over a window (two buckets of half the
         * window), a smoothed value, and the "standing" RTT: the least
         * sample of the last half round, which a scheduling stall (always
         * upwards) cannot raise. */
        uint32_t min_rtt, min_cur, min_prev;
        uint32_t srtt;
        uint32_t stand, stand_cur;
        uint64_t min_rot_at;
        uint64_t stand_at;
        uint64_t md_at;   /* no decrease before this (one per round) */
        uint64_t pace_at; /* virtual departure clock of the next byte (ns) */
        uint32_t pace_ps; /* picoseconds per byte at the pacing rate; 0 = not paced */
        uint32_t ai_carry;
        uint32_t drain_jitter; /* where in its drain this flow probes */
        uint32_t loss_q;       /* queueing delay at the last congestion loss (less a quarter) */
        uint64_t loss_q_at;    /* when it was learnt */
        struct dw_cc_stats stats;
};

/* seg: the largest datagram of the path (the first stream's MTU). */
void dw_cc_init(struct dw_cc *c, const struct dw_cc_params *p, uint32_t seg);

/* May `bytes` more leave now, with `pending` bytes already built for this
 * path but not yet reported through dw_cc_sent? A new transmission always
 * may when nothing is in flight (a window below one datagram is paced
 * instead). Counts the refusals. */
bool dw_cc_can_send(struct dw_cc *c, uint32_t pending, uint32_t bytes, uint64_t now);
/* Whether another full datagram would not fit the window once `pending`
 * more bytes are out: the sender then asks for an immediate ACK, since the
 * receiver's delayed ACK would hold the window shut. */
bool dw_cc_full_after(const struct dw_cc *c, uint32_t pending);
/* The earliest ns at which pacing lets a send go (0: now). */
uint64_t dw_cc_next_send(const struct dw_cc *c, uint64_t now);
/* bytes left; retx: a retransmission (paced, not counted in flight again). */
void dw_cc_sent(struct dw_cc *c, uint32_t bytes, bool retx, uint64_t now);
/* bytes of new data the peer now holds (each datagram once). */
void dw_cc_acked(struct dw_cc *c, uint32_t bytes, uint64_t now);
/* One RTT sample (Karn-clean, from rel/). */
void dw_cc_rtt(struct dw_cc *c, uint32_t rtt_ns, uint64_t now);
void dw_cc_lost(struct dw_cc *c, enum dw_cc_loss kind, uint64_t now);
/* Bytes of a stream that went away with datagrams still counted in flight. */
void dw_cc_forget(struct dw_cc *c, uint32_t bytes);
/* Pacing rate in bytes per second (0: not paced). */
uint64_t dw_cc_rate(const struct dw_cc *c);

#endif
