/* What the criterion integration tests of UD share: a UD QP made on one CQ,
 * a buffer registered for local writes, and a UD QP taken through INIT (its
 * Q_Key, port 1), RTR and RTS, each step asserted. */
#ifndef DIWARP_TESTS_INTEGRATION_UD_RTS_H
#define DIWARP_TESTS_INTEGRATION_UD_RTS_H

#include <criterion/criterion.h>
#include <diwarp/diwarp.h>
#include <stdint.h>

/* A UD QP with cq for both queues, max_wr WRs and max_sge SGEs each. */
static inline struct diwarp_qp *ud_qp_make(struct diwarp_pd *pd, struct diwarp_cq *cq,
                                           uint32_t max_wr, uint32_t max_sge)
{
        struct diwarp_qp_init_attr ia = {.send_cq = cq,
                                         .recv_cq = cq,
                                         .qp_type = DIWARP_QPT_UD,
                                         .cap = {.max_send_wr = max_wr,
                                                 .max_recv_wr = max_wr,
                                                 .max_send_sge = max_sge,
                                                 .max_recv_sge = max_sge}};
        struct diwarp_qp *qp = NULL;
        cr_assert_eq(diwarp_qp_create(pd, &ia, &qp), 0);
        return qp;
}

/* buf registered for local writes in *mr; its lkey. */
static inline uint32_t ud_mr_local(struct diwarp_pd *pd, void *buf, size_t len,
                                   struct diwarp_mr **mr)
{
        cr_assert_eq(diwarp_mr_reg(pd, buf, len, (uintptr_t)buf, DIWARP_ACCESS_LOCAL_WRITE, mr), 0);
        struct diwarp_mr_info mi;
        cr_assert_eq(diwarp_mr_info(*mr, &mi), 0);
        return mi.lkey;
}

static inline void ud_qp_to_rts(struct diwarp_qp *qp, uint32_t qkey)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT, .qkey = qkey, .port_num = 1};
        cr_assert_eq(diwarp_qp_modify(qp, &a,
                                      DIWARP_QP_STATE | DIWARP_QP_QKEY | DIWARP_QP_PKEY_INDEX |
                                          DIWARP_QP_PORT),
                     0);
        a.qp_state = DIWARP_QPS_RTR;
        cr_assert_eq(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE), 0);
        a.qp_state = DIWARP_QPS_RTS;
        cr_assert_eq(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN), 0);
}

#endif
