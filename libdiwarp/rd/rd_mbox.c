/* The credit-based mailbox receive ring of an RD QP (the model is
 * flow/credit.c, the wire docs/PROTOCOL.md "Credits").
 *
 * Every Send segment takes credits at its sender when it first leaves, one
 * per slot its payload fills (at least one), and arrives once at the
 * receiver, when rel/ accepts its PSN. A segment whose receive WQE is posted
 * is placed in it and its slots are retrieved at once; one that finds no
 * receive WQE is parked in the ring (its sender held the credits, so there is
 * room) and delivered, oldest first, when receives are posted. So a Send that
 * comes early costs no RNR NAK and no retransmission. Once anything is
 * parked, later Sends that need a new receive WQE park behind it: receive
 * WQEs go to messages in arrival order, as the ring is read in order.
 *
 * Credit values are cumulative and travel in the datagram header's 16-bit
 * credit field, on every datagram to a peer that has an index here: data
 * packets return what was retrieved (piggyback), ACKs carry the limit, and a
 * control-only CREDIT datagram goes when a threshold is reached. A sender
 * that waits for credits asks for the value (CREDIT|ACKREQ) every
 * RD_CREDIT_PROBE_NS, which recovers a lost credit datagram. A peer whose
 * datagrams carry no credit value runs without credits (DIWARP_CREDIT=off,
 * or more peers than this end has indices for): its Sends are not charged
 * and ours to it are not either; a Send beyond its credit that finds no
 * receive WQE gets an RNR NAK, as without credits.
 */
#define _GNU_SOURCE
#include "api/backend.h"
#include "rd/rd_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <diwarp/diwarpdv.h>

#include "rdmap/rdmap.h"
#include "util/log.h"

#define RD_CREDIT_PROBE_NS (2ull * 1000 * 1000)

/* len bytes of shared memory mapped twice in a row (len a multiple of the
 * page size): byte i and byte len + i are the same. MAP_FAILED on failure. */
