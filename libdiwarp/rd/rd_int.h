/* Internal to the RD transport: what rd.c, rd_tx.c and rd_rx.c share (the
 * per-device, per-QP and per-pseudo-stream state, the segment cookie, the
 * engine's WQE flags) and the helpers each calls in the others. Nothing
 * outside rd/rd*.c includes it: the rest of the engine reaches RD through
 * rd.h. Helpers a datagram's path calls (transmit, receive) are static inline
 * here, so splitting the transport into files costs no call on that path.
 *
 * Every function expects the device lock held.
 */
#ifndef DIWARP_RD_RD_INT_H
#define DIWARP_RD_RD_INT_H

#include <errno.h>

#include "flow/credit.h"
#include "flow/path.h"
#include "rd/rd.h"
#include "wire/rdmap.h"
#include "util/keyhash.h"
#include "util/time.h"

/* ---------------------------------------------------------------- layout */

#define RD_MAX_ORQ  DW_MAX_RD_ATOM /* Reads/Atomics we have outstanding, per QP */
#define RD_MAX_IRQ  64             /* Read/Atomic responses we owe, per QP (all peers) */
#define RD_HASH_MIN 16u

/* Receive WRs one stream may hold bound to messages not yet complete
 * without credits (with credits: its grant, if larger); a Send whose MSN
 * lies further ahead is dropped (rd_msn_in_window). */
#define RD_MSN_WINDOW 64u

/* In-flight tokens a QP asks for at once, and how soon a QP held back by
 * the host pool asks again when nothing else wakes it. */
#define RD_ADMIT_BATCH    8u
#define RD_TOKEN_RETRY_NS 100000ull
#define RD_BATCH          DW_UDP_GSO_MAX_SEGS /* slots; DW_UDP_TX_BATCH without GSO */
#define RD_SLOT_IOV       (DW_MAX_SGE + 3)
/* Bytes built per transmit step: the CRC pass over a segment leaves it in
 * cache for the kernel's copy only if the step stays small (64 datagrams of
 * 1472 bytes, or 4 of 64 KiB). */
#define RD_BATCH_BYTES (256u << 10)
/* Route MTU cache: entries per device, and how long one is trusted. */
#define RD_PMTU_CACHE   16
#define RD_PMTU_TTL_NS  (1000ull * 1000 * 1000)
#define RD_FALLBACK_MTU 1500 /* the route's MTU cannot be read: assume Ethernet */
/* Smallest Write segment placed without the bounce buffer (dw_rd_rx_direct):
 * below it the extra peek costs more than the copy it saves. */
#define RD_DIRECT_MIN (16u << 10)
#define RD_PEEK_LEN   (RD_HDR_CAP + 16)
/* Largest extra RDMAP header after the DDP header (Atomic Request). */
#define RD_HDR_CAP (DW_DGRAM_HDR_MAX_LEN + DW_DGRAM_DDP_UNTAGGED_LEN + DW_RDMAP_ATOMIC_REQ_HDR_LEN)

/* IPv4 + UDP headers: congestion control counts what the path carries. */
#define RD_IP_UDP 28
/* Headers of a data datagram as congestion control counts them. */
#define RD_CC_OVERHEAD (RD_IP_UDP + DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN + DW_DGRAM_CRC_LEN)

/* Cookie: kind (2 bits) | slot (14 bits, < DW_MAX_QP_WR and RD_MAX_IRQ) | segment (32 bits).
 * A credit control message (RD_CK_CCTL) is slot index + 1 of its QP's
 * mailbox, so no cookie is 0. */
enum { RD_CK_CCTL = 0, RD_CK_SQ = 1, RD_CK_IRQ = 2, RD_CK_PULL = 3 };
static inline uint64_t rd_cookie(unsigned kind, uint32_t slot, uint32_t seg)
{
        return (uint64_t)kind << 62 | (uint64_t)(slot & 0x3fffu) << 32 | seg;
}
static inline unsigned ck_kind(uint64_t c)
{
        return (unsigned)(c >> 62);
}
static inline uint32_t ck_slot(uint64_t c)
{
        return (uint32_t)(c >> 32) & 0x3fffu;
}
static inline uint32_t ck_seg(uint64_t c)
{
        return (uint32_t)c;
}

static_assert(DW_MAX_QP_WR <= 0x4000, "SQ slot fits the cookie");

/* Multirail: the rail a segment's latest copy went by (0: the peer's first
 * address) rides in cookie bits 46-47, above the slot. */
#define RD_CK_RAIL_SHIFT 46
static inline unsigned ck_rail(uint64_t c)
{
        return (unsigned)(c >> RD_CK_RAIL_SHIFT) & 3u;
}
static inline uint64_t ck_on_rail(uint64_t c, unsigned rail)
{
        return (c & ~(3ull << RD_CK_RAIL_SHIFT)) | (uint64_t)rail << RD_CK_RAIL_SHIFT;
}
static_assert(DW_FLOW_MAX_RAILS == 4 && DIWARP_MAX_RAILS == 4 && DW_DGRAM_MAX_RAILS == 4 &&
                  DW_CONFIG_MAX_RAILS == 4,
              "a rail index is 2 bits everywhere");
/* How often our rail list rides on a datagram to a peer device; segments a
 * rail sends in a row before the next is chosen (a GSO run's worth); how
 * long a rail found down waits before one segment probes it; a rail is down
 * after this many resends of its datagrams with none of them acknowledged
 * for RD_RAIL_DOWN_NS (or at once when the kernel refuses to send by it). */
#define RD_RAILS_EVERY_NS (100ull * 1000 * 1000)
#define RD_RAIL_RUN       32u
#define RD_RAIL_PROBE_NS  (200ull * 1000 * 1000)
#define RD_RAIL_DOWN_RETX 8u
#define RD_RAIL_DOWN_NS   (20ull * 1000 * 1000)

/* WQE flag bits of the RD engine (above queue/'s enum dw_wqe_flags). */
enum {
        RD_W_TXALL = 1u << 8,    /* send: every segment handed to the socket once */
        RD_W_RESP = 1u << 9,     /* Read/Atomic: the response is complete */
        RD_W_LAST = 1u << 10,    /* last segment (or response) seen; psn = its PSN */
        RD_W_BOUND = 1u << 11,   /* receive: bound to (peer, msn) */
        RD_W_INORQ = 1u << 16,   /* send: on the ORQ */
        RD_W_QUEUED = 1u << 17,  /* send: dw_rd_post_send resolved its peer */
        RD_W_TOKEN = 1u << 18,   /* send: holds an in-flight token (its first segment left) */
        RD_W_PULL = 1u << 19,    /* receiver-paced Send: the send side pushes pull_pushed
                                    bytes; the receive side is to be pulled (byte_len) */
        RD_W_PULLING = 1u << 20, /* receive: an rd_pull entry is pulling it */
};

