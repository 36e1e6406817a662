/* The extended QP and CQ: the verbs_context ops create_qp_ex and
 * create_cq_ex that verbs.h's inline ibv_create_qp_ex / ibv_create_cq_ex call,
 * the wr_* work request builders of struct ibv_qp_ex (ibv_wr_post(3)) and the
 * start_poll / next_poll / end_poll / read_* iterator of struct ibv_cq_ex
 * (ibv_create_cq_ex(3)).
 *
 * wr_*: the WRs built between wr_start and wr_complete go into arrays
 * allocated per QP at creation (max_send_wr WRs, each with max_send_sge SGEs
 * and max_inline_data bytes of inline data), so building and posting never
 * allocate. wr_complete posts them as one batch with diwarp_post_send_all:
 * all or none. The builders return nothing (by the API's design): the first
 * fault found while building (an opcode not requested at creation, too many
 * WRs or SGEs, inline data too long, an AH of another context) is kept and
 * returned by wr_complete, which then posts nothing, as the man page says
 * ("the entire posting will be aborted").
 *
 * cq_ex: start_poll and next_poll take one completion from the engine into
 * the wrapper; the read_* functions return its fields, timestamps included
 * (the engine stamps completions of a CQ that asks).
 */
#include "provider.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- extended QP -------------------------------------------------------- */

struct dwv_qp_ext {
        pthread_spinlock_t lock; /* the wr_start .. wr_complete/abort critical section */
        bool open;               /* a batch is open (lock held) ... */
        pthread_t owner;         /* ... by this thread */
        uint64_t ops;            /* the send_ops_flags the QP was created with */
        uint32_t max_wr, max_sge, max_inline;
        uint32_t n;                 /* WRs built since wr_start */
        struct diwarp_send_wr *cur; /* the last one, which setters complete */
        int err;                    /* first fault of this batch (positive errno) */
        const char *why;            /* ... and what it was, for the warn line */
        uint64_t err_wr_id;         /* ... and the wr_id of the WR it was found in */
        struct diwarp_send_wr *wr;  /* max_wr */
        struct diwarp_sge *sge;     /* max_wr * max_sge */
        uint8_t *inl;               /* max_wr * max_inline */
        struct ibv_mw **mw;         /* max_wr: the window of each bind WR */
};

static inline struct dwv_qp *dwv_qpx(struct ibv_qp_ex *qpx)
{
        return (struct dwv_qp *)qpx;
}

/* Records the first fault of the batch; later WRs and setters are ignored. */
static void dwv_wr_fault(struct ibv_qp_ex *qpx, int err, const char *why)
{
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (!x->err) {
                x->err = err;
                x->why = why;
                x->err_wr_id = qpx->wr_id;
        }
        x->cur = NULL;
}

/* Starts a WR of this opcode (op_flag: its IBV_QP_EX_WITH_* bit); NULL after
 * a fault. */
static struct diwarp_send_wr *dwv_wr_new(struct ibv_qp_ex *qpx, enum diwarp_wr_opcode opcode,
                                         uint64_t op_flag)
{
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (x->err)
                return NULL;
        if (!(x->ops & op_flag)) {
                dwv_wr_fault(qpx, EINVAL, "opcode not in the QP's send_ops_flags");
                return NULL;
        }
        if (x->n >= x->max_wr) {
                dwv_wr_fault(qpx, ENOMEM, "more WRs than max_send_wr in one batch");
                return NULL;
        }
        struct diwarp_send_wr *w = &x->wr[x->n];
        memset(w, 0, sizeof(*w));
        w->wr_id = qpx->wr_id;
        w->send_flags = qpx->wr_flags;
        w->opcode = opcode;
        w->sg_list = &x->sge[(size_t)x->n * x->max_sge];
        if (x->n)
                x->wr[x->n - 1].next = w;
        x->n++;
        x->cur = w;
        return w;
}

/* The WR a setter completes; NULL (a fault recorded) if there is none. */
static struct diwarp_send_wr *dwv_wr_cur(struct ibv_qp_ex *qpx)
{
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (!x->cur && !x->err)
                dwv_wr_fault(qpx, EINVAL, "a setter without a WR builder before it");
        return x->cur;
}

