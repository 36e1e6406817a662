/* RD reliability sublayer: see rel.h and README.md. */
#include "rel/rel.h"

#include <errno.h>
#include <string.h>

#define NS_PER_US   1000ull
#define NS_PER_MS   1000000ull
#define MAX_BACKOFF 16 /* 2^16 × 1 µs already exceeds any allowed rto_max */

void dw_rel_params_default(struct dw_rel_params *p)
{
        memset(p, 0, sizeof(*p));
        p->rto_init_us = DW_REL_DEF_RTO_INIT_US;
        p->rto_min_us = DW_REL_DEF_RTO_MIN_US;
        p->rto_max_us = DW_REL_DEF_RTO_MAX_US;
        p->ack_delay_us = DW_REL_DEF_ACK_DELAY_US;
        p->rnr_min_us = DW_REL_DEF_RNR_MIN_US;
        p->rnr_max_us = DW_REL_DEF_RNR_MAX_US;
        p->peer_timeout_ms = DW_REL_DEF_PEER_TIMEOUT_MS;
        p->window = DW_REL_DEF_WINDOW;
        p->ack_every = DW_REL_DEF_ACK_EVERY;
        p->retry_limit = DW_REL_DEF_RETRY_LIMIT;
        p->rnr_retry_limit = DW_REL_DEF_RNR_RETRY_LIMIT;
        p->dupthresh = DW_REL_DEF_DUPTHRESH;
}

static bool pow2_window(uint32_t n)
{
        return n >= 1 && n <= DW_REL_MAX_TXWIN && (n & (n - 1)) == 0;
}

int dw_rel_params_check(const struct dw_rel_params *p, const char **why)
{
        const char *w = NULL;

        if (!pow2_window(p->window))
                w = "window must be a power of two in 1..128";
        else if (p->rto_min_us < 1 || p->rto_min_us > p->rto_init_us ||
                 p->rto_init_us > p->rto_max_us)
                w = "need 1 <= rto_min <= rto_init <= rto_max";
        else if (p->rto_max_us > 4000000u)
                w = "rto_max above 4 s";
        else if (p->ack_every < 1)
                w = "ack_every must be >= 1";
        else if (p->dupthresh < 1)
                w = "dupthresh must be >= 1";
        else if (p->rnr_min_us < 1 || p->rnr_min_us > p->rnr_max_us)
                w = "need 1 <= rnr_min <= rnr_max";
        if (why)
                *why = w;
        return w ? -EINVAL : 0;
}

int dw_rel_peer_init(struct dw_rel_peer *r, const struct dw_rel_params *p,
                     struct dw_rel_txent *ring, uint32_t ring_len, uint32_t tx_psn, uint32_t rx_psn)
{
        if (!r || !p || !pow2_window(ring_len))
                return -EINVAL;
        memset(r, 0, sizeof(*r));
        r->p = p;
        r->ring = ring;
        r->ring_mask = (uint16_t)(ring_len - 1);
        r->snd_nxt = r->snd_una = r->sack_high = tx_psn;
        r->rcv_nxt = r->rcv_first = rx_psn;
        r->rto_ns = p->rto_init_us * (uint32_t)NS_PER_US;
        return 0;
}

void dw_rel_rx_start(struct dw_rel_peer *r, uint32_t rx_psn)
{
        r->rcv_nxt = r->rcv_first = rx_psn;
        r->rx_map[0] = r->rx_map[1] = 0;
        r->rx_unacked = 0;
        r->ack_deadline = 0;
        r->flags &= (uint8_t) ~(DW_REL_F_ACK_NOW | DW_REL_F_REQ_SEEN);
        r->flags2 &= (uint8_t) ~(DW_REL_F2_DSACK | DW_REL_F2_ACKED);
}

int dw_rel_tx_start(struct dw_rel_peer *r, uint32_t tx_psn)
{
        if (r->snd_nxt != r->snd_una)
                return -EBUSY;
        r->snd_nxt = r->snd_una = r->sack_high = r->rto_recover = r->rnr_psn = tx_psn;
        return 0;
}

int dw_rel_attach_ring(struct dw_rel_peer *r, struct dw_rel_txent *ring)
{
        if (!ring || r->ring || r->snd_nxt != r->snd_una)
                return -EINVAL;
        r->ring = ring;
        return 0;
}

struct dw_rel_txent *dw_rel_detach_ring(struct dw_rel_peer *r)
{
        struct dw_rel_txent *ring = r->ring;

        /* Every ring entry describes an outstanding PSN; none is left. */
        if (r->snd_nxt != r->snd_una)
                return NULL;
        r->ring = NULL;
        return ring;
}

static inline struct dw_rel_txent *ent(struct dw_rel_peer *r, uint32_t psn)
{
        return &r->ring[psn & r->ring_mask];
}

static inline uint32_t to_us(uint64_t now)
{
        return (uint32_t)(now / NS_PER_US);
}

static inline bool outstanding(const struct dw_rel_peer *r)
{
        return r->snd_nxt != r->snd_una;
}

static inline bool in_flight(const struct dw_rel_peer *r, uint32_t psn)
{
        return !dw_psn_before(psn, r->snd_una) && dw_psn_before(psn, r->snd_nxt);
}

static inline bool rnr_waiting(const struct dw_rel_peer *r, uint64_t now)
{
        return r->rnr_until != 0 && now < r->rnr_until;
}

static int set_fatal(struct dw_rel_peer *r, int err, enum dw_rel_fatal_reason why)
{
        r->fatal = (int16_t)err;
        r->fatal_reason = (uint8_t)why;
        return err;
}

static inline bool back_pressure(int rc)
{
        return rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -ENOBUFS;
}

