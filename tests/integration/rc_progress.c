/* Independent progress, multi-process: a target process registers memory,
 * hands its STag to an initiator process, then computes (a busy loop that
 * makes no diwarp call) for COMPUTE_MS while the initiator does an RDMA Write
 * and an RDMA Read of 1 MiB each against it.
 *
 *   rc_progress thread   target with DIWARP_PROGRESS=thread: the Write is
 *                        placed and the Read answered while the target
 *                        computes (timestamps well before the compute ends).
 *   rc_progress app      target without the progress thread: the Read cannot
 *                        complete and the Write is not placed until the target
 *                        calls into diwarp again (after the compute ends).
 *   rc_progress parked   as thread, but the target first busy-polls its CQ
 *                        for Sends that come HELLO_GAP_MS apart until its
 *                        thread parked and looked at it twice
 *                        (progress_park_wakes), HELLO_PHASE_MS at most;
 *                        a thread that runs wakes only for data the
 *                        target has not read first, so after STILL_HELLOS
 *                        hellos without a look the target pauses for a
 *                        hello (see hello_pause); that thread must notice
 *                        within PARKED_NOTICE_MS
 *                        that the target stopped polling. On a busy host
 *                        the device may turn shared instead (the thread
 *                        takes all progress over, progress_takeovers):
 *                        that passes too, and says so.
 *
 * CLOCK_MONOTONIC is one clock for both processes, so their timestamps
 * compare directly. Exit status: 0 pass, 1 fail. An alarm ends a hung run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "two_proc.h"

#define MIB        (1u << 20)
#define COMPUTE_MS 3000
/* thread mode: everything must be done this long before the compute ends */
#define MARGIN_MS 1000
/* parked: the receive WRs kept posted for the Sends the target polls for
 * before it computes, their spacing, and how long it polls at most */
#define HELLOS         16
#define HELLO_GAP_MS   3
#define HELLO_PHASE_MS 5000
/* hellos in a row without a look of a parked thread before the target
 * pauses (a parked thread looks every 5 ms at most: 3 hellos) */
#define STILL_HELLOS 5
/* ... and everything must be done this soon after it began to compute */
#define PARKED_NOTICE_MS 250

static uint64_t word(size_t i, uint64_t seed)
{
        return (i * 0x9e3779b97f4a7c15ull) ^ seed;
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
        for (size_t i = 0; i < len / 8; i++)
                ((uint64_t *)p)[i] = word(i, seed);
}

static bool matches(const uint8_t *p, size_t len, uint64_t seed)
{
        /* volatile: the target reads memory the progress thread writes */
        const volatile uint64_t *w = (const volatile uint64_t *)p;
        for (size_t i = 0; i < len / 8; i++)
                if (w[i] != word(i, seed))
                        return false;
        return true;
}

#define SEED_READ  0x5eadull
#define SEED_WRITE 0x3717eull

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t *buf; /* 2 MiB: [0, 1 MiB) Read source / sink, [1 MiB, 2 MiB) Write */
        uint32_t lkey, rkey;
};

struct info {
        union diwarp_gid gid;
        uint32_t qpn;
        uint64_t addr;
        uint32_t rkey;
};

static void side_open(struct side *s, struct info *me)
{
        CHECK(diwarp_device_open(NULL, &s->dev));
        CHECK(diwarp_pd_alloc(s->dev, &s->pd));
        CHECK(diwarp_cq_create(s->dev, 64, NULL, NULL, &s->cq));
        struct diwarp_qp_init_attr ia = {
            .send_cq = s->cq,
            .recv_cq = s->cq,
            .qp_type = DIWARP_QPT_RC,
            .cap = {
                .max_send_wr = 16, .max_recv_wr = HELLOS, .max_send_sge = 1, .max_recv_sge = 1}};
        CHECK(diwarp_qp_create(s->pd, &ia, &s->qp));
        s->buf = mmap(NULL, 2 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s->buf == MAP_FAILED)
                die("mmap");
        CHECK(diwarp_mr_reg(s->pd, s->buf, 2 * MIB, (uintptr_t)s->buf,
                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_READ |
                                DIWARP_ACCESS_REMOTE_WRITE,
                            &s->mr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(s->mr, &mi));
        s->lkey = mi.lkey;
        s->rkey = mi.rkey;
        memset(me, 0, sizeof(*me));
        CHECK(diwarp_device_gid(s->dev, &me->gid));
        me->qpn = diwarp_qp_num(s->qp);
        me->addr = (uintptr_t)s->buf;
        me->rkey = s->rkey;
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .qp_access_flags =
                                       DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_WRITE};
        CHECK(diwarp_qp_modify(s->qp, &a, DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS));
}

