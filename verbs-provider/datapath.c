/* The data path: the ibv_context ops that verbs.h's inline ibv_post_send,
 * ibv_post_recv, ibv_post_srq_recv, ibv_poll_cq and ibv_req_notify_cq call.
 *
 * No allocation and no logging here: work requests are converted on the
 * stack, one directly (the case of latency loops: post one WR, poll one WC),
 * lists in small batches. Scatter lists and receive WRs have the same layout in
 * ibverbs and diwarp (checked below), so they are passed through unconverted.
 */
#include "provider.h"

#include <assert.h>
#include <string.h>

#define DWV_BATCH 16

static_assert(sizeof(struct ibv_sge) == sizeof(struct diwarp_sge), "sge layout");
static_assert(offsetof(struct ibv_sge, addr) == offsetof(struct diwarp_sge, addr), "sge addr");
static_assert(offsetof(struct ibv_sge, length) == offsetof(struct diwarp_sge, length),
              "sge length");
static_assert(offsetof(struct ibv_sge, lkey) == offsetof(struct diwarp_sge, lkey), "sge lkey");
static_assert(sizeof(struct ibv_recv_wr) == sizeof(struct diwarp_recv_wr), "recv wr layout");
static_assert(offsetof(struct ibv_recv_wr, wr_id) == offsetof(struct diwarp_recv_wr, wr_id),
              "recv wr_id");
static_assert(offsetof(struct ibv_recv_wr, next) == offsetof(struct diwarp_recv_wr, next),
              "recv next");
static_assert(offsetof(struct ibv_recv_wr, sg_list) == offsetof(struct diwarp_recv_wr, sg_list),
              "recv sg_list");
static_assert(offsetof(struct ibv_recv_wr, num_sge) == offsetof(struct diwarp_recv_wr, num_sge),
              "recv num_sge");
/* The numeric identities the conversions rely on. */
static_assert((int)IBV_WR_SEND_WITH_INV == (int)DIWARP_WR_SEND_WITH_INV, "opcodes");
static_assert((int)IBV_WR_ATOMIC_FETCH_AND_ADD == (int)DIWARP_WR_ATOMIC_FETCH_AND_ADD, "opcodes");
static_assert((int)IBV_SEND_INLINE == (int)DIWARP_SEND_INLINE, "send flags");
static_assert((int)IBV_WC_RECV_RDMA_WITH_IMM == (int)DIWARP_WC_RECV_RDMA_WITH_IMM, "wc opcodes");
static_assert((int)IBV_WC_GENERAL_ERR == (int)DIWARP_WC_GENERAL_ERR, "wc status");
static_assert((int)IBV_WC_WITH_INV == (int)DIWARP_WC_WITH_INV, "wc flags");
static_assert((int)IBV_WR_BIND_MW == (int)DIWARP_WR_BIND_MW, "opcodes");
static_assert((int)IBV_WC_BIND_MW == (int)DIWARP_WC_BIND_MW, "wc opcodes");
static_assert((int)IBV_WC_MW_BIND_ERR == (int)DIWARP_WC_MW_BIND_ERR, "wc status");
static_assert((int)IBV_ACCESS_ZERO_BASED == (int)DIWARP_ACCESS_ZERO_BASED, "access flags");

/* A bind WR (IBV_WR_BIND_MW, type 2 windows) names objects of this context. */
static int dwv_conv_bind(struct ibv_qp *qp, const struct ibv_send_wr *s, struct diwarp_send_wr *d)
{
        struct ibv_mw *mw = s->bind_mw.mw;
        struct ibv_mr *mr = s->bind_mw.bind_info.mr;
        if (!mw || mw->context != qp->context || (mr && mr->context != qp->context)) {
                diwarpdv_warn(
                    "verbs: QP %#x: ibv_post_send: bind WR %#llx: memory window and region "
                    "must be objects of this context",
                    qp->qp_num, (unsigned long long)s->wr_id);
                return EINVAL;
        }
        d->num_sge = 0;
        d->wr.bind_mw.mw = ((struct dwv_mw *)mw)->d;
        d->wr.bind_mw.rkey = s->bind_mw.rkey;
        d->wr.bind_mw.bind_info.mr = mr ? ((struct dwv_mr *)mr)->d : NULL;
        d->wr.bind_mw.bind_info.addr = s->bind_mw.bind_info.addr;
        d->wr.bind_mw.bind_info.length = s->bind_mw.bind_info.length;
        d->wr.bind_mw.bind_info.access = (int)s->bind_mw.bind_info.mw_access_flags;
        return 0;
}

/* A posted bind gives the window its new rkey (the window's index, the WR's
 * key byte), as dwv_post_bind_mw does. */
static void dwv_bind_posted(const struct ibv_send_wr *s)
{
        struct ibv_mw *mw = s->bind_mw.mw;
        mw->rkey = (mw->rkey & ~0xffu) | (s->bind_mw.rkey & 0xffu);
}

