/* RD transport: RDMAP over DDP over the rel/ reliable-datagram sublayer, on
 * the device's one UDP socket. See rd.h for the model and qp/README.md (RD)
 * for the decisions.
 *
 * Transmit: WQEs are sent in SQ order; each is cut into segments of
 * dw_rd_seg_payload(mtu) bytes. A segment is named by a 64-bit cookie (kind,
 * ring slot, segment index) so rel/ can ask for it again and we rebuild it
 * from the WQE (or the responder's IRQ entry) with the same PSN and bytes.
 * Up to DW_UDP_TX_BATCH datagrams go out per sendmmsg; with UDP GSO (no fault
 * injection, kernel support) up to DW_UDP_GSO_MAX_SEGS are built per step and
 * each run of equal-size datagrams to one peer goes out as one GSO sendmsg
 * (rd_send_batch). PSNs are registered
 * with rel/ only for those the socket took, and the cursors roll back to the
 * first one it refused (local back-pressure costs no PSN and no retry).
 *
 * Receive: the datagram is still in the llp bounce buffer; a NEW segment is
 * checked (protection, receive WQE) and copied straight to its place, then
 * handed to rel/. A refused segment is not accepted: RNR NAK (no receive WQE,
 * no IRQ slot) or an error NAK (REM_ACCESS, REM_OP, INVALID) that is repeated
 * whenever the same PSN comes again. Completions follow rel/'s in-order
 * cursor: a message completes once every PSN up to its last segment arrived.
 *
 * Receive WQEs are bound to Send messages in MSN order (queue-0 MSN counts
 * only messages that consume a receive WQE), so a later Send can never take
 * the WQE of an earlier one that was refused for RNR. On an RD QP several
 * peers share the RQ: a WQE completes when its message does and leaves the
 * ring once every older WQE has completed too.
 */
#include "qp/rd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <diwarp/diwarpdv.h>

#include "util/time.h"
#include "wire/crc32c.h"
#include "wire/rdmap.h"

/* ---------------------------------------------------------------- layout */

#define RD_MAX_ORQ  DW_MAX_RD_ATOM /* Reads/Atomics we have outstanding, per QP */
#define RD_MAX_IRQ  64             /* Read/Atomic responses we owe, per QP (all peers) */
#define RD_HASH_MIN 16u
#define RD_BATCH    DW_UDP_GSO_MAX_SEGS /* slots; DW_UDP_TX_BATCH without GSO */
#define RD_SLOT_IOV (DW_MAX_SGE + 3)
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

/* Cookie: kind (2 bits) | slot (14 bits, < DW_MAX_QP_WR and RD_MAX_IRQ) | segment (32 bits). */
enum { RD_CK_SQ = 1, RD_CK_IRQ = 2 };
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

/* WQE flag bits of the RD engine (above queue/'s enum dw_wqe_flags). */
enum {
        RD_W_TXALL = 1u << 8,   /* send: every segment handed to the socket once */
        RD_W_RESP = 1u << 9,    /* Read/Atomic: the response is complete */
        RD_W_LAST = 1u << 10,   /* last segment (or response) seen; psn = its PSN */
        RD_W_BOUND = 1u << 11,  /* receive: bound to (peer, msn) */
        RD_W_IMM = 1u << 12,    /* receive: carries immediate data */
        RD_W_INV = 1u << 13,    /* receive: Send with Invalidate */
        RD_W_SE = 1u << 14,     /* receive: solicited */
        RD_W_WIMM = 1u << 15,   /* receive: consumed by RDMA Write with Immediate */
        RD_W_INORQ = 1u << 16,  /* send: on the ORQ */
        RD_W_QUEUED = 1u << 17, /* send: dw_rd_post_send resolved its peer */
};

/* Responder work for one Read or Atomic Request. */
struct rd_irq {
        struct dw_rd_peer *peer; /* NULL: free */
        bool atomic;
        uint32_t msn; /* request's queue-1 MSN (Atomic: also the Response's) */
        uint32_t sink_stag;
        uint64_t sink_to;
        uint32_t len;
        uint32_t src_stag;
        uint64_t src_to;
        uint32_t req_id;
        uint64_t orig; /* Atomic: the original value, kept for retransmission */
        uint32_t nseg, next_seg, sent, acked;
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
        uint8_t rsvd;
        /* Largest UDP payload to this peer (rd_udp_mtu), fixed for the
         * stream's life: segment k of a message always covers the same bytes,
         * so a retransmission rebuilds it exactly. */
        uint16_t udp_mtu;
        uint32_t batch; /* segments built in the current batch, not yet registered */
        /* The send-window ring (DW_REL_DEF_WINDOW entries, 2 KiB) is not here:
         * p->rel.ring borrows one from the device cache while PSNs are in
         * flight (rd_ring_get / rd_ring_idle), so an idle peer costs only this
         * struct. */
};
static_assert(sizeof(struct dw_rd_peer) <= 256, "an idle pseudo-stream costs at most 256 bytes");

struct dw_rd_qp {
        struct dw_qp *qp;
        bool rc; /* RC/UC carried by RD */
        struct dw_rel_params params;
        struct dw_rd_peer *rc_peer;
        struct dw_rd_peer *last_tx; /* peer of the last send WR: post_send tries it first */
        struct dw_rd_peer **htab;
        uint32_t hmask, npeers;
        /* transmit cursor: WQE tx_idx from the SQ head, its segment tx_seg */
        uint32_t tx_idx, tx_seg;
        struct dw_wqe *orq[RD_MAX_ORQ];
        uint32_t norq, orq_building;
        uint32_t rq_bound; /* receive WQEs [0, rq_bound) from the RQ head are bound */
        struct rd_irq irq[RD_MAX_IRQ];
        uint32_t fifo[RD_MAX_IRQ]; /* IRQ entries in arrival order, until fully sent */
        uint32_t fifo_head, fifo_count;
        bool irq_turn;
        /* Send WQEs completed (DW_WQE_DONE) by the ACK a ping-pong's incoming
         * Send carried, not retired to the CQ yet (rd_retire_held). */
        bool retire_held;
        struct dw_rd_qp *next, *prev; /* device list of RD QPs */
};

/* Payloads up to this size are copied behind the headers: the datagram is
 * then one iovec for the kernel to import and one CRC pass, which costs less
 * than the copy at these sizes (as on UD). */
#define RD_COPY_MAX 256

struct rd_txslot {
        /* the headers; for a payload of at most RD_COPY_MAX bytes the whole
         * datagram (payload, Immediate Data message and CRC behind them) */
        uint8_t hdr[RD_HDR_CAP + RD_COPY_MAX + DW_DGRAM_IMM_MSG_LEN + DW_DGRAM_CRC_LEN];
        uint8_t imm[DW_DGRAM_IMM_MSG_LEN];
        uint8_t crc[DW_DGRAM_CRC_LEN];
        struct iovec iov[RD_SLOT_IOV];
        int iovcnt;
        struct sockaddr_in dst;
        uint32_t bytes;
        uint32_t dlen; /* datagram length (sum of iov) */
        /* for commit / rollback */
        struct dw_rd_peer *peer;
        uint32_t psn;
        uint64_t cookie;
        uint32_t save_idx, save_seg;
};

struct dw_rd_dev {
        struct dw_rd_qp *qps;      /* every RD-served QP */
        struct dw_rd_peer *active; /* peers with outstanding data, owed ACKs or timers */
        bool tx_wait;              /* registered with dw_progress_tx_wait */
        /* The walk over `active` for rel/ timers runs when the earliest
         * deadline it knows of came (timers_at: no peer has work before it)
         * or when several peers changed state since the last step
         * (timers_dirty). A change of one peer only (`touched`, the common
         * case: a packet in or out) folds that peer's next deadline into
         * timers_at instead, so a busy-polling step skips the walk. */
        bool timers_dirty;
        uint64_t timers_at;
        struct dw_rd_peer *touched;
        /* The latest clock read of the current progress step (step_no),
         * reused by the timers check at its end instead of a second read;
         * rx_clock: read as the step's receive began, for its first datagram
         * (taken while waiting for it rather than after it arrived). */
        uint64_t step_now, step_no;
        bool rx_clock;
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
                uint64_t now; /* its arrival */
        } hack;
        uint32_t ctl_sent;  /* retransmissions and ACK-only datagrams of this walk */
        uint32_t dgram_max; /* largest datagram sent (diwarpdv_query_rd_path) */
        /* Direct receive (dw_rd_rx_direct): large Write segments were seen
         * lately, so the next datagram is peeked at first; rx_placed: the one
         * dw_rd_rx is handling is already in place. */
        bool rx_big, rx_placed;
        uint8_t rx_small; /* datagrams in a row not placed directly */
        uint8_t rx_hdr[RD_PEEK_LEN];
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

/* Free rings kept per device: enough for a burst of active peers without a
 * malloc; beyond it a drained peer's ring goes back to the heap. */
#define RD_RING_CACHE 64
#define RD_RING_BYTES (DW_REL_DEF_WINDOW * sizeof(struct dw_rel_txent))
struct rd_free_ring {
        struct rd_free_ring *next;
};

static_assert(DW_MAX_QP_WR <= 0x4000, "SQ slot fits the cookie");

static struct dw_rd_dev *rdd(struct dw_device *dev)
{
        return (struct dw_rd_dev *)dev->rd;
}

/* The clock, remembered as the latest read of the current progress step. */
static uint64_t rd_clock(struct dw_device *dev)
{
        struct dw_rd_dev *d = rdd(dev);
        d->step_now = dw_now_ns();
        d->step_no = dev->prog.steps;
        return d->step_now;
}

void dw_rd_rx_clock(struct dw_device *dev)
{
        struct dw_rd_dev *d = rdd(dev);
        if (d && (d->qps || d->active)) {
                rd_clock(dev);
                d->rx_clock = true;
        }
}

/* A send-window ring for a peer about to send: from the cache, else the
 * heap (only when more peers are active at once than ever before). */
static bool rd_ring_get(struct dw_rd_dev *d, struct dw_rd_peer *p)
{
        struct dw_rel_txent *ring;
        if (d->ring_cache) {
                ring = (struct dw_rel_txent *)d->ring_cache;
                d->ring_cache = d->ring_cache->next;
                d->ring_cached--;
        } else {
                ring = malloc(RD_RING_BYTES);
                if (!ring)
                        return false;
        }
        if (dw_rel_attach_ring(&p->rel, ring) < 0) {
                free(ring);
                return false;
        }
        return true;
}

static void rd_ring_put(struct dw_rd_dev *d, struct dw_rel_txent *ring)
{
        if (!ring)
                return;
        if (!d || d->ring_cached >= RD_RING_CACHE) {
                free(ring);
                return;
        }
        struct rd_free_ring *f = (struct rd_free_ring *)ring;
        f->next = d->ring_cache;
        d->ring_cache = f;
        d->ring_cached++;
}

/* The window drained (and no segment of the current batch is pending): the
 * ring goes back. */
static void rd_ring_idle(struct dw_rd_dev *d, struct dw_rd_peer *p)
{
        if (p->rel.ring && p->batch == 0 && dw_rel_tx_inflight(&p->rel) == 0)
                rd_ring_put(d, dw_rel_detach_ring(&p->rel));
}

uint32_t dw_rd_seg_payload(uint32_t mtu)
{
        if (mtu < DW_CONFIG_MIN_UDP_MTU)
                mtu = DW_CONFIG_MIN_UDP_MTU;
        if (mtu > DW_UDP_MAX_PAYLOAD)
                mtu = DW_UDP_MAX_PAYLOAD;
        /* Room for the fixed header, an untagged DDP header, an Immediate Data
         * message and the CRC; SACK blocks ride in what is left over. The size
         * is fixed per device so a retransmission rebuilds the same segment. */
        return mtu - DW_DGRAM_HDR_LEN - DW_DGRAM_DDP_UNTAGGED_LEN - DW_DGRAM_IMM_MSG_LEN -
               DW_DGRAM_CRC_LEN;
}

/* The route's MTU towards ip:port as the kernel's routing table and PMTU
 * cache see it now: a UDP socket from the device's address, connect()ed
 * there, IP_MTU. 0 when it cannot be read. */
static uint32_t rd_route_mtu(const struct dw_device *dev, uint32_t ip, uint16_t port)
{
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = dev->addr};
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = port, .sin_addr.s_addr = ip};
        int mtu = 0;
        socklen_t ml = sizeof(mtu);
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return 0;
        /* The device's source address picks the route its socket uses (source
         * routing); an address that is not local here still gets a route. */
        (void)bind(fd, (struct sockaddr *)&src, sizeof(src));
        if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 ||
            getsockopt(fd, IPPROTO_IP, IP_MTU, &mtu, &ml) < 0)
                mtu = 0;
        close(fd);
        return mtu > 0 ? (uint32_t)mtu : 0;
}

/* Largest UDP payload for a new pseudo-stream to ip:port: the route's MTU
 * less the IPv4 and UDP headers, at most DIWARP_UDP_MTU. Cached per address
 * for a second, so a burst of new peers costs no syscalls. */
static uint16_t rd_udp_mtu(struct dw_device *dev, uint32_t ip, uint16_t port)
{
        struct dw_rd_dev *d = dev->rd;
        struct rd_pmtu *c = &d->pmtu[(ip * 0x9e3779b1u) >> 28 & (RD_PMTU_CACHE - 1)];
        uint64_t now = dw_now_ns();
        if (c->ip != ip || !c->mtu || now - c->at_ns > RD_PMTU_TTL_NS) {
                uint32_t m = rd_route_mtu(dev, ip, port);
                c->ip = ip;
                c->mtu = m ? m : RD_FALLBACK_MTU;
                c->at_ns = now;
        }
        uint32_t u = c->mtu > 28 ? c->mtu - 28 : 0; /* IPv4 20 + UDP 8 */
        if (u > DW_UDP_MAX_PAYLOAD)
                u = DW_UDP_MAX_PAYLOAD;
        if (dev->cfg.udp_mtu && u > dev->cfg.udp_mtu)
                u = dev->cfg.udp_mtu;
        if (u < DW_CONFIG_MIN_UDP_MTU)
                u = DW_CONFIG_MIN_UDP_MTU;
        return (uint16_t)u;
}

static uint32_t rd_peer_seg(const struct dw_rd_peer *p)
{
        return dw_rd_seg_payload(p->udp_mtu);
}

size_t dw_rd_peer_bytes(void)
{
        return sizeof(struct dw_rd_peer); /* idle; + RD_RING_BYTES while sending */
}

bool dw_rd_wanted(const struct dw_device *dev, enum diwarp_qp_type type)
{
        if (type == DIWARP_QPT_RD)
                return true;
        return (type == DIWARP_QPT_RC || type == DIWARP_QPT_UC) &&
               dev->cfg.rc_transport == DW_RC_RD;
}

