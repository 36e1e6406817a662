/* rdmap/: opcode table and error classification (rdmap.h). */
#include "rdmap/rdmap.h"

#include <errno.h>
#include <string.h>

#include "wire/ddp.h"

#define T DW_DDP_TAGGED_HDR_LEN
#define U DW_DDP_UNTAGGED_HDR_LEN

/* RFC 5040 §4.2's opcodes and RFC 7306's, in wire order. */
const struct dw_rdmap_op dw_rdmap_ops[DW_RDMAP_NOPS] = {
#define OP(d, pay, acc, cx, len, kind)                                                             \
        {                                                                                          \
                .dir = DW_RDMAP_DIR_##d, .payload = pay, .access = acc, .ctx = DW_PROT_CTX_##cx,   \
                .hdr_len = len, .rx = DW_RDMAP_RX_##kind                                           \
        }
    [DW_RDMAP_WRITE] = OP(REQUEST, true, DIWARP_ACCESS_REMOTE_WRITE, TAGGED_SINK, T, WRITE),
    [DW_RDMAP_READ_REQ] = OP(REQUEST, false, DIWARP_ACCESS_REMOTE_READ, READ_SOURCE,
                             U + DW_RDMAP_RREQ_HDR_LEN, READ_REQ),
    [DW_RDMAP_READ_RESP] = OP(RESPONSE, true, 0, TAGGED_SINK, T, READ_RESP),
    [DW_RDMAP_SEND] = OP(REQUEST, true, 0, INVALIDATE, U, SEND),
    [DW_RDMAP_SEND_INVAL] = OP(REQUEST, true, 0, INVALIDATE, U, SEND),
    [DW_RDMAP_SEND_SE] = OP(REQUEST, true, 0, INVALIDATE, U, SEND),
    [DW_RDMAP_SEND_SE_INVAL] = OP(REQUEST, true, 0, INVALIDATE, U, SEND),
    [DW_RDMAP_TERMINATE] =
        OP(TERMINATE, false, 0, TAGGED_SINK, U + DW_RDMAP_TERM_CTRL_LEN, TERMINATE),
    [DW_RDMAP_IMM_DATA] = OP(REQUEST, false, 0, TAGGED_SINK, U + DW_RDMAP_IMM_HDR_LEN, IMM),
    [DW_RDMAP_IMM_DATA_SE] = OP(REQUEST, false, 0, TAGGED_SINK, U + DW_RDMAP_IMM_HDR_LEN, IMM),
    [DW_RDMAP_ATOMIC_REQ] = OP(REQUEST, false, DIWARP_ACCESS_REMOTE_ATOMIC, ATOMIC,
                               U + DW_RDMAP_ATOMIC_REQ_HDR_LEN, ATOMIC_REQ),
    [DW_RDMAP_ATOMIC_RESP] =
        OP(RESPONSE, false, 0, ATOMIC, U + DW_RDMAP_ATOMIC_RESP_HDR_LEN, ATOMIC_RESP),
#undef OP
};

#undef T
#undef U

static struct dw_term_error term(uint8_t layer, uint8_t etype, uint8_t ecode)
{
        struct dw_term_error e = {.layer = layer, .etype = etype, .ecode = ecode};
        return e;
}

/* RDMAP-layer Remote Protection Error: the Read Request source check and
 * the atomic target check are RDMAP's own (RFC 5040 §4.8, RFC 7306). */
static int rdmap_prot(enum dw_prot_status st, struct dw_term_error *out)
{
        uint8_t code;

        switch (st) {
        case DW_PROT_INVALID_STAG:
        case DW_PROT_INVALIDATED:
                code = DW_TERM_RDMAP_INVALID_STAG;
                break;
        case DW_PROT_PD_MISMATCH:
                code = DW_TERM_RDMAP_STAG_NOT_ON_STREAM;
                break;
        case DW_PROT_ACCESS:
                code = DW_TERM_RDMAP_ACCESS_RIGHTS;
                break;
        case DW_PROT_BOUNDS:
                code = DW_TERM_RDMAP_BASE_BOUNDS;
                break;
        case DW_PROT_TO_WRAP:
                code = DW_TERM_RDMAP_TO_WRAP;
                break;
        case DW_PROT_NOT_INVALIDATABLE:
                code = DW_TERM_RDMAP_STAG_NOT_INVALIDATED;
                break;
        default:
                return -EINVAL;
        }
        *out = term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION, code);
        return 0;
}

