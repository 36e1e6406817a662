/* RC receive: FPDUs parsed from the staging buffer, a data segment's
 * payload placed (straight from the socket into its target when large),
 * its CRC checked, then applied (Write, Read Response, Send); control
 * messages (Read and Atomic Requests, Atomic Responses, Immediate Data,
 * Terminate) processed whole; a Send without a receive WQE holds the
 * stream (rx_wait_for_recv). */
#include "rc/rc.h"
#include "rc/rc_int.h"
#include "rc/rc_local.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

#include "llp/tcp.h"
#include "progress/progress.h"
#include "rdmap/rdmap.h"
#include "util/time.h"
#include "util/copy.h"
#include "wire/crc32c.h"

static bool rx_imm_alone(struct dw_rc_conn *c, uint32_t imm, bool se);

void rc_rx_complete_recv(struct dw_rc_conn *c, struct dw_wqe *w, struct dw_recv_done d,
                         bool solicited)
{
        d.src_qp = c->qp->attr.dest_qp_num;
        dw_qp_recv_done(c->qp, w->wr_id, &d, solicited);
        dw_qp_recv_pop(c->qp);
}

/* A receive WQE fails because of what the peer sent; the Terminate we send
 * for it says why, and the completion carries the same code in vendor_err. */
static void rx_fail_recv(struct dw_rc_conn *c, struct dw_wqe *w, enum diwarp_wc_status st,
                         struct dw_term_error te)
{
        rc_rx_complete_recv(
            c, w, (struct dw_recv_done){.status = st, .vendor_err = dw_term_vendor_err(te)}, false);
}

static struct dw_wqe *rx_take_recv(struct dw_rc_conn *c)
{
        struct dw_wqe *w = dw_qp_recv_head(c->qp);

        if (!w) {
                c->qp->ctr.rx_dropped_no_recv++;
                c->qp->dev->ctr.rx_dropped_no_recv++;
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
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

void rc_rx_wait_end(struct dw_rc_conn *c)
{
        c->rx_wait_recv = false;
        dw_rc_timer_del(c->qp->dev, c);
        rc_set_watch(c, (c->watch_events & EPOLLOUT) != 0);
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
 * (rc_stream_failed).
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
                rc_set_watch(c, (c->watch_events & EPOLLOUT) != 0);
        } else if (c->rnr_deadline_ns && now >= c->rnr_deadline_ns) {
                rc_rx_wait_end(c);
                return 0;
        } else if (!c->ib_style && dw_tcp_peer_closed(c->fd)) {
                char pb[32];
                dw_info("RC QP %#x peer %s: the peer closed the connection while its Send "
                        "waited "
                        "for a receive WQE; dropped",
                        qp->qpn, rc_peer_str(c, pb, sizeof(pb)));
                rc_rx_wait_end(c);
                qp->ctr.rx_dropped_no_recv++;
                qp->dev->ctr.rx_dropped_no_recv++;
                rc_peer_gone_fail(c);
                return -1;
        }
        /* SRQ receives arrive without dw_rc_post_recv: look again soon. */
        dw_rc_timer_add(qp->dev, c, now + 1000000ull);
        return 1;
}

/* An RDMA Write segment (c->rh): its target in the STag's region. 0, or -1
 * (failed; the Terminate is queued). */
static int rx_resolve_write(struct dw_rc_conn *c, uint32_t payload)
{
        const struct dw_rdmap_hdr *h = &c->rh;
        struct dw_rdmap_refusal ref;
        uint8_t *host = NULL;

        /* diwarp puts nothing between its flagged Immediate Data and
         * the Send: a Write there comes from an RFC 7306 peer, whose
         * Immediate Data stood alone. */
        if (c->imm_pending && !rx_imm_alone(c, c->imm_value, false))
                return -1;
        if (dw_rdmap_write_accept(dw_rdmap_qp_of(c->qp), h->ddp.stag, h->ddp.to, payload, &host,
                                  &ref) < 0) {
                char what[80];
                snprintf(what, sizeof(what), "RDMA Write sink STag %#x TO %#llx len %zu",
                         h->ddp.stag, (unsigned long long)h->ddp.to, (size_t)payload);
                rc_fail_refused(c, &ref, NULL, what);
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

/* An RDMA Read Response segment (c->rh): its target in the sink of the
 * oldest outstanding Read, where it must fall. 0, or -1 (failed; the
 * Terminate is queued). */
static int rx_resolve_read_resp(struct dw_rc_conn *c, uint32_t payload)
{
        const struct dw_rdmap_hdr *h = &c->rh;
        struct dw_rc_orq *o = &c->orq[c->orq_head];

        if (!c->orq_count || o->atomic) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                  DW_TERM_RDMAP_UNEXPECTED_OPCODE, true, NULL,
                                  DIWARP_EVENT_QP_REQ_ERR,
                                  "RDMA Read Response without an outstanding Read");
                return -1;
        }
        if (payload && h->ddp.stag != o->sink_stag) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED,
                                  DW_TERM_DDP_T_INVALID_STAG, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "RDMA Read Response names another sink STag");
                return -1;
        }
        if ((payload && h->ddp.to != o->sink_to + o->done) || o->done + payload > o->len) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED,
                                  DW_TERM_DDP_T_BASE_BOUNDS, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "RDMA Read Response outside the requested range");
                return -1;
        }
        int n = dw_rdmap_sink_target(dw_rdmap_qp_of(c->qp), o->wqe, o->done, payload, c->tgt,
                                     DW_MAX_SGE);
        if (n < 0) {
                struct dw_wqe *w = o->wqe;
                rc_drop_wqe_refs(c);
                rc_complete_through(c, w, DIWARP_WC_LOC_PROT_ERR, 0);
                rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
                                  DW_TERM_RDMAP_CATASTROPHIC_STREAM, false, NULL, -1,
                                  "RDMA Read sink no longer registered");
                return -1;
        }
        c->ntgt = n;
        return 0;
}

