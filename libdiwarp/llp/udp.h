/* llp/udp: the device instance's UDP socket (one per device, shared by every
 * UD/RD QP). Knows sockets and buffers, nothing about QPs or the wire format.
 *
 * Transmit: dw_udp_send gathers iovecs with one sendmsg (no staging copy);
 * dw_udp_send_batch sends several such datagrams with one sendmmsg.
 * Receive: dw_udp_recv_batch fills up to DW_UDP_RX_BATCH preallocated bounce
 * buffers with one recvmmsg. IP_RECVERR is on: ICMP errors (port unreachable
 * from a peer that went away) are read from the error queue and counted, and
 * never fail a receive or a send.
 *
 * Two I/O backends behind the same calls (DIWARP_IO): plain (the syscalls
 * above) and io_uring (llp/uring.h: multishot recvmsg into the same bounce
 * buffers through a provided-buffer ring, sendmsg SQEs). Callers do not see
 * which one runs, except that the fd to watch for "datagrams may be waiting"
 * is dw_udp_poll_fd (the ring fd with io_uring).
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
/* > the largest IPv4 UDP payload (65507) so truncation is visible, with room
 * for io_uring's recvmsg_out header and source address in front of it. */
#define DW_UDP_RX_BUF   (65536 + 128)
#define DW_UDP_SOCK_BUF (8 << 20)
#define DW_UDP_TX_BATCH 16 /* datagrams per sendmmsg */
/* UDP GSO (UDP_SEGMENT): at most this many datagrams per super-datagram (the
 * kernel's UDP_MAX_SEGMENTS), and at most DW_UDP_GSO_MAX_BYTES of payload in
 * all (one IPv4 packet's worth before segmentation). */
#define DW_UDP_GSO_MAX_SEGS  64
#define DW_UDP_GSO_MAX_BYTES 65507
/* Datagrams one receive can return: with UDP GRO each buffer may hold a
 * train of up to DW_UDP_GSO_MAX_SEGS datagrams that dw_udp_recv_batch splits. */
#define DW_UDP_RX_MAX (DW_UDP_RX_BATCH * DW_UDP_GSO_MAX_SEGS)

struct dw_uring;

/* One datagram of a dw_udp_send_batch: iov[0..iovcnt) gathered, sent to dst. */
struct dw_udp_msg {
        const struct iovec *iov;
        int iovcnt;
        const struct sockaddr_in *dst;
};

struct dw_udp {
        int fd;
        uint8_t *rx_buf;         /* DW_UDP_RX_BATCH x DW_UDP_RX_BUF bytes */
        struct mmsghdr *rx_msgs; /* [DW_UDP_RX_BATCH]; opaque here (needs _GNU_SOURCE) */
        struct mmsghdr *tx_msgs; /* [DW_UDP_TX_BATCH] */
        struct iovec rx_iov[DW_UDP_RX_BATCH];
        /* The last batch: datagram i is rx_pkt[i], rx_len[i] bytes from rx_addr[i]. */
        uint8_t *rx_pkt[DW_UDP_RX_MAX];
        uint32_t rx_len[DW_UDP_RX_MAX];
        bool rx_trunc[DW_UDP_RX_MAX];
        struct sockaddr_in rx_addr[DW_UDP_RX_MAX];
        /* UDP GRO on (plain backend): the kernel may hand one buffer holding
         * several datagrams of gso_size bytes (a UDP_GRO cmsg in rx_ctrl). */
        bool gro;
        /* GRO is to come on (dw_udp_want_gro) once a receive finds a backlog
         * of DW_UDP_GRO_BACKLOG datagrams, the sign of bulk traffic. */
        bool gro_wanted;
        /* With GRO on: receives in a row that found one lone datagram (no
         * train, no batch); DW_UDP_GRO_LONE of them turn GRO off again. */
        uint16_t gro_lone;
        uint8_t (*rx_ctrl)[64]; /* [DW_UDP_RX_BATCH] control buffers, with gro */
        struct dw_uring *ur;    /* io_uring backend, NULL = plain */
        uint64_t icmp_errors;   /* errors read from the error queue */
        /* Plain backend: the last receive found at most one datagram, so the
         * next one is a recvfrom (one datagram, no msghdr/iovec import, no
         * second attempt inside recvmmsg) until one succeeds again. */
        bool rx_single;
        /* The kernel takes UDP_SEGMENT on this socket (probed at open; cleared
         * for good when a GSO send fails with EINVAL/EIO/ENOPROTOOPT). */
        bool gso;
        /* Receive timestamps on (dw_udp_enable_stamps, plain backend): the
         * kernel's arrival time of datagram i is rx_stamp[i], of the one
         * dw_udp_peek saw peek_stamp (CLOCK_MONOTONIC ns; 0: unknown). */
        bool stamps;
        /* Timestamps are to come on (dw_udp_want_stamps); stamp_calm: lone
         * receives in a row while on, none after the thread was away. */
        bool stamps_wanted;
        uint16_t stamp_calm;
        /* The next lone receive takes its stamp too (dw_udp_stamp_lone). */
        bool stamp_lone;
        uint64_t peek_stamp;
        uint64_t rx_stamp[DW_UDP_RX_MAX];
};