/* Responder work for one Read or Atomic Request. */
struct rd_irq {
        struct dw_rd_peer *peer; /* NULL: free */
        /* The request as accepted (rdmap/; an Atomic has run and its value
         * is kept for retransmission). Its MSN is also the Atomic
         * Response's; a pull's rq names the Send. */
        struct dw_rdmap_resp resp;
        uint32_t nseg, next_seg, sent, acked;
        /* A Read of a receiver-paced Send (PULLREQ): the source is the send
         * WQE in SQ slot wslot at byte src_to, not a memory region. */
        bool pull;
        uint32_t wslot;
};

/* Receive side of a receiver-paced Send (receiver-driven rendezvous): the receiver
 * reads [pushed, len) of the sender's message with RDMA Reads of the chunk
 * size, at most depth outstanding, the next one asked for when an earlier one
 * is placed. A Read's slot stays until its request is acknowledged too, since
 * a retransmission rebuilds the request from it. */
#define RD_MAX_PULL       16 /* Sends being pulled at once, per QP */
#define RD_PULL_MAX_DEPTH DW_CONFIG_MAX_PULL_DEPTH
struct rd_pull_read {
        uint32_t msn; /* our queue-1 MSN of the Read: its responses' Data Sink STag */
        uint32_t off; /* where in the message */
        uint32_t len;
        uint32_t placed; /* response bytes placed */
        bool used, sent, acked;
};
struct rd_pull {
        struct dw_rd_peer *peer; /* NULL: free */
        struct dw_wqe *w;        /* the receive WQE it fills */
        uint32_t send_msn;       /* the Send's queue-0 MSN: the Reads' Data Source STag */
        uint32_t len, pushed;    /* the message's length, the bytes the sender pushed */
        uint32_t next;           /* the next offset to ask for */
        uint32_t busy;           /* Reads asked for and not yet placed */
        uint32_t seq;            /* order of arrival: the oldest is pulled first */
        struct rd_pull_read rd[RD_PULL_MAX_DEPTH];
};

struct dw_rd_peer {
        struct dw_rel_peer rel;
        struct dw_rd_qp *s;
        struct dw_rd_peer *hnext;         /* per-QP hash chain */
        struct dw_rd_peer *anext, *aprev; /* device list of peers with timers */
        uint32_t ip;                      /* network order */
        uint16_t port;                    /* network order */
        bool active;
        bool dead; /* QP in ERR: no more reliability work */
        uint32_t rqpn;
        uint32_t tx_msn;  /* next queue-0 MSN (receive-consuming messages) we send */
        uint32_t tx_rreq; /* next queue-1 MSN (Read/Atomic Requests) we send */
        uint32_t rx_bind; /* next queue-0 MSN to bind to a receive WQE */
        uint32_t rx_done; /* next queue-0 MSN to complete */
        uint32_t nak_psn; /* PSN refused with nak_code (repeated on every copy) */
        uint8_t nak_code;
        /* Credits (rd_mbox.c): cr_off, the peer's last datagram carried no
         * credit value (its end runs without credits, or has no index for
         * us): our Sends to it go uncharged; cr_wait, a Send to it waits for
         * credits (counted once per wait). */
        bool cr_off : 1, cr_wait : 1;
        /* Stream start (RD QPs; RC over RD has both set from the start):
         * rx_sync, the peer's first PSN and MSN are known (from its START
         * descriptor), so its data can be taken; tx_synced, the peer
         * acknowledged our first PSN, so our data stops carrying START;
         * rx_resync, we started our side over after an idle time
         * (rd_peer_restart): the peer's next START is taken too. */
        bool rx_sync : 1, tx_synced : 1, rx_resync : 1;
        /* rx_old: Sends of the stream before it started over are still
         * parked (rd_mbox_restart_parked); their MSNs were moved to just
         * before the new start's first (rd_mbox_new_msn), and the receive
         * window of the new ones counts from there until they are through. */
        bool rx_old : 1;
        bool used : 1; /* rd_sweep_qp: something refers to the stream */
        /* Largest UDP payload to this peer (rd_udp_mtu), fixed for the
         * stream's life: segment k of a message always covers the same bytes,
         * so a retransmission rebuilds it exactly. */
        uint16_t udp_mtu;
        uint8_t batch; /* segments built in the current batch, not yet registered (< window) */
        /* Multirail: the peer's rail the latest datagram of the stream came
         * by (ACKs go back that way). cc_inflight counts every rail's bytes;
         * rd_path_forget splits them when the stream goes. */
        uint8_t reply_rail;
        uint16_t cr_idx; /* index in the QP's credit state + 1 (≤ 32767); 0: none */
        /* The congestion-control path to the peer device, shared by every
         * stream to that address, and the bytes this stream has in its
         * window (given back to the path if the stream goes first). */
        struct dw_flow_path *path;
        uint32_t cc_inflight;
        /* When the stream was last used (a datagram of it arrived, or it was
         * made), in rd_tick units: what the idle rules go by (rd_idle). */
        uint32_t last_tick;
        /* The send-window ring (DW_REL_DEF_WINDOW entries, 2 KiB) is not here:
         * p->rel.ring borrows one from the device cache while PSNs are in
         * flight (rd_ring_get / rd_ring_idle), so an idle peer costs only this
         * struct. */
};
static_assert(sizeof(struct dw_rd_peer) <= 256, "an idle pseudo-stream costs at most 256 bytes");
static_assert(DW_REL_DEF_WINDOW <= 255, "a batch's segment count fits a byte");
static_assert(DW_CONFIG_MAX_CREDIT_RING <= 65535,
              "a credit index (< DIWARP_CREDIT_PEERS) fits 16 bits");

/* The last bytes of a message-ending RDMA Write segment (rd_rx_write) are
 * placed, last byte last, only once every earlier PSN of the stream is in
 * and the segment's CRC is verified, so that a program polling a message's
 * last byte (RC semantics over RD: qperf's rc_rdma_write_poll_lat,
 * MVAPICH2's RDMA fast path) finds the whole message in place. A segment
 * that comes before an earlier PSN of its stream keeps them in one of the
 * QP's RD_TAILS slots until the stream's receive cursor passes it
 * (rd_tails_flush); with none free it is not accepted (the sender resends
 * it). */
#define RD_TAIL_HOLD 64u
#define RD_TAILS     8u

