/* Internal header of libdiwarp-verbs.so, the LD_PRELOAD ibverbs provider.
 *
 * Every ibverbs object we hand out is a wrapper that embeds the public
 * ibverbs struct (first member, so the application's pointer is the wrapper's)
 * with its public fields filled, plus the diwarp object it stands for.
 *
 * An object is ours when its context is one of our contexts, and a context is
 * ours when its device is diwarp0 (dwv_ctx_is_ours). Everything else is
 * forwarded to the real libibverbs, resolved by name and version (dwv_real).
 */
#ifndef DWV_PROVIDER_H
#define DWV_PROVIDER_H

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Binds the C function impl to the exported name@@version (the default
 * version, the one new links and LD_PRELOAD interposition resolve to). The
 * version script hides impl itself. */
#define DWV_SYMVER(impl, name, ver) __asm__(".symver " #impl ", " #name "@@" ver)

#define DWV_CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* ---- the device ---------------------------------------------------------
 * Laid out like rdma-core's private struct verbs_device (v44): code such as
 * mlx5dv_is_supported / efadv / ibv_get_device_index reads past struct
 * ibv_device, so those bytes must exist and hold harmless values. */
struct dwv_verbs_device {
        struct ibv_device device;
        const void *ops; /* points to a zeroed ops table whose first member is a name */
        int refcount;
        void *list_next, *list_prev;
        void *sysfs; /* NULL: "no sysfs", ibv_get_device_index returns -1 */
        uint64_t core_support;
};

/* The one diwarp device (diwarp0); static, initialised once, never freed. */
struct dwv_verbs_device *dwv_device(void);
/* The code at return address RET (a caller's __builtin_return_address(0))
 * is librdmacm's own (its rsocket service), not the program's: diwarp
 * serves it a few things the kernel would not (objects.c, rdmacm.c). */
bool dwv_called_from_librdmacm(const void *ret);
/* DIWARP_TRANSPORT=ib: the device reports InfiniBand transport (device.c). */
bool dwv_device_reports_ib(void);
static inline int dwv_dev_is_ours(const struct ibv_device *d)
{
        return d && d == &dwv_device()->device;
}
/* Stable node GUID (network order) derived from the device IPv4 address. */
uint64_t dwv_device_guid_be(void);
/* The interface of GID 0's address: the device's netdev ("lo" on a host with
 * loopback alone). */
const char *dwv_device_ifname(void);
/* The value of a device attribute file of sysfs (board_id, node_guid...):
 * its length, without newline, written to buf; -1 when there is no such
 * attribute. */
int dwv_sysfs_value(const char *file, char *buf, size_t size);
/* Once per process: removes the private sysfs trees (sysfs.c) that
 * processes of this user left when they were killed. */
void dwv_sysfs_clean_stale(void);

/* ---- the context -------------------------------------------------------- */
struct dwv_obj_link {
        struct dwv_obj_link *next, *prev;
};

struct dwv_context {
        struct verbs_context vctx; /* vctx.context is what applications see */
        struct diwarp_device *dev;
        /* Guards the lists below: every object of the context, for the
         * async-event lookup (qps, cqs, srqs) and for ibv_close_device,
         * which releases what the program left (dwv_release_all). */
        pthread_mutex_t objs_lock;
        struct dwv_obj_link qps, cqs, srqs, pds, mrs, mws, ahs, channels;
        uint32_t next_handle;
        /* The context rdmacm.c opened for every rdma_cm id: programs close
         * id->verbs at exit (perftest -R) while rdma_cm still uses it, so
         * ibv_close_device leaves it open. */
        bool keep_open;
};

static inline int dwv_ctx_is_ours(const struct ibv_context *ctx)
{
        return ctx && dwv_dev_is_ours(ctx->device);
}
static inline struct dwv_context *dwv_ctx(struct ibv_context *ctx)
{
        return DWV_CONTAINER(ctx, struct dwv_context, vctx.context);
}
uint32_t dwv_next_handle(struct dwv_context *c);
void dwv_link_add(struct dwv_context *c, struct dwv_obj_link *head, struct dwv_obj_link *l);
void dwv_link_del(struct dwv_context *c, struct dwv_obj_link *l);
/* Destroys every object still linked in the context (QPs, AHs, MRs, SRQs,
 * CQs, channels, PDs, in dependency order), as closing the device file does
 * on hardware. Returns how many there were. */
int dwv_release_all(struct dwv_context *c);

/* ---- wrappers ----------------------------------------------------------- */
struct dwv_pd {
        struct ibv_pd pd;
        struct diwarp_pd *d;
        struct dwv_obj_link link;
};

struct dwv_mr {
        struct ibv_mr mr;
        struct diwarp_mr *d;
        struct dwv_obj_link link;
};

struct dwv_mw {
        struct ibv_mw mw;
        struct diwarp_mw *d;
        struct dwv_obj_link link;
};

struct dwv_channel {
        struct ibv_comp_channel ch;
        struct diwarp_comp_channel *d;
        struct dwv_obj_link link;
};

struct dwv_cq {
        union {
                struct ibv_cq cq;
                struct ibv_cq_ex cqx; /* same leading fields; the rest for ibv_create_cq_ex */
        };
        struct diwarp_cq *d;
        struct dwv_obj_link link;
        unsigned events_got; /* channel events handed out (ibv_get_cq_event) */
        /* ibv_create_cq_ex only (extended.c): the completion start_poll or
         * next_poll took, which the read_* functions return; the lock held
         * from start_poll to end_poll (not with SINGLE_THREADED). */
        bool ex, ex_locked;
        uint64_t wc_flags;
        pthread_spinlock_t poll_lock;
        bool poll_open;       /* poll_lock held (start_poll .. end_poll) ... */
        pthread_t poll_owner; /* ... by this thread */
        struct diwarp_wc cur;
};

