/* Work queue rings and shared receive queues: see wq.h. */
#include "queue/wq.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

int dw_wq_init(struct dw_wq *wq, uint32_t max_wr, uint32_t max_sge, uint32_t max_inline)
{
        if (!wq || max_wr < 1 || max_sge > DW_MAX_SGE || max_inline > DW_MAX_INLINE)
                return -EINVAL;
        memset(wq, 0, sizeof(*wq));
        wq->ring = calloc(max_wr, sizeof(*wq->ring));
        if (!wq->ring)
                return -ENOMEM;
        if (max_inline > 0) {
                wq->inline_area = calloc(max_wr, max_inline);
                if (!wq->inline_area) {
                        free(wq->ring);
                        wq->ring = NULL;
                        return -ENOMEM;
                }
        }
        wq->capacity = max_wr;
        wq->max_sge = max_sge;
        wq->max_inline = max_inline;
        return 0;
}

void dw_wq_fini(struct dw_wq *wq)
{
        if (!wq)
                return;
        free(wq->ring);
        free(wq->inline_area);
        wq->ring = NULL;
        wq->inline_area = NULL;
        wq->capacity = wq->count = wq->head = wq->tail = wq->started = 0;
}

/* dw_wq_commit, dw_wq_head, dw_wq_pop, dw_wq_at, dw_wq_next: inline in wq.h
 * (called several times per message on the data path). */

struct dw_wqe *dw_wq_reserve(struct dw_wq *wq)
{
        struct dw_wqe *w;

        if (wq->count == wq->capacity)
                return NULL;
        w = &wq->ring[wq->tail];
        /* Everything but the SGE array is zeroed: the fill helpers write
         * sge[0..num_sge) and nothing reads past num_sge, so clearing the 128
         * bytes of eight SGEs for every post would be wasted on the hot path. */
        memset(w, 0, offsetof(struct dw_wqe, sge));
        memset((uint8_t *)w + offsetof(struct dw_wqe, inline_buf), 0,
               sizeof(*w) - offsetof(struct dw_wqe, inline_buf));
        if (wq->inline_area)
                w->inline_buf = wq->inline_area + (size_t)wq->tail * wq->max_inline;
        return w;
}

void dw_wq_advance(struct dw_wq *wq)
{
        struct dw_wqe *w = dw_wq_next(wq);

        if (!w)
                return;
        w->flags |= DW_WQE_STARTED;
        wq->started++;
}

uint32_t dw_wq_drop_done(struct dw_wq *wq, dw_wq_moved_fn moved, void *ctx)
{
        uint32_t n = wq->count, keep = 0, started = wq->started;
        for (uint32_t i = 0; i < n; i++) {
                struct dw_wqe *w = dw_wq_at(wq, i);
                if (w->flags & DW_WQE_DONE) {
                        if (i < wq->started)
                                started--;
                        continue;
                }
                if (keep != i) {
                        struct dw_wqe *to = dw_wq_at(wq, keep);
                        /* The inline area belongs to the slot, not the WQE:
                         * the bytes follow the WQE into its new slot's area. */
                        uint8_t *area = to->inline_buf;
                        if ((w->flags & DW_WQE_INLINE) && w->inline_len)
                                memcpy(area, w->inline_buf, w->inline_len);
                        *to = *w;
                        to->inline_buf = area;
                        if (to->flags & DW_WQE_INLINE)
                                to->sge[0].addr = (uint64_t)(uintptr_t)area;
                        if (moved)
                                moved(ctx, w, to);
                }
                keep++;
        }
        wq->count = keep;
        wq->started = started;
        wq->tail = (wq->head + keep) % wq->capacity;
        return n - keep;
}

static int copy_sges(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_sge *sg, int num_sge)
{
        uint64_t total = 0;
        int i;

        if (num_sge < 0 || (uint32_t)num_sge > wq->max_sge || (num_sge > 0 && !sg))
                return -EINVAL;
        for (i = 0; i < num_sge; i++) {
                wqe->sge[i] = sg[i];
                total += sg[i].length;
        }
        wqe->num_sge = (uint32_t)num_sge;
        wqe->total_len = total;
        return 0;
}

int dw_wqe_set_inline(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_sge *sg,
                      int num_sge)
{
        uint64_t total = 0;
        uint32_t off = 0;
        int i;

        if (num_sge < 0 || num_sge > DW_MAX_SGE || (num_sge > 0 && !sg))
                return -EINVAL;
        for (i = 0; i < num_sge; i++)
                total += sg[i].length;
        if (total > wq->max_inline || (total > 0 && !wqe->inline_buf))
                return -EINVAL;
        /* Copy now: ibverbs lets the caller reuse the buffer (and ignores the
         * lkey) as soon as the post returns. */
        for (i = 0; i < num_sge; i++) {
                if (sg[i].length)
                        memcpy(wqe->inline_buf + off, (const void *)(uintptr_t)sg[i].addr,
                               sg[i].length);
                off += sg[i].length;
        }
        wqe->inline_len = off;
        wqe->num_sge = total > 0 ? 1 : 0;
        wqe->sge[0].addr = (uint64_t)(uintptr_t)wqe->inline_buf;
        wqe->sge[0].length = off;
        wqe->sge[0].lkey = 0;
        wqe->total_len = off;
        wqe->flags |= DW_WQE_INLINE;
        return 0;
}

