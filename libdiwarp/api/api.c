/* The public entry points of the native API (include/diwarp/diwarp.h,
 * diwarpdv.h) whose work depends on the backend: each checks the arguments
 * the public contract defines, then makes one call through the process's
 * backend table (api/backend.h). The backends check only what is theirs
 * (their objects, states and limits). See api/README.md. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "api/backend.h"
#include "dw.h"

#define BE() dw_backend_get()

/* ---- devices ---------------------------------------------------------------- */

int diwarp_device_open(const struct diwarp_open_opts *opts, struct diwarp_device **out)
{
        if (!out || (opts && (opts->flags & ~(uint32_t)DIWARP_OPEN_FLAGS)))
                return -EINVAL;
        return BE()->device_open(opts, out);
}

int diwarp_device_close(struct diwarp_device *dev)
{
        if (!dev)
                return -EINVAL;
        return BE()->device_close(dev);
}

int diwarp_device_query(struct diwarp_device *dev, struct diwarp_device_attr *attr)
{
        if (!dev || !attr)
                return -EINVAL;
        return BE()->device_query(dev, attr);
}

int diwarp_device_gid(struct diwarp_device *dev, union diwarp_gid *gid)
{
        if (!dev || !gid)
                return -EINVAL;
        return BE()->device_gid(dev, gid);
}

int diwarp_device_gid_table(struct diwarp_device *dev, struct diwarp_netif *out, int max)
{
        if (!dev || max < 0 || (max > 0 && !out))
                return -EINVAL;
        return BE()->device_gid_table(dev, out, max);
}

int diwarp_device_gid_find(struct diwarp_device *dev, uint32_t addr, union diwarp_gid *gid)
{
        struct diwarp_netif t[DIWARP_MAX_GIDS];
        int n = diwarp_device_gid_table(dev, t, DIWARP_MAX_GIDS);
        if (n < 0)
                return n;
        if (!gid)
                return -EINVAL;
        for (int i = 0; i < n && i < DIWARP_MAX_GIDS; i++) {
                if (t[i].addr == addr) {
                        dw_ipv4_to_gid((struct in_addr){.s_addr = addr}, gid);
                        return i;
                }
        }
        return -ENOENT;
}

int diwarp_device_gid_of_socket(struct diwarp_device *dev, int fd, union diwarp_gid *gid)
{
        struct sockaddr_in me;
        socklen_t len = sizeof(me);
        if (getsockname(fd, (struct sockaddr *)&me, &len) == 0 && me.sin_family == AF_INET) {
                int idx = diwarp_device_gid_find(dev, me.sin_addr.s_addr, gid);
                if (idx != -ENOENT)
                        return idx;
        }
        int err = diwarp_device_gid(dev, gid);
        return err < 0 ? err : 0;
}

int diwarp_device_rails(struct diwarp_device *dev, struct diwarp_rail_stats *out, int max)
{
        if (!dev || max < 0 || (max > 0 && !out))
                return -EINVAL;
        return BE()->device_rails(dev, out, max);
}

int diwarp_device_port(struct diwarp_device *dev, uint16_t *port, uint16_t *instance)
{
        if (!dev)
                return -EINVAL;
        return BE()->device_port(dev, port, instance);
}

int diwarp_device_counters(struct diwarp_device *dev, struct diwarp_counters *out)
{
        if (!dev || !out)
                return -EINVAL;
        return BE()->device_counters(dev, out);
}

int diwarp_progress(struct diwarp_device *dev, int budget)
{
        if (!dev || budget < 0)
                return -EINVAL;
        return BE()->progress(dev, budget);
}

int diwarp_progress_thread_start(struct diwarp_device *dev)
{
        if (!dev)
                return -EINVAL;
        return BE()->progress_thread_start(dev);
}

int diwarp_async_fd(struct diwarp_device *dev)
{
        if (!dev)
                return -EINVAL;
        return BE()->async_fd(dev);
}