/* The first segment of a Send message (c->rh, no receive WQE bound yet):
 * binds the head receive WQE. 0, 1 (it waits for a receive WQE: nothing
 * consumed), 2 (the RFC 6581 RTR zero-length Send: no receive WQE) or -1
 * (failed; the Terminate is queued). */
static int rx_send_start(struct dw_rc_conn *c, uint32_t payload)
{
        const struct dw_rdmap_hdr *h = &c->rh;

        if (h->ddp.mo != 0) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                  DW_TERM_DDP_U_INVALID_MO, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "Send segment with MO != 0 starts a message");
                return -1;
        }
        if (c->rtr_send_expected && payload == 0 && h->ddp.last) {
                /* RFC 6581 RTR zero-length Send: no receive WQE. */
                return 2;
        }
        if (!dw_qp_recv_head(c->qp)) {
                int held = rx_wait_for_recv(c);
                if (held)
                        return held;
        }
        if (c->rx_wait_recv)
                rc_rx_wait_end(c);
        c->rx_wqe = rx_take_recv(c);
        if (!c->rx_wqe)
                return -1;
        c->rx_msg_len = 0;
        return 0;
}

/* A Send segment (any of the family; c->rh): its target in the receive WQE
 * the message fills. 0, 1 (it waits for a receive WQE: nothing consumed)
 * or -1 (failed; the Terminate is queued). */
