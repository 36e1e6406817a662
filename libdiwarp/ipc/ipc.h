/* ipc/: what a client process and the host daemon (diwarpd) say to each
 * other: the messages on the daemon's Unix socket, the shared-memory rings
 * of work requests and completions, and the checks the daemon applies to
 * everything a client sends (docs/PROTOCOL.md, "Daemon protocol").
 *
 * One SOCK_SEQPACKET connection per client device. Every request is one
 * message (a struct dw_ipc_req, at most DW_IPC_MAX_MSG bytes, up to
 * DW_IPC_MAX_FDS descriptors by SCM_RIGHTS) and gets one response
 * (struct dw_ipc_rsp, with up to DW_IPC_MAX_FDS descriptors). Objects are
 * named by handles of the client's own table in the daemon: a handle means
 * nothing on another connection, so a client can name only its own objects
 * and memory.
 *
 * Both ends run on one host and one kernel: integers are in host order.
 * Nothing here takes a lock or allocates; dw_ipc_req_check is pure.
 */
#ifndef DIWARP_IPC_IPC_H
#define DIWARP_IPC_IPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#define DW_IPC_MAGIC   0x31445744u /* "DWD1" in memory order */
#define DW_IPC_VERSION 1u
#define DW_IPC_MAX_MSG 4096u
#define DW_IPC_MAX_FDS 3
/* Largest inline data a send WR carries in the ring (DW_MAX_INLINE). */
#define DW_IPC_MAX_INLINE_COPY 512

enum dw_ipc_op {
        DW_IPC_OPEN = 1,       /* first request of a connection */
        DW_IPC_PD_ALLOC,       /* -> handle */
        DW_IPC_PD_DEALLOC,     /* handle */
        DW_IPC_SEG_ADD,        /* fd: a sealed memfd holding [base, base + len) of the client */
        DW_IPC_MR_REG,         /* -> handle, lkey */
        DW_IPC_MR_DEREG,       /* handle */
        DW_IPC_CHANNEL_CREATE, /* -> handle, fd: the channel's socket */
        DW_IPC_CHANNEL_DESTROY,
        DW_IPC_CQ_CREATE, /* -> handle, cqe, fd: the CQ's ring */
        DW_IPC_CQ_DESTROY,
        DW_IPC_QP_CREATE, /* -> handle, qpn, caps, fd: the SQ and RQ rings */
        DW_IPC_QP_DESTROY,
        DW_IPC_QP_MODIFY,
        DW_IPC_QP_QUERY,
        DW_IPC_SRQ_CREATE, /* -> handle, fd: the SRQ's ring */
        DW_IPC_SRQ_DESTROY,
        DW_IPC_SRQ_MODIFY,
        DW_IPC_SRQ_QUERY,
        DW_IPC_AH_CREATE,
        DW_IPC_AH_DESTROY,
        DW_IPC_COUNTERS, /* handle 0: the device; else a QP */
        DW_IPC_RD_PATH,
        DW_IPC_STAT,     /* the daemon's clients and their counters (diwarp stat) */
        DW_IPC_SHUTDOWN, /* diwarp daemon stop */
        DW_IPC_STAT_QPS, /* handle: the first QP to list, counting from 0 */
        DW_IPC_LISTEN,   /* -> handle, fd: a duplicate of the TCP listener (poll it) */
        DW_IPC_LISTENER_DESTROY,
        DW_IPC_GET_REQUEST, /* handle: the listener; never waits (-EAGAIN) */
        DW_IPC_ACCEPT,
        DW_IPC_REJECT,
        DW_IPC_CONNECT,    /* answered when connected, refused or timed out */
        DW_IPC_DISCONNECT, /* handle: the QP */
        DW_IPC_OP_END
};

/* ---- requests ------------------------------------------------------------ */

struct dw_ipc_hdr {
        uint32_t magic;
        uint16_t op;
        uint16_t len; /* bytes of the whole message */
        uint32_t seq; /* echoed in the response */
        uint32_t handle;
};

struct dw_ipc_open {
        uint32_t version;
        int32_t pid;
        char addr[16]; /* diwarp_open_opts.addr, "" = the daemon's default */
        uint16_t port_base;
        uint16_t pad;
};

struct dw_ipc_seg {
        uint64_t base; /* client address of byte 0 (page aligned) */
        uint64_t len;  /* bytes (whole pages) */
        uint32_t id;   /* the client's name for it (nonzero) */
        uint32_t nreplace;
        uint32_t replace[16]; /* segments this one covers, each once: their MRs move to it */
};

