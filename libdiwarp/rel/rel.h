/* RD reliability sublayer: a socket-free state machine per pseudo-stream
 * (local QP, remote QP). Selective repeat: PSNs, cumulative ACK + SACK,
 * fast retransmit on SACK holes, RTO from measured RTT (RFC 6298) with
 * exponential backoff, duplicate suppression, coalesced and piggybacked ACKs,
 * RNR back-off, and a bound on a silent peer (the one end of a silent stream;
 * an RTO retry limit only for params without it).
 *
 * Nothing here sends, allocates, logs or reads a clock: the caller (rd/) passes
 * `now` (dw_now_ns()) and gets work back through struct dw_rel_ops. The caller
 * holds the device lock. See rel/README.md and docs/PROTOCOL.md ("RD
 * reliability: timers and defaults").
 */
#ifndef DW_REL_REL_H
#define DW_REL_REL_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

#include "wire/dgram.h"

/* Receive window in PSNs: the out-of-order bitmap covers [rcv_nxt, rcv_nxt+128).
 * A sender never has more than this many PSNs outstanding. */
#define DW_REL_RX_WINDOW 128u
#define DW_REL_MAX_TXWIN DW_REL_RX_WINDOW

/* Defaults (docs/PROTOCOL.md, "RD reliability: timers and defaults"). */
#define DW_REL_DEF_WINDOW          128u
#define DW_REL_DEF_RTO_INIT_US     5000u /* before the first RTT sample */
#define DW_REL_DEF_RTO_MIN_US      1000u
#define DW_REL_DEF_RTO_MAX_US      500000u
#define DW_REL_DEF_RETRY_LIMIT     12u  /* RTO expiries in a row, without a peer timeout */
#define DW_REL_DEF_DUPTHRESH       3u   /* SACKed PSNs above a hole that make it lost */
#define DW_REL_DEF_ACK_EVERY       2u   /* in-order packets per ACK */
#define DW_REL_DEF_ACK_DELAY_US    50u  /* longest an owed ACK waits for a piggyback */
#define DW_REL_DEF_RNR_MIN_US      640u /* own RNR back-off when rnr_delay is 0 */
#define DW_REL_DEF_RNR_MAX_US      100000u
#define DW_REL_DEF_RNR_RETRY_LIMIT 7u
#define DW_REL_RNR_INFINITE        0xFFu /* rnr_retry_limit: retry forever (ibverbs rnr_retry 7) */
#define DW_REL_DEF_PEER_TIMEOUT_MS 5000u /* = DIWARP_PEER_TIMEOUT_MS default */
#define DW_REL_CLOCK_G_NS          1000u /* RFC 6298 G: send times are kept in µs */
#define DW_REL_MIN_REORDER_US      10u   /* floor of the reordering window (SRTT/4) */
#define DW_REL_MIN_PTO_US          100u  /* floor of the tail loss probe timeout */
#define DW_REL_STALL_HALF_MS       1000u /* a learned late ACK halves every second (at least) */

/* What streams learned together about late ACKs (rd/: every stream of a
 * device, through each QP's params): the longest
 * wait for ACK progress that a needless probe or RTO proved (the peer's
 * program was not scheduled, or placed data slowly; at most the RTO's
 * maximum) and when it was last seen. Every one of them then sends
 * its tail loss probe no earlier than 5/4 of that wait after its last ACK
 * progress (its RTO is left alone), the wait halved for every
 * DW_REL_STALL_HALF_MS, or 64 times the wait if longer, since it was seen
 * (rel/README.md, "Late ACKs are learned together"). Owned by the caller,
 * written by rel through the params that point to it. */
struct dw_rel_stall {
        uint64_t wait_ns;
        uint64_t seen_at; /* ns */
};

/* Shared tuning; one per QP or device, outlives its peers. */
struct dw_rel_params {
        /* The late ACKs learned for every stream of these params, or NULL
         * (none learned: each stream probes at 2 SRTT + the ACK delay). */
        struct dw_rel_stall *stall;
        uint32_t rto_init_us;
        uint32_t rto_min_us;
        uint32_t rto_max_us; /* ≤ 4 s: estimator state is 32-bit ns */
        uint32_t ack_delay_us;
        uint32_t rnr_min_us;
        uint32_t rnr_max_us;
        uint32_t peer_timeout_ms; /* 0 = none, retry_limit ends it (tests only) */
        uint16_t window;          /* sizing hint for the caller's ring; power of 2 ≤ 128 */
        uint16_t ack_every;
        uint8_t retry_limit;     /* ends a silent stream only when peer_timeout_ms is 0 */
        uint8_t rnr_retry_limit; /* DW_REL_RNR_INFINITE = never give up */
        uint8_t dupthresh;
};

