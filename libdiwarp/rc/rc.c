/* RC transport: RDMAP over DDP over MPA over one TCP stream per QP. This
 * file: the QP hooks of dw.h (dw_rc_*), the connection state, the socket
 * watch, timers and the live list, the hand-over of a stream from cm.c and
 * the failure paths (Terminate, broken stream). Transmit in rc_tx.c,
 * receive in rc_rx.c, the local copy in rc_copy.c. See rc.h for the buffer
 * layout and README.md for the decisions. */
#include "rc/rc.h"
#include "rc/rc_int.h"
#include "rc/rc_local.h"

#include <errno.h>
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
#include "rd/rd.h"
#include "rdmap/rdmap.h"
#include "util/time.h"

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

static int rc_watch_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx);

void rc_set_watch(struct dw_rc_conn *c, bool want_out)
{
        if (c->fd < 0)
                return;
        /* After the peer's orderly close there is nothing left to read (EOF
         * would keep the fd readable); errors and hang-ups are reported
         * anyway. */
        uint32_t ev = (c->peer_closed || c->rx_wait_recv ? 0 : EPOLLIN) | (want_out ? EPOLLOUT : 0);
        if (!c->watched) {
                if (dw_progress_watch_fd(&c->qp->dev->prog, c->fd, ev, rc_watch_cb, c) == 0) {
                        c->watched = true;
                        c->watch_events = ev;
                }
                return;
        }
        if (ev != c->watch_events && dw_progress_modify_fd(&c->qp->dev->prog, c->fd, ev) == 0)
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
        dw_progress_timer(&dev->prog, deadline_ns);
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

/* The stream's socket, out of the progress engine's set and no longer the
 * connection's: the caller closes it. */
static int rc_release_fd(struct dw_rc_conn *c)
{
        int fd = c->fd;
        if (fd >= 0 && c->watched)
                dw_progress_unwatch_fd(&c->qp->dev->prog, fd);
        c->fd = -1;
        c->watched = false;
        return fd;
}

void rc_close_now(struct dw_rc_conn *c)
{
        struct dw_device *dev = c->qp->dev;

        dw_rc_timer_del(dev, c);
        live_del(c);
        dw_rc_end_unregister(c->end_slot);
        c->end_slot = -1;
        int fd = rc_release_fd(c);
        if (fd >= 0)
                close(fd);
        c->rx_state = DW_RC_RX_STOP;
        if (c->state != DW_RC_IDLE)
                dw_rc_set_state(c, DW_RC_CLOSED, "stream closed");
}

/* Forgets every reference to send/receive WQEs (they are about to be
 * completed or flushed by the generic QP code). */
void rc_drop_wqe_refs(struct dw_rc_conn *c)
{
        c->cur = NULL;
        c->ndone = 0;
        c->orq_head = c->orq_count = 0;
        c->rx_wqe = NULL;
}

/* Completes SQ WQEs that are finished, in order. */
void rc_retire(struct dw_rc_conn *c)
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
void rc_complete_through(struct dw_rc_conn *c, struct dw_wqe *culprit, enum diwarp_wc_status status,
                         uint32_t vendor_err)
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
void rc_fail_with_term(struct dw_rc_conn *c, bool send_term, uint8_t layer, uint8_t etype,
                       uint8_t ecode, bool with_hdr, const uint8_t *rdmap_hdr, int event,
                       const char *why)
{
        struct dw_qp *qp = c->qp;
        char pb[32];

        dw_warn("RC QP %#x peer %s: %s; terminating (layer %u type %u code %#x)", qp->qpn,
                rc_peer_str(c, pb, sizeof(pb)), why, layer, etype, ecode);
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

void rc_fail_refused(struct dw_rc_conn *c, const struct dw_rdmap_refusal *ref,
                     const uint8_t *rdmap_hdr, const char *what)
{
        char why[160];

        c->qp->ctr.rx_dropped_protection++;
        c->qp->dev->ctr.rx_dropped_protection++;
        snprintf(why, sizeof(why), "%s: %s", what, ref->why);
        rc_fail_with_term(c, true, ref->te.layer, ref->te.etype, ref->te.ecode, true, rdmap_hdr,
                          DIWARP_EVENT_QP_ACCESS_ERR, why);
}

void rc_fail_prot(struct dw_rc_conn *c, enum dw_prot_status st, enum dw_prot_ctx ctx,
                  const uint8_t *rdmap_hdr, const char *what)
{
        struct dw_rdmap_refusal ref;

        dw_rdmap_refuse(&ref, st, ctx);
        rc_fail_refused(c, &ref, rdmap_hdr, what);
}

/* The peer of an IB-style stream is gone (it closed in order) and work needs
 * it: as an IB requester whose retries find no responder, the oldest
 * unfinished send WQE completes with RETRY_EXC_ERR, the QP moves to ERR (no
 * async event: IB reports this through the completion) and the rest flush. */
void rc_peer_gone_fail(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        struct dw_wqe *w;
        char pb[32];

        rc_retire(c);
        rc_drop_wqe_refs(c);
        rc_close_now(c); /* nobody to send a Terminate or FIN to */
        w = dw_wq_head(&qp->sq);
        if (w)
                dw_warn("RC QP %#x peer %s: send WR %#llx: the peer QP closed its stream; "
                        "completing with RETRY_EXC_ERR",
                        qp->qpn, rc_peer_str(c, pb, sizeof(pb)), (unsigned long long)w->wr_id);
        rc_complete_through(c, w, DIWARP_WC_RETRY_EXC_ERR, 0);
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
void rc_stream_failed(struct dw_rc_conn *c, int err)
{
        struct dw_qp *qp = c->qp;
        char pb[32];

        if (c->peer_closed) {
                /* The peer's socket is gone too (a write failed, or its reset
                 * came): the QP still stays as it is; only unfinished sends fail. */
                dw_dbg("RC QP %#x peer %s: stream gone after the peer's close (%s)", qp->qpn,
                       rc_peer_str(c, pb, sizeof(pb)), err ? strerror(-err) : "end of stream");
                rc_close_now(c);
                if (!dw_wq_empty(&qp->sq) && qp->state != DIWARP_QPS_ERR)
                        rc_peer_gone_fail(c);
                return;
        }
        if (err == 0 && c->ib_style && c->rx_state == DW_RC_RX_HDR && c->rx_end == c->rx_start) {
                dw_info("RC QP %#x peer %s: the peer closed its end (QP destroyed); this QP "
                        "stays in state %d until work needs the peer",
                        qp->qpn, rc_peer_str(c, pb, sizeof(pb)), qp->state);
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
                        rc_peer_gone_fail(c);
                        return;
                }
                rc_set_watch(c, c->iov_pos != c->iov_cnt);
                return;
        }
        bool busy = c->rx_state == DW_RC_RX_DIRECT || c->rx_end != c->rx_start || c->rx_wqe ||
                    c->orq_count || c->irq_count || c->iov_pos != c->iov_cnt ||
                    !dw_wq_empty(&qp->sq);

        if (err == 0 && !busy)
                dw_info("RC QP %#x peer %s: peer closed the connection", qp->qpn,
                        rc_peer_str(c, pb, sizeof(pb)));
        else
                dw_warn("RC QP %#x peer %s: connection lost (%s)%s", qp->qpn,
                        rc_peer_str(c, pb, sizeof(pb)), err ? strerror(-err) : "end of stream",
                        busy ? " with operations in flight" : "");
        rc_close_now(c);
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, (err == 0 && !busy) ? -1 : DIWARP_EVENT_QP_FATAL);
}

static int rc_watch_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx)
{
        struct dw_rc_conn *c = ctx;
        int work = 0;

        (void)dev;
        if (c->fd != fd)
                return 0;
        if (c->peer_closed && (events & (EPOLLERR | EPOLLHUP))) {
                rc_stream_failed(c, -ECONNRESET);
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
                if (dev->ctr.rx_bytes != before && c->fd >= 0 && rc_tx_has_work(c))
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

void dw_rc_register_end(struct dw_qp *qp, int fd, const struct sockaddr_in *to)
{
        struct dw_rc_conn *c = qp->rc;
        struct sockaddr_in local, remote;
        socklen_t ll = sizeof(local), rl = sizeof(remote);

        if (!c || c->end_slot >= 0)
                return;
        if (to)
                remote = *to;
        if (getsockname(fd, (struct sockaddr *)&local, &ll) == 0 && local.sin_family == AF_INET &&
            (to || getpeername(fd, (struct sockaddr *)&remote, &rl) == 0))
                c->end_slot = dw_rc_end_register(qp->dev, c, &local, &remote);
}

void dw_rc_unregister_end(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        if (!c || c->end_slot < 0)
                return;
        dw_rc_end_unregister(c->end_slot);
        c->end_slot = -1;
}

/* Sizes a stream being attached from its MSS: the MULPDU, the FPDUs per
 * batch and, for small FPDUs, a larger staging buffer (nothing is staged
 * yet). Without memory for them the buffers stay as they were. */
static void attach_size(struct dw_rc_conn *c, int fd, const struct sockaddr_in *peer)
{
        char pb[32];

        c->mulpdu = rc_mulpdu(fd, c->qp->dev->cfg.rc_fpdu);
        c->mss_age = 0;
        int nb = (int)(DW_RC_TX_BATCH_BYTES / c->mulpdu);
        nb = nb < DW_RC_TX_BATCH_MIN   ? DW_RC_TX_BATCH_MIN
             : nb > DW_RC_TX_BATCH_MAX ? DW_RC_TX_BATCH_MAX
                                       : nb;
        /* By the segment size, not DIWARP_RC_FPDU: small messages still come
         * in small FPDUs, many per read. */
        uint32_t seg = c->qp->dev->cfg.rc_fpdu ? rc_mulpdu(fd, 0) : c->mulpdu;
        if (seg < DW_RC_RXBUF_SMALL && c->rxbuf_cap < DW_RC_RXBUF_BULK) {
                uint8_t *b = malloc(DW_RC_RXBUF_BULK); /* nothing is staged yet */
                if (b) {
                        free(c->rxbuf);
                        c->rxbuf = b;
                        c->rxbuf_cap = DW_RC_RXBUF_BULK;
                }
        }
        if (rc_tx_arrays(c, nb) < 0)
                dw_warn("RC QP %#x peer %s: no memory for batches of %d FPDUs; %d per write",
                        c->qp->qpn, dw_tcp_addr_str(peer, pb, sizeof(pb)), nb, c->slot_cap);
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
        attach_size(c, fd, peer);
        dw_rc_set_state(c, DW_RC_UP, "stream attached");
        c->watched = false;
        rc_set_watch(c, false);
        if (!c->watched) {
                dw_warn("RC QP %#x peer %s: cannot watch the stream socket", qp->qpn,
                        dw_tcp_addr_str(peer, pb, sizeof(pb)));
                dw_rc_set_state(c, DW_RC_CLOSED, "the stream socket cannot be watched");
                close(fd);
                c->fd = -1;
                return -ENOSPC;
        }
        live_add(c);
        dw_rc_register_end(qp, fd, NULL);
        dw_info("RC QP %#x connected to %s (peer QP %#x, CRC %s, IRD %u, ORD %u, MULPDU %u)",
                qp->qpn, dw_tcp_addr_str(peer, pb, sizeof(pb)), qp->attr.dest_qp_num,
                c->crc ? "on" : "off", c->ird, rc_ord_limit(c), c->mulpdu);
        rc_tx(c);
        dw_progress_wake(&qp->dev->prog);
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

/* RC over RD (DW_RC_SETUP_RD_BIND, DW_RC_SETUP_RD): the QP goes through the
 * state machine as the native CM agreed, as handover_native moves a QP
 * with a stream; its datagrams go over rd/, and the CM stream stays
 * cm.c's. The bind gives rd/ the connection's tokens and key first, in
 * rc/'s one call into rd/ (dw_rd_rc_attach): before RTR, for the stream
 * RTR creates sizes its segments for the trailer. */
static int handover_rd(struct dw_qp *qp, const struct dw_rc_stream *s, enum dw_rc_setup how)
{
        struct diwarp_qp_attr a;

        if (!s) {
                if (qp->state != DIWARP_QPS_INIT && qp->state != DIWARP_QPS_RESET)
                        dw_qp_to_error(qp, DIWARP_EVENT_QP_FATAL);
                return -ECONNABORTED;
        }
        memset(&a, 0, sizeof(a));
        if (how == DW_RC_SETUP_RD_BIND) {
                dw_ipv4_to_gid(s->peer->sin_addr, &a.dgid);
                a.dest_qp_num = s->rd->peer_qpn;
                a.rq_psn = s->rd->peer_psn;
                a.max_dest_rd_atomic =
                    (uint8_t)(s->rd->ird > DW_RC_MAX_RD ? DW_RC_MAX_RD : s->rd->ird);
                a.qp_state = DIWARP_QPS_RTR;
                int r = dw_rd_rc_attach(qp, s->rd->rx_token, s->rd->tx_token, s->rd->conn_key);
                if (r == 0)
                        r = dw_qp_modify_internal(qp, &a,
                                                  DIWARP_QP_STATE | DIWARP_QP_AV |
                                                      DIWARP_QP_DEST_QPN | DIWARP_QP_RQ_PSN |
                                                      DIWARP_QP_MAX_DEST_RD_ATOMIC);
                if (r < 0)
                        dw_rd_rc_attach(qp, 0, 0, NULL);
                return r;
        }
        a.qp_state = DIWARP_QPS_RTS;
        a.sq_psn = s->rd->sq_psn;
        a.max_rd_atomic = (uint8_t)s->rd->ord;
        return dw_qp_modify_internal(
            qp, &a, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_MAX_QP_RD_ATOMIC);
}

int dw_rc_handover(struct dw_qp *qp, const struct dw_rc_stream *s, enum dw_rc_setup how)
{
        struct dw_rc_conn *c = qp->rc;
        int r = -ECONNABORTED;

        if (how == DW_RC_SETUP_NATIVE)
                return handover_native(qp, s);
        if (how == DW_RC_SETUP_RD_BIND || how == DW_RC_SETUP_RD)
                return handover_rd(qp, s, how);
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

        if (dw_qp_on_rd(qp)) {
                if (qp->state != DIWARP_QPS_ERR)
                        dw_qp_to_error(qp, -1);
                return 0;
        }
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
        if (!c->rxbuf || rc_tx_arrays(c, DW_RC_TX_BATCH_MIN) < 0) {
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

int dw_rc_qp_fini(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        if (!c)
                return -1;
        dw_cm_qp_cancel(qp);
        /* A stream that is up or closing is closed in order once the device
         * lock is released (dw_rc_close_lingering): a plain close with the
         * peer's data unread resets the connection, and the reset throws away
         * what our socket still held of Sends that completed here (rsockets'
         * rstream lost its last echo so when the peer's reader lagged beside
         * a compile). For an IB-style QP the FIN is also the orderly end its
         * peer expects (see rc_stream_failed). */
        int linger_fd = -1;
        if (c->state == DW_RC_UP || c->state == DW_RC_CLOSING)
                linger_fd = rc_release_fd(c);
        rc_close_now(c);
        free(c->rxbuf);
        free(c->iov);
        free(c->slot);
        free(c->done_wqe);
        free(c->done_end);
        free(c);
        qp->rc = NULL;
        return linger_fd;
}

/* A destroyed QP's stream waits at most this long for its peer to take what
 * it sent, and gives up sooner when the peer stops acknowledging. A device
 * driven from its owner's loop (the host daemon, which serves other clients
 * from the thread that waits) waits far less: a client whose peer never
 * reads must not hold the daemon for seconds a QP. */
#define DW_RC_LINGER_MS                2000u
#define DW_RC_LINGER_STALL_MS          250u
#define DW_RC_LINGER_EXTERNAL_MS       50u
#define DW_RC_LINGER_EXTERNAL_STALL_MS 20u

void dw_rc_close_lingering(int fd, bool external)
{
        if (external)
                dw_tcp_close_lingering(fd, DW_RC_LINGER_EXTERNAL_STALL_MS,
                                       DW_RC_LINGER_EXTERNAL_MS);
        else
                dw_tcp_close_lingering(fd, DW_RC_LINGER_STALL_MS, DW_RC_LINGER_MS);
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

        if (!c)
                return -EINVAL;
        if (c->peer_closed && (c->fd < 0 || dw_wr_op(wqe->opcode)->response))
                rc_peer_gone_fail(c);
        return 0;
}

void dw_rc_tx_posted(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        /* Before the stream is up the WQEs just wait in the SQ. */
        if (c && c->state == DW_RC_UP && c->iov_pos == c->iov_cnt)
                rc_tx(c);
}

void dw_rc_post_recv(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        /* A Send held for want of a receive WQE takes this one. */
        if (c && c->rx_wait_recv && c->fd >= 0) {
                rc_rx_wait_end(c);
                if (rc_rx(c) && c->fd >= 0 && rc_tx_has_work(c))
                        rc_tx(c);
        }
}

void dw_rc_qp_error(struct dw_qp *qp)
{
        struct dw_rc_conn *c = qp->rc;

        if (!c)
                return;
        rc_drop_wqe_refs(c);
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
                        rc_build_batch(c);
                        if (c->iov_cnt == 0) {
                                /* Nothing left to send: FIN now. */
                                shutdown(c->fd, SHUT_WR);
                                c->fin_after_batch = false;
                        }
                }
                rc_tx(c);
                rc_set_watch(c, c->iov_pos != c->iov_cnt);
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
                        dw_progress_timer(&dev->prog, c->deadline_ns);
                        continue;
                }
                if (c->state == DW_RC_CLOSING) {
                        char pb[32];
                        dw_dbg("RC QP %#x peer %s: closing without the peer's EOF", c->qp->qpn,
                               rc_peer_str(c, pb, sizeof(pb)));
                        rc_close_now(c);
                        work++;
                } else if (c->rx_wait_recv && c->state == DW_RC_UP) {
                        /* A held Send: an SRQ receive may have come, or the
                         * wait ended (rx_wait_for_recv sets the next look). */
                        dw_rc_timer_del(dev, c);
                        if (rc_rx(c) && c->fd >= 0 && rc_tx_has_work(c))
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
