/* api/: the one table of the native API's backends.
 *
 * Every public diwarp_* / diwarpdv_* function that depends on where the
 * work is done (api/api.c) checks its arguments and calls one entry of
 * struct dw_backend: the engine's (dwe_*, in qp/, rd/ and rc/) or the daemon
 * client's (dwc_*, in client/). The backend is chosen once per process
 * (dw_backend_get). Both backends include this header, so the compiler
 * checks their functions against the table.
 *
 * DW_BACKEND_VERBS lists the entries once: X(return type, name, (parameters)).
 * Adding a verb: a line here, its entry point in api/api.c, dwe_<name> in the
 * engine and dwc_<name> in client/.
 */
#ifndef DIWARP_API_BACKEND_H
#define DIWARP_API_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

/* clang-format off */
#define DW_BACKEND_VERBS(X)                                                                        \
        X(int, device_open, (const struct diwarp_open_opts *opts, struct diwarp_device **out))     \
        X(int, device_close, (struct diwarp_device *dev))                                          \
        X(int, device_query, (struct diwarp_device *dev, struct diwarp_device_attr *attr))         \
        X(int, device_gid, (struct diwarp_device *dev, union diwarp_gid *gid))                     \
        X(int, device_gid_table, (struct diwarp_device *dev, struct diwarp_netif *out, int max))   \
        X(int, device_rails, (struct diwarp_device *dev, struct diwarp_rail_stats *out, int max))  \
        X(int, device_port, (struct diwarp_device *dev, uint16_t *port, uint16_t *instance))       \
        X(int, device_counters, (struct diwarp_device *dev, struct diwarp_counters *out))          \
        X(int, progress, (struct diwarp_device *dev, int budget))                                  \
        X(int, progress_thread_start, (struct diwarp_device *dev))                                 \
        X(int, async_fd, (struct diwarp_device *dev))                                              \
        X(int, get_async_event, (struct diwarp_device *dev, struct diwarp_async_event *ev))        \
        X(int, pd_alloc, (struct diwarp_device *dev, struct diwarp_pd **out))                      \
        X(int, pd_dealloc, (struct diwarp_pd *pd))                                                 \
        X(int, mr_reg,                                                                             \
          (struct diwarp_pd *pd, void *addr, size_t length, uint64_t iova, int access,             \
           struct diwarp_mr **out))                                                                \
        X(int, mr_dereg, (struct diwarp_mr *mr))                                                   \
        X(int, mr_info, (const struct diwarp_mr *mr, struct diwarp_mr_info *info))                 \
        X(int, mr_rereg,                                                                           \
          (struct diwarp_mr *mr, int flags, struct diwarp_pd *pd, void *addr, size_t length,       \
           uint64_t iova, int access))                                                             \
        X(int, mw_alloc, (struct diwarp_pd *pd, enum diwarp_mw_type type, struct diwarp_mw **out)) \
        X(int, mw_dealloc, (struct diwarp_mw *mw))                                                 \
        X(int, mw_info, (const struct diwarp_mw *mw, struct diwarp_mw_info *info))                 \
        X(int, mw_bind,                                                                            \
          (struct diwarp_qp *qp, struct diwarp_mw *mw, uint32_t rkey,                              \
           const struct diwarp_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags))       \
        X(int, comp_channel_create, (struct diwarp_device *dev, struct diwarp_comp_channel **out)) \
        X(int, comp_channel_destroy, (struct diwarp_comp_channel *ch))                             \
        X(int, comp_channel_fd, (const struct diwarp_comp_channel *ch))                            \
        X(int, comp_channel_get_event,                                                             \
          (struct diwarp_comp_channel *ch, struct diwarp_cq **cq, void **cq_context))              \
        X(int, cq_create,                                                                          \
          (struct diwarp_device *dev, int cqe, void *cq_context,                                   \
           struct diwarp_comp_channel *channel, struct diwarp_cq **out))                           \
        X(int, cq_destroy, (struct diwarp_cq *cq))                                                 \
        X(int, cq_resize, (struct diwarp_cq *cq, int cqe))                                         \
        X(int, cq_poll, (struct diwarp_cq *cq, int n, struct diwarp_wc *wc))                       \
        X(int, cq_req_notify, (struct diwarp_cq *cq, bool solicited_only))                         \
        X(void, cq_ack_events, (struct diwarp_cq *cq, unsigned int nevents))                       \
        X(int, cq_cqe, (const struct diwarp_cq *cq))                                               \
        X(int, cq_set_timestamps, (struct diwarp_cq *cq, bool on))                                 \
        X(int, qp_create,                                                                          \
          (struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr, struct diwarp_qp **out))        \
        X(int, qp_destroy, (struct diwarp_qp *qp))                                                 \
        X(int, qp_modify, (struct diwarp_qp *qp, const struct diwarp_qp_attr *attr, int mask))     \
        X(int, qp_query,                                                                           \
          (struct diwarp_qp *qp, struct diwarp_qp_attr *attr,                                      \
           struct diwarp_qp_init_attr *init_attr))                                                 \
        X(uint32_t, qp_num, (const struct diwarp_qp *qp))                                          \
        X(enum diwarp_qp_state, qp_state, (const struct diwarp_qp *qp))                            \
        X(bool, qp_data_in_order, (const struct diwarp_qp *qp))                                    \
        X(int, qp_counters, (struct diwarp_qp *qp, struct diwarp_counters *out))                   \
        X(int, post_send,                                                                          \
          (struct diwarp_qp *qp, struct diwarp_send_wr *wr, struct diwarp_send_wr **bad_wr))      \
        X(int, post_send_all,                                                                      \
          (struct diwarp_qp *qp, struct diwarp_send_wr *wr, struct diwarp_send_wr **bad_wr))      \
        X(int, post_recv,                                                                          \
          (struct diwarp_qp *qp, struct diwarp_recv_wr *wr, struct diwarp_recv_wr **bad_wr))      \
        X(int, srq_create,                                                                         \
          (struct diwarp_pd *pd, struct diwarp_srq_attr *attr, void *srq_context,                 \
           struct diwarp_srq **out))                                                               \
        X(int, srq_destroy, (struct diwarp_srq *srq))                                              \
        X(int, srq_modify, (struct diwarp_srq *srq, const struct diwarp_srq_attr *attr, int mask)) \
        X(int, srq_query, (struct diwarp_srq *srq, struct diwarp_srq_attr *attr))                  \
        X(int, post_srq_recv,                                                                      \
          (struct diwarp_srq *srq, struct diwarp_recv_wr *wr, struct diwarp_recv_wr **bad_wr))    \
        X(int, ah_create,                                                                          \
          (struct diwarp_pd *pd, const union diwarp_gid *dgid, struct diwarp_ah **out))            \
        X(int, ah_destroy, (struct diwarp_ah *ah))                                                 \
        X(int, listen,                                                                             \
          (struct diwarp_device *dev, uint16_t port, int backlog, struct diwarp_listener **out))   \
        X(int, listener_destroy, (struct diwarp_listener *l))                                      \
        X(int, listener_fd, (const struct diwarp_listener *l))                                     \
        X(int, listener_get_request,                                                               \
          (struct diwarp_listener *l, int timeout_ms, struct diwarp_conn_request *req))            \
        X(int, accept,                                                                             \
          (struct diwarp_listener *l, uint64_t request_id, struct diwarp_qp *qp,                   \
           const struct diwarp_conn_param *reply))                                                 \
        X(int, reject,                                                                             \
          (struct diwarp_listener *l, uint64_t request_id, const void *private_data,               \
           uint16_t private_data_len))                                                             \
        X(int, connect,                                                                            \
          (struct diwarp_qp *qp, const union diwarp_gid *dgid, uint16_t port,                      \
           const struct diwarp_conn_param *param, int timeout_ms, void *reply_pd,                  \
           uint16_t *reply_pd_len))                                                                \
        X(int, disconnect, (struct diwarp_qp *qp))                                                 \
        X(int, post_send_rd,                                                                       \
          (struct diwarp_qp *qp, struct diwarp_send_wr *wr, const struct diwarpdv_rd_dest *dest,   \
           struct diwarp_send_wr **bad_wr))                                                        \
        X(int, qp_stat, (struct diwarp_qp *qp, struct diwarpdv_qp_stat *out))                     \
        X(int, query_rd_path,                                                                      \
          (struct diwarp_qp *qp, const struct diwarpdv_rd_dest *dest,                              \
           struct diwarpdv_rd_path *out))                                                          \
        X(int, mbox_open, (struct diwarp_qp *qp, struct diwarpdv_mbox *out))                       \
        X(int, mbox_release, (struct diwarp_qp *qp, const void *msg))                              \
        X(int, external_progress, (struct diwarp_device *dev))                                     \
        X(int, external_timeout, (struct diwarp_device *dev, int64_t *ns))                         \
        X(int, external_run, (struct diwarp_device *dev))
