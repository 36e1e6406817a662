/* bench-credits: the credit-based mailbox receive ring under load, on RD QPs:
 * all-to-all traffic among many endpoints, all or only some of them sending.
 *
 *   bench-credits [--procs K] [--eps P] [--msgs M] [--size B] [--rq R]
 *                 [--active A] [--dests D] [--timeout-ms MS]
 *
 * P endpoints (RD QPs, with their own receive queues) spread over K
 * processes (one device each, 1..16). Each of the first A endpoints (the
 * active senders; default all) sends M messages of B bytes to each of the D
 * endpoints after it (default: every other one), round robin; every endpoint keeps R
 * receive WRs posted and reposts each one as its completion is polled. With
 * R large enough for everything (R >= M * A) nothing ever waits for a
 * receive: the unbounded ring the overhead is measured against. With a small
 * R the messages that come early wait: parked in the mailbox with credits,
 * refused with RNR NAKs without (DIWARP_CREDIT=off).
 *
 * Every received message is checked (sender, sequence per sender, bytes).
 * The parent prints one line:
 *   RESULT eps=P procs=K msgs=M size=B rq=R active=A dests=D ms=T rate=MSG_PER_S
 *          rnr=.. retx=.. parked=.. credit_msgs=.. credit_stalls=.. probes=..
 *          tx_packets=.. rx_dropped=.. dups=.. rtos=.. loss_cuts=..
 * the counters summed over every device (dups: datagrams the receivers
 * already held, so every resend they count was needless; rtos and
 * loss_cuts: congestion-window collapses and loss cuts).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#define QKEY     0x11c0ffeeu
#define MAX_EPS  512
#define MAX_PROC 16
#define SQ_DEPTH 64

struct shared {
        uint32_t qpn[MAX_EPS];
        union diwarp_gid gid[MAX_PROC];
        volatile int ready, go, done, failed;
        uint64_t start_ns, end_ns[MAX_PROC];
        struct diwarp_counters ctr[MAX_PROC];
};

static struct {
        uint32_t procs, eps, msgs, size, rq, active, dests, timeout_ms;
} o = {2, 16, 200, 2048, 4, 0, 0, 60000};

static uint64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(void)
{
        fprintf(stderr, "usage: bench-credits [--procs K] [--eps P] [--msgs M] [--size B] "
                        "[--rq R] [--active A] [--dests D] [--timeout-ms MS]\n");
        exit(2);
}

/* Endpoint e lives in process e % K. */
static uint32_t proc_of(uint32_t e)
{
        return e % o.procs;
}

#define FAIL(...)                                                                                  \
        do {                                                                                       \
                fprintf(stderr, "bench-credits[%u]: ", me);                                        \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fprintf(stderr, "\n");                                                             \
                sh->failed = 1;                                                                    \
                return 1;                                                                          \
        } while (0)

/* Message header: sender endpoint, its sequence number towards us. */
struct msg_hdr {
        uint32_t src, seq;
};

static uint8_t pattern(uint32_t src, uint32_t seq, uint32_t i)
{
        return (uint8_t)(src * 131 + seq * 7 + i);
}

/* Each process on a CPU of its own among those allowed (busy pollers that
 * share a core measure the scheduler). */
static void pin_self(uint32_t me)
{
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof(set), &set))
                return;
        int n = CPU_COUNT(&set), k = (int)(me % (uint32_t)(n ? n : 1));
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
                if (CPU_ISSET(cpu, &set) && k-- == 0) {
                        CPU_ZERO(&set);
                        CPU_SET(cpu, &set);
                        sched_setaffinity(0, sizeof(set), &set);
                        return;
                }
}

