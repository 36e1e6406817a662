/* What the criterion integration tests of UD share: a UD QP taken through
 * INIT (its Q_Key, port 1), RTR and RTS, each step asserted. */
#ifndef DIWARP_TESTS_INTEGRATION_UD_RTS_H
#define DIWARP_TESTS_INTEGRATION_UD_RTS_H

#include <criterion/criterion.h>
#include <diwarp/diwarp.h>
#include <stdint.h>

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
