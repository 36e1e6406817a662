/* RD transmit: datagrams built from send WQEs and from the responder's IRQ
 * entries, sent in batches (sendmmsg, UDP GSO); the rel/ callbacks that
 * retransmit and acknowledge; the transmit cursor; the post-time latency
 * path (dw_rd_tx_posted).
 *
 * WQEs are sent in SQ order; each is cut into segments of
 * dw_rd_seg_payload(mtu) bytes. A segment is named by a 64-bit cookie (kind,
 * ring slot, segment index) so rel/ can ask for it again and we rebuild it
 * from the WQE (or the responder's IRQ entry) with the same PSN and bytes.
 * Up to DW_UDP_TX_BATCH datagrams go out per sendmmsg; with UDP GSO (no fault
 * injection, kernel support) up to DW_UDP_GSO_MAX_SEGS are built per step and
 * each run of equal-size datagrams to one peer goes out as one GSO sendmsg
 * (rd_send_batch). PSNs are registered
 * with rel/ only for those the socket took, and the cursors roll back to the
 * first one it refused (local back-pressure costs no PSN and no retry).
 * Which rail each datagram takes is rd_rail.c's.
 */
#include "rd/rd_int.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "util/log.h"
#include "rdmap/rdmap.h"
#include "wire/rdmap.h"

/* ---------------------------------------------------------------- packet build */

/* dw_dgram_encode of a header without SACK blocks that rd_build made (valid
 * by construction: flags DATA with ACK/ACKREQ/IMM, 24-bit QPNs, no X-flag
 * but NOCRC, no X2-flag but TOKEN), minus the checks. */
static ssize_t rd_put_hdr(const struct dw_dgram_hdr *h, uint8_t *b)
{
        b[0] = h->xflags || h->xflags2 ? DW_DGRAM_VERSION2 : DW_DGRAM_VERSION;
        b[1] = h->flags;
        b[2] = 0;
        b[3] = 0;
        dw_put_be32(b + 4, h->dst_qpn);
        b[4] = h->xflags;
        dw_put_be32(b + 8, h->src_qpn);
        b[8] = h->xflags2;
        dw_put_be32(b + 12, h->qkey);
        dw_put_be32(b + 16, h->psn);
        dw_put_be32(b + 20, h->ack_psn);
        dw_put_be16(b + 24, h->credits);
        dw_put_be16(b + 26, 0); /* rnr_delay */
        if (!h->xflags2)
                return DW_DGRAM_HDR_LEN;
        dw_put_be64(b + DW_DGRAM_HDR_LEN, h->token);
        return DW_DGRAM_HDR_LEN + DW_DGRAM_TOKEN_LEN;
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
        t->rail = (uint8_t)ck_rail(cookie);
        t->dst.sin_family = AF_INET;
        t->dst.sin_addr.s_addr = rd_rail_ip(p, t->rail);
        t->dst.sin_port = p->port;
        t->peer = p;
        t->psn = psn;
        t->cookie = cookie;
}

/* The datagram is t->hdr up to end: its trailer (the QP's seal s->seal)
 * goes behind it (none with DIWARP_RD_CRC=0), and it is sent as one iovec. */
static void rd_slot_whole(struct dw_seal *seal, struct rd_txslot *t, uint8_t *end)
{
        size_t len = (size_t)(end - t->hdr);
        struct dw_seal_run run;
        dw_seal_begin(seal, &run, t->hdr);
        dw_seal_add(seal, &run, t->hdr, len);
        t->iov[0].iov_base = t->hdr;
        t->iov[0].iov_len = len + dw_seal_end(seal, &run, t->hdr, end);
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
            w->total_len > rd_send_seg(p) || (p->rel.rx_map[0] | p->rel.rx_map[1]) ||
            ck_rail(cookie) || rd_rails_due(p) || !p->tx_synced)
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
        h.credits = 0;
        rd_hdr_ack(p, &h, 0); /* no holes: no SACK block */
        rd_mbox_hdr(p, &h, true);
        bool nocrc = rdd(qp->dev)->nocrc;
        uint64_t tok = p->s->ctok_tx;
        uint8_t *b = t->hdr;
        b[0] = nocrc || tok ? DW_DGRAM_VERSION2 : DW_DGRAM_VERSION;
        b[1] = h.flags;
        b[2] = 0;
        b[3] = 0;
        dw_put_be32(b + 4, p->rqpn);
        b[4] = nocrc ? DW_DGRAM_X_NOCRC : 0;
        dw_put_be32(b + 8, qp->qpn);
        b[8] = tok ? DW_DGRAM_X2_TOKEN : 0;
        dw_put_be32(b + 12, w->remote_qkey);
        dw_put_be32(b + 16, psn);
        dw_put_be32(b + 20, h.ack_psn);
        dw_put_be16(b + 24, h.credits);
        dw_put_be16(b + 26, 0); /* rnr_delay */
        b += DW_DGRAM_HDR_LEN;
        if (tok) {
                dw_put_be64(b, tok); /* RC over RD: the connection's token */
                b += DW_DGRAM_TOKEN_LEN;
        }
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
        rd_slot_whole(p->s->seal, t, b);
        rd_slot_for(t, p, psn, cookie, len);
        return true;
}

/* A credit control segment (X-flag CCTL): header, the untagged DDP header on
 * queue 3 with the type in its first RsvdULP byte, the value; one iovec. */
static int rd_build_cctl(struct dw_rd_peer *p, uint64_t cookie, uint32_t psn, bool ackreq,
                         struct rd_txslot *t)
{
        struct dw_rd_qp *s = p->s;
        const struct rd_cctl *c = &s->mb->cctl[ck_slot(cookie) - 1];
        bool nocrc = rdd(s->qp->dev)->nocrc;
        struct dw_dgram_hdr h = {
            .flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA | (ackreq ? DW_DGRAM_F_ACKREQ : 0),
            .xflags = (uint8_t)(DW_DGRAM_X_CCTL | (nocrc ? DW_DGRAM_X_NOCRC : 0)),
            .dst_qpn = p->rqpn,
            .src_qpn = s->qp->qpn,
            .psn = psn,
        };
        rd_mbox_hdr(p, &h, true);
        rd_hdr_rails(p, ck_rail(cookie), &h);
        rd_hdr_start(p, &h);
        rd_hdr_token(p, &h);
        rd_hdr_ack(p, &h, DW_DGRAM_MAX_SACK);
        ssize_t hl = dw_dgram_encode(&h, t->hdr, sizeof(t->hdr));
        if (hl < 0)
                return -EINVAL;
        uint8_t *b = t->hdr + hl;
        b[0] = DW_DDP_CTRL_L | DW_DDP_VERSION;
        b[1] = c->type == DW_CREDIT_CTL_REQUEST ? RD_CCTL_REQUEST : RD_CCTL_RESPONSE;
        dw_put_be32(b + 2, 0);
        dw_put_be32(b + 6, RD_CCTL_QN);
        dw_put_be32(b + 10, 1);
        dw_put_be32(b + 14, 0);
        dw_put_be32(b + 18, c->value);
        rd_slot_whole(s->seal, t, b + RD_CCTL_LEN);
        rd_slot_for(t, p, psn, cookie, 0);
        return 0;
}

