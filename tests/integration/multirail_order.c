/* Multirail (DIWARP_ADDR=a,b: a rail per address) over RD between two
 * processes, run by netns_multirail.sh in two network namespaces joined by
 * one veth pair per rail (bench/netns-topo.sh ... rails):
 *
 *   multirail_order order|write PORT          server (namespace B)
 *   multirail_order order|write PORT HOST     client (namespace A), HOST: B's rail 0
 *
 * Each side's DIWARP_ADDR (its rail list) comes from the environment; the
 * two talk over a TCP side channel on PORT.
 *
 *   order (MR-3)  ROUNDS rounds, each a large Send (2 MiB: receiver-paced, or
 *                 512 KiB + 3: pushed; both above DIWARP_STRIPE_MIN's default,
 *                 so striped over the rails) posted immediately before a
 *                 64-byte Send (rail 0 only), BATCH rounds posted at once.
 *                 The receiver's completions must come in posting order (the
 *                 small Send never ahead of the large one posted before it),
 *                 once each, with the right byte_len and contents; every
 *                 send completion succeeds, once.
 *   write (MR-4)  one MR (one STag) of 16 MiB at the server. The client
 *                 RDMA Writes it whole (4 x 2 MiB + 1 x 8 MiB, all posted at
 *                 once) three times with a new pattern, the server checks
 *                 every byte each time; then the client RDMA Reads it back
 *                 (2 x 8 MiB) and checks it. The Writes must have left by
 *                 every rail of the client (each >= 10 % of the bytes its
 *                 rails sent in that phase), the Reads' responses by every
 *                 rail of the server.
 *
 * Both sides print RAIL lines (diwarp_device_rails) and a RESULT line; exit
 * 0 pass, 1 fail (naming the completion, rail and numbers). Every wait has a
 * deadline (WAIT_MS for a completion or a side-channel message), and alarm()
 * bounds the whole run.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#define KiB     1024u
#define MiB     (1024u * 1024u)
#define QKEY    0x4d52u
#define WAIT_MS 30000 /* the longest wait for one completion or message */

#define ROUNDS     16
#define BATCH      4
#define SMALL      64u
#define SMALL_SLOT 4096u
#define WR_BUF     (16 * MiB)

static const char *who = "multirail_order";
static bool server;
static int oob = -1;

static void die(const char *fmt, ...)
{
        va_list ap;
        fprintf(stderr, "%s: FAIL: ", who);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        printf("RESULT role=%s status=fail\n", who);
        exit(1);
}

