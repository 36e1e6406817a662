/* Multi-process UD tests over loopback (and over a veth pair between two
 * network namespaces): the orchestrator fork+execs itself as a receiver and a
 * sender (or an example program as server and client) and checks what
 * arrived, byte for byte, against what was sent.
 *
 *   ud_multi sizes | qkey | drop | dup | reorder | corrupt | mixed | netns
 *   ud_multi example PROGRAM [client options...]
 *
 * Exit status: 0 pass, 1 fail, 77 skipped (netns without root / ip netns).
 * Every wait has a deadline; an alarm kills everything after 90 s.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#define QKEY       0x51e5a11u
#define STREAM_LEN 1000
#define GRH        40

#define SIZE_MAX_UD UINT32_MAX /* the device's max_msg_size_ud */
static const uint32_t sizes[] = {0, 1, 4095, 4096, SIZE_MAX_UD};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint8_t pat(uint64_t i, uint64_t s)
{
        return (uint8_t)(i * 7 + s * 13 + 1);
}

static void die(const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        exit(1);
}

#define CHECK(call)                                                                                \
        do {                                                                                       \
                int _e = (call);                                                                   \
                if (_e < 0)                                                                        \
                        die("%s: %s", #call, strerror(-_e));                                       \
        } while (0)

struct ud {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t *buf;
        size_t slot, nslots;
        uint32_t lkey;
        uint32_t max_ud;
};

static void ud_open(struct ud *u, size_t slot, size_t nslots)
{
        struct diwarp_device_attr da;
        memset(u, 0, sizeof(*u));
        CHECK(diwarp_device_open(NULL, &u->dev));
        CHECK(diwarp_device_query(u->dev, &da));
        u->max_ud = da.max_msg_size_ud;
        CHECK(diwarp_pd_alloc(u->dev, &u->pd));
        CHECK(diwarp_cq_create(u->dev, (int)nslots * 2 + 64, NULL, NULL, &u->cq));
        struct diwarp_qp_init_attr ia = {.send_cq = u->cq,
                                         .recv_cq = u->cq,
                                         .qp_type = DIWARP_QPT_UD,
                                         .cap = {.max_send_wr = 64,
                                                 .max_recv_wr = (uint32_t)nslots,
                                                 .max_send_sge = 1,
                                                 .max_recv_sge = 1}};
        CHECK(diwarp_qp_create(u->pd, &ia, &u->qp));
        u->slot = slot;
        u->nslots = nslots;
        u->buf = calloc(nslots, slot);
        if (!u->buf)
                die("out of memory");
        CHECK(diwarp_mr_reg(u->pd, u->buf, nslots * slot, (uintptr_t)u->buf,
                            DIWARP_ACCESS_LOCAL_WRITE, &u->mr));
        struct diwarp_mr_info mi;
        diwarp_mr_info(u->mr, &mi);
        u->lkey = mi.lkey;
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .port_num = 1};
        CHECK(diwarp_qp_modify(u->qp, &a, DIWARP_QP_STATE | DIWARP_QP_QKEY | DIWARP_QP_PORT));
        a.qp_state = DIWARP_QPS_RTR;
        CHECK(diwarp_qp_modify(u->qp, &a, DIWARP_QP_STATE));
        a.qp_state = DIWARP_QPS_RTS;
        CHECK(diwarp_qp_modify(u->qp, &a, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN));
}

static void ud_post_recv(struct ud *u, size_t i)
{
        struct diwarp_sge sge = {(uintptr_t)(u->buf + i * u->slot), (uint32_t)u->slot, u->lkey};
        struct diwarp_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
        CHECK(diwarp_post_recv(u->qp, &wr, &bad));
}

static void ud_close(struct ud *u)
{
        diwarp_qp_destroy(u->qp);
        diwarp_mr_dereg(u->mr);
        diwarp_cq_destroy(u->cq);
        diwarp_pd_dealloc(u->pd);
        CHECK(diwarp_device_close(u->dev));
        free(u->buf);
}

/* ---- receiver ------------------------------------------------------------- */

