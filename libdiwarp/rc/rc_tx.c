/* RC transmit: FPDUs gathered from registered memory into batches (header,
 * payload iovecs, pad and CRC; rc.h), the SQ's WQEs and the IRQ's Read and
 * Atomic Responses in turn, written with one writev per batch; a batch's
 * WQEs complete once it is out (after the other end consumed it, when that
 * end is in this process: rc_local.h). */
#include "rc/cm.h"
#include "rc/rc.h"
#include "rc/rc_int.h"
#include "rc/rc_local.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "llp/tcp.h"
#include "progress/progress.h"
#include "rdmap/rdmap.h"
#include "util/time.h"
#include "wire/crc32c.h"

#define DW_RC_IOV_MAX 1024 /* Linux UIO_MAXIOV */

/* MULPDU of the stream from its current effective MSS (RFC 5044: an FPDU
 * fills one TCP segment), or from DIWARP_RC_FPDU (fpdu bytes) when that is
 * larger: an FPDU then spans several segments, which cuts the per-FPDU
 * costs (header, CRC call, read) on an Ethernet-sized MSS. */
uint32_t rc_mulpdu(int fd, uint32_t fpdu)
{
        int mss = dw_tcp_mss(fd);
        uint32_t u = mss > 0 ? dw_mpa_mulpdu((uint32_t)mss) : DW_RC_MULPDU_DEFAULT;
        uint32_t f = fpdu ? dw_mpa_mulpdu(fpdu) : 0;
        if (f > u)
                u = f;
        return u < DW_RC_MULPDU_MIN ? DW_RC_MULPDU_MIN : u;
}

/* Grows the transmit arrays to batches of n FPDUs (no batch may be under
 * way). 0, or -ENOMEM with the arrays as they were (still usable). */
int rc_tx_arrays(struct dw_rc_conn *c, int n)
{
        int icap = n * 3 + DW_MAX_SGE + 2; /* header, payload, trailer; one multi-SGE FPDU */
        if (icap < DW_RC_TX_BATCH_MIN * (DW_MAX_SGE + 2))
                icap = DW_RC_TX_BATCH_MIN * (DW_MAX_SGE + 2);
        if (n <= c->slot_cap && icap <= c->iov_cap)
                return 0;
        struct iovec *iov = calloc((size_t)icap, sizeof(*iov));
        struct dw_rc_txslot *slot = calloc((size_t)n, sizeof(*slot));
        struct dw_wqe **done = calloc((size_t)n, sizeof(*done));
        uint64_t *done_end = calloc((size_t)n, sizeof(*done_end));
        if (!iov || !slot || !done || !done_end) {
                free(iov);
                free(slot);
                free(done);
                free(done_end);
                return -ENOMEM;
        }
        free(c->iov);
        free(c->slot);
        free(c->done_wqe);
        free(c->done_end);
        c->iov = iov;
        c->iov_cap = icap;
        c->slot = slot;
        c->done_wqe = done;
        c->done_end = done_end;
        c->slot_cap = n;
        return 0;
}

/* Payload bytes of one FPDU with a DDP header of that kind. */
static uint32_t seg_max(const struct dw_rc_conn *c, bool tagged)
{
        return c->mulpdu - (tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN);
}

static uint32_t crc_iov(uint32_t s, const struct iovec *iov, int n)
{
        for (int i = 0; i < n; i++)
                s = dw_crc32c_update(s, iov[i].iov_base, iov[i].iov_len);
        return s;
}

/* Appends one FPDU to the batch: header (DDP/RDMAP + ext) from a slot, payload
 * iovecs as given (registered memory), trailer. */
