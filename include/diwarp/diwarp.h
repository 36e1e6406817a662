/* diwarp native API.
 *
 * The objects and their semantics mirror ibverbs one to one (device, PD, MR,
 * CQ with completion channel, QP with the RESET->INIT->RTR->RTS->ERR state
 * machine and its SQD / SQE states, SRQ, AH), and every enumeration has the numeric values of its
 * ibverbs counterpart, so the verbs provider maps calls without tables.
 *
 * Conventions: functions returning int return 0 (or a count) on success and a
 * negative errno on failure. Constructors return the object through an out
 * parameter. All calls are thread-safe, as ibverbs calls are. Each call that
 * touches a device may run a bounded step of its progress engine.
 */
#ifndef DIWARP_DIWARP_H
#define DIWARP_DIWARP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DIWARP_VERSION_MAJOR 0
#define DIWARP_VERSION_MINOR 1
#define DIWARP_VERSION_PATCH 0

/* "0.1.0" */
const char *diwarp_version(void);

struct diwarp_device;
struct diwarp_pd;
struct diwarp_mr;
struct diwarp_mw;
struct diwarp_cq;
struct diwarp_comp_channel;
struct diwarp_qp;
struct diwarp_srq;
struct diwarp_ah;
struct diwarp_listener;

/* ---- device ---------------------------------------------------------- */

/* GID: 16 bytes, network order. GID index 0 is the IPv4-mapped address of the
 * device (::ffff:a.b.c.d). */
union diwarp_gid {
        uint8_t raw[16];
        struct {
                uint64_t subnet_prefix;
                uint64_t interface_id;
        } global;
};

/* One IPv4 interface address of the host (its network namespace). */
#define DIWARP_MAX_GIDS 16
struct diwarp_netif {
        uint32_t addr;    /* IPv4, network order */
        uint32_t ifindex; /* the interface's index, 0 if unknown */
        char ifname[16];  /* the interface's name (IFNAMSIZ) */
        bool loopback;
};

/* The host's IPv4 addresses of interfaces that are up, in GID-table order:
 * the default route's interface first, loopback last (127.0.0.1 the very
 * last), the others by interface index. Writes the first max of them;
 * returns how many there are (at most DIWARP_MAX_GIDS) or -errno. */
int diwarp_host_netifs(struct diwarp_netif *out, int max);

struct diwarp_open_opts {
        /* IPv4 address of the device instance in dotted form, which pins the
         * device to that one address; NULL: DIWARP_ADDR, else every address of
         * the host (diwarp_host_netifs; 127.0.0.1 alone when none is up). */
        const char *addr;
        /* First UDP/TCP port tried; 0: DIWARP_PORT_BASE or the built-in default. */
        uint16_t port_base;
        /* DIWARP_OPEN_* flags; 0: none. An unknown flag: -EINVAL. */
        uint32_t flags;
};

/* Host-local traffic is one copy (as DIWARP_LOCAL_COPY=1 makes it:
 * docs/USAGE.md) on this device unless the environment sets
 * DIWARP_LOCAL_COPY, which wins: for a process that holds both ends of much
 * of its traffic (the host daemon). A daemon client's device ignores it: the
 * daemon's devices decide. */
#define DIWARP_OPEN_LOCAL_COPY (1u << 0)
#define DIWARP_OPEN_FLAGS      DIWARP_OPEN_LOCAL_COPY /* every flag */

/* Opens a device instance: binds one UDP socket and one TCP listener on the
 * first free port at or above the port base. opts may be NULL. */
int diwarp_device_open(const struct diwarp_open_opts *opts, struct diwarp_device **out);
int diwarp_device_close(struct diwarp_device *dev);

struct diwarp_device_attr {
        char fw_ver[64];
        uint64_t node_guid;
        uint32_t vendor_id;
        uint32_t vendor_part_id;
        uint32_t hw_ver;
        uint64_t max_mr_size;
        int max_qp;
        int max_qp_wr;
        int max_sge;
        int max_cq;
        int max_cqe;
        int max_mr;
        int max_pd;
        int max_qp_rd_atom; /* ORD */
        int max_qp_init_rd_atom;
        int max_res_rd_atom; /* IRD */
        int max_srq;
        int max_srq_wr;
        int max_srq_sge;
        int max_ah;
        uint32_t max_inline_data;
        uint32_t max_msg_size_rc;
        uint32_t max_msg_size_ud;
        bool atomics;
        int max_mw; /* memory windows share the STag table with regions */
};

