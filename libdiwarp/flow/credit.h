/* Credit-based mailbox receive ring: the accounting of one
 * endpoint's ring and of the credits it holds in its peers' rings, for the
 * static protocol (fixed per-sender quota, Eq. 5.1 threshold) and the dynamic
 * one (intended quotas moved between senders by activity, compulsory credit
 * return). Pure logic like the rest of flow/: no sockets, no clock, no
 * logging; memory is allocated once by dw_credit_init, never per message.
 * flow/README.md ("Credits") has the model and what is not wired yet.
 *
 * An endpoint plays both roles towards each of its npeers peers:
 *  - receiver: its ring of ring_slots data slots is shared by every peer;
 *    a peer may fill slots only up to the credits the endpoint granted it;
 *  - sender: it holds credits in each peer's ring and never sends a
 *    slot-consuming message (data, compulsory request or response) without.
 * Stand-alone credit messages take no credit: they land in the receiving
 * endpoint's credit region, credit_slots entries per peer.
 *
 * Decisions where the thesis the ring follows leaves a choice (flow/README.md
 * names it and lists them):
 *  1. Credits are cumulative, not deltas: a credit message carries the limit
 *     "you may have used up to L slots of my ring in all" (32-bit, compared
 *     modulo 2^32). A lost, duplicated or reordered credit value is then
 *     harmless: a later one supersedes it. The sender's position ("used")
 *     counts the slots it sent and the credits it gave back; a compulsory
 *     response carries the sender's cumulative give-back, so it too is
 *     idempotent. The thesis's deltas rely on a lossless in-order network.
 *  2. The credit region holds credit_slots unconsumed stand-alone credit
 *     messages per peer; with Eq. 5.1 and in-order credit messages (the
 *     thesis's setting) the static protocol never has more outstanding.
 *     Should one more arrive (credits that travelled out of band on an ACK
 *     let the peer return more before the sender read the older ones; credit
 *     messages reordered or duplicated; the dynamic protocol, whose FIFO does
 *     not strictly bound them: seen mostly while a sender holds more than
 *     its shrunk quota, or with a floor above credit_slots), it is
 *     merged into the newest entry, which cumulative values make lossless;
 *     stats.cr_merged counts the merges (the thesis's overflow).
 *  3. A message takes one or several consecutive slots, wrapping at the end
 *     of the ring (no padding, so the count of free slots is exact). Slots
 *     return to the senders in ring order: a released message frees its
 *     slots (and counts as retrieved for its sender) once every message
 *     before it is released too, as the mailbox's single read pointer does.
 *     Its slots count one by one towards the thresholds, as one-slot
 *     packets would.
 *  4. Partial sends: dw_credit_tx_take grants up to what is asked, so a
 *     message is sent in pieces as credits come (thesis Sec. 5.2).
 *  5. Dynamic protocol: a threshold is reached when retrieved + piggybacked
 *     >= the FIFO head (both ways), and also when the sender holds no credit
 *     at all (nothing held, in flight or unread), which keeps a sender whose
 *     head threshold outgrew its shrunk quota from waiting forever. The
 *     per-sender floor (static_slots) is never lent out: a return may always
 *     draw on the sender's own floor, so "at least 1" never overflows. The
 *     blocked flow leaves the FIFO alone. A compulsory response's amount is
 *     computed when the request arrives. A monitoring point is every
 *     (credit_slots + 1)-th threshold event of the sender.
 *  6. Dynamic, messages that cannot be cut (cfg.msg_slots): a sender holding
 *     fewer credits than msg_slots reaches a threshold at once and is
 *     refilled to msg_slots from its floor (so msg_slots <= the floor).
 *
 * Not thread-safe: the caller serializes the calls on one struct dw_credit.
 */
