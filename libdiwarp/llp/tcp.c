#define _GNU_SOURCE /* accept4, POLLRDHUP */
#include "llp/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/time.h"

int dw_tcp_listen(struct in_addr addr, uint16_t port, int backlog, uint16_t *bound_port)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));

        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = addr, .sin_port = htons(port)};
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
            listen(fd, backlog > 0 ? backlog : 128) < 0) {
                int err = -errno;
                close(fd);
                return err;
        }
        if (bound_port) {
                socklen_t sl = sizeof(sa);
                if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
                        *bound_port = ntohs(sa.sin_port);
        }
        return fd;
}

int dw_tcp_accept(int lfd, struct sockaddr_in *peer)
{
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);

        for (;;) {
                int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0) {
                        if (peer)
                                *peer = sa;
                        return fd;
                }
                if (errno == EINTR)
                        continue;
                /* A connection reset before we accepted it is not an error of
                 * the listener: report "nothing pending". */
                if (errno == EWOULDBLOCK || errno == ECONNABORTED)
                        return -EAGAIN;
                return -errno;
        }
}

int dw_tcp_connect_start(struct in_addr src, const struct sockaddr_in *dst, bool *in_progress)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        /* Bind to the device's address so the peer sees the connection come
         * from the GID the QP advertises (matters with several devices). */
        if (src.s_addr != htonl(INADDR_ANY)) {
                struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = src};
                if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                        int err = -errno;
                        close(fd);
                        return err;
                }
        }
        *in_progress = false;
        if (connect(fd, (const struct sockaddr *)dst, sizeof(*dst)) < 0) {
                if (errno != EINPROGRESS && errno != EINTR) {
                        int err = -errno;
                        close(fd);
                        return err;
                }
                *in_progress = true;
        }
        return fd;
}

int dw_tcp_self_connect(struct in_addr addr, uint64_t deadline_ns)
{
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = addr};
        socklen_t sl = sizeof(sa);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        int err = 0;
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
                err = -errno;
        else if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                if (errno != EINPROGRESS && errno != EINTR)
                        err = -errno;
                else {
                        int r = dw_tcp_wait(fd, POLLOUT, deadline_ns);
                        err = r < 0 ? r : r == 0 ? -ETIMEDOUT : dw_tcp_connect_result(fd);
                }
        }
        if (err) {
                close(fd);
                return err;
        }
        return fd;
}

int dw_tcp_connect_result(int fd)
{
        int err = 0;
        socklen_t sl = sizeof(err);

        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) < 0)
                return -errno;
        return -err;
}

int dw_tcp_configure(int fd, uint32_t peer_timeout_ms)
{
        int one = 1;

        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
                return -errno;
        if (peer_timeout_ms == 0)
                return 0;

        /* Idle stream: keepalive probes start after idle seconds and give up
         * after cnt unanswered probes; together about peer_timeout_ms. Busy
         * stream (unacknowledged data): TCP_USER_TIMEOUT bounds the time data
         * may stay unacknowledged (it also caps the keepalive phase). */
        int secs = (int)((peer_timeout_ms + 999) / 1000);
        int idle = secs >= 3 ? secs / 3 : 1;
        int intvl = 1;
        int cnt = secs - idle > 0 ? secs - idle : 1;
        unsigned int uto = peer_timeout_ms;

        if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) < 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) < 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) < 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) < 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto)) < 0)
                return -errno;
        return 0;
}

int dw_tcp_mss(int fd)
{
        int mss = 0;
        socklen_t l = sizeof(mss);

        if (getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &l) < 0)
                return -errno;
        return mss > 0 ? mss : -EINVAL;
}

bool dw_tcp_peer_closed(int fd)
{
        struct pollfd p = {.fd = fd, .events = POLLRDHUP};
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Reads away what the socket holds, 1 MiB at most a call (a peer that
 * keeps sending must not hold the caller past its deadline). False: the
 * peer's end is closed or reset (nothing more to wait for). */
static bool tcp_discard_input(int fd)
{
        uint8_t sink[4096];
        for (int i = 0; i < 256;) {
                ssize_t r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
                if (r > 0) {
                        i++;
                        continue;
                }
                if (r < 0 && errno == EINTR)
                        continue;
                return r < 0 && errno == EAGAIN;
        }
        return true;
}

void dw_tcp_close_lingering(int fd, uint32_t stall_ms, uint32_t total_ms)
{
        if (fd < 0)
                return;
        shutdown(fd, SHUT_WR);
        uint64_t start = dw_now_ns(), moved = start;
        int last = -1;
        while (tcp_discard_input(fd)) {
                int unacked;
                if (ioctl(fd, SIOCOUTQ, &unacked) < 0 || unacked == 0)
                        break;
                uint64_t now = dw_now_ns();
                if (unacked != last) {
                        last = unacked;
                        moved = now;
                }
                if (now - moved >= (uint64_t)stall_ms * 1000000u ||
                    now - start >= (uint64_t)total_ms * 1000000u)
                        break;
                struct pollfd p = {.fd = fd, .events = POLLIN};
                poll(&p, 1, 1);
        }
        close(fd);
}

ssize_t dw_tcp_writev(int fd, const struct iovec *iov, int iovcnt)
{
        struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};

        for (;;) {
                ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n >= 0)
                        return n;
                if (errno == EINTR)
                        continue;
                if (errno == EWOULDBLOCK)
                        return -EAGAIN;
                return -errno;
        }
}

ssize_t dw_tcp_readv(int fd, const struct iovec *iov, int iovcnt)
{
        struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};

        for (;;) {
                /* One buffer (the staging reads, the busy-poll of an idle
                 * stream): recv skips the msghdr and iovec copies. */
                ssize_t n = iovcnt == 1 ? recv(fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT)
                                        : recvmsg(fd, &mh, MSG_DONTWAIT);
                if (n >= 0)
                        return n;
                if (errno == EINTR)
                        continue;
                if (errno == EWOULDBLOCK)
                        return -EAGAIN;
                return -errno;
        }
}

void dw_iov_advance(struct iovec **iovp, int *iovcnt, size_t n)
{
        struct iovec *iov = *iovp;
        int cnt = *iovcnt;

        while (cnt > 0 && n >= iov->iov_len) {
                n -= iov->iov_len;
                iov++;
                cnt--;
        }
        if (cnt > 0 && n) {
                iov->iov_base = (uint8_t *)iov->iov_base + n;
                iov->iov_len -= n;
        }
        *iovp = iov;
        *iovcnt = cnt;
}

int dw_tcp_wait(int fd, short events, uint64_t deadline_ns)
{
        for (;;) {
                uint64_t now = dw_now_ns();
                int ms = 0;
                if (deadline_ns > now) {
                        uint64_t left = (deadline_ns - now + 999999) / 1000000;
                        ms = left > 1000000 ? 1000000 : (int)left;
                }
                struct pollfd p = {.fd = fd, .events = events};
                int r = poll(&p, 1, ms);
                if (r > 0)
                        return p.revents;
                if (r == 0) {
                        if (dw_now_ns() >= deadline_ns)
                                return 0;
                        continue;
                }
                if (errno != EINTR)
                        return -errno;
        }
}

const char *dw_tcp_addr_str(const struct sockaddr_in *a, char *buf, size_t len)
{
        char ip[INET_ADDRSTRLEN] = "?";

        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, ntohs(a->sin_port));
        return buf;
}
