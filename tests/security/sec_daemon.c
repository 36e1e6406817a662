/* tests/security: a hostile client of the daemon (README.md). One case per
 * run: sec_daemon CASE. Each attack must be refused, the daemon must stay
 * up with a clean sanitizer log, and a legitimate client beside it must
 * complete its traffic. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "sec_common.h"

static struct sec_daemon D;

static void at_exit(void)
{
        sec_cleanup(&D);
}

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct dw_ipc_rsp *RSP;

static uint32_t new_pd(struct sec_conn *c)
{
        struct dw_ipc_req r;
        memset(&r, 0, sizeof(r));
        CHECK(sec_req(c, DW_IPC_PD_ALLOC, 0, &r, NULL, 0, RSP, NULL, NULL) == 0, "PD_ALLOC");
        return RSP->handle;
}

static int seg_add(struct sec_conn *c, void *base, uint64_t len, uint32_t id,
                   const uint32_t *replace, uint32_t nreplace)
{
        struct dw_ipc_req r;
        memset(&r, 0, sizeof(r));
        r.u.seg.base = (uintptr_t)base;
        r.u.seg.len = len;
        r.u.seg.id = id;
        r.u.seg.nreplace = nreplace;
        for (uint32_t i = 0; i < nreplace; i++)
                r.u.seg.replace[i] = replace[i];
        int fd = sec_memfd(len);
        int err = sec_req(c, DW_IPC_SEG_ADD, 0, &r, &fd, 1, RSP, NULL, NULL);
        close(fd);
        return err;
}

static int mr_reg(struct sec_conn *c, uint32_t pd, uint32_t seg, void *addr, uint64_t len)
{
        struct dw_ipc_req r;
        memset(&r, 0, sizeof(r));
        r.u.mr = (struct dw_ipc_mr_reg){.pd = pd,
                                        .seg = seg,
                                        .addr = (uintptr_t)addr,
                                        .len = len,
                                        .iova = (uintptr_t)addr,
                                        .access = DIWARP_ACCESS_LOCAL_WRITE};
        return sec_req(c, DW_IPC_MR_REG, 0, &r, NULL, 0, RSP, NULL, NULL);
}

/* Item 7: SEG_ADD whose replace list names one segment twice. */
static int case_seg_replace_dup(void)
{
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        struct sec_conn c;
        CHECK(sec_connect(D.sock, &c) == 0, "connect");
        CHECK(sec_open(&c, NULL, 0) == 0, "OPEN");
        uint32_t pd = new_pd(&c);
        uint8_t *mem =
            mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(mem != MAP_FAILED, "mmap");
        CHECK(seg_add(&c, mem, 4096, 1, NULL, 0) == 0, "segment 1");
        CHECK(mr_reg(&c, pd, 1, mem, 4096) == 0, "MR on segment 1");
        uint32_t mr = RSP->handle;
        /* The attack: {1, 1}, and {1, 2(itself)}. */
        uint32_t twice[2] = {1, 1};
        int err = seg_add(&c, mem, 8192, 2, twice, 2);
        CHECK(err == -EINVAL, "SEG_ADD replacing segment 1 twice: %d, want -EINVAL", err);
        uint32_t self[2] = {1, 2};
        err = seg_add(&c, mem, 8192, 2, self, 2);
        CHECK(err == -EINVAL, "SEG_ADD replacing itself: %d, want -EINVAL", err);
        sec_daemon_check(&D, "after the duplicate replace list");
        CHECK(
            sec_log_has(&D, "SEG_ADD request rejected: a segment named twice in the replace list"),
            "the refusal is not logged with the request and the reason");
        /* The same connection goes on: a legitimate merge moves the MR. */
        uint32_t once[1] = {1};
        CHECK(seg_add(&c, mem, 8192, 2, once, 1) == 0, "a legitimate replace");
        CHECK(seg_add(&c, mem, 3 * 4096, 3, (uint32_t[]){2}, 1) == 0, "a second merge");
        struct dw_ipc_req r;
        memset(&r, 0, sizeof(r));
        CHECK(sec_req(&c, DW_IPC_MR_DEREG, mr, &r, NULL, 0, RSP, NULL, NULL) == 0,
              "the MR that moved twice");
        close(c.s);
        sec_legit_traffic(D.sock);
        sec_daemon_check(&D, "after the legitimate traffic");
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        printf("OK seg_replace_dup: refused, the daemon and a client beside it unharmed\n");
        return 0;
}