#define CHECK(call)                                                                                \
        do {                                                                                       \
                int _e = (call);                                                                   \
                if (_e < 0)                                                                        \
                        die("%s: %s", #call, strerror(-_e));                                       \
        } while (0)

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the device ---------------------------------------------------------- */

static struct diwarp_device *dev;
static struct diwarp_pd *pd;
static struct diwarp_cq *cq;
static struct diwarp_qp *qp;
static struct diwarp_mr *mr;
static struct diwarp_ah *ah;
static uint8_t *buf;
static size_t buf_len;
static uint32_t lkey;

struct info {
        uint32_t qpn, rkey;
        uint64_t addr;
        uint8_t gid[16];
};
static struct info peer;

static void open_all(size_t len)
{
        CHECK(diwarp_device_open(NULL, &dev));
        CHECK(diwarp_pd_alloc(dev, &pd));
        CHECK(diwarp_cq_create(dev, 1024, NULL, NULL, &cq));
        buf_len = len;
        buf = aligned_alloc(4096, buf_len);
        if (!buf)
                die("no memory for %zu bytes", buf_len);
        memset(buf, 0, buf_len);
        CHECK(diwarp_mr_reg(pd, buf, buf_len, (uintptr_t)buf,
                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                DIWARP_ACCESS_REMOTE_READ,
                            &mr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(mr, &mi));
        lkey = mi.lkey;
        struct diwarp_qp_init_attr ia = {
            .send_cq = cq,
            .recv_cq = cq,
            .qp_type = DIWARP_QPT_RC, /* diwarpdv_create_qp makes it RD */
            .cap = {.max_send_wr = 256,
                    .max_recv_wr = 2 * ROUNDS + 8,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
        };
        CHECK(diwarpdv_create_qp(pd, &ia, &qp));
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .port_num = 1,
                                   .qkey = QKEY,
                                   .qp_access_flags = DIWARP_ACCESS_LOCAL_WRITE |
                                                      DIWARP_ACCESS_REMOTE_WRITE |
                                                      DIWARP_ACCESS_REMOTE_READ};
        CHECK(diwarp_qp_modify(
            qp, &a, DIWARP_QP_STATE | DIWARP_QP_PORT | DIWARP_QP_QKEY | DIWARP_QP_ACCESS_FLAGS));
        a.qp_state = DIWARP_QPS_RTR;
        CHECK(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE));
        a.qp_state = DIWARP_QPS_RTS;
        a.max_rd_atomic = 16;
        CHECK(diwarp_qp_modify(qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_MAX_QP_RD_ATOMIC));
}

/* RAIL lines, as diwarp-bw prints them; returns the number of rails. */
static int rails(struct diwarp_rail_stats *r, const char *tag)
{
        int n = diwarp_device_rails(dev, r, DIWARP_MAX_RAILS);
        if (n < 0)
                die("diwarp_device_rails: %s", strerror(-n));
        for (int i = 0; tag && i < n; i++) {
                struct in_addr in = {r[i].addr};
                printf("RAIL phase=%s index=%d addr=%s tx_bytes=%llu tx_packets=%llu "
                       "retransmits=%llu downs=%llu state=%s\n",
                       tag, i, inet_ntoa(in), (unsigned long long)r[i].tx_bytes,
                       (unsigned long long)r[i].tx_packets, (unsigned long long)r[i].retransmits,
                       (unsigned long long)r[i].downs, r[i].up ? "up" : "down");
        }
        fflush(stdout);
        return n;
}

/* Each rail sent at least 10 % of what all rails sent between b and a. */
static void rails_all_used(const struct diwarp_rail_stats *b, const struct diwarp_rail_stats *a,
                           int n, const char *what)
{
        if (n < 2)
                die("%s: the device has %d rail(s): DIWARP_ADDR=%s is not a list of 2 or more",
                    what, n, getenv("DIWARP_ADDR") ? getenv("DIWARP_ADDR") : "(unset)");
        uint64_t total = 0;
        for (int i = 0; i < n; i++)
                total += a[i].tx_bytes - b[i].tx_bytes;
        for (int i = 0; i < n; i++) {
                uint64_t d = a[i].tx_bytes - b[i].tx_bytes;
                struct in_addr in = {a[i].addr};
                if (d * 10 < total)
                        die("%s: rail %d (%s) sent %llu of the %llu bytes its device's %d rails "
                            "sent (< 10 %%): not striped over every rail",
                            what, i, inet_ntoa(in), (unsigned long long)d,
                            (unsigned long long)total, n);
        }
}

/* ---- side channel ------------------------------------------------------- */

static void oob_open(uint16_t port, const char *host)
{
        int one = 1;
        if (!host) {
                struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
                int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (l < 0 || bind(l, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(l, 1) < 0)
                        die("side channel: listen on port %u: %s", port, strerror(errno));
                struct pollfd p = {.fd = l, .events = POLLIN};
                if (poll(&p, 1, WAIT_MS) != 1)
                        die("side channel: no client within %d ms", WAIT_MS);
                oob = accept(l, NULL, NULL);
                close(l);
        } else {
                struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
                char ps[16];
                snprintf(ps, sizeof(ps), "%u", port);
                if (getaddrinfo(host, ps, &hints, &ai) != 0)
                        die("side channel: cannot resolve %s", host);
                uint64_t end = now_ms() + 10000; /* the server may still be starting */
                while (now_ms() < end) {
                        oob = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                        if (oob >= 0 && connect(oob, ai->ai_addr, ai->ai_addrlen) == 0)
                                break;
                        close(oob);
                        oob = -1;
                        usleep(50000);
                }
                freeaddrinfo(ai);
        }
        if (oob < 0)
                die("side channel: no connection (port %u%s%s)", port, host ? ", host " : "",
                    host ? host : "");
        setsockopt(oob, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void oob_send(const void *p, size_t n)
{
        if (write(oob, p, n) != (ssize_t)n)
                die("side channel write: %s", strerror(errno));
}

/* Reads n bytes; drives the device meanwhile (a passive RDMA target). */
static void oob_recv(void *p, size_t n)
{
        size_t got = 0;
        uint64_t end = now_ms() + WAIT_MS;
        struct pollfd pf = {.fd = oob, .events = POLLIN};
        while (got < n) {
                int e = diwarp_progress(dev, 64);
                if (e < 0)
                        die("diwarp_progress: %s", strerror(-e));
                if (poll(&pf, 1, 0) == 1) {
                        ssize_t r = read(oob, (uint8_t *)p + got, n - got);
                        if (r <= 0)
                                die("side channel: %s", r ? strerror(errno) : "the peer is gone");
                        got += (size_t)r;
                        end = now_ms() + WAIT_MS;
                } else if (now_ms() > end) {
                        die("side channel: no message from the peer for %d ms", WAIT_MS);
                }
        }
}

static uint64_t oob_xchg(uint64_t mine)
{
        uint64_t theirs;
        oob_send(&mine, sizeof(mine));
        oob_recv(&theirs, sizeof(theirs));
        return theirs;
}

static void exchange(void)
{
        struct info me = {.qpn = diwarp_qp_num(qp), .addr = (uintptr_t)buf};
        struct diwarp_mr_info mi;
        union diwarp_gid gid;
        CHECK(diwarp_mr_info(mr, &mi));
        me.rkey = mi.rkey;
        CHECK(diwarp_device_gid(dev, &gid));
        memcpy(me.gid, gid.raw, 16);
        oob_send(&me, sizeof(me));
        oob_recv(&peer, sizeof(peer));
        memcpy(gid.raw, peer.gid, 16);
        CHECK(diwarp_ah_create(pd, &gid, &ah));
}

/* ---- data --------------------------------------------------------------- */

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
        uint32_t x = seed * 2654435761u + 1;
        for (size_t i = 0; i < n; i++) {
                x = x * 1103515245u + 12345u;
                p[i] = (uint8_t)(x >> 16);
        }
}

/* Index of the first byte of p that differs from fill(seed), or -1. */
static long check(const uint8_t *p, size_t n, uint32_t seed)
{
        uint32_t x = seed * 2654435761u + 1;
        for (size_t i = 0; i < n; i++) {
                x = x * 1103515245u + 12345u;
                if (p[i] != (uint8_t)(x >> 16))
                        return (long)i;
        }
        return -1;
}

/* Polls one completion within WAIT_MS. */
static void poll1(struct diwarp_wc *wc, const char *what, unsigned n)
{
        uint64_t end = now_ms() + WAIT_MS;
        for (;;) {
                int r = diwarp_cq_poll(cq, 1, wc);
                if (r < 0)
                        die("cq_poll: %s", strerror(-r));
                if (r == 1)
                        return;
                if (now_ms() > end)
                        die("%s %u: no completion within %d ms", what, n, WAIT_MS);
        }
}

static void post_send(uint64_t id, enum diwarp_wr_opcode op, uint64_t off, uint32_t len,
                      uint64_t remote)
{
        struct diwarp_sge sge = {(uintptr_t)buf + off, len, lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED},
                              *bad;
        wr.wr.rdma.remote_addr = peer.addr + remote;
        wr.wr.rdma.rkey = peer.rkey;
        struct diwarpdv_rd_dest d = {ah, peer.qpn, QKEY};
        int e = diwarpdv_post_send_rd(qp, &wr, &d, &bad);
        if (e < 0)
                die("post WR %llu (opcode %d, %u bytes): %s", (unsigned long long)id, op, len,
                    strerror(-e));
}

/* Waits for n send completions with ids first..first+n-1, each once, success. */
static void send_done(uint64_t first, unsigned n, const char *what)
{
        bool seen[64] = {0};
        for (unsigned i = 0; i < n; i++) {
                struct diwarp_wc wc;
                poll1(&wc, what, i);
                uint64_t k = wc.wr_id - first;
                if (wc.status != DIWARP_WC_SUCCESS)
                        die("%s: WR %llu completed with %s (vendor_err %#x)", what,
                            (unsigned long long)wc.wr_id, diwarp_wc_status_str(wc.status),
                            wc.vendor_err);
                if (wc.wr_id < first || k >= n || seen[k])
                        die("%s: unexpected or repeated completion of WR %llu (want %llu..%llu "
                            "once each)",
                            what, (unsigned long long)wc.wr_id, (unsigned long long)first,
                            (unsigned long long)(first + n - 1));
                seen[k] = true;
        }
}

static uint32_t big_len(unsigned r)
{
        return r % 2 ? 512 * KiB + 3 : 2 * MiB;
}

/* MR-3. The receiver's buffer: ROUNDS large slots, then ROUNDS small ones. */
static void run_order(void)
{
        size_t big_area = (size_t)ROUNDS * 2 * MiB;
        if (server) {
                /* every receive posted before the first Send: 2r large, 2r+1 small */
                for (unsigned k = 0; k < 2 * ROUNDS; k++) {
                        unsigned r = k / 2;
                        uint64_t off =
                            k % 2 ? big_area + (size_t)r * SMALL_SLOT : (size_t)r * 2 * MiB;
                        struct diwarp_sge sge = {(uintptr_t)buf + off, k % 2 ? SMALL_SLOT : 2 * MiB,
                                                 lkey};
                        struct diwarp_recv_wr wr = {.wr_id = k, .sg_list = &sge, .num_sge = 1},
                                              *bad;
                        CHECK(diwarp_post_recv(qp, &wr, &bad));
                }
                oob_xchg(0);
                for (unsigned k = 0; k < 2 * ROUNDS; k++) {
                        unsigned r = k / 2;
                        struct diwarp_wc wc;
                        poll1(&wc, "receive completion", k);
                        if (wc.status != DIWARP_WC_SUCCESS)
                                die("receive completion %u (WR %llu): %s", k,
                                    (unsigned long long)wc.wr_id, diwarp_wc_status_str(wc.status));
                        if (wc.wr_id != k)
                                die("receive completion %u is receive WR %llu: out of posting "
                                    "order",
                                    k, (unsigned long long)wc.wr_id);
                        uint32_t want = k % 2 ? SMALL : big_len(r);
                        if (wc.byte_len != want)
                                die("receive completion %u (round %u, %s Send): byte_len %u, want "
                                    "%u%s",
                                    k, r, k % 2 ? "small" : "large", wc.byte_len, want,
                                    wc.byte_len == SMALL
                                        ? ": the 64-byte Send completed ahead of the large "
                                          "Send posted before it"
                                        : "");
                        const uint8_t *p =
                            buf + (k % 2 ? big_area + (size_t)r * SMALL_SLOT : (size_t)r * 2 * MiB);
                        long bad = check(p, want, k % 2 ? 1000 + r : r);
                        if (bad >= 0)
                                die("receive completion %u (round %u, %u bytes): byte %ld differs",
                                    k, r, want, bad);
                }
                struct diwarp_wc extra;
                if (diwarp_cq_poll(cq, 1, &extra) == 1)
                        die("a completion more than the %u Sends: WR %llu status %s", 2 * ROUNDS,
                            (unsigned long long)extra.wr_id, diwarp_wc_status_str(extra.status));
                oob_xchg(0);
                return;
        }
        /* sender: BATCH large slots, BATCH small ones */
        oob_xchg(0); /* the receives are posted */
        for (unsigned r0 = 0; r0 < ROUNDS; r0 += BATCH) {
                for (unsigned r = r0; r < r0 + BATCH; r++) {
                        uint64_t boff = (size_t)(r % BATCH) * 2 * MiB;
                        uint64_t soff = (size_t)BATCH * 2 * MiB + (r % BATCH) * SMALL_SLOT;
                        fill(buf + boff, big_len(r), r);
                        fill(buf + soff, SMALL, 1000 + r);
                        post_send(2 * r, DIWARP_WR_SEND, boff, big_len(r), 0);
                        post_send(2 * r + 1, DIWARP_WR_SEND, soff, SMALL, 0);
                }
                send_done(2 * r0, 2 * BATCH, "send completion");
        }
        oob_xchg(0); /* the receiver checked everything */
}

/* MR-4: one STag, Writes and Reads over every rail. */
static void run_write(void)
{
        struct diwarp_rail_stats b[DIWARP_MAX_RAILS], a[DIWARP_MAX_RAILS];
        if (server) {
                for (uint32_t seed = 1; seed <= 3; seed++) {
                        uint64_t s = oob_xchg(0); /* written */
                        if (s != seed)
                                die("side channel: round %u, the client says %llu", seed,
                                    (unsigned long long)s);
                        long bad = check(buf, WR_BUF, seed);
                        if (bad >= 0)
                                die("Write round %u: byte %ld of the 16 MiB MR differs", seed, bad);
                        oob_xchg(0); /* checked: the next round may write */
                }
                rails(b, NULL);
                oob_xchg(0); /* the Reads start */
                oob_xchg(0); /* and are done */
                int n = rails(a, "read");
                rails_all_used(b, a, n, "RDMA Read responses from one STag (server)");
                oob_xchg(0);
                return;
        }
        int n = rails(b, NULL);
        uint8_t *src = buf + WR_BUF;
        for (uint32_t seed = 1; seed <= 3; seed++) {
                fill(src, WR_BUF, seed);
                for (unsigned i = 0; i < 4; i++)
                        post_send(i, DIWARP_WR_RDMA_WRITE, WR_BUF + i * 2 * MiB, 2 * MiB,
                                  (uint64_t)i * 2 * MiB);
                post_send(4, DIWARP_WR_RDMA_WRITE, WR_BUF + 8 * MiB, 8 * MiB, 8 * MiB);
                send_done(0, 5, "RDMA Write completion");
                oob_xchg(seed);
                oob_xchg(0); /* the server checked every byte */
        }
        rails(a, "write");
        rails_all_used(b, a, n, "RDMA Writes into one STag (client)");
        memset(buf, 0, WR_BUF);
        oob_xchg(0);
        post_send(10, DIWARP_WR_RDMA_READ, 0, 8 * MiB, 0);
        post_send(11, DIWARP_WR_RDMA_READ, 8 * MiB, 8 * MiB, 8 * MiB);
        send_done(10, 2, "RDMA Read completion");
        long bad = check(buf, WR_BUF, 3);
        if (bad >= 0)
                die("RDMA Read of the 16 MiB MR: byte %ld differs from what was written", bad);
        oob_xchg(0);
        oob_xchg(0); /* the server checked its rails */
}

int main(int argc, char **argv)
{
        if (argc < 3 || argc > 4 || (strcmp(argv[1], "order") && strcmp(argv[1], "write"))) {
                fprintf(stderr, "usage: multirail_order order|write PORT [HOST]\n");
                return 2;
        }
        bool order = !strcmp(argv[1], "order");
        server = argc == 3;
        who = server ? "server" : "client";
        alarm(120);
        setvbuf(stdout, NULL, _IOLBF, 0);
        oob_open((uint16_t)atoi(argv[2]), server ? NULL : argv[3]);
        if (order)
                open_all(server ? (size_t)ROUNDS * (2 * MiB + SMALL_SLOT)
                                : (size_t)BATCH * (2 * MiB + SMALL_SLOT));
        else
                open_all(server ? WR_BUF : 2 * (size_t)WR_BUF);
        exchange();
        uint64_t t0 = now_ms();
        if (order)
                run_order();
        else
                run_write();
        struct diwarp_rail_stats r[DIWARP_MAX_RAILS];
        int n = rails(r, "end");
        struct diwarp_counters c;
        CHECK(diwarp_device_counters(dev, &c));
        printf("RESULT role=%s mode=%s rails=%d ms=%llu retransmits=%llu status=ok\n", who, argv[1],
               n, (unsigned long long)(now_ms() - t0), (unsigned long long)c.retransmits);
        CHECK(diwarp_ah_destroy(ah));
        CHECK(diwarp_qp_destroy(qp));
        CHECK(diwarp_mr_dereg(mr));
        CHECK(diwarp_cq_destroy(cq));
        CHECK(diwarp_pd_dealloc(pd));
        CHECK(diwarp_device_close(dev));
        free(buf);
        close(oob);
        return 0;
}
