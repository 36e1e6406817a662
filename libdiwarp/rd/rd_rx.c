/* RD receive: each datagram is checked and placed straight from the bounce
 * buffer (or, for a large Write or Read Response continuation, from the
 * socket into its target: dw_rd_rx_direct), accepted by rel/, and completed
 * in order; Read and Atomic Requests are queued for rd_tx.c to answer.
 *
 * The datagram is still in the llp bounce buffer; a NEW segment is
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
#include "rd/rd_int.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rdmap/rdmap.h"
#include "util/copy.h"
#include "wire/rdmap.h"

/* A thread away from the socket longer than d->stamp_gap_ns (descheduled,
 * or asleep in epoll) may find datagrams that waited: even a lone one is
 * read with its kernel stamp then, so that congestion control does not take
 * the wait for queueing. A shorter wait cannot look like queueing by
 * itself, and a busy-polling ping-pong, whose round trips now and then take
 * tens of µs on a shared machine (an interrupt, a hypervisor's exit), keeps
 * the cheaper receive: with a 20 µs gap it switched stamps on and off again
 * every 80 messages on this project's test VM, ≈ 0.25 µs a half round trip. */
void dw_rd_rx_clock(struct dw_device *dev)
{
        struct dw_rd_dev *d = rdd(dev);
        if (d && (d->qps || d->active)) {
                uint64_t before = d->step_now;
                if (rd_clock(dev) - before > d->stamp_gap_ns)
                        dw_udp_stamp_lone(&dev->udp);
                d->rx_clock = true;
        }
}

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
void rd_ack_flush(struct dw_rd_dev *d)
{
        struct dw_rd_peer *p = d->hack.peer;
        if (!p)
                return;
        d->hack.peer = NULL;
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK,
                                 .ack_psn = d->hack.ack_psn};
        int r = rd_on_ack(p, &h, d->hack.now, d->hack.arrived);
        if ((r == -EREMOTEIO || r == -ETIMEDOUT) && p->s->qp->state != DIWARP_QPS_ERR)
                rd_peer_fail(
                    p, r == -EREMOTEIO ? DIWARP_WC_RNR_RETRY_EXC_ERR : DIWARP_WC_RETRY_EXC_ERR,
                    DIWARP_EVENT_QP_FATAL, RD_WHY_REL);
}

/* ---------------------------------------------------------------- receive */

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
        if (dw_wq_count(&q->wq) < need - have)
                return false;
        if (qp->rq.capacity - dw_wq_count(&qp->rq) < need - have)
                rd_rq_compact(s);
        if (qp->rq.capacity - dw_wq_count(&qp->rq) < need - have)
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

/* Whether queue-0 MSN msn of p lies in the receive window: from the next
 * message to complete, at most RD_MSN_WINDOW messages ahead, or as many as
 * the stream's credit grant when it is larger (with credits, every message
 * not yet arrived holds at least one credit). A message beyond it would
 * bind the receive WQEs of every MSN before it at once, to messages that
 * may never come: a forged one could take a whole RQ (or SRQ). */
static bool rd_msn_in_window(const struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t msn)
{
        int32_t ahead = dw_psn_diff(msn, p->rx_done);
        if (ahead < 0)
                return false;
        if (p->rx_old) {
                /* The old start's parked Sends sit before the new start:
                 * the new ones' window begins after them. */
                int32_t old = dw_psn_diff(rd_mbox_new_msn(p), p->rx_done);
                if (old > 0)
                        ahead = ahead < old ? 0 : ahead - old;
                else
                        p->rx_old = false; /* they are through */
        }
        if ((uint32_t)ahead < RD_MSN_WINDOW)
                return true;
        struct dw_credit_view v;
        return s->mb && p->cr_idx && !p->cr_off &&
               dw_credit_view(&s->mb->cr, p->cr_idx - 1, &v) == 0 && (uint32_t)ahead < v.intended;
}

/* Receive WQE bound to (p, msn), binding WQEs in MSN order first. NULL:
 * not enough receive WQEs posted (RNR). */
struct dw_wqe *rd_rx_bind(struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t msn)
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
                        w->recv_end = 0;
                }
                p->rx_bind = msn + 1;
        }
        struct dw_wqe *w;
        for (uint32_t i = 0; i < s->rq_bound && (w = dw_wq_at(&qp->rq, i)); i++)
                if (w->priv == p && w->msn == msn && !(w->flags & DW_WQE_DONE))
                        return w;
        return NULL;
}

/* A receive WQE changed slot: a pull filling it follows it. */
static void rd_rq_moved(void *ctx, const struct dw_wqe *from, struct dw_wqe *to)
{
        struct dw_rd_qp *s = ctx;
        for (int i = 0; i < RD_MAX_PULL; i++)
                if (s->pull[i].peer && s->pull[i].w == from)
                        s->pull[i].w = to;
}