/* What one datagram of a message carries, as the step for its kind of
 * cookie fills it in for rd_build_frame. */
struct rd_seg_out {
        struct dw_rdmap_hdr r;                    /* the segment's RDMAP header */
        uint8_t ext[DW_RDMAP_ATOMIC_REQ_HDR_LEN]; /* after it: a request's or response's fields */
        size_t extlen;
        struct iovec pay[DW_MAX_SGE]; /* the payload, plen bytes */
        int npay;
        uint64_t plen;
        bool imm; /* t->imm holds the Immediate Data message */
        uint32_t qkey;
        uint8_t xflags;
        uint32_t pull_len, pull_pushed; /* X-flag PULL: the Send's descriptor */
};

/* Segment seg of a send-queue WQE (S bytes each, a Send's own size aside):
 * a Send's, a Write's, a Read Request, an Atomic request. */
static inline int rd_build_sq(struct dw_rd_peer *p, uint64_t cookie, uint32_t seg, uint32_t S,
                              struct rd_txslot *t, struct rd_seg_out *o)
{
        struct dw_qp *qp = p->s->qp;

        struct dw_wqe *w = &qp->sq.ring[ck_slot(cookie)];
        if (dw_wr_is_send(w->opcode))
                S = rd_send_seg(p);
        uint64_t off = (uint64_t)seg * S;
        bool se = w->send_flags & DIWARP_SEND_SOLICITED;
        o->qkey = w->remote_qkey;
        const struct dw_wr_op *op = dw_wr_op(w->opcode);
        switch (op->kind) {
        case DW_WR_SEND: {
                /* A receiver-paced Send pushes its first chunk only,
                 * none of it its last segment; the first carries the
                 * pull descriptor. */
                bool pull = w->flags & RD_W_PULL;
                uint64_t end = pull ? w->pull_pushed : w->total_len;
                o->plen = end - off < S ? end - off : S;
                bool last = !pull && off + o->plen == w->total_len;
                if (pull && seg == 0) {
                        o->xflags |= DW_DGRAM_X_PULL;
                        o->pull_len = (uint32_t)w->total_len;
                        o->pull_pushed = w->pull_pushed;
                }
                /* With immediate data the SE bit rides on the Immediate
                 * Data message, as on UD. */
                dw_rdmap_data_hdr(w, off, o->plen, w->msn, se && !op->imm, &o->r);
                o->r.ddp.last = last;
                o->imm = op->imm && last;
                break;
        }
        case DW_WR_WRITE:
                o->plen = w->total_len - off < S ? w->total_len - off : S;
                dw_rdmap_data_hdr(w, off, o->plen, 0, false, &o->r);
                o->imm = op->imm && o->r.ddp.last;
                break;
        case DW_WR_READ: {
                /* The Data Sink STag names the request (its queue-1 MSN)
                 * and the sink TO counts from 0: the requester places
                 * responses by offset into its SGE list. */
                struct dw_rdmap_rreq rq;
                dw_rdmap_read_req_build(w, w->msn, 0, &rq);
                dw_rdmap_hdr_init(&o->r, DW_RDMAP_READ_REQ);
                o->r.ddp.msn = w->msn;
                o->extlen = (size_t)dw_rdmap_rreq_encode(&rq, o->ext, sizeof(o->ext));
                break;
        }
        case DW_WR_ATOMIC: {
                struct dw_rdmap_atomic_req ar;
                dw_rdmap_atomic_req_build(w, w->msn, &ar);
                dw_rdmap_hdr_init(&o->r, DW_RDMAP_ATOMIC_REQ);
                o->r.ddp.msn = w->msn;
                o->extlen = (size_t)dw_rdmap_atomic_req_encode(&ar, o->ext, sizeof(o->ext));
                break;
        }
        default:
                return -EINVAL;
        }
        if (o->plen) {
                o->npay =
                    dw_rdmap_wr_iov(&qp->dev->mrs, qp->pd, w, off, o->plen, 0, o->pay, DW_MAX_SGE);
                if (o->npay < 0)
                        return -EACCES;
        }
        if (o->imm) {
                struct dw_rdmap_hdr ri;
                bool wr = op->kind == DW_WR_WRITE;
                dw_rdmap_hdr_init(&ri, dw_rdmap_imm_opcode(se));
                ri.ddp.msn = w->msn;
                ssize_t k = dw_rdmap_encode(&ri, t->imm, sizeof(t->imm));
                if (k != DW_DGRAM_DDP_UNTAGGED_LEN)
                        return -EINVAL;
                /* Bytes 0-3: the verbs immediate (network order); bytes
                 * 4-7: with a Write, its length (the receiver's byte_len). */
                memcpy(t->imm + k, &w->imm_data, 4);
                dw_put_be32(t->imm + k + 4, wr ? (uint32_t)w->total_len : 0);
        }
        return 0;
}

/* A Read Request of our pull of a receiver-paced Send. */
static inline void rd_build_pull_req(struct dw_rd_qp *s, uint64_t cookie, uint32_t seg,
                                     struct rd_seg_out *o)
{
        /* A Read of a receiver-paced Send we are receiving: its Data
         * Source STag names the Send (its MSN), the TO the offset. */
        const struct rd_pull *pl = &s->pull[ck_slot(cookie)];
        const struct rd_pull_read *rr = &pl->rd[seg];
        struct dw_rdmap_rreq rq = {.sink_stag = rr->msn,
                                   .sink_to = 0,
                                   .rdma_rd_sz = rr->len,
                                   .src_stag = pl->send_msn,
                                   .src_to = rr->off};
        dw_rdmap_hdr_init(&o->r, DW_RDMAP_READ_REQ);
        o->r.ddp.msn = rr->msn;
        o->extlen = (size_t)dw_rdmap_rreq_encode(&rq, o->ext, sizeof(o->ext));
        o->xflags |= DW_DGRAM_X_PULLREQ;
}

/* Segment seg of a response to the peer's request: an Atomic response, or
 * a Read Response's data (from a registered region, or from the Send a
 * pull reads). */