struct dw_ipc_mr_reg {
        uint32_t pd;
        uint32_t seg;
        uint64_t addr; /* client address */
        uint64_t len;
        uint64_t iova;
        int32_t access;
        uint32_t pad;
};

struct dw_ipc_cq_create {
        int32_t cqe;
        uint32_t channel; /* 0: none */
        uint64_t context; /* the client's cq_context, echoed in its events */
};

struct dw_ipc_qp_create {
        uint32_t pd;
        uint32_t send_cq, recv_cq, srq;
        uint32_t type; /* enum diwarp_qp_type */
        uint32_t sq_sig_all;
        struct diwarp_qp_cap cap;
};

struct dw_ipc_qp_modify {
        struct diwarp_qp_attr attr;
        int32_t mask;
};

struct dw_ipc_srq_create {
        uint32_t pd;
        struct diwarp_srq_attr attr;
};

struct dw_ipc_srq_modify {
        struct diwarp_srq_attr attr;
        int32_t mask;
};

struct dw_ipc_ah_create {
        uint32_t pd;
        union diwarp_gid dgid;
};

struct dw_ipc_rd_path {
        uint32_t ah; /* 0: RC over RD (the QP's one peer) */
        uint32_t remote_qpn;
        uint32_t remote_qkey;
};

struct dw_ipc_listen {
        uint16_t port;
        uint16_t pad;
        int32_t backlog;
};

/* ACCEPT, REJECT and CONNECT: the connection's parameters. */
struct dw_ipc_conn {
        uint32_t listener; /* ACCEPT, REJECT */
        uint32_t qp;       /* ACCEPT, CONNECT */
        uint64_t request_id;
        union diwarp_gid dgid, sgid; /* CONNECT; sgid only with has_sgid */
        uint16_t port;
        uint8_t ird, ord;
        uint8_t has_sgid;
        uint8_t pad[3];
        int32_t timeout_ms;
        uint16_t pd_len;
        uint8_t pd[DIWARP_MAX_PRIVATE_DATA];
};

struct dw_ipc_req {
        struct dw_ipc_hdr h;
        union {
                struct dw_ipc_open open;
                struct dw_ipc_seg seg;
                struct dw_ipc_mr_reg mr;
                struct dw_ipc_cq_create cq;
                struct dw_ipc_qp_create qp;
                struct dw_ipc_qp_modify qpm;
                struct dw_ipc_srq_create srq;
                struct dw_ipc_srq_modify srqm;
                struct dw_ipc_ah_create ah;
                struct dw_ipc_rd_path path;
                struct dw_ipc_listen listen;
                struct dw_ipc_conn conn;
        } u;
};

/* Bytes of a request of op (header and its payload); 0 for an unknown op. */
size_t dw_ipc_req_size(unsigned int op);

/* The daemon's decoder: checks a received message of len bytes that came
 * with nfds descriptors before anything acts on it: magic, op, length (exact
 * for op), the descriptor count op takes, and every field whose range does
 * not depend on the daemon's state (strings terminated, counts bounded,
 * access and type values known, segment page alignment). 0, or -EINVAL /
 * -EPROTO with *why a short constant reason. */
int dw_ipc_req_check(const void *msg, size_t len, int nfds, const char **why);

/* The operation's name for log lines ("SEG_ADD"); "unknown" for none. */
const char *dw_ipc_op_name(unsigned int op);

/* Descriptors op carries with the request. */
int dw_ipc_req_nfds(unsigned int op);

/* ---- responses ----------------------------------------------------------- */

struct dw_ipc_open_rsp {
        uint16_t port, instance;
        int32_t ngid;
        struct diwarp_netif gids[DIWARP_MAX_GIDS];
        union diwarp_gid gid;
        struct diwarp_device_attr attr;
        uint32_t server; /* the daemon's worker thread serving this client */
};

/* A shared ring's geometry inside the region a descriptor maps. */
struct dw_ipc_ring_geo {
        uint64_t off;        /* of the ring header */
        uint32_t entries;    /* a power of two */
        uint32_t entry_size; /* bytes, a multiple of 64 */
};

