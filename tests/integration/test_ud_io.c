/* The UDP I/O backends (llp/udp, llp/uring): DIWARP_IO selection, and
 * batched transmit (a posted list of UD sends goes out with sendmmsg, or
 * linked sendmsg SQEs with io_uring) checked end to end: every message
 * arrives byte for byte, send and receive completions come in posting order.
 * A list is longer than two steps' budget: the step of post_send sends the
 * first DW_PROGRESS_BUDGET, and the rest waits (tx_pending) for the later
 * steps, which send it through the UD transport's tx hook (the QPs that wait,
 * round-robin), or never when that hook does not run.
 * Each test sets DIWARP_IO before opening its devices (criterion runs every
 * test in its own process). */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#include "progress/progress.h"
#include "wire/dgram.h"
#include "ud_rts.h"

#define QKEY  0x2222u
#define NMSG  150
#define SLOT  4096
#define GRH   40
#define RSLOT (SLOT + GRH)
_Static_assert(NMSG > 2 * DW_PROGRESS_BUDGET, "a posted list outlasts a step's budget");

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t *buf; /* NMSG send slots then NMSG receive slots */
        uint32_t lkey;
};

/* These cases step each device by hand (diwarp_progress, cq_poll) and
 * assert what one step did (a Send held for a receive WQE, a datagram sent
 * after the wait): the devices run without a progress thread, which would
 * make the same progress behind the test's back. */
__attribute__((constructor)) static void app_driven_progress(void)
{
        setenv("DIWARP_PROGRESS", "app", 0);
}

/* diwarp_open_opts.flags of the devices side_open opens. */
static uint32_t open_flags;

static void side_open(struct side *s)
{
        memset(s, 0, sizeof(*s));
        struct diwarp_open_opts o = {.flags = open_flags};
        cr_assert_eq(diwarp_device_open(&o, &s->dev), 0);
        cr_assert_eq(diwarp_pd_alloc(s->dev, &s->pd), 0);
        cr_assert_eq(diwarp_cq_create(s->dev, 4 * NMSG, NULL, NULL, &s->cq), 0);
        s->qp = ud_qp_make(s->pd, s->cq, NMSG, 2);
        size_t len = (size_t)NMSG * (SLOT + RSLOT);
        s->buf = calloc(1, len);
        cr_assert_not_null(s->buf);
        s->lkey = ud_mr_local(s->pd, s->buf, len, &s->mr);
        ud_qp_to_rts(s->qp, QKEY);
}

static void side_close(struct side *s)
{
        cr_expect_eq(diwarp_qp_destroy(s->qp), 0);
        cr_expect_eq(diwarp_mr_dereg(s->mr), 0);
        cr_expect_eq(diwarp_cq_destroy(s->cq), 0);
        cr_expect_eq(diwarp_pd_dealloc(s->pd), 0);
        cr_expect_eq(diwarp_device_close(s->dev), 0);
        free(s->buf);
}

static uint8_t *rslot(struct side *s, int i)
{
        return s->buf + (size_t)NMSG * SLOT + (size_t)i * RSLOT;
}

static size_t msg_len(int i)
{
        return (size_t)(i * 83) % (SLOT + 1); /* 0 .. 4096, varied */
}

static void post_recvs(struct side *s)
{
        for (int i = 0; i < NMSG; i++) {
                struct diwarp_sge sg = {(uintptr_t)rslot(s, i), RSLOT, s->lkey};
                struct diwarp_recv_wr wr = {.wr_id = 1000 + i, .sg_list = &sg, .num_sge = 1};
                struct diwarp_recv_wr *bad;
                cr_assert_eq(diwarp_post_recv(s->qp, &wr, &bad), 0);
        }
}

/* Posts NMSG sends as ONE list (so one step has them all ready: the batched
 * path), two SGEs each, immediate data on every third. */