static inline int rd_build_response(struct dw_rd_peer *p, uint64_t cookie, uint32_t seg, uint32_t S,
                                    struct rd_seg_out *o)
{
        struct dw_rd_qp *s = p->s;
        struct dw_qp *qp = s->qp;

        struct rd_irq *e = &s->irq[ck_slot(cookie)];
        uint64_t off = (uint64_t)seg * S;
        if (e->pull) {
                /* A Read of a receiver-paced Send: from the Send's own SGEs
                 * (lkeys checked), not a memory region. */
                uint32_t len = e->resp.rq.rdma_rd_sz;
                o->plen = len - off < S ? len - off : S;
                o->npay = dw_rdmap_wr_iov(&qp->dev->mrs, qp->pd, &qp->sq.ring[e->wslot],
                                          e->resp.rq.src_to + off, o->plen, 0, o->pay, DW_MAX_SGE);
                if (o->npay < 0)
                        return -EACCES;
                dw_rdmap_read_resp_hdr(&e->resp.rq, off, o->plen, &o->r);
                return 0;
        }
        /* A region's source is checked per segment: it may have gone since
         * (rd_read_source_gone). */
        struct dw_rdmap_resp_seg sg;
        if (dw_rdmap_resp_segment(dw_rdmap_qp_of(qp), &e->resp, off, S, &sg) != DW_PROT_OK)
                return -EFAULT;
        o->r = sg.h;
        o->extlen = sg.extlen;
        if (sg.extlen)
                memcpy(o->ext, sg.ext, sg.extlen);
        o->plen = sg.len;
        if (sg.len) {
                o->pay[0].iov_base = sg.src;
                o->pay[0].iov_len = sg.len;
                o->npay = 1;
        }
        return 0;
}

/* The datagram itself, into t: the datagram header (with as many SACK
 * blocks as the MTU leaves room for), the DDP/RDMAP header and fields, then
 * the payload and the Immediate, copied behind the header when small,
 * else gathered; sealed. */
static inline int rd_build_frame(struct dw_rd_peer *p, uint64_t cookie, uint32_t psn, bool ackreq,
                                 struct rd_txslot *t, const struct rd_seg_out *o)
{
        struct dw_rd_qp *s = p->s;
        struct dw_qp *qp = s->qp;
        bool nocrc = rdd(qp->dev)->nocrc;

        size_t ddp_len = o->r.ddp.tagged ? DW_DGRAM_DDP_TAGGED_LEN : DW_DGRAM_DDP_UNTAGGED_LEN;
        size_t fixed = DW_DGRAM_HDR_LEN + ddp_len + o->extlen + o->plen +
                       (o->imm ? DW_DGRAM_IMM_MSG_LEN : 0) + dw_seal_trailer_len(s->seal, nocrc) +
                       ((o->xflags & DW_DGRAM_X_PULL) ? DW_DGRAM_PULL_LEN : 0);
        uint32_t mtu = p->udp_mtu;
        struct dw_dgram_hdr h = {
            .flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA | (o->imm ? DW_DGRAM_F_IMM : 0) |
                     (ackreq ? DW_DGRAM_F_ACKREQ : 0),
            .xflags = o->xflags,
            .dst_qpn = p->rqpn,
            .src_qpn = qp->qpn,
            .qkey = o->qkey,
            .psn = psn,
            .pull_len = o->pull_len,
            .pull_pushed = o->pull_pushed,
        };
        rd_mbox_hdr(p, &h, true);
        fixed += rd_hdr_rails(p, ck_rail(cookie), &h);
        fixed += rd_hdr_start(p, &h);
        fixed += rd_hdr_token(p, &h);
        size_t room = mtu > fixed ? (mtu - fixed) / DW_DGRAM_SACK_LEN : 0;
        rd_hdr_ack(p, &h, room > DW_DGRAM_MAX_SACK ? DW_DGRAM_MAX_SACK : (unsigned)room);
        ssize_t hl =
            h.sack_count || (h.xflags & ~DW_DGRAM_X_NOCRC) || (h.xflags2 & ~DW_DGRAM_X2_TOKEN)
                ? dw_dgram_encode(&h, t->hdr, sizeof(t->hdr))
                : rd_put_hdr(&h, t->hdr);
        if (hl < 0)
                return -EINVAL;
        ssize_t dl = rd_put_ddp(&o->r, t->hdr + hl);
        memcpy(t->hdr + hl + dl, o->ext, o->extlen);
        size_t hlen = (size_t)hl + (size_t)dl + o->extlen;
        if (o->plen <= RD_COPY_MAX && hlen <= RD_HDR_CAP) {
                uint8_t *q = t->hdr + hlen;
                for (int i = 0; i < o->npay; i++) {
                        memcpy(q, o->pay[i].iov_base, o->pay[i].iov_len);
                        q += o->pay[i].iov_len;
                }
                if (o->imm) {
                        memcpy(q, t->imm, sizeof(t->imm));
                        q += sizeof(t->imm);
                }
                rd_slot_whole(s->seal, t, q);
                goto filled;
        }
        int n = 0;
        t->iov[n].iov_base = t->hdr;
        t->iov[n].iov_len = hlen;
        n++;
        for (int i = 0; i < o->npay; i++)
                t->iov[n++] = o->pay[i];
        if (o->imm) {
                t->iov[n].iov_base = t->imm;
                t->iov[n].iov_len = sizeof(t->imm);
                n++;
        }
        struct dw_seal_run run;
        dw_seal_begin(s->seal, &run, t->hdr);
        dw_seal_add_iov(s->seal, &run, t->iov, (size_t)n);
        size_t tl = dw_seal_end(s->seal, &run, t->hdr, t->trl);
        if (tl) {
                t->iov[n].iov_base = t->trl;
                t->iov[n].iov_len = tl;
                n++;
        }
        t->iovcnt = n;
        t->dlen = 0;
        for (int i = 0; i < n; i++)
                t->dlen += (uint32_t)t->iov[i].iov_len;
filled:
        rd_slot_for(t, p, psn, cookie, (uint32_t)o->plen);
        return 0;
}

/* Builds the datagram for cookie with PSN psn into t (with the ACK fields of
 * rd_hdr_ack). 0, or -EACCES (a local key failed), -EFAULT (the region a
 * peer's Read names is no longer accessible), -EINVAL. */
static int rd_build(struct dw_rd_peer *p, uint64_t cookie, uint32_t psn, bool ackreq,
                    struct rd_txslot *t)
{
        struct dw_qp *qp = p->s->qp;
        uint32_t seg = ck_seg(cookie);
        struct rd_seg_out o; /* not zeroed whole: r and pay are written before use */
        int err = 0;