int diwarp_device_query(struct diwarp_device *dev, struct diwarp_device_attr *attr);
/* GID index 0: the IPv4-mapped first address of the device's table. */
int diwarp_device_gid(struct diwarp_device *dev, union diwarp_gid *gid);
/* The device's GID table: the addresses it answers at, each GID index i the
 * IPv4-mapped out[i].addr. A device pinned to one address (opts->addr,
 * DIWARP_ADDR) has that one entry; otherwise the table is the host's
 * addresses when the device was opened (diwarp_host_netifs), and its sockets
 * are bound to the wildcard address so it is reachable at each of them.
 * Writes the first max entries; returns the table's length or -errno. */
int diwarp_device_gid_table(struct diwarp_device *dev, struct diwarp_netif *out, int max);
/* The GID index whose address is addr (IPv4, network order), its GID in
 * *gid: what a program uses when it reached its peer from that address over
 * another channel, as rdma_cm's route resolution picks the source GID.
 * -ENOENT when the table has no such address. On one host, traffic between
 * addresses of a non-loopback interface costs the kernel an uncached route
 * per datagram (about 0.25 us each way), traffic on 127.0.0.1 does not. */
int diwarp_device_gid_find(struct diwarp_device *dev, uint32_t addr, union diwarp_gid *gid);
/* diwarp_device_gid_find for the local address of a connected socket fd
 * (a side channel to the peer); GID index 0 when it is not an IPv4 socket or
 * the table lacks its address. Returns the index or -errno. */
int diwarp_device_gid_of_socket(struct diwarp_device *dev, int fd, union diwarp_gid *gid);
/* The instance's UDP/TCP port and its instance number (the high 12 bits of
 * every QPN it hands out). */
int diwarp_device_port(struct diwarp_device *dev, uint16_t *port, uint16_t *instance);

/* Runs up to budget units of progress work (receive batches, completions,
 * timers). Returns the amount of work done (>= 0) or -errno. */
int diwarp_progress(struct diwarp_device *dev, int budget);

/* Starts the device's progress thread now (idempotent; it runs until the
 * device closes), as DIWARP_PROGRESS=thread does at open. For callers that
 * must make progress while the application calls nothing, e.g. the target
 * of RDMA Reads and Writes that waits by polling memory (the verbs provider). */
int diwarp_progress_thread_start(struct diwarp_device *dev);

/* ---- protection domain and memory registration ------------------------ */

enum diwarp_access_flags {
        DIWARP_ACCESS_LOCAL_WRITE = 1,
        DIWARP_ACCESS_REMOTE_WRITE = 1 << 1,
        DIWARP_ACCESS_REMOTE_READ = 1 << 2,
        DIWARP_ACCESS_REMOTE_ATOMIC = 1 << 3,
        DIWARP_ACCESS_MW_BIND = 1 << 4,
        DIWARP_ACCESS_ZERO_BASED = 1 << 5,
};

int diwarp_pd_alloc(struct diwarp_device *dev, struct diwarp_pd **out);
/* -EBUSY while MRs, QPs, SRQs or AHs still use it. */
int diwarp_pd_dealloc(struct diwarp_pd *pd);

struct diwarp_mr_info {
        void *addr;
        size_t length;
        uint64_t iova; /* the address remote peers use as TO base */
        uint32_t lkey;
        uint32_t rkey; /* STag: 24-bit index << 8 | 8-bit random key */
        int access;
};

int diwarp_mr_reg(struct diwarp_pd *pd, void *addr, size_t length, uint64_t iova, int access,
                  struct diwarp_mr **out);
int diwarp_mr_dereg(struct diwarp_mr *mr);
int diwarp_mr_info(const struct diwarp_mr *mr, struct diwarp_mr_info *info);

/* What diwarp_mr_rereg changes (the values of IBV_REREG_MR_CHANGE_*). */
enum diwarp_rereg_flags {
        DIWARP_REREG_TRANSLATION = 1 << 0, /* addr, length, iova */
        DIWARP_REREG_PD = 1 << 1,
        DIWARP_REREG_ACCESS = 1 << 2,
};

/* Changes a region in place (ibv_rereg_mr): the parts flags names take the
 * new values, checked as diwarp_mr_reg checks them; the STag stays. -EINVAL
 * (flags 0 or unknown, a PD of another device, a value diwarp_mr_reg would
 * refuse): the region is unchanged. */
int diwarp_mr_rereg(struct diwarp_mr *mr, int flags, struct diwarp_pd *pd, void *addr,
                    size_t length, uint64_t iova, int access);