static void post_list(struct side *s, struct side *peer, struct diwarp_ah *ah, uint8_t seed)
{
        static struct diwarp_send_wr wr[NMSG];
        static struct diwarp_sge sg[NMSG][2];
        for (int i = 0; i < NMSG; i++) {
                uint8_t *p = s->buf + (size_t)i * SLOT;
                size_t len = msg_len(i);
                for (size_t k = 0; k < len; k++)
                        p[k] = (uint8_t)(k * 5 + i + seed);
                sg[i][0] = (struct diwarp_sge){(uintptr_t)p, (uint32_t)(len / 2), s->lkey};
                sg[i][1] =
                    (struct diwarp_sge){(uintptr_t)p + len / 2, (uint32_t)(len - len / 2), s->lkey};
                wr[i] = (struct diwarp_send_wr){.wr_id = i,
                                                .next = i + 1 < NMSG ? &wr[i + 1] : NULL,
                                                .sg_list = sg[i],
                                                .num_sge = 2,
                                                .opcode = i % 3 == 0 ? DIWARP_WR_SEND_WITH_IMM
                                                                     : DIWARP_WR_SEND,
                                                .send_flags = DIWARP_SEND_SIGNALED,
                                                .imm_data = 0xabc00000u + (uint32_t)i};
                wr[i].wr.ud.ah = ah;
                wr[i].wr.ud.remote_qpn = diwarp_qp_num(peer->qp);
                wr[i].wr.ud.remote_qkey = QKEY;
        }
        struct diwarp_send_wr *bad = NULL;
        cr_assert_eq(diwarp_post_send(s->qp, wr, &bad), 0);
}

/* Polls s->cq until it holds nsend send and nrecv receive completions (5 s),
 * checking order, status and contents. Progresses other too. */
static void check(struct side *s, struct side *other, int nsend, int nrecv, struct side *from,
                  uint8_t seed)
{
        int got_s = 0, got_r = 0;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (got_s < nsend || got_r < nrecv) {
                struct diwarp_wc wc[16];
                int n = diwarp_cq_poll(s->cq, 16, wc);
                cr_assert_geq(n, 0);
                if (other)
                        diwarp_progress(other->dev, 64);
                for (int j = 0; j < n; j++) {
                        cr_assert_eq(wc[j].status, DIWARP_WC_SUCCESS, "wr_id %llu status %d",
                                     (unsigned long long)wc[j].wr_id, wc[j].status);
                        if (wc[j].opcode == DIWARP_WC_SEND) {
                                cr_assert_eq(wc[j].wr_id, (uint64_t)got_s, "send order");
                                got_s++;
                                continue;
                        }
                        int i = got_r++;
                        cr_assert_eq(wc[j].opcode, DIWARP_WC_RECV);
                        cr_assert_eq(wc[j].wr_id, 1000u + (unsigned)i, "receive order");
                        size_t len = msg_len(i);
                        cr_assert_eq(wc[j].byte_len, len + GRH, "message %d length", i);
                        cr_assert_eq(wc[j].src_qp, diwarp_qp_num(from->qp));
                        cr_assert_eq(!!(wc[j].wc_flags & DIWARP_WC_WITH_IMM), i % 3 == 0);
                        if (i % 3 == 0)
                                cr_assert_eq(wc[j].imm_data, 0xabc00000u + (uint32_t)i);
                        const uint8_t *p = rslot(s, i) + GRH;
                        for (size_t k = 0; k < len; k++)
                                if (p[k] != (uint8_t)(k * 5 + i + seed))
                                        cr_assert_fail("message %d byte %zu differs", i, k);
                }
                clock_gettime(CLOCK_MONOTONIC, &t);
                cr_assert_lt(t.tv_sec - t0.tv_sec, 5, "timeout: %d/%d sends, %d/%d receives", got_s,
                             nsend, got_r, nrecv);
        }
}

static uint64_t counter_of(struct side *s, size_t off);
#define CTR(s, f) counter_of(s, offsetof(struct diwarp_counters, f))

/* copy_env: DIWARP_LOCAL_COPY's value ("": unset; NULL: as the test's
 * environment says). copies 1: the sender's device copies to the receiver's,
 * every message is a copy, none crosses the socket; 0: every message crosses
 * the socket; -1: not checked. */