static void *ring_map_twice(size_t len)
{
        int fd = memfd_create("diwarp-mailbox", MFD_CLOEXEC);
        if (fd < 0)
                return MAP_FAILED;
        void *base = MAP_FAILED;
        if (ftruncate(fd, (off_t)len) == 0)
                base = mmap(NULL, 2 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base != MAP_FAILED &&
            (mmap(base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED ||
             mmap((uint8_t *)base + len, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                  0) == MAP_FAILED)) {
                munmap(base, 2 * len);
                base = MAP_FAILED;
        }
        close(fd);
        return base;
}

int rd_mbox_init(struct dw_rd_qp *s)
{
        const struct dw_config *cfg = &s->qp->dev->cfg;
        /* RC keeps InfiniBand's meaning of a Send completion (the message is
         * in a receive WR of the responder) unless told otherwise: a parked
         * Send completes before that, and a responder that tears down before
         * posting its receive loses it (docs/PROTOCOL.md, "Credits"). */
        if (cfg->credit == DW_CREDIT_OFF || (s->rc && !cfg->credit_rc_park))
                return 0;
        struct rd_mbox *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        uint32_t npeers = s->rc ? 1 : cfg->credit_peers;
        bool dyn = cfg->credit == DW_CREDIT_ON_DYNAMIC;
        struct dw_credit_cfg cc;
        dw_credit_cfg_default(&cc, dyn ? DW_CREDIT_DYNAMIC : DW_CREDIT_STATIC, npeers,
                              cfg->credit_ring);
        cc.slot_size = cfg->credit_slot;
        cc.credit_slots = cfg->credit_cslots;
        if (dyn) {
                cc.min_quota = cfg->credit_min_quota;
                /* A Send segment takes its credits at once: at most the floor. */
                cc.msg_slots = cc.min_quota ? cc.min_quota : cc.credit_slots;
                /* Requests and responses are reliable segments of the stream,
                 * processed as they arrive: no slot of the ring. */
                cc.ctl_free = true;
        }
        char why[160];
        int e = dw_credit_init(&m->cr, &cc, why, sizeof(why));
        if (e < 0) {
                dw_warn("RD QP %#x: credits: %s", s->qp->qpn, why);
                free(m);
                return e;
        }
        m->slot_size = cc.slot_size;
        m->ring_slots = cc.ring_slots;
        /* A segment never needs more credits than a sender surely gets: its
         * quota (static), its floor (dynamic: what it holds when idle). */
        uint64_t quota =
            dyn ? (cc.min_quota ? cc.min_quota : cc.credit_slots) : cc.ring_slots / npeers;
        uint64_t cap = quota * cc.slot_size;
        m->seg_cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
        m->buf_len = (size_t)cc.ring_slots * cc.slot_size;
        m->app = s->mbox_app;
        /* Mapped, not allocated: pages cost memory only once a segment was
         * parked on them. */
        void *b = m->app ? ring_map_twice(m->buf_len)
                         : mmap(NULL, m->buf_len, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        m->ent = calloc(cc.ring_slots, sizeof(*m->ent));
        m->idx_peer = calloc(npeers, sizeof(*m->idx_peer));
        m->idx_new = calloc(npeers, sizeof(*m->idx_new));
        if (m->app)
                m->ent_at = calloc(cc.ring_slots, sizeof(*m->ent_at));
        if (b == MAP_FAILED || !m->ent || !m->idx_peer || !m->idx_new || (m->app && !m->ent_at)) {
                if (b != MAP_FAILED)
                        munmap(b, m->app ? 2 * m->buf_len : m->buf_len);
                free(m->ent);
                free(m->idx_peer);
                free(m->idx_new);
                free(m->ent_at);
                dw_credit_fini(&m->cr);
                free(m);
                return -ENOMEM;
        }
        m->buf = b;
        s->mb = m;
        return 0;
}

void rd_mbox_fini(struct dw_rd_qp *s)
{
        struct rd_mbox *m = s->mb;
        if (!m)
                return;
        munmap(m->buf, m->app ? 2 * m->buf_len : m->buf_len);
        free(m->ent);
        free(m->idx_peer);
        free(m->idx_new);
        free(m->ent_at);
        dw_credit_fini(&m->cr);
        free(m);
        s->mb = NULL;
}

int rd_mbox_reset(struct dw_rd_qp *s)
{
        if (!s->mb)
                return 0;
        rd_mbox_fini(s);
        return rd_mbox_init(s);
}

void rd_mbox_peer_new(struct dw_rd_qp *s, struct dw_rd_peer *p)
{
        struct rd_mbox *m = s->mb;
        if (!m)
                return;
        uint32_t idx = m->next_idx;
        if (m->idx_free) {
                /* An index a freed stream gave back: its counters start
                 * afresh (rd_mbox_peer_gone), as the peer's do for a new
                 * stream. */
                for (idx = 0; m->idx_peer[idx]; idx++)
                        ;
                m->idx_free--;
        } else if (idx >= m->cr.cfg.npeers) {
                return; /* runs without credits */
        } else {
                m->next_idx++;
        }
        m->idx_peer[idx] = p;
        p->cr_idx = (uint16_t)(idx + 1);
}

bool rd_mbox_peer_gone(struct dw_rd_peer *p, bool check_only)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || !p->cr_idx)
                return true;
        if (m->cr.cfg.mode != DW_CREDIT_STATIC)
                return false;
        if (check_only)
                return true;
        uint32_t idx = p->cr_idx - 1;
        dw_credit_peer_reset(&m->cr, idx);
        m->idx_peer[idx] = NULL;
        m->idx_free++;
        p->cr_idx = 0;
        return true;
}

uint32_t rd_mbox_restart_parked(struct dw_rd_peer *p, uint32_t old_bind, uint32_t start,
                                uint32_t start_psn)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || m->app)
                return start;
        /* Nothing was under way (rd_peer_resync): every parked Send of p is
         * whole and unbound, its MSNs old_bind, old_bind + 1, ... */
        uint32_t k = 0;
        for (uint32_t i = 0; i < m->ent_count; i++) {
                const struct rd_mb_ent *e = &m->ent[(m->ent_head + i) % m->ring_slots];
                int32_t d = dw_psn_diff(e->g.msn, old_bind);
                if (e->peer == p && d >= 0 && (uint32_t)d + 1 > k)
                        k = (uint32_t)d + 1;
        }
        uint32_t first = start - k;
        if (k)
                m->idx_new[p->cr_idx - 1] = start; /* a parked Send has an index */
        for (uint32_t i = 0; k && i < m->ent_count; i++) {
                struct rd_mb_ent *e = &m->ent[(m->ent_head + i) % m->ring_slots];
                if (e->peer == p) {
                        e->g.msn = e->g.msn - old_bind + first;
                        /* Received whole before the start: its last PSN is
                         * behind the new cursor, so it completes once placed. */
                        e->g.psn = start_psn - 1;
                }
        }
        return first;
}