/* ---- memory windows (RFC 5040; the verbs' MW types 1 and 2B) -----------
 *
 * A window is an STag of its own for a subrange of a region registered with
 * DIWARP_ACCESS_MW_BIND, with its own remote rights; it grants remote access
 * only (never an lkey). Every remote access through it is checked against
 * its bounds and rights and against the region, which must still be valid.
 * A bind runs in order on the send queue of the QP it is posted on and
 * completes there (DIWARP_WC_BIND_MW; a refused bind: DIWARP_WC_MW_BIND_ERR,
 * and the QP goes to error). Each bind gives the window the key byte of the
 * rkey it names (with the window's own index), which must differ from the
 * current key: every STag handed out before dies.
 *
 * Type 1: bound with diwarp_mw_bind, belongs to its PD (any QP of the PD
 * serves it); a zero-length bind unbinds it; Local Invalidate and Send with
 * Invalidate refuse it ("STag cannot be invalidated").
 * Type 2: bound with a DIWARP_WR_BIND_MW work request, to the QP that posts
 * it (the only QP it serves, type 2B); Local Invalidate on that QP or a
 * Send with Invalidate arriving on it unbinds it; it must be unbound before
 * it is bound again. It is unbound when that QP is destroyed.
 *
 * diwarp_mr_dereg and diwarp_mr_rereg of a region with bound windows:
 * -EBUSY, as on hardware. */
enum diwarp_mw_type {
        DIWARP_MW_TYPE_1 = 1,
        DIWARP_MW_TYPE_2 = 2,
};

struct diwarp_mw_bind_info {
        struct diwarp_mr *mr; /* NULL allowed with length 0 */
        uint64_t addr;        /* first TO of the window, in the region's TOs */
        uint64_t length;      /* 0: unbind */
        int access;           /* DIWARP_ACCESS_REMOTE_*, ZERO_BASED; LOCAL_WRITE ignored */
};

struct diwarp_mw_info {
        uint32_t rkey; /* current STag: index << 8 | key */
        enum diwarp_mw_type type;
        bool bound;
        uint64_t addr; /* bound: first TO (0 with ZERO_BASED) */
        uint64_t length;
        int access;
};

/* -EINVAL (bad type), -ENOMEM (no STag left). The window starts unbound. */
int diwarp_mw_alloc(struct diwarp_pd *pd, enum diwarp_mw_type type, struct diwarp_mw **out);
/* Frees a window, bound or not; its STag dies at once. A bind still queued
 * for it then fails. */
int diwarp_mw_dealloc(struct diwarp_mw *mw);
int diwarp_mw_info(const struct diwarp_mw *mw, struct diwarp_mw_info *info);
/* Posts the bind of a type 1 window on qp's send queue (as ibv_bind_mw):
 * the window takes rkey's key byte when the bind runs. send_flags:
 * DIWARP_SEND_SIGNALED, DIWARP_SEND_FENCE. -EINVAL (not a type 1 window of
 * this device, QP state, a region of another device), -ENOMEM (queue full). */
int diwarp_mw_bind(struct diwarp_qp *qp, struct diwarp_mw *mw, uint32_t rkey,
                   const struct diwarp_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags);

/* ---- completion queues ------------------------------------------------ */

enum diwarp_wc_status {
        DIWARP_WC_SUCCESS = 0,
        DIWARP_WC_LOC_LEN_ERR = 1,
        DIWARP_WC_LOC_QP_OP_ERR = 2,
        DIWARP_WC_LOC_PROT_ERR = 4,
        DIWARP_WC_WR_FLUSH_ERR = 5,
        DIWARP_WC_MW_BIND_ERR = 6,
        DIWARP_WC_BAD_RESP_ERR = 7,
        DIWARP_WC_LOC_ACCESS_ERR = 8,
        DIWARP_WC_REM_INV_REQ_ERR = 9,
        DIWARP_WC_REM_ACCESS_ERR = 10,
        DIWARP_WC_REM_OP_ERR = 11,
        DIWARP_WC_RETRY_EXC_ERR = 12,
        DIWARP_WC_RNR_RETRY_EXC_ERR = 13,
        DIWARP_WC_REM_INV_RD_REQ_ERR = 15,
        DIWARP_WC_REM_ABORT_ERR = 16,
        DIWARP_WC_FATAL_ERR = 19,
        DIWARP_WC_RESP_TIMEOUT_ERR = 20,
        DIWARP_WC_GENERAL_ERR = 21,
};

const char *diwarp_wc_status_str(enum diwarp_wc_status status);

