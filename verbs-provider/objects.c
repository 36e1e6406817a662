/* The object verbs: PD, MR, completion channel, CQ, SRQ, AH, QP.
 *
 * Each maps 1:1 onto the native API (diwarp.h), whose enums and mask bits
 * have the ibverbs values. Objects of other devices go to the real
 * libibverbs. Misuse answers with the errno a hardware provider gives and a
 * warn-level line; it never crashes.
 */
#define _GNU_SOURCE
#include "provider.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

DWV_REAL(struct ibv_pd *, ibv_alloc_pd, "IBVERBS_1.1", (struct ibv_context *))
DWV_REAL(int, ibv_dealloc_pd, "IBVERBS_1.1", (struct ibv_pd *))
DWV_REAL(struct ibv_mr *, ibv_reg_mr, "IBVERBS_1.1", (struct ibv_pd *, void *, size_t, int))
DWV_REAL(struct ibv_mr *, ibv_reg_mr_iova2, "IBVERBS_1.8",
         (struct ibv_pd *, void *, size_t, uint64_t, unsigned int))
DWV_REAL(struct ibv_mr *, ibv_reg_mr_iova, "IBVERBS_1.7",
         (struct ibv_pd *, void *, size_t, uint64_t, int))
DWV_REAL(int, ibv_rereg_mr, "IBVERBS_1.1",
         (struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int))
DWV_REAL(struct ibv_mr *, ibv_reg_dmabuf_mr, "IBVERBS_1.12",
         (struct ibv_pd *, uint64_t, size_t, uint64_t, int, int))
DWV_REAL(int, ibv_dereg_mr, "IBVERBS_1.1", (struct ibv_mr *))
DWV_REAL(struct ibv_comp_channel *, ibv_create_comp_channel, "IBVERBS_1.0", (struct ibv_context *))
DWV_REAL(int, ibv_destroy_comp_channel, "IBVERBS_1.0", (struct ibv_comp_channel *))
DWV_REAL(struct ibv_cq *, ibv_create_cq, "IBVERBS_1.1",
         (struct ibv_context *, int, void *, struct ibv_comp_channel *, int))
DWV_REAL(int, ibv_resize_cq, "IBVERBS_1.1", (struct ibv_cq *, int))
DWV_REAL(int, ibv_destroy_cq, "IBVERBS_1.1", (struct ibv_cq *))
DWV_REAL(int, ibv_get_cq_event, "IBVERBS_1.1",
         (struct ibv_comp_channel *, struct ibv_cq **, void **))
DWV_REAL(void, ibv_ack_cq_events, "IBVERBS_1.1", (struct ibv_cq *, unsigned int))
DWV_REAL(struct ibv_srq *, ibv_create_srq, "IBVERBS_1.1",
         (struct ibv_pd *, struct ibv_srq_init_attr *))
DWV_REAL(int, ibv_modify_srq, "IBVERBS_1.1", (struct ibv_srq *, struct ibv_srq_attr *, int))
DWV_REAL(int, ibv_query_srq, "IBVERBS_1.1", (struct ibv_srq *, struct ibv_srq_attr *))
DWV_REAL(int, ibv_destroy_srq, "IBVERBS_1.1", (struct ibv_srq *))
DWV_REAL(struct ibv_ah *, ibv_create_ah, "IBVERBS_1.1", (struct ibv_pd *, struct ibv_ah_attr *))
DWV_REAL(struct ibv_ah *, ibv_create_ah_from_wc, "IBVERBS_1.1",
         (struct ibv_pd *, struct ibv_wc *, struct ibv_grh *, uint8_t))
DWV_REAL(int, ibv_destroy_ah, "IBVERBS_1.1", (struct ibv_ah *))
DWV_REAL(struct ibv_qp *, ibv_create_qp, "IBVERBS_1.1",
         (struct ibv_pd *, struct ibv_qp_init_attr *))
DWV_REAL(int, ibv_modify_qp, "IBVERBS_1.1", (struct ibv_qp *, struct ibv_qp_attr *, int))
DWV_REAL(int, ibv_query_qp, "IBVERBS_1.1",
         (struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *))
DWV_REAL(int, ibv_destroy_qp, "IBVERBS_1.1", (struct ibv_qp *))
DWV_REAL(struct ibv_qp_ex *, ibv_qp_to_qp_ex, "IBVERBS_1.6", (struct ibv_qp *))
DWV_REAL(int, ibv_query_qp_data_in_order, "IBVERBS_1.14",
         (struct ibv_qp *, enum ibv_wr_opcode, uint32_t))
DWV_REAL(int, ibv_query_ece, "IBVERBS_1.10", (struct ibv_qp *, struct ibv_ece *))
DWV_REAL(int, ibv_set_ece, "IBVERBS_1.10", (struct ibv_qp *, struct ibv_ece *))
DWV_REAL(struct ibv_context *, ibv_import_device, "IBVERBS_1.10", (int))
DWV_REAL(struct ibv_pd *, ibv_import_pd, "IBVERBS_1.10", (struct ibv_context *, uint32_t))
DWV_REAL(struct ibv_mr *, ibv_import_mr, "IBVERBS_1.10", (struct ibv_pd *, uint32_t))
DWV_REAL(struct ibv_dm *, ibv_import_dm, "IBVERBS_1.13", (struct ibv_context *, uint32_t))
DWV_REAL(void, ibv_unimport_pd, "IBVERBS_1.10", (struct ibv_pd *))
DWV_REAL(void, ibv_unimport_mr, "IBVERBS_1.10", (struct ibv_mr *))
DWV_REAL(void, ibv_unimport_dm, "IBVERBS_1.13", (struct ibv_dm *))
DWV_REAL(int, ibv_attach_mcast, "IBVERBS_1.1", (struct ibv_qp *, const union ibv_gid *, uint16_t))
DWV_REAL(int, ibv_detach_mcast, "IBVERBS_1.1", (struct ibv_qp *, const union ibv_gid *, uint16_t))

/* Returns NULL with errno set from a negative diwarp code. */
static void *dwv_fail(int neg)
{
        errno = -neg;
        return NULL;
}

/* ---- protection domains ------------------------------------------------- */

DWV_SYMVER(dwv_ibv_alloc_pd, ibv_alloc_pd, "IBVERBS_1.1");
struct ibv_pd *dwv_ibv_alloc_pd(struct ibv_context *ctx)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_alloc_pd()(ctx);
        struct dwv_context *c = dwv_ctx(ctx);
        struct dwv_pd *p = calloc(1, sizeof(*p));
        if (!p)
                return dwv_fail(-ENOMEM);
        int err = diwarp_pd_alloc(c->dev, &p->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_alloc_pd: %s", strerror(-err));
                free(p);
                return dwv_fail(err);
        }
        p->pd.context = ctx;
        p->pd.handle = dwv_next_handle(c);
        dwv_link_add(c, &c->pds, &p->link);
        return &p->pd;
}

/* What of the context still holds a CQ (cq) or a PD (pd), for the line
 * that says why it cannot go: "1 QP (QPN 0x10004)", "2 QPs (QPN 0x10004,
 * 0x10005), 1 MR". At most four QPNs are named. */