static void one_way(const char *io, const char *progress, const char *copy_env, int copies)
{
        setenv("DIWARP_IO", io, 1);
        if (progress)
                setenv("DIWARP_PROGRESS", progress, 1);
        if (copy_env && *copy_env)
                setenv("DIWARP_LOCAL_COPY", copy_env, 1);
        else if (copy_env)
                unsetenv("DIWARP_LOCAL_COPY");
        struct side a, b;
        side_open(&a);
        side_open(&b);
        union diwarp_gid g;
        struct diwarp_ah *ah;
        diwarp_device_gid(b.dev, &g);
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah), 0);
        post_recvs(&b);
        post_list(&a, &b, ah, 7);
        check(&a, &b, NMSG, 0, NULL, 0);
        if (copies == 1) {
                cr_assert_eq(CTR(&a, local_copies), NMSG);
                cr_assert_eq(CTR(&b, rx_packets), NMSG);
        } else if (copies == 0) {
                cr_assert_eq(CTR(&a, local_copies), 0);
        }
        check(&b, &a, 0, NMSG, &a, 7);
        cr_expect_eq(diwarp_ah_destroy(ah), 0);
        side_close(&a);
        side_close(&b);
}

static void batch_one_way(const char *io, const char *progress, bool copy)
{
        one_way(io, progress, copy ? "1" : NULL, copy ? 1 : -1);
}

/* Both directions at once, so one side's sends wait on io_uring completions
 * while the other side's datagrams arrive (receive completions met during a
 * send are kept for the next receive step). */
static void batch_both_ways(const char *io)
{
        setenv("DIWARP_IO", io, 1);
        struct side a, b;
        side_open(&a);
        side_open(&b);
        union diwarp_gid ga, gb;
        struct diwarp_ah *ah_ab, *ah_ba;
        diwarp_device_gid(a.dev, &ga);
        diwarp_device_gid(b.dev, &gb);
        cr_assert_eq(diwarp_ah_create(a.pd, &gb, &ah_ab), 0);
        cr_assert_eq(diwarp_ah_create(b.pd, &ga, &ah_ba), 0);
        for (int round = 0; round < 5; round++) {
                post_recvs(&a);
                post_recvs(&b);
                post_list(&a, &b, ah_ab, (uint8_t)(round * 2));
                post_list(&b, &a, ah_ba, (uint8_t)(round * 2 + 1));
                check(&a, &b, NMSG, NMSG, &b, (uint8_t)(round * 2 + 1));
                check(&b, &a, NMSG, NMSG, &a, (uint8_t)(round * 2));
        }
        cr_expect_eq(diwarp_ah_destroy(ah_ab), 0);
        cr_expect_eq(diwarp_ah_destroy(ah_ba), 0);
        side_close(&a);
        side_close(&b);
}

TestSuite(ud_io, .timeout = 60);

