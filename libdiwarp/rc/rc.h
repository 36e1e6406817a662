/* RC transport over TCP/MPA (RFC 5040/5041/5044, RFC 7306 extensions).
 *
 * One struct dw_rc_conn per RC/UC QP (qp->rc), allocated at QP create with
 * every buffer it will use, so the data path never allocates:
 *  - transmit: FPDUs are gathered with writev straight from registered memory:
 *    [MPA length + DDP/RDMAP header] [payload iovecs] [pad + CRC]. Up to
 *    a batch of FPDUs (DW_RC_TX_BATCH_*) goes out per syscall; a short write resumes where it
 *    stopped on the next progress step (EPOLLOUT).
 *  - receive: headers land in a small staging buffer; the payload of a tagged
 *    or untagged data segment is read with readv directly into its target
 *    (registered memory resolved through mem/ checks), followed by the trailer
 *    and a peek at the next header. Small FPDUs (an Ethernet-sized MSS) are
 *    read many at a time into staging (64 KiB on such streams) and copied
 *    to their targets. CRC32c is computed over what was placed.
 * The hooks of dw.h (dw_rc_*) drive it; cm.c hands it established streams
 * through dw_rc_handover. The device lock is held for everything here.
 */
#ifndef DIWARP_RC_RC_H
#define DIWARP_RC_RC_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dw.h"
#include "wire/ddp.h"
#include "wire/mpa.h"
#include "wire/rdmap.h"

struct dw_mpa_conn;
struct dw_cm_att;

/* FPDU size: every stream sizes its FPDUs from the TCP connection's effective
 * MSS (RFC 5044 MULPDU, dw_mpa_mulpdu), read at attach and again now and then
 * while large messages flow, so a full FPDU is one TCP segment. The ULPDU is
 * the DDP/RDMAP header (14 tagged, 18 untagged) plus the payload. */
#define DW_RC_MULPDU_DEFAULT 65042u      /* when TCP_MAXSEG cannot be read: 65024 payload + 18 */
#define DW_RC_MULPDU_MIN     256u        /* floor for absurdly small MSS values */
#define DW_RC_MSS_RECHECK    256u        /* FPDUs of bulk batches between two TCP_MAXSEG reads */
#define DW_RC_MSS_BULK       (32u << 10) /* a batch of at least this many bytes is bulk */
/* FPDUs per writev: as many as DW_RC_TX_BATCH_BYTES holds at the stream's
 * MULPDU (read at attach), at least DW_RC_TX_BATCH_MIN and at most
 * DW_RC_TX_BATCH_MAX, so small FPDUs (1442 bytes at MTU 1500: 256 a batch)
 * do not cost a syscall each. The WQEs of a batch complete when all of it
 * is written. The arrays are sized at QP create (minimum) and grown at
 * attach, never on the data path. */
#define DW_RC_TX_BATCH_MIN   16
#define DW_RC_TX_BATCH_MAX   256
#define DW_RC_TX_BATCH_BYTES (1u << 20)
#define DW_RC_HDR_MAX        (DW_MPA_HDR_LEN + DW_DDP_UNTAGGED_HDR_LEN + DW_RDMAP_ATOMIC_REQ_HDR_LEN)
#define DW_RC_RXBUF          16384u /* staging for headers and small FPDUs */
/* A stream whose FPDUs are small (the peer's MSS is Ethernet-sized) brings
 * every payload through staging: a larger buffer reads more of them per
 * syscall. Grown at attach when the own MULPDU is below DW_RC_RXBUF_SMALL
 * (both ends of a path usually see the same MSS). */
#define DW_RC_RXBUF_BULK  (64u << 10)
#define DW_RC_RXBUF_SMALL 8192u
/* A payload read straight into its target keeps its last bytes (at most
 * this many) back in the trailer until the FPDU's CRC is verified: a program
 * that polls the last byte may change its buffer as soon as it sees it,
 * and the CRC must be over the bytes that came (rc_rx.c, rx_direct). */