static int rx_resolve_send(struct dw_rc_conn *c, uint32_t payload)
{
        const struct dw_rdmap_hdr *h = &c->rh;

        if (h->ddp.msn != c->msn_expect_send) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                  DW_TERM_DDP_U_MSN_RANGE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "Send with unexpected MSN");
                return -1;
        }
        if (!c->rx_wqe) {
                int r = rx_send_start(c, payload);
                if (r != 0)
                        return r == 2 ? 0 : r;
        }
        if (h->ddp.mo != c->rx_msg_len) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                  DW_TERM_DDP_U_INVALID_MO, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "Send segment out of order (MO)");
                return -1;
        }
        int n = dw_rdmap_send_target(dw_rdmap_qp_of(c->qp), c->rx_wqe, c->rx_msg_len, payload,
                                     c->tgt, DW_MAX_SGE);
        if (n < 0) {
                struct dw_wqe *w = c->rx_wqe;
                c->rx_wqe = NULL;
                struct dw_term_error te = dw_rdmap_recv_term(n);
                rx_fail_recv(c, w, dw_rdmap_recv_wc(n), te);
                rc_fail_with_term(c, true, te.layer, te.etype, te.ecode, true, NULL,
                                  n == -EMSGSIZE ? DIWARP_EVENT_QP_REQ_ERR
                                                 : DIWARP_EVENT_QP_ACCESS_ERR,
                                  dw_rdmap_recv_why(n));
                return -1;
        }
        c->ntgt = n;
        return 0;
}

/* The resolver of each kind of message that carries payload (rdmap/'s
 * opcode table). */
typedef int rx_resolve_fn(struct dw_rc_conn *c, uint32_t payload);
static rx_resolve_fn *const rx_resolve_by_kind[DW_RDMAP_RX_NKINDS] = {
    [DW_RDMAP_RX_WRITE] = rx_resolve_write,
    [DW_RDMAP_RX_READ_RESP] = rx_resolve_read_resp,
    [DW_RDMAP_RX_SEND] = rx_resolve_send,
};

/* Resolves where the payload of the data segment in c->rh goes. 0, 1 (a
 * Send waits for a receive WQE: nothing consumed) or -1 (failed; the
 * Terminate is queued). */
static int rx_resolve(struct dw_rc_conn *c, uint32_t payload)
{
        c->ntgt = c->tgt_pos = 0;
        /* rx_parse sends only the opcodes that carry payload here: each has
         * its resolver. */
        return rx_resolve_by_kind[dw_rdmap_op(c->rh.opcode)->rx](c, payload);
}

/* The whole data segment (payload + trailer) is in: check CRC, then apply. */
static void rx_data_place(struct dw_rc_conn *c);

static void tgt_walk(struct dw_rc_conn *c, const uint8_t *src, size_t n, bool held);

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

/* One piece on purpose: split into helpers, GCC (release, -flto) no longer
 * inlines rx_data_end into rc_rx, which costs a call per data FPDU. */