static void side_connect(struct side *s, const struct info *peer)
{
        struct diwarp_qp_attr a = {
            .qp_state = DIWARP_QPS_RTR, .dgid = peer->gid, .dest_qp_num = peer->qpn};
        CHECK(diwarp_qp_modify(s->qp, &a, DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN));
        a.qp_state = DIWARP_QPS_RTS;
        CHECK(diwarp_qp_modify(s->qp, &a, DIWARP_QP_STATE));
}

static struct diwarp_wc wait_wc(struct side *s, uint64_t deadline_us, const char *what)
{
        struct diwarp_wc wc;
        for (;;) {
                int n = diwarp_cq_poll(s->cq, 1, &wc);
                if (n < 0)
                        die("cq_poll: %s", strerror(-n));
                if (n == 1) {
                        if (wc.status != DIWARP_WC_SUCCESS)
                                die("%s: %s", what, diwarp_wc_status_str(wc.status));
                        return wc;
                }
                if (now_us() > deadline_us)
                        die("%s: no completion in time", what);
        }
}

/* Target -> initiator after the compute. */
struct report {
        uint64_t t_start, t_end;
        uint64_t t_placed;   /* Write data seen complete in memory (0: not during compute) */
        uint64_t park_wakes; /* the target's parked thread's looks before the compute */
        uint64_t takeovers;  /* ... and the times its device turned shared */
        uint64_t hellos;     /* hellos the target received */
        uint64_t pauses;     /* ... and the pauses it made for the thread */
};

/* The thread parks when it wakes (for data, or for a look: progress/
 * README.md, "The running thread's looks") and sees that the target polled
 * since. Should its looks all find the target idle (a busy host took the
 * target's core for their 2 ms), it sleeps until data wakes it, and a
 * target busy-polling on the other core may read every hello first. Once
 * the target stops polling for two hello gaps, the next hello is the
 * thread's, and the target polled before it: it parks. */
static void hello_pause(void)
{
        struct timespec ts = {0, 2 * HELLO_GAP_MS * 1000000L};
        nanosleep(&ts, NULL);
}

static void post_hello_recv(struct side *s, int i)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + MIB + 64 * (size_t)(i % HELLOS), 64, s->lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        CHECK(diwarp_post_recv(s->qp, &rwr, &rbad));
}

static int target(int rfd, int wfd, bool thread, bool parked)
{
        who = "rc_progress target";
        alarm(60); /* not inherited across fork */
        /* The configuration is read at device open. */
        setenv("DIWARP_PROGRESS", thread ? "thread" : "app", 1);
        struct side s;
        struct info me, peer;
        side_open(&s, &me);
        fill(s.buf, MIB, SEED_READ);
        for (int i = 0; i < HELLOS; i++)
                post_hello_recv(&s, i);
        xwrite(wfd, &me, sizeof(me));
        xread(rfd, &peer, sizeof(peer));
        side_connect(&s, &peer);
        /* The initiator's hello Sends: the stream is up (we drove progress,
         * busy-polling, beside the thread). Parked: until the thread parked
         * (Sends that come after we stop land in the WRs still posted,
         * ahead of the Write in the stream's order). */
        uint64_t phase_end = now_us() + HELLO_PHASE_MS * 1000ull;
        struct diwarp_counters ctr;
        uint64_t hellos = 0, pauses = 0, looks = 0;
        for (int still = 0;; hellos++) {
                wait_wc(&s, now_us() + 20000000, "hello receive");
                post_hello_recv(&s, (int)hellos);
                CHECK(diwarp_device_counters(s.dev, &ctr));
                if (!parked || ctr.progress_park_wakes >= 2 || ctr.progress_takeovers ||
                    now_us() > phase_end)
                        break;
                if (ctr.progress_park_wakes != looks) {
                        looks = ctr.progress_park_wakes;
                        still = 0;
                } else if (++still >= STILL_HELLOS) {
                        still = 0;
                        pauses++;
                        hello_pause();
                }
        }
        memset(s.buf + MIB, 0, MIB);

        struct report rep = {.t_start = now_us(),
                             .park_wakes = ctr.progress_park_wakes,
                             .takeovers = ctr.progress_takeovers,
                             .hellos = hellos + 1,
                             .pauses = pauses};
        xwrite(wfd, &rep.t_start, sizeof(rep.t_start));
        /* Compute: no diwarp call. Only looks at its own memory. */
        uint64_t end = rep.t_start + COMPUTE_MS * 1000ull;
        volatile uint64_t sink = 0;
        while (now_us() < end) {
                for (int i = 0; i < 20000; i++)
                        sink += (uint64_t)i * (uint64_t)i;
                if (!rep.t_placed && matches(s.buf + MIB, MIB, SEED_WRITE))
                        rep.t_placed = now_us();
        }
        rep.t_end = now_us();
        (void)sink;
        xwrite(wfd, &rep, sizeof(rep));

        /* Back in diwarp: drive progress until the initiator is done. */
        uint64_t deadline = now_us() + 20000000;
        for (;;) {
                struct diwarp_wc wc;
                if (diwarp_cq_poll(s.cq, 1, &wc) == 1 && wc.status != DIWARP_WC_SUCCESS)
                        die("unexpected completion: %s", diwarp_wc_status_str(wc.status));
                struct pollfd p = {.fd = rfd, .events = POLLIN};
                if (poll(&p, 1, 0) == 1)
                        break;
                if (now_us() > deadline)
                        die("initiator never finished");
        }
        char done;
        xread(rfd, &done, 1);
        char ok = matches(s.buf + MIB, MIB, SEED_WRITE);
        xwrite(wfd, &ok, 1);
        diwarp_qp_destroy(s.qp);
        diwarp_mr_dereg(s.mr);
        diwarp_cq_destroy(s.cq);
        diwarp_pd_dealloc(s.pd);
        diwarp_device_close(s.dev);
        return 0;
}

