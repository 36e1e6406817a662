/* The daemon's fault cases (tests/interop/daemon.sh drives them):
 *
 *   daemon_fault fatal       a client whose daemon is killed: DEVICE_FATAL on
 *                            the async fd, outstanding WRs flushed, posts fail
 *   daemon_fault fatal_poll  the same found by a client that only busy-polls
 *   daemon_fault reopen      a device opens and moves a message (after a restart)
 *   daemon_fault holder      holds a QP, CQ and MR until killed
 *   daemon_fault merge       overlapping registrations: the client's memory
 *                            segments merge, contents and messages survive
 *   daemon_fault hostile     malformed and hostile requests on the socket: each
 *                            refused, the daemon and another client unharmed
 *
 * The client modes need DIWARP_PROGRESS=daemon. Each prints READY when the
 * script may act, and OK ... when every check passed (exit 0); a failed
 * check prints FAIL with the reason and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "ipc/ipc.h"

#define CHECK(cond, ...)                                                                           \
        do {                                                                                       \
                if (!(cond)) {                                                                     \
                        printf("FAIL line %d: ", __LINE__);                                        \
                        printf(__VA_ARGS__);                                                       \
                        printf("\n");                                                              \
                        exit(1);                                                                   \
                }                                                                                  \
        } while (0)

#define NRECV 4

struct ud {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t *buf;
};

static void ud_setup(struct ud *u)
{
        int err = diwarp_device_open(NULL, &u->dev);
        CHECK(err == 0, "device open through the daemon: %s", strerror(-err));
        CHECK(diwarp_pd_alloc(u->dev, &u->pd) == 0, "pd");
        CHECK(diwarp_cq_create(u->dev, 64, NULL, NULL, &u->cq) == 0, "cq");
        u->buf = malloc(65536);
        CHECK(u->buf, "malloc");
        memset(u->buf, 0, 65536);
        CHECK(diwarp_mr_reg(u->pd, u->buf, 65536, (uintptr_t)u->buf, DIWARP_ACCESS_LOCAL_WRITE,
                            &u->mr) == 0,
              "mr");
        struct diwarp_qp_init_attr a = {
            .send_cq = u->cq,
            .recv_cq = u->cq,
            .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = DIWARP_QPT_UD};
        CHECK(diwarp_qp_create(u->pd, &a, &u->qp) == 0, "qp");
        struct diwarp_qp_attr qa = {.qp_state = DIWARP_QPS_INIT, .qkey = 7};
        CHECK(diwarp_qp_modify(u->qp, &qa, DIWARP_QP_STATE | DIWARP_QP_QKEY) == 0, "init");
        qa.qp_state = DIWARP_QPS_RTR;
        CHECK(diwarp_qp_modify(u->qp, &qa, DIWARP_QP_STATE) == 0, "rtr");
        qa.qp_state = DIWARP_QPS_RTS;
        int err2 = diwarp_qp_modify(u->qp, &qa, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN);
        CHECK(err2 == 0, "rts: %s", strerror(-err2));
}

/* Frees everything, as a program does after a device loss too: each call
 * must succeed (the daemon freed its side when the connection ended). */
static void ud_teardown(struct ud *u)
{
        CHECK(diwarp_qp_destroy(u->qp) == 0, "qp destroy");
        CHECK(diwarp_mr_dereg(u->mr) == 0, "mr dereg");
        CHECK(diwarp_cq_destroy(u->cq) == 0, "cq destroy");
        CHECK(diwarp_pd_dealloc(u->pd) == 0, "pd dealloc");
        CHECK(diwarp_device_close(u->dev) == 0, "device close");
        free(u->buf);
}

static void post_recvs(struct ud *u)
{
        struct diwarp_mr_info mi;
        diwarp_mr_info(u->mr, &mi);
        for (int i = 0; i < NRECV; i++) {
                struct diwarp_sge sg = {(uintptr_t)u->buf + 4096 * (uint64_t)i, 4096, mi.lkey};
                struct diwarp_recv_wr wr = {
                    .wr_id = 100 + (uint64_t)i, .sg_list = &sg, .num_sge = 1};
                struct diwarp_recv_wr *bad;
                CHECK(diwarp_post_recv(u->qp, &wr, &bad) == 0, "post recv");
        }
}