static int add_fpdu(struct dw_rc_conn *c, const struct dw_rdmap_hdr *h, const void *ext,
                    size_t extlen, const struct iovec *pay, int npay, size_t paylen)
{
        struct dw_rc_txslot *s = &c->slot[c->nslot];
        ssize_t hl = dw_rdmap_encode(h, s->hdr + DW_MPA_HDR_LEN, DW_RC_HDR_MAX - DW_MPA_HDR_LEN);
        if (hl < 0)
                return (int)hl;
        if (extlen)
                memcpy(s->hdr + DW_MPA_HDR_LEN + hl, ext, extlen);
        size_t ulen = (size_t)hl + extlen + paylen;
        dw_put_be16(s->hdr, (uint16_t)ulen);
        size_t hdrlen = DW_MPA_HDR_LEN + (size_t)hl + extlen;

        uint32_t st = 0;
        if (c->crc) {
                st = dw_crc32c_update(dw_crc32c_init(), s->hdr, hdrlen);
                st = crc_iov(st, pay, npay);
        }
        ssize_t tl = dw_mpa_fpdu_trailer(s->trl, ulen, st, c->crc);
        if (tl < 0)
                return (int)tl;

        c->iov[c->iov_cnt].iov_base = s->hdr;
        c->iov[c->iov_cnt].iov_len = hdrlen;
        c->iov_cnt++;
        for (int i = 0; i < npay; i++)
                c->iov[c->iov_cnt++] = pay[i];
        c->iov[c->iov_cnt].iov_base = s->trl;
        c->iov[c->iov_cnt].iov_len = (size_t)tl;
        c->iov_cnt++;
        c->nslot++;
        c->batch_bytes += hdrlen + paylen + (size_t)tl;
        c->qp->ctr.tx_packets++;
        c->qp->ctr.tx_bytes += hdrlen + paylen + (size_t)tl;
        return 0;
}

static void add_term(struct dw_rc_conn *c)
{
        struct dw_rdmap_hdr h;
        uint8_t ext[DW_RDMAP_TERM_MAX_LEN];

        dw_rdmap_hdr_init(&h, DW_RDMAP_TERMINATE);
        h.ddp.msn = c->msn_term++;
        h.ddp.mo = 0;
        ssize_t n = dw_rdmap_term_encode(&c->term, ext, sizeof(ext));
        if (n < 0) {
                /* Drop the carried headers rather than the Terminate. */
                c->term.has_ddp_hdr = c->term.has_rdmap_hdr = c->term.seglen_valid = false;
                n = dw_rdmap_term_encode(&c->term, ext, sizeof(ext));
        }
        if (n >= 0)
                add_fpdu(c, &h, ext, (size_t)n, NULL, 0, 0);
}

/* w's last FPDU is in the batch: it is finished once the batch is out. */
static void mark_sent(struct dw_rc_conn *c, struct dw_wqe *w)
{
        c->done_end[c->ndone] = c->tx_sent + c->batch_bytes;
        c->done_wqe[c->ndone++] = w;
}

/* Payload iovecs for [off, off+len) of the current WQE's resolved sources. */
static int gather_src(struct dw_rc_conn *c, uint64_t off, uint64_t len, struct iovec *out)
{
        int n = 0;

        for (int i = 0; i < c->nsrc && len; i++) {
                if (off >= c->src[i].iov_len) {
                        off -= c->src[i].iov_len;
                        continue;
                }
                size_t piece = c->src[i].iov_len - off;
                if (piece > len)
                        piece = len;
                out[n].iov_base = (uint8_t *)c->src[i].iov_base + off;
                out[n].iov_len = piece;
                n++;
                len -= piece;
                off = 0;
        }
        return n;
}

/* A local error on a send WQE: it completes with status, the QP goes to ERR
 * and the peer gets a Terminate (local catastrophic: the fault is ours). */
static void wqe_local_error(struct dw_rc_conn *c, struct dw_wqe *w, enum diwarp_wc_status status,
                            const char *why)
{
        char pb[32];

        dw_warn("RC QP %#x peer %s: send WR %#llx: %s", c->qp->qpn, rc_peer_str(c, pb, sizeof(pb)),
                (unsigned long long)w->wr_id, why);
        rc_drop_wqe_refs(c);
        rc_complete_through(c, w, status, 0);
        rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
                          DW_TERM_RDMAP_CATASTROPHIC_STREAM, false, NULL, -1, why);
}

static bool sq_ready(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;

        /* SQD: the WQE under way finishes, no new one starts. */
        if (qp->state == DIWARP_QPS_SQD)
                return c->cur != NULL;
        /* RTR too: an IB-style passive side may send before it moves to RTS
         * (see diwarp_post_send); the stream is bidirectional once up. */
        if (qp->state != DIWARP_QPS_RTS && qp->state != DIWARP_QPS_RTR)
                return false;
        if (c->cur)
                return true;
        struct dw_wqe *w = dw_wq_next(&qp->sq);
        if (!w)
                return false;
        /* Fence: wait for every earlier Read / Atomic to complete. */
        if ((w->send_flags & DIWARP_SEND_FENCE) && c->orq_count)
                return false;
        /* ORD: excess Reads / Atomics wait here, in order. */
        if (dw_wr_op(w->opcode)->response && c->orq_count >= rc_ord_limit(c))
                return false;
        return true;
}