int diwarp_get_async_event(struct diwarp_device *dev, struct diwarp_async_event *ev)
{
        if (!dev || !ev)
                return -EINVAL;
        return BE()->get_async_event(dev, ev);
}

/* ---- protection domains, memory regions and windows -------------------------- */

int diwarp_pd_alloc(struct diwarp_device *dev, struct diwarp_pd **out)
{
        if (!dev || !out)
                return -EINVAL;
        return BE()->pd_alloc(dev, out);
}

int diwarp_pd_dealloc(struct diwarp_pd *pd)
{
        if (!pd)
                return -EINVAL;
        return BE()->pd_dealloc(pd);
}

int diwarp_mr_reg(struct diwarp_pd *pd, void *addr, size_t length, uint64_t iova, int access,
                  struct diwarp_mr **out)
{
        if (!pd || !out)
                return -EINVAL;
        return BE()->mr_reg(pd, addr, length, iova, access, out);
}

int diwarp_mr_dereg(struct diwarp_mr *mr)
{
        if (!mr)
                return -EINVAL;
        return BE()->mr_dereg(mr);
}

int diwarp_mr_info(const struct diwarp_mr *mr, struct diwarp_mr_info *info)
{
        if (!mr || !info)
                return -EINVAL;
        return BE()->mr_info(mr, info);
}

int diwarp_mr_rereg(struct diwarp_mr *mr, int flags, struct diwarp_pd *pd, void *addr,
                    size_t length, uint64_t iova, int access)
{
        if (!mr)
                return -EINVAL;
        return BE()->mr_rereg(mr, flags, pd, addr, length, iova, access);
}

int diwarp_mw_alloc(struct diwarp_pd *pd, enum diwarp_mw_type type, struct diwarp_mw **out)
{
        if (!pd || !out || (type != DIWARP_MW_TYPE_1 && type != DIWARP_MW_TYPE_2))
                return -EINVAL;
        return BE()->mw_alloc(pd, type, out);
}

int diwarp_mw_dealloc(struct diwarp_mw *mw)
{
        if (!mw)
                return -EINVAL;
        return BE()->mw_dealloc(mw);
}

int diwarp_mw_info(const struct diwarp_mw *mw, struct diwarp_mw_info *info)
{
        if (!mw || !info)
                return -EINVAL;
        return BE()->mw_info(mw, info);
}

int diwarp_mw_bind(struct diwarp_qp *qp, struct diwarp_mw *mw, uint32_t rkey,
                   const struct diwarp_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags)
{
        if (!qp || !mw || !info)
                return -EINVAL;
        return BE()->mw_bind(qp, mw, rkey, info, wr_id, send_flags);
}

/* ---- completion channels and CQs --------------------------------------------- */

int diwarp_comp_channel_create(struct diwarp_device *dev, struct diwarp_comp_channel **out)
{
        if (!dev || !out)
                return -EINVAL;
        return BE()->comp_channel_create(dev, out);
}

int diwarp_comp_channel_destroy(struct diwarp_comp_channel *ch)
{
        if (!ch)
                return -EINVAL;
        return BE()->comp_channel_destroy(ch);
}

int diwarp_comp_channel_fd(const struct diwarp_comp_channel *ch)
{
        if (!ch)
                return -EINVAL;
        return BE()->comp_channel_fd(ch);
}

int diwarp_comp_channel_get_event(struct diwarp_comp_channel *ch, struct diwarp_cq **cq,
                                  void **cq_context)
{
        if (!ch)
                return -EINVAL;
        return BE()->comp_channel_get_event(ch, cq, cq_context);
}

int diwarp_cq_create(struct diwarp_device *dev, int cqe, void *cq_context,
                     struct diwarp_comp_channel *channel, struct diwarp_cq **out)
{
        if (!dev || !out || cqe < 1)
                return -EINVAL;
        return BE()->cq_create(dev, cqe, cq_context, channel, out);
}

int diwarp_cq_destroy(struct diwarp_cq *cq)
{
        if (!cq)
                return -EINVAL;
        return BE()->cq_destroy(cq);
}

