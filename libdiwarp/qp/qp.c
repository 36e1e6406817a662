/* Queue pairs: creation, the IB state machine, posting, completion and
 * flushing. Transport work is delegated: UD to ud/ud.c, RD to rd/,
 * RC/UC to rc/rc.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "api/backend.h"
#include "dw.h"
#include "wire/dgram.h"

static bool dw_qp_is_rc(const struct dw_qp *qp)
{
        return qp->type == DIWARP_QPT_RC || qp->type == DIWARP_QPT_UC;
}

/* UD and every QP the RD transport serves receive through the UDP socket. */
static bool dw_qp_uses_udp(const struct dw_qp *qp)
{
        return qp->type == DIWARP_QPT_UD || dw_qp_on_rd(qp);
}

struct dw_qp *dw_qp_lookup(struct dw_device *dev, uint32_t qpn)
{
        if ((qpn & ~DW_DGRAM_QPN_MASK) || dw_qpn_instance(qpn) != dev->instance)
                return NULL;
        struct dw_qp *qp = dev->qps[dw_qpn_index(qpn)];
        return qp && qp->qpn == qpn ? qp : NULL;
}

/* ---- completions ------------------------------------------------------- */

void dw_qp_complete_send(struct dw_qp *qp, enum diwarp_wc_status status, uint32_t byte_len)
{
        dw_qp_complete_send_ve(qp, status, byte_len, 0);
}

void dw_qp_complete_send_ve(struct dw_qp *qp, enum diwarp_wc_status status, uint32_t byte_len,
                            uint32_t vendor_err)
{
        struct dw_wqe *w = dw_wq_head(&qp->sq);
        if (!w)
                return;
        if (status != DIWARP_WC_SUCCESS || qp->sq_sig_all ||
            (w->send_flags & DIWARP_SEND_SIGNALED)) {
                struct diwarp_wc wc = {
                    .wr_id = w->wr_id,
                    .status = status,
                    .opcode = dw_wr_op(w->opcode)->wc,
                    .byte_len = byte_len,
                    .qp_num = qp->qpn,
                    .vendor_err = status != DIWARP_WC_SUCCESS ? vendor_err : 0,
                };
                dw_cq_complete(qp->dev, qp->send_cq, &wc, false);
        }
        dw_wq_pop(&qp->sq);
        if (qp->state == DIWARP_QPS_SQD)
                dw_qp_sqd_check(qp);
}

void dw_qp_complete_recv(struct dw_qp *qp, struct diwarp_wc *wc, bool solicited)
{
        wc->qp_num = qp->qpn;
        dw_cq_complete(qp->dev, qp->recv_cq, wc, solicited);
}

struct dw_wqe *dw_qp_recv_head(struct dw_qp *qp)
{
        if (!qp->srq)
                return dw_wq_head(&qp->rq);
        if (!qp->srq_cur_valid) {
                bool limit = false;
                if (dw_srq_take(&qp->srq->q, &qp->srq_cur, &limit) < 0)
                        return NULL;
                qp->srq_cur_valid = true;
                if (limit)
                        dw_async_srq(qp->dev, qp->srq, DIWARP_EVENT_SRQ_LIMIT_REACHED);
        }
        return &qp->srq_cur;
}

void dw_qp_recv_pop(struct dw_qp *qp)
{
        if (qp->srq)
                qp->srq_cur_valid = false;
        else
                dw_wq_pop(&qp->rq);
}

/* Every outstanding WQE completes with WR_FLUSH_ERR (signaled or not, as an
 * RNIC does for error completions). SRQ WQEs stay in the SRQ for other QPs,
 * except the one this QP had already taken. */
static void dw_qp_flush_sq(struct dw_qp *qp)
{
        struct dw_wqe *w;
        while ((w = dw_wq_head(&qp->sq))) {
                struct diwarp_wc wc = {.wr_id = w->wr_id,
                                       .status = DIWARP_WC_WR_FLUSH_ERR,
                                       .opcode = dw_wr_op(w->opcode)->wc,
                                       .qp_num = qp->qpn};
                dw_cq_complete(qp->dev, qp->send_cq, &wc, false);
                dw_wq_pop(&qp->sq);
        }
        if (qp->tx_pending) {
                qp->tx_pending = false;
                dw_progress_tx_wait(&qp->dev->prog, false);
        }
}

static void dw_qp_flush(struct dw_qp *qp)
{
        struct dw_wqe *w;
        dw_qp_flush_sq(qp);
        while ((w = qp->srq ? (qp->srq_cur_valid ? &qp->srq_cur : NULL) : dw_wq_head(&qp->rq))) {
                struct diwarp_wc wc = {.wr_id = w->wr_id,
                                       .status = DIWARP_WC_WR_FLUSH_ERR,
                                       .opcode = DIWARP_WC_RECV,
                                       .qp_num = qp->qpn};
                dw_cq_complete(qp->dev, qp->recv_cq, &wc, false);
                dw_qp_recv_pop(qp);
        }
}

void dw_qp_to_sqe(struct dw_qp *qp)
{
        qp->state = DIWARP_QPS_SQE;
        qp->sq_draining = false;
        dw_qp_flush_sq(qp);
}

static bool dw_qp_sq_busy(const struct dw_qp *qp)
{
        if (dw_qp_on_rd(qp))
                return dw_rd_sq_busy(qp);
        /* RC marks a WQE started when its first FPDU is built and retires it
         * once sent (Reads: once answered); UD completes a WQE as soon as the
         * socket takes it, so nothing is ever under way there. */
        return dw_qp_is_rc(qp) && qp->sq.started > 0;
}

void dw_qp_sqd_check(struct dw_qp *qp)
{
        if (qp->state != DIWARP_QPS_SQD || !qp->sq_draining || dw_qp_sq_busy(qp))
                return;
        qp->sq_draining = false;
        if (qp->sqd_notify)
                dw_async_qp(qp, DIWARP_EVENT_SQ_DRAINED);
}