/* A Local Invalidate or Bind Memory Window: done here, no FPDU. 0, or -1 on
 * error (handled). */
static int run_local_wqe(struct dw_rc_conn *c, struct dw_wqe *w)
{
        char why[160];
        enum diwarp_wc_status st = dw_qp_run_local_wqe(c->qp, w, why, sizeof(why));

        if (st != DIWARP_WC_SUCCESS) {
                wqe_local_error(c, w, st, why);
                return -1;
        }
        w->status = DIWARP_WC_SUCCESS;
        w->byte_len = 0;
        w->flags |= DW_WQE_DONE;
        rc_retire(c);
        return 0;
}

/* Starts the next SQ WQE. Returns 1 when it became c->cur, 0 when it finished
 * without an FPDU (Local Invalidate, Bind Memory Window, a local copy), -1
 * on error (handled). */
static int start_wqe(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        struct dw_wqe *w = dw_wq_next(&qp->sq);
        struct iovec tmp[DW_MAX_SGE];
        int n;

        dw_wq_advance(&qp->sq);
        w->bytes_done = 0;
        const struct dw_wr_op *op = dw_wr_op(w->opcode);
        switch (op->kind) {
        case DW_WR_SEND:
        case DW_WR_WRITE:
                n = rc_sge_range_iov(qp, w, 0, w->total_len, 0, c->src, DW_MAX_SGE);
                if (n < 0) {
                        wqe_local_error(c, w, DIWARP_WC_LOC_PROT_ERR,
                                        "source SGE fails its lkey check");
                        return -1;
                }
                c->nsrc = n;
                if (rc_local_copy(c, w, c->src, n))
                        return 0;
                break;
        case DW_WR_READ:
                if (w->total_len > UINT32_MAX) {
                        wqe_local_error(c, w, DIWARP_WC_LOC_LEN_ERR, "RDMA Read longer than 4 GiB");
                        return -1;
                }
                n = rc_sge_range_iov(qp, w, 0, w->total_len, DIWARP_ACCESS_LOCAL_WRITE, tmp,
                                     DW_MAX_SGE);
                if (n < 0) {
                        wqe_local_error(c, w, DIWARP_WC_LOC_PROT_ERR,
                                        "RDMA Read sink SGE fails its lkey check");
                        return -1;
                }
                if (rc_local_copy(c, w, tmp, n))
                        return 0;
                break;
        case DW_WR_ATOMIC:
                n = rc_sge_range_iov(qp, w, 0, 8, DIWARP_ACCESS_LOCAL_WRITE, tmp, DW_MAX_SGE);
                if (n < 0) {
                        wqe_local_error(
                            c, w, n == -EMSGSIZE ? DIWARP_WC_LOC_LEN_ERR : DIWARP_WC_LOC_PROT_ERR,
                            "atomic result SGE is not 8 writable bytes");
                        return -1;
                }
                break;
        case DW_WR_LOCAL:
                return run_local_wqe(c, w);
        default:
                wqe_local_error(c, w, DIWARP_WC_LOC_QP_OP_ERR, "opcode not supported on RC");
                return -1;
        }
        c->cur = w;
        c->cur_off = 0;
        /* A Send with Immediate Data sends its Immediate Data message first. */
        c->cur_phase = op->kind == DW_WR_SEND && op->imm;
        return 1;
}

static void build_imm(struct dw_rc_conn *c, struct dw_wqe *w, bool with_send)
{
        struct dw_rdmap_hdr h;
        uint8_t imm[DW_RDMAP_IMM_HDR_LEN] = {0};
        bool se = w->send_flags & DIWARP_SEND_SOLICITED;

        /* With a Send the Send carries the SE bit; a lone immediate carries it. */
        dw_rdmap_hdr_init(&h, dw_rdmap_imm_opcode(!with_send && se));
        h.ddp.msn = c->msn_send++;
        memcpy(imm, &w->imm_data, 4);
        imm[4] = with_send ? DW_IMM_WITH_SEND : 0;
        add_fpdu(c, &h, imm, sizeof(imm), NULL, 0, 0);
}

/* The next FPDU of a Send (any of the family; w is c->cur): an untagged
 * segment of the Send queue. 1: FPDU added. */