static const char *peer_str(const struct dw_rd_peer *p, char *buf, size_t len)
{
        char ip[INET_ADDRSTRLEN];
        struct in_addr a = {.s_addr = p->ip};
        inet_ntop(AF_INET, &a, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u QPN %#x", ip, ntohs(p->port), p->rqpn);
        return buf;
}

static uint64_t rd_nseg(uint64_t len, uint32_t seg)
{
        return len <= seg ? 1 : (len + seg - 1) / seg; /* no division for the common case */
}

static bool is_read_like(int op)
{
        return op == DIWARP_WR_RDMA_READ || op == DIWARP_WR_ATOMIC_CMP_AND_SWP ||
               op == DIWARP_WR_ATOMIC_FETCH_AND_ADD;
}

static bool qp_allows(const struct dw_qp *qp, int access)
{
        if (!(qp->attr_mask_set & DIWARP_QP_ACCESS_FLAGS))
                return true;
        return (qp->attr.qp_access_flags & access) == access;
}

/* ---------------------------------------------------------------- peers */

static uint32_t rd_hash(uint32_t ip, uint16_t port, uint32_t qpn)
{
        uint64_t k = (uint64_t)ip << 32 ^ (uint64_t)port << 24 ^ qpn;
        k *= 0x9e3779b97f4a7c15ull;
        return (uint32_t)(k >> 32);
}

static void rd_activate(struct dw_rd_peer *p)
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

static void rd_deactivate(struct dw_rd_peer *p)
{
        struct dw_rd_dev *d = rdd(p->s->qp->dev);
        if (d->touched == p) {
                d->touched = NULL;
                d->timers_dirty = true;
        }
        if (!p->active)
                return;
        if (p->aprev)
                p->aprev->anext = p->anext;
        else
                d->active = p->anext;
        if (p->anext)
                p->anext->aprev = p->aprev;
        p->anext = p->aprev = NULL;
        p->active = false;
}

/* First PSN of the direction from QPN a to QPN b on an RD QP, which both ends
 * compute alike (no handshake). RC over RD uses sq_psn / rq_psn instead. */
static uint32_t rd_isn(uint32_t from_qpn, uint32_t to_qpn)
{
        uint64_t k = ((uint64_t)from_qpn << 24 | to_qpn) * 0xff51afd7ed558ccdull;
        return (uint32_t)(k >> 29);
}

static struct dw_rd_peer *rd_peer_find(struct dw_rd_qp *s, uint32_t ip, uint16_t port, uint32_t qpn)
{
        if (!s->htab)
                return NULL;
        struct dw_rd_peer *p = s->htab[rd_hash(ip, port, qpn) & s->hmask];
        for (; p; p = p->hnext)
                if (p->ip == ip && p->port == port && p->rqpn == qpn)
                        return p;
        return NULL;
}

static int rd_hash_grow(struct dw_rd_qp *s)
{
        uint32_t n = s->htab ? (s->hmask + 1) * 4 : RD_HASH_MIN;
        struct dw_rd_peer **t = calloc(n, sizeof(*t));
        if (!t)
                return -ENOMEM;
        if (s->htab) {
                for (uint32_t i = 0; i <= s->hmask; i++) {
                        struct dw_rd_peer *p = s->htab[i], *nx;
                        for (; p; p = nx) {
                                nx = p->hnext;
                                uint32_t b = rd_hash(p->ip, p->port, p->rqpn) & (n - 1);
                                p->hnext = t[b];
                                t[b] = p;
                        }
                }
                free(s->htab);
        }
        s->htab = t;
        s->hmask = n - 1;
        return 0;
}

static struct dw_rd_peer *rd_peer_new(struct dw_rd_qp *s, uint32_t ip, uint16_t port, uint32_t qpn,
                                      uint32_t tx_psn, uint32_t rx_psn)
{
        if (!s->htab || s->npeers >= (s->hmask + 1) * 2)
                if (rd_hash_grow(s) < 0)
                        return NULL;
        struct dw_rd_peer *p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        p->s = s;
        p->ip = ip;
        p->port = port;
        p->rqpn = qpn;
        p->tx_msn = p->tx_rreq = p->rx_bind = p->rx_done = 1;
        p->udp_mtu = rd_udp_mtu(s->qp->dev, ip, port);
        if (dw_rel_peer_init(&p->rel, &s->params, NULL, DW_REL_DEF_WINDOW, tx_psn, rx_psn) < 0) {
                free(p);
                return NULL;
        }
        uint32_t b = rd_hash(ip, port, qpn) & s->hmask;
        p->hnext = s->htab[b];
        s->htab[b] = p;
        s->npeers++;
        return p;
}

static void rd_peers_free(struct dw_rd_qp *s)
{
        if (!s->htab)
                return;
        struct dw_rd_dev *d = rdd(s->qp->dev);
        if (d && d->rx_next.peer && d->rx_next.peer->s == s)
                d->rx_next.peer = NULL;
        if (d && d->hack.peer && d->hack.peer->s == s)
                d->hack.peer = NULL; /* the QP's WQEs go without completions */
        for (uint32_t i = 0; i <= s->hmask; i++) {
                struct dw_rd_peer *p = s->htab[i], *nx;
                for (; p; p = nx) {
                        nx = p->hnext;
                        rd_deactivate(p);
                        free(p->rel.ring);
                        free(p);
                }
        }
        free(s->htab);
        s->htab = NULL;
        s->hmask = 0;
        s->npeers = 0;
        s->rc_peer = NULL;
        s->last_tx = NULL;
}

/* ---------------------------------------------------------------- send-side completion */

static void rd_retire(struct dw_rd_qp *s)
{
        struct dw_qp *qp = s->qp;
        struct dw_wqe *w;
        while ((w = dw_wq_head(&qp->sq)) && (w->flags & DW_WQE_DONE)) {
                dw_qp_complete_send(qp, (enum diwarp_wc_status)w->status, w->byte_len);
                if (s->tx_idx)
                        s->tx_idx--;
        }
        /* dw_qp_complete_send looked before the cursor moved back. */
        if (qp->state == DIWARP_QPS_SQD)
                dw_qp_sqd_check(qp);
}

bool dw_rd_sq_busy(const struct dw_qp *qp)
{
        const struct dw_rd_qp *s = qp->rd;
        return s->tx_idx || s->tx_seg;
}

static void rd_check_done(struct dw_rd_qp *s, struct dw_wqe *w)
{
        if ((w->flags & DW_WQE_DONE) || !(w->flags & RD_W_TXALL))
                return;
        if (is_read_like(w->opcode)) {
                if (!(w->flags & RD_W_RESP) || w->bytes_acked < 1)
                        return;
                w->byte_len = (uint32_t)w->total_len;
        } else {
                if (w->bytes_acked < w->ts_ns)
                        return;
                w->byte_len = (uint32_t)w->total_len;
        }
        w->status = DIWARP_WC_SUCCESS;
        w->flags |= DW_WQE_DONE;
        struct dw_rd_dev *d = rdd(s->qp->dev);
        if (d->hold_retire) {
                s->retire_held = true;
                if (!d->held_step) /* the oldest: none waits more than a step */
                        d->held_step = s->qp->dev->prog.steps;
                return;
        }
        rd_retire(s);
}

/* Send completions held back by the ACK of an incoming Send go to the CQ. In
 * a ping-pong the ACK of our last message rides on the peer's answer: the
 * receive completion is what the application waits for, so the step that
 * delivers it leaves the send completion to the application's next call (the
 * answer's post_send, after its datagram left, or the next step), as UD
 * reports it after the send. Returns whether any WQE was held. */
static bool rd_retire_held(struct dw_rd_qp *s)
{
        if (!s->retire_held)
                return false;
        s->retire_held = false;
        rd_retire(s);
        return true;
}

static void rd_peer_fail(struct dw_rd_peer *p, enum diwarp_wc_status status, int event,
                         const char *why);
static const struct dw_rel_ops rd_ops;

/* Whether the ACK of a datagram whose Send rd_rx_fast completed may wait for
 * the application's answer (rd_ack_flush): it acknowledges new PSNs, none it
 * could not (so it is valid now and later), and no RNR episode, RTO probe or
 * fatal state would make its effect depend on when it is handled. */
static bool rd_ack_holdable(const struct dw_rel_peer *r, const struct dw_dgram_hdr *h)
{
        return (h->flags & (DW_DGRAM_F_ACK | DW_DGRAM_F_SACK | DW_DGRAM_F_NAK)) == DW_DGRAM_F_ACK &&
               !r->fatal && !r->rnr_retries && !r->rnr_until && !(r->flags & DW_REL_F_RTO_PROBE) &&
               dw_psn_before(r->snd_una, h->ack_psn) && !dw_psn_before(r->snd_nxt, h->ack_psn);
}

/* Hands a held ACK to rel/, with its arrival time: the send completions it
 * makes go to the CQ at once. */
static void rd_ack_flush(struct dw_rd_dev *d)
{
        struct dw_rd_peer *p = d->hack.peer;
        if (!p)
                return;
        d->hack.peer = NULL;
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK,
                                 .ack_psn = d->hack.ack_psn};
        int r = dw_rel_on_ack(&p->rel, &h, d->hack.now, &rd_ops, p);
        if ((r == -EREMOTEIO || r == -ETIMEDOUT) && p->s->qp->state != DIWARP_QPS_ERR)
                rd_peer_fail(
                    p, r == -EREMOTEIO ? DIWARP_WC_RNR_RETRY_EXC_ERR : DIWARP_WC_RETRY_EXC_ERR,
                    DIWARP_EVENT_QP_FATAL, dw_rel_fatal_str(&p->rel));
}

static void orq_remove(struct dw_rd_qp *s, struct dw_wqe *w)
{
        for (uint32_t i = 0; i < s->norq; i++)
                if (s->orq[i] == w) {
                        s->orq[i] = s->orq[--s->norq];
                        w->flags &= ~RD_W_INORQ;
                        return;
                }
}

/* Completes the SQ from its head through w: finished WQEs with their status,
 * unfinished ones flushed, w with status. */
static void rd_complete_through(struct dw_rd_qp *s, struct dw_wqe *w, enum diwarp_wc_status status)
{
        struct dw_qp *qp = s->qp;
        struct dw_wqe *h;
        bool found = false;
        for (uint32_t i = 0; (h = dw_wq_at(&qp->sq, i)); i++)
                if (h == w) {
                        found = true;
                        break;
                }
        if (!found)
                return;
        while ((h = dw_wq_head(&qp->sq))) {
                if (h->flags & RD_W_INORQ)
                        orq_remove(s, h);
                bool last = h == w;
                dw_qp_complete_send(qp,
                                    last                       ? status
                                    : (h->flags & DW_WQE_DONE) ? (enum diwarp_wc_status)h->status
                                                               : DIWARP_WC_WR_FLUSH_ERR,
                                    last ? 0 : h->byte_len);
                if (s->tx_idx)
                        s->tx_idx--;
                else
                        s->tx_seg = 0;
                if (last)
                        break;
        }
}

/* The pseudo-stream to p failed for good (rel/ fatal, or a local error). */
static void rd_peer_fail(struct dw_rd_peer *p, enum diwarp_wc_status status, int event,
                         const char *why)
{
        struct dw_rd_qp *s = p->s;
        struct dw_qp *qp = s->qp;
        char pb[64];
        dw_warn("RD QP %#x peer %s: %s; QP to error", qp->qpn, peer_str(p, pb, sizeof(pb)), why);
        if (qp->state == DIWARP_QPS_ERR)
                return;
        struct dw_wqe *w;
        for (uint32_t i = 0; (w = dw_wq_at(&qp->sq, i)); i++)
                if (w->priv == p && !(w->flags & DW_WQE_DONE)) {
                        rd_complete_through(s, w, status);
                        break;
                }
        dw_qp_to_error(qp, event);
}

/* ---------------------------------------------------------------- packet build */

/* iovecs for bytes [off, off+len) of a send WQE's SGEs (lkeys checked). */
static int rd_src_iov(struct dw_qp *qp, const struct dw_wqe *w, uint64_t off, uint64_t len,
                      struct iovec *iov)
{
        int n = 0;
        if (len == 0)
                return 0;
        if (w->flags & DW_WQE_INLINE) {
                if (off + len > w->inline_len)
                        return -EMSGSIZE;
                iov[0].iov_base = w->inline_buf + off;
                iov[0].iov_len = len;
                return 1;
        }
        for (uint32_t i = 0; i < w->num_sge && len; i++) {
                const struct diwarp_sge *g = &w->sge[i];
                if (off >= g->length) {
                        off -= g->length;
                        continue;
                }
                uint64_t piece = g->length - off < len ? g->length - off : len;
                uint8_t *host = NULL;
                if (dw_mr_check_local(&qp->dev->mrs, g->lkey, qp->pd, 0, g->addr + off, piece,
                                      &host) != DW_PROT_OK)
                        return -EACCES;
                iov[n].iov_base = host;
                iov[n].iov_len = piece;
                n++;
                len -= piece;
                off = 0;
        }
        return len ? -EMSGSIZE : n;
}

/* dw_dgram_encode of a header without SACK blocks that rd_build made (valid
 * by construction: flags DATA with ACK/ACKREQ/IMM, 24-bit QPNs), minus the
 * checks. */
static ssize_t rd_put_hdr(const struct dw_dgram_hdr *h, uint8_t *b)
{
        b[0] = DW_DGRAM_VERSION;
        b[1] = h->flags;
        b[2] = 0;
        b[3] = 0;
        dw_put_be32(b + 4, h->dst_qpn);
        dw_put_be32(b + 8, h->src_qpn);
        dw_put_be32(b + 12, h->qkey);
        dw_put_be32(b + 16, h->psn);
        dw_put_be32(b + 20, h->ack_psn);
        dw_put_be32(b + 24, 0); /* credits, rnr_delay */
        return DW_DGRAM_HDR_LEN;
}

/* dw_rdmap_encode of a header from dw_rdmap_hdr_init (so T and QN agree with
 * the opcode): the same bytes without the opcode-table checks. */
static ssize_t rd_put_ddp(const struct dw_rdmap_hdr *r, uint8_t *b)
{
        b[0] = (uint8_t)((r->ddp.tagged ? DW_DDP_CTRL_T : 0) | (r->ddp.last ? DW_DDP_CTRL_L : 0) |
                         DW_DDP_VERSION);
        b[1] = (uint8_t)(DW_RDMAP_VERSION << 6 | r->opcode);
        if (r->ddp.tagged) {
                dw_put_be32(b + 2, r->ddp.stag);
                dw_put_be64(b + 6, r->ddp.to);
                return DW_DDP_TAGGED_HDR_LEN;
        }
        dw_put_be32(b + 2, r->inval_stag);
        dw_put_be32(b + 6, r->ddp.qn);
        dw_put_be32(b + 10, r->ddp.msn);
        dw_put_be32(b + 14, r->ddp.mo);
        return DW_DDP_UNTAGGED_HDR_LEN;
}

/* Where the slot's datagram goes and what it carries, for commit/rollback. */
static void rd_slot_for(struct rd_txslot *t, struct dw_rd_peer *p, uint32_t psn, uint64_t cookie,
                        uint32_t bytes)
{
        t->bytes = bytes;
        t->dst.sin_family = AF_INET;
        t->dst.sin_addr.s_addr = p->ip;
        t->dst.sin_port = p->port;
        t->peer = p;
        t->psn = psn;
        t->cookie = cookie;
}

/* The datagram is t->hdr up to end: its CRC goes behind it, and it is sent
 * as one iovec. */