uint64_t dw_rel_rto_ns(const struct dw_rel_peer *r)
{
        uint64_t max = (uint64_t)r->p->rto_max_us * NS_PER_US;
        uint64_t rto = (uint64_t)r->rto_ns << r->backoff;

        return rto < max ? rto : max;
}

/* The late ACK the streams of r's params learned to wait for (struct
 * dw_rel_stall), as of t: halved for every DW_REL_STALL_HALF_MS, or 64
 * times the wait if that is longer, since it was last seen (a path that
 * is slow to answer answers seldom: a second is a few dozen of its ACKs). */
static uint64_t stall_wait(const struct dw_rel_peer *r, uint64_t t)
{
        const struct dw_rel_stall *s = r->p->stall;
        if (!s || !s->wait_ns || t <= s->seen_at)
                return s ? s->wait_ns : 0;
        uint64_t half = (uint64_t)DW_REL_STALL_HALF_MS * NS_PER_MS;
        if (half < 64 * s->wait_ns)
                half = 64 * s->wait_ns;
        uint64_t halves = (t - s->seen_at) / half;
        return halves >= 64 ? 0 : s->wait_ns >> halves;
}

/* A needless probe or RTO: ACK progress came `wait` after the last. */
static void stall_seen(struct dw_rel_peer *r, uint64_t wait, uint64_t now)
{
        struct dw_rel_stall *s = r->p->stall;
        if (!s)
                return;
        if (wait > (uint64_t)r->p->rto_max_us * NS_PER_US)
                wait = (uint64_t)r->p->rto_max_us * NS_PER_US;
        uint64_t held = stall_wait(r, now);
        s->wait_ns = wait > held ? wait : held;
        s->seen_at = now;
}

void dw_rel_rtt_sample(struct dw_rel_peer *r, uint64_t rtt)
{
        const struct dw_rel_params *p = r->p;
        uint64_t max = (uint64_t)p->rto_max_us * NS_PER_US;
        uint64_t min = (uint64_t)p->rto_min_us * NS_PER_US;
        uint64_t srtt, var, rto;

        /* A sample longer than the largest RTO carries no usable information
         * and would overflow the 32-bit state. */
        if (rtt > max)
                rtt = max;
        if (!(r->flags & DW_REL_F_HAVE_RTT)) { /* RFC 6298 (2.2) */
                srtt = rtt;
                var = rtt / 2;
                r->flags |= DW_REL_F_HAVE_RTT;
        } else { /* (2.3): RTTVAR first, with the old SRTT; beta 1/4, alpha 1/8 */
                uint64_t old = r->srtt_ns;
                uint64_t dev = old > rtt ? old - rtt : rtt - old;

                var = (3 * (uint64_t)r->rttvar_ns + dev) / 4;
                srtt = (7 * old + rtt) / 8;
        }
        rto = srtt + (4 * var > DW_REL_CLOCK_G_NS ? 4 * var : DW_REL_CLOCK_G_NS);
        if (rto < min) /* (2.4) */
                rto = min;
        if (rto > max) /* (2.5) */
                rto = max;
        r->srtt_ns = (uint32_t)srtt;
        r->rttvar_ns = (uint32_t)var;
        r->rto_ns = (uint32_t)rto;
        /* Karn: a sample from a packet sent once ends the backoff. */
        r->backoff = 0;
}

/* ------------------------------------------------------------------ send */

bool dw_rel_tx_can_send(const struct dw_rel_peer *r, uint64_t now)
{
        return !r->fatal && r->ring && dw_rel_tx_inflight(r) <= r->ring_mask &&
               !rnr_waiting(r, now);
}

bool dw_rel_tx_want_ackreq(const struct dw_rel_peer *r)
{
        /* Asking on every packet of a window-limited flow would defeat ACK
         * coalescing; asking on the one that fills the window is enough. */
        return dw_rel_tx_inflight(r) + 1 == (uint32_t)r->ring_mask + 1;
}

int dw_rel_tx_rename(struct dw_rel_peer *r, uint32_t psn, uint64_t cookie, unsigned lane)
{
        if (!r->ring || !dw_psn_before(psn, r->snd_nxt) || dw_psn_before(psn, r->snd_una) ||
            lane >= DW_REL_MAX_LANES)
                return -EINVAL;
        ent(r, psn)->cookie = cookie;
        ent(r, psn)->lane = (uint8_t)lane;
        return 0;
}

int dw_rel_tx_sent(struct dw_rel_peer *r, uint32_t psn, uint64_t cookie, uint64_t now)
{
        struct dw_rel_txent *e;

        if (r->fatal)
                return r->fatal;
        if (psn != r->snd_nxt || !r->ring)
                return -EINVAL;
        if (dw_rel_tx_inflight(r) > r->ring_mask)
                return -EAGAIN;
        e = ent(r, psn);
        e->cookie = cookie;
        e->sent_us = to_us(now);
        e->retx = 0;
        e->flags = 0;
        e->lane = 0;
        e->rsvd = 0;
        if (!outstanding(r)) {
                r->last_progress = now;  /* the silent-peer clock starts with the first packet */
                r->rack_us = e->sent_us; /* no older delivery counts (µs stamps wrap) */
        }
        if (!r->rto_deadline) /* RFC 6298 (5.1) */
                r->rto_deadline = now + dw_rel_rto_ns(r);
        r->snd_nxt = psn + 1;
        if (r->flags & DW_REL_F_REQ_SEEN) {
                /* Data goes back within the ACK delay of a request: the peer's
                 * next requests can leave their ACK to our responses. */
                r->flags &= (uint8_t)~DW_REL_F_REQ_SEEN;
                if ((uint16_t)(e->sent_us - r->req_us16) <= r->p->ack_delay_us)
                        r->flags |= DW_REL_F_INTERACTIVE;
        }
        return 0;
}

