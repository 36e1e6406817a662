/* bench-multiqp: k QPs between two processes: normalized multi-connection
 * latency and aggregate throughput (bench/README.md, "Metrics").
 *
 *   server: bench-multiqp [--port P]
 *   client: bench-multiqp --mode lat|bw [--transport ud|rc|rd] [--qps K] [--size B]
 *                         [--iters N] [--window W] [--duration-ms MS] [--bidir] HOST
 *
 * lat: each iteration posts one send on every QP, round robin, and
 *     waits for the k replies. lat_us = elapsed / (iters * k) / 2: the
 *     normalized multi-connection half round trip (Rashti's thesis also divides by
 *     the message size; we keep microseconds and report the size beside it).
 * bw: for duration-ms both processes (--bidir; otherwise the client
 *     only) stream messages round robin over the k QPs, at most `window`
 *     unconsumed per QP (credits every window/2, a 16-byte message: magic +
 *     count). gbps = payload bytes received in the window (both directions
 *     with --bidir) * 8 / duration; jain = (sum x)^2 / (k * sum x^2) over the
 *     per-QP byte counts x. UD losses are not retransmitted: a QP whose window
 *     stays closed for 100 ms writes its missing messages off (counted as
 *     `lost`).
 */
#include <endian.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bcommon.h"

#define CREDIT_MAGIC 0x4352454449542121ull /* "CREDIT!!" */
#define CREDIT_LEN   16

enum { T_RECV = 1, T_SEND = 2, T_CREDIT = 3 };
enum { M_LAT = 0, M_BW = 1 };
static const char *const modes[] = {"lat", "bw", NULL};

static struct bc_ctx c;
static uint8_t *sendbuf, *slots;
static size_t slot_len;
static uint32_t nslots; /* per QP */

static uint8_t *slot(uint32_t qi, uint32_t s)
{
        return slots + ((size_t)qi * nslots + s) * slot_len;
}

static int repost(uint32_t qi, uint32_t s)
{
        return bc_post_recv(&c, qi, BC_WR(T_RECV, qi, s), slot(qi, s), (uint32_t)slot_len);
}

static bool bad_wc(const struct diwarp_wc *wc)
{
        if (wc->status == DIWARP_WC_SUCCESS)
                return false;
        fprintf(stderr, "%s: completion qp %u: %s\n", c.server ? "server" : "client",
                BC_WR_QP(wc->wr_id), diwarp_wc_status_str(wc->status));
        return true;
}

/* ---- lat: normalized latency ----------------------------------------------------- */

static bool run_lat(double *lat_us)
{
        const uint32_t k = c.nqp;
        uint32_t len = (uint32_t)c.o.size;
        uint64_t warm = c.o.iters / 10 < 10 ? 10 : c.o.iters / 10;
        uint64_t total = warm + c.o.iters;
        struct diwarp_wc wc[64];
        for (uint32_t qi = 0; qi < k; qi++)
                for (uint32_t s = 0; s < nslots; s++)
                        if (repost(qi, s))
                                return false;
        if (bc_sync(&c))
                return false;
        if (c.server) {
                uint64_t left = total * k;
                while (left) {
                        int got = bc_poll(&c, wc, 64);
                        if (got <= 0) {
                                fprintf(stderr, "server: stalled, %llu messages left\n",
                                        (unsigned long long)left);
                                return false;
                        }
                        for (int i = 0; i < got; i++) {
                                if (bad_wc(&wc[i]))
                                        return false;
                                if (BC_WR_TYPE(wc[i].wr_id) != T_RECV)
                                        continue;
                                uint32_t qi = BC_WR_QP(wc[i].wr_id);
                                if (bc_post_send(&c, qi, BC_WR(T_SEND, qi, 0), sendbuf, len,
                                                 DIWARP_SEND_SIGNALED) ||
                                    repost(qi, BC_WR_SLOT(wc[i].wr_id)))
                                        return false;
                                left--;
                        }
                }
                return bc_sync(&c) == 0;
        }
        uint64_t t0 = 0;
        for (uint64_t it = 0; it < total; it++) {
                if (it == warm)
                        t0 = bc_now_ns();
                for (uint32_t qi = 0; qi < k; qi++)
                        if (bc_post_send(&c, qi, BC_WR(T_SEND, qi, 0), sendbuf, len,
                                         DIWARP_SEND_SIGNALED))
                                return false;
                uint32_t replies = 0;
                while (replies < k) {
                        int got = bc_poll(&c, wc, 64);
                        if (got <= 0) {
                                fprintf(stderr, "client: iteration %llu: %u of %u replies\n",
                                        (unsigned long long)it, replies, k);
                                return false;
                        }
                        for (int i = 0; i < got; i++) {
                                if (bad_wc(&wc[i]))
                                        return false;
                                if (BC_WR_TYPE(wc[i].wr_id) != T_RECV)
                                        continue;
                                if (repost(BC_WR_QP(wc[i].wr_id), BC_WR_SLOT(wc[i].wr_id)))
                                        return false;
                                replies++;
                        }
                }
        }
        uint64_t t1 = bc_now_ns();
        *lat_us = (double)(t1 - t0) / 1e3 / (double)c.o.iters / (double)k / 2.0;
        return bc_sync(&c) == 0;
}