static int run_recv(const char *mode, uint64_t n)
{
        bool stream = strcmp(mode, "sizes") != 0;
        struct ud u;
        ud_open(&u, stream ? STREAM_LEN + GRH : 65536 + 64, stream ? 256 : 16);
        for (size_t i = 0; i < u.nslots; i++)
                ud_post_recv(&u, i);
        union diwarp_gid g;
        diwarp_device_gid(u.dev, &g);
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, g.raw + 12, ip, sizeof(ip));
        printf("READY %s %#x\n", ip, diwarp_qp_num(u.qp));
        fflush(stdout);

        uint8_t *seen = calloc(n + 1, 1);
        uint64_t received = 0, dups = 0, bad = 0, k = 0;
        uint64_t start = now_ms(), last = start;
        /* stream modes end after 1.5 s of silence; sizes ends when all arrived */
        while (now_ms() - start < 30000 && now_ms() - last < (received ? 1500u : 10000u)) {
                struct diwarp_wc wc;
                int r = diwarp_cq_poll(u.cq, 1, &wc);
                if (r < 0)
                        die("poll: %s", strerror(-r));
                if (r == 0)
                        continue;
                last = now_ms();
                const uint8_t *m = u.buf + wc.wr_id * u.slot;
                if (wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "recv: %s\n", diwarp_wc_status_str(wc.status));
                        bad++;
                } else if (!stream) {
                        uint32_t size = sizes[k / 2] == SIZE_MAX_UD ? u.max_ud : sizes[k / 2];
                        bool imm = k & 1;
                        bool ok = wc.byte_len == size + GRH &&
                                  !!(wc.wc_flags & DIWARP_WC_WITH_IMM) == imm &&
                                  (!imm || wc.imm_data == htonl(0x1000 + (uint32_t)k)) &&
                                  (wc.wc_flags & DIWARP_WC_GRH) && m[0] >> 4 == 6;
                        for (uint32_t i = 0; ok && i < size; i++)
                                ok = m[GRH + i] == pat(i, k);
                        if (!ok) {
                                fprintf(stderr,
                                        "message %llu (size %u imm %d): wrong (byte_len %u)\n",
                                        (unsigned long long)k, size, imm, wc.byte_len);
                                bad++;
                        }
                        received++;
                        k++;
                } else {
                        uint64_t seq = 0;
                        bool ok = wc.byte_len == STREAM_LEN + GRH;
                        if (ok) {
                                for (int i = 0; i < 8; i++)
                                        seq = seq << 8 | m[GRH + i];
                                ok = seq < n;
                        }
                        for (uint32_t i = 8; ok && i < STREAM_LEN; i++)
                                ok = m[GRH + i] == pat(i, seq);
                        if (!ok)
                                bad++;
                        else if (seen[seq]++)
                                dups++;
                        else
                                received++;
                }
                ud_post_recv(&u, wc.wr_id);
                if (!stream && k == n)
                        break;
        }
        struct diwarp_counters c;
        diwarp_device_counters(u.dev, &c);
        printf("DONE received=%llu dups=%llu bad=%llu crc=%llu qkeydrop=%llu dupdrop=%llu "
               "malformed=%llu norecv=%llu\n",
               (unsigned long long)received, (unsigned long long)dups, (unsigned long long)bad,
               (unsigned long long)c.crc_errors, (unsigned long long)c.rx_dropped_qkey,
               (unsigned long long)c.rx_dropped_duplicate,
               (unsigned long long)c.rx_dropped_malformed,
               (unsigned long long)c.rx_dropped_no_recv);
        fflush(stdout);
        free(seen);
        ud_close(&u);
        return 0;
}

/* ---- sender ---------------------------------------------------------------- */

static void wait_sends(struct ud *u, uint64_t *outstanding)
{
        uint64_t t0 = now_ms();
        while (*outstanding && now_ms() - t0 < 10000) {
                struct diwarp_wc wc;
                int r = diwarp_cq_poll(u->cq, 1, &wc);
                if (r < 0)
                        die("poll: %s", strerror(-r));
                if (r == 1) {
                        if (wc.status != DIWARP_WC_SUCCESS)
                                die("send: %s", diwarp_wc_status_str(wc.status));
                        (*outstanding)--;
                }
        }
        if (*outstanding)
                die("send completions missing");
}

