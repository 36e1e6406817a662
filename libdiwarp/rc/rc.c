/* RC transport: RDMAP over DDP over MPA over one TCP stream per QP.
 * See rc.h for the buffer layout and README.md for the decisions. */
#include "rc/rc.h"
#include "rc/rc_local.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rc/cm.h"
#include "rc/mpa_conn.h"
#include "llp/tcp.h"
#include "progress/progress.h"
#include "rdmap/rdmap.h"
#include "util/time.h"
#include "wire/crc32c.h"

/* diwarp's use of the 8 opaque bytes of an RFC 7306 Immediate Data header:
 * bytes 0-3 the 32-bit immediate value as ibverbs carries it (network order),
 * byte 4 flags, bytes 5-7 zero. DW_IMM_WITH_SEND (byte 4 exactly 0x01, opcode
 * Immediate Data without SE): this immediate belongs to the Send that follows
 * it (Send with Immediate), so it consumes no receive WQE of its own. Any
 * other Immediate Data (an RDMA Write with Immediate, or an RFC 7306 peer's
 * Immediate Data operation) completes a receive WQE as RECV_RDMA_WITH_IMM;
 * so does a flagged one that is followed by anything but a Send. */
#define DW_IMM_WITH_SEND 0x01u

#define DW_RC_IOV_MAX 1024 /* Linux UIO_MAXIOV */

static int rc_tx(struct dw_rc_conn *c);
static void rc_close_now(struct dw_rc_conn *c);
static bool rx_imm_alone(struct dw_rc_conn *c, uint32_t imm, bool se);

/* ---------------------------------------------------------------- helpers */

static const char *peer_str(const struct dw_rc_conn *c, char *buf, size_t len)
{
        if (c->fd < 0 && c->peer.sin_family != AF_INET)
                return "(unconnected)";
        return dw_tcp_addr_str(&c->peer, buf, len);
}

/* ---------------------------------------------------------------- connection state */

static const char *const rc_state_names[] = {
    [DW_RC_IDLE] = "IDLE",       [DW_RC_CONNECTING] = "CONNECTING", [DW_RC_UP] = "UP",
    [DW_RC_CLOSING] = "CLOSING", [DW_RC_CLOSED] = "CLOSED",
};

#define RC_TO(s) (1u << (s))
/* The transitions of enum dw_rc_conn_state, by state: the states it may move
 * to. A stream ends in CLOSED (RESET alone brings the QP back to IDLE); a
 * connection being set up (CONNECTING) goes back to IDLE when it fails. */
static const uint8_t rc_state_next[] = {
    [DW_RC_IDLE] = RC_TO(DW_RC_CONNECTING) | RC_TO(DW_RC_UP),
    [DW_RC_CONNECTING] = RC_TO(DW_RC_IDLE) | RC_TO(DW_RC_UP) | RC_TO(DW_RC_CLOSED),
    [DW_RC_UP] = RC_TO(DW_RC_CLOSING) | RC_TO(DW_RC_CLOSED),
    [DW_RC_CLOSING] = RC_TO(DW_RC_CLOSED),
    [DW_RC_CLOSED] = RC_TO(DW_RC_IDLE),
};

bool dw_rc_set_state(struct dw_rc_conn *c, enum dw_rc_conn_state to, const char *why)
{
        enum dw_rc_conn_state from = c->state;

        if (from == to)
                return true;
        if (!(rc_state_next[from] & RC_TO(to))) {
                dw_warn("RC QP %#x: connection state %s -> %s refused (%s): not a transition of "
                        "the RC state machine",
                        c->qp->qpn, rc_state_names[from], rc_state_names[to], why);
                return false;
        }
        dw_dbg("RC QP %#x: connection %s -> %s (%s)", c->qp->qpn, rc_state_names[from],
               rc_state_names[to], why);
        c->state = to;
        return true;
}

static uint32_t ord_limit(const struct dw_rc_conn *c)
{
        const struct dw_qp *qp = c->qp;
        uint32_t o = c->peer_ird ? c->peer_ird : 1;

        if ((qp->attr_mask_set & DIWARP_QP_MAX_QP_RD_ATOMIC) && qp->attr.max_rd_atomic &&
            qp->attr.max_rd_atomic < o)
                o = qp->attr.max_rd_atomic;
        return o > DW_RC_MAX_RD ? DW_RC_MAX_RD : o;
}

uint16_t dw_rc_offer_ird(const struct dw_qp *qp)
{
        if ((qp->attr_mask_set & DIWARP_QP_MAX_DEST_RD_ATOMIC) && qp->attr.max_dest_rd_atomic)
                return qp->attr.max_dest_rd_atomic < DW_RC_MAX_RD ? qp->attr.max_dest_rd_atomic
                                                                  : DW_RC_MAX_RD;
        return DW_RC_MAX_RD;
}

uint16_t dw_rc_offer_ord(const struct dw_qp *qp)
{
        if ((qp->attr_mask_set & DIWARP_QP_MAX_QP_RD_ATOMIC) && qp->attr.max_rd_atomic)
                return qp->attr.max_rd_atomic < DW_RC_MAX_RD ? qp->attr.max_rd_atomic
                                                             : DW_RC_MAX_RD;
        return DW_RC_MAX_RD;
}

/* iovecs for bytes [off, off+len) of a WQE's SGE list, every piece checked
 * against its lkey with the given access. Returns the count, -EMSGSIZE when
 * the range runs past the SGEs, -EACCES on a protection failure. */
static int sge_range_iov(struct dw_qp *qp, const struct dw_wqe *w, uint64_t off, uint64_t len,
                         int access, struct iovec *iov, int max)
{
        int n = 0;

        if (len == 0)
                return 0;
        if ((w->flags & DW_WQE_INLINE) && access == 0) {
                if (off + len > w->sge[0].length)
                        return -EMSGSIZE;
                iov[0].iov_base = (uint8_t *)(uintptr_t)w->sge[0].addr + off;
                iov[0].iov_len = len;
                return 1;
        }
        for (uint32_t i = 0; i < w->num_sge && len; i++) {
                const struct diwarp_sge *s = &w->sge[i];
                if (off >= s->length) {
                        off -= s->length;
                        continue;
                }
                uint64_t piece = s->length - off;
                if (piece > len)
                        piece = len;
                uint8_t *host = NULL;
                if (dw_mr_check_local(&qp->dev->mrs, s->lkey, qp->pd, access, s->addr + off, piece,
                                      &host) != DW_PROT_OK)
                        return -EACCES;
                if (n == max)
                        return -EMSGSIZE;
                iov[n].iov_base = host;
                iov[n].iov_len = piece;
                n++;
                len -= piece;
                off = 0;
        }
        return len ? -EMSGSIZE : n;
}

/* MULPDU of the stream from its current effective MSS. */
static uint32_t rc_mulpdu(int fd)
{
        int mss = dw_tcp_mss(fd);
        uint32_t u = mss > 0 ? dw_mpa_mulpdu((uint32_t)mss) : DW_RC_MULPDU_DEFAULT;
        return u < DW_RC_MULPDU_MIN ? DW_RC_MULPDU_MIN : u;
}

/* Grows the transmit arrays to batches of n FPDUs (no batch may be under
 * way). 0, or -ENOMEM with the arrays as they were (still usable). */
static int tx_arrays(struct dw_rc_conn *c, int n)
{
        int icap = n * 3 + DW_MAX_SGE + 2; /* header, payload, trailer; one multi-SGE FPDU */
        if (icap < DW_RC_TX_BATCH_MIN * (DW_MAX_SGE + 2))
                icap = DW_RC_TX_BATCH_MIN * (DW_MAX_SGE + 2);
        if (n <= c->slot_cap && icap <= c->iov_cap)
                return 0;
        struct iovec *iov = calloc((size_t)icap, sizeof(*iov));
        struct dw_rc_txslot *slot = calloc((size_t)n, sizeof(*slot));
        struct dw_wqe **done = calloc((size_t)n, sizeof(*done));
        uint64_t *done_end = calloc((size_t)n, sizeof(*done_end));
        if (!iov || !slot || !done || !done_end) {
                free(iov);
                free(slot);
                free(done);
                free(done_end);
                return -ENOMEM;
        }
        free(c->iov);
        free(c->slot);
        free(c->done_wqe);
        free(c->done_end);
        c->iov = iov;
        c->iov_cap = icap;
        c->slot = slot;
        c->done_wqe = done;
        c->done_end = done_end;
        c->slot_cap = n;
        return 0;
}

/* Payload bytes of one FPDU with a DDP header of that kind. */
static uint32_t seg_max(const struct dw_rc_conn *c, bool tagged)
{
        return c->mulpdu - (tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN);
}

static uint32_t crc_iov(uint32_t s, const struct iovec *iov, int n)
{
        for (int i = 0; i < n; i++)
                s = dw_crc32c_update(s, iov[i].iov_base, iov[i].iov_len);
        return s;
}

/* ---------------------------------------------------------------- watch / timers */

static int rc_watch_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx);

static void set_watch(struct dw_rc_conn *c, bool want_out)
{
        if (c->fd < 0)
                return;
        /* After the peer's orderly close there is nothing left to read (EOF
         * would keep the fd readable); errors and hang-ups are reported
         * anyway. */
        uint32_t ev = (c->peer_closed || c->rx_wait_recv ? 0 : EPOLLIN) | (want_out ? EPOLLOUT : 0);
        if (!c->watched) {
                if (dw_progress_watch_fd(c->qp->dev, c->fd, ev, rc_watch_cb, c) == 0) {
                        c->watched = true;
                        c->watch_events = ev;
                }
                return;
        }
        if (ev != c->watch_events && dw_progress_modify_fd(c->qp->dev, c->fd, ev) == 0)
                c->watch_events = ev;
}

void dw_rc_timer_add(struct dw_device *dev, struct dw_rc_conn *c, uint64_t deadline_ns)
{
        struct dw_rc_dev *rd = dev->rc;

        c->deadline_ns = deadline_ns;
        if (!c->on_timer_list && rd) {
                c->tprev = NULL;
                c->tnext = rd->timers;
                if (rd->timers)
                        rd->timers->tprev = c;
                rd->timers = c;
                c->on_timer_list = true;
        }
        dw_progress_timer(dev, deadline_ns);
}

void dw_rc_timer_del(struct dw_device *dev, struct dw_rc_conn *c)
{
        struct dw_rc_dev *rd = dev->rc;

        if (!c->on_timer_list || !rd)
                return;
        if (c->tprev)
                c->tprev->tnext = c->tnext;
        else
                rd->timers = c->tnext;
        if (c->tnext)
                c->tnext->tprev = c->tprev;
        c->tnext = c->tprev = NULL;
        c->on_timer_list = false;
}

/* The live list: conns with an open stream, read directly by dw_rc_poll. */
static void live_add(struct dw_rc_conn *c)
{
        struct dw_rc_dev *rd = c->qp->dev->rc;

        if (c->on_live_list || !rd)
                return;
        c->lprev = NULL;
        c->lnext = rd->live;
        if (rd->live)
                rd->live->lprev = c;
        rd->live = c;
        rd->nlive++;
        c->on_live_list = true;
}

static void live_del(struct dw_rc_conn *c)
{
        struct dw_rc_dev *rd = c->qp->dev->rc;

        if (!c->on_live_list || !rd)
                return;
        if (c->lprev)
                c->lprev->lnext = c->lnext;
        else
                rd->live = c->lnext;
        if (c->lnext)
                c->lnext->lprev = c->lprev;
        c->lnext = c->lprev = NULL;
        rd->nlive--;
        c->on_live_list = false;
}

/* ---------------------------------------------------------------- stream state */

static void reset_stream(struct dw_rc_conn *c)
{
        c->iov_pos = c->iov_cnt = 0;
        c->nslot = c->ndone = 0;
        c->term_queued = c->term_pending = false;
        c->fin_after_batch = false;
        c->cur = NULL;
        c->cur_off = 0;
        c->cur_phase = 0;
        c->nsrc = 0;
        c->irq_turn = false;
        c->msn_send = c->msn_rreq = c->msn_term = c->msn_aresp = 1;
        c->orq_head = c->orq_count = 0;
        c->rx_state = DW_RC_RX_HDR;
        c->rx_start = c->rx_end = 0;
        c->rx_big = false;
        c->rx_wqe = NULL;
        c->rx_msg_len = 0;
        c->msn_expect_send = c->msn_expect_rreq = c->msn_expect_aresp = 1;
        c->rx_write_bytes = c->rx_write_len = 0;
        c->imm_pending = false;
        c->irq_head = c->irq_count = 0;
        c->rtr_send_expected = false;
        c->comm_est = false;
        c->peer_closed = false;
        c->tx_sent = c->batch_bytes = c->rx_done = 0;
        c->rx_wait_recv = false;
}

static void rc_close_now(struct dw_rc_conn *c)
{
        struct dw_device *dev = c->qp->dev;

        dw_rc_timer_del(dev, c);
        live_del(c);
        dw_rc_end_unregister(c->end_slot);
        c->end_slot = -1;
        if (c->fd >= 0) {
                if (c->watched)
                        dw_progress_unwatch_fd(dev, c->fd);
                close(c->fd);
        }
        c->fd = -1;
        c->watched = false;
        c->rx_state = DW_RC_RX_STOP;
        if (c->state != DW_RC_IDLE)
                dw_rc_set_state(c, DW_RC_CLOSED, "stream closed");
}

/* Forgets every reference to send/receive WQEs (they are about to be
 * completed or flushed by the generic QP code). */
static void drop_wqe_refs(struct dw_rc_conn *c)
{
        c->cur = NULL;
        c->ndone = 0;
        c->orq_head = c->orq_count = 0;
        c->rx_wqe = NULL;
}

/* Completes SQ WQEs that are finished, in order. */
static void retire(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        struct dw_wqe *w;

        while ((w = dw_wq_head(&qp->sq)) && (w->flags & DW_WQE_DONE)) {
                if (w == c->cur)
                        c->cur = NULL;
                dw_qp_complete_send(qp, (enum diwarp_wc_status)w->status, w->byte_len);
        }
}

/* Completes the SQ from its head through culprit: earlier finished WQEs with
 * their status, unfinished ones flushed, culprit with status. Does nothing if
 * culprit is not (or no longer) in the SQ. References must be dropped first. */