/* ---- bw: aggregate throughput ---------------------------------------------------- */

struct qstate {
        uint64_t sent, credited, consumed, credit_at, bytes;
        uint64_t closed_since; /* ns the window has been full since (0: open) */
        uint64_t nsend;        /* sends posted (data and credits), for signaling */
};

static int post_tracked(struct qstate *st, uint32_t qi, const void *p, uint32_t len, unsigned fl)
{
        /* every 16th signaled: its completion frees the SQ slots of the others */
        bool sig = (st->nsend & 15) == 15;
        int e = bc_post_send(&c, qi, BC_WR(T_SEND, qi, 0), p, len,
                             fl | (sig ? DIWARP_SEND_SIGNALED : 0));
        if (e == 0)
                st->nsend++;
        return e;
}

static bool run_bw(double *gbps, double *jain, double *minq, double *maxq, uint64_t *lost)
{
        const uint32_t k = c.nqp, w = c.o.window;
        const uint32_t every = w / 2 ? w / 2 : 1;
        uint32_t len = (uint32_t)c.o.size;
        bool sender = !c.server || c.o.bidir;
        struct qstate *st = calloc(k, sizeof(*st));
        uint64_t *peer = calloc(k, sizeof(uint64_t));
        struct diwarp_wc wc[64];
        bool ok = false;
        if (!st || !peer)
                goto out;
        for (uint32_t qi = 0; qi < k; qi++)
                for (uint32_t s = 0; s < nslots; s++)
                        if (repost(qi, s))
                                goto out;
        if (bc_sync(&c))
                goto out;
        uint64_t t0 = bc_now_ns(), dur = (uint64_t)c.o.duration_ms * 1000000ull;
        uint64_t t_end = t0 + dur, drain_end = t_end + 300000000ull;
        uint64_t last_event = t0;
        bool me_done = false;
        unsigned spin = 0;
        for (;;) {
                uint64_t now = bc_now_ns();
                bool sending = sender && now < t_end;
                if (!sending) {
                        /* drain: until every message we sent is credited, then
                         * say so on the side channel; both keep crediting until
                         * both have said it */
                        bool all = true;
                        for (uint32_t qi = 0; sender && qi < k; qi++)
                                all &= st[qi].credited >= st[qi].sent;
                        if (!me_done && (all || now > drain_end)) {
                                uint8_t b = 1;
                                if (bc_write_all(c.oob, &b, 1) < 0)
                                        goto out;
                                me_done = true;
                        }
                        if (me_done && (spin++ & 63) == 0) {
                                struct pollfd pf = {.fd = c.oob, .events = POLLIN};
                                uint8_t b;
                                if (poll(&pf, 1, 0) == 1) {
                                        if (bc_read_all(c.oob, &b, 1) < 0)
                                                goto out;
                                        break;
                                }
                        }
                        if (now > drain_end + 2000000000ull) {
                                fprintf(stderr, "peer never finished draining\n");
                                goto out;
                        }
                }
                for (uint32_t qi = 0; sending && qi < k; qi++) {
                        struct qstate *q = &st[qi];
                        if (q->sent - q->credited >= w) {
                                if (!q->closed_since) {
                                        q->closed_since = now;
                                } else if (c.o.transport == BC_UD &&
                                           now - q->closed_since > 100000000ull) {
                                        *lost += q->sent - q->credited;
                                        q->credited = q->sent;
                                        q->closed_since = 0;
                                }
                                continue;
                        }
                        q->closed_since = 0;
                        int e = post_tracked(q, qi, sendbuf, len, 0);
                        if (e == -12)
                                continue; /* SQ full until a completion */
                        if (e) {
                                fprintf(stderr, "post send qp %u: %d\n", qi, e);
                                goto out;
                        }
                        q->sent++;
                }
                int got = diwarp_cq_poll(c.cq, 64, wc);
                if (got < 0) {
                        fprintf(stderr, "poll CQ: %d\n", got);
                        goto out;
                }
                if (got == 0) {
                        if (sending && now - last_event > (uint64_t)c.o.timeout_ms * 1000000ull) {
                                fprintf(stderr, "%s: no completion for %d ms\n",
                                        c.server ? "server" : "client", c.o.timeout_ms);
                                goto out;
                        }
                        continue;
                }
                last_event = now;
                for (int i = 0; i < got; i++) {
                        if (bad_wc(&wc[i]))
                                goto out;
                        if (BC_WR_TYPE(wc[i].wr_id) != T_RECV)
                                continue;
                        uint32_t qi = BC_WR_QP(wc[i].wr_id), s = BC_WR_SLOT(wc[i].wr_id);
                        struct qstate *q = &st[qi];
                        const uint8_t *p = slot(qi, s) + bc_wc_hdr(&wc[i]);
                        uint64_t m[2];
                        memcpy(m, p, sizeof(m));
                        bool credit = wc[i].byte_len == CREDIT_LEN + bc_wc_hdr(&wc[i]) &&
                                      be64toh(m[0]) == CREDIT_MAGIC;
                        if (repost(qi, s))
                                goto out;
                        if (credit) {
                                uint64_t v = be64toh(m[1]);
                                if (v > q->credited && v <= q->sent)
                                        q->credited = v;
                                continue;
                        }
                        q->consumed++;
                        if (now < t_end)
                                q->bytes += wc[i].byte_len - bc_wc_hdr(&wc[i]);
                        if (q->consumed - q->credit_at >= every) {
                                uint64_t cm[2] = {htobe64(CREDIT_MAGIC), htobe64(q->consumed)};
                                if (post_tracked(q, qi, cm, CREDIT_LEN, DIWARP_SEND_INLINE)) {
                                        fprintf(stderr, "post credit qp %u failed\n", qi);
                                        goto out;
                                }
                                q->credit_at = q->consumed;
                        }
                }
        }
        /* per-QP received bytes, both ways */
        for (uint32_t qi = 0; qi < k; qi++)
                peer[qi] = htobe64(st[qi].bytes);
        if (bc_write_all(c.oob, peer, k * sizeof(uint64_t)) < 0 ||
            bc_read_all(c.oob, peer, k * sizeof(uint64_t)) < 0)
                goto out;
        double sum = 0, sq = 0;
        *minq = -1, *maxq = 0;
        for (uint32_t qi = 0; qi < k; qi++) {
                double x = (double)be64toh(peer[qi]) + (c.o.bidir ? (double)st[qi].bytes : 0);
                double g = x * 8 / ((double)dur / 1e9) / 1e9;
                sum += x;
                sq += x * x;
                if (*minq < 0 || g < *minq)
                        *minq = g;
                if (g > *maxq)
                        *maxq = g;
        }
        *gbps = sum * 8 / ((double)dur / 1e9) / 1e9;
        *jain = sq > 0 ? sum * sum / ((double)k * sq) : 0;
        ok = sum > 0;
        if (!ok)
                fprintf(stderr, "no payload received\n");
out:
        free(st);
        free(peer);
        return ok;
}