#define DW_RC_RX_HOLD       64u
#define DW_RC_MAX_RD        DW_MAX_RD_ATOM
#define DW_RC_RX_STEP_BYTES (4u << 20) /* bytes read per callback before yielding */
#define DW_RC_TX_STEP_BYTES (8u << 20) /* bytes written per call before yielding */

enum dw_rc_conn_state {
        DW_RC_IDLE,       /* no stream; IB-style: waiting for RTR */
        DW_RC_CONNECTING, /* cm.c is setting the stream up */
        DW_RC_UP,         /* FPDU mode */
        DW_RC_CLOSING,    /* draining: last FPDUs / Terminate out, FIN sent, wait for EOF */
        DW_RC_CLOSED,     /* stream gone; the QP is in ERR (or RESET), or peer_closed */
};

/* An RDMA Read or Atomic we issued, waiting for its response (ORQ). */
struct dw_rc_orq {
        struct dw_wqe *wqe;
        bool atomic;
        uint32_t msn;       /* DDP queue 1 MSN of the request */
        uint32_t sink_stag; /* Read: the Data Sink STag we named */
        uint64_t sink_to;
        uint64_t len;
        uint64_t done; /* Read Response bytes placed */
};

/* An RDMA Read or Atomic request from the peer, waiting for our response (IRQ). */
struct dw_rc_irq {
        struct dw_rdmap_resp resp; /* the request as accepted (an Atomic has run) */
        uint32_t done;             /* Read Response bytes sent */
        uint8_t term_hdr[DW_DDP_UNTAGGED_HDR_LEN + DW_RDMAP_RREQ_HDR_LEN]; /* for a Terminate */
};

struct dw_rc_txslot {
        uint8_t hdr[DW_RC_HDR_MAX + 2];
        uint8_t trl[DW_MPA_TRAILER_MAX + 1];
};

enum dw_rc_rx_state {
        DW_RC_RX_HDR,    /* parsing headers in the staging buffer */
        DW_RC_RX_DIRECT, /* reading payload remainder + trailer straight from the socket */
        DW_RC_RX_STOP,   /* nothing more is read (error / closing) */
};

struct dw_rc_conn {
        struct dw_qp *qp;
        enum dw_rc_conn_state state;
        int fd;
        struct sockaddr_in peer;
        bool watched;
        uint32_t watch_events;
        /* negotiated */
        bool crc;
        uint16_t ird;           /* requests we accept at once */
        uint16_t peer_ird;      /* cap on our ORD */
        bool rtr_send_expected; /* RFC 6581 P2P: first zero-length Send is the RTR */
        bool ib_style;          /* set up by the IB-style connect */
        /* IB-style stream ended by the peer in an orderly way (EOF at an FPDU
         * boundary: its QP was destroyed). As on IB, that does not touch this
         * QP: posted receives stay, Sends/Writes still go out while our half
         * of the stream lasts; Reads/Atomics fail (see rc_stream_failed). */
        bool peer_closed;
        bool initiator;
        bool in_tx;    /* rc_tx/rc_build_batch running: error paths must not re-enter */
        bool comm_est; /* first FPDU of this stream seen (COMM_EST if the QP was in RTR) */

        /* ---- transmit ---- */
        struct iovec *iov; /* iov_cap entries */
        int iov_cap;
        int iov_pos, iov_cnt;      /* batch being written: iov[iov_pos..iov_cnt) */
        struct dw_rc_txslot *slot; /* slot_cap FPDU headers and trailers */
        struct dw_wqe **done_wqe;  /* slot_cap: finished when the batch is out */
        int slot_cap;
        int nslot;
        int ndone;
        bool term_queued; /* the Terminate is in the batch: close after it */
        bool term_pending;
        struct dw_rdmap_term term;
        bool fin_after_batch; /* graceful disconnect: FIN once the batch is out */
        /* SQ WQE being segmented */
        struct dw_wqe *cur;
        uint64_t cur_off;
        int cur_phase; /* 0: main message, 1: the Immediate Data message */
        struct iovec src[DW_MAX_SGE];
        int nsrc;
        bool irq_turn;      /* round-robin between IRQ responses and the SQ */
        uint32_t mulpdu;    /* largest ULPDU per FPDU (from the MSS) */
        uint32_t mss_age;   /* FPDUs of bulk batches since the MSS was read */
        size_t batch_bytes; /* bytes in the batch being built */
        uint32_t msn_send, msn_rreq, msn_term, msn_aresp; /* next MSN per DDP queue */
        struct dw_rc_orq orq[DW_RC_MAX_RD];
        uint32_t orq_head, orq_count;
        uint32_t atomic_req_id;

