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
#include <grp.h>
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
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#include "daemon/daemon.h"

static struct dd_daemon D = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* --nice inherit: the nice it inherited. */
#define DD_NICE_KEEP 100
/* --nice auto, the default: the inherited nice, DD_NICE_BOOST while load
 * that is not the daemon's or its clients' keeps the cores busy
 * (priority.c). */
#define DD_NICE_AUTO  101
#define DD_NICE_BOOST (-10)

/* The governor of --nice auto (off otherwise), run by the acceptor. */
static struct dd_gov G;

struct dd_daemon *dd_daemon(void)
{
        return &D;
}

/* The socket's directory: created when missing (private, or readable by
 * the group served); an existing one must be ours or root's, and not
 * writable by others unless sticky, or someone else could swap the socket. */
static int socket_dir(const char *path)
{
        char dir[108];
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir)
                return 0;
        *slash = 0;
        if (mkdir(dir, D.has_group ? 0750 : 0700) == 0) {
                if (D.has_group && chown(dir, (uid_t)-1, (gid_t)D.group) < 0) {
                        fprintf(stderr, "diwarpd: cannot give %s to group %u: %s\n", dir, D.group,
                                strerror(errno));
                        return -1;
                }
                return 0;
        }
        if (errno != EEXIST) {
                fprintf(stderr, "diwarpd: cannot create %s: %s\n", dir, strerror(errno));
                return -1;
        }
        struct stat st;
        if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
                fprintf(stderr, "diwarpd: %s is not a directory\n", dir);
                return -1;
        }
        if ((st.st_uid != D.uid && st.st_uid != 0) ||
            ((st.st_mode & 022) && !(st.st_mode & S_ISVTX))) {
                fprintf(stderr,
                        "diwarpd: %s belongs to uid %u with mode %04o: another user could replace "
                        "the socket in it; choose a directory of your own (--socket)\n",
                        dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
                return -1;
        }
        return 0;
}

/* What sits at path before we bind: nothing, or a stale socket of ours
 * (removed). A live daemon (-2), anything we cannot reach (EACCES: another
 * user's), or a stale socket or file of someone else is left alone (-1). */
static int socket_clear(const char *path, const struct sockaddr_un *un)
{
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -1;
        int r = connect(s, (const struct sockaddr *)un, sizeof(*un));
        int err = errno;
        close(s);
        if (r == 0) {
                fprintf(stderr, "diwarpd: a daemon already listens on %s\n", path);
                return -2;
        }
        if (err == ENOENT)
                return 0;
        struct stat st;
        if (lstat(path, &st) < 0) {
                if (errno == ENOENT)
                        return 0;
                fprintf(stderr, "diwarpd: %s: %s\n", path, strerror(errno));
                return -1;
        }
        if (err != ECONNREFUSED || !S_ISSOCK(st.st_mode) || st.st_uid != D.uid) {
                fprintf(stderr,
                        "diwarpd: %s (%s uid %u, mode %04o) cannot be reached: %s; it is not a "
                        "stale socket of ours (uid %u), so it is left alone: remove it as its "
                        "owner, or choose another path (--socket)\n",
                        path, S_ISSOCK(st.st_mode) ? "a socket of" : "a file of",
                        (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), strerror(err), D.uid);
                return -1;
        }
        if (unlink(path) < 0 && errno != ENOENT) {
                fprintf(stderr, "diwarpd: cannot remove the stale socket %s: %s\n", path,
                        strerror(errno));
                return -1;
        }
        return 0;
}

static struct stat bound; /* our socket, so that only it is removed at exit */

static int listen_socket(const char *path)
{
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        snprintf(un.sun_path, sizeof(un.sun_path), "%s", path);
        if (socket_dir(path) < 0)
                return -1;
        int c = socket_clear(path, &un);
        if (c < 0)
                return c;
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        mode_t old = umask(0177);
        int b = bind(s, (struct sockaddr *)&un, sizeof(un));
        umask(old);
        /* The group served may connect; nobody else (the peer check in the
         * acceptor refuses them anyway). */
        if (b < 0 || (D.has_group && chown(path, (uid_t)-1, (gid_t)D.group) < 0) ||
            chmod(path, D.has_group ? 0660 : 0600) < 0 || lstat(path, &bound) < 0 ||
            listen(s, 128) < 0) {
                fprintf(stderr, "diwarpd: cannot listen on %s: %s\n", path, strerror(errno));
                close(s);
                return -1;
        }
        return s;
}

/* Removes path if it is still the socket we bound. */
static void socket_remove(const char *path)
{
        struct stat st;
        if (lstat(path, &st) == 0 && st.st_ino == bound.st_ino && st.st_dev == bound.st_dev)
                unlink(path);
}

/* Whether the peer of a new connection is served: our uid, or a member of
 * the group (its primary gid or one of its supplementary groups). */
