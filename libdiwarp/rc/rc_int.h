/* Internal to the RC transport: what rc.c, rc_tx.c, rc_rx.c and rc_copy.c
 * share. Nothing outside rc/ includes it: the rest of the engine reaches RC
 * through rc.h (the dw_rc_* hooks of dw.h). Helpers the data path calls in
 * another file on every message are static inline here, so the split into
 * files costs no call on that path (release builds link with -flto, which
 * inlines across the files too).
 *
 * Every function expects the device lock held.
 */
#ifndef DIWARP_RC_RC_INT_H
#define DIWARP_RC_RC_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "rc/rc.h"
#include "llp/tcp.h"
#include "mem/mr.h"
#include "rdmap/rdmap.h"

/* diwarp's use of the 8 opaque bytes of an RFC 7306 Immediate Data header:
 * bytes 0-3 the 32-bit immediate value as ibverbs carries it (network order),
 * byte 4 flags, bytes 5-7 zero. DW_IMM_WITH_SEND (byte 4 exactly 0x01, opcode
 * Immediate Data without SE): this immediate belongs to the Send that follows
 * it (Send with Immediate), so it consumes no receive WQE of its own. Any
 * other Immediate Data (an RDMA Write with Immediate, or an RFC 7306 peer's
 * Immediate Data operation) completes a receive WQE as RECV_RDMA_WITH_IMM;
 * so does a flagged one that is followed by anything but a Send. */
#define DW_IMM_WITH_SEND 0x01u

static inline const char *rc_peer_str(const struct dw_rc_conn *c, char *buf, size_t len)
{
        if (c->fd < 0 && c->peer.sin_family != AF_INET)
                return "(unconnected)";
        return dw_tcp_addr_str(&c->peer, buf, len);
}

static inline uint32_t rc_ord_limit(const struct dw_rc_conn *c)
{
        const struct dw_qp *qp = c->qp;
        uint32_t o = c->peer_ird ? c->peer_ird : 1;

        if ((qp->attr_mask_set & DIWARP_QP_MAX_QP_RD_ATOMIC) && qp->attr.max_rd_atomic &&
            qp->attr.max_rd_atomic < o)
                o = qp->attr.max_rd_atomic;
        return o > DW_RC_MAX_RD ? DW_RC_MAX_RD : o;
}

/* Anything for rc_tx to do: responses, a Terminate, a batch or WQE under
 * way, or SQ WQEs not started yet. */
static inline bool rc_tx_has_work(struct dw_rc_conn *c)
{
        return c->irq_count || c->term_pending || c->cur || c->iov_pos != c->iov_cnt ||
               (dw_wq_next(&c->qp->sq) != NULL && c->qp->state != DIWARP_QPS_SQD);
}

/* IB semantics: the first message on a QP still in RTR (the passive side of
 * an IB-style connect that has not moved to RTS yet) raises Communication
 * Established, once. */
static inline void rc_rx_comm_est(struct dw_rc_conn *c)
{
        if (!c->comm_est) {
                c->comm_est = true;
                if (c->qp->state == DIWARP_QPS_RTR)
                        dw_async_qp(c->qp, DIWARP_EVENT_COMM_EST);
        }
}

/* ---- rc.c: connection state, watch, failures */

/* Watches the stream socket: readable unless nothing is to be read (the
 * peer closed, a Send waits for a receive WQE), writable when want_out. */
void rc_set_watch(struct dw_rc_conn *c, bool want_out);
/* Closes the stream now (no FIN wait): unwatched, off the lists, CLOSED. */
void rc_close_now(struct dw_rc_conn *c);
/* Forgets every reference to send/receive WQEs (about to be completed or
 * flushed by the generic QP code). */
void rc_drop_wqe_refs(struct dw_rc_conn *c);
/* Completes SQ WQEs that are finished, in order. */
void rc_retire(struct dw_rc_conn *c);
/* Completes the SQ from its head through culprit (earlier finished WQEs with
 * their status, unfinished ones flushed, culprit with status). */