/* clang-format on */

#define DW_BACKEND_FIELD(ret, name, params) ret(*name) params;
struct dw_backend {
        const char *name; /* "engine" or "daemon client" */
        DW_BACKEND_VERBS(DW_BACKEND_FIELD)
};
#undef DW_BACKEND_FIELD

/* The two backends' functions. */
#define DW_BACKEND_PROTO(ret, name, params) ret dwe_##name params;
DW_BACKEND_VERBS(DW_BACKEND_PROTO)
#undef DW_BACKEND_PROTO
#define DW_BACKEND_PROTO(ret, name, params) ret dwc_##name params;
DW_BACKEND_VERBS(DW_BACKEND_PROTO)
#undef DW_BACKEND_PROTO

extern const struct dw_backend dw_engine_backend;
extern const struct dw_backend dw_client_backend;

/* The process's backend: chosen at the first call (dw_backend_select),
 * then one load. */
extern _Atomic(const struct dw_backend *) dw_backend_chosen;
const struct dw_backend *dw_backend_select(void);

static inline const struct dw_backend *dw_backend_get(void)
{
        const struct dw_backend *b = atomic_load_explicit(&dw_backend_chosen, memory_order_acquire);
        return __builtin_expect(b != NULL, 1) ? b : dw_backend_select();
}

#endif