static double now_s(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* After the daemon is gone: the receives come back flushed, in order. */
static void expect_flushed(struct ud *u, double deadline)
{
        int got = 0;
        while (got < NRECV) {
                struct diwarp_wc wc;
                int n = diwarp_cq_poll(u->cq, 1, &wc);
                CHECK(n >= 0, "poll: %s", strerror(-n));
                if (n == 0) {
                        CHECK(now_s() < deadline, "only %d of %d receives flushed", got, NRECV);
                        continue;
                }
                CHECK(wc.status == DIWARP_WC_WR_FLUSH_ERR, "status %d, not WR_FLUSH_ERR",
                      wc.status);
                CHECK(wc.wr_id == 100 + (uint64_t)got, "wr_id %llu, want %d",
                      (unsigned long long)wc.wr_id, 100 + got);
                got++;
        }
        CHECK(diwarp_qp_state(u->qp) == DIWARP_QPS_ERR, "QP state %d, not ERR",
              diwarp_qp_state(u->qp));
        struct diwarp_mr_info mi;
        diwarp_mr_info(u->mr, &mi);
        struct diwarp_sge sg = {(uintptr_t)u->buf, 8, mi.lkey};
        struct diwarp_recv_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        int err = diwarp_post_recv(u->qp, &wr, &bad);
        CHECK(err == -EIO, "post after the daemon died: %d, want -EIO", err);
        struct diwarp_qp_attr qa = {.qp_state = DIWARP_QPS_RESET};
        err = diwarp_qp_modify(u->qp, &qa, DIWARP_QP_STATE);
        CHECK(err == -EIO, "modify after the daemon died: %d, want -EIO", err);
}

static int run_fatal(bool events)
{
        struct ud u;
        ud_setup(&u);
        post_recvs(&u);
        printf("READY\n");
        fflush(stdout);
        double deadline = now_s() + 20;
        if (events) {
                struct pollfd p = {.fd = diwarp_async_fd(u.dev), .events = POLLIN};
                int r = poll(&p, 1, 20000);
                CHECK(r == 1, "no async event within 20 s of the daemon's death");
                struct diwarp_async_event ev;
                int err = diwarp_get_async_event(u.dev, &ev);
                CHECK(err == 0, "get_async_event: %s", strerror(-err));
                CHECK(ev.event_type == DIWARP_EVENT_DEVICE_FATAL, "event %d, not DEVICE_FATAL",
                      ev.event_type);
        }
        expect_flushed(&u, deadline);
        ud_teardown(&u);
        printf("OK fatal (%s)\n", events ? "async event" : "busy poll");
        return 0;
}

static int run_reopen(void)
{
        struct ud u;
        ud_setup(&u);
        post_recvs(&u);
        union diwarp_gid gid;
        CHECK(diwarp_device_gid(u.dev, &gid) == 0, "gid");
        struct diwarp_ah *ah;
        CHECK(diwarp_ah_create(u.pd, &gid, &ah) == 0, "ah");
        struct diwarp_mr_info mi;
        diwarp_mr_info(u.mr, &mi);
        memcpy(u.buf + 60000, "through the daemon", 19);
        struct diwarp_sge sg = {(uintptr_t)u.buf + 60000, 19, mi.lkey};
        struct diwarp_send_wr wr = {.wr_id = 9,
                                    .sg_list = &sg,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .wr.ud = {ah, diwarp_qp_num(u.qp), 7}};
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(u.qp, &wr, &bad) == 0, "post send");
        double deadline = now_s() + 10;
        bool sent = false, recvd = false;
        while (!sent || !recvd) {
                struct diwarp_wc wc;
                int n = diwarp_cq_poll(u.cq, 1, &wc);
                CHECK(n >= 0 && now_s() < deadline, "no completion (sent %d recvd %d)", sent,
                      recvd);
                if (n == 0)
                        continue;
                CHECK(wc.status == DIWARP_WC_SUCCESS, "status %d", wc.status);
                if (wc.opcode == DIWARP_WC_SEND)
                        sent = true;
                else {
                        CHECK(wc.wr_id == 100 && wc.byte_len == 19 + 40, "recv wr_id %llu len %u",
                              (unsigned long long)wc.wr_id, wc.byte_len);
                        CHECK(!memcmp(u.buf + 40, "through the daemon", 19), "payload");
                        recvd = true;
                }
        }
        CHECK(diwarp_ah_destroy(ah) == 0, "ah destroy");
        ud_teardown(&u);
        printf("OK reopen\n");
        return 0;
}

/* Sends len bytes at src (in mr_src) to a receive at dst (in mr_dst) over
 * u's own UD QP and waits for both completions; the bytes must arrive. */
