/* diwarp-bw: one-way bandwidth between two processes.
 *
 *   server: diwarp-bw [--port P]
 *   client: diwarp-bw [--transport ud|rc|rd] [--op send|write|read] [--size B]
 *                     [--iters N] [--window W] [--validate] HOST
 *
 * send:  the client streams messages; the server keeps receives posted and
 *        returns credits (an 8-byte message with its receive count) every
 *        window/2 messages, so the client never has more than window messages
 *        the server has not consumed (UD has no other flow control).
 * write: (RC) the client streams RDMA Writes into the server's buffer.
 * read:  (RC) the client streams RDMA Reads from the server's buffer.
 * gbps counts payload bits over the client's elapsed time (first post to the
 * last credit / completion); the server's RESULT (op=send) uses its own
 * first-to-last arrival time. The last line printed is the RESULT line.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#include <diwarp/diwarpdv.h>

static struct ex_ctx c;

/* Messages in flight: --window, at most 64. Automatic: 64 on reliable
 * transports (their own window limits them) but no more Sends than 256 MiB
 * of receive slots hold; on UD what a default 208 KiB socket receive buffer
 * holds. */
static uint32_t auto_window(const struct ex_opts *o)
{
        uint64_t w;
        if (o->window)
                return o->window > 64 ? 64 : o->window;
        if (o->transport != EX_UD)
                w = o->op == EX_SEND && o->size ? (256ull << 20) / o->size : 64;
        else
                w = 180000 / (o->size + 1024);
        return w < 2 ? 2 : w > 64 ? 64 : (uint32_t)w;
}

/* Sends: the server keeps a receive slot per message in flight, the client
 * one send area. Write and Read: one region of the message size on each
 * side, the writer's / reader's source or destination and the peer's target
 * or source. */
static struct ex_layout bw_layout(const struct ex_opts *o, bool server)
{
        if (o->op != EX_SEND)
                return (struct ex_layout){o->size, 0};
        return server ? (struct ex_layout){0, auto_window(o)} : (struct ex_layout){o->size, 0};
}

static bool send_credit(uint64_t count)
{
        uint8_t msg[8];
        uint64_t be = htobe64(count);
        memcpy(msg, &be, 8);
        struct diwarp_sge sge = {(uintptr_t)msg, 8, 0};
        struct diwarp_send_wr wr = {.wr_id = EX_WRID_CREDIT,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_INLINE},
                              *bad;
        if (c.o.transport != EX_RC) {
                wr.wr.ud.ah = c.ah;
                wr.wr.ud.remote_qpn = c.peer_qpn;
                wr.wr.ud.remote_qkey = EX_QKEY;
        }
        return diwarp_post_send(c.qp, &wr, &bad) == 0;
}

/* Server side of op=send. Returns the number of messages received intact. */
static bool serve_send(uint32_t window, uint64_t *received, double *secs)
{
        uint64_t t_first = 0, t_last = 0;
        uint32_t every = window / 2 ? window / 2 : 1;
        uint64_t n = 0;
        bool ok = true;
        struct diwarp_wc wc;
        size_t off = c.o.transport == EX_UD ? EX_GRH : 0;
        for (uint32_t i = 0; i < c.nrecv; i++)
                if (ex_post_recv_slot(&c, i))
                        return false;
        if (ex_sync(&c))
                return false;
        while (n < c.o.iters) {
                int r = ex_poll1(&c, &wc);
                if (r <= 0) {
                        fprintf(stderr, "server: no message for %d ms after %llu\n", c.o.timeout_ms,
                                (unsigned long long)n);
                        ok = false;
                        break;
                }
                if ((wc.wr_id & EX_WRID_MASK) != EX_WRID_RECV)
                        continue; /* credit send completions (unsignaled unless error) */
                if (wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "server: receive: %s\n", diwarp_wc_status_str(wc.status));
                        ok = false;
                        break;
                }
                uint32_t slot = (uint32_t)(wc.wr_id & 0xffffffffu);
                t_last = ex_now_ns();
                if (!t_first)
                        t_first = t_last;
                if (wc.byte_len != c.o.size + off) {
                        fprintf(stderr, "server: got %u bytes\n", wc.byte_len);
                        ok = false;
                }
                if (c.o.validate) {
                        int64_t bad =
                            ex_check(c.recv_area + (size_t)slot * c.slot_len + off, c.o.size, 0);
                        if (bad >= 0) {
                                fprintf(stderr, "server: message %llu byte %lld differs\n",
                                        (unsigned long long)n, (long long)bad);
                                ok = false;
                        }
                }
                n++;
                if (ex_post_recv_slot(&c, slot))
                        return false;
                if ((n % every == 0 || n == c.o.iters) && !send_credit(n))
                        return false;
        }
        *received = n;
        /* first to last arrival: one message's time short of the whole run */
        if (n > 1)
                *secs = (double)(t_last - t_first) / 1e9 * (double)n / (double)(n - 1);
        return ok;
}