static void dwv_wr_send(struct ibv_qp_ex *qpx)
{
        dwv_wr_new(qpx, DIWARP_WR_SEND, IBV_QP_EX_WITH_SEND);
}

static void dwv_wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
        struct diwarp_send_wr *w =
            dwv_wr_new(qpx, DIWARP_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM);
        if (w)
                w->imm_data = (uint32_t)imm;
}

static void dwv_wr_send_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
        struct diwarp_send_wr *w =
            dwv_wr_new(qpx, DIWARP_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV);
        if (w)
                w->invalidate_rkey = rkey;
}

static void dwv_wr_rdma(struct ibv_qp_ex *qpx, enum diwarp_wr_opcode op, uint64_t flag,
                        uint32_t rkey, uint64_t addr, __be32 imm)
{
        struct diwarp_send_wr *w = dwv_wr_new(qpx, op, flag);
        if (w) {
                w->wr.rdma.rkey = rkey;
                w->wr.rdma.remote_addr = addr;
                w->imm_data = (uint32_t)imm;
        }
}

static void dwv_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr)
{
        dwv_wr_rdma(qpx, DIWARP_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE, rkey, addr, 0);
}

static void dwv_wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, __be32 imm)
{
        dwv_wr_rdma(qpx, DIWARP_WR_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, rkey,
                    addr, imm);
}

static void dwv_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr)
{
        dwv_wr_rdma(qpx, DIWARP_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ, rkey, addr, 0);
}

static void dwv_wr_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
                                  uint64_t compare, uint64_t swap)
{
        struct diwarp_send_wr *w =
            dwv_wr_new(qpx, DIWARP_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
        if (w) {
                w->wr.atomic.rkey = rkey;
                w->wr.atomic.remote_addr = addr;
                w->wr.atomic.compare_add = compare;
                w->wr.atomic.swap = swap;
        }
}

static void dwv_wr_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
                                    uint64_t add)
{
        struct diwarp_send_wr *w =
            dwv_wr_new(qpx, DIWARP_WR_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);
        if (w) {
                w->wr.atomic.rkey = rkey;
                w->wr.atomic.remote_addr = addr;
                w->wr.atomic.compare_add = add;
        }
}

static void dwv_wr_local_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
        struct diwarp_send_wr *w = dwv_wr_new(qpx, DIWARP_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV);
        if (w)
                w->invalidate_rkey = rkey;
}

/* Binds a type 2 window in the batch's order (type 1 windows are bound by
 * ibv_bind_mw); the window takes rkey's key byte once the batch is posted. */
static void dwv_wr_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw, uint32_t rkey,
                           const struct ibv_mw_bind_info *info)
{
        struct ibv_qp *qp = &qpx->qp_base;
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (!x->err && (!mw || !info || mw->context != qp->context ||
                        (info->mr && info->mr->context != qp->context))) {
                dwv_wr_fault(qpx, EINVAL,
                             "bind: window and region must be objects of this context");
                return;
        }
        if (!x->err && mw->type != IBV_MW_TYPE_2) {
                dwv_wr_fault(qpx, EINVAL, "bind: a type 1 window is bound by ibv_bind_mw");
                return;
        }
        struct diwarp_send_wr *w = dwv_wr_new(qpx, DIWARP_WR_BIND_MW, IBV_QP_EX_WITH_BIND_MW);
        if (!w)
                return;
        x->mw[x->n - 1] = mw;
        w->num_sge = 0;
        w->wr.bind_mw.mw = ((struct dwv_mw *)mw)->d;
        w->wr.bind_mw.rkey = rkey;
        w->wr.bind_mw.bind_info.mr = info->mr ? ((struct dwv_mr *)info->mr)->d : NULL;
        w->wr.bind_mw.bind_info.addr = info->addr;
        w->wr.bind_mw.bind_info.length = info->length;
        w->wr.bind_mw.bind_info.access = (int)info->mw_access_flags;
        x->cur = NULL; /* a bind takes no SGE or inline data */
}