static void dwv_holders(struct dwv_context *c, const struct ibv_cq *cq, const struct ibv_pd *pd,
                        char *buf, size_t len)
{
        int nqp = 0, nmr = 0, nmw = 0, nsrq = 0, nah = 0;
        char qpns[64] = "";
        size_t qo = 0;
        struct dwv_obj_link *l;

        pthread_mutex_lock(&c->objs_lock);
        for (l = c->qps.next; l != &c->qps; l = l->next) {
                struct ibv_qp *q = &DWV_CONTAINER(l, struct dwv_qp, link)->qpx.qp_base;
                if (cq ? q->send_cq != cq && q->recv_cq != cq : q->pd != pd)
                        continue;
                if (nqp++ < 4 && qo < sizeof(qpns))
                        qo += (size_t)snprintf(qpns + qo, sizeof(qpns) - qo, "%s%#x",
                                               qo ? ", " : "", q->qp_num);
        }
        for (l = pd ? c->mrs.next : &c->mrs; l != &c->mrs; l = l->next)
                nmr += DWV_CONTAINER(l, struct dwv_mr, link)->mr.pd == pd;
        for (l = pd ? c->mws.next : &c->mws; l != &c->mws; l = l->next)
                nmw += DWV_CONTAINER(l, struct dwv_mw, link)->mw.pd == pd;
        for (l = pd ? c->srqs.next : &c->srqs; l != &c->srqs; l = l->next)
                nsrq += DWV_CONTAINER(l, struct dwv_srq, link)->srq.pd == pd;
        for (l = pd ? c->ahs.next : &c->ahs; l != &c->ahs; l = l->next)
                nah += DWV_CONTAINER(l, struct dwv_ah, link)->ah.pd == pd;
        pthread_mutex_unlock(&c->objs_lock);

        size_t o = 0;
        buf[0] = 0;
        if (nqp)
                o += (size_t)snprintf(buf, len, "%d QP%s (QPN %s%s)", nqp, nqp == 1 ? "" : "s",
                                      qpns, nqp > 4 ? ", ..." : "");
        const struct {
                int n;
                const char *what;
        } more[] = {{nmr, "MR"}, {nmw, "MW"}, {nsrq, "SRQ"}, {nah, "AH"}};
        for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
                if (more[i].n && o < len)
                        o += (size_t)snprintf(buf + o, len - o, "%s%d %s%s", o ? ", " : "",
                                              more[i].n, more[i].what, more[i].n == 1 ? "" : "s");
        if (!buf[0])
                snprintf(buf, len, "objects of another context");
}

/* The line for a CQ or PD destroy refused with EBUSY: what holds it. The
 * kernel refuses the same way; a program that ends without destroying a QP
 * (some MPI libraries leak the QP of a rank's channel to itself) sees it at
 * exit, and ibv_close_device releases what is left. */
static void dwv_warn_busy(struct dwv_context *c, const char *call, const char *what,
                          uint32_t handle, const struct ibv_cq *cq, const struct ibv_pd *pd)
{
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static struct diwarpdv_log_limit limit;
        char holders[160];
        dwv_holders(c, cq, pd, holders, sizeof(holders));
        pthread_mutex_lock(&lock);
        diwarpdv_warn_limited(
            &limit,
            "verbs: %s: %s (handle %u) is still used by %s: not destroyed (EBUSY, as "
            "the kernel answers); destroy those first, or ibv_close_device releases "
            "them all",
            call, what, handle, holders);
        pthread_mutex_unlock(&lock);
}

DWV_SYMVER(dwv_ibv_dealloc_pd, ibv_dealloc_pd, "IBVERBS_1.1");
int dwv_ibv_dealloc_pd(struct ibv_pd *pd)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_dealloc_pd()(pd);
        int err = diwarp_pd_dealloc(dwv_pd(pd)->d);
        if (err == -EBUSY) {
                dwv_warn_busy(dwv_ctx(pd->context), "ibv_dealloc_pd", "PD", pd->handle, NULL, pd);
                return dwv_errno(err);
        }
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_dealloc_pd(handle %u): %s", pd->handle, strerror(-err));
                return dwv_errno(err);
        }
        dwv_link_del(dwv_ctx(pd->context), &dwv_pd(pd)->link);
        free(dwv_pd(pd));
        return 0;
}

/* ---- memory regions ----------------------------------------------------- */

/* Access bits diwarp implements, plus ones that are no-ops for a stack that
 * never pins pages (ON_DEMAND, HUGETLB, and the optional-range hints). */
#define DWV_ACCESS_NATIVE                                                                          \
        (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |               \
         IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED)
#define DWV_ACCESS_IGNORED (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_OPTIONAL_RANGE)

static struct ibv_mr *dwv_reg(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                              unsigned int access)
{
        if (access & ~(unsigned)(DWV_ACCESS_NATIVE | DWV_ACCESS_IGNORED)) {
                diwarpdv_warn("verbs: ibv_reg_mr: unsupported access flags %#x",
                              access & ~(unsigned)(DWV_ACCESS_NATIVE | DWV_ACCESS_IGNORED));
                return dwv_fail(-EINVAL);
        }
        struct dwv_mr *m = calloc(1, sizeof(*m));
        if (!m)
                return dwv_fail(-ENOMEM);
        int err = diwarp_mr_reg(dwv_pd(pd)->d, addr, length, iova,
                                (int)(access & DWV_ACCESS_NATIVE), &m->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_reg_mr(%p, %zu, access %#x): %s", addr, length, access,
                              strerror(-err));
                free(m);
                return dwv_fail(err);
        }
        struct diwarp_mr_info info;
        diwarp_mr_info(m->d, &info);
        m->mr.context = pd->context;
        m->mr.pd = pd;
        m->mr.addr = addr;
        m->mr.length = length;
        m->mr.handle = dwv_next_handle(dwv_ctx(pd->context));
        m->mr.lkey = info.lkey;
        m->mr.rkey = info.rkey;
        dwv_link_add(dwv_ctx(pd->context), &dwv_ctx(pd->context)->mrs, &m->link);
        return &m->mr;
}

DWV_SYMVER(dwv_ibv_reg_mr, ibv_reg_mr, "IBVERBS_1.1");
struct ibv_mr *dwv_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_reg_mr()(pd, addr, length, access);
        return dwv_reg(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

DWV_SYMVER(dwv_ibv_reg_mr_iova2, ibv_reg_mr_iova2, "IBVERBS_1.8");
struct ibv_mr *dwv_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                    unsigned int access)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_reg_mr_iova2()(pd, addr, length, iova, access);
        return dwv_reg(pd, addr, length, iova, access);
}

DWV_SYMVER(dwv_ibv_reg_mr_iova, ibv_reg_mr_iova, "IBVERBS_1.7");
struct ibv_mr *dwv_ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                   int access)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_reg_mr_iova()(pd, addr, length, iova, access);
        return dwv_reg(pd, addr, length, iova, (unsigned)access);
}

/* ibv_rereg_mr: the region changes in place and keeps its keys (a peer's
 * rkey still names it), as a hardware RNIC's rereg does where it can. Every
 * failure leaves the old region valid: IBV_REREG_MR_ERR_INPUT. */
DWV_SYMVER(dwv_ibv_rereg_mr, ibv_rereg_mr, "IBVERBS_1.1");
int dwv_ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
                     int access)
{
        if (!mr || !dwv_ctx_is_ours(mr->context))
                return real_ibv_rereg_mr()(mr, flags, pd, addr, length, access);
        struct dwv_mr *m = (struct dwv_mr *)mr;
        if (!flags || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
            ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != mr->context)) ||
            ((flags & IBV_REREG_MR_CHANGE_ACCESS) &&
             (access & ~(DWV_ACCESS_NATIVE | DWV_ACCESS_IGNORED)))) {
                diwarpdv_warn("verbs: ibv_rereg_mr(lkey %#x, flags %#x, access %#x): invalid input",
                              mr->lkey, flags, access);
                errno = EINVAL;
                return IBV_REREG_MR_ERR_INPUT;
        }
        int err =
            diwarp_mr_rereg(m->d, flags, (flags & IBV_REREG_MR_CHANGE_PD) ? dwv_pd(pd)->d : NULL,
                            addr, length, (uintptr_t)addr, access & DWV_ACCESS_NATIVE);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_rereg_mr(lkey %#x, flags %#x, %p, %zu, access %#x): %s",
                              mr->lkey, flags, addr, length, access, strerror(-err));
                errno = -err;
                return IBV_REREG_MR_ERR_INPUT;
        }
        if (flags & IBV_REREG_MR_CHANGE_PD)
                mr->pd = pd;
        if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
                mr->addr = addr;
                mr->length = length;
        }
        return 0;
}