/* A TCP listener that never answers: an MPA exchange with it waits. */
static int silent_listener(uint16_t *port)
{
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET};
        socklen_t al = sizeof(a);
        CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(s, 16) == 0 &&
                  getsockname(s, (struct sockaddr *)&a, &al) == 0,
              "silent listener");
        *port = ntohs(a.sin_port);
        return s;
}

static uint32_t stat_clients(void)
{
        struct sec_conn t;
        struct dw_ipc_req r;
        CHECK(sec_connect(D.sock, &t) == 0, "connect for STAT");
        memset(&r, 0, sizeof(r));
        CHECK(sec_req(&t, DW_IPC_STAT, 0, &r, NULL, 0, RSP, NULL, NULL) == 0, "STAT");
        close(t.s);
        return RSP->u.stat.nclients;
}

/* An RC QP in INIT of c; *cq its CQ. */
static uint32_t rc_qp(struct sec_conn *c, uint32_t pd, uint32_t *cq)
{
        struct dw_ipc_req r;
        memset(&r, 0, sizeof(r));
        r.u.cq.cqe = 8;
        CHECK(sec_req(c, DW_IPC_CQ_CREATE, 0, &r, NULL, 0, RSP, NULL, NULL) == 0, "CQ");
        *cq = RSP->handle;
        memset(&r, 0, sizeof(r));
        r.u.qp = (struct dw_ipc_qp_create){
            .pd = pd,
            .send_cq = *cq,
            .recv_cq = *cq,
            .type = DIWARP_QPT_RC,
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
        CHECK(sec_req(c, DW_IPC_QP_CREATE, 0, &r, NULL, 0, RSP, NULL, NULL) == 0, "QP");
        uint32_t qp = RSP->handle;
        memset(&r, 0, sizeof(r));
        r.u.qpm.attr.qp_state = DIWARP_QPS_INIT;
        r.u.qpm.mask = DIWARP_QP_STATE;
        int err = sec_req(c, DW_IPC_QP_MODIFY, qp, &r, NULL, 0, RSP, NULL, NULL);
        CHECK(err == 0, "QP to INIT: %s", strerror(-err));
        return qp;
}

/* Item 8: requests queued behind a slow CONNECT, then a hang-up. */
static int case_connect_hangup(void)
{
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        uint16_t port;
        int ls = silent_listener(&port);
        for (int round = 0; round < 3; round++) {
                struct sec_conn c;
                CHECK(sec_connect(D.sock, &c) == 0, "connect");
                CHECK(sec_open(&c, NULL, 0) == 0, "OPEN");
                uint32_t pd = new_pd(&c), cq;
                uint32_t qp = rc_qp(&c, pd, &cq);
                struct dw_ipc_req r;
                memset(&r, 0, sizeof(r));
                r.u.conn.qp = qp;
                r.u.conn.port = port;
                r.u.conn.timeout_ms = 1500;
                /* ::ffff:127.0.0.1 */
                r.u.conn.dgid.raw[10] = r.u.conn.dgid.raw[11] = 0xff;
                r.u.conn.dgid.raw[12] = 127;
                r.u.conn.dgid.raw[15] = 1;
                sec_send(&c, DW_IPC_CONNECT, 0, &r, NULL, 0);
                /* Queued behind it: a second CONNECT on the same QP and the
                 * QP's destruction; then the client hangs up. */
                sec_send(&c, DW_IPC_CONNECT, 0, &r, NULL, 0);
                memset(&r, 0, sizeof(r));
                sec_send(&c, DW_IPC_QP_DESTROY, qp, &r, NULL, 0);
                sec_send(&c, DW_IPC_CQ_DESTROY, cq, &r, NULL, 0);
                sec_send(&c, DW_IPC_PD_DEALLOC, pd, &r, NULL, 0);
                usleep(100000 * (unsigned)round);
                close(c.s);
        }
        /* Meanwhile the daemon serves everyone else. */
        sec_legit_traffic(D.sock);
        sec_daemon_check(&D, "while the connects run");
        /* Each hung-up client is freed once its connect ended (1.5 s). */
        double end = now_s() + 15;
        uint32_t n;
        while ((n = stat_clients()) > 0) {
                CHECK(now_s() < end, "the daemon still holds %u hung-up clients", n);
                usleep(100000);
        }
        sec_daemon_check(&D, "after the hung-up clients were freed");
        sec_legit_traffic(D.sock);
        close(ls);
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        sec_daemon_check(&D, "at exit");
        printf("OK connect_hangup: queued requests waited for the connect; clients freed\n");
        return 0;
}

/* ---- another user ------------------------------------------------------------ */

static bool need_root(void)
{
        if (geteuid() == 0)
                return true;
        printf("SKIP: needs root to play a second uid (%u)\n", OTHER_UID);
        return false;
}

/* Runs fn in a child as the other user; its exit status. */
static int as_other(void (*fn)(void *), void *arg)
{
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                sec_become(OTHER_UID, OTHER_GID);
                alarm(30);
                fn(arg);
                _exit(0);
        }
        int st;
        CHECK(waitpid(p, &st, 0) == p, "wait");
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The other user on a daemon that does not serve it: the connection is
 * closed before any request runs (OPEN, STAT, SHUTDOWN). */
static void other_refused(void *arg)
{
        (void)arg;
        struct dw_ipc_req r;
        static const unsigned int ops[] = {DW_IPC_OPEN, DW_IPC_STAT, DW_IPC_SHUTDOWN};
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                struct sec_conn c;
                CHECK(sec_connect(D.sock, &c) == 0, "the socket is open to others here");
                memset(&r, 0, sizeof(r));
                r.u.open.version = DW_IPC_VERSION;
                int err = sec_req(&c, ops[i], 0, &r, NULL, 0, RSP, NULL, NULL);
                CHECK(err == -ECONNRESET, "%s from another uid answered %d: served",
                      dw_ipc_op_name(ops[i]), err);
                close(c.s);
        }
}