/* RFC 6675 IsLost with SACKed-PSN counting: an un-SACKed PSN with at least
 * dupthresh SACKed PSNs above it is lost, and gets one fast retransmit. A
 * retransmission that is lost too is found the RACK way (RFC 8985): a packet
 * sent more than a reordering window after it has been delivered, so it is
 * overdue and goes again; without any later delivery the RTO recovers it. The
 * walk stays below sack_high, where the receiver's blocks described every
 * hole (it reports its lowest runs only). */
static unsigned mark_lost(struct dw_rel_peer *r)
{
        unsigned above[DW_REL_MAX_LANES] = {0}, marked = 0;
        uint32_t psn = r->sack_high;
        uint32_t reo_us = (r->flags & DW_REL_F_HAVE_RTT) ? r->srtt_ns / 4000u : 0;

        if (reo_us < DW_REL_MIN_REORDER_US)
                reo_us = DW_REL_MIN_REORDER_US;
        while (psn != r->snd_una) {
                struct dw_rel_txent *e = ent(r, --psn);

                unsigned lane = e->lane & (DW_REL_MAX_LANES - 1);
                if (e->flags & DW_REL_TXF_SACKED) {
                        above[lane]++;
                } else if (e->flags & DW_REL_TXF_PENDING) {
                        continue;
                } else if (!(e->flags & DW_REL_TXF_FAST)
                               ? above[lane] >= r->p->dupthresh
                               : (int32_t)(r->rack_us - e->sent_us) > (int32_t)reo_us) {
                        e->flags |= DW_REL_TXF_FAST | DW_REL_TXF_PENDING;
                        r->flags |= DW_REL_F_RETX_PENDING;
                        r->stats.fast_retransmits++;
                        marked++;
                }
        }
        return marked;
}

/* The first ACK progress after an RTO probe decides the episode (after F-RTO,
 * RFC 5682). If it holds a packet that was sent only once before the RTO, the
 * network was delivering all along and the timer fired because a side was not
 * scheduled (a descheduled process stalls for milliseconds, far above a
 * microsecond RTT): the RTO was spurious, its backoff is undone and SACK
 * recovery carries on. Otherwise only the probe got through: every un-SACKed
 * PSN sent before the RTO is lost and goes again now. */
static void rto_verdict(struct dw_rel_peer *r, bool orig_held, uint64_t quiet, uint64_t now,
                        const struct dw_rel_ops *ops, void *ctx)
{
        r->flags &= (uint8_t)~DW_REL_F_RTO_PROBE;
        if (orig_held) {
                r->backoff = r->rto_undo_backoff;
                /* The peer is slower to answer than the timers thought at
                 * times, by `quiet` since the last ACK progress: every
                 * stream sharing the params' stall record (rd/: every
                 * stream of the device) waits that long before it probes
                 * from now on (RFC 8985 widens its reordering window on D-SACK
                 * for the same reason). A peer's program that is not
                 * scheduled is late to all of its streams at once. */
                stall_seen(r, quiet, now);
                return;
        }
        /* Congestion control collapses only after a real timeout; what a
         * tail loss probe finds lost is a tail of losses, as SACK finds.
         * With a single packet outstanding the verdict proves nothing: the
         * probe is then the only packet an ACK can hold, whether the
         * original was lost or only late (a receiver that was not
         * scheduled), so it is not reported as a loss. */
        if (ops && ops->lost && r->probe_out > 1)
                ops->lost(ctx, (r->flags2 & DW_REL_F2_TLP) ? DW_REL_LOSS_PROBE : DW_REL_LOSS_RTO,
                          now);
        /* Only what had a round trip's time to be acknowledged: this ACK may
         * answer an earlier retransmission rather than the probe, and packets
         * sent just before the probe may still be on their way. */
        uint64_t rtt = (r->flags & DW_REL_F_HAVE_RTT) ? r->srtt_ns + r->srtt_ns / 4
                                                      : (uint64_t)r->p->rto_init_us * NS_PER_US;
        uint32_t now_us = to_us(now);

        for (uint32_t psn = r->snd_una; dw_psn_before(psn, r->rto_recover); psn++) {
                struct dw_rel_txent *e = ent(r, psn);

                if ((e->flags & (DW_REL_TXF_SACKED | DW_REL_TXF_PENDING)) ||
                    (uint64_t)(uint32_t)(now_us - e->sent_us) * NS_PER_US < rtt)
                        continue;
                e->flags |= DW_REL_TXF_PENDING | DW_REL_TXF_FAST;
                r->flags |= DW_REL_F_RETX_PENDING;
        }
}

