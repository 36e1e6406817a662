/* bench-msgrate: message rate of small sends with a window, one QP, one way.
 *
 *   server: bench-msgrate [--port P]
 *   client: bench-msgrate [--transport ud|rc|rd] [--size 8] [--window 64] [--iters N] HOST
 *
 * The client keeps at most `window` messages the server has not consumed:
 * the server returns a credit (a 16-byte message: magic + cumulative count)
 * every window/2 messages, so UD never overruns the receiver. Messages of at
 * most 64 bytes are posted inline (as perftest does). The client times the
 * first post to the last credit; mps = messages / time / 1e6.
 */
#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bcommon.h"

#define CREDIT_MAGIC 0x4352454449542121ull /* "CREDIT!!" */
#define CREDIT_LEN   16
#define CREDIT_SLOTS 16

enum { T_DATA = 1, T_CREDIT = 2, T_SEND = 3 };

static struct bc_ctx c;

static bool send_credit(uint64_t count, uint64_t k)
{
        uint64_t m[2] = {htobe64(CREDIT_MAGIC), htobe64(count)};
        /* inline: the stack copies it at post time */
        unsigned flags = DIWARP_SEND_INLINE | ((k & 15) == 15 ? DIWARP_SEND_SIGNALED : 0);
        int e = bc_post_send(&c, 0, BC_WR(T_SEND, 0, 0), m, CREDIT_LEN, flags);
        if (e)
                fprintf(stderr, "server: post credit: %d\n", e);
        return e == 0;
}

static bool serve(uint8_t *slots, size_t slot_len, uint32_t nslots)
{
        const uint64_t n_all = c.o.iters;
        uint32_t every = c.o.window / 2 ? c.o.window / 2 : 1;
        uint64_t n = 0, credits = 0;
        struct diwarp_wc wc[32];
        for (uint32_t i = 0; i < nslots; i++)
                if (bc_post_recv(&c, 0, BC_WR(T_DATA, 0, i), slots + i * slot_len,
                                 (uint32_t)slot_len))
                        return false;
        if (bc_sync(&c))
                return false;
        while (n < n_all) {
                int got = bc_poll(&c, wc, 32);
                if (got <= 0) {
                        fprintf(stderr, "server: no message for %d ms after %llu\n", c.o.timeout_ms,
                                (unsigned long long)n);
                        return false;
                }
                for (int i = 0; i < got; i++) {
                        if (wc[i].status != DIWARP_WC_SUCCESS) {
                                fprintf(stderr, "server: completion %s\n",
                                        diwarp_wc_status_str(wc[i].status));
                                return false;
                        }
                        if (BC_WR_TYPE(wc[i].wr_id) != T_DATA)
                                continue;
                        uint32_t s = BC_WR_SLOT(wc[i].wr_id);
                        if (wc[i].byte_len != c.o.size + bc_wc_hdr(&wc[i])) {
                                fprintf(stderr, "server: %u bytes, expected %llu\n", wc[i].byte_len,
                                        (unsigned long long)(c.o.size + bc_wc_hdr(&wc[i])));
                                return false;
                        }
                        n++;
                        if (bc_post_recv(&c, 0, wc[i].wr_id, slots + s * slot_len,
                                         (uint32_t)slot_len))
                                return false;
                        if ((n % every == 0 || n == n_all) && !send_credit(n, credits++))
                                return false;
                }
        }
        /* the last credit must leave before the QP goes away */
        return bc_sync(&c) == 0;
}