static bool peer_served(int fd, struct ucred *cr)
{
        socklen_t len = sizeof(*cr);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len) < 0)
                return false;
        if (cr->uid == D.uid)
                return true;
        if (!D.has_group)
                return false;
        if (cr->gid == D.group)
                return true;
        gid_t groups[256];
        len = sizeof(groups);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
                return false;
        for (size_t i = 0; i < len / sizeof(gid_t); i++)
                if (groups[i] == D.group)
                        return true;
        return false;
}

/* The acceptor's refusals, rate-limited (acceptor thread only). */
static void refused(const struct ucred *cr)
{
        static struct diwarpdv_log_limit limit;
        if (!diwarpdv_log_limit_pass(&limit, DIWARPDV_LOG_WARN))
                return;
        if (D.has_group)
                diwarpdv_warn(
                    "diwarpd: connection of pid %d (uid %u) refused: this daemon serves uid %u "
                    "and group %u only",
                    (int)cr->pid, (unsigned)cr->uid, D.uid, D.group);
        else
                diwarpdv_warn(
                    "diwarpd: connection of pid %d (uid %u) refused: this daemon serves uid %u "
                    "only (DIWARPD_GROUP or --group names a group to serve too)",
                    (int)cr->pid, (unsigned)cr->uid, D.uid);
}

/* A group by name or number. */
static int group_of(const char *name, uint32_t *gid)
{
        char *end;
        unsigned long n = strtoul(name, &end, 10);
        if (*name && !*end && n < UINT32_MAX) {
                *gid = (uint32_t)n;
                return 0;
        }
        struct group *g = getgrnam(name);
        if (!g)
                return -1;
        *gid = (uint32_t)g->gr_gid;
        return 0;
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
                "usage: diwarpd [--socket PATH] [--servers N] [--spin-us US] [--nice N]\n"
                "               [--group NAME] [--max-devices N] [--client-devices N]\n"
                "  Runs in the foreground; `diwarp daemon start` runs it in the background.\n"
                "  --socket PATH  Unix socket (default: DIWARP_DAEMON_SOCKET, else\n"
                "                 $XDG_RUNTIME_DIR/diwarpd.sock, else /run/diwarp/diwarpd.sock)\n"
                "  --servers N    worker threads (default DIWARPD_SERVERS, else 1)\n"
                "  --spin-us US   how long a server polls before it sleeps (default\n"
                "                 DIWARPD_SPIN_US, else 50)\n"
                "  --nice N       nice value of the daemon's threads: -20..19; auto, as\n"
                "                 inherited but -10 while CPU-bound programs that are not\n"
                "                 its clients keep the cores busy; inherit (default\n"
                "                 DIWARPD_NICE, else auto)\n"
                "  --group NAME   serve the members of this group too (default\n"
                "                 DIWARPD_GROUP, else only the daemon's own uid); the\n"
                "                 socket is then mode 0660 in that group\n"
                "  --max-devices N     engine devices the daemon holds at most (default\n"
                "                      DIWARPD_MAX_DEVICES, else 16)\n"
                "  --client-devices N  distinct devices (address, port base) one client\n"
                "                      process uses at most (default DIWARPD_CLIENT_DEVICES,\n"
                "                      else 4)\n");
}

/* A --nice / DIWARPD_NICE value: -20..19, "auto" or "inherit"; false when
 * none. */