/* A run of Write bytes placed ahead of an earlier, missing PSN of their
 * stream (PSNs psn_lo..psn_hi, contiguous bytes [to, to + len) of STag
 * stag). Write segments are placed as they arrive, so without this a late
 * segment of an earlier Write (resent after a loss, or reordered) would
 * overwrite bytes a later Write to the same place had already written: a
 * late segment is placed around every run of a later PSN (rd_rx_write,
 * rd_tails_flush), and a run is forgotten once the stream's cursor passes
 * it. The segments of one Write make one run; with RD_AHEAD runs of a QP in
 * use a segment that would start another is not accepted (the sender resends
 * it). */
struct rd_ahead {
        struct dw_rd_peer *peer;
        uint32_t psn_lo, psn_hi, stag;
        uint64_t to, len;
};
#define RD_AHEAD 32u

struct rd_tail {
        struct dw_rd_peer *peer;
        uint32_t psn, stag;
        uint64_t to;
        uint32_t len;
        uint8_t bytes[RD_TAIL_HOLD];
};

struct dw_rd_qp {
        struct dw_qp *qp;
        bool rc; /* RC/UC carried by RD */
        /* In-flight caps (DIWARP_INFLIGHT_*, flow/inflight.h): a send WQE starts only
         * with a token; capped says whether any cap is in force. admitted:
         * tokens granted, not yet taken by a WQE; starting: WQEs of the batch
         * being built that take one; to_release: tokens of retired WQEs, given
         * back once per step. */
        bool capped, token_wait;
        struct dw_inflight_qp ifl;
        uint32_t admitted, starting, to_release;
        struct dw_rel_params params;
        /* RC over RD connected through rc/cm.c: the token every datagram of the
         * connection carries to us (ctok_rx; any other is dropped) and to
         * the peer (ctok_tx). 0: none (an IB-style connect). */
        uint64_t ctok_rx, ctok_tx;
        /* The trailer of this QP's datagrams (wire/seal.h): the device's
         * seal, or cseal, the connection's own key (DIWARP_AUTH, RC over RD
         * connected through rc/cm.c: dw_rd_rc_attach). */
        struct dw_seal *seal;
        struct dw_seal cseal;
        struct dw_rd_peer *rc_peer;
        struct dw_rd_peer *last_tx; /* peer of the last send WR: post_send tries it first */
        struct dw_rd_peer **htab;
        uint32_t hmask, npeers;
        /* transmit cursor: WQE tx_idx from the SQ head, its segment tx_seg */
        uint32_t tx_idx, tx_seg;
        /* Multirail: the rail striped segments go by now, and how many it
         * has sent in a row. */
        uint8_t tx_rail;
        uint32_t tx_run;
        struct dw_wqe *orq[RD_MAX_ORQ];
        uint32_t norq, orq_building;
        uint32_t rq_bound; /* receive WQEs [0, rq_bound) from the RQ head are bound */
        struct rd_irq irq[RD_MAX_IRQ];
        uint32_t fifo[RD_MAX_IRQ]; /* IRQ entries in arrival order, until fully sent */
        struct rd_pull pull[RD_MAX_PULL];
        uint32_t npull;        /* pull entries in use */
        uint32_t pull_waiting; /* bound receive WQEs to pull that wait for an entry */
        uint32_t pull_rr;      /* the entry an unsent Read request is looked for from */
        uint32_t pull_busy;    /* Reads asked for and not yet placed, all entries */
        uint32_t pull_seq;     /* the next entry's seq */
        uint32_t fifo_head, fifo_count;
        bool irq_turn;
        /* The credit-based mailbox receive ring (rd_mbox.c); NULL with
         * DIWARP_CREDIT=off. */
        struct rd_mbox *mb;
        /* diwarpdv_mbox_open made this an application mailbox: no receive
         * WRs, every Send lands in the ring and completes pointing into it. */
        bool mbox_app;
        /* Send WQEs completed (DW_WQE_DONE) by the ACK a ping-pong's incoming
         * Send carried, not retired to the CQ yet (rd_retire_held). */
        bool retire_held;
        /* Message-ending Write segments' tails held for earlier PSNs
         * (RD_TAIL_HOLD). */
        uint32_t ntails;
        struct rd_tail tails[RD_TAILS];
        /* Write bytes placed ahead of a missing PSN (struct rd_ahead). */
        uint32_t nahead;
        struct rd_ahead ahead[RD_AHEAD];
        struct dw_rd_qp *next, *prev; /* device list of RD QPs */
};

/* A Send segment as the receive side places it: from the datagram, or from
 * the mailbox where it was parked. */
struct rd_seg {
        uint32_t msn, mo, psn, len;
        uint32_t inval_stag; /* Send with Invalidate */
        uint32_t imm;        /* Immediate Data (network order), with has_imm */
        uint8_t opcode;      /* RDMAP */
        bool last, has_imm, imm_se;
};

/* How the Send whose last segment g is ends, len bytes in all (with its
 * Immediate Data, diwarp's Send with Immediate): rdmap/'s record, kept in
 * the receive WR or the mailbox entry until the message completes. */
static inline struct dw_rdmap_msg_end rd_seg_end(const struct rd_seg *g, uint32_t len)
{
        struct dw_rdmap_msg_end e = dw_rdmap_send_end(g->opcode, len, g->inval_stag);
        if (g->has_imm)
                dw_rdmap_end_imm(&e, g->imm, g->imm_se);
        return e;
}

/* One parked segment: where its bytes are in the ring and what to do with
 * them once a receive WQE is there. */
struct rd_mb_ent {
        struct dw_rd_peer *peer;
        uint32_t pos, nslots;
        struct rd_seg g;
        /* Parked while its stream had holes: a later MSN of it may have come
         * first and bind this one's receive WR before its turn. */
        bool late;
        bool delivered; /* application mailbox: its completion is out */
};

/* A compulsory request or response of the dynamic credit protocol, sent
 * as a reliable segment of the stream (X-flag CCTL) until acknowledged. */
#define RD_MAX_CCTL 32
struct rd_cctl {
        struct dw_rd_peer *peer; /* NULL: free */
        uint32_t value;          /* response: the cumulative give-back */
        uint8_t type;            /* DW_CREDIT_CTL_REQUEST or _RESPONSE */
        bool sent;
};

/* The credit-based mailbox receive ring of an RD QP: ring_slots slots of slot_size bytes
 * shared by every peer that sends to the QP, the credit state of both roles
 * towards up to npeers peers, and the segments parked in arrival order. */