        if (ck_kind(cookie) == RD_CK_CCTL)
                return rd_build_cctl(p, cookie, psn, ackreq, t);
        if (ck_kind(cookie) == RD_CK_SQ && seg == 0 &&
            rd_build_small(p, &qp->sq.ring[ck_slot(cookie)], cookie, psn, ackreq, t))
                return 0;
        o.extlen = 0;
        o.npay = 0;
        o.plen = 0;
        o.imm = false;
        o.qkey = 0;
        o.xflags = rdd(qp->dev)->nocrc ? DW_DGRAM_X_NOCRC : 0;
        o.pull_len = o.pull_pushed = 0;
        if (ck_kind(cookie) == RD_CK_SQ)
                err = rd_build_sq(p, cookie, seg, rd_peer_seg(p), t, &o);
        else if (ck_kind(cookie) == RD_CK_PULL)
                rd_build_pull_req(p->s, cookie, seg, &o);
        else
                err = rd_build_response(p, cookie, seg, rd_peer_seg(p), &o);
        return err < 0 ? err : rd_build_frame(p, cookie, psn, ackreq, t, &o);
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
        if (r >= 0)
                return 0;
        if (!rd_backpressure(r)) {
                rdd(dev)->tx_neterr = r;
                return 0;
        }
        dev->ctr.tx_backpressure++;
        return r;
}

static int rd_send_ctrl(struct dw_rd_peer *p, struct dw_dgram_hdr *h)
{
        struct dw_qp *qp = p->s->qp;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN + DW_SEAL_TRAILER_MAX];
        h->dst_qpn = p->rqpn;
        h->src_qpn = qp->qpn;
        rd_mbox_hdr(p, h, false);
        if (rdd(qp->dev)->nocrc)
                h->xflags |= DW_DGRAM_X_NOCRC;
        /* Back the way the peer's latest datagram came: a rail that fails
         * one way is left both ways. */
        unsigned rail = rd_rails(p) ? p->reply_rail : 0;
        if (rail && rd_rail_path(p, rail)->down)
                rail = rd_home_rail(p);
        rd_hdr_rails(p, rail, h);
        rd_hdr_token(p, h);
        if (!rail && p->path->chal_due) {
                /* Multirail: our challenge, to the device's first address
                 * only (rd_rails_unproven). */
                h->xflags2 |= DW_DGRAM_X2_CHALLENGE;
                h->challenge = p->path->chal;
                p->path->chal_due = false;
        }
        ssize_t n = dw_dgram_encode(h, buf, sizeof(buf));
        if (n < 0)
                return 0;
        n = dw_seal_packet(p->s->seal, buf, (size_t)n, sizeof(buf));
        if (n < 0)
                return 0;
        struct iovec iov = {buf, (size_t)n};
        struct sockaddr_in dst = {
            .sin_family = AF_INET, .sin_addr.s_addr = rd_rail_ip(p, rail), .sin_port = p->port};
        rdd(qp->dev)->tx_neterr = 0;
        int r = rd_send_one(qp->dev, &iov, 1, &dst);
        if (rdd(qp->dev)->tx_neterr)
                rd_rail_neterr(p, rail, rdd(qp->dev)->tx_neterr, rdd(qp->dev)->step_now);
        return r;
}

void rd_send_nak(struct dw_rd_peer *p, uint32_t psn, uint8_t code)
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
        struct dw_rd_dev *d = rdd(s->qp->dev);
        (void)psn;
        uint32_t b = rd_cc_bytes(p, cookie);
        unsigned rail = ck_rail(cookie);
        if (rail | p->path->nrails) {
                /* Multirail: the window of the rail that carried it learns it,
                 * and the rail is alive. */
                struct dw_flow_path *f = rd_rail_path(p, rail);
                d->cc_acked_rail[f == p->path ? 0 : rail] += b;
                f->last_ack = d->step_now;
                f->retx_since_ack = 0;
                if (f->down)
                        rd_rail_up(p, rail);
        } else {
                d->cc_acked += b;
        }
        p->cc_inflight = b < p->cc_inflight ? p->cc_inflight - b : 0;
        if (ck_kind(cookie) == RD_CK_SQ) {
                struct dw_wqe *w = &s->qp->sq.ring[ck_slot(cookie)];
                w->bytes_acked++;
                rd_check_done(s, w);
        } else if (ck_kind(cookie) == RD_CK_PULL) {
                rd_pull_acked(s, ck_slot(cookie), ck_seg(cookie));
        } else if (ck_kind(cookie) == RD_CK_CCTL) {
                rd_mbox_cctl_acked(s, ck_slot(cookie));
        } else {
                struct rd_irq *e = &s->irq[ck_slot(cookie)];
                e->acked++;
                if (e->acked >= e->nseg && e->sent >= e->nseg) {
                        e->peer = NULL;
                        if (e->pull) {
                                /* A chunk of a receiver-paced Send is with the
                                 * receiver: the Send completes once all are. */
                                struct dw_wqe *w = &s->qp->sq.ring[e->wslot];
                                w->pull_done += e->resp.rq.rdma_rd_sz;
                                rd_check_done(s, w);
                        }
                }
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
        struct dw_rd_dev *d = rdd(dev);
        if (d->ctl_sent >= RD_CTL_PER_WALK)
                return -EAGAIN;
        d->ctl_sent++;
        uint64_t now = d->step_now;
        uint32_t b = rd_cc_bytes(p, cookie);
        unsigned rail = ck_rail(cookie);
        if (rd_rails(p))
                cookie = rd_resend_rail(p, psn, cookie, b, now);
        dw_cc_sent(&rd_rail_path(p, ck_rail(cookie))->cc, b, true, now);
        int r = rd_build(p, cookie, psn, false, t);
        if (r < 0)
                return r;
        d->tx_neterr = 0;
        r = rd_send_one(dev, t->iov, t->iovcnt, &t->dst);
        if (r < 0)
                return r;
        if (d->tx_neterr)
                rd_rail_neterr(p, t->rail, d->tx_neterr, now);
        if (dev->nrails > 1) {
                dev->rail[rail].retransmits++;
                dev->rail[t->rail].tx_packets++;
                dev->rail[t->rail].tx_bytes += t->dlen;
        }
        dev->ctr.retransmits++;
        p->s->qp->ctr.retransmits++;
        dev->ctr.tx_packets++;
        return 0;
}

/* An ACK that goes alone says how long the packet it reports waited here
 * (DW_DGRAM_X2_ACKDELAY): the sender's congestion control then sees the
 * network's delay, not this thread's wait for a core. */
