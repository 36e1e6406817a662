/* bench-overlap: verbs-level communication/computation overlap and independent
 * progress (bench/README.md, "Metrics"), RC, RDMA Read (or Write) of --size bytes.
 *
 *   server (target):    bench-overlap [--port P] [--cpu C]
 *   client (initiator): bench-overlap --mode progress|overlap [--op read|write]
 *                       [--size B] [--reps R] [--block] [--cpu C] HOST
 *
 * progress (target side): the target computes for D microseconds and
 *     makes no diwarp call while the initiator's operation is in flight.
 *     t0 = completion time with D = 0; D = 10 * t0; ratio = t(D) / t0. With
 *     independent progress (DIWARP_PROGRESS=thread) ratio stays near 1; with
 *     application-driven progress it is about (D + t0) / t0 = 11.
 * overlap (initiator side): the initiator posts the operation, computes c,
 *     then waits for the completion: l(c). l0 = l(0); c grows by 0.1 * l0 until
 *     l(c) >= 1.1 * l0; overlap = (c - (l(c) - l0)) / l0 at the largest c with
 *     l(c) < 1.1 * l0 (at c = 0.1 * l0 when there is none). 1 = all of the
 *     transfer hides behind computation, 0 = none.
 * Each time is the median of --reps trials. "Compute" is a loop reading the
 * clock: no diwarp call. --block waits on the completion channel instead of
 * spinning (use it with DIWARP_PROGRESS=thread so the progress threads get a
 * core); --cpu pins the main thread after the device is open, so a progress
 * thread keeps the process's launch affinity.
 */
#include <endian.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bcommon.h"

enum { M_PROGRESS = 0, M_OVERLAP = 1 };
static const char *const modes[] = {"progress", "overlap", NULL};
enum { CMD_SERVE = 1, CMD_COMPUTE = 2, CMD_END = 3 };

static struct bc_ctx c;
static volatile double sink;

static void compute(uint64_t ns)
{
        uint64_t end = bc_now_ns() + ns;
        double x = 1.0;
        while (bc_now_ns() < end)
                x = x * 1.0000001 + 1e-9;
        sink = x;
}

static int cmp_u64(const void *a, const void *b)
{
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return (x > y) - (x < y);
}

/* ---- target -------------------------------------------------------------------- */

static bool thread_mode(void)
{
        const char *p = getenv("DIWARP_PROGRESS");
        return p && !strcmp(p, "thread");
}

/* Serves until the next command arrives on the side channel. */
static bool serve_until_cmd(uint64_t cmd[2])
{
        if (thread_mode())
                return bc_read_all(c.oob, cmd, 16) == 0;
        struct pollfd p = {.fd = c.oob, .events = POLLIN};
        for (unsigned spin = 0;; spin++) {
                if (diwarp_progress(c.dev, 64) < 0)
                        return false;
                if ((spin & 63) == 0 && poll(&p, 1, 0) == 1)
                        return bc_read_all(c.oob, cmd, 16) == 0;
        }
}

static bool target(void)
{
        uint64_t cmd[2];
        if (!serve_until_cmd(cmd))
                return false;
        for (;;) {
                uint64_t op = be64toh(cmd[0]), ns = be64toh(cmd[1]);
                if (op == CMD_END)
                        return true;
                uint8_t ack = 1;
                if (bc_write_all(c.oob, &ack, 1) < 0)
                        return false;
                if (op == CMD_COMPUTE)
                        compute(ns);
                if (!serve_until_cmd(cmd))
                        return false;
        }
}

/* ---- initiator ----------------------------------------------------------------- */

static int command(uint64_t op, uint64_t ns)
{
        uint64_t cmd[2] = {htobe64(op), htobe64(ns)};
        uint8_t ack;
        if (bc_write_all(c.oob, cmd, 16) < 0)
                return -1;
        return op == CMD_END ? 0 : bc_read_all(c.oob, &ack, 1);
}

/* One operation: the target computes target_ns, we compute local_ns between
 * post and wait. Returns the post-to-completion time in ns, 0 on failure. */