enum diwarp_wc_opcode {
        DIWARP_WC_SEND = 0,
        DIWARP_WC_RDMA_WRITE = 1,
        DIWARP_WC_RDMA_READ = 2,
        DIWARP_WC_COMP_SWAP = 3,
        DIWARP_WC_FETCH_ADD = 4,
        DIWARP_WC_BIND_MW = 5,
        DIWARP_WC_LOCAL_INV = 6,
        DIWARP_WC_RECV = 1 << 7,
        DIWARP_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
};

enum diwarp_wc_flags {
        DIWARP_WC_GRH = 1 << 0,
        DIWARP_WC_WITH_IMM = 1 << 1,
        DIWARP_WC_WITH_INV = 1 << 3,
};

struct diwarp_wc {
        uint64_t wr_id;
        enum diwarp_wc_status status;
        enum diwarp_wc_opcode opcode;
        uint32_t vendor_err; /* for Terminate-caused errors: layer << 12 | type << 8 | code */
        uint32_t byte_len;
        uint32_t imm_data;         /* network byte order, as in ibverbs */
        uint32_t invalidated_rkey; /* with DIWARP_WC_WITH_INV */
        uint32_t qp_num;
        uint32_t src_qp;
        unsigned int wc_flags;
        uint16_t pkey_index;
        uint16_t slid;
        uint8_t sl;
        uint8_t dlid_path_bits;
        /* On a CQ with timestamps on (diwarp_cq_set_timestamps): when the
         * completion was generated, CLOCK_MONOTONIC in ns; else 0. */
        uint64_t ts_ns;
};

/* A completion channel is a real file descriptor: poll it for POLLIN, then
 * call diwarp_comp_channel_get_event. */
int diwarp_comp_channel_create(struct diwarp_device *dev, struct diwarp_comp_channel **out);
int diwarp_comp_channel_destroy(struct diwarp_comp_channel *ch);
int diwarp_comp_channel_fd(const struct diwarp_comp_channel *ch);
/* Blocks unless the fd was made non-blocking (then -EAGAIN). */
int diwarp_comp_channel_get_event(struct diwarp_comp_channel *ch, struct diwarp_cq **cq,
                                  void **cq_context);

int diwarp_cq_create(struct diwarp_device *dev, int cqe, void *cq_context,
                     struct diwarp_comp_channel *channel, struct diwarp_cq **out);
/* -EBUSY while a QP or SRQ still uses it. */
int diwarp_cq_destroy(struct diwarp_cq *cq);
/* Room for cqe completions (1..max_cqe); those waiting stay, in order.
 * -EINVAL when cqe is out of range or below the completions waiting. */
int diwarp_cq_resize(struct diwarp_cq *cq, int cqe);
/* Returns the number of completions written (0..n) or -errno. Busy-polls: each
 * call runs a bounded progress step first. */
int diwarp_cq_poll(struct diwarp_cq *cq, int n, struct diwarp_wc *wc);
/* Arms the CQ: the next completion (solicited_only: the next solicited receive
 * or any error completion) writes one event to the CQ's channel. */
int diwarp_cq_req_notify(struct diwarp_cq *cq, bool solicited_only);
void diwarp_cq_ack_events(struct diwarp_cq *cq, unsigned int nevents);
int diwarp_cq_cqe(const struct diwarp_cq *cq);
/* Stamps each completion generated from now on with its time (ts_ns), or
 * stops. Off by default: a clock read per completion. */
int diwarp_cq_set_timestamps(struct diwarp_cq *cq, bool on);

/* ---- queue pairs ------------------------------------------------------ */

enum diwarp_qp_type {
        DIWARP_QPT_RC = 2,
        DIWARP_QPT_UC = 3, /* carried by the RC transport: stronger guarantees */
        DIWARP_QPT_UD = 4,
        DIWARP_QPT_RD = 0x100, /* reliable datagram, diwarp extension */
};

enum diwarp_qp_state {
        DIWARP_QPS_RESET = 0,
        DIWARP_QPS_INIT = 1,
        DIWARP_QPS_RTR = 2,
        DIWARP_QPS_RTS = 3,
        DIWARP_QPS_SQD = 4,
        DIWARP_QPS_SQE = 5,
        DIWARP_QPS_ERR = 6,
};

struct diwarp_qp_cap {
        uint32_t max_send_wr;
        uint32_t max_recv_wr;
        uint32_t max_send_sge;
        uint32_t max_recv_sge;
        uint32_t max_inline_data;
};