static void rx_data_place(struct dw_rc_conn *c)
{
        struct dw_qp *qp = c->qp;
        const struct dw_rdmap_hdr *h = &c->rh;
        uint32_t hold = c->trl_hold;
        uint32_t pad = c->trl_len - DW_MPA_CRC_LEN - hold;

        c->rx_state = DW_RC_RX_HDR;
        if (c->crc) {
                uint32_t want = dw_crc32c_final(dw_crc32c_update(c->crc_state, c->trl, hold + pad));
                const uint8_t *p = c->trl + hold + pad;
                uint32_t got = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                               (uint32_t)p[3] << 24;
                if (want != got) {
                        qp->ctr.crc_errors++;
                        qp->dev->ctr.crc_errors++;
                        rc_fail_with_term(c, true, DW_TERM_LAYER_LLP, DW_TERM_LLP_MPA,
                                          DW_TERM_LLP_CRC, true, NULL, DIWARP_EVENT_QP_FATAL,
                                          "MPA CRC mismatch");
                        return;
                }
        }
        if (hold) {
                tgt_walk(c, c->trl, hold, true);
                c->trl_hold = 0;
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
                        rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP,
                                          DW_TERM_RDMAP_REMOTE_OPERATION, DW_TERM_RDMAP_UNSPECIFIED,
                                          true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                          "RDMA Read Response shorter than requested");
                        return;
                }
                o->wqe->status = DIWARP_WC_SUCCESS;
                o->wqe->byte_len = (uint32_t)o->len;
                o->wqe->flags |= DW_WQE_DONE;
                c->orq_head = (c->orq_head + 1) % DW_RC_MAX_RD;
                c->orq_count--;
                rc_retire(c);
                return;
        }
        default: {
                if (!c->rx_wqe) { /* absorbed RTR Send */
                        c->rtr_send_expected = false;
                        c->msn_expect_send++;
                        return;
                }
                c->rx_msg_len += c->rx_payload;
                if (!h->ddp.last)
                        return;
                struct dw_wqe *w = c->rx_wqe;
                struct dw_rdmap_msg_end e =
                    dw_rdmap_send_end(h->opcode, (uint32_t)c->rx_msg_len, h->inval_stag);
                if (c->imm_pending) { /* diwarp's Send with Immediate */
                        dw_rdmap_end_imm(&e, c->imm_value, false);
                        c->imm_pending = false;
                }
                c->rx_wqe = NULL;
                c->msn_expect_send++;
                struct dw_recv_done d;
                struct dw_term_error te;
                bool se = dw_rdmap_recv_end(dw_rdmap_qp_of(qp), &e, &d, &te);
                rc_rx_complete_recv(c, w, d, se);
                if (d.status != DIWARP_WC_SUCCESS)
                        rc_fail_with_term(c, true, te.layer, te.etype, te.ecode, true, NULL,
                                          DIWARP_EVENT_QP_ACCESS_ERR,
                                          "Send with Invalidate of an STag that cannot be "
                                          "invalidated");
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
        struct dw_rdmap_msg_end e = dw_rdmap_imm_end((uint32_t)c->rx_write_len, imm, se);
        c->rx_write_len = 0;
        struct dw_recv_done d;
        bool solicited = dw_rdmap_recv_end(dw_rdmap_qp_of(c->qp), &e, &d, NULL);
        rc_rx_complete_recv(c, w, d, solicited);
        return true;
}

/* A Read or Atomic Request (c->rh): accepted into the IRQ, whose responses
 * rc_tx.c sends, or refused with a Terminate. */
static void rx_irq_request(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen)
{
        struct dw_qp *qp = c->qp;
        bool atomic = c->rh.opcode == DW_RDMAP_ATOMIC_REQ;
        struct dw_rdmap_refusal ref;
        int r;

        if (c->rh.ddp.msn != c->msn_expect_rreq) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                  DW_TERM_DDP_U_MSN_RANGE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "Read/Atomic Request MSN");
                return;
        }
        if (c->irq_count >= c->ird || c->irq_count >= DW_RC_MAX_RD) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                  DW_TERM_DDP_U_NO_BUFFER, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                                  "more Read/Atomic Requests outstanding than our IRD");
                return;
        }
        struct dw_rc_irq *e = &c->irq[(c->irq_head + c->irq_count) % DW_RC_MAX_RD];
        memset(e, 0, sizeof(*e));
        memcpy(e->term_hdr, c->rh_raw, DW_DDP_UNTAGGED_HDR_LEN);
        if (!atomic && extlen >= DW_RDMAP_RREQ_HDR_LEN)
                memcpy(e->term_hdr + DW_DDP_UNTAGGED_HDR_LEN, ext, DW_RDMAP_RREQ_HDR_LEN);
        r = dw_rdmap_resp_accept(dw_rdmap_qp_of(qp), &c->rh, ext, extlen, &e->resp, &ref);
        if (r == -EACCES) {
                rc_fail_refused(c, &ref, atomic ? NULL : ext,
                                atomic ? "Atomic Request target" : "RDMA Read Request source");
                return;
        }
        if (r < 0) {
                rc_fail_with_term(c, true, ref.te.layer, ref.te.etype, ref.te.ecode, true, NULL,
                                  DIWARP_EVENT_QP_REQ_ERR, ref.why);
                return;
        }
        c->msn_expect_rreq++;
        c->irq_count++;
}