static void rd_slot_whole(struct rd_txslot *t, uint8_t *end)
{
        size_t len = (size_t)(end - t->hdr);
        dw_dgram_crc_trailer(end, dw_crc32c_update(dw_crc32c_init(), t->hdr, len));
        t->iov[0].iov_base = t->hdr;
        t->iov[0].iov_len = len + DW_DGRAM_CRC_LEN;
        t->iovcnt = 1;
        t->dlen = (uint32_t)t->iov[0].iov_len;
}

/* rd_build for the first segment of a Send or RDMA Write (no Immediate Data,
 * no Invalidate) of at most RD_COPY_MAX bytes that fits one segment, from an
 * inline buffer or one SGE, while no SACK block is owed: the same datagram,
 * written directly. False (nothing changed) for anything else, which the
 * general builder below handles; a failing lkey check is left to it too. */
static bool rd_build_small(struct dw_rd_peer *p, struct dw_wqe *w, uint64_t cookie, uint32_t psn,
                           bool ackreq, struct rd_txslot *t)
{
        struct dw_qp *qp = p->s->qp;
        bool write = w->opcode == DIWARP_WR_RDMA_WRITE;
        if ((w->opcode != DIWARP_WR_SEND && !write) || w->total_len > RD_COPY_MAX ||
            w->total_len > rd_peer_seg(p) || (p->rel.rx_map[0] | p->rel.rx_map[1]))
                return false;
        uint32_t len = (uint32_t)w->total_len;
        const uint8_t *src = NULL;
        if (w->flags & DW_WQE_INLINE) {
                if (w->inline_len != len)
                        return false;
                src = w->inline_buf;
        } else if (len) {
                uint8_t *host;
                if (w->num_sge != 1 || w->sge[0].length != len ||
                    dw_mr_check_local(&qp->dev->mrs, w->sge[0].lkey, qp->pd, 0, w->sge[0].addr, len,
                                      &host) != DW_PROT_OK)
                        return false;
                src = host;
        }
        struct dw_dgram_hdr h;
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA | (ackreq ? DW_DGRAM_F_ACKREQ : 0);
        h.ack_psn = 0;
        if (dw_rel_ack_owed(&p->rel))
                dw_rel_build_ack(&p->rel, &h, 0); /* no holes: no SACK block */
        uint8_t *b = t->hdr;
        b[0] = DW_DGRAM_VERSION;
        b[1] = h.flags;
        b[2] = 0;
        b[3] = 0;
        dw_put_be32(b + 4, p->rqpn);
        dw_put_be32(b + 8, qp->qpn);
        dw_put_be32(b + 12, w->remote_qkey);
        dw_put_be32(b + 16, psn);
        dw_put_be32(b + 20, h.ack_psn);
        dw_put_be32(b + 24, 0); /* credits, rnr_delay */
        b += DW_DGRAM_HDR_LEN;
        if (write) {
                /* Tagged, L = 1: the whole Write at its TO. */
                b[0] = DW_DDP_CTRL_T | DW_DDP_CTRL_L | DW_DDP_VERSION;
                b[1] = DW_RDMAP_VERSION << 6 | DW_RDMAP_WRITE;
                dw_put_be32(b + 2, w->rkey);
                dw_put_be64(b + 6, w->remote_addr);
                b += DW_DGRAM_DDP_TAGGED_LEN;
        } else {
                /* Untagged, L = 1, queue 0, MO 0. */
                bool se = w->send_flags & DIWARP_SEND_SOLICITED;
                b[0] = DW_DDP_CTRL_L | DW_DDP_VERSION;
                b[1] = DW_RDMAP_VERSION << 6 | (se ? DW_RDMAP_SEND_SE : DW_RDMAP_SEND);
                dw_put_be32(b + 2, 0);
                dw_put_be32(b + 6, 0);
                dw_put_be32(b + 10, w->msn);
                dw_put_be32(b + 14, 0);
                b += DW_DGRAM_DDP_UNTAGGED_LEN;
        }
        if (len)
                memcpy(b, src, len);
        b += len;
        rd_slot_whole(t, b);
        rd_slot_for(t, p, psn, cookie, len);
        return true;
}

/* Builds the datagram for cookie with PSN psn into t (and piggybacks an
 * owed ACK). 0, or -EACCES (a local key or the Read source failed), -EINVAL. */
static int rd_build(struct dw_rd_peer *p, uint64_t cookie, uint32_t psn, bool ackreq,
                    struct rd_txslot *t)
{
        struct dw_rd_qp *s = p->s;
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        uint32_t S = rd_peer_seg(p);
        struct dw_rdmap_hdr r;
        uint8_t ext[DW_RDMAP_ATOMIC_REQ_HDR_LEN];
        size_t extlen = 0;
        struct iovec pay[DW_MAX_SGE];
        int npay = 0;
        uint64_t plen = 0;
        bool imm = false;
        uint32_t qkey = 0;
        uint32_t seg = ck_seg(cookie);

        if (ck_kind(cookie) == RD_CK_SQ && seg == 0 &&
            rd_build_small(p, &qp->sq.ring[ck_slot(cookie)], cookie, psn, ackreq, t))
                return 0;
        if (ck_kind(cookie) == RD_CK_SQ) {
                struct dw_wqe *w = &qp->sq.ring[ck_slot(cookie)];
                uint64_t off = (uint64_t)seg * S;
                bool se = w->send_flags & DIWARP_SEND_SOLICITED;
                qkey = w->remote_qkey;
                switch (w->opcode) {
                case DIWARP_WR_SEND:
                case DIWARP_WR_SEND_WITH_IMM:
                case DIWARP_WR_SEND_WITH_INV: {
                        bool inv = w->opcode == DIWARP_WR_SEND_WITH_INV;
                        bool wimm = w->opcode == DIWARP_WR_SEND_WITH_IMM;
                        plen = w->total_len - off < S ? w->total_len - off : S;
                        bool last = off + plen == w->total_len;
                        /* With immediate data the SE bit rides on the Immediate
                         * Data message, as on UD. */
                        dw_rdmap_hdr_init(&r,
                                          inv ? (se ? DW_RDMAP_SEND_SE_INVAL : DW_RDMAP_SEND_INVAL)
                                              : (se && !wimm ? DW_RDMAP_SEND_SE : DW_RDMAP_SEND));
                        if (inv)
                                r.inval_stag = w->invalidate_rkey;
                        r.ddp.msn = w->msn;
                        r.ddp.mo = (uint32_t)off;
                        r.ddp.last = last;
                        imm = wimm && last;
                        break;
                }
                case DIWARP_WR_RDMA_WRITE:
                case DIWARP_WR_RDMA_WRITE_WITH_IMM:
                        plen = w->total_len - off < S ? w->total_len - off : S;
                        dw_rdmap_hdr_init(&r, DW_RDMAP_WRITE);
                        r.ddp.stag = w->rkey;
                        r.ddp.to = w->remote_addr + off;
                        r.ddp.last = off + plen == w->total_len;
                        imm = w->opcode == DIWARP_WR_RDMA_WRITE_WITH_IMM && r.ddp.last;
                        break;
                case DIWARP_WR_RDMA_READ: {
                        /* The Data Sink STag names the request (its queue-1 MSN)
                         * and the sink TO counts from 0: the requester places
                         * responses by offset into its SGE list. */
                        struct dw_rdmap_rreq rq = {.sink_stag = w->msn,
                                                   .sink_to = 0,
                                                   .rdma_rd_sz = (uint32_t)w->total_len,
                                                   .src_stag = w->rkey,
                                                   .src_to = w->remote_addr};
                        dw_rdmap_hdr_init(&r, DW_RDMAP_READ_REQ);
                        r.ddp.msn = w->msn;
                        extlen = (size_t)dw_rdmap_rreq_encode(&rq, ext, sizeof(ext));
                        break;
                }
                case DIWARP_WR_ATOMIC_CMP_AND_SWP:
                case DIWARP_WR_ATOMIC_FETCH_AND_ADD: {
                        bool cas = w->opcode == DIWARP_WR_ATOMIC_CMP_AND_SWP;
                        struct dw_rdmap_atomic_req ar = {
                            .aopcode = cas ? DW_ATOMIC_CMP_SWAP : DW_ATOMIC_FETCH_ADD,
                            .req_id = w->msn,
                            .remote_stag = w->rkey,
                            .remote_to = w->remote_addr,
                            .add_swap_data = cas ? w->swap : w->compare_add,
                            .add_swap_mask = cas ? ~0ull : 0,
                            .compare_data = cas ? w->compare_add : 0,
                            .compare_mask = cas ? ~0ull : 0,
                        };
                        dw_rdmap_hdr_init(&r, DW_RDMAP_ATOMIC_REQ);
                        r.ddp.msn = w->msn;
                        extlen = (size_t)dw_rdmap_atomic_req_encode(&ar, ext, sizeof(ext));
                        break;
                }
                default:
                        return -EINVAL;
                }
                if (plen) {
                        npay = rd_src_iov(qp, w, off, plen, pay);
                        if (npay < 0)
                                return -EACCES;
                }
                if (imm) {
                        struct dw_rdmap_hdr ri;
                        bool wr = w->opcode == DIWARP_WR_RDMA_WRITE_WITH_IMM;
                        dw_rdmap_hdr_init(&ri, se ? DW_RDMAP_IMM_DATA_SE : DW_RDMAP_IMM_DATA);
                        ri.ddp.msn = w->msn;
                        ssize_t k = dw_rdmap_encode(&ri, t->imm, sizeof(t->imm));
                        if (k != DW_DGRAM_DDP_UNTAGGED_LEN)
                                return -EINVAL;
                        /* Bytes 0-3: the verbs immediate (network order); bytes
                         * 4-7: with a Write, its length (the receiver's byte_len). */
                        memcpy(t->imm + k, &w->imm_data, 4);
                        dw_put_be32(t->imm + k + 4, wr ? (uint32_t)w->total_len : 0);
                }
        } else {
                struct rd_irq *e = &s->irq[ck_slot(cookie)];
                if (e->atomic) {
                        struct dw_rdmap_atomic_resp ar = {.req_id = e->req_id,
                                                          .orig_data = e->orig};
                        dw_rdmap_hdr_init(&r, DW_RDMAP_ATOMIC_RESP);
                        r.ddp.msn = e->msn;
                        extlen = (size_t)dw_rdmap_atomic_resp_encode(&ar, ext, sizeof(ext));
                } else {
                        uint64_t off = (uint64_t)seg * S;
                        plen = e->len - off < S ? e->len - off : S;
                        uint8_t *host = NULL;
                        /* Checked per segment: the region may have gone since. */
                        if (dw_mr_check_remote(&dev->mrs, e->src_stag, qp->pd,
                                               DIWARP_ACCESS_REMOTE_READ, e->src_to + off, plen,
                                               &host) != DW_PROT_OK)
                                return -EACCES;
                        dw_rdmap_hdr_init(&r, DW_RDMAP_READ_RESP);
                        r.ddp.stag = e->sink_stag;
                        r.ddp.to = e->sink_to + off;
                        r.ddp.last = off + plen == e->len;
                        if (plen) {
                                pay[0].iov_base = host;
                                pay[0].iov_len = plen;
                                npay = 1;
                        }
                }
        }

        size_t ddp_len = r.ddp.tagged ? DW_DGRAM_DDP_TAGGED_LEN : DW_DGRAM_DDP_UNTAGGED_LEN;
        size_t fixed = DW_DGRAM_HDR_LEN + ddp_len + extlen + plen +
                       (imm ? DW_DGRAM_IMM_MSG_LEN : 0) + DW_DGRAM_CRC_LEN;
        uint32_t mtu = p->udp_mtu;
        struct dw_dgram_hdr h = {
            .flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA | (imm ? DW_DGRAM_F_IMM : 0) |
                     (ackreq ? DW_DGRAM_F_ACKREQ : 0),
            .dst_qpn = p->rqpn,
            .src_qpn = qp->qpn,
            .qkey = qkey,
            .psn = psn,
        };
        if (dw_rel_ack_owed(&p->rel)) {
                size_t room = mtu > fixed ? (mtu - fixed) / DW_DGRAM_SACK_LEN : 0;
                dw_rel_build_ack(&p->rel, &h,
                                 room > DW_DGRAM_MAX_SACK ? DW_DGRAM_MAX_SACK : (unsigned)room);
        }
        ssize_t hl =
            h.sack_count ? dw_dgram_encode(&h, t->hdr, sizeof(t->hdr)) : rd_put_hdr(&h, t->hdr);
        if (hl < 0)
                return -EINVAL;
        ssize_t dl = rd_put_ddp(&r, t->hdr + hl);
        memcpy(t->hdr + hl + dl, ext, extlen);
        size_t hlen = (size_t)hl + (size_t)dl + extlen;
        if (plen <= RD_COPY_MAX && hlen <= RD_HDR_CAP) {
                uint8_t *q = t->hdr + hlen;
                for (int i = 0; i < npay; i++) {
                        memcpy(q, pay[i].iov_base, pay[i].iov_len);
                        q += pay[i].iov_len;
                }
                if (imm) {
                        memcpy(q, t->imm, sizeof(t->imm));
                        q += sizeof(t->imm);
                }
                rd_slot_whole(t, q);
                goto filled;
        }
        int n = 0;
        t->iov[n].iov_base = t->hdr;
        t->iov[n].iov_len = hlen;
        n++;
        for (int i = 0; i < npay; i++)
                t->iov[n++] = pay[i];
        if (imm) {
                t->iov[n].iov_base = t->imm;
                t->iov[n].iov_len = sizeof(t->imm);
                n++;
        }
        uint32_t st = dw_crc32c_update_iov(dw_crc32c_init(), t->iov, (size_t)n);
        dw_dgram_crc_trailer(t->crc, st);
        t->iov[n].iov_base = t->crc;
        t->iov[n].iov_len = sizeof(t->crc);
        n++;
        t->iovcnt = n;
        t->dlen = 0;
        for (int i = 0; i < n; i++)
                t->dlen += (uint32_t)t->iov[i].iov_len;
filled:
        rd_slot_for(t, p, psn, cookie, (uint32_t)plen);
        return 0;
}

static bool rd_backpressure(int r)
{
        return r == -EAGAIN || r == -ENOBUFS;
}

/* Sends one datagram (fault hook when on). Network errors (ICMP) count as
 * sent: the datagram is lost and rel/ recovers or gives up. */
static int rd_send_one(struct dw_device *dev, const struct iovec *iov, int n,
                       const struct sockaddr_in *dst)
{
        int r;
        if (dev->fault_on)
                r = dw_fault_tx(&dev->fault, iov, n, dst, sizeof(*dst), dw_now_ns(), dw_udp_send_fn,
                                &dev->udp, &dev->ctr);
        else
                r = dw_udp_send(&dev->udp, iov, n, dst);
        if (r >= 0 || !rd_backpressure(r))
                return 0;
        dev->ctr.tx_backpressure++;
        return r;
}