DWV_SYMVER(dwv_ibv_reg_dmabuf_mr, ibv_reg_dmabuf_mr, "IBVERBS_1.12");
struct ibv_mr *dwv_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                     uint64_t iova, int fd, int access)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_reg_dmabuf_mr()(pd, offset, length, iova, fd, access);
        /* Device memory has no host address a socket could reach. */
        diwarpdv_warn("verbs: ibv_reg_dmabuf_mr: dma-buf regions are not supported by diwarp");
        return dwv_fail(-EOPNOTSUPP);
}

DWV_SYMVER(dwv_ibv_dereg_mr, ibv_dereg_mr, "IBVERBS_1.1");
int dwv_ibv_dereg_mr(struct ibv_mr *mr)
{
        if (!mr || !dwv_ctx_is_ours(mr->context))
                return real_ibv_dereg_mr()(mr);
        struct dwv_mr *m = (struct dwv_mr *)mr;
        int err = diwarp_mr_dereg(m->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_dereg_mr(lkey %#x): %s", mr->lkey, strerror(-err));
                return dwv_errno(err);
        }
        dwv_link_del(dwv_ctx(mr->context), &m->link);
        free(m);
        return 0;
}

/* ---- memory windows -------------------------------------------------------
 * ibv_alloc_mw, ibv_dealloc_mw and ibv_bind_mw are inline in verbs.h and reach
 * these through ibv_context.ops; libibverbs exports nothing for windows. */

struct ibv_mw *dwv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return dwv_fail(-EINVAL);
        if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
                diwarpdv_warn("verbs: ibv_alloc_mw: type %d: diwarp0 has types 1 and 2", (int)type);
                return dwv_fail(-EINVAL);
        }
        struct dwv_mw *m = calloc(1, sizeof(*m));
        if (!m)
                return dwv_fail(-ENOMEM);
        int err = diwarp_mw_alloc(dwv_pd(pd)->d, (enum diwarp_mw_type)type, &m->d);
        struct diwarp_mw_info info;
        if (err == 0)
                err = diwarp_mw_info(m->d, &info);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_alloc_mw(type %d): %s", (int)type, strerror(-err));
                if (m->d)
                        diwarp_mw_dealloc(m->d);
                free(m);
                return dwv_fail(err);
        }
        m->mw.context = pd->context;
        m->mw.pd = pd;
        m->mw.rkey = info.rkey;
        m->mw.handle = dwv_next_handle(dwv_ctx(pd->context));
        m->mw.type = type;
        dwv_link_add(dwv_ctx(pd->context), &dwv_ctx(pd->context)->mws, &m->link);
        return &m->mw;
}

int dwv_dealloc_mw(struct ibv_mw *mw)
{
        if (!mw || !dwv_ctx_is_ours(mw->context))
                return dwv_errno(-EINVAL);
        struct dwv_mw *m = (struct dwv_mw *)mw;
        int err = diwarp_mw_dealloc(m->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_dealloc_mw(rkey %#x): %s", mw->rkey, strerror(-err));
                return dwv_errno(err);
        }
        dwv_link_del(dwv_ctx(mw->context), &m->link);
        free(m);
        return 0;
}

int dwv_post_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t rkey,
                     const struct ibv_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags)
{
        if (!qp || !mw || !info || !dwv_ctx_is_ours(qp->context) || mw->context != qp->context ||
            (info->mr && info->mr->context != qp->context)) {
                diwarpdv_warn(
                    "verbs: QP %#x: bind of memory window WR %#llx: window, QP and region "
                    "must be objects of one diwarp0 context",
                    qp ? qp->qp_num : 0, (unsigned long long)wr_id);
                return dwv_errno(-EINVAL);
        }
        struct diwarp_mw_bind_info b = {
            .mr = info->mr ? ((struct dwv_mr *)info->mr)->d : NULL,
            .addr = info->addr,
            .length = info->length,
            .access = (int)info->mw_access_flags,
        };
        struct dwv_mw *m = (struct dwv_mw *)mw;
        int err;
        if (mw->type == IBV_MW_TYPE_1) {
                err = diwarp_mw_bind(dwv_qp(qp)->d, m->d, rkey, &b, wr_id, send_flags);
        } else {
                struct diwarp_send_wr wr = {
                    .wr_id = wr_id,
                    .opcode = DIWARP_WR_BIND_MW,
                    .send_flags = send_flags,
                };
                wr.wr.bind_mw.mw = m->d;
                wr.wr.bind_mw.rkey = rkey;
                wr.wr.bind_mw.bind_info = b;
                err = diwarp_post_send(dwv_qp(qp)->d, &wr, NULL);
        }
        if (err < 0) {
                if (err != -ENOMEM)
                        diwarpdv_warn("verbs: QP %#x: bind of memory window rkey %#x (type %d) to "
                                      "[%#llx, +%llu): %s",
                                      qp->qp_num, mw->rkey, (int)mw->type,
                                      (unsigned long long)info->addr,
                                      (unsigned long long)info->length, strerror(-err));
                return dwv_errno(err);
        }
        /* The window's index with the new key byte: the rkey it has once the
         * bind has run (the engine keeps the index bits). */
        mw->rkey = (mw->rkey & ~0xffu) | (rkey & 0xffu);
        return 0;
}

int dwv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
        if (!mw || !mw_bind)
                return dwv_errno(-EINVAL);
        if (mw->type != IBV_MW_TYPE_1)
                return dwv_errno(-EINVAL);
        /* As hardware providers do: the next key of the window's rkey. */
        return dwv_post_bind_mw(qp, mw, ibv_inc_rkey(mw->rkey), &mw_bind->bind_info, mw_bind->wr_id,
                                mw_bind->send_flags);
}

/* ---- completion channels and CQs ---------------------------------------- */

DWV_SYMVER(dwv_ibv_create_comp_channel, ibv_create_comp_channel, "IBVERBS_1.0");
struct ibv_comp_channel *dwv_ibv_create_comp_channel(struct ibv_context *ctx)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_create_comp_channel()(ctx);
        struct dwv_channel *ch = calloc(1, sizeof(*ch));
        if (!ch)
                return dwv_fail(-ENOMEM);
        int err = diwarp_comp_channel_create(dwv_ctx(ctx)->dev, &ch->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_create_comp_channel: %s", strerror(-err));
                free(ch);
                return dwv_fail(err);
        }
        ch->ch.context = ctx;
        ch->ch.fd = diwarp_comp_channel_fd(ch->d);
        dwv_link_add(dwv_ctx(ctx), &dwv_ctx(ctx)->channels, &ch->link);
        return &ch->ch;
}