static void ud_loop(struct ud *u, struct diwarp_ah *ah, uint8_t *src, struct diwarp_mr *mr_src,
                    uint8_t *dst, struct diwarp_mr *mr_dst, uint32_t len)
{
        struct diwarp_mr_info ms, md;
        diwarp_mr_info(mr_src, &ms);
        diwarp_mr_info(mr_dst, &md);
        struct diwarp_sge rs = {(uintptr_t)dst, len + 40, md.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 1, .sg_list = &rs, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        CHECK(diwarp_post_recv(u->qp, &rwr, &rbad) == 0, "post recv");
        struct diwarp_sge ss = {(uintptr_t)src, len, ms.lkey};
        struct diwarp_send_wr wr = {.wr_id = 2,
                                    .sg_list = &ss,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .wr.ud = {ah, diwarp_qp_num(u->qp), 7}};
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(u->qp, &wr, &bad) == 0, "post send");
        double deadline = now_s() + 10;
        for (int got = 0; got < 2;) {
                struct diwarp_wc wc;
                int n = diwarp_cq_poll(u->cq, 1, &wc);
                CHECK(n >= 0 && now_s() < deadline, "no completion (%d of 2)", got);
                if (n == 0)
                        continue;
                CHECK(wc.status == DIWARP_WC_SUCCESS, "wr_id %llu status %d",
                      (unsigned long long)wc.wr_id, wc.status);
                got++;
        }
        CHECK(!memcmp(dst + 40, src, len), "payload differs");
}

/* Registrations through the daemon share memory in segments, one memfd
 * each; a registration that overlaps segments merges them into one
 * (client.c, seg_share). Pages [0, 2) and [3, 5) of an area are registered,
 * then [1, 4), which joins both; every byte written before must still be
 * there, and a message moves between the parts. Deregistered in another
 * order, the pages stay the program's, and registering again works. */