/* An Atomic Response (c->rh): the original value goes to the oldest ORQ
 * entry's result buffer, which completes. */
static void rx_atomic_resp(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen)
{
        struct dw_qp *qp = c->qp;
        struct dw_rdmap_atomic_resp ar;
        struct dw_rc_orq *o = &c->orq[c->orq_head];
        const char *why = NULL;

        if (c->rh.ddp.msn != c->msn_expect_aresp ||
            dw_rdmap_atomic_resp_decode(ext, extlen, &ar, &why) < 0 || !c->orq_count ||
            !o->atomic || ar.req_id != (uint32_t)o->sink_to) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                  DW_TERM_RDMAP_UNEXPECTED_OPCODE, true, NULL,
                                  DIWARP_EVENT_QP_REQ_ERR,
                                  "Atomic Response that matches no outstanding request");
                return;
        }
        c->msn_expect_aresp++;
        struct dw_wqe *w = o->wqe;
        uint64_t v = ar.orig_data; /* host order, as ibverbs returns it */
        if (dw_rdmap_sink_place(dw_rdmap_qp_of(qp), w, 0, &v, 8) < 0) {
                rc_drop_wqe_refs(c);
                rc_complete_through(c, w, DIWARP_WC_LOC_PROT_ERR, 0);
                rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
                                  DW_TERM_RDMAP_CATASTROPHIC_STREAM, false, NULL, -1,
                                  "atomic result buffer no longer registered");
                return;
        }
        w->status = DIWARP_WC_SUCCESS;
        w->byte_len = 8;
        w->flags |= DW_WQE_DONE;
        c->orq_head = (c->orq_head + 1) % DW_RC_MAX_RD;
        c->orq_count--;
        rc_retire(c);
}

/* An Immediate Data message (c->rh): held for the Send that follows it
 * (diwarp's Send with Immediate), or completing a receive WQE alone. */
static void rx_imm_data(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen)
{
        const struct dw_rdmap_hdr *h = &c->rh;
        struct dw_rdmap_imm im;
        const char *why = NULL;

        if (h->ddp.msn != c->msn_expect_send || c->rx_wqe ||
            dw_rdmap_imm_decode(ext, extlen, &im, &why) < 0) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
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
}

/* The WQE of ours a received Terminate names: the carried DDP header says
 * which (a Read Request's MSN, a Send's MSN, a Write's STag); else the
 * oldest outstanding Read or Atomic, else the WQE being sent. */
static struct dw_wqe *term_culprit(struct dw_rc_conn *c, const struct dw_rdmap_term *t)
{
        struct dw_wqe *culprit = NULL;
        struct dw_ddp_hdr dh;

        if (t->has_ddp_hdr && dw_ddp_decode(t->ddp_hdr, t->ddp_hdr_len, &dh, NULL) > 0) {
                struct dw_wqe *w;
                if (!dh.tagged && dh.qn == DW_RDMAP_QN_READ_REQ) {
                        for (uint32_t i = 0; i < c->orq_count; i++) {
                                struct dw_rc_orq *o = &c->orq[(c->orq_head + i) % DW_RC_MAX_RD];
                                if (o->msn == dh.msn)
                                        culprit = o->wqe;
                        }
                }
                for (uint32_t i = 0; !culprit && (w = dw_wq_at(&c->qp->sq, i)); i++) {
                        if (!(w->flags & DW_WQE_STARTED) || (w->flags & DW_WQE_DONE))
                                continue;
                        bool send = dw_wr_op(w->opcode)->kind == DW_WR_SEND;
                        bool write = dw_wr_op(w->opcode)->kind == DW_WR_WRITE;
                        if ((!dh.tagged && dh.qn == DW_RDMAP_QN_SEND && send && w->msn == dh.msn) ||
                            (dh.tagged && write && w->rkey == dh.stag))
                                culprit = w;
                }
        }
        if (!culprit && c->orq_count)
                culprit = c->orq[c->orq_head].wqe;
        if (!culprit)
                culprit = c->cur;
        return culprit;
}