void rd_rq_compact(struct dw_rd_qp *s)
{
        struct dw_wq *rq = &s->qp->rq;
        uint32_t bound_done = 0;
        for (uint32_t i = 0; i < s->rq_bound; i++)
                if (dw_wq_at(rq, i)->flags & DW_WQE_DONE)
                        bound_done++;
        dw_wq_drop_done(rq, rd_rq_moved, s);
        s->rq_bound -= bound_done;
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

void rd_recv_fail(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                  enum diwarp_wc_status st, struct dw_term_error te)
{
        w->flags |= DW_WQE_DONE;
        dw_qp_recv_done(s->qp, w->wr_id,
                        &(struct dw_recv_done){
                            .status = st, .src_qp = p->rqpn, .vendor_err = dw_term_vendor_err(te)},
                        false);
        rd_rq_pop_done(s);
}

/* The run a segment of psn at to would extend: p's last run, of the same
 * STag, ending where the segment starts, at the PSN before it. */
static struct rd_ahead *rd_ahead_tail(const struct dw_rd_qp *s, const struct dw_rd_peer *p,
                                      uint32_t psn, uint32_t stag, uint64_t to)
{
        for (uint32_t i = s->nahead; i-- > 0;) {
                const struct rd_ahead *a = &s->ahead[i];
                if (a->peer == p)
                        return a->psn_hi + 1 == psn && a->stag == stag && a->to + a->len == to
                                   ? (struct rd_ahead *)a
                                   : NULL;
        }
        return NULL;
}

bool rd_ahead_room(const struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t psn,
                   uint32_t stag, uint64_t to)
{
        return s->nahead < RD_AHEAD || rd_ahead_tail(s, p, psn, stag, to);
}

/* Records len bytes at to of stag as placed by p's psn, ahead of its
 * cursor (the caller made sure of room: rd_ahead_room). */
static void rd_ahead_note(struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t psn, uint32_t stag,
                          uint64_t to, uint64_t len)
{
        struct rd_ahead *a = rd_ahead_tail(s, p, psn, stag, to);
        if (a) {
                a->psn_hi = psn;
                a->len += len;
        } else if (s->nahead < RD_AHEAD) {
                s->ahead[s->nahead++] = (struct rd_ahead){p, psn, psn, stag, to, len};
        }
}

/* Forgets p's runs the cursor has passed (all of them with all). */
static void rd_ahead_prune(struct dw_rd_qp *s, struct dw_rd_peer *p, bool all)
{
        uint32_t cur = dw_rel_rx_cursor(&p->rel);
        for (uint32_t i = 0; i < s->nahead;) {
                struct rd_ahead *a = &s->ahead[i];
                if (a->peer == p && (all || dw_psn_before(a->psn_hi, cur))) {
                        /* In order: rd_ahead_tail takes a peer's last run. */
                        memmove(a, a + 1, (s->nahead - i - 1) * sizeof(*a));
                        s->nahead--;
                        continue;
                }
                i++;
        }
}

/* Whether run a is of a later PSN than psn and overlaps [to, to + len) of stag. */
static bool rd_ahead_hit(const struct rd_ahead *a, const struct dw_rd_peer *p, uint32_t psn,
                         uint32_t stag, uint64_t to, uint64_t len)
{
        return a->peer == p && a->stag == stag && dw_psn_before(psn, a->psn_lo) &&
               a->to < to + len && to < a->to + a->len;
}

bool rd_ahead_overlaps(const struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t psn,
                       uint32_t stag, uint64_t to, uint64_t len)
{
        for (uint32_t i = 0; i < s->nahead; i++)
                if (rd_ahead_hit(&s->ahead[i], p, psn, stag, to, len))
                        return true;
        return false;
}

/* Places n bytes of p's psn at to of stag (host) from src, around every run
 * a later PSN placed there (those bytes are newer); the last piece last
 * byte last with lbl. Without runs (no PSN missing: the common case) one
 * copy. */
static void rd_place_runs(const struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t psn,
                          uint32_t stag, uint64_t to, uint8_t *host, const uint8_t *src, uint64_t n,
                          bool lbl);
static inline void rd_place_under(const struct dw_rd_qp *s, const struct dw_rd_peer *p,
                                  uint32_t psn, uint32_t stag, uint64_t to, uint8_t *host,
                                  const uint8_t *src, uint64_t n, bool lbl)
{
        if (s->nahead)
                rd_place_runs(s, p, psn, stag, to, host, src, n, lbl);
        else if (lbl)
                dw_copy_last_byte_last(host, src, n);
        else
                memcpy(host, src, n);
}

static void rd_place_runs(const struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t psn,
                          uint32_t stag, uint64_t to, uint8_t *host, const uint8_t *src, uint64_t n,
                          bool lbl)
{
        uint64_t at = 0; /* bytes of the segment placed or skipped */
        while (at < n) {
                /* The next later run that overlaps what is left: its start
                 * ends this piece, its end starts the next. */
                uint64_t skip_lo = n, skip_hi = n;
                for (uint32_t i = 0; i < s->nahead; i++) {
                        const struct rd_ahead *a = &s->ahead[i];
                        if (!rd_ahead_hit(a, p, psn, stag, to + at, n - at))
                                continue;
                        uint64_t lo = a->to > to + at ? a->to - to : at;
                        uint64_t hi = a->to + a->len - to < n ? a->to + a->len - to : n;
                        if (lo < skip_lo || (lo == skip_lo && hi > skip_hi)) {
                                skip_lo = lo;
                                skip_hi = hi;
                        }
                }
                if (skip_lo > at) {
                        if (lbl && skip_lo == n)
                                dw_copy_last_byte_last(host + at, src + at, skip_lo - at);
                        else
                                memcpy(host + at, src + at, skip_lo - at);
                }
                at = skip_hi;
        }
}

void rd_tails_flush(struct dw_rd_qp *s, struct dw_rd_peer *p, bool all)
{
        uint32_t cur = dw_rel_rx_cursor(&p->rel);
        for (;;) {
                struct rd_tail *t = NULL;
                for (uint32_t i = 0; i < s->ntails; i++) {
                        struct rd_tail *x = &s->tails[i];
                        if (x->peer == p && (all || dw_psn_before(x->psn, cur)) &&
                            (!t || dw_psn_before(x->psn, t->psn)))
                                t = x;
                }
                if (!t)
                        return;
                /* The region may have gone since the segment was checked:
                 * checked again, and the bytes dropped if it did. */
                uint8_t *host = NULL; /* set when the check passes (gcc -O2 cannot see it) */
                if (dw_rdmap_write_accept(dw_rdmap_qp_of(s->qp), t->stag, t->to, t->len, &host,
                                          NULL) == 0)
                        rd_place_under(s, p, t->psn, t->stag, t->to, host, t->bytes, t->len, true);
                *t = s->tails[--s->ntails];
        }
        if (all && s->nahead)
                rd_ahead_prune(s, p, true);
}

/* Completes, in order, every message of p whose last PSN is below the cursor
 * (after the held tails of its Writes are in place). */
void rd_rx_complete(struct dw_rd_qp *s, struct dw_rd_peer *p)
{
        struct dw_qp *qp = s->qp;
        uint32_t cur = dw_rel_rx_cursor(&p->rel);
        if (s->ntails)
                rd_tails_flush(s, p, false);
        if (s->nahead)
                rd_ahead_prune(s, p, false); /* after the tails: they are placed around runs */
        if (s->mbox_app)
                rd_mbox_app_complete(s, p);
        for (;;) {
                struct dw_wqe *w = NULL, *x;
                for (uint32_t i = 0; i < s->rq_bound && (x = dw_wq_at(&qp->rq, i)); i++)
                        if (x->priv == p && x->msn == p->rx_done && !(x->flags & DW_WQE_DONE)) {
                                w = x;
                                break;
                        }
                if (!w || !(w->flags & RD_W_LAST) || !dw_psn_before(w->psn, cur))
                        break;
                struct dw_rdmap_msg_end e = dw_rdmap_wqe_end(w);
                struct dw_recv_done d;
                bool solicited = dw_rdmap_recv_end(dw_rdmap_qp_of(qp), &e, &d, NULL);
                d.src_qp = p->rqpn;
                w->flags |= DW_WQE_DONE;
                p->rx_done++;
                dw_qp_recv_done(qp, w->wr_id, &d, solicited);
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

static struct dw_wqe *rd_orq_find(struct dw_rd_qp *s, struct dw_rd_peer *p, uint32_t msn,
                                  bool atomic)
{
        for (uint32_t i = 0; i < s->norq; i++) {
                struct dw_wqe *w = s->orq[i];
                if (w->priv == p && w->msn == msn &&
                    (dw_wr_op(w->opcode)->kind == DW_WR_ATOMIC) == atomic)
                        return w;
        }
        return NULL;
}

int rd_irq_alloc(struct dw_rd_qp *s)
{
        if (s->fifo_count >= RD_MAX_IRQ)
                return -1;
        for (int i = 0; i < RD_MAX_IRQ; i++)
                if (!s->irq[i].peer)
                        return i;
        return -1;
}

void rd_irq_queue(struct dw_rd_qp *s, int idx)
{
        s->fifo[(s->fifo_head + s->fifo_count) % RD_MAX_IRQ] = (uint32_t)idx;
        s->fifo_count++;
}

int rd_send_place(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                  const struct rd_seg *g, const uint8_t *pay, const uint8_t *pay2, uint32_t len1,
                  int pull, uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        struct dw_rdmap_qp rq = dw_rdmap_qp_of(qp);
        int e = dw_rdmap_send_place(rq, w, g->mo, pay, len1);
        if (e == 0 && g->len > len1)
                e = dw_rdmap_send_place(rq, w, (uint64_t)g->mo + len1, pay2, g->len - len1);
        if (e < 0 && pull >= 0)
                rd_pull_free(s, &s->pull[pull]);
        else if (e < 0 && pull == -2 && s->pull_waiting)
                s->pull_waiting--;
        if (e < 0) {
                dw_warn_limited(&qp->dev->log_limit,
                                "RD QP %#x: receive WR %#llx (%llu bytes), MO %u: %s", qp->qpn,
                                (unsigned long long)w->wr_id, (unsigned long long)w->total_len,
                                g->mo, dw_rdmap_recv_why(e));
                rd_recv_fail(s, p, w, dw_rdmap_recv_wc(e), dw_rdmap_recv_term(e));
                *nak = dw_rdmap_term_to_nak(dw_rdmap_recv_term(e));
                return -1;
        }
        /* Pushed bytes and the newest PSN of a Send that may turn out to be
         * receiver-paced (its first segment may come last). */
        w->bytes_done += g->len;
        if (!(w->ts_ns >> 32) || dw_psn_before((uint32_t)w->ts_ns, g->psn))
                w->ts_ns = 1ull << 32 | g->psn;
        if (w->flags & RD_W_PULL)
                rd_pull_check(s, w);
        if (g->last) {
                w->psn = g->psn;
                w->flags |= RD_W_LAST;
                struct dw_rdmap_msg_end end = rd_seg_end(g, g->mo + g->len);
                dw_rdmap_wqe_end_note(w, &end);
        }
        qp->ctr.rx_bytes += g->len;
        return 0;
}

/* A request the responder refused (rdmap/'s refusal ref): a protection
 * failure is counted and logged, rate-limited (nothing is formatted for a
 * line held back), with the peer and what the request asked for (fmt); one
 * that did not decode only gets its NAK. The sender's WR fails with the
 * error NAK of the refusal's Terminate error. */
static __attribute__((format(printf, 5, 6))) enum rd_verdict
rd_refuse(struct dw_rd_qp *s, struct dw_rd_peer *p, const struct dw_rdmap_refusal *ref,
          uint8_t *nak, const char *fmt, ...)
{
        struct dw_qp *qp = s->qp;
        if (ref->st != DW_PROT_OK) {
                qp->dev->ctr.rx_dropped_protection++;
                qp->ctr.rx_dropped_protection++;
                if (dw_warn_limit_pass(&qp->dev->log_limit)) {
                        char what[96], pb[64];
                        va_list ap;
                        va_start(ap, fmt);
                        vsnprintf(what, sizeof(what), fmt, ap);
                        va_end(ap);
                        dw_log(DW_LOG_WARN, "RD QP %#x peer %s: %s: %s", qp->qpn,
                               rd_peer_str(p, pb, sizeof(pb)), what, ref->why);
                }
        }
        *nak = dw_rdmap_term_to_nak(ref->te);
        return RV_NAK;
}

/* A segment of a Send with Invalidate whose STag cannot be invalidated
 * (dw_rdmap_send_inval_accept): refused with the error NAK of its refusal,
 * as a Write to a bad STag is, so the sender's WR fails instead of being
 * acknowledged. The message's receive WR, when one is bound to it or can be
 * bound now, completes with REM_INV_REQ_ERR (the status the Invalidate at
 * completion gives); one a receiver-paced Send already pulls into is left to
 * its pull. */
static enum rd_verdict rd_inval_refused(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                        const struct dw_rdmap_hdr *r,
                                        const struct dw_rdmap_refusal *ref, uint8_t *nak)
{
        enum rd_verdict v = rd_refuse(s, p, ref, nak, "Send with Invalidate (MSN %u) of STag %#x",
                                      r->ddp.msn, r->inval_stag);
        bool unbound = dw_psn_diff(r->ddp.msn, p->rx_bind) >= 0;
        struct dw_wqe *w = NULL;
        if (!s->mbox_app && !(unbound && s->mb && s->mb->ent_count))
                w = rd_rx_bind(s, p, r->ddp.msn);
        if (w && !(w->flags & RD_W_PULL))
                rd_recv_fail(s, p, w, DIWARP_WC_REM_INV_REQ_ERR, ref->te);
        return v;
}

/* A NEW DATA segment decoded by rd_rx_segment, for its opcode's step. */
struct rd_rx_seg {
        struct dw_rdmap_hdr r;  /* the segment's RDMAP header */
        struct dw_rdmap_hdr ri; /* the Immediate's (has_imm) */
        uint8_t *pay;           /* the payload, plen bytes */
        size_t plen;
        uint32_t imm_val, imm_len;
        bool has_imm;
};

/* A Send segment: bound to its receive WQE (or parked in the mailbox, or
 * pulled by the receiver) and placed. */
static enum rd_verdict rd_rx_send(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                  const struct dw_dgram_hdr *h, const struct rd_rx_seg *x,
                                  uint8_t *nak)
{
        const struct dw_rdmap_hdr *r = &x->r;
        const struct dw_rdmap_hdr *ri = &x->ri;
        uint8_t *pay = x->pay;
        size_t plen = x->plen;
        bool has_imm = x->has_imm;

        if (dw_psn_before(r->ddp.msn, p->rx_done))
                return RV_DROP;
        if (!rd_msn_in_window(s, p, r->ddp.msn))
                return RV_WINDOW;
        /* Each segment, before it is accepted: the Invalidate itself comes as
         * the message completes, in order (rd_rx_complete). */
        struct dw_rdmap_refusal ref;
        if (dw_rdmap_send_inval(r->opcode) &&
            dw_rdmap_send_inval_accept(dw_rdmap_qp_of(s->qp), r->inval_stag, &ref) < 0)
                return rd_inval_refused(s, p, r, &ref, nak);
        struct rd_seg g = {.msn = r->ddp.msn,
                           .mo = r->ddp.mo,
                           .psn = h->psn,
                           .len = (uint32_t)plen,
                           .inval_stag = r->inval_stag,
                           .imm = x->imm_val,
                           .opcode = r->opcode,
                           .last = r->ddp.last,
                           .has_imm = has_imm,
                           .imm_se = has_imm && ri->opcode == DW_RDMAP_IMM_DATA_SE};
        /* No receive WQE for it yet, or older Sends are parked ahead
         * of it: into the mailbox (a receiver-paced Send's first
         * segment needs its WQE: RNR). */
        bool pull_seg = h->xflags & DW_DGRAM_X_PULL;
        if (s->mbox_app)
                return rd_mbox_app_rx(p, &g, pay, pull_seg, nak);
        bool unbound = dw_psn_diff(r->ddp.msn, p->rx_bind) >= 0;
        if (s->mb && unbound && s->mb->ent_count)
                return pull_seg ? RV_RNR : rd_mbox_park(p, &g, pay);
        struct dw_wqe *w = rd_rx_bind(s, p, r->ddp.msn);
        if (!w)
                return s->mb && unbound && !pull_seg ? rd_mbox_park(p, &g, pay) : RV_RNR;
        int pull = -1;
        if (pull_seg) {
                /* Before the placement: a refusal (no entry free: RNR)
                 * must leave nothing behind. */
                enum rd_verdict v = rd_pull_start(s, p, w, r, h, &pull, nak);
                if (v != RV_ACCEPT)
                        return v;
        }
        /* -2: the first segment of a receiver-paced Send waiting for
         * a pull entry. */
        if (pull_seg && pull < 0)
                pull = -2;
        int e = rd_send_place(s, p, w, &g, pay, NULL, (uint32_t)plen, pull, nak);
        rd_mbox_account(p, (uint32_t)plen);
        return e < 0 ? RV_NAK : RV_ACCEPT;
}

/* An RDMA Write segment: checked against its STag and placed; with
 * Immediate, it consumes a receive WQE. A large segment that is not the
 * last names where its successor goes (direct placement). */
static enum rd_verdict rd_rx_write(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                   const struct dw_dgram_hdr *h, const struct rd_rx_seg *x,
                                   uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        const struct dw_rdmap_hdr *r = &x->r;
        const struct dw_rdmap_hdr *ri = &x->ri;
        uint8_t *pay = x->pay;
        size_t plen = x->plen;
        bool has_imm = x->has_imm;

        struct dw_wqe *w = NULL;
        /* The message's last segment ahead of an earlier PSN of the stream:
         * its tail waits in a slot (RD_TAIL_HOLD), refused while none is
         * free, before anything is placed. */
        bool ahead = h->psn != dw_rel_rx_cursor(&p->rel);
        bool tail_late = r->ddp.last && plen && ahead;
        if (tail_late && s->ntails == RD_TAILS)
                return RV_WINDOW;
        /* Bytes placed ahead of a missing PSN (all but a last segment's
         * tail) are recorded (struct rd_ahead), refused while there is no
         * room for them. */
        uint32_t tail = r->ddp.last ? (plen < RD_TAIL_HOLD ? (uint32_t)plen : RD_TAIL_HOLD) : 0;
        if (ahead && plen > tail && !rd_ahead_room(s, p, h->psn, r->ddp.stag, r->ddp.to))
                return RV_WINDOW;
        if (has_imm) {
                if (dw_psn_before(ri->ddp.msn, p->rx_done))
                        return RV_DROP;
                if (!rd_msn_in_window(s, p, ri->ddp.msn))
                        return RV_WINDOW;
        }
        uint8_t *host = NULL;
        struct dw_rdmap_refusal ref;
        if (dw_rdmap_write_accept(dw_rdmap_qp_of(qp), r->ddp.stag, r->ddp.to, plen, &host, &ref) <
            0)
                return rd_refuse(s, p, &ref, nak, "RDMA Write to STag %#x TO %#llx len %zu",
                                 r->ddp.stag, (unsigned long long)r->ddp.to, plen);
        if (has_imm) {
                w = rd_rx_bind(s, p, ri->ddp.msn);
                if (!w)
                        return RV_RNR;
        }
        struct dw_rd_dev *d = rdd(dev);
        if (plen >= RD_DIRECT_MIN && !r->ddp.last && !has_imm) {
                d->rx_big = true;
                d->rx_next =
                    (struct rd_rx_next){p, h->psn + 1, r->ddp.stag, r->ddp.to + plen, false};
        } else if (d->rx_next.peer == p) {
                d->rx_next.peer = NULL;
        }
        /* The segment that ends the Write stores its tail last, last byte
         * last, and only once every earlier PSN of the stream is in: a
         * program polling the message's last byte then finds the rest of it
         * in place. The direct path read the tail aside (d->rx_tail). */
        if (plen) {
                const uint8_t *src = d->rx_placed ? d->rx_tail : pay + plen - tail;
                /* Around what later PSNs placed there already (struct
                 * rd_ahead); the direct path placed none that overlaps. */
                if (!d->rx_placed)
                        rd_place_under(s, p, h->psn, r->ddp.stag, r->ddp.to, host, pay, plen - tail,
                                       false);
                if (ahead && plen > tail)
                        rd_ahead_note(s, p, h->psn, r->ddp.stag, r->ddp.to, plen - tail);
                if (tail_late) {
                        struct rd_tail *t = &s->tails[s->ntails++];
                        t->peer = p;
                        t->psn = h->psn;
                        t->stag = r->ddp.stag;
                        t->to = r->ddp.to + plen - tail;
                        t->len = tail;
                        memcpy(t->bytes, src, tail);
                } else if (tail) {
                        rd_place_under(s, p, h->psn, r->ddp.stag, r->ddp.to + plen - tail,
                                       host + plen - tail, src, tail, true);
                }
        }
        if (w) {
                w->psn = h->psn;
                w->flags |= RD_W_LAST;
                struct dw_rdmap_msg_end e =
                    dw_rdmap_imm_end(x->imm_len, x->imm_val, ri->opcode == DW_RDMAP_IMM_DATA_SE);
                dw_rdmap_wqe_end_note(w, &e);
        }
        qp->ctr.rx_bytes += plen;
        return RV_ACCEPT;
}

/* A refused Read or Atomic Request: its error NAK, and a line naming what
 * it asked for (decoded again: only a refusal needs it). */
static enum rd_verdict rd_request_refused(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                          const struct rd_rx_seg *x,
                                          const struct dw_rdmap_refusal *ref, uint8_t *nak)
{
        const char *why = NULL;
        if (x->r.opcode == DW_RDMAP_ATOMIC_REQ) {
                struct dw_rdmap_atomic_req ar = {0};
                dw_rdmap_atomic_req_decode(x->pay, x->plen, &ar, &why);
                return rd_refuse(s, p, ref, nak, "Atomic on STag %#x TO %#llx", ar.remote_stag,
                                 (unsigned long long)ar.remote_to);
        }
        struct dw_rdmap_rreq rq = {0};
        dw_rdmap_rreq_decode(x->pay, x->plen, &rq, &why);
        return rd_refuse(s, p, ref, nak, "RDMA Read of STag %#x TO %#llx len %u", rq.src_stag,
                         (unsigned long long)rq.src_to, rq.rdma_rd_sz);
}

/* A Read or Atomic Request: an IRQ entry made room for, the request
 * accepted into it (rdmap/: checked; an Atomic runs here, once: rel/
 * accepts each PSN once, and a response sent again carries the value kept)
 * and queued for its response. A Read of a receiver-paced Send is served
 * from the sender's SGEs instead (rd_pull_serve). */
static enum rd_verdict rd_rx_request(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                     const struct dw_dgram_hdr *h, const struct rd_rx_seg *x,
                                     uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        const struct dw_rdmap_hdr *r = &x->r;

        if (h->xflags & DW_DGRAM_X_PULLREQ) {
                struct dw_rdmap_rreq rq;
                const char *why = NULL;
                if (dw_rdmap_rreq_decode(x->pay, x->plen, &rq, &why) < 0) {
                        *nak = dw_rdmap_term_to_nak(dw_rdmap_malformed_term(r->opcode));
                        return RV_NAK;
                }
                return rd_pull_serve(s, p, r, &rq, nak);
        }
        /* Executed in stream order, as an RC responder does: an Atomic, or
         * the Read whose response is built from memory as it goes out, must
         * see every Write the requester posted before it. A request that
         * overtook an earlier PSN (reordered, or that PSN lost) waits for it:
         * not accepted now, so the sender resends it; one refused anyway is
         * refused at once. */
        struct dw_rdmap_refusal ref;
        if (h->psn != dw_rel_rx_cursor(&p->rel))
                return dw_rdmap_resp_check(dw_rdmap_qp_of(qp), r, x->pay, x->plen, &ref) < 0
                           ? rd_request_refused(s, p, x, &ref, nak)
                           : RV_AHEAD;
        int idx = rd_irq_alloc(s);
        if (idx < 0)
                return RV_RNR;
        struct rd_irq *e = &s->irq[idx];
        *e = (struct rd_irq){0};
        if (dw_rdmap_resp_accept(dw_rdmap_qp_of(qp), r, x->pay, x->plen, &e->resp, &ref) < 0)
                return rd_request_refused(s, p, x, &ref, nak);
        e->peer = p;
        e->nseg = e->resp.atomic ? 1 : (uint32_t)rd_nseg(e->resp.rq.rdma_rd_sz, rd_peer_seg(p));
        rd_irq_queue(s, idx);
        return RV_ACCEPT;
}

/* An RDMA Read Response segment: placed into the Read's sink (or a pull's). */
static enum rd_verdict rd_rx_read_resp(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                       const struct dw_dgram_hdr *h, const struct rd_rx_seg *x,
                                       uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        const struct dw_rdmap_hdr *r = &x->r;
        uint8_t *pay = x->pay;
        size_t plen = x->plen;

        if (s->npull) {
                enum rd_verdict v = rd_pull_response(s, p, h, r, pay, plen);
                if (v != RV_DROP)
                        return v;
        }
        struct dw_wqe *w = rd_orq_find(s, p, r->ddp.stag, false);
        if (!w || r->ddp.to > w->total_len || plen > w->total_len - r->ddp.to)
                return RV_DROP;
        struct dw_rd_dev *d = rdd(dev);
        if (!d->rx_placed && dw_rdmap_sink_place(dw_rdmap_qp_of(qp), w, r->ddp.to, pay, plen) < 0) {
                rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, -1, "RDMA Read sink fails its lkey check");
                return RV_GONE;
        }
        if (plen >= RD_DIRECT_MIN && !r->ddp.last && w->num_sge == 1) {
                d->rx_big = true;
                d->rx_next =
                    (struct rd_rx_next){p, h->psn + 1, r->ddp.stag, r->ddp.to + plen, true};
        } else if (d->rx_next.peer == p) {
                d->rx_next.peer = NULL;
        }
        if (r->ddp.last) {
                w->psn = h->psn;
                w->flags |= RD_W_LAST;
        }
        qp->ctr.rx_bytes += plen;
        return RV_ACCEPT;
}

/* An Atomic response: its original value into the WQE's buffer. */
static enum rd_verdict rd_rx_atomic_resp(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                         const struct dw_dgram_hdr *h, const struct rd_rx_seg *x,
                                         uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        const char *why = NULL;
        uint8_t *pay = x->pay;
        size_t plen = x->plen;

        struct dw_rdmap_atomic_resp ar;
        if (dw_rdmap_atomic_resp_decode(pay, plen, &ar, &why) < 0)
                return RV_DROP;
        struct dw_wqe *w = rd_orq_find(s, p, ar.req_id, true);
        if (!w)
                return RV_DROP;
        uint64_t v = ar.orig_data; /* host order, as ibverbs returns it */
        if (dw_rdmap_sink_place(dw_rdmap_qp_of(qp), w, 0, &v, 8) < 0) {
                rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, -1,
                             "atomic result buffer fails its lkey check");
                return RV_GONE;
        }
        w->psn = h->psn;
        w->flags |= RD_W_LAST;
        return RV_ACCEPT;
}

/* The handler of each kind of message (rdmap/'s opcode table): RD carries
 * no Terminate (an error NAK reports an error) and no Immediate Data
 * message of its own (it rides in the datagram of a message's last
 * segment), so a datagram that holds one is dropped. */
typedef enum rd_verdict rd_rx_fn(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                 const struct dw_dgram_hdr *h, const struct rd_rx_seg *x,
                                 uint8_t *nak);
static rd_rx_fn *const rd_rx_by_kind[DW_RDMAP_RX_NKINDS] = {
    [DW_RDMAP_RX_SEND] = rd_rx_send,           [DW_RDMAP_RX_WRITE] = rd_rx_write,
    [DW_RDMAP_RX_READ_REQ] = rd_rx_request,    [DW_RDMAP_RX_ATOMIC_REQ] = rd_rx_request,
    [DW_RDMAP_RX_READ_RESP] = rd_rx_read_resp, [DW_RDMAP_RX_ATOMIC_RESP] = rd_rx_atomic_resp,
};

/* One NEW DATA segment: decode and check it, then its opcode's step places it. */
static enum rd_verdict rd_rx_segment(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                     const struct dw_dgram_hdr *h, uint8_t *pkt,
                                     const struct dw_dgram_layout *lay, uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        struct dw_device *dev = qp->dev;
        const char *why = NULL;
        if (h->xflags & DW_DGRAM_X_CCTL)
                return rd_mbox_cctl_rx(p, pkt + lay->seg_off, lay->seg_len);
        struct rd_rx_seg x;
        ssize_t rl = dw_rdmap_decode(pkt + lay->seg_off, lay->seg_len, &x.r, &why);
        if (rl < 0)
                return RV_DROP;
        x.pay = pkt + lay->seg_off + rl;
        x.plen = lay->seg_len - (size_t)rl;
        x.has_imm = h->flags & DW_DGRAM_F_IMM;
        x.imm_val = x.imm_len = 0;
        if (x.has_imm) {
                if (dw_rdmap_decode(pkt + lay->imm_off, DW_DGRAM_IMM_MSG_LEN, &x.ri, &why) < 0 ||
                    (x.ri.opcode != DW_RDMAP_IMM_DATA && x.ri.opcode != DW_RDMAP_IMM_DATA_SE) ||
                    !x.r.ddp.last)
                        return RV_DROP;
                memcpy(&x.imm_val, pkt + lay->imm_off + DW_DGRAM_DDP_UNTAGGED_LEN, 4);
                x.imm_len = dw_get_be32(pkt + lay->imm_off + DW_DGRAM_DDP_UNTAGGED_LEN + 4);
        }
        /* Requests must carry our Q_Key on an RD QP; responses belong to a
         * stream we opened and carry none. */
        const struct dw_rdmap_op *op = dw_rdmap_op(x.r.opcode);
        if (!op)
                return RV_DROP;
        bool request = op->dir != DW_RDMAP_DIR_RESPONSE && !(h->xflags & DW_DGRAM_X_PULLREQ);
        /* The pull flags go with one opcode each (docs/PROTOCOL.md). */
        if (((h->xflags & DW_DGRAM_X_PULL) && (!dw_rdmap_is_send(x.r.opcode) || x.has_imm)) ||
            ((h->xflags & DW_DGRAM_X_PULLREQ) && x.r.opcode != DW_RDMAP_READ_REQ))
                return RV_DROP;
        if (!s->rc && request && h->qkey != qp->attr.qkey) {
                dev->ctr.rx_dropped_qkey++;
                qp->ctr.rx_dropped_qkey++;
                return RV_DROP;
        }

        rd_rx_fn *fn = rd_rx_by_kind[op->rx];
        return fn ? fn(s, p, h, &x, nak) : RV_DROP;
}

/* Whether an error NAK can be the peer's answer to one of our datagrams: it
 * comes from the peer's address, or from one of its rails whose list the
 * peer gave us (an origin, X-flag RAIL, is otherwise taken on trust: a
 * stranger could name any stream with it), and it names a PSN this stream
 * has outstanding that the peer does not hold (a refused PSN is never
 * accepted, so never SACKed). */
static bool rd_nak_matches(const struct dw_rd_peer *p, const struct dw_dgram_hdr *h,
                           uint32_t from_ip)
{
        const struct dw_rel_peer *r = &p->rel;
        uint32_t psn = h->ack_psn;
        if (from_ip != p->ip) {
                const struct dw_flow_path *f = p->path;
                unsigned i = 1;
                while (i < f->nrails && f->rail_ip[i] != from_ip)
                        i++;
                if (i >= f->nrails)
                        return false;
        }
        if (dw_psn_before(psn, r->snd_una) || !dw_psn_before(psn, r->snd_nxt) || !r->ring)
                return false;
        return !(r->ring[psn & r->ring_mask].flags & DW_REL_TXF_SACKED);
}

/* An error NAK for one of our PSNs: the WR that sent it fails, the QP too.
 * One that does not match an outstanding PSN of the stream it names is
 * dropped and counted: it can end nothing. */
static void rd_on_error_nak(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint32_t from_ip)
{
        struct dw_rd_qp *s = p->s;
        struct dw_rel_peer *r = &p->rel;
        uint32_t psn = h->ack_psn;
        char pb[64];
        if (!rd_nak_matches(p, h, from_ip)) {
                struct dw_qp *qp = s->qp;
                qp->dev->ctr.rx_dropped_nak++;
                qp->ctr.rx_dropped_nak++;
                dw_warn_limited(&qp->dev->log_limit,
                                "RD QP %#x peer %s: error NAK (code %u) for PSN %#x, which the "
                                "stream has not outstanding or from another address: dropped",
                                qp->qpn, rd_peer_str(p, pb, sizeof(pb)), h->nak_code, psn);
                return;
        }
        uint64_t cookie = r->ring[psn & r->ring_mask].cookie;
        enum diwarp_wc_status st = dw_rdmap_nak_to_wc(h->nak_code);
        dw_warn_limited(&s->qp->dev->log_limit, "RD QP %#x peer %s: PSN %#x refused (NAK code %u)",
                        s->qp->qpn, rd_peer_str(p, pb, sizeof(pb)), psn, h->nak_code);
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
            (!s->rc && h->qkey != qp->attr.qkey) || (s->mb && s->mb->ent_count))
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
        struct dw_rdmap_qp rq = dw_rdmap_qp_of(qp);
        if (dw_rdmap_send_place(rq, w, 0, pay, plen) < 0)
                return false;
        qp->ctr.rx_bytes += plen;
        qp->dev->ctr.rx_packets++;
        qp->ctr.rx_packets++;
        dw_rel_rx_next(&p->rel, h->flags & DW_DGRAM_F_ACKREQ, now); /* psn is the cursor */
        rd_mbox_account(p, (uint32_t)plen);
        p->rx_bind++;
        p->rx_done++;
        w->flags |= DW_WQE_DONE;
        struct dw_rdmap_msg_end e = dw_rdmap_send_end(
            c == RD_MSG1(DW_RDMAP_SEND_SE) ? DW_RDMAP_SEND_SE : DW_RDMAP_SEND, (uint32_t)plen, 0);
        struct dw_recv_done d;
        bool solicited = dw_rdmap_recv_end(rq, &e, &d, NULL);
        d.src_qp = p->rqpn;
        dw_qp_recv_done(qp, w->wr_id, &d, solicited);
        dw_wq_pop(&qp->rq);
        return true;
}