        /* ---- receive ---- */
        enum dw_rc_rx_state rx_state;
        uint8_t *rxbuf; /* rxbuf_cap bytes */
        uint32_t rxbuf_cap;
        uint32_t rx_start, rx_end;
        bool rx_big;            /* last payload was large: read headers in small peeks */
        struct dw_rdmap_hdr rh; /* header of the segment being placed */
        uint8_t rh_raw[DW_DDP_UNTAGGED_HDR_LEN];
        uint16_t rx_ulen;             /* its ULPDU_Length (a Terminate's DDP Segment Length) */
        uint32_t rx_payload;          /* payload bytes of this segment */
        struct iovec tgt[DW_MAX_SGE]; /* placement target of the remainder */
        int ntgt, tgt_pos;
        uint8_t trl[DW_RC_RX_HOLD + DW_MPA_TRAILER_MAX + 1]; /* held payload, pad, CRC */
        uint32_t trl_len, trl_have;
        uint32_t trl_hold; /* payload bytes held at the start of trl (DW_RC_RX_HOLD) */
        uint32_t crc_state;
        struct dw_wqe *rx_wqe; /* receive WQE the current Send message fills */
        uint64_t rx_msg_len;   /* bytes of the current untagged message so far */
        uint32_t msn_expect_send, msn_expect_rreq, msn_expect_aresp;
        uint64_t rx_write_bytes; /* bytes of the RDMA Write message being received */
        uint64_t rx_write_len;   /* length of the last whole RDMA Write message */
        bool imm_pending;        /* Send with Immediate: the imm of the next Send */
        uint32_t imm_value;
        struct dw_rc_irq irq[DW_RC_MAX_RD];
        uint32_t irq_head, irq_count;

        /* ---- timers / cm ---- */
        uint64_t deadline_ns; /* CLOSING: give up waiting for EOF; cm: connect deadline */
        struct dw_cm_att *cm; /* cm.c: IB-style connect attempt in progress */
        struct dw_rc_conn *tnext, *tprev; /* device list of conns with timers */
        bool on_timer_list;
        struct dw_rc_conn *lnext, *lprev; /* device list of conns with an open stream */
        bool on_live_list;
        bool rx_short; /* the last read returned less than asked: the socket is drained */
        /* A Send found no receive WQE: the stream is held (not read) until one
         * is posted, or rnr_deadline_ns (0: no bound) passes. */
        bool rx_wait_recv;
        uint64_t rnr_deadline_ns;

        /* ---- both ends in this process (rc_local.h) ---- */
        int end_slot;         /* -1: not registered */
        uint64_t tx_sent;     /* stream bytes written since attach */
        uint64_t *done_end;   /* slot_cap: stream offset after each done_wqe[] */
        uint64_t rx_done;     /* stream bytes consumed (whole FPDUs) */
        uint32_t rx_fpdu_len; /* wire length of the data FPDU being placed */
};

/* The one writer of c->state: moves the connection to `to` if the RC state
 * machine has that transition (rc.c, rc_state_next), else logs why was
 * refused and leaves the state alone (false). Moving to the current state is
 * no transition (true). */
bool dw_rc_set_state(struct dw_rc_conn *c, enum dw_rc_conn_state to, const char *why);

/* RC over RD (DW_RC_SETUP_RD*): what the native CM agreed for the QP. */
struct dw_rc_rd_bind {
        uint32_t peer_qpn; /* the peer QP */
        uint32_t peer_psn; /* its first PSN */
        uint32_t sq_psn;   /* ours */
        uint16_t ird;      /* requests we accept at once */
        uint16_t ord;      /* Reads/Atomics we issue at once (negotiated) */
        /* DW_RC_SETUP_RD_BIND: the token every datagram of the connection
         * carries to us (rx) and to the peer (tx), both from the MPA
         * exchange, and the connection's key (DW_SEAL_CONN_KEY_LEN bytes,
         * DIWARP_AUTH) or NULL; handed to rd/ (dw_rd_rc_attach). */
        uint64_t rx_token, tx_token;
        const uint8_t *conn_key;
};