static int on_nak(struct dw_rel_peer *r, const struct dw_dgram_hdr *h, uint64_t now)
{
        uint32_t psn = h->ack_psn;
        struct dw_rel_txent *e;

        if (!in_flight(r, psn))
                return 0; /* stale: already acked, or never sent */
        e = ent(r, psn);
        if (e->flags & DW_REL_TXF_SACKED)
                return 0;

        if (h->nak_code == DW_DGRAM_NAK_SEQ) {
                /* The receiver expects psn: resend it (we never send SEQ NAKs
                 * ourselves; selective repeat does not need them). */
                e->flags |= DW_REL_TXF_PENDING;
                r->flags |= DW_REL_F_RETX_PENDING;
                return 0;
        }
        if (h->nak_code != DW_DGRAM_NAK_RNR)
                return 0; /* access/operation errors: rd/ completes the WQE in error */

        r->stats.rnr_naks++;
        r->last_progress = now; /* the peer is alive, just out of receives */
        e->flags |= DW_REL_TXF_PENDING;
        r->flags |= DW_REL_F_RETX_PENDING;
        if (rnr_waiting(r, now))
                return 0; /* same episode: the in-flight packets after psn bounce too */

        const struct dw_rel_params *p = r->p;
        if (p->rnr_retry_limit != DW_REL_RNR_INFINITE && r->rnr_retries >= p->rnr_retry_limit)
                return set_fatal(r, -EREMOTEIO, DW_REL_RNR_EXCEEDED);
        if (r->rnr_retries == 0 || dw_psn_before(psn, r->rnr_psn))
                r->rnr_psn = psn;
        if (r->rnr_retries < 0xFE)
                r->rnr_retries++;

        uint64_t delay_us;
        if (h->rnr_delay) {
                delay_us = (uint64_t)h->rnr_delay * DW_DGRAM_RNR_DELAY_UNIT_US;
        } else {
                unsigned sh = r->rnr_retries - 1u;
                delay_us = (uint64_t)p->rnr_min_us << (sh > MAX_BACKOFF ? MAX_BACKOFF : sh);
                if (delay_us > p->rnr_max_us)
                        delay_us = p->rnr_max_us;
        }
        r->rnr_until = now + delay_us * NS_PER_US;
        /* Waiting for the receiver is not loss: keep the RTO out of the way. */
        r->rto_deadline = r->rnr_until + dw_rel_rto_ns(r);
        return 0;
}

/* The SACK blocks of h an ACK may carry, checked before anything changes:
 * the count taken (at most DW_DGRAM_MAX_SACK), or -EBADMSG for an ACK of
 * PSNs never sent or an empty block. */
static int ack_check(const struct dw_rel_peer *r, const struct dw_dgram_hdr *h)
{
        unsigned nsack = 0;
        if (dw_psn_before(r->snd_nxt, h->ack_psn))
                return -EBADMSG;
        if (h->flags & DW_DGRAM_F_SACK)
                nsack = h->sack_count < DW_DGRAM_MAX_SACK ? h->sack_count : DW_DGRAM_MAX_SACK;
        for (unsigned i = 0; i < nsack; i++)
                if (!dw_psn_before(h->sack[i].start, h->sack[i].end) ||
                    dw_psn_before(r->snd_nxt, h->sack[i].end))
                        return -EBADMSG;
        return (int)nsack;
}

/* What one ACK's walk over the packets it newly holds found. */
struct ack_scan {
        const struct dw_rel_ops *ops;
        void *ctx;
        uint32_t best_sent, best_psn; /* the RTT sample's packet */
        bool have_sample;
        bool orig_held; /* a packet sent once before the RTO got through */
        bool progress;  /* the cumulative point moved */
        bool sacked_new;
};

/* Packet psn (entry e) is newly held by the peer, cumulatively or SACKed. */
static inline void ack_held(struct dw_rel_peer *r, struct ack_scan *a, uint32_t psn,
                            struct dw_rel_txent *e)
{
        e->flags |= DW_REL_TXF_SACKED;
        if ((int32_t)(e->sent_us - r->rack_us) > 0)
                r->rack_us = e->sent_us;
        if (a->ops && a->ops->acked)
                a->ops->acked(a->ctx, psn, e->cookie);
        /* Karn: only packets sent once; the newest one has the least
         * coalescing delay in its sample. */
        if (e->retx == 0 && (!a->have_sample || (int32_t)(e->sent_us - a->best_sent) > 0)) {
                a->best_sent = e->sent_us;
                a->best_psn = psn;
                a->have_sample = true;
        }
        /* F-RTO: a packet sent only once before the RTO got through. */
        if (e->retx == 0 && dw_psn_before(psn, r->rto_recover))
                a->orig_held = true;
}

/* Walks what h newly holds: the cumulative point, then the SACK blocks from
 * index first (a D-SACK block, index 0, names a duplicate, not data held). */
static void ack_scan(struct dw_rel_peer *r, struct ack_scan *a, const struct dw_dgram_hdr *h,
                     unsigned first, unsigned nsack)
{
        while (dw_psn_before(r->snd_una, h->ack_psn)) {
                struct dw_rel_txent *e = ent(r, r->snd_una);

                if (!(e->flags & DW_REL_TXF_SACKED))
                        ack_held(r, a, r->snd_una, e);
                r->snd_una++;
                a->progress = true;
        }
        for (unsigned i = first; i < nsack; i++) {
                uint32_t psn = h->sack[i].start, end = h->sack[i].end;

                if (dw_psn_before(psn, r->snd_una))
                        psn = r->snd_una;
                for (; dw_psn_before(psn, end); psn++) {
                        struct dw_rel_txent *e = ent(r, psn);

                        if (!(e->flags & DW_REL_TXF_SACKED)) {
                                ack_held(r, a, psn, e);
                                a->sacked_new = true;
                        }
                }
                if (dw_psn_before(r->sack_high, end))
                        r->sack_high = end;
        }
        if (dw_psn_before(r->sack_high, r->snd_una))
                r->sack_high = r->snd_una;
}

/* The RTT sample of an ACK, if it may give one. old_high: sack_high before
 * the ACK; truncated: this ACK or the one before carried as many blocks as
 * fit. */
