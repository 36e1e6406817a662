/* Raw-socket baselines for diwarp's benchmarks: what plain UDP and TCP sockets
 * achieve on the same machine, measured the same way (busy-polling, pinned).
 *
 *   raw-sock --proto udp|tcp --mode pingpong|stream|rate [--size B] [--iters N]
 *            [--window W] [--port P] [--cpu C] [--block] [HOST]
 *
 * Without HOST it serves one run and exits; with HOST it drives the run and
 * prints `RESULT proto=.. mode=.. size=.. iters=.. status=ok lat_us=..|gbps=..|mps=..`.
 *
 * pingpong: half the average round trip. stream (TCP): back-to-back sends of
 * SIZE bytes, one byte of acknowledgement at the end. stream (UDP) and rate
 * (both): the client keeps at most W messages the server has not received;
 * the server returns an 8-byte credit (cumulative count) every W/2 messages,
 * as diwarp-bw and bench-msgrate do (UDP has no other flow control). Each
 * message is one send() and one recv() of SIZE bytes, so `rate` counts
 * messages the way an application sending messages over a socket sees them.
 * W defaults to 64 for rate and to what a 208 KiB socket buffer holds for
 * UDP stream (the rule diwarp-bw uses).
 *
 * --block: receives sleep in the kernel until data arrives (a blocking
 * recv/recvfrom) instead of busy-polling: the baseline of an event-driven
 * program (ibv_get_cq_event), a thread woken by the kernel for each message.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct opts {
        bool udp;
        bool stream;
        bool rate;
        uint32_t window;
        size_t size;
        long iters;
        uint16_t port;
        int cpu;
        const char *host;
};

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
        fprintf(stderr, "raw-sock: %s: %s\n", what, strerror(errno));
        printf("RESULT status=fail\n");
        exit(1);
}

/* Receive flags: MSG_DONTWAIT busy-polls, so the baseline pays no wake-up
 * cost diwarp's busy-polling avoids; --block clears it (0: the thread sleeps
 * until the kernel wakes it). */
static int recv_flags = MSG_DONTWAIT;

static void recv_exact(int fd, char *buf, size_t len)
{
        size_t got = 0;
        while (got < len) {
                ssize_t n = recv(fd, buf + got, len - got, recv_flags);
                if (n > 0) {
                        got += (size_t)n;
                } else if (n == 0) {
                        errno = ECONNRESET;
                        die("recv");
                } else if (errno != EAGAIN && errno != EINTR) {
                        die("recv");
                }
        }
}

static void send_exact(int fd, const char *buf, size_t len)
{
        size_t put = 0;
        while (put < len) {
                ssize_t n = send(fd, buf + put, len - put, MSG_NOSIGNAL);
                if (n > 0)
                        put += (size_t)n;
                else if (n < 0 && errno != EAGAIN && errno != EINTR)
                        die("send");
        }
}

static size_t udp_recv(int fd, char *buf, size_t cap, struct sockaddr_in *from)
{
        for (;;) {
                socklen_t fl = sizeof(*from);
                ssize_t n = recvfrom(fd, buf, cap, recv_flags, (struct sockaddr *)from, &fl);
                if (n >= 0)
                        return (size_t)n;
                if (errno != EAGAIN && errno != EINTR)
                        die("recvfrom");
        }
}

static int tcp_socket(const struct opts *o)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
                die("socket");
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
        if (!o->host) {
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                sa.sin_addr.s_addr = htonl(INADDR_ANY);
                if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1))
                        die("bind/listen");
                int c = accept(fd, NULL, NULL);
                if (c < 0)
                        die("accept");
                close(fd);
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                return c;
        }
        if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1) {
                errno = EINVAL;
                die("host");
        }
        for (int tries = 0;; tries++) {
                if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
                        return fd;
                if (tries > 200)
                        die("connect");
                usleep(10000);
        }
}

static void run_tcp(const struct opts *o, char *buf)
{
        int fd = tcp_socket(o);
        double t0 = 0;
        if (o->stream) {
                char ack = 0;
                if (o->host) {
                        t0 = now_s();
                        for (long i = 0; i < o->iters; i++)
                                send_exact(fd, buf, o->size);
                        recv_exact(fd, &ack, 1);
                        double t = now_s() - t0;
                        printf("RESULT proto=tcp mode=stream size=%zu iters=%ld status=ok "
                               "gbps=%.3f\n",
                               o->size, o->iters, (double)o->size * o->iters * 8 / t / 1e9);
                } else {
                        for (long i = 0; i < o->iters; i++)
                                recv_exact(fd, buf, o->size);
                        send_exact(fd, &ack, 1);
                }
        } else {
                t0 = now_s();
                for (long i = 0; i < o->iters; i++) {
                        if (o->host) {
                                send_exact(fd, buf, o->size);
                                recv_exact(fd, buf, o->size);
                        } else {
                                recv_exact(fd, buf, o->size);
                                send_exact(fd, buf, o->size);
                        }
                }
                double t = now_s() - t0;
                if (o->host)
                        printf("RESULT proto=tcp mode=pingpong size=%zu iters=%ld status=ok "
                               "lat_us=%.3f\n",
                               o->size, o->iters, t / o->iters / 2 * 1e6);
        }
        close(fd);
}