struct rd_mbox {
        struct dw_credit cr;
        uint8_t *buf; /* ring_slots * slot_size bytes, mapped on demand */
        size_t buf_len;
        uint32_t slot_size, ring_slots;
        uint32_t seg_cap;             /* largest Send segment: the quota in bytes */
        struct rd_mb_ent *ent;        /* ring_slots entries: a parked segment takes a slot */
        uint32_t ent_head, ent_count; /* parked and not delivered, oldest first */
        uint32_t late;                /* of them, parked while their stream had holes */
        uint32_t *ent_at;             /* application mailbox: per slot, its message's entry + 1 */
        struct dw_rd_peer **idx_peer; /* npeers: the stream holding each index */
        uint32_t *idx_new; /* npeers: with the stream's rx_old, its new start's first MSN */
        uint32_t next_idx; /* indices handed out so far (the highest + 1) */
        uint32_t idx_free; /* of them, given back by freed streams */
        bool ctl;          /* a credit message may be due */
        /* Application mailbox (diwarpdv_mbox_open): buf is mapped twice in a
         * row, so a message is contiguous across the end of the ring; parked
         * entries complete to the CQ and stay until released. */
        bool app;
        /* While a Send waits for credits (the SQ goes in order, so one peer
         * at a time): when to ask that peer for its credit value. */
        uint64_t probe_at;
        struct rd_cctl cctl[RD_MAX_CCTL];
        uint32_t ncctl, cctl_unsent;
};

/* Payloads up to this size are copied behind the headers: the datagram is
 * then one iovec for the kernel to import and one CRC pass, which costs less
 * than the copy at these sizes (as on UD). */
#define RD_COPY_MAX 256

struct rd_txslot {
        /* the headers; for a payload of at most RD_COPY_MAX bytes the whole
         * datagram (payload, Immediate Data message and trailer behind them) */
        uint8_t hdr[RD_HDR_CAP + RD_COPY_MAX + DW_DGRAM_IMM_MSG_LEN + DW_SEAL_TRAILER_MAX];
        uint8_t imm[DW_DGRAM_IMM_MSG_LEN];
        uint8_t trl[DW_SEAL_TRAILER_MAX];
        struct iovec iov[RD_SLOT_IOV];
        int iovcnt;
        struct sockaddr_in dst;
        uint32_t bytes;
        uint32_t dlen; /* datagram length (sum of iov) */
        /* for commit / rollback */
        struct dw_rd_peer *peer;
        uint32_t psn;
        uint64_t cookie;
        uint32_t cc_bytes; /* as congestion control counts the datagram (rd_cc_bytes) */
        uint8_t rail;      /* multirail: the rail it leaves by (ck_rail of cookie) */
        uint32_t save_idx, save_seg;
        uint32_t cr_slots; /* credits a Send segment took (given back if refused) */
};

struct dw_rd_dev {
        struct dw_rd_qp *qps; /* every RD-served QP */
        /* Bounded state (DIWARP_RD_MAX_PEERS, _DEV_PEERS, _IDLE_MS):
         * pseudo-streams of the device (nrd: of RD QPs, the ones that may be
         * freed when idle), the idle time in rd_tick units, the next sweep
         * for idle ones and the last sweep a full table asked for. */
        uint32_t npeers, nrd;
        uint32_t idle_ticks;
        uint64_t sweep_at, sweep_asked;
        /* The device's secret for the first PSN and MSNs of its streams
         * (RFC 6528's F; util/keyhash.h). */
        struct dw_keyhash isn_key;
        struct dw_rd_qp *tx_rr; /* the QP the next transmit pass starts with */
        struct dw_flow_paths paths;
        /* The late ACKs every stream of the device learned to wait for (its
         * QPs' params.stall; rel/README.md, "Late ACKs are learned together"):
         * a peer's program that is not scheduled is late to every stream it
         * has with us, over every QP. */
        struct dw_rel_stall stall;
        uint64_t pace_wake; /* earliest pacing deadline a held send waits for (0: none) */
        /* From the configuration: no CRC32c on RD datagrams (DIWARP_RD_CRC=0),
         * and the receiver-paced Send thresholds (DIWARP_RD_PULL_*). */
        bool nocrc;
        uint32_t pull_min, pull_chunk, pull_depth;
        /* Bytes the ACK rel/ is handling acknowledged (ops_acked adds, the
         * path's window learns them after). */
        uint32_t cc_acked;
        uint32_t cc_acked_rail[DW_FLOW_MAX_RAILS]; /* the same, per rail (multirail streams) */
        /* The network error (errno) of the last rd_send_one, 0: none. */
        int tx_neterr;
        struct dw_rd_peer *active; /* peers with outstanding data, owed ACKs or timers */
        bool tx_wait;              /* registered with dw_progress_tx_wait */
        /* The walk over `active` for rel/ timers runs when the earliest
         * deadline it knows of came (timers_at: no peer has work before it)
         * or when several peers changed state since the last step
         * (timers_dirty). A change of one peer only (`touched`, the common
         * case: a packet in or out) folds that peer's next deadline into
         * timers_at instead, so a busy-polling step skips the walk
         * (rd_fold_touched; timers_owner: the peer whose deadline
         * timers_at is, NULL when unknown). */
        bool timers_dirty;
        uint64_t timers_at;
        struct dw_rd_peer *touched, *timers_owner;
        /* The latest clock read of the current progress step (step_no),
         * reused by the timers check at its end instead of a second read;
         * rx_clock: read as the step's receive began, for its first datagram
         * (taken while waiting for it rather than after it arrived). */
        uint64_t step_now, step_no;
        bool rx_clock;
        /* A step that begins this long after the last clock reading reads
         * even a lone datagram with its kernel stamp (dw_rd_rx_clock): half
         * the congestion control's delay target (DIWARP_CC_TARGET_US). */
        uint64_t stamp_gap_ns;
        /* hold_retire: dw_rd_rx is handling the ACK of a datagram whose Send
         * it already completed; held_step: the step in which send completions
         * were first held back since the last release (see rd_retire_held). */
        bool hold_retire;
        uint64_t held_step;
        /* The plain ACK (no SACK) carried by a Send rd_rx_fast completed,
         * handed to rel/ after the application's answer (rd_ack_flush);
         * peer NULL: none. */
        struct rd_held_ack {
                struct dw_rd_peer *peer;
                uint32_t ack_psn;
                uint64_t now;     /* when it was read */
                uint64_t arrived; /* when the kernel received it */
        } hack;
        uint32_t ctl_sent;  /* retransmissions and ACK-only datagrams of this walk */
        uint32_t dgram_max; /* largest datagram sent (diwarpdv_query_rd_path) */
        /* Direct receive (dw_rd_rx_direct): large Write segments were seen
         * lately, so the next datagram is peeked at first; rx_placed: the one
         * dw_rd_rx is handling is already in place. */
        bool rx_big, rx_placed;
        uint8_t rx_small; /* datagrams in a row not placed directly */
        uint8_t rx_hdr[RD_PEEK_LEN];
        /* The held tail (RD_TAIL_HOLD) of a message-ending segment the
         * direct path read, for rd_rx_write to place. */
        uint8_t rx_tail[RD_TAIL_HOLD];
        /* The segment that continues the last CRC-verified, non-last large
         * RDMA Write segment, or Read Response segment into a one-SGE sink,
         * received: the only one placed before its CRC is known, since a
         * verified segment must rewrite exactly that range before the
         * message completes. */
        struct rd_rx_next {
                const struct dw_rd_peer *peer; /* NULL: no message in progress */
                uint32_t psn;
                uint32_t stag; /* Write: the target STag; Read Response: the sink's */
                uint64_t to;
                bool read; /* a Read Response, placed through the Read WR's SGE */
        } rx_next;
        /* Route MTUs by destination address, asked of the kernel when a
         * pseudo-stream starts (rd_udp_mtu); direct-mapped. */
        struct rd_pmtu {
                uint32_t ip; /* network order; 0 = empty */
                uint32_t mtu;
                uint64_t at_ns;
        } pmtu[RD_PMTU_CACHE];
        struct rd_txslot slot[RD_BATCH];
        struct dw_udp_msg msgs[RD_BATCH];
        /* one GSO super-datagram: the slots' iovecs back to back */
        struct iovec gso_iov[RD_BATCH * RD_SLOT_IOV];
        struct rd_txslot rslot; /* retransmissions and control packets */
        /* Send-window rings of drained peers, kept for the next sender (a
         * singly linked list through the first bytes of each free ring). */
        struct rd_free_ring *ring_cache;
        uint32_t ring_cached;
};