Test(ud_io, unknown_io_backend_fails_open)
{
        struct diwarp_device *dev = NULL;
        setenv("DIWARP_IO", "epoll", 1);
        cr_assert_eq(diwarp_device_open(NULL, &dev), -EINVAL);
        cr_assert_null(dev);
        setenv("DIWARP_IO", "", 1); /* empty = unset: the default (plain) */
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

Test(ud_io, uring_opens_or_falls_back)
{
        /* io_uring, or the plain backend with a warning where the kernel refuses it. */
        struct diwarp_device *dev = NULL;
        setenv("DIWARP_IO", "uring", 1);
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

Test(ud_io, batched_list_plain)
{
        batch_one_way("plain", NULL, false);
}

Test(ud_io, batched_list_uring)
{
        batch_one_way("uring", NULL, false);
}

Test(ud_io, batched_list_uring_progress_thread)
{
        batch_one_way("uring", "thread", false);
}

Test(ud_io, local_copy_batched_list)
{
        batch_one_way("plain", NULL, true);
}

/* DIWARP_OPEN_LOCAL_COPY: copies unless DIWARP_LOCAL_COPY says otherwise
 * (the environment wins); without the flag and the variable, none. */
Test(ud_io, open_flag_local_copy)
{
        open_flags = DIWARP_OPEN_LOCAL_COPY;
        one_way("plain", NULL, "", 1);
}

Test(ud_io, open_flag_local_copy_env_off)
{
        open_flags = DIWARP_OPEN_LOCAL_COPY;
        one_way("plain", NULL, "0", 0);
}

Test(ud_io, no_open_flag_no_local_copy)
{
        one_way("plain", NULL, "", 0);
}

Test(ud_io, open_flag_unknown)
{
        struct diwarp_device *dev = NULL;
        struct diwarp_open_opts o = {.flags = DIWARP_OPEN_LOCAL_COPY << 1};
        cr_assert_eq(diwarp_device_open(&o, &dev), -EINVAL);
        cr_assert_null(dev);
        o.flags = ~0u;
        cr_assert_eq(diwarp_device_open(&o, &dev), -EINVAL);
        cr_assert_null(dev);
}

Test(ud_io, both_ways_plain)
{
        batch_both_ways("plain");
}

Test(ud_io, both_ways_uring)
{
        batch_both_ways("uring");
}

/* ---- the UD MSN on the wire ---- */

/* A plain UDP socket where the device of instance inst would listen: the
 * engine sends datagrams for QPN inst << 12 | 2 there (the highest free
 * instance, away from those other devices take). */
static int raw_udp_peer(uint32_t *qpn)
{
        const char *b = getenv("DIWARP_PORT_BASE");
        uint32_t base = b ? (uint32_t)strtoul(b, NULL, 0) : 17471;
        for (uint32_t inst = 4095; inst > 2048; inst--) {
                if (base + inst > 65535)
                        continue;
                int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in sa = {.sin_family = AF_INET,
                                         .sin_port = htons((uint16_t)(base + inst)),
                                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
                        *qpn = inst << 12 | 2;
                        return fd;
                }
                if (fd >= 0)
                        close(fd);
        }
        cr_assert_fail("no free port for a raw UDP peer");
        return -1;
}

/* A Send of the first len bytes of s's buffer (wr_id 0). */
static void ud_send_to(struct side *s, struct diwarp_ah *ah, uint32_t qpn, uint32_t qkey,
                       uint32_t len, unsigned flags)
{
        struct diwarp_sge sg = {(uintptr_t)s->buf, len, s->lkey};
        struct diwarp_send_wr wr = {
            .sg_list = &sg, .num_sge = 1, .opcode = DIWARP_WR_SEND, .send_flags = flags};
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = qpn;
        wr.wr.ud.remote_qkey = qkey;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(s->qp, &wr, &bad), 0);
}

/* The DDP MSN of the next datagram on fd (big-endian at datagram header +
 * 10), checked against what the UD decoder reads, and its source QPN. */
static uint32_t wire_msn(int fd, uint32_t *src_qpn)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};
        cr_assert_eq(poll(&p, 1, 5000), 1, "no UD datagram within 5 s");
        uint8_t pkt[2048];
        ssize_t n = recv(fd, pkt, sizeof(pkt), 0);
        cr_assert_geq(n, (ssize_t)(DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN + 4));
        cr_assert_eq(pkt[1] & DW_DGRAM_F_RD, 0, "a UD datagram");
        const uint8_t *d = pkt + DW_DGRAM_HDR_LEN;
        cr_assert_eq(d[0], 0x41, "DDP: untagged, L, DV 1");
        cr_assert_eq(d[1], 0x43, "RDMAP: RV 1, Send");
        uint32_t qn = (uint32_t)d[6] << 24 | d[7] << 16 | d[8] << 8 | d[9];
        uint32_t msn = (uint32_t)d[10] << 24 | d[11] << 16 | d[12] << 8 | d[13];
        cr_assert_eq(qn, 0);
        struct dw_dgram_ud u;
        cr_assert_eq(dw_dgram_decode_ud(pkt, (size_t)n - DW_DGRAM_CRC_LEN, &u, NULL), 0);
        cr_assert_eq(u.msn, msn);
        *src_qpn = u.src_qpn;
        return msn;
}

/* UD MSNs (docs/PROTOCOL.md, UD over UDP): each UD QP numbers its Sends from
 * a random first MSN, chosen at creation and again at each reset, so a
 * restarted QP on the same port and QPN does not repeat its predecessor's
 * MSNs (the receiver's duplicate filter keys on address, QPN and MSN);
 * consecutive Sends of a QP have consecutive MSNs. */