/* Operations diwarp does not offer: creation refuses their send_ops_flags, so
 * these are reached only by a program calling a builder it did not ask for. */

static void dwv_wr_send_tso(struct ibv_qp_ex *qpx, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
        (void)hdr, (void)hdr_sz, (void)mss;
        dwv_wr_fault(qpx, EOPNOTSUPP, "TSO is not offered (no raw packet QPs)");
}

static void dwv_wr_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
                                const void *data)
{
        (void)rkey, (void)addr, (void)data;
        dwv_wr_fault(qpx, EOPNOTSUPP, "atomic write is not offered");
}

static void dwv_wr_set_xrc_srqn(struct ibv_qp_ex *qpx, uint32_t srqn)
{
        (void)srqn;
        dwv_wr_fault(qpx, EOPNOTSUPP, "XRC is not offered");
}

static void dwv_wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah, uint32_t remote_qpn,
                               uint32_t remote_qkey)
{
        struct diwarp_send_wr *w = dwv_wr_cur(qpx);
        if (!w)
                return;
        if (qpx->qp_base.qp_type != IBV_QPT_UD) {
                dwv_wr_fault(qpx, EINVAL, "wr_set_ud_addr on a QP that is not UD");
                return;
        }
        if (!ah || ah->context != qpx->qp_base.context) {
                dwv_wr_fault(qpx, EINVAL, "no AH, or an AH of another context");
                return;
        }
        w->wr.ud.ah = dwv_ah(ah)->d;
        w->wr.ud.remote_qpn = remote_qpn;
        w->wr.ud.remote_qkey = remote_qkey;
}

static void dwv_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge, const struct ibv_sge *sg)
{
        struct diwarp_send_wr *w = dwv_wr_cur(qpx);
        if (!w)
                return;
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (num_sge > x->max_sge || (num_sge && !sg)) {
                dwv_wr_fault(qpx, EINVAL, "more SGEs than max_send_sge");
                return;
        }
        memcpy(w->sg_list, sg, num_sge * sizeof(*sg)); /* same layout (datapath.c) */
        w->num_sge = (int)num_sge;
}

static void dwv_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
        struct ibv_sge sge = {.addr = addr, .length = length, .lkey = lkey};
        dwv_wr_set_sge_list(qpx, 1, &sge);
}

/* Inline data is copied now, into this WR's slot; the engine copies it once
 * more at wr_complete (as for IBV_SEND_INLINE). */
static void dwv_wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t num_buf,
                                        const struct ibv_data_buf *buf)
{
        struct diwarp_send_wr *w = dwv_wr_cur(qpx);
        if (!w)
                return;
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (w->opcode != DIWARP_WR_SEND && w->opcode != DIWARP_WR_SEND_WITH_IMM &&
            w->opcode != DIWARP_WR_SEND_WITH_INV && w->opcode != DIWARP_WR_RDMA_WRITE &&
            w->opcode != DIWARP_WR_RDMA_WRITE_WITH_IMM) {
                dwv_wr_fault(qpx, EINVAL, "inline data on a WR that is not a Send or a Write");
                return;
        }
        if (num_buf && !buf) {
                dwv_wr_fault(qpx, EINVAL, "no inline buffer list");
                return;
        }
        size_t total = 0;
        for (size_t i = 0; i < num_buf; i++) {
                total += buf[i].length;
                if (total > x->max_inline) {
                        dwv_wr_fault(qpx, EINVAL, "inline data longer than max_inline_data");
                        return;
                }
        }
        uint8_t *dst = x->inl ? x->inl + (size_t)(w - x->wr) * x->max_inline : NULL;
        size_t off = 0;
        for (size_t i = 0; i < num_buf; i++) {
                if (buf[i].length)
                        memcpy(dst + off, buf[i].addr, buf[i].length);
                off += buf[i].length;
        }
        w->num_sge = total ? 1 : 0;
        w->sg_list[0] = (struct diwarp_sge){.addr = (uintptr_t)dst, .length = (uint32_t)total};
        w->send_flags |= IBV_SEND_INLINE;
}