static void ack_sample(struct dw_rel_peer *r, const struct ack_scan *a, uint32_t old_high,
                       bool truncated, uint64_t now, uint64_t cc_rtt_end)
{
        if (!a->have_sample)
                return;
        /* A sample only from a packet no earlier ACK could have reported
         * (at or above the old sack_high), from ACKs that are not possibly
         * truncated, and not from the ACK that ends a probe episode: otherwise
         * the newest packet held may have arrived long ago (behind a hole,
         * beyond the blocks of earlier ACKs, or before ACKs that were lost)
         * and its age is not a round trip. */
        /* The ACK that ends a probe episode as spurious (it holds a packet
         * sent once before the probe) does give a sample: the original was
         * late, not lost, and how late is what the path takes (a receiver
         * that places data slowly). Without it the RTO would stay below the
         * path's real RTT and every packet would time out once. */
        bool spurious_end = (r->flags & DW_REL_F_RTO_PROBE) && a->orig_held;
        if (dw_psn_before(a->best_psn, old_high) || truncated ||
            ((r->flags & DW_REL_F_RTO_PROBE) && !spurious_end)) {
                r->backoff = 0; /* Karn: a packet sent once got through, the path works */
                return;
        }
        uint64_t rtt = (uint64_t)(uint32_t)(to_us(now) - a->best_sent) * NS_PER_US;
        dw_rel_rtt_sample(r, rtt);
        if (a->ops && a->ops->rtt) {
                /* cc_rtt_end: the ACK's arrival less the receiver's delay;
                 * never before the packet left, never past now. */
                uint64_t cc = rtt;
                int32_t d = (int32_t)(to_us(cc_rtt_end) - a->best_sent);
                if (cc_rtt_end < now && d > 0)
                        cc = (uint64_t)d * NS_PER_US;
                a->ops->rtt(a->ctx, a->best_psn, ent(r, a->best_psn)->cookie,
                            cc > UINT32_MAX ? UINT32_MAX : (uint32_t)cc, now);
        }
}

/* The ACK moved something: the retry count, tail-loss probe, probe
 * timeout's back-off, RNR wait and RTO timer follow. */
static void ack_progress(struct dw_rel_peer *r, uint64_t now)
{
        r->retries = 0;
        r->flags &= (uint8_t)~DW_REL_F_TLP_DONE;
        r->last_progress = now;
        if (r->rnr_retries &&
            (!in_flight(r, r->rnr_psn) || (ent(r, r->rnr_psn)->flags & DW_REL_TXF_SACKED)))
                r->rnr_retries = 0; /* the refused PSN got through */
        /* RFC 6298 (5.2)/(5.3) */
        r->rto_deadline = outstanding(r) ? now + dw_rel_rto_ns(r) : 0;
        if (!outstanding(r))
                r->rnr_until = 0;
}

uint32_t dw_rel_rx_highest(const struct dw_rel_peer *r)
{
        if (!(r->rx_map[0] | r->rx_map[1]))
                return r->rcv_nxt - 1;
        /* Rotated so that bit i is rcv_nxt + i, as dw_rel_build_ack does. */
        unsigned __int128 m = ((unsigned __int128)r->rx_map[1] << 64) | r->rx_map[0];
        unsigned s = r->rcv_nxt & (DW_REL_RX_WINDOW - 1);
        if (s)
                m = (m >> s) | (m << (DW_REL_RX_WINDOW - s));
        uint64_t hi = (uint64_t)(m >> 64), lo = (uint64_t)m;
        unsigned top =
            hi ? 127u - (unsigned)__builtin_clzll(hi) : 63u - (unsigned)__builtin_clzll(lo);
        return r->rcv_nxt + top;
}

uint32_t dw_rel_ack_top(const struct dw_dgram_hdr *h)
{
        uint32_t top = h->ack_psn - 1;
        unsigned first = (h->xflags & DW_DGRAM_X_DSACK) && h->sack_count ? 1 : 0;
        for (unsigned i = first; i < h->sack_count; i++)
                if (dw_psn_before(top, h->sack[i].end - 1))
                        top = h->sack[i].end - 1;
        return top;
}

void dw_rel_ack_delay(const struct dw_rel_peer *r, struct dw_dgram_hdr *h, uint64_t now)
{
        if (!(r->flags2 & DW_REL_F2_RX_HIGH) || !(h->flags & DW_DGRAM_F_ACK) ||
            (h->flags & DW_DGRAM_F_NAK) || dw_rel_ack_top(h) != dw_rel_rx_highest(r))
                return;
        uint32_t us = (uint32_t)(uint16_t)((uint16_t)(now / 16000u) - r->rx_high_t16) * 16u;
        if (us < DW_REL_ACK_DELAY_MIN_US)
                return;
        h->xflags2 |= DW_DGRAM_X2_ACKDELAY;
        h->ack_delay_us = us > DW_DGRAM_ACK_DELAY_MAX_US ? DW_DGRAM_ACK_DELAY_MAX_US : us;
}

int dw_rel_on_ack(struct dw_rel_peer *r, const struct dw_dgram_hdr *h, uint64_t now,
                  const struct dw_rel_ops *ops, void *ctx)
{
        return dw_rel_on_ack_at(r, h, now, now, ops, ctx);
}