struct dwv_srq {
        struct ibv_srq srq;
        struct diwarp_srq *d;
        struct dwv_obj_link link;
};

struct dwv_ah {
        struct ibv_ah ah;
        struct diwarp_ah *d;
        struct dwv_obj_link link;
};

struct dwv_qp_ext;
struct dwv_qp {
        struct ibv_qp_ex qpx; /* qpx.qp_base is the application's struct ibv_qp */
        struct diwarp_qp *d;
        struct dwv_obj_link link;
        bool idle; /* in the INIT state it was created in, not yet modified */
        /* The wr_* batch of a QP created with send_ops_flags (extended.c);
         * NULL otherwise (ibv_qp_to_qp_ex then returns NULL). */
        struct dwv_qp_ext *x;
        /* rdma_cm connected this QP while it was the program's own (named
         * in conn_param->qp_num, not id->qp): the MPA exchange took it to
         * RTS, so the INIT/RTR/RTS steps librdmacm's flow then has the
         * program make with rdma_init_qp_attr's attributes find it there
         * (objects.c). Cleared by the step to RTS. */
        bool cm_readied;
};

static inline struct dwv_pd *dwv_pd(struct ibv_pd *p)
{
        return (struct dwv_pd *)p;
}
static inline struct dwv_cq *dwv_cq(struct ibv_cq *c)
{
        return (struct dwv_cq *)c;
}
static inline struct dwv_srq *dwv_srq(struct ibv_srq *s)
{
        return (struct dwv_srq *)s;
}
static inline struct dwv_qp *dwv_qp(struct ibv_qp *q)
{
        return (struct dwv_qp *)q;
}
static inline struct dwv_ah *dwv_ah(struct ibv_ah *a)
{
        return (struct dwv_ah *)a;
}

/* ---- forwarding to the real libibverbs ---------------------------------- */
/* dlvsym in libibverbs.so.1 (never ourselves); NULL (and a warning) if absent. */
void *dwv_real(const char *name, const char *version);

/* Declares a static accessor real_<name>() returning the real function,
 * resolved once. */
#define DWV_REAL(ret, name, ver, params)                                                           \
        typedef ret(*name##_real_fn) params;                                                       \
        static name##_real_fn real_##name(void)                                                    \
        {                                                                                          \
                static name##_real_fn fn;                                                          \
                name##_real_fn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);                         \
                if (!f) {                                                                          \
                        f = (name##_real_fn)dwv_real(#name, ver);                                  \
                        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);                                \
                }                                                                                  \
                return f;                                                                          \
        }

/* ---- data path (datapath.c): the ibv_context ops ------------------------ */
int dwv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int dwv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int dwv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int dwv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int dwv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

/* ---- memory windows (objects.c): ibv_context ops -------------------------- */
struct ibv_mw *dwv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int dwv_dealloc_mw(struct ibv_mw *mw);
int dwv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind);
/* Posts one bind of mw (type 1 or 2) on qp's send queue, the window taking
 * rkey's key byte: the legacy paths (ibv_bind_mw, IBV_WR_BIND_MW) share it,
 * and an extended QP's wr_bind_mw can call it. On success mw->rkey is the
 * window's new rkey. 0 or a positive errno (and errno set). */
int dwv_post_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t rkey,
                     const struct ibv_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags);

/* ---- extended QP and CQ (extended.c): verbs_context ops ----------------- */
struct ibv_qp *dwv_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr);
struct ibv_cq_ex *dwv_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr);
void dwv_qp_ext_free(struct dwv_qp *q);
/* For rdma_create_qp_ex: 0 or EOPNOTSUPP (with a warn line naming verb) for
 * send_ops_flags the QP type cannot carry; then the wr_* API on a QP made
 * with those capabilities (0 or ENOMEM). */
int dwv_send_ops_check(const char *verb, enum ibv_qp_type type, uint64_t ops);
int dwv_qp_ext_enable(struct ibv_qp *qp, uint64_t ops, const struct ibv_qp_cap *granted);
int dwv_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *values);
/* diwarp0's clock for completion timestamps: CLOCK_MONOTONIC in ns. */
#define DWV_HCA_CORE_CLOCK_KHZ 1000000u

/* objects.c's constructors, shared with extended.c. */
struct ibv_qp *dwv_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init);
int dwv_ibv_destroy_qp(struct ibv_qp *qp);
int dwv_ibv_destroy_cq(struct ibv_cq *cq);
struct dwv_cq *dwv_cq_new(struct ibv_context *ctx, int cqe, void *cq_context,
                          struct ibv_comp_channel *channel, int comp_vector);

/* ---- queries (device.c), also used as verbs_context ops ------------------ */
int dwv_query_port_ex(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr,
                      size_t attr_len);
int dwv_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
                        struct ibv_device_attr_ex *attr, size_t attr_size);

/* Sets errno from a negative diwarp return and returns the positive errno
 * (the convention of the int-returning verbs). */
static inline int dwv_errno(int neg)
{
        errno = -neg;
        return -neg;
}

#endif