int dw_prot_status_to_term(enum dw_prot_status st, enum dw_prot_ctx ctx, struct dw_term_error *out)
{
        if (!out || st == DW_PROT_OK)
                return -EINVAL;
        switch (ctx) {
        case DW_PROT_CTX_TAGGED_SINK:
                /* Tagged placement is validated by DDP (RFC 5041 §7.2 Tagged
                 * Buffer Error); DDP has no access-rights code, so a missing
                 * REMOTE_WRITE is reported by RDMAP. */
                switch (st) {
                case DW_PROT_INVALID_STAG:
                case DW_PROT_INVALIDATED:
                        *out =
                            term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_INVALID_STAG);
                        return 0;
                case DW_PROT_PD_MISMATCH:
                        *out = term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED,
                                    DW_TERM_DDP_T_STAG_NOT_ON_STREAM);
                        return 0;
                case DW_PROT_BOUNDS:
                        *out =
                            term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_BASE_BOUNDS);
                        return 0;
                case DW_PROT_TO_WRAP:
                        *out = term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_TO_WRAP);
                        return 0;
                default:
                        return rdmap_prot(st, out);
                }
        case DW_PROT_CTX_READ_SOURCE:
        case DW_PROT_CTX_ATOMIC:
                return rdmap_prot(st, out);
        case DW_PROT_CTX_INVALIDATE:
                /* Every failure to invalidate is "STag cannot be
                 * invalidated" (RFC 5040 §4.8, Remote Protection Error). */
                switch (st) {
                case DW_PROT_INVALID_STAG:
                case DW_PROT_INVALIDATED:
                case DW_PROT_PD_MISMATCH:
                case DW_PROT_NOT_INVALIDATABLE:
                        *out = term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION,
                                    DW_TERM_RDMAP_STAG_NOT_INVALIDATED);
                        return 0;
                default:
                        return -EINVAL;
                }
        }
        return -EINVAL;
}

struct dw_term_error dw_rdmap_prot_term(enum dw_prot_status st, enum dw_prot_ctx ctx)
{
        struct dw_term_error e =
            term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION, DW_TERM_RDMAP_UNSPECIFIED);
        dw_prot_status_to_term(st, ctx, &e);
        return e;
}

struct dw_term_error dw_rdmap_recv_term(int err)
{
        if (err == -EMSGSIZE)
                return term(DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED, DW_TERM_DDP_U_MSG_TOO_LONG);
        return term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                    DW_TERM_RDMAP_CATASTROPHIC_STREAM);
}

struct dw_term_error dw_rdmap_malformed_term(uint8_t opcode)
{
        return term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                    opcode == DW_RDMAP_READ_REQ ? DW_TERM_RDMAP_UNSPECIFIED
                                                : DW_TERM_RDMAP_UNEXPECTED_OPCODE);
}

uint8_t dw_rdmap_term_to_nak(struct dw_term_error e)
{
        if ((e.layer == DW_TERM_LAYER_RDMAP && e.etype == DW_TERM_RDMAP_REMOTE_PROTECTION) ||
            (e.layer == DW_TERM_LAYER_DDP && e.etype == DW_TERM_DDP_TAGGED))
                return DW_DGRAM_NAK_REM_ACCESS;
        if (e.layer == DW_TERM_LAYER_DDP && e.etype == DW_TERM_DDP_UNTAGGED)
                return DW_DGRAM_NAK_INVALID;
        if (e.layer == DW_TERM_LAYER_RDMAP && e.etype == DW_TERM_RDMAP_REMOTE_OPERATION &&
            (e.ecode == DW_TERM_RDMAP_UNEXPECTED_OPCODE ||
             e.ecode == DW_TERM_RDMAP_INVALID_VERSION || e.ecode == DW_TERM_RDMAP_UNSPECIFIED))
                return DW_DGRAM_NAK_INVALID;
        return DW_DGRAM_NAK_REM_OP;
}

enum diwarp_wc_status dw_rdmap_nak_to_wc(uint8_t nak_code)
{
        switch (nak_code) {
        case DW_DGRAM_NAK_REM_ACCESS:
                return DIWARP_WC_REM_ACCESS_ERR;
        case DW_DGRAM_NAK_REM_OP:
                return DIWARP_WC_REM_OP_ERR;
        default:
                return DIWARP_WC_REM_INV_REQ_ERR;
        }
}

enum diwarp_wc_status dw_rdmap_term_to_wc(struct dw_term_error t, int *event)
{
        enum diwarp_wc_status st = DIWARP_WC_REM_OP_ERR;
        int ev = DIWARP_EVENT_QP_REQ_ERR;