void rd_mbox_peer_restart(struct dw_rd_peer *p)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || !p->cr_idx || dw_credit_peer_reset(&m->cr, p->cr_idx - 1) < 0)
                return;
        p->cr_wait = false;
        m->ctl = true;
}

static uint32_t slots_for(const struct rd_mbox *m, uint32_t len)
{
        return dw_credit_slots_for(&m->cr, len);
}

int rd_mbox_tx_take(struct dw_rd_peer *p, uint32_t len, uint64_t now)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || !p->cr_idx || p->cr_off)
                return 0;
        uint32_t need = slots_for(m, len);
        if (dw_credit_tx_avail(&m->cr, p->cr_idx - 1) >= need) {
                dw_credit_tx_take(&m->cr, p->cr_idx - 1, need);
                p->cr_wait = false;
                return (int)need;
        }
        struct dw_qp *qp = p->s->qp;
        if (!p->cr_wait) {
                p->cr_wait = true;
                qp->ctr.credit_stalls++;
                qp->dev->ctr.credit_stalls++;
                m->probe_at = now + RD_CREDIT_PROBE_NS;
        } else if (now >= m->probe_at) {
                /* The credit datagram that would free us may have been lost. */
                rd_send_credit(p, true);
                qp->ctr.credit_probes++;
                qp->dev->ctr.credit_probes++;
                m->probe_at = now + RD_CREDIT_PROBE_NS;
        }
        dw_progress_timer(&qp->dev->prog, m->probe_at);
        return -1;
}

void rd_mbox_tx_untake(struct dw_rd_peer *p, uint32_t slots)
{
        struct rd_mbox *m = p->s->mb;
        if (m && p->cr_idx && slots)
                dw_credit_tx_untake(&m->cr, p->cr_idx - 1, slots);
}

void rd_mbox_hdr(struct dw_rd_peer *p, struct dw_dgram_hdr *h, bool reliable)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || !p->cr_idx)
                return;
        uint32_t limit;
        if (reliable) {
                if (dw_credit_piggyback(&m->cr, p->cr_idx - 1, &limit) < 0)
                        return;
        } else {
                limit = dw_credit_limit(&m->cr, p->cr_idx - 1);
        }
        h->flags |= DW_DGRAM_F_CREDIT;
        h->credits = (uint16_t)limit;
}

void rd_mbox_rx_hdr(struct dw_rd_peer *p, const struct dw_dgram_hdr *h)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || !p->cr_idx)
                return;
        if (!(h->flags & DW_DGRAM_F_CREDIT)) {
                p->cr_off = true;
                return;
        }
        p->cr_off = false;
        uint32_t idx = p->cr_idx - 1;
        uint32_t limit = dw_credit_widen16(&m->cr, idx, h->credits);
        int r = dw_credit_tx_update(&m->cr, idx, limit);
        if (r > 0)
                m->ctl = true; /* a compulsory request or response may wait for it */
        if (r < 0) {
                char pb[64];
                dw_dbg("RD QP %#x peer %s: credit value %u ignored (beyond any ring)",
                       p->s->qp->qpn, rd_peer_str(p, pb, sizeof(pb)), h->credits);
        }
        /* A probe asks for the value at once, and for every retrieved slot:
         * the sender waits. */
        if (!(h->flags & DW_DGRAM_F_DATA) && (h->flags & DW_DGRAM_F_ACKREQ)) {
                dw_credit_flush(&m->cr, idx);
                rd_send_credit(p, false);
        }
}

void rd_mbox_account(struct dw_rd_peer *p, uint32_t len)
{
        struct rd_mbox *m = p->s->mb;
        if (!m || !p->cr_idx)
                return;
        /* A sender without credits for it (it runs without them) is not
         * counted: nothing was taken, nothing is owed back. */
        if (dw_credit_rx_consumed(&m->cr, p->cr_idx - 1, slots_for(m, len)) == 0)
                m->ctl = true;
}