/* Item 11: a daemon serves its own uid only; its socket's mode is not the
 * only guard (here it is opened to everyone, as a mistaken chmod would). */
static int case_peer_uid_refused(void)
{
        if (!need_root())
                return SKIP;
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        CHECK(chmod(D.dir, 0755) == 0 && chmod(D.sock, 0777) == 0, "open the socket to others");
        CHECK(as_other(other_refused, NULL) == 0, "another uid was served");
        sec_daemon_check(&D, "after another uid's requests");
        CHECK(sec_log_has(&D, "refused: this daemon serves uid 0 only"),
              "the refusal is not logged with the uid");
        sec_legit_traffic(D.sock);
        CHECK(stat_clients() == 0, "clients left");
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        printf("OK peer_uid_refused: another uid's OPEN, STAT and SHUTDOWN never ran\n");
        return 0;
}

/* A group member: served, but STAT, STAT_QPS and SHUTDOWN are the owner's. */
static void member_limits(void *arg)
{
        (void)arg;
        struct sec_conn c;
        struct dw_ipc_req r;
        CHECK(sec_connect(D.sock, &c) == 0, "a member reaches the socket");
        CHECK(sec_open(&c, NULL, 0) == 0, "a member's OPEN");
        static const unsigned int ops[] = {DW_IPC_STAT, DW_IPC_STAT_QPS, DW_IPC_SHUTDOWN};
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                memset(&r, 0, sizeof(r));
                int err = sec_req(&c, ops[i], 0, &r, NULL, 0, RSP, NULL, NULL);
                CHECK(err == -EPERM, "%s from a group member: %d, want -EPERM",
                      dw_ipc_op_name(ops[i]), err);
        }
        memset(&r, 0, sizeof(r));
        CHECK(sec_req(&c, DW_IPC_PD_ALLOC, 0, &r, NULL, 0, RSP, NULL, NULL) == 0,
              "the member's connection goes on");
        close(c.s);
}