static int run_merge(void)
{
        struct ud u;
        ud_setup(&u);
        const size_t pg = 4096;
        uint8_t *a = mmap(NULL, 6 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(a != MAP_FAILED, "mmap");
        for (size_t i = 0; i < 6 * pg; i++)
                a[i] = (uint8_t)(i * 7 + 3);
        struct diwarp_mr *m[3];
        const size_t at[3] = {0, 3 * pg, 1 * pg}, len[3] = {2 * pg, 2 * pg, 3 * pg};
        for (int i = 0; i < 3; i++) {
                int err = diwarp_mr_reg(u.pd, a + at[i], len[i], (uintptr_t)(a + at[i]),
                                        DIWARP_ACCESS_LOCAL_WRITE, &m[i]);
                CHECK(err == 0, "register pages [%zu, %zu): %s", at[i] / pg, (at[i] + len[i]) / pg,
                      strerror(-err));
        }
        for (size_t i = 0; i < 6 * pg; i++)
                CHECK(a[i] == (uint8_t)(i * 7 + 3), "byte %zu changed by the registrations", i);
        union diwarp_gid gid;
        CHECK(diwarp_device_gid(u.dev, &gid) == 0, "gid");
        struct diwarp_ah *ah;
        CHECK(diwarp_ah_create(u.pd, &gid, &ah) == 0, "ah");
        /* From the first registration's pages into the second's, then from
         * the merged one's middle into the first's. */
        ud_loop(&u, ah, a + 100, m[0], a + 3 * pg, m[1], 1000);
        ud_loop(&u, ah, a + 2 * pg + 10, m[2], a + pg, m[0], 2000);
        CHECK(diwarp_mr_dereg(m[2]) == 0, "dereg the merged registration");
        CHECK(diwarp_mr_dereg(m[0]) == 0, "dereg the first");
        a[5 * pg - 1] = 0x5a; /* still the program's memory */
        CHECK(diwarp_mr_dereg(m[1]) == 0, "dereg the second");
        CHECK(a[5 * pg - 1] == 0x5a && a[10] == (uint8_t)(10 * 7 + 3), "contents after dereg");
        CHECK(diwarp_mr_reg(u.pd, a, 6 * pg, (uintptr_t)a, DIWARP_ACCESS_LOCAL_WRITE, &m[0]) == 0,
              "register the whole area again");
        ud_loop(&u, ah, a + 5 * pg, m[0], a, m[0], 500);
        CHECK(diwarp_mr_dereg(m[0]) == 0, "dereg");
        CHECK(diwarp_ah_destroy(ah) == 0, "ah destroy");
        ud_teardown(&u);
        munmap(a, 6 * pg);
        printf("OK merge\n");
        return 0;
}

static int run_holder(void)
{
        struct ud u;
        ud_setup(&u);
        post_recvs(&u);
        printf("READY pid %d\n", getpid());
        fflush(stdout);
        for (;;)
                pause();
        return 0;
}

/* ---- raw protocol ------------------------------------------------------------ */

struct conn {
        int s;
        uint32_t seq;
};

static struct conn conn_open(void)
{
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        CHECK(dw_ipc_socket_path(un.sun_path, sizeof(un.sun_path)) == 0, "socket path");
        struct conn c = {.s = socket(AF_UNIX, SOCK_SEQPACKET, 0)};
        CHECK(c.s >= 0 && connect(c.s, (struct sockaddr *)&un, sizeof(un)) == 0,
              "connect to the daemon: %s", strerror(errno));
        return c;
}

/* Sends len bytes of r (as they are: the header is the caller's) and
 * returns the response's status; -ECONNRESET when the daemon hung up. */
static int raw(struct conn *c, const void *r, size_t len, const int *fds, int nfds,
               struct dw_ipc_rsp *rsp, int *fds_out, int *nout)
{
        CHECK(dw_ipc_send(c->s, r, len, fds, nfds, false) >= 0 || errno == EPIPE, "send");
        struct pollfd p = {.fd = c->s, .events = POLLIN};
        CHECK(poll(&p, 1, 5000) == 1, "no answer within 5 s");
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

static int req(struct conn *c, unsigned int op, uint32_t handle, struct dw_ipc_req *r,
               const int *fds, int nfds, struct dw_ipc_rsp *rsp, int *fds_out, int *nout)
{
        r->h.magic = DW_IPC_MAGIC;
        r->h.op = (uint16_t)op;
        r->h.len = (uint16_t)dw_ipc_req_size(op);
        r->h.seq = ++c->seq;
        r->h.handle = handle;
        return raw(c, r, r->h.len, fds, nfds, rsp, fds_out, nout);
}

/* Opens the device on c; returns the server's doorbell. */
static int open_dev(struct conn *c, struct dw_ipc_rsp *rsp)
{
        struct dw_ipc_req r = {0};
        int fds[DW_IPC_MAX_FDS], n = DW_IPC_MAX_FDS;
        r.u.open.version = DW_IPC_VERSION;
        r.u.open.pid = getpid();
        CHECK(req(c, DW_IPC_OPEN, 0, &r, NULL, 0, rsp, fds, &n) == 0 && n == 3, "open");
        close(fds[0]);
        close(fds[2]);
        return fds[1];
}

static int sealed_memfd(void *src, size_t len, bool seal)
{
        int fd = memfd_create("t", MFD_ALLOW_SEALING);
        CHECK(fd >= 0 && ftruncate(fd, (off_t)len) == 0, "memfd");
        CHECK(pwrite(fd, src, len, 0) == (ssize_t)len, "memfd write");
        if (seal)
                CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0, "seal");
        return fd;
}

static uint64_t rejected(struct dw_ipc_rsp *rsp)
{
        struct conn t = conn_open();
        struct dw_ipc_req r = {0};
        CHECK(req(&t, DW_IPC_STAT, 0, &r, NULL, 0, rsp, NULL, NULL) == 0, "stat");
        close(t.s);
        return rsp->u.stat.rejected;
}

static int run_hostile(void)
{
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        struct dw_ipc_req r;
        CHECK(rsp, "calloc");
        uint64_t rej0 = rejected(rsp);
        struct conn a = conn_open(), b = conn_open();
        close(open_dev(&a, rsp));
        int doorbell = open_dev(&b, rsp);

        /* A: a PD, a shared segment and an MR on it. */
        memset(&r, 0, sizeof(r));
        CHECK(req(&a, DW_IPC_PD_ALLOC, 0, &r, NULL, 0, rsp, NULL, NULL) == 0, "A pd");
        uint32_t a_pd = rsp->handle;
        void *page = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int fd = sealed_memfd(page, 8192, true);
        memset(&r, 0, sizeof(r));
        r.u.seg = (struct dw_ipc_seg){.base = (uintptr_t)page, .len = 8192, .id = 5};
        CHECK(req(&a, DW_IPC_SEG_ADD, 0, &r, &fd, 1, rsp, NULL, NULL) == 0, "A seg");
        close(fd);
        memset(&r, 0, sizeof(r));
        r.u.mr = (struct dw_ipc_mr_reg){.pd = a_pd,
                                        .seg = 5,
                                        .addr = (uintptr_t)page,
                                        .len = 8192,
                                        .iova = (uintptr_t)page,
                                        .access = DIWARP_ACCESS_LOCAL_WRITE};
        CHECK(req(&a, DW_IPC_MR_REG, 0, &r, NULL, 0, rsp, NULL, NULL) == 0, "A mr");
        uint32_t a_mr = rsp->handle;

        /* B names A's objects and memory: every one refused. */
        memset(&r, 0, sizeof(r));
        CHECK(req(&b, DW_IPC_PD_DEALLOC, a_pd, &r, NULL, 0, rsp, NULL, NULL) == -EINVAL,
              "B freed A's PD");
        CHECK(req(&b, DW_IPC_MR_DEREG, a_mr, &r, NULL, 0, rsp, NULL, NULL) == -EINVAL,
              "B freed A's MR");
        CHECK(req(&b, DW_IPC_PD_ALLOC, 0, &r, NULL, 0, rsp, NULL, NULL) == 0, "B pd");
        uint32_t b_pd = rsp->handle;
        r.u.mr = (struct dw_ipc_mr_reg){.pd = b_pd,
                                        .seg = 5,
                                        .addr = (uintptr_t)page,
                                        .len = 4096,
                                        .iova = 0,
                                        .access = DIWARP_ACCESS_LOCAL_WRITE};
        CHECK(req(&b, DW_IPC_MR_REG, 0, &r, NULL, 0, rsp, NULL, NULL) == -EFAULT,
              "B registered A's segment");
        /* Handles are per connection: A's MR handle names nothing of B's. */
        r.u.mr.pd = a_mr;
        r.u.mr.seg = 0;
        r.u.mr.len = 0;
        CHECK(req(&b, DW_IPC_MR_REG, 0, &r, NULL, 0, rsp, NULL, NULL) == -EINVAL,
              "B registered with a handle of A's");

        /* B: a segment that is not sealed, and one smaller than it says. */
        int bad = sealed_memfd(page, 4096, false);
        memset(&r, 0, sizeof(r));
        r.u.seg = (struct dw_ipc_seg){.base = (uintptr_t)page, .len = 4096, .id = 9};
        CHECK(req(&b, DW_IPC_SEG_ADD, 0, &r, &bad, 1, rsp, NULL, NULL) == -EINVAL,
              "unsealed segment taken");
        close(bad);
        bad = sealed_memfd(page, 4096, true);
        r.u.seg.len = 8192;
        CHECK(req(&b, DW_IPC_SEG_ADD, 0, &r, &bad, 1, rsp, NULL, NULL) == -EINVAL,
              "segment shorter than its memfd taken");
        close(bad);
        /* A region past the end of its segment. */
        r.u.seg.len = 4096;
        bad = sealed_memfd(page, 4096, true);
        CHECK(req(&b, DW_IPC_SEG_ADD, 0, &r, &bad, 1, rsp, NULL, NULL) == 0, "B seg");
        close(bad);
        r.u.mr = (struct dw_ipc_mr_reg){.pd = b_pd,
                                        .seg = 9,
                                        .addr = (uintptr_t)page,
                                        .len = 4097,
                                        .access = DIWARP_ACCESS_LOCAL_WRITE};
        CHECK(req(&b, DW_IPC_MR_REG, 0, &r, NULL, 0, rsp, NULL, NULL) == -EFAULT,
              "MR past its segment taken");

        /* Malformed messages: each refused with an answer, connection kept. */
        uint8_t junk[64];
        memset(junk, 0xa5, sizeof(junk));
        CHECK(raw(&b, junk, 3, NULL, 0, rsp, NULL, NULL) == -EPROTO, "3 bytes");
        CHECK(raw(&b, junk, sizeof(junk), NULL, 0, rsp, NULL, NULL) == -EPROTO, "bad magic");
        memset(&r, 0, sizeof(r));
        r.h = (struct dw_ipc_hdr){DW_IPC_MAGIC, 999, sizeof(r.h), 1, 0};
        CHECK(raw(&b, &r, sizeof(r.h), NULL, 0, rsp, NULL, NULL) == -EPROTO, "unknown op");
        r.h = (struct dw_ipc_hdr){DW_IPC_MAGIC, DW_IPC_QP_CREATE, 20, 2, 0};
        CHECK(raw(&b, &r, 20, NULL, 0, rsp, NULL, NULL) == -EPROTO, "short QP_CREATE");
        memset(&r, 0, sizeof(r));
        CHECK(req(&b, DW_IPC_SEG_ADD, 0, &r, NULL, 0, rsp, NULL, NULL) == -EPROTO,
              "SEG_ADD without its memfd");
        int extra = memfd_create("x", 0);
        CHECK(req(&b, DW_IPC_PD_ALLOC, 0, &r, &extra, 1, rsp, NULL, NULL) == -EPROTO,
              "a descriptor where none belongs");
        close(extra);
        r.u.qp = (struct dw_ipc_qp_create){
            .pd = b_pd, .send_cq = 77, .recv_cq = 77, .type = DIWARP_QPT_UD};
        CHECK(req(&b, DW_IPC_QP_CREATE, 0, &r, NULL, 0, rsp, NULL, NULL) == -EINVAL,
              "QP on CQs that do not exist");
        static uint8_t big[DW_IPC_MAX_MSG + 100];
        memcpy(big, &r, sizeof(r.h));
        CHECK(dw_ipc_send(b.s, big, sizeof(big), NULL, 0, false) > 0, "send big");
        memset(&r, 0, sizeof(r));
        CHECK(req(&b, DW_IPC_PD_ALLOC, 0, &r, NULL, 0, rsp, NULL, NULL) == 0,
              "B's connection did not survive a message longer than the limit");

        /* B scribbles over its send ring: the daemon drops B, not A. */
        int cfd = -1, n = 1;
        memset(&r, 0, sizeof(r));
        r.u.cq.cqe = 8;
        CHECK(req(&b, DW_IPC_CQ_CREATE, 0, &r, NULL, 0, rsp, &cfd, &n) == 0 && n == 1, "B cq");
        close(cfd);
        uint32_t b_cq = rsp->handle;
        r.u.qp = (struct dw_ipc_qp_create){
            .pd = b_pd,
            .send_cq = b_cq,
            .recv_cq = b_cq,
            .type = DIWARP_QPT_UD,
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
        int qfd = -1;
        n = 1;
        CHECK(req(&b, DW_IPC_QP_CREATE, 0, &r, NULL, 0, rsp, &qfd, &n) == 0 && n == 1, "B qp");
        struct dw_ipc_ring *sq =
            mmap(NULL, rsp->u.qp.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, qfd, 0);
        CHECK(sq != MAP_FAILED, "map B's rings");
        close(qfd);
        atomic_store(&sq->prod, 0x7fffffffu);
        uint64_t one = 1;
        CHECK(write(doorbell, &one, sizeof(one)) == sizeof(one), "doorbell");
        close(doorbell);
        struct pollfd p = {.fd = b.s, .events = POLLIN};
        CHECK(poll(&p, 1, 5000) == 1, "B not dropped within 5 s of a corrupt ring");
        char ch;
        CHECK(recv(b.s, &ch, 1, 0) == 0, "B's connection not closed");

        /* A is untouched. */
        memset(&r, 0, sizeof(r));
        CHECK(req(&a, DW_IPC_MR_DEREG, a_mr, &r, NULL, 0, rsp, NULL, NULL) == 0, "A lost its MR");
        CHECK(req(&a, DW_IPC_PD_DEALLOC, a_pd, &r, NULL, 0, rsp, NULL, NULL) == 0, "A lost its PD");
        uint64_t rej1 = rejected(rsp);
        CHECK(rej1 >= rej0 + 7, "rejected counter %llu -> %llu", (unsigned long long)rej0,
              (unsigned long long)rej1);
        printf("OK hostile (%llu requests rejected)\n", (unsigned long long)(rej1 - rej0));
        munmap(sq, 4096);
        munmap(page, 8192);
        close(a.s);
        close(b.s);
        free(rsp);
        return 0;
}

int main(int argc, char **argv)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        const char *m = argc > 1 ? argv[1] : "";
        if (!strcmp(m, "fatal"))
                return run_fatal(true);
        if (!strcmp(m, "fatal_poll"))
                return run_fatal(false);
        if (!strcmp(m, "reopen"))
                return run_reopen();
        if (!strcmp(m, "holder"))
                return run_holder();
        if (!strcmp(m, "hostile"))
                return run_hostile();
        if (!strcmp(m, "merge"))
                return run_merge();
        fprintf(stderr, "usage: daemon_fault fatal|fatal_poll|reopen|holder|hostile|merge\n");
        return 2;
}