enum rd_verdict rd_mbox_park(struct dw_rd_peer *p, const struct rd_seg *g, const uint8_t *pay)
{
        struct dw_rd_qp *s = p->s;
        struct rd_mbox *m = s->mb;
        /* After an error NAK the peer's stream is over (its QP goes to ERR):
         * a later Send parked now would hold the next receive WR for ever. */
        if (!m || !p->cr_idx || p->nak_code)
                return RV_RNR;
        uint32_t n = slots_for(m, g->len), pos;
        if (dw_credit_rx_arrive(&m->cr, p->cr_idx - 1, n, &pos) < 0)
                return RV_RNR; /* no credit for it: a sender without credits */
        size_t off = (size_t)pos * m->slot_size;
        size_t first = m->buf_len - off < g->len ? m->buf_len - off : g->len;
        memcpy(m->buf + off, pay, first);
        memcpy(m->buf, pay + first, g->len - first);
        struct rd_mb_ent *e = &m->ent[(m->ent_head + m->ent_count) % m->ring_slots];
        *e = (struct rd_mb_ent){.peer = p,
                                .pos = pos,
                                .nslots = n,
                                .g = *g,
                                .late = (p->rel.rx_map[0] | p->rel.rx_map[1]) != 0};
        m->late += e->late;
        m->ent_count++;
        s->qp->ctr.mbox_parked++;
        s->qp->dev->ctr.mbox_parked++;
        return RV_ACCEPT;
}

void rd_mbox_drain(struct dw_rd_qp *s)
{
        struct rd_mbox *m = s->mb;
        if (!m || !m->ent_count || m->app)
                return;
        /* Oldest first. Once one finds too few receive WRs, no later one binds
         * a new WR (they go in arrival order), but a later one whose message
         * is bound already (its MSN came through a reordered stream, after a
         * later MSN that bound it) is delivered: its WR waits for it, and the
         * WRs behind it for their completion. */
        bool short_of_wrs = false;
        struct dw_rd_peer *last = NULL;
        for (uint32_t i = 0; i < m->ent_count; i++) {
                struct rd_mb_ent *e = &m->ent[(m->ent_head + i) % m->ring_slots];
                struct dw_rd_peer *p = e->peer;
                if (!p)
                        continue; /* delivered */
                if (!p->dead && s->qp->state != DIWARP_QPS_ERR) {
                        bool bound = dw_psn_diff(e->g.msn, p->rx_bind) < 0;
                        if (!bound && short_of_wrs) {
                                /* Only a segment that came late can be bound
                                 * behind one that waits. */
                                if (!m->late)
                                        break;
                                continue;
                        }
                        struct dw_wqe *w = rd_rx_bind(s, p, e->g.msn);
                        if (!w && !bound) {
                                short_of_wrs = true;
                                if (!m->late)
                                        break;
                                continue;
                        }
                        /* Bound but gone: its message already failed, and
                         * its bytes go with it. A failure completes the WR
                         * with its error; the segment was acknowledged long
                         * ago, so the sender learns nothing of it
                         * (docs/PROTOCOL.md). */
                        if (w) {
                                size_t off = (size_t)e->pos * m->slot_size;
                                uint32_t first = m->buf_len - off < e->g.len
                                                     ? (uint32_t)(m->buf_len - off)
                                                     : e->g.len;
                                uint8_t nak = 0;
                                rd_send_place(s, p, w, &e->g, m->buf + off, m->buf, first, -1,
                                              &nak);
                        }
                }
                dw_credit_rx_release(&m->cr, e->pos, e->nslots);
                m->ctl = true;
                m->late -= e->late;
                e->peer = NULL;
                if (last && last != p && !last->dead)
                        rd_rx_complete(s, last);
                last = p;
        }
        while (m->ent_count && !m->ent[m->ent_head].peer) {
                m->ent_head = (m->ent_head + 1) % m->ring_slots;
                m->ent_count--;
        }
        if (last && !last->dead)
                rd_rx_complete(s, last);
        rd_mbox_ctl(s);
}

void rd_mbox_ctl(struct dw_rd_qp *s)
{
        struct rd_mbox *m = s->mb;
        if (!m || !m->ctl)
                return;
        m->ctl = false;
        struct dw_credit_ctl c;
        /* A compulsory request or response needs an entry until its ACK; with
         * none free the rest waits in the model's queue for the next step. */
        while (m->ncctl < RD_MAX_CCTL && dw_credit_next_ctl(&m->cr, &c) == 1) {
                struct dw_rd_peer *p = c.peer < m->next_idx ? m->idx_peer[c.peer] : NULL;
                if (!p || p->dead)
                        continue;
                if (c.type == DW_CREDIT_CTL_CREDIT) {
                        rd_send_credit(p, false);
                        s->qp->ctr.credit_msgs++;
                        s->qp->dev->ctr.credit_msgs++;
                        continue;
                }
                uint32_t i = 0;
                while (m->cctl[i].peer)
                        i++;
                m->cctl[i] = (struct rd_cctl){.peer = p, .value = c.value, .type = (uint8_t)c.type};
                m->ncctl++;
                m->cctl_unsent++;
                s->qp->ctr.credit_msgs++;
                s->qp->dev->ctr.credit_msgs++;
        }
        if (m->ncctl == RD_MAX_CCTL)
                m->ctl = true; /* look again once an entry frees */
}