/* A stream cm.c set up: the finished MPA exchange on fd, with peer. Over RD
 * (rd set) the QP takes no stream: fd stays cm.c's idle CM channel, and mc
 * is not read. */
struct dw_rc_stream {
        int fd;
        const struct dw_mpa_conn *mc;
        const struct sockaddr_in *peer;
        const struct dw_rc_rd_bind *rd;
};

/* How the stream was set up, which says what the QP does with it. */
enum dw_rc_setup {
        /* IB-style connect, either side: attached; a failure (or s NULL: the
         * stream never came) moves the QP to ERR with QP_FATAL. */
        DW_RC_SETUP_IB,
        /* Attached as it is, nothing else: a failure is returned only. The
         * connection to itself (RTR named the QP itself), whose failure
         * fails the modify to RTR that started it. */
        DW_RC_SETUP_ATTACH,
        /* Native connect/accept: INIT -> RTR (the peer's address, the
         * negotiated IRD), attached, -> RTS (the negotiated ORD); a failure
         * moves a QP past INIT to ERR with QP_FATAL. */
        DW_RC_SETUP_NATIVE,
        /* RC over RD, native connect/accept: INIT -> RTR with the peer's
         * address, QPN and first PSN and our IRD (the responder before it
         * sends its Reply, the initiator when the Reply arrives). A failure
         * is returned only (the QP stays in INIT). */
        DW_RC_SETUP_RD_BIND,
        /* RC over RD: RTR -> RTS with our first PSN and the negotiated ORD.
         * A failure is returned only. With s NULL: the setup failed, or the
         * connection's CM stream broke: a QP past INIT (not RESET) moves to
         * ERR with QP_FATAL. An orderly end is dw_rc_disconnect. */
        DW_RC_SETUP_RD,
};

/* cm.c -> the QP: the one hand-over of a set-up stream (s->fd is the QP's
 * from here on: closed by rc.c, also on failure; sends queued before are
 * transmitted), or, with s NULL, of a setup that failed. 0 or -errno. */
int dw_rc_handover(struct dw_qp *qp, const struct dw_rc_stream *s, enum dw_rc_setup how);

/* cm.c -> rc.c: the stream on fd will be qp's, its end is registered now
 * (rc_local.h): by a responder before its MPA Reply goes out (the initiator
 * may attach and send as soon as it has it), by an initiator before its
 * Request goes out (the responder attaches and may send once its Reply is
 * written, before the initiator has read it). to: the address connected to
 * (a connect still in progress has no peer name yet); NULL reads the peer's
 * name from fd. dw_rc_handover registers it otherwise. */
void dw_rc_register_end(struct dw_qp *qp, int fd, const struct sockaddr_in *to);
/* The attempt that registered qp's end failed (its socket is closed): the
 * registration goes with it. */
void dw_rc_unregister_end(struct dw_qp *qp);

/* Graceful disconnect (diwarp_disconnect): what was handed to the socket
 * still goes out, then FIN; the QP moves to ERR. Over RD (no stream; also
 * when the peer closed the CM stream, or is gone before the connection was
 * up) the QP moves to ERR without an event, unless it is there already;
 * closing the CM stream is cm.c's. */
int dw_rc_disconnect(struct dw_qp *qp);

/* IRD we offer in MPA for this QP (max_dest_rd_atomic or the device maximum),
 * and the ORD we ask for. */
uint16_t dw_rc_offer_ird(const struct dw_qp *qp);
uint16_t dw_rc_offer_ord(const struct dw_qp *qp);

/* Timer list of the device (cm.c uses it for its connect attempts too). */
void dw_rc_timer_add(struct dw_device *dev, struct dw_rc_conn *c, uint64_t deadline_ns);
void dw_rc_timer_del(struct dw_device *dev, struct dw_rc_conn *c);

#endif