int dw_rel_on_ack_at(struct dw_rel_peer *r, const struct dw_dgram_hdr *h, uint64_t now,
                     uint64_t arrived, const struct dw_rel_ops *ops, void *ctx)
{
        if (r->fatal)
                return r->fatal;
        if (h->flags & DW_DGRAM_F_NAK)
                return on_nak(r, h, now);
        if (!(h->flags & DW_DGRAM_F_ACK))
                return 0;

        /* Validate everything before changing anything. */
        int checked = ack_check(r, h);
        if (checked < 0)
                return checked;
        unsigned nsack = (unsigned)checked;
        /* A D-SACK block names a duplicate the peer received, not data it
         * holds beyond the cumulative point: it is evidence, not a SACK. */
        bool dsack = (h->xflags & DW_DGRAM_X_DSACK) && nsack;

        uint32_t old_high = r->sack_high;
        struct ack_scan a = {.ops = ops, .ctx = ctx};
        ack_scan(r, &a, h, dsack ? 1 : 0, nsack);
        bool sack_full = r->flags & DW_REL_F_SACK_FULL;
        /* As many blocks as fit: runs above the last one may exist unreported. */
        if (nsack >= DW_DGRAM_MAX_SACK)
                r->flags |= DW_REL_F_SACK_FULL;
        else
                r->flags &= (uint8_t)~DW_REL_F_SACK_FULL;

        /* The receiver's delay counts for the packet it names: the highest
         * this ACK reports, which is the sample's when it is new. */
        uint64_t cc_end = arrived < now ? arrived : now;
        if ((h->xflags2 & DW_DGRAM_X2_ACKDELAY) && a.have_sample &&
            a.best_psn == dw_rel_ack_top(h)) {
                uint64_t d = (uint64_t)h->ack_delay_us * NS_PER_US;
                cc_end = cc_end > d ? cc_end - d : 0;
        }
        ack_sample(r, &a, old_high, nsack >= DW_DGRAM_MAX_SACK || sack_full, now, cc_end);
        uint64_t quiet = now > r->last_progress ? now - r->last_progress : 0;
        bool moved = a.progress || a.sacked_new;
        if (moved)
                ack_progress(r, now);
        /* A duplicate of something sent before the probe episode began: the
         * probe (or the packet it duplicated) had arrived, the timer fired
         * for a late ACK, not a loss. */
        if (dsack && (r->flags & DW_REL_F_RTO_PROBE) &&
            dw_psn_before(h->sack[0].start, r->rto_recover)) {
                r->stats.spurious++;
                rto_verdict(r, true, quiet, now, ops, ctx);
        }
        if ((r->flags & DW_REL_F_RTO_PROBE) && moved)
                rto_verdict(r, a.orig_held, quiet, now, ops, ctx);
        if (moved && r->sack_high != r->snd_una && mark_lost(r) && ops && ops->lost)
                ops->lost(ctx, DW_REL_LOSS_SACK, now);
        return 0;
}

/* --------------------------------------------------------------- receive */

static inline bool rx_bit(const struct dw_rel_peer *r, uint32_t psn)
{
        unsigned i = psn & (DW_REL_RX_WINDOW - 1);

        return (r->rx_map[i >> 6] >> (i & 63)) & 1;
}

enum dw_rel_verdict dw_rel_rx_classify(const struct dw_rel_peer *r, uint32_t psn)
{
        int32_t d = dw_psn_diff(psn, r->rcv_nxt);

        if (d < 0)
                return DW_REL_DUPLICATE;
        if (d >= (int32_t)DW_REL_RX_WINDOW)
                return DW_REL_OUT_OF_WINDOW;
        return d > 0 && rx_bit(r, psn) ? DW_REL_DUPLICATE : DW_REL_NEW;
}

uint32_t dw_rel_rx_data(struct dw_rel_peer *r, uint32_t psn, bool ack_req, uint64_t now,
                        enum dw_rel_verdict *verdict)
{
        enum dw_rel_verdict v = dw_rel_rx_classify(r, psn);
        uint32_t adv = 0;

        if (verdict)
                *verdict = v;
        if (v == DW_REL_OUT_OF_WINDOW) {
                r->stats.rx_oow++;
                return 0;
        }
        if (v == DW_REL_DUPLICATE) {
                /* The sender missed our ACK (or the network duplicated): answer
                 * at once so it stops retransmitting. */
                r->stats.rx_dup++;
                r->flags |= DW_REL_F_ACK_NOW;
                /* Reported with the next ACK (RFC 2883): the sender learns that
                 * a retransmission was needless. */
                r->flags2 |= DW_REL_F2_DSACK;
                r->dsack_psn = psn;
                return 0;
        }
        if (psn != r->rcv_nxt) {
                unsigned i = psn & (DW_REL_RX_WINDOW - 1);

                r->rx_map[i >> 6] |= 1ull << (i & 63);
                /* A hole: SACK it now so the sender's fast retransmit can run
                 * (RFC 5681 §4.2 acks out-of-order segments immediately). */
                r->flags |= DW_REL_F_ACK_NOW;
                return 0;
        }
        do {
                unsigned i = r->rcv_nxt & (DW_REL_RX_WINDOW - 1);

                r->rx_map[i >> 6] &= ~(1ull << (i & 63));
                r->rcv_nxt++;
                adv++;
        } while (rx_bit(r, r->rcv_nxt));

        if (adv > 1 || r->rx_map[0] || r->rx_map[1])
                r->flags |= DW_REL_F_ACK_NOW; /* filled a hole, or holes remain */
        else
                dw_rel_rx_ack_in_order(r, ack_req, now);
        return adv;
}

bool dw_rel_ack_due(const struct dw_rel_peer *r, uint64_t now)
{
        return (r->flags & DW_REL_F_ACK_NOW) || (r->ack_deadline && now >= r->ack_deadline);
}

bool dw_rel_ack_owed(const struct dw_rel_peer *r)
{
        return (r->flags & DW_REL_F_ACK_NOW) || r->ack_deadline;
}