static void rd_build_lone_ack(struct dw_rd_peer *p, struct dw_dgram_hdr *h)
{
        dw_rel_build_ack(&p->rel, h, DW_DGRAM_MAX_SACK);
        dw_rel_ack_delay(&p->rel, h, rd_clock(p->s->qp->dev));
}

int rd_send_credit(struct dw_rd_peer *p, bool probe)
{
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | (probe ? DW_DGRAM_F_ACKREQ : 0),
                                 .psn = p->rel.snd_nxt};
        if (dw_rel_ack_owed(&p->rel))
                rd_build_lone_ack(p, &h);
        return rd_send_ctrl(p, &h);
}

int rd_send_ack(struct dw_rd_peer *p)
{
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD, .psn = p->rel.snd_nxt};
        rd_build_lone_ack(p, &h);
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

static void ops_rtt(void *ctx, uint32_t psn, uint64_t cookie, uint32_t rtt_ns, uint64_t now)
{
        struct dw_rd_peer *p = ctx;
        (void)psn;
        dw_cc_rtt(&rd_rail_path(p, ck_rail(cookie))->cc, rtt_ns, now);
}

static void ops_lost(void *ctx, enum dw_rel_loss how, uint64_t now)
{
        struct dw_rd_peer *p = ctx;
        /* A multirail stream's losses are charged per rail, as each lost
         * datagram is resent (rd_resend_rail). */
        if (rd_rails(p))
                return;
        dw_cc_lost(&p->path->cc,
                   how == DW_REL_LOSS_RTO     ? DW_CC_LOSS_RTO
                   : how == DW_REL_LOSS_PROBE ? DW_CC_LOSS_PROBE
                                              : DW_CC_LOSS_FAST,
                   now);
}

const struct dw_rel_ops rd_ops = {
    .acked = ops_acked,
    .retransmit = ops_retransmit,
    .send_ack = ops_send_ack,
    .rtt = ops_rtt,
    .lost = ops_lost,
};

int rd_on_ack(struct dw_rd_peer *p, const struct dw_dgram_hdr *h, uint64_t now, uint64_t arrived)
{
        struct dw_rd_dev *d = rdd(p->s->qp->dev);
        d->cc_acked = 0;
        bool rails = p->path->nrails;
        if (rails)
                memset(d->cc_acked_rail, 0, sizeof(d->cc_acked_rail));
        uint32_t una = p->rel.snd_una;
        int r = dw_rel_on_ack_at(&p->rel, h, now, arrived, &rd_ops, p);
        /* Our first PSN acknowledged: the peer knows where the stream
         * starts, and our datagrams stop saying it. */
        if (p->rel.snd_una != una)
                p->tx_synced = true;
        if (d->cc_acked)
                dw_cc_acked(&p->path->cc, d->cc_acked, now);
        for (unsigned i = 0; rails && i < p->path->nrails; i++)
                if (d->cc_acked_rail[i])
                        dw_cc_acked(&rd_rail_path(p, i)->cc, d->cc_acked_rail[i], now);
        if (h->xflags & DW_DGRAM_X_ECE)
                dw_cc_lost(&p->path->cc, DW_CC_LOSS_ECN, now);
        return r;
}

/* ---------------------------------------------------------------- transmit */

/* Whether the stream's window and the window of the path of the rail
 * `rail` let `bytes` more go now. */
static bool rd_room(struct dw_rd_peer *p, uint64_t now, uint32_t bytes, unsigned rail)
{
        if (p->dead)
                return false;
        if (!p->rel.ring && !rd_ring_get(rdd(p->s->qp->dev), p))
                return false;
        return dw_rel_tx_can_send(&p->rel, now) &&
               dw_rel_tx_inflight(&p->rel) + p->batch < DW_REL_DEF_WINDOW &&
               rd_cc_room_on(rdd(p->s->qp->dev), rd_rail_path(p, rail), bytes, now);
}

static uint32_t rd_ord(const struct dw_rd_qp *s)
{
        const struct dw_qp *qp = s->qp;
        if ((qp->attr_mask_set & DIWARP_QP_MAX_QP_RD_ATOMIC) && qp->attr.max_rd_atomic &&
            qp->attr.max_rd_atomic < RD_MAX_ORQ)
                return qp->attr.max_rd_atomic;
        return RD_MAX_ORQ;
}

/* A token for the next WQE of the batch to start: one already admitted, or
 * a few more asked for (one critical section for a burst of posts). False:
 * the caps hold it back; the step asks again (keeping the process's place
 * in the host pool's line). */
static bool rd_token(struct dw_rd_qp *s, uint64_t now)
{
        if (s->starting < s->admitted) {
                s->starting++;
                return true;
        }
        uint32_t queued = dw_wq_count(&s->qp->sq) - s->tx_idx;
        uint32_t want = queued < RD_ADMIT_BATCH ? queued : RD_ADMIT_BATCH;
        int n = dw_host_admit(&s->ifl, want ? want : 1, now);
        if (n <= 0) {
                if (!s->token_wait) {
                        s->token_wait = true;
                        s->qp->ctr.inflight_waits++;
                        s->qp->dev->ctr.inflight_waits++;
                }
                return false;
        }
        s->token_wait = false;
        s->admitted += (uint32_t)n;
        s->starting++;
        return true;
}

/* Next SQ segment into t. 1 built, 0 nothing (empty or blocked), 2 progress
 * without a packet (Local Invalidate, Bind Memory Window), -1 the QP failed. */
