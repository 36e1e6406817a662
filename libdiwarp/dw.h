/* Internal umbrella header of the engine: the device, QP, AH and SRQ objects
 * and the functions the generic QP code exposes to the transports (UD in
 * ud/, RD in rd/, RC in rc/), with the hooks it calls them by.
 *
 * Public handles are the internal objects themselves: a struct diwarp_qp * is
 * a struct dw_qp * (see the dw_*_of / dw_*_pub converters below), so the public
 * API needs no lookup tables.
 *
 * Locking: dev->lock guards everything reachable from a device. Every public
 * call takes it; the progress thread takes it for each bounded step. Every
 * dw_ function declared here expects the caller to hold it, unless its
 * comment says otherwise.
 */
#ifndef DIWARP_DW_H
#define DIWARP_DW_H

#include <diwarp/diwarp.h>

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "mem/mr.h"
#include "queue/cq.h"
#include "queue/event.h"
#include "queue/wq.h"
#include "flow/inflight.h"
#include "util/config.h"
#include "util/fault.h"
#include "util/log.h"
#include "llp/udp.h"
#include "progress/progress.h"
#include "rdmap/rdmap.h"
#include "wire/seal.h"

/* ---- limits --------------------------------------------------------- */

#define DW_QPN_INDEX_BITS  12
#define DW_QPN_INDEX_MASK  0xfffu
#define DW_MAX_QP          4096 /* per instance: the low 12 bits of the QPN */
#define DW_MAX_INSTANCE    4096 /* the high 12 bits of the QPN */
#define DW_FIRST_QP_INDEX  2    /* QPN 0 and 1 are never handed out */
#define DW_MAX_QP_WR       16384
#define DW_MAX_CQE         (1 << 20)
#define DW_MAX_CQ          65536 /* per instance */
#define DW_MAX_MR          (1 << 16)
#define DW_MAX_PD          1024
#define DW_MAX_SRQ         1024
#define DW_MAX_SRQ_WR      16384
#define DW_MAX_AH          (1 << 16)
#define DW_MAX_RD_ATOM     16
#define DW_MAX_MSG_RC      (1u << 31)
#define DW_GRH_LEN         40 /* UD receives start with a GRH, as on IB/RoCE */
#define DW_UD_DEFAULT_QKEY 0

static inline uint32_t dw_qpn_make(uint16_t instance, uint32_t index)
{
        return (uint32_t)instance << DW_QPN_INDEX_BITS | (index & DW_QPN_INDEX_MASK);
}

static inline uint16_t dw_qpn_instance(uint32_t qpn)
{
        return (uint16_t)((qpn >> DW_QPN_INDEX_BITS) & 0xfffu);
}

static inline uint32_t dw_qpn_index(uint32_t qpn)
{
        return qpn & DW_QPN_INDEX_MASK;
}

struct dw_device;
struct dw_qp;
struct dw_rc_conn;  /* per-QP RC connection state (llp/tcp.h, rc/rc.c) */
struct dw_rc_dev;   /* rc/cm.h: per-device RC/CM state */
struct dw_rd_qp;    /* rd/rd.c: per-QP RD state (RD QPs, RC over RD) */
struct dw_stat_dev; /* qp/stat_shm.h */

/* ---- device ----------------------------------------------------------- */