void rd_mbox_cctl_acked(struct dw_rd_qp *s, uint32_t slot)
{
        struct rd_mbox *m = s->mb;
        if (!m || slot == 0 || slot > RD_MAX_CCTL || !m->cctl[slot - 1].peer)
                return;
        m->cctl[slot - 1].peer = NULL;
        m->ncctl--;
}

enum rd_verdict rd_mbox_cctl_rx(struct dw_rd_peer *p, const uint8_t *seg, size_t len)
{
        struct dw_rd_qp *s = p->s;
        struct rd_mbox *m = s->mb;
        char pb[64];
        if (len != RD_CCTL_LEN || seg[0] != (DW_DDP_CTRL_L | DW_DDP_VERSION) ||
            dw_get_be32(seg + 2) != 0 || dw_get_be32(seg + 6) != RD_CCTL_QN ||
            dw_get_be32(seg + 14) != 0 ||
            (seg[1] != RD_CCTL_REQUEST && seg[1] != RD_CCTL_RESPONSE)) {
                dw_dbg("RD QP %#x peer %s: malformed credit control segment dropped", s->qp->qpn,
                       rd_peer_str(p, pb, sizeof(pb)));
                return RV_DROP;
        }
        /* Taken as delivered whatever becomes of it: refusing it would only
         * have the peer send it again. */
        if (!m || !p->cr_idx || m->cr.cfg.mode != DW_CREDIT_DYNAMIC) {
                dw_dbg("RD QP %#x peer %s: credit control ignored (dynamic credits are off here)",
                       s->qp->qpn, rd_peer_str(p, pb, sizeof(pb)));
                return RV_ACCEPT;
        }
        uint32_t idx = p->cr_idx - 1;
        int e = seg[1] == RD_CCTL_REQUEST
                    ? dw_credit_on_request(&m->cr, idx)
                    : dw_credit_on_response(&m->cr, idx, dw_get_be32(seg + 18));
        if (e < 0)
                dw_dbg("RD QP %#x peer %s: credit control %u refused by the model (%d)", s->qp->qpn,
                       rd_peer_str(p, pb, sizeof(pb)), seg[1], e);
        m->ctl = true;
        return RV_ACCEPT;
}

/* ---------------------------------------------------------------- application mailbox */

enum rd_verdict rd_mbox_app_rx(struct dw_rd_peer *p, const struct rd_seg *g, const uint8_t *pay,
                               bool pull, uint8_t *nak)
{
        struct dw_rd_qp *s = p->s;
        struct rd_mbox *m = s->mb;
        char pb[64];
        if (pull || g->mo != 0 || !g->last || g->len > m->seg_cap) {
                /* Its length is unknown until its last segment: no place for
                 * it in the ring can be chosen now. */
                dw_warn_limited(&s->qp->dev->log_limit,
                                "RD QP %#x peer %s: a Send of more than one segment (MSN %u) to an "
                                "application mailbox, which takes one segment of at most %u bytes",
                                s->qp->qpn, rd_peer_str(p, pb, sizeof(pb)), g->msn, m->seg_cap);
                *nak = DW_DGRAM_NAK_INVALID;
                return RV_NAK;
        }
        if (!p->cr_idx || p->nak_code)
                return RV_RNR;
        uint32_t n = slots_for(m, g->len), pos;
        if (dw_credit_rx_arrive(&m->cr, p->cr_idx - 1, n, &pos) < 0)
                return RV_RNR; /* a sender without credits: room comes as slots are released */
        memcpy(m->buf + (size_t)pos * m->slot_size, pay, g->len); /* mapped twice: no wrap */
        uint32_t k = (m->ent_head + m->ent_count) % m->ring_slots;
        struct rd_mb_ent *e = &m->ent[k];
        *e = (struct rd_mb_ent){.peer = p, .pos = pos, .nslots = n, .g = *g};
        m->ent_at[pos] = k + 1;
        m->ent_count++;
        s->qp->ctr.mbox_parked++;
        s->qp->dev->ctr.mbox_parked++;
        return RV_ACCEPT;
}