static int tx_send_fpdu(struct dw_rc_conn *c, struct dw_wqe *w)
{
        struct dw_rdmap_hdr h;
        struct iovec pay[DW_MAX_SGE];
        bool se = w->send_flags & DIWARP_SEND_SOLICITED;
        uint64_t seg = w->total_len - c->cur_off;

        if (seg > seg_max(c, false))
                seg = seg_max(c, false);
        if (c->cur_off == 0)
                w->msn = c->msn_send;
        dw_rdmap_data_hdr(w, c->cur_off, seg, w->msn, se, &h);
        bool last = h.ddp.last;
        int np = gather_src(c, c->cur_off, seg, pay);
        add_fpdu(c, &h, NULL, 0, pay, np, seg);
        c->cur_off += seg;
        if (last) {
                c->msn_send++;
                mark_sent(c, w);
                c->cur = NULL;
        }
        return 1;
}

/* The next FPDU of an RDMA Write (w is c->cur): a tagged segment, or, after
 * the last one of a Write with Immediate, its Immediate Data. 1: FPDU added. */
static int tx_write_fpdu(struct dw_rc_conn *c, struct dw_wqe *w)
{
        struct dw_rdmap_hdr h;
        struct iovec pay[DW_MAX_SGE];

        if (c->cur_phase == 1) {
                build_imm(c, w, false);
                mark_sent(c, w);
                c->cur = NULL;
                return 1;
        }
        uint64_t seg = w->total_len - c->cur_off;
        if (seg > seg_max(c, true))
                seg = seg_max(c, true);
        dw_rdmap_data_hdr(w, c->cur_off, seg, 0, false, &h);
        bool last = h.ddp.last;
        int np = gather_src(c, c->cur_off, seg, pay);
        add_fpdu(c, &h, NULL, 0, pay, np, seg);
        c->cur_off += seg;
        if (last) {
                if (dw_wr_op(w->opcode)->imm) {
                        c->cur_phase = 1;
                } else {
                        mark_sent(c, w);
                        c->cur = NULL;
                }
        }
        return 1;
}

/* The ORQ entry of a Read or Atomic Request about to go out. */
static struct dw_rc_orq *orq_push(struct dw_rc_conn *c)
{
        struct dw_rc_orq *o = &c->orq[(c->orq_head + c->orq_count) % DW_RC_MAX_RD];

        c->orq_count++;
        return o;
}

/* An RDMA Read Request for w (c->cur), outstanding in the ORQ until its
 * Response. 1: FPDU added. */
static int tx_read_req(struct dw_rc_conn *c, struct dw_wqe *w)
{
        struct dw_rdmap_hdr h;
        struct dw_rdmap_rreq rq;
        uint8_t ext[DW_RDMAP_RREQ_HDR_LEN];

        dw_rdmap_read_req_build(w, w->num_sge ? w->sge[0].lkey : 0, w->num_sge ? w->sge[0].addr : 0,
                                &rq);

        dw_rdmap_rreq_encode(&rq, ext, sizeof(ext));
        dw_rdmap_hdr_init(&h, DW_RDMAP_READ_REQ);
        h.ddp.msn = c->msn_rreq++;
        *orq_push(c) = (struct dw_rc_orq){.wqe = w,
                                          .atomic = false,
                                          .msn = h.ddp.msn,
                                          .sink_stag = rq.sink_stag,
                                          .sink_to = rq.sink_to,
                                          .len = w->total_len};
        add_fpdu(c, &h, ext, sizeof(ext), NULL, 0, 0);
        c->cur = NULL;
        return 1;
}

/* An Atomic Request for w (c->cur), outstanding in the ORQ until its
 * Response (sink_to holds its request identifier). 1: FPDU added. */
static int tx_atomic_req(struct dw_rc_conn *c, struct dw_wqe *w)
{
        struct dw_rdmap_hdr h;
        struct dw_rdmap_atomic_req ar;
        uint8_t ext[DW_RDMAP_ATOMIC_REQ_HDR_LEN];

        dw_rdmap_atomic_req_build(w, ++c->atomic_req_id, &ar);
        dw_rdmap_atomic_req_encode(&ar, ext, sizeof(ext));
        dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_REQ);
        h.ddp.msn = c->msn_rreq++;
        *orq_push(c) = (struct dw_rc_orq){
            .wqe = w, .atomic = true, .msn = h.ddp.msn, .len = 8, .sink_to = ar.req_id};
        add_fpdu(c, &h, ext, sizeof(ext), NULL, 0, 0);
        c->cur = NULL;
        return 1;
}