struct dw_ipc_qp_rsp {
        uint32_t qpn;
        struct diwarp_qp_cap cap;
        uint64_t map_len;
        struct dw_ipc_ring_geo sq, rq; /* rq.entries 0 with an SRQ */
};

struct dw_ipc_cq_rsp {
        int32_t cqe;
        uint64_t map_len;
        struct dw_ipc_ring_geo ring;
};

struct dw_ipc_srq_rsp {
        struct diwarp_srq_attr attr;
        uint64_t map_len;
        struct dw_ipc_ring_geo ring;
};

struct dw_ipc_qp_query_rsp {
        struct diwarp_qp_attr attr;
        struct diwarp_qp_cap cap;
        uint32_t state;
        uint32_t data_in_order;
};

/* One client as diwarp stat shows it. */
struct dw_ipc_stat_client {
        int32_t pid;
        uint32_t server;
        uint32_t nqp, ncq, nmr, npd;
        uint64_t mr_bytes;
        uint64_t posted_send, posted_recv, completions;
};

#define DW_IPC_STAT_MAX 32
struct dw_ipc_stat_rsp {
        int32_t daemon_pid;
        uint32_t nclients; /* connected; the first DW_IPC_STAT_MAX are listed */
        uint32_t nservers;
        uint64_t wakeups; /* the servers' sleeps ended */
        uint64_t requests;
        uint64_t rejected; /* malformed or refused requests */
        struct diwarp_counters dev;
        struct dw_ipc_stat_client c[DW_IPC_STAT_MAX];
};

/* QPs of every client, DW_IPC_STAT_QPS_MAX at a time (the public record). */
#define DW_IPC_STAT_QPS_MAX 24
struct dw_ipc_stat_qps_rsp {
        uint32_t total; /* QPs of every client */
        uint32_t n;     /* listed here, from the first asked for */
        struct diwarpdv_qp_stat q[DW_IPC_STAT_QPS_MAX];
};

struct dw_ipc_rsp {
        struct dw_ipc_hdr h; /* op | DW_IPC_RSP */
        int32_t status;      /* 0 or -errno */
        uint32_t handle;     /* the object created */
        uint32_t key;        /* MR: lkey = rkey */
        uint32_t pad;
        union {
                struct dw_ipc_open_rsp open;
                struct dw_ipc_qp_rsp qp;
                struct dw_ipc_cq_rsp cq;
                struct dw_ipc_srq_rsp srq;
                struct dw_ipc_qp_query_rsp qpq;
                struct diwarp_srq_attr srq_attr;
                struct diwarp_counters ctr;
                struct diwarpdv_rd_path path;
                struct dw_ipc_stat_rsp stat;
                struct dw_ipc_stat_qps_rsp qps;
                struct diwarp_conn_request creq;
                struct {
                        uint16_t len;
                        uint8_t data[DIWARP_MAX_PRIVATE_DATA];
                } reply_pd; /* CONNECT: the peer's reply private data */
        } u;
};
#define DW_IPC_RSP 0x8000u

/* ---- events (daemon -> client, on the event and channel sockets) -------- */

enum dw_ipc_ev_kind { DW_IPC_EV_DEV = 0, DW_IPC_EV_QP, DW_IPC_EV_CQ, DW_IPC_EV_SRQ };

struct dw_ipc_event {
        uint32_t type;   /* enum diwarp_event_type; a channel: 0 */
        uint32_t kind;   /* enum dw_ipc_ev_kind */
        uint32_t handle; /* the object's handle */
        uint32_t pad;
};

/* ---- shared memory --------------------------------------------------------
 * Single producer, single consumer. Each side keeps its own copy of the
 * index it owns and reads the other's with acquire; the daemon never trusts
 * an index a client wrote (it bounds it by the ring's size, which it keeps
 * itself). */
struct dw_ipc_ring {
        _Alignas(64) _Atomic uint32_t prod;
        _Alignas(64) _Atomic uint32_t cons;
        /* CQ rings: the client's request for an event (ibv_req_notify_cq):
         * 1 = next completion, 2 = next solicited; the daemon takes it. */
        _Alignas(64) _Atomic uint32_t arm;
        /* SQ/RQ rings: WRs the daemon posted that the engine took; the QP's
         * state as the daemon last saw it. */
        _Atomic uint32_t qp_state;
        /* CQ rings: client threads asleep on prod (a futex on the shared
         * page, dw_ipc_cq_nap) after a long run of empty polls; the daemon
         * wakes them when it moves prod while this is non-zero. Only a hint
         * to the daemon: it wakes, nothing else. */
        _Alignas(64) _Atomic uint32_t nappers;
};
#define DW_IPC_RING_HDR 256u
_Static_assert(sizeof(struct dw_ipc_ring) <= DW_IPC_RING_HDR, "ring header");