/* A Terminate from the peer: the WR it names completes with its error, the
 * QP goes to ERR. */
static void rx_terminate(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen)
{
        struct dw_qp *qp = c->qp;
        struct dw_rdmap_term t;
        const char *why = NULL;
        char pb[32];

        qp->ctr.terminates_received++;
        qp->dev->ctr.terminates_received++;
        if (dw_rdmap_term_decode(ext, extlen, &t, &why) < 0) {
                dw_warn("RC QP %#x peer %s: malformed Terminate (%s)", qp->qpn,
                        rc_peer_str(c, pb, sizeof(pb)), why);
                memset(&t, 0, sizeof(t));
                t.layer = DW_TERM_LAYER_RDMAP;
                t.etype = DW_TERM_RDMAP_REMOTE_OPERATION;
                t.ecode = DW_TERM_RDMAP_UNSPECIFIED;
        }
        dw_warn("RC QP %#x peer %s: Terminate received (layer %u type %u code %#x)", qp->qpn,
                rc_peer_str(c, pb, sizeof(pb)), t.layer, t.etype, t.ecode);
        int ev;
        struct dw_term_error te = {t.layer, t.etype, t.ecode};
        enum diwarp_wc_status st = dw_rdmap_term_to_wc(te, &ev);
        struct dw_wqe *culprit = term_culprit(c, &t);
        rc_drop_wqe_refs(c);
        rc_complete_through(c, culprit, st, dw_term_vendor_err(te));
        c->term_pending = false;
        c->rx_state = DW_RC_RX_STOP;
        if (qp->state != DIWARP_QPS_ERR)
                dw_qp_to_error(qp, ev);
}

/* The handler of each kind of control message (rdmap/'s opcode table): a
 * Read or Atomic Request joins the IRQ, an Atomic Response completes its
 * WR, Immediate Data and a Terminate as their functions say. */
typedef void rx_control_fn(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen);
static rx_control_fn *const rx_control_by_kind[DW_RDMAP_RX_NKINDS] = {
    [DW_RDMAP_RX_READ_REQ] = rx_irq_request,    [DW_RDMAP_RX_ATOMIC_REQ] = rx_irq_request,
    [DW_RDMAP_RX_ATOMIC_RESP] = rx_atomic_resp, [DW_RDMAP_RX_IMM] = rx_imm_data,
    [DW_RDMAP_RX_TERMINATE] = rx_terminate,
};

/* A control message, whole in staging (c->rh; ext: what follows its
 * DDP/RDMAP header). */
static void rx_control(struct dw_rc_conn *c, const uint8_t *ext, size_t extlen)
{
        const struct dw_rdmap_op *op = dw_rdmap_op(c->rh.opcode);
        c->qp->ctr.rx_packets++;
        if (op && rx_control_by_kind[op->rx]) {
                rx_control_by_kind[op->rx](c, ext, extlen);
                return;
        }
        rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                          DW_TERM_RDMAP_UNEXPECTED_OPCODE, true, NULL, DIWARP_EVENT_QP_REQ_ERR,
                          "unexpected RDMAP opcode");
}

/* Places n bytes into the target iovecs (CRC over them), advancing. */
/* Moves the target on by n bytes: copied from src (staged) or already read
 * into it by the kernel (src NULL). The CRC runs over the staged copy, not
 * the target: the program may change its memory as soon as the bytes land
 * (qperf's rc_rdma_write_poll_lat writes its last byte back once it sees
 * it). held: src is the payload's last bytes, kept in the trailer until the
 * CRC was verified (rx_direct): not counted again, the last byte stored
 * last. */