void dw_rel_params_default(struct dw_rel_params *p);
/* 0, or -EINVAL with a reason. */
int dw_rel_params_check(const struct dw_rel_params *p, const char **why);

/* Send-window entry, one per outstanding PSN, in a caller-provided ring
 * indexed by PSN & (ring_len - 1). 16 bytes. */
enum {
        DW_REL_TXF_SACKED = 0x01,  /* the peer holds it; `acked` already called */
        DW_REL_TXF_PENDING = 0x02, /* retransmit at the next dw_rel_timers */
        DW_REL_TXF_FAST = 0x04,    /* fast retransmit already spent on it */
};

struct dw_rel_txent {
        uint64_t cookie;  /* caller's handle to rebuild the packet (WQE slot, offset...) */
        uint32_t sent_us; /* last (re)transmission, µs; wraps every 71 minutes */
        uint8_t retx;     /* times retransmitted; Karn: no RTT sample when > 0 */
        uint8_t flags;
        /* The lane (path) it went by, 0..DW_REL_MAX_LANES-1: SACKs above a
         * hole count as evidence of its loss only from its own lane, since
         * lanes of different delays reorder (dw_rel_tx_rename). */
        uint8_t lane;
        uint8_t rsvd;
};
static_assert(sizeof(struct dw_rel_txent) == 16, "txent is 16 bytes");

enum dw_rel_verdict {
        DW_REL_NEW = 0,           /* first copy: place it */
        DW_REL_DUPLICATE = 1,     /* already received: drop (an ACK is owed) */
        DW_REL_OUT_OF_WINDOW = 2, /* beyond rcv_nxt + 128: drop, no state change */
};

enum dw_rel_fatal_reason {
        DW_REL_OK = 0,
        DW_REL_RETRY_EXCEEDED = 1, /* -ETIMEDOUT → IBV_WC_RETRY_EXC_ERR */
        DW_REL_PEER_TIMEOUT = 2,   /* -ETIMEDOUT → IBV_WC_RETRY_EXC_ERR */
        DW_REL_RNR_EXCEEDED = 3,   /* -EREMOTEIO → IBV_WC_RNR_RETRY_EXC_ERR */
};

struct dw_rel_stats {
        uint32_t retransmits; /* all retransmissions (fast, RTO, RNR) */
        uint32_t fast_retransmits;
        uint32_t rto_expiries;
        uint32_t rnr_naks;
        uint32_t rx_dup;
        uint32_t rx_oow;
        uint32_t acks_built;
        uint32_t tail_probes; /* probes after 2 SRTT without ACK progress */
        uint32_t spurious;    /* probe episodes a D-SACK proved needless */
};

enum {
        DW_REL_F_HAVE_RTT = 0x01,
        DW_REL_F_ACK_NOW = 0x02,      /* an ACK must go out without waiting */
        DW_REL_F_RETX_PENDING = 0x04, /* some ring entry has DW_REL_TXF_PENDING */
        DW_REL_F_RTO_PROBE = 0x08,    /* RTO fired: one probe out, waiting for its verdict */
        DW_REL_F_SACK_FULL = 0x10,    /* the last ACK had every SACK block: maybe truncated */
        DW_REL_F_TLP_DONE = 0x20,     /* tail loss probe spent since the last ACK progress */
        DW_REL_F_INTERACTIVE = 0x40,  /* our data answers the peer's ACKREQs: defer their ACK */
        DW_REL_F_REQ_SEEN = 0x80,     /* an ACKREQ arrived at req_us16, no data sent since */
};

enum {
        DW_REL_F2_TLP = 0x01,     /* the probe episode is a tail loss probe's, no RTO fired */
        DW_REL_F2_DSACK = 0x02,   /* a duplicate arrived: the next ACK reports it (dsack_psn) */
        DW_REL_F2_ACKED = 0x04,   /* an ACK was built since the receive side (re)started */
        DW_REL_F2_RX_HIGH = 0x08, /* rx_high_t16 holds the highest PSN's arrival */
};