/* A client thread that found its CQ ring empty for a long run of polls
 * sleeps until the daemon moves prod from seen_prod, or ns passed. */
void dw_ipc_cq_nap(struct dw_ipc_ring *r, uint32_t seen_prod, long ns);

/* The daemon moved a CQ ring's prod: wakes the client threads napping on it
 * (one syscall, only while some nap). */
void dw_ipc_cq_published(struct dw_ipc_ring *r);

static inline void *dw_ipc_ring_entry(struct dw_ipc_ring *r, uint32_t entry_size, uint32_t entries,
                                      uint32_t i)
{
        return (uint8_t *)r + DW_IPC_RING_HDR + (size_t)(i & (entries - 1)) * entry_size;
}

/* A send WR in the SQ ring: the engine's WR minus its pointers. SGEs and
 * inline bytes follow (cap.max_send_sge SGEs, then cap.max_inline_data
 * bytes). */
struct dw_ipc_swr {
        uint64_t wr_id;
        uint32_t opcode, send_flags;
        uint32_t imm_data, invalidate_rkey;
        uint64_t remote_addr;
        uint64_t compare_add, swap;
        uint32_t rkey;
        uint32_t ah; /* handle; UD and RD */
        uint32_t remote_qpn, remote_qkey;
        uint32_t num_sge;
        uint32_t inline_len; /* with DIWARP_SEND_INLINE: bytes after the SGEs */
        uint32_t rd;         /* posted with diwarpdv_post_send_rd */
        uint32_t pad;
};

/* Whether a send WR's opcode is a Send (which, on a datagram QP posted
 * without diwarpdv_post_send_rd, carries its destination as wr.ud does). */
static inline bool dw_ipc_send_op(uint32_t opcode)
{
        return opcode == DIWARP_WR_SEND || opcode == DIWARP_WR_SEND_WITH_IMM ||
               opcode == DIWARP_WR_SEND_WITH_INV;
}

struct dw_ipc_rwr {
        uint64_t wr_id;
        uint32_t num_sge;
        uint32_t pad;
};

size_t dw_ipc_swr_size(const struct diwarp_qp_cap *cap);
size_t dw_ipc_rwr_size(uint32_t max_sge);
static inline struct diwarp_sge *dw_ipc_swr_sges(struct dw_ipc_swr *w)
{
        return (struct diwarp_sge *)(w + 1);
}
static inline struct diwarp_sge *dw_ipc_rwr_sges(struct dw_ipc_rwr *w)
{
        return (struct diwarp_sge *)(w + 1);
}

/* A server's page, mapped read-only by its clients. */
struct dw_ipc_server_page {
        _Alignas(64) _Atomic uint32_t sleeping; /* write the doorbell to wake it */
};

/* Size of a region of rings: DW_IPC_RING_HDR + entries * entry_size each,
 * rounded up to pages. */
uint64_t dw_ipc_ring_bytes(uint32_t entries, uint32_t entry_size);
/* The smallest power of two >= n (n >= 1, at most 2^31). */
uint32_t dw_ipc_pow2(uint32_t n);

/* ---- the socket ----------------------------------------------------------- */

/* Where the daemon listens: DIWARP_DAEMON_SOCKET, else
 * $XDG_RUNTIME_DIR/diwarpd.sock, else /run/diwarp/diwarpd.sock (-ENAMETOOLONG
 * when it does not fit a sockaddr_un). */
int dw_ipc_socket_path(char *out, size_t len);

/* One message with up to DW_IPC_MAX_FDS descriptors; nonblocking sends
 * (MSG_DONTWAIT) with dontwait. Returns bytes or -errno. */
ssize_t dw_ipc_send(int sock, const void *msg, size_t len, const int *fds, int nfds, bool dontwait);
/* Receives one message; descriptors land in fds[] (*nfds in: room, out:
 * count; any beyond the room are closed). 0 on end of stream, bytes, or
 * -errno (-EMSGSIZE: truncated message). */
ssize_t dw_ipc_recv(int sock, void *msg, size_t len, int *fds, int *nfds);

#endif