static int rd_next_sq(struct dw_rd_qp *s, uint64_t now, int nbuilt, struct rd_txslot *t)
{
        struct dw_qp *qp = s->qp;
        struct dw_wqe *w = dw_wq_at(&qp->sq, s->tx_idx);
        if (!w)
                return 0;
        if (dw_wr_op(w->opcode)->kind == DW_WR_LOCAL) {
                if (nbuilt)
                        return 0;
                char why[160];
                enum diwarp_wc_status st = dw_qp_run_local_wqe(qp, w, why, sizeof(why));
                s->tx_idx++;
                s->tx_seg = 0;
                if (st != DIWARP_WC_SUCCESS) {
                        dw_warn("RD QP %#x: send WR %#llx: %s", qp->qpn,
                                (unsigned long long)w->wr_id, why);
                        rd_complete_through(s, w, st);
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
                if (dw_wr_op(w->opcode)->response && s->norq + s->orq_building >= rd_ord(s))
                        return 0;
        }
        uint32_t slot = (uint32_t)(w - qp->sq.ring);
        uint64_t cookie = rd_cookie(RD_CK_SQ, slot, s->tx_seg);
        uint32_t ccb = rd_cc_bytes(p, cookie);
        int rail = rd_seg_rail(s, p, w->total_len, ccb, now);
        if (rail < 0)
                return 0;
        cookie = ck_on_rail(cookie, (unsigned)rail);
        struct dw_flow_path *f = rd_rail_path(p, (unsigned)rail);
        if (!rd_room(p, now, ccb, (unsigned)rail))
                return 0;
        if (s->capped && s->tx_seg == 0 && !(w->flags & RD_W_TOKEN) && !rd_token(s, now))
                return 0;
        int cr = 0;
        if (s->mb && dw_wr_is_send(w->opcode)) {
                /* Credits in the peer's mailbox, one per slot the segment fills. */
                cr = rd_mbox_tx_take(p, rd_send_seg_len(p, w, s->tx_seg), now);
                if (cr < 0)
                        return 0;
        }
        uint32_t psn = p->rel.snd_nxt + p->batch;
        bool last_seg = s->tx_seg + 1 >= w->ts_ns;
        bool ackreq = dw_rel_tx_inflight(&p->rel) + p->batch + 1 >= DW_REL_DEF_WINDOW ||
                      (last_seg && s->tx_idx + 1 >= dw_wq_count(&qp->sq)) ||
                      dw_cc_full_after(&f->cc, f->pending + ccb);
        int r = rd_build(p, cookie, psn, ackreq, t);
        t->cr_slots = (uint32_t)cr;
        if (r < 0) {
                dw_warn("RD QP %#x: send WR %#llx: local protection error (lkey)", qp->qpn,
                        (unsigned long long)w->wr_id);
                rd_complete_through(s, w, DIWARP_WC_LOC_PROT_ERR);
                dw_qp_to_error(qp, -1);
                return -1;
        }
        t->save_idx = s->tx_idx;
        t->save_seg = s->tx_seg;
        t->cc_bytes = ccb;
        f->pending += ccb;
        p->batch++;
        if (dw_wr_op(w->opcode)->response && s->tx_seg == 0)
                s->orq_building++;
        if (last_seg) {
                s->tx_idx++;
                s->tx_seg = 0;
        } else {
                s->tx_seg++;
        }
        return 1;
}

/* The next Read Request of a receiver-paced Send we are receiving (see
 * rd_pull.c): one the socket refused before, else a new one while fewer
 * than the depth are unplaced. 1 built, 0 none. */
/* A free Read slot of the oldest message with bytes left to ask for, once
 * fewer than pull_depth Reads of the QP are unplaced; -1 when none may go. */
static int rd_pull_new_read(struct dw_rd_qp *s, struct dw_rd_dev *d, uint32_t *idx_out)
{
        if (s->pull_busy >= d->pull_depth)
                return -1;
        int best = -1, best_slot = -1;
        for (uint32_t i = 0; i < RD_MAX_PULL; i++) {
                struct rd_pull *pl = &s->pull[i];
                if (!pl->peer || !pl->w || pl->next >= pl->len)
                        continue;
                if (best >= 0 && (int32_t)(pl->seq - s->pull[best].seq) > 0)
                        continue;
                int slot = -1;
                for (uint32_t k = 0; k < RD_PULL_MAX_DEPTH && slot < 0; k++)
                        if (!pl->rd[k].used)
                                slot = (int)k;
                if (slot >= 0) {
                        best = (int)i;
                        best_slot = slot;
                }
        }
        if (best < 0)
                return -1;
        struct rd_pull *pl = &s->pull[best];
        uint32_t left = pl->len - pl->next;
        struct rd_pull_read *rr = &pl->rd[best_slot];
        *rr = (struct rd_pull_read){.msn = pl->peer->tx_rreq++,
                                    .off = pl->next,
                                    .len = left < d->pull_chunk ? left : d->pull_chunk,
                                    .used = true};
        pl->next += rr->len;
        pl->busy++;
        s->pull_busy++;
        s->qp->ctr.pulls++;
        s->qp->ctr.pull_bytes += rr->len;
        s->qp->dev->ctr.pulls++;
        s->qp->dev->ctr.pull_bytes += rr->len;
        *idx_out = (uint32_t)best;
        return best_slot;
}

static int rd_next_pull(struct dw_rd_qp *s, uint64_t now, struct rd_txslot *t)
{
        struct dw_rd_dev *d = rdd(s->qp->dev);
        uint32_t idx = 0;
        int slot = -1;
        /* A Read asked for whose request is not out yet (the socket refused
         * it) goes before a new one. */
        for (uint32_t k = 0; k < RD_MAX_PULL && slot < 0; k++) {
                idx = (s->pull_rr + k) % RD_MAX_PULL;
                struct rd_pull *pl = &s->pull[idx];
                if (!pl->peer || !pl->w)
                        continue;
                for (uint32_t i = 0; i < RD_PULL_MAX_DEPTH && slot < 0; i++)
                        if (pl->rd[i].used && !pl->rd[i].sent)
                                slot = (int)i;
        }
        if (slot < 0 && (slot = rd_pull_new_read(s, d, &idx)) < 0)
                return 0;
        struct rd_pull *pl = &s->pull[idx];
        struct dw_rd_peer *p = pl->peer;
        unsigned rail = rd_home_rail(p);
        uint64_t cookie = ck_on_rail(rd_cookie(RD_CK_PULL, idx, (uint32_t)slot), rail);
        uint32_t ccb = rd_cc_bytes(p, cookie);
        if (!rd_room(p, now, ccb, rail))
                return 0;
        uint32_t psn = p->rel.snd_nxt + p->batch;
        bool ackreq = dw_rel_tx_inflight(&p->rel) + p->batch + 1 >= DW_REL_DEF_WINDOW;
        if (rd_build(p, cookie, psn, ackreq, t) < 0)
                return 0;
        t->save_idx = idx;
        t->save_seg = (uint32_t)slot;
        t->cc_bytes = ccb;
        rd_rail_path(p, rail)->pending += ccb;
        p->batch++;
        /* Taken by this batch; a refusal of the socket gives it back. */
        pl->rd[slot].sent = true;
        s->pull_rr = idx;
        return 1;
}

/* The next credit control message not sent yet; 1 built, 0 none. */
static int rd_next_cctl(struct dw_rd_qp *s, uint64_t now, struct rd_txslot *t)
{
        struct rd_mbox *m = s->mb;
        for (uint32_t i = 0; m && m->cctl_unsent && i < RD_MAX_CCTL; i++) {
                struct rd_cctl *c = &m->cctl[i];
                if (!c->peer || c->sent)
                        continue;
                struct dw_rd_peer *p = c->peer;
                unsigned rail = rd_home_rail(p);
                uint64_t cookie = ck_on_rail(rd_cookie(RD_CK_CCTL, i + 1, 0), rail);
                uint32_t ccb = rd_cc_bytes(p, cookie);
                if (!rd_room(p, now, ccb, rail))
                        continue;
                uint32_t psn = p->rel.snd_nxt + p->batch;
                if (rd_build(p, cookie, psn, true, t) < 0)
                        return 0;
                t->save_idx = i;
                t->cc_bytes = ccb;
                rd_rail_path(p, rail)->pending += ccb;
                p->batch++;
                /* Taken by this batch; a refusal of the socket gives it back. */
                c->sent = true;
                m->cctl_unsent--;
                return 1;
        }
        return 0;
}

static int rd_next_irq(struct dw_rd_qp *s, uint64_t now, struct rd_txslot *t)
{
        for (uint32_t k = 0; k < s->fifo_count; k++) {
                uint32_t idx = s->fifo[(s->fifo_head + k) % RD_MAX_IRQ];
                struct rd_irq *e = &s->irq[idx];
                if (!e->peer || e->next_seg >= e->nseg)
                        continue;
                struct dw_rd_peer *p = e->peer;
                uint64_t cookie = rd_cookie(RD_CK_IRQ, idx, e->next_seg);
                uint32_t ccb = rd_cc_bytes(p, cookie);
                /* A chunk of a receiver-paced Send is striped as its Send is. */
                uint64_t len = e->resp.atomic ? 0
                               : e->pull      ? s->qp->sq.ring[e->wslot].total_len
                                              : e->resp.rq.rdma_rd_sz;
                int rail = rd_seg_rail(s, p, len, ccb, now);
                if (rail < 0)
                        return 0;
                cookie = ck_on_rail(cookie, (unsigned)rail);
                struct dw_flow_path *f = rd_rail_path(p, (unsigned)rail);
                if (!rd_room(p, now, ccb, (unsigned)rail))
                        return 0;
                uint32_t psn = p->rel.snd_nxt + p->batch;
                bool ackreq = dw_rel_tx_inflight(&p->rel) + p->batch + 1 >= DW_REL_DEF_WINDOW ||
                              e->next_seg + 1 >= e->nseg ||
                              dw_cc_full_after(&f->cc, f->pending + ccb);
                int r = rd_build(p, cookie, psn, ackreq, t);
                if (r < 0) {
                        if (r == -EFAULT)
                                rd_read_source_gone(p);
                        else
                                rd_peer_fail(p, DIWARP_WC_LOC_PROT_ERR, DIWARP_EVENT_QP_ACCESS_ERR,
                                             "a local SGE of a receiver-paced Send is no longer "
                                             "in a valid memory region");
                        return -1;
                }
                t->save_idx = idx;
                t->save_seg = e->next_seg;
                t->cc_bytes = ccb;
                f->pending += ccb;
                p->batch++;
                e->next_seg++;
                return 1;
        }
        return 0;
}

/* Packets in flight to one peer that make a window, not a ping-pong (whose
 * next message may leave before the ACK of the last one is handled). */
#define RD_STAMP_WINDOW 4

static void rd_commit(struct dw_rd_qp *s, struct rd_txslot *t, uint64_t now)
{
        struct dw_rd_peer *p = t->peer;
        struct dw_qp *qp = s->qp;
        dw_rel_tx_sent(&p->rel, t->psn, t->cookie, now);
        /* A window, not a ping-pong: the ACKs coming back are timed by the
         * kernel's stamps (dw_udp_stamps_busy). */
        if (dw_rel_tx_inflight(&p->rel) >= RD_STAMP_WINDOW)
                dw_udp_stamps_busy(&qp->dev->udp);
        if (t->rail)
                dw_rel_tx_rename(&p->rel, t->psn, t->cookie, t->rail);
        dw_cc_sent(&rd_rail_path(p, t->rail)->cc, t->cc_bytes, false, now);
        p->cc_inflight += t->cc_bytes;
        if (qp->dev->nrails > 1) {
                qp->dev->rail[t->rail].tx_packets++;
                qp->dev->rail[t->rail].tx_bytes += t->dlen;
        }
        if (t->dlen > rdd(qp->dev)->dgram_max)
                rdd(qp->dev)->dgram_max = t->dlen;
        qp->ctr.tx_packets++;
        qp->ctr.tx_bytes += t->bytes;
        qp->dev->ctr.tx_packets++;
        qp->dev->ctr.tx_bytes += t->bytes;
        if (ck_kind(t->cookie) == RD_CK_SQ) {
                struct dw_wqe *w = &qp->sq.ring[ck_slot(t->cookie)];
                w->bytes_done++;
                if (s->capped && !(w->flags & RD_W_TOKEN)) {
                        w->flags |= RD_W_TOKEN;
                        s->admitted--;
                }
                if (dw_wr_op(w->opcode)->response && !(w->flags & RD_W_INORQ) &&
                    s->norq < RD_MAX_ORQ) {
                        s->orq[s->norq++] = w;
                        w->flags |= RD_W_INORQ;
                }
                if (w->bytes_done >= w->ts_ns)
                        w->flags |= RD_W_TXALL;
        } else if (ck_kind(t->cookie) == RD_CK_IRQ) {
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
                                if (r < 0)
                                        rd_rail_neterr(d->slot[sent].peer, d->slot[sent].rail, r,
                                                       d->step_now);
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
                /* Lost to a network error: rel/ recovers (by the other rails
                 * if it was this rail's). */
                rd_rail_neterr(d->slot[sent].peer, d->slot[sent].rail, r, d->step_now);
                sent++;
        }
        return sent;
}

/* Transmits new segments of one QP. Returns work; *blocked when the socket
 * pushed back. */
/* Builds the next batch into the device's slots: credit control first,
 * then pull requests, then the SQ and the responder's queue in turns. The
 * datagrams built, or -1 when the QP failed while building; *work counts
 * WRs finished without a datagram. */
static int rd_tx_build(struct dw_rd_qp *s, uint64_t now, int *work)
{
        struct dw_device *dev = s->qp->dev;
        struct dw_rd_dev *d = rdd(dev);
        int n = 0;
        uint32_t bytes = 0;
        bool sq_off = false, irq_off = s->fifo_count == 0, pull_off = s->npull == 0;
        s->orq_building = 0;
        s->starting = 0;
        /* With GSO a step builds up to 64 datagrams (a few super-
         * datagrams' worth), fewer when they are large. */
        int nmax = !dev->fault_on && dw_udp_gso_on(&dev->udp) ? RD_BATCH : DW_UDP_TX_BATCH;
        /* Credit control first: a blocked sender waits for it. */
        while (n < nmax && s->mb && s->mb->cctl_unsent && rd_next_cctl(s, now, &d->slot[n]) == 1) {
                bytes += d->slot[n].dlen;
                n++;
        }
        while (n < nmax && bytes < RD_BATCH_BYTES && !(sq_off && irq_off && pull_off)) {
                /* Pull requests first: small, and each one unlocks a chunk
                 * of data. */
                if (!pull_off) {
                        int r = rd_next_pull(s, now, &d->slot[n]);
                        if (r == 1) {
                                bytes += d->slot[n].dlen;
                                n++;
                                continue;
                        }
                        pull_off = true;
                        if (sq_off && irq_off)
                                break;
                }
                bool use_irq = !irq_off && (s->irq_turn || sq_off);
                int r =
                    use_irq ? rd_next_irq(s, now, &d->slot[n]) : rd_next_sq(s, now, n, &d->slot[n]);
                if (r < 0)
                        return -1;
                if (r == 0) {
                        if (use_irq)
                                irq_off = true;
                        else
                                sq_off = true;
                        continue;
                }
                if (r == 2) {
                        (*work)++;
                        continue;
                }
                s->irq_turn = !use_irq;
                bytes += d->slot[n].dlen;
                n++;
        }
        return n;
}

/* The QP failed while building: the batch is forgotten. */
static void rd_tx_forget(struct dw_rd_dev *d)
{
        for (int i = 0; i < RD_BATCH; i++) {
                if (d->slot[i].peer) {
                        rd_pending_clear(d->slot[i].peer);
                        d->slot[i].peer->batch = 0;
                        rd_ring_idle(d, d->slot[i].peer);
                }
                d->slot[i].peer = NULL;
        }
}

/* Hands the n datagrams built to the socket: how many it took. */
static int rd_tx_send(struct dw_device *dev, struct dw_rd_dev *d, int n, uint64_t now)
{
        if (!dev->fault_on && n > 1)
                return rd_send_batch(dev, d, n);
        int sent = 0;
        for (; sent < n; sent++) {
                struct rd_txslot *t = &d->slot[sent];
                d->tx_neterr = 0;
                if (rd_send_one(dev, t->iov, t->iovcnt, &t->dst) < 0)
                        break;
                if (d->tx_neterr)
                        rd_rail_neterr(t->peer, t->rail, d->tx_neterr, now);
        }
        return sent;
}

/* The socket took sent of the n datagrams: those are committed to rel/,
 * and the cursors roll back to the first one it refused. */
static void rd_tx_settle(struct dw_rd_qp *s, struct dw_rd_dev *d, int n, int sent, uint64_t now)
{
        for (int i = 0; i < n; i++) {
                d->slot[i].peer->batch = 0;
                rd_pending_clear(d->slot[i].peer);
        }
        for (int i = 0; i < sent; i++)
                rd_commit(s, &d->slot[i], now);
        for (int i = n - 1; i >= sent; i--) {
                struct rd_txslot *t = &d->slot[i];
                if (ck_kind(t->cookie) == RD_CK_CCTL) {
                        s->mb->cctl[t->save_idx].sent = false;
                        s->mb->cctl_unsent++;
                } else if (ck_kind(t->cookie) == RD_CK_PULL) {
                        /* rd_next_pull offers it again */
                        s->pull[t->save_idx].rd[t->save_seg].sent = false;
                } else if (ck_kind(t->cookie) == RD_CK_SQ) {
                        s->tx_idx = t->save_idx;
                        s->tx_seg = t->save_seg;
                        rd_mbox_tx_untake(t->peer, t->cr_slots);
                } else {
                        s->irq[t->save_idx].next_seg = t->save_seg;
                }
        }
        for (int i = sent; i < n; i++)
                rd_ring_idle(d, d->slot[i].peer); /* refused: maybe nothing in flight */
        for (int i = 0; i < n; i++)
                d->slot[i].peer = NULL;
}

int rd_tx_qp(struct dw_rd_qp *s, int budget, bool *blocked)
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
                if (work && dw_wq_count(&qp->sq) <= s->tx_idx && !s->fifo_count && !s->npull &&
                    !(s->mb && s->mb->cctl_unsent))
                        return work;
                uint64_t now = rd_clock(dev);
                int n = rd_tx_build(s, now, &work);
                if (n < 0) {
                        rd_tx_forget(d);
                        return work + 1;
                }
                if (n == 0)
                        break;
                int sent = rd_tx_send(dev, d, n, now);
                rd_tx_settle(s, d, n, sent, now);
                work += sent;
                if (sent < n) {
                        qp->ctr.tx_backpressure++;
                        *blocked = true;
                        return work;
                }
        }
        return work;
}