        if ((t.layer == DW_TERM_LAYER_RDMAP && t.etype == DW_TERM_RDMAP_REMOTE_PROTECTION) ||
            (t.layer == DW_TERM_LAYER_DDP && t.etype == DW_TERM_DDP_TAGGED)) {
                st = DIWARP_WC_REM_ACCESS_ERR;
                ev = DIWARP_EVENT_QP_ACCESS_ERR;
        } else if (t.layer == DW_TERM_LAYER_DDP && t.etype == DW_TERM_DDP_UNTAGGED) {
                if (t.ecode == DW_TERM_DDP_U_NO_BUFFER)
                        st = DIWARP_WC_RNR_RETRY_EXC_ERR;
                else if (t.ecode == DW_TERM_DDP_U_MSG_TOO_LONG)
                        st = DIWARP_WC_REM_INV_REQ_ERR;
        } else if (t.layer == DW_TERM_LAYER_RDMAP &&
                   t.ecode == DW_TERM_RDMAP_STAG_NOT_INVALIDATED) {
                st = DIWARP_WC_REM_INV_REQ_ERR;
        } else if (t.layer == DW_TERM_LAYER_LLP || (t.layer == DW_TERM_LAYER_RDMAP &&
                                                    t.etype == DW_TERM_RDMAP_LOCAL_CATASTROPHIC)) {
                st = DIWARP_WC_REM_ABORT_ERR;
                ev = DIWARP_EVENT_QP_FATAL;
        }
        if (event)
                *event = ev;
        return st;
}

enum diwarp_wc_status dw_rdmap_send_invalidate(struct dw_rdmap_qp qp, uint32_t stag,
                                               struct dw_term_error *te)
{
        enum dw_prot_status st = dw_mr_invalidate_status(qp.mrs, stag, qp.pd, qp.qpn);

        if (st == DW_PROT_OK)
                return DIWARP_WC_SUCCESS;
        if (te)
                *te = dw_rdmap_prot_term(st, DW_PROT_CTX_INVALIDATE);
        return DIWARP_WC_REM_INV_REQ_ERR;
}

int dw_rdmap_refuse(struct dw_rdmap_refusal *ref, enum dw_prot_status st, enum dw_prot_ctx ctx)
{
        if (ref) {
                ref->st = st;
                ref->why = dw_prot_status_str(st);
                ref->te = dw_rdmap_prot_term(st, ctx);
        }
        return -EACCES;
}

int dw_rdmap_send_inval_accept(struct dw_rdmap_qp qp, uint32_t stag, struct dw_rdmap_refusal *ref)
{
        enum dw_prot_status st = dw_mr_invalidate_check(qp.mrs, stag, qp.pd, qp.qpn);

        if (st == DW_PROT_OK)
                return 0;
        return dw_rdmap_refuse(ref, st, DW_PROT_CTX_INVALIDATE);
}

static int malformed(struct dw_rdmap_refusal *ref, uint8_t opcode, const char *why)
{
        ref->st = DW_PROT_OK;
        ref->why = why;
        ref->te = dw_rdmap_malformed_term(opcode);
        return -EBADMSG;
}

int dw_rdmap_read_req_accept(struct dw_rdmap_qp qp, const uint8_t *ext, size_t len,
                             struct dw_rdmap_rreq *rq, struct dw_rdmap_refusal *ref)
{
        const char *why = NULL;

        if (dw_rdmap_rreq_decode(ext, len, rq, &why) < 0)
                return malformed(ref, DW_RDMAP_READ_REQ, why);
        enum dw_prot_status st =
            dw_rdmap_read_source(qp, rq->src_stag, rq->src_to, rq->rdma_rd_sz, NULL);
        return st == DW_PROT_OK ? 0 : dw_rdmap_refuse(ref, st, DW_PROT_CTX_READ_SOURCE);
}

int dw_rdmap_atomic_req_accept(struct dw_rdmap_qp qp, const uint8_t *ext, size_t len,
                               struct dw_rdmap_atomic_req *ar, uint8_t **host,
                               struct dw_rdmap_refusal *ref)
{
        const char *why = NULL;

        if (dw_rdmap_atomic_req_decode(ext, len, ar, &why) < 0)
                return malformed(ref, DW_RDMAP_ATOMIC_REQ, why);
        enum dw_prot_status st = dw_rdmap_atomic_target(qp, ar, host);
        return st == DW_PROT_OK ? 0 : dw_rdmap_refuse(ref, st, DW_PROT_CTX_ATOMIC);
}