static uint64_t trial(uint64_t target_ns, uint64_t local_ns)
{
        if (command(target_ns ? CMD_COMPUTE : CMD_SERVE, target_ns))
                return 0;
        uint32_t len = (uint32_t)c.o.size;
        uint8_t *local = c.buf + c.o.size;
        uint64_t t0 = bc_now_ns();
        int e = bc_post_rdma(&c, 0, 1, c.o.op == 0, local, len, 0);
        if (e) {
                if (e == -95)
                        c.unsupported = true;
                fprintf(stderr, "post: %d\n", e);
                return 0;
        }
        if (local_ns)
                compute(local_ns);
        struct diwarp_wc wc;
        int r = bc_poll(&c, &wc, 1);
        uint64_t t = bc_now_ns() - t0;
        if (r != 1 || wc.status != DIWARP_WC_SUCCESS) {
                fprintf(stderr, "operation failed: %s\n",
                        r == 1 ? diwarp_wc_status_str(wc.status) : "no completion");
                return 0;
        }
        return t ? t : 1;
}

static uint64_t median_trial(uint64_t target_ns, uint64_t local_ns)
{
        uint64_t *v = calloc(c.o.reps, sizeof(uint64_t)), m = 0;
        if (!v)
                return 0;
        for (uint32_t i = 0; i < c.o.reps; i++)
                if (!(v[i] = trial(target_ns, local_ns)))
                        goto out;
        qsort(v, c.o.reps, sizeof(uint64_t), cmp_u64);
        m = v[c.o.reps / 2];
out:
        free(v);
        return m;
}

int main(int argc, char **argv)
{
        struct bc_opts o;
        bc_parse(argc, argv, &o, "bench-overlap", modes);
        /* RDMA needs RC (or, once the API names a peer for it, RD): UD, the
         * parser's default, means "not given" here */
        if (o.transport == BC_UD)
                o.transport = BC_RC;
        uint64_t t0 = 0, td = 0, d = 0, l0 = 0, cm = 0, lm = 0;
        double ratio = 0, overlap = 0;
        bool ok = bc_oob_open(&c, &o) == 0;
        if (ok) {
                ok = bc_setup(&c, 1, 2 * (c.o.size ? c.o.size : 1), 16, 4) == 0;
                if (ok && c.server) {
                        ok = target();
                } else if (ok && c.o.mode == M_PROGRESS) {
                        /* warm-up: connection, first-touch of the socket buffers */
                        ok = trial(0, 0) && (t0 = median_trial(0, 0));
                        d = 10 * t0;
                        ok = ok && (td = median_trial(d, 0));
                        ratio = t0 ? (double)td / (double)t0 : 0;
                        ok = command(CMD_END, 0) == 0 && ok;
                } else if (ok) {
                        ok = trial(0, 0) && (l0 = median_trial(0, 0));
                        uint64_t best_c = 0, best_l = 0;
                        for (unsigned m = 1; ok && m <= 30; m++) {
                                uint64_t cc = l0 * m / 10, l = median_trial(0, cc);
                                ok = l != 0;
                                if (!ok || l >= l0 + l0 / 10) {
                                        if (m == 1)
                                                best_c = cc, best_l = l;
                                        break;
                                }
                                best_c = cc, best_l = l;
                        }
                        cm = best_c, lm = best_l;
                        overlap = l0 ? ((double)cm - ((double)lm - (double)l0)) / (double)l0 : 0;
                        ok = command(CMD_END, 0) == 0 && ok;
                }
                ok = bc_finish(&c, ok);
        }
        o = c.o;
        const char *st = c.unsupported ? "unsupported" : ok ? "ok" : "fail";
        bc_teardown(&c);
        const char *op = o.op == 0 ? "read" : "write";
        if (o.mode == M_PROGRESS)
                printf("RESULT mode=progress op=%s size=%llu reps=%u status=%s t0_us=%.1f "
                       "tD_us=%.1f D_us=%.1f ratio=%.4f\n",
                       op, (unsigned long long)o.size, o.reps, st, (double)t0 / 1e3,
                       (double)td / 1e3, (double)d / 1e3, ratio);
        else
                printf("RESULT mode=overlap op=%s size=%llu reps=%u status=%s l0_us=%.1f "
                       "c_us=%.1f l_us=%.1f overlap=%.4f\n",
                       op, (unsigned long long)o.size, o.reps, st, (double)l0 / 1e3,
                       (double)cm / 1e3, (double)lm / 1e3, overlap);
        return c.unsupported ? BC_EXIT_UNSUPP : ok ? 0 : 1;
}