static void complete_through(struct dw_rc_conn *c, struct dw_wqe *culprit,
                             enum diwarp_wc_status status, uint32_t vendor_err)
{
        struct dw_qp *qp = c->qp;
        bool found = false;
        struct dw_wqe *w;

        if (!culprit)
                return;
        for (uint32_t i = 0; (w = dw_wq_at(&qp->sq, i)); i++)
                if (w == culprit) {
                        found = true;
                        break;
                }
        if (!found)
                return;
        while ((w = dw_wq_head(&qp->sq))) {
                if (w == culprit) {
                        dw_qp_complete_send_ve(qp, status, 0, vendor_err);
                        break;
                }
                dw_qp_complete_send(qp,
                                    (w->flags & DW_WQE_DONE) ? (enum diwarp_wc_status)w->status
                                                             : DIWARP_WC_WR_FLUSH_ERR,
                                    w->byte_len);
        }
}

/* We detected an error: send a Terminate (unless !send_term), move the QP to
 * ERR with event (-1: none). */
static void fail_with_term(struct dw_rc_conn *c, bool send_term, uint8_t layer, uint8_t etype,
                           uint8_t ecode, bool with_hdr, const uint8_t *rdmap_hdr, int event,
                           const char *why)
{
        struct dw_qp *qp = c->qp;
        char pb[32];

        dw_warn("RC QP %#x peer %s: %s; terminating (layer %u type %u code %#x)", qp->qpn,
                peer_str(c, pb, sizeof(pb)), why, layer, etype, ecode);
        if (send_term && c->fd >= 0 && !c->term_pending) {
                memset(&c->term, 0, sizeof(c->term));
                c->term.layer = layer;
                c->term.etype = etype;
                c->term.ecode = ecode;
                if (with_hdr) {
                        bool tagged = c->rh_raw[0] & DW_DDP_CTRL_T;
                        c->term.has_ddp_hdr = true;
                        c->term.ddp_hdr_len =
                            tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN;
                        memcpy(c->term.ddp_hdr, c->rh_raw, c->term.ddp_hdr_len);
                        /* RFC 5040 section 4.8: with the offending segment's
                         * DDP header goes its DDP Segment Length (the MPA
                         * ULPDU_Length that framed it), and M says it is valid. */
                        c->term.seglen_valid = true;
                        c->term.ddp_seg_len = c->rx_ulen;
                }
                if (rdmap_hdr) {
                        c->term.has_rdmap_hdr = true;
                        memcpy(c->term.rdmap_hdr, rdmap_hdr, DW_RDMAP_RREQ_HDR_LEN);
                }
                c->term_pending = true;
                if (c->end_slot >= 0)
                        dw_rc_end_terminated(c->end_slot, c->rx_done);
                qp->ctr.terminates_sent++;
                qp->dev->ctr.terminates_sent++;
        }
        c->rx_state = DW_RC_RX_STOP;
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, event);
        else
                dw_rc_qp_error(qp);
}

static void fail_prot(struct dw_rc_conn *c, enum dw_prot_status st, enum dw_prot_ctx ctx,
                      const uint8_t *rdmap_hdr, const char *what)
{
        struct dw_term_error te = dw_rdmap_prot_term(st, ctx);
        char why[160];

        c->qp->ctr.rx_dropped_protection++;
        c->qp->dev->ctr.rx_dropped_protection++;
        snprintf(why, sizeof(why), "%s: %s", what, dw_prot_status_str(st));
        fail_with_term(c, true, te.layer, te.etype, te.ecode, true, rdmap_hdr,
                       DIWARP_EVENT_QP_ACCESS_ERR, why);
}

/* The peer of an IB-style stream is gone (it closed in order) and work needs
 * it: as an IB requester whose retries find no responder, the oldest
 * unfinished send WQE completes with RETRY_EXC_ERR, the QP moves to ERR (no
 * async event: IB reports this through the completion) and the rest flush. */
static void peer_gone_fail(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        struct dw_wqe *w;
        char pb[32];

        retire(c);
        drop_wqe_refs(c);
        rc_close_now(c); /* nobody to send a Terminate or FIN to */
        w = dw_wq_head(&qp->sq);
        if (w)
                dw_warn("RC QP %#x peer %s: send WR %#llx: the peer QP closed its stream; "
                        "completing with RETRY_EXC_ERR",
                        qp->qpn, peer_str(c, pb, sizeof(pb)), (unsigned long long)w->wr_id);
        complete_through(c, w, DIWARP_WC_RETRY_EXC_ERR, 0);
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, -1);
}

/* The stream broke (EOF, reset, user timeout) without a Terminate.
 *
 * An IB-style stream (ibv_modify_qp RTR with a GID and QPN) that ends with
 * EOF at an FPDU boundary is the peer destroying its QP. On IB that leaves
 * the local QP alone, so here too: the stream is marked peer_closed, posted
 * receives stay posted, Sends and Writes still go out on our half of the
 * stream, and only work that cannot succeed fails, with RETRY_EXC_ERR: a
 * Read or Atomic (no response can come), or a send once our half is gone
 * too (write error or reset). Programs that close right after their last
 * exchange (ibv_rc_pingpong, ibv_srq_pingpong) must not see flushes next to
 * their last real completion.
 *
 * Everything else is an error now: a reset or timeout, EOF inside an FPDU,
 * and any end of a stream the native CM set up (diwarp_connect/accept;
 * iWARP semantics: the peer's diwarp_disconnect ends the connection, the QP
 * moves to ERR and its WQEs flush, quietly if nothing was in flight). */
static void stream_failed(struct dw_rc_conn *c, int err)
{
        struct dw_qp *qp = c->qp;
        char pb[32];

        if (c->peer_closed) {
                /* The peer's socket is gone too (a write failed, or its reset
                 * came): the QP still stays as it is; only unfinished sends fail. */
                dw_dbg("RC QP %#x peer %s: stream gone after the peer's close (%s)", qp->qpn,
                       peer_str(c, pb, sizeof(pb)), err ? strerror(-err) : "end of stream");
                rc_close_now(c);
                if (!dw_wq_empty(&qp->sq) && qp->state != DIWARP_QPS_ERR)
                        peer_gone_fail(c);
                return;
        }
        if (err == 0 && c->ib_style && c->rx_state == DW_RC_RX_HDR && c->rx_end == c->rx_start) {
                dw_info("RC QP %#x peer %s: the peer closed its end (QP destroyed); this QP "
                        "stays in state %d until work needs the peer",
                        qp->qpn, peer_str(c, pb, sizeof(pb)), qp->state);
                /* A message cut short stays unfinished in its receive WQE, as
                 * on IB; the peer's outstanding Reads need no response. */
                c->rx_wqe = NULL;
                c->rx_msg_len = 0;
                c->imm_pending = false;
                c->irq_head = c->irq_count = 0;
                c->rx_state = DW_RC_RX_STOP;
                c->peer_closed = true;
                /* Our direction stays open: Sends and Writes still go out
                 * (the peer's end drains until it is really closed, like an
                 * IB QP that acknowledges until destroyed). Reads and Atomics
                 * can never be answered now. */
                if (c->orq_count && qp->state != DIWARP_QPS_ERR) {
                        peer_gone_fail(c);
                        return;
                }
                set_watch(c, c->iov_pos != c->iov_cnt);
                return;
        }
        bool busy = c->rx_state == DW_RC_RX_DIRECT || c->rx_end != c->rx_start || c->rx_wqe ||
                    c->orq_count || c->irq_count || c->iov_pos != c->iov_cnt ||
                    !dw_wq_empty(&qp->sq);

        if (err == 0 && !busy)
                dw_info("RC QP %#x peer %s: peer closed the connection", qp->qpn,
                        peer_str(c, pb, sizeof(pb)));
        else
                dw_warn("RC QP %#x peer %s: connection lost (%s)%s", qp->qpn,
                        peer_str(c, pb, sizeof(pb)), err ? strerror(-err) : "end of stream",
                        busy ? " with operations in flight" : "");
        rc_close_now(c);
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, (err == 0 && !busy) ? -1 : DIWARP_EVENT_QP_FATAL);
}

/* ---------------------------------------------------------------- transmit */

/* Appends one FPDU to the batch: header (DDP/RDMAP + ext) from a slot, payload
 * iovecs as given (registered memory), trailer. */
static int add_fpdu(struct dw_rc_conn *c, const struct dw_rdmap_hdr *h, const void *ext,
                    size_t extlen, const struct iovec *pay, int npay, size_t paylen)
{
        struct dw_rc_txslot *s = &c->slot[c->nslot];
        ssize_t hl = dw_rdmap_encode(h, s->hdr + DW_MPA_HDR_LEN, DW_RC_HDR_MAX - DW_MPA_HDR_LEN);
        if (hl < 0)
                return (int)hl;
        if (extlen)
                memcpy(s->hdr + DW_MPA_HDR_LEN + hl, ext, extlen);
        size_t ulen = (size_t)hl + extlen + paylen;
        dw_put_be16(s->hdr, (uint16_t)ulen);
        size_t hdrlen = DW_MPA_HDR_LEN + (size_t)hl + extlen;

        uint32_t st = 0;
        if (c->crc) {
                st = dw_crc32c_update(dw_crc32c_init(), s->hdr, hdrlen);
                st = crc_iov(st, pay, npay);
        }
        ssize_t tl = dw_mpa_fpdu_trailer(s->trl, ulen, st, c->crc);
        if (tl < 0)
                return (int)tl;

        c->iov[c->iov_cnt].iov_base = s->hdr;
        c->iov[c->iov_cnt].iov_len = hdrlen;
        c->iov_cnt++;
        for (int i = 0; i < npay; i++)
                c->iov[c->iov_cnt++] = pay[i];
        c->iov[c->iov_cnt].iov_base = s->trl;
        c->iov[c->iov_cnt].iov_len = (size_t)tl;
        c->iov_cnt++;
        c->nslot++;
        c->batch_bytes += hdrlen + paylen + (size_t)tl;
        c->qp->ctr.tx_packets++;
        c->qp->ctr.tx_bytes += hdrlen + paylen + (size_t)tl;
        return 0;
}

static void add_term(struct dw_rc_conn *c)
{
        struct dw_rdmap_hdr h;
        uint8_t ext[DW_RDMAP_TERM_MAX_LEN];

        dw_rdmap_hdr_init(&h, DW_RDMAP_TERMINATE);
        h.ddp.msn = c->msn_term++;
        h.ddp.mo = 0;
        ssize_t n = dw_rdmap_term_encode(&c->term, ext, sizeof(ext));
        if (n < 0) {
                /* Drop the carried headers rather than the Terminate. */
                c->term.has_ddp_hdr = c->term.has_rdmap_hdr = c->term.seglen_valid = false;
                n = dw_rdmap_term_encode(&c->term, ext, sizeof(ext));
        }
        if (n >= 0)
                add_fpdu(c, &h, ext, (size_t)n, NULL, 0, 0);
}

/* w's last FPDU is in the batch: it is finished once the batch is out. */
static void mark_sent(struct dw_rc_conn *c, struct dw_wqe *w)
{
        c->done_end[c->ndone] = c->tx_sent + c->batch_bytes;
        c->done_wqe[c->ndone++] = w;
}

/* Payload iovecs for [off, off+len) of the current WQE's resolved sources. */
static int gather_src(struct dw_rc_conn *c, uint64_t off, uint64_t len, struct iovec *out)
{
        int n = 0;

        for (int i = 0; i < c->nsrc && len; i++) {
                if (off >= c->src[i].iov_len) {
                        off -= c->src[i].iov_len;
                        continue;
                }
                size_t piece = c->src[i].iov_len - off;
                if (piece > len)
                        piece = len;
                out[n].iov_base = (uint8_t *)c->src[i].iov_base + off;
                out[n].iov_len = piece;
                n++;
                len -= piece;
                off = 0;
        }
        return n;
}

static bool is_read_like(int op)
{
        return op == DIWARP_WR_RDMA_READ || op == DIWARP_WR_ATOMIC_CMP_AND_SWP ||
               op == DIWARP_WR_ATOMIC_FETCH_AND_ADD;
}

/* A local error on a send WQE: it completes with status, the QP goes to ERR
 * and the peer gets a Terminate (local catastrophic: the fault is ours). */
static void wqe_local_error(struct dw_rc_conn *c, struct dw_wqe *w, enum diwarp_wc_status status,
                            const char *why)
{
        char pb[32];

        dw_warn("RC QP %#x peer %s: send WR %#llx: %s", c->qp->qpn, peer_str(c, pb, sizeof(pb)),
                (unsigned long long)w->wr_id, why);
        drop_wqe_refs(c);
        complete_through(c, w, status, 0);
        fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
                       DW_TERM_RDMAP_CATASTROPHIC_STREAM, false, NULL, -1, why);
}

static bool sq_ready(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;

        /* SQD: the WQE under way finishes, no new one starts. */
        if (qp->state == DIWARP_QPS_SQD)
                return c->cur != NULL;
        /* RTR too: an IB-style passive side may send before it moves to RTS
         * (see diwarp_post_send); the stream is bidirectional once up. */
        if (qp->state != DIWARP_QPS_RTS && qp->state != DIWARP_QPS_RTR)
                return false;
        if (c->cur)
                return true;
        struct dw_wqe *w = dw_wq_next(&qp->sq);
        if (!w)
                return false;
        /* Fence: wait for every earlier Read / Atomic to complete. */
        if ((w->send_flags & DIWARP_SEND_FENCE) && c->orq_count)
                return false;
        /* ORD: excess Reads / Atomics wait here, in order. */
        if (is_read_like(w->opcode) && c->orq_count >= ord_limit(c))
                return false;
        return true;
}

/* The last byte of an iovec list (NULL when it has none). */
static uint8_t *iov_last_byte(const struct iovec *v, int n)
{
        while (n > 0 && v[n - 1].iov_len == 0)
                n--;
        return n ? (uint8_t *)v[n - 1].iov_base + v[n - 1].iov_len - 1 : NULL;
}

/* Copies src to dst (the same length in all), the last byte last and after
 * a full fence: a program that polls the last byte of a buffer written to
 * it (perftest's latency tests) then finds every other byte in place, as it
 * does when FPDUs arrive in order. memcpy alone may store its tail first, or
 * with non-temporal stores that a plain release does not order. */