static void dwv_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
        struct ibv_data_buf b = {.addr = addr, .length = length};
        dwv_wr_set_inline_data_list(qpx, 1, &b);
}

/* True when the calling thread holds this section (open, owner). Other
 * threads only read `open` false or see another owner: the fields are
 * written by the holder, atomically. */
static bool dwv_section_mine(const bool *open, const pthread_t *owner)
{
        return __atomic_load_n(open, __ATOMIC_ACQUIRE) &&
               pthread_equal(__atomic_load_n(owner, __ATOMIC_RELAXED), pthread_self());
}

static void dwv_section_enter(pthread_spinlock_t *lock, bool *open, pthread_t *owner)
{
        pthread_spin_lock(lock);
        __atomic_store_n(owner, pthread_self(), __ATOMIC_RELAXED);
        __atomic_store_n(open, true, __ATOMIC_RELEASE);
}

static void dwv_section_leave(pthread_spinlock_t *lock, bool *open)
{
        __atomic_store_n(open, false, __ATOMIC_RELEASE);
        pthread_spin_unlock(lock);
}

static void dwv_wr_start(struct ibv_qp_ex *qpx)
{
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        /* A second wr_start in the same thread would wait for itself
         * forever: the open batch is discarded and a new one starts. */
        if (dwv_section_mine(&x->open, &x->owner))
                diwarpdv_warn("verbs: QP %#x: ibv_wr_start inside an open batch (no wr_complete or "
                              "wr_abort): its %u WR%s discarded",
                              qpx->qp_base.qp_num, x->n, x->n == 1 ? "" : "s");
        else
                dwv_section_enter(&x->lock, &x->open, &x->owner);
        x->n = 0;
        x->cur = NULL;
        x->err = 0;
}

static int dwv_wr_complete(struct ibv_qp_ex *qpx)
{
        struct dwv_qp *q = dwv_qpx(qpx);
        struct dwv_qp_ext *x = q->x;
        if (!dwv_section_mine(&x->open, &x->owner)) {
                diwarpdv_warn("verbs: QP %#x: ibv_wr_complete without ibv_wr_start",
                              qpx->qp_base.qp_num);
                return EINVAL;
        }
        int err = x->err;
        if (err) {
                diwarpdv_warn(
                    "verbs: QP %#x: ibv_wr_complete: WR %#llx: %s; the %u WR%s of the batch "
                    "were not posted",
                    qpx->qp_base.qp_num, (unsigned long long)x->err_wr_id, x->why, x->n,
                    x->n == 1 ? "" : "s");
        } else if (x->n) {
                struct diwarp_send_wr *bad = NULL;
                int e = diwarp_post_send_all(q->d, x->wr, &bad);
                if (e < 0) {
                        err = -e;
                        if (e == -ENOMEM)
                                diwarpdv_dbg("verbs: QP %#x: ibv_wr_complete: send queue full",
                                             qpx->qp_base.qp_num);
                        else
                                diwarpdv_warn(
                                    "verbs: QP %#x: ibv_wr_complete: WR %#llx refused: %s "
                                    "(QP state, opcode, length or address); the %u WR%s of "
                                    "the batch were not posted",
                                    qpx->qp_base.qp_num, (unsigned long long)(bad ? bad->wr_id : 0),
                                    strerror(err), x->n, x->n == 1 ? "" : "s");
                } else {
                        for (uint32_t i = 0; i < x->n; i++)
                                if (x->wr[i].opcode == DIWARP_WR_BIND_MW)
                                        x->mw[i]->rkey = (x->mw[i]->rkey & ~0xffu) |
                                                         (x->wr[i].wr.bind_mw.rkey & 0xffu);
                }
        }
        x->n = 0;
        x->cur = NULL;
        x->err = 0;
        dwv_section_leave(&x->lock, &x->open);
        return err;
}