void dw_qp_to_error(struct dw_qp *qp, int event)
{
        bool was_err = qp->state == DIWARP_QPS_ERR;
        qp->state = DIWARP_QPS_ERR;
        if (!was_err) {
                if (dw_qp_on_rd(qp)) {
                        dw_rd_qp_error(qp);
                        dw_cm_qp_cancel(qp); /* a native connection's CM stream */
                } else if (dw_qp_is_rc(qp))
                        dw_rc_qp_error(qp);
                if (event >= 0)
                        dw_async_qp(qp, (enum diwarp_event_type)event);
                /* IB: a QP on an SRQ reports its last WQE once it is in error. */
                if (qp->srq)
                        dw_async_qp(qp, DIWARP_EVENT_QP_LAST_WQE_REACHED);
        }
        dw_qp_flush(qp);
}

/* A random first MSN per UD QP (see struct dw_ud_seen). */
static uint32_t dw_random_msn(const struct dw_qp *qp)
{
        uint32_t v;
        if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v))
                return v;
        uint64_t x = (uint64_t)(uintptr_t)qp ^ ((uint64_t)qp->qpn << 40) ^ (uint64_t)time(NULL);
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        return (uint32_t)x;
}

/* Discards WQEs without completions, and the QP's completions still in its
 * CQs (transition to RESET). */
static void dw_qp_reset_queues(struct dw_qp *qp)
{
        while (dw_wq_head(&qp->sq))
                dw_wq_pop(&qp->sq);
        while (dw_wq_head(&qp->rq))
                dw_wq_pop(&qp->rq);
        qp->srq_cur_valid = false;
        if (qp->send_cq)
                dw_cq_purge_qp(qp->send_cq, qp->qpn);
        if (qp->recv_cq && qp->recv_cq != qp->send_cq)
                dw_cq_purge_qp(qp->recv_cq, qp->qpn);
        if (qp->tx_pending) {
                qp->tx_pending = false;
                dw_progress_tx_wait(&qp->dev->prog, false);
        }
        qp->sq_draining = qp->sqd_notify = false;
        qp->ud_msn = dw_random_msn(qp);
        if (qp->ud_seen)
                memset(qp->ud_seen, 0, DW_UD_SEEN_SLOTS * sizeof(*qp->ud_seen));
        qp->attr_mask_set = 0;
}

/* ---- create / destroy --------------------------------------------------------- */

static int dw_qp_alloc_index(struct dw_device *dev)
{
        for (unsigned k = 0; k < DW_MAX_QP; k++) {
                uint32_t i = dev->next_qp_index + k;
                i = DW_FIRST_QP_INDEX + (i - DW_FIRST_QP_INDEX) % (DW_MAX_QP - DW_FIRST_QP_INDEX);
                if (!dev->qps[i]) {
                        /* Next search starts after it, so a destroyed QPN is not
                         * handed out again at once (stale packets for it). */
                        dev->next_qp_index = i + 1;
                        return (int)i;
                }
        }
        return -ENOMEM;
}

/* The capabilities asked for, within the device's limits; a 0 becomes 1. */
static int qp_cap_check(struct diwarp_qp_cap *cap)
{
        if (cap->max_send_wr > DW_MAX_QP_WR || cap->max_recv_wr > DW_MAX_QP_WR ||
            cap->max_send_sge > DW_MAX_SGE || cap->max_recv_sge > DW_MAX_SGE ||
            cap->max_inline_data > DW_MAX_INLINE)
                return -EINVAL;
        if (cap->max_send_wr == 0)
                cap->max_send_wr = 1;
        if (cap->max_recv_wr == 0)
                cap->max_recv_wr = 1;
        if (cap->max_send_sge == 0)
                cap->max_send_sge = 1;
        if (cap->max_recv_sge == 0)
                cap->max_recv_sge = 1;
        return 0;
}

/* Frees what qp_queues_init made. */
static void qp_queues_fini(struct dw_qp *qp)
{
        free(qp->ud_seen);
        qp->ud_seen = NULL;
        if (!qp->srq)
                dw_wq_fini(&qp->rq);
        dw_wq_fini(&qp->sq);
}

/* The QP's own memory: its queues (no receive queue with an SRQ: *cap then
 * says 0 receive WRs) and a UD QP's duplicate filter. */
static int qp_queues_init(struct dw_qp *qp, struct diwarp_qp_cap *cap)
{
        int err = dw_wq_init(&qp->sq, cap->max_send_wr, cap->max_send_sge, cap->max_inline_data);
        if (err < 0)
                return err;
        if (qp->srq) {
                cap->max_recv_wr = 0;
                cap->max_recv_sge = 0;
        } else {
                err = dw_wq_init(&qp->rq, cap->max_recv_wr, cap->max_recv_sge, 0);
                if (err < 0) {
                        dw_wq_fini(&qp->sq);
                        return err;
                }
        }
        qp->cap = *cap;
        if (qp->type == DIWARP_QPT_UD) {
                qp->ud_seen = calloc(DW_UD_SEEN_SLOTS, sizeof(*qp->ud_seen));
                if (!qp->ud_seen) {
                        qp_queues_fini(qp);
                        return -ENOMEM;
                }
                qp->ud_msn = dw_random_msn(qp);
        }
        return 0;
}

/* Gives qp its QPN and its transport's state, puts it in the device's
 * table and takes its references on the PD, CQs and SRQ. */
static int qp_register(struct dw_qp *qp)
{
        struct dw_device *dev = qp->dev;
        int err = 0;
        pthread_mutex_lock(&dev->lock);
        int idx = dw_qp_alloc_index(dev);
        if (idx < 0) {
                err = idx;
                goto out;
        }
        qp->qpn = dw_qpn_make(dev->instance, (uint32_t)idx);
        if (dw_rd_wanted(dev, qp->type))
                err = dw_rd_qp_init(qp);
        else if (dw_qp_is_rc(qp))
                err = dw_rc_qp_init(qp);
        if (err < 0)
                goto out;
        dev->qps[idx] = qp;
        dev->nqp++;
        if (dw_qp_uses_udp(qp))
                dev->prog.ndgram++; /* app-driven steps read the UDP socket */
        dw_pd_get(qp->pd);
        qp->send_cq->use_count++;
        qp->recv_cq->use_count++;
        if (qp->srq)
                qp->srq->q.use_count++;
out:
        pthread_mutex_unlock(&dev->lock);
        return err;
}