struct diwarp_qp_init_attr {
        void *qp_context;
        struct diwarp_cq *send_cq;
        struct diwarp_cq *recv_cq;
        struct diwarp_srq *srq;
        struct diwarp_qp_cap cap; /* in: requested; out: granted */
        enum diwarp_qp_type qp_type;
        bool sq_sig_all;
};

/* Mask bits of diwarp_qp_modify: the ibverbs IBV_QP_* values. */
enum diwarp_qp_attr_mask {
        DIWARP_QP_STATE = 1 << 0,
        DIWARP_QP_CUR_STATE = 1 << 1,
        DIWARP_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2, /* RTS->SQD: raise SQ_DRAINED */
        DIWARP_QP_ACCESS_FLAGS = 1 << 3,
        DIWARP_QP_PKEY_INDEX = 1 << 4,
        DIWARP_QP_PORT = 1 << 5,
        DIWARP_QP_QKEY = 1 << 6,
        DIWARP_QP_AV = 1 << 7,
        DIWARP_QP_PATH_MTU = 1 << 8,
        DIWARP_QP_TIMEOUT = 1 << 9,
        DIWARP_QP_RETRY_CNT = 1 << 10,
        DIWARP_QP_RNR_RETRY = 1 << 11,
        DIWARP_QP_RQ_PSN = 1 << 12,
        DIWARP_QP_MAX_QP_RD_ATOMIC = 1 << 13,
        DIWARP_QP_MIN_RNR_TIMER = 1 << 15,
        DIWARP_QP_SQ_PSN = 1 << 16,
        DIWARP_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
        DIWARP_QP_CAP = 1 << 19,
        DIWARP_QP_DEST_QPN = 1 << 20,
};

struct diwarp_qp_attr {
        enum diwarp_qp_state qp_state;
        enum diwarp_qp_state cur_qp_state;
        int qp_access_flags; /* remote rights granted; none until set (ACCESS_FLAGS) */
        uint32_t qkey;
        uint32_t dest_qp_num;
        union diwarp_gid dgid; /* with DIWARP_QP_AV: the peer's GID */
        uint8_t sgid_index;    /* with DIWARP_QP_AV: our GID (RC: the source address) */
        uint32_t path_mtu;     /* bytes */
        uint32_t rq_psn;
        uint32_t sq_psn;
        uint8_t max_rd_atomic;      /* ORD: outstanding RDMA Reads/atomics we issue */
        uint8_t max_dest_rd_atomic; /* IRD: ones we accept */
        uint8_t timeout;            /* IB encoding: 4.096 us * 2^timeout; 0 = default */
        uint8_t retry_cnt;
        uint8_t rnr_retry;
        uint8_t min_rnr_timer;
        uint8_t port_num;
        uint16_t pkey_index;
        struct diwarp_qp_cap cap;
        /* In: with DIWARP_QP_EN_SQD_ASYNC_NOTIFY on RTS->SQD, nonzero asks for
         * DIWARP_EVENT_SQ_DRAINED once the send queue is drained. Out (query):
         * nonzero while the QP is in SQD and WRs started before it still run. */
        uint8_t en_sqd_async_notify;
        uint8_t sq_draining;
};

int diwarp_qp_create(struct diwarp_pd *pd, struct diwarp_qp_init_attr *attr,
                     struct diwarp_qp **out);
int diwarp_qp_destroy(struct diwarp_qp *qp);
int diwarp_qp_modify(struct diwarp_qp *qp, const struct diwarp_qp_attr *attr, int mask);
int diwarp_qp_query(struct diwarp_qp *qp, struct diwarp_qp_attr *attr,
                    struct diwarp_qp_init_attr *init_attr);
uint32_t diwarp_qp_num(const struct diwarp_qp *qp);
enum diwarp_qp_state diwarp_qp_state(const struct diwarp_qp *qp);
/* Whether the bytes of one inbound RDMA Write or Send, or of the response to
 * one of our RDMA Reads, are placed in order (ibv_query_qp_data_in_order):
 * true for RC and UC over TCP (a stream, placed as it arrives), false for UD,
 * RD and RC over RD (datagrams are placed as they arrive, in any order). */
bool diwarp_qp_data_in_order(const struct diwarp_qp *qp);

struct diwarp_sge {
        uint64_t addr;
        uint32_t length;
        uint32_t lkey;
};