#ifndef DW_FLOW_CREDIT_H
#define DW_FLOW_CREDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DW_CREDIT_MAX_PEERS     (1u << 24) /* a peer index fits the QPN's 24 bits */
#define DW_CREDIT_MAX_SLOTS     (1u << 24) /* data slots in one ring */
#define DW_CREDIT_MAX_CSLOTS    64u        /* credit_slots per peer */
#define DW_CREDIT_MIN_SLOT_SIZE 64u
#define DW_CREDIT_MAX_SLOT_SIZE 65536u

enum dw_credit_mode {
        DW_CREDIT_STATIC = 1,  /* fixed quota per sender (thesis ch. 5) */
        DW_CREDIT_DYNAMIC = 2, /* intended quotas follow activity (thesis ch. 6) */
};

struct dw_credit_cfg {
        enum dw_credit_mode mode;
        uint32_t npeers;       /* senders sharing the ring (and receivers we send to) */
        uint32_t ring_slots;   /* data region, in slots */
        uint32_t slot_size;    /* bytes; a power of two in [64, 65536] */
        uint32_t credit_slots; /* c: credit-region entries per peer, 1..64 */
        /* Dynamic: the per-sender floor (static_slots); 0 = credit_slots. */
        uint32_t min_quota;
        /* Dynamic: cap on a sender's intended quota; 0 = none. */
        uint32_t max_quota;
        /* Static: the return threshold; 0 = Eq. 5.1. Any other value must be
         * 1..quota (a threshold above the quota can never be reached). */
        uint32_t threshold;
        /* Dynamic: the most slots one message takes when it cannot be sent
         * in pieces (0 = 1, at most the floor): a sender left holding fewer
         * is refilled to it at once, so it never waits for a threshold its
         * own traffic can no longer reach. */
        uint32_t msg_slots;
        /* Dynamic: compulsory requests and responses travel outside the ring
         * (the transport delivers them reliably on its own): they take no
         * slot and no credit, so a sender whose credits are all in flight
         * can still answer, and the caller does not rx_arrive them. The
         * thesis's mailbox messages (false) take one each. */
        bool ctl_free;
        /* Credits we hold in each peer's ring at the start: what the peer's
         * configuration grants a sender (static: its ring_slots / npeers;
         * dynamic: its floor). 0 = derive it from this configuration, right
         * when every endpoint of the job uses the same knobs. */
        uint32_t init_credits;
};

/* Per-peer state, both roles (48 bytes). The dynamic protocol adds a
 * struct dw_credit_dyn (16 bytes) and a FIFO of credit_slots + 1 thresholds
 * (4 bytes each) per peer, outside it. */
struct dw_credit_peer {
        /* Sender role: our credits in the peer's ring. */
        uint32_t tx_limit; /* cumulative limit the peer granted (newest known) */
        uint32_t tx_used;  /* slots sent + credits given back, cumulative */
        uint32_t tx_skip;  /* credits given back by compulsory responses, cumulative */
        uint32_t cr_value; /* newest limit among unconsumed stand-alone credit messages */
        /* Receiver role: the peer's share of our ring. */
        uint32_t rx_granted; /* cumulative limit granted to the peer */
        uint32_t rx_arrived; /* slots arrived, cumulative */
        uint32_t rx_retired; /* slots retrieved (freed in ring order), cumulative */
        uint32_t rx_skip;    /* credits the peer gave back (newest response) */
        uint32_t retrieved;  /* retrieved_packets: retrieved since the last return */
        uint32_t intended;   /* static: the quota; dynamic: the intended quota */
        uint32_t q_next;     /* control queue link */
        uint8_t cr_used;     /* unconsumed stand-alone credit messages from the peer */
        uint8_t flags;       /* DW_CREDIT_F_* */
};

/* The dynamic protocol's part of a peer, beside its FIFO of thresholds:
 * allocated in dynamic mode only, so a peer of the static protocol costs
 * the 48 bytes above and nothing more. */