static int case_group_served(void)
{
        if (!need_root())
                return SKIP;
        char gid[16];
        snprintf(gid, sizeof(gid), "%u", OTHER_GID);
        CHECK(chmod(D.dir, 0755) == 0, "chmod");
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, (const char *const[]){"--group", gid, NULL});
        struct stat st;
        CHECK(stat(D.sock, &st) == 0 && st.st_gid == OTHER_GID && (st.st_mode & 0777) == 0660,
              "the socket is not mode 0660 in the group (gid %u mode %03o)", (unsigned)st.st_gid,
              (unsigned)(st.st_mode & 0777));
        CHECK(as_other(member_limits, NULL) == 0, "a group member");
        sec_daemon_check(&D, "after a member's STAT and SHUTDOWN");
        CHECK(sec_log_has(&D, "SHUTDOWN refused: only the daemon's owner (uid 0) may ask"),
              "the refusal is not logged");
        /* Legitimate traffic: the member's (trusting uid 0) and the owner's. */
        sec_legit_traffic_as(D.sock, OTHER_UID, OTHER_GID, "0");
        sec_legit_traffic(D.sock);
        CHECK(stat_clients() == 0, "clients left");
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        printf("OK group_served: a member is served, STAT and SHUTDOWN only the owner's\n");
        return 0;
}

/* What a socket listening as the other user received: the bytes and
 * descriptors a client handed it. */
struct fake {
        char path[300];
        int ready;
        long bytes, fds;
};

static void fake_daemon(void *arg)
{
        struct fake *f = arg;
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        snprintf(un.sun_path, sizeof(un.sun_path), "%.107s", f->path);
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        CHECK(s >= 0 && bind(s, (struct sockaddr *)&un, sizeof(un)) == 0 &&
                  chmod(f->path, 0777) == 0 && listen(s, 4) == 0,
              "fake daemon: %s", strerror(errno));
        __atomic_store_n(&f->ready, 1, __ATOMIC_RELEASE);
        for (;;) {
                int c = accept(s, NULL, NULL);
                if (c < 0)
                        continue;
                for (;;) {
                        uint8_t buf[DW_IPC_MAX_MSG];
                        int fds[DW_IPC_MAX_FDS], n = DW_IPC_MAX_FDS;
                        ssize_t k = dw_ipc_recv(c, buf, sizeof(buf), fds, &n);
                        if (k <= 0)
                                break;
                        __atomic_add_fetch(&f->bytes, k, __ATOMIC_RELAXED);
                        __atomic_add_fetch(&f->fds, n, __ATOMIC_RELAXED);
                        for (int i = 0; i < n; i++)
                                close(fds[i]);
                        break; /* never answers: the client sees the end */
                }
                close(c);
        }
}

/* Item 11: a client in client mode refuses a socket served by another uid,
 * before it sends anything; the message names the path and both uids. */
