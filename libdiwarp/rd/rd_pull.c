/* RD transport: receiver-paced Sends (receiver-driven rendezvous;
 * docs/PROTOCOL.md, "Receiver-paced Sends").
 *
 * A Send of at least DIWARP_RD_PULL_MIN bytes pushes only its first chunk
 * (DIWARP_RD_PULL_CHUNK bytes) as ordinary Send segments; the first carries
 * a pull descriptor (X-flag PULL: the message's length and the bytes
 * pushed). The receiver binds its receive WQE as for any Send and reads the
 * rest with RDMA Read Requests of the chunk size (X-flag PULLREQ: the Data
 * Source STag names the Send by its MSN, the TO is the offset in it), at
 * most DIWARP_RD_PULL_DEPTH outstanding per QP whatever the number of
 * messages being pulled (the oldest message first), asking for the next one
 * only when an earlier one has been placed: a receiver whose memory takes
 * data slowly paces its sender without a rate being measured or advertised,
 * and what is pulled towards it never exceeds depth × chunk. The sender serves the
 * Reads from the Send's own SGEs and completes the Send once every chunk is
 * acknowledged; the receive completes once every byte is placed, in MSN
 * order as any Send. The transmit side of the Reads (rd_next_pull) is in
 * rd_tx.c; docs/PROTOCOL.md has the wire rules.
 */
#include "rd/rd_int.h"

#include <string.h>

#include "rdmap/rdmap.h"

/* ---------------------------------------------------------------- receiver */

void rd_pull_free(struct dw_rd_qp *s, struct rd_pull *pl)
{
        if (!pl->peer)
                return;
        s->pull_busy -= pl->busy;
        memset(pl, 0, sizeof(*pl));
        s->npull--;
        rd_pull_activate(s);
}

/* An entry for receive WQE w, which a pull descriptor marked (RD_W_PULL,
 * pull_pushed, the length in byte_len); -1 when every entry is busy: the
 * WQE then waits, bound, for one (rd_pull_activate). */
static int pull_take(struct dw_rd_qp *s, struct dw_wqe *w)
{
        for (int i = 0; i < RD_MAX_PULL; i++) {
                struct rd_pull *pl = &s->pull[i];
                if (pl->peer)
                        continue;
                *pl = (struct rd_pull){.peer = w->priv,
                                       .w = w,
                                       .send_msn = w->msn,
                                       .len = w->byte_len,
                                       .pushed = w->pull_pushed,
                                       .next = w->pull_pushed,
                                       .seq = s->pull_seq++};
                s->npull++;
                w->flags |= RD_W_PULLING;
                return i;
        }
        return -1;
}

bool rd_pull_activate(struct dw_rd_qp *s)
{
        struct dw_wqe *w;
        bool any = false;
        for (uint32_t i = 0; s->pull_waiting && s->npull < RD_MAX_PULL && i < s->rq_bound &&
                             (w = dw_wq_at(&s->qp->rq, i));
             i++)
                if ((w->flags & (RD_W_PULL | RD_W_PULLING | DW_WQE_DONE)) == RD_W_PULL &&
                    pull_take(s, w) >= 0) {
                        s->pull_waiting--;
                        any = true;
                }
        return any;
}

/* The Send's first segment (its pull descriptor) arrived for receive WQE w:
 * an entry to pull the rest into it, or a place in the wait for one (the
 * Reads of earlier Sends free them). RV_NAK when the message cannot fit. */
enum rd_verdict rd_pull_start(struct dw_rd_qp *s, struct dw_rd_peer *p, struct dw_wqe *w,
                              const struct dw_rdmap_hdr *r, const struct dw_dgram_hdr *h, int *idx,
                              uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        if (w->flags & RD_W_PULL)
                return RV_ACCEPT;
        if (r->ddp.tagged || r->ddp.mo != 0 || h->pull_len > w->total_len) {
                dw_warn_limited(
                    &qp->dev->log_limit,
                    "RD QP %#x: receiver-paced Send of %u bytes into the %llu-byte receive "
                    "WR %#llx",
                    qp->qpn, h->pull_len, (unsigned long long)w->total_len,
                    (unsigned long long)w->wr_id);
                rd_recv_fail(s, p, w, DIWARP_WC_LOC_LEN_ERR, dw_rdmap_recv_term(-EMSGSIZE));
                *nak = DW_DGRAM_NAK_INVALID;
                return RV_NAK;
        }
        w->flags |= RD_W_PULL;
        w->pull_pushed = h->pull_pushed;
        /* Its length is known from the first segment: the end is noted now. */
        struct dw_rdmap_msg_end e = dw_rdmap_send_end(r->opcode, h->pull_len, r->inval_stag);
        dw_rdmap_wqe_end_note(w, &e);
        *idx = pull_take(s, w);
        if (*idx < 0)
                s->pull_waiting++;
        (void)p;
        return RV_ACCEPT;
}

static struct rd_pull *pull_of(struct dw_rd_qp *s, const struct dw_wqe *w)
{
        for (int i = 0; i < RD_MAX_PULL; i++)
                if (s->pull[i].peer && s->pull[i].w == w)
                        return &s->pull[i];
        return NULL;
}

/* The entry is done with once its message is whole and every Read it asked
 * for was answered and acknowledged (a retransmitted request is rebuilt from
 * its slot). */
static void pull_retire(struct dw_rd_qp *s, struct rd_pull *pl)
{
        if (pl->w)
                return;
        for (unsigned i = 0; i < RD_PULL_MAX_DEPTH; i++)
                if (pl->rd[i].used)
                        return;
        rd_pull_free(s, pl);
}