struct dw_credit_dyn {
        uint32_t piggybacked; /* returned early by piggyback this interval */
        uint32_t prev, next;  /* activity list links */
        uint8_t list;         /* activity list (slot 0..3) */
        uint8_t events;       /* threshold events modulo credit_slots + 1 */
};

#define DW_CREDIT_F_BLOCKED 0x01 /* compulsory request sent, response not yet in */
#define DW_CREDIT_F_REQ     0x02 /* a compulsory request waits for a credit */
#define DW_CREDIT_F_RESP    0x04 /* a compulsory response waits for a credit */
#define DW_CREDIT_F_DUE     0x08 /* a stand-alone credit message is owed */
#define DW_CREDIT_F_CHANGED 0x10 /* rx_granted moved since last carried to the peer */
#define DW_CREDIT_F_QUEUED  0x20 /* in the control queue */

enum dw_credit_act { DW_CREDIT_HIGH = 0, DW_CREDIT_MEDIUM, DW_CREDIT_LOW, DW_CREDIT_NULL };

struct dw_credit_stats {
        uint64_t arrivals;    /* messages placed in the ring */
        uint64_t slots_in;    /* slots they took */
        uint64_t credit_msgs; /* stand-alone credit messages handed out to send */
        uint64_t piggybacks;  /* credit values handed out to ride on other packets */
        uint64_t early_slots; /* credits returned early by piggyback */
        uint64_t cr_merged;   /* credit messages merged for want of a credit-region entry */
        uint64_t tx_stalls;   /* tx_take calls that got fewer slots than asked */
        uint64_t requests;    /* compulsory requests handed out */
        uint64_t responses;   /* compulsory responses handed out */
        uint64_t steals;      /* intended-quota moves */
        uint64_t refused;     /* arrivals refused: the sender had no credit */
};

struct dw_credit {
        struct dw_credit_cfg cfg;
        struct dw_credit_peer *peer;
        struct dw_credit_dyn *dyn; /* dynamic: npeers of them; NULL in static mode */
        uint32_t *fifo;            /* dynamic: npeers x (credit_slots + 1) thresholds */
        uint32_t *slot;            /* per ring slot: (peer + 1) at a message's first slot, else 0 */
        uint32_t *slot_len;        /* per ring slot: the message's slots (first slot only) */
        uint8_t *slot_done;        /* per ring slot: the message was released (first slot only) */
        uint32_t head, tail;       /* ring positions, cumulative (mod 2^32) */
        uint32_t available;        /* dynamic: data slots granted to nobody */
        uint32_t q_head, q_tail;
        uint32_t lhead[4], ltail[4], llen[4];
        uint8_t role[4]; /* activity role -> list slot */
        struct dw_credit_stats stats;
};

enum dw_credit_ctl_type {
        DW_CREDIT_CTL_CREDIT = 1,   /* stand-alone credit: value = our limit for the peer */
        DW_CREDIT_CTL_REQUEST = 2,  /* compulsory credit return request (takes a slot) */
        DW_CREDIT_CTL_RESPONSE = 3, /* compulsory response: value = our cumulative give-back */
};

struct dw_credit_ctl {
        uint32_t peer;
        enum dw_credit_ctl_type type;
        uint32_t value;
};

/* Read-only view of one peer, for tests, counters and the invariants. */
struct dw_credit_view {
        uint32_t tx_credits; /* slots we may still send to the peer */
        uint32_t rx_current; /* thesis current_credits: granted, not yet retrieved or given back */
        uint32_t rx_inring;  /* the peer's slots in our ring, arrived and not retrieved */
        uint32_t rx_retrieved; /* retrieved, not yet returned (static) */
        uint32_t intended;
        uint32_t threshold; /* static: the threshold; dynamic: the FIFO head */
        uint32_t cr_used;
        enum dw_credit_act act;
        bool blocked;
};

/* Eq. 5.1: quota div (credit_slots + 1) + 1 (0 if credit_slots + 1 is 0). */
uint32_t dw_credit_threshold(uint32_t quota, uint32_t credit_slots);