static bool client_send(uint32_t window, double *secs)
{
        uint64_t sent = 0, credited = 0;
        struct diwarp_wc wc;
        uint32_t len = (uint32_t)c.o.size;
        for (uint32_t i = 0; i < EX_CREDIT_SLOTS; i++)
                if (ex_post_credit_recv(&c, i))
                        return false;
        ex_fill(c.send_area, len, 0);
        if (ex_sync(&c))
                return false;
        uint64_t t0 = ex_now_ns();
        while (credited < c.o.iters) {
                while (sent < c.o.iters && sent - credited < window) {
                        /* signal every 16th: the SQ slots of the others free up with it */
                        bool sig = (sent & 15) == 15 || sent + 1 == c.o.iters;
                        int e = ex_post_send(&c, EX_WRID_SEND | sent, c.send_area, len, sig,
                                             DIWARP_WR_SEND, 0);
                        if (e == -12 /* ENOMEM: SQ full */)
                                break;
                        if (e) {
                                fprintf(stderr, "client: post send: %d\n", e);
                                return false;
                        }
                        sent++;
                }
                int r = ex_poll1(&c, &wc);
                if (r <= 0) {
                        fprintf(stderr, "client: stalled at %llu sent, %llu credited\n",
                                (unsigned long long)sent, (unsigned long long)credited);
                        return false;
                }
                if (wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "client: completion: %s\n",
                                diwarp_wc_status_str(wc.status));
                        return false;
                }
                if ((wc.wr_id & EX_WRID_MASK) == EX_WRID_CREDIT) {
                        uint32_t i = (uint32_t)(wc.wr_id & 0xffffffffu);
                        size_t off = c.o.transport == EX_UD ? EX_GRH : 0;
                        uint64_t v;
                        memcpy(&v, c.credit_area + (size_t)i * 64 + off, 8);
                        v = be64toh(v);
                        if (v > credited)
                                credited = v;
                        if (ex_post_credit_recv(&c, i))
                                return false;
                }
        }
        *secs = (double)(ex_now_ns() - t0) / 1e9;
        return true;
}

static bool client_rdma(uint32_t window, bool read, double *secs)
{
        uint64_t posted = 0, done = 0;
        struct diwarp_wc wc;
        uint32_t len = (uint32_t)c.o.size;
        if (!read) /* a Read's destination is the same region: left zero */
                ex_fill(c.send_area, len, 0);
        if (ex_sync(&c))
                return false;
        uint64_t t0 = ex_now_ns();
        while (done < c.o.iters) {
                while (posted < c.o.iters && posted - done < window) {
                        if (ex_post_rdma(&c, EX_WRID_SEND | posted, read, len))
                                return false;
                        posted++;
                }
                int r = ex_poll1(&c, &wc);
                if (r <= 0 || wc.status != DIWARP_WC_SUCCESS) {
                        fprintf(stderr, "client: RDMA %s failed after %llu: %s\n",
                                read ? "read" : "write", (unsigned long long)done,
                                r <= 0 ? "no completion in time" : diwarp_wc_status_str(wc.status));
                        return false;
                }
                done++;
        }
        *secs = (double)(ex_now_ns() - t0) / 1e9;
        if (read && c.o.validate && ex_check(c.recv_area, len, 0) >= 0) {
                fprintf(stderr, "client: read data differs\n");
                return false;
        }
        return ex_done(&c) == 0;
}