static void copy_iov(const struct iovec *dst, int nd, const struct iovec *src, int ns)
{
        uint8_t *dlast = iov_last_byte(dst, nd);
        const uint8_t *slast = iov_last_byte(src, ns);
        size_t left = 0, doff = 0, soff = 0;

        if (!dlast || !slast)
                return;
        for (int j = 0; j < ns; j++)
                left += src[j].iov_len;
        left--; /* the very last byte goes after the rest */
        for (int i = 0, j = 0; left && i < nd && j < ns;) {
                size_t n = dst[i].iov_len - doff;
                if (n > src[j].iov_len - soff)
                        n = src[j].iov_len - soff;
                if (n > left)
                        n = left;
                memcpy((uint8_t *)dst[i].iov_base + doff, (const uint8_t *)src[j].iov_base + soff,
                       n);
                doff += n;
                soff += n;
                left -= n;
                if (doff == dst[i].iov_len) {
                        i++;
                        doff = 0;
                }
                if (soff == src[j].iov_len) {
                        j++;
                        soff = 0;
                }
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        *(volatile uint8_t *)dlast = *slast;
}

static void rx_complete_recv(struct dw_rc_conn *c, struct dw_wqe *w, enum diwarp_wc_status st,
                             enum diwarp_wc_opcode op, uint32_t len, unsigned flags, uint32_t imm,
                             uint32_t inv, bool solicited);
static void rx_comm_est(struct dw_rc_conn *c);

/* The responder p takes the WQE as if it had come in FPDUs: a Write or Read
 * lands in (or comes from) its registered memory, a Send in its next receive
 * WQE, which completes. Every rule of the wire applies, checked under p's
 * device lock before a byte moves: its QP's state and access flags, its MR
 * table (STag, PD, bounds, access) for a tagged WQE, a receive WQE with
 * room for a Send. false (nothing done): the WQE goes on the stream, where
 * a failure gets its Terminate. */
static bool local_take(struct dw_rc_conn *c, struct dw_rc_conn *p, struct dw_wqe *w,
                       const struct iovec *loc, int nloc)
{
        struct dw_qp *pq = p->qp;

        if (p->state != DW_RC_UP || p->rx_state != DW_RC_RX_HDR || p->rx_end != p->rx_start ||
            p->term_pending || p->imm_pending || p->rx_wait_recv || p->rx_wqe || p->irq_count ||
            p->orq_count || p->rtr_send_expected ||
            (pq->state != DIWARP_QPS_RTS && pq->state != DIWARP_QPS_RTR &&
             pq->state != DIWARP_QPS_SQD))
                return false;
        if (w->opcode == DIWARP_WR_SEND) {
                struct dw_wqe *rw = dw_qp_recv_head(pq);
                struct iovec tgt[DW_MAX_SGE];
                int n = rw ? sge_range_iov(pq, rw, 0, w->total_len, DIWARP_ACCESS_LOCAL_WRITE, tgt,
                                           DW_MAX_SGE)
                           : -ENOENT;
                if (n < 0)
                        return false;
                rx_comm_est(p);
                copy_iov(tgt, n, loc, nloc);
                c->msn_send++;
                p->msn_expect_send++;
                rx_complete_recv(p, rw, DIWARP_WC_SUCCESS, DIWARP_WC_RECV, (uint32_t)w->total_len,
                                 0, 0, 0, (w->send_flags & DIWARP_SEND_SOLICITED) != 0);
                return true;
        }
        bool write = w->opcode == DIWARP_WR_RDMA_WRITE;
        int access = write ? DIWARP_ACCESS_REMOTE_WRITE : DIWARP_ACCESS_REMOTE_READ;
        uint8_t *host = NULL;
        if ((!write && !p->ird) || dw_rdmap_check_remote(pq, access, w->rkey, w->remote_addr,
                                                         w->total_len, &host) != DW_PROT_OK)
                return false;
        rx_comm_est(p);
        struct iovec mem = {host, w->total_len};
        if (write) {
                copy_iov(&mem, 1, loc, nloc);
                /* As a Write that came in FPDUs: its length is what an
                 * Immediate Data on its own would report. */
                p->rx_write_len = w->total_len;
                p->rx_write_bytes = 0;
        } else {
                copy_iov(loc, nloc, &mem, 1);
        }
        return true;
}

/* A plain Send, RDMA Write or Read whose other end is linked in this process
 * (rc_local.h) is done as one copy between the two programs' memory instead
 * of FPDUs through the loopback stream (DIWARP_LOCAL_COPY; on in the host
 * daemon, where every client's regions are mapped). Only while the stream is
 * idle both ways, so its order is kept: the responder has consumed every
 * byte sent before, no Read is outstanding in either direction, nothing is
 * queued. The responder's device is only tried (never waited for). loc: the
 * WQE's checked local SGEs (the source of a Send or Write, the sink of a
 * Read). true: the WQE completed. */
static int rc_rx(struct dw_rc_conn *c);

static bool local_copy(struct dw_rc_conn *c, struct dw_wqe *w, const struct iovec *loc, int nloc)
{
        bool locked;

        if (c->qp->dev->cfg.local_copy != 1 || c->end_slot < 0 || c->state != DW_RC_UP ||
            c->nslot || c->term_pending || c->orq_count || c->irq_count ||
            (w->opcode != DIWARP_WR_SEND && !w->total_len) ||
            (w->opcode != DIWARP_WR_SEND && w->opcode != DIWARP_WR_RDMA_WRITE &&
             w->opcode != DIWARP_WR_RDMA_READ))
                return false;
        struct dw_rc_conn *p = dw_rc_end_lock_peer(c->end_slot, c->qp->dev, &locked);
        if (!p)
                return false;
        /* With its lock held, the other end's rx_done is what it publishes
         * as consumed. What this end sent before is in its socket: it reads
         * it now (only reads, as local_peer_wait has it do), so a Write
         * posted right behind a Send need not join the stream, and a stream
         * that carried a few does not keep every WQE behind on it. A
         * terminated end fails local_take's state checks. */
        if (p->rx_done != c->tx_sent)
                rc_rx(p);
        bool done = p->rx_done == c->tx_sent && local_take(c, p, w, loc, nloc);
        /* A receive completed on a device another loop drives: wake it. */
        if (done && locked && w->opcode == DIWARP_WR_SEND)
                dw_progress_wake(p->qp->dev);
        dw_rc_end_unlock_peer(p, locked);
        if (!done)
                return false;
        c->qp->ctr.local_copies++;
        c->qp->ctr.local_copy_bytes += w->total_len;
        c->qp->dev->ctr.local_copies++;
        c->qp->dev->ctr.local_copy_bytes += w->total_len;
        w->status = DIWARP_WC_SUCCESS;
        w->byte_len = (uint32_t)w->total_len;
        w->flags |= DW_WQE_DONE;
        retire(c);
        return true;
}

/* Starts the next SQ WQE. Returns 1 when it became c->cur, 0 when it finished
 * without an FPDU (Local Invalidate, Bind Memory Window, a local copy), -1
 * on error (handled). */
static int start_wqe(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        struct dw_wqe *w = dw_wq_next(&qp->sq);
        struct iovec tmp[DW_MAX_SGE];
        int n;

        dw_wq_advance(&qp->sq);
        w->bytes_done = 0;
        switch (w->opcode) {
        case DIWARP_WR_SEND:
        case DIWARP_WR_SEND_WITH_IMM:
        case DIWARP_WR_SEND_WITH_INV:
        case DIWARP_WR_RDMA_WRITE:
        case DIWARP_WR_RDMA_WRITE_WITH_IMM:
                n = sge_range_iov(qp, w, 0, w->total_len, 0, c->src, DW_MAX_SGE);
                if (n < 0) {
                        wqe_local_error(c, w, DIWARP_WC_LOC_PROT_ERR,
                                        "source SGE fails its lkey check");
                        return -1;
                }
                c->nsrc = n;
                if (local_copy(c, w, c->src, n))
                        return 0;
                break;
        case DIWARP_WR_RDMA_READ:
                if (w->total_len > UINT32_MAX) {
                        wqe_local_error(c, w, DIWARP_WC_LOC_LEN_ERR, "RDMA Read longer than 4 GiB");
                        return -1;
                }
                n = sge_range_iov(qp, w, 0, w->total_len, DIWARP_ACCESS_LOCAL_WRITE, tmp,
                                  DW_MAX_SGE);
                if (n < 0) {
                        wqe_local_error(c, w, DIWARP_WC_LOC_PROT_ERR,
                                        "RDMA Read sink SGE fails its lkey check");
                        return -1;
                }
                if (local_copy(c, w, tmp, n))
                        return 0;
                break;
        case DIWARP_WR_ATOMIC_CMP_AND_SWP:
        case DIWARP_WR_ATOMIC_FETCH_AND_ADD:
                n = sge_range_iov(qp, w, 0, 8, DIWARP_ACCESS_LOCAL_WRITE, tmp, DW_MAX_SGE);
                if (n < 0) {
                        wqe_local_error(
                            c, w, n == -EMSGSIZE ? DIWARP_WC_LOC_LEN_ERR : DIWARP_WC_LOC_PROT_ERR,
                            "atomic result SGE is not 8 writable bytes");
                        return -1;
                }
                break;
        case DIWARP_WR_LOCAL_INV:
        case DIWARP_WR_BIND_MW: {
                char why[160];
                enum diwarp_wc_status st = dw_qp_run_local_wqe(qp, w, why, sizeof(why));
                if (st != DIWARP_WC_SUCCESS) {
                        wqe_local_error(c, w, st, why);
                        return -1;
                }
                w->status = DIWARP_WC_SUCCESS;
                w->byte_len = 0;
                w->flags |= DW_WQE_DONE;
                retire(c);
                return 0;
        }
        default:
                wqe_local_error(c, w, DIWARP_WC_LOC_QP_OP_ERR, "opcode not supported on RC");
                return -1;
        }
        c->cur = w;
        c->cur_off = 0;
        c->cur_phase = (w->opcode == DIWARP_WR_SEND_WITH_IMM) ? 1 : 0;
        return 1;
}

static void build_imm(struct dw_rc_conn *c, struct dw_wqe *w, bool with_send)
{
        struct dw_rdmap_hdr h;
        uint8_t imm[DW_RDMAP_IMM_HDR_LEN] = {0};
        bool se = w->send_flags & DIWARP_SEND_SOLICITED;

        /* With a Send the Send carries the SE bit; a lone immediate carries it. */
        dw_rdmap_hdr_init(&h, (!with_send && se) ? DW_RDMAP_IMM_DATA_SE : DW_RDMAP_IMM_DATA);
        h.ddp.msn = c->msn_send++;
        memcpy(imm, &w->imm_data, 4);
        imm[4] = with_send ? DW_IMM_WITH_SEND : 0;
        add_fpdu(c, &h, imm, sizeof(imm), NULL, 0, 0);
}

/* Emits the next FPDU of the current SQ WQE. 1: FPDU added, 0: nothing to do,
 * -1: error (handled). */
static int tx_sq_fpdu(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;

        while (!c->cur) {
                int r = start_wqe(c);
                if (r < 0)
                        return -1;
                if (r == 0) {
                        if (!sq_ready(c))
                                return 0;
                        continue;
                }
        }
        struct dw_wqe *w = c->cur;
        struct dw_rdmap_hdr h;
        struct iovec pay[DW_MAX_SGE];

        switch (w->opcode) {
        case DIWARP_WR_SEND_WITH_IMM:
                if (c->cur_phase == 1) {
                        build_imm(c, w, true);
                        c->cur_phase = 0;
                        return 1;
                }
                /* fall through */
        case DIWARP_WR_SEND:
        case DIWARP_WR_SEND_WITH_INV: {
                bool se = w->send_flags & DIWARP_SEND_SOLICITED;
                bool inv = w->opcode == DIWARP_WR_SEND_WITH_INV;
                uint64_t seg = w->total_len - c->cur_off;
                if (seg > seg_max(c, false))
                        seg = seg_max(c, false);
                dw_rdmap_hdr_init(&h, inv ? (se ? DW_RDMAP_SEND_SE_INVAL : DW_RDMAP_SEND_INVAL)
                                          : (se ? DW_RDMAP_SEND_SE : DW_RDMAP_SEND));
                if (inv)
                        h.inval_stag = w->invalidate_rkey;
                if (c->cur_off == 0)
                        w->msn = c->msn_send;
                h.ddp.msn = w->msn;
                h.ddp.mo = (uint32_t)c->cur_off;
                bool last = c->cur_off + seg == w->total_len;
                h.ddp.last = last;
                int np = gather_src(c, c->cur_off, seg, pay);
                add_fpdu(c, &h, NULL, 0, pay, np, seg);
                c->cur_off += seg;
                if (last) {
                        c->msn_send++;
                        mark_sent(c, w);
                        c->cur = NULL;
                }
                return 1;
        }
        case DIWARP_WR_RDMA_WRITE:
        case DIWARP_WR_RDMA_WRITE_WITH_IMM: {
                if (c->cur_phase == 1) {
                        build_imm(c, w, false);
                        mark_sent(c, w);
                        c->cur = NULL;
                        return 1;
                }
                uint64_t seg = w->total_len - c->cur_off;
                if (seg > seg_max(c, true))
                        seg = seg_max(c, true);
                dw_rdmap_hdr_init(&h, DW_RDMAP_WRITE);
                h.ddp.stag = w->rkey;
                h.ddp.to = w->remote_addr + c->cur_off;
                bool last = c->cur_off + seg == w->total_len;
                h.ddp.last = last;
                int np = gather_src(c, c->cur_off, seg, pay);
                add_fpdu(c, &h, NULL, 0, pay, np, seg);
                c->cur_off += seg;
                if (last) {
                        if (w->opcode == DIWARP_WR_RDMA_WRITE_WITH_IMM) {
                                c->cur_phase = 1;
                        } else {
                                mark_sent(c, w);
                                c->cur = NULL;
                        }
                }
                return 1;
        }
        case DIWARP_WR_RDMA_READ: {
                struct dw_rdmap_rreq rq = {
                    .sink_stag = w->num_sge ? w->sge[0].lkey : 0,
                    .sink_to = w->num_sge ? w->sge[0].addr : 0,
                    .rdma_rd_sz = (uint32_t)w->total_len,
                    .src_stag = w->rkey,
                    .src_to = w->remote_addr,
                };
                uint8_t ext[DW_RDMAP_RREQ_HDR_LEN];
                dw_rdmap_rreq_encode(&rq, ext, sizeof(ext));
                dw_rdmap_hdr_init(&h, DW_RDMAP_READ_REQ);
                h.ddp.msn = c->msn_rreq++;
                struct dw_rc_orq *o = &c->orq[(c->orq_head + c->orq_count) % DW_RC_MAX_RD];
                *o = (struct dw_rc_orq){.wqe = w,
                                        .atomic = false,
                                        .msn = h.ddp.msn,
                                        .sink_stag = rq.sink_stag,
                                        .sink_to = rq.sink_to,
                                        .len = w->total_len};
                c->orq_count++;
                add_fpdu(c, &h, ext, sizeof(ext), NULL, 0, 0);
                c->cur = NULL;
                return 1;
        }
        case DIWARP_WR_ATOMIC_CMP_AND_SWP:
        case DIWARP_WR_ATOMIC_FETCH_AND_ADD: {
                struct dw_rdmap_atomic_req ar;
                dw_rdmap_atomic_req_build(w, ++c->atomic_req_id, &ar);
                uint8_t ext[DW_RDMAP_ATOMIC_REQ_HDR_LEN];
                dw_rdmap_atomic_req_encode(&ar, ext, sizeof(ext));
                dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_REQ);
                h.ddp.msn = c->msn_rreq++;
                struct dw_rc_orq *o = &c->orq[(c->orq_head + c->orq_count) % DW_RC_MAX_RD];
                *o = (struct dw_rc_orq){
                    .wqe = w, .atomic = true, .msn = h.ddp.msn, .len = 8, .sink_to = ar.req_id};
                c->orq_count++;
                add_fpdu(c, &h, ext, sizeof(ext), NULL, 0, 0);
                c->cur = NULL;
                return 1;
        }
        default:
                break;
        }
        (void)qp;
        return 0;
}