DWV_SYMVER(dwv_ibv_destroy_comp_channel, ibv_destroy_comp_channel, "IBVERBS_1.0");
int dwv_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
        if (!channel || !dwv_ctx_is_ours(channel->context))
                return real_ibv_destroy_comp_channel()(channel);
        struct dwv_channel *ch = (struct dwv_channel *)channel;
        int err = diwarp_comp_channel_destroy(ch->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_destroy_comp_channel(fd %d): %s", channel->fd,
                              strerror(-err));
                return dwv_errno(err);
        }
        dwv_link_del(dwv_ctx(channel->context), &ch->link);
        free(ch);
        return 0;
}

DWV_SYMVER(dwv_ibv_create_cq, ibv_create_cq, "IBVERBS_1.1");
struct ibv_cq *dwv_ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                 struct ibv_comp_channel *channel, int comp_vector)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_create_cq()(ctx, cqe, cq_context, channel, comp_vector);
        struct dwv_cq *cq = dwv_cq_new(ctx, cqe, cq_context, channel, comp_vector);
        return cq ? &cq->cq : NULL;
}

/* A CQ of this context, linked; NULL with errno. ibv_create_cq and
 * ibv_create_cq_ex (extended.c) both make theirs here. */
struct dwv_cq *dwv_cq_new(struct ibv_context *ctx, int cqe, void *cq_context,
                          struct ibv_comp_channel *channel, int comp_vector)
{
        struct dwv_context *c = dwv_ctx(ctx);
        if (channel && channel->context != ctx) {
                diwarpdv_warn("verbs: ibv_create_cq: completion channel of another context");
                return dwv_fail(-EINVAL);
        }
        if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
                diwarpdv_warn("verbs: ibv_create_cq: comp_vector %d (the device has %d)",
                              comp_vector, ctx->num_comp_vectors);
                return dwv_fail(-EINVAL);
        }
        struct dwv_cq *cq = calloc(1, sizeof(*cq));
        if (!cq)
                return dwv_fail(-ENOMEM);
        /* The engine's cq_context is the wrapper: a channel event leads back
         * to it without a lookup. */
        int err = diwarp_cq_create(c->dev, cqe, cq,
                                   channel ? ((struct dwv_channel *)channel)->d : NULL, &cq->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_create_cq(cqe %d): %s", cqe, strerror(-err));
                free(cq);
                return dwv_fail(err);
        }
        cq->cq.context = ctx;
        cq->cq.channel = channel;
        cq->cq.cq_context = cq_context;
        cq->cq.handle = dwv_next_handle(c);
        cq->cq.cqe = diwarp_cq_cqe(cq->d);
        pthread_mutex_init(&cq->cq.mutex, NULL);
        pthread_cond_init(&cq->cq.cond, NULL);
        if (channel)
                __atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
        dwv_link_add(c, &c->cqs, &cq->link);
        return cq;
}

DWV_SYMVER(dwv_ibv_resize_cq, ibv_resize_cq, "IBVERBS_1.1");
int dwv_ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
        if (!cq || !dwv_ctx_is_ours(cq->context))
                return real_ibv_resize_cq()(cq, cqe);
        if (cqe < 1) {
                diwarpdv_warn("verbs: ibv_resize_cq(%d): at least one entry", cqe);
                return EINVAL;
        }
        int err = diwarp_cq_resize(dwv_cq(cq)->d, cqe);
        if (err < 0) {
                diwarpdv_warn(
                    "verbs: ibv_resize_cq(%d): %s (more completions waiting, or above the "
                    "device's max_cqe)",
                    cqe, strerror(-err));
                return -err;
        }
        cq->cqe = cqe;
        return 0;
}

DWV_SYMVER(dwv_ibv_destroy_cq, ibv_destroy_cq, "IBVERBS_1.1");
int dwv_ibv_destroy_cq(struct ibv_cq *ibcq)
{
        if (!ibcq || !dwv_ctx_is_ours(ibcq->context))
                return real_ibv_destroy_cq()(ibcq);
        struct dwv_cq *cq = dwv_cq(ibcq);
        int err = diwarp_cq_destroy(cq->d);
        if (err == -EBUSY) {
                dwv_warn_busy(dwv_ctx(ibcq->context), "ibv_destroy_cq", "CQ", ibcq->handle, ibcq,
                              NULL);
                return dwv_errno(err);
        }
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_destroy_cq(handle %u): %s", ibcq->handle, strerror(-err));
                return dwv_errno(err);
        }
        if (ibcq->channel)
                __atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_RELAXED);
        dwv_link_del(dwv_ctx(ibcq->context), &cq->link);
        pthread_mutex_destroy(&ibcq->mutex);
        pthread_cond_destroy(&ibcq->cond);
        if (cq->ex)
                pthread_spin_destroy(&cq->poll_lock);
        free(cq);
        return 0;
}

DWV_SYMVER(dwv_ibv_get_cq_event, ibv_get_cq_event, "IBVERBS_1.1");
int dwv_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
        if (!channel || !dwv_ctx_is_ours(channel->context))
                return real_ibv_get_cq_event()(channel, cq, cq_context);
        struct diwarp_cq *dcq = NULL;
        void *wrapper = NULL;
        int err = diwarp_comp_channel_get_event(((struct dwv_channel *)channel)->d, &dcq, &wrapper);
        if (err < 0) {
                errno = -err;
                return -1;
        }
        struct dwv_cq *w = wrapper;
        __atomic_add_fetch(&w->events_got, 1, __ATOMIC_RELAXED);
        if (cq)
                *cq = &w->cq;
        if (cq_context)
                *cq_context = w->cq.cq_context;
        return 0;
}

DWV_SYMVER(dwv_ibv_ack_cq_events, ibv_ack_cq_events, "IBVERBS_1.1");
void dwv_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
        if (!cq || !dwv_ctx_is_ours(cq->context)) {
                real_ibv_ack_cq_events()(cq, nevents);
                return;
        }
        diwarp_cq_ack_events(dwv_cq(cq)->d, nevents);
        /* The public counters, as applications and the real library see them. */
        pthread_mutex_lock(&cq->mutex);
        cq->comp_events_completed += nevents;
        pthread_cond_signal(&cq->cond);
        pthread_mutex_unlock(&cq->mutex);
}

/* ---- shared receive queues ---------------------------------------------- */

DWV_SYMVER(dwv_ibv_create_srq, ibv_create_srq, "IBVERBS_1.1");
struct ibv_srq *dwv_ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *init)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_create_srq()(pd, init);
        if (!init)
                return dwv_fail(-EINVAL);
        struct dwv_context *c = dwv_ctx(pd->context);
        struct dwv_srq *s = calloc(1, sizeof(*s));
        if (!s)
                return dwv_fail(-ENOMEM);
        struct diwarp_srq_attr a = {
            .max_wr = init->attr.max_wr,
            .max_sge = init->attr.max_sge,
            .srq_limit = init->attr.srq_limit,
        };
        int err = diwarp_srq_create(dwv_pd(pd)->d, &a, s, &s->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_create_srq(max_wr %u, max_sge %u): %s", init->attr.max_wr,
                              init->attr.max_sge, strerror(-err));
                free(s);
                return dwv_fail(err);
        }
        init->attr.max_wr = a.max_wr;
        init->attr.max_sge = a.max_sge;
        s->srq.context = pd->context;
        s->srq.srq_context = init->srq_context;
        s->srq.pd = pd;
        s->srq.handle = dwv_next_handle(c);
        pthread_mutex_init(&s->srq.mutex, NULL);
        pthread_cond_init(&s->srq.cond, NULL);
        dwv_link_add(c, &c->srqs, &s->link);
        return &s->srq;
}