/* Converts one WR; 0, or EINVAL for something only the provider can judge
 * (an AH of another context). The engine validates everything else. */
static int dwv_conv_send(struct ibv_qp *qp, const struct ibv_send_wr *s, struct diwarp_send_wr *d)
{
        d->wr_id = s->wr_id;
        d->next = NULL;
        d->sg_list = (struct diwarp_sge *)s->sg_list;
        d->num_sge = s->num_sge;
        d->opcode = (enum diwarp_wr_opcode)s->opcode;
        d->send_flags = s->send_flags;
        /* One union in ibverbs, two fields here: the engine reads the one its
         * opcode needs. */
        d->imm_data = s->imm_data;
        d->invalidate_rkey = s->invalidate_rkey;
        if (qp->qp_type == IBV_QPT_UD) {
                /* wr.ud aliases wr.rdma: for any other opcode "ah" is an
                 * address, not an AH, and must not be dereferenced. */
                if (s->opcode != IBV_WR_SEND && s->opcode != IBV_WR_SEND_WITH_IMM)
                        return EINVAL;
                struct ibv_ah *ah = s->wr.ud.ah;
                if (!ah || ah->context != qp->context)
                        return EINVAL;
                d->wr.ud.ah = dwv_ah(ah)->d;
                d->wr.ud.remote_qpn = s->wr.ud.remote_qpn;
                d->wr.ud.remote_qkey = s->wr.ud.remote_qkey;
        } else if (s->opcode == IBV_WR_BIND_MW) {
                return dwv_conv_bind(qp, s, d);
        } else if (s->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
                   s->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
                d->wr.atomic.remote_addr = s->wr.atomic.remote_addr;
                d->wr.atomic.compare_add = s->wr.atomic.compare_add;
                d->wr.atomic.swap = s->wr.atomic.swap;
                d->wr.atomic.rkey = s->wr.atomic.rkey;
        } else {
                d->wr.rdma.remote_addr = s->wr.rdma.remote_addr;
                d->wr.rdma.rkey = s->wr.rdma.rkey;
        }
        return 0;
}

/* A post was refused (error path only, so it may log). A full queue is the
 * program's flow control, not misuse: debug level. */
static void dwv_post_failed(struct ibv_qp *qp, const char *verb, uint64_t wr_id, int err)
{
        static const char *const state[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
        enum ibv_qp_state s = (enum ibv_qp_state)diwarp_qp_state(dwv_qp(qp)->d);
        const char *sn = (unsigned)s < sizeof(state) / sizeof(state[0]) ? state[s] : "?";

        if (err == -ENOMEM)
                diwarpdv_dbg("verbs: QP %#x: %s: WR %#llx: queue full", qp->qp_num, verb,
                             (unsigned long long)wr_id);
        else
                diwarpdv_warn(
                    "verbs: QP %#x (%s): %s: WR %#llx refused: %s (bad opcode, SGE count, "
                    "length or state)",
                    qp->qp_num, sn, verb, (unsigned long long)wr_id, strerror(-err));
}

static int dwv_conv_failed(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr,
                           int err)
{
        if (wr->opcode != IBV_WR_BIND_MW) /* dwv_conv_bind said why */
                diwarpdv_warn(
                    "verbs: QP %#x: ibv_post_send: WR %#llx: opcode %d without a valid AH of this "
                    "context (UD QPs take Sends only)",
                    qp->qp_num, (unsigned long long)wr->wr_id, wr->opcode);
        if (bad_wr)
                *bad_wr = wr;
        return err;
}

/* A list of WRs, converted and posted DWV_BATCH at a time; out of line, so
 * that the one-WR path below stays a small frame. */
static __attribute__((noinline)) int dwv_post_send_list(struct ibv_qp *qp, struct ibv_send_wr *wr,
                                                        struct ibv_send_wr **bad_wr)
{
        struct diwarp_qp *dqp = dwv_qp(qp)->d;
        struct diwarp_send_wr dw[DWV_BATCH];
        struct ibv_send_wr *src[DWV_BATCH];
        while (wr) {
                int n = 0, conv_err = 0;
                for (; wr && n < DWV_BATCH; wr = wr->next) {
                        conv_err = dwv_conv_send(qp, wr, &dw[n]);
                        if (conv_err)
                                break;
                        if (n)
                                dw[n - 1].next = &dw[n];
                        src[n++] = wr;
                }
                if (n) {
                        struct diwarp_send_wr *dbad = NULL;
                        int err = diwarp_post_send(dqp, dw, &dbad);
                        if (err < 0) {
                                struct ibv_send_wr *b = dbad ? src[dbad - dw] : src[0];
                                dwv_post_failed(qp, "ibv_post_send", b->wr_id, err);
                                for (struct ibv_send_wr **p = src; *p != b; p++)
                                        if ((*p)->opcode == IBV_WR_BIND_MW)
                                                dwv_bind_posted(*p);
                                if (bad_wr)
                                        *bad_wr = b;
                                return -err;
                        }
                        for (int i = 0; i < n; i++)
                                if (src[i]->opcode == IBV_WR_BIND_MW)
                                        dwv_bind_posted(src[i]);
                }
                if (conv_err)
                        return dwv_conv_failed(qp, wr, bad_wr, conv_err);
        }
        return 0;
}

int dwv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
        /* A single WR (every latency-bound loop): no batch bookkeeping. */
        if (wr && !wr->next) {
                struct diwarp_send_wr one, *dbad;
                int err = dwv_conv_send(qp, wr, &one);
                if (err)
                        return dwv_conv_failed(qp, wr, bad_wr, err);
                err = diwarp_post_send(dwv_qp(qp)->d, &one, &dbad);
                if (err < 0) {
                        dwv_post_failed(qp, "ibv_post_send", wr->wr_id, err);
                        if (bad_wr)
                                *bad_wr = wr;
                        return -err;
                }
                if (wr->opcode == IBV_WR_BIND_MW)
                        dwv_bind_posted(wr);
                return 0;
        }
        return dwv_post_send_list(qp, wr, bad_wr);
}