Test(ud_io, ud_msn_random_first_then_consecutive)
{
        struct side a, c;
        side_open(&a);
        side_open(&c); /* a second UD QP */
        uint32_t qpn;
        int fd = raw_udp_peer(&qpn);
        /* The raw peer is on 127.0.0.1 (the device's GID 0 is the host's
         * first address, which may be another). */
        union diwarp_gid g = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
        struct diwarp_ah *ah_a, *ah_c;
        cr_assert_eq(diwarp_ah_create(a.pd, &g, &ah_a), 0);
        cr_assert_eq(diwarp_ah_create(c.pd, &g, &ah_c), 0);
        uint32_t src;
        ud_send_to(&a, ah_a, qpn, QKEY, 10, 0);
        uint32_t a0 = wire_msn(fd, &src);
        cr_assert_eq(src, diwarp_qp_num(a.qp));
        ud_send_to(&a, ah_a, qpn, QKEY, 10, 0);
        cr_assert_eq(wire_msn(fd, &src), a0 + 1, "consecutive MSNs");
        ud_send_to(&c, ah_c, qpn, QKEY, 10, 0);
        uint32_t c0 = wire_msn(fd, &src);
        cr_assert_eq(src, diwarp_qp_num(c.qp));
        /* Random 32-bit values: equal, or both the RFC 5041 stream start of
         * 1, by chance once in 2^32. */
        cr_assert_neq(a0, c0, "two QPs start at the same MSN %#x", a0);
        cr_assert(a0 != 1 || c0 != 1, "both QPs start at MSN 1");
        /* Reset and back to RTS: a new first MSN. */
        struct diwarp_qp_attr at = {.qp_state = DIWARP_QPS_RESET};
        cr_assert_eq(diwarp_qp_modify(a.qp, &at, DIWARP_QP_STATE), 0);
        at = (struct diwarp_qp_attr){.qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .port_num = 1};
        cr_assert_eq(diwarp_qp_modify(a.qp, &at,
                                      DIWARP_QP_STATE | DIWARP_QP_QKEY | DIWARP_QP_PKEY_INDEX |
                                          DIWARP_QP_PORT),
                     0);
        at.qp_state = DIWARP_QPS_RTR;
        cr_assert_eq(diwarp_qp_modify(a.qp, &at, DIWARP_QP_STATE), 0);
        at.qp_state = DIWARP_QPS_RTS;
        cr_assert_eq(diwarp_qp_modify(a.qp, &at, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN), 0);
        ud_send_to(&a, ah_a, qpn, QKEY, 10, 0);
        uint32_t a1 = wire_msn(fd, &src);
        cr_assert_neq(a1, a0 + 2, "after a reset the MSNs do not go on (%#x)", a1);
        cr_assert_neq(a1, a0, "after a reset the MSNs do not start over (%#x)", a1);
        /* Send completions, for a clean close. */
        struct diwarp_wc wc[4];
        for (int k = 0; k < 100 && (diwarp_cq_poll(a.cq, 4, wc) >= 0); k++)
                ;
        close(fd);
        cr_expect_eq(diwarp_ah_destroy(ah_a), 0);
        cr_expect_eq(diwarp_ah_destroy(ah_c), 0);
        side_close(&a);
        side_close(&c);
}

/* ---- one copy to a device of this process (DIWARP_LOCAL_COPY) ---- */

static uint64_t counter_of(struct side *s, size_t off)
{
        struct diwarp_counters c;
        cr_assert_eq(diwarp_device_counters(s->dev, &c), 0);
        return *(const uint64_t *)((const uint8_t *)&c + off);
}

/* What the receiver sees is what the datagram gives: the same GRH (source
 * and destination GID, payload length) from a copying sender as from one
 * whose message crosses the socket; a wrong Q_Key drops the message at the
 * receiver, counted there, as on the wire. A Send to a QP without a receive
 * WQE waits for one (it may be on its way) and is a copy when it comes;
 * after DW_UD_HOLD_NS (1 ms) without one it goes as a datagram, which the
 * receiver drops. */