void rd_pull_check(struct dw_rd_qp *s, struct dw_wqe *w)
{
        struct rd_pull *pl = (w->flags & RD_W_PULLING) ? pull_of(s, w) : NULL;
        if (!pl || w->bytes_done < pl->pushed || w->pull_done < (uint64_t)pl->len - pl->pushed)
                return;
        /* Whole: it completes in MSN order once the in-order cursor has passed
         * the newest PSN of any of its pieces. */
        w->psn = (uint32_t)w->ts_ns;
        w->byte_len = pl->len;
        w->flags |= RD_W_LAST;
        pl->w = NULL;
        pull_retire(s, pl);
}

static struct rd_pull_read *read_of(struct dw_rd_qp *s, const struct dw_rd_peer *p, uint32_t msn,
                                    struct rd_pull **out)
{
        for (int i = 0; i < RD_MAX_PULL; i++) {
                struct rd_pull *pl = &s->pull[i];
                if (pl->peer != p)
                        continue;
                for (unsigned k = 0; k < RD_PULL_MAX_DEPTH; k++)
                        if (pl->rd[k].used && pl->rd[k].msn == msn) {
                                *out = pl;
                                return &pl->rd[k];
                        }
        }
        return NULL;
}

/* A Read Response segment: RV_DROP when it answers none of our pulls (an
 * ordinary Read's then), else placed into the receive WQE. */
enum rd_verdict rd_pull_response(struct dw_rd_qp *s, struct dw_rd_peer *p,
                                 const struct dw_dgram_hdr *h, const struct dw_rdmap_hdr *r,
                                 const uint8_t *pay, size_t plen)
{
        struct rd_pull *pl;
        struct rd_pull_read *rr = read_of(s, p, r->ddp.stag, &pl);
        if (!rr || !pl->w)
                return RV_DROP;
        struct dw_wqe *w = pl->w;
        if (r->ddp.to > rr->len || plen > rr->len - r->ddp.to || rr->placed + plen > rr->len)
                return RV_DROP;
        if (dw_rdmap_send_place(dw_rdmap_qp_of(s->qp), w, rr->off + r->ddp.to, pay, plen) < 0) {
                rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, -1,
                             "receive WR of a receiver-paced Send fails its lkey check");
                return RV_GONE;
        }
        s->qp->ctr.rx_bytes += plen;
        if (dw_psn_before((uint32_t)w->ts_ns, h->psn))
                w->ts_ns = 1ull << 32 | h->psn;
        rr->placed += (uint32_t)plen;
        w->pull_done += plen;
        if (rr->placed >= rr->len) {
                /* Placed: the next Read may go (rd_next_pull). */
                pl->busy--;
                s->pull_busy--;
                if (rr->acked)
                        rr->used = false;
        }
        rd_pull_check(s, w);
        return RV_ACCEPT;
}

void rd_pull_acked(struct dw_rd_qp *s, uint32_t idx, uint32_t slot)
{
        if (idx >= RD_MAX_PULL || slot >= RD_PULL_MAX_DEPTH || !s->pull[idx].peer)
                return;
        struct rd_pull *pl = &s->pull[idx];
        struct rd_pull_read *rr = &pl->rd[slot];
        rr->acked = true;
        if (rr->placed >= rr->len)
                rr->used = false;
        pull_retire(s, pl);
}

/* ---------------------------------------------------------------- sender */

/* A PULLREQ Read Request: the source is our Send to p with that MSN, still
 * under way, and the range one the receiver may pull (past what we pushed). */
enum rd_verdict rd_pull_serve(struct dw_rd_qp *s, struct dw_rd_peer *p,
                              const struct dw_rdmap_hdr *r, const struct dw_rdmap_rreq *rq,
                              uint8_t *nak)
{
        struct dw_qp *qp = s->qp;
        struct dw_wqe *w = NULL, *x;
        for (uint32_t i = 0; (x = dw_wq_at(&qp->sq, i)); i++)
                if (x->priv == p && (x->flags & RD_W_PULL) && x->msn == rq->src_stag &&
                    !(x->flags & DW_WQE_DONE)) {
                        w = x;
                        break;
                }
        if (!w || rq->src_to < w->pull_pushed || rq->src_to > w->total_len ||
            rq->rdma_rd_sz > w->total_len - rq->src_to) {
                char pb[64];
                dw_warn_limited(
                    &qp->dev->log_limit,
                    "RD QP %#x peer %s: pull of %u bytes at %llu of Send MSN %u: no such "
                    "Send under way, or out of its range",
                    qp->qpn, rd_peer_str(p, pb, sizeof(pb)), rq->rdma_rd_sz,
                    (unsigned long long)rq->src_to, rq->src_stag);
                qp->dev->ctr.rx_dropped_protection++;
                qp->ctr.rx_dropped_protection++;
                *nak = DW_DGRAM_NAK_REM_ACCESS;
                return RV_NAK;
        }
        int idx = rd_irq_alloc(s);
        if (idx < 0)
                return RV_RNR;
        s->irq[idx] = (struct rd_irq){.peer = p,
                                      .resp = {.msn = r->ddp.msn, .rq = *rq},
                                      .nseg = (uint32_t)rd_nseg(rq->rdma_rd_sz, rd_peer_seg(p)),
                                      .pull = true,
                                      .wslot = (uint32_t)(w - qp->sq.ring)};
        rd_irq_queue(s, idx);
        return RV_ACCEPT;
}
