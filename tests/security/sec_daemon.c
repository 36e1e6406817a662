/* tests/security: a hostile client of the daemon (README.md). One case per
 * run: sec_daemon CASE. Each attack must be refused, the daemon must stay
 * up with a clean sanitizer log, and a legitimate client beside it must
 * complete its traffic. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
        fprintf(stderr, "usage: sec_daemon seg_replace_dup|connect_hangup\n");
        return 2;
}