static void dwv_wr_abort(struct ibv_qp_ex *qpx)
{
        struct dwv_qp_ext *x = dwv_qpx(qpx)->x;
        if (!dwv_section_mine(&x->open, &x->owner)) {
                diwarpdv_warn("verbs: QP %#x: ibv_wr_abort without ibv_wr_start",
                              qpx->qp_base.qp_num);
                return;
        }
        x->n = 0;
        x->cur = NULL;
        x->err = 0;
        dwv_section_leave(&x->lock, &x->open);
}

void dwv_qp_ext_free(struct dwv_qp *q)
{
        struct dwv_qp_ext *x = q->x;
        if (!x)
                return;
        pthread_spin_destroy(&x->lock);
        free(x->wr);
        free(x->sge);
        free(x->inl);
        free(x->mw);
        free(x);
        q->x = NULL;
}

/* The operations each QP type can carry over diwarp. */
#define DWV_OPS_UD ((uint64_t)(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM))
#define DWV_OPS_UC                                                                                 \
        (DWV_OPS_UD | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |             \
         IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_LOCAL_INV)
#define DWV_OPS_RC                                                                                 \
        (DWV_OPS_UC | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |               \
         IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_BIND_MW)

static int dwv_qp_ext_init(struct dwv_qp *q, uint64_t ops, const struct ibv_qp_cap *cap)
{
        struct dwv_qp_ext *x = calloc(1, sizeof(*x));
        if (!x)
                return ENOMEM;
        x->ops = ops;
        x->max_wr = cap->max_send_wr ? cap->max_send_wr : 1;
        x->max_sge = cap->max_send_sge ? cap->max_send_sge : 1; /* room for inline's one */
        x->max_inline = cap->max_inline_data;
        x->wr = calloc(x->max_wr, sizeof(*x->wr));
        x->sge = calloc((size_t)x->max_wr * x->max_sge, sizeof(*x->sge));
        x->inl = x->max_inline ? calloc(x->max_wr, x->max_inline) : NULL;
        x->mw = calloc(x->max_wr, sizeof(*x->mw));
        if (!x->wr || !x->sge || (x->max_inline && !x->inl) || !x->mw ||
            pthread_spin_init(&x->lock, PTHREAD_PROCESS_PRIVATE)) {
                free(x->wr);
                free(x->sge);
                free(x->inl);
                free(x->mw);
                free(x);
                return ENOMEM;
        }
        q->x = x;
        struct ibv_qp_ex *qpx = &q->qpx;
        qpx->comp_mask = 0;
        qpx->wr_id = 0;
        qpx->wr_flags = 0;
        qpx->wr_atomic_cmp_swp = dwv_wr_atomic_cmp_swp;
        qpx->wr_atomic_fetch_add = dwv_wr_atomic_fetch_add;
        qpx->wr_bind_mw = dwv_wr_bind_mw;
        qpx->wr_local_inv = dwv_wr_local_inv;
        qpx->wr_rdma_read = dwv_wr_rdma_read;
        qpx->wr_rdma_write = dwv_wr_rdma_write;
        qpx->wr_rdma_write_imm = dwv_wr_rdma_write_imm;
        qpx->wr_send = dwv_wr_send;
        qpx->wr_send_imm = dwv_wr_send_imm;
        qpx->wr_send_inv = dwv_wr_send_inv;
        qpx->wr_send_tso = dwv_wr_send_tso;
        qpx->wr_set_ud_addr = dwv_wr_set_ud_addr;
        qpx->wr_set_xrc_srqn = dwv_wr_set_xrc_srqn;
        qpx->wr_set_inline_data = dwv_wr_set_inline_data;
        qpx->wr_set_inline_data_list = dwv_wr_set_inline_data_list;
        qpx->wr_set_sge = dwv_wr_set_sge;
        qpx->wr_set_sge_list = dwv_wr_set_sge_list;
        qpx->wr_start = dwv_wr_start;
        qpx->wr_complete = dwv_wr_complete;
        qpx->wr_abort = dwv_wr_abort;
        qpx->wr_atomic_write = dwv_wr_atomic_write;
        return 0;
}