/* A datagram refused before it reaches a stream (no proven rail, no
 * connection token, no room for a new stream): counted under the counter
 * at `field` (offsetof in struct diwarp_counters) on the QP and on its
 * device, and one rate-limited line naming the QP, the sender and, after
 * "dropped: ", why. Nothing is formatted for a line held back. */
static __attribute__((noinline, format(printf, 4, 5))) void
rd_drop_from(struct dw_rd_qp *s, size_t field, const struct sockaddr_in *from, const char *why, ...)
{
        struct dw_qp *qp = s->qp;
        (*(uint64_t *)((char *)&qp->dev->ctr + field))++;
        (*(uint64_t *)((char *)&qp->ctr + field))++;
        if (!dw_warn_limit_pass(&qp->dev->log_limit))
                return;
        char ip[INET_ADDRSTRLEN], reason[192];
        va_list ap;
        va_start(ap, why);
        vsnprintf(reason, sizeof(reason), why, ap);
        va_end(ap);
        dw_log(DW_LOG_WARN, "%s QP %#x%s: datagram from %s:%u dropped: %s", s->rc ? "RC" : "RD",
               qp->qpn, s->rc ? " over RD" : "",
               inet_ntop(AF_INET, &from->sin_addr, ip, sizeof(ip)), ntohs(from->sin_port), reason);
}