int dw_rel_build_ack(struct dw_rel_peer *r, struct dw_dgram_hdr *h, unsigned max_sack)
{
        struct dw_dgram_sack runs[DW_REL_RX_WINDOW / 2];
        unsigned nr = 0, n = 0, i;

        if (h->flags & DW_DGRAM_F_NAK)
                return -EINVAL;
        if (max_sack > DW_DGRAM_MAX_SACK)
                max_sack = DW_DGRAM_MAX_SACK;
        h->flags |= DW_DGRAM_F_RD | DW_DGRAM_F_ACK;
        h->flags &= (uint8_t)~DW_DGRAM_F_SACK;
        h->xflags &= (uint8_t)~DW_DGRAM_X_DSACK;
        h->ack_psn = r->rcv_nxt;
        if (max_sack && (r->flags2 & DW_REL_F2_DSACK)) {
                /* The duplicate first, as RFC 2883 puts it. */
                h->xflags |= DW_DGRAM_X_DSACK;
                h->sack[n].start = r->dsack_psn;
                h->sack[n].end = r->dsack_psn + 1;
                n++;
                r->flags2 &= (uint8_t)~DW_REL_F2_DSACK;
        }

        if (max_sack && (r->rx_map[0] | r->rx_map[1])) {
                /* Rotate the bitmap so bit i is rcv_nxt + i (bit 0 is never set). */
                unsigned __int128 m = ((unsigned __int128)r->rx_map[1] << 64) | r->rx_map[0];
                unsigned s = r->rcv_nxt & (DW_REL_RX_WINDOW - 1);

                if (s)
                        m = (m >> s) | (m << (DW_REL_RX_WINDOW - s));
                i = 1;
                while (m >> i) {
                        unsigned start, end;

                        while (!((m >> i) & 1))
                                i++;
                        start = i;
                        while (i < DW_REL_RX_WINDOW && ((m >> i) & 1))
                                i++;
                        end = i;
                        runs[nr].start = r->rcv_nxt + start;
                        runs[nr].end = r->rcv_nxt + end;
                        nr++;
                        if (i >= DW_REL_RX_WINDOW)
                                break;
                }
                /* The lowest runs only, ascending: the blocks then describe
                 * [ack_psn, end of the last block) completely, so every gap
                 * between them is a real hole and the sender may infer loss
                 * there. Skipping to a higher run would leave unreported runs
                 * below it that the sender would take for holes and resend. */
                for (i = 0; i < nr && n < max_sack; i++)
                        h->sack[n++] = runs[i];
        }
        h->sack_count = (uint8_t)n;
        if (n)
                h->flags |= DW_DGRAM_F_SACK;
        r->flags &= (uint8_t)~DW_REL_F_ACK_NOW;
        r->flags2 |= DW_REL_F2_ACKED;
        r->ack_deadline = 0;
        r->rx_unacked = 0;
        r->stats.acks_built++;
        return (int)n;
}

void dw_rel_build_rnr_nak(struct dw_dgram_hdr *h, uint32_t psn, uint32_t delay_us)
{
        uint32_t units = (delay_us + DW_DGRAM_RNR_DELAY_UNIT_US - 1) / DW_DGRAM_RNR_DELAY_UNIT_US;

        h->flags = DW_DGRAM_F_RD | DW_DGRAM_F_NAK | (h->flags & DW_DGRAM_F_CREDIT);
        h->sack_count = 0;
        h->nak_code = DW_DGRAM_NAK_RNR;
        h->ack_psn = psn;
        h->rnr_delay = (uint16_t)(units > 0xFFFF ? 0xFFFF : units);
}

/* ---------------------------------------------------------------- timers */

/* RTO expiry. At microsecond RTTs nearly every expiry comes from a side that
 * was not scheduled for a few milliseconds, not from loss, so resending every
 * un-SACKed PSN would mostly make duplicates. Only the oldest un-SACKed PSN
 * goes (the probe); the ACK it draws decides the rest (rto_verdict). The
 * episode starts a fresh fast-retransmit round: a hole whose fast
 * retransmission was lost can be found again by SACKs. */
/* When a tail loss probe is due (RFC 8985 §7, simplified): no ACK progress
 * for PTO = 2 SRTT + the ACK delay, while packets are outstanding. The tail
 * of a burst, or the last ACK of a stalled window, was lost and nothing else
 * will draw an ACK: probing now recovers in a few RTTs instead of the RTO's
 * millisecond floor. Once per episode; UINT64_MAX when not armed. */
static uint64_t tlp_at(const struct dw_rel_peer *r)
{
        if (!(r->flags & DW_REL_F_HAVE_RTT) ||
            (r->flags & (DW_REL_F_TLP_DONE | DW_REL_F_RTO_PROBE)) || !outstanding(r))
                return UINT64_MAX;
        uint64_t pto = 2ull * r->srtt_ns + (uint64_t)r->p->ack_delay_us * NS_PER_US;
        if (pto < DW_REL_MIN_PTO_US * NS_PER_US)
                pto = DW_REL_MIN_PTO_US * NS_PER_US;
        uint64_t late = stall_wait(r, r->last_progress);
        if (pto < late + late / 4)
                pto = late + late / 4;
        uint64_t t = r->last_progress + pto;
        return r->rto_deadline && t >= r->rto_deadline ? UINT64_MAX : t;
}

static void rto_probe(struct dw_rel_peer *r, bool tlp)
{
        bool first = true;

        if (!(r->flags & DW_REL_F_RTO_PROBE)) {
                r->flags |= DW_REL_F_RTO_PROBE;
                r->rto_recover = r->snd_nxt;
                r->rto_undo_backoff = r->backoff;
                r->flags2 |= DW_REL_F2_TLP;
                unsigned out = 0;
                for (uint32_t psn = r->snd_una; psn != r->snd_nxt && out < UINT8_MAX; psn++)
                        if (!(ent(r, psn)->flags & DW_REL_TXF_SACKED))
                                out++;
                r->probe_out = (uint8_t)out;
        }
        if (!tlp)
                r->flags2 &= (uint8_t)~DW_REL_F2_TLP;
        for (uint32_t psn = r->snd_una; psn != r->snd_nxt; psn++) {
                struct dw_rel_txent *e = ent(r, psn);

                if (!tlp)
                        e->flags &= (uint8_t)~DW_REL_TXF_FAST;
                if (first && !(e->flags & DW_REL_TXF_SACKED)) {
                        e->flags |= DW_REL_TXF_PENDING;
                        r->flags |= DW_REL_F_RETX_PENDING;
                        first = false;
                }
        }
}