int dwe_qp_create(struct diwarp_pd *p, struct diwarp_qp_init_attr *attr, struct diwarp_qp **out)
{
        struct dw_pd *pd = dw_pd_of(p);
        struct dw_device *dev = pd->dev;
        struct dw_cq_obj *scq = dw_cq_of(attr->send_cq), *rcq = dw_cq_of(attr->recv_cq);
        struct dw_srq_obj *srq = attr->srq ? dw_srq_of(attr->srq) : NULL;
        if (scq->dev != dev || rcq->dev != dev || (srq && srq->dev != dev))
                return -EINVAL;
        switch (attr->qp_type) {
        case DIWARP_QPT_RC:
        case DIWARP_QPT_UC:
        case DIWARP_QPT_UD:
                break;
        case DIWARP_QPT_RD: /* rd/rd.c (diwarpdv_create_qp) */
                break;
        default:
                return -EINVAL;
        }
        struct diwarp_qp_cap cap = attr->cap;
        int err = qp_cap_check(&cap);
        if (err < 0)
                return err;

        struct dw_qp *qp = calloc(1, sizeof(*qp));
        if (!qp)
                return -ENOMEM;
        qp->dev = dev;
        qp->pd = pd;
        qp->qp_context = attr->qp_context;
        qp->type = attr->qp_type;
        qp->state = DIWARP_QPS_RESET;
        qp->send_cq = &scq->cq;
        qp->recv_cq = &rcq->cq;
        qp->srq = srq;
        qp->sq_sig_all = attr->sq_sig_all;
        qp->attr.qkey = DW_UD_DEFAULT_QKEY;
        err = qp_queues_init(qp, &cap);
        if (err < 0) {
                free(qp);
                return err;
        }
        err = qp_register(qp);
        if (err < 0) {
                qp_queues_fini(qp);
                free(qp);
                return err;
        }
        attr->cap = cap;
        dw_dbg("QP %#x created (type %d)", qp->qpn, qp->type);
        *out = dw_qp_pub(qp);
        return 0;
}

int dwe_qp_destroy(struct diwarp_qp *q)
{
        struct dw_qp *qp = dw_qp_of(q);
        struct dw_device *dev = qp->dev;
        int linger_fd = -1;
        pthread_mutex_lock(&dev->lock);
        if (dw_qp_uses_udp(qp))
                dev->prog.ndgram--;
        if (dw_qp_on_rd(qp)) {
                dw_cm_qp_cancel(qp);
                dw_rd_qp_fini(qp);
        } else if (dw_qp_is_rc(qp)) {
                linger_fd = dw_rc_qp_fini(qp);
        }
        if (qp->tx_pending)
                dw_progress_tx_wait(&dev->prog, false);
        dev->qps[dw_qpn_index(qp->qpn)] = NULL;
        dev->nqp--;
        dw_mw_qp_gone(&dev->mrs, qp->qpn);
        dw_pd_put(qp->pd);
        qp->send_cq->use_count--;
        qp->recv_cq->use_count--;
        if (qp->srq)
                qp->srq->q.use_count--;
        dw_async_queue_purge(&dev->async, q);
        pthread_mutex_unlock(&dev->lock);
        dw_rc_close_lingering(linger_fd, dev->prog.external);
        qp_queues_fini(qp);
        free(qp);
        return 0;
}

uint32_t dwe_qp_num(const struct diwarp_qp *q)
{
        return ((const struct dw_qp *)q)->qpn;
}

bool dwe_qp_data_in_order(const struct diwarp_qp *q)
{
        const struct dw_qp *qp = (const struct dw_qp *)q;
        return (qp->type == DIWARP_QPT_RC || qp->type == DIWARP_QPT_UC) && !qp->rd;
}

enum diwarp_qp_state dwe_qp_state(const struct diwarp_qp *q)
{
        const struct dw_qp *qp = (const struct dw_qp *)q;
        /* A single aligned enum read; a racing modify gives the old or the new state. */
        return __atomic_load_n(&qp->state, __ATOMIC_RELAXED);
}

/* ---- modify ------------------------------------------------------------------------ */

/* Attributes a transition must carry. iWARP needs fewer than IB: PKEY_INDEX
 * and PORT are optional (one port, no partitions), and the RC path
 * attributes (AV, DEST_QPN, PSNs, timers) are optional because rdma_cm-style
 * setup (MPA over TCP) supplies the peer instead; AV and DEST_QPN, when used
 * for the IB-style connect, must come together. */
static int dw_qp_required(const struct dw_qp *qp, enum diwarp_qp_state cur,
                          enum diwarp_qp_state next)
{
        if (cur == DIWARP_QPS_RESET && next == DIWARP_QPS_INIT)
                return qp->type == DIWARP_QPT_UD || qp->type == DIWARP_QPT_RD ? DIWARP_QP_QKEY : 0;
        if (cur == DIWARP_QPS_RTR && next == DIWARP_QPS_RTS)
                return qp->type == DIWARP_QPT_UD ? DIWARP_QP_SQ_PSN : 0;
        return 0;
}

static bool dw_qp_transition_ok(enum diwarp_qp_state cur, enum diwarp_qp_state next)
{
        if (next == DIWARP_QPS_RESET || next == DIWARP_QPS_ERR)
                return true;
        switch (cur) {
        case DIWARP_QPS_RESET:
                return next == DIWARP_QPS_INIT;
        case DIWARP_QPS_INIT:
                return next == DIWARP_QPS_INIT || next == DIWARP_QPS_RTR;
        case DIWARP_QPS_RTR:
                return next == DIWARP_QPS_RTS;
        case DIWARP_QPS_RTS:
                return next == DIWARP_QPS_RTS || next == DIWARP_QPS_SQD;
        case DIWARP_QPS_SQD:
                return next == DIWARP_QPS_SQD || next == DIWARP_QPS_RTS;
        case DIWARP_QPS_SQE:
                return next == DIWARP_QPS_RTS; /* SQE is entered by a send error only */
        default:
                return false; /* ERR only to RESET */
        }
}

/* Attributes a transition into, out of or within SQD / SQE may carry besides
 * STATE and CUR_STATE (the optional attributes of those rows of the IB
 * modify table that mean something here); -1 for the other transitions. */