struct dw_device {
        pthread_mutex_t lock;
        struct dw_config cfg;
        uint16_t port;        /* UDP and TCP port: cfg.port_base + instance */
        uint16_t instance;    /* high 12 bits of every QPN */
        struct in_addr addr;  /* GID index 0's address: the device's identity */
        union diwarp_gid gid; /* ::ffff:a.b.c.d of addr */
        /* The sockets' address: addr when pinned (DIWARP_ADDR), else the
         * wildcard, so the device answers at every address of its table. */
        struct in_addr bind_addr;
        int ngid; /* GID table: gids[0..ngid), gids[0].addr == addr */
        struct diwarp_netif gids[DIWARP_MAX_GIDS];
        /* Multirail: DIWARP_ADDR's list, gids[0..nrails) (1: one rail, no
         * striping), and what left by each rail. */
        int nrails;
        struct dw_rail_ctr {
                uint64_t tx_bytes, tx_packets, retransmits, downs;
        } rail[DIWARP_MAX_RAILS];
        struct dw_udp udp;
        int tcp_listen_fd; /* instance TCP listener (IB-style RC connects, accepted by rc/cm.c) */
        struct dw_mr_table mrs;
        struct dw_async_queue async;
        struct dw_fault fault;
        bool fault_on;
        /* Every datagram's trailer is written and checked through this
         * (wire/seal.h): CRC32c, or none on RD with DIWARP_RD_CRC=0. */
        struct dw_seal seal;
        /* RC QPs over RD whose datagrams use their connection's key (rd/,
         * DIWARP_AUTH): while any, dw_ud_rx opens an RD datagram to one of
         * them with that key instead. */
        uint32_t conn_keys;
        struct dw_progress prog;
        struct dw_qp *qps[DW_MAX_QP]; /* by QPN index; [0], [1] stay NULL */
        uint32_t next_qp_index;       /* allocation cursor */
        unsigned tx_rr;               /* where dw_ud_tx_waiting resumes in qps[] (round-robin) */
        int nqp, npd, ncq, nsrq, nah, nchannel;
        uint32_t next_pd_handle;
        struct diwarp_counters ctr;
        /* The rate limit of the log lines a peer can cause per datagram
         * (util/log.h, dw_warn_limited). */
        struct dw_log_limit log_limit;
        struct dw_rc_dev *rc; /* rc/: device-wide RC/CM state (listeners, IB-style connects) */
        void *rd; /* rd/rd.c: device-wide RD state (active pseudo-streams, tx staging) */
        /* qp/stat_shm.c: this device as `diwarp stat` reads it (NULL: not
         * published) and its shm name. */
        struct dw_stat_dev *stat;
        char stat_name[64];
        struct dw_device *reg_next; /* device registry link */
};

/* ---- address handle --------------------------------------------------- */

struct dw_ah {
        struct dw_pd *pd;
        union diwarp_gid dgid;
        struct in_addr ip; /* from the IPv4-mapped dgid; port comes from the remote QPN */
};

/* ---- CQ, completion channel and SRQ wrappers ----------------------------
 * queue/ objects first, so a struct dw_cq * handed out by queue/ (e.g. by
 * dw_comp_channel_get_event) is also the public struct diwarp_cq *. */

struct dw_cq_obj {
        struct dw_cq cq;
        struct dw_device *dev;
};

struct dw_channel_obj {
        struct dw_comp_channel ch;
        struct dw_device *dev;
};

struct dw_srq_obj {
        struct dw_srq q; /* q.srq_context, q.use_count, q.limit */
        struct dw_device *dev;
        struct dw_pd *pd;
        uint32_t max_sge;
};

/* ---- queue pair --------------------------------------------------------- */

/* UD duplicate filter: a direct-mapped table of recently delivered messages,
 * keyed by (source IPv4, source port, source QPN, MSN). UD has no sequence
 * numbers of its own, but a datagram the network (or DIWARP_FAULT=dup)
 * duplicates carries the same MSN; senders start their MSN at a random value
 * so a restarted peer reusing a port and QPN is not mistaken for one. */
#define DW_UD_SEEN_SLOTS 256
struct dw_ud_seen {
        uint64_t addr;    /* ip << 16 | port; 0 = empty */
        uint64_t qpn_msn; /* src_qpn << 32 | msn */
};