enum diwarp_wr_opcode {
        DIWARP_WR_RDMA_WRITE = 0,
        DIWARP_WR_RDMA_WRITE_WITH_IMM = 1,
        DIWARP_WR_SEND = 2,
        DIWARP_WR_SEND_WITH_IMM = 3,
        DIWARP_WR_RDMA_READ = 4,
        DIWARP_WR_ATOMIC_CMP_AND_SWP = 5,
        DIWARP_WR_ATOMIC_FETCH_AND_ADD = 6,
        DIWARP_WR_LOCAL_INV = 7,
        DIWARP_WR_BIND_MW = 8, /* type 2 windows; type 1: diwarp_mw_bind */
        DIWARP_WR_SEND_WITH_INV = 9,
};

enum diwarp_send_flags {
        DIWARP_SEND_FENCE = 1 << 0,
        DIWARP_SEND_SIGNALED = 1 << 1,
        DIWARP_SEND_SOLICITED = 1 << 2,
        DIWARP_SEND_INLINE = 1 << 3,
};

struct diwarp_send_wr {
        uint64_t wr_id;
        struct diwarp_send_wr *next;
        struct diwarp_sge *sg_list;
        int num_sge;
        enum diwarp_wr_opcode opcode;
        unsigned int send_flags;
        uint32_t imm_data;        /* network byte order */
        uint32_t invalidate_rkey; /* SEND_WITH_INV and LOCAL_INV */
        union {
                struct {
                        uint64_t remote_addr;
                        uint32_t rkey;
                } rdma;
                struct {
                        uint64_t remote_addr;
                        uint64_t compare_add;
                        uint64_t swap;
                        uint32_t rkey;
                } atomic;
                struct {
                        struct diwarp_ah *ah;
                        uint32_t remote_qpn;
                        uint32_t remote_qkey;
                } ud;
                struct {
                        struct diwarp_mw *mw;
                        uint32_t rkey; /* its key byte is the window's new key */
                        struct diwarp_mw_bind_info bind_info;
                } bind_mw;
        } wr;
};

struct diwarp_recv_wr {
        uint64_t wr_id;
        struct diwarp_recv_wr *next;
        struct diwarp_sge *sg_list;
        int num_sge;
};

/* On failure *bad_wr names the first WR not posted; those before it were. */
int diwarp_post_send(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                     struct diwarp_send_wr **bad_wr);
/* All or nothing: the whole list is checked (QP state, each WR, room in the
 * send queue for all of them) before any WR is queued. On failure nothing
 * was posted and *bad_wr names the first WR refused (-EINVAL, or -ENOMEM for
 * the first that would not fit). The batch of ibv_wr_complete. */
int diwarp_post_send_all(struct diwarp_qp *qp, struct diwarp_send_wr *wr,
                         struct diwarp_send_wr **bad_wr);
int diwarp_post_recv(struct diwarp_qp *qp, struct diwarp_recv_wr *wr,
                     struct diwarp_recv_wr **bad_wr);

/* ---- shared receive queues -------------------------------------------- */

struct diwarp_srq_attr {
        uint32_t max_wr;
        uint32_t max_sge;
        uint32_t srq_limit;
};

int diwarp_srq_create(struct diwarp_pd *pd, struct diwarp_srq_attr *attr, void *srq_context,
                      struct diwarp_srq **out);
int diwarp_srq_destroy(struct diwarp_srq *srq);
int diwarp_srq_modify(struct diwarp_srq *srq, const struct diwarp_srq_attr *attr, int mask);
int diwarp_srq_query(struct diwarp_srq *srq, struct diwarp_srq_attr *attr);
int diwarp_post_srq_recv(struct diwarp_srq *srq, struct diwarp_recv_wr *wr,
                         struct diwarp_recv_wr **bad_wr);

/* ---- address handles (UD, RD) ----------------------------------------- */

int diwarp_ah_create(struct diwarp_pd *pd, const union diwarp_gid *dgid, struct diwarp_ah **out);
int diwarp_ah_destroy(struct diwarp_ah *ah);

/* ---- asynchronous events ---------------------------------------------- */

enum diwarp_event_type {
        DIWARP_EVENT_CQ_ERR = 0,
        DIWARP_EVENT_QP_FATAL = 1,
        DIWARP_EVENT_QP_REQ_ERR = 2,
        DIWARP_EVENT_QP_ACCESS_ERR = 3,
        DIWARP_EVENT_COMM_EST = 4,
        DIWARP_EVENT_SQ_DRAINED = 5,
        DIWARP_EVENT_DEVICE_FATAL = 8,
        DIWARP_EVENT_PORT_ACTIVE = 9,
        DIWARP_EVENT_SRQ_ERR = 14,
        DIWARP_EVENT_SRQ_LIMIT_REACHED = 15,
        DIWARP_EVENT_QP_LAST_WQE_REACHED = 16,
};