int diwarp_cq_resize(struct diwarp_cq *cq, int cqe)
{
        if (!cq || cqe < 1)
                return -EINVAL;
        return BE()->cq_resize(cq, cqe);
}

int diwarp_cq_poll(struct diwarp_cq *cq, int n, struct diwarp_wc *wc)
{
        if (!cq || n < 0 || (n > 0 && !wc))
                return -EINVAL;
        return BE()->cq_poll(cq, n, wc);
}

/* Whether a thread that arms a CQ asks for the short time slice
 * (DIWARP_WAITER_SLICE, read once: 1 by default, 0 leaves the thread's
 * scheduling alone). */
static bool dw_waiter_slice_wanted(void)
{
        static int wanted = -1; /* -1: not read yet */
        int w = __atomic_load_n(&wanted, __ATOMIC_RELAXED);
        if (w < 0) {
                const char *v = getenv("DIWARP_WAITER_SLICE");
                w = 1;
                if (v && !strcmp(v, "0"))
                        w = 0;
                else if (v && strcmp(v, "1"))
                        dw_warn("DIWARP_WAITER_SLICE=%s: expected 0 or 1; using 1", v);
                __atomic_store_n(&wanted, w, __ATOMIC_RELAXED);
        }
        return w;
}

/* A thread that arms a CQ is about to sleep on its completion channel.
 * Beside CPU hogs its wake-up (by the kernel, for the data it sleeps on in
 * ibv_get_cq_event; by the progress thread, when it polls the channel fd
 * itself) waited for a hog's time slice, where a blocking socket reader's
 * did not: event-driven ping-pongs took 3-4 times a blocking TCP
 * ping-pong. So the thread asks once for the short time slice, as the
 * progress thread does (diwarpdv_short_time_slice; docs/PERFORMANCE.md,
 * "Event-driven programs on a busy host"). */
static void dw_waiter_slice(void)
{
        static __thread bool asked;
        if (asked)
                return;
        asked = true;
        if (dw_waiter_slice_wanted())
                diwarpdv_short_time_slice();
}

int diwarp_cq_req_notify(struct diwarp_cq *cq, bool solicited_only)
{
        if (!cq)
                return -EINVAL;
        dw_waiter_slice();
        return BE()->cq_req_notify(cq, solicited_only);
}

void diwarp_cq_ack_events(struct diwarp_cq *cq, unsigned int nevents)
{
        if (cq)
                BE()->cq_ack_events(cq, nevents);
}

int diwarp_cq_cqe(const struct diwarp_cq *cq)
{
        if (!cq)
                return -EINVAL;
        return BE()->cq_cqe(cq);
}

int diwarp_cq_set_timestamps(struct diwarp_cq *cq, bool on)
{
        if (!cq)
                return -EINVAL;
        return BE()->cq_set_timestamps(cq, on);
}

/* ---- QPs ------------------------------------------------------------------------ */

int diwarp_qp_create(struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr, struct diwarp_qp **out)
{
        if (!pd || !attr || !out || !attr->send_cq || !attr->recv_cq)
                return -EINVAL;
        return BE()->qp_create(pd, attr, out);
}

int diwarpdv_create_qp(struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr,
                       struct diwarp_qp **out)
{
        if (!attr)
                return -EINVAL;
        attr->qp_type = DIWARP_QPT_RD;
        return diwarp_qp_create(pd, attr, out);
}

int diwarp_qp_destroy(struct diwarp_qp *qp)
{
        if (!qp)
                return -EINVAL;
        return BE()->qp_destroy(qp);
}

int diwarp_qp_modify(struct diwarp_qp *qp, const struct diwarp_qp_attr *attr, int mask)
{
        if (!qp || !attr)
                return -EINVAL;
        return BE()->qp_modify(qp, attr, mask);
}

int diwarp_qp_query(struct diwarp_qp *qp, struct diwarp_qp_attr *attr,
                    struct diwarp_qp_init_attr *init_attr)
{
        if (!qp)
                return -EINVAL;
        return BE()->qp_query(qp, attr, init_attr);
}