static int case_client_refuses_foreign(void)
{
        if (!need_root())
                return SKIP;
        struct fake *f =
            mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(f != MAP_FAILED, "mmap");
        memset(f, 0, sizeof(*f));
        snprintf(f->path, sizeof(f->path), "%s/fake.sock", D.dir);
        CHECK(chown(D.dir, OTHER_UID, OTHER_GID) == 0, "chown");
        fflush(stdout);
        pid_t fk = fork();
        CHECK(fk >= 0, "fork");
        if (fk == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                sec_become(OTHER_UID, OTHER_GID);
                fake_daemon(f);
                _exit(0);
        }
        double end = now_s() + 10;
        while (!__atomic_load_n(&f->ready, __ATOMIC_ACQUIRE)) {
                CHECK(now_s() < end, "the fake daemon did not start");
                usleep(10000);
        }
        char err_path[300];
        snprintf(err_path, sizeof(err_path), "%s/client.err", D.dir);
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd >= 0)
                        dup2(fd, 2);
                setenv("DIWARP_PROGRESS", "daemon", 1);
                setenv("DIWARP_DAEMON_SOCKET", f->path, 1);
                struct diwarp_device *dev;
                int err = diwarp_device_open(NULL, &dev);
                _exit(err == -EACCES ? 0 : 1);
        }
        int st;
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the client opened a device through another uid's socket");
        usleep(200000);
        CHECK(f->bytes == 0 && f->fds == 0,
              "the client sent %ld bytes and %ld descriptors to another uid's socket", f->bytes,
              f->fds);
        FILE *e = fopen(err_path, "r");
        char line[1024] = "";
        CHECK(e && fgets(line, sizeof(line), e), "no error message");
        fclose(e);
        char want[400];
        snprintf(want, sizeof(want), "%s is served by uid %u, not by uid 0", f->path, OTHER_UID);
        CHECK(strstr(line, want), "the message does not name the path and both uids: %s", line);
        /* Trusting that uid on purpose goes through to it. */
        p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                setenv("DIWARP_PROGRESS", "daemon", 1);
                setenv("DIWARP_DAEMON_SOCKET", f->path, 1);
                char uid[16];
                snprintf(uid, sizeof(uid), "%u", OTHER_UID);
                setenv("DIWARP_DAEMON_UID", uid, 1);
                close(2);
                struct diwarp_device *dev;
                int err = diwarp_device_open(NULL, &dev);
                _exit(err == -EACCES ? 1 : 0);
        }
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "DIWARP_DAEMON_UID did not make the client trust that uid");
        CHECK(f->bytes > 0, "the trusting client sent nothing");
        kill(fk, SIGKILL);
        waitpid(fk, NULL, 0);
        /* Our own daemon beside it serves us. */
        CHECK(chown(D.dir, 0, 0) == 0, "chown back");
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        sec_legit_traffic(D.sock);
        sec_daemon_check(&D, "after the legitimate traffic");
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        printf("OK client_refuses_foreign: nothing sent to another uid's socket\n");
        return 0;
}

/* Runs diwarpd as uid on path to its exit (it must not start); its status. */
static int daemon_run_as(uid_t uid, gid_t gid, const char *path, const char *log)
{
        const char *bin = getenv("DIWARPD");
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                }
                if (uid != (uid_t)-1)
                        sec_become(uid, gid);
                alarm(20);
                execl(bin, bin, "--socket", path, (char *)NULL);
                _exit(127);
        }
        int st;
        CHECK(waitpid(p, &st, 0) == p, "wait");
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool file_has(const char *path, const char *s)
{
        FILE *f = fopen(path, "r");
        char line[1024];
        bool has = false;
        while (f && !has && fgets(line, sizeof(line), f))
                has = strstr(line, s) != NULL;
        if (f)
                fclose(f);
        return has;
}

/* Item 11: a daemon never removes a socket it cannot reach (EACCES) nor a
 * stale socket of another user; only a stale one of its own. */