struct dw_qp {
        struct dw_device *dev;
        struct dw_pd *pd;
        void *qp_context;
        enum diwarp_qp_type type;
        enum diwarp_qp_state state;
        uint32_t qpn;
        struct dw_cq *send_cq, *recv_cq;
        struct dw_srq_obj *srq; /* NULL: receives come from rq */
        struct dw_wq sq, rq;
        struct diwarp_qp_cap cap; /* granted */
        bool sq_sig_all;
        /* Attributes as last set through diwarp_qp_modify (qkey, dest_qp_num,
         * dgid, path_mtu, ORD/IRD, timeouts, access flags...). */
        struct diwarp_qp_attr attr;
        int attr_mask_set;       /* union of every mask applied since RESET */
        struct sockaddr_in peer; /* RC/RD: peer instance address (dgid ip, port of dest QPN) */
        uint32_t ud_msn;         /* UD: MSN of the next Send (DDP queue 0), random start */
        /* UD with DIWARP_LOCAL_COPY: the head Send waits for its local
         * destination's receive WQE until then (ud_tx_local); 0: not waiting. */
        uint64_t ud_hold_until;
        struct dw_ud_seen *ud_seen; /* UD: DW_UD_SEEN_SLOTS entries, duplicate filter */
        bool tx_pending;            /* UD: WQEs wait for socket room (back-pressure) */
        bool sq_draining;           /* SQD: WQEs started before SQD still run */
        bool sqd_notify;            /* SQD: raise SQ_DRAINED when sq_draining clears */
        /* UD transmit: the headers (datagram + DDP/RDMAP Send) of the last
         * message, reused with only the MSN rewritten while destination QPN,
         * qkey and opcode repeat (ud/ud.c). ud_hdr_op 0: empty. */
        uint8_t ud_hdr[48];
        uint8_t ud_hdr_len, ud_hdr_op;
        uint32_t ud_hdr_dst, ud_hdr_qkey;
        struct dw_seal_run ud_hdr_run; /* seal state over ud_hdr up to the MSN (ud/ud.c) */
        /* SRQ QPs: the receive WQE taken from the SRQ for the message being
         * placed (dw_qp_recv_head), so the transports see one API for RQ and SRQ. */
        struct dw_wqe srq_cur;
        bool srq_cur_valid;
        struct diwarp_counters ctr;
        struct dw_rc_conn *rc; /* RC connection state, NULL until dw_rc_qp_init sets it */
        struct dw_rd_qp *rd;   /* rd/rd.c: RD QPs and RC over RD; NULL otherwise */
};

/* The PD a receive WR's lkeys are checked in: a receive WR posted to an SRQ
 * is validated with the SRQ's PD, whatever the QP's (InfiniBand: the QP and
 * its SRQ may be in different PDs); one posted to the QP's own RQ with the
 * QP's. Every transport's placement into a receive WR takes its PD from
 * here; a send WR's SGEs (sources, Read sinks, atomic results) are the QP's. */
static inline const struct dw_pd *dw_qp_recv_pd(const struct dw_qp *qp)
{
        return qp->srq ? qp->srq->pd : qp->pd;
}

/* What rdmap/'s responder rules read of qp: its device's STag table, its
 * PD and QPN, and its remote rights (none until the application sets them,
 * as in ibverbs). */
static inline struct dw_rdmap_qp dw_rdmap_qp_of(struct dw_qp *qp)
{
        return (struct dw_rdmap_qp){
            .mrs = &qp->dev->mrs,
            .pd = qp->pd,
            .recv_pd = dw_qp_recv_pd(qp),
            .qpn = qp->qpn,
            .access = (qp->attr_mask_set & DIWARP_QP_ACCESS_FLAGS) ? qp->attr.qp_access_flags : 0,
        };
}

/* ---- converters between public handles and engine objects -------------- */

static inline struct dw_device *dw_dev_of(struct diwarp_device *d)
{
        return (struct dw_device *)d;
}
static inline struct diwarp_device *dw_dev_pub(struct dw_device *d)
{
        return (struct diwarp_device *)d;
}
static inline struct dw_qp *dw_qp_of(struct diwarp_qp *q)
{
        return (struct dw_qp *)q;
}
static inline struct diwarp_qp *dw_qp_pub(struct dw_qp *q)
{
        return (struct diwarp_qp *)q;
}
static inline struct dw_pd *dw_pd_of(struct diwarp_pd *p)
{
        return (struct dw_pd *)p;
}
static inline struct dw_cq_obj *dw_cq_of(struct diwarp_cq *c)
{
        return (struct dw_cq_obj *)c;
}
static inline struct diwarp_cq *dw_cq_pub(struct dw_cq *c)
{
        return (struct diwarp_cq *)c; /* dw_cq is the first member of dw_cq_obj */
}
static inline struct dw_srq_obj *dw_srq_of(struct diwarp_srq *s)
{
        return (struct dw_srq_obj *)s;
}
static inline struct diwarp_srq *dw_srq_pub(struct dw_srq_obj *s)
{
        return (struct diwarp_srq *)s;
}
static inline struct dw_ah *dw_ah_of(struct diwarp_ah *a)
{
        return (struct dw_ah *)a;
}