DWV_SYMVER(dwv_ibv_modify_srq, ibv_modify_srq, "IBVERBS_1.1");
int dwv_ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
        if (!srq || !dwv_ctx_is_ours(srq->context))
                return real_ibv_modify_srq()(srq, attr, mask);
        if (!attr)
                return EINVAL;
        struct diwarp_srq_attr a = {
            .max_wr = attr->max_wr,
            .max_sge = attr->max_sge,
            .srq_limit = attr->srq_limit,
        };
        int err = diwarp_srq_modify(dwv_srq(srq)->d, &a, mask);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_modify_srq(mask %#x): %s", mask, strerror(-err));
                return -err;
        }
        return 0;
}

DWV_SYMVER(dwv_ibv_query_srq, ibv_query_srq, "IBVERBS_1.1");
int dwv_ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
        if (!srq || !dwv_ctx_is_ours(srq->context))
                return real_ibv_query_srq()(srq, attr);
        if (!attr)
                return EINVAL;
        struct diwarp_srq_attr a;
        int err = diwarp_srq_query(dwv_srq(srq)->d, &a);
        if (err < 0)
                return -err;
        attr->max_wr = a.max_wr;
        attr->max_sge = a.max_sge;
        attr->srq_limit = a.srq_limit;
        return 0;
}

DWV_SYMVER(dwv_ibv_destroy_srq, ibv_destroy_srq, "IBVERBS_1.1");
int dwv_ibv_destroy_srq(struct ibv_srq *srq)
{
        if (!srq || !dwv_ctx_is_ours(srq->context))
                return real_ibv_destroy_srq()(srq);
        struct dwv_srq *s = dwv_srq(srq);
        int err = diwarp_srq_destroy(s->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_destroy_srq(handle %u): %s", srq->handle, strerror(-err));
                return dwv_errno(err);
        }
        dwv_link_del(dwv_ctx(srq->context), &s->link);
        pthread_mutex_destroy(&srq->mutex);
        pthread_cond_destroy(&srq->cond);
        free(s);
        return 0;
}

/* ---- address handles ---------------------------------------------------- */

static struct ibv_ah *dwv_ah_create(struct ibv_pd *pd, const union ibv_gid *dgid)
{
        struct dwv_ah *a = calloc(1, sizeof(*a));
        if (!a)
                return dwv_fail(-ENOMEM);
        union diwarp_gid g;
        memcpy(g.raw, dgid->raw, sizeof(g.raw));
        int err = diwarp_ah_create(dwv_pd(pd)->d, &g, &a->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_create_ah: %s", strerror(-err));
                free(a);
                return dwv_fail(err);
        }
        a->ah.context = pd->context;
        a->ah.pd = pd;
        a->ah.handle = dwv_next_handle(dwv_ctx(pd->context));
        dwv_link_add(dwv_ctx(pd->context), &dwv_ctx(pd->context)->ahs, &a->link);
        return &a->ah;
}

bool dwv_called_from_librdmacm(const void *ret)
{
        Dl_info caller;
        return dladdr(ret, &caller) && caller.dli_fname && strstr(caller.dli_fname, "librdmacm");
}

/* What a program that addresses its peer by LID (InfiniBand style) is told,
 * for an RC connection and for a UD address handle. qperf runs its rc_ tests
 * over rdma_cm with -cm1, but its ud_ tests address by LID whatever the flag,
 * which no iWARP or RoCE device can serve. */
#define DWV_NO_LID "diwarp0 is an iWARP device and has no LIDs; name the peer by GID"
#define DWV_NO_LID_RC                                                                              \
        DWV_NO_LID " (ibv_rc_pingpong -g 0, perftest -x 0) or connect through rdma_cm "            \
                   "(perftest -R, qperf -cm1)"
#define DWV_NO_LID_UD                                                                              \
        DWV_NO_LID " (ibv_ud_pingpong -g 0, perftest -x 0; qperf's ud_ tests use LIDs even "       \
                   "with -cm1 and cannot run here)"

DWV_SYMVER(dwv_ibv_create_ah, ibv_create_ah, "IBVERBS_1.1");
struct ibv_ah *dwv_ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_create_ah()(pd, attr);
        if (!attr)
                return dwv_fail(-EINVAL);
        if (attr->port_num != 1) {
                diwarpdv_warn("verbs: ibv_create_ah: port %u (diwarp0 has port 1)", attr->port_num);
                return dwv_fail(-EINVAL);
        }
        if (!attr->is_global) {
                /* Ethernet link layer: a peer is named by its GID, and an AH
                 * without a GRH is refused, as a RoCE device refuses it. One
                 * caller is let through: librdmacm's rsocket datagram service
                 * hands a datagram to its own QP with an AH naming our port's
                 * LID (0) and no GRH; for it LID 0 names this device. */
                if (!dwv_called_from_librdmacm(__builtin_return_address(0)) || attr->dlid != 0) {
                        diwarpdv_warn("verbs: ibv_create_ah: LID %u without GRH (is_global=0): %s",
                                      attr->dlid, DWV_NO_LID_UD);
                        return dwv_fail(-EINVAL);
                }
                union diwarp_gid self;
                int err = diwarp_device_gid(dwv_ctx(pd->context)->dev, &self);
                if (err < 0)
                        return dwv_fail(err);
                diwarpdv_info("verbs: ibv_create_ah: no GRH, LID 0: addresses this device itself "
                              "(name a peer by GID, e.g. pass -g 0)");
                union ibv_gid own;
                memcpy(own.raw, self.raw, sizeof(own.raw));
                return dwv_ah_create(pd, &own);
        }
        return dwv_ah_create(pd, &attr->grh.dgid);
}

DWV_SYMVER(dwv_ibv_create_ah_from_wc, ibv_create_ah_from_wc, "IBVERBS_1.1");
struct ibv_ah *dwv_ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
                                         uint8_t port_num)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_create_ah_from_wc()(pd, wc, grh, port_num);
        if (!wc || !grh || !(wc->wc_flags & IBV_WC_GRH)) {
                diwarpdv_warn("verbs: ibv_create_ah_from_wc: completion without GRH");
                return dwv_fail(-EINVAL);
        }
        /* The sender is the GRH's source GID. */
        return dwv_ah_create(pd, &grh->sgid);
}

DWV_SYMVER(dwv_ibv_destroy_ah, ibv_destroy_ah, "IBVERBS_1.1");
int dwv_ibv_destroy_ah(struct ibv_ah *ah)
{
        if (!ah || !dwv_ctx_is_ours(ah->context))
                return real_ibv_destroy_ah()(ah);
        int err = diwarp_ah_destroy(dwv_ah(ah)->d);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_destroy_ah(handle %u): %s", ah->handle, strerror(-err));
                return dwv_errno(err);
        }
        dwv_link_del(dwv_ctx(ah->context), &dwv_ah(ah)->link);
        free(dwv_ah(ah));
        return 0;
}

/* ---- queue pairs -------------------------------------------------------- */

static int dwv_cq_ok(struct ibv_context *ctx, struct ibv_cq *cq)
{
        return cq && cq->context == ctx;
}