static void pause_us(struct ud *u, unsigned us)
{
        /* keep the engine moving (fault-held packets) while pausing */
        uint64_t t0 = now_ms() * 1000;
        struct timespec ts = {0, 20000};
        while (now_ms() * 1000 - t0 < us) {
                diwarp_progress(u->dev, 16);
                nanosleep(&ts, NULL);
        }
}

static int run_send(const char *mode, uint64_t n, const char *ip, uint32_t qpn)
{
        bool stream = strcmp(mode, "sizes") != 0;
        bool wrong_qkey = strcmp(mode, "qkey") == 0;
        struct ud u;
        ud_open(&u, 65536, 1);
        union diwarp_gid g = {0};
        g.raw[10] = g.raw[11] = 0xff;
        if (inet_pton(AF_INET, ip, g.raw + 12) != 1)
                die("bad ip %s", ip);
        struct diwarp_ah *ah;
        CHECK(diwarp_ah_create(u.pd, &g, &ah));
        uint64_t outstanding = 0, wrong = 0;
        for (uint64_t k = 0; k < n; k++) {
                uint32_t size =
                    stream ? STREAM_LEN : (sizes[k / 2] == SIZE_MAX_UD ? u.max_ud : sizes[k / 2]);
                for (uint32_t i = 0; i < size; i++)
                        u.buf[i] = pat(i, k);
                if (stream)
                        for (int i = 0; i < 8; i++)
                                u.buf[i] = (uint8_t)(k >> (56 - 8 * i));
                struct diwarp_sge sge = {(uintptr_t)u.buf, size, u.lkey};
                struct diwarp_send_wr wr = {.wr_id = k,
                                            .sg_list = &sge,
                                            .num_sge = size ? 1 : 0,
                                            .opcode = (!stream && (k & 1)) ? DIWARP_WR_SEND_WITH_IMM
                                                                           : DIWARP_WR_SEND,
                                            .send_flags = DIWARP_SEND_SIGNALED,
                                            .imm_data = htonl(0x1000 + (uint32_t)k)},
                                      *bad;
                wr.wr.ud.ah = ah;
                wr.wr.ud.remote_qpn = qpn;
                wr.wr.ud.remote_qkey = QKEY;
                if (wrong_qkey && k % 3 == 0) {
                        wr.wr.ud.remote_qkey = QKEY ^ 1;
                        wrong++;
                }
                CHECK(diwarp_post_send(u.qp, &wr, &bad));
                outstanding++;
                /* the buffer is rewritten for the next message: wait for this one */
                wait_sends(&u, &outstanding);
                pause_us(&u, stream ? 300 : 3000);
        }
        pause_us(&u, 20000); /* let reordered / delayed packets out */
        struct diwarp_counters c;
        diwarp_device_counters(u.dev, &c);
        printf("SENT n=%llu wrongqkey=%llu fdrop=%llu fdup=%llu freorder=%llu fcorrupt=%llu\n",
               (unsigned long long)n, (unsigned long long)wrong,
               (unsigned long long)c.fault_dropped, (unsigned long long)c.fault_duplicated,
               (unsigned long long)c.fault_reordered, (unsigned long long)c.fault_corrupted);
        fflush(stdout);
        diwarp_ah_destroy(ah);
        ud_close(&u);
        return 0;
}

/* ---- orchestration ------------------------------------------------------------- */

#define MAXKIDS 4
static pid_t kids[MAXKIDS];
static int nkids;

static void kill_kids(void)
{
        for (int i = 0; i < nkids; i++)
                if (kids[i] > 0)
                        kill(kids[i], SIGKILL);
}

static void on_alarm(int sig)
{
        (void)sig;
        kill_kids();
        static const char msg[] = "ud_multi: global timeout, children killed\n";
        if (write(2, msg, sizeof(msg) - 1) < 0) {
        }
        _exit(1);
}