static int initiator(int rfd, int wfd, const char *mode, bool parked, pid_t child)
{
        bool thread = strcmp(mode, "app") != 0;
        struct side s;
        struct info me, peer;
        side_open(&s, &me);
        fill(s.buf + MIB, MIB, SEED_WRITE);
        xread(rfd, &peer, sizeof(peer));
        xwrite(wfd, &me, sizeof(me));
        side_connect(&s, &peer);
        struct diwarp_sge sge = {(uintptr_t)s.buf, 8, s.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarp_send_wr *bad;
        /* Parked: a Send every HELLO_GAP_MS until the target starts to
         * compute (its start time comes through the pipe). */
        for (int i = 0; i == 0 || parked; i++) {
                struct pollfd p = {.fd = rfd, .events = POLLIN};
                if (i && poll(&p, 1, HELLO_GAP_MS) == 1)
                        break;
                CHECK(diwarp_post_send(s.qp, &wr, &bad));
                wait_wc(&s, now_us() + 20000000, "hello send");
        }

        uint64_t t_start;
        xread(rfd, &t_start, sizeof(t_start));
        /* Write first, then Read: both against the computing target. */
        struct diwarp_sge wsge = {(uintptr_t)s.buf + MIB, MIB, s.lkey};
        struct diwarp_send_wr w = {.wr_id = 2,
                                   .sg_list = &wsge,
                                   .num_sge = 1,
                                   .opcode = DIWARP_WR_RDMA_WRITE,
                                   .send_flags = DIWARP_SEND_SIGNALED};
        w.wr.rdma.remote_addr = peer.addr + MIB;
        w.wr.rdma.rkey = peer.rkey;
        struct diwarp_sge rsge = {(uintptr_t)s.buf, MIB, s.lkey};
        struct diwarp_send_wr r = {.wr_id = 3,
                                   .sg_list = &rsge,
                                   .num_sge = 1,
                                   .opcode = DIWARP_WR_RDMA_READ,
                                   .send_flags = DIWARP_SEND_SIGNALED};
        r.wr.rdma.remote_addr = peer.addr;
        r.wr.rdma.rkey = peer.rkey;
        uint64_t t_post = now_us();
        CHECK(diwarp_post_send(s.qp, &w, &bad));
        CHECK(diwarp_post_send(s.qp, &r, &bad));
        uint64_t t_done[4] = {0};
        uint64_t deadline = t_start + (COMPUTE_MS + 15000) * 1000ull;
        for (int i = 0; i < 2; i++) {
                struct diwarp_wc wc = wait_wc(&s, deadline, "RDMA Write / Read");
                if (wc.wr_id != 2 && wc.wr_id != 3)
                        die("completion of wr_id %llu", (unsigned long long)wc.wr_id);
                t_done[wc.wr_id] = now_us();
        }
        if (!matches(s.buf, MIB, SEED_READ))
                die("RDMA Read returned wrong data");
        struct report rep;
        xread(rfd, &rep, sizeof(rep));
        char done = 1, ok = 0;
        xwrite(wfd, &done, 1);
        xread(rfd, &ok, 1);
        int st = 0;
        waitpid(child, &st, 0);
        child_pid = 0;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                die("target failed (status %#x)", st);
        if (!ok)
                die("the Write's data is not in the target's memory");

#define REL(t) ((t) ? (long long)((int64_t)(t) - (int64_t)rep.t_start) / 1000 : -1ll)
        printf("%s: target computes [0, %lld] ms; posted at %lld ms; Write completed %lld ms, "
               "placed %lld ms (-1: not during the compute); Read completed %lld ms; before, "
               "the target's parked thread looked %llu times and its device turned shared "
               "%llu times (%llu hellos, %llu pauses)\n",
               mode, REL(rep.t_end), REL(t_post), REL(t_done[2]), REL(rep.t_placed), REL(t_done[3]),
               (unsigned long long)rep.park_wakes, (unsigned long long)rep.takeovers,
               (unsigned long long)rep.hellos, (unsigned long long)rep.pauses);
        if (parked && rep.park_wakes < 2 && !rep.takeovers)
                die("the target's progress thread neither parked (looked at the application "
                    "twice) nor took over while the target busy-polled for %d ms (%llu hellos, "
                    "%llu pauses for the thread)",
                    HELLO_PHASE_MS, (unsigned long long)rep.hellos, (unsigned long long)rep.pauses);
        if (parked && rep.park_wakes < 2)
                printf("%s: busy host: the device turned shared before the thread parked; "
                       "the shared path served the compute\n",
                       mode);
        uint64_t limit = rep.t_end - MARGIN_MS * 1000ull;
        if (rep.t_end - rep.t_start < COMPUTE_MS * 1000ull)
                die("the target computed less than %d ms", COMPUTE_MS);
        if (parked) {
                /* A parked thread looks once per park interval (1 ms, or
                 * the scheduler tick while no CQ is armed: 4 ms at HZ=250)
                 * and unparks at its second look after the stop: it must
                 * notice the stop soon. */
                limit = rep.t_start + PARKED_NOTICE_MS * 1000ull;
        }
        if (thread) {
                /* The progress thread placed and answered while the target
                 * computed, with a margin of a second (parked: within
                 * PARKED_NOTICE_MS of the start). */
                if (!t_done[3] || t_done[3] > limit)
                        die("RDMA Read completed at %lld ms, not during the compute",
                            REL(t_done[3]));
                if (!t_done[2] || t_done[2] > limit)
                        die("RDMA Write completed at %lld ms, not during the compute",
                            REL(t_done[2]));
                if (!rep.t_placed || rep.t_placed > limit)
                        die("the Write was not placed during the compute (%lld ms)",
                            REL(rep.t_placed));
        } else {
                /* Nobody ran the target's engine: the Read Response cannot
                 * exist before the target called into diwarp again, nor can
                 * the Write's data be in its memory. (The Write itself may
                 * complete: iWARP completes it when TCP took the data.) */
                if (t_done[3] < rep.t_end)
                        die("RDMA Read completed at %lld ms, while the target computed",
                            REL(t_done[3]));
                if (rep.t_placed)
                        die("the Write was placed during the compute without a progress thread");
        }
        printf("%s: ok\n", mode);
        return 0;
}

int main(int argc, char **argv)
{
        who = "rc_progress";
        if (argc != 2 ||
            (strcmp(argv[1], "thread") && strcmp(argv[1], "app") && strcmp(argv[1], "parked"))) {
                fprintf(stderr, "usage: %s thread|app|parked\n", argv[0]);
                return 2;
        }
        bool thread = strcmp(argv[1], "app") != 0;
        bool parked = strcmp(argv[1], "parked") == 0;
        alarm(60);
        int t2i[2], i2t[2];
        if (pipe(t2i) || pipe(i2t))
                die("pipe");
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid == 0) {
                close(t2i[0]);
                close(i2t[1]);
                _exit(target(i2t[0], t2i[1], thread, parked));
        }
        child_pid = pid;
        close(t2i[1]);
        close(i2t[0]);
        setenv("DIWARP_PROGRESS", "app", 1);
        int r = initiator(t2i[0], i2t[1], argv[1], parked, pid);
        return r;
}