DWV_SYMVER(dwv_ibv_create_qp, ibv_create_qp, "IBVERBS_1.1");
struct ibv_qp *dwv_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_create_qp()(pd, init);
        struct ibv_context *ctx = pd->context;
        struct dwv_context *c = dwv_ctx(ctx);
        if (!init)
                return dwv_fail(-EINVAL);
        if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC &&
            init->qp_type != IBV_QPT_UD) {
                diwarpdv_warn("verbs: ibv_create_qp: QP type %d is not supported (RC, UC, UD are)",
                              init->qp_type);
                return dwv_fail(-EOPNOTSUPP);
        }
        if (!dwv_cq_ok(ctx, init->send_cq) || !dwv_cq_ok(ctx, init->recv_cq)) {
                diwarpdv_warn(
                    "verbs: ibv_create_qp: send_cq and recv_cq must be CQs of this context");
                return dwv_fail(-EINVAL);
        }
        if (init->srq && init->srq->context != ctx) {
                diwarpdv_warn("verbs: ibv_create_qp: SRQ of another context");
                return dwv_fail(-EINVAL);
        }
        struct dwv_qp *q = calloc(1, sizeof(*q));
        if (!q)
                return dwv_fail(-ENOMEM);
        struct diwarp_qp_init_attr a = {
            .qp_context = q,
            .send_cq = dwv_cq(init->send_cq)->d,
            .recv_cq = dwv_cq(init->recv_cq)->d,
            .srq = init->srq ? dwv_srq(init->srq)->d : NULL,
            .cap =
                {
                    .max_send_wr = init->cap.max_send_wr,
                    .max_recv_wr = init->cap.max_recv_wr,
                    .max_send_sge = init->cap.max_send_sge,
                    .max_recv_sge = init->cap.max_recv_sge,
                    .max_inline_data = init->cap.max_inline_data,
                },
            .qp_type = (enum diwarp_qp_type)init->qp_type,
            .sq_sig_all = init->sq_sig_all != 0,
        };
        int err = diwarp_qp_create(dwv_pd(pd)->d, &a, &q->d);
        if (err < 0) {
                /* Libraries find the inline limit by asking for less and less
                 * (libfabric's verbs provider does): no warning for that. */
                struct diwarp_device_attr da;
                bool probe = err == -EINVAL && diwarp_device_query(dwv_ctx(ctx)->dev, &da) == 0 &&
                             init->cap.max_inline_data > da.max_inline_data;
                diwarpdv_log_at(
                    probe ? DIWARPDV_LOG_DEBUG : DIWARPDV_LOG_WARN,
                    "verbs: ibv_create_qp(type %d, send_wr %u, recv_wr %u, send_sge %u, "
                    "recv_sge %u, inline %u): %s%s",
                    init->qp_type, init->cap.max_send_wr, init->cap.max_recv_wr,
                    init->cap.max_send_sge, init->cap.max_recv_sge, init->cap.max_inline_data,
                    strerror(-err), probe ? " (inline data above the device's limit)" : "");
                free(q);
                return dwv_fail(err);
        }
        /* Granted capabilities go back to the caller (libfabric sizes its
         * inline threshold from this). */
        init->cap.max_send_wr = a.cap.max_send_wr;
        init->cap.max_recv_wr = a.cap.max_recv_wr;
        init->cap.max_send_sge = a.cap.max_send_sge;
        init->cap.max_recv_sge = a.cap.max_recv_sge;
        init->cap.max_inline_data = a.cap.max_inline_data;

        struct ibv_qp *qp = &q->qpx.qp_base;
        qp->context = ctx;
        qp->qp_context = init->qp_context;
        qp->pd = pd;
        qp->send_cq = init->send_cq;
        qp->recv_cq = init->recv_cq;
        qp->srq = init->srq;
        qp->handle = dwv_next_handle(c);
        qp->qp_num = diwarp_qp_num(q->d);
        qp->qp_type = init->qp_type;
        /* An iWARP RNIC creates a QP in its Idle state, which ibv_query_qp
         * reports as INIT (as the kernel's iWARP providers do, and
         * rdma-core's tests expect of an RNIC), while libibverbs' own field
         * says RESET, as for any new QP: a program then moves it RESET ->
         * INIT, which arrives here as INIT -> INIT with the same attributes. */
        struct diwarp_qp_attr ia = {.qp_state = DIWARP_QPS_INIT, .port_num = 1};
        int imask = DIWARP_QP_STATE | DIWARP_QP_PORT | DIWARP_QP_PKEY_INDEX |
                    (init->qp_type == IBV_QPT_UD ? DIWARP_QP_QKEY : 0);
        err = diwarp_qp_modify(q->d, &ia, imask);
        if (err < 0) {
                diwarpdv_warn("verbs: ibv_create_qp: QP %#x to INIT: %s", qp->qp_num,
                              strerror(-err));
                diwarp_qp_destroy(q->d);
                free(q);
                return dwv_fail(err);
        }
        qp->state = IBV_QPS_RESET;
        q->idle = true;
        pthread_mutex_init(&qp->mutex, NULL);
        pthread_cond_init(&qp->cond, NULL);
        dwv_link_add(c, &c->qps, &q->link);
        return qp;
}

static uint32_t dwv_mtu_bytes(enum ibv_mtu m)
{
        return (m >= IBV_MTU_256 && m <= IBV_MTU_4096) ? 128u << m : 0;
}

static enum ibv_mtu dwv_mtu_enum(uint32_t bytes)
{
        enum ibv_mtu m = IBV_MTU_256;
        while (m < IBV_MTU_4096 && (128u << (m + 1)) <= bytes)
                m++;
        return m;
}

/* IB-only attributes a hardware iWARP provider accepts and ignores. */
#define DWV_QP_IGNORED (IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_RATE_LIMIT)
_Static_assert((int)IBV_QP_EN_SQD_ASYNC_NOTIFY == (int)DIWARP_QP_EN_SQD_ASYNC_NOTIFY, "mask");
_Static_assert((int)IBV_QPS_SQD == (int)DIWARP_QPS_SQD && (int)IBV_QPS_SQE == (int)DIWARP_QPS_SQE,
               "states");