/* Starts argv with extra environment assignments (NAME=VALUE, NULL-ended);
 * *out_fd reads its stdout. */
static pid_t spawn(char *const argv[], const char *const env[], int *out_fd)
{
        int p[2];
        if (pipe(p) < 0)
                die("pipe");
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid == 0) {
                dup2(p[1], 1);
                close(p[0]);
                close(p[1]);
                for (int i = 0; env && env[i]; i++)
                        putenv((char *)env[i]);
                execvp(argv[0], argv);
                fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
                _exit(127);
        }
        close(p[1]);
        *out_fd = p[0];
        /* Reuse the slot of a child already reaped (the example retries). */
        int k = 0;
        while (k < nkids && kids[k] > 0)
                k++;
        if (k == MAXKIDS) {
                kill(pid, SIGKILL);
                die("too many children");
        }
        kids[k] = pid;
        if (k == nkids)
                nkids++;
        return pid;
}

/* Reads one line starting with prefix (other lines are echoed) within ms. */
static bool read_line(int fd, const char *prefix, char *line, size_t cap, int ms)
{
        size_t len = 0;
        uint64_t deadline = now_ms() + (uint64_t)ms;
        for (;;) {
                char *nl = memchr(line, '\n', len);
                while (nl) {
                        *nl = 0;
                        if (!strncmp(line, prefix, strlen(prefix)))
                                return true;
                        fprintf(stderr, "  | %s\n", line);
                        len -= (size_t)(nl + 1 - line);
                        memmove(line, nl + 1, len);
                        nl = memchr(line, '\n', len);
                }
                int left = (int)(deadline - now_ms());
                if (left <= 0 || len + 1 >= cap)
                        return false;
                struct pollfd p = {.fd = fd, .events = POLLIN};
                if (poll(&p, 1, left) <= 0)
                        return false;
                ssize_t r = read(fd, line + len, cap - 1 - len);
                if (r <= 0)
                        return false;
                len += (size_t)r;
        }
}

static int wait_kid(pid_t pid, int ms)
{
        uint64_t deadline = now_ms() + (uint64_t)ms;
        for (;;) {
                int st;
                pid_t r = waitpid(pid, &st, WNOHANG);
                if (r == pid) {
                        for (int i = 0; i < nkids; i++)
                                if (kids[i] == pid)
                                        kids[i] = 0;
                        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                }
                if (now_ms() > deadline) {
                        kill(pid, SIGKILL);
                        waitpid(pid, &st, 0);
                        return -1;
                }
                usleep(10000);
        }
}

static uint64_t field(const char *line, const char *name)
{
        char key[64];
        snprintf(key, sizeof(key), " %s=", name);
        const char *p = strstr(line, key);
        return p ? strtoull(p + strlen(key), NULL, 0) : UINT64_MAX;
}

struct outcome {
        char sent[256], done[512];
};

