/* RD transport: RDMAP over DDP over the rel/ reliable-datagram sublayer, on
 * the device's one UDP socket. See rd.h for the model and README.md for the
 * decisions.
 *
 * This file keeps the pseudo-streams (per-QP peer hash, the device's list of
 * active peers, the cache of send-window rings, route MTUs), the QP hooks of
 * rd.h, the send-side completions (retire, complete through a WR, peer
 * failure), the progress step's transmit round and rel/ timer walk, and the
 * diwarpdv_* RD entry points. Building and sending datagrams is rd_tx.c;
 * receiving and placing them is rd_rx.c; rd_int.h holds what they share.
 */
#include "api/backend.h"
#include "rd/rd_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarpdv.h>

/* ---------------------------------------------------------------- pseudo-streams */

/* Free rings kept per device: enough for a burst of active peers without a
 * malloc; beyond it a drained peer's ring goes back to the heap. */
#define RD_RING_CACHE 64
#define RD_RING_BYTES (DW_REL_DEF_WINDOW * sizeof(struct dw_rel_txent))
struct rd_free_ring {
        struct rd_free_ring *next;
};

/* A send-window ring for a peer about to send: from the cache, else the
 * heap (only when more peers are active at once than ever before). */
bool rd_ring_get(struct dw_rd_dev *d, struct dw_rd_peer *p)
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
void rd_ring_idle(struct dw_rd_dev *d, struct dw_rd_peer *p)
{
        if (p->rel.ring && p->batch == 0 && dw_rel_tx_inflight(&p->rel) == 0)
                rd_ring_put(d, dw_rel_detach_ring(&p->rel));
}

uint32_t dw_rd_seg_payload(uint32_t mtu)
{
        return rd_seg_payload(mtu);
}

/* The route's MTU towards ip:port as the kernel's routing table and PMTU
 * cache see it now: a UDP socket from the device's address, connect()ed
 * there, IP_MTU. 0 when it cannot be read. */
static uint32_t rd_route_mtu(const struct dw_device *dev, uint32_t ip, uint16_t port)
{
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = dev->bind_addr};
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