bool dw_rd_rx_keyed(struct dw_device *dev, uint8_t *pkt, size_t len, const struct sockaddr_in *from,
                    uint64_t stamp)
{
        if (len < DW_DGRAM_HDR_LEN || !(pkt[1] & DW_DGRAM_F_RD))
                return false;
        /* The destination QPN (bytes 5-7) only picks the key: nothing else
         * is read before the tag verifies. */
        struct dw_qp *qp = dw_qp_lookup(dev, dw_get_be32(pkt + 4) & DW_DGRAM_QPN_MASK);
        if (!qp || !qp->rd || qp->rd->seal != &qp->rd->cseal)
                return false;
        const char *why = NULL;
        ssize_t body = dw_seal_open(qp->rd->seal, pkt, len, &why);
        if (body == -ENOKEY || body == -EKEYREJECTED) {
                qp->ctr.rx_dropped_auth++;
                dw_ud_rx_auth_fail(dev, qp, (int)body, from);
                return true;
        }
        struct dw_dgram_hdr h;
        ssize_t hl = body < 0 ? body : dw_dgram_decode_rd(pkt, (size_t)body, &h, &why);
        if (hl < 0) {
                dev->ctr.rx_dropped_malformed++;
                dw_dbg("RC QP %#x over RD: malformed datagram from port %u dropped: %s", qp->qpn,
                       ntohs(from->sin_port), why ? why : "?");
                return true;
        }
        dw_rd_rx(dev, pkt, (size_t)body, (size_t)hl, &h, from, stamp);
        return true;
}