/* ---------------------------------------------------------------- latency path */

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
        uint8_t kind = dw_wr_op(w->opcode)->kind;
        if (kind != DW_WR_SEND && kind != DW_WR_WRITE)
                return; /* Reads and Atomics take an ORQ slot, local WRs run in order: rd_tx_qp */
        /* The clock is read after the send, off the latency path: before it,
         * only an RNR back-off would need it, and that is left to the step. */
        uint32_t slot = (uint32_t)(w - qp->sq.ring);
        uint64_t cookie = rd_cookie(RD_CK_SQ, slot, 0);
        uint32_t ccb = rd_cc_bytes(p, cookie);
        /* The clock of the last step: pacing's burst allowance covers its age. */
        /* A stream whose first rail is down sends by another: left to the step. */
        if (p->rel.rnr_until || (p->path->down && rd_rails(p)) || !rd_room(p, d->step_now, ccb, 0))
                return;
        s->starting = 0;
        if (s->capped && !rd_token(s, d->step_now))
                return;
        /* A one-segment Send takes its credits here; none left: the step
         * waits for them. */
        int cr = 0;
        if (s->mb && dw_wr_is_send(w->opcode)) {
                cr = rd_mbox_tx_take(p, rd_send_seg_len(p, w, 0), d->step_now);
                if (cr < 0)
                        return;
        }
        struct rd_txslot *t = &d->slot[0];
        /* As rd_next_sq builds it: the last WQE of the SQ asks for an ACK. A
         * build error or a refusal of the socket is left to the progress step,
         * which fails the WR or waits for the socket as usual. */
        t->cc_bytes = ccb;
        if (rd_build(p, cookie, p->rel.snd_nxt, true, t) < 0 ||
            rd_send_one(dev, t->iov, t->iovcnt, &t->dst) < 0) {
                rd_mbox_tx_untake(p, (uint32_t)cr);
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