Test(ud_io, local_copy_same_grh_and_drops)
{
        struct side wire, copy, b;
        unsetenv("DIWARP_LOCAL_COPY");
        side_open(&wire);
        side_open(&b);
        setenv("DIWARP_LOCAL_COPY", "1", 1);
        side_open(&copy);
        union diwarp_gid g;
        struct diwarp_ah *ah_w, *ah_c;
        diwarp_device_gid(b.dev, &g);
        cr_assert_eq(diwarp_ah_create(wire.pd, &g, &ah_w), 0);
        cr_assert_eq(diwarp_ah_create(copy.pd, &g, &ah_c), 0);
        uint32_t bq = diwarp_qp_num(b.qp);
        for (int i = 0; i < 2; i++) {
                struct diwarp_sge sg = {(uintptr_t)rslot(&b, i), RSLOT, b.lkey};
                struct diwarp_recv_wr wr = {.wr_id = 1000 + i, .sg_list = &sg, .num_sge = 1};
                struct diwarp_recv_wr *bad;
                cr_assert_eq(diwarp_post_recv(b.qp, &wr, &bad), 0);
        }
        memset(wire.buf, 0x5a, 300);
        memset(copy.buf, 0x5a, 300);
        ud_send_to(&wire, ah_w, bq, QKEY, 300, DIWARP_SEND_SIGNALED);
        check(&wire, &b, 1, 0, NULL, 0);
        struct diwarp_wc wc;
        uint64_t end = (uint64_t)time(NULL) + 5;
        while (diwarp_cq_poll(b.cq, 1, &wc) != 1) {
                diwarp_progress(b.dev, 64);
                cr_assert_lt((uint64_t)time(NULL), end, "the datagram did not arrive");
        }
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        ud_send_to(&copy, ah_c, bq, QKEY, 300, DIWARP_SEND_SIGNALED);
        cr_assert_eq(diwarp_cq_poll(copy.cq, 1, &wc), 1, "the copy completes at the post");
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(diwarp_cq_poll(b.cq, 1, &wc), 1, "and so does its receive");
        cr_assert_eq(wc.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wc.byte_len, 300 + GRH);
        cr_assert_eq(wc.src_qp, diwarp_qp_num(copy.qp));
        cr_assert_eq(memcmp(rslot(&b, 0), rslot(&b, 1), GRH + 300), 0,
                     "GRH and payload differ between the datagram and the copy");
        cr_assert_eq(CTR(&copy, local_copies), 1);
        cr_assert_eq(CTR(&wire, local_copies), 0);
        /* No receive posted: the Send waits for one, and a receive posted
         * meanwhile takes it as a copy. */
        ud_send_to(&copy, ah_c, bq, QKEY, 10, DIWARP_SEND_SIGNALED);
        cr_assert_eq(diwarp_cq_poll(copy.cq, 1, &wc), 0, "the Send did not wait for a receive");
        struct diwarp_sge one = {(uintptr_t)rslot(&b, 2), RSLOT, b.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 1002, .sg_list = &one, .num_sge = 1};
        struct diwarp_recv_wr *rbad;
        cr_assert_eq(diwarp_post_recv(b.qp, &rwr, &rbad), 0);
        check(&copy, NULL, 1, 0, NULL, 0);
        cr_assert_eq(CTR(&copy, local_copies), 2);
        cr_assert_eq(diwarp_cq_poll(b.cq, 1, &wc), 1, "the held Send arrived");
        cr_assert_eq(wc.wr_id, 1002);
        cr_assert_eq(wc.byte_len, 10 + GRH);
        /* None comes: after the wait it goes as a datagram, dropped there. */
        ud_send_to(&copy, ah_c, bq, QKEY, 10, DIWARP_SEND_SIGNALED);
        check(&copy, NULL, 1, 0, NULL, 0);
        cr_assert_eq(CTR(&copy, local_copies), 2, "no copy without a receive WQE");
        end = (uint64_t)time(NULL) + 5;
        while (CTR(&b, rx_dropped_no_recv) != 1) {
                diwarp_progress(b.dev, 64);
                cr_assert_lt((uint64_t)time(NULL), end, "the datagram did not arrive");
        }
        /* A wrong Q_Key with a receive posted. */
        post_recvs(&b);
        ud_send_to(&copy, ah_c, bq, QKEY + 1, 10, DIWARP_SEND_SIGNALED);
        cr_assert_eq(diwarp_cq_poll(copy.cq, 1, &wc), 1, "a copy completes at the post");
        cr_assert_eq(CTR(&copy, local_copies), 3);
        cr_assert_eq(CTR(&b, rx_dropped_qkey), 1);
        cr_assert_eq(diwarp_cq_poll(b.cq, 1, &wc), 0, "a dropped message completed");
        cr_expect_eq(diwarp_ah_destroy(ah_w), 0);
        cr_expect_eq(diwarp_ah_destroy(ah_c), 0);
        side_close(&wire);
        side_close(&copy);
        side_close(&b);
}
