/* diwarp-pingpong: latency between two processes.
 *
 *   server: diwarp-pingpong [--port P]
 *   client: diwarp-pingpong [--transport ud|rc|rd] [--op send|write|read] [--size B]
 *                           [--iters N] [--validate] HOST
 *
 * send:  the client sends, the server answers with a message of the same size.
 * write: (RC) the client writes into the server's buffer; the server notices
 *        the last byte change and writes back.
 * read:  (RC) the client reads the server's buffer.
 * lat_us is half the average round trip (send, write) or the average RDMA
 * Read time (read). The last line printed is the RESULT line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static struct ex_ctx c;

/* Waits for the next receive completion; send completions are checked and
 * dropped. Returns the receive slot or -1. */
static int wait_recv(void)
{
        struct diwarp_wc wc;
        for (;;) {
                int r = ex_poll1(&c, &wc);
                if (r <= 0) {
                        fprintf(stderr, "timeout waiting for a message\n");
                        return -1;
                }
                if (wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "completion wr_id %#llx: %s\n",
                                (unsigned long long)wc.wr_id, diwarp_wc_status_str(wc.status));
                        return -1;
                }
                if ((wc.wr_id & EX_WRID_MASK) == EX_WRID_RECV) {
                        uint32_t want =
                            (uint32_t)(c.o.size + (c.o.transport == EX_UD ? EX_GRH : 0));
                        if (wc.byte_len != want) {
                                fprintf(stderr, "received %u bytes, expected %u\n", wc.byte_len,
                                        want);
                                return -1;
                        }
                        return (int)(wc.wr_id & 0xffffffffu);
                }
        }
}

static bool check_slot(int slot, uint64_t k)
{
        if (!c.o.validate)
                return true;
        const uint8_t *p =
            c.recv_area + (size_t)slot * c.slot_len + (c.o.transport == EX_UD ? EX_GRH : 0);
        int64_t bad = ex_check(p, c.o.size, k);
        if (bad >= 0)
                fprintf(stderr, "iteration %llu: byte %lld differs\n", (unsigned long long)k,
                        (long long)bad);
        return bad < 0;
}

static bool run_send(double *lat_us)
{
        const uint64_t n = c.o.iters;
        uint32_t len = (uint32_t)c.o.size;
        /* Both slots posted ahead: the receive for message k+1 is already in
         * place when message k is answered, so reposting happens after the
         * send, off the round trip (and UD never finds the RQ empty). */
        if (ex_post_recv_slot(&c, 0) || ex_post_recv_slot(&c, 1) || ex_sync(&c))
                return false;
        ex_fill(c.send_area, len, 0);
        uint64_t t0 = ex_now_ns();
        for (uint64_t k = 0; k < n; k++) {
                if (c.server) {
                        int s = wait_recv();
                        if (s < 0 || !check_slot(s, k))
                                return false;
                        if (c.o.validate)
                                ex_fill(c.send_area, len, k);
                        if (ex_post_send(&c, EX_WRID_SEND | k, c.send_area, len, true,
                                         DIWARP_WR_SEND, 0) ||
                            ex_post_recv_slot(&c, (uint32_t)s))
                                return false;
                } else {
                        if (c.o.validate)
                                ex_fill(c.send_area, len, k);
                        if (ex_post_send(&c, EX_WRID_SEND | k, c.send_area, len, true,
                                         DIWARP_WR_SEND, 0))
                                return false;
                        /* the slot of answer k-1 goes back after send k: answer k
                         * lands in the other one, posted since */
                        if (k > 0 && ex_post_recv_slot(&c, (uint32_t)((k - 1) & 1)))
                                return false;
                        int s = wait_recv();
                        if (s < 0 || !check_slot(s, k))
                                return false;
                }
        }
        uint64_t t1 = ex_now_ns();
        *lat_us = (double)(t1 - t0) / 1e3 / (double)n / 2.0;
        return true;
}

/* Spins until the last byte of receive slot 0 shows message k. */
static bool wait_marker(uint64_t k)
{
        volatile uint8_t *last = c.recv_area + c.o.size - 1;
        uint8_t want = ex_pat(c.o.size - 1, k);
        uint64_t deadline = ex_now_ns() + (uint64_t)c.o.timeout_ms * 1000000ull;
        struct diwarp_wc wc;
        for (unsigned spin = 0; *last != want; spin++) {
                /* polling the CQ drives progress and reaps our write completions */
                int r = diwarp_cq_poll(c.cq, 1, &wc);
                if (r < 0 || (r == 1 && wc.status != DIWARP_WC_SUCCESS)) {
                        fprintf(stderr, "write failed: %s\n",
                                r < 0 ? "poll" : diwarp_wc_status_str(wc.status));
                        return false;
                }
                if ((spin & 255) == 255 && ex_now_ns() > deadline) {
                        fprintf(stderr, "timeout waiting for write %llu\n", (unsigned long long)k);
                        return false;
                }
        }
        return true;
}