/* The peer's stream for a datagram that passed the QP's checks: a new one
 * for a stranger that starts its stream (RD only, while there is room), or
 * the known one with its receive side started or started again. NULL: the
 * datagram is dropped (counted). */
static inline struct dw_rd_peer *rd_rx_peer(struct dw_qp *qp, struct dw_rd_peer *p,
                                            const struct dw_dgram_hdr *h,
                                            const struct sockaddr_in *from, uint32_t src,
                                            uint64_t now)
{
        struct dw_device *dev = qp->dev;
        struct dw_rd_qp *s = qp->rd;
        bool data = h->flags & DW_DGRAM_F_DATA;

        if (!p) {
                /* First use: only a request from a stranger that starts its
                 * stream (X2-flag START: its first PSN and MSN) opens one
                 * (RC over RD knows its one peer from RTR), and only while
                 * the QP and the device have room for another: nothing is
                 * answered to a source that does not get a stream. */
                if (s->rc || !data || h->qkey != qp->attr.qkey ||
                    (h->flags & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK)) ||
                    !(h->xflags2 & DW_DGRAM_X2_START)) {
                        dev->ctr.rx_dropped_no_qp++;
                        return NULL;
                }
                if (!rd_peer_room(s, now)) {
                        rd_drop_from(s, offsetof(struct diwarp_counters, rx_dropped_peers), from,
                                     "a new stream, and the QP holds %u streams, the device %u "
                                     "(DIWARP_RD_MAX_PEERS %u, DIWARP_RD_DEV_PEERS %u)",
                                     s->npeers, rdd(qp->dev)->npeers, qp->dev->cfg.rd_max_peers,
                                     qp->dev->cfg.rd_dev_peers);
                        return NULL;
                }
                p = rd_peer_new_rd(s, src, from->sin_port, h->src_qpn, h);
                if (!p) {
                        dev->ctr.rx_dropped_no_qp++;
                        return NULL;
                }
        } else if (data && !p->rx_sync) {
                /* Our stream to the peer came first: its own starts with the
                 * first datagram that says where (every one does until we
                 * acknowledge its first PSN). Data before that has no place. */
                if (!(h->xflags2 & DW_DGRAM_X2_START)) {
                        dev->ctr.rx_dropped_no_qp++;
                        return NULL;
                }
                rd_peer_rx_start(p, h);
        } else if (data && (h->xflags2 & DW_DGRAM_X2_START)) {
                /* A known start is kept, unless the stream was idle (the
                 * peer may have freed it and started anew) or we started
                 * ours over. */
                rd_peer_resync(p, h, now);
        } else if (data && p->rx_resync) {
                p->rx_resync = false; /* the peer goes on where it was */
        }
        return p;
}