/* wrap: prefix for each child ("ip netns exec NS" or NULL) and env for each. */
static bool run_pair(const char *self, const char *mode, uint64_t n, const char *fault,
                     char *const *wrap_r, const char *env_r[], char *const *wrap_s,
                     const char *env_s[], struct outcome *o)
{
        char nbuf[32], line[512];
        snprintf(nbuf, sizeof(nbuf), "%llu", (unsigned long long)n);
        char *argv_r[16];
        int a = 0;
        for (int i = 0; wrap_r && wrap_r[i]; i++)
                argv_r[a++] = wrap_r[i];
        argv_r[a++] = (char *)self;
        argv_r[a++] = "--recv";
        argv_r[a++] = (char *)mode;
        argv_r[a++] = nbuf;
        argv_r[a] = NULL;
        int rfd, sfd;
        pid_t rp = spawn(argv_r, env_r, &rfd);
        if (!read_line(rfd, "READY ", line, sizeof(line), 10000)) {
                fprintf(stderr, "receiver did not get ready\n");
                return false;
        }
        char ip[64], qpn[32];
        if (sscanf(line, "READY %63s %31s", ip, qpn) != 2)
                return false;
        fprintf(stderr, "receiver ready at %s QPN %s\n", ip, qpn);
        char fault_env[300];
        snprintf(fault_env, sizeof(fault_env), "DIWARP_FAULT=%s", fault ? fault : "");
        const char *env2[8];
        int e = 0;
        for (int i = 0; env_s && env_s[i]; i++)
                env2[e++] = env_s[i];
        env2[e++] = fault_env;
        env2[e] = NULL;
        char *argv_s[16];
        a = 0;
        for (int i = 0; wrap_s && wrap_s[i]; i++)
                argv_s[a++] = wrap_s[i];
        argv_s[a++] = (char *)self;
        argv_s[a++] = "--send";
        argv_s[a++] = (char *)mode;
        argv_s[a++] = nbuf;
        argv_s[a++] = ip;
        argv_s[a++] = qpn;
        argv_s[a] = NULL;
        pid_t sp = spawn(argv_s, env2, &sfd);
        bool ok = read_line(sfd, "SENT ", o->sent, sizeof(o->sent), 60000);
        int sst = wait_kid(sp, 10000);
        ok = read_line(rfd, "DONE ", o->done, sizeof(o->done), 40000) && ok;
        int rst = wait_kid(rp, 10000);
        fprintf(stderr, "sender:   %s (exit %d)\nreceiver: %s (exit %d)\n", o->sent, sst, o->done,
                rst);
        close(rfd);
        close(sfd);
        return ok && sst == 0 && rst == 0;
}

static int check(bool cond, const char *what)
{
        fprintf(stderr, "%s: %s\n", cond ? "ok  " : "FAIL", what);
        return cond ? 0 : 1;
}

static int case_stream(const char *self, const char *name)
{
        struct outcome o;
        const uint64_t n = 400;
        const char *fault = NULL;
        if (!strcmp(name, "drop"))
                fault = "drop:0.1";
        else if (!strcmp(name, "dup"))
                fault = "dup:0.2";
        else if (!strcmp(name, "reorder"))
                fault = "reorder:0.3";
        else if (!strcmp(name, "corrupt"))
                fault = "corrupt:0.2";
        else if (!strcmp(name, "mixed"))
                fault = "drop:0.05,dup:0.1,reorder:0.1,corrupt:0.1,delay:100";
        const char *mode = !strcmp(name, "qkey") ? "qkey" : "stream";
        if (!run_pair(self, mode, n, fault, NULL, NULL, NULL, NULL, &o))
                return 1;
        uint64_t rec = field(o.done, "received"), dups = field(o.done, "dups"),
                 bad = field(o.done, "bad"), crc = field(o.done, "crc"),
                 dupdrop = field(o.done, "dupdrop"), qkeydrop = field(o.done, "qkeydrop");
        uint64_t fdrop = field(o.sent, "fdrop"), fdup = field(o.sent, "fdup"),
                 fcor = field(o.sent, "fcorrupt"), wrong = field(o.sent, "wrongqkey");
        int f = 0;
        f += check(bad == 0, "no corrupted or malformed message reached the application");
        f += check(dups == 0, "no message was delivered twice");
        if (!strcmp(name, "qkey")) {
                f += check(rec == n - wrong, "every right-qkey message arrived");
                f += check(qkeydrop == wrong, "every wrong-qkey message was dropped and counted");
        } else if (!strcmp(name, "drop")) {
                f += check(fdrop > 0, "the fault model dropped packets");
                f +=
                    check(rec >= n - fdrop && rec < n, "losses only where the fault model dropped");
        } else if (!strcmp(name, "dup")) {
                f += check(fdup > 0, "the fault model duplicated packets");
                f += check(dupdrop >= fdup, "every duplicate was dropped and counted");
                f += check(rec == n, "every message arrived once");
        } else if (!strcmp(name, "reorder")) {
                f += check(field(o.sent, "freorder") > 0, "the fault model reordered packets");
                f += check(rec == n, "every message arrived");
        } else if (!strcmp(name, "corrupt")) {
                f += check(fcor > 0, "the fault model corrupted packets");
                f += check(crc > 0 && crc <= fcor, "corrupted packets counted as CRC errors");
                f += check(rec + crc >= n, "only corrupted packets are missing");
        } else { /* mixed */
                f += check(rec > n / 2, "most messages arrived");
        }
        return f ? 1 : 0;
}