uint32_t diwarp_qp_num(const struct diwarp_qp *qp)
{
        return qp ? BE()->qp_num(qp) : 0;
}

enum diwarp_qp_state diwarp_qp_state(const struct diwarp_qp *qp)
{
        return qp ? BE()->qp_state(qp) : DIWARP_QPS_ERR;
}

bool diwarp_qp_data_in_order(const struct diwarp_qp *qp)
{
        return qp && BE()->qp_data_in_order(qp);
}

int diwarp_qp_counters(struct diwarp_qp *qp, struct diwarp_counters *out)
{
        if (!qp || !out)
                return -EINVAL;
        return BE()->qp_counters(qp, out);
}

/* ---- posting (the hot paths: the checks, then one indirect call) ------------- */

static int bad_send(struct diwarp_send_wr *wr, struct diwarp_send_wr **bad_wr)
{
        if (bad_wr)
                *bad_wr = wr;
        return -EINVAL;
}

static int bad_recv(struct diwarp_recv_wr *wr, struct diwarp_recv_wr **bad_wr)
{
        if (bad_wr)
                *bad_wr = wr;
        return -EINVAL;
}

int diwarp_post_send(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                     struct diwarp_send_wr **bad_wr)
{
        if (__builtin_expect(!qp || !wr, 0))
                return bad_send(wr, bad_wr);
        return BE()->post_send(qp, wr, bad_wr);
}

int diwarp_post_send_all(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                         struct diwarp_send_wr **bad_wr)
{
        if (!qp || !wr)
                return bad_send(wr, bad_wr);
        return BE()->post_send_all(qp, wr, bad_wr);
}

int diwarpdv_post_send_rd(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                          const struct diwarpdv_rd_dest *dest, struct diwarp_send_wr **bad_wr)
{
        if (__builtin_expect(!qp || !wr || !dest || !dest->ah, 0))
                return bad_send(wr, bad_wr);
        return BE()->post_send_rd(qp, wr, dest, bad_wr);
}

int diwarp_post_recv(struct diwarp_qp *qp, struct diwarp_recv_wr *wr,
                     struct diwarp_recv_wr **bad_wr)
{
        if (__builtin_expect(!qp || !wr, 0))
                return bad_recv(wr, bad_wr);
        return BE()->post_recv(qp, wr, bad_wr);
}

/* ---- SRQs and address handles ---------------------------------------------------- */

int diwarp_srq_create(struct diwarp_pd *pd, struct diwarp_srq_attr *attr, void *srq_context,
                      struct diwarp_srq **out)
{
        if (!pd || !attr || !out)
                return -EINVAL;
        return BE()->srq_create(pd, attr, srq_context, out);
}

int diwarp_srq_destroy(struct diwarp_srq *srq)
{
        if (!srq)
                return -EINVAL;
        return BE()->srq_destroy(srq);
}

int diwarp_srq_modify(struct diwarp_srq *srq, const struct diwarp_srq_attr *attr, int mask)
{
        if (!srq || !attr)
                return -EINVAL;
        return BE()->srq_modify(srq, attr, mask);
}

int diwarp_srq_query(struct diwarp_srq *srq, struct diwarp_srq_attr *attr)
{
        if (!srq || !attr)
                return -EINVAL;
        return BE()->srq_query(srq, attr);
}

int diwarp_post_srq_recv(struct diwarp_srq *srq, struct diwarp_recv_wr *wr,
                         struct diwarp_recv_wr **bad_wr)
{
        if (!srq || !wr)
                return bad_recv(wr, bad_wr);
        return BE()->post_srq_recv(srq, wr, bad_wr);
}

int diwarp_ah_create(struct diwarp_pd *pd, const union diwarp_gid *dgid, struct diwarp_ah **out)
{
        if (!pd || !dgid || !out)
                return -EINVAL;
        return BE()->ah_create(pd, dgid, out);
}