static bool nice_value(const char *v, long *out)
{
        if (strcmp(v, "auto") == 0 || strcmp(v, "inherit") == 0) {
                *out = strcmp(v, "auto") == 0 ? DD_NICE_AUTO : DD_NICE_KEEP;
                return true;
        }
        char *end;
        long x = strtol(v, &end, 10);
        if (!*v || *end || x < -20 || x > 19)
                return false;
        *out = x;
        return true;
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

/* What the daemon is told to do: the environment, then the command line. */
struct dd_options {
        char path[108];
        long servers, spin, max_devs, client_devs;
        long nice; /* DD_NICE_AUTO (default), DD_NICE_KEEP (as inherited) or a nice */
        const char *group;
};

/* Reads the options into *o. Returns -1 to go on, else the exit code
 * (0 after --help, 2 for a bad option, the reason printed). */
static int parse_options(int argc, char **argv, struct dd_options *o)
{
        if (dw_ipc_socket_path(o->path, sizeof(o->path)) < 0) {
                fprintf(stderr, "diwarpd: socket path too long\n");
                return 2;
        }
        o->servers = env_long("DIWARPD_SERVERS", 1, 1, DD_MAX_SERVERS);
        o->spin = env_long("DIWARPD_SPIN_US", 50, 0, 1000000);
        o->nice = DD_NICE_AUTO;
        const char *env_nice = getenv("DIWARPD_NICE");
        if (env_nice && *env_nice && !nice_value(env_nice, &o->nice)) {
                fprintf(stderr, "diwarpd: DIWARPD_NICE=%s: expected -20..19, auto or inherit\n",
                        env_nice);
                return 2;
        }
        o->group = getenv("DIWARPD_GROUP");
        o->max_devs = env_long("DIWARPD_MAX_DEVICES", 16, 1, 4096);
        o->client_devs = env_long("DIWARPD_CLIENT_DEVICES", 4, 1, 4096);
        static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                             {"servers", required_argument, NULL, 'n'},
                                             {"spin-us", required_argument, NULL, 'p'},
                                             {"nice", required_argument, NULL, 'i'},
                                             {"group", required_argument, NULL, 'g'},
                                             {"max-devices", required_argument, NULL, 'm'},
                                             {"client-devices", required_argument, NULL, 'c'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
        int c;
        while ((c = getopt_long(argc, argv, "s:n:p:i:g:m:c:h", opts, NULL)) != -1) {
                char *end;
                switch (c) {
                case 's':
                        snprintf(o->path, sizeof(o->path), "%s", optarg);
                        break;
                case 'n':
                        o->servers = strtol(optarg, &end, 10);
                        if (*end || o->servers < 1 || o->servers > DD_MAX_SERVERS) {
                                fprintf(stderr, "diwarpd: --servers: 1..%d\n", DD_MAX_SERVERS);
                                return 2;
                        }
                        break;
                case 'p':
                        o->spin = strtol(optarg, &end, 10);
                        if (*end || o->spin < 0 || o->spin > 1000000) {
                                fprintf(stderr, "diwarpd: --spin-us: 0..1000000\n");
                                return 2;
                        }
                        break;
                case 'i':
                        if (!nice_value(optarg, &o->nice)) {
                                fprintf(stderr, "diwarpd: --nice: -20..19, auto or inherit\n");
                                return 2;
                        }
                        break;
                case 'g':
                        o->group = optarg;
                        break;
                case 'm':
                case 'c': {
                        long v = strtol(optarg, &end, 10);
                        if (*end || v < 1 || v > 4096) {
                                fprintf(stderr, "diwarpd: --%s: 1..4096\n",
                                        c == 'm' ? "max-devices" : "client-devices");
                                return 2;
                        }
                        *(c == 'm' ? &o->max_devs : &o->client_devs) = v;
                        break;
                }
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        return -1;
}

/* Who is served (the daemon's uid, and the group named) and the limits on
 * devices. Returns -1 to go on, else the exit code. */
static int apply_options(const struct dd_options *o)
{
        D.uid = (uint32_t)geteuid();
        D.max_devs = (int)o->max_devs;
        D.client_devs = (int)o->client_devs;
        if (o->group && *o->group) {
                if (group_of(o->group, &D.group) < 0) {
                        fprintf(stderr,
                                "diwarpd: group '%s' (DIWARPD_GROUP, --group): no such "
                                "group\n",
                                o->group);
                        return 2;
                }
                D.has_group = true;
        }
        return -1;
}

/* --nice auto: the governor starts at the inherited nice when the boost is
 * allowed (tried once on this thread, then undone); else the start line says
 * why not and the daemon keeps its nice. */
static void take_nice_auto(int now, char *said, size_t saidlen)
{
        if (now <= DD_NICE_BOOST) {
                snprintf(said, saidlen, "nice %d (auto: already at or above %d)", now,
                         DD_NICE_BOOST);
                return;
        }
        int err = dd_nice_apply(DD_NICE_BOOST);
        dd_nice_apply(now);
        if (err < 0) {
                snprintf(said, saidlen, "nice %d (auto: cannot take %d: %s)", now, DD_NICE_BOOST,
                         strerror(-err));
                return;
        }
        dd_gov_init(&G, now, DD_NICE_BOOST);
        snprintf(said, saidlen, "nice %d, auto: %d beside unrelated load", now, DD_NICE_BOOST);
}

/* The daemon is its host's progress engine, as the kernel's softirqs are
 * TCP's: its servers send the ACKs and run the timers of every client, so
 * a server that waits for its core behind CPU-bound programs that are not
 * its clients stalls all of them. A higher priority fixes that: RD and RC
 * over RD through the daemons beside a nice-0 `yes` per core, 1 Gbit/s,
 * 0.92-0.98 x TCP at nice -10 against 0.54-0.89 at 0. But the same priority
 * beside its own busy-polling clients preempts them at every wake-up (8
 * clients all to all: 60 000 messages/s against 144 000), so by default
 * (auto) the daemon takes it only while load that is neither its own nor
 * its clients' keeps the cores busy (priority.c, daemon/README.md); a
 * fixed nice is the operator's choice. Set before the servers start, which
 * inherit it; the start line says which nice the daemon runs at, and why
 * not the one asked for (no CAP_SYS_NICE, RLIMIT_NICE at its default). */
static void take_nice(long want, char *said, size_t saidlen)
{
        errno = 0;
        int now = getpriority(PRIO_PROCESS, 0);
        if (now == -1 && errno) {
                snprintf(said, saidlen, "nice unknown: %s", strerror(errno));
                return;
        }
        if (want == DD_NICE_AUTO) {
                take_nice_auto(now, said, saidlen);
                return;
        }
        if (want == DD_NICE_KEEP || now == want) {
                snprintf(said, saidlen, "nice %d", now);
                return;
        }
        int err = dd_nice_apply((int)want);
        if (err < 0) {
                dd_nice_apply(now);
                snprintf(said, saidlen, "nice %d: cannot take %ld: %s", now, want, strerror(-err));
        } else {
                snprintf(said, saidlen, "nice %ld", want);
        }
}

/* SIGTERM, SIGINT and SIGHUP arrive on the descriptor returned (the main
 * loop stops on them); blocked before the servers start, so they inherit
 * the mask and never take one. */
static int signals_fd(void)
{
        signal(SIGPIPE, SIG_IGN);
        sigset_t sigs;
        sigemptyset(&sigs);
        sigaddset(&sigs, SIGTERM);
        sigaddset(&sigs, SIGINT);
        sigaddset(&sigs, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &sigs, NULL);
        return signalfd(-1, &sigs, SFD_CLOEXEC);
}

/* Every connection waiting on the listener: handed to the least loaded
 * server, or refused (peer_served says who is served). */
static void accept_all(int ls)
{
        for (;;) {
                int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (c < 0)
                        break;
                struct ucred cr = {0};
                if (!peer_served(c, &cr)) {
                        refused(&cr);
                        close(c);
                        continue;
                }
                dd_gov_client(&G, (int32_t)cr.pid);
                dd_server_hand(least_loaded(), c, (int32_t)cr.pid, (uint32_t)cr.uid);
        }
}

/* The main thread's loop: connections to accept, until a signal stops it. */
static void accept_until_signal(int ls, int sfd)
{
        int ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
        epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
        ev.data.fd = sfd;
        epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);
        while (!atomic_load(&D.stop)) {
                struct epoll_event evs[4];
                int n = epoll_wait(ep, evs, 4, G.on ? (int)(DD_GOV_TICK_NS / 1000000) : 500);
                dd_gov_tick(&G, diwarpdv_now_ns());
                for (int i = 0; i < n; i++) {
                        if (evs[i].data.fd == sfd) {
                                struct signalfd_siginfo si;
                                if (read(sfd, &si, sizeof(si)) > 0)
                                        atomic_store(&D.stop, true);
                                continue;
                        }
                        accept_all(ls);
                }
        }
}

int main(int argc, char **argv)
{
        /* The engine this process runs is its own, never a client of itself. */
        if (diwarpdv_engine_only() < 0) {
                fprintf(stderr, "diwarpd: cannot run the engine: the process is a daemon client\n");
                return 1;
        }
        diwarpdv_log_from_env();
        /* Its servers drive its devices from their own loops
         * (diwarpdv_external_progress): no progress thread, whatever the
         * environment of the shell that started it says. */
        setenv("DIWARP_PROGRESS", "app", 1);

        struct dd_options o = {0};
        int code = parse_options(argc, argv, &o);
        if (code < 0)
                code = apply_options(&o);
        if (code >= 0)
                return code;
        char nice_said[160];
        take_nice(o.nice, nice_said, sizeof(nice_said));
        int sfd = signals_fd();
        int ls = listen_socket(o.path);
        if (ls < 0)
                return ls == -2 ? 3 : 1;
        D.spin_ns = (uint64_t)o.spin * 1000;
        D.nservers = (int)o.servers;
        for (int i = 0; i < D.nservers; i++)
                if (dd_server_start(&D.servers[i], i) < 0) {
                        fprintf(stderr, "diwarpd: cannot start server %d\n", i);
                        socket_remove(o.path);
                        return 1;
                }
        if (D.has_group)
                printf("diwarpd: listening on %s (%d server%s, spin %ld us, %s; uid %u and group "
                       "%u)\n",
                       o.path, D.nservers, D.nservers > 1 ? "s" : "", o.spin, nice_said, D.uid,
                       D.group);
        else
                printf("diwarpd: listening on %s (%d server%s, spin %ld us, %s; uid %u only)\n",
                       o.path, D.nservers, D.nservers > 1 ? "s" : "", o.spin, nice_said, D.uid);
        fflush(stdout);
        accept_until_signal(ls, sfd);
        printf("diwarpd: stopping\n");
        fflush(stdout);
        for (int i = 0; i < D.nservers; i++)
                dd_server_stop(&D.servers[i]);
        close(ls);
        socket_remove(o.path);
        return 0;
}