/* ---- device registry (qp/device.c) -------------------------------------
 * The one global besides the log level: every open device of the process.
 * Takes its own mutex, never waiting for a device lock under it.
 *
 * The device of this process whose UDP socket dst reaches (its port, and an
 * address of its own: the pinned one, or one of its GID table or loopback
 * when on the wildcard), with its lock: self as it is (the caller holds its
 * lock), another only when its lock is free (trylock; *locked is then set
 * and the caller unlocks). 0 and *out, -ENOENT (none), -EBUSY (its lock
 * is taken). */
int dw_registry_local(struct dw_device *self, const struct sockaddr_in *dst, struct dw_device **out,
                      bool *locked);

/* ---- in-flight caps of the process (qp/device.c, flow/inflight.h) -------
 * Messages in flight are capped per QP (DIWARP_INFLIGHT_QP), per process
 * (DIWARP_INFLIGHT_PROC) and per host (DIWARP_INFLIGHT_HOST, a token pool in
 * shared memory). The process state belongs to the registry; these take its
 * own lock, so call them with or without a device lock. */
/* Whether a process or host cap is in force. */
bool dw_host_capped(void);
/* Admits up to want messages of the QP: 0..want, or a negative errno. */
int dw_host_admit(struct dw_inflight_qp *q, uint32_t want, uint64_t now);
/* n admitted messages of the QP completed (or were flushed). */
void dw_host_complete(struct dw_inflight_qp *q, uint32_t n);
/* Once per step: deferred releases, the place in the host pool's line.
 * True while the process waits for host tokens (poll again soon). */
bool dw_host_poll(uint64_t now);
/* Nothing waits for tokens any more: leave the line. */
void dw_host_cancel(void);
/* The process's counters; -ENOENT when no process or host cap is set. */
int dw_host_counters(struct dw_inflight_counters *out);

/* ---- functions the generic QP code offers the transports (qp/qp.c) ----- */

/* QP of this device with that QPN (instance must match), or NULL. */
struct dw_qp *dw_qp_lookup(struct dw_device *dev, uint32_t qpn);
/* diwarp_device_counters / diwarp_device_rails with the device lock held. */
void dw_device_counters_locked(struct dw_device *dev, struct diwarp_counters *out);
int dw_device_rails_locked(struct dw_device *dev, struct diwarp_rail_stats *out, int max);
/* diwarpdv_qp_stat with the device lock held (pid: this process). */
void dw_qp_stat_locked(const struct dw_qp *qp, struct diwarpdv_qp_stat *out);

/* Writes a completion for a send WQE (if signaled or status != SUCCESS) and
 * pops it from the SQ; the WQE must be the SQ head (completions are in order). */
void dw_qp_complete_send(struct dw_qp *qp, enum diwarp_wc_status status, uint32_t byte_len);
/* The same, with wc.vendor_err = vendor_err on an error completion: RC puts
 * the received Terminate's layer << 12 | type << 8 | code there
 * (dw_term_vendor_err) for the WR the Terminate names. */
void dw_qp_complete_send_ve(struct dw_qp *qp, enum diwarp_wc_status status, uint32_t byte_len,
                            uint32_t vendor_err);

/* Runs a send WQE that moves nothing on the wire, in its place in the SQ:
 * Local Invalidate or Bind Memory Window. DIWARP_WC_SUCCESS, or the error
 * status (LOC_PROT_ERR, MW_BIND_ERR) with a reason naming the STags in why;
 * the transport completes the WQE and, on error, fails the QP. */
enum diwarp_wc_status dw_qp_run_local_wqe(struct dw_qp *qp, struct dw_wqe *w, char *why,
                                          size_t why_len);

/* diwarp_qp_modify without taking the lock: the same checks, attribute
 * updates and transport side effects (dw_rc_qp_modify). rc/rc.c moves natively
 * connected QPs through INIT -> RTR -> RTS with it (dw_rc_handover). */
int dw_qp_modify_internal(struct dw_qp *qp, const struct diwarp_qp_attr *attr, int mask);

