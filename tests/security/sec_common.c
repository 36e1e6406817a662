/* tests/security: the shared helpers (sec_common.h). */
#define _GNU_SOURCE
#include "sec_common.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const struct sec_daemon *last;

void sec_on_fail(void)
{
        fflush(stdout);
        if (!last || !last->log[0])
                return;
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "echo '--- the daemon log (tail):'; tail -n 40 '%s'", last->log);
        if (system(cmd) < 0)
                printf("(no log)\n");
        fflush(stdout);
}

void sec_dir(struct sec_daemon *d)
{
        memset(d, 0, sizeof(*d));
        const char *tmp = getenv("TMPDIR");
        snprintf(d->dir, sizeof(d->dir), "%s/dwsec.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        CHECK(mkdtemp(d->dir), "mkdtemp %s: %s", d->dir, strerror(errno));
        snprintf(d->sock, sizeof(d->sock), "%s/diwarpd.sock", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/diwarpd.log", d->dir);
}

void sec_become(uid_t uid, gid_t gid)
{
        CHECK(setgroups(0, NULL) == 0 && setgid(gid) == 0 && setuid(uid) == 0,
              "cannot become uid %u: %s", (unsigned)uid, strerror(errno));
}

void sec_daemon_start(struct sec_daemon *d, uid_t uid, gid_t gid, const char *const *extra)
{
        const char *bin = getenv("DIWARPD");
        CHECK(bin && *bin, "DIWARPD (the daemon's path) is not set");
        const char *argv[16] = {bin, "--socket", d->sock};
        int n = 3;
        for (int i = 0; extra && extra[i] && n < 15; i++)
                argv[n++] = extra[i];
        argv[n] = NULL;
        last = d;
        fflush(stdout);
        d->pid = fork();
        CHECK(d->pid >= 0, "fork");
        if (d->pid == 0) {
                int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0666);
                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                        close(fd);
                }
                if (uid != (uid_t)-1)
                        sec_become(uid, gid);
                unsetenv("DIWARP_PROGRESS");
                unsetenv("DIWARP_DAEMON_SOCKET");
                execv(bin, (char *const *)argv);
                _exit(127);
        }
        double end = now_s() + 15;
        for (;;) {
                struct sec_conn c;
                if (sec_connect(d->sock, &c) == 0) {
                        close(c.s);
                        return;
                }
                int st;
                if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                        d->pid = 0;
                        char cmd[400];
                        snprintf(cmd, sizeof(cmd), "cat %s", d->log);
                        CHECK(system(cmd) >= 0, "log");
                        CHECK(0, "the daemon exited at start (status 0x%x)", st);
                }
                CHECK(now_s() < end, "the daemon does not answer on %s", d->sock);
                usleep(20000);
        }
}

bool sec_log_has(const struct sec_daemon *d, const char *s)
{
        FILE *f = fopen(d->log, "r");
        if (!f)
                return false;
        char line[1024];
        bool has = false;
        while (!has && fgets(line, sizeof(line), f))
                has = strstr(line, s) != NULL;
        fclose(f);
        return has;
}

void sec_daemon_check(struct sec_daemon *d, const char *when)
{
        int st;
        if (d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == d->pid) {
                d->pid = 0;
                char cmd[400];
                snprintf(cmd, sizeof(cmd), "tail -n 40 %s", d->log);
                CHECK(system(cmd) >= 0, "log");
                CHECK(0, "%s: the daemon died (%s %d)", when,
                      WIFSIGNALED(st) ? "signal" : "exit status",
                      WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        }
        CHECK(!sec_log_has(d, "AddressSanitizer") && !sec_log_has(d, "runtime error:") &&
                  !sec_log_has(d, "LeakSanitizer"),
              "%s: the daemon's log holds a sanitizer report (%s)", when, d->log);
}

int sec_daemon_stop(struct sec_daemon *d)
{
        if (d->pid <= 0)
                return -1;
        kill(d->pid, SIGTERM);
        double end = now_s() + 20;
        int st = 0;
        while (waitpid(d->pid, &st, WNOHANG) != d->pid) {
                if (now_s() > end) {
                        kill(d->pid, SIGKILL);
                        waitpid(d->pid, &st, 0);
                        d->pid = 0;
                        return -1;
                }
                usleep(20000);
        }
        d->pid = 0;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void sec_cleanup(struct sec_daemon *d)
{
        if (d->pid > 0) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, NULL, 0);
                d->pid = 0;
        }
        if (!d->dir[0])
                return;
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
        if (system(cmd) != 0)
                printf("note: could not remove %s\n", d->dir);
}

