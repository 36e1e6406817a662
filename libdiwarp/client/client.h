/* client/: the native API in client mode (DIWARP_PROGRESS=daemon). The host
 * daemon (diwarpd) owns the sockets and runs the engine; here every verb is
 * either a request on the daemon's Unix socket (objects, state changes) or a
 * store into a shared-memory ring the daemon serves (posts, completions,
 * event arming). See client/README.md.
 *
 * The mode is the process's: dw_client_mode() is decided once, from the
 * environment, at the first call. The public functions of the engine route
 * to the dwc_ functions below when it is on; their handles are then client
 * objects, never engine ones.
 */
#ifndef DIWARP_CLIENT_CLIENT_H
#define DIWARP_CLIENT_CLIENT_H

#include <stdbool.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

/* Whether this process runs in client mode. The daemon itself calls
 * dw_client_mode_forbid() first, so the engine it runs is never routed. */
bool dw_client_mode(void);
void dw_client_mode_forbid(void);

int dwc_device_open(const struct diwarp_open_opts *opts, struct diwarp_device **out);
int dwc_device_close(struct diwarp_device *dev);
int dwc_device_query(struct diwarp_device *dev, struct diwarp_device_attr *attr);
int dwc_device_gid(struct diwarp_device *dev, union diwarp_gid *gid);
int dwc_device_gid_table(struct diwarp_device *dev, struct diwarp_netif *out, int max);
int dwc_device_port(struct diwarp_device *dev, uint16_t *port, uint16_t *instance);
int dwc_progress(struct diwarp_device *dev);
int dwc_pd_alloc(struct diwarp_device *dev, struct diwarp_pd **out);
int dwc_pd_dealloc(struct diwarp_pd *pd);
int dwc_mr_reg(struct diwarp_pd *pd, void *addr, size_t length, uint64_t iova, int access,
               struct diwarp_mr **out);
int dwc_mr_dereg(struct diwarp_mr *mr);
int dwc_mr_info(const struct diwarp_mr *mr, struct diwarp_mr_info *info);
int dwc_comp_channel_create(struct diwarp_device *dev, struct diwarp_comp_channel **out);
int dwc_comp_channel_destroy(struct diwarp_comp_channel *ch);
int dwc_comp_channel_fd(const struct diwarp_comp_channel *ch);
int dwc_comp_channel_get_event(struct diwarp_comp_channel *ch, struct diwarp_cq **cq,
                               void **cq_context);
int dwc_cq_create(struct diwarp_device *dev, int cqe, void *cq_context,
                  struct diwarp_comp_channel *channel, struct diwarp_cq **out);
int dwc_cq_destroy(struct diwarp_cq *cq);
int dwc_cq_poll(struct diwarp_cq *cq, int n, struct diwarp_wc *wc);
int dwc_cq_req_notify(struct diwarp_cq *cq, bool solicited_only);
void dwc_cq_ack_events(struct diwarp_cq *cq, unsigned int nevents);
int dwc_cq_cqe(const struct diwarp_cq *cq);
int dwc_qp_create(struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr, struct diwarp_qp **out);
int dwc_qp_destroy(struct diwarp_qp *qp);
int dwc_qp_modify(struct diwarp_qp *qp, const struct diwarp_qp_attr *attr, int mask);
int dwc_qp_query(struct diwarp_qp *qp, struct diwarp_qp_attr *attr,
                 struct diwarp_qp_init_attr *init_attr);
uint32_t dwc_qp_num(const struct diwarp_qp *qp);
enum diwarp_qp_state dwc_qp_state(const struct diwarp_qp *qp);
bool dwc_qp_data_in_order(const struct diwarp_qp *qp);
/* rd: diwarpdv_post_send_rd's destination, else NULL. all: all or nothing. */
int dwc_post_send(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                  const struct diwarpdv_rd_dest *rd, bool all, struct diwarp_send_wr **bad_wr);
int dwc_post_recv(struct diwarp_qp *qp, struct diwarp_recv_wr *wr, struct diwarp_recv_wr **bad_wr);
int dwc_srq_create(struct diwarp_pd *pd, struct diwarp_srq_attr *attr, void *srq_context,
                   struct diwarp_srq **out);
int dwc_srq_destroy(struct diwarp_srq *srq);
int dwc_srq_modify(struct diwarp_srq *srq, const struct diwarp_srq_attr *attr, int mask);
int dwc_srq_query(struct diwarp_srq *srq, struct diwarp_srq_attr *attr);
int dwc_post_srq_recv(struct diwarp_srq *srq, struct diwarp_recv_wr *wr,
                      struct diwarp_recv_wr **bad_wr);
int dwc_ah_create(struct diwarp_pd *pd, const union diwarp_gid *dgid, struct diwarp_ah **out);
int dwc_ah_destroy(struct diwarp_ah *ah);
int dwc_async_fd(struct diwarp_device *dev);
int dwc_get_async_event(struct diwarp_device *dev, struct diwarp_async_event *ev);
int dwc_device_counters(struct diwarp_device *dev, struct diwarp_counters *out);
int dwc_qp_counters(struct diwarp_qp *qp, struct diwarp_counters *out);
int dwc_query_rd_path(struct diwarp_qp *qp, const struct diwarpdv_rd_dest *dest,
                      struct diwarpdv_rd_path *out);
int dwc_listen(struct diwarp_device *dev, uint16_t port, int backlog, struct diwarp_listener **out);
int dwc_listener_destroy(struct diwarp_listener *l);
int dwc_listener_fd(const struct diwarp_listener *l);
int dwc_listener_get_request(struct diwarp_listener *l, int timeout_ms,
                             struct diwarp_conn_request *req);
int dwc_accept(struct diwarp_listener *l, uint64_t request_id, struct diwarp_qp *qp,
               const struct diwarp_conn_param *reply);
int dwc_reject(struct diwarp_listener *l, uint64_t request_id, const void *private_data,
               uint16_t private_data_len);
int dwc_connect(struct diwarp_qp *qp, const union diwarp_gid *dgid, uint16_t port,
                const struct diwarp_conn_param *param, int timeout_ms, void *reply_pd,
                uint16_t *reply_pd_len);
int dwc_disconnect(struct diwarp_qp *qp);
/* What client mode does not offer yet: logs once per name, -EOPNOTSUPP. */
int dwc_unsupported(const char *what);

/* diwarp stat: asks the daemon at path for its clients and counters. */
struct dw_ipc_stat_rsp;
int dwc_daemon_stat(struct dw_ipc_stat_rsp *out);
struct dw_ipc_stat_qps_rsp;
int dwc_daemon_stat_qps(uint32_t first, struct dw_ipc_stat_qps_rsp *out);
/* diwarp daemon stop. */
int dwc_daemon_shutdown(void);

#endif