/* Writes wc (qp_num is filled in) to the QP's receive CQ; solicited as the
 * message's SE bit says. Raises CQ_ERR on overflow. */
void dw_qp_complete_recv(struct dw_qp *qp, struct diwarp_wc *wc, bool solicited);

/* Completes receive WR wr_id with what d says (dw_qp_complete_recv; d is
 * rdmap/'s record, made by dw_rdmap_recv_end). The caller pops the WR.
 * Inline: RD's fast receive path calls it per message. */
static inline void dw_qp_recv_done(struct dw_qp *qp, uint64_t wr_id, const struct dw_recv_done *d,
                                   bool solicited)
{
        struct diwarp_wc wc = {
            .wr_id = wr_id,
            .status = d->status,
            .opcode = d->write_imm ? DIWARP_WC_RECV_RDMA_WITH_IMM : DIWARP_WC_RECV,
            .byte_len = d->byte_len,
            .imm_data = d->has_imm ? d->imm : 0,
            .invalidated_rkey = d->inval ? d->inval_rkey : 0,
            .wc_flags =
                (d->has_imm ? DIWARP_WC_WITH_IMM : 0u) | (d->inval ? DIWARP_WC_WITH_INV : 0u),
            .src_qp = d->src_qp,
            .vendor_err = d->vendor_err,
        };
        dw_qp_complete_recv(qp, &wc, solicited);
}

/* Head receive WQE, or NULL when none is posted. With an SRQ the WQE is taken
 * from the SRQ into qp->srq_cur on the first call (firing SRQ_LIMIT_REACHED if
 * due) and stays there until dw_qp_recv_pop, so a multi-segment message can
 * keep placing into it. dw_qp_recv_pop removes it (after its completion). */
struct dw_wqe *dw_qp_recv_head(struct dw_qp *qp);
void dw_qp_recv_pop(struct dw_qp *qp);

/* Pushes a completion to a CQ; on overflow raises CQ_ERR. */
void dw_cq_complete(struct dw_device *dev, struct dw_cq *cq, const struct diwarp_wc *wc,
                    bool solicited);

/* Moves the QP to ERR: flushes every outstanding send and receive WQE with
 * DIWARP_WC_WR_FLUSH_ERR, tells the transport (dw_rc_qp_error), and raises
 * event (pass -1 for none: e.g. the application asked for ERR). */
void dw_qp_to_error(struct dw_qp *qp, int event);

/* A UD send completed in error: flushes the rest of the SQ with
 * DIWARP_WC_WR_FLUSH_ERR and moves the QP to SQE (receives go on). */
void dw_qp_to_sqe(struct dw_qp *qp);

/* In SQD, raises SQ_DRAINED (if asked for) once no started send WQE is left.
 * The transports call it after retiring send WQEs (dw_qp_complete_send does
 * for the generic path). */
void dw_qp_sqd_check(struct dw_qp *qp);

/* Raises an async event for a QP / CQ / SRQ / the device. */
void dw_async_qp(struct dw_qp *qp, enum diwarp_event_type type);
void dw_async_cq(struct dw_device *dev, struct dw_cq *cq, enum diwarp_event_type type);
void dw_async_srq(struct dw_device *dev, struct dw_srq_obj *srq, enum diwarp_event_type type);
void dw_async_dev(struct dw_device *dev, enum diwarp_event_type type);

/* Address of a peer instance: ip + port_base + instance(qpn). */
void dw_peer_addr(const struct dw_device *dev, struct in_addr ip, uint32_t qpn,
                  struct sockaddr_in *out);
/* IPv4 of an IPv4-mapped GID; -EINVAL when the GID is not one. */
int dw_gid_to_ipv4(const union diwarp_gid *gid, struct in_addr *ip);
void dw_ipv4_to_gid(struct in_addr ip, union diwarp_gid *gid);
/* The address a QP speaks from: its AV's source GID (sgid_index of the
 * device's table) once it has one, else GID index 0. */
struct in_addr dw_qp_src_addr(const struct dw_qp *qp);

/* ---- UD (ud/ud.c) --------------------------------------------------------- */

/* Transmits queued UD sends of qp until the SQ is empty or the socket pushes
 * back. Returns work done. */