/* The ACK or NAK a datagram carries (after a Send the fast path placed).
 * True: the datagram is done with (an error NAK, an ACK held for the
 * application's next call, or the stream failed). */
static inline bool rd_rx_acks(struct dw_qp *qp, struct dw_rd_peer *p, const struct dw_dgram_hdr *h,
                              const struct sockaddr_in *from, bool placed, uint64_t now,
                              uint64_t arrived)
{
        struct dw_device *dev = qp->dev;
        struct dw_rd_dev *d = rdd(dev);

        if ((h->flags & DW_DGRAM_F_NAK) && h->nak_code >= DW_DGRAM_NAK_REM_ACCESS) {
                rd_on_error_nak(p, h, from->sin_addr.s_addr);
                return true;
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
                        d->hack = (struct rd_held_ack){p, h->ack_psn, now, arrived};
                        if (!d->held_step)
                                d->held_step = dev->prog.steps;
                        return true;
                }
                d->hold_retire = placed;
                int r = rd_on_ack(p, h, now, arrived);
                d->hold_retire = false;
                if (qp->state == DIWARP_QPS_ERR)
                        return true;
                /* A drained window keeps its ring while the peer has timers
                 * (an exchange goes on); rd_progress_busy takes it back once
                 * the peer is idle. */
                if (r == -EREMOTEIO || r == -ETIMEDOUT) {
                        rd_peer_fail(p,
                                     r == -EREMOTEIO ? DIWARP_WC_RNR_RETRY_EXC_ERR
                                                     : DIWARP_WC_RETRY_EXC_ERR,
                                     DIWARP_EVENT_QP_FATAL, RD_WHY_REL);
                        return true;
                }
        }
        return false;
}