static int case_no_unlink_foreign(void)
{
        if (!need_root())
                return SKIP;
        /* Our daemon listens (mode 0600) in a directory that then goes to
         * the other user, who starts a daemon on the same path. */
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        CHECK(chown(D.dir, OTHER_UID, OTHER_GID) == 0 && chmod(D.dir, 0755) == 0, "chown");
        struct stat before, after;
        CHECK(stat(D.sock, &before) == 0, "stat");
        char log[300];
        snprintf(log, sizeof(log), "%s/other.log", D.dir);
        int rc = daemon_run_as(OTHER_UID, OTHER_GID, D.sock, log);
        CHECK(rc != 0 && rc != 127, "a second daemon of another uid started on our path (%d)", rc);
        CHECK(stat(D.sock, &after) == 0 && after.st_ino == before.st_ino,
              "our socket was removed by another uid's daemon (EACCES)");
        CHECK(file_has(log, "it is not a stale socket of ours"), "no clear refusal in its log");
        sec_daemon_check(&D, "after another uid's start");
        sec_legit_traffic(D.sock);
        /* A stale socket of the other user: left alone, even by root. */
        char stale[300];
        snprintf(stale, sizeof(stale), "%s/stale.sock", D.dir);
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                sec_become(OTHER_UID, OTHER_GID);
                struct sockaddr_un un = {.sun_family = AF_UNIX};
                snprintf(un.sun_path, sizeof(un.sun_path), "%.107s", stale);
                int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
                _exit(s >= 0 && bind(s, (struct sockaddr *)&un, sizeof(un)) == 0 ? 0 : 1);
        }
        int st;
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0, "stale socket");
        CHECK(stat(stale, &before) == 0, "stat");
        snprintf(log, sizeof(log), "%s/stale.log", D.dir);
        CHECK(chown(D.dir, 0, 0) == 0, "chown back");
        rc = daemon_run_as((uid_t)-1, (gid_t)-1, stale, log);
        CHECK(rc != 0 && rc != 127, "a daemon took another uid's stale socket (%d)", rc);
        CHECK(stat(stale, &after) == 0 && after.st_ino == before.st_ino,
              "another uid's stale socket was removed");
        /* A stale socket of our own is taken over. */
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        CHECK(unlink(stale) == 0, "unlink");
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        snprintf(un.sun_path, sizeof(un.sun_path), "%.107s", D.sock);
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        CHECK(s >= 0 && bind(s, (struct sockaddr *)&un, sizeof(un)) == 0, "our stale socket");
        close(s);
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        sec_legit_traffic(D.sock);
        sec_daemon_check(&D, "after taking over our own stale socket");
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        CHECK(access(D.sock, F_OK) != 0, "the daemon left its socket behind at exit");
        printf("OK no_unlink_foreign: another's sockets kept, our stale one taken over\n");
        return 0;
}

/* ---- devices ------------------------------------------------------------------ */

static int daemon_fds(void)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/fd", (int)D.pid);
        DIR *d = opendir(p);
        CHECK(d, "%s", p);
        int n = 0;
        while (readdir(d))
                n++;
        closedir(d);
        return n - 2;
}

