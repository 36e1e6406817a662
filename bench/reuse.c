/* bench-reuse: effect of buffer reuse on latency, at verbs level.
 *
 *   server: bench-reuse [--port P]
 *   client: bench-reuse [--transport ud|rc] [--size B] [--iters N] [--pool BYTES] HOST
 *
 * Send ping-pong (as diwarp-pingpong) where iteration k sends from and
 * receives into buffer j(k) of a pool of registered buffers (pool bytes per
 * pool, at least 2 buffers):
 *   full reuse (100%): j = 0;  half (50%): j = (k/2) mod n;  none (0%): j = k mod n.
 * The three patterns run one after the other on one connection, iters each
 * (the first tenth untimed). Every buffer is registered once and touched
 * before the run, so what differs is cache and TLB locality only.
 *   RESULT ... lat_full_us=.. lat_half_us=.. lat_none_us=.. ratio=none/full
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bcommon.h"

enum { T_RECV = 1, T_SEND = 2 };
static struct bc_ctx c;
static uint8_t *spool, *rpool;
static size_t rslot;
static uint64_t nbuf;

static uint64_t pick(int pattern, uint64_t k)
{
        return pattern == 0 ? 0 : pattern == 1 ? (k / 2) % nbuf : k % nbuf;
}

static int post_recv_k(int pattern, uint64_t k)
{
        uint64_t j = pick(pattern, k);
        return bc_post_recv(&c, 0, BC_WR(T_RECV, 0, j), rpool + j * rslot, (uint32_t)rslot);
}

static int wait_recv(void)
{
        struct diwarp_wc wc;
        for (;;) {
                int r = bc_poll(&c, &wc, 1);
                if (r <= 0) {
                        fprintf(stderr, "%s: timeout waiting for a message\n",
                                c.server ? "server" : "client");
                        return -1;
                }
                if (wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "completion: %s\n", diwarp_wc_status_str(wc.status));
                        return -1;
                }
                if (BC_WR_TYPE(wc.wr_id) == T_RECV)
                        return 0;
        }
}

static bool phase(int pattern, double *lat_us)
{
        uint64_t n = c.o.iters + (c.o.iters / 10 ? c.o.iters / 10 : 1);
        uint64_t warm = n - c.o.iters;
        uint32_t len = (uint32_t)c.o.size;
        for (uint64_t k = 0; k < 2 && k < n; k++)
                if (post_recv_k(pattern, k))
                        return false;
        if (bc_sync(&c))
                return false;
        uint64_t t0 = 0;
        for (uint64_t k = 0; k < n; k++) {
                if (k == warm)
                        t0 = bc_now_ns();
                uint8_t *sb = spool + pick(pattern, k) * (c.o.size ? c.o.size : 1);
                if (!c.server &&
                    bc_post_send(&c, 0, BC_WR(T_SEND, 0, 0), sb, len, DIWARP_SEND_SIGNALED))
                        return false;
                if (wait_recv())
                        return false;
                /* the next receive but one: no receive is left over at the end */
                if (k + 2 < n && post_recv_k(pattern, k + 2))
                        return false;
                if (c.server &&
                    bc_post_send(&c, 0, BC_WR(T_SEND, 0, 0), sb, len, DIWARP_SEND_SIGNALED))
                        return false;
        }
        *lat_us = (double)(bc_now_ns() - t0) / 1e3 / (double)c.o.iters / 2.0;
        return bc_sync(&c) == 0;
}

int main(int argc, char **argv)
{
        struct bc_opts o;
        bc_parse(argc, argv, &o, "bench-reuse", NULL);
        double lat[3] = {0, 0, 0};
        bool ok = bc_oob_open(&c, &o) == 0;
        if (ok) {
                uint64_t pool = c.o.pool ? c.o.pool : 64ull << 20;
                size_t sslot = c.o.size ? c.o.size : 1;
                rslot = c.o.size + bc_hdr(&c);
                nbuf = pool / sslot;
                if (nbuf < 2)
                        nbuf = 2;
                if (nbuf > 65536)
                        nbuf = 65536;
                size_t len = nbuf * sslot + nbuf * rslot;
                ok = bc_setup(&c, 1, len, 64, 8) == 0;
                if (ok) {
                        spool = c.buf;
                        rpool = c.buf + nbuf * sslot;
                        for (int p = 0; p < 3 && ok; p++)
                                ok = phase(p, &lat[p]);
                }
                ok = bc_finish(&c, ok);
        }
        o = c.o;
        const char *st = c.unsupported ? "unsupported" : ok ? "ok" : "fail";
        bc_teardown(&c);
        printf("RESULT transport=%s size=%llu iters=%llu buffers=%llu status=%s lat_full_us=%.3f "
               "lat_half_us=%.3f lat_none_us=%.3f ratio=%.4f\n",
               bc_transport_name(o.transport), (unsigned long long)o.size,
               (unsigned long long)o.iters, (unsigned long long)nbuf, st, lat[0], lat[1], lat[2],
               lat[0] > 0 ? lat[2] / lat[0] : 0.0);
        return c.unsupported ? BC_EXIT_UNSUPP : ok ? 0 : 1;
}