int dw_ud_tx(struct dw_qp *qp, int budget);
/* The sends of the QPs that wait for socket room (qp->tx_pending):
 * round-robin over them, resuming after the last QP served, each with a
 * fair share of the budget (the UD transport's tx hook). Work done. */
int dw_ud_tx_waiting(struct dw_device *dev, int budget);
/* Handles one received datagram (CRC not yet checked). */
void dw_ud_rx(struct dw_device *dev, uint8_t *pkt, size_t len, const struct sockaddr_in *from,
              uint64_t stamp);
/* Counts and logs (rate-limited) a datagram dw_seal_open refused for
 * DIWARP_AUTH (e: -ENOKEY, -EKEYREJECTED or -ENOPROTOOPT): under the
 * device's key (qp NULL), or under the connection key of the RC QP qp
 * (rd/'s dw_rd_rx_keyed). */
void dw_ud_rx_auth_fail(struct dw_device *dev, const struct dw_qp *qp, int e,
                        const struct sockaddr_in *from);

/* ---- hooks into the RD transport (implemented by rd/) ----------------------
 * The generic QP code calls these for QPs served by RD (DIWARP_QPT_RD, and
 * RC/UC QPs when DIWARP_RC_TRANSPORT=rd), the device code at open and close
 * and through the RD table it registers with the progress engine; lock held.
 * rd/rd.h has the entries the other transports use. */

/* True when this QP is served by the RD transport (qp->rd set at create). */
static inline bool dw_qp_on_rd(const struct dw_qp *qp)
{
        return qp->rd != NULL;
}

/* Whether a new QP of this type uses RD on this device. */
bool dw_rd_wanted(const struct dw_device *dev, enum diwarp_qp_type type);
/* Device close: frees the per-device RD state (dev->rd). */
void dw_rd_dev_fini(struct dw_device *dev);

/* QP create/destroy (qp->rd). -EOPNOTSUPP with an SRQ. */
int dw_rd_qp_init(struct dw_qp *qp);
void dw_rd_qp_fini(struct dw_qp *qp);
/* After a successful state change (qp->state is the new state). RC over RD:
 * RTR with AV + DEST_QPN creates the pseudo-stream (rx ISN rq_psn, tx ISN
 * sq_psn, which RTS may still set). RESET forgets every peer. */
int dw_rd_qp_modify(struct dw_qp *qp, enum diwarp_qp_state old_state, int mask);
/* Some send WQE has segments on the wire and is not retired yet (SQD drain). */
bool dw_rd_sq_busy(const struct dw_qp *qp);
/* A send WQE was committed: resolves its peer (creating it), assigns its
 * MSN. Transmission happens in dw_rd_progress. Negative: QP to ERR. */
int dw_rd_post_send(struct dw_qp *qp, struct dw_wqe *wqe);
/* After a post_send call queued its WQEs: when the newest is the only one
 * waiting, is a Send or Write that fits one datagram and its stream has window
 * room, it goes out now, ahead of the progress step (the latency path; the
 * same datagram, fault hook and accounting as dw_rd_progress would give it).
 * Otherwise, or when the socket pushes back, the progress step sends it. */
void dw_rd_tx_posted(struct dw_qp *qp);
/* Send completions the ACK of an incoming Send made are reported by the
 * caller's next call rather than in the step that received it (see
 * rd_retire_held); post_send, finding the SQ full, reports them at once to
 * make room: true when there were any. */
bool dw_rd_sq_release(struct dw_qp *qp);
void dw_rd_post_recv(struct dw_qp *qp);
/* The receive queue is full: frees the slots of WQEs that completed out of
 * order (rd_rq_compact). True when a slot is free now. */
bool dw_rd_rq_make_room(struct dw_qp *qp);
/* The QP is an application mailbox (diwarpdv_mbox_open): it takes no receive WRs. */
bool dw_rd_mbox_app(const struct dw_qp *qp);
/* Receives were posted to srq: Sends parked for its RD QPs go to them. */
void dw_rd_srq_posted(struct dw_device *dev, const struct dw_srq_obj *srq);
/* The QP goes to ERR (called before the WQEs are flushed). */
void dw_rd_qp_error(struct dw_qp *qp);

