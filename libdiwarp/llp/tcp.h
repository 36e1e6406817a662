/* TCP lower layer for RC: non-blocking stream sockets and the socket options
 * that make a vanished peer an error in bounded time.
 *
 * Pure socket helpers: no device, no QP, no MPA. rc/cm.c runs the MPA connection
 * setup on top of these; rc/rc_tx.c and rc/rc_rx.c move FPDUs through
 * dw_tcp_writev/readv.
 * Every function returns >= 0 or a negative errno and never raises SIGPIPE.
 */
#ifndef DIWARP_LLP_TCP_H
#define DIWARP_LLP_TCP_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Non-blocking, close-on-exec listener bound to addr:port (port 0: any; the
 * bound port is then in *bound_port if non-NULL). SO_REUSEADDR is set so a
 * restarted process can rebind at once. Returns the fd or -errno. */
int dw_tcp_listen(struct in_addr addr, uint16_t port, int backlog, uint16_t *bound_port);

/* Accepts one pending connection (non-blocking, close-on-exec). Returns the fd,
 * -EAGAIN when none is pending, or -errno. peer may be NULL. */
int dw_tcp_accept(int lfd, struct sockaddr_in *peer);

/* Starts a non-blocking connect from src (INADDR_ANY / port 0 allowed) to dst.
 * Returns the fd; *in_progress tells whether the connect is still running
 * (then wait for POLLOUT and call dw_tcp_connect_result). -errno on failure. */
int dw_tcp_connect_start(struct in_addr src, const struct sockaddr_in *dst, bool *in_progress);

/* A stream connected to itself (TCP simultaneous open of one socket, RFC 793
 * §3.4): bound to addr on a free port and connected to that same address, so
 * every byte written is read back from the same fd. Non-blocking,
 * close-on-exec; waits for the handshake (a local one) until deadline_ns.
 * Returns the fd or -errno. */
int dw_tcp_self_connect(struct in_addr addr, uint64_t deadline_ns);

/* Result of a finished non-blocking connect: 0 or -errno (SO_ERROR). */
int dw_tcp_connect_result(int fd);

/* Sets the options every RC stream gets: TCP_NODELAY (FPDUs are whole
 * messages already; Nagle would only add latency), SO_KEEPALIVE with
 * TCP_KEEPIDLE/INTVL/CNT and TCP_USER_TIMEOUT derived from peer_timeout_ms,
 * so that a peer that vanishes without FIN/RST (host down, cable pulled) makes
 * the socket fail with ETIMEDOUT within about peer_timeout_ms, both when we
 * have unacknowledged data (user timeout) and when the stream is idle
 * (keepalive). peer_timeout_ms 0 leaves the kernel defaults. */
int dw_tcp_configure(int fd, uint32_t peer_timeout_ms);

/* The connected stream's current effective send MSS (TCP_MAXSEG: the path
 * MTU less IP and TCP headers and the options every segment carries). Returns
 * it (> 0) or -errno. */
int dw_tcp_mss(int fd);

/* True once the peer has closed its end (its FIN or a reset arrived), even
 * with data of it still unread: POLLRDHUP, one poll without waiting. */
bool dw_tcp_peer_closed(int fd);

/* Closes a stream without losing what was sent on it. close() of a TCP
 * socket with unread data resets the connection, and the reset throws away
 * what the socket still holds to send: the peer never gets data whose Sends
 * completed here. So: FIN after what is queued, then read away whatever
 * arrives until the peer has acknowledged everything (SIOCOUTQ 0), its end
 * closed or reset, it acknowledged nothing for stall_ms, or total_ms passed;
 * then close. Blocks (poll, 1 ms at a time): call without the device lock. */
void dw_tcp_close_lingering(int fd, uint32_t stall_ms, uint32_t total_ms);

/* writev with MSG_NOSIGNAL|MSG_DONTWAIT. Returns bytes written (may be short),
 * -EAGAIN when the socket buffer is full, or -errno (-EPIPE, -ECONNRESET,
 * -EFAULT for an unmapped source buffer...). */
ssize_t dw_tcp_writev(int fd, const struct iovec *iov, int iovcnt);

/* readv with MSG_DONTWAIT. Returns bytes read, 0 at end of stream, -EAGAIN when
 * nothing is available, or -errno (-EFAULT for an unmapped target). */
ssize_t dw_tcp_readv(int fd, const struct iovec *iov, int iovcnt);

/* Advances an iovec array past n consumed bytes: *iov / *iovcnt are moved past
 * fully consumed entries and the first partial one is trimmed in place. */
void dw_iov_advance(struct iovec **iov, int *iovcnt, size_t n);

/* Blocks (poll) until fd has events or deadline_ns (dw_now_ns clock; 0 = no
 * wait) passes. Returns the revents, 0 on timeout, or -errno. */
int dw_tcp_wait(int fd, short events, uint64_t deadline_ns);

/* "a.b.c.d:port" into buf (at least 24 bytes), for log lines. */
const char *dw_tcp_addr_str(const struct sockaddr_in *a, char *buf, size_t len);

#endif