/* ---- a legitimate client -------------------------------------------------- */

#define LCHECK(cond, ...)                                                                          \
        do {                                                                                       \
                if (!(cond)) {                                                                     \
                        printf("FAIL legit client line %d: ", __LINE__);                           \
                        printf(__VA_ARGS__);                                                       \
                        printf("\n");                                                              \
                        fflush(stdout);                                                            \
                        _exit(1);                                                                  \
                }                                                                                  \
        } while (0)

static void legit_child(void)
{
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        int err = diwarp_device_open(NULL, &dev);
        LCHECK(err == 0, "device open through the daemon: %s", strerror(-err));
        LCHECK(diwarp_pd_alloc(dev, &pd) == 0, "pd");
        LCHECK(diwarp_cq_create(dev, 16, NULL, NULL, &cq) == 0, "cq");
        uint8_t *buf =
            mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        LCHECK(buf != MAP_FAILED, "mmap");
        LCHECK(diwarp_mr_reg(pd, buf, 65536, (uintptr_t)buf, DIWARP_ACCESS_LOCAL_WRITE, &mr) == 0,
               "mr");
        struct diwarp_qp_init_attr a = {
            .send_cq = cq,
            .recv_cq = cq,
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = DIWARP_QPT_UD};
        LCHECK(diwarp_qp_create(pd, &a, &qp) == 0, "qp");
        struct diwarp_qp_attr qa = {.qp_state = DIWARP_QPS_INIT, .qkey = 7};
        LCHECK(diwarp_qp_modify(qp, &qa, DIWARP_QP_STATE | DIWARP_QP_QKEY) == 0, "init");
        qa.qp_state = DIWARP_QPS_RTR;
        LCHECK(diwarp_qp_modify(qp, &qa, DIWARP_QP_STATE) == 0, "rtr");
        qa.qp_state = DIWARP_QPS_RTS;
        LCHECK(diwarp_qp_modify(qp, &qa, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN) == 0, "rts");
        struct diwarp_mr_info mi;
        diwarp_mr_info(mr, &mi);
        struct diwarp_sge rs = {(uintptr_t)buf, 4096, mi.lkey};
        struct diwarp_recv_wr rw = {.wr_id = 100, .sg_list = &rs, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        LCHECK(diwarp_post_recv(qp, &rw, &rbad) == 0, "post recv");
        union diwarp_gid gid;
        LCHECK(diwarp_device_gid(dev, &gid) == 0, "gid");
        struct diwarp_ah *ah;
        LCHECK(diwarp_ah_create(pd, &gid, &ah) == 0, "ah");
        memcpy(buf + 60000, "legitimate traffic", 19);
        struct diwarp_sge sg = {(uintptr_t)buf + 60000, 19, mi.lkey};
        struct diwarp_send_wr wr = {.wr_id = 9,
                                    .sg_list = &sg,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .wr.ud = {ah, diwarp_qp_num(qp), 7}};
        struct diwarp_send_wr *bad;
        LCHECK(diwarp_post_send(qp, &wr, &bad) == 0, "post send");
        double end = now_s() + 10;
        bool sent = false, recvd = false;
        while (!sent || !recvd) {
                struct diwarp_wc wc;
                int n = diwarp_cq_poll(cq, 1, &wc);
                LCHECK(n >= 0 && now_s() < end, "no completion within 10 s (sent %d received %d)",
                       sent, recvd);
                if (n == 0)
                        continue;
                LCHECK(wc.status == DIWARP_WC_SUCCESS, "completion status %d", wc.status);
                if (wc.opcode == DIWARP_WC_SEND) {
                        sent = true;
                        continue;
                }
                LCHECK(wc.wr_id == 100 && wc.byte_len == 19 + 40, "receive %llu of %u bytes",
                       (unsigned long long)wc.wr_id, wc.byte_len);
                LCHECK(!memcmp(buf + 40, "legitimate traffic", 19), "payload");
                recvd = true;
        }
        LCHECK(diwarp_ah_destroy(ah) == 0 && diwarp_qp_destroy(qp) == 0 &&
                   diwarp_mr_dereg(mr) == 0 && diwarp_cq_destroy(cq) == 0 &&
                   diwarp_pd_dealloc(pd) == 0 && diwarp_device_close(dev) == 0,
               "teardown");
        _exit(0);
}

void sec_legit_traffic(const char *sock)
{
        sec_legit_traffic_as(sock, (uid_t)-1, (gid_t)-1, NULL);
}

void sec_legit_traffic_as(const char *sock, uid_t uid, gid_t gid, const char *daemon_uid)
{
        char s[400], u[64];
        snprintf(s, sizeof(s), "DIWARP_DAEMON_SOCKET=%s", sock);
        snprintf(u, sizeof(u), "DIWARP_DAEMON_UID=%s", daemon_uid ? daemon_uid : "");
        const char *env[] = {"DIWARP_PROGRESS=daemon", s, daemon_uid ? u : NULL, NULL};
        sec_legit_run(uid, gid, env);
}

void sec_legit_run(uid_t uid, gid_t gid, const char *const *env)
{
        fflush(stdout);
        pid_t p = fork();
        CHECK(p >= 0, "fork");
        if (p == 0) {
                if (uid != (uid_t)-1)
                        sec_become(uid, gid);
                unsetenv("DIWARP_PROGRESS");
                for (int i = 0; env && env[i]; i++)
                        putenv((char *)env[i]);
                alarm(30);
                legit_child();
        }
        int st;
        CHECK(waitpid(p, &st, 0) == p, "wait");
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the legitimate client beside the attack failed (status 0x%x)", st);
}

/* ---- the raw protocol ------------------------------------------------------ */

int sec_connect(const char *sock, struct sec_conn *c)
{
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        snprintf(un.sun_path, sizeof(un.sun_path), "%s", sock);
        c->seq = 0;
        c->s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (c->s < 0)
                return -errno;
        if (connect(c->s, (struct sockaddr *)&un, sizeof(un)) < 0) {
                int err = -errno;
                close(c->s);
                c->s = -1;
                return err;
        }
        return 0;
}

void sec_send(struct sec_conn *c, unsigned int op, uint32_t handle, struct dw_ipc_req *r,
              const int *fds, int nfds)
{
        r->h.magic = DW_IPC_MAGIC;
        r->h.op = (uint16_t)op;
        r->h.len = (uint16_t)dw_ipc_req_size(op);
        r->h.seq = ++c->seq;
        r->h.handle = handle;
        CHECK(dw_ipc_send(c->s, r, r->h.len, fds, nfds, false) >= 0, "send request %u", op);
}

int sec_req(struct sec_conn *c, unsigned int op, uint32_t handle, struct dw_ipc_req *r,
            const int *fds, int nfds, struct dw_ipc_rsp *rsp, int *fds_out, int *nout)
{
        r->h.magic = DW_IPC_MAGIC;
        r->h.op = (uint16_t)op;
        r->h.len = (uint16_t)dw_ipc_req_size(op);
        r->h.seq = ++c->seq;
        r->h.handle = handle;
        if (dw_ipc_send(c->s, r, r->h.len, fds, nfds, false) < 0)
                return -ECONNRESET;
        struct pollfd p = {.fd = c->s, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1)
                return -ECONNRESET;
        int room = nout ? *nout : 0, tmp[DW_IPC_MAX_FDS];
        ssize_t n = dw_ipc_recv(c->s, rsp, sizeof(*rsp), fds_out ? fds_out : tmp, &room);
        if (n <= 0)
                return -ECONNRESET;
        if (nout)
                *nout = room;
        else
                for (int i = 0; i < room; i++)
                        close(tmp[i]);
        return rsp->status;
}

int sec_open(struct sec_conn *c, const char *addr, uint16_t port_base)
{
        struct dw_ipc_req r;
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        CHECK(rsp, "calloc");
        memset(&r, 0, sizeof(r));
        r.u.open.version = DW_IPC_VERSION;
        r.u.open.pid = getpid();
        if (addr)
                snprintf(r.u.open.addr, sizeof(r.u.open.addr), "%s", addr);
        r.u.open.port_base = port_base;
        int err = sec_req(c, DW_IPC_OPEN, 0, &r, NULL, 0, rsp, NULL, NULL);
        free(rsp);
        return err;
}

int sec_memfd(size_t len)
{
        int fd = memfd_create("sec", MFD_ALLOW_SEALING | MFD_CLOEXEC);
        CHECK(fd >= 0 && ftruncate(fd, (off_t)len) == 0, "memfd");
        CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0, "seal");
        return fd;
}