/* Creates the socket bound to addr:port (non-blocking, CLOEXEC, IP_RECVERR,
 * DW_UDP_SOCK_BUF send/receive buffers as far as the system allows), plain
 * backend. -EADDRINUSE when the port is taken; other -errno. */
int dw_udp_open(struct dw_udp *u, struct in_addr addr, uint16_t port);
void dw_udp_close(struct dw_udp *u);

/* Switches the socket to the io_uring backend. -ENOTSUP when the library was
 * built without liburing; another -errno when the kernel refuses (seccomp,
 * io_uring_disabled, no provided-buffer rings): the plain backend stays. */
int dw_udp_enable_uring(struct dw_udp *u);
/* Turns UDP GRO on (plain backend): a GSO train from a peer (or
 * datagrams a NIC coalesced) then comes up as one buffer, one receive instead
 * of up to 64, split again by dw_udp_recv_batch. The RD engine asks for it
 * with dw_udp_want_gro; UD alone does without (GRO costs every receive). 0, or
 * -ENOTSUP with io_uring, or the setsockopt error (GRO stays off). */
int dw_udp_enable_gro(struct dw_udp *u);
/* Asks for GRO when the traffic is bulk: the plain backend turns it on when
 * one recvmmsg returns at least DW_UDP_GRO_BACKLOG datagrams, and off again
 * (still wanted) after DW_UDP_GRO_LONE receives in a row that each found one
 * lone datagram. A ping-pong, which finds one datagram at a time, does not
 * pay GRO's cost per receive for long, even when its start (connection
 * set-up, a first burst, a descheduled poller) left a backlog; a GSO train
 * received without GRO arrives split into such a backlog, so bulk traffic
 * turns it on with its first train. */
#define DW_UDP_GRO_BACKLOG 4
#define DW_UDP_GRO_LONE    64
static inline void dw_udp_want_gro(struct dw_udp *u)
{
        if (!u->gro)
                u->gro_wanted = true;
}
/* Turns on kernel receive timestamps (SO_TIMESTAMPNS) now: the RD engine
 * times the network with them, not the moment its thread got a core to read
 * the socket (dw_udp_rx_stamp). A datagram read by io_uring, or by the lone
 * recvfrom of a ping-pong (see dw_udp_stamp_lone), has none. 0 or -errno
 * (then none are taken). */
int dw_udp_enable_stamps(struct dw_udp *u);
/* Asks for timestamps when the traffic calls for them: on with a backlog of
 * DW_UDP_GRO_BACKLOG datagrams, or when the caller says its thread was away
 * from the socket (dw_udp_stamp_lone); off again after DW_UDP_GRO_LONE lone
 * receives in a row without such a word (a busy-polling ping-pong, whose
 * every datagram the kernel would otherwise stamp). */
static inline void dw_udp_want_stamps(struct dw_udp *u)
{
        if (!u->stamps)
                u->stamps_wanted = true;
}
/* A batch (recvmmsg, GRO) and a peek always take their stamps; the lone
 * receive of a busy-polling ping-pong (recvfrom, the cheapest) takes one
 * only when the caller asks for it, before a receive that may find a
 * datagram that waited: its thread was away from the socket for a while.
 * Wanted timestamps come on then too. */
void dw_udp_stamp_lone(struct dw_udp *u);
/* The caller's traffic is bulk (a window of datagrams in flight): wanted
 * timestamps come on, and lone receives do not turn them off. */
void dw_udp_stamps_on_wanted(struct dw_udp *u);
static inline void dw_udp_stamps_busy(struct dw_udp *u)
{
        u->stamp_calm = 0;
        if (__builtin_expect(u->stamps_wanted && !u->stamps, 0))
                dw_udp_stamps_on_wanted(u);
}
static inline bool dw_udp_uring_on(const struct dw_udp *u)
{
        return u->ur != NULL;
}
/* The fd whose readability means "datagrams may be waiting": the socket, or
 * the ring fd with io_uring (the socket then only matters for EPOLLOUT). */
int dw_udp_poll_fd(const struct dw_udp *u);

/* Sends one datagram. Returns bytes sent, or -errno: -EAGAIN/-ENOBUFS mean
 * "no room now, retry on the next progress step". A pending ICMP error is
 * consumed and the send retried once; a network error met on both tries is
 * the destination's own (-ENETUNREACH: no route, an interface down) and is
 * returned (the batch and GSO sends do the same). */