int dwv_send_ops_check(const char *verb, enum ibv_qp_type type, uint64_t ops)
{
        uint64_t can = type == IBV_QPT_RC   ? DWV_OPS_RC
                       : type == IBV_QPT_UC ? DWV_OPS_UC
                       : type == IBV_QPT_UD ? DWV_OPS_UD
                                            : 0;
        if (ops & ~can) {
                diwarpdv_warn(
                    "verbs: %s: send_ops_flags %#llx: %#llx not offered on QP type %d (no "
                    "TSO, flush or atomic write; RDMA Read, atomics and memory window bind "
                    "on RC only; UD: Sends)",
                    verb, (unsigned long long)ops, (unsigned long long)(ops & ~can), type);
                return EOPNOTSUPP;
        }
        return 0;
}

int dwv_qp_ext_enable(struct ibv_qp *qp, uint64_t ops, const struct ibv_qp_cap *granted)
{
        return dwv_qp_ext_init(dwv_qp(qp), ops, granted);
}

struct ibv_qp *dwv_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
        if (!attr) {
                errno = EINVAL;
                return NULL;
        }
        /* XRC, TSO headers, RSS (indirection table, RX hash): not offered. */
        const uint32_t known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if (attr->comp_mask & ~known) {
                diwarpdv_warn(
                    "verbs: ibv_create_qp_ex: comp_mask %#x: diwarp0 offers no XRC, TSO or "
                    "RSS QPs (PD, CREATE_FLAGS and SEND_OPS_FLAGS are known)",
                    attr->comp_mask);
                errno = EOPNOTSUPP;
                return NULL;
        }
        if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) {
                diwarpdv_warn(
                    "verbs: ibv_create_qp_ex: create_flags %#x are not supported (none is)",
                    attr->create_flags);
                errno = EOPNOTSUPP;
                return NULL;
        }
        if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ctx) {
                diwarpdv_warn(
                    "verbs: ibv_create_qp_ex: no PD of this context (IBV_QP_INIT_ATTR_PD)");
                errno = EINVAL;
                return NULL;
        }
        uint64_t ops = 0;
        if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
                ops = attr->send_ops_flags;
                int err = dwv_send_ops_check("ibv_create_qp_ex", attr->qp_type, ops);
                if (err) {
                        errno = err;
                        return NULL;
                }
        }
        /* The leading fields of ibv_qp_init_attr_ex are an ibv_qp_init_attr. */
        struct ibv_qp_init_attr init;
        memcpy(&init, attr, sizeof(init));
        struct ibv_qp *qp = dwv_ibv_create_qp(attr->pd, &init);
        if (!qp)
                return NULL;
        attr->cap = init.cap;
        if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
                int err = dwv_qp_ext_init(dwv_qp(qp), ops, &init.cap);
                if (err) {
                        dwv_ibv_destroy_qp(qp);
                        errno = err;
                        return NULL;
                }
        }
        return qp;
}

_Static_assert(offsetof(struct ibv_qp_init_attr_ex, sq_sig_all) ==
                   offsetof(struct ibv_qp_init_attr, sq_sig_all),
               "ibv_qp_init_attr_ex starts with an ibv_qp_init_attr");

/* ---- extended CQ -------------------------------------------------------- */

static inline struct dwv_cq *dwv_cqx(struct ibv_cq_ex *c)
{
        return (struct dwv_cq *)c;
}

/* Takes the next completion into cq->cur: 0, ENOENT when none, or an error. */
static int dwv_cqx_take(struct dwv_cq *cq)
{
        int got = diwarp_cq_poll(cq->d, 1, &cq->cur);
        if (got == 1) {
                cq->cqx.status = (enum ibv_wc_status)cq->cur.status;
                cq->cqx.wr_id = cq->cur.wr_id;
                return 0;
        }
        return got == 0 ? ENOENT : -got;
}