static int dw_qp_sq_state_allowed(const struct dw_qp *qp, enum diwarp_qp_state cur,
                                  enum diwarp_qp_state next)
{
        int qkey = qp->type == DIWARP_QPT_UD || qp->type == DIWARP_QPT_RD ? DIWARP_QP_QKEY : 0;
        if (cur == DIWARP_QPS_RTS && next == DIWARP_QPS_SQD)
                return DIWARP_QP_EN_SQD_ASYNC_NOTIFY;
        if (cur == DIWARP_QPS_SQD && next == DIWARP_QPS_RTS)
                return DIWARP_QP_ACCESS_FLAGS | DIWARP_QP_MIN_RNR_TIMER | qkey;
        if (cur == DIWARP_QPS_SQE && next == DIWARP_QPS_RTS)
                return DIWARP_QP_ACCESS_FLAGS | qkey;
        if (cur == DIWARP_QPS_SQD && next == DIWARP_QPS_SQD)
                return DIWARP_QP_ACCESS_FLAGS | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                       DIWARP_QP_TIMEOUT | DIWARP_QP_RETRY_CNT | DIWARP_QP_RNR_RETRY |
                       DIWARP_QP_MIN_RNR_TIMER | DIWARP_QP_MAX_QP_RD_ATOMIC |
                       DIWARP_QP_MAX_DEST_RD_ATOMIC | qkey;
        return -1;
}

#define DW_QP_KNOWN_MASK                                                                           \
        (DIWARP_QP_STATE | DIWARP_QP_CUR_STATE | DIWARP_QP_ACCESS_FLAGS | DIWARP_QP_PKEY_INDEX |   \
         DIWARP_QP_PORT | DIWARP_QP_QKEY | DIWARP_QP_AV | DIWARP_QP_PATH_MTU | DIWARP_QP_TIMEOUT | \
         DIWARP_QP_RETRY_CNT | DIWARP_QP_RNR_RETRY | DIWARP_QP_RQ_PSN |                            \
         DIWARP_QP_MAX_QP_RD_ATOMIC | DIWARP_QP_MIN_RNR_TIMER | DIWARP_QP_SQ_PSN |                 \
         DIWARP_QP_MAX_DEST_RD_ATOMIC | DIWARP_QP_CAP | DIWARP_QP_DEST_QPN |                       \
         DIWARP_QP_EN_SQD_ASYNC_NOTIFY)

/* The transition and the attribute mask against the QP's state: a known
 * mask, a transition the state diagram has, the attributes that
 * transition may and must carry. */
static int dw_qp_modify_check_mask(const struct dw_qp *qp, const struct diwarp_qp_attr *a, int mask,
                                   enum diwarp_qp_state cur, enum diwarp_qp_state next)
{
        if (mask & ~DW_QP_KNOWN_MASK) {
                dw_warn("QP %#x: modify with unknown mask bits %#x", qp->qpn,
                        mask & ~DW_QP_KNOWN_MASK);
                return -EINVAL;
        }
        if ((mask & DIWARP_QP_CUR_STATE) && a->cur_qp_state != cur) {
                dw_warn("QP %#x: CUR_STATE %d but the QP is in state %d", qp->qpn, a->cur_qp_state,
                        cur);
                return -EINVAL;
        }
        if (next < DIWARP_QPS_RESET || next > DIWARP_QPS_ERR)
                return -EINVAL;
        if ((mask & DIWARP_QP_STATE) && !dw_qp_transition_ok(cur, next)) {
                dw_warn("QP %#x: invalid transition %d -> %d", qp->qpn, cur, next);
                return -EINVAL;
        }
        if (!(mask & DIWARP_QP_STATE) &&
            (cur == DIWARP_QPS_RESET || cur == DIWARP_QPS_ERR || cur == DIWARP_QPS_SQE) &&
            (mask & ~DIWARP_QP_CUR_STATE)) {
                dw_warn("QP %#x: attributes %#x without a state change in state %d", qp->qpn,
                        mask & ~DIWARP_QP_CUR_STATE, cur);
                return -EINVAL;
        }
        if (next != DIWARP_QPS_RESET && next != DIWARP_QPS_ERR) {
                int allowed = dw_qp_sq_state_allowed(qp, cur, next);
                int extra = mask & ~(DIWARP_QP_STATE | DIWARP_QP_CUR_STATE);
                if (allowed < 0)
                        allowed = DW_QP_KNOWN_MASK & ~DIWARP_QP_EN_SQD_ASYNC_NOTIFY;
                if (extra & ~allowed) {
                        dw_warn("QP %#x: transition %d -> %d does not take attribute mask %#x",
                                qp->qpn, cur, next, extra & ~allowed);
                        return -EINVAL;
                }
                /* IB: attributes change in SQD only once the queue drained. */
                if (cur == DIWARP_QPS_SQD && next == DIWARP_QPS_SQD && extra && qp->sq_draining) {
                        dw_warn("QP %#x: SQD attributes %#x while the send queue still drains",
                                qp->qpn, extra);
                        return -EINVAL;
                }
        }
        int need = dw_qp_required(qp, cur, next);
        if ((mask & need) != need) {
                dw_warn("QP %#x: transition %d -> %d needs attribute mask %#x (got %#x)", qp->qpn,
                        cur, next, need, mask);
                return -EINVAL;
        }
        if (dw_qp_is_rc(qp) && next == DIWARP_QPS_RTR && cur == DIWARP_QPS_INIT &&
            !!(mask & DIWARP_QP_AV) != !!(mask & DIWARP_QP_DEST_QPN)) {
                dw_warn("QP %#x: RTR needs both AV and DEST_QPN, or neither (CM connect)", qp->qpn);
                return -EINVAL;
        }
        return 0;
}

