/* RD transport: reliable datagrams over the device's single UDP socket.
 *
 * Serves two kinds of QP: DIWARP_QPT_RD (diwarpdv_create_qp: an address
 * handle + remote QPN per WR, UD-like) and RC/UC QPs when
 * DIWARP_RC_TRANSPORT=rd (one pseudo-stream, set up by the IB-style RTR with
 * dgid + dest_qp_num and sq_psn/rq_psn, no TCP connection).
 *
 * Per (local QP, remote QP) pseudo-stream a struct dw_rd_peer wraps the
 * rel/ state machine (struct dw_rel_peer) and its send-window ring; it is
 * created on first use (first WR to, or first valid packet from, that remote
 * QP) and found through a per-QP hash keyed by (remote IPv4, port, remote
 * QPN). Messages are cut into segments of at most the path MTU (cfg.udp_mtu);
 * each carries its DDP offset (MO untagged, TO tagged) and is placed directly
 * into the target buffer in any order; completions follow the rel/ in-order
 * cursor. See rd/README.md and docs/PROTOCOL.md ("RD over UDP: packet types
 * as used").
 *
 * Every function expects the device lock held.
 */
#ifndef DIWARP_RD_RD_H
#define DIWARP_RD_RD_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#include "dw.h"
#include "rel/rel.h"
#include "wire/dgram.h"

struct dw_rd_qp;
struct dw_rd_peer;

/* True when this QP is served by the RD transport (qp->rd set at create). */
static inline bool dw_qp_on_rd(const struct dw_qp *qp)
{
        return qp->rd != NULL;
}

/* Whether a new QP of this type uses RD on this device. */
bool dw_rd_wanted(const struct dw_device *dev, enum diwarp_qp_type type);

/* Device open/close: per-device RD state (dev->rd). */
int dw_rd_dev_init(struct dw_device *dev);
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
/* The QP is an application mailbox (diwarpdv_mbox_open): it takes no receive WRs. */
bool dw_rd_mbox_app(const struct dw_qp *qp);
/* Receives were posted to srq: Sends parked for its RD QPs go to them. */
void dw_rd_srq_posted(struct dw_device *dev, const struct dw_srq_obj *srq);
/* The QP goes to ERR (called before the WQEs are flushed). */
void dw_rd_qp_error(struct dw_qp *qp);

/* One received RD datagram: CRC verified, header decoded (hl bytes), body is
 * the length without the CRC. */
void dw_rd_rx(struct dw_device *dev, uint8_t *pkt, size_t body, size_t hl,
              const struct dw_dgram_hdr *h, const struct sockaddr_in *from);
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
/* Payload bytes per segment for a given UDP MTU (see rd_int.h). */
uint32_t dw_rd_seg_payload(uint32_t udp_mtu);
/* sizeof(struct dw_rd_peer): an idle pseudo-stream (≤ 256 bytes). A peer with
 * PSNs in flight also borrows a send-window ring of DW_REL_DEF_WINDOW × 16
 * bytes from a per-device cache. For reports and tests. */
size_t dw_rd_peer_bytes(void);
/* A first PSN for a stream of QP qpn (RD-served) to peer_qpn at
 * peer_ip:peer_port (network order; 0 when not known yet) from the device's
 * keyed hash and the clock (RFC 6528): what rc/cm.c offers for a native RC
 * connection carried by RD. */
uint32_t dw_rd_first_psn(struct dw_device *dev, uint32_t qpn, uint32_t peer_ip, uint16_t peer_port,
                         uint32_t peer_qpn);
/* RC over RD connected by rc/cm.c (device lock held, the QP in RTR): rx, the
 * token every datagram of the connection must carry to us (any other is
 * dropped and counted in rx_dropped_token), tx, the one ours carry to the
 * peer; both from the MPA exchange on the connection's TCP stream; key, the
 * connection's AES-GMAC key (DW_SEAL_CONN_KEY_LEN bytes, dw_seal_conn_key)
 * when DIWARP_AUTH asks for one, or NULL: every datagram of the QP is then
 * sealed and opened with it. A reset forgets them; an IB-style connect has
 * none. 0, or a negative errno (libcrypto, getrandom) with nothing set. */
int dw_rd_qp_conn_token(struct dw_qp *qp, uint64_t rx, uint64_t tx, const uint8_t *key);
/* dw_ud_rx, while dev->conn_keys: an RD datagram (len bytes with its
 * trailer) to a QP with its connection's key is opened with that key and
 * handled (true); any other is left to the device's seal (false). */
bool dw_rd_rx_keyed(struct dw_device *dev, uint8_t *pkt, size_t len,
                    const struct sockaddr_in *from);

#endif