int dw_rdmap_resp_accept(struct dw_rdmap_qp qp, const struct dw_rdmap_hdr *h, const uint8_t *ext,
                         size_t len, struct dw_rdmap_resp *out, struct dw_rdmap_refusal *ref)
{
        *out =
            (struct dw_rdmap_resp){.atomic = h->opcode == DW_RDMAP_ATOMIC_REQ, .msn = h->ddp.msn};
        if (!out->atomic)
                return dw_rdmap_read_req_accept(qp, ext, len, &out->rq, ref);
        struct dw_rdmap_atomic_req ar;
        uint8_t *host = NULL;
        int r = dw_rdmap_atomic_req_accept(qp, ext, len, &ar, &host, ref);
        if (r < 0)
                return r;
        out->req_id = ar.req_id;
        out->orig = dw_rdmap_atomic_exec((uint64_t *)host, &ar);
        return 0;
}

int dw_rdmap_resp_check(struct dw_rdmap_qp qp, const struct dw_rdmap_hdr *h, const uint8_t *ext,
                        size_t len, struct dw_rdmap_refusal *ref)
{
        if (h->opcode == DW_RDMAP_ATOMIC_REQ) {
                struct dw_rdmap_atomic_req ar;
                return dw_rdmap_atomic_req_accept(qp, ext, len, &ar, NULL, ref);
        }
        struct dw_rdmap_rreq rq;
        return dw_rdmap_read_req_accept(qp, ext, len, &rq, ref);
}

enum dw_prot_status dw_rdmap_resp_segment(struct dw_rdmap_qp qp, const struct dw_rdmap_resp *r,
                                          uint64_t off, uint32_t max, struct dw_rdmap_resp_seg *seg)
{
        seg->src = NULL;
        seg->len = 0;
        seg->ends = true;
        if (r->atomic) {
                struct dw_rdmap_atomic_resp ar = {.req_id = r->req_id, .orig_data = r->orig};
                dw_rdmap_hdr_init(&seg->h, DW_RDMAP_ATOMIC_RESP);
                seg->h.ddp.msn = r->msn;
                seg->extlen = (size_t)dw_rdmap_atomic_resp_encode(&ar, seg->ext, sizeof(seg->ext));
                return DW_PROT_OK;
        }
        seg->extlen = 0;
        uint64_t left = r->rq.rdma_rd_sz > off ? r->rq.rdma_rd_sz - off : 0;
        seg->len = left < max ? (uint32_t)left : max;
        enum dw_prot_status st =
            dw_rdmap_read_source(qp, r->rq.src_stag, r->rq.src_to + off, seg->len, &seg->src);
        if (st != DW_PROT_OK)
                return st;
        dw_rdmap_read_resp_hdr(&r->rq, off, seg->len, &seg->h);
        seg->ends = seg->h.ddp.last;
        return DW_PROT_OK;
}

/* ---- Where a segment's payload goes ---- */

int dw_rdmap_wr_iov(struct dw_mr_table *mrs, const struct dw_pd *pd, const struct dw_wqe *w,
                    uint64_t off, uint64_t len, int access, struct iovec *iov, int max)
{
        int n = 0;

        if (len == 0)
                return 0;
        if ((w->flags & DW_WQE_INLINE) && access == 0) {
                if (off + len > w->sge[0].length)
                        return -EMSGSIZE;
                iov[0].iov_base = (uint8_t *)(uintptr_t)w->sge[0].addr + off;
                iov[0].iov_len = len;
                return 1;
        }
        for (uint32_t i = 0; i < w->num_sge && len; i++) {
                const struct diwarp_sge *s = &w->sge[i];
                if (off >= s->length) {
                        off -= s->length;
                        continue;
                }
                uint64_t piece = s->length - off;
                if (piece > len)
                        piece = len;
                uint8_t *host = NULL;
                if (dw_mr_check_local(mrs, s->lkey, pd, access, s->addr + off, piece, &host) !=
                    DW_PROT_OK)
                        return -EACCES;
                if (n == max)
                        return -EMSGSIZE;
                iov[n].iov_base = host;
                iov[n].iov_len = piece;
                n++;
                len -= piece;
                off = 0;
        }
        return len ? -EMSGSIZE : n;
}

int dw_rdmap_wr_scatter_sges(struct dw_mr_table *mrs, const struct dw_pd *pd,
                             const struct dw_wqe *w, uint64_t off, const void *src, size_t len)
{
        struct iovec dst[DW_MAX_SGE];
        /* Every piece is checked before any is written. */
        int n = dw_rdmap_wr_iov(mrs, pd, w, off, len, DIWARP_ACCESS_LOCAL_WRITE, dst, DW_MAX_SGE);
        if (n < 0)
                return n;
        const uint8_t *p = src;
        for (int i = 0; i < n; i++) {
                memcpy(dst[i].iov_base, p, dst[i].iov_len);
                p += dst[i].iov_len;
        }
        return 0;
}