/* Next FPDU of the head IRQ entry (Read Response segment or Atomic Response). */
static int tx_irq_fpdu(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        struct dw_rc_irq *e = &c->irq[c->irq_head];
        struct dw_rdmap_hdr h;

        if (e->atomic) {
                uint8_t *host = NULL;
                enum dw_prot_status st =
                    dw_mr_check_remote(&qp->dev->mrs, e->areq.remote_stag, qp->pd, qp->qpn,
                                       DIWARP_ACCESS_REMOTE_ATOMIC, e->areq.remote_to, 8, &host);
                if (st != DW_PROT_OK) {
                        memcpy(c->rh_raw, e->term_hdr, DW_DDP_UNTAGGED_HDR_LEN);
                        c->rx_ulen = DW_DDP_UNTAGGED_HDR_LEN + DW_RDMAP_ATOMIC_REQ_HDR_LEN;
                        fail_prot(c, st, DW_PROT_CTX_ATOMIC, NULL, "Atomic target");
                        return -1;
                }
                struct dw_rdmap_atomic_resp ar = {
                    .req_id = e->areq.req_id,
                    .orig_data = dw_rdmap_atomic_exec((uint64_t *)host, &e->areq)};
                uint8_t ext[DW_RDMAP_ATOMIC_RESP_HDR_LEN];
                dw_rdmap_atomic_resp_encode(&ar, ext, sizeof(ext));
                dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_RESP);
                h.ddp.msn = c->msn_aresp++;
                add_fpdu(c, &h, ext, sizeof(ext), NULL, 0, 0);
                c->irq_head = (c->irq_head + 1) % DW_RC_MAX_RD;
                c->irq_count--;
                return 1;
        }

        uint32_t seg = e->len - e->done;
        if (seg > seg_max(c, true))
                seg = seg_max(c, true);
        uint8_t *host = NULL;
        /* Checked again per segment: the region may have been deregistered or
         * invalidated since the request arrived. */
        enum dw_prot_status st =
            dw_mr_check_remote(&qp->dev->mrs, e->src_stag, qp->pd, qp->qpn,
                               DIWARP_ACCESS_REMOTE_READ, e->src_to + e->done, seg, &host);
        if (st != DW_PROT_OK) {
                memcpy(c->rh_raw, e->term_hdr, DW_DDP_UNTAGGED_HDR_LEN);
                c->rx_ulen = DW_DDP_UNTAGGED_HDR_LEN + DW_RDMAP_RREQ_HDR_LEN;
                fail_prot(c, st, DW_PROT_CTX_READ_SOURCE, e->term_hdr + DW_DDP_UNTAGGED_HDR_LEN,
                          "RDMA Read source");
                return -1;
        }
        dw_rdmap_hdr_init(&h, DW_RDMAP_READ_RESP);
        h.ddp.stag = e->sink_stag;
        h.ddp.to = e->sink_to + e->done;
        bool last = e->done + seg == e->len;
        h.ddp.last = last;
        struct iovec pay = {host, seg};
        add_fpdu(c, &h, NULL, 0, &pay, seg ? 1 : 0, seg);
        e->done += seg;
        if (last) {
                c->irq_head = (c->irq_head + 1) % DW_RC_MAX_RD;
                c->irq_count--;
        }
        return 1;
}

static void build_batch(struct dw_rc_conn *c)
{
        c->nslot = 0;
        c->ndone = 0;
        c->iov_pos = c->iov_cnt = 0;
        c->batch_bytes = 0;

        if (c->term_pending && !c->term_queued) {
                add_term(c);
                c->term_queued = true;
                return;
        }
        if (c->state != DW_RC_UP)
                return;
        while (c->nslot < c->slot_cap && c->iov_cnt + DW_MAX_SGE + 2 <= c->iov_cap &&
               c->batch_bytes < DW_RC_TX_BATCH_BYTES) {
                bool irq = c->irq_count > 0;
                bool sq = sq_ready(c);
                if (!irq && !sq)
                        break;
                bool use_irq = irq && (!sq || c->irq_turn);
                c->irq_turn = !use_irq;
                int r = use_irq ? tx_irq_fpdu(c) : tx_sq_fpdu(c);
                if (r <= 0 || c->term_pending)
                        break;
        }
        if (c->term_pending && !c->term_queued && c->nslot < c->slot_cap) {
                add_term(c);
                c->term_queued = true;
        }
        /* Bulk batches: every DW_RC_MSS_RECHECK FPDUs the MSS is read again
         * (it grows with the peer's window on loopback, and a path MTU
         * change moves it); a small-message exchange never pays. */
        if (c->batch_bytes >= DW_RC_MSS_BULK &&
            (c->mss_age += (uint32_t)c->nslot) >= DW_RC_MSS_RECHECK) {
                c->mss_age = 0;
                c->mulpdu = rc_mulpdu(c->fd);
        }
}

/* The other end of the stream is in this process (rc_local.h): waits until
 * it has consumed the stream through upto, driving it when its progress is
 * idle, for at most DW_RC_LOCAL_WAIT_NS (only a responder that makes no
 * progress, e.g. its thread descheduled on a loaded machine, takes that
 * long), and not while it holds a Send for want of a receive WQE for ever
 * (rnr_retry 7). Returns
 * the offset where it
 * terminated the stream, or DW_RC_END_NONE. */
#define DW_RC_LOCAL_WAIT_NS (1000u * 1000 * 1000)
static int rc_rx(struct dw_rc_conn *c);
static bool tx_has_work(struct dw_rc_conn *c);
static uint64_t local_peer_wait(struct dw_rc_conn *c, uint64_t upto)
{
        uint64_t consumed, term_at = DW_RC_END_NONE, deadline = 0;
        bool waiting;

        dw_rc_end_set_waiting(c->end_slot, true);
        while (dw_rc_end_peer_state(c->end_slot, &consumed, &term_at, &waiting) && !waiting &&
               consumed < upto && term_at == DW_RC_END_NONE) {
                bool locked;
                struct dw_rc_conn *peer = dw_rc_end_lock_peer(c->end_slot, c->qp->dev, &locked);
                bool held = false;
                if (peer) {
                        /* As the progress step does: what arrived may give
                         * the peer something to send (Read Responses). */
                        if (rc_rx(peer) && peer->fd >= 0 && tx_has_work(peer))
                                rc_tx(peer);
                        /* A Send it holds for want of a receive WQE, with no
                         * bound (rnr_retry 7), waits for the program, which
                         * may be this very caller. A bounded hold ends in a
                         * Terminate this WR must report. */
                        held = peer->rx_wait_recv && !peer->rnr_deadline_ns;
                        dw_rc_end_unlock_peer(peer, locked);
                }
                if (held)
                        break;
                uint64_t now = dw_now_ns();
                if (!deadline)
                        deadline = now + DW_RC_LOCAL_WAIT_NS;
                else if (now > deadline)
                        break;
                if (!peer)
                        sched_yield();
        }
        dw_rc_end_set_waiting(c->end_slot, false);
        return term_at;
}

static void batch_done(struct dw_rc_conn *c)
{
        uint64_t term_at = DW_RC_END_NONE;
        bool sync = false;

        for (int i = 0; i < c->ndone && c->end_slot >= 0; i++)
                if (c->qp->sq_sig_all || (c->done_wqe[i]->send_flags & DIWARP_SEND_SIGNALED))
                        sync = true;
        if (sync && dw_rc_end_linked(c->end_slot))
                term_at = local_peer_wait(c, c->done_end[c->ndone - 1]);
        for (int i = 0; i < c->ndone; i++) {
                struct dw_wqe *w = c->done_wqe[i];
                /* The other end terminated the stream before this WR's end:
                 * it completes with the error its Terminate carries. */
                if (c->done_end[i] > term_at)
                        break;
                w->status = DIWARP_WC_SUCCESS;
                w->byte_len = (uint32_t)w->total_len;
                w->flags |= DW_WQE_DONE;
        }
        c->ndone = 0;
        c->nslot = 0;
        c->iov_pos = c->iov_cnt = 0;
        if (c->qp->state != DIWARP_QPS_ERR)
                retire(c);
        if ((c->term_queued || c->fin_after_batch) && c->fd >= 0) {
                /* Everything up to the Terminate (or the graceful end) is out:
                 * FIN, then wait for the peer's EOF before closing, so the
                 * Terminate is read rather than lost to a reset. */
                shutdown(c->fd, SHUT_WR);
                c->fin_after_batch = false;
                c->term_pending = false;
                if (c->state == DW_RC_UP)
                        dw_rc_set_state(c, DW_RC_CLOSING, "FIN sent");
        }
}

static int rc_tx_locked(struct dw_rc_conn *c, size_t *writtenp);

static int rc_tx(struct dw_rc_conn *c)
{
        size_t written = 0;
        int work = 0;

        if (c->fd < 0 || (c->state != DW_RC_UP && c->state != DW_RC_CLOSING) || c->in_tx)
                return 0;
        c->in_tx = true;
        work = rc_tx_locked(c, &written);
        c->in_tx = false;
        return work;
}

static int rc_tx_locked(struct dw_rc_conn *c, size_t *writtenp)
{
        size_t written = *writtenp;
        int work = 0;

        for (;;) {
                if (c->iov_pos == c->iov_cnt) {
                        if (c->iov_cnt) {
                                batch_done(c);
                                /* The common end of a small send: nothing more
                                 * queued, no batch to build. */
                                if (c->fd >= 0 && !c->term_pending && !c->irq_count && !c->cur &&
                                    !dw_wq_next(&c->qp->sq))
                                        break;
                        }
                        if (c->fd < 0)
                                return work;
                        build_batch(c);
                        if (c->iov_cnt == 0)
                                break;
                }
                int cnt = c->iov_cnt - c->iov_pos;
                if (cnt > DW_RC_IOV_MAX)
                        cnt = DW_RC_IOV_MAX;
                ssize_t n = dw_tcp_writev(c->fd, c->iov + c->iov_pos, cnt);
                if (n > 0)
                        c->tx_sent += (size_t)n;
                if (n == -EAGAIN) {
                        set_watch(c, true);
                        return work;
                }
                if (n < 0) {
                        stream_failed(c, (int)n);
                        return work;
                }
                struct iovec *p = c->iov + c->iov_pos;
                int left = c->iov_cnt - c->iov_pos;
                dw_iov_advance(&p, &left, (size_t)n);
                c->iov_pos = (int)(p - c->iov);
                /* Zero-length entries at the end of a batch count as written. */
                while (c->iov_pos < c->iov_cnt && c->iov[c->iov_pos].iov_len == 0)
                        c->iov_pos++;
                written += (size_t)n;
                work++;
                c->qp->dev->ctr.tx_bytes += (size_t)n;
                if (written >= DW_RC_TX_STEP_BYTES) {
                        /* Yield for fairness; EPOLLOUT brings us back. */
                        set_watch(c, true);
                        return work;
                }
        }
        set_watch(c, false);
        return work;
}

/* ---------------------------------------------------------------- receive */

/* IB semantics: the first message on a QP still in RTR (the passive side of
 * an IB-style connect that has not moved to RTS yet) raises Communication
 * Established, once. */
static void rx_comm_est(struct dw_rc_conn *c)
{
        if (!c->comm_est) {
                c->comm_est = true;
                if (c->qp->state == DIWARP_QPS_RTR)
                        dw_async_qp(c->qp, DIWARP_EVENT_COMM_EST);
        }
}

static void rx_complete_recv(struct dw_rc_conn *c, struct dw_wqe *w, enum diwarp_wc_status st,
                             enum diwarp_wc_opcode op, uint32_t len, unsigned flags, uint32_t imm,
                             uint32_t inv, bool solicited)
{
        struct diwarp_wc wc = {
            .wr_id = w->wr_id,
            .status = st,
            .opcode = op,
            .byte_len = len,
            .imm_data = imm,
            .invalidated_rkey = inv,
            .wc_flags = flags,
            .src_qp = c->qp->attr.dest_qp_num,
        };
        dw_qp_complete_recv(c->qp, &wc, solicited);
        dw_qp_recv_pop(c->qp);
}

/* A receive WQE fails because of what the peer sent; the Terminate we send
 * for it says why, and the completion carries the same code in vendor_err. */