static int rd_send_ctrl(struct dw_rd_peer *p, struct dw_dgram_hdr *h)
{
        struct dw_qp *qp = p->s->qp;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN + DW_DGRAM_CRC_LEN];
        h->dst_qpn = p->rqpn;
        h->src_qpn = qp->qpn;
        ssize_t n = dw_dgram_encode(h, buf, sizeof(buf));
        if (n < 0)
                return 0;
        n = dw_dgram_packet_seal(buf, (size_t)n, sizeof(buf));
        if (n < 0)
                return 0;
        struct iovec iov = {buf, (size_t)n};
        struct sockaddr_in dst = {
            .sin_family = AF_INET, .sin_addr.s_addr = p->ip, .sin_port = p->port};
        return rd_send_one(qp->dev, &iov, 1, &dst);
}

static void rd_send_nak(struct dw_rd_peer *p, uint32_t psn, uint8_t code)
{
        struct dw_dgram_hdr h = {0};
        if (code == DW_DGRAM_NAK_RNR) {
                dw_rel_build_rnr_nak(&h, psn, 0);
                h.flags |= DW_DGRAM_F_RD;
        } else {
                h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_NAK;
                h.nak_code = code;
                h.ack_psn = psn;
        }
        h.psn = p->rel.snd_nxt;
        rd_send_ctrl(p, &h);
}

/* ---------------------------------------------------------------- rel/ callbacks */

static void ops_acked(void *ctx, uint32_t psn, uint64_t cookie)
{
        struct dw_rd_peer *p = ctx;
        struct dw_rd_qp *s = p->s;
        (void)psn;
        if (ck_kind(cookie) == RD_CK_SQ) {
                struct dw_wqe *w = &s->qp->sq.ring[ck_slot(cookie)];
                w->bytes_acked++;
                rd_check_done(s, w);
        } else {
                struct rd_irq *e = &s->irq[ck_slot(cookie)];
                e->acked++;
                if (e->acked >= e->nseg && e->sent >= e->nseg)
                        e->peer = NULL;
        }
}

/* Retransmissions and ACK-only datagrams one timer walk may send. Timers of
 * many pseudo-streams expire together (they started together): sent in one
 * burst they overflow the peer's socket buffer and are lost again, in step,
 * until the retry limit. Beyond the cap the callbacks report back-pressure:
 * rel/ keeps the work pending, without counting a retry, for the next step. */
#define RD_CTL_PER_WALK DW_PROGRESS_BUDGET

static int ops_retransmit(void *ctx, uint32_t psn, uint64_t cookie)
{
        struct dw_rd_peer *p = ctx;
        struct dw_device *dev = p->s->qp->dev;
        struct rd_txslot *t = &rdd(dev)->rslot;
        if (rdd(dev)->ctl_sent >= RD_CTL_PER_WALK)
                return -EAGAIN;
        rdd(dev)->ctl_sent++;
        int r = rd_build(p, cookie, psn, false, t);
        if (r < 0)
                return r;
        r = rd_send_one(dev, t->iov, t->iovcnt, &t->dst);
        if (r < 0)
                return r;
        dev->ctr.retransmits++;
        p->s->qp->ctr.retransmits++;
        dev->ctr.tx_packets++;
        return 0;
}

static int rd_send_ack(struct dw_rd_peer *p)
{
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD, .psn = p->rel.snd_nxt};
        dw_rel_build_ack(&p->rel, &h, DW_DGRAM_MAX_SACK);
        return rd_send_ctrl(p, &h);
}

static int ops_send_ack(void *ctx)
{
        struct dw_rd_peer *p = ctx;
        struct dw_rd_dev *d = rdd(p->s->qp->dev);
        if (d->ctl_sent >= RD_CTL_PER_WALK)
                return -EAGAIN;
        d->ctl_sent++;
        return rd_send_ack(p);
}

static const struct dw_rel_ops rd_ops = {
    .acked = ops_acked,
    .retransmit = ops_retransmit,
    .send_ack = ops_send_ack,
};

/* ---------------------------------------------------------------- transmit */

static bool rd_room(struct dw_rd_peer *p, uint64_t now)
{
        if (p->dead)
                return false;
        if (!p->rel.ring && !rd_ring_get(rdd(p->s->qp->dev), p))
                return false;
        return dw_rel_tx_can_send(&p->rel, now) &&
               dw_rel_tx_inflight(&p->rel) + p->batch < DW_REL_DEF_WINDOW;
}

static uint32_t rd_ord(const struct dw_rd_qp *s)
{
        const struct dw_qp *qp = s->qp;
        if ((qp->attr_mask_set & DIWARP_QP_MAX_QP_RD_ATOMIC) && qp->attr.max_rd_atomic &&
            qp->attr.max_rd_atomic < RD_MAX_ORQ)
                return qp->attr.max_rd_atomic;
        return RD_MAX_ORQ;
}

/* Next SQ segment into t. 1 built, 0 nothing (empty or blocked), 2 progress
 * without a packet (Local Invalidate), -1 the QP failed. */
static int rd_next_sq(struct dw_rd_qp *s, uint64_t now, int nbuilt, struct rd_txslot *t)
{
        struct dw_qp *qp = s->qp;
        struct dw_wqe *w = dw_wq_at(&qp->sq, s->tx_idx);
        if (!w)
                return 0;
        if (w->opcode == DIWARP_WR_LOCAL_INV) {
                if (nbuilt)
                        return 0;
                enum dw_prot_status st =
                    dw_mr_invalidate_status(&qp->dev->mrs, w->invalidate_rkey, qp->pd);
                s->tx_idx++;
                s->tx_seg = 0;
                if (st != DW_PROT_OK) {
                        dw_warn("RD QP %#x: Local Invalidate of STag %#x: %s", qp->qpn,
                                w->invalidate_rkey, dw_prot_status_str(st));
                        rd_complete_through(s, w, DIWARP_WC_LOC_PROT_ERR);
                        dw_qp_to_error(qp, -1);
                        return -1;
                }
                w->status = DIWARP_WC_SUCCESS;
                w->byte_len = 0;
                w->flags |= DW_WQE_DONE | RD_W_TXALL;
                rd_retire(s);
                return 2;
        }
        struct dw_rd_peer *p = w->priv;
        if (!p)
                return 0;
        /* SQD: a message already on the wire finishes, no new one starts. */
        if (s->tx_seg == 0 && qp->state == DIWARP_QPS_SQD)
                return 0;
        if (s->tx_seg == 0) {
                if ((w->send_flags & DIWARP_SEND_FENCE) && s->norq + s->orq_building)
                        return 0;
                if (is_read_like(w->opcode) && s->norq + s->orq_building >= rd_ord(s))
                        return 0;
        }
        if (!rd_room(p, now))
                return 0;
        uint32_t psn = p->rel.snd_nxt + p->batch;
        bool last_seg = s->tx_seg + 1 >= w->ts_ns;
        bool ackreq = dw_rel_tx_inflight(&p->rel) + p->batch + 1 >= DW_REL_DEF_WINDOW ||
                      (last_seg && s->tx_idx + 1 >= dw_wq_count(&qp->sq));
        uint32_t slot = (uint32_t)(w - qp->sq.ring);
        int r = rd_build(p, rd_cookie(RD_CK_SQ, slot, s->tx_seg), psn, ackreq, t);
        if (r < 0) {
                dw_warn("RD QP %#x: send WR %#llx: local protection error (lkey)", qp->qpn,
                        (unsigned long long)w->wr_id);
                rd_complete_through(s, w, DIWARP_WC_LOC_PROT_ERR);
                dw_qp_to_error(qp, -1);
                return -1;
        }
        t->save_idx = s->tx_idx;
        t->save_seg = s->tx_seg;
        p->batch++;
        if (is_read_like(w->opcode) && s->tx_seg == 0)
                s->orq_building++;
        if (last_seg) {
                s->tx_idx++;
                s->tx_seg = 0;
        } else {
                s->tx_seg++;
        }
        return 1;
}

static int rd_next_irq(struct dw_rd_qp *s, uint64_t now, struct rd_txslot *t)
{
        for (uint32_t k = 0; k < s->fifo_count; k++) {
                uint32_t idx = s->fifo[(s->fifo_head + k) % RD_MAX_IRQ];
                struct rd_irq *e = &s->irq[idx];
                if (!e->peer || e->next_seg >= e->nseg)
                        continue;
                struct dw_rd_peer *p = e->peer;
                if (!rd_room(p, now))
                        return 0;
                uint32_t psn = p->rel.snd_nxt + p->batch;
                bool ackreq = dw_rel_tx_inflight(&p->rel) + p->batch + 1 >= DW_REL_DEF_WINDOW ||
                              e->next_seg + 1 >= e->nseg;
                int r = rd_build(p, rd_cookie(RD_CK_IRQ, idx, e->next_seg), psn, ackreq, t);
                if (r < 0) {
                        rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, DIWARP_EVENT_QP_ACCESS_ERR,
                                     "RDMA Read source no longer accessible");
                        return -1;
                }
                t->save_idx = idx;
                t->save_seg = e->next_seg;
                p->batch++;
                e->next_seg++;
                return 1;
        }
        return 0;
}

static void rd_commit(struct dw_rd_qp *s, struct rd_txslot *t, uint64_t now)
{
        struct dw_rd_peer *p = t->peer;
        struct dw_qp *qp = s->qp;
        dw_rel_tx_sent(&p->rel, t->psn, t->cookie, now);
        if (t->dlen > rdd(qp->dev)->dgram_max)
                rdd(qp->dev)->dgram_max = t->dlen;
        qp->ctr.tx_packets++;
        qp->ctr.tx_bytes += t->bytes;
        qp->dev->ctr.tx_packets++;
        qp->dev->ctr.tx_bytes += t->bytes;
        if (ck_kind(t->cookie) == RD_CK_SQ) {
                struct dw_wqe *w = &qp->sq.ring[ck_slot(t->cookie)];
                w->bytes_done++;
                if (is_read_like(w->opcode) && !(w->flags & RD_W_INORQ) && s->norq < RD_MAX_ORQ) {
                        s->orq[s->norq++] = w;
                        w->flags |= RD_W_INORQ;
                }
                if (w->bytes_done >= w->ts_ns)
                        w->flags |= RD_W_TXALL;
        } else {
                struct rd_irq *e = &s->irq[ck_slot(t->cookie)];
                e->sent++;
                while (s->fifo_count) {
                        struct rd_irq *h = &s->irq[s->fifo[s->fifo_head]];
                        if (h->peer && h->sent < h->nseg)
                                break;
                        s->fifo_head = (s->fifo_head + 1) % RD_MAX_IRQ;
                        s->fifo_count--;
                }
        }
        rd_activate(p);
}

/* How many slots from i one GSO send can carry: same peer address, the size
 * of slot i for all but the last (which may be shorter), within the kernel's
 * segment and byte limits. *gso = that size. */
static int rd_gso_run(const struct dw_rd_dev *d, int i, int n, uint32_t *gso)
{
        const struct rd_txslot *a = &d->slot[i];
        uint32_t L = a->dlen, total = L;
        int k = 1;
        *gso = L;
        if (L > UINT16_MAX)
                return 1;
        while (i + k < n && k < DW_UDP_GSO_MAX_SEGS) {
                const struct rd_txslot *t = &d->slot[i + k];
                if (t->dst.sin_addr.s_addr != a->dst.sin_addr.s_addr ||
                    t->dst.sin_port != a->dst.sin_port || t->dlen > L ||
                    total + t->dlen > DW_UDP_GSO_MAX_BYTES)
                        break;
                total += t->dlen;
                k++;
                if (t->dlen < L)
                        break; /* a shorter one ends the super-datagram */
        }
        return k;
}

/* Sends slots [0, n) in order (no fault injection): runs of 2 or more go as
 * one GSO sendmsg while the socket takes UDP_SEGMENT, the rest with
 * sendmmsg. Returns how many were sent; fewer than n means back-pressure.
 * Network errors count as sent (lost: rel/ recovers). */
static int rd_send_batch(struct dw_device *dev, struct dw_rd_dev *d, int n)
{
        int sent = 0;
        while (sent < n) {
                bool gso = dw_udp_gso_on(&dev->udp);
                uint32_t L;
                int k = gso ? rd_gso_run(d, sent, n, &L) : 1;
                int r;
                if (k >= 2) {
                        /* Every slot but the last is exactly L bytes, so the
                         * kernel's cuts at L-byte boundaries fall between them. */
                        int c = 0;
                        for (int j = 0; j < k; j++) {
                                const struct rd_txslot *t = &d->slot[sent + j];
                                memcpy(d->gso_iov + c, t->iov, (size_t)t->iovcnt * sizeof(*t->iov));
                                c += t->iovcnt;
                        }
                        r = dw_udp_send_gso(&dev->udp, d->gso_iov, c, &d->slot[sent].dst,
                                            (uint16_t)L);
                        if (r == -EOPNOTSUPP)
                                continue; /* GSO now off: the same slots the ordinary way */
                        if (r >= 0 || !rd_backpressure(r)) {
                                sent += k;
                                continue;
                        }
                        dev->ctr.tx_backpressure++;
                        break;
                }
                /* Singles up to the next run worth a GSO send: one sendmmsg. */
                int j = sent + 1;
                while (j < n && j - sent < DW_UDP_TX_BATCH &&
                       !(gso && rd_gso_run(d, j, n, &L) >= 2))
                        j++;
                for (int i = sent; i < j; i++)
                        d->msgs[i] = (struct dw_udp_msg){.iov = d->slot[i].iov,
                                                         .iovcnt = d->slot[i].iovcnt,
                                                         .dst = &d->slot[i].dst};
                r = dw_udp_send_batch(&dev->udp, d->msgs + sent, j - sent);
                if (r > 0) {
                        sent += r;
                        continue;
                }
                if (rd_backpressure(r)) {
                        dev->ctr.tx_backpressure++;
                        break;
                }
                sent++; /* lost to a network error: rel/ recovers */
        }
        return sent;
}

static void rd_tx_wait(struct dw_device *dev, bool wait)
{
        struct dw_rd_dev *d = rdd(dev);
        if (d->tx_wait == wait)
                return;
        d->tx_wait = wait;
        dw_progress_tx_wait(dev, wait);
}

/* Transmits new segments of one QP. Returns work; *blocked when the socket
 * pushed back. */
