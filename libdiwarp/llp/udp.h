/* llp/udp: the device instance's UDP socket (one per device, shared by every
 * UD/RD QP). Knows sockets and buffers, nothing about QPs or the wire format.
 *
 * Transmit: dw_udp_send gathers iovecs with one sendmsg (no staging copy).
 * Receive: dw_udp_recv_batch fills up to DW_UDP_RX_BATCH preallocated bounce
 * buffers with one recvmmsg. IP_RECVERR is on: ICMP errors (port unreachable
 * from a peer that went away) are read from the error queue and counted, and
 * never fail a receive or a send.
 */
#ifndef DIWARP_LLP_UDP_H
#define DIWARP_LLP_UDP_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define DW_UDP_RX_BATCH 32
#define DW_UDP_RX_BUF   65536 /* > the largest IPv4 UDP payload, so truncation is visible */
#define DW_UDP_SOCK_BUF (4 << 20)

struct dw_udp {
        int fd;
        uint8_t *rx_buf;         /* DW_UDP_RX_BATCH x DW_UDP_RX_BUF bytes */
        struct mmsghdr *rx_msgs; /* [DW_UDP_RX_BATCH]; opaque here (needs _GNU_SOURCE) */
        struct iovec rx_iov[DW_UDP_RX_BATCH];
        struct sockaddr_in rx_addr[DW_UDP_RX_BATCH];
        uint64_t icmp_errors; /* errors read from the error queue */
};

/* Creates the socket bound to addr:port (non-blocking, CLOEXEC, IP_RECVERR,
 * DW_UDP_SOCK_BUF send/receive buffers as far as the system allows).
 * -EADDRINUSE when the port is taken; other -errno. */
int dw_udp_open(struct dw_udp *u, struct in_addr addr, uint16_t port);
void dw_udp_close(struct dw_udp *u);

/* Sends one datagram. Returns bytes sent, or -errno: -EAGAIN/-ENOBUFS mean
 * "no room now, retry on the next progress step". A pending ICMP error is
 * consumed and the send retried once. */
int dw_udp_send(struct dw_udp *u, const struct iovec *iov, int iovcnt,
                const struct sockaddr_in *dst);
/* Same signature as dw_fault_send_fn (ctx = struct dw_udp *). */
int dw_udp_send_fn(void *ctx, const struct iovec *iov, int iovcnt, const void *addr,
                   socklen_t addrlen);

/* Receives up to max (<= DW_UDP_RX_BATCH) datagrams. Returns the count
 * (0 when none is waiting) or -errno. Datagram i is dw_udp_rx_pkt(u, i) with
 * dw_udp_rx_len(u, i) bytes from u->rx_addr[i]; dw_udp_rx_truncated marks an
 * oversize one. Valid until the next call. */
int dw_udp_recv_batch(struct dw_udp *u, int max);
size_t dw_udp_rx_len(const struct dw_udp *u, int i);
bool dw_udp_rx_truncated(const struct dw_udp *u, int i);

static inline uint8_t *dw_udp_rx_pkt(struct dw_udp *u, int i)
{
        return u->rx_buf + (size_t)i * DW_UDP_RX_BUF;
}

#endif