static bool drive(uint8_t *data, uint8_t *cslots, size_t cslot_len, double *secs)
{
        const uint64_t n_all = c.o.iters;
        uint64_t sent = 0, credited = 0;
        uint32_t len = (uint32_t)c.o.size;
        unsigned inl = len <= 64 ? DIWARP_SEND_INLINE : 0;
        struct diwarp_wc wc[32];
        for (uint32_t i = 0; i < CREDIT_SLOTS; i++)
                if (bc_post_recv(&c, 0, BC_WR(T_CREDIT, 0, i), cslots + i * cslot_len,
                                 (uint32_t)cslot_len))
                        return false;
        if (bc_sync(&c))
                return false;
        uint64_t t0 = bc_now_ns();
        while (credited < n_all) {
                while (sent < n_all && sent - credited < c.o.window) {
                        /* every 16th signaled: it frees the SQ slots of the others */
                        bool sig = (sent & 15) == 15 || sent + 1 == n_all;
                        int e = bc_post_send(&c, 0, BC_WR(T_SEND, 0, 0), data, len,
                                             inl | (sig ? DIWARP_SEND_SIGNALED : 0));
                        if (e == -12) /* ENOMEM: SQ full until a completion */
                                break;
                        if (e) {
                                fprintf(stderr, "client: post send: %d\n", e);
                                return false;
                        }
                        sent++;
                }
                int got = bc_poll(&c, wc, 32);
                if (got <= 0) {
                        fprintf(stderr, "client: stalled at %llu sent, %llu credited\n",
                                (unsigned long long)sent, (unsigned long long)credited);
                        return false;
                }
                for (int i = 0; i < got; i++) {
                        if (wc[i].status != DIWARP_WC_SUCCESS) {
                                fprintf(stderr, "client: completion %s\n",
                                        diwarp_wc_status_str(wc[i].status));
                                return false;
                        }
                        if (BC_WR_TYPE(wc[i].wr_id) != T_CREDIT)
                                continue;
                        uint32_t s = BC_WR_SLOT(wc[i].wr_id);
                        uint64_t m[2];
                        memcpy(m, cslots + s * cslot_len + bc_wc_hdr(&wc[i]), sizeof(m));
                        if (be64toh(m[0]) != CREDIT_MAGIC) {
                                fprintf(stderr, "client: bad credit message\n");
                                return false;
                        }
                        uint64_t v = be64toh(m[1]);
                        if (v > credited)
                                credited = v;
                        if (bc_post_recv(&c, 0, wc[i].wr_id, cslots + s * cslot_len,
                                         (uint32_t)cslot_len))
                                return false;
                }
        }
        *secs = (double)(bc_now_ns() - t0) / 1e9;
        return bc_sync(&c) == 0;
}

int main(int argc, char **argv)
{
        struct bc_opts o;
        bc_parse(argc, argv, &o, "bench-msgrate", NULL);
        double secs = 0;
        bool ok = bc_oob_open(&c, &o) == 0;
        if (ok) {
                size_t slot_len = c.o.size + bc_hdr(&c);
                size_t cslot_len = CREDIT_LEN + bc_hdr(&c);
                uint32_t nslots = 2 * c.o.window;
                size_t len =
                    (c.o.size ? c.o.size : 1) + nslots * slot_len + CREDIT_SLOTS * cslot_len;
                ok = bc_setup(&c, 1, len, 2 * c.o.window + 64, nslots + CREDIT_SLOTS) == 0;
                if (ok) {
                        uint8_t *data = c.buf, *slots = c.buf + (c.o.size ? c.o.size : 1);
                        uint8_t *cslots = slots + nslots * slot_len;
                        ok = c.server ? serve(slots, slot_len, nslots)
                                      : drive(data, cslots, cslot_len, &secs);
                }
                ok = bc_finish(&c, ok);
        }
        o = c.o;
        const char *st = c.unsupported ? "unsupported" : ok ? "ok" : "fail";
        bc_teardown(&c);
        printf("RESULT transport=%s size=%llu window=%u iters=%llu status=%s mps=%.4f\n",
               bc_transport_name(o.transport), (unsigned long long)o.size, o.window,
               (unsigned long long)o.iters, st, secs > 0 ? (double)o.iters / secs / 1e6 : 0.0);
        return c.unsupported ? BC_EXIT_UNSUPP : ok ? 0 : 1;
}