static void run_udp(const struct opts *o, char *buf)
{
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd < 0)
                die("socket");
        struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(o->port)};
        if (!o->host) {
                struct sockaddr_in sa = {.sin_family = AF_INET,
                                         .sin_port = htons(o->port),
                                         .sin_addr.s_addr = htonl(INADDR_ANY)};
                if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)))
                        die("bind");
                for (long i = 0; i < o->iters; i++) {
                        udp_recv(fd, buf, o->size ? o->size : 1, &peer);
                        if (sendto(fd, buf, o->size, 0, (struct sockaddr *)&peer, sizeof(peer)) < 0)
                                die("sendto");
                }
                return;
        }
        if (inet_pton(AF_INET, o->host, &peer.sin_addr) != 1) {
                errno = EINVAL;
                die("host");
        }
        /* The server may not be bound yet: retry the first exchange with a timeout. */
        struct sockaddr_in from;
        for (int tries = 0;; tries++) {
                if (sendto(fd, buf, o->size, 0, (struct sockaddr *)&peer, sizeof(peer)) < 0)
                        die("sendto");
                double start = now_s();
                ssize_t n = -1;
                while (now_s() - start < 0.05) {
                        socklen_t fl = sizeof(from);
                        n = recvfrom(fd, buf, o->size ? o->size : 1, MSG_DONTWAIT,
                                     (struct sockaddr *)&from, &fl);
                        if (n >= 0)
                                break;
                }
                if (n >= 0)
                        break;
                if (tries > 100) {
                        errno = ETIMEDOUT;
                        die("no answer");
                }
        }
        double t0 = now_s();
        for (long i = 1; i < o->iters; i++) {
                if (sendto(fd, buf, o->size, 0, (struct sockaddr *)&peer, sizeof(peer)) < 0)
                        die("sendto");
                udp_recv(fd, buf, o->size ? o->size : 1, &from);
        }
        double t = now_s() - t0;
        long timed = o->iters > 1 ? o->iters - 1 : 1;
        printf("RESULT proto=udp mode=pingpong size=%zu iters=%ld status=ok lat_us=%.3f\n", o->size,
               o->iters, t / timed / 2 * 1e6);
}

/* ---- windowed one-way transfer with credits (UDP stream, rate) ---------------- */

static int credit_socket(const struct opts *o, struct sockaddr_in *peer)
{
        if (!o->udp)
                return tcp_socket(o);
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd < 0)
                die("socket");
        int big = 4 << 20;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
        *peer = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(o->port)};
        char b = 0;
        if (!o->host) {
                struct sockaddr_in sa = {.sin_family = AF_INET,
                                         .sin_port = htons(o->port),
                                         .sin_addr.s_addr = htonl(INADDR_ANY)};
                if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)))
                        die("bind");
                /* the client's hello tells us where it is; answer it */
                udp_recv(fd, &b, 1, peer);
                if (sendto(fd, &b, 1, 0, (struct sockaddr *)peer, sizeof(*peer)) < 0)
                        die("sendto");
                return fd;
        }
        if (inet_pton(AF_INET, o->host, &peer->sin_addr) != 1) {
                errno = EINVAL;
                die("host");
        }
        for (int tries = 0;; tries++) {
                if (sendto(fd, &b, 1, 0, (struct sockaddr *)peer, sizeof(*peer)) < 0)
                        die("sendto");
                double start = now_s();
                while (now_s() - start < 0.05)
                        if (recv(fd, &b, 1, MSG_DONTWAIT) == 1)
                                return fd;
                if (tries > 100) {
                        errno = ETIMEDOUT;
                        die("no answer");
                }
        }
}

static void xmit(int fd, const struct opts *o, const char *buf, size_t len,
                 const struct sockaddr_in *peer)
{
        if (!o->udp) {
                send_exact(fd, buf, len);
                return;
        }
        for (;;) {
                if (sendto(fd, buf, len, 0, (const struct sockaddr *)peer, sizeof(*peer)) >= 0)
                        return;
                if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR)
                        die("sendto");
        }
}