void rd_mbox_app_complete(struct dw_rd_qp *s, struct dw_rd_peer *p)
{
        struct rd_mbox *m = s->mb;
        uint32_t cur = dw_rel_rx_cursor(&p->rel);
        for (bool more = true; more;) {
                more = false;
                for (uint32_t i = 0; i < m->ent_count; i++) {
                        struct rd_mb_ent *e = &m->ent[(m->ent_head + i) % m->ring_slots];
                        if (e->peer != p || e->delivered || e->g.msn != p->rx_done)
                                continue;
                        if (!dw_psn_before(e->g.psn, cur))
                                return;
                        struct dw_rdmap_msg_end end = rd_seg_end(&e->g, e->g.len);
                        struct dw_recv_done d;
                        bool se = dw_rdmap_recv_end(dw_rdmap_qp_of(s->qp), &end, &d, NULL);
                        d.src_qp = p->rqpn;
                        e->delivered = true;
                        p->rx_done++;
                        p->rx_bind = p->rx_done;
                        /* The mailbox slot's address is its wr_id. */
                        dw_qp_recv_done(s->qp, (uintptr_t)(m->buf + (size_t)e->pos * m->slot_size),
                                        &d, se);
                        more = true;
                        break;
                }
        }
}

int dwe_mbox_open(struct diwarp_qp *q, struct diwarpdv_mbox *out)
{
        struct dw_qp *qp = dw_qp_of(q);
        struct dw_device *dev = qp->dev;
        pthread_mutex_lock(&dev->lock);
        struct dw_rd_qp *s = qp->rd;
        const char *why = NULL;
        if (!s || s->rc)
                why = "not an RD QP";
        else if (qp->state != DIWARP_QPS_RESET && qp->state != DIWARP_QPS_INIT)
                why = "not in RESET or INIT";
        else if (qp->srq || dw_wq_count(&qp->rq))
                why = "it has receive WRs (posted, or an SRQ)";
        else if (dev->cfg.credit == DW_CREDIT_OFF)
                why = "credits are off (DIWARP_CREDIT=off)";
        else if (((size_t)dev->cfg.credit_ring * dev->cfg.credit_slot) % (size_t)getpagesize())
                why = "the ring (DIWARP_CREDIT_RING x DIWARP_CREDIT_SLOT) is not a multiple of "
                      "the page size";
        int err = 0;
        if (why) {
                dw_warn("QP %#x: no application mailbox: %s", qp->qpn, why);
                err = -EINVAL;
        } else if (!s->mbox_app) {
                rd_mbox_fini(s);
                s->mbox_app = true;
                err = rd_mbox_init(s);
                if (err < 0)
                        s->mbox_app = false;
        }
        if (!err) {
                struct rd_mbox *m = s->mb;
                *out = (struct diwarpdv_mbox){.ring = m->buf,
                                              .len = m->buf_len,
                                              .slot_size = m->slot_size,
                                              .slots = m->ring_slots,
                                              .max_msg = m->seg_cap};
        }
        pthread_mutex_unlock(&dev->lock);
        return err;
}

int dwe_mbox_release(struct diwarp_qp *q, const void *msg)
{
        struct dw_qp *qp = dw_qp_of(q);
        struct dw_device *dev = qp->dev;
        pthread_mutex_lock(&dev->lock);
        struct dw_rd_qp *s = qp->rd;
        struct rd_mbox *m = s && s->mbox_app ? s->mb : NULL;
        int err = -EINVAL;
        /* Messages start on slot boundaries of the first mapping. */
        uintptr_t off = m ? (uintptr_t)msg - (uintptr_t)m->buf : 0;
        uint32_t k =
            m && off < m->buf_len && off % m->slot_size == 0 ? m->ent_at[off / m->slot_size] : 0;
        struct rd_mb_ent *e = k ? &m->ent[k - 1] : NULL;
        /* Not handed out yet (no completion): not the application's. */
        if (e && e->peer && e->delivered) {
                dw_credit_rx_release(&m->cr, e->pos, e->nslots);
                m->ent_at[e->pos] = 0;
                e->peer = NULL;
                m->ctl = true;
                err = 0;
        }
        while (m && m->ent_count && !m->ent[m->ent_head].peer) {
                m->ent_head = (m->ent_head + 1) % m->ring_slots;
                m->ent_count--;
        }
        if (!err)
                rd_mbox_ctl(s);
        else
                dw_warn("QP %#x: diwarpdv_mbox_release(%p): not a message the mailbox handed "
                        "out and not yet released",
                        qp->qpn, msg);
        pthread_mutex_unlock(&dev->lock);
        return err;
}