static int run_proc(struct shared *sh, uint32_t me)
{
        pin_self(me);
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_mr *mr;
        int e;
        uint32_t mine[MAX_EPS], n = 0;
        for (uint32_t ep = 0; ep < o.eps; ep++)
                if (proc_of(ep) == me)
                        mine[n++] = ep;
        if ((e = diwarp_device_open(NULL, &dev)))
                FAIL("device open: %s", strerror(-e));
        if ((e = diwarp_pd_alloc(dev, &pd)))
                FAIL("PD: %s", strerror(-e));
        if ((e = diwarp_cq_create(dev, (int)(n * (SQ_DEPTH + o.rq) + 64), NULL, NULL, &cq)))
                FAIL("CQ: %s", strerror(-e));
        size_t slot = o.size < sizeof(struct msg_hdr) ? sizeof(struct msg_hdr) : o.size;
        size_t len = (size_t)n * (o.rq + SQ_DEPTH) * slot;
        uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED)
                FAIL("buffer: %s", strerror(errno));
        if ((e = diwarp_mr_reg(pd, buf, len, (uintptr_t)buf, DIWARP_ACCESS_LOCAL_WRITE, &mr)))
                FAIL("MR: %s", strerror(-e));
        struct diwarp_mr_info mi;
        diwarp_mr_info(mr, &mi);
        struct diwarp_qp *qp[MAX_EPS];
        for (uint32_t i = 0; i < n; i++) {
                struct diwarp_qp_init_attr ia = {
                    .send_cq = cq,
                    .recv_cq = cq,
                    .qp_type = DIWARP_QPT_RD,
                    /* Room for WRs completed behind an older one of
                     * another peer, which leave the ring later. */
                    .cap = {.max_send_wr = SQ_DEPTH,
                            .max_recv_wr = o.rq + 256,
                            .max_send_sge = 1,
                            .max_recv_sge = 1},
                };
                if ((e = diwarpdv_create_qp(pd, &ia, &qp[i])))
                        FAIL("QP: %s", strerror(-e));
                struct diwarp_qp_attr a = {
                    .qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .port_num = 1};
                if ((e = diwarp_qp_modify(qp[i], &a,
                                          DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                              DIWARP_QP_QKEY)))
                        FAIL("INIT: %s", strerror(-e));
                a.qp_state = DIWARP_QPS_RTR;
                if ((e = diwarp_qp_modify(qp[i], &a, DIWARP_QP_STATE)))
                        FAIL("RTR: %s", strerror(-e));
                a.qp_state = DIWARP_QPS_RTS;
                if ((e = diwarp_qp_modify(qp[i], &a, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN)))
                        FAIL("RTS: %s", strerror(-e));
                sh->qpn[mine[i]] = diwarp_qp_num(qp[i]);
        }
        /* Receive slots [0, rq) and send slots [rq, rq + SQ_DEPTH) per local endpoint. */