/* ---------------------------------------------------------------- shared between the files */

/* Idle times: the clock in units of 2^20 ns (about 1.05 ms), modulo 2^32
 * (wraps after 52 days; differences are taken modulo 2^32). */
#define RD_TICK_SHIFT 20
static inline uint32_t rd_tick(uint64_t ns)
{
        return (uint32_t)(ns >> RD_TICK_SHIFT);
}
/* Ticks since p last saw a datagram (or was made); 0 when now is older
 * than that (a step's clock read before the stream was made). */
static inline uint32_t rd_idle(const struct dw_rd_peer *p, uint64_t now)
{
        int32_t d = (int32_t)(rd_tick(now) - p->last_tick);
        return d > 0 ? (uint32_t)d : 0;
}

/* rd.c */
/* Room for one more stream a stranger opens on s (caps; a full table first
 * frees idle streams, at most once per RD_SWEEP_MIN_NS). */
bool rd_peer_room(struct dw_rd_qp *s, uint64_t now);
/* A START on a stream whose start is known: taken as the peer's stream
 * starting over when the stream was idle for a quarter of DIWARP_RD_IDLE_MS
 * (or we restarted ours) and its receive side holds nothing; then ours
 * starts over too. Returns whether it was taken. */
bool rd_peer_resync(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint64_t now);
bool rd_ring_get(struct dw_rd_dev *d, struct dw_rd_peer *p);
void rd_ring_idle(struct dw_rd_dev *d, struct dw_rd_peer *p);
struct dw_rd_peer *rd_peer_new(struct dw_rd_qp *s, uint32_t ip, uint16_t port, uint32_t qpn,
                               uint32_t tx_psn, uint32_t rx_psn);
/* A pseudo-stream of an RD QP: our first PSN (= our first queue-0 MSN) and
 * first queue-1 MSN from the device's keyed hash; the peer's from its START
 * descriptor (start: a DATA header with X2-flag START), else unknown until
 * one comes (rx_sync clear). */
struct dw_rd_peer *rd_peer_new_rd(struct dw_rd_qp *s, uint32_t ip, uint16_t port, uint32_t qpn,
                                  const struct dw_dgram_hdr *start);
/* The peer's START descriptor: its first PSN and MSN. */
void rd_peer_rx_start(struct dw_rd_peer *p, const struct dw_dgram_hdr *h);
const char *rd_peer_str(const struct dw_rd_peer *p, char *buf, size_t len);
void rd_retire(struct dw_rd_qp *s);
void rd_check_done(struct dw_rd_qp *s, struct dw_wqe *w);
void rd_complete_through(struct dw_rd_qp *s, struct dw_wqe *w, enum diwarp_wc_status status);
/* why: the reason for the warn line, or RD_WHY_REL for rel/'s fatal reason
 * (a silent peer named with its timeout). */
#define RD_WHY_REL NULL
void rd_peer_fail(struct dw_rd_peer *p, enum diwarp_wc_status status, int event, const char *why);
/* A Read Response cannot be (re)sent: the region the peer's Read names was
 * deregistered or invalidated while the Read was served. The QP goes to
 * error with IBV_EVENT_QP_ACCESS_ERR (a responder's access error); no WR of
 * ours is at fault, so every one is flushed (WR_FLUSH_ERR), none reported as
 * a local protection error. */
void rd_read_source_gone(struct dw_rd_peer *p);

/* rd_rail.c: multirail */
/* The stream's bytes in flight leave its rails' windows (it goes away); a
 * rail of p's device found down / answering again; the kernel refused to
 * send by it. */
void rd_path_forget(struct dw_rd_peer *p);
void rd_rail_down(struct dw_rd_peer *p, unsigned rail, uint64_t now, const char *why);
void rd_rail_up(struct dw_rd_peer *p, unsigned rail);
void rd_rail_neterr(struct dw_rd_peer *p, unsigned rail, int err, uint64_t now);
/* The rail of a segment that is not striped: 0 unless down. */
unsigned rd_home_rail(const struct dw_rd_peer *p);
/* Whether path f's window lets `bytes` more go now (else notes when pacing
 * will, in d->pace_wake). */
bool rd_cc_room_on(struct dw_rd_dev *d, struct dw_flow_path *f, uint32_t bytes, uint64_t now);
/* The rail of a new segment of a message of `len` bytes; -1: none has room. */
int rd_seg_rail(struct dw_rd_qp *s, struct dw_rd_peer *p, uint64_t len, uint32_t ccb, uint64_t now);
/* The multirail extensions of a datagram by `rail` to p; their length. */
size_t rd_hdr_rails(struct dw_rd_peer *p, unsigned rail, struct dw_dgram_hdr *h);
/* Nothing of the batch is pending on any of p's rails any more. */
void rd_pending_clear(struct dw_rd_peer *p);
/* A resend of psn (cookie, b bytes as cc counts them): the cookie it goes
 * with, renamed to another rail when its own is down. */
uint64_t rd_resend_rail(struct dw_rd_peer *p, uint32_t psn, uint64_t cookie, uint32_t b,
                        uint64_t now);
/* What a received datagram says of the peer's rails (list, challenge, the
 * rail it came by). */
void rd_rx_rails(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint32_t from_ip,
                 uint64_t now);