struct diwarp_async_event {
        enum diwarp_event_type event_type;
        union {
                struct diwarp_qp *qp;
                struct diwarp_cq *cq;
                struct diwarp_srq *srq;
        } element;
};

/* A real fd: readable while events are pending. */
int diwarp_async_fd(struct diwarp_device *dev);
/* -EAGAIN when none is pending and the fd is non-blocking. */
int diwarp_get_async_event(struct diwarp_device *dev, struct diwarp_async_event *ev);

/* ---- native connection management (RC) -------------------------------- */

#define DIWARP_MAX_PRIVATE_DATA 512

struct diwarp_conn_param {
        const void *private_data;
        uint16_t private_data_len;
        uint8_t ird; /* responder resources: RDMA Reads we accept at once */
        uint8_t ord; /* initiator depth: RDMA Reads we issue at once */
        /* diwarp_connect: the address of ours the connection comes from, an
         * IPv4-mapped GID of the device's table; NULL: the one the route to
         * the peer picks (a pinned device: its address). */
        const union diwarp_gid *sgid;
};

/* Listens on addr:port (TCP) for MPA connection requests. */
int diwarp_listen(struct diwarp_device *dev, uint16_t port, int backlog,
                  struct diwarp_listener **out);
int diwarp_listener_destroy(struct diwarp_listener *l);
int diwarp_listener_fd(const struct diwarp_listener *l);

struct diwarp_conn_request {
        uint64_t id; /* opaque, passed to accept/reject */
        union diwarp_gid peer_gid;
        uint16_t peer_port;
        union diwarp_gid local_gid; /* the address of ours the peer connected to */
        uint8_t private_data[DIWARP_MAX_PRIVATE_DATA];
        uint16_t private_data_len;
        uint8_t ird, ord;
};

/* Waits up to timeout_ms (-1: forever) for a connection request. */
int diwarp_listener_get_request(struct diwarp_listener *l, int timeout_ms,
                                struct diwarp_conn_request *req);
/* qp (RC, in INIT) becomes RTS on success. reply may carry private data. */
int diwarp_accept(struct diwarp_listener *l, uint64_t request_id, struct diwarp_qp *qp,
                  const struct diwarp_conn_param *reply);
int diwarp_reject(struct diwarp_listener *l, uint64_t request_id, const void *private_data,
                  uint16_t private_data_len);
/* Connects qp (RC, INIT) to dgid:port. Completes within timeout_ms or fails
 * with -ETIMEDOUT; -ECONNREFUSED when the peer rejects (reply private data
 * copied to reply_pd). */
int diwarp_connect(struct diwarp_qp *qp, const union diwarp_gid *dgid, uint16_t port,
                   const struct diwarp_conn_param *param, int timeout_ms, void *reply_pd,
                   uint16_t *reply_pd_len);
int diwarp_disconnect(struct diwarp_qp *qp);

/* ---- counters --------------------------------------------------------- */