/* Emits the next FPDU of the current SQ WQE. 1: FPDU added, 0: nothing to do,
 * -1: error (handled). */
static int tx_sq_fpdu(struct dw_rc_conn *c)
{
        while (!c->cur) {
                int r = start_wqe(c);
                if (r < 0)
                        return -1;
                if (r == 0) {
                        if (!sq_ready(c))
                                return 0;
                        continue;
                }
        }
        struct dw_wqe *w = c->cur;

        switch (dw_wr_op(w->opcode)->kind) {
        case DW_WR_SEND:
                if (c->cur_phase == 1) { /* start_wqe: Immediate Data first */
                        build_imm(c, w, true);
                        c->cur_phase = 0;
                        return 1;
                }
                return tx_send_fpdu(c, w);
        case DW_WR_WRITE:
                return tx_write_fpdu(c, w);
        case DW_WR_READ:
                return tx_read_req(c, w);
        case DW_WR_ATOMIC:
                return tx_atomic_req(c, w);
        default:
                return 0;
        }
}

/* Next FPDU of the head IRQ entry: a Read Response segment (its source
 * checked again: rdmap/) or the Atomic Response, whose value the Atomic
 * gave as it was accepted. Atomic Responses are numbered on their own
 * queue (3) in the order sent. */
static int tx_irq_fpdu(struct dw_rc_conn *c)
{
        struct dw_rc_irq *e = &c->irq[c->irq_head];
        struct dw_rdmap_resp_seg sg;

        enum dw_prot_status st =
            dw_rdmap_resp_segment(dw_rdmap_qp_of(c->qp), &e->resp, e->done, seg_max(c, true), &sg);
        if (st != DW_PROT_OK) {
                memcpy(c->rh_raw, e->term_hdr, DW_DDP_UNTAGGED_HDR_LEN);
                c->rx_ulen = DW_DDP_UNTAGGED_HDR_LEN + DW_RDMAP_RREQ_HDR_LEN;
                rc_fail_prot(c, st, DW_PROT_CTX_READ_SOURCE, e->term_hdr + DW_DDP_UNTAGGED_HDR_LEN,
                             "RDMA Read source");
                return -1;
        }
        if (e->resp.atomic)
                sg.h.ddp.msn = c->msn_aresp++;
        struct iovec pay = {sg.src, sg.len};
        add_fpdu(c, &sg.h, sg.extlen ? sg.ext : NULL, sg.extlen, &pay, sg.len ? 1 : 0, sg.len);
        e->done += sg.len;
        if (sg.ends) {
                c->irq_head = (c->irq_head + 1) % DW_RC_MAX_RD;
                c->irq_count--;
        }
        return 1;
}

void rc_build_batch(struct dw_rc_conn *c)
{
        c->nslot = 0;
        c->ndone = 0;
        c->iov_pos = c->iov_cnt = 0;
        c->batch_bytes = 0;

        if (c->term_pending && !c->term_queued) {
                add_term(c);
                c->term_queued = true;
                return;
        }
        if (c->state != DW_RC_UP)
                return;
        while (c->nslot < c->slot_cap && c->iov_cnt + DW_MAX_SGE + 2 <= c->iov_cap &&
               c->batch_bytes < DW_RC_TX_BATCH_BYTES) {
                bool irq = c->irq_count > 0;
                bool sq = sq_ready(c);
                if (!irq && !sq)
                        break;
                bool use_irq = irq && (!sq || c->irq_turn);
                /* A WQE that may be one copy starts a batch of its own: in
                 * a batch behind FPDUs of the WQE before it, it would have
                 * to go on the stream, and so would every WQE of a queue
                 * kept full behind it (rc_copy.c). */
                if (!use_irq && !c->cur && c->nslot &&
                    rc_local_copy_candidate(c, dw_wq_next(&c->qp->sq)))
                        break;
                c->irq_turn = !use_irq;
                int r = use_irq ? tx_irq_fpdu(c) : tx_sq_fpdu(c);
                if (r <= 0 || c->term_pending)
                        break;
        }
        if (c->term_pending && !c->term_queued && c->nslot < c->slot_cap) {
                add_term(c);
                c->term_queued = true;
        }
        /* Bulk batches: every DW_RC_MSS_RECHECK FPDUs the MSS is read again
         * (it grows with the peer's window on loopback, and a path MTU
         * change moves it); a small-message exchange never pays. */
        if (c->batch_bytes >= DW_RC_MSS_BULK &&
            (c->mss_age += (uint32_t)c->nslot) >= DW_RC_MSS_RECHECK) {
                c->mss_age = 0;
                c->mulpdu = rc_mulpdu(c->fd, c->qp->dev->cfg.rc_fpdu);
        }
}

