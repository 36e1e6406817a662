/* The instance UDP socket: open/bind, gathered send, batched receive. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* recvmmsg */
#endif
#include "llp/udp.h"
#ifdef DIWARP_HAVE_URING
#include "llp/uring.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <linux/udp.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

int dw_udp_open(struct dw_udp *u, struct in_addr addr, uint16_t port)
{
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
        int one = 1, sz = DW_UDP_SOCK_BUF;
        int fd, err;

        memset(u, 0, sizeof(*u));
        u->fd = -1;
        fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
                err = -errno;
                close(fd);
                return err;
        }
        /* ICMP errors go to the error queue instead of failing the next
         * call blindly; we drain them (dw_udp_drain_errors). */
        setsockopt(fd, IPPROTO_IP, IP_RECVERR, &one, sizeof(one));
        /* Bigger buffers absorb bursts of 64 KiB datagrams; as root the FORCE
         * variant passes the rmem_max/wmem_max caps. Failures are harmless. */
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) < 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) < 0)
                setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));

        /* A socket-wide gso_size of 0 changes nothing (each send says its
         * own size in a cmsg); the call only tells whether the kernel knows
         * UDP_SEGMENT (Linux >= 4.18). */
        int zero = 0;
        u->gso = setsockopt(fd, SOL_UDP, UDP_SEGMENT, &zero, sizeof(zero)) == 0;
        /* GRO is off until bulk RD traffic turns it on (dw_udp_want_gro):
         * UDP_GRO on a socket costs each datagram received ≈ 100-170 ns
         * (loopback, 64 B ping-pong), which UD latency does not want. */
        u->gro = false;
        u->gro_wanted = false;

        u->rx_buf = malloc((size_t)DW_UDP_RX_BATCH * DW_UDP_RX_BUF);
        u->rx_msgs = calloc(DW_UDP_RX_BATCH, sizeof(*u->rx_msgs));
        u->tx_msgs = calloc(DW_UDP_TX_BATCH, sizeof(*u->tx_msgs));
        u->rx_ctrl = calloc(DW_UDP_RX_BATCH, sizeof(*u->rx_ctrl));
        if (!u->rx_buf || !u->rx_msgs || !u->tx_msgs || !u->rx_ctrl) {
                u->fd = fd;
                dw_udp_close(u);
                return -ENOMEM;
        }
        /* The receive headers are set up once; a receive resets only what
         * the kernel writes back (msg_namelen; msg_len and msg_flags are
         * always written for the datagrams it returns). */
        for (int i = 0; i < DW_UDP_RX_BATCH; i++) {
                u->rx_iov[i].iov_base = u->rx_buf + (size_t)i * DW_UDP_RX_BUF;
                u->rx_iov[i].iov_len = DW_UDP_RX_BUF;
                u->rx_pkt[i] = u->rx_iov[i].iov_base;
                struct msghdr *mh = &u->rx_msgs[i].msg_hdr;
                mh->msg_name = &u->rx_addr[i];
                mh->msg_namelen = sizeof(u->rx_addr[i]);
                mh->msg_iov = &u->rx_iov[i];
                mh->msg_iovlen = 1;
        }
        u->fd = fd;
        return 0;
}

void dw_udp_close(struct dw_udp *u)
{
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                dw_uring_close(u); /* before the socket and the buffers it points at */
#endif
        if (u->fd >= 0)
                close(u->fd);
        u->fd = -1;
        free(u->rx_buf);
        free(u->rx_msgs);
        free(u->tx_msgs);
        free(u->rx_ctrl);
        u->rx_ctrl = NULL;
        u->rx_buf = NULL;
        u->rx_msgs = NULL;
        u->tx_msgs = NULL;
}

/* The receive headers carry control buffers while GRO or timestamps want
 * their cmsgs, none otherwise (a recvmmsg without them costs less). */
static void udp_rx_ctrl(struct dw_udp *u, bool on)
{
        for (int i = 0; i < DW_UDP_RX_BATCH; i++) {
                u->rx_msgs[i].msg_hdr.msg_control = on ? u->rx_ctrl[i] : NULL;
                u->rx_msgs[i].msg_hdr.msg_controllen = on ? sizeof(u->rx_ctrl[i]) : 0;
        }
}