static int rd_tx_qp(struct dw_rd_qp *s, int budget, bool *blocked)
{
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        struct dw_rd_dev *d = rdd(dev);
        int work = 0;

        while (work < budget) {
                if (qp->state != DIWARP_QPS_RTS && qp->state != DIWARP_QPS_SQD &&
                    !(s->rc && qp->state == DIWARP_QPS_RTR))
                        return work;
                /* Everything went in the previous round (the common case of
                 * one message): no clock read for an empty one. */
                if (work && dw_wq_count(&qp->sq) <= s->tx_idx && !s->fifo_count)
                        return work;
                uint64_t now = rd_clock(dev);
                int n = 0;
                uint32_t bytes = 0;
                bool sq_off = false, irq_off = s->fifo_count == 0;
                s->orq_building = 0;
                /* With GSO a step builds up to 64 datagrams (a few super-
                 * datagrams' worth), fewer when they are large. */
                int nmax = !dev->fault_on && dw_udp_gso_on(&dev->udp) ? RD_BATCH : DW_UDP_TX_BATCH;
                while (n < nmax && bytes < RD_BATCH_BYTES && !(sq_off && irq_off)) {
                        bool use_irq = !irq_off && (s->irq_turn || sq_off);
                        int r = use_irq ? rd_next_irq(s, now, &d->slot[n])
                                        : rd_next_sq(s, now, n, &d->slot[n]);
                        if (r < 0) {
                                n = -1;
                                break;
                        }
                        if (r == 0) {
                                if (use_irq)
                                        irq_off = true;
                                else
                                        sq_off = true;
                                continue;
                        }
                        if (r == 2) {
                                work++;
                                continue;
                        }
                        s->irq_turn = !use_irq;
                        bytes += d->slot[n].dlen;
                        n++;
                }
                if (n < 0) {
                        /* The QP failed while building: forget the batch. */
                        for (int i = 0; i < RD_BATCH; i++) {
                                if (d->slot[i].peer) {
                                        d->slot[i].peer->batch = 0;
                                        rd_ring_idle(d, d->slot[i].peer);
                                }
                                d->slot[i].peer = NULL;
                        }
                        return work + 1;
                }
                if (n == 0)
                        break;
                int sent = 0;
                if (dev->fault_on || n == 1) {
                        for (; sent < n; sent++)
                                if (rd_send_one(dev, d->slot[sent].iov, d->slot[sent].iovcnt,
                                                &d->slot[sent].dst) < 0)
                                        break;
                } else {
                        sent = rd_send_batch(dev, d, n);
                }
                for (int i = 0; i < n; i++)
                        d->slot[i].peer->batch = 0;
                for (int i = 0; i < sent; i++)
                        rd_commit(s, &d->slot[i], now);
                /* Roll the cursors back to the first datagram the socket refused. */
                for (int i = n - 1; i >= sent; i--) {
                        struct rd_txslot *t = &d->slot[i];
                        if (ck_kind(t->cookie) == RD_CK_SQ) {
                                s->tx_idx = t->save_idx;
                                s->tx_seg = t->save_seg;
                        } else {
                                s->irq[t->save_idx].next_seg = t->save_seg;
                        }
                }
                for (int i = sent; i < n; i++)
                        rd_ring_idle(d, d->slot[i].peer); /* refused: maybe nothing in flight */
                for (int i = 0; i < n; i++)
                        d->slot[i].peer = NULL;
                work += sent;
                if (sent < n) {
                        qp->ctr.tx_backpressure++;
                        *blocked = true;
                        return work;
                }
        }
        return work;
}

/* ---------------------------------------------------------------- receive */

enum rd_verdict { RV_ACCEPT, RV_DROP, RV_RNR, RV_NAK, RV_GONE };

/* True when `need` unbound receive WQEs are in qp->rq. On an SRQ, qp->rq is
 * the QP's own ring of WQEs taken from the SRQ: they are taken only when a
 * message binds them, all or none, so an RNR leaves the SRQ whole for the
 * other QPs. */
static bool rd_rq_have(struct dw_rd_qp *s, uint32_t need)
{
        struct dw_qp *qp = s->qp;
        uint32_t have = dw_wq_count(&qp->rq) - s->rq_bound;
        if (have >= need)
                return true;
        if (!qp->srq)
                return false;
        struct dw_srq *q = &qp->srq->q;
        if (dw_wq_count(&q->wq) < need - have ||
            qp->rq.capacity - dw_wq_count(&qp->rq) < need - have)
                return false;
        for (; have < need; have++) {
                struct dw_wqe *w = dw_wq_reserve(&qp->rq);
                bool limit = false;
                if (!w || dw_srq_take(q, w, &limit) < 0)
                        return false;
                w->flags = 0;
                w->priv = NULL;
                dw_wq_commit(&qp->rq);
                if (limit)
                        dw_async_srq(qp->dev, qp->srq, DIWARP_EVENT_SRQ_LIMIT_REACHED);
        }
        return true;
}

/* Receive WQE bound to (p, msn), binding WQEs in MSN order first. NULL:
 * not enough receive WQEs posted (RNR). */
static struct dw_wqe *rd_rx_bind(struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t msn)
{
        struct dw_qp *qp = s->qp;
        if (dw_psn_diff(msn, p->rx_bind) >= 0) {
                uint32_t need = msn - p->rx_bind + 1;
                if (!rd_rq_have(s, need))
                        return NULL;
                for (uint32_t m = p->rx_bind; need--; m++) {
                        struct dw_wqe *w = dw_wq_at(&qp->rq, s->rq_bound++);
                        w->priv = p;
                        w->msn = m;
                        w->flags |= RD_W_BOUND;
                        w->byte_len = 0;
                }
                p->rx_bind = msn + 1;
        }
        struct dw_wqe *w;
        for (uint32_t i = 0; i < s->rq_bound && (w = dw_wq_at(&qp->rq, i)); i++)
                if (w->priv == p && w->msn == msn && !(w->flags & DW_WQE_DONE))
                        return w;
        return NULL;
}

static void rd_rq_pop_done(struct dw_rd_qp *s)
{
        struct dw_wqe *w;
        while ((w = dw_wq_head(&s->qp->rq)) && (w->flags & DW_WQE_DONE)) {
                dw_wq_pop(&s->qp->rq);
                if (s->rq_bound)
                        s->rq_bound--;
        }
}

static void rd_recv_fail(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                         enum diwarp_wc_status st)
{
        struct diwarp_wc wc = {
            .wr_id = w->wr_id, .status = st, .opcode = DIWARP_WC_RECV, .src_qp = p->rqpn};
        w->flags |= DW_WQE_DONE;
        dw_qp_complete_recv(s->qp, &wc, false);
        rd_rq_pop_done(s);
}

/* Completes, in order, every message of p whose last PSN is below the cursor. */
static void rd_rx_complete(struct dw_rd_qp *s, struct dw_rd_peer *p)
{
        struct dw_qp *qp = s->qp;
        uint32_t cur = dw_rel_rx_cursor(&p->rel);
        for (;;) {
                struct dw_wqe *w = NULL, *x;
                for (uint32_t i = 0; i < s->rq_bound && (x = dw_wq_at(&qp->rq, i)); i++)
                        if (x->priv == p && x->msn == p->rx_done && !(x->flags & DW_WQE_DONE)) {
                                w = x;
                                break;
                        }
                if (!w || !(w->flags & RD_W_LAST) || !dw_psn_before(w->psn, cur))
                        break;
                struct diwarp_wc wc = {
                    .wr_id = w->wr_id,
                    .status = DIWARP_WC_SUCCESS,
                    .opcode =
                        (w->flags & RD_W_WIMM) ? DIWARP_WC_RECV_RDMA_WITH_IMM : DIWARP_WC_RECV,
                    .byte_len = w->byte_len,
                    .src_qp = p->rqpn,
                };
                if (w->flags & RD_W_IMM) {
                        wc.wc_flags |= DIWARP_WC_WITH_IMM;
                        wc.imm_data = w->imm_data;
                }
                if (w->flags & RD_W_INV) {
                        if (dw_mr_invalidate_status(&qp->dev->mrs, w->invalidate_rkey, qp->pd) ==
                            DW_PROT_OK) {
                                wc.wc_flags |= DIWARP_WC_WITH_INV;
                                wc.invalidated_rkey = w->invalidate_rkey;
                        } else {
                                wc.status = DIWARP_WC_REM_INV_REQ_ERR;
                        }
                }
                w->flags |= DW_WQE_DONE;
                p->rx_done++;
                dw_qp_complete_recv(qp, &wc, (w->flags & RD_W_SE) != 0);
        }
        rd_rq_pop_done(s);
        for (uint32_t i = 0; i < s->norq;) {
                struct dw_wqe *w = s->orq[i];
                if (w->priv == p && (w->flags & RD_W_LAST) && dw_psn_before(w->psn, cur)) {
                        w->flags |= RD_W_RESP;
                        s->orq[i] = s->orq[--s->norq];
                        w->flags &= ~RD_W_INORQ;
                        rd_check_done(s, w);
                        continue;
                }
                i++;
        }
}

static uint64_t masked_add(uint64_t a, uint64_t b, uint64_t mask)
{
        /* RFC 7306 field-wise add: a 1 in the mask marks the top bit of a field,
         * so carries stop there. */
        uint64_t out = 0;
        unsigned carry = 0;
        for (unsigned i = 0; i < 64; i++) {
                unsigned sum = (unsigned)((a >> i) & 1) + (unsigned)((b >> i) & 1) + carry;
                out |= (uint64_t)(sum & 1) << i;
                carry = (mask >> i) & 1 ? 0 : sum >> 1;
        }
        return out;
}

static uint64_t rd_atomic_exec(uint64_t *p, const struct dw_rdmap_atomic_req *a)
{
        uint64_t old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
        for (;;) {
                uint64_t nv;
                if (a->aopcode == DW_ATOMIC_FETCH_ADD)
                        nv = a->add_swap_mask ? masked_add(old, a->add_swap_data, a->add_swap_mask)
                                              : old + a->add_swap_data;
                else if (a->aopcode == DW_ATOMIC_CMP_SWAP &&
                         (old & a->compare_mask) != (a->compare_data & a->compare_mask))
                        return old;
                else
                        nv = (old & ~a->add_swap_mask) | (a->add_swap_data & a->add_swap_mask);
                if (__atomic_compare_exchange_n(p, &old, nv, false, __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST))
                        return old;
        }
}

static struct dw_wqe *rd_orq_find(struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t msn,
                                  bool atomic)
{
        for (uint32_t i = 0; i < s->norq; i++) {
                struct dw_wqe *w = s->orq[i];
                if (w->priv == p && w->msn == msn && (w->opcode != DIWARP_WR_RDMA_READ) == atomic)
                        return w;
        }
        return NULL;
}

static int rd_irq_alloc(struct dw_rd_qp *s)
{
        if (s->fifo_count >= RD_MAX_IRQ)
                return -1;
        for (int i = 0; i < RD_MAX_IRQ; i++)
                if (!s->irq[i].peer)
                        return i;
        return -1;
}

static void rd_irq_queue(struct dw_rd_qp *s, int idx)
{
        s->fifo[(s->fifo_head + s->fifo_count) % RD_MAX_IRQ] = (uint32_t)idx;
        s->fifo_count++;
}