int dw_rel_timers(struct dw_rel_peer *r, uint64_t now, const struct dw_rel_ops *ops, void *ctx)
{
        const struct dw_rel_params *p = r->p;
        int rc;

        if (r->fatal)
                return r->fatal;

        if (outstanding(r)) {
                if (p->peer_timeout_ms &&
                    now - r->last_progress >= (uint64_t)p->peer_timeout_ms * NS_PER_MS)
                        return set_fatal(r, -ETIMEDOUT, DW_REL_PEER_TIMEOUT);
                if (now >= tlp_at(r) && !rnr_waiting(r, now)) {
                        /* Tail loss probe: no RTO count, no backoff. */
                        r->flags |= DW_REL_F_TLP_DONE;
                        r->stats.tail_probes++;
                        rto_probe(r, true);
                }
                if (r->rto_deadline && now >= r->rto_deadline && !rnr_waiting(r, now) &&
                    (r->flags & DW_REL_F_RETX_PENDING)) {
                        /* The last probe (or retransmission) has not left yet:
                         * local back-pressure, not a silent network. No retry
                         * counted, no backoff; the silent-peer bound still holds. */
                        r->rto_deadline = now + dw_rel_rto_ns(r);
                } else if (r->rto_deadline && now >= r->rto_deadline && !rnr_waiting(r, now)) {
                        r->stats.rto_expiries++;
                        if (r->retries < UINT8_MAX)
                                r->retries++;
                        /* A peer timeout, when set, alone ends a silent
                         * stream: at µs RTTs the 12 expiries take 2 s, and a
                         * peer whose program was not scheduled, not
                         * progressed or stopped that long is not gone. */
                        if (!p->peer_timeout_ms && r->retries > p->retry_limit)
                                return set_fatal(r, -ETIMEDOUT, DW_REL_RETRY_EXCEEDED);
                        rto_probe(r, false);
                        if (r->backoff < MAX_BACKOFF) /* RFC 6298 (5.5) */
                                r->backoff++;
                        r->rto_deadline = now + dw_rel_rto_ns(r); /* (5.6) */
                }
        }

        if ((r->flags & DW_REL_F_RETX_PENDING) && !rnr_waiting(r, now)) {
                uint32_t now_us = to_us(now);

                for (uint32_t psn = r->snd_una; psn != r->snd_nxt; psn++) {
                        struct dw_rel_txent *e = ent(r, psn);

                        if (!(e->flags & DW_REL_TXF_PENDING))
                                continue;
                        if (!(e->flags & DW_REL_TXF_SACKED)) {
                                rc = ops->retransmit(ctx, psn, e->cookie);
                                if (rc < 0)
                                        return back_pressure(rc) ? 0 : rc;
                                e->sent_us = now_us;
                                if (e->retx < UINT8_MAX)
                                        e->retx++;
                                r->stats.retransmits++;
                        }
                        e->flags &= (uint8_t)~DW_REL_TXF_PENDING;
                }
                r->flags &= (uint8_t)~DW_REL_F_RETX_PENDING;
                r->rnr_until = 0;
                if (!r->rto_deadline && outstanding(r))
                        r->rto_deadline = now + dw_rel_rto_ns(r);
        }

        if (dw_rel_ack_due(r, now) && ops->send_ack) {
                /* A request's ACK waited the whole delay and no response took
                 * it: the exchange is over, answer the next requests at once. */
                if (!(r->flags & DW_REL_F_ACK_NOW) && (r->flags & DW_REL_F_REQ_SEEN))
                        r->flags &= (uint8_t) ~(DW_REL_F_INTERACTIVE | DW_REL_F_REQ_SEEN);
                rc = ops->send_ack(ctx);
                if (rc < 0 && !back_pressure(rc))
                        return rc;
        }
        return 0;
}

uint64_t dw_rel_next_deadline(const struct dw_rel_peer *r)
{
        uint64_t d = UINT64_MAX;

        if (r->fatal || (r->flags & DW_REL_F_ACK_NOW))
                return 0;
        if (r->flags & DW_REL_F_RETX_PENDING) {
                if (!r->rnr_until)
                        return 0;
                d = r->rnr_until;
        }
        if (r->ack_deadline && r->ack_deadline < d)
                d = r->ack_deadline;
        if (outstanding(r)) {
                if (r->rto_deadline && r->rto_deadline < d)
                        d = r->rto_deadline;
                if (tlp_at(r) < d)
                        d = tlp_at(r);
                if (r->p->peer_timeout_ms) {
                        uint64_t t = r->last_progress + (uint64_t)r->p->peer_timeout_ms * NS_PER_MS;
                        if (t < d)
                                d = t;
                }
        }
        return d;
}

const char *dw_rel_fatal_str(const struct dw_rel_peer *r)
{
        switch (r->fatal_reason) {
        case DW_REL_OK:
                return "ok";
        case DW_REL_RETRY_EXCEEDED:
                return "retransmission retry limit exceeded";
        case DW_REL_PEER_TIMEOUT:
                return "peer silent for the peer timeout";
        case DW_REL_RNR_EXCEEDED:
                return "RNR retry limit exceeded";
        }
        return "unknown";
}