static int case_sizes(const char *self, char *const *wr, const char **er, char *const *ws,
                      const char **es)
{
        struct outcome o;
        const uint64_t n = NSIZES * 2;
        if (!run_pair(self, "sizes", n, NULL, wr, er, ws, es, &o))
                return 1;
        int f = 0;
        f += check(field(o.done, "received") == n,
                   "sizes 0, 1, 4095, 4096 and max, with and without immediate, all arrived");
        f += check(field(o.done, "bad") == 0, "byte for byte identical, GRH and immediate right");
        return f ? 1 : 0;
}

static int sh(const char *cmd)
{
        int st = system(cmd);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int case_netns(const char *self)
{
        if (geteuid() != 0) {
                printf("SKIP: netns test needs root (ip netns + veth)\n");
                return 77;
        }
        char a[32], b[32], cmd[1024];
        int id = getpid() % 100000;
        snprintf(a, sizeof(a), "dwA%d", id);
        snprintf(b, sizeof(b), "dwB%d", id);
        snprintf(
            cmd, sizeof(cmd),
            "set -e; ip netns add %s; ip netns add %s; "
            "ip link add vA%d type veth peer name vB%d; "
            "ip link set vA%d netns %s; ip link set vB%d netns %s; "
            "ip -n %s addr add 10.231.0.1/24 dev vA%d; ip -n %s addr add 10.231.0.2/24 dev vB%d; "
            "ip -n %s link set vA%d up; ip -n %s link set vB%d up; "
            "ip -n %s link set lo up; ip -n %s link set lo up",
            a, b, id, id, id, a, id, b, a, id, b, id, a, id, b, id, a, b);
        if (sh(cmd) != 0) {
                snprintf(cmd, sizeof(cmd),
                         "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", a, b);
                sh(cmd);
                printf("SKIP: ip netns / veth not available here\n");
                return 77;
        }
        char *wr[] = {"ip", "netns", "exec", a, NULL};
        char *ws[] = {"ip", "netns", "exec", b, NULL};
        const char *er[] = {"DIWARP_ADDR=10.231.0.1", NULL};
        const char *es[] = {"DIWARP_ADDR=10.231.0.2", NULL};
        int r = case_sizes(self, wr, er, ws, es);
        snprintf(cmd, sizeof(cmd), "ip netns del %s; ip netns del %s", a, b);
        sh(cmd);
        return r;
}

/* A TCP port for an example's side channel that nothing holds now (not even
 * in TIME_WAIT: the probe does not set SO_REUSEADDR), drawn at random from
 * 22000..32767: above the device instance ports (DIWARP_PORT_BASE 17471 +
 * instance) and below the kernel's ephemeral range, so neither a device of a
 * concurrent test run nor the source port of some connect() takes it between
 * this probe and the server's bind. The caller retries if it was taken. */
static int pick_port(void)
{
        unsigned seed = (unsigned)getpid() ^ (unsigned)now_ms();
        for (int tries = 0; tries < 200; tries++) {
                int port = 22000 + (int)(rand_r(&seed) % (32768 - 22000));
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fd < 0)
                        return -1;
                struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
                int r = bind(fd, (struct sockaddr *)&sin, sizeof(sin));
                close(fd);
                if (r == 0)
                        return port;
        }
        return -1;
}

/* True once a TCP socket listens on port (read from /proc, so nothing connects
 * to the server and takes its one side-channel accept). */
static bool tcp_listening(int port)
{
        static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
        for (int i = 0; i < 2; i++) {
                FILE *f = fopen(files[i], "r");
                if (!f)
                        continue;
                char line[512];
                bool found = false;
                while (!found && fgets(line, sizeof(line), f)) {
                        char local[128];
                        unsigned st;
                        if (sscanf(line, " %*s %127s %*s %x", local, &st) != 2)
                                continue;
                        char *colon = strrchr(local, ':');
                        found =
                            colon && st == 0x0A && strtoul(colon + 1, NULL, 16) == (unsigned)port;
                }
                fclose(f);
                if (found)
                        return true;
        }
        return false;
}