/* One NEW DATA segment: check, place. */
static enum rd_verdict rd_rx_segment(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                     const struct dw_dgram_hdr *h, uint8_t *pkt,
                                     const struct dw_dgram_layout *lay, uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        const char *why = NULL;
        struct dw_rdmap_hdr r;
        ssize_t rl = dw_rdmap_decode(pkt + lay->seg_off, lay->seg_len, &r, &why);
        if (rl < 0)
                return RV_DROP;
        uint8_t *pay = pkt + lay->seg_off + rl;
        size_t plen = lay->seg_len - (size_t)rl;
        bool has_imm = h->flags & DW_DGRAM_F_IMM;
        struct dw_rdmap_hdr ri;
        uint32_t imm_val = 0, imm_len = 0;
        if (has_imm) {
                if (dw_rdmap_decode(pkt + lay->imm_off, DW_DGRAM_IMM_MSG_LEN, &ri, &why) < 0 ||
                    (ri.opcode != DW_RDMAP_IMM_DATA && ri.opcode != DW_RDMAP_IMM_DATA_SE) ||
                    !r.ddp.last)
                        return RV_DROP;
                memcpy(&imm_val, pkt + lay->imm_off + DW_DGRAM_DDP_UNTAGGED_LEN, 4);
                imm_len = dw_get_be32(pkt + lay->imm_off + DW_DGRAM_DDP_UNTAGGED_LEN + 4);
        }
        /* Requests must carry our Q_Key on an RD QP; responses belong to a
         * stream we opened and carry none. */
        bool request = r.opcode != DW_RDMAP_READ_RESP && r.opcode != DW_RDMAP_ATOMIC_RESP;
        if (!s->rc && request && h->qkey != qp->attr.qkey) {
                dev->ctr.rx_dropped_qkey++;
                qp->ctr.rx_dropped_qkey++;
                return RV_DROP;
        }

        switch (r.opcode) {
        case DW_RDMAP_SEND:
        case DW_RDMAP_SEND_SE:
        case DW_RDMAP_SEND_INVAL:
        case DW_RDMAP_SEND_SE_INVAL: {
                int32_t ahead = dw_psn_diff(r.ddp.msn, p->rx_done);
                if (ahead < 0 || ahead > 65536)
                        return RV_DROP;
                struct dw_wqe *w = rd_rx_bind(s, p, r.ddp.msn);
                if (!w)
                        return RV_RNR;
                int e = dw_qp_scatter(qp, w, r.ddp.mo, pay, plen);
                if (e == -EMSGSIZE) {
                        dw_warn("RD QP %#x: Send of more than the %llu-byte receive WR %#llx",
                                qp->qpn, (unsigned long long)w->total_len,
                                (unsigned long long)w->wr_id);
                        rd_recv_fail(s, p, w, DIWARP_WC_LOC_LEN_ERR);
                        *nak = DW_DGRAM_NAK_INVALID;
                        return RV_NAK;
                }
                if (e < 0) {
                        dw_warn("RD QP %#x: receive WR %#llx: local protection error (lkey)",
                                qp->qpn, (unsigned long long)w->wr_id);
                        rd_recv_fail(s, p, w, DIWARP_WC_LOC_PROT_ERR);
                        *nak = DW_DGRAM_NAK_REM_OP;
                        return RV_NAK;
                }
                if (r.ddp.last) {
                        w->psn = h->psn;
                        w->byte_len = r.ddp.mo + (uint32_t)plen;
                        w->flags |= RD_W_LAST;
                        if (r.opcode == DW_RDMAP_SEND_SE || r.opcode == DW_RDMAP_SEND_SE_INVAL)
                                w->flags |= RD_W_SE;
                        if (r.opcode == DW_RDMAP_SEND_INVAL || r.opcode == DW_RDMAP_SEND_SE_INVAL) {
                                w->flags |= RD_W_INV;
                                w->invalidate_rkey = r.inval_stag;
                        }
                        if (has_imm) {
                                w->flags |= RD_W_IMM;
                                w->imm_data = imm_val;
                                if (ri.opcode == DW_RDMAP_IMM_DATA_SE)
                                        w->flags |= RD_W_SE;
                        }
                }
                qp->ctr.rx_bytes += plen;
                return RV_ACCEPT;
        }
        case DW_RDMAP_WRITE: {
                struct dw_wqe *w = NULL;
                if (has_imm) {
                        int32_t ahead = dw_psn_diff(ri.ddp.msn, p->rx_done);
                        if (ahead < 0 || ahead > 65536)
                                return RV_DROP;
                }
                uint8_t *host = NULL;
                enum dw_prot_status st = DW_PROT_OK;
                if (plen && !qp_allows(qp, DIWARP_ACCESS_REMOTE_WRITE))
                        st = DW_PROT_ACCESS;
                else
                        st = dw_mr_check_remote(&dev->mrs, r.ddp.stag, qp->pd,
                                                DIWARP_ACCESS_REMOTE_WRITE, r.ddp.to, plen, &host);
                if (st != DW_PROT_OK) {
                        dw_warn("RD QP %#x: RDMA Write to STag %#x TO %#llx len %zu: %s", qp->qpn,
                                r.ddp.stag, (unsigned long long)r.ddp.to, plen,
                                dw_prot_status_str(st));
                        dev->ctr.rx_dropped_protection++;
                        qp->ctr.rx_dropped_protection++;
                        *nak = DW_DGRAM_NAK_REM_ACCESS;
                        return RV_NAK;
                }
                if (has_imm) {
                        w = rd_rx_bind(s, p, ri.ddp.msn);
                        if (!w)
                                return RV_RNR;
                }
                struct dw_rd_dev *d = rdd(dev);
                if (plen >= RD_DIRECT_MIN && !r.ddp.last && !has_imm) {
                        d->rx_big = true;
                        d->rx_next =
                            (struct rd_rx_next){p, h->psn + 1, r.ddp.stag, r.ddp.to + plen, false};
                } else if (d->rx_next.peer == p) {
                        d->rx_next.peer = NULL;
                }
                if (plen && !d->rx_placed)
                        memcpy(host, pay, plen);
                if (w) {
                        w->psn = h->psn;
                        w->byte_len = imm_len;
                        w->imm_data = imm_val;
                        w->flags |= RD_W_LAST | RD_W_IMM | RD_W_WIMM;
                        if (ri.opcode == DW_RDMAP_IMM_DATA_SE)
                                w->flags |= RD_W_SE;
                }
                qp->ctr.rx_bytes += plen;
                return RV_ACCEPT;
        }
        case DW_RDMAP_READ_REQ: {
                struct dw_rdmap_rreq rq;
                if (dw_rdmap_rreq_decode(pay, plen, &rq, &why) < 0) {
                        *nak = DW_DGRAM_NAK_INVALID;
                        return RV_NAK;
                }
                enum dw_prot_status st = DW_PROT_OK;
                if (rq.rdma_rd_sz && !qp_allows(qp, DIWARP_ACCESS_REMOTE_READ))
                        st = DW_PROT_ACCESS;
                else
                        st = dw_mr_check_remote(&dev->mrs, rq.src_stag, qp->pd,
                                                DIWARP_ACCESS_REMOTE_READ, rq.src_to, rq.rdma_rd_sz,
                                                NULL);
                if (st != DW_PROT_OK) {
                        dw_warn("RD QP %#x: RDMA Read of STag %#x TO %#llx len %u: %s", qp->qpn,
                                rq.src_stag, (unsigned long long)rq.src_to, rq.rdma_rd_sz,
                                dw_prot_status_str(st));
                        dev->ctr.rx_dropped_protection++;
                        qp->ctr.rx_dropped_protection++;
                        *nak = DW_DGRAM_NAK_REM_ACCESS;
                        return RV_NAK;
                }
                int idx = rd_irq_alloc(s);
                if (idx < 0)
                        return RV_RNR;
                struct rd_irq *e = &s->irq[idx];
                *e = (struct rd_irq){.peer = p,
                                     .msn = r.ddp.msn,
                                     .sink_stag = rq.sink_stag,
                                     .sink_to = rq.sink_to,
                                     .len = rq.rdma_rd_sz,
                                     .src_stag = rq.src_stag,
                                     .src_to = rq.src_to,
                                     .nseg = (uint32_t)rd_nseg(rq.rdma_rd_sz, rd_peer_seg(p))};
                rd_irq_queue(s, idx);
                return RV_ACCEPT;
        }
        case DW_RDMAP_ATOMIC_REQ: {
                struct dw_rdmap_atomic_req ar;
                if (dw_rdmap_atomic_req_decode(pay, plen, &ar, &why) < 0) {
                        *nak = DW_DGRAM_NAK_INVALID;
                        return RV_NAK;
                }
                uint8_t *host = NULL;
                enum dw_prot_status st = DW_PROT_OK;
                if (!qp_allows(qp, DIWARP_ACCESS_REMOTE_ATOMIC))
                        st = DW_PROT_ACCESS;
                else
                        st =
                            dw_mr_check_remote(&dev->mrs, ar.remote_stag, qp->pd,
                                               DIWARP_ACCESS_REMOTE_ATOMIC, ar.remote_to, 8, &host);
                if (st == DW_PROT_OK && ((uintptr_t)host & 7))
                        st = DW_PROT_BOUNDS;
                if (st != DW_PROT_OK) {
                        dw_warn("RD QP %#x: Atomic on STag %#x TO %#llx: %s", qp->qpn,
                                ar.remote_stag, (unsigned long long)ar.remote_to,
                                dw_prot_status_str(st));
                        dev->ctr.rx_dropped_protection++;
                        qp->ctr.rx_dropped_protection++;
                        *nak = DW_DGRAM_NAK_REM_ACCESS;
                        return RV_NAK;
                }
                int idx = rd_irq_alloc(s);
                if (idx < 0)
                        return RV_RNR;
                struct rd_irq *e = &s->irq[idx];
                /* Executed once, here: rel/ accepts each PSN once, and a
                 * retransmitted response carries the value kept in e. */
                *e = (struct rd_irq){.peer = p,
                                     .atomic = true,
                                     .msn = r.ddp.msn,
                                     .req_id = ar.req_id,
                                     .orig = rd_atomic_exec((uint64_t *)host, &ar),
                                     .nseg = 1};
                rd_irq_queue(s, idx);
                return RV_ACCEPT;
        }
        case DW_RDMAP_READ_RESP: {
                struct dw_wqe *w = rd_orq_find(s, p, r.ddp.stag, false);
                if (!w || r.ddp.to > w->total_len || plen > w->total_len - r.ddp.to)
                        return RV_DROP;
                struct dw_rd_dev *d = rdd(dev);
                if (!d->rx_placed && dw_qp_scatter(qp, w, r.ddp.to, pay, plen) < 0) {
                        rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, -1,
                                     "RDMA Read sink fails its lkey check");
                        return RV_GONE;
                }
                if (plen >= RD_DIRECT_MIN && !r.ddp.last && w->num_sge == 1) {
                        d->rx_big = true;
                        d->rx_next =
                            (struct rd_rx_next){p, h->psn + 1, r.ddp.stag, r.ddp.to + plen, true};
                } else if (d->rx_next.peer == p) {
                        d->rx_next.peer = NULL;
                }
                if (r.ddp.last) {
                        w->psn = h->psn;
                        w->flags |= RD_W_LAST;
                }
                qp->ctr.rx_bytes += plen;
                return RV_ACCEPT;
        }
        case DW_RDMAP_ATOMIC_RESP: {
                struct dw_rdmap_atomic_resp ar;
                if (dw_rdmap_atomic_resp_decode(pay, plen, &ar, &why) < 0)
                        return RV_DROP;
                struct dw_wqe *w = rd_orq_find(s, p, ar.req_id, true);
                if (!w)
                        return RV_DROP;
                uint64_t v = ar.orig_data; /* host order, as ibverbs returns it */
                if (dw_qp_scatter(qp, w, 0, &v, 8) < 0) {
                        rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, -1,
                                     "atomic result buffer fails its lkey check");
                        return RV_GONE;
                }
                w->psn = h->psn;
                w->flags |= RD_W_LAST;
                return RV_ACCEPT;
        }
        default:
                return RV_DROP;
        }
}

/* An error NAK for one of our PSNs: the WR that sent it fails, the QP too. */
static void rd_on_error_nak(struct dw_rd_peer *p, const struct dw_dgram_hdr *h)
{
        struct dw_rd_qp *s = p->s;
        struct dw_rel_peer *r = &p->rel;
        uint32_t psn = h->ack_psn;
        if (dw_psn_before(psn, r->snd_una) || !dw_psn_before(psn, r->snd_nxt))
                return; /* stale */
        uint64_t cookie = r->ring[psn & r->ring_mask].cookie;
        enum diwarp_wc_status st = h->nak_code == DW_DGRAM_NAK_REM_ACCESS ? DIWARP_WC_REM_ACCESS_ERR
                                   : h->nak_code == DW_DGRAM_NAK_REM_OP   ? DIWARP_WC_REM_OP_ERR
                                                                        : DIWARP_WC_REM_INV_REQ_ERR;
        char pb[64];
        dw_warn("RD QP %#x peer %s: PSN %#x refused (NAK code %u)", s->qp->qpn,
                peer_str(p, pb, sizeof(pb)), psn, h->nak_code);
        if (ck_kind(cookie) == RD_CK_SQ) {
                rd_complete_through(s, &s->qp->sq.ring[ck_slot(cookie)], st);
                dw_qp_to_error(s->qp, -1);
        } else {
                rd_peer_fail(p, DIWARP_WC_REM_OP_ERR, DIWARP_EVENT_QP_FATAL,
                             "the peer refused a response");
        }
}

/* First two bytes of a single-segment untagged message: DDP control (T = 0,
 * L = 1, DV = 1), then RDMAP control (RV = 1, the opcode). */
#define RD_MSG1(op)                                                                                \
        ((uint16_t)((DW_DDP_CTRL_L | DW_DDP_VERSION) << 8 | DW_RDMAP_VERSION << 6 | (op)))

/* The common receive without the general segment path: the next in-order PSN
 * (no holes behind it) carrying a whole Send (one segment, no Immediate Data,
 * the peer's next MSN) for the receive WR at the head of an RQ on which no
 * message is bound. It gets the checks, placement, accounting and completion
 * that rd_rx_segment and rd_rx_complete would give it; anything else, and any
 * check that fails, returns false before changing state, for the general path
 * to handle (and to report). */
static bool rd_rx_fast(struct dw_rd_qp *s, struct dw_rd_peer *p, const struct dw_dgram_hdr *h,
                       const uint8_t *pkt, const struct dw_dgram_layout *lay, uint64_t now)
{
        struct dw_qp *qp = s->qp;
        const uint8_t *g = pkt + lay->seg_off;
        if (h->psn != p->rel.rcv_nxt || (p->rel.rx_map[0] | p->rel.rx_map[1]) ||
            (h->flags & DW_DGRAM_F_IMM) || lay->seg_len < DW_DGRAM_DDP_UNTAGGED_LEN ||
            s->rq_bound || qp->srq || p->rx_bind != p->rx_done ||
            (!s->rc && h->qkey != qp->attr.qkey))
                return false;
        /* What dw_rdmap_decode and the Send rules accept for such a message:
         * RsvdULP (no Invalidate STag), QN 0 and MO 0 are zero. */
        uint64_t w0 = dw_get_be64(g); /* controls, RsvdULP, QN bytes 0-1 */
        uint16_t c = (uint16_t)(w0 >> 48);
        if ((c != RD_MSG1(DW_RDMAP_SEND) && c != RD_MSG1(DW_RDMAP_SEND_SE)) ||
            (w0 & 0xffffffffffffull) != 0 || (dw_get_be16(g + 8) | dw_get_be32(g + 14)) != 0 ||
            dw_get_be32(g + 10) != p->rx_done)
                return false;
        struct dw_wqe *w = dw_wq_head(&qp->rq);
        const uint8_t *pay = g + DW_DGRAM_DDP_UNTAGGED_LEN;
        size_t plen = lay->seg_len - DW_DGRAM_DDP_UNTAGGED_LEN;
        if (!w || plen > w->total_len)
                return false;
        if (plen) {
                /* dw_qp_scatter at offset 0, the single-SGE case inline */
                uint8_t *host;
                if (w->num_sge != 1 || dw_mr_check_local(&qp->dev->mrs, w->sge[0].lkey, qp->pd,
                                                         DIWARP_ACCESS_LOCAL_WRITE, w->sge[0].addr,
                                                         plen, &host) != DW_PROT_OK) {
                        if (dw_qp_scatter(qp, w, 0, pay, plen) < 0)
                                return false;
                } else {
                        memcpy(host, pay, plen);
                }
        }
        qp->ctr.rx_bytes += plen;
        qp->dev->ctr.rx_packets++;
        qp->ctr.rx_packets++;
        dw_rel_rx_next(&p->rel, h->flags & DW_DGRAM_F_ACKREQ, now); /* psn is the cursor */
        p->rx_bind++;
        p->rx_done++;
        struct diwarp_wc wc = {
            .wr_id = w->wr_id,
            .status = DIWARP_WC_SUCCESS,
            .opcode = DIWARP_WC_RECV,
            .byte_len = (uint32_t)plen,
            .src_qp = p->rqpn,
        };
        w->flags |= DW_WQE_DONE;
        dw_qp_complete_recv(qp, &wc, c == RD_MSG1(DW_RDMAP_SEND_SE));
        dw_wq_pop(&qp->rq);
        return true;
}

