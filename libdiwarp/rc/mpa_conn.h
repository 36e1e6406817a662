/* MPA connection setup (RFC 5044 section 7, RFC 6581 enhanced setup) on one
 * non-blocking TCP socket, as a state machine that never blocks: the caller
 * drives it with dw_mpa_step whenever the socket may have become readable or
 * writable (a poll loop for the blocking native CM calls, the progress engine
 * for IB-style connects).
 *
 * Initiator: [TCP connect] -> send Request -> read Reply -> DONE | REJECTED.
 * Responder: read Request -> REQUEST (caller decides) -> dw_mpa_respond ->
 *            send Reply -> DONE (accepted) | REJECTED (we rejected).
 *
 * Negotiation, decided here once for the whole project:
 *  - Revision 2 always sent. A revision 1 request is answered in revision 1
 *    (no IRD/ORD block: both then default to DW_MPA_DEFAULT_IRD_ORD).
 *  - CRC: the Request carries C = our policy (DIWARP_RC_CRC). The Reply
 *    carries C = request C OR responder policy; both directions then use what
 *    the Reply says. An initiator that asked for CRC and got C = 0 (a peer that
 *    refuses CRC) runs without it and logs that at info level.
 *  - Markers: never. A Request with M = 1 (the initiator wants to receive
 *    markers, which we never insert) is answered with a Reject Reply (R = 1,
 *    M = 0) and the connection closes; a Reply with M = 1 makes the initiator
 *    fail with -EPROTO. Either way the application sees an error, not a
 *    connection that cannot carry FPDUs.
 *  - IRD/ORD: the Reply carries the responder's IRD and ORD = min(responder
 *    ORD, initiator IRD); each side then uses ORD = min(own ORD, peer IRD).
 *  - Peer-to-peer mode (RFC 6581): we never ask for it. A responder that gets
 *    P2P accepts with a zero-length RDMA Write (or Read, or Send, in that order
 *    of preference) as the RTR message; rtr_* in the result tell rc.c what
 *    to expect (only a zero-length Send needs special handling: it must not
 *    consume a receive WQE).
 * Private data is limited to DW_MPA_PD_MAX - 4 = 508 bytes (the enhanced block
 * counts against PD_Length).
 */
#ifndef DIWARP_RC_MPA_CONN_H
#define DIWARP_RC_MPA_CONN_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#include "wire/mpa.h"

#define DW_MPA_ULP_PD_MAX      (DW_MPA_PD_MAX - DW_MPA_V2_LEN) /* 508 */
#define DW_MPA_DEFAULT_IRD_ORD 1

enum dw_mpa_state {
        DW_MPA_CONNECTING, /* initiator: TCP connect in progress (wait POLLOUT) */
        DW_MPA_SEND_REQ,   /* initiator: writing the Request */
        DW_MPA_WAIT_REP,   /* initiator: reading the Reply */
        DW_MPA_WAIT_REQ,   /* responder: reading the Request */
        DW_MPA_REQUEST,    /* responder: Request complete, call dw_mpa_respond */
        DW_MPA_SEND_REP,   /* responder: writing the Reply */
        DW_MPA_DONE,       /* connected: FPDU mode from now on */
        DW_MPA_REJECTED,   /* initiator: peer rejected; responder: we rejected, reply sent */
        DW_MPA_FAILED,     /* error: see err / why */
};

struct dw_mpa_conn {
        int fd;
        bool initiator;
        enum dw_mpa_state state;
        /* local policy */
        bool want_crc;
        uint16_t ird, ord; /* what we offer: IRD we accept, ORD we want */
        /* frame being written */
        uint8_t tx[DW_MPA_FRAME_HDR_LEN + DW_MPA_PD_MAX];
        uint16_t tx_len, tx_off;
        /* frame being read: exactly the frame's bytes, never beyond, so the
         * first FPDU after it stays in the socket for rc.c */
        uint8_t rx[DW_MPA_FRAME_HDR_LEN + DW_MPA_PD_MAX];
        uint16_t rx_len;
        /* result (valid from REQUEST / DONE / REJECTED) */
        uint8_t revision;  /* the peer's */
        bool crc;          /* CRC in use in both directions */
        bool peer_markers; /* the peer asked for markers (we reject) */
        uint16_t peer_ird, peer_ord;
        bool peer_p2p;
        bool rtr_send, rtr_write, rtr_read; /* responder: RTR message chosen (P2P) */
        uint8_t pd[DW_MPA_ULP_PD_MAX];      /* the peer's private data */
        uint16_t pd_len;
        /* error */
        int err;
        const char *why;
};

/* Initiator. fd: a socket whose connect was started (connecting = true while
 * it is in progress). pd/pd_len: Request private data (<= 508 bytes).
 * Returns 0 or -EINVAL (pd too long). */
int dw_mpa_init_initiator(struct dw_mpa_conn *c, int fd, bool connecting, bool want_crc,
                          uint16_t ird, uint16_t ord, const void *pd, uint16_t pd_len);

/* Responder on an accepted socket. */
void dw_mpa_init_responder(struct dw_mpa_conn *c, int fd, bool want_crc, uint16_t ird,
                           uint16_t ord);

/* Runs the machine as far as the socket allows without blocking. Returns 1
 * when the state is one the caller must act on (REQUEST, DONE, REJECTED,
 * FAILED), 0 when it waits for the socket (see dw_mpa_poll_events). */
int dw_mpa_step(struct dw_mpa_conn *c);

/* poll() events the machine currently waits for (POLLIN or POLLOUT). */
short dw_mpa_poll_events(const struct dw_mpa_conn *c);

/* Responder, in REQUEST: queues the Reply. accept false sends a Reject (R = 1)
 * with the given private data. On accept, ird/ord are the responder's offer
 * (ORD is cut to the initiator's IRD). -EINVAL (wrong state, pd too long).
 * Then keep calling dw_mpa_step until DONE / REJECTED / FAILED. */
int dw_mpa_respond(struct dw_mpa_conn *c, bool accept, uint16_t ird, uint16_t ord, const void *pd,
                   uint16_t pd_len);

/* Negotiated values for rc.c once DONE: ORD = min(own ORD, peer IRD). */
static inline uint16_t dw_mpa_result_ord(const struct dw_mpa_conn *c)
{
        return c->ord < c->peer_ird ? c->ord : c->peer_ird;
}

/* Blocking helper for the native CM calls: steps c, polling its fd, until it
 * needs the caller (returns 1) or deadline_ns passes (-ETIMEDOUT; the state is
 * left as is). */
int dw_mpa_run(struct dw_mpa_conn *c, uint64_t deadline_ns);

#endif
