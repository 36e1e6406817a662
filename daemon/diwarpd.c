/* diwarpd: the host progress daemon. See daemon/README.md.
 *
 * One process per host (per user). The main thread accepts connections on
 * the Unix socket and hands each to the server (worker thread) with the
 * fewest clients. A server owns engine device instances, runs the requests
 * of its clients, moves their posted WRs from the shared rings into the
 * engine and the engine's completions into their shared CQs, and sleeps
 * when nothing moved for DIWARPD_SPIN_US.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#include "daemon/daemon.h"
#include "util/log.h"

static struct dd_daemon D = {.lock = PTHREAD_MUTEX_INITIALIZER};

uint64_t dd_now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct dd_daemon *dd_daemon(void)
{
        return &D;
}

static int listen_socket(const char *path)
{
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        snprintf(un.sun_path, sizeof(un.sun_path), "%s", path);
        /* The directory: created private when missing (/run/diwarp). */
        char dir[sizeof(un.sun_path)];
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = 0;
                if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
                        fprintf(stderr, "diwarpd: cannot create %s: %s\n", dir, strerror(errno));
                        return -1;
                }
        }
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -1;
        if (connect(s, (struct sockaddr *)&un, sizeof(un)) == 0) {
                fprintf(stderr, "diwarpd: a daemon already listens on %s\n", path);
                close(s);
                return -2;
        }
        close(s);
        unlink(path); /* a stale socket of a daemon that is gone */
        s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        mode_t old = umask(0177);
        int b = bind(s, (struct sockaddr *)&un, sizeof(un));
        umask(old);
        if (b < 0 || chmod(path, 0600) < 0 || listen(s, 128) < 0) {
                fprintf(stderr, "diwarpd: cannot listen on %s: %s\n", path, strerror(errno));
                close(s);
                return -1;
        }
        return s;
}

static struct dd_server *least_loaded(void)
{
        struct dd_server *best = NULL;
        pthread_mutex_lock(&D.lock);
        for (int i = 0; i < D.nservers; i++)
                if (!best || D.servers[i].nclients < best->nclients)
                        best = &D.servers[i];
        pthread_mutex_unlock(&D.lock);
        return best;
}

static void usage(FILE *f)
{
        fprintf(f,
                "usage: diwarpd [--socket PATH] [--servers N] [--spin-us US]\n"
                "  Runs in the foreground; `diwarp daemon start` runs it in the background.\n"
                "  --socket PATH  Unix socket (default: DIWARP_DAEMON_SOCKET, else\n"
                "                 $XDG_RUNTIME_DIR/diwarpd.sock, else /run/diwarp/diwarpd.sock)\n"
                "  --servers N    worker threads (default DIWARPD_SERVERS, else 1)\n"
                "  --spin-us US   how long a server polls before it sleeps (default\n"
                "                 DIWARPD_SPIN_US, else 50)\n");
}

static long env_long(const char *name, long dflt, long lo, long hi)
{
        const char *v = getenv(name);
        if (!v || !*v)
                return dflt;
        char *end;
        long x = strtol(v, &end, 10);
        if (*end || x < lo || x > hi) {
                fprintf(stderr, "diwarpd: %s=%s: expected %ld..%ld\n", name, v, lo, hi);
                exit(2);
        }
        return x;
}

int main(int argc, char **argv)
{
        /* The engine this process runs is its own, never a client of itself. */
        dw_client_mode_forbid();
        int lvl = dw_log_level_from_env();
        if (lvl >= 0)
                dw_log_set_level(lvl);
        /* Its servers drive its devices from their own loops
         * (dw_progress_external): no progress thread, whatever the
         * environment of the shell that started it says. */
        setenv("DIWARP_PROGRESS", "app", 1);

        char path[108];
        if (dw_ipc_socket_path(path, sizeof(path)) < 0) {
                fprintf(stderr, "diwarpd: socket path too long\n");
                return 2;
        }
        long servers = env_long("DIWARPD_SERVERS", 1, 1, DD_MAX_SERVERS);
        long spin = env_long("DIWARPD_SPIN_US", 50, 0, 1000000);
        static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                             {"servers", required_argument, NULL, 'n'},
                                             {"spin-us", required_argument, NULL, 'p'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
        int o;
        while ((o = getopt_long(argc, argv, "s:n:p:h", opts, NULL)) != -1) {
                char *end;
                switch (o) {
                case 's':
                        snprintf(path, sizeof(path), "%s", optarg);
                        break;
                case 'n':
                        servers = strtol(optarg, &end, 10);
                        if (*end || servers < 1 || servers > DD_MAX_SERVERS) {
                                fprintf(stderr, "diwarpd: --servers: 1..%d\n", DD_MAX_SERVERS);
                                return 2;
                        }
                        break;
                case 'p':
                        spin = strtol(optarg, &end, 10);
                        if (*end || spin < 0 || spin > 1000000) {
                                fprintf(stderr, "diwarpd: --spin-us: 0..1000000\n");
                                return 2;
                        }
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        signal(SIGPIPE, SIG_IGN);
        sigset_t sigs;
        sigemptyset(&sigs);
        sigaddset(&sigs, SIGTERM);
        sigaddset(&sigs, SIGINT);
        sigaddset(&sigs, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* the servers inherit it */
        int sfd = signalfd(-1, &sigs, SFD_CLOEXEC);

        int ls = listen_socket(path);
        if (ls < 0)
                return ls == -2 ? 3 : 1;
        D.spin_ns = (uint64_t)spin * 1000;
        D.nservers = (int)servers;
        for (int i = 0; i < D.nservers; i++)
                if (dd_server_start(&D.servers[i], i) < 0) {
                        fprintf(stderr, "diwarpd: cannot start server %d\n", i);
                        unlink(path);
                        return 1;
                }
        int ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
        epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
        ev.data.fd = sfd;
        epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);
        printf("diwarpd: listening on %s (%d server%s, spin %ld us)\n", path, D.nservers,
               D.nservers > 1 ? "s" : "", spin);
        fflush(stdout);
        while (!atomic_load(&D.stop)) {
                struct epoll_event evs[4];
                int n = epoll_wait(ep, evs, 4, 500);
                for (int i = 0; i < n; i++) {
                        if (evs[i].data.fd == sfd) {
                                struct signalfd_siginfo si;
                                if (read(sfd, &si, sizeof(si)) > 0)
                                        atomic_store(&D.stop, true);
                                continue;
                        }
                        for (;;) {
                                int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                                if (c < 0)
                                        break;
                                dd_server_hand(least_loaded(), c);
                        }
                }
        }
        printf("diwarpd: stopping\n");
        fflush(stdout);
        for (int i = 0; i < D.nservers; i++)
                dd_server_stop(&D.servers[i]);
        close(ls);
        unlink(path);
        return 0;
}