/* The values of the attributes the mask names, before any is applied. */
static int dw_qp_modify_check_values(const struct dw_qp *qp, const struct diwarp_qp_attr *a,
                                     int mask)
{
        struct in_addr ip;

        if ((mask & DIWARP_QP_AV) && dw_gid_to_ipv4(&a->dgid, &ip) < 0) {
                dw_warn("QP %#x: AV GID is not an IPv4-mapped address", qp->qpn);
                return -EINVAL;
        }
        if ((mask & DIWARP_QP_DEST_QPN) && (a->dest_qp_num & ~DW_DGRAM_QPN_MASK))
                return -EINVAL;
        if ((mask & DIWARP_QP_AV) && a->sgid_index >= qp->dev->ngid) {
                dw_warn("QP %#x: AV source GID index %u is outside the GID table (%d entries)",
                        qp->qpn, a->sgid_index, qp->dev->ngid);
                return -EINVAL;
        }
        if ((mask & DIWARP_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > DW_MAX_RD_ATOM)
                return -EINVAL;
        if ((mask & DIWARP_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > DW_MAX_RD_ATOM)
                return -EINVAL;
        if ((mask & DIWARP_QP_PORT) && a->port_num != 1)
                return -EINVAL;
        return 0;
}

/* Copies the attributes the mask names into the QP (the AV also sets the
 * peer's address). */
static void dw_qp_modify_apply(struct dw_qp *qp, const struct diwarp_qp_attr *a, int mask)
{
        if (mask & DIWARP_QP_ACCESS_FLAGS)
                qp->attr.qp_access_flags = a->qp_access_flags;
        if (mask & DIWARP_QP_PKEY_INDEX)
                qp->attr.pkey_index = a->pkey_index;
        if (mask & DIWARP_QP_PORT)
                qp->attr.port_num = a->port_num;
        if (mask & DIWARP_QP_QKEY)
                qp->attr.qkey = a->qkey;
        if (mask & DIWARP_QP_AV) {
                qp->attr.dgid = a->dgid;
                qp->attr.sgid_index = a->sgid_index;
                struct in_addr ip;
                dw_gid_to_ipv4(&a->dgid, &ip);
                qp->peer.sin_family = AF_INET;
                qp->peer.sin_addr = ip;
        }
        if (mask & DIWARP_QP_DEST_QPN)
                qp->attr.dest_qp_num = a->dest_qp_num;
        if (mask & (DIWARP_QP_AV | DIWARP_QP_DEST_QPN))
                dw_peer_addr(qp->dev, qp->peer.sin_addr, qp->attr.dest_qp_num, &qp->peer);
        if (mask & DIWARP_QP_PATH_MTU)
                qp->attr.path_mtu = a->path_mtu;
        if (mask & DIWARP_QP_TIMEOUT)
                qp->attr.timeout = a->timeout;
        if (mask & DIWARP_QP_RETRY_CNT)
                qp->attr.retry_cnt = a->retry_cnt;
        if (mask & DIWARP_QP_RNR_RETRY)
                qp->attr.rnr_retry = a->rnr_retry;
        if (mask & DIWARP_QP_RQ_PSN)
                qp->attr.rq_psn = a->rq_psn;
        if (mask & DIWARP_QP_SQ_PSN)
                qp->attr.sq_psn = a->sq_psn;
        if (mask & DIWARP_QP_MAX_QP_RD_ATOMIC)
                qp->attr.max_rd_atomic = a->max_rd_atomic;
        if (mask & DIWARP_QP_MAX_DEST_RD_ATOMIC)
                qp->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
        if (mask & DIWARP_QP_MIN_RNR_TIMER)
                qp->attr.min_rnr_timer = a->min_rnr_timer;
}

/* Entering SQD, or leaving SQD or SQE for RTS: the send queue drains, or
 * starts again. */
static void dw_qp_modify_sq(struct dw_qp *qp, const struct diwarp_qp_attr *a, int mask,
                            enum diwarp_qp_state cur, enum diwarp_qp_state next)
{
        if (next == DIWARP_QPS_SQD && cur != DIWARP_QPS_SQD) {
                /* WQEs under way finish; the transports start no new one. */
                qp->sq_draining = true;
                qp->sqd_notify = (mask & DIWARP_QP_EN_SQD_ASYNC_NOTIFY) && a->en_sqd_async_notify;
                dw_qp_sqd_check(qp);
        } else if (next == DIWARP_QPS_RTS && (cur == DIWARP_QPS_SQD || cur == DIWARP_QPS_SQE)) {
                qp->sq_draining = qp->sqd_notify = false;
                if (qp->type == DIWARP_QPT_UD && !qp->tx_pending)
                        dw_ud_tx(qp, DW_PROGRESS_BUDGET);
        }
}

static int dw_qp_modify_locked(struct dw_qp *qp, const struct diwarp_qp_attr *a, int mask)
{
        enum diwarp_qp_state cur = qp->state;
        enum diwarp_qp_state next = (mask & DIWARP_QP_STATE) ? a->qp_state : cur;
        int err = dw_qp_modify_check_mask(qp, a, mask, cur, next);

        if (!err)
                err = dw_qp_modify_check_values(qp, a, mask);
        if (err)
                return err;
        if (next == DIWARP_QPS_ERR) {
                dw_qp_to_error(qp, -1);
                return 0;
        }
        struct diwarp_qp_attr saved = qp->attr;
        int saved_mask = qp->attr_mask_set;
        struct sockaddr_in saved_peer = qp->peer;
        if (next == DIWARP_QPS_RESET) {
                dw_qp_reset_queues(qp);
                memset(&qp->attr, 0, sizeof(qp->attr));
                memset(&qp->peer, 0, sizeof(qp->peer));
        }
        dw_qp_modify_apply(qp, a, mask);
        qp->attr_mask_set |= mask & ~DIWARP_QP_EN_SQD_ASYNC_NOTIFY;
        qp->state = next;
        if (dw_qp_on_rd(qp) || dw_qp_is_rc(qp)) {
                /* The transport takes the new state, or the QP is as it was. */
                err = dw_qp_on_rd(qp) ? dw_rd_qp_modify(qp, cur, mask)
                                      : dw_rc_qp_modify(qp, cur, mask);
                if (err < 0) {
                        qp->state = cur;
                        qp->attr = saved;
                        qp->attr_mask_set = saved_mask;
                        qp->peer = saved_peer;
                        return err;
                }
                if (next == DIWARP_QPS_RESET && dw_qp_on_rd(qp))
                        dw_cm_qp_cancel(qp);
        }
        dw_qp_modify_sq(qp, a, mask, cur, next);
        dw_dbg("QP %#x: state %d -> %d", qp->qpn, cur, next);
        return 0;
}

int dw_qp_modify_internal(struct dw_qp *qp, const struct diwarp_qp_attr *attr, int mask)
{
        return dw_qp_modify_locked(qp, attr, mask);
}

int dwe_qp_modify(struct diwarp_qp *q, const struct diwarp_qp_attr *attr, int mask)
{
        struct dw_qp *qp = dw_qp_of(q);
        pthread_mutex_lock(&qp->dev->lock);
        int err = dw_qp_modify_locked(qp, attr, mask);
        pthread_mutex_unlock(&qp->dev->lock);
        return err;
}

int dwe_qp_query(struct diwarp_qp *q, struct diwarp_qp_attr *attr,
                 struct diwarp_qp_init_attr *init_attr)
{
        struct dw_qp *qp = dw_qp_of(q);
        pthread_mutex_lock(&qp->dev->lock);
        if (attr) {
                *attr = qp->attr;
                attr->qp_state = qp->state;
                attr->cur_qp_state = qp->state;
                attr->cap = qp->cap;
                if (!attr->port_num)
                        attr->port_num = 1;
                attr->en_sqd_async_notify = qp->sqd_notify;
                attr->sq_draining = qp->state == DIWARP_QPS_SQD && qp->sq_draining;
        }
        if (init_attr) {
                memset(init_attr, 0, sizeof(*init_attr));
                init_attr->qp_context = qp->qp_context;
                init_attr->send_cq = dw_cq_pub(qp->send_cq);
                init_attr->recv_cq = dw_cq_pub(qp->recv_cq);
                init_attr->srq = qp->srq ? dw_srq_pub(qp->srq) : NULL;
                init_attr->cap = qp->cap;
                init_attr->qp_type = qp->type;
                init_attr->sq_sig_all = qp->sq_sig_all;
        }
        pthread_mutex_unlock(&qp->dev->lock);
        return 0;
}

int dwe_qp_counters(struct diwarp_qp *q, struct diwarp_counters *out)
{
        struct dw_qp *qp = dw_qp_of(q);
        pthread_mutex_lock(&qp->dev->lock);
        *out = qp->ctr;
        pthread_mutex_unlock(&qp->dev->lock);
        return 0;
}

void dw_qp_stat_locked(const struct dw_qp *qp, struct diwarpdv_qp_stat *out)
{
        memset(out, 0, sizeof(*out));
        out->pid = (int32_t)getpid();
        out->qpn = qp->qpn;
        out->type = qp->type;
        out->state = qp->state;
        if (qp->type == DIWARP_QPT_RC || qp->type == DIWARP_QPT_UC) {
                out->peer_qpn = qp->attr.dest_qp_num;
                out->peer = qp->attr.dgid;
        }
        out->tx_packets = qp->ctr.tx_packets;
        out->tx_bytes = qp->ctr.tx_bytes;
        out->rx_packets = qp->ctr.rx_packets;
        out->rx_bytes = qp->ctr.rx_bytes;
        out->retransmits = qp->ctr.retransmits;
        out->rnr_naks = qp->ctr.rnr_naks;
}

int dwe_qp_stat(struct diwarp_qp *q, struct diwarpdv_qp_stat *out)
{
        struct dw_qp *qp = dw_qp_of(q);
        pthread_mutex_lock(&qp->dev->lock);
        dw_qp_stat_locked(qp, out);
        pthread_mutex_unlock(&qp->dev->lock);
        return 0;
}

/* ---- posting ---------------------------------------------------------------------- */

/* UD sends only (with Immediate, never Invalidate); UC has no Read or
 * Atomic (no responder answers); RC and RD take every send WR. */
static bool dw_opcode_ok(enum diwarp_qp_type type, int op)
{
        const struct dw_wr_op *o = dw_wr_op(op);
        switch (type) {
        case DIWARP_QPT_UD:
                return o->kind == DW_WR_SEND && !o->inval;
        case DIWARP_QPT_UC:
                return o->kind != DW_WR_INVALID && !o->response;
        case DIWARP_QPT_RC:
        case DIWARP_QPT_RD:
                return o->kind != DW_WR_INVALID;
        default:
                return false;
        }
}

/* A bind WR names a window of this device of the kind its path binds (type 2
 * through diwarp_post_send, type 1 through diwarp_mw_bind) and, unless it
 * unbinds, a region of this device. The rest is checked when it runs. */
static int dw_check_bind_wr(struct dw_qp *qp, const struct diwarp_send_wr *wr, int bind_kind)
{
        const struct dw_mr *mw = (const struct dw_mr *)wr->wr.bind_mw.mw;
        const struct dw_mr *mr = (const struct dw_mr *)wr->wr.bind_mw.bind_info.mr;
        const struct dw_mr_table *t = &qp->dev->mrs;
        /* Only slots of this device's table are looked at. */
        if (mw && (mw <= t->slots || mw > t->slots + t->max))
                mw = NULL;
        if (mr && (mr <= t->slots || mr > t->slots + t->max))
                mr = NULL;
        if (!mw || !mw->in_use || mw->kind != bind_kind) {
                dw_warn("QP %#x: bind WR %#llx: %s", qp->qpn, (unsigned long long)wr->wr_id,
                        bind_kind == DW_STAG_MW1
                            ? "not a type 1 memory window of this device"
                            : "not a type 2 memory window of this device (type 1 windows are "
                              "bound with ibv_bind_mw)");
                return -EINVAL;
        }
        if (wr->wr.bind_mw.bind_info.length && (!mr || !mr->in_use || mr->kind != DW_STAG_MR)) {
                dw_warn("QP %#x: bind WR %#llx of window STag %#x: no region of this device",
                        qp->qpn, (unsigned long long)wr->wr_id, mw->stag);
                return -EINVAL;
        }
        return 0;
}

static int dw_check_send_wr(struct dw_qp *qp, const struct diwarp_send_wr *wr, int bind_kind)
{
        if (wr->opcode == DIWARP_WR_BIND_MW) {
                if (!dw_opcode_ok(qp->type, wr->opcode))
                        return -EINVAL;
                return dw_check_bind_wr(qp, wr, bind_kind);
        }
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge ||
            (wr->num_sge > 0 && !wr->sg_list))
                return -EINVAL;
        if (!dw_opcode_ok(qp->type, wr->opcode))
                return -EINVAL;
        uint64_t total = 0;
        for (int i = 0; i < wr->num_sge; i++)
                total += wr->sg_list[i].length;
        if ((wr->send_flags & DIWARP_SEND_INLINE) && total > qp->cap.max_inline_data)
                return -EINVAL;
        if (qp->type == DIWARP_QPT_UD) {
                struct dw_ah *ah = wr->wr.ud.ah ? dw_ah_of(wr->wr.ud.ah) : NULL;
                if (!ah || ah->pd->dev != qp->dev)
                        return -EINVAL;
                if (wr->wr.ud.remote_qpn & ~DW_DGRAM_QPN_MASK)
                        return -EINVAL;
                uint64_t max =
                    dw_wr_op(wr->opcode)->imm ? DW_DGRAM_MAX_UD_MSG_IMM : DW_DGRAM_MAX_UD_MSG;
                if (qp->dev->seal.mac) /* DIWARP_AUTH: a longer trailer */
                        max -= DW_DGRAM_AUTH_LEN - DW_DGRAM_CRC_LEN;
                if (total > max)
                        return -EINVAL;
        } else if (qp->type == DIWARP_QPT_RD) {
                /* Send-type WRs carry their destination in wr.ud; RDMA and atomic
                 * WRs go through diwarpdv_post_send_rd (wr.wr is a union). */
                bool send = dw_wr_is_send(wr->opcode);
                if (dw_wr_op(wr->opcode)->kind != DW_WR_LOCAL && !send)
                        return -EINVAL;
                struct dw_ah *ah = wr->wr.ud.ah ? dw_ah_of(wr->wr.ud.ah) : NULL;
                if (send &&
                    (!ah || ah->pd->dev != qp->dev || (wr->wr.ud.remote_qpn & ~DW_DGRAM_QPN_MASK)))
                        return -EINVAL;
                if (total > DW_MAX_MSG_RC)
                        return -EINVAL;
        } else if (total > DW_MAX_MSG_RC) {
                return -EINVAL;
        }
        return 0;
}

/* The bind fields of a BIND_MW WQE (no SGEs; the union fields of the WQE
 * reused): rkey = the window's new STag (its index, the WR's key byte),
 * remote_addr = first TO, compare_add = length, swap = the region's STag,
 * imm_data = the window's access, invalidate_rkey = the window kind expected. */
static void dw_wqe_set_bind(struct dw_wqe *w, const struct diwarp_send_wr *wr, int bind_kind)
{
        const struct dw_mr *mw = (const struct dw_mr *)wr->wr.bind_mw.mw;
        const struct dw_mr *mr = (const struct dw_mr *)wr->wr.bind_mw.bind_info.mr;
        w->num_sge = 0;
        w->total_len = 0;
        w->rkey = (mw->stag & ~0xffu) | (wr->wr.bind_mw.rkey & 0xffu);
        w->remote_addr = wr->wr.bind_mw.bind_info.addr;
        w->compare_add = wr->wr.bind_mw.bind_info.length;
        w->swap = wr->wr.bind_mw.bind_info.length && mr ? mr->stag : 0;
        w->imm_data = (uint32_t)wr->wr.bind_mw.bind_info.access;
        w->invalidate_rkey = (uint32_t)bind_kind;
}

enum diwarp_wc_status dw_qp_run_local_wqe(struct dw_qp *qp, struct dw_wqe *w, char *why,
                                          size_t why_len)
{
        if (w->opcode == DIWARP_WR_LOCAL_INV) {
                enum dw_prot_status st =
                    dw_mr_invalidate_status(&qp->dev->mrs, w->invalidate_rkey, qp->pd, qp->qpn);
                if (st == DW_PROT_OK)
                        return DIWARP_WC_SUCCESS;
                snprintf(why, why_len, "Local Invalidate of STag %#x: %s", w->invalidate_rkey,
                         dw_prot_status_str(st));
                return DIWARP_WC_LOC_PROT_ERR;
        }
        struct dw_mw_bind b = {
            .new_stag = w->rkey,
            .mr_stag = (uint32_t)w->swap,
            .addr = w->remote_addr,
            .length = w->compare_add,
            .access = (int)w->imm_data,
        };
        const char *reason = "refused";
        if (dw_mw_bind(&qp->dev->mrs, (int)w->invalidate_rkey, qp->pd, qp->qpn, &b, &reason) == 0)
                return DIWARP_WC_SUCCESS;
        snprintf(why, why_len,
                 "bind of memory window STag %#x to region STag %#x [%#llx, +%llu): %s", b.new_stag,
                 b.mr_stag, (unsigned long long)b.addr, (unsigned long long)b.length, reason);
        return DIWARP_WC_MW_BIND_ERR;
}

/* ERR accepts work and flushes it, as ibverbs providers do. RC/UC also
 * accept work in RTR: an iWARP stream carries both directions once up, and
 * programs written for iWARP through the IB-style connect send from a QP they
 * leave in RTR (perftest's credit Writes on the receiving side). SQD queues
 * work that starts at SQD->RTS; SQE flushes it. */
static bool dw_qp_sq_accepts(const struct dw_qp *qp)
{
        return qp->state == DIWARP_QPS_RTS || qp->state == DIWARP_QPS_ERR ||
               qp->state == DIWARP_QPS_SQD || qp->state == DIWARP_QPS_SQE ||
               (qp->state == DIWARP_QPS_RTR && dw_qp_is_rc(qp));
}

/* Posts the list under the device lock; stops at the first WR refused.
 * bind_kind: the window type a BIND_MW WR may bind (type 2 through
 * post_send, type 1 through diwarp_mw_bind). */
static int dw_post_send_locked(struct dw_qp *qp, struct diwarp_send_wr *wr,
                               struct diwarp_send_wr **bad_wr, int bind_kind)
{
        struct dw_device *dev = qp->dev;
        int err = 0;
        for (; wr; wr = wr->next) {
                if (!dw_qp_sq_accepts(qp)) {
                        err = -EINVAL;
                        break;
                }
                err = dw_check_send_wr(qp, wr, bind_kind);
                if (err < 0)
                        break;
                struct dw_wqe *w = dw_wq_reserve(&qp->sq);
                if (!w && dw_qp_on_rd(qp) && dw_rd_sq_release(qp))
                        w = dw_wq_reserve(&qp->sq); /* held send completions made room */
                if (!w) {
                        err = -ENOMEM;
                        break;
                }
                if (wr->opcode == DIWARP_WR_BIND_MW) {
                        struct diwarp_send_wr nosge = *wr;
                        nosge.num_sge = 0;
                        nosge.send_flags &= ~DIWARP_SEND_INLINE;
                        err = dw_wqe_from_send_wr(&qp->sq, w, &nosge);
                        if (err == 0)
                                dw_wqe_set_bind(w, wr, bind_kind);
                } else {
                        err = dw_wqe_from_send_wr(&qp->sq, w, wr);
                }
                if (err < 0)
                        break;
                dw_wq_commit(&qp->sq);
                if (qp->state == DIWARP_QPS_ERR) {
                        dw_qp_flush(qp);
                } else if (qp->state == DIWARP_QPS_SQE) {
                        dw_qp_flush_sq(qp);
                } else if (dw_qp_on_rd(qp) || dw_qp_is_rc(qp)) {
                        int e = dw_qp_on_rd(qp) ? dw_rd_post_send(qp, w) : dw_rc_post_send(qp, w);
                        if (e < 0) {
                                char ip[INET_ADDRSTRLEN] = "?";
                                inet_ntop(AF_INET, &qp->peer.sin_addr, ip, sizeof(ip));
                                dw_warn("RC QP %#x peer %s:%u: transport refused a send: %s",
                                        qp->qpn, ip, ntohs(qp->peer.sin_port), strerror(-e));
                                dw_qp_to_error(qp, DIWARP_EVENT_QP_FATAL);
                        }
                }
        }
        if (err < 0 && bad_wr)
                *bad_wr = wr;
        if (qp->type == DIWARP_QPT_UD && qp->state == DIWARP_QPS_RTS && !qp->tx_pending)
                dw_ud_tx(qp, DW_PROGRESS_BUDGET);
        else if (dw_qp_on_rd(qp))
                dw_rd_tx_posted(qp);
        else if (dw_qp_is_rc(qp) && qp->state != DIWARP_QPS_ERR)
                dw_rc_tx_posted(qp);
        dw_progress_step_post(&dev->prog, DW_PROGRESS_BUDGET);
        return err;
}

/* Every check dw_post_send_locked makes, for the whole list, before any WR
 * is queued: the state, each WR, and room for all of them in the SQ. */
static int dw_post_send_check_all(struct dw_qp *qp, struct diwarp_send_wr *wr,
                                  struct diwarp_send_wr **bad_wr)
{
        uint32_t n = 0;
        int err = 0;
        for (; wr; wr = wr->next, n++) {
                if (!dw_qp_sq_accepts(qp)) {
                        err = -EINVAL;
                        break;
                }
                err = dw_check_send_wr(qp, wr, DW_STAG_MW2);
                if (err < 0)
                        break;
                if (n >= qp->sq.capacity - dw_wq_count(&qp->sq) &&
                    !(dw_qp_on_rd(qp) && dw_rd_sq_release(qp) &&
                      n < qp->sq.capacity - dw_wq_count(&qp->sq))) {
                        err = -ENOMEM;
                        break;
                }
        }
        if (err < 0 && bad_wr)
                *bad_wr = wr;
        return err;
}

int dwe_post_send_all(struct diwarp_qp *q, struct diwarp_send_wr *wr,
                      struct diwarp_send_wr **bad_wr)
{
        struct dw_qp *qp = dw_qp_of(q);
        pthread_mutex_lock(&qp->dev->lock);
        int err = dw_post_send_check_all(qp, wr, bad_wr);
        if (err == 0)
                err = dw_post_send_locked(qp, wr, bad_wr, DW_STAG_MW2);
        pthread_mutex_unlock(&qp->dev->lock);
        return err;
}

int dwe_post_send(struct diwarp_qp *q, struct diwarp_send_wr *wr, struct diwarp_send_wr **bad_wr)
{
        struct dw_qp *qp = dw_qp_of(q);
        pthread_mutex_lock(&qp->dev->lock);
        int err = dw_post_send_locked(qp, wr, bad_wr, DW_STAG_MW2);
        pthread_mutex_unlock(&qp->dev->lock);
        return err;
}

int dwe_mw_bind(struct diwarp_qp *q, struct diwarp_mw *mw, uint32_t rkey,
                const struct diwarp_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags)
{
        struct dw_qp *qp = dw_qp_of(q);
        struct diwarp_send_wr wr = {
            .wr_id = wr_id,
            .opcode = DIWARP_WR_BIND_MW,
            .send_flags = send_flags & (DIWARP_SEND_SIGNALED | DIWARP_SEND_FENCE),
        };
        wr.wr.bind_mw.mw = mw;
        wr.wr.bind_mw.rkey = rkey;
        wr.wr.bind_mw.bind_info = *info;
        pthread_mutex_lock(&qp->dev->lock);
        int err = dw_post_send_locked(qp, &wr, NULL, DW_STAG_MW1);
        pthread_mutex_unlock(&qp->dev->lock);
        return err;
}

int dwe_post_recv(struct diwarp_qp *q, struct diwarp_recv_wr *wr, struct diwarp_recv_wr **bad_wr)
{
        struct dw_qp *qp = dw_qp_of(q);
        int err = 0;
        struct dw_device *dev = qp->dev;
        pthread_mutex_lock(&dev->lock);
        for (; wr; wr = wr->next) {
                if (qp->srq || qp->state == DIWARP_QPS_RESET || dw_rd_mbox_app(qp)) {
                        err = -EINVAL;
                        break;
                }
                if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_recv_sge ||
                    (wr->num_sge > 0 && !wr->sg_list)) {
                        err = -EINVAL;
                        break;
                }
                struct dw_wqe *w = dw_wq_reserve(&qp->rq);
                if (!w && dw_qp_on_rd(qp) && dw_rd_rq_make_room(qp))
                        w = dw_wq_reserve(&qp->rq);
                if (!w) {
                        err = -ENOMEM;
                        break;
                }
                err = dw_wqe_from_recv_wr(&qp->rq, w, wr);
                if (err < 0)
                        break;
                dw_wq_commit(&qp->rq);
                if (qp->state == DIWARP_QPS_ERR)
                        dw_qp_flush(qp);
                else if (dw_qp_on_rd(qp))
                        dw_rd_post_recv(qp);
                else if (dw_qp_is_rc(qp))
                        dw_rc_post_recv(qp);
        }
        if (err < 0 && bad_wr)
                *bad_wr = wr;
        dw_progress_step_post(&dev->prog, DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&dev->lock);
        return err;
}