static void rx_fail_recv(struct dw_rc_conn *c, struct dw_wqe *w, enum diwarp_wc_status st,
                         struct dw_term_error te)
{
        struct diwarp_wc wc = {
            .wr_id = w->wr_id,
            .status = st,
            .opcode = DIWARP_WC_RECV,
            .vendor_err = dw_term_vendor_err(te),
            .src_qp = c->qp->attr.dest_qp_num,
        };
        dw_qp_complete_recv(c->qp, &wc, false);
        dw_qp_recv_pop(c->qp);
}

static struct dw_wqe *rx_take_recv(struct dw_rc_conn *c)
{
        struct dw_wqe *w = dw_qp_recv_head(c->qp);

        if (!w) {
                c->qp->ctr.rx_dropped_no_recv++;
                c->qp->dev->ctr.rx_dropped_no_recv++;
                fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                               DW_TERM_DDP_U_NO_BUFFER, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                               "untagged message but no receive WQE posted");
        }
        return w;
}

/* InfiniBand's RNR timer encoding (min_rnr_timer 0..31), in 10 us units. */
static const uint32_t rnr_timer_10us[32] = {65536, 1,    2,    3,     4,     6,     8,     12,
                                            16,    24,   32,   48,    64,    96,    128,   192,
                                            256,   384,  512,  768,   1024,  1536,  2048,  3072,
                                            4096,  6144, 8192, 12288, 16384, 24576, 32768, 49152};

static void rx_wait_end(struct dw_rc_conn *c)
{
        c->rx_wait_recv = false;
        dw_rc_timer_del(c->qp->dev, c);
        set_watch(c, (c->watch_events & EPOLLOUT) != 0);
}

/* A Send (or the Immediate Data of a Write with Immediate) found no receive
 * WQE posted. An InfiniBand requester would send it again after an RNR NAK,
 * rnr_retry times min_rnr_timer (7: for ever), and programs written for
 * InfiniBand post receives late counting on that. RC over TCP holds the
 * stream instead, as long as that retrying would last: the socket is not
 * read, so TCP's window stops the sender and nothing is lost or sent twice;
 * a receive posted meanwhile takes the Send. Then, or at once with rnr_retry
 * 0, the Send fails as RFC 5041 says (Terminate, no buffer). Nothing of it
 * shows on the wire.
 *
 * A connection of the native CM whose peer has closed its end (its FIN or
 * reset is in, behind the held Send) ends then, as an InfiniBand disconnect
 * ends the retrying: the held Send is dropped and the QP goes to ERR
 * (DISCONNECTED for rdma_cm) without a Terminate nobody would read. A peer
 * that closes with more unsent data behind the held Send (qperf's rc_bw
 * client) cannot send its FIN through the closed window: its socket resets
 * the stream when it gives up, after its peer timeout (TCP_USER_TIMEOUT). An
 * IB-style stream stays held: there the peer's close leaves the QP as it is
 * (stream_failed).
 *
 * 1 while the stream waits, 0 when the Send is to fail, -1 once the
 * connection is gone. */
static int rx_wait_for_recv(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        uint64_t now = dw_now_ns();

        if (!c->rx_wait_recv) {
                if (qp->attr.rnr_retry == 0)
                        return 0;
                c->rx_wait_recv = true;
                c->rnr_deadline_ns = qp->attr.rnr_retry >= 7
                                         ? 0
                                         : now + (uint64_t)qp->attr.rnr_retry *
                                                     rnr_timer_10us[qp->attr.min_rnr_timer & 31] *
                                                     10000ull;
                qp->ctr.rnr_naks++;
                qp->dev->ctr.rnr_naks++;
                set_watch(c, (c->watch_events & EPOLLOUT) != 0);
        } else if (c->rnr_deadline_ns && now >= c->rnr_deadline_ns) {
                rx_wait_end(c);
                return 0;
        } else if (!c->ib_style && dw_tcp_peer_closed(c->fd)) {
                char pb[32];
                dw_info("RC QP %#x peer %s: the peer closed the connection while its Send waited "
                        "for a receive WQE; dropped",
                        qp->qpn, peer_str(c, pb, sizeof(pb)));
                rx_wait_end(c);
                qp->ctr.rx_dropped_no_recv++;
                qp->dev->ctr.rx_dropped_no_recv++;
                peer_gone_fail(c);
                return -1;
        }
        /* SRQ receives arrive without dw_rc_post_recv: look again soon. */
        dw_rc_timer_add(qp->dev, c, now + 1000000ull);
        return 1;
}

/* Resolves where the payload of the data segment in c->rh goes. 0, 1 (a
 * Send waits for a receive WQE: nothing consumed) or -1 (failed; the
 * Terminate is queued). */
static int rx_resolve(struct dw_rc_conn *c, uint32_t payload)
{
        struct dw_qp *qp = c->qp;
        const struct dw_rdmap_hdr *h = &c->rh;
        int n;

        c->ntgt = c->tgt_pos = 0;
        switch (h->opcode) {
        case DW_RDMAP_WRITE: {
                uint8_t *host = NULL;
                enum dw_prot_status st = DW_PROT_OK;
                /* diwarp puts nothing between its flagged Immediate Data and
                 * the Send: a Write there comes from an RFC 7306 peer, whose
                 * Immediate Data stood alone. */
                if (c->imm_pending && !rx_imm_alone(c, c->imm_value, false))
                        return -1;
                st = dw_rdmap_check_remote(qp, DIWARP_ACCESS_REMOTE_WRITE, h->ddp.stag, h->ddp.to,
                                           payload, &host);
                if (st != DW_PROT_OK) {
                        char what[80];
                        snprintf(what, sizeof(what), "RDMA Write sink STag %#x TO %#llx len %zu",
                                 h->ddp.stag, (unsigned long long)h->ddp.to, (size_t)payload);
                        fail_prot(c, st, DW_PROT_CTX_TAGGED_SINK, NULL, what);
                        return -1;
                }
                if (payload) {
                        c->tgt[0].iov_base = host;
                        c->tgt[0].iov_len = payload;
                        c->ntgt = 1;
                }
                c->rx_write_bytes += payload;
                if (h->ddp.last) {
                        c->rx_write_len = c->rx_write_bytes;
                        c->rx_write_bytes = 0;
                }
                return 0;
        }
        case DW_RDMAP_READ_RESP: {
                struct dw_rc_orq *o = &c->orq[c->orq_head];
                if (!c->orq_count || o->atomic) {
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                       DW_TERM_RDMAP_UNEXPECTED_OPCODE, true, NULL,
                                       DIWARP_EVENT_QP_REQ_ERR,
                                       "RDMA Read Response without an outstanding Read");
                        return -1;
                }
                if (payload && h->ddp.stag != o->sink_stag) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED,
                                       DW_TERM_DDP_T_INVALID_STAG, true, NULL,
                                       DIWARP_EVENT_QP_REQ_ERR,
                                       "RDMA Read Response names another sink STag");
                        return -1;
                }
                if ((payload && h->ddp.to != o->sink_to + o->done) || o->done + payload > o->len) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED,
                                       DW_TERM_DDP_T_BASE_BOUNDS, true, NULL,
                                       DIWARP_EVENT_QP_REQ_ERR,
                                       "RDMA Read Response outside the requested range");
                        return -1;
                }
                n = sge_range_iov(qp, o->wqe, o->done, payload, DIWARP_ACCESS_LOCAL_WRITE, c->tgt,
                                  DW_MAX_SGE);
                if (n < 0) {
                        struct dw_wqe *w = o->wqe;
                        drop_wqe_refs(c);
                        complete_through(c, w, DIWARP_WC_LOC_PROT_ERR, 0);
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP,
                                       DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
                                       DW_TERM_RDMAP_CATASTROPHIC_STREAM, false, NULL, -1,
                                       "RDMA Read sink no longer registered");
                        return -1;
                }
                c->ntgt = n;
                return 0;
        }
        default: { /* Send family */
                if (h->ddp.msn != c->msn_expect_send) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                       DW_TERM_DDP_U_MSN_RANGE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                       "Send with unexpected MSN");
                        return -1;
                }
                if (!c->rx_wqe) {
                        if (h->ddp.mo != 0) {
                                fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                               DW_TERM_DDP_U_INVALID_MO, true, NULL,
                                               DIWARP_EVENT_QP_REQ_ERR,
                                               "Send segment with MO != 0 starts a message");
                                return -1;
                        }
                        if (c->rtr_send_expected && payload == 0 && h->ddp.last) {
                                /* RFC 6581 RTR zero-length Send: no receive WQE. */
                                return 0;
                        }
                        if (!dw_qp_recv_head(qp)) {
                                int held = rx_wait_for_recv(c);
                                if (held)
                                        return held;
                        }
                        if (c->rx_wait_recv)
                                rx_wait_end(c);
                        c->rx_wqe = rx_take_recv(c);
                        if (!c->rx_wqe)
                                return -1;
                        c->rx_msg_len = 0;
                }
                if (h->ddp.mo != c->rx_msg_len) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                       DW_TERM_DDP_U_INVALID_MO, true, NULL,
                                       DIWARP_EVENT_QP_REQ_ERR, "Send segment out of order (MO)");
                        return -1;
                }
                n = sge_range_iov(qp, c->rx_wqe, c->rx_msg_len, payload, DIWARP_ACCESS_LOCAL_WRITE,
                                  c->tgt, DW_MAX_SGE);
                if (n < 0) {
                        struct dw_wqe *w = c->rx_wqe;
                        bool too_long = n == -EMSGSIZE;
                        c->rx_wqe = NULL;
                        struct dw_term_error te = dw_rdmap_recv_term(n);
                        rx_fail_recv(c, w,
                                     too_long ? DIWARP_WC_LOC_LEN_ERR : DIWARP_WC_LOC_PROT_ERR, te);
                        fail_with_term(c, true, te.layer, te.etype, te.ecode, true, NULL,
                                       too_long ? DIWARP_EVENT_QP_REQ_ERR
                                                : DIWARP_EVENT_QP_ACCESS_ERR,
                                       too_long ? "Send longer than the receive WQE"
                                                : "receive WQE SGE fails its lkey check");
                        return -1;
                }
                c->ntgt = n;
                return 0;
        }
        }
}

/* The whole data segment (payload + trailer) is in: check CRC, then apply. */
static void rx_data_place(struct dw_rc_conn *c);

/* A data FPDU is whole: placed, and counted as consumed unless it failed. */
static void rx_data_end(struct dw_rc_conn *c)
{
        rx_data_place(c);
        if (c->rx_state != DW_RC_RX_STOP) {
                c->rx_done += c->rx_fpdu_len;
                if (c->end_slot >= 0)
                        dw_rc_end_consumed(c->end_slot, c->rx_done);
        }
}

static void rx_data_place(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        const struct dw_rdmap_hdr *h = &c->rh;
        uint32_t pad = c->trl_len - DW_MPA_CRC_LEN;

        c->rx_state = DW_RC_RX_HDR;
        if (c->crc) {
                uint32_t want = dw_crc32c_final(dw_crc32c_update(c->crc_state, c->trl, pad));
                const uint8_t *p = c->trl + pad;
                uint32_t got = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                               (uint32_t)p[3] << 24;
                if (want != got) {
                        qp->ctr.crc_errors++;
                        qp->dev->ctr.crc_errors++;
                        fail_with_term(c, true, DW_TERM_LAYER_LLP, DW_TERM_LLP_MPA, DW_TERM_LLP_CRC,
                                       true, NULL, DIWARP_EVENT_QP_FATAL, "MPA CRC mismatch");
                        return;
                }
        }
        qp->ctr.rx_packets++;
        qp->ctr.rx_bytes += c->rx_payload;

        switch (h->opcode) {
        case DW_RDMAP_WRITE:
                return;
        case DW_RDMAP_READ_RESP: {
                struct dw_rc_orq *o = &c->orq[c->orq_head];
                o->done += c->rx_payload;
                if (!h->ddp.last)
                        return;
                if (o->done != o->len) {
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                       DW_TERM_RDMAP_UNSPECIFIED, true, NULL,
                                       DIWARP_EVENT_QP_REQ_ERR,
                                       "RDMA Read Response shorter than requested");
                        return;
                }
                o->wqe->status = DIWARP_WC_SUCCESS;
                o->wqe->byte_len = (uint32_t)o->len;
                o->wqe->flags |= DW_WQE_DONE;
                c->orq_head = (c->orq_head + 1) % DW_RC_MAX_RD;
                c->orq_count--;
                retire(c);
                return;
        }
        default: {
                bool se = h->opcode == DW_RDMAP_SEND_SE || h->opcode == DW_RDMAP_SEND_SE_INVAL;
                bool inv = h->opcode == DW_RDMAP_SEND_INVAL || h->opcode == DW_RDMAP_SEND_SE_INVAL;
                if (!c->rx_wqe) { /* absorbed RTR Send */
                        c->rtr_send_expected = false;
                        c->msn_expect_send++;
                        return;
                }
                c->rx_msg_len += c->rx_payload;
                if (!h->ddp.last)
                        return;
                struct dw_wqe *w = c->rx_wqe;
                unsigned flags = 0;
                uint32_t imm = 0;
                c->rx_wqe = NULL;
                c->msn_expect_send++;
                if (inv) {
                        enum dw_prot_status st =
                            dw_mr_invalidate_status(&qp->dev->mrs, h->inval_stag, qp->pd, qp->qpn);
                        if (st != DW_PROT_OK) {
                                struct dw_term_error te = {DW_TERM_LAYER_RDMAP,
                                                           DW_TERM_RDMAP_REMOTE_OPERATION,
                                                           DW_TERM_RDMAP_STAG_NOT_INVALIDATED};
                                dw_prot_status_to_term(st, DW_PROT_CTX_INVALIDATE, &te);
                                rx_fail_recv(c, w, DIWARP_WC_REM_INV_REQ_ERR, te);
                                fail_with_term(c, true, te.layer, te.etype, te.ecode, true, NULL,
                                               DIWARP_EVENT_QP_ACCESS_ERR,
                                               "Send with Invalidate of an STag that cannot be "
                                               "invalidated");
                                return;
                        }
                        flags |= DIWARP_WC_WITH_INV;
                }
                if (c->imm_pending) {
                        flags |= DIWARP_WC_WITH_IMM;
                        imm = c->imm_value;
                        c->imm_pending = false;
                }
                rx_complete_recv(c, w, DIWARP_WC_SUCCESS, DIWARP_WC_RECV, (uint32_t)c->rx_msg_len,
                                 flags, imm, inv ? h->inval_stag : 0, se);
                return;
        }
        }
}