/* rd_tx.c */
extern const struct dw_rel_ops rd_ops;
/* dw_rel_on_ack with rd_ops, then the path's window learns what it acked. */
/* arrived: when the kernel received the ACK (≤ now; now when unknown). */
int rd_on_ack(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint64_t now, uint64_t arrived);
void rd_send_nak(struct dw_rd_peer *p, uint32_t psn, uint8_t code);
int rd_send_ack(struct dw_rd_peer *p);
/* A control datagram carrying our credit value (and an owed ACK); probe:
 * asks the peer for its own value at once (CREDIT|ACKREQ). */
int rd_send_credit(struct dw_rd_peer *p, bool probe);
int rd_tx_qp(struct dw_rd_qp *s, int budget, bool *blocked);

/* rd_rx.c */
/* What the receive path makes of a NEW DATA segment (RV_WINDOW: a message
 * whose MSN lies outside the receive window, dropped and counted; RV_AHEAD:
 * a Read or Atomic Request ahead of an earlier PSN of its stream, not
 * accepted yet, so the sender sends it again). */
enum rd_verdict { RV_ACCEPT, RV_DROP, RV_RNR, RV_NAK, RV_GONE, RV_WINDOW, RV_AHEAD };
void rd_ack_flush(struct dw_rd_dev *d);
/* Receive WR w fails with status st because of what the peer sent; te, the
 * Terminate error RC would send for it, goes in vendor_err (as RC's). */
void rd_recv_fail(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                  enum diwarp_wc_status st, struct dw_term_error te);
/* Frees the slots of receive WQEs that completed behind an older one still
 * under way (messages of different peers complete in any order): the ring
 * pops only from its head, and without this an application that reposts
 * what completed would be refused (ENOMEM), or an SRQ's QP would RNR. */
void rd_rq_compact(struct dw_rd_qp *s);
int rd_irq_alloc(struct dw_rd_qp *s);
void rd_irq_queue(struct dw_rd_qp *s, int idx);

/* rd_rx.c, for the mailbox */
struct dw_wqe *rd_rx_bind(struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t msn);
void rd_rx_complete(struct dw_rd_qp *s, struct dw_rd_peer *p);
/* Places, in PSN order, the held tails (RD_TAIL_HOLD) of p that the
 * stream's receive cursor passed, or all of p's (the stream goes). */
void rd_tails_flush(struct dw_rd_qp *s, struct dw_rd_peer *p, bool all);
/* Whether len bytes at to of STag stag, of p's PSN psn, overlap a run placed
 * by a later PSN of p (struct rd_ahead); room: whether a segment of psn
 * there, ahead of the cursor, can be recorded. */
bool rd_ahead_overlaps(const struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t psn,
                       uint32_t stag, uint64_t to, uint64_t len);
bool rd_ahead_room(const struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t psn,
                   uint32_t stag, uint64_t to);
/* Places a Send segment in receive WQE w bound to it: g->len bytes, the
 * first len1 of them at pay and the rest at pay2 (a segment parked across
 * the end of the ring); pull, the rd_pull entry rd_pull_start gave it (-1:
 * none; -2: a receiver-paced Send's first segment waiting for one). 0, or -1: the WQE failed
 * (completed with an error, warned) and *nak says what to answer. */
int rd_send_place(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                  const struct rd_seg *g, const uint8_t *pay, const uint8_t *pay2, uint32_t len1,
                  int pull, uint8_t *nak);

/* rd_mbox.c: credits and the mailbox receive ring */
/* A credit control segment: an untagged DDP header on queue 3 whose first
 * RsvdULP byte is the type, then the value (docs/PROTOCOL.md). */
#define RD_CCTL_QN       3u
#define RD_CCTL_REQUEST  1u /* the type byte on the wire */
#define RD_CCTL_RESPONSE 2u
#define RD_CCTL_LEN      (DW_DGRAM_DDP_UNTAGGED_LEN + 4u)
/* A credit control segment arrived (X-flag CCTL, a NEW PSN). */
enum rd_verdict rd_mbox_cctl_rx(struct dw_rd_peer *p, const uint8_t *seg, size_t len);
/* Its ACK came: the entry is free. */
void rd_mbox_cctl_acked(struct dw_rd_qp *s, uint32_t slot);
int rd_mbox_init(struct dw_rd_qp *s);
void rd_mbox_fini(struct dw_rd_qp *s);
/* The peers went (reset, RTR of RC over RD): credits start over. */
int rd_mbox_reset(struct dw_rd_qp *s);
void rd_mbox_peer_new(struct dw_rd_qp *s, struct dw_rd_peer *p);
/* p's credit index goes back to the QP (p is being freed); false: the
 * index cannot be reclaimed (dynamic protocol), keep p. */
bool rd_mbox_peer_gone(struct dw_rd_peer *p, bool check_only);
/* p's stream starts over at both ends: so do its credit counters. */
void rd_mbox_peer_restart(struct dw_rd_peer *p);
/* p's receive side starts over at MSN start and PSN start_psn while Sends
 * of the old start (MSNs from old_bind on, none bound) may be parked: they
 * move to the k MSNs before start, in their order, so they bind before the
 * new ones, and to a PSN behind the new cursor (they arrived whole).
 * Returns the first MSN to bind: start - k. */
uint32_t rd_mbox_restart_parked(struct dw_rd_peer *p, uint32_t old_bind, uint32_t start,
                                uint32_t start_psn);
/* With p->rx_old: the first MSN of p's new start. */
static inline uint32_t rd_mbox_new_msn(const struct dw_rd_peer *p)
{
        return p->s->mb->idx_new[p->cr_idx - 1];
}
/* Sender: the credits the Send segment of len bytes to p takes now (0: it
 * goes uncharged), or -1: it waits for credits (counted; probes the peer
 * now and then); and giving them back when the socket refused it. */
int rd_mbox_tx_take(struct dw_rd_peer *p, uint32_t len, uint64_t now);
void rd_mbox_tx_untake(struct dw_rd_peer *p, uint32_t slots);
/* The credit value a datagram to p carries (reliable: a data packet). */
void rd_mbox_hdr(struct dw_rd_peer *p, struct dw_dgram_hdr *h, bool reliable);
/* A datagram from p arrived: its credit value, or that it has none. */
void rd_mbox_rx_hdr(struct dw_rd_peer *p, const struct dw_dgram_hdr *h);
/* A Send segment placed straight into its WQE (or refused with an error NAK)
 * still counts against its sender's credits: it arrives and is retrieved. */