void rc_complete_through(struct dw_rc_conn *c, struct dw_wqe *culprit, enum diwarp_wc_status status,
                         uint32_t vendor_err);
/* We detected an error: a Terminate (unless !send_term), the QP to ERR with
 * event (-1: none). */
void rc_fail_with_term(struct dw_rc_conn *c, bool send_term, uint8_t layer, uint8_t etype,
                       uint8_t ecode, bool with_hdr, const uint8_t *rdmap_hdr, int event,
                       const char *why);
/* A request rdmap/ refused (dw_rdmap_write_accept, _read_req_accept,
 * _atomic_req_accept): its Terminate (ref->te, with the offending DDP
 * header and rdmap_hdr when not NULL), QP_ACCESS_ERR, counted in
 * rx_dropped_protection; what names the check for the log line. */
void rc_fail_refused(struct dw_rc_conn *c, const struct dw_rdmap_refusal *ref,
                     const uint8_t *rdmap_hdr, const char *what);
/* The same for a failed check st in context ctx (dw_rdmap_refuse). */
void rc_fail_prot(struct dw_rc_conn *c, enum dw_prot_status st, enum dw_prot_ctx ctx,
                  const uint8_t *rdmap_hdr, const char *what);
/* The peer of an IB-style stream closed and work needs it: RETRY_EXC_ERR. */
void rc_peer_gone_fail(struct dw_rc_conn *c);
/* The stream broke (EOF, reset, user timeout; err 0 for EOF) without a
 * Terminate. */
void rc_stream_failed(struct dw_rc_conn *c, int err);
/* iovecs for bytes [off, off+len) of a send WQE's SGE list (source, Read
 * sink, atomic result), each checked against its lkey in the QP's PD
 * (dw_rdmap_wr_iov): the count, -EMSGSIZE or -EACCES. */
static inline int rc_sge_range_iov(struct dw_qp *qp, const struct dw_wqe *w, uint64_t off,
                                   uint64_t len, int access, struct iovec *iov, int max)
{
        return dw_rdmap_wr_iov(&qp->dev->mrs, qp->pd, w, off, len, access, iov, max);
}

/* ---- rc_tx.c: FPDU building, batching and the writes */

/* MULPDU of the stream from its current effective MSS. */
uint32_t rc_mulpdu(int fd, uint32_t fpdu);
/* Grows the transmit arrays to batches of n FPDUs: 0 or -ENOMEM. */
int rc_tx_arrays(struct dw_rc_conn *c, int n);
/* Builds the next batch of FPDUs (Terminate first when one is due). */
void rc_build_batch(struct dw_rc_conn *c);
/* Transmits what is queued, as far as the socket takes it: the work done. */
int rc_tx(struct dw_rc_conn *c);

/* ---- rc_rx.c: receive parsing, placement and control messages */

/* Reads and processes what the stream holds, up to a step's bytes: the work done. */
int rc_rx(struct dw_rc_conn *c);
/* Completes the head receive WQE w with d (its src_qp is the stream's peer
 * QP) and pops it. */
void rc_rx_complete_recv(struct dw_rc_conn *c, struct dw_wqe *w, struct dw_recv_done d,
                         bool solicited);
/* A Send held for want of a receive WQE is no longer held. */
void rc_rx_wait_end(struct dw_rc_conn *c);

/* ---- rc_copy.c: the other end in this process */

/* A WQE whose other end is in this process, done as one copy: true when
 * it completed (DIWARP_LOCAL_COPY). */
bool rc_local_copy(struct dw_rc_conn *c, struct dw_wqe *w, const struct iovec *loc, int nloc);
/* w could be done as one copy if the stream were idle: the batch being
 * built ends before it rather than carry it (rc_build_batch). */
bool rc_local_copy_candidate(const struct dw_rc_conn *c, const struct dw_wqe *w);

#endif