/* Per-pseudo-stream state. Fields are readable (tests, counters); change them
 * only through the functions below. */
struct dw_rel_peer {
        const struct dw_rel_params *p;
        struct dw_rel_txent *ring;
        /* send side: outstanding PSNs are [snd_una, snd_nxt) */
        uint32_t snd_nxt;
        uint32_t snd_una;   /* oldest PSN not cumulatively acked */
        uint32_t sack_high; /* one past the highest SACKed PSN (≥ snd_una) */
        uint32_t rnr_psn;   /* PSN of the current RNR episode */
        uint16_t ring_mask;
        uint8_t backoff; /* RTO doublings since the last valid RTT sample */
        uint8_t retries; /* RTO expiries since the last ACK progress (saturates) */
        uint8_t rnr_retries;
        uint8_t flags;
        int16_t fatal; /* 0 or the negative errno every call now returns */
        uint8_t fatal_reason;
        uint8_t rto_undo_backoff; /* backoff before the RTO episode (undone if spurious) */
        uint8_t flags2;           /* DW_REL_F2_* */
        uint8_t probe_out;        /* un-SACKed PSNs outstanding when it began (at most 255) */
        uint32_t rto_recover;     /* snd_nxt when the RTO episode began */
        uint32_t rack_us;         /* latest send time (µs) of a packet the peer holds */
        uint32_t srtt_ns;
        uint32_t rttvar_ns;
        uint32_t rto_ns;        /* RFC 6298 RTO before backoff, clamped */
        uint64_t rto_deadline;  /* ns; 0 = timer not running */
        uint64_t last_progress; /* ns of the last ACK progress (or RNR NAK, or first send) */
        uint64_t rnr_until;     /* ns; no transmission before it; 0 = none */
        /* receive side */
        uint64_t rx_map[2];    /* bit (psn & 127): psn in (rcv_nxt, rcv_nxt+128) received */
        uint32_t rcv_nxt;      /* cumulative ACK point = in-order delivery cursor */
        uint16_t rx_unacked;   /* in-order packets since the last ACK built */
        uint16_t req_us16;     /* arrival of the last ACKREQ, µs mod 2^16 (DW_REL_F_REQ_SEEN) */
        uint64_t ack_deadline; /* ns; 0 = no delayed ACK owed */
        struct dw_rel_stats stats;
        uint32_t dsack_psn; /* the duplicate to report (DW_REL_F2_DSACK) */
        /* The PSN the receive side started at (dw_rel_peer_init,
         * dw_rel_rx_start): a stream start that names it again is a late copy
         * of the one taken (the transport's to judge). */
        uint32_t rcv_first;
        /* When the highest PSN received arrived, in 16 µs units mod 2^16
         * (the kernel's receive time when the caller knows it;
         * DW_REL_F2_RX_HIGH: one did): an ACK that reports that PSN says how
         * long it waited (dw_rel_ack_delay; a wait past 1.05 s reads short). */
        uint16_t rx_high_t16;
};
static_assert(sizeof(struct dw_rel_peer) <= 256, "per-peer reliability state stays ≤ 256 bytes");

enum dw_rel_loss {
        DW_REL_LOSS_SACK = 0,  /* SACKs exposed a hole, or a retransmission was lost again */
        DW_REL_LOSS_PROBE = 1, /* a tail loss probe's verdict: the tail was lost */
        DW_REL_LOSS_RTO = 2,   /* an RTO episode that was not spurious */
};

/* What dw_rel_on_ack / dw_rel_timers ask of the caller. */
struct dw_rel_ops {
        /* The peer holds `psn` (cumulative ACK or SACK): exactly once per PSN.
         * Release the packet; complete WQEs in order by dw_rel_tx_una(). */
        void (*acked)(void *ctx, uint32_t psn, uint64_t cookie);
        /* Send the packet `psn` again (same PSN and payload; fresh ACK fields
         * from dw_rel_build_ack are welcome). 0 when the socket took it;
         * -EAGAIN / -ENOBUFS = local back-pressure: it stays pending for the
         * next call. Any other negative value stops the pass and is returned. */
        int (*retransmit)(void *ctx, uint32_t psn, uint64_t cookie);
        /* Send a control-only ACK built with dw_rel_build_ack. 0 or as above. */
        int (*send_ack)(void *ctx);
        /* Optional (NULL: not told). An RTT sample was taken (the same ones
         * the RTO estimator gets: Karn-clean, see dw_rel_on_ack) from the
         * packet psn, named by cookie. */
        void (*rtt)(void *ctx, uint32_t psn, uint64_t cookie, uint32_t rtt_ns, uint64_t now);
        /* Optional. Packets were found lost (congestion control listens
         * here): how, once per ACK or verdict, not per packet. */
        void (*lost)(void *ctx, enum dw_rel_loss how, uint64_t now);
};