int dwv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
        struct diwarp_recv_wr *dbad = NULL;
        int err = diwarp_post_recv(dwv_qp(qp)->d, (struct diwarp_recv_wr *)wr, &dbad);
        if (err < 0) {
                struct ibv_recv_wr *b = dbad ? (struct ibv_recv_wr *)dbad : wr;
                dwv_post_failed(qp, "ibv_post_recv", b->wr_id, err);
                if (bad_wr)
                        *bad_wr = b;
                return -err;
        }
        return 0;
}

int dwv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
        struct diwarp_recv_wr *dbad = NULL;
        int err = diwarp_post_srq_recv(dwv_srq(srq)->d, (struct diwarp_recv_wr *)wr, &dbad);
        if (err < 0) {
                if (err == -ENOMEM)
                        diwarpdv_dbg("verbs: ibv_post_srq_recv: SRQ full");
                else
                        diwarpdv_warn("verbs: ibv_post_srq_recv: WR refused: %s (bad SGE count?)",
                                      strerror(-err));
                if (bad_wr)
                        *bad_wr = dbad ? (struct ibv_recv_wr *)dbad : wr;
                return -err;
        }
        return 0;
}

static inline void dwv_conv_wc(const struct diwarp_wc *s, struct ibv_wc *d)
{
        d->wr_id = s->wr_id;
        d->status = (enum ibv_wc_status)s->status;
        d->opcode = (enum ibv_wc_opcode)s->opcode;
        d->vendor_err = s->vendor_err;
        d->byte_len = s->byte_len;
        if (s->wc_flags & DIWARP_WC_WITH_INV)
                d->invalidated_rkey = s->invalidated_rkey;
        else
                d->imm_data = s->imm_data;
        d->qp_num = s->qp_num;
        d->src_qp = s->src_qp;
        d->wc_flags = s->wc_flags;
        d->pkey_index = s->pkey_index;
        d->slid = s->slid;
        d->sl = s->sl;
        d->dlid_path_bits = s->dlid_path_bits;
}

/* Out of line, so that the one-WC path below stays a leaf-sized frame. */
static __attribute__((noinline)) int dwv_poll_cq_batch(struct diwarp_cq *dcq, int num_entries,
                                                       struct ibv_wc *wc)
{
        if (num_entries < 0 || (num_entries > 0 && !wc))
                return -EINVAL;

        struct diwarp_wc dwc[DWV_BATCH];
        int total = 0;
        while (total < num_entries) {
                int want = num_entries - total;
                if (want > DWV_BATCH)
                        want = DWV_BATCH;
                int got = diwarp_cq_poll(dcq, want, dwc);
                if (got < 0)
                        return total ? total : got;
                for (int i = 0; i < got; i++)
                        dwv_conv_wc(&dwc[i], &wc[total + i]);
                total += got;
                if (got < want)
                        break;
        }
        return total;
}

int dwv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
        struct diwarp_cq *dcq = dwv_cq(cq)->d;

        /* One at a time (latency loops): no batch buffer. */
        if (num_entries == 1 && wc) {
                struct diwarp_wc one;
                int got = diwarp_cq_poll(dcq, 1, &one);
                if (got == 1)
                        dwv_conv_wc(&one, wc);
                return got;
        }
        return dwv_poll_cq_batch(dcq, num_entries, wc);
}

int dwv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
        int err = diwarp_cq_req_notify(dwv_cq(cq)->d, solicited_only != 0);
        return err < 0 ? -err : 0;
}