void rd_mbox_account(struct dw_rd_peer *p, uint32_t len);
/* A Send segment with no receive WQE for it: parked (RV_ACCEPT) or RV_RNR. */
enum rd_verdict rd_mbox_park(struct dw_rd_peer *p, const struct rd_seg *g, const uint8_t *pay);
/* Delivers parked segments to receive WQEs posted since, oldest first. */
void rd_mbox_drain(struct dw_rd_qp *s);
/* Sends the stand-alone credit messages that are due. */
void rd_mbox_ctl(struct dw_rd_qp *s);
/* Application mailbox: a Send segment to it (the whole message) lands in the
 * ring (RV_ACCEPT), waits for room (RV_RNR) or is refused (RV_NAK, *nak). */
enum rd_verdict rd_mbox_app_rx(struct dw_rd_peer *p, const struct rd_seg *g, const uint8_t *pay,
                               bool pull, uint8_t *nak);
/* Completes, in MSN order, the messages of p the cursor has passed. */
void rd_mbox_app_complete(struct dw_rd_qp *s, struct dw_rd_peer *p);

/* rd_pull.c: receiver-paced Sends */
enum rd_verdict rd_pull_start(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                              const struct dw_rdmap_hdr *r, const struct dw_dgram_hdr *h, int *idx,
                              uint8_t *nak);
void rd_pull_free(struct dw_rd_qp *s, struct rd_pull *pl);
/* Gives free entries to receive WQEs waiting to be pulled; true if any. */
bool rd_pull_activate(struct dw_rd_qp *s);
/* A pushed or pulled piece of receive WQE w (RD_W_PULL) was placed: marks it
 * whole (RD_W_LAST) once every byte is in. */
void rd_pull_check(struct dw_rd_qp *s, struct dw_wqe *w);
enum rd_verdict rd_pull_response(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                 const struct dw_dgram_hdr *h, const struct dw_rdmap_hdr *r,
                                 const uint8_t *pay, size_t plen);
/* The request of Read slot `slot` of pull entry idx was acknowledged. */
void rd_pull_acked(struct dw_rd_qp *s, uint32_t idx, uint32_t slot);
enum rd_verdict rd_pull_serve(struct dw_rd_qp *s, struct dw_rd_peer *p,
                              const struct dw_rdmap_hdr *r, const struct dw_rdmap_rreq *rq,
                              uint8_t *nak);

/* ---------------------------------------------------------------- helpers */

static inline struct dw_rd_dev *rdd(struct dw_device *dev)
{
        return (struct dw_rd_dev *)dev->rd;
}

/* The clock, remembered as the latest read of the current progress step. */
static inline uint64_t rd_clock(struct dw_device *dev)
{
        struct dw_rd_dev *d = rdd(dev);
        d->step_now = dw_now_ns();
        d->step_no = dev->prog.steps;
        return d->step_now;
}

/* dw_rd_seg_payload: inline, as every segment built asks for it. */
static inline uint32_t rd_seg_payload(uint32_t mtu)
{
        if (mtu < DW_CONFIG_MIN_UDP_MTU)
                mtu = DW_CONFIG_MIN_UDP_MTU;
        if (mtu > DW_UDP_MAX_PAYLOAD)
                mtu = DW_UDP_MAX_PAYLOAD;
        /* Room for the fixed header, an untagged DDP header, an Immediate Data
         * message, a start descriptor and the CRC; SACK blocks ride in what
         * is left over. The size is fixed per stream so a retransmission
         * rebuilds the same segment. */
        return mtu - DW_DGRAM_HDR_LEN - DW_DGRAM_DDP_UNTAGGED_LEN - DW_DGRAM_IMM_MSG_LEN -
               DW_DGRAM_START_LEN - DW_DGRAM_CRC_LEN;
}

static inline uint32_t rd_peer_seg(const struct dw_rd_peer *p)
{
        return rd_seg_payload(p->udp_mtu);
}

/* Send segments are smaller when credits are on and the quota is: a segment
 * never needs more credits than a sender can ever hold. */
static inline uint32_t rd_send_seg(const struct dw_rd_peer *p)
{
        uint32_t S = rd_peer_seg(p);
        return p->s->mb && p->s->mb->seg_cap < S ? p->s->mb->seg_cap : S;
}

/* Payload bytes of segment seg of Send WQE w (of its pushed part when
 * receiver-paced): what the segment's credits are counted on. */
static inline uint32_t rd_send_seg_len(const struct dw_rd_peer *p, const struct dw_wqe *w,
                                       uint32_t seg)
{
        uint64_t S = rd_send_seg(p), off = (uint64_t)seg * S;
        uint64_t end = (w->flags & RD_W_PULL) ? w->pull_pushed : w->total_len;
        return end <= off ? 0 : (uint32_t)(end - off < S ? end - off : S);
}

static inline uint64_t rd_nseg(uint64_t len, uint32_t seg)
{
        return len <= seg ? 1 : (len + seg - 1) / seg; /* no division for the common case */
}

/* The datagram a cookie names, in the bytes congestion control counts: the
 * same value when it leaves and when it is acknowledged, whatever ACK fields
 * rode on it. */
static inline uint32_t rd_cc_bytes(const struct dw_rd_peer *p, uint64_t cookie)
{
        const struct dw_rd_qp *s = p->s;
        uint64_t S = rd_peer_seg(p), off = (uint64_t)ck_seg(cookie) * S, len = 0;
        if (ck_kind(cookie) == RD_CK_SQ) {
                const struct dw_wqe *w = &s->qp->sq.ring[ck_slot(cookie)];
                if (dw_wr_is_send(w->opcode)) {
                        S = rd_send_seg(p);
                        off = (uint64_t)ck_seg(cookie) * S;
                }
                uint64_t end = (w->flags & RD_W_PULL) ? w->pull_pushed : w->total_len;
                if (dw_wr_op(w->opcode)->response)
                        len = DW_RDMAP_ATOMIC_REQ_HDR_LEN;
                else if (end > off)
                        len = end - off;
        } else if (ck_kind(cookie) == RD_CK_PULL) {
                len = DW_RDMAP_RREQ_HDR_LEN;
        } else if (ck_kind(cookie) == RD_CK_CCTL) {
                len = RD_CCTL_LEN - DW_DGRAM_DDP_UNTAGGED_LEN;
        } else {
                const struct rd_irq *e = &s->irq[ck_slot(cookie)];
                if (e->resp.atomic)
                        len = DW_RDMAP_ATOMIC_RESP_HDR_LEN;
                else if (e->resp.rq.rdma_rd_sz > off)
                        len = e->resp.rq.rdma_rd_sz - off;
        }
        return (uint32_t)(len < S ? len : S) + RD_CC_OVERHEAD;
}

/* Rails usable towards p: ours and its device's, paired by index; 0 when
 * the stream is not multirail (fewer than two on either side). */
static inline unsigned rd_rails(const struct dw_rd_peer *p)
{
        unsigned theirs = p->path->nrails;
        if (theirs < 2)
                return 0;
        unsigned ours = (unsigned)p->s->qp->dev->nrails;
        unsigned n = ours < theirs ? ours : theirs;
        return n < 2 ? 0 : n;
}