const char *rd_peer_str(const struct dw_rd_peer *p, char *buf, size_t len)
{
        char ip[INET_ADDRSTRLEN];
        struct in_addr a = {.s_addr = p->ip};
        inet_ntop(AF_INET, &a, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u QPN %#x", ip, ntohs(p->port), p->rqpn);
        return buf;
}

static void rd_deactivate(struct dw_rd_peer *p)
{
        struct dw_rd_dev *d = rdd(p->s->qp->dev);
        if (d->touched == p) {
                d->touched = NULL;
                d->timers_dirty = true;
        }
        if (d->timers_owner == p)
                d->timers_owner = NULL;
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

struct dw_rd_peer *rd_peer_new(struct dw_rd_qp *s, uint32_t ip, uint16_t port, uint32_t qpn,
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
        p->rx_sync = p->tx_synced = true; /* RC over RD: the PSNs are agreed */
        p->udp_mtu = rd_udp_mtu(s->qp->dev, ip, port);
        /* A multirail device's datagrams may carry its rail list or its
         * origin address: segments leave room for them. */
        if (s->qp->dev->nrails > 1)
                p->udp_mtu -= RD_MULTIRAIL_ROOM;
        /* DIWARP_AUTH: the authentication trailer is longer than the CRC. */
        if (s->seal->mac)
                p->udp_mtu -= DW_DGRAM_AUTH_LEN - DW_DGRAM_CRC_LEN;
        if (dw_rel_peer_init(&p->rel, &s->params, NULL, DW_REL_DEF_WINDOW, tx_psn, rx_psn) < 0) {
                free(p);
                return NULL;
        }
        p->path = dw_flow_path_get(&rdd(s->qp->dev)->paths, ip, port, p->udp_mtu + RD_IP_UDP);
        if (!p->path) {
                free(p);
                return NULL;
        }
        uint32_t b = rd_hash(ip, port, qpn) & s->hmask;
        p->hnext = s->htab[b];
        s->htab[b] = p;
        s->npeers++;
        struct dw_rd_dev *d = rdd(s->qp->dev);
        d->npeers++;
        if (!s->rc)
                d->nrd++;
        p->last_tick = rd_tick(dw_now_ns());
        rd_mbox_peer_new(s, p);
        return p;
}

/* ---------------------------------------------------------------- bounded state */

/* A full table frees idle streams at most this often (a flood of new
 * streams would otherwise walk it for each). */
#define RD_SWEEP_MIN_NS (100ull * 1000 * 1000)

/* Frees a stream nothing refers to (rd_sweep_qp checked). */
static void rd_peer_free(struct dw_rd_peer *p)
{
        struct dw_rd_qp *s = p->s;
        struct dw_rd_dev *d = rdd(s->qp->dev);
        struct dw_rd_peer **pp = &s->htab[rd_hash(p->ip, p->port, p->rqpn) & s->hmask];
        while (*pp != p)
                pp = &(*pp)->hnext;
        *pp = p->hnext;
        rd_deactivate(p);
        rd_path_forget(p);
        rd_mbox_peer_gone(p, false);
        if (s->ntails || s->nahead)
                rd_tails_flush(s, p, true); /* and forgets p's runs placed ahead */
        dw_flow_path_put(&d->paths, p->path);
        if (s->last_tx == p)
                s->last_tx = NULL;
        s->npeers--;
        d->npeers--;
        d->nrd--;
        free(p);
}

static void rd_mark(const struct dw_rd_qp *s, struct dw_rd_peer *p)
{
        if (p && p->s == s)
                p->used = true;
}

/* Frees the streams of RD QP s that are idle (no datagram for
 * DIWARP_RD_IDLE_MS) and hold nothing: no PSN in flight or timer, no
 * receive under way, and nothing of the QP or device
 * refers to them (send and bound receive WQEs, responder, pull and credit
 * control entries, parked segments, the receive path's memory); a credit
 * index goes back to the QP with its stream (not with the dynamic
 * protocol, where such a stream stays: rd_mbox_peer_gone). A peer
 * that comes back finds the stream gone and starts a new one: its side
 * restarts with START after half the idle time (rd_peer_restart). Returns
 * how many went. */
static uint32_t rd_sweep_qp(struct dw_rd_qp *s, uint64_t now)
{
        struct dw_qp *qp = s->qp;
        struct dw_rd_dev *d = rdd(qp->dev);
        if (s->rc || s->mbox_app || !s->htab || !s->npeers ||
            (qp->state != DIWARP_QPS_RTS && qp->state != DIWARP_QPS_RTR &&
             qp->state != DIWARP_QPS_SQD && qp->state != DIWARP_QPS_SQE))
                return 0;
        for (uint32_t i = 0, n = dw_wq_count(&qp->sq); i < n; i++)
                rd_mark(s, dw_wq_at(&qp->sq, i)->priv);
        for (uint32_t i = 0; i < s->rq_bound; i++)
                rd_mark(s, dw_wq_at(&qp->rq, i)->priv);
        for (uint32_t i = 0; i < RD_MAX_IRQ; i++)
                rd_mark(s, s->irq[i].peer);
        for (uint32_t i = 0; i < RD_MAX_PULL; i++)
                rd_mark(s, s->pull[i].peer);
        if (s->mb) {
                for (uint32_t i = 0; i < RD_MAX_CCTL; i++)
                        rd_mark(s, s->mb->cctl[i].peer);
                for (uint32_t k = 0; k < s->mb->ent_count; k++)
                        rd_mark(s, s->mb->ent[(s->mb->ent_head + k) % s->mb->ring_slots].peer);
        }
        rd_mark(s, d->touched);
        rd_mark(s, d->hack.peer);
        rd_mark(s, (struct dw_rd_peer *)d->rx_next.peer);
        uint32_t freed = 0;
        for (uint32_t b = 0; b <= s->hmask; b++) {
                struct dw_rd_peer *p = s->htab[b], *nx;
                for (; p; p = nx) {
                        nx = p->hnext;
                        if (p->used || p->active || p->rel.ring || p->batch ||
                            !rd_mbox_peer_gone(p, true) || p->rel.snd_nxt != p->rel.snd_una ||
                            p->rx_bind != p->rx_done || (p->rel.rx_map[0] | p->rel.rx_map[1]) ||
                            p->rel.ack_deadline || rd_idle(p, now) < d->idle_ticks) {
                                p->used = false;
                                continue;
                        }
                        rd_peer_free(p);
                        freed++;
                }
        }
        qp->dev->ctr.rd_peers_reclaimed += freed;
        qp->ctr.rd_peers_reclaimed += freed;
        return freed;
}

/* Every RD QP of the device, then again a quarter of the idle time later. */
static void rd_sweep(struct dw_rd_dev *d, uint64_t now)
{
        d->sweep_at = now + ((uint64_t)d->idle_ticks << RD_TICK_SHIFT) / 4;
        for (struct dw_rd_qp *s = d->qps; s && d->nrd; s = s->next)
                rd_sweep_qp(s, now);
}

bool rd_peer_room(struct dw_rd_qp *s, uint64_t now)
{
        struct dw_device *dev = s->qp->dev;
        struct dw_rd_dev *d = rdd(dev);
        if (s->npeers < dev->cfg.rd_max_peers && d->npeers < dev->cfg.rd_dev_peers)
                return true;
        if (d->sweep_asked && now - d->sweep_asked < RD_SWEEP_MIN_NS)
                return false;
        d->sweep_asked = now;
        if (d->npeers >= dev->cfg.rd_dev_peers)
                rd_sweep(d, now);
        else
                rd_sweep_qp(s, now);
        return s->npeers < dev->cfg.rd_max_peers && d->npeers < dev->cfg.rd_dev_peers;
}

/* Whether p's send side may start over: nothing in flight and no WQE to p
 * under way (segments sent, or a Read or Atomic waiting for its response);
 * *msn: the first queue-0 MSN still to go (a WQE queued, else the next). */
static bool rd_tx_restartable(struct dw_rd_peer *p, uint32_t *msn)
{
        struct dw_rd_qp *s = p->s;
        struct dw_qp *qp = s->qp;
        if (p->rel.snd_nxt != p->rel.snd_una || p->batch)
                return false;
        uint32_t first = p->tx_msn;
        for (uint32_t i = 0, n = dw_wq_count(&qp->sq); i < n; i++) {
                const struct dw_wqe *w = dw_wq_at(&qp->sq, i);
                if (w->priv != p || (w->flags & DW_WQE_DONE))
                        continue;
                if (i < s->tx_idx || (i == s->tx_idx && s->tx_seg) ||
                    (w->flags & (RD_W_INORQ | RD_W_TXALL)))
                        return false;
                if (dw_wr_op(w->opcode)->consumes_recv && dw_psn_before(w->msn, first))
                        first = w->msn;
        }
        *msn = first;
        return true;
}

/* Our side of p starts over (docs/PROTOCOL.md "Stream start": after an
 * idle time the peer may have freed the stream): its next PSN is its next
 * queue-0 MSN, told by START again, and the peer's next START is taken. */
static bool rd_peer_restart(struct dw_rd_peer *p)
{
        uint32_t msn;
        if (p->s->rc || !p->tx_synced || !rd_tx_restartable(p, &msn))
                return false;
        dw_rel_tx_start(&p->rel, msn);
        p->tx_synced = false;
        p->rx_resync = true;
        return true;
}

bool rd_peer_resync(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint64_t now)
{
        struct dw_rd_dev *d = rdd(p->s->qp->dev);
        if (p->s->rc || (!p->rx_resync && rd_idle(p, now) < d->idle_ticks / 4) ||
            p->rx_bind != p->rx_done || (p->rel.rx_map[0] | p->rel.rx_map[1]))
                return false;
        /* A late copy of the start we took: a datagram of its first window
         * the peer resent before our ACK reached it (under load it can come
         * seconds late, after an idle time or our own restart). A Send of
         * that start completed here since, so it cannot be the peer's new
         * start at the same place: a peer that kept the stream starts over
         * at its next MSN, at or past ours; one that freed it, at a new
         * random place. Taking it would deliver those Sends again. (With no
         * Send completed since, a copy and a restart after Writes alone look
         * the same, and the start is taken: refusing a real restart would
         * lose its data.) */
        if (h->start_psn == p->rel.rcv_first && dw_psn_before(h->start_msn, p->rx_done))
                return false;
        if (h->start_psn == p->rel.rcv_nxt && h->start_msn == p->rx_done && p->rx_resync) {
                p->rx_resync = false; /* the same place: nothing moves */
                return true;
        }
        uint32_t old_bind = p->rx_bind;
        rd_peer_rx_start(p, h);
        /* Sends of the old start still parked here are the peer's too, sent
         * and acknowledged before: they come first (docs/PROTOCOL.md,
         * "Stream start"). */
        uint32_t first = rd_mbox_restart_parked(p, old_bind, h->start_msn, h->start_psn);
        if (first != h->start_msn) {
                p->rx_bind = p->rx_done = first;
                p->rx_old = true;
        }
        /* A start the peer began (not its answer to ours, which found our
         * credit counters started over already): both ends' counters start
         * over with it, as the peer's did (docs/PROTOCOL.md "Credits"). */
        if (!p->rx_resync)
                rd_mbox_peer_restart(p);
        rd_peer_restart(p);
        /* Our side follows the peer's start, which was just taken: no
         * other START answers it. A later one at another place is the
         * peer's next start (after an idle time, by the rule above), and
         * its credit counters start over with it. */
        p->rx_resync = false;
        return true;
}

/* RFC 6528's ISN, for a pseudo-stream of an RD QP: F(secret, our address,
 * port and QPN, the peer's, the clock) from the device's keyed hash. The
 * clock makes a new stream of the same QPs (a QP reset or made again with
 * its QPN) start elsewhere. out[0]: the first PSN, out[1]: another 32
 * bits. */
static int rd_stream_secret(struct dw_device *dev, uint32_t qpn, uint32_t ip, uint16_t port,
                            uint32_t peer_qpn, uint32_t out[2])
{
        uint8_t in[28];
        uint16_t our_port = htons(dev->port);
        uint64_t now = dw_now_ns();
        memcpy(in, &dev->addr.s_addr, 4);
        memcpy(in + 4, &our_port, 2);
        memcpy(in + 6, &qpn, 4);
        memcpy(in + 10, &ip, 4);
        memcpy(in + 14, &port, 2);
        memcpy(in + 16, &peer_qpn, 4);
        memcpy(in + 20, &now, 8);
        uint8_t h[DW_KEYHASH_OUT_LEN];
        int e = dw_keyhash(&rdd(dev)->isn_key, in, sizeof(in), h);
        if (e < 0)
                return e;
        memcpy(out, h, 2 * sizeof(*out));
        return 0;
}

void rd_peer_rx_start(struct dw_rd_peer *p, const struct dw_dgram_hdr *h)
{
        dw_rel_rx_start(&p->rel, h->start_psn);
        p->rx_bind = p->rx_done = h->start_msn;
        p->rx_sync = true;
        p->rx_old = false;
}

struct dw_rd_peer *rd_peer_new_rd(struct dw_rd_qp *s, uint32_t ip, uint16_t port, uint32_t qpn,
                                  const struct dw_dgram_hdr *start)
{
        uint32_t v[2];
        if (rd_stream_secret(s->qp->dev, s->qp->qpn, ip, port, qpn, v) < 0)
                return NULL;
        struct dw_rd_peer *p = rd_peer_new(s, ip, port, qpn, v[0], 0);
        if (!p)
                return NULL;
        /* Our first queue-0 MSN is our first PSN (the START descriptor says
         * so); queue 1's is the hash's other half, which only we match. */
        p->tx_msn = v[0];
        p->tx_rreq = v[1];
        p->tx_synced = false;
        p->rx_sync = false;
        if (start)
                rd_peer_rx_start(p, start);
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
                        rd_path_forget(p);
                        dw_flow_path_put(&d->paths, p->path);
                        free(p->rel.ring);
                        free(p);
                }
        }
        free(s->htab);
        s->htab = NULL;
        s->hmask = 0;
        if (d) {
                d->npeers -= s->npeers;
                if (!s->rc)
                        d->nrd -= s->npeers;
        }
        s->npeers = 0;
        s->rc_peer = NULL;
        s->last_tx = NULL;
}