/* ring_len: power of two in 1..128; it is the send window. tx_psn: first PSN
 * this side sends; rx_psn: first PSN expected from the peer (both ends must
 * agree on them: sq_psn/rq_psn for RC over RD). ring may be NULL: the send
 * window ring is only needed while PSNs are outstanding, so a caller with many
 * idle peers attaches one (of ring_len entries) before sending and detaches
 * it when the window drains. */
int dw_rel_peer_init(struct dw_rel_peer *r, const struct dw_rel_params *p,
                     struct dw_rel_txent *ring, uint32_t ring_len, uint32_t tx_psn,
                     uint32_t rx_psn);
/* The peer's first PSN, learnt after init (an RD pseudo-stream learns it
 * from the peer's first datagrams): the receive side starts over there.
 * Only before anything was received, or when nothing received is pending
 * (an idle stream the peer started anew). */
void dw_rel_rx_start(struct dw_rel_peer *r, uint32_t rx_psn);
/* The send side starts over at tx_psn (RC over RD: the sq_psn IB's RTS
 * gives; an RD stream restarted after an idle time). 0, or -EBUSY while a
 * PSN is outstanding. */
int dw_rel_tx_start(struct dw_rel_peer *r, uint32_t tx_psn);
/* Gives an idle peer (nothing outstanding, no ring) its ring: 0 or -EINVAL. */
int dw_rel_attach_ring(struct dw_rel_peer *r, struct dw_rel_txent *ring);
/* Takes the ring back once nothing is outstanding (the receive side and the
 * timers of an idle peer never touch it); NULL while PSNs are in flight or
 * when there is none. dw_rel_tx_can_send is false without a ring. */
struct dw_rel_txent *dw_rel_detach_ring(struct dw_rel_peer *r);

/* ---- send side ---- */

/* True when a new PSN may be sent now: window not full, no RNR back-off, not fatal. */
bool dw_rel_tx_can_send(const struct dw_rel_peer *r, uint64_t now);
static inline uint32_t dw_rel_tx_next_psn(const struct dw_rel_peer *r)
{
        return r->snd_nxt;
}
static inline uint32_t dw_rel_tx_una(const struct dw_rel_peer *r)
{
        return r->snd_una;
}
static inline uint32_t dw_rel_tx_inflight(const struct dw_rel_peer *r)
{
        return r->snd_nxt - r->snd_una;
}
/* Registers the packet just handed to the socket with PSN dw_rel_tx_next_psn()
 * (call it only once the socket accepted it, so an EAGAIN costs no PSN).
 * -EINVAL wrong PSN, -EAGAIN window full, or the fatal errno. */
int dw_rel_tx_sent(struct dw_rel_peer *r, uint32_t psn, uint64_t cookie, uint64_t now);
/* Renames an outstanding packet and sets the lane it (or its next copy)
 * goes by (a multirail sender's rail): later callbacks get the new cookie.
 * -EINVAL when psn is not outstanding or lane >= DW_REL_MAX_LANES. */
#define DW_REL_MAX_LANES 4
int dw_rel_tx_rename(struct dw_rel_peer *r, uint32_t psn, uint64_t cookie, unsigned lane);
/* Whether the next data packet should carry ACKREQ: it fills the window, so
 * the sender stops until an ACK comes and a delayed ACK would stall it. */
bool dw_rel_tx_want_ackreq(const struct dw_rel_peer *r);

/* Consumes the feedback of any received RD header: ACK (+SACK) and NAK (RNR,
 * SEQ; other NAK codes are the QP's business and ignored here). Calls
 * ops->acked for every PSN newly held by the peer, takes an RTT sample (Karn),
 * marks holes for fast retransmit. 0; -EBADMSG when the header acknowledges
 * PSNs never sent (nothing changed); -EREMOTEIO when the RNR retry limit is
 * exceeded; the fatal errno once fatal. */