/* diwarp's Send with Immediate: byte 4 exactly 0x01, bytes 5-7 zero, without
 * SE (the Send carries it). */
static bool imm_with_send(uint8_t opcode, const struct dw_rdmap_imm *im)
{
        return opcode == DW_RDMAP_IMM_DATA && im->data[4] == DW_IMM_WITH_SEND && !im->data[5] &&
               !im->data[6] && !im->data[7];
}

/* An Immediate Data message on its own (RFC 7306): it consumes the next
 * receive WQE, which completes as RECV_RDMA_WITH_IMM with the immediate and
 * byte_len = the length of the RDMA Write message before it (a Write with
 * Immediate Data), 0 when no Write came since the previous Immediate Data
 * (an RFC 7306 peer's Immediate Data operation). false: no receive
 * WQE (the Terminate is queued). */
static bool rx_imm_alone(struct dw_rc_conn *c, uint32_t imm, bool se)
{
        c->imm_pending = false;
        struct dw_wqe *w = rx_take_recv(c);
        if (!w)
                return false;
        uint32_t len = (uint32_t)c->rx_write_len;
        c->rx_write_len = 0;
        rx_complete_recv(c, w, DIWARP_WC_SUCCESS, DIWARP_WC_RECV_RDMA_WITH_IMM, len,
                         DIWARP_WC_WITH_IMM, imm, 0, se);
        return true;
}

static void rx_control(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen)
{
        struct dw_qp *qp = c->qp;
        const struct dw_rdmap_hdr *h = &c->rh;
        const char *why = NULL;

        qp->ctr.rx_packets++;
        switch (h->opcode) {
        case DW_RDMAP_READ_REQ:
        case DW_RDMAP_ATOMIC_REQ: {
                bool atomic = h->opcode == DW_RDMAP_ATOMIC_REQ;
                if (h->ddp.msn != c->msn_expect_rreq) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                       DW_TERM_DDP_U_MSN_RANGE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                       "Read/Atomic Request MSN");
                        return;
                }
                if (c->irq_count >= c->ird || c->irq_count >= DW_RC_MAX_RD) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                       DW_TERM_DDP_U_NO_BUFFER, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                       "more Read/Atomic Requests outstanding than our IRD");
                        return;
                }
                struct dw_rc_irq *e = &c->irq[(c->irq_head + c->irq_count) % DW_RC_MAX_RD];
                memset(e, 0, sizeof(*e));
                memcpy(e->term_hdr, c->rh_raw, DW_DDP_UNTAGGED_HDR_LEN);
                struct dw_rdmap_refusal ref;
                int r;
                if (!atomic) {
                        struct dw_rdmap_rreq rq;
                        r = dw_rdmap_read_req_accept(qp, ext, extlen, &rq, &ref);
                        if (r == -EACCES) {
                                fail_prot(c, ref.st, DW_PROT_CTX_READ_SOURCE, ext,
                                          "RDMA Read Request source");
                                return;
                        }
                        if (r < 0) {
                                fail_with_term(c, true, ref.te.layer, ref.te.etype, ref.te.ecode,
                                               true, NULL, DIWARP_EVENT_QP_REQ_ERR, ref.why);
                                return;
                        }
                        memcpy(e->term_hdr + DW_DDP_UNTAGGED_HDR_LEN, ext, DW_RDMAP_RREQ_HDR_LEN);
                        e->sink_stag = rq.sink_stag;
                        e->sink_to = rq.sink_to;
                        e->len = rq.rdma_rd_sz;
                        e->src_stag = rq.src_stag;
                        e->src_to = rq.src_to;
                } else {
                        r = dw_rdmap_atomic_req_accept(qp, ext, extlen, &e->areq, NULL, &ref);
                        if (r == -EACCES) {
                                fail_prot(c, ref.st, DW_PROT_CTX_ATOMIC, NULL,
                                          "Atomic Request target");
                                return;
                        }
                        if (r < 0) {
                                fail_with_term(c, true, ref.te.layer, ref.te.etype, ref.te.ecode,
                                               true, NULL, DIWARP_EVENT_QP_REQ_ERR, ref.why);
                                return;
                        }
                        e->atomic = true;
                }
                c->msn_expect_rreq++;
                c->irq_count++;
                return;
        }
        case DW_RDMAP_ATOMIC_RESP: {
                struct dw_rdmap_atomic_resp ar;
                struct dw_rc_orq *o = &c->orq[c->orq_head];
                if (h->ddp.msn != c->msn_expect_aresp ||
                    dw_rdmap_atomic_resp_decode(ext, extlen, &ar, &why) < 0 || !c->orq_count ||
                    !o->atomic || ar.req_id != (uint32_t)o->sink_to) {
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                       DW_TERM_RDMAP_UNEXPECTED_OPCODE, true, NULL,
                                       DIWARP_EVENT_QP_REQ_ERR,
                                       "Atomic Response that matches no outstanding request");
                        return;
                }
                c->msn_expect_aresp++;
                struct iovec iov[DW_MAX_SGE];
                int n = sge_range_iov(qp, o->wqe, 0, 8, DIWARP_ACCESS_LOCAL_WRITE, iov, DW_MAX_SGE);
                struct dw_wqe *w = o->wqe;
                if (n < 0) {
                        drop_wqe_refs(c);
                        complete_through(c, w, DIWARP_WC_LOC_PROT_ERR, 0);
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP,
                                       DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
                                       DW_TERM_RDMAP_CATASTROPHIC_STREAM, false, NULL, -1,
                                       "atomic result buffer no longer registered");
                        return;
                }
                uint8_t val[8];
                memcpy(val, &ar.orig_data, 8); /* host order, as ibverbs returns it */
                size_t off = 0;
                for (int i = 0; i < n; i++) {
                        memcpy(iov[i].iov_base, val + off, iov[i].iov_len);
                        off += iov[i].iov_len;
                }
                w->status = DIWARP_WC_SUCCESS;
                w->byte_len = 8;
                w->flags |= DW_WQE_DONE;
                c->orq_head = (c->orq_head + 1) % DW_RC_MAX_RD;
                c->orq_count--;
                retire(c);
                return;
        }
        case DW_RDMAP_IMM_DATA:
        case DW_RDMAP_IMM_DATA_SE: {
                struct dw_rdmap_imm im;
                if (h->ddp.msn != c->msn_expect_send || c->rx_wqe ||
                    dw_rdmap_imm_decode(ext, extlen, &im, &why) < 0) {
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                       DW_TERM_DDP_U_MSN_RANGE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                       "Immediate Data out of sequence");
                        return;
                }
                uint32_t imm;
                memcpy(&imm, im.data, 4);
                c->msn_expect_send++;
                /* An immediate held for a Send that another Immediate Data
                 * followed instead: the peer is an RFC 7306 peer whose
                 * bytes happened to look like diwarp's flag; it stands
                 * alone, in order, before this one. */
                if (c->imm_pending && !rx_imm_alone(c, c->imm_value, false))
                        return;
                if (imm_with_send(h->opcode, &im)) {
                        c->imm_pending = true;
                        c->imm_value = imm;
                        return;
                }
                rx_imm_alone(c, imm, h->opcode == DW_RDMAP_IMM_DATA_SE);
                return;
        }
        case DW_RDMAP_TERMINATE: {
                struct dw_rdmap_term t;
                char pb[32];
                qp->ctr.terminates_received++;
                qp->dev->ctr.terminates_received++;
                if (dw_rdmap_term_decode(ext, extlen, &t, &why) < 0) {
                        dw_warn("RC QP %#x peer %s: malformed Terminate (%s)", qp->qpn,
                                peer_str(c, pb, sizeof(pb)), why);
                        memset(&t, 0, sizeof(t));
                        t.layer = DW_TERM_LAYER_RDMAP;
                        t.etype = DW_TERM_RDMAP_REMOTE_OPERATION;
                        t.ecode = DW_TERM_RDMAP_UNSPECIFIED;
                }
                dw_warn("RC QP %#x peer %s: Terminate received (layer %u type %u code %#x)",
                        qp->qpn, peer_str(c, pb, sizeof(pb)), t.layer, t.etype, t.ecode);
                int ev;
                enum diwarp_wc_status st =
                    dw_rdmap_term_to_wc((struct dw_term_error){t.layer, t.etype, t.ecode}, &ev);
                /* Which of our WRs caused it: the carried DDP header names it. */
                struct dw_wqe *culprit = NULL;
                struct dw_ddp_hdr dh;
                if (t.has_ddp_hdr && dw_ddp_decode(t.ddp_hdr, t.ddp_hdr_len, &dh, NULL) > 0) {
                        struct dw_wqe *w;
                        if (!dh.tagged && dh.qn == DW_RDMAP_QN_READ_REQ) {
                                for (uint32_t i = 0; i < c->orq_count; i++) {
                                        struct dw_rc_orq *o =
                                            &c->orq[(c->orq_head + i) % DW_RC_MAX_RD];
                                        if (o->msn == dh.msn)
                                                culprit = o->wqe;
                                }
                        }
                        for (uint32_t i = 0; !culprit && (w = dw_wq_at(&qp->sq, i)); i++) {
                                if (!(w->flags & DW_WQE_STARTED) || (w->flags & DW_WQE_DONE))
                                        continue;
                                bool send = w->opcode == DIWARP_WR_SEND ||
                                            w->opcode == DIWARP_WR_SEND_WITH_IMM ||
                                            w->opcode == DIWARP_WR_SEND_WITH_INV;
                                bool write = w->opcode == DIWARP_WR_RDMA_WRITE ||
                                             w->opcode == DIWARP_WR_RDMA_WRITE_WITH_IMM;
                                if ((!dh.tagged && dh.qn == DW_RDMAP_QN_SEND && send &&
                                     w->msn == dh.msn) ||
                                    (dh.tagged && write && w->rkey == dh.stag))
                                        culprit = w;
                        }
                }
                if (!culprit && c->orq_count)
                        culprit = c->orq[c->orq_head].wqe;
                if (!culprit)
                        culprit = c->cur;
                drop_wqe_refs(c);
                complete_through(
                    c, culprit, st,
                    dw_term_vendor_err((struct dw_term_error){t.layer, t.etype, t.ecode}));
                c->term_pending = false;
                c->rx_state = DW_RC_RX_STOP;
                if (qp->state != DIWARP_QPS_ERR)
                        dw_qp_to_error(qp, ev);
                return;
        }
        default:
                fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                               DW_TERM_RDMAP_UNEXPECTED_OPCODE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                               "unexpected RDMAP opcode");
                return;
        }
}

/* Places n bytes into the target iovecs (CRC over them), advancing. */
static void tgt_consume(struct dw_rc_conn *c, const uint8_t *src, size_t n)
{
        while (n && c->tgt_pos < c->ntgt) {
                struct iovec *t = &c->tgt[c->tgt_pos];
                size_t k = t->iov_len < n ? t->iov_len : n;
                if (src) {
                        memcpy(t->iov_base, src, k);
                        /* The CRC over the staged copy, not the target: the
                         * program may change its memory as soon as the
                         * bytes land (qperf's rc_rdma_write_poll_lat writes
                         * its last byte back once it sees it). */
                        if (c->crc)
                                c->crc_state = dw_crc32c_update(c->crc_state, src, k);
                        src += k;
                } else if (c->crc) {
                        c->crc_state = dw_crc32c_update(c->crc_state, t->iov_base, k);
                }
                t->iov_base = (uint8_t *)t->iov_base + k;
                t->iov_len -= k;
                n -= k;
                if (t->iov_len == 0)
                        c->tgt_pos++;
        }
}

static size_t tgt_left(const struct dw_rc_conn *c)
{
        size_t s = 0;
        for (int i = c->tgt_pos; i < c->ntgt; i++)
                s += c->tgt[i].iov_len;
        return s;
}