void dw_credit_cfg_default(struct dw_credit_cfg *cfg, enum dw_credit_mode mode, uint32_t npeers,
                           uint32_t ring_slots);

/* Allocates and sets up. Returns 0, or -EINVAL with the reason in why (may be
 * NULL): mode, npeers, ring_slots, slot_size, credit_slots, min_quota,
 * max_quota or threshold out of range, or a ring too small to give every
 * peer one slot (static) or its floor (dynamic); -ENOMEM. */
int dw_credit_init(struct dw_credit *c, const struct dw_credit_cfg *cfg, char *why, size_t whylen);
void dw_credit_fini(struct dw_credit *c);

/* The peer's counters start over, both roles (static protocol only): as
 * after dw_credit_init, for a stream that the two ends start over together
 * (RD's stream restart, docs/PROTOCOL.md "Credits"), or for an index handed
 * to a new peer. Its messages still in the ring leave it in order without
 * crediting anyone. -EINVAL no such peer, -EOPNOTSUPP the dynamic protocol,
 * whose quotas other peers hold shares of. */
int dw_credit_peer_reset(struct dw_credit *c, uint32_t peer);

/* Slots a message of `bytes` takes (at least 1). */
uint32_t dw_credit_slots_for(const struct dw_credit *c, uint64_t bytes);
/* Per-peer state in bytes (the struct plus the dynamic FIFO). */
size_t dw_credit_peer_bytes(const struct dw_credit *c);

/* ---- Sender role ------------------------------------------------------------ */

/* Slots we may send to peer now (credits left after the queued compulsory
 * messages, which go first). 0 for a bad peer. */
uint32_t dw_credit_tx_avail(const struct dw_credit *c, uint32_t peer);
/* Takes up to want credits towards peer and returns how many (0..want): the
 * caller sends that many slots now, as one message or piece of one. */
uint32_t dw_credit_tx_take(struct dw_credit *c, uint32_t peer, uint32_t want);
/* Gives back n credits taken by the last dw_credit_tx_take calls for
 * slots that never left (the socket refused the datagram). */
void dw_credit_tx_untake(struct dw_credit *c, uint32_t peer, uint32_t n);
/* The 32-bit cumulative limit a 16-bit wire value (its low bits) stands for:
 * the one nearest the newest limit known from peer. Exact while every value
 * in flight lies within 2^15 of it, which a ring of at most 32767 slots
 * guarantees. */
uint32_t dw_credit_widen16(const struct dw_credit *c, uint32_t peer, uint16_t wire);
/* A credit value from peer arrived on a data packet or an ACK: applied at
 * once. Returns 1 if it gave new credits, 0 if stale (older or duplicate),
 * -EINVAL bad peer, -EPROTO a limit more than the largest ring ahead of us. */
int dw_credit_tx_update(struct dw_credit *c, uint32_t peer, uint32_t limit);
/* A stand-alone credit message from peer lands in our credit region: 0, or 1
 * if it had to be merged (region entries of that peer all in use), -EINVAL,
 * -EPROTO as dw_credit_tx_update. Its credits count once consumed. */
int dw_credit_cr_arrive(struct dw_credit *c, uint32_t peer, uint32_t limit);
/* We read peer's credit messages out of the region: the newest value covers
 * the older ones, so all of that peer's entries are freed and the newest is
 * applied. Returns 1 if it gave new credits, 0 if not, -EINVAL bad peer,
 * -ENOENT the region holds none from peer. */
int dw_credit_cr_consume(struct dw_credit *c, uint32_t peer);
/* Dynamic: a compulsory request from peer arrived (it took a slot of our
 * ring: dw_credit_rx_arrive first). We give back every credit above the floor
 * and queue the response. 0, -EINVAL, -EPROTO in static mode. */
