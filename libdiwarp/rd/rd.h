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

/* The hooks the generic QP code (qp/) and the progress engine's RD table
 * call are declared in dw.h ("hooks into the RD transport"); these are the
 * entries the other transports use (ud/ hands RD datagrams on, rc/ connects
 * RC over RD) and the sizes tests report. */

/* Per-device RD state (dev->rd), made with the device's first RD QP;
 * dw_rd_dev_fini (dw.h) frees it at close. */
int dw_rd_dev_init(struct dw_device *dev);
/* One received RD datagram: CRC verified, header decoded (hl bytes), body is
 * the length without the CRC; stamp: when the kernel received it (ns, 0:
 * unknown), the time its RTT sample and ACK delay go by. */
void dw_rd_rx(struct dw_device *dev, uint8_t *pkt, size_t body, size_t hl,
              const struct dw_dgram_hdr *h, const struct sockaddr_in *from, uint64_t stamp);
/* Payload bytes per segment for a given UDP MTU (see rd_int.h). */
uint32_t dw_rd_seg_payload(uint32_t udp_mtu);
/* sizeof(struct dw_rd_peer): an idle pseudo-stream (≤ 256 bytes). A peer with
 * PSNs in flight also borrows a send-window ring of DW_REL_DEF_WINDOW × 16
 * bytes from a per-device cache. For reports and tests. */
size_t dw_rd_peer_bytes(void);
/* RC over RD connected by rc/cm.c, rc/'s one call into rd/ (rc.c binds the
 * QP with it as it moves it to RTR; device lock held): rx, the token every
 * datagram of the connection must carry to us (any other is dropped and
 * counted in rx_dropped_token), tx, the one ours carry to the peer; both
 * from the MPA exchange on the connection's TCP stream; key, the
 * connection's AES-GMAC key (DW_SEAL_CONN_KEY_LEN bytes, dw_seal_conn_key)
 * when DIWARP_AUTH asks for one, or NULL: every datagram of the QP is then
 * sealed and opened with it. All zero (0, 0, NULL) forgets them, as a reset
 * does; an IB-style connect has none. 0, or a negative errno (libcrypto,
 * getrandom) with nothing set. */
int dw_rd_rc_attach(struct dw_qp *qp, uint64_t rx, uint64_t tx, const uint8_t *key);
/* dw_ud_rx, while dev->conn_keys: an RD datagram (len bytes with its
 * trailer) to a QP with its connection's key is opened with that key and
 * handled (true); any other is left to the device's seal (false). */
bool dw_rd_rx_keyed(struct dw_device *dev, uint8_t *pkt, size_t len, const struct sockaddr_in *from,
                    uint64_t stamp);

#endif