/* Parses what is staged. 1: progress made, 0: need more bytes, -1: stopped. */
static int rx_parse(struct dw_rc_conn *c)
{
        uint32_t avail = c->rx_end - c->rx_start;
        uint8_t *p = c->rxbuf + c->rx_start;
        const char *why = NULL;

        if (avail < DW_MPA_HDR_LEN + 1)
                return 0;
        uint16_t ulen = dw_get_be16(p);
        c->rx_ulen = ulen;
        bool tagged = p[2] & DW_DDP_CTRL_T;
        uint32_t dlen = tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN;
        memset(c->rh_raw, 0, sizeof(c->rh_raw));
        if (ulen < dlen) {
                memcpy(c->rh_raw, p + 2, avail - 2 < dlen ? avail - 2 : dlen);
                fail_with_term(
                    c, true, DW_TERM_LAYER_DDP, tagged ? DW_TERM_DDP_TAGGED : DW_TERM_DDP_UNTAGGED,
                    tagged ? DW_TERM_DDP_T_INVALID_VERSION : DW_TERM_DDP_U_INVALID_VERSION, false,
                    NULL, DIWARP_EVENT_QP_FATAL, "MPA ULPDU shorter than a DDP header");
                return -1;
        }
        if (avail < DW_MPA_HDR_LEN + dlen)
                return 0;
        memcpy(c->rh_raw, p + 2, dlen);
        ssize_t hr = dw_rdmap_decode(p + 2, dlen, &c->rh, &why);
        if (hr < 0) {
                uint8_t dv = p[2] & DW_DDP_CTRL_DV, rv = (p[3] & DW_RDMAP_CTRL_RV) >> 6;
                if (dv != DW_DDP_VERSION)
                        fail_with_term(c, true, DW_TERM_LAYER_DDP,
                                       tagged ? DW_TERM_DDP_TAGGED : DW_TERM_DDP_UNTAGGED,
                                       tagged ? DW_TERM_DDP_T_INVALID_VERSION
                                              : DW_TERM_DDP_U_INVALID_VERSION,
                                       true, NULL, DIWARP_EVENT_QP_FATAL, why);
                else if (!tagged && dw_get_be32(p + 2 + 6) > DW_RDMAP_QN_ATOMIC_RESP)
                        fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                       DW_TERM_DDP_U_INVALID_QN, true, NULL, DIWARP_EVENT_QP_FATAL,
                                       why);
                else
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                       rv != DW_RDMAP_VERSION ? DW_TERM_RDMAP_INVALID_VERSION
                                                              : DW_TERM_RDMAP_UNEXPECTED_OPCODE,
                                       true, NULL, DIWARP_EVENT_QP_FATAL, why);
                return -1;
        }
        rx_comm_est(c);

        switch (c->rh.opcode) {
        case DW_RDMAP_WRITE:
        case DW_RDMAP_READ_RESP:
        case DW_RDMAP_SEND:
        case DW_RDMAP_SEND_INVAL:
        case DW_RDMAP_SEND_SE:
        case DW_RDMAP_SEND_SE_INVAL: {
                uint32_t hl = DW_MPA_HDR_LEN + dlen;
                c->rx_payload = ulen - dlen;
                c->rx_fpdu_len = (uint32_t)dw_mpa_fpdu_len(ulen, c->crc);
                c->crc_state = 0;
                if (c->crc)
                        c->crc_state = dw_crc32c_update(dw_crc32c_init(), p, hl);
                int rr = rx_resolve(c, c->rx_payload);
                if (rr < 0)
                        return -1;
                if (rr > 0)
                        return 0; /* held: the header stays staged */
                c->rx_big = c->rx_payload > 4096;
                c->rx_start += hl;
                uint32_t have = c->rx_end - c->rx_start;
                uint32_t take = have < c->rx_payload ? have : c->rx_payload;
                if (c->ntgt)
                        tgt_consume(c, c->rxbuf + c->rx_start, take);
                c->rx_start += take;
                c->trl_len = (uint32_t)(dw_mpa_pad_len(ulen) + DW_MPA_CRC_LEN);
                c->trl_have = 0;
                have = c->rx_end - c->rx_start;
                if (take == c->rx_payload) {
                        uint32_t t = have < c->trl_len ? have : c->trl_len;
                        memcpy(c->trl, c->rxbuf + c->rx_start, t);
                        c->trl_have = t;
                        c->rx_start += t;
                }
                if (take == c->rx_payload && c->trl_have == c->trl_len) {
                        rx_data_end(c);
                } else {
                        c->rx_state = DW_RC_RX_DIRECT;
                        c->rx_start = c->rx_end = 0; /* all staged bytes were consumed */
                }
                return c->rx_state == DW_RC_RX_STOP ? -1 : 1;
        }
        default: {
                /* Control messages are small and whole in staging. */
                size_t fl = dw_mpa_fpdu_len(ulen, c->crc);
                if (ulen > dlen + DW_RDMAP_ATOMIC_REQ_HDR_LEN + DW_RDMAP_TERM_MAX_LEN) {
                        fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                       DW_TERM_RDMAP_UNSPECIFIED, true, NULL, DIWARP_EVENT_QP_FATAL,
                                       "control message too long");
                        return -1;
                }
                if (avail < fl)
                        return 0;
                struct dw_mpa_fpdu f;
                ssize_t r = dw_mpa_fpdu_decode(p, avail, c->crc, DW_MPA_ULPDU_MAX, &f, &why);
                if (r < 0) {
                        if (r == -EILSEQ) {
                                c->qp->ctr.crc_errors++;
                                c->qp->dev->ctr.crc_errors++;
                        }
                        fail_with_term(c, true, DW_TERM_LAYER_LLP, DW_TERM_LLP_MPA, DW_TERM_LLP_CRC,
                                       true, NULL, DIWARP_EVENT_QP_FATAL,
                                       why ? why : "MPA CRC mismatch");
                        return -1;
                }
                /* An Immediate Data message that takes a receive WQE (a
                 * Write with Immediate's) waits for one as a Send does. */
                struct dw_rdmap_imm im;
                if ((c->rh.opcode == DW_RDMAP_IMM_DATA || c->rh.opcode == DW_RDMAP_IMM_DATA_SE) &&
                    !dw_qp_recv_head(c->qp) &&
                    dw_rdmap_imm_decode(p + 2 + dlen, ulen - dlen, &im, &why) >= 0 &&
                    (c->imm_pending || !imm_with_send(c->rh.opcode, &im))) {
                        int held = rx_wait_for_recv(c);
                        if (held)
                                return held > 0 ? 0 : -1; /* held: the FPDU stays staged */
                }
                if (c->rx_wait_recv)
                        rx_wait_end(c);
                c->rx_start += (uint32_t)fl;
                c->rx_big = false;
                rx_control(c, p + 2 + dlen, ulen - dlen);
                if (c->rx_state == DW_RC_RX_STOP)
                        return -1;
                c->rx_done += fl;
                if (c->end_slot >= 0)
                        dw_rc_end_consumed(c->end_slot, c->rx_done);
                return 1;
        }
        }
}

/* Staging bytes to read after a large payload: exactly the header of a next
 * FPDU of the same kind (a Write stream is followed by Writes), so the
 * payload behind it is read straight into its target and stays at the
 * target's alignment (a longer peek would stage the first payload bytes and
 * leave every direct read misaligned by their count). */
static uint32_t rx_peek_len(const struct dw_rc_conn *c)
{
        return DW_MPA_HDR_LEN +
               (c->rh.ddp.tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN);
}

/* Reads payload remainder + trailer (+ a peek at the next header). */
static ssize_t rx_direct(struct dw_rc_conn *c)
{
        struct iovec iov[DW_MAX_SGE + 2];
        int n = 0;

        for (int i = c->tgt_pos; i < c->ntgt; i++)
                iov[n++] = c->tgt[i];
        size_t pay_left = tgt_left(c);
        size_t trl_left = c->trl_len - c->trl_have;
        iov[n].iov_base = c->trl + c->trl_have;
        iov[n].iov_len = trl_left;
        n++;
        /* What to read past the trailer: after a small payload that is not
         * its message's last (a message cut into FPDUs of an Ethernet-sized
         * MSS: more small ones follow) as much as staging holds, so the
         * stream goes back to many FPDUs per read instead of one readv each;
         * otherwise just the next header, whose payload (perhaps large, as
         * the next message may be) then comes straight to its target too. */
        uint32_t peek = !c->rx_big && !c->rh.ddp.last ? c->rxbuf_cap - c->rx_end : rx_peek_len(c);
        iov[n].iov_base = c->rxbuf + c->rx_end;
        iov[n].iov_len = peek;
        n++;
        ssize_t r = dw_tcp_readv(c->fd, iov, n);
        if (r <= 0)
                return r;
        c->rx_short = (size_t)r < pay_left + trl_left + peek;
        size_t got = (size_t)r;
        size_t k = got < pay_left ? got : pay_left;
        tgt_consume(c, NULL, k);
        got -= k;
        if (got) {
                size_t t = got < trl_left ? got : trl_left;
                c->trl_have += (uint32_t)t;
                got -= t;
                c->rx_end += (uint32_t)got;
        }
        if (tgt_left(c) == 0 && c->trl_have == c->trl_len)
                rx_data_end(c);
        return r;
}

static ssize_t rx_fill(struct dw_rc_conn *c)
{
        if (c->rx_start == c->rx_end) {
                c->rx_start = c->rx_end = 0;
        } else if (c->rx_start && c->rxbuf_cap - c->rx_end < 256) {
                memmove(c->rxbuf, c->rxbuf + c->rx_start, c->rx_end - c->rx_start);
                c->rx_end -= c->rx_start;
                c->rx_start = 0;
        }
        size_t space = c->rxbuf_cap - c->rx_end;
        /* After a large payload, read just enough for the next header so the
         * payload behind it can go straight to its target. */
        uint32_t peek = rx_peek_len(c);
        if (c->rx_big && space > peek && c->rx_end - c->rx_start < peek)
                space = peek - (c->rx_end - c->rx_start);
        struct iovec iov = {c->rxbuf + c->rx_end, space};
        ssize_t r = dw_tcp_readv(c->fd, &iov, 1);
        if (r > 0) {
                c->rx_end += (uint32_t)r;
                c->rx_short = (size_t)r < space;
        }
        return r;
}

static int rc_rx_closing(struct dw_rc_conn *c)
{
        uint8_t sink[4096];
        for (int i = 0; i < 64; i++) {
                struct iovec iov = {sink, sizeof(sink)};
                ssize_t r = dw_tcp_readv(c->fd, &iov, 1);
                if (r == -EAGAIN)
                        return 1;
                if (r <= 0) {
                        rc_close_now(c);
                        return 1;
                }
        }
        return 1;
}

static int rc_rx(struct dw_rc_conn *c)
{
        size_t got = 0;
        int work = 0;
        /* A read that returned less than it asked for drained the socket:
         * another one now would only return EAGAIN (the next step reads again). */
        bool drained = false;

        while (c->fd >= 0) {
                if (c->state == DW_RC_CLOSING)
                        return work + rc_rx_closing(c);
                if (c->state != DW_RC_UP || c->rx_state == DW_RC_RX_STOP)
                        return work;
                ssize_t r;
                if (c->rx_state == DW_RC_RX_DIRECT) {
                        if (got >= DW_RC_RX_STEP_BYTES || drained)
                                return work;
                        r = rx_direct(c);
                } else {
                        int p = rx_parse(c);
                        if (p > 0) {
                                work++;
                                continue;
                        }
                        if (p < 0 || c->rx_wait_recv)
                                return work;
                        if (got >= DW_RC_RX_STEP_BYTES || drained)
                                return work;
                        r = rx_fill(c);
                }
                if (r == -EAGAIN)
                        return work;
                if (r <= 0) {
                        stream_failed(c, (int)r);
                        return work;
                }
                got += (size_t)r;
                drained = c->rx_short;
                c->qp->dev->ctr.rx_bytes += (size_t)r;
        }
        return work;
}

static int rc_watch_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx)
{
        struct dw_rc_conn *c = ctx;
        int work = 0;

        (void)dev;
        if (c->fd != fd)
                return 0;
        if (c->peer_closed && (events & (EPOLLERR | EPOLLHUP))) {
                stream_failed(c, -ECONNRESET);
                return 1;
        }
        if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                work += rc_rx(c);
        /* Always try to transmit: receiving may have queued Read Responses,
         * freed ORD slots, or the socket may have room again. */
        if (c->fd == fd)
                work += rc_tx(c);
        return work;
}

/* Anything for rc_tx to do: responses, a Terminate, a batch or WQE under
 * way, or SQ WQEs not started yet. */
static bool tx_has_work(struct dw_rc_conn *c)
{
        return c->irq_count || c->term_pending || c->cur || c->iov_pos != c->iov_cnt ||
               (dw_wq_next(&c->qp->sq) != NULL && c->qp->state != DIWARP_QPS_SQD);
}

/* More live streams than this are looked at through epoll (one syscall for
 * all) rather than with one recvmsg each per step. */
#define DW_RC_POLL_MAX 8

/* Out of line: a busy-polling step without live streams pays only the test
 * in dw_rc_poll, not this function's register saves. */
static __attribute__((noinline)) int rc_poll_live(struct dw_device *dev, struct dw_rc_dev *rd)
{
        int work = 0;

        if (rd->nlive > DW_RC_POLL_MAX)
                return -1;
        for (struct dw_rc_conn *c = rd->live, *next; c; c = next) {
                next = c->lnext;
                /* Closing streams (draining to EOF) and stopped receivers are
                 * left to the epoll look: nothing latency-bound there. */
                if (c->state != DW_RC_UP || c->rx_state == DW_RC_RX_STOP)
                        continue;
                uint64_t before = dev->ctr.rx_bytes;
                work += rc_rx(c);
                /* As rc_watch_cb: what arrived may let the transmit side go on
                 * (Read Responses, ORD slots), but only when there is something
                 * to transmit: a plain receive goes back to the application
                 * at once. */
                if (dev->ctr.rx_bytes != before && c->fd >= 0 && tx_has_work(c))
                        work += rc_tx(c);
        }
        return work;
}

int dw_rc_poll(struct dw_device *dev, int budget)
{
        struct dw_rc_dev *rd = dev->rc;

        (void)budget;
        if (!rd || !rd->live)
                return 0;
        return rc_poll_live(dev, rd);
}

/* ---------------------------------------------------------------- hooks */

void dw_rc_register_end(struct dw_qp *qp, int fd)
{
        struct dw_rc_conn *c = qp->rc;
        struct sockaddr_in local, remote;
        socklen_t ll = sizeof(local), rl = sizeof(remote);

        if (!c || c->end_slot >= 0)
                return;
        if (getsockname(fd, (struct sockaddr *)&local, &ll) == 0 && local.sin_family == AF_INET &&
            getpeername(fd, (struct sockaddr *)&remote, &rl) == 0)
                c->end_slot = dw_rc_end_register(qp->dev, c, &local, &remote);
}

/* The MPA exchange on fd is DONE for qp; the stream is now the QP's (fd is
 * closed here from now on, also on failure). Sends queued before are
 * transmitted. 0 or -errno. */