#define RSLOT(i, k) (buf + ((size_t)(i) * (o.rq + SQ_DEPTH) + (k)) * slot)
        for (uint32_t i = 0; i < n; i++)
                for (uint32_t k = 0; k < o.rq; k++) {
                        struct diwarp_sge sge = {(uintptr_t)RSLOT(i, k), (uint32_t)slot, mi.lkey};
                        struct diwarp_recv_wr wr = {.wr_id = (uint64_t)i << 32 | k,
                                                    .sg_list = &sge,
                                                    .num_sge = 1},
                                              *bad;
                        if ((e = diwarp_post_recv(qp[i], &wr, &bad)))
                                FAIL("post recv: %s", strerror(-e));
                }
        diwarp_device_gid(dev, &sh->gid[me]);
        struct diwarp_ah *ah[MAX_PROC];
        __atomic_add_fetch(&sh->ready, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) < (int)o.procs)
                if (sh->failed)
                        return 1;
        for (uint32_t p = 0; p < o.procs; p++)
                if ((e = diwarp_ah_create(pd, &sh->gid[p], &ah[p])))
                        FAIL("AH: %s", strerror(-e));

        /* Per local endpoint: next destination index and sequence numbers. */
        uint32_t *next_seq = calloc((size_t)n * o.eps, sizeof(uint32_t));
        uint32_t *want_seq = calloc((size_t)n * o.eps, sizeof(uint32_t));
        uint32_t sent[MAX_EPS] = {0}, inflight[MAX_EPS] = {0}, sq_next[MAX_EPS] = {0};
        uint64_t to_recv = 0, recvd = 0, to_send = 0, sends_done = 0;
        if (!next_seq || !want_seq)
                FAIL("tables: out of memory");
        for (uint32_t i = 0; i < n; i++) {
                if (mine[i] < o.active)
                        to_send += (uint64_t)o.msgs * o.dests;
                for (uint32_t src = 0; src < o.active; src++) {
                        uint32_t d = (mine[i] + o.eps - src) % o.eps;
                        if (d >= 1 && d <= o.dests)
                                to_recv += o.msgs;
                }
        }
        while (!__atomic_load_n(&sh->go, __ATOMIC_SEQ_CST))
                if (sh->failed)
                        return 1;
        uint64_t deadline = now_ns() + (uint64_t)o.timeout_ms * 1000000ull;
        uint32_t total_per_ep = o.msgs * o.dests;
        struct diwarp_wc wc[32];
        while (recvd < to_recv || sends_done < to_send) {
                for (uint32_t i = 0; i < n; i++) {
                        uint32_t src = mine[i];
                        while (src < o.active && sent[i] < total_per_ep && inflight[i] < SQ_DEPTH) {
                                /* Round robin over the next `dests` endpoints. */
                                uint32_t dst = (src + 1 + sent[i] % o.dests) % o.eps;
                                uint32_t seq = next_seq[(size_t)i * o.eps + dst]++;
                                uint8_t *m = RSLOT(i, o.rq + sq_next[i]);
                                sq_next[i] = (sq_next[i] + 1) % SQ_DEPTH;
                                struct msg_hdr h = {src, seq};
                                memcpy(m, &h, sizeof(h));
                                for (uint32_t b = sizeof(h); b < o.size; b++)
                                        m[b] = pattern(src, seq, b);
                                struct diwarp_sge sge = {(uintptr_t)m, o.size, mi.lkey};
                                struct diwarp_send_wr wr = {.wr_id = (uint64_t)i << 32,
                                                            .sg_list = &sge,
                                                            .num_sge = 1,
                                                            .opcode = DIWARP_WR_SEND,
                                                            .send_flags = DIWARP_SEND_SIGNALED},
                                                      *bad;
                                wr.wr.ud.ah = ah[proc_of(dst)];
                                wr.wr.ud.remote_qpn = sh->qpn[dst];
                                wr.wr.ud.remote_qkey = QKEY;
                                if ((e = diwarp_post_send(qp[i], &wr, &bad)))
                                        FAIL("post send: %s", strerror(-e));
                                sent[i]++;
                                inflight[i]++;
                        }
                }
                int got = diwarp_cq_poll(cq, 32, wc);
                if (got < 0)
                        FAIL("poll: %s", strerror(-got));
                for (int w = 0; w < got; w++) {
                        uint32_t i = (uint32_t)(wc[w].wr_id >> 32), k = (uint32_t)wc[w].wr_id;
                        if (wc[w].status != DIWARP_WC_SUCCESS)
                                FAIL("endpoint %u: %s", mine[i],
                                     diwarp_wc_status_str(wc[w].status));
                        if (wc[w].opcode == DIWARP_WC_SEND) {
                                inflight[i]--;
                                sends_done++;
                                continue;
                        }
                        const uint8_t *m = RSLOT(i, k);
                        struct msg_hdr h;
                        memcpy(&h, m, sizeof(h));
                        if (h.src >= o.active || wc[w].byte_len != o.size ||
                            h.seq != want_seq[(size_t)i * o.eps + h.src])
                                FAIL("endpoint %u: message %u from %u (want %u), %u bytes", mine[i],
                                     h.seq, h.src,
                                     h.src < o.eps ? want_seq[(size_t)i * o.eps + h.src] : 0,
                                     wc[w].byte_len);
                        for (uint32_t b = sizeof(h); b < o.size; b++)
                                if (m[b] != pattern(h.src, h.seq, b))
                                        FAIL("endpoint %u: message %u from %u: byte %u", mine[i],
                                             h.seq, h.src, b);
                        want_seq[(size_t)i * o.eps + h.src]++;
                        recvd++;
                        struct diwarp_sge sge = {(uintptr_t)m, (uint32_t)slot, mi.lkey};
                        struct diwarp_recv_wr wr = {.wr_id = wc[w].wr_id,
                                                    .sg_list = &sge,
                                                    .num_sge = 1},
                                              *bad;
                        if ((e = diwarp_post_recv(qp[i], &wr, &bad)))
                                FAIL("repost: %s", strerror(-e));
                }
                if (now_ns() > deadline)
                        FAIL("timeout: %llu/%llu received, %llu/%llu sends done",
                             (unsigned long long)recvd, (unsigned long long)to_recv,
                             (unsigned long long)sends_done, (unsigned long long)to_send);
        }
        sh->end_ns[me] = now_ns();
        __atomic_add_fetch(&sh->done, 1, __ATOMIC_SEQ_CST);
        /* Stay until everyone is done: our ACKs and credits are what they wait for. */
        while (__atomic_load_n(&sh->done, __ATOMIC_SEQ_CST) < (int)o.procs && !sh->failed)
                diwarp_cq_poll(cq, 32, wc);
        diwarp_device_counters(dev, &sh->ctr[me]);
        for (uint32_t i = 0; i < n; i++)
                diwarp_qp_destroy(qp[i]);
        for (uint32_t p = 0; p < o.procs; p++)
                diwarp_ah_destroy(ah[p]);
        diwarp_mr_dereg(mr);
        diwarp_cq_destroy(cq);
        diwarp_pd_dealloc(pd);
        diwarp_device_close(dev);
        free(next_seq);
        free(want_seq);
        return 0;
}