/* ---------------------------------------------------------------- send-side completion */

void rd_retire(struct dw_rd_qp *s)
{
        struct dw_qp *qp = s->qp;
        struct dw_wqe *w;
        while ((w = dw_wq_head(&qp->sq)) && (w->flags & DW_WQE_DONE)) {
                if (w->flags & RD_W_TOKEN)
                        s->to_release++;
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

void rd_check_done(struct dw_rd_qp *s, struct dw_wqe *w)
{
        if ((w->flags & DW_WQE_DONE) || !(w->flags & RD_W_TXALL))
                return;
        if (dw_wr_op(w->opcode)->response) {
                if (!(w->flags & RD_W_RESP) || w->bytes_acked < 1)
                        return;
                w->byte_len = (uint32_t)w->total_len;
        } else {
                if (w->bytes_acked < w->ts_ns)
                        return;
                /* A receiver-paced Send: every pulled chunk acknowledged too. */
                if ((w->flags & RD_W_PULL) && w->pull_done < w->total_len - w->pull_pushed)
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
void rd_complete_through(struct dw_rd_qp *s, struct dw_wqe *w, enum diwarp_wc_status status)
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
                if (h->flags & RD_W_TOKEN)
                        s->to_release++;
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
void rd_peer_fail(struct dw_rd_peer *p, enum diwarp_wc_status status, int event, const char *why)
{
        struct dw_rd_qp *s = p->s;
        struct dw_qp *qp = s->qp;
        char pb[64], wb[112];
        if (why == RD_WHY_REL && p->rel.fatal_reason == DW_REL_PEER_TIMEOUT) {
                /* The one bound of a silent stream: say how long, and which
                 * setting sets it. */
                snprintf(wb, sizeof(wb),
                         "silent for %u ms with data outstanding (DIWARP_PEER_TIMEOUT_MS)",
                         s->params.peer_timeout_ms);
                why = wb;
        } else if (why == RD_WHY_REL) {
                why = dw_rel_fatal_str(&p->rel);
        }
        dw_warn_limited(&qp->dev->log_limit, "RD QP %#x peer %s: %s; QP to error", qp->qpn,
                        rd_peer_str(p, pb, sizeof(pb)), why);
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

/* When p, silent, fails a Read or Atomic of ours that waits for its
 * response (ns; UINT64_MAX: none waits). Once the request is acknowledged
 * nothing of ours is in flight to p, so no retransmission timer would ever
 * notice a responder that stopped (its QP went to error, its process died):
 * the wait would never end. As for data in flight, the peer's silence for
 * DIWARP_PEER_TIMEOUT_MS ends it; every datagram of the response restarts
 * the count (last_tick). */
static uint64_t rd_read_deadline(const struct dw_rd_peer *p)
{
        const struct dw_rd_qp *s = p->s;
        for (uint32_t i = 0; i < s->norq; i++)
                if (s->orq[i]->priv == p)
                        return ((uint64_t)p->last_tick << RD_TICK_SHIFT) +
                               (uint64_t)s->params.peer_timeout_ms * 1000000u;
        return UINT64_MAX;
}

/* p's timers are all done (none due, nothing in flight): the stream may
 * leave the active list, unless a Read of ours waits for p's response
 * (rd_read_deadline). Returns that deadline, UINT64_MAX when p left; when it
 * has passed p is failed (and left). */
static uint64_t rd_peer_quiet(struct dw_rd_dev *d, struct dw_rd_peer *p, uint64_t now)
{
        uint64_t rdl = rd_read_deadline(p);
        if (rdl != UINT64_MAX && now < rdl)
                return rdl;
        if (rdl != UINT64_MAX) {
                char why[96];
                snprintf(why, sizeof(why), "silent for %u ms while a Read waits for its response",
                         p->s->params.peer_timeout_ms);
                rd_peer_fail(p, DIWARP_WC_RETRY_EXC_ERR, DIWARP_EVENT_QP_FATAL, why);
        }
        rd_deactivate(p);
        rd_ring_idle(d, p);
        return UINT64_MAX;
}

void rd_read_source_gone(struct dw_rd_peer *p)
{
        rd_peer_fail(p, DIWARP_WC_WR_FLUSH_ERR, DIWARP_EVENT_QP_ACCESS_ERR,
                     "the region a peer's RDMA Read names is no longer accessible (deregistered "
                     "or invalidated while the Read was served)");
}

/* ---------------------------------------------------------------- progress */

static void rd_tx_wait(struct dw_device *dev, bool wait)
{
        struct dw_rd_dev *d = rdd(dev);
        if (d->tx_wait == wait)
                return;
        d->tx_wait = wait;
        dw_progress_tx_wait(&dev->prog, wait);
}

/* Receives held in an earlier step are reported now (with the ACKs they
 * owe); true when they were held in this very step, whose end then comes
 * at once (the timers wait for the next step). */
static bool rd_step_held(struct dw_device *dev, struct dw_rd_dev *d)
{
        if (!d->held_step)
                return false;
        if (d->held_step == dev->prog.steps) {
                /* Held in this step: the next one (at once for a progress
                 * thread) reports them. */
                dw_progress_timer(&dev->prog, 0);
                return true;
        }
        d->held_step = 0;
        rd_ack_flush(d);
        for (struct dw_rd_qp *s = d->qps; s; s = s->next)
                rd_retire_held(s);
        return false;
}

/* In-flight caps: the tokens of retired WQEs go back before anyone asks
 * for new ones (a QP held back asks again as it transmits); the mailboxes'
 * credit datagrams go. True when a QP waits for a token. */
static bool rd_step_tokens(struct dw_rd_dev *d)
{
        bool token_wait = false;
        for (struct dw_rd_qp *s = d->qps; s; s = s->next) {
                if (s->mb && s->mb->ctl)
                        rd_mbox_ctl(s);
                if (s->to_release) {
                        dw_host_complete(&s->ifl, s->to_release);
                        s->to_release = 0;
                }
                token_wait |= s->token_wait;
        }
        return token_wait;
}

/* Every QP with something to send transmits, until the socket refuses. */
static int rd_step_tx(struct dw_device *dev, struct dw_rd_dev *d, int budget)
{
        int work = 0;
        bool blocked = false;
        /* Each step starts with the next QP: when the paths' windows are the
         * limit, the first QP served would otherwise take every opening. */
        struct dw_rd_qp *start = d->tx_rr ? d->tx_rr : d->qps;
        for (struct dw_rd_qp *s = start; s && !blocked;) {
                if (dw_wq_count(&s->qp->sq) > s->tx_idx || s->fifo_count || s->npull ||
                    (s->mb && s->mb->cctl_unsent))
                        work += rd_tx_qp(s, budget, &blocked);
                s = s->next ? s->next : d->qps;
                if (s == start)
                        break;
        }
        d->tx_rr = start && start->next ? start->next : NULL;
        rd_tx_wait(dev, blocked);
        return work;
}

/* The clock of this step: its latest read if it made one (a receive or a
 * transmit: every stamp rel/ took in it is at or before it), else now. */
static uint64_t rd_step_clock(const struct dw_device *dev, const struct dw_rd_dev *d)
{
        return d->step_no == dev->prog.steps && d->step_now ? d->step_now : dw_now_ns();
}

/* p's stream has no timer left and nothing in flight: unless a Read of
 * ours waits for p (rd_read_deadline), it may leave the active list
 * (rd_peer_quiet). dl: its next deadline (dw_rel_next_deadline). */
static inline bool rd_rel_done(const struct dw_rd_peer *p, uint64_t dl)
{
        return dl == UINT64_MAX && dw_rel_tx_inflight(&p->rel) == 0;
}

/* rel/'s timers of an active peer: false when it left the active list
 * (dead, its QP in error, or failed now), else true with its next deadline
 * in *dl. */
static bool rd_peer_timers(struct dw_rd_dev *d, struct dw_rd_peer *p, uint64_t now, uint64_t *dl)
{
        if (p->dead || p->s->qp->state == DIWARP_QPS_ERR) {
                rd_deactivate(p);
                return false;
        }
        int r = dw_rel_timers(&p->rel, now, &rd_ops, p);
        if (r == -EFAULT) {
                rd_read_source_gone(p);
                rd_deactivate(p);
                return false;
        }
        if (r < 0 && !rd_backpressure(r)) {
                enum diwarp_wc_status st = r == -EREMOTEIO   ? DIWARP_WC_RNR_RETRY_EXC_ERR
                                           : r == -ETIMEDOUT ? DIWARP_WC_RETRY_EXC_ERR
                                                             : DIWARP_WC_LOC_PROT_ERR;
                /* Marks the QP's peers dead; they leave the list as the
                 * walk meets them, so the walk's next pointer stays valid. */
                char why[160];
                snprintf(why, sizeof(why), "retransmission failed: %s%s", strerror(-r),
                         r == -EACCES ? " (a local SGE of the message is no longer "
                                        "in a valid memory region)"
                                      : "");
                rd_peer_fail(p, st, DIWARP_EVENT_QP_FATAL,
                             r == -ETIMEDOUT || r == -EREMOTEIO ? RD_WHY_REL : why);
                rd_deactivate(p);
                return false;
        }
        *dl = dw_rel_next_deadline(&p->rel);
        if (rd_rel_done(p, *dl))
                *dl = rd_peer_quiet(d, p, now);
        return true;
}

/* Up to this many active peers, the earliest deadline is found anew
 * (rd_timers_rescan) whenever the peer that set it moves it later; beyond,
 * an early wake-up costs less than a scan per ACK. */
#define RD_TIMERS_RESCAN_MAX 8

/* The earliest of the active peers' deadlines, read without running their
 * timers: a few comparisons each. Leaves timers_at as it is when more than
 * RD_TIMERS_RESCAN_MAX peers are active, and asks for the walk when one of
 * them has no deadline left (the walk takes it off the list). */
static void rd_timers_rescan(struct dw_rd_dev *d)
{
        uint64_t next = UINT64_MAX;
        struct dw_rd_peer *owner = NULL;
        unsigned n = 0;
        for (struct dw_rd_peer *q = d->active; q; q = q->anext) {
                if (++n > RD_TIMERS_RESCAN_MAX)
                        return;
                uint64_t dl = dw_rel_next_deadline(&q->rel);
                if (rd_rel_done(q, dl)) {
                        dl = rd_read_deadline(q); /* what rd_peer_quiet would keep */
                        if (dl == UINT64_MAX) {
                                /* q has nothing left: the walk (now) lets it
                                 * leave the list, as the stale deadline's did. */
                                d->timers_dirty = true;
                                return;
                        }
                }
                if (dl < next) {
                        next = dl;
                        owner = q;
                }
        }
        d->timers_at = next;
        d->timers_owner = owner;
}

/* The one peer that changed since the last step (`touched`) folds its next
 * deadline into timers_at. An earlier one lowers it; a later one from the
 * peer that set it, or from the only active peer, has the few active peers
 * scanned (rd_timers_rescan). timers_at must not stay earlier
 * than every peer's deadline: in a ping-pong the ACK that retires a Send
 * moves its probe timer past the next message, and the stale earliest
 * deadline woke a sleeping poller for nothing, on a shared core a context
 * switch each (fi_pingpong over RC over RD, both ends on one core: 42-49 us
 * a transfer before, 28-34 after; rd/README.md). */
static void rd_fold_touched(struct dw_rd_dev *d, uint64_t now)
{
        struct dw_rd_peer *t = d->touched;
        uint64_t dl = dw_rel_next_deadline(&t->rel);
        bool only = d->active == t && !t->anext;
        bool owner = d->timers_owner == t;
        d->touched = NULL;
        if (rd_rel_done(t, dl))
                dl = rd_peer_quiet(d, t, now); /* may leave the active list */
        if (dl < d->timers_at) {
                d->timers_at = dl;
                d->timers_owner = t;
        } else if ((owner || only) && dl > d->timers_at) {
                rd_timers_rescan(d); /* with t alone active, t's deadline */
        }
}

/* The timers: the idle sweep when due, then the walk over the active
 * peers when the earliest deadline known has come or peers changed. */
static int rd_step_timers(struct dw_device *dev, struct dw_rd_dev *d)
{
        uint64_t now = rd_step_clock(dev, d);
        /* Idle streams of RD QPs go (rd_sweep_qp), looked for by the steps
         * that come: no timer of its own wakes a progress thread for it (a
         * device nobody uses keeps them, within the caps, until it is used). */
        if (d->nrd && now >= d->sweep_at)
                rd_sweep(d, now);
        if (d->touched && !d->timers_dirty)
                rd_fold_touched(d, now);
        if (!d->timers_dirty && now < d->timers_at) {
                if (d->timers_at != UINT64_MAX) /* each step asks anew */
                        dw_progress_timer(&dev->prog, d->timers_at);
                return 0;
        }
        d->timers_dirty = false;
        d->touched = NULL;
        d->ctl_sent = 0;
        int work = 0;
        uint64_t next = UINT64_MAX;
        d->timers_owner = NULL;
        for (struct dw_rd_peer *p = d->active, *nx; p; p = nx) {
                nx = p->anext;
                uint64_t dl;
                if (!rd_peer_timers(d, p, now, &dl))
                        continue;
                if (dl < next) {
                        next = dl;
                        d->timers_owner = p;
                }
                work++;
        }
        d->timers_at = next;
        if (next != UINT64_MAX)
                dw_progress_timer(&dev->prog, next);
        return work;
}

/* Out of line: without RD QPs or active peers a step pays only the test in
 * dw_rd_progress, not this function's register saves. */
static __attribute__((noinline)) int rd_progress_busy(struct dw_device *dev, struct dw_rd_dev *d,
                                                      int budget)
{
        bool held_now = rd_step_held(dev, d);
        bool token_wait = rd_step_tokens(d);
        int work = rd_step_tx(dev, d, budget);
        if (token_wait) {
                /* Tokens freed by another process wake nobody here: a QP
                 * waiting for one asks again every RD_TOKEN_RETRY_NS, whether
                 * or not this process stands in the pool's line (a token the
                 * line gave it may have gone to another QP of the process,
                 * and an application that makes no steps of its own, its
                 * progress thread serving it, must not wait for ever). */
                uint64_t now = rd_step_clock(dev, d);
                dw_host_poll(now);
                dw_progress_timer(&dev->prog, now + RD_TOKEN_RETRY_NS);
        }
        if (d->pace_wake) {
                /* A send waits for pacing: a step then, also for a thread. */
                dw_progress_timer(&dev->prog, d->pace_wake);
                d->pace_wake = 0;
        }
        /* The step that delivered a ping-pong's receive ends here, for the
         * application to answer sooner; the timers wait for the next step. */
        if (held_now)
                return work;
        return work + rd_step_timers(dev, d);
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
        struct dw_cc_params cp;
        dw_cc_params_default(&cp);
        cp.enabled = dev->cfg.cc;
        cp.pacing = dev->cfg.cc_pacing;
        cp.target_ns = dev->cfg.cc_target_us * 1000u;
        d->stamp_gap_ns = cp.target_ns / 2;
        d->nocrc = dev->seal.nocrc; /* DIWARP_RD_CRC=0, unless DIWARP_AUTH */
        d->pull_min = dev->cfg.pull_min;
        d->pull_chunk = dev->cfg.pull_chunk;
        d->pull_depth = dev->cfg.pull_depth;
        d->idle_ticks = rd_tick((uint64_t)dev->cfg.rd_idle_ms * 1000000u);
        /* Drains align on the wall clock, which hosts share (NTP), while
         * `now` is the monotonic clock, which they do not. */
        struct timespec rt, mt;
        clock_gettime(CLOCK_REALTIME, &rt);
        clock_gettime(CLOCK_MONOTONIC, &mt);
        cp.clock_offset_ns =
            ((int64_t)rt.tv_sec - mt.tv_sec) * 1000000000ll + ((int64_t)rt.tv_nsec - mt.tv_nsec);
        const char *why = NULL;
        int e = dw_keyhash_init(&d->isn_key, &why);
        if (e < 0) {
                dw_err("device port %u: RD streams cannot start: %s", dev->port, why);
                free(d);
                return e;
        }
        dw_flow_paths_init(&d->paths, &cp);
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
        if (d) {
                dw_flow_paths_fini(&d->paths);
                dw_keyhash_fini(&d->isn_key);
        }
        free(dev->rd);
        dev->rd = NULL;
}

static void rd_params(struct dw_rd_qp *s)
{
        struct dw_qp *qp = s->qp;
        dw_rel_params_default(&s->params);
        s->params.peer_timeout_ms = qp->dev->cfg.peer_timeout_ms;
        /* DIWARP_RD_LATE_ACKS=stream: each stream probes by its own RTT alone
         * (what the device's learning is measured against). */
        s->params.stall = qp->dev->cfg.rd_late_shared ? &rdd(qp->dev)->stall : NULL;
        if (!s->rc) {
                /* RD QPs: a Send waits for its receive WR as long as the peer
                 * answers (RNR forever); a silent peer still ends it. */
                s->params.rnr_retry_limit = DW_REL_RNR_INFINITE;
        } else if (qp->attr_mask_set & DIWARP_QP_RNR_RETRY) {
                s->params.rnr_retry_limit =
                    qp->attr.rnr_retry >= 7 ? DW_REL_RNR_INFINITE : qp->attr.rnr_retry;
        }
}

static void rd_tokens_drop(struct dw_rd_qp *s);
static void rd_conn_key_drop(struct dw_rd_qp *s);

void dw_rd_dev_counters(struct dw_device *dev, struct diwarp_counters *out)
{
        struct dw_rd_dev *d = rdd(dev);
        if (!d)
                return;
        struct dw_cc_stats st;
        dw_flow_paths_stats(&d->paths, &st);
        out->cc_decrease_delay += st.md_delay;
        out->cc_decrease_loss += st.md_loss;
        out->cc_rto += st.rto;
        out->cc_window_waits += st.cwnd_waits;
        out->cc_pacing_waits += st.pace_waits + st.drain_waits;
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
        s->seal = &dev->seal;
        int me = rd_mbox_init(s);
        if (me < 0) {
                if (qp->srq)
                        dw_wq_fini(&qp->rq);
                free(s);
                return me;
        }
        dw_inflight_qp_init(&s->ifl, dev->cfg.inflight_qp);
        s->capped = dev->cfg.inflight_qp || dw_host_capped();
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
        /* RTT samples and ACK delays go by the kernel's receive time: on a
         * busy host the thread may read a datagram long after it came. On
         * with bulk traffic, as GRO; without (a ping-pong, an old kernel)
         * they go by the reading time. */
        dw_udp_want_stamps(&dev->udp);
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
        rd_tokens_drop(s);
        rd_peers_free(s);
        rd_mbox_fini(s);
        rd_conn_key_drop(s);
        if (d->tx_rr == s)
                d->tx_rr = s->next;
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

/* Every token the QP holds goes back: its WQEs will not complete through
 * rd_retire (an error flushes them, a reset or destroy drops them). */
static void rd_tokens_drop(struct dw_rd_qp *s)
{
        if (!s->capped)
                return;
        uint32_t n = s->admitted + s->to_release;
        struct dw_wqe *w;
        for (uint32_t i = 0; (w = dw_wq_at(&s->qp->sq, i)); i++)
                if (w->flags & RD_W_TOKEN) {
                        w->flags &= ~RD_W_TOKEN;
                        n++;
                }
        dw_host_complete(&s->ifl, n);
        s->admitted = s->to_release = s->starting = 0;
        /* This QP stood in the host pool's line and nothing of it will ask
         * again: leave it, or the tokens the line hands the process stay
         * uncollected until it exits. Another QP of the process that still
         * waits joins the line again at its next try. */
        if (s->token_wait)
                dw_host_cancel();
        s->token_wait = false;
}

static void rd_reset_state(struct dw_rd_qp *s)
{
        s->tx_idx = s->tx_seg = 0;
        s->retire_held = false;
        s->norq = s->orq_building = 0;
        s->rq_bound = 0;
        memset(s->irq, 0, sizeof(s->irq));
        s->fifo_head = s->fifo_count = 0;
        memset(s->pull, 0, sizeof(s->pull));
        s->npull = s->pull_rr = s->pull_waiting = s->pull_busy = 0;
}

/* The connection's key goes (a reset, the QP destroyed): the device's seal
 * again. */
static void rd_conn_key_drop(struct dw_rd_qp *s)
{
        if (s->seal != &s->cseal)
                return;
        dw_seal_fini(&s->cseal);
        s->seal = &s->qp->dev->seal;
        s->qp->dev->conn_keys--;
}

int dw_rd_rc_attach(struct dw_qp *qp, uint64_t rx, uint64_t tx, const uint8_t *key)
{
        struct dw_rd_qp *s = qp->rd;
        rd_conn_key_drop(s);
        s->ctok_rx = rx;
        s->ctok_tx = tx;
        if (!key)
                return 0;
        /* Its own random first nonce, as a device's (wire/seal.h). */
        uint8_t start[DW_DGRAM_AUTH_NONCE_LEN];
        const char *why = NULL;
        int e = dw_random(start, sizeof(start));
        if (e == 0)
                e = dw_seal_init(&s->cseal, false, key, DW_SEAL_CONN_KEY_LEN, start, &why);
        if (e < 0) {
                dw_warn("RC QP %#x over RD: DIWARP_AUTH: cannot set up the connection key: %s",
                        qp->qpn, why ? why : strerror(-e));
                s->ctok_rx = s->ctok_tx = 0;
                return e;
        }
        s->seal = &s->cseal;
        qp->dev->conn_keys++;
        return 0;
}

int dw_rd_qp_modify(struct dw_qp *qp, enum diwarp_qp_state old, int mask)
{
        struct dw_rd_qp *s = qp->rd;
        if (qp->state == DIWARP_QPS_RESET) {
                s->ctok_rx = s->ctok_tx = 0;
                rd_conn_key_drop(s);
                if (old != DIWARP_QPS_ERR && old != DIWARP_QPS_RESET)
                        rd_flush_acks(s);
                rd_tokens_drop(s);
                rd_peers_free(s);
                rd_reset_state(s);
                return rd_mbox_reset(s);
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
                int e = rd_mbox_reset(s);
                if (e < 0)
                        return e;
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
                if (r->snd_nxt != qp->attr.sq_psn && dw_wq_count(&qp->sq) == 0)
                        dw_rel_tx_start(r, qp->attr.sq_psn);
        }
        return 0;
}

int dw_rd_post_send(struct dw_qp *qp, struct dw_wqe *w)
{
        struct dw_rd_qp *s = qp->rd;
        const struct dw_wr_op *op = dw_wr_op(w->opcode);
        struct dw_rd_peer *p;
        if (s->rc) {
                p = s->rc_peer;
                if (!p)
                        return -ENOTCONN;
                w->remote_qkey = 0;
        } else if (op->kind == DW_WR_LOCAL) {
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
                                p = rd_peer_new_rd(s, a.sin_addr.s_addr, a.sin_port, w->remote_qpn,
                                                   NULL);
                        if (!p)
                                return -ENOMEM;
                        s->last_tx = p;
                }
                /* Idle for half the time after which the peer may free the
                 * stream: ours starts over, told by START (a no-op for a
                 * peer that kept it). */
                uint64_t now = dw_now_ns();
                if (p->tx_synced && rd_idle(p, now) >= rdd(qp->dev)->idle_ticks / 2 &&
                    rd_peer_restart(p))
                        rd_mbox_peer_restart(p); /* the peer's start over with ours */
                /* IB rule: a remote qkey with the high bit set means "use the QP's own". */
                if (w->remote_qkey & 0x80000000u)
                        w->remote_qkey = qp->attr.qkey;
        }
        w->priv = p;
        /* Fixed here, with the stream's segment size, for every copy. */
        w->ts_ns = rd_nseg(w->total_len, !p                       ? 1
                                         : op->kind == DW_WR_SEND ? rd_send_seg(p)
                                                                  : rd_peer_seg(p));
        if (op->response)
                w->ts_ns = 1;
        /* A large Send is receiver-paced: it pushes its first chunk and the
         * receiver pulls the rest (rd_pull.c). Not with Immediate Data, which
         * would need a segment's room beside the pull descriptor. */
        struct dw_rd_dev *d = rdd(qp->dev);
        if (p && d->pull_min && w->total_len >= d->pull_min && w->total_len > d->pull_chunk &&
            op->kind == DW_WR_SEND && !op->imm) {
                w->flags |= RD_W_PULL;
                w->pull_pushed = d->pull_chunk;
                w->ts_ns = rd_nseg(w->pull_pushed, rd_send_seg(p));
        }
        /* A message that consumes a receive WR counts in the Send queue's
         * MSNs, a request answered by a response in the Read queue's. */
        if (op->consumes_recv) {
                w->msn = p->tx_msn++;
        } else if (op->response) {
                if (w->total_len > UINT32_MAX)
                        return -EMSGSIZE;
                w->msn = p->tx_rreq++;
        }
        w->flags |= RD_W_QUEUED;
        return 0;
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

bool dw_rd_rq_make_room(struct dw_qp *qp)
{
        if (!qp->rd || !dw_wq_full(&qp->rq))
                return false;
        rd_rq_compact(qp->rd);
        return !dw_wq_full(&qp->rq);
}

void dw_rd_post_recv(struct dw_qp *qp)
{
        /* Bound to messages when their segments arrive, or now to those
         * parked in the mailbox. */
        if (qp->rd)
                rd_mbox_drain(qp->rd);
}

bool dw_rd_mbox_app(const struct dw_qp *qp)
{
        return qp->rd && qp->rd->mbox_app;
}

void dw_rd_srq_posted(struct dw_device *dev, const struct dw_srq_obj *srq)
{
        struct dw_rd_dev *d = rdd(dev);
        if (!d)
                return;
        for (struct dw_rd_qp *s = d->qps; s; s = s->next)
                if (s->mb && s->mb->ent_count && s->qp->srq == srq)
                        rd_mbox_drain(s);
}

void dw_rd_qp_error(struct dw_qp *qp)
{
        struct dw_rd_qp *s = qp->rd;
        if (!s)
                return;
        struct dw_rd_dev *d = rdd(qp->dev);
        if (d->hack.peer && d->hack.peer->s == s)
                rd_ack_flush(d);
        /* What arrived was accepted: the peer learns it, or its sends of it
         * would fail for want of an ACK that no one sends any more. */
        rd_flush_acks(s);
        rd_retire_held(s); /* they succeeded: not flushed */
        rd_tokens_drop(s);
        if (s->htab)
                for (uint32_t i = 0; i <= s->hmask; i++)
                        for (struct dw_rd_peer *p = s->htab[i]; p; p = p->hnext) {
                                p->dead = true; /* unlinked by the next progress step */
                                /* Nothing of it will be acknowledged now. */
                                rd_path_forget(p);
                        }
        rdd(qp->dev)->timers_dirty = true;
        /* Receive WQEs that already completed (behind an older unfinished one)
         * leave the ring now, so the flush does not complete them twice. */
        struct dw_wq *rq = &qp->rq;
        rd_rq_compact(s);
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

int dwe_post_send_rd(struct diwarp_qp *q, struct diwarp_send_wr *wr,
                     const struct diwarpdv_rd_dest *dest, struct diwarp_send_wr **bad_wr)
{
        struct dw_qp *qp = dw_qp_of(q);
        int err = 0;
        if (dest->remote_qpn & ~DW_DGRAM_QPN_MASK) {
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
                    dw_wr_op(wr->opcode)->kind == DW_WR_INVALID ||
                    wr->opcode == DIWARP_WR_BIND_MW) { /* windows bind through post_send */
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
        dw_progress_step(&dev->prog, DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&dev->lock);
        return err;
}

int dwe_query_rd_path(struct diwarp_qp *q, const struct diwarpdv_rd_dest *dest,
                      struct diwarpdv_rd_path *out)
{
        struct dw_qp *qp = dw_qp_of(q);
        if (!qp->rd || (!dest) != qp->rd->rc)
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
                const struct dw_cc *c = &p->path->cc;
                memset(out, 0, sizeof(*out));
                out->max_dgram = p->udp_mtu;
                out->seg_payload = rd_peer_seg(p);
                out->dev_max_sent = rdd(dev)->dgram_max;
                out->cwnd = c->cwnd;
                out->inflight = c->inflight;
                out->min_rtt_ns = c->min_rtt == UINT32_MAX ? 0 : c->min_rtt;
                out->srtt_ns = c->srtt;
                out->pacing_bps = c->p->enabled ? dw_cc_rate(c) * 8 : 0; /* off: not paced */
                out->cc_decrease_delay = c->stats.md_delay;
                out->cc_decrease_loss = c->stats.md_loss;
                out->cc_rto = c->stats.rto;
                out->cc_window_waits = c->stats.cwnd_waits;
                out->cc_pacing_waits = c->stats.pace_waits + c->stats.drain_waits;
                out->tail_probes = p->rel.stats.tail_probes;
                out->rto_expiries = p->rel.stats.rto_expiries;
                out->fast_retransmits = p->rel.stats.fast_retransmits;
                out->retransmits = p->rel.stats.retransmits;
        } else {
                err = -ENOENT;
        }
        pthread_mutex_unlock(&dev->lock);
        return err;
}