static int dwv_cqx_start_poll(struct ibv_cq_ex *c, struct ibv_poll_cq_attr *attr)
{
        struct dwv_cq *cq = dwv_cqx(c);
        if (attr && attr->comp_mask)
                return EINVAL;
        /* A start_poll in the thread that has not ended its previous batch
         * (a misuse that would wait for itself forever) continues it. */
        bool lock = cq->ex_locked && !dwv_section_mine(&cq->poll_open, &cq->poll_owner);
        if (lock)
                dwv_section_enter(&cq->poll_lock, &cq->poll_open, &cq->poll_owner);
        int err = dwv_cqx_take(cq);
        if (err && cq->ex_locked)
                dwv_section_leave(&cq->poll_lock, &cq->poll_open); /* no end_poll follows */
        return err;
}

static int dwv_cqx_next_poll(struct ibv_cq_ex *c)
{
        return dwv_cqx_take(dwv_cqx(c));
}

/* An end_poll after a start_poll that failed (pyverbs' poll helper makes
 * one) ends nothing. */
static void dwv_cqx_end_poll(struct ibv_cq_ex *c)
{
        struct dwv_cq *cq = dwv_cqx(c);
        if (cq->ex_locked && dwv_section_mine(&cq->poll_open, &cq->poll_owner))
                dwv_section_leave(&cq->poll_lock, &cq->poll_open);
}

static enum ibv_wc_opcode dwv_cqx_read_opcode(struct ibv_cq_ex *c)
{
        return (enum ibv_wc_opcode)dwv_cqx(c)->cur.opcode;
}

static uint32_t dwv_cqx_read_vendor_err(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.vendor_err;
}

static uint32_t dwv_cqx_read_byte_len(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.byte_len;
}

/* Also ibv_wc_read_invalidated_rkey (verbs.h reads it through this one). */
static __be32 dwv_cqx_read_imm_data(struct ibv_cq_ex *c)
{
        const struct diwarp_wc *w = &dwv_cqx(c)->cur;
        return (__be32)((w->wc_flags & DIWARP_WC_WITH_INV) ? w->invalidated_rkey : w->imm_data);
}

static uint32_t dwv_cqx_read_qp_num(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.qp_num;
}

static uint32_t dwv_cqx_read_src_qp(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.src_qp;
}

static unsigned int dwv_cqx_read_wc_flags(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.wc_flags;
}

static uint32_t dwv_cqx_read_slid(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.slid;
}

static uint8_t dwv_cqx_read_sl(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.sl;
}

static uint8_t dwv_cqx_read_dlid_path_bits(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.dlid_path_bits;
}

/* The fields creation refuses (no VLAN stripping, flow tags or tag
 * matching): a program that reads one it did not ask for gets 0, not a
 * crash. */
static uint16_t dwv_cqx_read_cvlan(struct ibv_cq_ex *c)
{
        (void)c;
        return 0;
}

static uint32_t dwv_cqx_read_flow_tag(struct ibv_cq_ex *c)
{
        (void)c;
        return 0;
}

static void dwv_cqx_read_tm_info(struct ibv_cq_ex *c, struct ibv_wc_tm_info *tm)
{
        (void)c;
        if (tm)
                memset(tm, 0, sizeof(*tm));
}

/* Completion timestamps: the engine stamps each completion of such a CQ
 * with CLOCK_MONOTONIC in ns when it generates it. diwarp0's "HCA clock" is
 * that clock: hca_core_clock 1 GHz (ibv_query_device_ex), the raw clock of
 * ibv_query_rt_values_ex. Without the flag, 0. */
static uint64_t dwv_cqx_read_completion_ts(struct ibv_cq_ex *c)
{
        return dwv_cqx(c)->cur.ts_ns;
}

static uint64_t dwv_cqx_read_completion_wallclock_ns(struct ibv_cq_ex *c)
{
        uint64_t ts = dwv_cqx(c)->cur.ts_ns;
        if (!ts)
                return 0;
        struct timespec mono, real;
        clock_gettime(CLOCK_MONOTONIC, &mono);
        clock_gettime(CLOCK_REALTIME, &real);
        int64_t off = ((int64_t)real.tv_sec - (int64_t)mono.tv_sec) * 1000000000 +
                      ((int64_t)real.tv_nsec - (int64_t)mono.tv_nsec);
        return ts + (uint64_t)off;
}