/* The other end of the stream is in this process (rc_local.h): waits until
 * it has consumed the stream through upto, driving it when its progress is
 * idle, for at most DW_RC_LOCAL_WAIT_NS (only a responder that makes no
 * progress, e.g. its thread descheduled on a loaded machine, takes that
 * long), and not while it holds a Send for want of a receive WQE for ever
 * (rnr_retry 7). Returns the offset where it terminated the stream, or
 * DW_RC_END_NONE. */
#define DW_RC_LOCAL_WAIT_NS (1000u * 1000 * 1000)
static uint64_t local_peer_wait(struct dw_rc_conn *c, uint64_t upto)
{
        uint64_t consumed, term_at = DW_RC_END_NONE, deadline = 0;
        bool waiting;

        dw_rc_end_set_waiting(c->end_slot, true);
        while (dw_rc_end_peer_state(c->end_slot, &consumed, &term_at, &waiting) && !waiting &&
               consumed < upto && term_at == DW_RC_END_NONE) {
                bool locked;
                struct dw_rc_conn *peer = dw_rc_end_lock_peer(c->end_slot, c->qp->dev, &locked);
                bool held = false, detached = false;
                if (peer) {
                        /* An IB-style initiator that has not read our Reply
                         * yet (its progress did not run since): reading it
                         * attaches its stream. */
                        if (peer->fd < 0)
                                dw_cm_att_step(peer->qp);
                        /* An end with no stream (its Reply not all in, or
                         * its attach failed) consumes nothing: the plain
                         * iWARP order holds rather than a wait to the bound. */
                        detached = peer->fd < 0;
                        /* As the progress step does: what arrived may give
                         * the peer something to send (Read Responses). */
                        if (rc_rx(peer) && peer->fd >= 0 && rc_tx_has_work(peer))
                                rc_tx(peer);
                        /* A Send it holds for want of a receive WQE, with no
                         * bound (rnr_retry 7), waits for the program, which
                         * may be this very caller. A bounded hold ends in a
                         * Terminate this WR must report. */
                        held = peer->rx_wait_recv && !peer->rnr_deadline_ns;
                        dw_rc_end_unlock_peer(peer, locked);
                }
                if (held || detached)
                        break;
                uint64_t now = dw_now_ns();
                if (!deadline) {
                        deadline = now + DW_RC_LOCAL_WAIT_NS;
                } else if (now > deadline) {
                        /* Seen once in CI on a loaded host: say so, so the
                         * late placement a program may see has a reason. */
                        dw_warn_limited(&c->qp->dev->log_limit,
                                        "RC QP %#x: the other end (in this process) consumed "
                                        "%llu of %llu stream bytes in %u ms; the WR completes "
                                        "before its data is placed",
                                        c->qp->qpn, (unsigned long long)consumed,
                                        (unsigned long long)upto, DW_RC_LOCAL_WAIT_NS / 1000000u);
                        break;
                }
                if (!peer)
                        sched_yield();
        }
        dw_rc_end_set_waiting(c->end_slot, false);
        return term_at;
}