/* A data segment the fast path did not take: classified against the
 * stream's window, then placed (rd_rx_segment) and acknowledged, or
 * refused with the NAK its verdict calls for. */
static inline void rd_rx_data(struct dw_qp *qp, struct dw_rd_peer *p, const struct dw_dgram_hdr *h,
                              uint8_t *pkt, const struct dw_dgram_layout *lay, uint64_t now)
{
        struct dw_device *dev = qp->dev;
        struct dw_rd_qp *s = qp->rd;

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
        enum rd_verdict rv = rd_rx_segment(s, p, h, pkt, lay, &nak);
        switch (rv) {
        case RV_ACCEPT: {
                dev->ctr.rx_packets++;
                qp->ctr.rx_packets++;
                uint32_t adv =
                    dw_rel_rx_data(&p->rel, h->psn, h->flags & DW_DGRAM_F_ACKREQ, now, &v);
                dw_rel_rx_arrived(&p->rel, h->psn, now);
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
        case RV_WINDOW:
                /* Not accepted: a real one is sent again once the window
                 * moved. */
                dev->ctr.rx_dropped_msn++;
                qp->ctr.rx_dropped_msn++;
                return;
        case RV_GONE:
        case RV_AHEAD:
                return;
        }
}

void dw_rd_rx(struct dw_device *dev, uint8_t *pkt, size_t body, size_t hl,
              const struct dw_dgram_hdr *h, const struct sockaddr_in *from, uint64_t stamp)
{
        const char *why = NULL;
        struct dw_rd_dev *d = rdd(dev);
        if (!d) {
                /* No RD QP was ever made here (the RD state is made with the
                 * first): a stray or forged RD datagram has nothing to reach. */
                dev->ctr.rx_dropped_no_qp++;
                return;
        }
        rd_ack_flush(d); /* ACKs reach rel/ in arrival order */
        struct dw_qp *qp = dw_qp_lookup(dev, h->dst_qpn);
        if (!qp || !qp->rd) {
                dev->ctr.rx_dropped_no_qp++;
                return;
        }
        struct dw_rd_qp *s = qp->rd;
        if (s->ctok_rx && h->token != s->ctok_rx) {
                rd_drop_from(s, offsetof(struct diwarp_counters, rx_dropped_token), from,
                             "without the connection's token, or with a wrong one");
                return;
        }
        bool data = h->flags & DW_DGRAM_F_DATA;
        uint32_t src = rd_stream_ip(d, h, from);
        if (!src) {
                const uint8_t *o = (const uint8_t *)&h->origin;
                rd_drop_from(s, offsetof(struct diwarp_counters, rx_dropped_rail), from,
                             "it names origin %u.%u.%u.%u (X-flag RAIL), which is no proven rail "
                             "of that peer",
                             o[0], o[1], o[2], o[3]);
                return;
        }
        struct dw_rd_peer *p = rd_peer_find(s, src, from->sin_port, h->src_qpn);
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
        /* The first datagram of a step uses the clock read as the step began
         * (dw_rd_rx_clock), the others read it anew. */
        uint64_t now = d->rx_clock && d->step_no == dev->prog.steps ? d->step_now : rd_clock(dev);
        d->rx_clock = false;
        /* The kernel's receive time, when known: what the thread's own wait
         * for a core added is not the network's. */
        uint64_t arrived = stamp && stamp < now ? stamp : now;
        p = rd_rx_peer(qp, p, h, from, src, now);
        if (!p)
                return;
        p->last_tick = rd_tick(now);
        if (dev->nrails > 1)
                rd_rx_rails(p, h, from->sin_addr.s_addr, now);
        rd_activate(p);
        if (s->mb)
                rd_mbox_rx_hdr(p, h);
        /* A Send the fast path takes is placed and completed before the ACK it
         * carries is handled: its receive completion then comes before the send
         * completion that ACK brings, so a ping-pong finds it with one poll. */
        bool placed = data && rd_rx_fast(s, p, h, pkt, &lay, now);
        if (placed)
                dw_rel_rx_arrived(&p->rel, h->psn, now);
        /* Data that comes faster than answers go back: a window, not a
         * ping-pong; its arrivals are timed by the kernel's stamps. */
        if (data && p->rel.rx_unacked >= 2)
                dw_udp_stamps_busy(&dev->udp);
        if (rd_rx_acks(qp, p, h, from, placed, now, arrived))
                return;
        if (data && !placed)
                rd_rx_data(qp, p, h, pkt, &lay, now);
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

/* Where the direct path may read the peeked segment h/r of p (plen payload
 * bytes; a Read Response when read, else a Write): the one-SGE Read sink or
 * the Write target, after every check the bounce-buffer path makes before it
 * places (rd_rx_segment, dw_rdmap_sink_place); *tail the bytes of a Write's last
 * segment read aside. NULL: the segment takes the bounce buffer. */
static uint8_t *rd_direct_target(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                 const struct dw_dgram_hdr *h, const struct dw_rdmap_hdr *r,
                                 size_t plen, bool read, uint32_t *tail)
{
        struct dw_qp *qp = s->qp;
        uint8_t *host = NULL;
        if (read) {
                struct dw_wqe *w = rd_orq_find(s, p, r->ddp.stag, false);
                struct iovec sink;
                if (!w || w->num_sge != 1 ||
                    dw_rdmap_sink_target(dw_rdmap_qp_of(qp), w, r->ddp.to, plen, &sink, 1) != 1)
                        return NULL;
                return sink.iov_base;
        }
        if (dw_rdmap_write_accept(dw_rdmap_qp_of(qp), r->ddp.stag, r->ddp.to, plen, &host, NULL) <
            0)
                return NULL; /* dw_rd_rx refuses it with a NAK */
        /* A Write's last segment keeps its tail out of the target until the
         * CRC is verified (rd_rx_write places it); one ahead of an earlier
         * PSN needs a free tail slot. Its bytes must not overwrite what a
         * later PSN placed there, and bytes placed ahead need a run to
         * record them (struct rd_ahead). */
        *tail = r->ddp.last ? RD_TAIL_HOLD : 0;
        bool ahead = h->psn != dw_rel_rx_cursor(&p->rel);
        if (*tail && ahead && s->ntails == RD_TAILS)
                return NULL;
        if (s->nahead && (rd_ahead_overlaps(s, p, h->psn, r->ddp.stag, r->ddp.to, plen) ||
                          (ahead && !rd_ahead_room(s, p, h->psn, r->ddp.stag, r->ddp.to))))
                return NULL;
        return host;
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
        /* With DIWARP_AUTH no byte reaches registered memory before its tag
         * is verified: every datagram takes the bounce buffer (stage,
         * verify, copy). */
        if (!d || !d->rx_big || !dev->cfg.rd_direct || dw_udp_uring_on(&dev->udp) || dev->seal.mac)
                return 0;
        struct sockaddr_in from;
        bool train;
        uint8_t *hb = d->rx_hdr;
        int len = dw_udp_peek(&dev->udp, hb, sizeof(d->rx_hdr), &from, &train);
        if (len == -EAGAIN)
                return -1;
        if (len < 0)
                return 0;
        if (train || (size_t)len < RD_DIRECT_MIN)
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
        uint32_t src = rd_stream_ip(d, &h, &from);
        /* A connection's key (DIWARP_AUTH, only with a token) verifies
         * before placing, as the device's does. */
        if (!src || (s->ctok_rx && (h.token != s->ctok_rx || s->seal->mac)))
                return rd_direct_skip(d); /* dw_rd_rx drops and counts it */
        struct dw_rd_peer *p = rd_peer_find(s, src, from.sin_port, h.src_qpn);
        bool read = d->rx_next.read;
        /* Requests carry our Q_Key on an RD QP; responses carry none. */
        if (!p || p != d->rx_next.peer || h.psn != d->rx_next.psn || p->dead ||
            (p->nak_code && h.psn == p->nak_psn) || (!s->rc && !read && h.qkey != qp->attr.qkey) ||
            dw_rel_rx_classify(&p->rel, h.psn) != DW_REL_NEW)
                return rd_direct_skip(d);
        struct dw_rdmap_hdr r;
        ssize_t rl = dw_rdmap_decode(hb + hl, sizeof(d->rx_hdr) - (size_t)hl, &r, &why);
        /* Without a CRC (DIWARP_RD_CRC=0 at both ends) the body runs to the
         * end; one our setting refuses takes the ordinary way, which drops it. */
        bool nocrc = h.xflags & DW_DGRAM_X_NOCRC;
        size_t tl = dw_seal_trailer_len(&dev->seal, nocrc);
        if ((nocrc && !d->nocrc) || (h.xflags & ~(DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAIL)) ||
            (h.xflags2 & ~DW_DGRAM_X2_TOKEN) || (size_t)len < tl + RD_DIRECT_MIN)
                return rd_direct_skip(d);
        size_t body = (size_t)len - tl;
        if (rl < 0 || r.opcode != (read ? DW_RDMAP_READ_RESP : DW_RDMAP_WRITE) ||
            body < (size_t)(hl + rl) + RD_DIRECT_MIN || r.ddp.stag != d->rx_next.stag ||
            r.ddp.to != d->rx_next.to)
                return rd_direct_skip(d);
        size_t plen = body - (size_t)(hl + rl);
        uint32_t tail = 0;
        uint8_t *host = rd_direct_target(s, p, &h, &r, plen, read, &tail);
        if (!host)
                return rd_direct_skip(d);
        uint8_t trl[DW_SEAL_TRAILER_MAX];
        struct iovec iov[4] = {
            {hb, (size_t)(hl + rl)}, {host, plen - tail}, {d->rx_tail, tail}, {trl, tl}};
        int n = dw_udp_recv_iov(&dev->udp, iov, tl ? 4 : 3);
        if (n < 0)
                return n == -EAGAIN ? -1 : 0;
        if (n != len) {
                /* Not the datagram peeked at: nothing else reads this socket
                 * under the device lock, so this is not expected. */
                dev->ctr.rx_dropped_malformed++;
                return 1;
        }
        if (dw_seal_open_iov(&dev->seal, iov, 3, trl, tl, &why) < 0) {
                dev->ctr.crc_errors++;
                return 1;
        }
        dev->ctr.rx_placed_direct++;
        qp->ctr.rx_placed_direct++;
        d->rx_placed = true;
        dw_rd_rx(dev, hb, body, (size_t)hl, &h, &from, dw_udp_rx_peek_stamp(&dev->udp));
        d->rx_placed = false;
        d->rx_small = 0;
        return 1;
}