static long daemon_rss_kb(void)
{
        char p[64], line[256];
        snprintf(p, sizeof(p), "/proc/%d/status", (int)D.pid);
        FILE *f = fopen(p, "r");
        long kb = -1;
        while (f && fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld", &kb) == 1)
                        break;
        if (f)
                fclose(f);
        return kb;
}

static void wait_no_clients(void)
{
        double end = now_s() + 10;
        uint32_t n;
        while ((n = stat_clients()) > 0) {
                CHECK(now_s() < end, "the daemon still holds %u clients", n);
                usleep(20000);
        }
}

#define BASE 31000 /* port bases 31000 + 16 i: each a device of its own */

/* A second client process at the daemon's cap: its third new device is
 * refused, and legitimate traffic on an existing device goes through. */
static void second_client(void)
{
        struct sec_conn a, b, c;
        CHECK(sec_connect(D.sock, &a) == 0 && sec_open(&a, NULL, BASE + 16 * 50) == 0,
              "the 4th device of the daemon");
        CHECK(sec_connect(D.sock, &b) == 0 && sec_open(&b, NULL, BASE + 16 * 51) == 0,
              "the 5th device of the daemon");
        CHECK(sec_connect(D.sock, &c) == 0, "connect");
        int err = sec_open(&c, NULL, BASE + 16 * 52);
        CHECK(err == -ENFILE, "a 6th device of the daemon: %d, want -ENFILE", err);
        sec_legit_traffic(D.sock);
        _exit(0);
}

/* Item 9: short connections naming new devices leave nothing behind; the
 * devices per client and per daemon are capped with a clear refusal. */
static int case_device_churn(void)
{
        /* Under AddressSanitizer freed memory waits in a quarantine (256 MB
         * by default) before it goes back: keep it small, so the RSS shows
         * what the daemon keeps, not what ASan does. */
        const char *asan = getenv("ASAN_OPTIONS");
        char opts[1024];
        snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4", asan ? asan : "",
                 asan && *asan ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        setenv("DIWARPD_MAX_DEVICES", "5", 1);
        setenv("DIWARPD_CLIENT_DEVICES", "3", 1);
        sec_daemon_start(&D, (uid_t)-1, (gid_t)-1, NULL);
        struct sec_conn c;
        CHECK(sec_connect(D.sock, &c) == 0 && sec_open(&c, NULL, BASE) == 0, "first device");
        close(c.s);
        wait_no_clients();
        int fds0 = daemon_fds();
        long rss0 = daemon_rss_kb();
        for (int i = 0; i < 40; i++) {
                CHECK(sec_connect(D.sock, &c) == 0, "connect %d", i);
                int err = sec_open(&c, NULL, (uint16_t)(BASE + 16 * i));
                CHECK(err == 0, "short connection %d: OPEN %d", i, err);
                close(c.s);
                wait_no_clients();
        }
        int fds1 = daemon_fds();
        long rss1 = daemon_rss_kb();
        printf("40 short connections: fds %d -> %d, RSS %ld -> %ld kB\n", fds0, fds1, rss0, rss1);
        CHECK(fds1 <= fds0 + 2, "the daemon kept %d descriptors of closed devices", fds1 - fds0);
        CHECK(rss1 - rss0 < 64 * 1024, "the daemon grew by %ld kB", rss1 - rss0);
        /* Per client: three distinct devices; a fourth is refused, one more
         * connection on a device it uses is not. */
        struct sec_conn h[4];
        static const uint16_t bases[3] = {0, BASE + 16 * 60, BASE + 16 * 61};
        for (int i = 0; i < 3; i++)
                CHECK(sec_connect(D.sock, &h[i]) == 0 && sec_open(&h[i], NULL, bases[i]) == 0,
                      "device %d of the client", i);
        CHECK(sec_connect(D.sock, &h[3]) == 0, "connect");
        int err = sec_open(&h[3], NULL, BASE + 16 * 62);
        CHECK(err == -EMFILE, "a 4th device of one client: %d, want -EMFILE", err);
        CHECK(sec_log_has(&D, "the most one client may (DIWARPD_CLIENT_DEVICES"),
              "the per-client refusal is not logged");
        err = sec_open(&h[3], NULL, bases[1]);
        CHECK(err == 0, "another connection to a device the client uses: %d", err);
        /* Per daemon: five in all. */
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0)
                second_client();
        int st;
        CHECK(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the second client");
        CHECK(sec_log_has(&D, "its most (DIWARPD_MAX_DEVICES"),
              "the per-daemon refusal is not logged");
        for (int i = 0; i < 4; i++)
                close(h[i].s);
        wait_no_clients();
        CHECK(daemon_fds() <= fds0 + 2, "descriptors left after the capped clients left");
        /* Everything closed: new devices open again. */
        CHECK(sec_connect(D.sock, &c) == 0 && sec_open(&c, NULL, BASE + 16 * 63) == 0,
              "a new device once the others closed");
        close(c.s);
        sec_legit_traffic(D.sock);
        sec_daemon_check(&D, "after the device churn");
        CHECK(sec_daemon_stop(&D) == 0, "the daemon's exit status");
        printf("OK device_churn: devices closed with their last client, caps refused clearly\n");
        return 0;
}

int main(int argc, char **argv)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGPIPE, SIG_IGN);
        RSP = calloc(1, sizeof(*RSP));
        CHECK(RSP, "calloc");
        const char *m = argc > 1 ? argv[1] : "";
        sec_dir(&D);
        atexit(at_exit);
        if (!strcmp(m, "seg_replace_dup"))
                return case_seg_replace_dup();
        if (!strcmp(m, "connect_hangup"))
                return case_connect_hangup();
        if (!strcmp(m, "device_churn"))
                return case_device_churn();
        if (!strcmp(m, "peer_uid_refused"))
                return case_peer_uid_refused();
        if (!strcmp(m, "group_served"))
                return case_group_served();
        if (!strcmp(m, "client_refuses_foreign"))
                return case_client_refuses_foreign();
        if (!strcmp(m, "no_unlink_foreign"))
                return case_no_unlink_foreign();
        fprintf(stderr, "usage: sec_daemon CASE (see meson.build)\n");
        return 2;
}