DWV_SYMVER(dwv_ibv_modify_qp, ibv_modify_qp, "IBVERBS_1.1");
int dwv_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_modify_qp()(qp, attr, mask);
        if (!attr)
                return EINVAL;
        if (dwv_qp(qp)->cm_readied && (mask & IBV_QP_STATE)) {
                /* After CONNECT_RESPONSE: the steps rdma_init_qp_attr gives
                 * for INIT, RTR and RTS (rdmacm.c) on a QP already in RTS. */
                static const int cm_attrs[] = {[IBV_QPS_INIT] = IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                                                IBV_QP_ACCESS_FLAGS,
                                               [IBV_QPS_RTR] = IBV_QP_ACCESS_FLAGS,
                                               [IBV_QPS_RTS] = IBV_QP_TIMEOUT | IBV_QP_RNR_RETRY};
                enum ibv_qp_state s = attr->qp_state;
                int rest = mask & ~IBV_QP_STATE;
                if ((s == IBV_QPS_INIT || s == IBV_QPS_RTR || s == IBV_QPS_RTS) &&
                    !(rest & ~cm_attrs[s])) {
                        struct diwarp_qp_attr a;
                        memset(&a, 0, sizeof(a));
                        a.qp_access_flags = (int)attr->qp_access_flags;
                        a.timeout = attr->timeout;
                        a.rnr_retry = attr->rnr_retry;
                        int dm = rest & (IBV_QP_ACCESS_FLAGS | IBV_QP_TIMEOUT | IBV_QP_RNR_RETRY);
                        int err = dm ? diwarp_qp_modify(dwv_qp(qp)->d, &a, dm) : 0;
                        if (err < 0)
                                return -err;
                        if (s == IBV_QPS_RTS)
                                dwv_qp(qp)->cm_readied = false;
                        qp->state = IBV_QPS_RTS;
                        return 0;
                }
        }
        struct diwarp_qp_attr a;
        memset(&a, 0, sizeof(a));
        int dmask = mask & ~DWV_QP_IGNORED;
        a.qp_state = (enum diwarp_qp_state)attr->qp_state;
        a.cur_qp_state = (enum diwarp_qp_state)attr->cur_qp_state;
        a.qp_access_flags = (int)attr->qp_access_flags;
        a.qkey = attr->qkey;
        a.dest_qp_num = attr->dest_qp_num;
        a.rq_psn = attr->rq_psn;
        a.sq_psn = attr->sq_psn;
        a.max_rd_atomic = attr->max_rd_atomic;
        a.max_dest_rd_atomic = attr->max_dest_rd_atomic;
        a.timeout = attr->timeout;
        a.retry_cnt = attr->retry_cnt;
        a.rnr_retry = attr->rnr_retry;
        a.min_rnr_timer = attr->min_rnr_timer;
        a.port_num = attr->port_num;
        a.pkey_index = attr->pkey_index;
        a.cap.max_send_wr = attr->cap.max_send_wr;
        a.cap.max_recv_wr = attr->cap.max_recv_wr;
        a.cap.max_send_sge = attr->cap.max_send_sge;
        a.cap.max_recv_sge = attr->cap.max_recv_sge;
        a.cap.max_inline_data = attr->cap.max_inline_data;
        a.en_sqd_async_notify = attr->en_sqd_async_notify;
        if (mask & IBV_QP_PATH_MTU) {
                a.path_mtu = dwv_mtu_bytes(attr->path_mtu);
                if (!a.path_mtu) {
                        diwarpdv_warn("verbs: QP %#x: modify: invalid path_mtu %d", qp->qp_num,
                                      attr->path_mtu);
                        return EINVAL;
                }
        }
        if (mask & IBV_QP_AV) {
                if (!attr->ah_attr.is_global) {
                        diwarpdv_warn("verbs: QP %#x: modify: ah_attr names LID %u without GRH "
                                      "(is_global=0): %s",
                                      qp->qp_num, attr->ah_attr.dlid, DWV_NO_LID_RC);
                        return EINVAL;
                }
                memcpy(a.dgid.raw, attr->ah_attr.grh.dgid.raw, sizeof(a.dgid.raw));
                a.sgid_index = attr->ah_attr.grh.sgid_index;
        }
        /* A program that names the state it believes the QP is in says
         * RESET for one it has not touched: that is the INIT it was created
         * in. */
        if ((mask & IBV_QP_CUR_STATE) && dwv_qp(qp)->idle && attr->cur_qp_state == IBV_QPS_RESET)
                a.cur_qp_state = DIWARP_QPS_INIT;
        int err = diwarp_qp_modify(dwv_qp(qp)->d, &a, dmask);
        if (err < 0) {
                diwarpdv_warn("verbs: QP %#x: ibv_modify_qp(mask %#x, state %d): %s", qp->qp_num,
                              mask, attr->qp_state, strerror(-err));
                return -err;
        }
        dwv_qp(qp)->idle = false;
        if (mask & IBV_QP_STATE)
                qp->state = attr->qp_state;
        return 0;
}

DWV_SYMVER(dwv_ibv_query_qp, ibv_query_qp, "IBVERBS_1.1");
int dwv_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                     struct ibv_qp_init_attr *init)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_query_qp()(qp, attr, mask, init);
        if (!attr || !init)
                return EINVAL;
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        int err = diwarp_qp_query(dwv_qp(qp)->d, &a, &ia);
        if (err < 0)
                return -err;
        memset(attr, 0, sizeof(*attr));
        attr->qp_state = (enum ibv_qp_state)a.qp_state;
        attr->cur_qp_state = (enum ibv_qp_state)a.cur_qp_state;
        /* Reported as an InfiniBand-transport device (DIWARP_TRANSPORT=ib),
         * an untouched QP is in RESET, as an IB device creates it. */
        if (dwv_qp(qp)->idle && dwv_device_reports_ib())
                attr->qp_state = attr->cur_qp_state = IBV_QPS_RESET;
        attr->path_mtu = dwv_mtu_enum(a.path_mtu ? a.path_mtu : 4096);
        attr->path_mig_state = IBV_MIG_MIGRATED;
        attr->qkey = a.qkey;
        attr->rq_psn = a.rq_psn;
        attr->sq_psn = a.sq_psn;
        attr->dest_qp_num = a.dest_qp_num;
        attr->qp_access_flags = (unsigned)a.qp_access_flags;
        attr->cap.max_send_wr = a.cap.max_send_wr;
        attr->cap.max_recv_wr = a.cap.max_recv_wr;
        attr->cap.max_send_sge = a.cap.max_send_sge;
        attr->cap.max_recv_sge = a.cap.max_recv_sge;
        attr->cap.max_inline_data = a.cap.max_inline_data;
        attr->ah_attr.is_global = 1;
        memcpy(attr->ah_attr.grh.dgid.raw, a.dgid.raw, sizeof(a.dgid.raw));
        attr->ah_attr.grh.sgid_index = a.sgid_index;
        attr->ah_attr.grh.hop_limit = 64;
        attr->ah_attr.port_num = 1;
        attr->pkey_index = a.pkey_index;
        attr->max_rd_atomic = a.max_rd_atomic;
        attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
        attr->min_rnr_timer = a.min_rnr_timer;
        attr->port_num = a.port_num ? a.port_num : 1;
        attr->timeout = a.timeout;
        attr->retry_cnt = a.retry_cnt;
        attr->rnr_retry = a.rnr_retry;
        attr->en_sqd_async_notify = a.en_sqd_async_notify;
        attr->sq_draining = a.sq_draining;

        memset(init, 0, sizeof(*init));
        init->qp_context = qp->qp_context;
        init->send_cq = qp->send_cq;
        init->recv_cq = qp->recv_cq;
        init->srq = qp->srq;
        init->cap = attr->cap;
        init->qp_type = qp->qp_type;
        init->sq_sig_all = ia.sq_sig_all;
        qp->state = attr->qp_state;
        return 0;
}

DWV_SYMVER(dwv_ibv_destroy_qp, ibv_destroy_qp, "IBVERBS_1.1");
int dwv_ibv_destroy_qp(struct ibv_qp *qp)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_destroy_qp()(qp);
        struct dwv_qp *q = dwv_qp(qp);
        /* Unlinked first: rdmacm.c looks QPs up in this list (under objs_lock)
         * and must never find one whose engine QP is gone. */
        dwv_link_del(dwv_ctx(qp->context), &q->link);
        int err = diwarp_qp_destroy(q->d);
        if (err < 0) {
                diwarpdv_warn("verbs: QP %#x: ibv_destroy_qp: %s", qp->qp_num, strerror(-err));
                dwv_link_add(dwv_ctx(qp->context), &dwv_ctx(qp->context)->qps, &q->link);
                return dwv_errno(err);
        }
        pthread_mutex_destroy(&qp->mutex);
        pthread_cond_destroy(&qp->cond);
        dwv_qp_ext_free(q);
        free(q);
        return 0;
}

DWV_SYMVER(dwv_ibv_qp_to_qp_ex, ibv_qp_to_qp_ex, "IBVERBS_1.6");
struct ibv_qp_ex *dwv_ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_qp_to_qp_ex()(qp);
        /* Only QPs created by ibv_create_qp_ex with send_ops_flags have the
         * wr_* API (extended.c); for others, as the real library says, none. */
        return dwv_qp(qp)->x ? &dwv_qp(qp)->qpx : NULL;
}

DWV_SYMVER(dwv_ibv_query_qp_data_in_order, ibv_query_qp_data_in_order, "IBVERBS_1.14");
int dwv_ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_query_qp_data_in_order()(qp, op, flags);
        if (flags)
                return 0;
        switch (op) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV:
        case IBV_WR_RDMA_READ:
                return diwarp_qp_data_in_order(dwv_qp(qp)->d) ? 1 : 0;
        default:
                return 0;
        }
}