static void tgt_walk(struct dw_rc_conn *c, const uint8_t *src, size_t n, bool held)
{
        while (n && c->tgt_pos < c->ntgt) {
                struct iovec *t = &c->tgt[c->tgt_pos];
                size_t k = t->iov_len < n ? t->iov_len : n;
                if (held && k == n)
                        dw_copy_last_byte_last(t->iov_base, src, k);
                else if (src)
                        memcpy(t->iov_base, src, k);
                if (c->crc && !held)
                        c->crc_state = dw_crc32c_update(c->crc_state, src ? src : t->iov_base, k);
                if (src)
                        src += k;
                t->iov_base = (uint8_t *)t->iov_base + k;
                t->iov_len -= k;
                n -= k;
                if (t->iov_len == 0)
                        c->tgt_pos++;
        }
}

static void tgt_consume(struct dw_rc_conn *c, const uint8_t *src, size_t n)
{
        tgt_walk(c, src, n, false);
}

static size_t tgt_left(const struct dw_rc_conn *c)
{
        size_t s = 0;
        for (int i = c->tgt_pos; i < c->ntgt; i++)
                s += c->tgt[i].iov_len;
        return s;
}

/* The DDP/RDMAP header of an FPDU that does not decode: the Terminate for
 * what is wrong with it (DDP version, queue number, RDMAP version or
 * opcode). p: the FPDU. */
static void rx_hdr_fail(struct dw_rc_conn *c, const uint8_t *p, bool tagged, const char *why)
{
        uint8_t dv = p[2] & DW_DDP_CTRL_DV, rv = (p[3] & DW_RDMAP_CTRL_RV) >> 6;

        if (dv != DW_DDP_VERSION)
                rc_fail_with_term(
                    c, true, DW_TERM_LAYER_DDP, tagged ? DW_TERM_DDP_TAGGED : DW_TERM_DDP_UNTAGGED,
                    tagged ? DW_TERM_DDP_T_INVALID_VERSION : DW_TERM_DDP_U_INVALID_VERSION, true,
                    NULL, DIWARP_EVENT_QP_FATAL, why);
        else if (!tagged && dw_get_be32(p + 2 + 6) > DW_RDMAP_QN_ATOMIC_RESP)
                rc_fail_with_term(c, true, DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED,
                                  DW_TERM_DDP_U_INVALID_QN, true, NULL, DIWARP_EVENT_QP_FATAL, why);
        else
                rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
                                  rv != DW_RDMAP_VERSION ? DW_TERM_RDMAP_INVALID_VERSION
                                                         : DW_TERM_RDMAP_UNEXPECTED_OPCODE,
                                  true, NULL, DIWARP_EVENT_QP_FATAL, why);
}

/* The MPA and DDP/RDMAP headers of the staged FPDU at p (avail bytes) into
 * c->rx_ulen, c->rh_raw and c->rh; *dlen: the DDP/RDMAP header's length.
 * 1: decoded, 0: need more bytes, -1: stopped (the Terminate is queued). */
static int rx_parse_hdr(struct dw_rc_conn *c, const uint8_t *p, uint32_t avail, uint32_t *dlen)
{
        const char *why = NULL;
        uint16_t ulen = dw_get_be16(p);
        bool tagged = p[2] & DW_DDP_CTRL_T;
        uint32_t dl = tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN;

        c->rx_ulen = ulen;
        memset(c->rh_raw, 0, sizeof(c->rh_raw));
        if (ulen < dl) {
                memcpy(c->rh_raw, p + 2, avail - 2 < dl ? avail - 2 : dl);
                rc_fail_with_term(
                    c, true, DW_TERM_LAYER_DDP, tagged ? DW_TERM_DDP_TAGGED : DW_TERM_DDP_UNTAGGED,
                    tagged ? DW_TERM_DDP_T_INVALID_VERSION : DW_TERM_DDP_U_INVALID_VERSION, false,
                    NULL, DIWARP_EVENT_QP_FATAL, "MPA ULPDU shorter than a DDP header");
                return -1;
        }
        if (avail < DW_MPA_HDR_LEN + dl)
                return 0;
        memcpy(c->rh_raw, p + 2, dl);
        if (dw_rdmap_decode(p + 2, dl, &c->rh, &why) < 0) {
                rx_hdr_fail(c, p, tagged, why);
                return -1;
        }
        *dlen = dl;
        return 1;
}