int main(int argc, char **argv)
{
        static const struct option lo[] = {{"procs", required_argument, NULL, 'k'},
                                           {"eps", required_argument, NULL, 'p'},
                                           {"msgs", required_argument, NULL, 'm'},
                                           {"size", required_argument, NULL, 's'},
                                           {"rq", required_argument, NULL, 'r'},
                                           {"active", required_argument, NULL, 'a'},
                                           {"dests", required_argument, NULL, 'd'},
                                           {"timeout-ms", required_argument, NULL, 't'},
                                           {NULL, 0, NULL, 0}};
        int c;
        while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
                char *end;
                unsigned long v = optarg ? strtoul(optarg, &end, 10) : 0;
                if (!optarg || *end || v > 100000000)
                        usage();
                switch (c) {
                case 'k':
                        o.procs = (uint32_t)v;
                        break;
                case 'p':
                        o.eps = (uint32_t)v;
                        break;
                case 'm':
                        o.msgs = (uint32_t)v;
                        break;
                case 's':
                        o.size = (uint32_t)v;
                        break;
                case 'r':
                        o.rq = (uint32_t)v;
                        break;
                case 'a':
                        o.active = (uint32_t)v;
                        break;
                case 'd':
                        o.dests = (uint32_t)v;
                        break;
                case 't':
                        o.timeout_ms = (uint32_t)v;
                        break;
                default:
                        usage();
                }
        }
        if (!o.active)
                o.active = o.eps;
        if (!o.dests || o.dests >= o.eps)
                o.dests = o.eps - 1;
        if (o.procs < 1 || o.procs > MAX_PROC || o.eps < 2 || o.eps > MAX_EPS || o.eps < o.procs ||
            !o.msgs || !o.rq || o.active > o.eps || o.size < sizeof(struct msg_hdr)) {
                fprintf(stderr, "bench-credits: 1 <= procs <= 16, procs <= eps in 2..512, msgs, rq "
                                "> 0, active <= eps, size >= 8\n");
                return 2;
        }
        struct shared *sh =
            mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (sh == MAP_FAILED)
                return 1;
        memset(sh, 0, sizeof(*sh));
        pid_t pid[MAX_PROC];
        for (uint32_t p = 0; p < o.procs; p++) {
                pid[p] = fork();
                if (pid[p] == 0)
                        _exit(run_proc(sh, p));
        }
        uint64_t lim = now_ns() + (uint64_t)o.timeout_ms * 1000000ull;
        while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) < (int)o.procs && !sh->failed &&
               now_ns() < lim)
                usleep(1000);
        usleep(20000); /* every process sees every AH */
        sh->start_ns = now_ns();
        __atomic_store_n(&sh->go, 1, __ATOMIC_SEQ_CST);
        int ok = 1;
        for (uint32_t p = 0; p < o.procs; p++) {
                int st;
                waitpid(pid[p], &st, 0);
                if (!WIFEXITED(st) || WEXITSTATUS(st))
                        ok = 0;
        }
        if (!ok || sh->failed) {
                fprintf(stderr, "bench-credits: failed\n");
                return 1;
        }
        uint64_t end = 0;
        struct diwarp_counters t = {0};
        for (uint32_t p = 0; p < o.procs; p++) {
                if (sh->end_ns[p] > end)
                        end = sh->end_ns[p];
                t.rnr_naks += sh->ctr[p].rnr_naks;
                t.retransmits += sh->ctr[p].retransmits;
                t.mbox_parked += sh->ctr[p].mbox_parked;
                t.credit_msgs += sh->ctr[p].credit_msgs;
                t.credit_stalls += sh->ctr[p].credit_stalls;
                t.credit_probes += sh->ctr[p].credit_probes;
                t.tx_packets += sh->ctr[p].tx_packets;
                t.rx_dropped_no_recv += sh->ctr[p].rx_dropped_no_recv;
                t.rx_dropped_duplicate += sh->ctr[p].rx_dropped_duplicate;
                t.cc_rto += sh->ctr[p].cc_rto;
                t.cc_decrease_loss += sh->ctr[p].cc_decrease_loss;
        }
        double ms = (double)(end - sh->start_ns) / 1e6;
        uint64_t total = (uint64_t)o.active * o.dests * o.msgs;
        printf("RESULT eps=%u procs=%u msgs=%u size=%u rq=%u active=%u dests=%u ms=%.2f rate=%.0f "
               "rnr=%llu retx=%llu parked=%llu credit_msgs=%llu credit_stalls=%llu probes=%llu "
               "tx_packets=%llu rx_dropped=%llu dups=%llu rtos=%llu loss_cuts=%llu\n",
               o.eps, o.procs, o.msgs, o.size, o.rq, o.active, o.dests, ms,
               (double)total / (ms / 1e3), (unsigned long long)t.rnr_naks,
               (unsigned long long)t.retransmits, (unsigned long long)t.mbox_parked,
               (unsigned long long)t.credit_msgs, (unsigned long long)t.credit_stalls,
               (unsigned long long)t.credit_probes, (unsigned long long)t.tx_packets,
               (unsigned long long)t.rx_dropped_no_recv, (unsigned long long)t.rx_dropped_duplicate,
               (unsigned long long)t.cc_rto, (unsigned long long)t.cc_decrease_loss);
        return 0;
}