int dw_udp_send(struct dw_udp *u, const struct iovec *iov, int iovcnt,
                const struct sockaddr_in *dst);
/* Sends msgs[0..n) (n <= DW_UDP_TX_BATCH) in order with one syscall, stopping
 * at the first failure. Returns how many were sent (>= 1), or -errno when
 * msgs[0] could not be (the error of a later one is seen by calling again
 * from it). Same back-pressure and ICMP rules as dw_udp_send. */
int dw_udp_send_batch(struct dw_udp *u, const struct dw_udp_msg *msgs, int n);
/* GSO: one sendmsg carrying iov[0..iovcnt) to dst, which the kernel cuts
 * into datagrams of gso_size bytes (the last may be shorter) at gso_size
 * boundaries of the concatenated iovec bytes. All or nothing: returns the
 * bytes sent, or -errno with the dw_udp_send rules. When the kernel refuses
 * GSO (EINVAL/EIO/ENOPROTOOPT) u->gso is turned off for good (info line once)
 * and -EOPNOTSUPP is returned: the caller sends the same datagrams the
 * ordinary way. Plain backend only (-EOPNOTSUPP with io_uring). */
int dw_udp_send_gso(struct dw_udp *u, const struct iovec *iov, int iovcnt,
                    const struct sockaddr_in *dst, uint16_t gso_size);
static inline bool dw_udp_gso_on(const struct dw_udp *u)
{
        return u->gso && !u->ur;
}
/* Same signature as dw_fault_send_fn (ctx = struct dw_udp *). */
int dw_udp_send_fn(void *ctx, const struct iovec *iov, int iovcnt, const void *addr,
                   socklen_t addrlen);

/* Receives up to max (<= DW_UDP_RX_BATCH) buffers' worth of datagrams.
 * Returns the datagram count (0 when none is waiting) or -errno; with UDP GRO
 * that count may exceed max (up to DW_UDP_RX_MAX): a coalesced buffer is
 * split back into its datagrams here. Datagram i is dw_udp_rx_pkt(u, i) with
 * dw_udp_rx_len(u, i) bytes from u->rx_addr[i]; dw_udp_rx_truncated marks an
 * oversize one. Valid until dw_udp_rx_done or the next call. */
int dw_udp_recv_batch(struct dw_udp *u, int max);
/* Peeks at the next datagram (plain backend): its first cap bytes into buf,
 * its source into *from; it stays queued. Returns its full length, -EAGAIN
 * when none is waiting, or another -errno. *train: it is a GRO train of
 * several datagrams (only dw_udp_recv_batch splits those). */
int dw_udp_peek(struct dw_udp *u, void *buf, size_t cap, struct sockaddr_in *from, bool *train);
/* Reads the next datagram scattered over iov[0..iovcnt) (plain backend), for
 * a caller that peeked at it and placed its parts. Returns its full length
 * (larger than the iovecs when it did not fit), or -errno. */
int dw_udp_recv_iov(struct dw_udp *u, const struct iovec *iov, int iovcnt);
/* The caller is done with the last batch: its buffers go back to the kernel
 * (io_uring; a no-op for plain). */
void dw_udp_rx_done(struct dw_udp *u);
/* True when datagrams were already taken from the kernel (io_uring reaps
 * receive completions while it waits for its sends) and wait for
 * dw_udp_recv_batch: the caller must not sleep on dw_udp_poll_fd. */
bool dw_udp_rx_stashed(const struct dw_udp *u);

static inline size_t dw_udp_rx_len(const struct dw_udp *u, int i)
{
        return u->rx_len[i];
}
static inline bool dw_udp_rx_truncated(const struct dw_udp *u, int i)
{
        return u->rx_trunc[i];
}
static inline uint8_t *dw_udp_rx_pkt(struct dw_udp *u, int i)
{
        return u->rx_pkt[i];
}
/* When the kernel received the datagram dw_udp_peek saw (0: unknown). */
static inline uint64_t dw_udp_rx_peek_stamp(const struct dw_udp *u)
{
        return u->stamps && !u->ur ? u->peek_stamp : 0;
}
/* When the kernel received datagram i of the last batch (CLOCK_MONOTONIC
 * ns), 0 when unknown (timestamps off, io_uring). */
static inline uint64_t dw_udp_rx_stamp(const struct dw_udp *u, int i)
{
        return u->stamps && !u->ur ? u->rx_stamp[i] : 0;
}

/* For llp/uring.c: reads and counts every queued ICMP error; tells whether an
 * errno is such a report about an earlier datagram. */
void dw_udp_drain_errors(struct dw_udp *u);
bool dw_udp_is_icmp_err(int e);

#endif