static void batch_done(struct dw_rc_conn *c)
{
        uint64_t term_at = DW_RC_END_NONE;
        bool sync = false;

        for (int i = 0; i < c->ndone && c->end_slot >= 0; i++)
                if (c->qp->sq_sig_all || (c->done_wqe[i]->send_flags & DIWARP_SEND_SIGNALED))
                        sync = true;
        if (sync && dw_rc_end_linked(c->end_slot))
                term_at = local_peer_wait(c, c->done_end[c->ndone - 1]);
        for (int i = 0; i < c->ndone; i++) {
                struct dw_wqe *w = c->done_wqe[i];
                /* The other end terminated the stream before this WR's end:
                 * it completes with the error its Terminate carries. */
                if (c->done_end[i] > term_at)
                        break;
                w->status = DIWARP_WC_SUCCESS;
                w->byte_len = (uint32_t)w->total_len;
                w->flags |= DW_WQE_DONE;
        }
        c->ndone = 0;
        c->nslot = 0;
        c->iov_pos = c->iov_cnt = 0;
        if (c->qp->state != DIWARP_QPS_ERR)
                rc_retire(c);
        if ((c->term_queued || c->fin_after_batch) && c->fd >= 0) {
                /* Everything up to the Terminate (or the graceful end) is out:
                 * FIN, then wait for the peer's EOF before closing, so the
                 * Terminate is read rather than lost to a reset. */
                shutdown(c->fd, SHUT_WR);
                c->fin_after_batch = false;
                c->term_pending = false;
                if (c->state == DW_RC_UP)
                        dw_rc_set_state(c, DW_RC_CLOSING, "FIN sent");
        }
}

static int rc_tx_locked(struct dw_rc_conn *c, size_t *writtenp);

/* Reads of the stream a failed write makes before the stream fails (each
 * rc_rx reads up to DW_RC_RX_STEP_BYTES). */
#define DW_RC_TX_FAIL_DRAIN_STEPS 64

/* A write failed because the peer's end is gone: its reset, after its FIN
 * (EPIPE) or not. What the peer sent before that may still sit unread in
 * our socket, its last messages among it (an RNIC would have placed them as
 * they came): they are read and delivered first, so that their receive
 * completions come before the flushes the failure brings (test_rc
 * send_that_meets_a_reset_first_delivers_what_arrived). Then the stream
 * fails, unless reading met its end first and failed it already. */
static void rc_tx_failed(struct dw_rc_conn *c, int err)
{
        if (err == -EPIPE || err == -ECONNRESET)
                for (int i = 0; i < DW_RC_TX_FAIL_DRAIN_STEPS && c->fd >= 0 && rc_rx(c) > 0; i++)
                        ;
        if (c->fd >= 0)
                rc_stream_failed(c, err);
}

int rc_tx(struct dw_rc_conn *c)
{
        size_t written = 0;
        int work = 0;

        if (c->fd < 0 || (c->state != DW_RC_UP && c->state != DW_RC_CLOSING) || c->in_tx)
                return 0;
        c->in_tx = true;
        work = rc_tx_locked(c, &written);
        c->in_tx = false;
        return work;
}

static int rc_tx_locked(struct dw_rc_conn *c, size_t *writtenp)
{
        size_t written = *writtenp;
        int work = 0;

        for (;;) {
                if (c->iov_pos == c->iov_cnt) {
                        if (c->iov_cnt) {
                                batch_done(c);
                                /* The common end of a small send: nothing more
                                 * queued, no batch to build. */
                                if (c->fd >= 0 && !c->term_pending && !c->irq_count && !c->cur &&
                                    !dw_wq_next(&c->qp->sq))
                                        break;
                        }
                        if (c->fd < 0)
                                return work;
                        rc_build_batch(c);
                        if (c->iov_cnt == 0)
                                break;
                }
                int cnt = c->iov_cnt - c->iov_pos;
                if (cnt > DW_RC_IOV_MAX)
                        cnt = DW_RC_IOV_MAX;
                ssize_t n = dw_tcp_writev(c->fd, c->iov + c->iov_pos, cnt);
                if (n > 0)
                        c->tx_sent += (size_t)n;
                if (n == -EAGAIN) {
                        rc_set_watch(c, true);
                        return work;
                }
                if (n < 0) {
                        rc_tx_failed(c, (int)n);
                        return work;
                }
                struct iovec *p = c->iov + c->iov_pos;
                int left = c->iov_cnt - c->iov_pos;
                dw_iov_advance(&p, &left, (size_t)n);
                c->iov_pos = (int)(p - c->iov);
                /* Zero-length entries at the end of a batch count as written. */
                while (c->iov_pos < c->iov_cnt && c->iov[c->iov_pos].iov_len == 0)
                        c->iov_pos++;
                written += (size_t)n;
                work++;
                c->qp->dev->ctr.tx_bytes += (size_t)n;
                if (written >= DW_RC_TX_STEP_BYTES) {
                        /* Yield for fairness; EPOLLOUT brings us back. */
                        rc_set_watch(c, true);
                        return work;
                }
        }
        rc_set_watch(c, false);
        return work;
}