int dw_credit_on_request(struct dw_credit *c, uint32_t peer);

/* ---- Receiver role ---------------------------------------------------------- */

/* A message of nslots from peer arrives; *pos gets its first slot (index into
 * the ring; it wraps). -EINVAL bad peer or nslots (0 or above the ring),
 * -EPROTO the peer had no credit for it (nothing changes). */
int dw_credit_rx_arrive(struct dw_credit *c, uint32_t peer, uint32_t nslots, uint32_t *pos);
/* A message of nslots from peer that took its credits and was placed
 * straight into a receive WR, when dw_credit_rx_arrive found no room in the
 * ring for it (the slots of a restarted peer's old messages, still there,
 * may fill it: dw_credit_peer_reset): counted as arrived and retrieved at
 * once, so the sender gets its credits back. -EINVAL bad peer or nslots,
 * -EPROTO the peer had no credit for it (nothing changes). */
int dw_credit_rx_pass(struct dw_credit *c, uint32_t peer, uint32_t nslots);
/* A message of nslots from peer placed straight into a receive WR: it
 * arrives and is consumed at once. Its credits come back in ring order:
 * at once when the ring holds no older message (the common case, and the
 * cheap one: no slot is written), else through the ring behind the older
 * ones (a slot taken and freed: dw_credit_rx_arrive, dw_credit_rx_release),
 * or passed (dw_credit_rx_pass) when the ring has no room for it. 0,
 * -EINVAL bad peer or nslots, -EPROTO the peer had no credit for it
 * (nothing changes). */
int dw_credit_rx_consumed(struct dw_credit *c, uint32_t peer, uint32_t nslots);
/* The consumer is done with the message at pos (nslots must be its size).
 * Its slots go back in ring order (decision 3), which may reach thresholds
 * and queue credit messages. -EINVAL pos is not an unreleased message's
 * first slot or nslots differs, -EALREADY released twice. */
int dw_credit_rx_release(struct dw_credit *c, uint32_t pos, uint32_t nslots);
/* Dynamic: peer's compulsory response (it took a slot too) with its
 * cumulative give-back. 0, -EINVAL, or -EPROTO with nothing changed: static
 * mode, no request of ours outstanding, a give-back smaller than the last
 * one or more than the peer could have held. */
int dw_credit_on_response(struct dw_credit *c, uint32_t peer, uint32_t skip_total);
/* A packet (data or ACK) is about to leave for peer and can carry a credit
 * field and will reach it (a data packet, which RD delivers reliably):
 * returns retrieved credits early (piggyback way) and writes the limit to
 * carry. Returns 1 if the value is news to the peer, 0 if not (carrying it
 * is harmless), -EINVAL. */
int dw_credit_piggyback(struct dw_credit *c, uint32_t peer, uint32_t *limit);
/* Static: the peer says it waits for credits (a probe): everything it gave
 * back by retrieval goes back now, threshold reached or not, since a message
 * of several slots may need more than the sender holds while the receiver
 * sits on fewer than a threshold's worth. Returns 1 if that raised the limit,
 * 0 if not (nothing retrieved; dynamic: its refill rule covers it), -EINVAL. */
int dw_credit_flush(struct dw_credit *c, uint32_t peer);
/* The limit granted to peer now, with no change of state: for carriers that
 * may be lost (an ACK). Only dw_credit_piggyback on a reliable carrier (a
 * data packet) or a stand-alone credit message discharges a return. */
uint32_t dw_credit_limit(const struct dw_credit *c, uint32_t peer);

/* Next control message to send, any peer: per peer a compulsory request
 * first, then a response (both only with a credit, which they take), then a
 * stand-alone credit (needs none). Returns 1 with *out, or 0 if none can go. */
int dw_credit_next_ctl(struct dw_credit *c, struct dw_credit_ctl *out);

int dw_credit_view(const struct dw_credit *c, uint32_t peer, struct dw_credit_view *v);

#endif