const struct dw_wr_op dw_wr_ops[DW_WR_NOPS + 1] = {
    [DIWARP_WR_RDMA_WRITE] = {.kind = DW_WR_WRITE, .payload = true, .wc = DIWARP_WC_RDMA_WRITE},
    [DIWARP_WR_RDMA_WRITE_WITH_IMM] = {.kind = DW_WR_WRITE,
                                       .payload = true,
                                       .imm = true,
                                       .consumes_recv = true,
                                       .wc = DIWARP_WC_RDMA_WRITE},
    [DIWARP_WR_SEND] = {.kind = DW_WR_SEND,
                        .payload = true,
                        .consumes_recv = true,
                        .wc = DIWARP_WC_SEND},
    [DIWARP_WR_SEND_WITH_IMM] = {.kind = DW_WR_SEND,
                                 .payload = true,
                                 .imm = true,
                                 .consumes_recv = true,
                                 .wc = DIWARP_WC_SEND},
    [DIWARP_WR_RDMA_READ] = {.kind = DW_WR_READ, .response = true, .wc = DIWARP_WC_RDMA_READ},
    [DIWARP_WR_ATOMIC_CMP_AND_SWP] = {.kind = DW_WR_ATOMIC,
                                      .response = true,
                                      .wc = DIWARP_WC_COMP_SWAP},
    [DIWARP_WR_ATOMIC_FETCH_AND_ADD] = {.kind = DW_WR_ATOMIC,
                                        .response = true,
                                        .wc = DIWARP_WC_FETCH_ADD},
    [DIWARP_WR_LOCAL_INV] = {.kind = DW_WR_LOCAL, .wc = DIWARP_WC_LOCAL_INV},
    [DIWARP_WR_BIND_MW] = {.kind = DW_WR_LOCAL, .wc = DIWARP_WC_BIND_MW},
    [DIWARP_WR_SEND_WITH_INV] = {.kind = DW_WR_SEND,
                                 .payload = true,
                                 .inval = true,
                                 .consumes_recv = true,
                                 .wc = DIWARP_WC_SEND},
    /* Any other value: refused at post time; a flush completes it as a Send. */
    [DW_WR_NOPS] = {.kind = DW_WR_INVALID, .wc = DIWARP_WC_SEND},
};

int dw_wqe_from_send_wr(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_send_wr *wr)
{
        int rc;

        wqe->wr_id = wr->wr_id;
        wqe->opcode = wr->opcode;
        wqe->send_flags = wr->send_flags;
        wqe->imm_data = wr->imm_data;
        wqe->invalidate_rkey = wr->invalidate_rkey;
        /* The union is interpreted by opcode; UD/RD address fields ride with
         * sends (the QP type decides whether they mean anything). */
        switch (dw_wr_op(wr->opcode)->kind) {
        case DW_WR_WRITE:
        case DW_WR_READ:
                wqe->remote_addr = wr->wr.rdma.remote_addr;
                wqe->rkey = wr->wr.rdma.rkey;
                break;
        case DW_WR_ATOMIC:
                wqe->remote_addr = wr->wr.atomic.remote_addr;
                wqe->rkey = wr->wr.atomic.rkey;
                wqe->compare_add = wr->wr.atomic.compare_add;
                wqe->swap = wr->wr.atomic.swap;
                break;
        case DW_WR_SEND:
                wqe->ah = wr->wr.ud.ah;
                wqe->remote_qpn = wr->wr.ud.remote_qpn;
                wqe->remote_qkey = wr->wr.ud.remote_qkey;
                break;
        default:
                break;
        }
        if ((wr->send_flags & DIWARP_SEND_INLINE) && dw_wr_op(wr->opcode)->payload)
                rc = dw_wqe_set_inline(wq, wqe, wr->sg_list, wr->num_sge);
        else
                rc = copy_sges(wq, wqe, wr->sg_list, wr->num_sge);
        return rc;
}

int dw_wqe_from_recv_wr(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_recv_wr *wr)
{
        wqe->wr_id = wr->wr_id;
        return copy_sges(wq, wqe, wr->sg_list, wr->num_sge);
}

/* ---- shared receive queue ---- */

int dw_srq_init(struct dw_srq *srq, uint32_t max_wr, uint32_t max_sge, void *srq_context)
{
        int rc;

        if (!srq)
                return -EINVAL;
        memset(srq, 0, sizeof(*srq));
        rc = dw_wq_init(&srq->wq, max_wr, max_sge, 0);
        if (rc)
                return rc;
        srq->srq_context = srq_context;
        return 0;
}

void dw_srq_fini(struct dw_srq *srq)
{
        if (srq)
                dw_wq_fini(&srq->wq);
}

int dw_srq_arm_limit(struct dw_srq *srq, uint32_t limit)
{
        if (limit > srq->wq.capacity)
                return -EINVAL;
        srq->limit = limit;
        srq->limit_armed = limit > 0;
        return 0;
}

int dw_srq_take(struct dw_srq *srq, struct dw_wqe *out, bool *limit_event)
{
        struct dw_wqe *w = dw_wq_head(&srq->wq);

        if (limit_event)
                *limit_event = false;
        if (!w)
                return -ENOENT;
        *out = *w;
        dw_wq_pop(&srq->wq);
        if (srq->limit_armed && srq->wq.count < srq->limit) {
                srq->limit_armed = false;
                if (limit_event)
                        *limit_event = true;
        }
        return 0;
}