int dw_udp_enable_uring(struct dw_udp *u)
{
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                return 0;
        u->gro_wanted = false;
        if (u->gro) {
                /* io_uring hands buffers up as they are: no coalescing. */
                int zero = 0;
                if (setsockopt(u->fd, SOL_UDP, UDP_GRO, &zero, sizeof(zero)) < 0)
                        return -errno;
                u->gro = false;
                udp_rx_ctrl(u, false);
        }
        return dw_uring_open(u);
#else
        (void)u;
        return -ENOTSUP;
#endif
}

int dw_udp_enable_stamps(struct dw_udp *u)
{
        int one = 1;
        if (u->stamps)
                return 0;
        if (setsockopt(u->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0)
                return -errno;
        u->stamps = true;
        if (!u->ur)
                udp_rx_ctrl(u, true);
        return 0;
}

/* Off again for a busy-polling ping-pong: the kernel then stamps no
 * datagram (stamping costs a ping-pong ≈ 0.15 µs per message on loopback). */
static void udp_stamps_off(struct dw_udp *u)
{
        int zero = 0;
        u->stamp_calm = 0;
        if (!u->stamps || setsockopt(u->fd, SOL_SOCKET, SO_TIMESTAMPNS, &zero, sizeof(zero)) < 0)
                return;
        u->stamps = false;
        u->stamps_wanted = true;
        udp_rx_ctrl(u, u->gro);
}

void dw_udp_stamps_on_wanted(struct dw_udp *u)
{
        if (u->stamps_wanted && !u->stamps && !u->ur && dw_udp_enable_stamps(u) == 0)
                u->stamps_wanted = false;
}

void dw_udp_stamp_lone(struct dw_udp *u)
{
        u->stamp_lone = true;
        dw_udp_stamps_busy(u);
}

int dw_udp_enable_gro(struct dw_udp *u)
{
        if (u->gro)
                return 0;
        if (u->ur)
                return -ENOTSUP; /* io_uring hands buffers up as they are */
        int one = 1;
        if (setsockopt(u->fd, SOL_UDP, UDP_GRO, &one, sizeof(one)) < 0)
                return -errno;
        udp_rx_ctrl(u, true);
        u->gro = true;
        u->gro_lone = 0;
        return 0;
}

int dw_udp_poll_fd(const struct dw_udp *u)
{
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                return dw_uring_fd(u);
#endif
        return u->fd;
}

/* Reads and discards every queued ICMP error. UD is unreliable and RD has its
 * own timers, so an error only matters as a counter. */
void dw_udp_drain_errors(struct dw_udp *u)
{
        uint8_t ctrl[256], data[64];
        for (int i = 0; i < 64; i++) {
                struct iovec iov = {data, sizeof(data)};
                struct msghdr mh = {.msg_iov = &iov,
                                    .msg_iovlen = 1,
                                    .msg_control = ctrl,
                                    .msg_controllen = sizeof(ctrl)};
                if (recvmsg(u->fd, &mh, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
                        return;
                u->icmp_errors++;
        }
}

bool dw_udp_is_icmp_err(int e)
{
        return e == ECONNREFUSED || e == EHOSTUNREACH || e == ENETUNREACH || e == EHOSTDOWN ||
               e == ENETDOWN || e == EPROTO;
}

/* A socket call failed with errno e: 0 when it is worth one more try (a
 * signal, or a queued ICMP report about an earlier datagram, now drained),
 * else the negative errno with EWOULDBLOCK spelled -EAGAIN. */
static int udp_failed(struct dw_udp *u, int e)
{
        if (e == EINTR)
                return 0;
        if (dw_udp_is_icmp_err(e)) {
                dw_udp_drain_errors(u);
                return 0;
        }
        return e == EWOULDBLOCK ? -EAGAIN : -e;
}

/* Two tries both failed with e. A network error met twice is the
 * destination's own (no route, interface down), not a queued ICMP report
 * about an earlier datagram: the caller learns it (a multirail device
 * leaves that rail). Anything else: try again later. */
static int udp_gave_up(int e)
{
        return dw_udp_is_icmp_err(e) ? -e : -EAGAIN;
}

int dw_udp_send(struct dw_udp *u, const struct iovec *iov, int iovcnt,
                const struct sockaddr_in *dst)
{
#ifdef DIWARP_HAVE_URING
        if (u->ur) {
                struct dw_udp_msg m = {.iov = iov, .iovcnt = iovcnt, .dst = dst};
                int r = dw_uring_send_batch(u, &m, 1);
                if (r < 0)
                        return r;
                size_t len = 0;
                for (int i = 0; i < iovcnt; i++)
                        len += iov[i].iov_len;
                return (int)len;
        }
#endif
        struct msghdr mh = {.msg_name = (void *)dst,
                            .msg_namelen = sizeof(*dst),
                            .msg_iov = (struct iovec *)iov,
                            .msg_iovlen = (size_t)iovcnt};
        int e = EAGAIN;
        for (int attempt = 0; attempt < 2; attempt++) {
                ssize_t n = sendmsg(u->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n >= 0)
                        return (int)n;
                e = errno;
                int r = udp_failed(u, e);
                if (r < 0)
                        return r;
        }
        return udp_gave_up(e);
}

int dw_udp_send_gso(struct dw_udp *u, const struct iovec *iov, int iovcnt,
                    const struct sockaddr_in *dst, uint16_t gso_size)
{
        union {
                char buf[CMSG_SPACE(sizeof(uint16_t))];
                struct cmsghdr align;
        } ctrl;
        if (!dw_udp_gso_on(u))
                return -EOPNOTSUPP;
        memset(&ctrl, 0, sizeof(ctrl));
        struct msghdr mh = {.msg_name = (void *)dst,
                            .msg_namelen = sizeof(*dst),
                            .msg_iov = (struct iovec *)iov,
                            .msg_iovlen = (size_t)iovcnt,
                            .msg_control = ctrl.buf,
                            .msg_controllen = sizeof(ctrl.buf)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_UDP;
        cm->cmsg_type = UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        memcpy(CMSG_DATA(cm), &gso_size, sizeof(gso_size));
        int e = EAGAIN;
        for (int attempt = 0; attempt < 2; attempt++) {
                ssize_t n = sendmsg(u->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n >= 0)
                        return (int)n;
                e = errno;
                if (e == EINVAL || e == EIO || e == ENOPROTOOPT) {
                        /* No checksum offload on the route, gso_size above its
                         * MTU, an old kernel...: not going to get better. */
                        u->gso = false;
                        dw_info("UDP GSO refused by the kernel (%s); sending datagrams one by one",
                                strerror(e));
                        return -EOPNOTSUPP;
                }
                int r = udp_failed(u, e);
                if (r < 0)
                        return r;
        }
        return udp_gave_up(e);
}

int dw_udp_send_batch(struct dw_udp *u, const struct dw_udp_msg *msgs, int n)
{
        if (n > DW_UDP_TX_BATCH)
                n = DW_UDP_TX_BATCH;
        if (n <= 0)
                return -EINVAL;
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                return dw_uring_send_batch(u, msgs, n);
#endif
        for (int i = 0; i < n; i++) {
                struct msghdr *mh = &u->tx_msgs[i].msg_hdr;
                mh->msg_name = (void *)msgs[i].dst;
                mh->msg_namelen = sizeof(*msgs[i].dst);
                mh->msg_iov = (struct iovec *)msgs[i].iov;
                mh->msg_iovlen = (size_t)msgs[i].iovcnt;
                mh->msg_control = NULL;
                mh->msg_controllen = 0;
                mh->msg_flags = 0;
        }
        int e = EAGAIN;
        for (int attempt = 0; attempt < 2; attempt++) {
                /* sendmmsg stops at the first failing datagram; when it sent at
                 * least one, that error is lost and the caller meets it again
                 * by sending from the first unsent one. */
                int r = sendmmsg(u->fd, u->tx_msgs, (unsigned)n, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (r > 0)
                        return r;
                e = r == 0 ? EAGAIN : errno;
                r = udp_failed(u, e);
                if (r < 0)
                        return r;
        }
        return udp_gave_up(e);
}

int dw_udp_send_fn(void *ctx, const struct iovec *iov, int iovcnt, const void *addr,
                   socklen_t addrlen)
{
        (void)addrlen;
        return dw_udp_send(ctx, iov, iovcnt, addr);
}

void dw_udp_rx_done(struct dw_udp *u)
{
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                dw_uring_rx_done(u);
#else
        (void)u;
#endif
}

bool dw_udp_rx_stashed(const struct dw_udp *u)
{
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                return dw_uring_rx_stashed(u);
#else
        (void)u;
#endif
        return false;
}

/* Kernel timestamps are CLOCK_REALTIME; the engine's clock is
 * CLOCK_MONOTONIC. One reading of both per receive converts them (a stamp
 * is at most a socket's backlog old). */
struct udp_clock {
        uint64_t rt, mono; /* 0 until the first stamp of the receive */
};

static uint64_t udp_mono_stamp(struct udp_clock *c, const struct timespec *ts)
{
        uint64_t rt = (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
        if (!rt)
                return 0;
        if (!c->mono) {
                struct timespec r, m;
                clock_gettime(CLOCK_REALTIME, &r);
                clock_gettime(CLOCK_MONOTONIC, &m);
                c->rt = (uint64_t)r.tv_sec * 1000000000ull + (uint64_t)r.tv_nsec;
                c->mono = (uint64_t)m.tv_sec * 1000000000ull + (uint64_t)m.tv_nsec;
        }
        if (rt >= c->rt)
                return c->mono; /* the wall clock stepped back meanwhile */
        uint64_t age = c->rt - rt;
        return age < c->mono ? c->mono - age : 0;
}

/* The cmsgs of a received datagram: a GRO train's gso_size (0: none) and
 * the kernel's arrival time (0: none). */
static void udp_rx_cmsgs(struct msghdr *mh, struct udp_clock *clk, uint32_t *gso, uint64_t *stamp)
{
        *gso = 0;
        *stamp = 0;
        if (!mh->msg_controllen)
                return;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO &&
                    c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                        int g;
                        memcpy(&g, CMSG_DATA(c), sizeof(g));
                        *gso = g > 0 ? (uint32_t)g : 0;
                } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
                           c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
                        struct timespec ts;
                        memcpy(&ts, CMSG_DATA(c), sizeof(ts));
                        *stamp = udp_mono_stamp(clk, &ts);
                }
        }
}

int dw_udp_peek(struct dw_udp *u, void *buf, size_t cap, struct sockaddr_in *from, bool *train)
{
        union {
                char buf[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(struct timespec))];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = {buf, cap};
        bool want = u->gro || u->stamps;
        *train = false;
        for (int attempt = 0; attempt < 2; attempt++) {
                struct msghdr mh = {.msg_name = from,
                                    .msg_namelen = sizeof(*from),
                                    .msg_iov = &iov,
                                    .msg_iovlen = 1,
                                    .msg_control = want ? ctrl.buf : NULL,
                                    .msg_controllen = want ? sizeof(ctrl.buf) : 0};
                ssize_t n = recvmsg(u->fd, &mh, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
                if (n >= 0) {
                        struct udp_clock clk = {0, 0};
                        uint32_t g;
                        udp_rx_cmsgs(&mh, &clk, &g, &u->peek_stamp);
                        *train = g > 0 && (uint32_t)n > g;
                        return (int)n;
                }
                int r = udp_failed(u, errno);
                if (r < 0)
                        return r;
        }
        return -EAGAIN;
}

int dw_udp_recv_iov(struct dw_udp *u, const struct iovec *iov, int iovcnt)
{
        for (int attempt = 0; attempt < 2; attempt++) {
                struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
                ssize_t n = recvmsg(u->fd, &mh, MSG_TRUNC | MSG_DONTWAIT);
                if (n >= 0)
                        return (int)n;
                int r = udp_failed(u, errno);
                if (r < 0)
                        return r;
        }
        return -EAGAIN;
}

/* GRO receive: buffers 0..n) arrived (lengths in rx_msgs); splits each at
 * its UDP_GRO gso_size into rx_pkt/rx_len/rx_addr. Output entries of buffer
 * i start at or after index i, so filling from the last buffer backwards
 * never overwrites the address of a buffer not yet read. */
static int udp_gro_split(struct dw_udp *u, int n, bool *lone)
{
        uint32_t gso[DW_UDP_RX_BATCH];
        uint32_t cnt[DW_UDP_RX_BATCH];
        uint64_t stamp[DW_UDP_RX_BATCH];
        struct udp_clock clk = {0, 0};
        int total = 0;
        for (int i = 0; i < n; i++) {
                struct msghdr *mh = &u->rx_msgs[i].msg_hdr;
                uint32_t len = u->rx_msgs[i].msg_len;
                udp_rx_cmsgs(mh, &clk, &gso[i], &stamp[i]);
                if (mh->msg_flags & MSG_TRUNC)
                        gso[i] = 0; /* reported whole, as truncated */
                cnt[i] = gso[i] && len > gso[i] ? (len + gso[i] - 1) / gso[i] : 1;
                if (cnt[i] > DW_UDP_GSO_MAX_SEGS) {
                        /* not a train we could have asked for: one bad datagram */
                        cnt[i] = 1;
                        gso[i] = 0;
                }
                total += (int)cnt[i];
        }
        /* No train, no batch: the lone datagram of a ping-pong. */
        *lone = n == 1 && total == 1;
        int k = total;
        for (int i = n - 1; i >= 0; i--) {
                struct msghdr *mh = &u->rx_msgs[i].msg_hdr;
                struct sockaddr_in from = u->rx_addr[i];
                uint32_t len = u->rx_msgs[i].msg_len;
                bool trunc = (mh->msg_flags & MSG_TRUNC) != 0;
                uint8_t *base = u->rx_iov[i].iov_base;
                /* the kernel shortened them to what it wrote */
                mh->msg_namelen = sizeof(u->rx_addr[i]);
                mh->msg_controllen = sizeof(u->rx_ctrl[i]);
                k -= (int)cnt[i];
                for (uint32_t j = 0; j < cnt[i]; j++) {
                        uint32_t off = gso[i] * j;
                        uint32_t l = cnt[i] == 1 ? len : (len - off < gso[i] ? len - off : gso[i]);
                        u->rx_pkt[k + (int)j] = base + off;
                        u->rx_len[k + (int)j] = l;
                        u->rx_trunc[k + (int)j] = trunc;
                        u->rx_addr[k + (int)j] = from;
                        u->rx_stamp[k + (int)j] = stamp[i];
                }
        }
        return total;
}

/* GRO off again after DW_UDP_GRO_LONE lone receives: the traffic is a
 * ping-pong now, and GRO costs each of its receives; the next backlog turns
 * it back on. A refused setsockopt leaves it on. */
static void udp_gro_off(struct dw_udp *u)
{
        int zero = 0;
        u->gro_lone = 0;
        if (setsockopt(u->fd, SOL_UDP, UDP_GRO, &zero, sizeof(zero)) < 0)
                return;
        u->gro = false;
        u->gro_wanted = true;
        udp_rx_ctrl(u, u->stamps);
        /* Datagram i is buffer i again: a train split may have left entries
         * pointing inside an earlier buffer. */
        for (int i = 0; i < DW_UDP_RX_BATCH; i++)
                u->rx_pkt[i] = u->rx_iov[i].iov_base;
}

/* The receive modes of dw_udp_recv_batch (plain backend). Each returns the
 * datagram count, or -1 with errno set. */

/* GRO on: recvmsg for the lone datagram of a ping-pong, else recvmmsg; the
 * control buffer carries a GRO train's gso_size. */
static int udp_recv_gro(struct dw_udp *u, int max)
{
        int n;
        if (u->rx_single) {
                ssize_t r = recvmsg(u->fd, &u->rx_msgs[0].msg_hdr, MSG_DONTWAIT);
                if (r >= 0)
                        u->rx_msgs[0].msg_len = (unsigned)r;
                n = r >= 0 ? 1 : -1;
        } else {
                n = recvmmsg(u->fd, u->rx_msgs, (unsigned)max, MSG_DONTWAIT, NULL);
        }
        if (n < 0)
                return -1;
        u->rx_single = !u->rx_single && n <= 1;
        bool lone = false;
        int got = udp_gro_split(u, n, &lone);
        if (!lone)
                u->gro_lone = 0;
        else if (++u->gro_lone >= DW_UDP_GRO_LONE)
                udp_gro_off(u);
        return got;
}

/* Latency mode: a busy-polling ping-pong sees one datagram at a time;
 * recvfrom is the cheapest way to get it, recvmsg when the stamp is wanted
 * (dw_udp_stamp_lone). MSG_TRUNC returns the real length of an oversize
 * one. More may be queued: the next call takes a batch. */
static int udp_recv_one(struct dw_udp *u)
{
        ssize_t r;
        if (u->stamps && u->stamp_lone) {
                struct msghdr *mh = &u->rx_msgs[0].msg_hdr;
                r = recvmsg(u->fd, mh, MSG_DONTWAIT | MSG_TRUNC);
                if (r < 0)
                        return -1;
                struct udp_clock clk = {0, 0};
                uint32_t gso;
                udp_rx_cmsgs(mh, &clk, &gso, &u->rx_stamp[0]);
                mh->msg_namelen = sizeof(u->rx_addr[0]);
                mh->msg_controllen = sizeof(u->rx_ctrl[0]);
        } else {
                socklen_t al = sizeof(u->rx_addr[0]);
                r = recvfrom(u->fd, u->rx_pkt[0], DW_UDP_RX_BUF, MSG_DONTWAIT | MSG_TRUNC,
                             (struct sockaddr *)&u->rx_addr[0], &al);
                if (r < 0)
                        return -1;
        }
        u->rx_len[0] = r > DW_UDP_RX_BUF ? DW_UDP_RX_BUF : (uint32_t)r;
        u->rx_trunc[0] = r > DW_UDP_RX_BUF;
        u->rx_single = false;
        /* DW_UDP_GRO_LONE lone receives in a row, none after the thread was
         * away: a busy-polling ping-pong, which stamps would only slow. */
        if (u->stamps && !u->stamp_lone && ++u->stamp_calm >= DW_UDP_GRO_LONE)
                udp_stamps_off(u);
        u->stamp_lone = false;
        return 1;
}

static int udp_recv_many(struct dw_udp *u, int max)
{
        int n = recvmmsg(u->fd, u->rx_msgs, (unsigned)max, MSG_DONTWAIT, NULL);
        if (n < 0)
                return -1;
        u->rx_single = n <= 1;
        struct udp_clock clk = {0, 0};
        for (int i = 0; i < n; i++) {
                struct msghdr *mh = &u->rx_msgs[i].msg_hdr;
                if (u->stamps) {
                        uint32_t gso;
                        udp_rx_cmsgs(mh, &clk, &gso, &u->rx_stamp[i]);
                        mh->msg_controllen = sizeof(u->rx_ctrl[i]);
                }
                /* the kernel shortened it to the source's length */
                mh->msg_namelen = sizeof(u->rx_addr[i]);
                u->rx_len[i] = u->rx_msgs[i].msg_len;
                u->rx_trunc[i] = (mh->msg_flags & MSG_TRUNC) != 0;
        }
        if (n > 1)
                u->stamp_calm = 0;
        if (n >= DW_UDP_GRO_BACKLOG && (u->gro_wanted || (u->stamps_wanted && !u->stamps))) {
                /* this batch is read; later ones carry the cmsgs */
                dw_udp_stamps_on_wanted(u);
                if (u->gro_wanted) {
                        u->gro_wanted = false;
                        dw_udp_enable_gro(u);
                }
        }
        return n;
}

int dw_udp_recv_batch(struct dw_udp *u, int max)
{
        if (max > DW_UDP_RX_BATCH)
                max = DW_UDP_RX_BATCH;
        if (max <= 0)
                return 0;
#ifdef DIWARP_HAVE_URING
        if (u->ur)
                return dw_uring_recv_batch(u, max);
#endif
        for (int attempt = 0; attempt < 2; attempt++) {
                int n = u->gro         ? udp_recv_gro(u, max)
                        : u->rx_single ? udp_recv_one(u)
                                       : udp_recv_many(u, max);
                if (n >= 0)
                        return n;
                int e = errno;
                if (e == EAGAIN || e == EWOULDBLOCK) {
                        u->rx_single = true;
                        return 0;
                }
                if (e == EINTR)
                        continue;
                if (dw_udp_is_icmp_err(e)) {
                        dw_udp_drain_errors(u);
                        continue;
                }
                return -e;
        }
        return 0;
}