static bool run_write(double *lat_us)
{
        const uint64_t n = c.o.iters;
        uint32_t len = (uint32_t)c.o.size;
        if (len == 0) {
                fprintf(stderr, "--op write needs --size >= 1\n");
                return false;
        }
        /* make sure no stale byte looks like the first marker */
        c.recv_area[len - 1] = (uint8_t)~ex_pat(len - 1, 0);
        if (ex_sync(&c))
                return false;
        uint64_t t0 = ex_now_ns();
        for (uint64_t k = 0; k < n; k++) {
                if (c.server && (!wait_marker(k) || !check_slot(0, k)))
                        return false;
                if (c.o.validate)
                        ex_fill(c.send_area, len, k);
                else
                        c.send_area[len - 1] = ex_pat(len - 1, k);
                if (ex_post_rdma(&c, EX_WRID_SEND | k, false, len))
                        return false;
                if (!c.server && (!wait_marker(k) || !check_slot(0, k)))
                        return false;
        }
        uint64_t t1 = ex_now_ns();
        *lat_us = (double)(t1 - t0) / 1e3 / (double)n / 2.0;
        return true;
}

static bool run_read(double *lat_us)
{
        const uint64_t n = c.o.iters;
        uint32_t len = (uint32_t)c.o.size;
        ex_fill(c.send_area, len, 0);
        if (ex_sync(&c))
                return false;
        if (c.server)
                return ex_serve_until_done(&c) == 0;
        struct diwarp_wc wc;
        uint64_t t0 = ex_now_ns();
        bool ok = true;
        for (uint64_t k = 0; k < n && ok; k++) {
                if (c.o.validate)
                        memset(c.recv_area, 0, len);
                if (ex_post_rdma(&c, EX_WRID_SEND | k, true, len) || ex_poll1(&c, &wc) != 1 ||
                    wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "read %llu failed\n", (unsigned long long)k);
                        ok = false;
                        break;
                }
                ok = check_slot(0, 0);
        }
        uint64_t t1 = ex_now_ns();
        *lat_us = (double)(t1 - t0) / 1e3 / (double)n;
        ex_done(&c);
        return ok;
}

/* A send area and receive slots of the message size: two for Sends (the
 * next receive is posted ahead), one for Writes and Reads (the peer's target
 * or the Read's destination, apart from what this side sends). */
static struct ex_layout pp_layout(const struct ex_opts *o, bool server)
{
        (void)server;
        return (struct ex_layout){o->size, o->op == EX_SEND ? 2 : 1};
}

int main(int argc, char **argv)
{
        struct ex_opts o;
        ex_parse(argc, argv, &o, "diwarp-pingpong", false);
        double lat = 0;
        bool ok = ex_setup(&c, &o, pp_layout) == 0;
        o = c.o; /* the client's parameters, on the server too (even when it refused them) */
        if (ok) {
                switch (c.o.op) {
                case EX_SEND:
                        ok = run_send(&lat);
                        break;
                case EX_WRITE:
                        ok = run_write(&lat);
                        break;
                case EX_READ:
                        ok = run_read(&lat);
                        break;
                }
                bool peer_ok = false;
                if (ex_finish(&c, ok, 0, &peer_ok, NULL) < 0 || !peer_ok)
                        ok = false;
        }
        struct diwarp_counters ctr = {0};
        if (c.dev)
                diwarp_device_counters(c.dev, &ctr);
        ex_teardown(&c);
        printf("RESULT transport=%s op=%s size=%llu iters=%llu status=%s lat_us=%.2f "
               "takeovers=%llu nap_drives=%llu timer_wakes=%llu\n",
               ex_transport_name(o.transport), ex_op_name(o.op), (unsigned long long)o.size,
               (unsigned long long)o.iters, ok ? "ok" : "fail", lat,
               (unsigned long long)ctr.progress_takeovers,
               (unsigned long long)ctr.progress_nap_drives,
               (unsigned long long)ctr.progress_timer_wakes);
        return ok ? 0 : 1;
}