struct diwarp_counters {
        uint64_t tx_packets, tx_bytes;
        uint64_t rx_packets, rx_bytes;
        uint64_t retransmits;
        uint64_t crc_errors;
        uint64_t rx_dropped_malformed;
        uint64_t rx_dropped_no_qp;
        uint64_t rx_dropped_qkey;
        uint64_t rx_dropped_no_recv;
        uint64_t rx_dropped_duplicate;
        uint64_t rx_dropped_protection;
        uint64_t rnr_naks;
        uint64_t credit_stalls;
        uint64_t tx_backpressure;
        uint64_t fault_dropped, fault_duplicated, fault_reordered, fault_corrupted, fault_delayed;
        uint64_t terminates_sent, terminates_received;
        uint64_t rx_placed_direct; /* RD segments received straight into memory */
        /* Appended with RD congestion control (docs/USAGE.md: DIWARP_CC,
         * DIWARP_INFLIGHT_*, DIWARP_RD_PULL_*). The window and RTTs of a path
         * are in diwarpdv_query_rd_path; here the events, summed over the
         * device's paths (device) or counted for the QP. */
        uint64_t inflight_waits;     /* times a send WQE waited for an in-flight token */
        uint64_t cc_decrease_delay;  /* window decreases: queueing delay over the target */
        uint64_t cc_decrease_loss;   /* window decreases: a loss */
        uint64_t cc_rto;             /* window collapses after a retransmission timeout */
        uint64_t cc_window_waits;    /* sends held by a full window */
        uint64_t cc_pacing_waits;    /* sends held by pacing or a synchronised drain */
        uint64_t pulls;              /* receiver-paced Sends: RDMA Read Requests issued */
        uint64_t pull_bytes;         /* bytes those Reads fetched */
        uint64_t fault_slowrx_waits; /* receive steps DIWARP_FAULT=slowrx held back */
        uint64_t rx_dropped_nocrc;   /* RD datagrams without CRC32c refused (DIWARP_RD_CRC=1) */
        /* RD error NAKs that name no PSN their stream has outstanding, or
         * that come from another address than the peer's (forged). */
        uint64_t rx_dropped_nak;
        /* RD Sends (and Writes with Immediate) whose MSN lies beyond the
         * receive window: they would bind receive WRs for messages that
         * may never come. */
        uint64_t rx_dropped_msn;
        /* The credit-based mailbox receive ring (DIWARP_CREDIT); credit_stalls
         * above counts the times a Send waited for credits. */
        uint64_t mbox_parked;   /* Send segments parked for want of a receive WR */
        uint64_t credit_msgs;   /* stand-alone credit datagrams sent (thresholds reached) */
        uint64_t credit_probes; /* credit values asked for by a sender still waiting */
        /* RC Writes and Reads done as one copy between two ends in one
         * process (DIWARP_LOCAL_COPY, the host daemon), and their bytes. */
        uint64_t local_copies, local_copy_bytes;
        /* Times the progress thread found the application that was polling
         * no longer polling (descheduled on a shared host, or computing) and
         * took over all progress (docs/USAGE.md, "Progress"). */
        uint64_t progress_takeovers;
        /* Datagram paths (docs/SECURITY.md): RC-over-RD datagrams without
         * their connection's token or with a wrong one; RD datagrams naming
         * an origin (X-flag RAIL) that is no proven rail of that peer, and
         * rail lists with a wrong token; datagrams of a stranger's new RD
         * stream refused because the QP or the device holds as many streams
         * as DIWARP_RD_MAX_PEERS / DIWARP_RD_DEV_PEERS allow. */
        uint64_t rx_dropped_token;
        uint64_t rx_dropped_rail;
        uint64_t rx_dropped_peers;
        /* RD streams freed after DIWARP_RD_IDLE_MS without a datagram. */
        uint64_t rd_peers_reclaimed;
        /* Datagrams dropped by DIWARP_AUTH (docs/SECURITY.md): with a key,
         * those without a tag or whose tag does not verify; without one,
         * those that carry a tag. */
        uint64_t rx_dropped_auth;
        /* Times the parked progress thread woke to look whether the
         * application still polls (docs/USAGE.md, "Progress"). */
        uint64_t progress_park_wakes;
        /* Naps of a poller on a shared device that drove the device (slept
         * on its sockets and read what came itself) instead of waiting for
         * the progress thread (docs/USAGE.md, "Progress"). */
        uint64_t progress_nap_drives;
        /* Sleeps of a thread that drove the device from a wait (a napping
         * poller, an event-driven wait) that a transport's timer ended
         * rather than data: ACK delays, probes, retransmission timeouts
         * (docs/USAGE.md, "Progress"). */
        uint64_t progress_timer_wakes;
};

int diwarp_device_counters(struct diwarp_device *dev, struct diwarp_counters *out);

/* Multirail (DIWARP_ADDR=a,b,...): what left by each rail of the device,
 * summed over its peers, since it opened. A rail is down while at least one
 * peer's path over it is (its sends failed, or it stopped being
 * acknowledged); it is probed again and comes back up when it answers. */
#define DIWARP_MAX_RAILS 4
struct diwarp_rail_stats {
        uint32_t addr;     /* the rail's local IPv4 address, network order (DIWARP_ADDR's entry) */
        uint64_t tx_bytes; /* datagram payload bytes sent by the rail (first copies and resends) */
        uint64_t tx_packets;
        uint64_t retransmits; /* resends of datagrams first sent by the rail */
        uint64_t downs;       /* times a peer's path over the rail was found down */
        bool up;
};
/* Fills out[0..max) and returns the number of rails (1 for a device with a
 * single address or none pinned), or -errno. */
int diwarp_device_rails(struct diwarp_device *dev, struct diwarp_rail_stats *out, int max);
int diwarp_qp_counters(struct diwarp_qp *qp, struct diwarp_counters *out);

#ifdef __cplusplus
}
#endif

#endif