/* A data FPDU (Write, Read Response, Send) whose headers are decoded: its
 * target resolved, what is staged of it placed, the rest read directly
 * (DW_RC_RX_DIRECT). p: the FPDU in staging. 1, 0 (held) or -1 as rx_parse. */
static int rx_parse_data(struct dw_rc_conn *c, const uint8_t *p, uint32_t dlen)
{
        uint16_t ulen = c->rx_ulen;
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
        /* What is read straight into the target keeps its last bytes back
         * until the CRC is verified (DW_RC_RX_HOLD); a staged payload is
         * checked in staging. */
        uint32_t rest = c->rx_payload - take;
        c->trl_hold = c->crc && c->ntgt ? (rest < DW_RC_RX_HOLD ? rest : DW_RC_RX_HOLD) : 0;
        c->trl_len = (uint32_t)(c->trl_hold + dw_mpa_pad_len(ulen) + DW_MPA_CRC_LEN);
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

/* A control FPDU whose headers are decoded: processed once it is whole in
 * staging (p, avail bytes). 1, 0 (need more bytes, or held) or -1 as
 * rx_parse. */
static int rx_parse_control(struct dw_rc_conn *c, const uint8_t *p, uint32_t avail, uint32_t dlen)
{
        uint16_t ulen = c->rx_ulen;
        const char *why = NULL;
        /* Control messages are small and whole in staging. */
        size_t fl = dw_mpa_fpdu_len(ulen, c->crc);

        if (ulen > dlen + DW_RDMAP_ATOMIC_REQ_HDR_LEN + DW_RDMAP_TERM_MAX_LEN) {
                rc_fail_with_term(c, true, DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
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
                rc_fail_with_term(c, true, DW_TERM_LAYER_LLP, DW_TERM_LLP_MPA, DW_TERM_LLP_CRC,
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
                rc_rx_wait_end(c);
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

/* Parses what is staged. 1: progress made, 0: need more bytes, -1: stopped. */
static int rx_parse(struct dw_rc_conn *c)
{
        uint32_t avail = c->rx_end - c->rx_start;
        uint8_t *p = c->rxbuf + c->rx_start;
        uint32_t dlen = 0;

        if (avail < DW_MPA_HDR_LEN + 1)
                return 0;
        int r = rx_parse_hdr(c, p, avail, &dlen);
        if (r <= 0)
                return r;
        rc_rx_comm_est(c);
        /* Payload (Write, Read Response, the Sends) is placed as it streams
         * in; a control message is handled once it is whole in staging.
         * The decoder let only RDMAP's opcodes through. */
        if (dw_rdmap_op(c->rh.opcode)->payload)
                return rx_parse_data(c, p, dlen);
        return rx_parse_control(c, p, avail, dlen);
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

        /* The target up to the held bytes, which the trailer's iovec takes. */
        size_t pay_left = tgt_left(c) - c->trl_hold, want = 0;
        for (int i = c->tgt_pos; i < c->ntgt && want < pay_left; i++) {
                iov[n] = c->tgt[i];
                if (iov[n].iov_len > pay_left - want)
                        iov[n].iov_len = pay_left - want;
                want += iov[n].iov_len;
                n++;
        }
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
        if (tgt_left(c) == c->trl_hold && c->trl_have == c->trl_len)
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

int rc_rx(struct dw_rc_conn *c)
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
                        rc_stream_failed(c, (int)r);
                        return work;
                }
                got += (size_t)r;
                drained = c->rx_short;
                c->qp->dev->ctr.rx_bytes += (size_t)r;
        }
        return work;
}