/* Called as a progress step starts receiving: when RD QPs exist, reads the
 * clock that the step's first RD datagram will use, so that datagram is not
 * kept waiting for it. */
void dw_rd_rx_clock(struct dw_device *dev);
/* Receives the next datagram straight into its target when it is a large
 * RDMA Write segment (and large ones were arriving): 1 done, 0 use the batch
 * receive (always with DIWARP_RD_DIRECT=0), 2 receive one datagram the
 * ordinary way, -1 nothing is waiting. */
int dw_rd_rx_direct(struct dw_device *dev);
/* Transmit new segments, run rel/ timers (retransmissions, ACKs), and ask the
 * progress engine for a step at the next deadline. Returns work done. */
int dw_rd_progress(struct dw_device *dev, int budget);

/* Adds the device's congestion-control counts (every path it has had) to
 * out's cc_* fields. */
void dw_rd_dev_counters(struct dw_device *dev, struct diwarp_counters *out);
/* Multirail: down[r] = some peer's path over rail r is down now. */
void dw_rd_rails_down(struct dw_device *dev, bool down[DIWARP_MAX_RAILS]);

/* ---- hooks into the RC transport (implemented by rc/rc.c) ------------------
 * The generic QP code calls these for RC (and UC) QPs only, lock held. */

/* At create (RC QP, state RESET): allocate qp->rc. */
int dw_rc_qp_init(struct dw_qp *qp);
/* At destroy: free qp->rc and end the connection. Returns the socket of a
 * stream that was up or closing (else -1), for dw_rc_close_lingering once
 * the device lock is released. */
int dw_rc_qp_fini(struct dw_qp *qp);
/* Closes that socket in order (no lock held): FIN, and what the peer still
 * sends is read away until it has taken what we sent (bounded: 2 s, 50 ms
 * on an external device, a daemon's). */
void dw_rc_close_lingering(int fd, bool external);
/* After a successful state change (qp->state already = new state, qp->attr
 * updated). E.g. RTR with DEST_QPN + AV starts the IB-style connect. A
 * negative return fails the modify (the state is restored by the caller). */
int dw_rc_qp_modify(struct dw_qp *qp, enum diwarp_qp_state old_state, int mask);
/* A send WQE was committed to qp->sq (it stays there until completed with
 * dw_qp_complete_send, in order). Transmits nothing: dw_rc_tx_posted does,
 * once the whole list of the post is in the SQ. The post itself has
 * succeeded already; a negative return moves the QP to ERR (QP_FATAL),
 * which flushes the WQE. */
int dw_rc_post_send(struct dw_qp *qp, struct dw_wqe *wqe);
/* The end of a post_send: the WQEs it committed go out in one batch (one
 * writev for a list of WRs, not one each), unless a batch is still being
 * written; that batch's end picks them up. */
void dw_rc_tx_posted(struct dw_qp *qp);
/* A receive WQE was committed (the RC receive path takes it with dw_qp_recv_head). */
void dw_rc_post_recv(struct dw_qp *qp);
/* The QP went to ERR (by the application or an error): tear the stream down.
 * Called before the WQEs are flushed. */
void dw_rc_qp_error(struct dw_qp *qp);
/* Bounded RC progress: socket I/O, timers. Returns work done. */
int dw_rc_progress(struct dw_device *dev, int budget);
/* Application-driven steps: reads the live RC streams directly (one recvmsg
 * each, no epoll). Returns work done, or -1 when there are more live streams
 * than it polls this way: the caller then looks at them through epoll. */
int dw_rc_poll(struct dw_device *dev, int budget);
/* Forgets connect attempts / pending requests of a QP (destroy, reset, error).
 * RC over RD: also closes the QP's CM stream, which tells the peer (its QP
 * goes to ERR: rdma_cm's DISCONNECTED). Implemented by rc/cm.c. */
void dw_cm_qp_cancel(struct dw_qp *qp);
/* Device open/close: RC/CM per-device state (dev->rc), e.g. the instance
 * TCP listener's accept handler through dw_progress_watch_fd. */
int dw_rc_dev_init(struct dw_device *dev);
void dw_rc_dev_fini(struct dw_device *dev);

#endif