static void run_credit(const struct opts *o, char *buf)
{
        struct sockaddr_in peer;
        int fd = credit_socket(o, &peer);
        uint32_t every = o->window / 2 ? o->window / 2 : 1;
        uint64_t credit;
        if (!o->host) {
                uint64_t n = 0;
                double last = now_s();
                while (n < (uint64_t)o->iters) {
                        if (o->udp) {
                                ssize_t r = recv(fd, buf, o->size ? o->size : 1, MSG_DONTWAIT);
                                if (r < 0) {
                                        if (errno != EAGAIN && errno != EINTR)
                                                die("recv");
                                        if (now_s() - last > 5) {
                                                errno = ETIMEDOUT;
                                                die("no message");
                                        }
                                        continue;
                                }
                                if ((size_t)r != o->size)
                                        continue; /* a late hello */
                                last = now_s();
                        } else {
                                recv_exact(fd, buf, o->size);
                        }
                        n++;
                        if (n % every == 0 || n == (uint64_t)o->iters) {
                                credit = n;
                                xmit(fd, o, (const char *)&credit, sizeof(credit), &peer);
                        }
                }
                close(fd);
                return;
        }
        uint64_t sent = 0, credited = 0;
        size_t have = 0;
        char cb[8];
        double t0 = now_s(), last = t0;
        while (credited < (uint64_t)o->iters) {
                while (sent < (uint64_t)o->iters && sent - credited < o->window) {
                        xmit(fd, o, buf, o->size, &peer);
                        sent++;
                }
                ssize_t r = recv(fd, cb + have, sizeof(cb) - have, MSG_DONTWAIT);
                if (r > 0) {
                        have += (size_t)r;
                        if (o->udp && have != sizeof(cb)) {
                                have = 0; /* a stray hello answer */
                                continue;
                        }
                        if (have == sizeof(cb)) {
                                memcpy(&credit, cb, sizeof(credit));
                                if (credit > credited)
                                        credited = credit;
                                have = 0;
                                last = now_s();
                        }
                } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                        die("recv credit");
                } else if (now_s() - last > 5) {
                        errno = ETIMEDOUT;
                        die("stalled waiting for credit");
                }
        }
        double t = now_s() - t0;
        if (o->rate)
                printf("RESULT proto=%s mode=rate size=%zu iters=%ld window=%u status=ok "
                       "mps=%.4f\n",
                       o->udp ? "udp" : "tcp", o->size, o->iters, o->window,
                       (double)o->iters / t / 1e6);
        else
                printf("RESULT proto=udp mode=stream size=%zu iters=%ld window=%u status=ok "
                       "gbps=%.3f\n",
                       o->size, o->iters, o->window, (double)o->size * o->iters * 8 / t / 1e9);
        close(fd);
}

int main(int argc, char **argv)
{
        struct opts o = {.size = 64, .iters = 10000, .port = 18600, .cpu = -1};
        static const struct option longopts[] = {
            {"proto", required_argument, NULL, 'p'},  {"mode", required_argument, NULL, 'm'},
            {"size", required_argument, NULL, 's'},   {"iters", required_argument, NULL, 'n'},
            {"port", required_argument, NULL, 'P'},   {"cpu", required_argument, NULL, 'c'},
            {"window", required_argument, NULL, 'w'}, {"block", no_argument, NULL, 'b'},
            {NULL, 0, NULL, 0},
        };
        int c;
        while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
                switch (c) {
                case 'p':
                        o.udp = strcmp(optarg, "udp") == 0;
                        if (!o.udp && strcmp(optarg, "tcp") != 0)
                                goto usage;
                        break;
                case 'm':
                        o.stream = strcmp(optarg, "stream") == 0;
                        o.rate = strcmp(optarg, "rate") == 0;
                        if (!o.stream && !o.rate && strcmp(optarg, "pingpong") != 0)
                                goto usage;
                        break;
                case 's':
                        o.size = strtoul(optarg, NULL, 0);
                        break;
                case 'n':
                        o.iters = strtol(optarg, NULL, 0);
                        break;
                case 'P':
                        o.port = (uint16_t)strtoul(optarg, NULL, 0);
                        break;
                case 'c':
                        o.cpu = atoi(optarg);
                        break;
                case 'w':
                        o.window = (uint32_t)strtoul(optarg, NULL, 0);
                        break;
                case 'b':
                        recv_flags = 0;
                        break;
                default:
                        goto usage;
                }
        }
        if (optind < argc)
                o.host = argv[optind];
        if (o.iters <= 0 || (o.udp && o.size > 65507) || (o.rate && o.size == 0))
                goto usage;
        if (!o.window) {
                uint64_t w = 180000 / (o.size + 1024);
                o.window = o.rate ? 64 : w < 2 ? 2 : w > 64 ? 64 : (uint32_t)w;
        }
        if (o.cpu >= 0) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(o.cpu, &set);
                if (sched_setaffinity(0, sizeof(set), &set))
                        die("sched_setaffinity");
        }
        char *buf = calloc(1, o.size ? o.size : 1);
        if (!buf)
                die("calloc");
        if (o.rate || (o.udp && o.stream))
                run_credit(&o, buf);
        else if (o.udp)
                run_udp(&o, buf);
        else
                run_tcp(&o, buf);
        free(buf);
        return 0;
usage:
        fprintf(stderr, "usage: raw-sock --proto udp|tcp --mode pingpong|stream|rate [--size B] "
                        "[--iters N] [--window W] [--port P] [--cpu C] [--block] [HOST]\n");
        return 2;
}