/* Enhanced connection establishment (ECE) is an InfiniBand CM option: no
 * iWARP RNIC has it. */
DWV_SYMVER(dwv_ibv_query_ece, ibv_query_ece, "IBVERBS_1.10");
int dwv_ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_query_ece()(qp, ece);
        return EOPNOTSUPP;
}

DWV_SYMVER(dwv_ibv_set_ece, ibv_set_ece, "IBVERBS_1.10");
int dwv_ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_set_ece()(qp, ece);
        return EOPNOTSUPP;
}

/* Sharing objects between processes through a command FD (ibv_import_*)
 * needs a kernel device: diwarp0 has none, so nothing can be imported into
 * it, and none of its objects was imported. */
/* A kernel device's command FD is a uverbs character device; diwarp0's
 * cmd_fd is a private eventfd (device.c), which the real ibv_import_device
 * would take for a kernel one and fail on with EINVAL. Any FD that is not a
 * character device gets EOPNOTSUPP: there is no device behind it to import. */
DWV_SYMVER(dwv_ibv_import_device, ibv_import_device, "IBVERBS_1.10");
struct ibv_context *dwv_ibv_import_device(int cmd_fd)
{
        struct stat st;
        if (fstat(cmd_fd, &st) == 0 && !S_ISCHR(st.st_mode)) {
                diwarpdv_warn("verbs: ibv_import_device(fd %d): not a kernel device's command FD "
                              "(diwarp0 has no kernel objects to import)",
                              cmd_fd);
                return dwv_fail(-EOPNOTSUPP);
        }
        return real_ibv_import_device()(cmd_fd);
}

DWV_SYMVER(dwv_ibv_import_pd, ibv_import_pd, "IBVERBS_1.10");
struct ibv_pd *dwv_ibv_import_pd(struct ibv_context *ctx, uint32_t handle)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_import_pd()(ctx, handle);
        diwarpdv_warn("verbs: ibv_import_pd: diwarp0 has no kernel objects to import");
        return dwv_fail(-EOPNOTSUPP);
}

DWV_SYMVER(dwv_ibv_import_mr, ibv_import_mr, "IBVERBS_1.10");
struct ibv_mr *dwv_ibv_import_mr(struct ibv_pd *pd, uint32_t handle)
{
        if (!pd || !dwv_ctx_is_ours(pd->context))
                return real_ibv_import_mr()(pd, handle);
        diwarpdv_warn("verbs: ibv_import_mr: diwarp0 has no kernel objects to import");
        return dwv_fail(-EOPNOTSUPP);
}

DWV_SYMVER(dwv_ibv_import_dm, ibv_import_dm, "IBVERBS_1.13");
struct ibv_dm *dwv_ibv_import_dm(struct ibv_context *ctx, uint32_t handle)
{
        if (!dwv_ctx_is_ours(ctx))
                return real_ibv_import_dm()(ctx, handle);
        diwarpdv_warn("verbs: ibv_import_dm: diwarp0 has no kernel objects to import");
        return dwv_fail(-EOPNOTSUPP);
}

DWV_SYMVER(dwv_ibv_unimport_pd, ibv_unimport_pd, "IBVERBS_1.10");
void dwv_ibv_unimport_pd(struct ibv_pd *pd)
{
        if (!pd || !dwv_ctx_is_ours(pd->context)) {
                real_ibv_unimport_pd()(pd);
                return;
        }
        diwarpdv_warn(
            "verbs: ibv_unimport_pd: PD handle %u was not imported (ibv_dealloc_pd frees it)",
            pd->handle);
}

DWV_SYMVER(dwv_ibv_unimport_mr, ibv_unimport_mr, "IBVERBS_1.10");
void dwv_ibv_unimport_mr(struct ibv_mr *mr)
{
        if (!mr || !dwv_ctx_is_ours(mr->context)) {
                real_ibv_unimport_mr()(mr);
                return;
        }
        diwarpdv_warn("verbs: ibv_unimport_mr: lkey %#x was not imported (ibv_dereg_mr frees it)",
                      mr->lkey);
}

DWV_SYMVER(dwv_ibv_unimport_dm, ibv_unimport_dm, "IBVERBS_1.13");
void dwv_ibv_unimport_dm(struct ibv_dm *dm)
{
        if (!dm || !dwv_ctx_is_ours(dm->context)) {
                real_ibv_unimport_dm()(dm);
                return;
        }
        diwarpdv_warn("verbs: ibv_unimport_dm: diwarp0 has no device memory");
}

DWV_SYMVER(dwv_ibv_attach_mcast, ibv_attach_mcast, "IBVERBS_1.1");
int dwv_ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_attach_mcast()(qp, gid, lid);
        diwarpdv_warn("verbs: QP %#x: multicast is not supported (as on iWARP RNICs)", qp->qp_num);
        return EOPNOTSUPP;
}

DWV_SYMVER(dwv_ibv_detach_mcast, ibv_detach_mcast, "IBVERBS_1.1");
int dwv_ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
        if (!qp || !dwv_ctx_is_ours(qp->context))
                return real_ibv_detach_mcast()(qp, gid, lid);
        return EOPNOTSUPP;
}

/* ---- releasing what a program left at ibv_close_device ------------------ */

/* First object of a list (its link), or NULL; the lock is not held while the
 * object is destroyed, which unlinks it. */
static struct dwv_obj_link *dwv_first(struct dwv_context *c, struct dwv_obj_link *head)
{
        pthread_mutex_lock(&c->objs_lock);
        struct dwv_obj_link *l = head->next != head ? head->next : NULL;
        pthread_mutex_unlock(&c->objs_lock);
        return l;
}

int dwv_release_all(struct dwv_context *c)
{
        struct dwv_obj_link *l;
        int n = 0;

        /* Each destroy unlinks its object; one that refuses (it cannot, in
         * this order) is unlinked by hand so the loop ends. */
#define DWV_DRAIN(head, type, destroy_expr)                                                        \
        while ((l = dwv_first(c, head))) {                                                         \
                type *o = DWV_CONTAINER(l, type, link);                                            \
                n++;                                                                               \
                if (destroy_expr)                                                                  \
                        dwv_link_del(c, l);                                                        \
        }
        DWV_DRAIN(&c->qps, struct dwv_qp, dwv_ibv_destroy_qp(&o->qpx.qp_base))
        DWV_DRAIN(&c->ahs, struct dwv_ah, dwv_ibv_destroy_ah(&o->ah))
        DWV_DRAIN(&c->mws, struct dwv_mw, dwv_dealloc_mw(&o->mw))
        DWV_DRAIN(&c->mrs, struct dwv_mr, dwv_ibv_dereg_mr(&o->mr))
        DWV_DRAIN(&c->srqs, struct dwv_srq, dwv_ibv_destroy_srq(&o->srq))
        /* Events handed out but never acknowledged would block the destroy. */
        DWV_DRAIN(&c->cqs, struct dwv_cq,
                  (dwv_ibv_ack_cq_events(&o->cq, __atomic_load_n(&o->events_got, __ATOMIC_RELAXED) -
                                                     o->cq.comp_events_completed),
                   dwv_ibv_destroy_cq(&o->cq)))
        DWV_DRAIN(&c->channels, struct dwv_channel, dwv_ibv_destroy_comp_channel(&o->ch))
        DWV_DRAIN(&c->pds, struct dwv_pd, dwv_ibv_dealloc_pd(&o->pd))
#undef DWV_DRAIN
        return n;
}