int diwarp_ah_destroy(struct diwarp_ah *ah)
{
        if (!ah)
                return -EINVAL;
        return BE()->ah_destroy(ah);
}

/* ---- connection management ------------------------------------------------------- */

int diwarp_listen(struct diwarp_device *dev, uint16_t port, int backlog,
                  struct diwarp_listener **out)
{
        if (!dev || !out)
                return -EINVAL;
        return BE()->listen(dev, port, backlog, out);
}

int diwarp_listener_destroy(struct diwarp_listener *l)
{
        if (!l)
                return -EINVAL;
        return BE()->listener_destroy(l);
}

int diwarp_listener_fd(const struct diwarp_listener *l)
{
        if (!l)
                return -EINVAL;
        return BE()->listener_fd(l);
}

int diwarp_listener_get_request(struct diwarp_listener *l, int timeout_ms,
                                struct diwarp_conn_request *req)
{
        if (!l || !req)
                return -EINVAL;
        return BE()->listener_get_request(l, timeout_ms, req);
}

int diwarp_accept(struct diwarp_listener *l, uint64_t request_id, struct diwarp_qp *qp,
                  const struct diwarp_conn_param *reply)
{
        if (!l || !qp || (reply && reply->private_data_len > DIWARP_MAX_PRIVATE_DATA))
                return -EINVAL;
        return BE()->accept(l, request_id, qp, reply);
}

int diwarp_reject(struct diwarp_listener *l, uint64_t request_id, const void *private_data,
                  uint16_t private_data_len)
{
        if (!l || private_data_len > DIWARP_MAX_PRIVATE_DATA)
                return -EINVAL;
        return BE()->reject(l, request_id, private_data, private_data_len);
}

int diwarp_connect(struct diwarp_qp *qp, const union diwarp_gid *dgid, uint16_t port,
                   const struct diwarp_conn_param *param, int timeout_ms, void *reply_pd,
                   uint16_t *reply_pd_len)
{
        if (!qp || !dgid || (param && param->private_data_len > DIWARP_MAX_PRIVATE_DATA)) {
                /* As after any failure before the peer's reply: no private data. */
                if (reply_pd_len)
                        *reply_pd_len = 0;
                return -EINVAL;
        }
        return BE()->connect(qp, dgid, port, param, timeout_ms, reply_pd, reply_pd_len);
}

int diwarp_disconnect(struct diwarp_qp *qp)
{
        if (!qp)
                return -EINVAL;
        return BE()->disconnect(qp);
}

int diwarpdv_qp_stat(struct diwarp_qp *qp, struct diwarpdv_qp_stat *out)
{
        if (!qp || !out)
                return -EINVAL;
        return BE()->qp_stat(qp, out);
}

/* ---- RD (diwarpdv.h) -------------------------------------------------------------- */

int diwarpdv_query_rd_path(struct diwarp_qp *qp, const struct diwarpdv_rd_dest *dest,
                           struct diwarpdv_rd_path *out)
{
        if (!qp || !out || (dest && !dest->ah))
                return -EINVAL;
        return BE()->query_rd_path(qp, dest, out);
}

int diwarpdv_mbox_open(struct diwarp_qp *qp, struct diwarpdv_mbox *out)
{
        if (!qp || !out)
                return -EINVAL;
        return BE()->mbox_open(qp, out);
}

int diwarpdv_mbox_release(struct diwarp_qp *qp, const void *msg)
{
        if (!qp || !msg)
                return -EINVAL;
        return BE()->mbox_release(qp, msg);
}

int diwarpdv_external_progress(struct diwarp_device *dev)
{
        if (!dev)
                return -EINVAL;
        return BE()->external_progress(dev);
}

int diwarpdv_external_timeout(struct diwarp_device *dev, int64_t *ns)
{
        if (!dev || !ns)
                return -EINVAL;
        return BE()->external_timeout(dev, ns);
}

int diwarpdv_external_run(struct diwarp_device *dev)
{
        if (!dev)
                return -EINVAL;
        return BE()->external_run(dev);
}