/* Server and client of an example program; both must end with status=ok.
 * The side-channel port is picked at run time, so concurrent test runs do
 * not collide; a server that exits before it listens (its port was taken
 * after all) is retried on another port. */
static int case_example(int argc, char **argv)
{
        char port[16];
        int sfd = -1, cfd;
        pid_t sp = -1;
        for (int attempt = 1;; attempt++) {
                int p = pick_port();
                if (p < 0) {
                        fprintf(stderr, "no free TCP port for the side channel\n");
                        return 1;
                }
                snprintf(port, sizeof(port), "%d", p);
                char *sv[] = {argv[0], "--port", port, NULL};
                sp = spawn(sv, NULL, &sfd);
                uint64_t deadline = now_ms() + 20000;
                int st = -2;
                while (!tcp_listening(p) && now_ms() < deadline) {
                        if (waitpid(sp, &st, WNOHANG) == sp)
                                break;
                        st = -2;
                        usleep(20000);
                }
                if (st == -2 && tcp_listening(p))
                        break;
                if (st == -2)
                        wait_kid(sp, 0); /* never listened: kill it */
                else
                        for (int i = 0; i < nkids; i++)
                                if (kids[i] == sp)
                                        kids[i] = 0;
                close(sfd);
                fprintf(stderr, "example server on port %s did not listen (attempt %d)\n", port,
                        attempt);
                if (attempt == 3)
                        return 1;
        }
        char *cv[32];
        int a = 0;
        cv[a++] = argv[0];
        cv[a++] = "--port";
        cv[a++] = port;
        for (int i = 1; i < argc && a < 28; i++)
                cv[a++] = argv[i];
        cv[a++] = "127.0.0.1";
        cv[a] = NULL;
        char sl[512] = "", cl[512] = "";
        pid_t cp = spawn(cv, NULL, &cfd);
        bool ok = read_line(cfd, "RESULT ", cl, sizeof(cl), 60000);
        ok = read_line(sfd, "RESULT ", sl, sizeof(sl), 10000) && ok;
        int cst = wait_kid(cp, 10000), sst = wait_kid(sp, 10000);
        fprintf(stderr, "client: %s (exit %d)\nserver: %s (exit %d)\n", cl, cst, sl, sst);
        return ok && cst == 0 && sst == 0 && strstr(cl, "status=ok") && strstr(sl, "status=ok") ? 0
                                                                                                : 1;
}

int main(int argc, char **argv)
{
        if (argc >= 4 && !strcmp(argv[1], "--recv"))
                return run_recv(argv[2], strtoull(argv[3], NULL, 0));
        if (argc >= 6 && !strcmp(argv[1], "--send"))
                return run_send(argv[2], strtoull(argv[3], NULL, 0), argv[4],
                                (uint32_t)strtoul(argv[5], NULL, 0));
        if (argc < 2)
                die("usage: ud_multi sizes|qkey|drop|dup|reorder|corrupt|mixed|netns|example "
                    "PROG...");
        signal(SIGALRM, on_alarm);
        alarm(90);
        setvbuf(stdout, NULL, _IONBF, 0);
        const char *self = "/proc/self/exe";
        char path[4096];
        ssize_t l = readlink(self, path, sizeof(path) - 1);
        if (l > 0) {
                path[l] = 0;
                self = path;
        }
        int r;
        if (!strcmp(argv[1], "sizes"))
                r = case_sizes(self, NULL, NULL, NULL, NULL);
        else if (!strcmp(argv[1], "netns"))
                r = case_netns(self);
        else if (!strcmp(argv[1], "example"))
                r = argc >= 3 ? case_example(argc - 2, argv + 2) : 1;
        else
                r = case_stream(self, argv[1]);
        kill_kids();
        return r;
}