void dw_rd_rx(struct dw_device *dev, uint8_t *pkt, size_t body, size_t hl,
              const struct dw_dgram_hdr *h, const struct sockaddr_in *from)
{
        const char *why = NULL;
        rd_ack_flush(rdd(dev)); /* ACKs reach rel/ in arrival order */
        struct dw_qp *qp = dw_qp_lookup(dev, h->dst_qpn);
        if (!qp || !qp->rd) {
                dev->ctr.rx_dropped_no_qp++;
                return;
        }
        struct dw_rd_qp *s = qp->rd;
        bool data = h->flags & DW_DGRAM_F_DATA;
        struct dw_rd_peer *p = rd_peer_find(s, from->sin_addr.s_addr, from->sin_port, h->src_qpn);
        if (p && p->nak_code && data && h->psn == p->nak_psn) {
                /* Error NAKs travel unreliably: answer every copy. */
                rd_send_nak(p, h->psn, p->nak_code);
                return;
        }
        bool ready = qp->state == DIWARP_QPS_RTS || qp->state == DIWARP_QPS_RTR ||
                     qp->state == DIWARP_QPS_SQD || qp->state == DIWARP_QPS_SQE;
        if (!ready || (p && p->dead)) {
                dev->ctr.rx_dropped_no_qp++;
                return;
        }
        struct dw_dgram_layout lay;
        if (dw_dgram_layout(h, hl, body, &lay, &why) < 0) {
                dev->ctr.rx_dropped_malformed++;
                return;
        }
        if (!p) {
                /* First use: only a request from a stranger opens a stream
                 * (RC over RD knows its one peer from RTR). */
                if (s->rc || !data || h->qkey != qp->attr.qkey ||
                    (h->flags & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK))) {
                        dev->ctr.rx_dropped_no_qp++;
                        return;
                }
                p = rd_peer_new(s, from->sin_addr.s_addr, from->sin_port, h->src_qpn,
                                rd_isn(qp->qpn, h->src_qpn), rd_isn(h->src_qpn, qp->qpn));
                if (!p) {
                        dev->ctr.rx_dropped_no_qp++;
                        return;
                }
        }
        /* The first datagram of a step uses the clock read as the step began
         * (dw_rd_rx_clock), the others read it anew. */
        struct dw_rd_dev *d = rdd(dev);
        uint64_t now = d->rx_clock && d->step_no == dev->prog.steps ? d->step_now : rd_clock(dev);
        d->rx_clock = false;
        rd_activate(p);
        /* A Send the fast path takes is placed and completed before the ACK it
         * carries is handled: its receive completion then comes before the send
         * completion that ACK brings, so a ping-pong finds it with one poll. */
        bool placed = data && rd_rx_fast(s, p, h, pkt, &lay, now);
        if ((h->flags & DW_DGRAM_F_NAK) && h->nak_code >= DW_DGRAM_NAK_REM_ACCESS) {
                rd_on_error_nak(p, h);
                return;
        }
        if (h->flags & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK)) {
                if (h->flags & DW_DGRAM_F_NAK && h->nak_code == DW_DGRAM_NAK_RNR) {
                        dev->ctr.rnr_naks++;
                        qp->ctr.rnr_naks++;
                }
                if (placed && rd_ack_holdable(&p->rel, h)) {
                        /* The application answers the Send first; the ACK
                         * waits for its next call, as its completions would
                         * (rd_retire_held). */
                        d->hack = (struct rd_held_ack){p, h->ack_psn, now};
                        if (!d->held_step)
                                d->held_step = dev->prog.steps;
                        return;
                }
                d->hold_retire = placed;
                int r = dw_rel_on_ack(&p->rel, h, now, &rd_ops, p);
                d->hold_retire = false;
                if (qp->state == DIWARP_QPS_ERR)
                        return;
                /* A drained window keeps its ring while the peer has timers
                 * (an exchange goes on); rd_progress_busy takes it back once
                 * the peer is idle. */
                if (r == -EREMOTEIO || r == -ETIMEDOUT) {
                        rd_peer_fail(p,
                                     r == -EREMOTEIO ? DIWARP_WC_RNR_RETRY_EXC_ERR
                                                     : DIWARP_WC_RETRY_EXC_ERR,
                                     DIWARP_EVENT_QP_FATAL, dw_rel_fatal_str(&p->rel));
                        return;
                }
        }
        if (!data || placed)
                return;
        enum dw_rel_verdict v = dw_rel_rx_classify(&p->rel, h->psn);
        if (v != DW_REL_NEW) {
                if (v == DW_REL_DUPLICATE) {
                        dev->ctr.rx_dropped_duplicate++;
                        qp->ctr.rx_dropped_duplicate++;
                        dw_rel_rx_data(&p->rel, h->psn, h->flags & DW_DGRAM_F_ACKREQ, now, &v);
                }
                return;
        }
        uint8_t nak = 0;
        enum rd_verdict rv = rd_rx_segment(s, p, h, pkt, &lay, &nak);
        switch (rv) {
        case RV_ACCEPT: {
                dev->ctr.rx_packets++;
                qp->ctr.rx_packets++;
                uint32_t adv =
                    dw_rel_rx_data(&p->rel, h->psn, h->flags & DW_DGRAM_F_ACKREQ, now, &v);
                if (adv)
                        rd_rx_complete(s, p);
                return;
        }
        case RV_RNR:
                dev->ctr.rx_dropped_no_recv++;
                qp->ctr.rx_dropped_no_recv++;
                rd_send_nak(p, h->psn, DW_DGRAM_NAK_RNR);
                return;
        case RV_NAK:
                p->nak_psn = h->psn;
                p->nak_code = nak;
                rd_send_nak(p, h->psn, nak);
                /* RC semantics: the responder's stream ends too; an RD QP keeps
                 * serving its other peers. */
                if (s->rc && qp->state != DIWARP_QPS_ERR)
                        dw_qp_to_error(qp, nak == DW_DGRAM_NAK_REM_ACCESS
                                               ? DIWARP_EVENT_QP_ACCESS_ERR
                                               : DIWARP_EVENT_QP_REQ_ERR);
                return;
        case RV_DROP:
                dev->ctr.rx_dropped_malformed++;
                return;
        case RV_GONE:
                return;
        }
}

/* The datagram peeked at is not for direct placement: read it alone (a
 * message's short last segment, a Write with Immediate, an ACK), or after a
 * run of such go back to batches until large segments return. */
static int rd_direct_skip(struct dw_rd_dev *d)
{
        if (++d->rx_small < 4)
                return 2;
        d->rx_big = false;
        d->rx_small = 0;
        return 0;
}

/* When large RDMA Write segments (or Read Response segments into a one-SGE
 * sink) are streaming in, the next datagram is peeked at; if it is the one
 * d->rx_next names (same peer stream, the next PSN, not yet received, the same
 * STag and the TO right after the last verified segment), one recvmsg puts its
 * headers in rx_hdr and its payload straight into the target: one copy (the
 * kernel's), as TCP has, instead of two. Its CRC is checked after the
 * placement; a mismatch drops it as in dw_ud_rx (counted in crc_errors). The
 * bytes written before the check can only lie in the range that follows a
 * verified segment of a message still in progress, which the sender
 * retransmits until a verified copy of that PSN is placed there, before the
 * message can complete: a damaged datagram never leaves its bytes anywhere
 * else, whatever its header says. The first segment of each message, and any
 * out of order, take the bounce-buffer path. Every check dw_rd_rx makes before
 * placing is made before the read. */
int dw_rd_rx_direct(struct dw_device *dev)
{
        struct dw_rd_dev *d = rdd(dev);
        if (!d || !d->rx_big || dw_udp_uring_on(&dev->udp))
                return 0;
        struct sockaddr_in from;
        bool train;
        uint8_t *hb = d->rx_hdr;
        int len = dw_udp_peek(&dev->udp, hb, sizeof(d->rx_hdr), &from, &train);
        if (len == -EAGAIN)
                return -1;
        if (len < 0)
                return 0;
        if (train || (size_t)len < RD_DIRECT_MIN + DW_DGRAM_CRC_LEN)
                return rd_direct_skip(d);
        const char *why = NULL;
        struct dw_dgram_hdr h;
        ssize_t hl = dw_dgram_decode(hb, sizeof(d->rx_hdr), &h, &why);
        if (hl < 0 || (h.flags & (DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_IMM |
                                  DW_DGRAM_F_NAK)) != (DW_DGRAM_F_RD | DW_DGRAM_F_DATA))
                return rd_direct_skip(d);
        struct dw_qp *qp = dw_qp_lookup(dev, h.dst_qpn);
        if (!qp || !qp->rd ||
            (qp->state != DIWARP_QPS_RTS && qp->state != DIWARP_QPS_RTR &&
             qp->state != DIWARP_QPS_SQD && qp->state != DIWARP_QPS_SQE))
                return rd_direct_skip(d);
        struct dw_rd_qp *s = qp->rd;
        struct dw_rd_peer *p = rd_peer_find(s, from.sin_addr.s_addr, from.sin_port, h.src_qpn);
        bool read = d->rx_next.read;
        /* Requests carry our Q_Key on an RD QP; responses carry none. */
        if (!p || p != d->rx_next.peer || h.psn != d->rx_next.psn || p->dead ||
            (p->nak_code && h.psn == p->nak_psn) || (!s->rc && !read && h.qkey != qp->attr.qkey) ||
            dw_rel_rx_classify(&p->rel, h.psn) != DW_REL_NEW)
                return rd_direct_skip(d);
        struct dw_rdmap_hdr r;
        ssize_t rl = dw_rdmap_decode(hb + hl, sizeof(d->rx_hdr) - (size_t)hl, &r, &why);
        size_t body = (size_t)len - DW_DGRAM_CRC_LEN;
        if (rl < 0 || r.opcode != (read ? DW_RDMAP_READ_RESP : DW_RDMAP_WRITE) ||
            body < (size_t)(hl + rl) + RD_DIRECT_MIN || r.ddp.stag != d->rx_next.stag ||
            r.ddp.to != d->rx_next.to || (!read && !qp_allows(qp, DIWARP_ACCESS_REMOTE_WRITE)))
                return rd_direct_skip(d);
        size_t plen = body - (size_t)(hl + rl);
        uint8_t *host = NULL;
        if (read) {
                /* The checks of rd_rx_segment and dw_qp_scatter for a one-SGE sink. */
                struct dw_wqe *w = rd_orq_find(s, p, r.ddp.stag, false);
                if (!w || w->num_sge != 1 || r.ddp.to > w->total_len ||
                    plen > w->total_len - r.ddp.to ||
                    dw_mr_check_local(&dev->mrs, w->sge[0].lkey, qp->pd, DIWARP_ACCESS_LOCAL_WRITE,
                                      w->sge[0].addr + r.ddp.to, plen, &host) != DW_PROT_OK)
                        return rd_direct_skip(d);
        } else if (dw_mr_check_remote(&dev->mrs, r.ddp.stag, qp->pd, DIWARP_ACCESS_REMOTE_WRITE,
                                      r.ddp.to, plen, &host) != DW_PROT_OK) {
                return rd_direct_skip(d); /* dw_rd_rx refuses it with a NAK */
        }
        uint8_t trl[DW_DGRAM_CRC_LEN];
        struct iovec iov[3] = {{hb, (size_t)(hl + rl)}, {host, plen}, {trl, sizeof(trl)}};
        int n = dw_udp_recv_iov(&dev->udp, iov, 3);
        if (n < 0)
                return n == -EAGAIN ? -1 : 0;
        if (n != len) {
                /* Not the datagram peeked at: nothing else reads this socket
                 * under the device lock, so this is not expected. */
                dev->ctr.rx_dropped_malformed++;
                return 1;
        }
        uint32_t st = dw_crc32c_update(dw_crc32c_init(), hb, (size_t)(hl + rl));
        st = dw_crc32c_update(st, host, plen);
        uint8_t want[DW_DGRAM_CRC_LEN];
        dw_dgram_crc_trailer(want, st);
        if (memcmp(want, trl, sizeof(want)) != 0) {
                dev->ctr.crc_errors++;
                return 1;
        }
        dev->ctr.rx_placed_direct++;
        qp->ctr.rx_placed_direct++;
        d->rx_placed = true;
        dw_rd_rx(dev, hb, body, (size_t)hl, &h, &from);
        d->rx_placed = false;
        d->rx_small = 0;
        return 1;
}

/* ---------------------------------------------------------------- progress */

/* Out of line: without RD QPs or active peers a step pays only the test in
 * dw_rd_progress, not this function's register saves. */
static __attribute__((noinline)) int rd_progress_busy(struct dw_device *dev, struct dw_rd_dev *d,
                                                      int budget)
{
        int work = 0;
        bool blocked = false;
        bool held_now = false;
        if (d->held_step) {
                /* Held in this step: the next one (at once for a progress
                 * thread) reports them. */
                if (d->held_step == dev->prog.steps) {
                        held_now = true;
                        dw_progress_timer(dev, 0);
                } else {
                        d->held_step = 0;
                        rd_ack_flush(d);
                        for (struct dw_rd_qp *s = d->qps; s; s = s->next)
                                rd_retire_held(s);
                }
        }
        for (struct dw_rd_qp *s = d->qps; s && !blocked; s = s->next)
                if (dw_wq_count(&s->qp->sq) > s->tx_idx || s->fifo_count)
                        work += rd_tx_qp(s, budget, &blocked);
        rd_tx_wait(dev, blocked);
        /* The step that delivered a ping-pong's receive ends here, for the
         * application to answer sooner; the timers wait for the next step. */
        if (held_now)
                return work;

        /* The latest clock read of this step, if it made one (a receive or a
         * transmit): every stamp rel/ took in it is at or before it. */
        uint64_t now = d->step_no == dev->prog.steps && d->step_now ? d->step_now : dw_now_ns();
        uint64_t next = UINT64_MAX;
        if (d->touched && !d->timers_dirty) {
                struct dw_rd_peer *t = d->touched;
                uint64_t dl = dw_rel_next_deadline(&t->rel);
                d->touched = NULL;
                if (dl < d->timers_at)
                        d->timers_at = dl;
                else if (dl == UINT64_MAX && dw_rel_tx_inflight(&t->rel) == 0) {
                        rd_deactivate(t);
                        rd_ring_idle(d, t);
                }
        }
        if (!d->timers_dirty && now < d->timers_at) {
                if (d->timers_at != UINT64_MAX) /* each step asks anew */
                        dw_progress_timer(dev, d->timers_at);
                return work;
        }
        d->timers_dirty = false;
        d->touched = NULL;
        d->ctl_sent = 0;
        struct dw_rd_peer *p = d->active, *nx;
        for (; p; p = nx) {
                nx = p->anext;
                if (p->dead || p->s->qp->state == DIWARP_QPS_ERR) {
                        rd_deactivate(p);
                        continue;
                }
                int r = dw_rel_timers(&p->rel, now, &rd_ops, p);
                if (r < 0 && !rd_backpressure(r)) {
                        enum diwarp_wc_status st = r == -EREMOTEIO   ? DIWARP_WC_RNR_RETRY_EXC_ERR
                                                   : r == -ETIMEDOUT ? DIWARP_WC_RETRY_EXC_ERR
                                                                     : DIWARP_WC_LOC_PROT_ERR;
                        /* Marks the QP's peers dead; they leave the list as the
                         * walk meets them, so nx stays valid. */
                        rd_peer_fail(p, st, DIWARP_EVENT_QP_FATAL,
                                     r == -ETIMEDOUT || r == -EREMOTEIO ? dw_rel_fatal_str(&p->rel)
                                                                        : "retransmission failed");
                        rd_deactivate(p);
                        continue;
                }
                uint64_t dl = dw_rel_next_deadline(&p->rel);
                if (dl == UINT64_MAX && dw_rel_tx_inflight(&p->rel) == 0) {
                        rd_deactivate(p);
                        rd_ring_idle(d, p);
                } else if (dl < next)
                        next = dl;
                work++;
        }
        d->timers_at = next;
        if (next != UINT64_MAX)
                dw_progress_timer(dev, next);
        return work;
}

int dw_rd_progress(struct dw_device *dev, int budget)
{
        struct dw_rd_dev *d = rdd(dev);
        if (!d || (!d->qps && !d->active))
                return 0;
        return rd_progress_busy(dev, d, budget);
}

/* ---------------------------------------------------------------- QP hooks */

int dw_rd_dev_init(struct dw_device *dev)
{
        struct dw_rd_dev *d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        dev->rd = d;
        return 0;
}

void dw_rd_dev_fini(struct dw_device *dev)
{
        struct dw_rd_dev *d = rdd(dev);
        while (d && d->ring_cache) {
                struct rd_free_ring *f = d->ring_cache;
                d->ring_cache = f->next;
                free(f);
        }
        free(dev->rd);
        dev->rd = NULL;
}

static void rd_params(struct dw_rd_qp *s)
{
        struct dw_qp *qp = s->qp;
        dw_rel_params_default(&s->params);
        s->params.peer_timeout_ms = qp->dev->cfg.peer_timeout_ms;
        if (!s->rc) {
                /* RD QPs: a Send waits for its receive WR as long as the peer
                 * answers (RNR forever); a silent peer still ends it. */
                s->params.rnr_retry_limit = DW_REL_RNR_INFINITE;
        } else if (qp->attr_mask_set & DIWARP_QP_RNR_RETRY) {
                s->params.rnr_retry_limit =
                    qp->attr.rnr_retry >= 7 ? DW_REL_RNR_INFINITE : qp->attr.rnr_retry;
        }
}