int main(int argc, char **argv)
{
        struct ex_opts o;
        ex_parse(argc, argv, &o, "diwarp-bw", true);
        double secs = 0;
        uint64_t count = 0;
        bool ok = ex_setup(&c, &o, bw_layout) == 0;
        o = c.o; /* the client's parameters, on the server too (even when it refused them) */
        uint32_t window = 0;
        if (ok) {
                window = auto_window(&c.o);
                if (c.server) {
                        if (c.o.op == EX_SEND) {
                                ok = serve_send(window, &count, &secs);
                        } else {
                                if (c.o.op == EX_READ)
                                        ex_fill(c.send_area, c.o.size, 0);
                                ok = ex_sync(&c) == 0 && ex_serve_until_done(&c) == 0;
                                if (c.o.op == EX_WRITE && c.o.validate &&
                                    ex_check(c.recv_area, c.o.size, 0) >= 0) {
                                        fprintf(stderr, "server: written data differs\n");
                                        ok = false;
                                }
                                count = c.o.iters;
                        }
                } else if (c.o.op == EX_SEND) {
                        ok = client_send(window, &secs);
                } else {
                        ok = client_rdma(window, c.o.op == EX_READ, &secs);
                }
                bool peer_ok = false;
                uint64_t peer_count = 0;
                if (ex_finish(&c, ok, count, &peer_ok, &peer_count) < 0 || !peer_ok)
                        ok = false;
                if (!c.server && c.o.op == EX_SEND && peer_count != c.o.iters)
                        ok = false;
        }
        /* Reliable datagrams (RD, or RC carried by RD): the largest datagram
         * the pseudo-stream sends, which follows the route's MTU. */
        struct diwarpdv_rd_path path = {0};
        struct diwarp_counters ctr = {0};
        if (ok && c.qp) {
                diwarp_qp_counters(c.qp, &ctr);
                /* The device's: its progress thread serves every QP. */
                struct diwarp_counters dc;
                if (diwarp_device_counters(c.dev, &dc) == 0)
                        ctr.progress_takeovers = dc.progress_takeovers;
                struct diwarpdv_rd_dest d = {c.ah, c.peer_qpn, 0x80000000u};
                if (diwarpdv_query_rd_path(c.qp, o.transport == EX_RD ? &d : NULL, &path) < 0)
                        path.max_dgram = 0;
        }
        /* Multirail: what each rail carried (RAIL lines, before RESULT). */
        struct diwarp_rail_stats rails[DIWARP_MAX_RAILS];
        int nrails = c.dev ? diwarp_device_rails(c.dev, rails, DIWARP_MAX_RAILS) : 0;
        for (int i = 0; nrails > 1 && i < nrails && i < DIWARP_MAX_RAILS; i++) {
                char a[INET_ADDRSTRLEN];
                struct in_addr ia = {rails[i].addr};
                printf("RAIL index=%d addr=%s tx_bytes=%llu tx_packets=%llu retransmits=%llu "
                       "downs=%llu state=%s\n",
                       i, inet_ntop(AF_INET, &ia, a, sizeof(a)),
                       (unsigned long long)rails[i].tx_bytes,
                       (unsigned long long)rails[i].tx_packets,
                       (unsigned long long)rails[i].retransmits, (unsigned long long)rails[i].downs,
                       rails[i].up ? "up" : "down");
        }
        ex_teardown(&c);
        double gbps = secs > 0 ? (double)o.size * (double)o.iters * 8 / secs / 1e9 : 0;
        char dg[640] = "";
        if (path.max_dgram)
                snprintf(dg, sizeof(dg),
                         " dgram=%u sent_max=%u retx=%llu backpressure=%llu dup=%llu direct=%llu"
                         " cwnd=%u inflight=%u min_rtt_us=%.1f srtt_us=%.1f pace_mbps=%.1f"
                         " cc_delay=%llu cc_loss=%llu cc_rto=%llu tlp=%u rto=%u fast=%u"
                         " token_waits=%llu pulls=%llu",
                         path.max_dgram, path.dev_max_sent, (unsigned long long)ctr.retransmits,
                         (unsigned long long)ctr.tx_backpressure,
                         (unsigned long long)ctr.rx_dropped_duplicate,
                         (unsigned long long)ctr.rx_placed_direct, path.cwnd, path.inflight,
                         path.min_rtt_ns / 1e3, path.srtt_ns / 1e3, path.pacing_bps / 1e6,
                         (unsigned long long)path.cc_decrease_delay,
                         (unsigned long long)path.cc_decrease_loss, (unsigned long long)path.cc_rto,
                         path.tail_probes, path.rto_expiries, path.fast_retransmits,
                         (unsigned long long)ctr.inflight_waits, (unsigned long long)ctr.pulls);
        printf("RESULT transport=%s op=%s size=%llu iters=%llu status=%s gbps=%.3f%s "
               "takeovers=%llu\n",
               ex_transport_name(o.transport), ex_op_name(o.op), (unsigned long long)o.size,
               (unsigned long long)o.iters, ok ? "ok" : "fail", gbps, dg,
               (unsigned long long)ctr.progress_takeovers);
        return ok ? 0 : 1;
}