static int rc_attach(struct dw_qp *qp, int fd, const struct dw_mpa_conn *mc,
                     const struct sockaddr_in *peer)
{
        struct dw_rc_conn *c = qp->rc;
        char pb[32];

        if (!c || c->fd >= 0 || qp->state == DIWARP_QPS_ERR || qp->state == DIWARP_QPS_RESET) {
                close(fd);
                return -EINVAL;
        }
        reset_stream(c);
        c->fd = fd;
        c->peer = *peer;
        c->crc = mc->crc;
        c->ird = mc->ird > DW_RC_MAX_RD ? DW_RC_MAX_RD : mc->ird;
        if (!c->ird)
                c->ird = 1;
        c->peer_ird = dw_mpa_result_ord(mc);
        if (!c->peer_ird)
                c->peer_ird = 1;
        c->initiator = mc->initiator;
        c->rtr_send_expected = !mc->initiator && mc->rtr_send;
        int r = dw_tcp_configure(fd, qp->dev->cfg.peer_timeout_ms);
        if (r < 0)
                dw_warn("RC QP %#x peer %s: TCP options: %s", qp->qpn,
                        dw_tcp_addr_str(peer, pb, sizeof(pb)), strerror(-r));
        c->mulpdu = rc_mulpdu(fd);
        c->mss_age = 0;
        int nb = (int)(DW_RC_TX_BATCH_BYTES / c->mulpdu);
        nb = nb < DW_RC_TX_BATCH_MIN   ? DW_RC_TX_BATCH_MIN
             : nb > DW_RC_TX_BATCH_MAX ? DW_RC_TX_BATCH_MAX
                                       : nb;
        if (c->mulpdu < DW_RC_RXBUF_SMALL && c->rxbuf_cap < DW_RC_RXBUF_BULK) {
                uint8_t *b = malloc(DW_RC_RXBUF_BULK); /* nothing is staged yet */
                if (b) {
                        free(c->rxbuf);
                        c->rxbuf = b;
                        c->rxbuf_cap = DW_RC_RXBUF_BULK;
                }
        }
        if (tx_arrays(c, nb) < 0)
                dw_warn("RC QP %#x peer %s: no memory for batches of %d FPDUs; %d per write",
                        qp->qpn, dw_tcp_addr_str(peer, pb, sizeof(pb)), nb, c->slot_cap);
        dw_rc_set_state(c, DW_RC_UP, "stream attached");
        c->watched = false;
        set_watch(c, false);
        if (!c->watched) {
                dw_warn("RC QP %#x peer %s: cannot watch the stream socket", qp->qpn,
                        dw_tcp_addr_str(peer, pb, sizeof(pb)));
                dw_rc_set_state(c, DW_RC_CLOSED, "the stream socket cannot be watched");
                close(fd);
                c->fd = -1;
                return -ENOSPC;
        }
        live_add(c);
        dw_rc_register_end(qp, fd);
        dw_info("RC QP %#x connected to %s (peer QP %#x, CRC %s, IRD %u, ORD %u, MULPDU %u)",
                qp->qpn, dw_tcp_addr_str(peer, pb, sizeof(pb)), qp->attr.dest_qp_num,
                c->crc ? "on" : "off", c->ird, ord_limit(c), c->mulpdu);
        rc_tx(c);
        dw_progress_wake(qp->dev);
        return 0;
}

/* Native connect/accept: the QP goes through the state machine as rdma_cm
 * moves it (INIT -> RTR with the peer's address and the negotiated IRD, the
 * stream attached, RTR -> RTS with the negotiated ORD), so every
 * transition's checks and side effects apply and diwarp_qp_query reports
 * the peer. The peer's QPN is not known: MPA carries none, and the
 * application's private data goes on the wire exactly as given (an iWARP
 * peer hands all of it to its ULP), so dest_qp_num stays 0, as on an RNIC
 * connected through the iWARP CM. The caller holds the device lock through
 * all of it: no FPDU is processed while the QP is in RTR, so a native
 * connection never raises COMM_EST (README.md). */
static int handover_native(struct dw_qp *qp, const struct dw_rc_stream *s)
{
        struct dw_rc_conn *c = qp->rc;
        const struct dw_mpa_conn *mc = s->mc;
        int fd = s->fd;
        struct diwarp_qp_attr a;
        char pb[32];
        int r;

        /* RTS: an external QP the program readied itself (cm.c, claim_qp). */
        if (qp->state != DIWARP_QPS_INIT && qp->state != DIWARP_QPS_RTR &&
            qp->state != DIWARP_QPS_RTS) {
                dw_warn("RC QP %#x peer %s: the QP left for state %d during connection setup",
                        qp->qpn, dw_tcp_addr_str(s->peer, pb, sizeof(pb)), qp->state);
                dw_rc_set_state(c, DW_RC_IDLE, "the QP left during connection setup");
                close(fd);
                return -EINVAL;
        }
        uint16_t ird = mc->ird > DW_RC_MAX_RD ? DW_RC_MAX_RD : mc->ird;
        uint16_t ord = dw_mpa_result_ord(mc);
        if (ord > DW_RC_MAX_RD)
                ord = DW_RC_MAX_RD;
        memset(&a, 0, sizeof(a));
        dw_ipv4_to_gid(s->peer->sin_addr, &a.dgid);
        a.dest_qp_num = 0;
        a.max_dest_rd_atomic = (uint8_t)ird;
        a.max_rd_atomic = (uint8_t)ord;
        int path = DIWARP_QP_AV | DIWARP_QP_DEST_QPN | DIWARP_QP_MAX_DEST_RD_ATOMIC;
        /* Still DW_RC_CONNECTING here, so RTR with AV + DEST_QPN does not
         * start an IB-style connect. */
        if (qp->state == DIWARP_QPS_INIT) {
                a.qp_state = DIWARP_QPS_RTR;
                r = dw_qp_modify_internal(qp, &a, DIWARP_QP_STATE | path);
                path = 0;
                if (r < 0)
                        goto fail;
        }
        r = rc_attach(qp, fd, mc, s->peer);
        fd = -1; /* rc_attach owns it now, also on failure */
        if (r < 0)
                goto fail;
        a.qp_state = DIWARP_QPS_RTS;
        r = dw_qp_modify_internal(qp, &a, DIWARP_QP_STATE | DIWARP_QP_MAX_QP_RD_ATOMIC | path);
        if (r < 0)
                goto fail;
        /* The AV gave the peer's instance address; the stream's is the truth. */
        qp->peer = *s->peer;
        return 0;

fail:
        dw_warn("RC QP %#x peer %s: native connection setup failed: %s", qp->qpn,
                dw_tcp_addr_str(s->peer, pb, sizeof(pb)), strerror(-r));
        if (fd >= 0)
                close(fd);
        if (c->state == DW_RC_CONNECTING)
                dw_rc_set_state(c, DW_RC_IDLE, "native connection setup failed");
        if (qp->state != DIWARP_QPS_INIT)
                dw_qp_to_error(qp, DIWARP_EVENT_QP_FATAL);
        return r;
}

int dw_rc_handover(struct dw_qp *qp, const struct dw_rc_stream *s, enum dw_rc_setup how)
{
        struct dw_rc_conn *c = qp->rc;
        int r = -ECONNABORTED;

        if (how == DW_RC_SETUP_NATIVE)
                return handover_native(qp, s);
        if (s) {
                if (how == DW_RC_SETUP_IB)
                        c->ib_style = true;
                r = rc_attach(qp, s->fd, s->mc, s->peer);
                if (r == 0 || how == DW_RC_SETUP_ATTACH)
                        return r;
        }
        /* IB-style: the stream never came, or cannot be used. */
        if (c->state == DW_RC_CONNECTING)
                dw_rc_set_state(c, DW_RC_IDLE, "IB-style connect failed");
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, DIWARP_EVENT_QP_FATAL);
        return r;
}

int dw_rc_disconnect(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        if (!c)
                return -EINVAL;
        if (c->state == DW_RC_UP)
                c->fin_after_batch = true;
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, -1);
        else
                dw_rc_qp_error(qp);
        return 0;
}

int dw_rc_qp_init(struct dw_qp *qp)
{
        struct dw_rc_conn *c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->rxbuf = malloc(DW_RC_RXBUF);
        c->rxbuf_cap = DW_RC_RXBUF;
        if (!c->rxbuf || tx_arrays(c, DW_RC_TX_BATCH_MIN) < 0) {
                free(c->rxbuf);
                free(c);
                return -ENOMEM;
        }
        c->qp = qp;
        c->fd = -1;
        c->end_slot = -1;
        c->mulpdu = DW_RC_MULPDU_DEFAULT;
        c->state = DW_RC_IDLE; /* the initial state, not a transition */
        reset_stream(c);
        qp->rc = c;
        return 0;
}

void dw_rc_qp_fini(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        if (!c)
                return;
        dw_cm_qp_cancel(qp);
        if (c->fd >= 0 && c->ib_style && c->state == DW_RC_UP) {
                /* Destroying an IB-style QP is an orderly close for the peer
                 * (see stream_failed): FIN first, and what already arrived is
                 * read away, so the close does not turn into a reset. */
                shutdown(c->fd, SHUT_WR);
                uint8_t sink[4096];
                for (int i = 0; i < 256 && recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
                        ;
        }
        rc_close_now(c);
        free(c->rxbuf);
        free(c->iov);
        free(c->slot);
        free(c->done_wqe);
        free(c->done_end);
        free(c);
        qp->rc = NULL;
}

int dw_rc_qp_modify(struct dw_qp *qp, enum diwarp_qp_state old_state, int mask)
{
        struct dw_rc_conn *c = qp->rc;

        (void)mask;
        if (!c)
                return 0;
        switch (qp->state) {
        case DIWARP_QPS_RESET:
                dw_cm_qp_cancel(qp);
                rc_close_now(c);
                reset_stream(c);
                dw_rc_set_state(c, DW_RC_IDLE, "QP reset");
                c->ib_style = false;
                return 0;
        case DIWARP_QPS_RTR:
                if (old_state != DIWARP_QPS_RTR && c->state == DW_RC_IDLE &&
                    (qp->attr_mask_set & DIWARP_QP_DEST_QPN) && (qp->attr_mask_set & DIWARP_QP_AV))
                        return dw_cm_ib_connect(qp);
                return 0;
        case DIWARP_QPS_RTS:
                if (c->state == DW_RC_IDLE && old_state == DIWARP_QPS_INIT &&
                    (qp->attr_mask_set & DIWARP_QP_DEST_QPN) && (qp->attr_mask_set & DIWARP_QP_AV))
                        return dw_cm_ib_connect(qp);
                if (c->state == DW_RC_UP)
                        rc_tx(c);
                return 0;
        case DIWARP_QPS_ERR:
                dw_rc_qp_error(qp);
                return 0;
        default:
                return 0;
        }
}

int dw_rc_post_send(struct dw_qp *qp, struct dw_wqe *wqe)
{
        struct dw_rc_conn *c = qp->rc;

        (void)wqe;
        if (!c)
                return -EINVAL;
        if (c->peer_closed && (c->fd < 0 || is_read_like(wqe->opcode))) {
                peer_gone_fail(c);
                return 0;
        }
        /* Before the stream is up the WQE just waits in the SQ. */
        if (c->state == DW_RC_UP && c->iov_pos == c->iov_cnt)
                rc_tx(c);
        return 0;
}

void dw_rc_post_recv(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        /* A Send held for want of a receive WQE takes this one. */
        if (c && c->rx_wait_recv && c->fd >= 0) {
                rx_wait_end(c);
                if (rc_rx(c) && c->fd >= 0 && tx_has_work(c))
                        rc_tx(c);
        }
}

void dw_rc_qp_error(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        if (!c)
                return;
        drop_wqe_refs(c);
        c->irq_head = c->irq_count = 0;
        c->imm_pending = false;
        dw_cm_qp_cancel(qp);
        if (c->state == DW_RC_UP && c->fd >= 0) {
                /* Finish the FPDU batch on the wire (the stream must stay
                 * framed), then the Terminate if one is due, then FIN. */
                if (!c->term_pending)
                        c->fin_after_batch = true;
                dw_rc_set_state(c, DW_RC_CLOSING, "QP error");
                c->rx_state = DW_RC_RX_STOP;
                uint32_t ms = qp->dev->cfg.peer_timeout_ms ? qp->dev->cfg.peer_timeout_ms : 5000;
                dw_rc_timer_add(qp->dev, c, dw_now_ns() + (uint64_t)ms * 1000000ull);
                if (c->in_tx)
                        return; /* the running rc_tx sends the Terminate / FIN */
                if (c->iov_pos == c->iov_cnt) {
                        build_batch(c);
                        if (c->iov_cnt == 0) {
                                /* Nothing left to send: FIN now. */
                                shutdown(c->fd, SHUT_WR);
                                c->fin_after_batch = false;
                        }
                }
                rc_tx(c);
                set_watch(c, c->iov_pos != c->iov_cnt);
        } else if (c->state != DW_RC_CLOSING) {
                rc_close_now(c);
        }
}

/* Out of line, as rc_poll_live: the common idle step stops in the test of
 * dw_rc_progress. */
static __attribute__((noinline)) int rc_progress_timed(struct dw_device *dev, struct dw_rc_dev *rd)
{
        int work = 0;
        uint64_t now = dw_now_ns();
        struct dw_rc_conn *c = rd->timers, *next;
        for (; c; c = next) {
                next = c->tnext;
                if (c->deadline_ns > now) {
                        dw_progress_timer(dev, c->deadline_ns);
                        continue;
                }
                if (c->state == DW_RC_CLOSING) {
                        char pb[32];
                        dw_dbg("RC QP %#x peer %s: closing without the peer's EOF", c->qp->qpn,
                               peer_str(c, pb, sizeof(pb)));
                        rc_close_now(c);
                        work++;
                } else if (c->rx_wait_recv && c->state == DW_RC_UP) {
                        /* A held Send: an SRQ receive may have come, or the
                         * wait ended (rx_wait_for_recv sets the next look). */
                        dw_rc_timer_del(dev, c);
                        if (rc_rx(c) && c->fd >= 0 && tx_has_work(c))
                                rc_tx(c);
                        work++;
                } else {
                        dw_rc_timer_del(dev, c);
                }
        }
        work += dw_cm_progress(dev);
        return work;
}

int dw_rc_progress(struct dw_device *dev, int budget)
{
        struct dw_rc_dev *rd = dev->rc;

        (void)budget;
        /* Nothing timed: no clock read (it costs ~200 ns on some VMs, and a
         * busy-polling application runs this every step). */
        if (!rd || (!rd->timers && !rd->pend && !rd->atts && !rd->rdchs_ending))
                return 0;
        return rc_progress_timed(dev, rd);
}

int dw_rc_dev_init(struct dw_device *dev)
{
        struct dw_rc_dev *rd = calloc(1, sizeof(*rd));
        if (!rd)
                return -ENOMEM;
        rd->dev = dev;
        dev->rc = rd;
        int r = dw_cm_dev_init(dev);
        if (r < 0) {
                dev->rc = NULL;
                free(rd);
        }
        return r;
}

void dw_rc_dev_fini(struct dw_device *dev)
{
        struct dw_rc_dev *rd = dev->rc;

        if (!rd)
                return;
        dw_cm_dev_fini(dev);
        free(rd);
        dev->rc = NULL;
}