/* The path (congestion window, rail state) and peer address of rail `rail`
 * of p's device; rail 0 is the stream's own. */
static inline struct dw_flow_path *rd_rail_path(const struct dw_rd_peer *p, unsigned rail)
{
        return rail && rail < p->path->nrails ? p->path->rail[rail] : p->path;
}
static inline uint32_t rd_rail_ip(const struct dw_rd_peer *p, unsigned rail)
{
        return rail && rail < p->path->nrails ? p->path->rail_ip[rail] : p->ip;
}

/* Whether a datagram to p's first address would carry our rail list now. */
static inline bool rd_rails_due(const struct dw_rd_peer *p)
{
        struct dw_device *dev = p->s->qp->dev;
        if (dev->nrails < 2)
                return false;
        uint64_t t = p->path->rails_told_at;
        return !t || rdd(dev)->step_now - t >= RD_RAILS_EVERY_NS;
}

/* Multirail: segments of a multirail device leave room for a rail list, an
 * origin and the token proving the list (docs/PROTOCOL.md "Multirail"). */
#define RD_MULTIRAIL_ROOM (DW_DGRAM_MULTIRAIL_MAX + DW_DGRAM_TOKEN_LEN)

/* Whether a datagram with X-flag RAIL may be taken as from its origin: it
 * came from the origin itself (as a datagram without RAIL would), or the
 * origin is a peer device we talk to (a path to it at the same UDP port)
 * whose rail list was proven (nrails is set only then) and the datagram
 * came from one of those rails. */
static inline bool rd_rail_ok(const struct dw_rd_dev *d, uint32_t origin, uint16_t port,
                              uint32_t from_ip)
{
        if (from_ip == origin)
                return true;
        const struct dw_flow_path *f = dw_flow_path_find(&d->paths, origin, port);
        if (!f)
                return false;
        for (unsigned i = 1; i < f->nrails; i++)
                if (f->rail_ip[i] == from_ip)
                        return true;
        return false;
}

/* The address a datagram names its stream by: its origin when it came by
 * another rail than its sender's first (X-flag RAIL) and rd_rail_ok takes
 * it, else its source; 0: a RAIL datagram rd_rail_ok refuses. */
static inline uint32_t rd_stream_ip(const struct dw_rd_dev *d, const struct dw_dgram_hdr *h,
                                    const struct sockaddr_in *from)
{
        if (!(h->xflags & DW_DGRAM_X_RAIL))
                return from->sin_addr.s_addr;
        return rd_rail_ok(d, h->origin, from->sin_port, from->sin_addr.s_addr) ? h->origin : 0;
}

/* RC over RD: the connection's token on a datagram to the peer (none after
 * an IB-style connect). Returns its length. */
static inline size_t rd_hdr_token(const struct dw_rd_peer *p, struct dw_dgram_hdr *h)
{
        if (!p->s->ctok_tx)
                return 0;
        h->xflags2 |= DW_DGRAM_X2_TOKEN;
        h->token = p->s->ctok_tx;
        return DW_DGRAM_TOKEN_LEN;
}

static inline bool rd_backpressure(int r)
{
        return r == -EAGAIN || r == -ENOBUFS;
}

static inline uint32_t rd_hash(uint32_t ip, uint16_t port, uint32_t qpn)
{
        uint64_t k = (uint64_t)ip << 32 ^ (uint64_t)port << 24 ^ qpn;
        k *= 0x9e3779b97f4a7c15ull;
        return (uint32_t)(k >> 32);
}

static inline void rd_activate(struct dw_rd_peer *p)
{
        struct dw_rd_dev *d = rdd(p->s->qp->dev);
        if (!d->touched && !p->dead)
                d->touched = p;
        else if (d->touched != p)
                d->timers_dirty = true;
        if (p->active || p->dead)
                return;
        p->active = true;
        p->aprev = NULL;
        p->anext = d->active;
        if (d->active)
                d->active->aprev = p;
        d->active = p;
}

/* The start descriptor a DATA datagram of p carries until the peer has
 * acknowledged our first PSN: our first PSN (the oldest unacknowledged one
 * until then) and our first queue-0 MSN, the same value. Returns its
 * length. */
static inline size_t rd_hdr_start(const struct dw_rd_peer *p, struct dw_dgram_hdr *h)
{
        if (p->tx_synced)
                return 0;
        h->xflags2 |= DW_DGRAM_X2_START;
        h->start_psn = h->start_msn = p->rel.snd_una;
        return DW_DGRAM_START_LEN;
}

/* The ACK fields of a data datagram to p: the owed ACK (up to max_sack SACK
 * blocks), else the cumulative ACK point again (dw_rel_ack_repeat), so a
 * lost ACK cannot let the peer hear of a completion here (the reader's FIN
 * after its Read) while it still resends what we hold: the resend would read
 * memory the peer's application may have deregistered since. An RD QP's
 * stream repeats it only while it is in use (a datagram from the peer within
 * a quarter of the idle time, and no restart of ours pending): the peer may
 * have started its stream over after an idle time, and the old cursor would
 * then name its new PSNs. */
static inline void rd_hdr_ack(struct dw_rd_peer *p, struct dw_dgram_hdr *h, unsigned max_sack)
{
        if (dw_rel_ack_owed(&p->rel)) {
                dw_rel_build_ack(&p->rel, h, max_sack);
                return;
        }
        const struct dw_rd_dev *d = rdd(p->s->qp->dev);
        if (p->s->rc ||
            (p->tx_synced && !p->rx_resync && rd_idle(p, d->step_now) < d->idle_ticks / 4))
                dw_rel_ack_repeat(&p->rel, h);
}

static inline struct dw_rd_peer *rd_peer_find(struct dw_rd_qp *s, uint32_t ip, uint16_t port,
                                              uint32_t qpn)
{
        if (!s->htab)
                return NULL;
        struct dw_rd_peer *p = s->htab[rd_hash(ip, port, qpn) & s->hmask];
        for (; p; p = p->hnext)
                if (p->ip == ip && p->port == port && p->rqpn == qpn)
                        return p;
        return NULL;
}

/* Send completions held back by the ACK of an incoming Send go to the CQ. In
 * a ping-pong the ACK of our last message rides on the peer's answer: the
 * receive completion is what the application waits for, so the step that
 * delivers it leaves the send completion to the application's next call (the
 * answer's post_send, after its datagram left, or the next step), as UD
 * reports it after the send. Returns whether any WQE was held. */
static inline bool rd_retire_held(struct dw_rd_qp *s)
{
        if (!s->retire_held)
                return false;
        s->retire_held = false;
        rd_retire(s);
        return true;
}

#endif