int dwv_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *values)
{
        (void)ctx;
        if (!values)
                return EINVAL;
        if (values->comp_mask & ~(uint32_t)IBV_VALUES_MASK_RAW_CLOCK)
                return EOPNOTSUPP;
        if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK)
                clock_gettime(CLOCK_MONOTONIC, &values->raw_clock);
        return 0;
}

/* What diwarp0's completions carry: the standard fields and timestamps. */
#define DWV_WC_EX_FLAGS                                                                            \
        ((uint64_t)IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |                   \
         IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

struct ibv_cq_ex *dwv_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
        if (!attr) {
                errno = EINVAL;
                return NULL;
        }
        if (attr->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS) {
                diwarpdv_warn(
                    "verbs: ibv_create_cq_ex: comp_mask %#x: parent domains are not offered",
                    attr->comp_mask);
                errno = EOPNOTSUPP;
                return NULL;
        }
        uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
        if (flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED) {
                diwarpdv_warn(
                    "verbs: ibv_create_cq_ex: flags %#x: IGNORE_OVERRUN is not offered (an "
                    "overrun CQ goes to error)",
                    flags);
                errno = EOPNOTSUPP;
                return NULL;
        }
        if (attr->wc_flags & ~DWV_WC_EX_FLAGS) {
                diwarpdv_warn(
                    "verbs: ibv_create_cq_ex: wc_flags %#llx not offered (CVLAN, flow tag, "
                    "tag matching); the standard ones and timestamps are",
                    (unsigned long long)(attr->wc_flags & ~DWV_WC_EX_FLAGS));
                errno = EOPNOTSUPP;
                return NULL;
        }
        if (attr->cqe > (uint32_t)INT32_MAX) {
                diwarpdv_warn("verbs: ibv_create_cq_ex: cqe %u", attr->cqe);
                errno = EINVAL;
                return NULL;
        }
        struct dwv_cq *cq = dwv_cq_new(ctx, (int)attr->cqe, attr->cq_context, attr->channel,
                                       (int)attr->comp_vector);
        if (!cq)
                return NULL;
        if (pthread_spin_init(&cq->poll_lock, PTHREAD_PROCESS_PRIVATE)) {
                dwv_ibv_destroy_cq(&cq->cq);
                errno = ENOMEM;
                return NULL;
        }
        if ((attr->wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                               IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)) &&
            diwarp_cq_set_timestamps(cq->d, true) < 0) {
                pthread_spin_destroy(&cq->poll_lock);
                dwv_ibv_destroy_cq(&cq->cq);
                errno = EINVAL;
                return NULL;
        }
        cq->ex = true;
        cq->ex_locked = !(flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
        cq->wc_flags = attr->wc_flags;
        struct ibv_cq_ex *x = &cq->cqx;
        x->comp_mask = 0;
        x->start_poll = dwv_cqx_start_poll;
        x->next_poll = dwv_cqx_next_poll;
        x->end_poll = dwv_cqx_end_poll;
        x->read_opcode = dwv_cqx_read_opcode;
        x->read_vendor_err = dwv_cqx_read_vendor_err;
        x->read_byte_len = dwv_cqx_read_byte_len;
        x->read_imm_data = dwv_cqx_read_imm_data;
        x->read_qp_num = dwv_cqx_read_qp_num;
        x->read_src_qp = dwv_cqx_read_src_qp;
        x->read_wc_flags = dwv_cqx_read_wc_flags;
        x->read_slid = dwv_cqx_read_slid;
        x->read_sl = dwv_cqx_read_sl;
        x->read_dlid_path_bits = dwv_cqx_read_dlid_path_bits;
        x->read_completion_ts = dwv_cqx_read_completion_ts;
        x->read_cvlan = dwv_cqx_read_cvlan;
        x->read_flow_tag = dwv_cqx_read_flow_tag;
        x->read_tm_info = dwv_cqx_read_tm_info;
        x->read_completion_wallclock_ns = dwv_cqx_read_completion_wallclock_ns;
        return x;
}