int dw_rd_qp_init(struct dw_qp *qp)
{
        struct dw_device *dev = qp->dev;
        if (!rdd(dev)) {
                int e = dw_rd_dev_init(dev);
                if (e < 0)
                        return e;
        }
        struct dw_rd_qp *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        if (qp->srq) {
                /* Receive WQEs taken from the SRQ wait here, bound to their
                 * messages, until they complete (see rd_rq_have). */
                const struct dw_wq *sq = &qp->srq->q.wq;
                int e = dw_wq_init(&qp->rq, sq->capacity, sq->max_sge ? sq->max_sge : 1, 0);
                if (e < 0) {
                        free(s);
                        return e;
                }
        }
        s->qp = qp;
        s->rc = qp->type != DIWARP_QPT_RD;
        qp->rd = s;
        rd_params(s);
        struct dw_rd_dev *d = rdd(dev);
        s->next = d->qps;
        if (d->qps)
                d->qps->prev = s;
        d->qps = s;
        /* GSO trains from RD peers arrive as one buffer once bulk traffic
         * turned GRO on (before, the kernel splits them: slower, still
         * correct); a ping-pong keeps it off, as GRO costs every receive. */
        dw_udp_want_gro(&dev->udp);
        return 0;
}

/* Sends the ACKs still owed before the streams go. A request's ACK may be
 * waiting for a response (rel/ ACK deferral) that will never come now: without
 * it the peer would wait for its send completion until its retries ran out. */
static void rd_flush_acks(struct dw_rd_qp *s)
{
        if (!s->htab)
                return;
        for (uint32_t i = 0; i <= s->hmask; i++)
                for (struct dw_rd_peer *p = s->htab[i]; p; p = p->hnext)
                        if (!p->dead && dw_rel_ack_owed(&p->rel))
                                rd_send_ack(p);
}

void dw_rd_qp_fini(struct dw_qp *qp)
{
        struct dw_rd_qp *s = qp->rd;
        if (!s)
                return;
        struct dw_rd_dev *d = rdd(qp->dev);
        if (qp->state != DIWARP_QPS_ERR && qp->state != DIWARP_QPS_RESET)
                rd_flush_acks(s);
        rd_peers_free(s);
        if (s->prev)
                s->prev->next = s->next;
        else
                d->qps = s->next;
        if (s->next)
                s->next->prev = s->prev;
        free(s);
        qp->rd = NULL;
        if (qp->srq)
                dw_wq_fini(&qp->rq);
}

static void rd_reset_state(struct dw_rd_qp *s)
{
        s->tx_idx = s->tx_seg = 0;
        s->retire_held = false;
        s->norq = s->orq_building = 0;
        s->rq_bound = 0;
        memset(s->irq, 0, sizeof(s->irq));
        s->fifo_head = s->fifo_count = 0;
}

int dw_rd_qp_modify(struct dw_qp *qp, enum diwarp_qp_state old, int mask)
{
        struct dw_rd_qp *s = qp->rd;
        if (qp->state == DIWARP_QPS_RESET) {
                if (old != DIWARP_QPS_ERR && old != DIWARP_QPS_RESET)
                        rd_flush_acks(s);
                rd_peers_free(s);
                rd_reset_state(s);
                return 0;
        }
        rd_params(s);
        if (!s->rc)
                return 0;
        if (qp->state == DIWARP_QPS_RTR && old == DIWARP_QPS_INIT) {
                if (!(mask & DIWARP_QP_AV) || !(mask & DIWARP_QP_DEST_QPN)) {
                        dw_warn("RC QP %#x over RD: RTR needs AV and DEST_QPN (no CM "
                                "connection over RD)",
                                qp->qpn);
                        return -EOPNOTSUPP;
                }
                rd_peers_free(s);
                uint32_t sq = (qp->attr_mask_set & DIWARP_QP_SQ_PSN) ? qp->attr.sq_psn : 0;
                s->rc_peer = rd_peer_new(s, qp->peer.sin_addr.s_addr, qp->peer.sin_port,
                                         qp->attr.dest_qp_num, sq, qp->attr.rq_psn);
                if (!s->rc_peer)
                        return -ENOMEM;
                return 0;
        }
        if ((mask & DIWARP_QP_SQ_PSN) && s->rc_peer) {
                struct dw_rel_peer *r = &s->rc_peer->rel;
                /* IB sets sq_psn at RTS; nothing was sent yet, so the send
                 * side starts over at the agreed PSN (receive side untouched). */
                if (r->snd_nxt == r->snd_una && r->snd_nxt != qp->attr.sq_psn &&
                    dw_wq_count(&qp->sq) == 0) {
                        r->snd_nxt = r->snd_una = r->sack_high = qp->attr.sq_psn;
                }
        }
        return 0;
}

int dw_rd_post_send(struct dw_qp *qp, struct dw_wqe *w)
{
        struct dw_rd_qp *s = qp->rd;
        struct dw_rd_peer *p;
        if (s->rc) {
                p = s->rc_peer;
                if (!p)
                        return -ENOTCONN;
                w->remote_qkey = 0;
        } else if (w->opcode == DIWARP_WR_LOCAL_INV) {
                p = NULL;
        } else {
                struct dw_ah *ah = w->ah;
                /* The address is a function of (ip, QPN): the same pair is the
                 * same stream. */
                p = s->last_tx;
                if (!p || p->rqpn != w->remote_qpn || p->ip != ah->ip.s_addr) {
                        struct sockaddr_in a;
                        dw_peer_addr(qp->dev, ah->ip, w->remote_qpn, &a);
                        p = rd_peer_find(s, a.sin_addr.s_addr, a.sin_port, w->remote_qpn);
                        if (!p)
                                p = rd_peer_new(s, a.sin_addr.s_addr, a.sin_port, w->remote_qpn,
                                                rd_isn(qp->qpn, w->remote_qpn),
                                                rd_isn(w->remote_qpn, qp->qpn));
                        if (!p)
                                return -ENOMEM;
                        s->last_tx = p;
                }
                /* IB rule: a remote qkey with the high bit set means "use the QP's own". */
                if (w->remote_qkey & 0x80000000u)
                        w->remote_qkey = qp->attr.qkey;
        }
        w->priv = p;
        /* Fixed here, with the stream's segment size, for every copy. */
        w->ts_ns = rd_nseg(w->total_len, p ? rd_peer_seg(p) : 1);
        if (is_read_like(w->opcode))
                w->ts_ns = 1;
        switch (w->opcode) {
        case DIWARP_WR_SEND:
        case DIWARP_WR_SEND_WITH_IMM:
        case DIWARP_WR_SEND_WITH_INV:
        case DIWARP_WR_RDMA_WRITE_WITH_IMM:
                w->msn = p->tx_msn++;
                break;
        case DIWARP_WR_RDMA_READ:
        case DIWARP_WR_ATOMIC_CMP_AND_SWP:
        case DIWARP_WR_ATOMIC_FETCH_AND_ADD:
                if (w->total_len > UINT32_MAX)
                        return -EMSGSIZE;
                w->msn = p->tx_rreq++;
                break;
        default:
                break;
        }
        w->flags |= RD_W_QUEUED;
        return 0;
}

static void rd_tx_now(struct dw_rd_qp *s)
{
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        struct dw_rd_dev *d = rdd(dev);
        /* Only when the newest WQE is the one waiting: nothing queued before it
         * is overtaken, and no segment or Read response is under way. */
        if ((qp->state != DIWARP_QPS_RTS && !(s->rc && qp->state == DIWARP_QPS_RTR)) || s->tx_seg ||
            s->fifo_count || d->tx_wait || dw_wq_count(&qp->sq) != s->tx_idx + 1)
                return;
        struct dw_wqe *w = dw_wq_at(&qp->sq, s->tx_idx);
        struct dw_rd_peer *p = w->priv;
        if (!p || w->ts_ns != 1 || ((w->send_flags & DIWARP_SEND_FENCE) && s->norq))
                return;
        switch (w->opcode) {
        case DIWARP_WR_SEND:
        case DIWARP_WR_SEND_WITH_IMM:
        case DIWARP_WR_SEND_WITH_INV:
        case DIWARP_WR_RDMA_WRITE:
        case DIWARP_WR_RDMA_WRITE_WITH_IMM:
                break;
        default:
                return; /* Reads and Atomics take an ORQ slot: rd_tx_qp */
        }
        /* The clock is read after the send, off the latency path: before it,
         * only an RNR back-off would need it, and that is left to the step. */
        if (p->rel.rnr_until || !rd_room(p, 0))
                return;
        struct rd_txslot *t = &d->slot[0];
        uint32_t slot = (uint32_t)(w - qp->sq.ring);
        /* As rd_next_sq builds it: the last WQE of the SQ asks for an ACK. A
         * build error or a refusal of the socket is left to the progress step,
         * which fails the WR or waits for the socket as usual. */
        if (rd_build(p, rd_cookie(RD_CK_SQ, slot, 0), p->rel.snd_nxt, true, t) < 0 ||
            rd_send_one(dev, t->iov, t->iovcnt, &t->dst) < 0) {
                t->peer = NULL;
                rd_ring_idle(d, p);
                return;
        }
        rd_commit(s, t, dw_now_ns());
        t->peer = NULL;
        s->tx_idx++;
}

void dw_rd_tx_posted(struct dw_qp *qp)
{
        struct dw_rd_qp *s = qp->rd;
        if (!s)
                return;
        rd_tx_now(s);
        /* after the datagram left */
        rd_ack_flush(rdd(qp->dev));
        rd_retire_held(s);
}

bool dw_rd_sq_release(struct dw_qp *qp)
{
        if (!qp->rd)
                return false;
        uint32_t n = dw_wq_count(&qp->sq);
        rd_ack_flush(rdd(qp->dev));
        rd_retire_held(qp->rd);
        return dw_wq_count(&qp->sq) < n;
}

void dw_rd_post_recv(struct dw_qp *qp)
{
        (void)qp; /* bound to messages when their segments arrive */
}

void dw_rd_qp_error(struct dw_qp *qp)
{
        struct dw_rd_qp *s = qp->rd;
        if (!s)
                return;
        struct dw_rd_dev *d = rdd(qp->dev);
        if (d->hack.peer && d->hack.peer->s == s)
                rd_ack_flush(d);
        rd_retire_held(s); /* they succeeded: not flushed */
        if (s->htab)
                for (uint32_t i = 0; i <= s->hmask; i++)
                        for (struct dw_rd_peer *p = s->htab[i]; p; p = p->hnext)
                                p->dead = true; /* unlinked by the next progress step */
        rdd(qp->dev)->timers_dirty = true;
        /* Receive WQEs that already completed (behind an older unfinished one)
         * leave the ring now, so the flush does not complete them twice. */
        struct dw_wq *rq = &qp->rq;
        uint32_t keep = 0, n = dw_wq_count(rq);
        for (uint32_t i = 0; i < n; i++) {
                struct dw_wqe *w = dw_wq_at(rq, i);
                if (w->flags & DW_WQE_DONE)
                        continue;
                if (keep != i)
                        *dw_wq_at(rq, keep) = *w;
                keep++;
        }
        if (keep != n) {
                rq->count = keep;
                rq->tail = (rq->head + keep) % rq->capacity;
        }
        /* WQEs taken from an SRQ belong to this QP now: they flush here (the
         * generic flush only knows the SRQ's). */
        for (struct dw_wqe *w; qp->srq && (w = dw_wq_head(rq));) {
                struct diwarp_wc wc = {
                    .wr_id = w->wr_id, .status = DIWARP_WC_WR_FLUSH_ERR, .opcode = DIWARP_WC_RECV};
                dw_qp_complete_recv(qp, &wc, false);
                dw_wq_pop(rq);
        }
        rd_reset_state(s);
}

int diwarpdv_create_qp(struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr,
                       struct diwarp_qp **out)
{
        if (!attr)
                return -EINVAL;
        attr->qp_type = DIWARP_QPT_RD;
        return diwarp_qp_create(pd, attr, out);
}

int diwarpdv_post_send_rd(struct diwarp_qp *q, struct diwarp_send_wr *wr,
                          const struct diwarpdv_rd_dest *dest, struct diwarp_send_wr **bad_wr)
{
        struct dw_qp *qp = dw_qp_of(q);
        int err = 0;
        if (!qp || !wr || !dest || !dest->ah || (dest->remote_qpn & ~DW_DGRAM_QPN_MASK)) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EINVAL;
        }
        struct dw_device *dev = qp->dev;
        struct dw_ah *ah = dw_ah_of(dest->ah);
        pthread_mutex_lock(&dev->lock);
        for (; wr; wr = wr->next) {
                if (qp->type != DIWARP_QPT_RD || ah->pd->dev != dev ||
                    (qp->state != DIWARP_QPS_RTS && qp->state != DIWARP_QPS_SQD &&
                     qp->state != DIWARP_QPS_ERR) ||
                    wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge ||
                    (wr->num_sge > 0 && !wr->sg_list) ||
                    (wr->opcode > DIWARP_WR_LOCAL_INV && wr->opcode != DIWARP_WR_SEND_WITH_INV)) {
                        err = -EINVAL;
                        break;
                }
                uint64_t total = 0;
                for (int i = 0; i < wr->num_sge; i++)
                        total += wr->sg_list[i].length;
                if (total > DW_MAX_MSG_RC ||
                    ((wr->send_flags & DIWARP_SEND_INLINE) && total > qp->cap.max_inline_data)) {
                        err = -EINVAL;
                        break;
                }
                struct dw_wqe *w = dw_wq_reserve(&qp->sq);
                if (!w && dw_rd_sq_release(qp))
                        w = dw_wq_reserve(&qp->sq);
                if (!w) {
                        err = -ENOMEM;
                        break;
                }
                err = dw_wqe_from_send_wr(&qp->sq, w, wr);
                if (err < 0)
                        break;
                w->ah = ah;
                w->remote_qpn = dest->remote_qpn;
                w->remote_qkey = dest->remote_qkey;
                dw_wq_commit(&qp->sq);
                if (qp->state == DIWARP_QPS_ERR) {
                        dw_qp_to_error(qp, -1); /* flushes it */
                } else {
                        int e = dw_rd_post_send(qp, w);
                        if (e < 0) {
                                dw_warn("RD QP %#x: cannot queue a send: %s", qp->qpn,
                                        strerror(-e));
                                dw_qp_to_error(qp, DIWARP_EVENT_QP_FATAL);
                        }
                }
        }
        if (err < 0 && bad_wr)
                *bad_wr = wr;
        dw_rd_tx_posted(qp);
        dw_progress_step(dev, DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&dev->lock);
        return err;
}

int diwarpdv_query_rd_path(struct diwarp_qp *q, const struct diwarpdv_rd_dest *dest,
                           struct diwarpdv_rd_path *out)
{
        struct dw_qp *qp = dw_qp_of(q);
        if (!qp || !out || !qp->rd || (!dest) != qp->rd->rc || (dest && !dest->ah))
                return -EINVAL;
        struct dw_device *dev = qp->dev;
        int err = 0;
        pthread_mutex_lock(&dev->lock);
        struct dw_rd_qp *s = qp->rd;
        struct dw_rd_peer *p = s->rc_peer;
        if (dest) {
                struct sockaddr_in a;
                dw_peer_addr(dev, dw_ah_of(dest->ah)->ip, dest->remote_qpn, &a);
                p = rd_peer_find(s, a.sin_addr.s_addr, a.sin_port, dest->remote_qpn);
        }
        if (p) {
                out->max_dgram = p->udp_mtu;
                out->seg_payload = rd_peer_seg(p);
                out->dev_max_sent = rdd(dev)->dgram_max;
        } else {
                err = -ENOENT;
        }
        pthread_mutex_unlock(&dev->lock);
        return err;
}
