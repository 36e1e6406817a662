/* llp/uring: the io_uring backend of the instance UDP socket (DIWARP_IO=uring).
 * Only llp/udp.c calls it; everyone else goes through llp/udp.h.
 *
 * Receive: one multishot IORING_OP_RECVMSG on the socket picks its buffers
 * from a provided-buffer ring made of the socket's DW_UDP_RX_BATCH bounce
 * buffers; a progress step reaps the completions from the CQ without a
 * syscall and hands the buffers back (dw_uring_rx_done) once the packets are
 * placed. The multishot request is re-armed after it ends (no buffer left,
 * an ICMP error, the arming thread exited).
 *
 * Transmit: one IORING_OP_SENDMSG SQE per datagram, linked (IOSQE_IO_LINK)
 * so a failure cancels the rest, as sendmmsg stops at its first error, with
 * MSG_DONTWAIT so a full socket buffer completes with -EAGAIN instead of
 * parking the request. The sends are submitted and their completions awaited
 * in the same call, so headers on the caller's stack and payload in
 * registered memory are read before it returns (same contract as sendmsg).
 * Receive completions met meanwhile are stashed for the next receive.
 *
 * Compiled only when liburing is found (DIWARP_HAVE_URING).
 */
#ifndef DIWARP_LLP_URING_H
#define DIWARP_LLP_URING_H

#include "llp/udp.h"

int dw_uring_open(struct dw_udp *u);
void dw_uring_close(struct dw_udp *u);
int dw_uring_fd(const struct dw_udp *u);
int dw_uring_send_batch(struct dw_udp *u, const struct dw_udp_msg *msgs, int n);
int dw_uring_recv_batch(struct dw_udp *u, int max);
void dw_uring_rx_done(struct dw_udp *u);
bool dw_uring_rx_stashed(const struct dw_udp *u);

#endif