int main(int argc, char **argv)
{
        struct bc_opts o;
        bc_parse(argc, argv, &o, "bench-multiqp", modes);
        double lat = 0, gbps = 0, jain = 0, minq = 0, maxq = 0;
        uint64_t lost = 0;
        bool ok = bc_oob_open(&c, &o) == 0;
        if (ok) {
                uint32_t k = c.o.qps, w = c.o.window;
                bool lat_mode = c.o.mode == M_LAT;
                nslots = lat_mode ? 2 : w + 8;
                slot_len = (c.o.size > CREDIT_LEN ? c.o.size : CREDIT_LEN) + bc_hdr(&c);
                size_t len = (c.o.size ? c.o.size : 1) + (size_t)k * nslots * slot_len;
                uint32_t swr = lat_mode ? 16 : 2 * w + 32;
                ok = bc_setup(&c, k, len, swr, nslots) == 0;
                if (ok) {
                        sendbuf = c.buf;
                        slots = c.buf + (c.o.size ? c.o.size : 1);
                        ok = lat_mode ? run_lat(&lat) : run_bw(&gbps, &jain, &minq, &maxq, &lost);
                }
                ok = bc_finish(&c, ok);
        }
        o = c.o;
        const char *st = c.unsupported ? "unsupported" : ok ? "ok" : "fail";
        bc_teardown(&c);
        if (o.mode == M_LAT)
                printf("RESULT mode=lat transport=%s qps=%u size=%llu iters=%llu status=%s "
                       "lat_us=%.3f\n",
                       bc_transport_name(o.transport), o.qps, (unsigned long long)o.size,
                       (unsigned long long)o.iters, st, lat);
        else
                printf("RESULT mode=bw transport=%s qps=%u size=%llu window=%u bidir=%u "
                       "status=%s gbps=%.4f jain=%.4f min_qp_gbps=%.4f max_qp_gbps=%.4f "
                       "lost=%llu\n",
                       bc_transport_name(o.transport), o.qps, (unsigned long long)o.size, o.window,
                       o.bidir, st, gbps, jain, minq, maxq, (unsigned long long)lost);
        return c.unsupported ? BC_EXIT_UNSUPP : ok ? 0 : 1;
}