int dw_rel_on_ack(struct dw_rel_peer *r, const struct dw_dgram_hdr *h, uint64_t now,
                  const struct dw_rel_ops *ops, void *ctx);
/* dw_rel_on_ack for an ACK the kernel received at `arrived` (≤ now; the
 * caller's thread may have read it later): the RTT sample congestion control
 * gets (ops->rtt) runs from the packet's sending to `arrived`, less the ACK
 * delay the receiver reported for that packet (DW_DGRAM_X2_ACKDELAY): the
 * network's round trip, not the time either host's thread waited for a core.
 * The RTO estimator keeps the whole sample up to now: a retransmission timer
 * must cover a late ACK however it came to be late. */
int dw_rel_on_ack_at(struct dw_rel_peer *r, const struct dw_dgram_hdr *h, uint64_t now,
                     uint64_t arrived, const struct dw_rel_ops *ops, void *ctx);

/* ---- receive side ---- */

/* Classifies a DATA PSN without changing state: rd/ uses it to answer RNR
 * before accepting (an RNR-refused PSN must stay NEW for its retry). */
enum dw_rel_verdict dw_rel_rx_classify(const struct dw_rel_peer *r, uint32_t psn);
/* Accepts a DATA PSN. Returns how far the in-order cursor (dw_rel_rx_cursor)
 * advanced: every PSN before the cursor has been received, so rd/ completes
 * messages up to it in order. ack_req: the packet had DW_DGRAM_F_ACKREQ; its
 * ACK is immediate unless our data has been answering the peer's requests
 * within the ACK delay (DW_REL_F_INTERACTIVE, learnt in dw_rel_tx_sent), in
 * which case it waits up to the ACK delay for the response to carry it. */
uint32_t dw_rel_rx_data(struct dw_rel_peer *r, uint32_t psn, bool ack_req, uint64_t now,
                        enum dw_rel_verdict *verdict);
/* The ACK owed after an in-order packet that left no hole (shared by
 * dw_rel_rx_data and dw_rel_rx_next; see there). */
static inline void dw_rel_rx_ack_in_order(struct dw_rel_peer *r, bool ack_req, uint64_t now)
{
        if (ack_req) {
                /* The sender waits for this ACK. When our data has been
                 * answering its requests (a request/response exchange), the
                 * response is about to go and carries the ACK: a separate
                 * ACK datagram would double the packets and syscalls of every
                 * exchange. Otherwise nothing is coming back: ACK at once. */
                r->flags |= DW_REL_F_REQ_SEEN;
                r->req_us16 = (uint16_t)(now / 1000u);
                if ((r->flags & DW_REL_F_INTERACTIVE) && r->p->ack_delay_us &&
                    ++r->rx_unacked < r->p->ack_every) {
                        if (!r->ack_deadline)
                                r->ack_deadline = now + (uint64_t)r->p->ack_delay_us * 1000u;
                } else {
                        r->flags |= DW_REL_F_ACK_NOW;
                }
        } else if (++r->rx_unacked >= r->p->ack_every || r->p->ack_delay_us == 0) {
                r->flags |= DW_REL_F_ACK_NOW;
        } else if (!r->ack_deadline) {
                r->ack_deadline = now + (uint64_t)r->p->ack_delay_us * 1000u;
        }
}
/* dw_rel_rx_data(r, dw_rel_rx_cursor(r), ...) when nothing past the cursor
 * has arrived (rx_map empty): a NEW packet that advances the cursor by one,
 * with the same state change, inline. False (nothing changed) otherwise. */
static inline bool dw_rel_rx_next(struct dw_rel_peer *r, bool ack_req, uint64_t now)
{
        if (r->rx_map[0] | r->rx_map[1])
                return false;
        r->rcv_nxt++;
        dw_rel_rx_ack_in_order(r, ack_req, now);
        return true;
}
/* A NEW DATA packet psn, accepted (dw_rel_rx_data / dw_rel_rx_next), arrived
 * (read by the receiving thread) at `at` (ns; not the kernel's receive
 * time: the wait in the socket is backlog the sender must see, not a hold):
 * the highest PSN's is kept for the ACK delay. dw_rel_rx_highest: the
 * highest PSN received. */
uint32_t dw_rel_rx_highest(const struct dw_rel_peer *r);
static inline void dw_rel_rx_arrived(struct dw_rel_peer *r, uint32_t psn, uint64_t at)
{
        if ((r->rx_map[0] | r->rx_map[1]) ? psn == dw_rel_rx_highest(r) : psn == r->rcv_nxt - 1) {
                r->flags2 |= DW_REL_F2_RX_HIGH;
                r->rx_high_t16 = (uint16_t)(at / 16000u);
        }
}
static inline uint32_t dw_rel_rx_cursor(const struct dw_rel_peer *r)
{
        return r->rcv_nxt;
}
/* True when an ACK must be sent now (to piggyback on data, or alone). */
bool dw_rel_ack_due(const struct dw_rel_peer *r, uint64_t now);
/* True when some ACK is owed (now or after the coalescing delay): piggyback
 * it on any data packet going to this peer. */
bool dw_rel_ack_owed(const struct dw_rel_peer *r);
/* Adds ACK (ack_psn = cursor) and up to max_sack SACK blocks (ascending, the
 * lowest runs first and the highest run last when they do not all fit) to h,
 * which must not carry a NAK. Clears the owed ACK. Returns the blocks written
 * or -EINVAL. */
int dw_rel_build_ack(struct dw_rel_peer *r, struct dw_dgram_hdr *h, unsigned max_sack);
/* An ACK delay below this is not reported: it is within what the sender's
 * own delay target allows, and the ACK stays a version-1 header. */
#define DW_REL_ACK_DELAY_MIN_US 16
/* For an ACK built into h (dw_rel_build_ack) that goes now, alone: when the
 * highest PSN it reports is the newest received (the one whose RTT sample the
 * sender takes), adds how long that packet waited here since it arrived
 * (DW_DGRAM_X2_ACKDELAY, µs, capped), if at least DW_REL_ACK_DELAY_MIN_US. */
void dw_rel_ack_delay(const struct dw_rel_peer *r, struct dw_dgram_hdr *h, uint64_t now);
/* The highest PSN an ACK header reports held (cumulatively or by a SACK
 * block; a D-SACK block is not one). */
uint32_t dw_rel_ack_top(const struct dw_dgram_hdr *h);
/* With no ACK owed: the cumulative ACK point again (ACK, ack_psn = cursor, no
 * SACK block), for a data packet that goes anyway, once an ACK was built
 * since the receive side (re)started (before that the cursor may not be the
 * peer's). An ACK lost on the way is so repaired by our next packet, before
 * the peer learns anything else from us: the peer's application can never
 * hear from ours that data arrived (a Read completed) while the peer still
 * resends that data. True when h got it; the owed-ACK state is untouched. */
static inline bool dw_rel_ack_repeat(const struct dw_rel_peer *r, struct dw_dgram_hdr *h)
{
        if (!(r->flags2 & DW_REL_F2_ACKED) || (h->flags & DW_DGRAM_F_NAK))
                return false;
        h->flags |= DW_DGRAM_F_RD | DW_DGRAM_F_ACK;
        h->ack_psn = r->rcv_nxt;
        return true;
}
/* Turns h into an RNR NAK refusing psn; delay_us is rounded up to the 10 µs
 * unit (0 = let the sender pick its own back-off). */
void dw_rel_build_rnr_nak(struct dw_dgram_hdr *h, uint32_t psn, uint32_t delay_us);

/* ---- timers ---- */

/* Runs due work: peer timeout, RTO expiry (marks, backs off, counts toward
 * the retry limit), pending retransmissions (fast, RTO, after RNR), a due
 * ACK. Returns 0, a non back-pressure error from a callback, or the fatal
 * errno (-ETIMEDOUT retry limit or silent peer, -EREMOTEIO RNR limit), after
 * which the QP goes to error; the peer stays fatal. */
int dw_rel_timers(struct dw_rel_peer *r, uint64_t now, const struct dw_rel_ops *ops, void *ctx);
/* Earliest ns at which dw_rel_timers has work (≤ now: at once); UINT64_MAX none. */
uint64_t dw_rel_next_deadline(const struct dw_rel_peer *r);

/* Current RTO including backoff, ns. */
uint64_t dw_rel_rto_ns(const struct dw_rel_peer *r);
/* RFC 6298 update with one RTT measurement (exposed for tests). */
void dw_rel_rtt_sample(struct dw_rel_peer *r, uint64_t rtt_ns);
const char *dw_rel_fatal_str(const struct dw_rel_peer *r);

#endif
