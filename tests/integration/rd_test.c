/* RD transport end to end (rd/rd.c): RD QPs made with diwarpdv_create_qp and
 * RC QPs carried by RD (DIWARP_RC_TRANSPORT=rd).
 *
 *   rd_test ops    rd|rc   every operation, sizes 0 .. 64 MiB, byte-exact
 *   rd_test mw     rd|rc   memory windows: type 2 bound on a QP, Writes and
 *                          Reads inside its bounds, refused past them, unbound
 *                          by a Send with Invalidate (rkey reported); type 1
 *                          bound, used and unbound
 *   rd_test stream rd|rc   2000 Sends/Writes-with-imm of mixed sizes: exactly
 *                          once, in order, byte-exact (meson runs it under
 *                          DIWARP_FAULT drop/dup/reorder/corrupt/mixed)
 *   rd_test loss   rd|rc   48 x 1 MiB RDMA Writes under DIWARP_FAULT drop: byte-exact,
 *                          retransmissions at most ~3x the dropped datagrams
 *   rd_test gib    rd|rc   a 1 GiB RDMA Write, Send and Read, every word checked
 *   rd_test guard  rd|rc   24 large RDMA Writes into guarded slots, then Reads
 *                          back into guarded sinks (meson runs it under
 *                          DIWARP_FAULT corruption): byte-exact, no byte
 *                          outside the targets changed, direct placement
 *                          used on both sides unless DIWARP_RD_DIRECT=0
 *   rd_test prot   rd|rc   protection violations -> REM_ACCESS_ERR
 *   rd_test mailbox rd|rc  4 senders (RC: 1) into one QP that posts its
 *                          receives slowly, through a small ring: all
 *                          delivered once, in order, byte-exact, parked and
 *                          credit waits counted, no RNR NAK
 *   rd_test mbox   rd      the application mailbox (diwarpdv_mbox_open): 2
 *                          senders into a 64-slot ring released late and out
 *                          of order: every message once, in order, byte-exact,
 *                          contiguous across the end of the ring; credit waits,
 *                          no RNR NAK; misuses refused
 *   rd_test rnr    rd|rc   Send before the receive is posted: delivered; with
 *                          credits parked in the mailbox (the Send completes,
 *                          no RNR NAK, no retransmission), with
 *                          DIWARP_CREDIT=off refused with RNR NAKs until then
 *   rd_test path   rd|rc   a 64 MiB RDMA Write and Read over loopback,
 *                          byte-exact, in datagrams of the route's MTU (lo's,
 *                          less 28, capped by DIWARP_UDP_MTU), none larger
 *   rd_test srq    rd|rc   3 QPs on one SRQ, 3 peers: RNR while the SRQ is
 *                          empty, the limit event, then every message
 *                          exactly once, in order per stream, byte-exact
 *   rd_test srqpd  rd|rc   a QP in one PD on an SRQ in another: a receive
 *                          registered in the SRQ's PD takes a Send, one in
 *                          the QP's PD fails with LOC_PROT_ERR (sender
 *                          REM_OP_ERR, states as for any lkey failure); the
 *                          QP's own Read lands in memory of the QP's PD
 *   rd_test invfail rd|rc  Send with Invalidate of an STag the receiver cannot
 *                          invalidate (another PD, type 1 window, none):
 *                          REM_INV_REQ_ERR at the receiver, REM_ACCESS_ERR at
 *                          the sender (error NAK), sender QP in ERR,
 *                          receiver in RTS serving another peer (RD) or ERR
 *   rd_test mboxinv rd     Send with Invalidate into an application mailbox
 *                          (a region of the QP's PD, a type 2 window): the
 *                          receive reports WITH_INV and the STag, a Write
 *                          through it is then refused (REM_ACCESS_ERR)
 *   rd_test fds            one UDP socket per device for 64 QPs x 64 peers
 *   rd_test heap           10 000 pseudo-streams per device: idle peer state
 *                          <= 256 bytes, heap growth per pseudo-stream
 *   rd_test order  rd|rc   300 rounds of two 8 KiB Writes to the same
 *                          bytes, a Fetch-and-Add of their first word and a
 *                          Read of them, posted back to back (meson runs it
 *                          under DIWARP_FAULT reorder and drop, in datagrams
 *                          of MTU 1500): the Atomic returns what the second
 *                          Write put there and the Read what the Atomic left
 *                          and the rest of the second Write, every round:
 *                          Reads and Atomics run in stream order, and a late
 *                          segment never overwrites a later Write's bytes
 *   rd_test pingpong rd|rc  2000 Send exchanges between QPs whose send queues
 *                          hold one WR, each answer posted as soon as its
 *                          receive completes: every post accepted, every
 *                          completion in order, byte-exact
 *   rd_test vanish rd|rc kill|stop   peer process killed / stopped: the WR
 *                          fails with RETRY_EXC_ERR within the peer timeout
 *   rd_test pull   rd|rc   receiver-paced Sends (rd/rd_pull.c): 256 KiB - 1,
 *                          256 KiB, 1 MiB + 17 and 8 MiB, 1 or 3 SGEs on
 *                          either side, plain / Solicited Event (a solicited-
 *                          only CQ fires for those only) / Invalidate (the
 *                          STag refuses Writes afterwards), byte-exact with
 *                          guard bytes around every receive SGE and in its
 *                          spare room, the receiver's pulls / pull_bytes
 *                          exactly as the size implies (none with
 *                          DIWARP_RD_PULL_MIN=0); then 24 large Sends, each
 *                          followed by a small one, posted at once (more than
 *                          the 16 pull entries): all complete, in posting
 *                          order (meson also runs it under DIWARP_FAULT)
 *   rd_test pulllen rd|rc  a 512 KiB Send into a 128 KiB and a 1000-byte
 *                          receive WR: LOC_LEN_ERR at the receiver,
 *                          REM_INV_REQ_ERR at the sender and a flush behind
 *                          it, sender QP in ERR, receiver QP in ERR (RC) or
 *                          RTS and serving another peer (RD), nothing
 *                          written outside the receive WR, nothing pulled
 *   rd_test crc    rd|rc   DIWARP_RD_CRC=0: the datagram on the wire (a raw
 *                          UDP socket as peer: version 2, NOCRC, no trailer;
 *                          with 1: its CRC32c; the first Send carries its
 *                          START descriptor, its MSN the first), data end to end
 *                          with both devices at 0, and mismatched devices
 *                          either way: rx_dropped_nocrc at the refusing side,
 *                          RETRY_EXC_ERR at the sender within its peer timeout
 *   rd_test caps   rd|rc   100 Writes and Sends posted at once under the
 *                          DIWARP_INFLIGHT_QP or _PROC meson sets: all
 *                          complete in order, byte-exact, inflight_waits > 0
 *   rd_test hostcap rd|rc  DIWARP_INFLIGHT_HOST=3 on a private pool shared by
 *                          forked processes: 3 streamers complete, between
 *                          them waiting for tokens; a process holding every
 *                          token (RNR for ever) blocks 2 more until
 *                          SIGKILLed, then they complete and its tokens are
 *                          reclaimed, while a live process whose waiting
 *                          QP went to error holds and waits for nothing; the
 *                          pool's name is unlinked
 *   rd_test slowrx rd|rc [write|send]   a receiver at DIWARP_FAULT=slowrx:
 *                          2000000 takes 4 MiB by Writes and by receiver-
 *                          paced Sends: intact, no faster than the rate,
 *                          throttle waits counted, and the Sends with at most
 *                          1 % of their datagrams retransmitted
 *   rd_test cc     rd|rc   after traffic, diwarpdv_query_rd_path shows a
 *                          window and RTTs and the device's cc_* counters
 *                          equal its one path's; DIWARP_CC=off: no congestion
 *                          event, no pacing rate; under drops: a decrease
 *   rd_test restart rd     a raw UDP socket as the peer: after the device
 *                          started its side of the stream over (idle time),
 *                          a late copy of the peer's first Send (START) is
 *                          not delivered again, and its next Send once
 *   rd_test rqorder rd [srq]  receive WRs completing out of order: a 4-deep
 *                          receive queue whose WRs 0 and 2 take large Sends
 *                          from two peers that are not progressed, 1 and 3
 *                          small Sends of a third that complete: reposting
 *                          two WRs is accepted (their slots are free), they
 *                          take two more, and the large Sends then complete
 *                          byte-exact into WRs 0 and 2; with "srq", the
 *                          same with the receives posted to a 4-deep SRQ
 *   rd_test dereg  rd|rc   both ways at once, under DIWARP_FAULT: Writes from
 *                          regions registered per message and deregistered
 *                          at the Write's completion, Reads of regions
 *                          deregistered when the reader's FIN arrives: every
 *                          completion succeeds, byte-exact (DR_MESSAGES:
 *                          how many of each, default 1500)
 *
 * Two devices in one process (two instances, two UDP sockets) except for
 * vanish and hostcap, which fork. Exit 0 pass, 1 fail; alarm() bounds each
 * run.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

/* Engine-internal layouts the crc and hostcap cases read: the datagram
 * header on the wire, its CRC32c, and the in-flight pool's shared memory. */
#include "flow/inflight.h"
#include "wire/crc32c.h"
#include "wire/ddp.h"
#include "wire/dgram.h"
#include "wire/rdmap.h"

/* Engine-internal (rd/rd.h): per-peer state size, reported by the fds case. */
size_t dw_rd_peer_bytes(void);

#define QKEY 0x11223344u
#define MiB  (1024u * 1024u)

static bool rc_mode;
static size_t buf_len = 64 * MiB + 4096;
static struct diwarp_srq *make_srq; /* qp_make puts new QPs on it when set */
static uint32_t sq_depth = 4096;    /* max_send_wr of the QPs qp_make creates */
static uint32_t rq_depth = 4096;    /* max_recv_wr of those QPs */
static uint32_t max_sge = 2;        /* max_send_sge and max_recv_sge of those QPs */
static bool side_channel;           /* side_open gives the CQ a completion channel */

static void die(const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "FAIL: ");
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        exit(1);
}

#define CHECK(call)                                                                                \
        do {                                                                                       \
                int _e = (call);                                                                   \
                if (_e < 0)                                                                        \
                        die("%s:%d %s: %s", __FILE__, __LINE__, #call, strerror(-_e));             \
        } while (0)

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_comp_channel *ch; /* with side_channel */
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        struct diwarp_ah *ah; /* to the other side */
        uint8_t *buf;
        uint32_t lkey, rkey;
        uint32_t qpn;
        union diwarp_gid gid;
};

static void side_open(struct side *s, int access)
{
        memset(s, 0, sizeof(*s));
        CHECK(diwarp_device_open(NULL, &s->dev));
        CHECK(diwarp_pd_alloc(s->dev, &s->pd));
        if (side_channel)
                CHECK(diwarp_comp_channel_create(s->dev, &s->ch));
        CHECK(diwarp_cq_create(s->dev, 8192, NULL, s->ch, &s->cq));
        s->buf = aligned_alloc(4096, buf_len);
        if (!s->buf)
                die("no memory");
        memset(s->buf, 0, buf_len);
        CHECK(diwarp_mr_reg(s->pd, s->buf, buf_len, (uintptr_t)s->buf, access, &s->mr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(s->mr, &mi));
        s->lkey = mi.lkey;
        s->rkey = mi.rkey;
        CHECK(diwarp_device_gid(s->dev, &s->gid));
}

static void qp_make(struct side *s, int qp_access)
{
        struct diwarp_qp_init_attr ia = {
            .send_cq = s->cq,
            .recv_cq = s->cq,
            .cap = {.max_send_wr = sq_depth,
                    .max_recv_wr = rq_depth,
                    .max_send_sge = max_sge,
                    .max_recv_sge = max_sge,
                    .max_inline_data = 64},
            .qp_type = DIWARP_QPT_RC,
            .srq = make_srq,
        };
        if (rc_mode)
                CHECK(diwarp_qp_create(s->pd, &ia, &s->qp));
        else
                CHECK(diwarpdv_create_qp(s->pd, &ia, &s->qp));
        s->qpn = diwarp_qp_num(s->qp);
        struct diwarp_qp_attr a = {
            .qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .qp_access_flags = qp_access, .port_num = 1};
        CHECK(diwarp_qp_modify(
            s->qp, &a, DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS | (rc_mode ? 0 : DIWARP_QP_QKEY)));
}

static void qp_connect(struct side *s, const struct side *peer, uint32_t peer_qpn)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTR};
        int mask = DIWARP_QP_STATE;
        if (rc_mode) {
                a.dgid = peer->gid;
                a.dest_qp_num = peer_qpn;
                a.rq_psn = peer_qpn * 7 + 100; /* = the peer's sq_psn below */
                a.max_dest_rd_atomic = 16;
                a.rnr_retry = 7;
                mask |= DIWARP_QP_AV | DIWARP_QP_DEST_QPN | DIWARP_QP_RQ_PSN |
                        DIWARP_QP_MAX_DEST_RD_ATOMIC | DIWARP_QP_RNR_RETRY;
        }
        CHECK(diwarp_qp_modify(s->qp, &a, mask));
        a.qp_state = DIWARP_QPS_RTS;
        a.sq_psn = s->qpn * 7 + 100;
        a.max_rd_atomic = 16;
        CHECK(diwarp_qp_modify(s->qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_MAX_QP_RD_ATOMIC));
        if (!rc_mode)
                CHECK(diwarp_ah_create(s->pd, &peer->gid, &s->ah));
}

/* Up to 8 variables set for the devices opened until env_pop. */
struct env_saved {
        char *name[8], *old[8];
        int n;
};

/* Sets "NAME=VALUE;NAME=VALUE" (';': DIWARP_FAULT values hold commas). Both
 * devices of a pair read the one process environment when they open, so a
 * setting meant for one side is pushed around its open only. */
static void env_push(const char *list, struct env_saved *sv)
{
        sv->n = 0;
        if (!list)
                return;
        char *copy = strdup(list), *save = NULL;
        for (char *t = strtok_r(copy, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
                char *eq = strchr(t, '=');
                if (!eq || sv->n == 8)
                        die("env_push: bad list %s", list);
                *eq = '\0';
                const char *old = getenv(t);
                sv->name[sv->n] = strdup(t);
                sv->old[sv->n] = old ? strdup(old) : NULL;
                sv->n++;
                setenv(t, eq + 1, 1);
        }
        free(copy);
}

static void env_pop(struct env_saved *sv)
{
        for (int i = sv->n - 1; i >= 0; i--) {
                if (sv->old[i])
                        setenv(sv->name[i], sv->old[i], 1);
                else
                        unsetenv(sv->name[i]);
                free(sv->name[i]);
                free(sv->old[i]);
        }
        sv->n = 0;
}

/* pair_open with a_env set while a's device opens and b_env while b's does
 * (env_push lists, NULL for none); b_channel gives b's CQ a channel. */
static void pair_open_split(struct side *a, struct side *b, int qp_access, const char *a_env,
                            const char *b_env, bool b_channel)
{
        int acc = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                  DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_ATOMIC;
        struct env_saved sv;
        env_push(a_env, &sv);
        side_open(a, acc);
        env_pop(&sv);
        env_push(b_env, &sv);
        side_channel = b_channel;
        side_open(b, acc);
        side_channel = false;
        env_pop(&sv);
        qp_make(a, qp_access);
        qp_make(b, qp_access);
        qp_connect(a, b, b->qpn);
        qp_connect(b, a, a->qpn);
}

static void pair_open(struct side *a, struct side *b, int qp_access)
{
        pair_open_split(a, b, qp_access, NULL, NULL, false);
}

static void side_close(struct side *s)
{
        if (s->ah)
                CHECK(diwarp_ah_destroy(s->ah));
        if (s->qp)
                CHECK(diwarp_qp_destroy(s->qp));
        CHECK(diwarp_mr_dereg(s->mr));
        CHECK(diwarp_cq_destroy(s->cq));
        if (s->ch)
                CHECK(diwarp_comp_channel_destroy(s->ch));
        CHECK(diwarp_pd_dealloc(s->pd));
        CHECK(diwarp_device_close(s->dev));
        free(s->buf);
}

/* Posts one WR from a to b (destination filled for RD). */
static void post(struct side *a, struct side *b, struct diwarp_send_wr *wr)
{
        struct diwarp_send_wr *bad = NULL;
        bool send = wr->opcode == DIWARP_WR_SEND || wr->opcode == DIWARP_WR_SEND_WITH_IMM;
        if (rc_mode) {
                CHECK(diwarp_post_send(a->qp, wr, &bad));
        } else if (send) {
                wr->wr.ud.ah = a->ah;
                wr->wr.ud.remote_qpn = b->qpn;
                wr->wr.ud.remote_qkey = QKEY;
                CHECK(diwarp_post_send(a->qp, wr, &bad));
        } else {
                struct diwarpdv_rd_dest d = {a->ah, b->qpn, QKEY};
                CHECK(diwarpdv_post_send_rd(a->qp, wr, &d, &bad));
        }
}

/* One signaled atomic WR from a to the word at target (rkey) of b, its
 * result into the first 8 bytes of a's buffer. */
static void post_atomic(struct side *a, struct side *b, enum diwarp_wr_opcode op, uint64_t id,
                        uint64_t *target, uint32_t rkey, uint64_t compare_add, uint64_t swap)
{
        struct diwarp_sge sge = {(uintptr_t)a->buf, 8, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = rkey;
        wr.wr.atomic.compare_add = compare_add;
        wr.wr.atomic.swap = swap;
        post(a, b, &wr);
}

static void post_recv(struct side *s, uint64_t id, uint64_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + off, len, s->lkey};
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        CHECK(diwarp_post_recv(s->qp, &wr, &bad));
}

/* Polls both sides until `want` completions arrived on side w. */
static int poll_until(struct side *w, struct side *other, struct diwarp_wc *out, int want,
                      unsigned timeout_ms)
{
        int got = 0;
        uint64_t end = now_ms() + timeout_ms;
        while (got < want) {
                int n = diwarp_cq_poll(w->cq, want - got, out + got);
                if (n < 0)
                        die("cq_poll: %s", strerror(-n));
                got += n;
                if (other) {
                        struct diwarp_wc junk[4];
                        int m = diwarp_cq_poll(other->cq, 0, junk);
                        (void)m;
                        diwarp_progress(other->dev, 64);
                }
                if (now_ms() > end)
                        return got;
        }
        return got;
}

static void expect_wc(struct diwarp_wc *wc, uint64_t id, enum diwarp_wc_status st, const char *what)
{
        if (wc->wr_id != id || wc->status != st)
                die("%s: wc wr_id %#llx status %d (%s), want %#llx status %d", what,
                    (unsigned long long)wc->wr_id, wc->status, diwarp_wc_status_str(wc->status),
                    (unsigned long long)id, st);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
        uint32_t x = seed * 2654435761u + 1;
        for (size_t i = 0; i < n; i++) {
                x = x * 1103515245u + 12345u;
                p[i] = (uint8_t)(x >> 16);
        }
}

static void verify(const uint8_t *a, const uint8_t *b, size_t n, const char *what, uint32_t size)
{
        if (memcmp(a, b, n) != 0) {
                size_t i = 0;
                while (a[i] == b[i])
                        i++;
                die("%s size %u: data differs at byte %zu", what, size, i);
        }
}

/* ---------------------------------------------------------------- ops */

static const uint32_t sizes[] = {0, 1, 4095, 4096, 65536, MiB, 64 * MiB};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static int case_ops(void)
{
        struct side a, b;
        int all = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                  DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_ATOMIC;
        pair_open(&a, &b, all);
        struct diwarp_wc wc[4];
        uint8_t *ref = malloc(64 * MiB);
        if (!ref)
                die("no memory");
        for (unsigned k = 0; k < NSIZES; k++) {
                uint32_t sz = sizes[k];
                unsigned tmo = 120000;
                /* Send and Send with Immediate */
                for (int imm = 0; imm < 2; imm++) {
                        fill(a.buf, sz, sz + imm);
                        memset(b.buf, 0, sz + 16);
                        post_recv(&b, 77, 0, sz + 16);
                        struct diwarp_sge sge = {(uintptr_t)a.buf, sz, a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = 1,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = imm ? DIWARP_WR_SEND_WITH_IMM
                                                                  : DIWARP_WR_SEND,
                                                    .send_flags = DIWARP_SEND_SIGNALED,
                                                    .imm_data = 0xabcd1234};
                        post(&a, &b, &wr);
                        if (poll_until(&b, &a, wc, 1, tmo) != 1)
                                die("send size %u: no receive completion", sz);
                        expect_wc(wc, 77, DIWARP_WC_SUCCESS, "recv");
                        if (wc->byte_len != sz || wc->opcode != DIWARP_WC_RECV ||
                            wc->src_qp != a.qpn ||
                            (imm &&
                             (!(wc->wc_flags & DIWARP_WC_WITH_IMM) || wc->imm_data != 0xabcd1234)))
                                die("send size %u imm %d: byte_len %u opcode %d src %#x flags %#x",
                                    sz, imm, wc->byte_len, wc->opcode, wc->src_qp, wc->wc_flags);
                        verify(a.buf, b.buf, sz, "send", sz);
                        if (poll_until(&a, &b, wc, 1, tmo) != 1)
                                die("send size %u: no send completion", sz);
                        expect_wc(wc, 1, DIWARP_WC_SUCCESS, "send");
                }
                /* RDMA Write and Write with Immediate */
                for (int imm = 0; imm < 2; imm++) {
                        fill(a.buf, sz, sz + 5 + imm);
                        memset(b.buf, 0, sz + 16);
                        if (imm)
                                post_recv(&b, 78, 0, 0);
                        struct diwarp_sge sge = {(uintptr_t)a.buf, sz, a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = 2,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = imm ? DIWARP_WR_RDMA_WRITE_WITH_IMM
                                                                  : DIWARP_WR_RDMA_WRITE,
                                                    .send_flags = DIWARP_SEND_SIGNALED,
                                                    .imm_data = 0x5555};
                        wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
                        wr.wr.rdma.rkey = b.rkey;
                        post(&a, &b, &wr);
                        if (poll_until(&a, &b, wc, 1, tmo) != 1)
                                die("write size %u: no completion", sz);
                        expect_wc(wc, 2, DIWARP_WC_SUCCESS, "write");
                        if (imm) {
                                if (poll_until(&b, &a, wc, 1, tmo) != 1)
                                        die("write imm size %u: no receive completion", sz);
                                expect_wc(wc, 78, DIWARP_WC_SUCCESS, "write imm recv");
                                if (wc->opcode != DIWARP_WC_RECV_RDMA_WITH_IMM ||
                                    wc->imm_data != 0x5555 || wc->byte_len != sz)
                                        die("write imm size %u: opcode %d imm %#x len %u", sz,
                                            wc->opcode, wc->imm_data, wc->byte_len);
                        }
                        verify(a.buf, b.buf, sz, "write", sz);
                }
                /* RDMA Read */
                fill(b.buf, sz, sz + 9);
                memset(a.buf, 0, sz + 16);
                {
                        struct diwarp_sge sge = {(uintptr_t)a.buf, sz, a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = 3,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = DIWARP_WR_RDMA_READ,
                                                    .send_flags = DIWARP_SEND_SIGNALED};
                        wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
                        wr.wr.rdma.rkey = b.rkey;
                        post(&a, &b, &wr);
                        if (poll_until(&a, &b, wc, 1, tmo) != 1)
                                die("read size %u: no completion", sz);
                        expect_wc(wc, 3, DIWARP_WC_SUCCESS, "read");
                        if (wc->byte_len != sz || wc->opcode != DIWARP_WC_RDMA_READ)
                                die("read size %u: byte_len %u", sz, wc->byte_len);
                        verify(b.buf, a.buf, sz, "read", sz);
                }
                fprintf(stderr, "ops size %u ok\n", sz);
        }
        /* Atomics */
        uint64_t *target = (uint64_t *)(b.buf + 64);
        *target = 1000;
        post_atomic(&a, &b, DIWARP_WR_ATOMIC_FETCH_AND_ADD, 4, target, b.rkey, 5, 0);
        if (poll_until(&a, &b, wc, 1, 10000) != 1)
                die("fetch-add: no completion");
        expect_wc(wc, 4, DIWARP_WC_SUCCESS, "fetch-add");
        if (*(uint64_t *)a.buf != 1000 || *target != 1005)
                die("fetch-add: got %llu, target %llu", (unsigned long long)*(uint64_t *)a.buf,
                    (unsigned long long)*target);
        post_atomic(&a, &b, DIWARP_WR_ATOMIC_CMP_AND_SWP, 5, target, b.rkey, 1005, 77);
        if (poll_until(&a, &b, wc, 1, 10000) != 1)
                die("cmp-swap: no completion");
        expect_wc(wc, 5, DIWARP_WC_SUCCESS, "cmp-swap");
        if (*(uint64_t *)a.buf != 1005 || *target != 77)
                die("cmp-swap: got %llu, target %llu", (unsigned long long)*(uint64_t *)a.buf,
                    (unsigned long long)*target);
        fprintf(stderr, "atomics ok\n");
        free(ref);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- stream */

#define STREAM_N   2000
#define STREAM_MAX 20000

static uint32_t stream_size(unsigned i)
{
        static const uint32_t pick[] = {0, 1, 7, 1400, 1500, 4096, 9000, 20000};
        return pick[(i * 2654435761u >> 7) % 8];
}

static int case_stream(void)
{
        struct side a, b;
        buf_len = ((size_t)STREAM_N * STREAM_MAX + 4095) / 4096 * 4096;
        int all =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        pair_open(&a, &b, all);
        /* Receives for every message first: slot i of b.buf for message i. */
        for (unsigned i = 0; i < STREAM_N; i++)
                post_recv(&b, 1000 + i, (uint64_t)i * STREAM_MAX, STREAM_MAX);
        for (unsigned i = 0; i < STREAM_N; i++)
                fill(a.buf + (uint64_t)i * STREAM_MAX, stream_size(i), i);
        unsigned posted = 0, sent_done = 0, recvd = 0;
        struct diwarp_wc wc[64];
        uint64_t end = now_ms() + 100000;
        while (recvd < STREAM_N || sent_done < STREAM_N) {
                while (posted < STREAM_N && posted - sent_done < 1000) {
                        unsigned i = posted;
                        uint32_t sz = stream_size(i);
                        struct diwarp_sge sge = {(uintptr_t)a.buf + (uint64_t)i * STREAM_MAX, sz,
                                                 a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = i,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .send_flags = DIWARP_SEND_SIGNALED,
                                                    .imm_data = i};
                        if (i % 3 == 2) {
                                /* Write with immediate into the same slot. */
                                wr.opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM;
                                wr.wr.rdma.remote_addr =
                                    (uintptr_t)b.buf + (uint64_t)i * STREAM_MAX;
                                wr.wr.rdma.rkey = b.rkey;
                        } else {
                                wr.opcode = i % 3 ? DIWARP_WR_SEND_WITH_IMM : DIWARP_WR_SEND;
                        }
                        post(&a, &b, &wr);
                        posted++;
                }
                int n = diwarp_cq_poll(a.cq, 64, wc);
                for (int k = 0; k < n; k++) {
                        expect_wc(&wc[k], sent_done, DIWARP_WC_SUCCESS, "stream send");
                        sent_done++;
                }
                n = diwarp_cq_poll(b.cq, 64, wc);
                for (int k = 0; k < n; k++) {
                        unsigned i = recvd;
                        expect_wc(&wc[k], 1000 + i, DIWARP_WC_SUCCESS, "stream recv (order)");
                        uint32_t sz = stream_size(i);
                        if (wc[k].byte_len != sz)
                                die("message %u: byte_len %u want %u", i, wc[k].byte_len, sz);
                        if (i % 3 &&
                            (!(wc[k].wc_flags & DIWARP_WC_WITH_IMM) || wc[k].imm_data != i))
                                die("message %u: immediate missing", i);
                        verify(a.buf + (uint64_t)i * STREAM_MAX, b.buf + (uint64_t)i * STREAM_MAX,
                               sz, "stream", sz);
                        recvd++;
                }
                if (now_ms() > end)
                        die("stream: timeout, %u/%u received, %u/%u sent", recvd, STREAM_N,
                            sent_done, STREAM_N);
        }
        /* Nothing more may arrive: exactly once. */
        for (int k = 0; k < 50; k++) {
                if (diwarp_cq_poll(b.cq, 64, wc) != 0 || diwarp_cq_poll(a.cq, 64, wc) != 0)
                        die("stream: extra completion");
                usleep(1000);
        }
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        fprintf(stderr,
                "stream ok: retransmits %llu+%llu crc_errors %llu+%llu dup %llu+%llu "
                "fault drop %llu dup %llu reorder %llu corrupt %llu\n",
                (unsigned long long)ca.retransmits, (unsigned long long)cb.retransmits,
                (unsigned long long)ca.crc_errors, (unsigned long long)cb.crc_errors,
                (unsigned long long)ca.rx_dropped_duplicate,
                (unsigned long long)cb.rx_dropped_duplicate,
                (unsigned long long)(ca.fault_dropped + cb.fault_dropped),
                (unsigned long long)(ca.fault_duplicated + cb.fault_duplicated),
                (unsigned long long)(ca.fault_reordered + cb.fault_reordered),
                (unsigned long long)(ca.fault_corrupted + cb.fault_corrupted));
        if (ca.fault_corrupted + cb.fault_corrupted > 0 && ca.crc_errors + cb.crc_errors == 0)
                die("corrupted datagrams were not counted as CRC errors");
        if (ca.fault_dropped + cb.fault_dropped > 0 && ca.retransmits + cb.retransmits == 0)
                die("drops without retransmissions");
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- loss */

#define LOSS_N      48 /* 1 MiB RDMA Writes */
#define LOSS_WINDOW 4
#define LOSS_SLOTS  16

/* The longest gap between two turns of the loop of loss_round, in µs. */
static uint64_t loss_now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* One round of case_loss: true when the retransmissions stayed within the
 * bound; *stall_us the longest the loop went without a turn. */
static bool loss_round(uint64_t *stall_us)
{
        struct side a, b;
        buf_len = (size_t)LOSS_SLOTS * MiB;
        int all =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        pair_open(&a, &b, all);
        for (unsigned i = 0; i < LOSS_SLOTS; i++)
                fill(a.buf + (uint64_t)i * MiB, MiB, i + 1);
        unsigned posted = 0, done = 0;
        struct diwarp_wc wc[16];
        uint64_t t0 = now_ms(), end = t0 + 150000;
        uint64_t turn = loss_now_us();
        *stall_us = 0;
        while (done < LOSS_N) {
                uint64_t t = loss_now_us();
                if (t - turn > *stall_us)
                        *stall_us = t - turn;
                turn = t;
                while (posted < LOSS_N && posted - done < LOSS_WINDOW) {
                        unsigned slot = posted % LOSS_SLOTS;
                        struct diwarp_sge sge = {(uintptr_t)a.buf + (uint64_t)slot * MiB, MiB,
                                                 a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = posted,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                                    .send_flags = DIWARP_SEND_SIGNALED};
                        wr.wr.rdma.remote_addr = (uintptr_t)b.buf + (uint64_t)slot * MiB;
                        wr.wr.rdma.rkey = b.rkey;
                        post(&a, &b, &wr);
                        posted++;
                }
                int n = diwarp_cq_poll(a.cq, 16, wc);
                for (int k = 0; k < n; k++) {
                        expect_wc(&wc[k], done, DIWARP_WC_SUCCESS, "loss write");
                        done++;
                }
                diwarp_progress(b.dev, 64);
                if (now_ms() > end)
                        die("loss: timeout, %u/%u writes done", done, LOSS_N);
        }
        uint64_t ms = now_ms() - t0;
        verify(a.buf, b.buf, (size_t)LOSS_SLOTS * MiB, "loss write", MiB);
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        uint64_t drops = ca.fault_dropped + cb.fault_dropped;
        fprintf(stderr,
                "loss ok: %u MiB in %llu ms; retransmits %llu for %llu drops (%llu data side, "
                "%llu ack side); duplicates received %llu\n",
                LOSS_N, (unsigned long long)ms, (unsigned long long)ca.retransmits,
                (unsigned long long)drops, (unsigned long long)ca.fault_dropped,
                (unsigned long long)cb.fault_dropped, (unsigned long long)cb.rx_dropped_duplicate);
        if (drops > 0 && ca.retransmits == 0)
                die("loss: drops without retransmissions");
        /* ~3x the drops, and a little slack for tiny drop counts (a tail loss
         * can cost one RTO probe on top). */
        bool within = ca.retransmits <= 3 * drops + 8;
        if (!within)
                fprintf(stderr,
                        "loss: %llu retransmits for %llu drops (more than 3x); the loop's "
                        "longest gap %llu us\n",
                        (unsigned long long)ca.retransmits, (unsigned long long)drops,
                        (unsigned long long)*stall_us);
        side_close(&a);
        side_close(&b);
        return within;
}

/* Streams LOSS_N 1 MiB RDMA Writes (meson runs it under DIWARP_FAULT drop) and
 * bounds the retransmissions by the datagrams the fault hook dropped: selective
 * repeat resends what was lost, not whole windows. Byte-exact. Both ends turn
 * in this one thread: when the host takes it away for longer than the
 * minimum RTO (1 ms), the sender's timer runs out before the receiver had a
 * turn to acknowledge, and the window goes again. That is the scheduler, not
 * the loss recovery: such a round is run again (at most 3 rounds), a round
 * over the bound without a stall fails at once. */
static int case_loss(void)
{
        for (int round = 1;; round++) {
                uint64_t stall_us;
                if (loss_round(&stall_us))
                        return 0;
                if (stall_us < 1000)
                        die("loss: over the bound without a stall of the test (longest gap "
                            "%llu us)",
                            (unsigned long long)stall_us);
                if (round == 3)
                        die("loss: over the bound in 3 rounds, each with a stall of the test");
                fprintf(stderr,
                        "loss: the test stalled %llu us (the minimum RTO is 1 ms): "
                        "once more\n",
                        (unsigned long long)stall_us);
        }
}

/* ---------------------------------------------------------------- gib */

#define GIB (1024u * MiB)

/* Every 64-bit word gets a value from its offset and a seed: a misplaced,
 * missing or repeated segment changes some word. */
static void fill_words(uint8_t *p, size_t len, uint64_t seed)
{
        uint64_t *w = (uint64_t *)p;
        for (size_t i = 0; i < len / 8; i++)
                w[i] = (i * 0x9e3779b97f4a7c15ull) ^ seed;
}

static void one_gib(struct side *a, struct side *b, enum diwarp_wr_opcode op, uint64_t id,
                    const char *what)
{
        struct diwarp_wc wc[1];
        struct diwarp_sge sge = {(uintptr_t)a->buf, GIB, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
        wr.wr.rdma.rkey = b->rkey;
        post(a, b, &wr);
        if (poll_until(a, b, wc, 1, 200000) != 1)
                die("gib: %s of 1 GiB did not complete", what);
        expect_wc(wc, id, DIWARP_WC_SUCCESS, what);
        if (op == DIWARP_WR_RDMA_READ && wc->byte_len != GIB)
                die("gib: Read byte_len %u", wc->byte_len);
}

/* 1 GiB messages: an RDMA Write, a Send into one 1 GiB receive and an RDMA
 * Read back, every word checked, in datagrams of the route's MTU. */
static int case_gib(void)
{
        struct side a, b;
        struct diwarp_wc wc[1];
        buf_len = GIB;
        pair_open(&a, &b, DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ);
        fill_words(a.buf, GIB, 1);
        one_gib(&a, &b, DIWARP_WR_RDMA_WRITE, 1, "gib write");
        verify(a.buf, b.buf, GIB, "gib write", GIB);

        fill_words(a.buf, GIB, 2);
        post_recv(&b, 7, 0, GIB);
        one_gib(&a, &b, DIWARP_WR_SEND, 2, "gib send");
        if (poll_until(&b, &a, wc, 1, 10000) != 1)
                die("gib: no receive completion for the 1 GiB Send");
        expect_wc(wc, 7, DIWARP_WC_SUCCESS, "gib recv");
        if (wc->byte_len != GIB)
                die("gib: Send byte_len %u", wc->byte_len);
        verify(a.buf, b.buf, GIB, "gib send", GIB);

        memset(a.buf, 0, GIB);
        one_gib(&a, &b, DIWARP_WR_RDMA_READ, 3, "gib read");
        verify(b.buf, a.buf, GIB, "gib read", GIB);
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        fprintf(stderr, "gib ok: %llu + %llu datagrams, %llu placed directly, %llu retransmits\n",
                (unsigned long long)ca.tx_packets, (unsigned long long)cb.tx_packets,
                (unsigned long long)(ca.rx_placed_direct + cb.rx_placed_direct),
                (unsigned long long)(ca.retransmits + cb.retransmits));
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- guard */

#define GUARD_N    24
#define GUARD_SLOT (4 * MiB)
#define GUARD_OFF  4096
#define GUARD_BYTE 0x5a

static uint32_t lo_udp_mtu(void);

static uint32_t guard_size(unsigned i)
{
        static const uint32_t pick[] = {MiB,    3 * MiB + 17, 5 * 65536 - 3,
                                        200000, 2 * MiB + 1,  65536};
        return pick[i % 6];
}

/* A program polling the last byte of an RDMA Write's target (RC semantics,
 * which RC over RD keeps) must find the whole message in place once that
 * byte shows, whatever was lost, reordered or damaged on the way: the
 * receiver places a message's tail only once every earlier PSN of its
 * stream is in and verified. Checked for each slot not yet seen complete;
 * returns how many were seen so (their last byte differs from GUARD_BYTE). */
static unsigned guard_poll_last(const struct side *a, const struct side *b, unsigned posted,
                                bool *seen, const char *what)
{
        unsigned n = 0;
        for (unsigned i = 0; i < posted; i++) {
                uint64_t off = (uint64_t)i * GUARD_SLOT + GUARD_OFF, sz = guard_size(i);
                const volatile uint8_t *last = b->buf + off + sz - 1;
                if (seen[i] || a->buf[off + sz - 1] == GUARD_BYTE || *last != a->buf[off + sz - 1])
                        continue;
                __atomic_thread_fence(__ATOMIC_ACQUIRE);
                if (memcmp(a->buf + off, b->buf + off, sz) != 0) {
                        uint64_t k = 0;
                        while (k < sz - 1 && a->buf[off + k] == b->buf[off + k])
                                k++; /* (the rest may land while this looks) */
                        die("%s: slot %u's last byte is in place, byte %llu of %llu is not (%#x "
                            "for %#x): a message's tail was placed before the rest of it",
                            what, i, (unsigned long long)k, (unsigned long long)sz, b->buf[off + k],
                            a->buf[off + k]);
                }
                seen[i] = true;
                n++;
        }
        return n;
}

/* Posts one `op` (RDMA Write or Read) per slot from a to b, the local and
 * remote range [GUARD_OFF, GUARD_OFF + size) of each slot, six at a time, and
 * waits for every completion in order. Writes: the target's last byte is
 * polled meanwhile (guard_poll_last). */
static void guard_run(struct side *a, struct side *b, enum diwarp_wr_opcode op, const char *what)
{
        unsigned posted = 0, done = 0, early = 0;
        bool seen[GUARD_N] = {false};
        struct diwarp_wc wc[16];
        uint64_t end = now_ms() + 150000;
        while (done < GUARD_N) {
                while (posted < GUARD_N && posted - done < 6) {
                        uint64_t off = (uint64_t)posted * GUARD_SLOT + GUARD_OFF;
                        struct diwarp_sge sge = {(uintptr_t)a->buf + off, guard_size(posted),
                                                 a->lkey};
                        struct diwarp_send_wr wr = {.wr_id = posted,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = op,
                                                    .send_flags = DIWARP_SEND_SIGNALED};
                        wr.wr.rdma.remote_addr = (uintptr_t)b->buf + off;
                        wr.wr.rdma.rkey = b->rkey;
                        post(a, b, &wr);
                        posted++;
                }
                int n = diwarp_cq_poll(a->cq, 16, wc);
                for (int k = 0; k < n; k++) {
                        expect_wc(&wc[k], done, DIWARP_WC_SUCCESS, what);
                        done++;
                }
                diwarp_progress(b->dev, 64);
                if (op == DIWARP_WR_RDMA_WRITE)
                        early += guard_poll_last(a, b, posted, seen, what);
                if (now_ms() > end)
                        die("%s: timeout, %u/%u done", what, done, GUARD_N);
        }
        if (op == DIWARP_WR_RDMA_WRITE)
                fprintf(stderr, "%s: %u of %u targets seen whole once their last byte showed\n",
                        what, early, GUARD_N);
}

/* Every slot of dst holds src's bytes in its target range and GUARD_BYTE
 * everywhere else. */
static void guard_check(const uint8_t *src, const uint8_t *dst, const char *what)
{
        for (unsigned i = 0; i < GUARD_N; i++) {
                uint64_t base = (uint64_t)i * GUARD_SLOT, sz = guard_size(i);
                verify(src + base + GUARD_OFF, dst + base + GUARD_OFF, sz, what, (uint32_t)sz);
                for (uint64_t k = 0; k < GUARD_SLOT; k++) {
                        if (k == GUARD_OFF)
                                k += sz;
                        if (k < GUARD_SLOT && dst[base + k] != GUARD_BYTE)
                                die("%s: byte %llu of slot %u (outside the %llu-byte target at "
                                    "%u) changed to %#x",
                                    what, (unsigned long long)k, i, (unsigned long long)sz,
                                    GUARD_OFF, dst[base + k]);
                }
        }
}

/* RDMA Writes of mixed large sizes, each into its own slot of b's region with
 * guard bytes around it, under the DIWARP_FAULT meson gives (corruption among
 * it): every target byte-exact and no other byte of the region touched, while
 * segments are placed before their CRC is checked (loopback's 64 KiB
 * datagrams) unless DIWARP_RD_DIRECT=0 says otherwise. */
static int case_guard(void)
{
        struct side a, b;
        buf_len = (size_t)GUARD_N * GUARD_SLOT;
        int all =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        pair_open(&a, &b, all);
        memset(b.buf, GUARD_BYTE, buf_len);
        for (unsigned i = 0; i < GUARD_N; i++)
                fill(a.buf + (uint64_t)i * GUARD_SLOT + GUARD_OFF, guard_size(i), i + 5);
        guard_run(&a, &b, DIWARP_WR_RDMA_WRITE, "guard write");
        guard_check(a.buf, b.buf, "guard write");
        /* The same slots read back into a's region, guarded the same way:
         * Read Responses into a one-SGE sink are placed directly too. */
        memset(a.buf, GUARD_BYTE, buf_len);
        guard_run(&a, &b, DIWARP_WR_RDMA_READ, "guard read");
        guard_check(b.buf, a.buf, "guard read");
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        const char *direct = getenv("DIWARP_RD_DIRECT");
        const char *fault = getenv("DIWARP_FAULT");
        bool want_direct = !(direct && strcmp(direct, "0") == 0) && lo_udp_mtu() > 32768;
        fprintf(stderr,
                "guard ok: %llu Write and %llu Read Response segments placed directly, "
                "%llu + %llu CRC errors\n",
                (unsigned long long)cb.rx_placed_direct, (unsigned long long)ca.rx_placed_direct,
                (unsigned long long)cb.crc_errors, (unsigned long long)ca.crc_errors);
        if (want_direct ? cb.rx_placed_direct == 0 || ca.rx_placed_direct == 0
                        : cb.rx_placed_direct + ca.rx_placed_direct != 0)
                die("guard: %llu + %llu segments placed directly with DIWARP_RD_DIRECT=%s",
                    (unsigned long long)cb.rx_placed_direct,
                    (unsigned long long)ca.rx_placed_direct, direct ? direct : "unset");
        if (fault && strstr(fault, "corrupt") && (cb.crc_errors == 0 || ca.crc_errors == 0))
                die("guard: DIWARP_FAULT=%s but no CRC error counted on one side", fault);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- prot */

static int case_prot(void)
{
        struct side a, b;
        buf_len = 1 * MiB;
        /* b grants remote write only (no read, no atomic) on its QP. */
        pair_open(&a, &b, DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE);
        struct diwarp_wc wc[4];
        struct diwarp_sge sge = {(uintptr_t)a.buf, 4096, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 9,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        /* Out of bounds: past the end of b's region. */
        wr.wr.rdma.remote_addr = (uintptr_t)b.buf + buf_len - 100;
        wr.wr.rdma.rkey = b.rkey;
        memset(b.buf, 0, buf_len);
        post(&a, &b, &wr);
        if (poll_until(&a, &b, wc, 1, 10000) != 1)
                die("prot write: no completion");
        expect_wc(wc, 9, DIWARP_WC_REM_ACCESS_ERR, "out-of-bounds write");
        for (size_t i = 0; i < buf_len; i++)
                if (b.buf[i])
                        die("prot: a refused write touched memory at %zu", i);
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_ERR)
                die("requester QP not in ERR after REM_ACCESS_ERR");
        if (!rc_mode && diwarp_qp_state(b.qp) != DIWARP_QPS_RTS)
                die("RD responder must keep serving other peers");
        side_close(&a);
        side_close(&b);

        /* Read where the QP grants no remote read. */
        pair_open(&a, &b, DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE);
        sge.lkey = a.lkey;
        sge.addr = (uintptr_t)a.buf;
        wr.opcode = DIWARP_WR_RDMA_READ;
        wr.wr_id = 10;
        wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
        wr.wr.rdma.rkey = b.rkey;
        post(&a, &b, &wr);
        if (poll_until(&a, &b, wc, 1, 10000) != 1)
                die("prot read: no completion");
        expect_wc(wc, 10, DIWARP_WC_REM_ACCESS_ERR, "read without REMOTE_READ");
        side_close(&a);
        side_close(&b);

        /* Bad rkey (stale key byte). */
        pair_open(&a, &b, DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE);
        sge.lkey = a.lkey;
        sge.addr = (uintptr_t)a.buf;
        wr.opcode = DIWARP_WR_RDMA_WRITE;
        wr.wr_id = 11;
        wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
        wr.wr.rdma.rkey = b.rkey ^ 0x5a;
        post(&a, &b, &wr);
        if (poll_until(&a, &b, wc, 1, 10000) != 1)
                die("prot rkey: no completion");
        expect_wc(wc, 11, DIWARP_WC_REM_ACCESS_ERR, "write with a bad rkey");
        side_close(&a);
        side_close(&b);
        fprintf(stderr, "prot ok\n");
        return 0;
}

/* ---------------------------------------------------------------- mw */

/* One bind WR of a type 2 window on s's send queue; returns its completion. */
static struct diwarp_wc mw_bind2(struct side *s, struct side *other, struct diwarp_mw *mw,
                                 uint32_t rkey, struct diwarp_mr *mr, uint64_t addr, uint64_t len,
                                 int access)
{
        struct diwarp_send_wr wr = {
            .wr_id = 0xb2, .opcode = DIWARP_WR_BIND_MW, .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.bind_mw.mw = mw;
        wr.wr.bind_mw.rkey = rkey;
        wr.wr.bind_mw.bind_info = (struct diwarp_mw_bind_info){mr, addr, len, access};
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(s->qp, &wr, &bad));
        struct diwarp_wc wc;
        if (poll_until(s, other, &wc, 1, 10000) != 1)
                die("mw: no bind completion");
        if (wc.status == DIWARP_WC_SUCCESS && wc.opcode != DIWARP_WC_BIND_MW)
                die("mw: bind completed with opcode %d", wc.opcode);
        return wc;
}

static uint32_t mw_rkey(struct diwarp_mw *mw)
{
        struct diwarp_mw_info mi;
        CHECK(diwarp_mw_info(mw, &mi));
        return mi.rkey;
}

static uint32_t inc_key(uint32_t rkey)
{
        return (rkey & ~0xffu) | (uint8_t)(rkey + 1);
}

/* a Reads (or Writes) len bytes at b's address addr through rkey. */
static struct diwarp_wc mw_rdma(struct side *a, struct side *b, enum diwarp_wr_opcode op,
                                uint64_t id, uint64_t addr, uint32_t len, uint32_t rkey)
{
        struct diwarp_sge sge = {(uintptr_t)a->buf, len, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = addr;
        wr.wr.rdma.rkey = rkey;
        post(a, b, &wr);
        struct diwarp_wc wc;
        if (poll_until(a, b, &wc, 1, 10000) != 1)
                die("mw: no completion for WR %#llx", (unsigned long long)id);
        return wc;
}

/* Memory windows on RD QPs and RC over RD: type 2 bound on b's QP serves a's
 * Writes and Reads inside its bounds only, and a Send with Invalidate from a
 * unbinds it (b's receive reports the rkey); type 1 bound with
 * diwarp_mw_bind, refused by Send with Invalidate, unbound by a zero-length
 * bind. The region grants no remote right itself. */
static int case_mw(void)
{
        struct side a, b;
        buf_len = 1 * MiB;
        const int qacc =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        const int wacc = DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        for (int round = 0; round < 2; round++) {
                pair_open(&a, &b, qacc);
                struct diwarp_mr *wmr;
                CHECK(diwarp_mr_reg(b.pd, b.buf, buf_len, (uintptr_t)b.buf,
                                    DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_MW_BIND, &wmr));
                struct diwarp_mr_info wi;
                CHECK(diwarp_mr_info(wmr, &wi));
                struct diwarp_mw *mw2, *mw1;
                CHECK(diwarp_mw_alloc(b.pd, DIWARP_MW_TYPE_2, &mw2));
                CHECK(diwarp_mw_alloc(b.pd, DIWARP_MW_TYPE_1, &mw1));
                uint64_t base = (uintptr_t)b.buf + 65536;
                memset(b.buf, 0, buf_len);

                uint32_t r = inc_key(mw_rkey(mw2));
                struct diwarp_wc wc = mw_bind2(&b, &a, mw2, r, wmr, base, 65536, wacc);
                expect_wc(&wc, 0xb2, DIWARP_WC_SUCCESS, "type 2 bind");
                if (mw_rkey(mw2) != r)
                        die("mw: the window did not take the new key");
                fill(a.buf, 65536, 77);
                wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_WRITE, 1, base, 65536, r);
                expect_wc(&wc, 1, DIWARP_WC_SUCCESS, "Write through a type 2 window");
                memset(a.buf, 0, 65536);
                wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_READ, 2, base, 65536, r);
                expect_wc(&wc, 2, DIWARP_WC_SUCCESS, "Read through a type 2 window");
                verify(b.buf + 65536, a.buf, 65536, "mw write/read", 65536);
                for (size_t i = 0; i < 65536; i++)
                        if (b.buf[i])
                                die("mw: a Write through the window touched byte %zu before it", i);
                if (round == 0) {
                        /* The region's own rkey grants nothing; one byte past
                         * the window is refused and nothing is written. */
                        wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_WRITE, 3, base + 65536 - 8, 16, r);
                        expect_wc(&wc, 3, DIWARP_WC_REM_ACCESS_ERR, "Write past the window");
                        for (size_t i = 2 * 65536; i < buf_len; i++)
                                if (b.buf[i])
                                        die("mw: a refused Write touched byte %zu", i);
                } else {
                        /* Send with Invalidate: b's receive reports the rkey,
                         * then the window refuses. */
                        post_recv(&b, 0x77, 0, 64);
                        struct diwarp_sge sge = {(uintptr_t)a.buf, 8, a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = 4,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = DIWARP_WR_SEND_WITH_INV,
                                                    .send_flags = DIWARP_SEND_SIGNALED,
                                                    .invalidate_rkey = r};
                        wr.wr.ud.ah = a.ah;
                        wr.wr.ud.remote_qpn = b.qpn;
                        wr.wr.ud.remote_qkey = QKEY;
                        struct diwarp_send_wr *bad;
                        CHECK(diwarp_post_send(a.qp, &wr, &bad));
                        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                                die("mw: no receive for the Send with Invalidate");
                        expect_wc(&wc, 0x77, DIWARP_WC_SUCCESS, "Send with Invalidate receive");
                        if (!(wc.wc_flags & DIWARP_WC_WITH_INV) || wc.invalidated_rkey != r)
                                die("mw: receive flags %#x rkey %#x, want WITH_INV %#x",
                                    wc.wc_flags, wc.invalidated_rkey, r);
                        if (poll_until(&a, &b, &wc, 1, 10000) != 1)
                                die("mw: no send completion");
                        expect_wc(&wc, 4, DIWARP_WC_SUCCESS, "Send with Invalidate");
                        /* Type 1 on the same QPs: bound, used, unbound. */
                        uint32_t k = inc_key(mw_rkey(mw1));
                        struct diwarp_mw_bind_info bi = {wmr, base, 4096, wacc};
                        CHECK(diwarp_mw_bind(b.qp, mw1, k, &bi, 0xb1, DIWARP_SEND_SIGNALED));
                        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                                die("mw: no type 1 bind completion");
                        expect_wc(&wc, 0xb1, DIWARP_WC_SUCCESS, "type 1 bind");
                        wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_READ, 5, base, 4096, k);
                        expect_wc(&wc, 5, DIWARP_WC_SUCCESS, "Read through a type 1 window");
                        if (diwarp_mr_dereg(wmr) != -EBUSY)
                                die("mw: dereg of a region with a bound window must be EBUSY");
                        bi = (struct diwarp_mw_bind_info){NULL, 0, 0, 0};
                        CHECK(
                            diwarp_mw_bind(b.qp, mw1, inc_key(k), &bi, 0xb3, DIWARP_SEND_SIGNALED));
                        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                                die("mw: no unbind completion");
                        expect_wc(&wc, 0xb3, DIWARP_WC_SUCCESS, "type 1 unbind");
                        wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_READ, 6, base, 8, r);
                        expect_wc(&wc, 6, DIWARP_WC_REM_ACCESS_ERR, "Read after invalidation");
                }
                CHECK(diwarp_mw_dealloc(mw1));
                CHECK(diwarp_mw_dealloc(mw2));
                CHECK(diwarp_mr_dereg(wmr));
                side_close(&a);
                side_close(&b);
        }
        fprintf(stderr, "mw ok\n");
        return 0;
}

/* ---------------------------------------------------------------- mailbox */

/* Whether the QPs under test have a mailbox: RD QPs unless
 * DIWARP_CREDIT=off; RC QPs over RD only with DIWARP_CREDIT_RC=park. */
static bool credits_on(void)
{
        const char *v = getenv("DIWARP_CREDIT"), *rc = getenv("DIWARP_CREDIT_RC");
        if (v && *v && !strcmp(v, "off"))
                return false;
        return !rc_mode || (rc && !strcmp(rc, "park"));
}

#define MB_NQ   4
#define MB_MSGS 150
#define MB_LEN  3000u /* two slots of the default 2 KiB */

/* Posts the Send of message i of sender q from m (len bytes of pattern
 * `seed`, starting with {q, i}), wr_id q << 32 | i; a's lkey covers m. */
static void post_numbered(struct side *a, struct side *b, uint8_t *m, uint32_t len, unsigned q,
                          unsigned i, unsigned seed)
{
        fill(m, len, seed);
        uint32_t hdr[2] = {q, i};
        memcpy(m, hdr, sizeof(hdr));
        struct diwarp_sge sge = {(uintptr_t)m, len, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = (uint64_t)q << 32 | i,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        post(a, b, &wr);
}

/* Several senders into one receiving QP that posts its receives slowly: the
 * mailbox holds what comes early, the senders wait for credits when their
 * quota is in the ring, and every message arrives once, in order per sender,
 * byte-exact, with no RNR NAK and nothing dropped for want of a receive. Run
 * with a small ring (meson: DIWARP_CREDIT_RING=32, _PEERS=4: 4 messages per
 * sender), also under injected loss and reordering. */
static int case_mailbox(void)
{
        if (!credits_on())
                die("mailbox: needs credits (DIWARP_CREDIT=static)");
        unsigned nq = rc_mode ? 1 : MB_NQ;
        /* aligned_alloc takes whole pages */
        buf_len = ((size_t)MB_NQ * MB_MSGS * MB_LEN + 16 * MB_LEN + 4095) & ~(size_t)4095;
        struct side a[MB_NQ], b;
        pair_open(&a[0], &b, DIWARP_ACCESS_LOCAL_WRITE);
        for (unsigned q = 1; q < nq; q++) {
                a[q] = a[0];
                a[q].ah = NULL;
                qp_make(&a[q], DIWARP_ACCESS_LOCAL_WRITE);
                qp_connect(&a[q], &b, b.qpn);
        }
        uint32_t qpn_of[MB_NQ];
        for (unsigned q = 0; q < nq; q++) {
                qpn_of[q] = a[q].qpn;
                for (unsigned i = 0; i < MB_MSGS; i++)
                        post_numbered(&a[q], &b, a[0].buf + ((size_t)q * MB_MSGS + i) * MB_LEN,
                                      MB_LEN, q, i, q * 1000 + i);
        }
        /* The receiver: at most 8 receives posted, one more every 20 polls,
         * each into a buffer no posted WR uses (RD completes a stream's
         * message when it is whole: a WR behind a lost segment completes
         * after later ones). */
        uint8_t *rbase = b.buf + (size_t)MB_NQ * MB_MSGS * MB_LEN;
        unsigned next[MB_NQ] = {0}, received = 0, posted = 0, sent = 0, tick = 0;
        bool busy[16] = {false};
        unsigned total = nq * MB_MSGS;
        struct diwarp_wc wc[16];
        uint64_t end = now_ms() + 60000;
        while (received < total || sent < total) {
                if (posted - received < 8 && posted < total && ++tick % 20 == 0) {
                        unsigned slot = 0;
                        while (busy[slot])
                                slot++;
                        busy[slot] = true;
                        post_recv(&b, slot, (uint64_t)(rbase - b.buf) + (uint64_t)slot * MB_LEN,
                                  MB_LEN);
                        posted++;
                }
                int n = diwarp_cq_poll(b.cq, 16, wc);
                if (n < 0)
                        die("mailbox: poll: %s", strerror(-n));
                for (int k = 0; k < n; k++) {
                        expect_wc(&wc[k], wc[k].wr_id, DIWARP_WC_SUCCESS, "mailbox recv");
                        const uint8_t *got = rbase + wc[k].wr_id * MB_LEN;
                        uint32_t hdr[2];
                        memcpy(hdr, got, sizeof(hdr));
                        if (hdr[0] >= nq || hdr[1] != next[hdr[0]] || wc[k].byte_len != MB_LEN ||
                            wc[k].src_qp != qpn_of[hdr[0]])
                                die("mailbox: got message %u of sender %u (%u bytes, from %#x); "
                                    "want %u",
                                    hdr[1], hdr[0], wc[k].byte_len, wc[k].src_qp,
                                    hdr[0] < nq ? next[hdr[0]] : 0);
                        verify(a[0].buf + ((size_t)hdr[0] * MB_MSGS + hdr[1]) * MB_LEN, got, MB_LEN,
                               "mailbox", MB_LEN);
                        next[hdr[0]]++;
                        received++;
                        busy[wc[k].wr_id] = false;
                }
                n = diwarp_cq_poll(a[0].cq, 16, wc);
                if (n < 0)
                        die("mailbox: poll: %s", strerror(-n));
                for (int k = 0; k < n; k++)
                        expect_wc(&wc[k], wc[k].wr_id, DIWARP_WC_SUCCESS, "mailbox send");
                sent += (unsigned)n;
                if (now_ms() > end) {
                        struct diwarp_counters ca, cb;
                        CHECK(diwarp_device_counters(a[0].dev, &ca));
                        CHECK(diwarp_device_counters(b.dev, &cb));
                        die("mailbox: timeout: %u/%u received (%u receives posted), %u sends "
                            "done; sender: %llu credit waits, %llu probes, %llu retransmissions, "
                            "%llu RNR NAKs; receiver: %llu parked, %llu credit datagrams",
                            received, total, posted, sent, (unsigned long long)ca.credit_stalls,
                            (unsigned long long)ca.credit_probes,
                            (unsigned long long)ca.retransmits, (unsigned long long)ca.rnr_naks,
                            (unsigned long long)cb.mbox_parked, (unsigned long long)cb.credit_msgs);
                }
        }
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a[0].dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        if (ca.rnr_naks || cb.rx_dropped_no_recv)
                die("mailbox: %llu RNR NAKs, %llu Sends dropped for want of a receive",
                    (unsigned long long)ca.rnr_naks, (unsigned long long)cb.rx_dropped_no_recv);
        if (!cb.mbox_parked || !ca.credit_stalls)
                die("mailbox: %llu segments parked, %llu credit waits: the ring was never used "
                    "up",
                    (unsigned long long)cb.mbox_parked, (unsigned long long)ca.credit_stalls);
        fprintf(stderr,
                "mailbox ok: %u messages from %u senders; %llu parked, %llu credit waits, %llu "
                "probes, %llu credit datagrams, %llu retransmissions\n",
                total, nq, (unsigned long long)cb.mbox_parked, (unsigned long long)ca.credit_stalls,
                (unsigned long long)ca.credit_probes, (unsigned long long)cb.credit_msgs,
                (unsigned long long)ca.retransmits);
        for (unsigned q = 1; q < nq; q++) {
                CHECK(diwarp_ah_destroy(a[q].ah));
                CHECK(diwarp_qp_destroy(a[q].qp));
        }
        side_close(&a[0]);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- mbox */

#define MBX_NQ   2
#define MBX_MSGS 400

/* The application mailbox (diwarpdv_mbox_open): two senders into a ring of
 * 64 slots (meson: DIWARP_CREDIT_RING=64, _PEERS=2) that the receiver
 * releases late and out of order. Every message arrives once, in order per
 * sender, byte-exact and contiguous where it crosses the end of the ring; the
 * senders wait for credits, nobody gets an RNR NAK; the misuses fail. */
static int case_mbox(void)
{
        if (rc_mode) {
                fprintf(stderr, "mbox: RD only\n");
                return 77;
        }
        buf_len = (size_t)MBX_NQ * MBX_MSGS * 8192;
        struct side a[MBX_NQ], b;
        int acc = DIWARP_ACCESS_LOCAL_WRITE;
        side_open(&a[0], acc);
        side_open(&b, acc);
        for (unsigned q = 0; q < MBX_NQ; q++) {
                if (q)
                        a[q] = a[0];
                a[q].ah = NULL;
                qp_make(&a[q], acc);
        }
        qp_make(&b, acc);
        struct diwarpdv_mbox mb;
        CHECK(diwarpdv_mbox_open(b.qp, &mb));
        if (mb.slots != 64 || mb.slot_size != 2048 || mb.len != 64 * 2048 || !mb.max_msg)
                die("mbox: ring of %u x %u = %zu bytes, max message %u", mb.slots, mb.slot_size,
                    mb.len, mb.max_msg);
        for (unsigned q = 0; q < MBX_NQ; q++)
                qp_connect(&a[q], &b, b.qpn);
        qp_connect(&b, &a[0], a[0].qpn);
        /* Receive WRs have no place on a mailbox, nor does a second open. */
        {
                struct diwarp_sge sge = {(uintptr_t)b.buf, 64, b.lkey};
                struct diwarp_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
                if (diwarp_post_recv(b.qp, &wr, &bad) != -EINVAL)
                        die("mbox: a receive WR was accepted");
                struct diwarpdv_mbox again;
                if (diwarpdv_mbox_open(b.qp, &again) != -EINVAL)
                        die("mbox: opened again in RTS");
        }
        uint32_t most = mb.max_msg < 5000 ? mb.max_msg : 5000;
        uint32_t len_of[MBX_NQ][MBX_MSGS];
        for (unsigned q = 0; q < MBX_NQ; q++)
                for (unsigned i = 0; i < MBX_MSGS; i++) {
                        uint32_t len = 8 + (i * 2654435761u + q * 40503u) % (most - 8);
                        len_of[q][i] = len;
                        post_numbered(&a[q], &b, a[0].buf + ((size_t)q * MBX_MSGS + i) * 8192, len,
                                      q, i, q * 7000 + i);
                }
        unsigned next[MBX_NQ] = {0}, received = 0, sent = 0, held = 0, wrapped = 0, tick = 0,
                 twice_checked = 0;
        const uint8_t *hold[64];
        uint64_t seed = 12345;
        struct diwarp_wc wc[16];
        uint64_t end = now_ms() + 60000;
        const uint8_t *ring = mb.ring;
        while (received < MBX_NQ * MBX_MSGS || sent < MBX_NQ * MBX_MSGS || held) {
                int n = diwarp_cq_poll(b.cq, 16, wc);
                if (n < 0)
                        die("mbox: poll: %s", strerror(-n));
                for (int k = 0; k < n; k++) {
                        expect_wc(&wc[k], wc[k].wr_id, DIWARP_WC_SUCCESS, "mbox recv");
                        const uint8_t *m = (const uint8_t *)(uintptr_t)wc[k].wr_id;
                        if (m < ring || m >= ring + mb.len)
                                die("mbox: message at %p, outside the ring %p + %zu", (void *)m,
                                    (void *)ring, mb.len);
                        uint32_t hdr[2];
                        memcpy(hdr, m, sizeof(hdr));
                        if (hdr[0] >= MBX_NQ || hdr[1] != next[hdr[0]] ||
                            wc[k].byte_len != len_of[hdr[0]][hdr[1]] ||
                            wc[k].src_qp != a[hdr[0]].qpn)
                                die("mbox: message %u of sender %u (%u bytes, from %#x), want %u",
                                    hdr[1], hdr[0], wc[k].byte_len, wc[k].src_qp,
                                    hdr[0] < MBX_NQ ? next[hdr[0]] : 0);
                        verify(a[0].buf + ((size_t)hdr[0] * MBX_MSGS + hdr[1]) * 8192, m,
                               wc[k].byte_len, "mbox", wc[k].byte_len);
                        wrapped += m + wc[k].byte_len > ring + mb.len;
                        next[hdr[0]]++;
                        received++;
                        if (held == 64)
                                die("mbox: more than 64 messages held");
                        hold[held++] = m;
                }
                /* Release late, one at a time, in random order; once every
                 * message is in, only after every Send completed, so that no
                 * new message can land where a released one was (the
                 * progress thread places them meanwhile) and a second release
                 * of the same pointer must be refused. */
                bool all_in = received == MBX_NQ * MBX_MSGS;
                bool quiet = all_in && sent == MBX_NQ * MBX_MSGS;
                if (held && (all_in ? quiet : (held >= 12 || ++tick % 7 == 0))) {
                        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                        unsigned j = (unsigned)(seed >> 33) % held;
                        CHECK(diwarpdv_mbox_release(b.qp, hold[j]));
                        if (quiet) {
                                if (diwarpdv_mbox_release(b.qp, hold[j]) != -EINVAL)
                                        die("mbox: a message released twice");
                                twice_checked++;
                        }
                        hold[j] = hold[--held];
                }
                n = diwarp_cq_poll(a[0].cq, 16, wc);
                for (int k = 0; k < n; k++)
                        expect_wc(&wc[k], wc[k].wr_id, DIWARP_WC_SUCCESS, "mbox send");
                sent += (unsigned)(n > 0 ? n : 0);
                if (now_ms() > end)
                        die("mbox: timeout: %u received, %u sends done, %u held", received, sent,
                            held);
        }
        if (!twice_checked)
                die("mbox: no message was left to release twice once the traffic ended");
        if (diwarpdv_mbox_release(b.qp, ring + 3) != -EINVAL)
                die("mbox: a pointer into the middle of the ring was released");
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a[0].dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        if (ca.rnr_naks || !ca.credit_stalls || !wrapped)
                die("mbox: %llu RNR NAKs, %llu credit waits, %u messages across the end",
                    (unsigned long long)ca.rnr_naks, (unsigned long long)ca.credit_stalls, wrapped);
        /* A Send longer than the mailbox takes is refused, by name. */
        uint32_t big = mb.max_msg + 1;
        struct diwarp_sge sge = {(uintptr_t)a[0].buf, big, a[0].lkey};
        struct diwarp_send_wr wr = {.wr_id = 99,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        post(&a[1], &b, &wr);
        if (poll_until(&a[0], &b, wc, 1, 10000) != 1)
                die("mbox: no completion for a Send of %u bytes", big);
        expect_wc(wc, 99, DIWARP_WC_REM_INV_REQ_ERR, "mbox: too long a Send");
        fprintf(stderr,
                "mbox ok: %u messages from %u senders, %u across the end of the ring, %llu "
                "credit waits\n",
                received, MBX_NQ, wrapped, (unsigned long long)ca.credit_stalls);
        for (unsigned q = 1; q < MBX_NQ; q++) {
                CHECK(diwarp_ah_destroy(a[q].ah));
                CHECK(diwarp_qp_destroy(a[q].qp));
        }
        side_close(&a[0]);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- rnr */

/* With credits (the default) a Send that comes before its receive is parked
 * in the receiver's mailbox: it completes at the sender, with no RNR NAK and
 * no retransmission, and is delivered once the receive is posted. With
 * DIWARP_CREDIT=off it is refused with RNR NAKs and retried until then. */
static int case_rnr(void)
{
        struct side a, b;
        buf_len = 1 * MiB;
        bool credits = credits_on();
        pair_open(&a, &b, DIWARP_ACCESS_LOCAL_WRITE);
        fill(a.buf, 100000, 3);
        struct diwarp_wc wc[4];
        struct diwarp_sge sge = {(uintptr_t)a.buf, 100000, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 12,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        post(&a, &b, &wr);
        struct diwarp_counters c;
        if (credits) {
                if (poll_until(&a, &b, wc, 1, 10000) != 1)
                        die("rnr: the Send was not taken into the receiver's mailbox");
                expect_wc(wc, 12, DIWARP_WC_SUCCESS, "rnr send (parked)");
                if (poll_until(&b, &a, wc, 1, 200) != 0)
                        die("rnr: a receive completed before any was posted");
                CHECK(diwarp_device_counters(b.dev, &c));
                if (c.mbox_parked == 0)
                        die("rnr: nothing counted as parked");
        } else if (poll_until(&a, &b, wc, 1, 500) != 0) {
                /* 500 ms with no receive posted: nothing completes, nothing is lost. */
                die("rnr: the send completed (%s) without a receive",
                    diwarp_wc_status_str(wc[0].status));
        }
        post_recv(&b, 13, 0, 200000);
        if (poll_until(&b, &a, wc, 1, 10000) != 1)
                die("rnr: not delivered after the receive was posted");
        expect_wc(wc, 13, DIWARP_WC_SUCCESS, "rnr recv");
        if (wc[0].byte_len != 100000)
                die("rnr: byte_len %u, expected 100000", wc[0].byte_len);
        verify(a.buf, b.buf, 100000, "rnr", 100000);
        if (!credits) {
                if (poll_until(&a, &b, wc, 1, 10000) != 1)
                        die("rnr: no send completion");
                expect_wc(wc, 12, DIWARP_WC_SUCCESS, "rnr send");
        }
        CHECK(diwarp_device_counters(a.dev, &c));
        struct diwarp_counters cb;
        CHECK(diwarp_device_counters(b.dev, &cb));
        /* With credits nothing is refused, so nothing is sent again but
         * what a timer resends on a busy host: a datagram the receiver
         * already held (one such in a CI run beside a build loop). */
        if (credits && (c.rnr_naks != 0 || c.retransmits > cb.rx_dropped_duplicate))
                die("rnr: %llu RNR NAKs and %llu retransmissions (%llu of them duplicates at "
                    "the receiver) with credits on",
                    (unsigned long long)c.rnr_naks, (unsigned long long)c.retransmits,
                    (unsigned long long)cb.rx_dropped_duplicate);
        if (!credits && c.rnr_naks == 0)
                die("rnr: no RNR NAK counted");
        fprintf(stderr, "rnr ok (%llu RNR NAKs, %llu segments parked)\n",
                (unsigned long long)c.rnr_naks, (unsigned long long)cb.mbox_parked);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- path */

/* The UDP payload a stream over loopback should use: lo's MTU less the IPv4
 * and UDP headers, at most 65507 and DIWARP_UDP_MTU. */
static uint32_t lo_udp_mtu(void)
{
        FILE *f = fopen("/sys/class/net/lo/mtu", "r");
        unsigned mtu = 0;
        if (!f || fscanf(f, "%u", &mtu) != 1)
                die("path: cannot read lo's MTU");
        fclose(f);
        uint32_t u = mtu - 28 > 65507 ? 65507 : mtu - 28;
        const char *cap = getenv("DIWARP_UDP_MTU");
        if (cap && *cap && strtoul(cap, NULL, 10) < u)
                u = (uint32_t)strtoul(cap, NULL, 10);
        return u;
}

static int case_path(void)
{
        struct side a, b;
        struct diwarp_wc wc[2];
        pair_open(&a, &b, DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ);
        struct diwarpdv_rd_dest d = {a.ah, b.qpn, QKEY};
        struct diwarpdv_rd_path path;
        if (diwarpdv_query_rd_path(a.qp, rc_mode ? NULL : &d, &path) != (rc_mode ? 0 : -ENOENT))
                die("path: query before the first message");
        const uint32_t len = 64 * MiB;
        fill(a.buf, len, 77);
        struct diwarp_sge sge = {(uintptr_t)a.buf, len, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
        wr.wr.rdma.rkey = b.rkey;
        post(&a, &b, &wr);
        if (poll_until(&a, &b, wc, 1, 60000) != 1)
                die("path: Write did not complete");
        expect_wc(wc, 1, DIWARP_WC_SUCCESS, "path write");
        verify(a.buf, b.buf, len, "path write", len);
        /* Direct placement is on unless DIWARP_RD_DIRECT=0: it must run with
         * 64 KiB datagrams over loopback and never when turned off. */
        struct diwarp_counters cb;
        CHECK(diwarp_device_counters(b.dev, &cb));
        const char *direct = getenv("DIWARP_RD_DIRECT");
        bool want_direct = !(direct && strcmp(direct, "0") == 0) && lo_udp_mtu() > 32768;
        if (want_direct ? cb.rx_placed_direct == 0 : cb.rx_placed_direct != 0)
                die("path: %llu segments placed directly with DIWARP_RD_DIRECT=%s",
                    (unsigned long long)cb.rx_placed_direct, direct ? direct : "unset");
        /* Read it back into a's buffer, zeroed first. */
        memset(a.buf, 0, len);
        sge.length = len;
        wr = (struct diwarp_send_wr){.wr_id = 2,
                                     .sg_list = &sge,
                                     .num_sge = 1,
                                     .opcode = DIWARP_WR_RDMA_READ,
                                     .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
        wr.wr.rdma.rkey = b.rkey;
        post(&a, &b, &wr);
        if (poll_until(&a, &b, wc, 1, 60000) != 1)
                die("path: Read did not complete");
        expect_wc(wc, 2, DIWARP_WC_SUCCESS, "path read");
        verify(b.buf, a.buf, len, "path read", len);
        uint32_t want = lo_udp_mtu();
        CHECK(diwarpdv_query_rd_path(a.qp, rc_mode ? NULL : &d, &path));
        /* Full-size datagrams were sent (a tagged segment leaves a few header
         * bytes of the untagged room unused), and none above the MTU. */
        if (path.max_dgram != want || path.dev_max_sent > want || path.dev_max_sent + 64 < want)
                die("path: stream datagrams %u bytes (largest sent %u), want %u", path.max_dgram,
                    path.dev_max_sent, want);
        struct diwarpdv_rd_path pb;
        struct diwarpdv_rd_dest db = {b.ah, a.qpn, QKEY};
        CHECK(diwarpdv_query_rd_path(b.qp, rc_mode ? NULL : &db, &pb));
        if (pb.max_dgram != want || pb.dev_max_sent > want || pb.dev_max_sent + 64 < want)
                die("path: responder datagrams %u bytes (largest sent %u), want %u", pb.max_dgram,
                    pb.dev_max_sent, want);
        fprintf(stderr, "path ok: %u-byte datagrams, %u-byte segments\n", path.max_dgram,
                path.seg_payload);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- srq */

#define SRQ_NQ     3    /* receiver QPs sharing the SRQ, and sender peers */
#define SRQ_MSGS   40   /* per (sender, receiver QP) stream */
#define SRQ_SLOT   8192 /* bytes per message slot */
#define SRQ_DEPTH  32   /* SRQ size; receive slots on the receiver */
#define SRQ_FIRST  10   /* receives posted after the RNR phase */
#define SRQ_LIMIT  8
#define SRQ_WINDOW 4 /* sends in flight per stream */

static uint32_t srq_len(unsigned s, unsigned q, unsigned i)
{
        return 12 + (s * 131 + q * 71 + i * 977) % 5000; /* 1 to 4 segments */
}

/* Sender s's message i to receiver QP q: a 12-byte (s, q, i) header, then
 * bytes from a seed of the three. */
static uint8_t *srq_msg(struct side *t, unsigned q, unsigned i)
{
        return t->buf + ((uint64_t)q * SRQ_MSGS + i) * SRQ_SLOT;
}

static void srq_post_recv(struct diwarp_srq *srq, const struct side *r, unsigned slot)
{
        struct diwarp_sge sge = {(uintptr_t)r->buf + (uint64_t)slot * SRQ_SLOT, SRQ_SLOT, r->lkey};
        struct diwarp_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
        CHECK(diwarp_post_srq_recv(srq, &wr, &bad));
}

static bool srq_limit_event(struct diwarp_device *dev, struct diwarp_srq *srq)
{
        struct pollfd pfd = {.fd = diwarp_async_fd(dev), .events = POLLIN};
        while (poll(&pfd, 1, 0) == 1) {
                struct diwarp_async_event ev;
                CHECK(diwarp_get_async_event(dev, &ev));
                if (ev.event_type == DIWARP_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq)
                        return true;
        }
        return false;
}

/* Several QPs (RD QPs, or RC QPs over RD) share one SRQ and receive from
 * several peers. With the SRQ empty every Send is refused (RNR) and retried;
 * once receives are posted, everything arrives exactly once, in order per
 * stream, byte-exact, and taking receives below the armed limit raises
 * SRQ_LIMIT_REACHED. */
static int case_srq(void)
{
        struct side rx[SRQ_NQ], tx[SRQ_NQ];
        struct diwarp_srq *srq;
        struct diwarp_wc wc[16];
        buf_len = (size_t)SRQ_NQ * SRQ_MSGS * SRQ_SLOT;
        int acc = DIWARP_ACCESS_LOCAL_WRITE;

        side_open(&rx[0], acc);
        struct diwarp_srq_attr sa = {.max_wr = SRQ_DEPTH, .max_sge = 1};
        CHECK(diwarp_srq_create(rx[0].pd, &sa, NULL, &srq));
        make_srq = srq;
        for (unsigned q = 0; q < SRQ_NQ; q++) {
                if (q)
                        rx[q] = rx[0];
                rx[q].ah = NULL;
                qp_make(&rx[q], acc);
        }
        make_srq = NULL;
        for (unsigned s = 0; s < SRQ_NQ; s++) {
                side_open(&tx[s], acc);
                qp_make(&tx[s], acc);
        }
        for (unsigned q = 0; q < SRQ_NQ; q++) {
                /* RC: one peer per QP; RD: every sender talks to every QP. */
                qp_connect(&rx[q], &tx[q], tx[q].qpn);
                qp_connect(&tx[q], &rx[q], rx[q].qpn);
        }
        for (unsigned s = 0; s < SRQ_NQ; s++)
                for (unsigned q = 0; q < SRQ_NQ; q++)
                        for (unsigned i = 0; i < SRQ_MSGS; i++) {
                                uint8_t *m = srq_msg(&tx[s], q, i);
                                uint32_t hdr[3] = {s, q, i};
                                fill(m, srq_len(s, q, i), s * 10000 + q * 100 + i);
                                memcpy(m, hdr, sizeof(hdr));
                        }

        unsigned posted[SRQ_NQ][SRQ_NQ] = {{0}}, sdone[SRQ_NQ] = {0};
        unsigned rnext[SRQ_NQ][SRQ_NQ] = {{0}}, rdone = 0, total = 0;
        for (unsigned s = 0; s < SRQ_NQ; s++)
                total += rc_mode ? SRQ_MSGS : SRQ_NQ * SRQ_MSGS;

                /* Posts what the windows allow; RC QPs send to their one peer only. */
#define SRQ_PUMP()                                                                                 \
        for (unsigned s = 0; s < SRQ_NQ; s++)                                                      \
                for (unsigned q = 0; q < SRQ_NQ; q++) {                                            \
                        if (rc_mode && q != s)                                                     \
                                continue;                                                          \
                        while (posted[s][q] < SRQ_MSGS &&                                          \
                               posted[s][q] - rnext[s][q] < SRQ_WINDOW) {                          \
                                unsigned i = posted[s][q]++;                                       \
                                struct diwarp_sge sge = {(uintptr_t)srq_msg(&tx[s], q, i),         \
                                                         srq_len(s, q, i), tx[s].lkey};            \
                                struct diwarp_send_wr wr = {.wr_id = (uint64_t)q << 32 | i,        \
                                                            .sg_list = &sge,                       \
                                                            .num_sge = 1,                          \
                                                            .opcode = DIWARP_WR_SEND,              \
                                                            .send_flags = DIWARP_SEND_SIGNALED};   \
                                post(&tx[s], &rx[q], &wr);                                         \
                        }                                                                          \
                }

                /* Receives from the SRQ: check and give the slot back (when `repost`). */
#define SRQ_DRAIN(repost)                                                                          \
        do {                                                                                       \
                int n = diwarp_cq_poll(rx[0].cq, 16, wc);                                          \
                if (n < 0)                                                                         \
                        die("srq: cq_poll: %s", strerror(-n));                                     \
                for (int k = 0; k < n; k++) {                                                      \
                        uint32_t hdr[3];                                                           \
                        unsigned slot = (unsigned)wc[k].wr_id;                                     \
                        const uint8_t *got = rx[0].buf + (uint64_t)slot * SRQ_SLOT;                \
                        expect_wc(&wc[k], slot, DIWARP_WC_SUCCESS, "srq recv");                    \
                        memcpy(hdr, got, sizeof(hdr));                                             \
                        unsigned s = hdr[0], q = hdr[1], i = hdr[2];                               \
                        if (s >= SRQ_NQ || q >= SRQ_NQ || i != rnext[s][q])                        \
                                die("srq: got (%u, %u, %u), want message %u of that stream", s, q, \
                                    i, s < SRQ_NQ && q < SRQ_NQ ? rnext[s][q] : 0);                \
                        if (wc[k].qp_num != rx[q].qpn || wc[k].src_qp != tx[s].qpn)                \
                                die("srq: message (%u, %u, %u) on QP %#x from %#x", s, q, i,       \
                                    wc[k].qp_num, wc[k].src_qp);                                   \
                        if (wc[k].byte_len != srq_len(s, q, i))                                    \
                                die("srq: (%u, %u, %u) byte_len %u, want %u", s, q, i,             \
                                    wc[k].byte_len, srq_len(s, q, i));                             \
                        verify(srq_msg(&tx[s], q, i), got, srq_len(s, q, i), "srq recv",           \
                               srq_len(s, q, i));                                                  \
                        rnext[s][q]++;                                                             \
                        rdone++;                                                                   \
                        if (repost)                                                                \
                                srq_post_recv(srq, &rx[0], slot);                                  \
                }                                                                                  \
        } while (0)

        /* The SRQ is empty: no receive lands. With credits the Sends are
         * parked in the receiving QPs' mailboxes and complete; without, every
         * one is refused and retried. */
        bool credits = credits_on();
        unsigned sends = 0;
        SRQ_PUMP();
        uint64_t end = now_ms() + 300;
        while (now_ms() < end) {
                for (unsigned s = 0; s < SRQ_NQ; s++) {
                        int n = diwarp_cq_poll(tx[s].cq, 16, wc);
                        if (n != 0 && (!credits || wc[0].status != DIWARP_WC_SUCCESS))
                                die("srq: a send completed (%s) with the SRQ empty",
                                    diwarp_wc_status_str(wc[0].status));
                        for (int k = 0; k < n; k++)
                                if (wc[k].status != DIWARP_WC_SUCCESS)
                                        die("srq: parked send: %s",
                                            diwarp_wc_status_str(wc[k].status));
                        sends += (unsigned)(n > 0 ? n : 0);
                        sdone[s] += (unsigned)(n > 0 ? n : 0);
                }
                SRQ_DRAIN(false);
                if (rdone)
                        die("srq: a receive completed with the SRQ empty");
        }
        uint64_t naks = 0;
        for (unsigned s = 0; s < SRQ_NQ; s++) {
                struct diwarp_counters c;
                CHECK(diwarp_device_counters(tx[s].dev, &c));
                naks += c.rnr_naks;
        }
        struct diwarp_counters rc0;
        CHECK(diwarp_device_counters(rx[0].dev, &rc0));
        if (!credits && naks == 0)
                die("srq: no RNR NAK while the SRQ was empty");
        if (credits && (naks != 0 || rc0.mbox_parked == 0 || sends == 0))
                die("srq: with credits, %llu RNR NAKs, %llu segments parked, %u sends done "
                    "while the SRQ was empty",
                    (unsigned long long)naks, (unsigned long long)rc0.mbox_parked, sends);

        /* A few receives with the limit armed above what is left after three
         * are taken: the limit event fires, the refused Sends go through. */
        sa.srq_limit = SRQ_LIMIT;
        /* With credits the parked Sends take each receive as it is posted:
         * the limit is armed first. */
        if (credits)
                CHECK(diwarp_srq_modify(srq, &sa, 2 /* IBV_SRQ_LIMIT */));
        for (unsigned slot = 0; slot < SRQ_FIRST; slot++)
                srq_post_recv(srq, &rx[0], slot);
        if (!credits)
                CHECK(diwarp_srq_modify(srq, &sa, 2 /* IBV_SRQ_LIMIT */));
        end = now_ms() + 20000;
        while (rdone < SRQ_FIRST - SRQ_LIMIT + 1) {
                SRQ_DRAIN(false);
                for (unsigned s = 0; s < SRQ_NQ; s++)
                        diwarp_progress(tx[s].dev, 64);
                if (now_ms() > end)
                        die("srq: %u receives after posting %u", rdone, SRQ_FIRST);
        }
        if (!srq_limit_event(rx[0].dev, srq))
                die("srq: no SRQ_LIMIT_REACHED below the limit of %u", SRQ_LIMIT);

        /* The rest of the slots, then everything, reposting as they complete. */
        for (unsigned slot = SRQ_FIRST; slot < SRQ_DEPTH; slot++)
                srq_post_recv(srq, &rx[0], slot);
        end = now_ms() + 60000;
        while (rdone < total || sends < total) {
                SRQ_DRAIN(true);
                SRQ_PUMP();
                for (unsigned s = 0; s < SRQ_NQ; s++) {
                        int n = diwarp_cq_poll(tx[s].cq, 16, wc);
                        for (int k = 0; k < n; k++)
                                if (wc[k].status != DIWARP_WC_SUCCESS)
                                        die("srq: send %#llx of peer %u: %s",
                                            (unsigned long long)wc[k].wr_id, s,
                                            diwarp_wc_status_str(wc[k].status));
                        sends += (unsigned)(n > 0 ? n : 0);
                        sdone[s] += (unsigned)(n > 0 ? n : 0);
                }
                if (now_ms() > end)
                        die("srq: timeout, %u/%u received, %u sends done", rdone, total, sends);
        }
#undef SRQ_PUMP
#undef SRQ_DRAIN
        fprintf(stderr, "srq ok: %u messages over %u QPs on one SRQ, %llu RNR NAKs\n", total,
                SRQ_NQ, (unsigned long long)naks);
        for (unsigned q = 0; q < SRQ_NQ; q++) {
                if (rx[q].ah)
                        CHECK(diwarp_ah_destroy(rx[q].ah));
                CHECK(diwarp_qp_destroy(rx[q].qp));
        }
        CHECK(diwarp_srq_destroy(srq));
        rx[0].ah = NULL;
        rx[0].qp = NULL;
        CHECK(diwarp_mr_dereg(rx[0].mr));
        CHECK(diwarp_cq_destroy(rx[0].cq));
        CHECK(diwarp_pd_dealloc(rx[0].pd));
        CHECK(diwarp_device_close(rx[0].dev));
        free(rx[0].buf);
        for (unsigned s = 0; s < SRQ_NQ; s++)
                side_close(&tx[s]);
        return 0;
}

/* ---------------------------------------------------------------- srqpd */

/* Receive WRs posted to an SRQ are checked in the SRQ's PD, not the QP's:
 * b's QP is in one PD, its SRQ in another. b's own RDMA Read lands in memory
 * of the QP's PD (a send WR's SGEs are the QP's); a receive whose buffer is
 * registered in the SRQ's PD takes a's Send; one registered in the QP's PD
 * completes with LOC_PROT_ERR and nothing written, a's Send with REM_OP_ERR
 * (the error NAK of a receive WR that fails its lkey), a's QP in ERR, b's
 * QP in RTS (RD: it serves its other peers) or in ERR (RC over RD). */
static int case_srqpd(void)
{
        struct side a, b;
        struct diwarp_wc wc;
        buf_len = 1 * MiB;
        int acc = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_READ;
        side_open(&a, acc);
        side_open(&b, acc);
        struct diwarp_pd *spd;
        struct diwarp_mr *smr;
        struct diwarp_srq *srq;
        uint8_t *sbuf = b.buf + buf_len / 2;
        CHECK(diwarp_pd_alloc(b.dev, &spd));
        CHECK(diwarp_mr_reg(spd, sbuf, buf_len / 2, (uintptr_t)sbuf, DIWARP_ACCESS_LOCAL_WRITE,
                            &smr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(smr, &mi));
        struct diwarp_srq_attr sa = {.max_wr = 16, .max_sge = 1};
        CHECK(diwarp_srq_create(spd, &sa, NULL, &srq));
        make_srq = srq;
        qp_make(&b, acc);
        make_srq = NULL;
        qp_make(&a, acc);
        qp_connect(&a, &b, b.qpn);
        qp_connect(&b, &a, a.qpn);

        fill(a.buf, 4096, 5);
        wc = mw_rdma(&b, &a, DIWARP_WR_RDMA_READ, 1, (uintptr_t)a.buf, 4096, a.rkey);
        expect_wc(&wc, 1, DIWARP_WC_SUCCESS, "srqpd: Read into the QP's PD");
        verify(a.buf, b.buf, 4096, "srqpd read", 4096);

        struct diwarp_sge rs = {(uintptr_t)sbuf, 4096, mi.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 0x51, .sg_list = &rs, .num_sge = 1}, *rbad;
        CHECK(diwarp_post_srq_recv(srq, &rwr, &rbad));
        fill(a.buf, 1000, 9);
        struct diwarp_sge sge = {(uintptr_t)a.buf, 1000, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 2,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        post(&a, &b, &wr);
        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                die("srqpd: no receive in the SRQ's PD");
        expect_wc(&wc, 0x51, DIWARP_WC_SUCCESS, "srqpd: receive in the SRQ's PD");
        if (wc.byte_len != 1000)
                die("srqpd: received %u bytes, want 1000", wc.byte_len);
        verify(a.buf, sbuf, 1000, "srqpd send", 1000);
        if (poll_until(&a, &b, &wc, 1, 10000) != 1)
                die("srqpd: no send completion");
        expect_wc(&wc, 2, DIWARP_WC_SUCCESS, "srqpd: Send into the SRQ's PD");

        /* b's own region is in the QP's PD, which does not apply. */
        memset(b.buf, 0, 8192);
        rs = (struct diwarp_sge){(uintptr_t)b.buf + 4096, 4096, b.lkey};
        rwr.wr_id = 0x52;
        CHECK(diwarp_post_srq_recv(srq, &rwr, &rbad));
        wr.wr_id = 3;
        post(&a, &b, &wr);
        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                die("srqpd: no receive in the QP's PD");
        expect_wc(&wc, 0x52, DIWARP_WC_LOC_PROT_ERR, "srqpd: receive in the QP's PD");
        for (size_t i = 0; i < 8192; i++)
                if (b.buf[i])
                        die("srqpd: a refused receive wrote byte %zu", i);
        if (poll_until(&a, &b, &wc, 1, 10000) != 1)
                die("srqpd: no completion of the refused Send");
        expect_wc(&wc, 3, DIWARP_WC_REM_OP_ERR, "srqpd: Send into the QP's PD");
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_ERR)
                die("srqpd: requester QP not in ERR after REM_OP_ERR");
        if (diwarp_qp_state(b.qp) != (rc_mode ? DIWARP_QPS_ERR : DIWARP_QPS_RTS))
                die("srqpd: responder QP in state %d", diwarp_qp_state(b.qp));

        if (b.ah)
                CHECK(diwarp_ah_destroy(b.ah));
        CHECK(diwarp_qp_destroy(b.qp));
        b.ah = NULL;
        b.qp = NULL;
        CHECK(diwarp_srq_destroy(srq));
        CHECK(diwarp_mr_dereg(smr));
        CHECK(diwarp_pd_dealloc(spd));
        side_close(&a);
        side_close(&b);
        fprintf(stderr, "srqpd ok\n");
        return 0;
}

/* ---------------------------------------------------------------- invfail */

/* Posts a's signaled Send with Invalidate of stag to b. */
static void inv_send(struct side *a, struct side *b, uint64_t id, uint32_t stag)
{
        struct diwarp_sge sge = {(uintptr_t)a->buf, 8, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND_WITH_INV,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .invalidate_rkey = stag};
        wr.wr.ud.ah = a->ah;
        wr.wr.ud.remote_qpn = b->qpn;
        wr.wr.ud.remote_qkey = QKEY;
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(a->qp, &wr, &bad));
}

/* A Send with Invalidate of an STag b cannot invalidate (a region of another
 * PD of its device, a type 1 window, an STag that names nothing) is refused
 * with an error NAK before it is acknowledged: a's WR completes with
 * REM_ACCESS_ERR (what RC over TCP's Terminate, Remote Protection "STag
 * cannot be invalidated", gives) and a's QP is in ERR, b's receive WR
 * completes with REM_INV_REQ_ERR, b's QP is in RTS (RD) or in ERR (RC over
 * RD), as for any other refused request, and the STag still works. First, as
 * a control, one that b can invalidate succeeds. */
static int case_invfail(void)
{
        struct side a, b;
        struct diwarp_wc wc;
        buf_len = 1 * MiB;
        const int qacc =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        const char *what[3] = {"a region of another PD", "a type 1 window", "no such STag"};
        for (int k = 0; k < 3; k++) {
                pair_open(&a, &b, qacc);
                uint8_t *xbuf = b.buf + buf_len / 2;
                struct diwarp_pd *opd = NULL;
                struct diwarp_mr *xmr = NULL;
                struct diwarp_mw *mw = NULL;
                struct diwarp_mr_info xi;
                uint32_t stag;
                if (k == 0) {
                        /* The control: b's own region of the QP's PD. */
                        struct diwarp_mr *own;
                        CHECK(diwarp_mr_reg(b.pd, xbuf, 4096, (uintptr_t)xbuf, qacc, &own));
                        CHECK(diwarp_mr_info(own, &xi));
                        post_recv(&b, 0x70, 0, 64);
                        inv_send(&a, &b, 1, xi.rkey);
                        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                                die("invfail: no receive for the control");
                        expect_wc(&wc, 0x70, DIWARP_WC_SUCCESS, "invfail: control receive");
                        if (!(wc.wc_flags & DIWARP_WC_WITH_INV) || wc.invalidated_rkey != xi.rkey)
                                die("invfail: control receive flags %#x rkey %#x", wc.wc_flags,
                                    wc.invalidated_rkey);
                        if (poll_until(&a, &b, &wc, 1, 10000) != 1)
                                die("invfail: no send completion for the control");
                        expect_wc(&wc, 1, DIWARP_WC_SUCCESS, "invfail: control send");
                        CHECK(diwarp_mr_dereg(own));

                        CHECK(diwarp_pd_alloc(b.dev, &opd));
                        CHECK(diwarp_mr_reg(opd, xbuf, 4096, (uintptr_t)xbuf, qacc, &xmr));
                        CHECK(diwarp_mr_info(xmr, &xi));
                        stag = xi.rkey;
                } else if (k == 1) {
                        CHECK(diwarp_mw_alloc(b.pd, DIWARP_MW_TYPE_1, &mw));
                        stag = mw_rkey(mw);
                } else {
                        stag = b.rkey ^ 0x5a;
                }
                post_recv(&b, 0x71, 64, 64);
                inv_send(&a, &b, 2, stag);
                if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                        die("invfail %s: no receive completion", what[k]);
                expect_wc(&wc, 0x71, DIWARP_WC_REM_INV_REQ_ERR, what[k]);
                /* vendor_err: RDMAP, Remote Protection, "STag cannot be
                 * invalidated" (RFC 5040 §4.8), as RC's Terminate says it. */
                if (wc.vendor_err != (0x0u << 12 | 0x1u << 8 | 0x09u))
                        die("invfail %s: receive vendor_err %#x", what[k], wc.vendor_err);
                if (poll_until(&a, &b, &wc, 1, 10000) != 1)
                        die("invfail %s: no send completion", what[k]);
                expect_wc(&wc, 2, DIWARP_WC_REM_ACCESS_ERR, what[k]);
                if (diwarp_qp_state(a.qp) != DIWARP_QPS_ERR)
                        die("invfail %s: requester QP not in ERR", what[k]);
                if (diwarp_qp_state(b.qp) != (rc_mode ? DIWARP_QPS_ERR : DIWARP_QPS_RTS))
                        die("invfail %s: responder QP in state %d", what[k], diwarp_qp_state(b.qp));
                if (!rc_mode) {
                        /* b serves on: another peer's Write lands. */
                        struct side c;
                        side_open(&c, qacc);
                        qp_make(&c, qacc);
                        qp_connect(&c, &b, b.qpn);
                        fill(c.buf, 4096, 11);
                        wc = mw_rdma(&c, &b, DIWARP_WR_RDMA_WRITE, 3, (uintptr_t)b.buf + 8192, 4096,
                                     b.rkey);
                        expect_wc(&wc, 3, DIWARP_WC_SUCCESS, "invfail: a Write of another peer");
                        verify(c.buf, b.buf + 8192, 4096, "invfail write", 4096);
                        side_close(&c);
                }
                if (mw)
                        CHECK(diwarp_mw_dealloc(mw));
                if (xmr)
                        CHECK(diwarp_mr_dereg(xmr));
                if (opd)
                        CHECK(diwarp_pd_dealloc(opd));
                side_close(&a);
                side_close(&b);
        }
        fprintf(stderr, "invfail ok\n");
        return 0;
}

/* ---------------------------------------------------------------- mboxinv */

/* A Send with Invalidate delivered through an application mailbox
 * (diwarpdv_mbox_open) performs its Invalidate as the message completes, as
 * one into a receive WR does: the receive completion carries WITH_INV and the
 * STag, and a's Write through that STag, accepted just before, is then
 * refused (REM_ACCESS_ERR) and writes nothing. Round 0: a region of b's PD
 * (invfail's control); round 1: a type 2 window bound on b's QP. A plain Send
 * before it completes without WITH_INV. */
static int case_mboxinv(void)
{
        if (rc_mode) {
                fprintf(stderr, "mboxinv: RD only\n");
                return 77;
        }
        struct side a, b;
        struct diwarp_wc wc;
        buf_len = 1 * MiB;
        const int qacc =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        const int wacc = DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        const char *what[2] = {"a region of the QP's PD", "a type 2 window"};
        for (int k = 0; k < 2; k++) {
                side_open(&a, qacc);
                side_open(&b, qacc);
                qp_make(&a, qacc);
                qp_make(&b, qacc);
                struct diwarpdv_mbox mb;
                CHECK(diwarpdv_mbox_open(b.qp, &mb));
                qp_connect(&a, &b, b.qpn);
                qp_connect(&b, &a, a.qpn);
                const uint8_t *ring = mb.ring;
                uint8_t *xbuf = b.buf + buf_len / 2;
                struct diwarp_mr *xmr = NULL;
                struct diwarp_mw *mw = NULL;
                uint32_t stag;
                if (k == 0) {
                        struct diwarp_mr_info xi;
                        CHECK(diwarp_mr_reg(b.pd, xbuf, 4096, (uintptr_t)xbuf, qacc, &xmr));
                        CHECK(diwarp_mr_info(xmr, &xi));
                        stag = xi.rkey;
                } else {
                        CHECK(diwarp_mr_reg(b.pd, b.buf, buf_len, (uintptr_t)b.buf,
                                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_MW_BIND,
                                            &xmr));
                        CHECK(diwarp_mw_alloc(b.pd, DIWARP_MW_TYPE_2, &mw));
                        stag = inc_key(mw_rkey(mw));
                        wc = mw_bind2(&b, &a, mw, stag, xmr, (uintptr_t)xbuf, 4096, wacc);
                        expect_wc(&wc, 0xb2, DIWARP_WC_SUCCESS, "mboxinv: type 2 bind");
                }
                /* The STag serves a Write before the Invalidate. */
                fill(a.buf, 4096, 21);
                wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_WRITE, 1, (uintptr_t)xbuf, 4096, stag);
                expect_wc(&wc, 1, DIWARP_WC_SUCCESS, what[k]);
                verify(a.buf, xbuf, 4096, "mboxinv write", 4096);

                /* A plain Send, then the Send with Invalidate: both into the
                 * mailbox, in order, only the second with WITH_INV. */
                for (int s = 0; s < 2; s++) {
                        fill(a.buf, 8, 40 + s);
                        if (s) {
                                inv_send(&a, &b, 3, stag);
                        } else {
                                struct diwarp_sge sge = {(uintptr_t)a.buf, 8, a.lkey};
                                struct diwarp_send_wr wr = {.wr_id = 2,
                                                            .sg_list = &sge,
                                                            .num_sge = 1,
                                                            .opcode = DIWARP_WR_SEND,
                                                            .send_flags = DIWARP_SEND_SIGNALED};
                                post(&a, &b, &wr);
                        }
                        if (poll_until(&b, &a, &wc, 1, 10000) != 1)
                                die("mboxinv %s: no receive for Send %d", what[k], s);
                        expect_wc(&wc, wc.wr_id, DIWARP_WC_SUCCESS, what[k]);
                        const uint8_t *m = (const uint8_t *)(uintptr_t)wc.wr_id;
                        if (m < ring || m >= ring + mb.len || wc.opcode != DIWARP_WC_RECV ||
                            wc.byte_len != 8 || wc.src_qp != a.qpn)
                                die("mboxinv %s: Send %d received at %p (ring %p + %zu), opcode "
                                    "%d, %u bytes from %#x",
                                    what[k], s, (const void *)m, (const void *)ring, mb.len,
                                    wc.opcode, wc.byte_len, wc.src_qp);
                        verify(a.buf, m, 8, "mboxinv message", 8);
                        bool inv = (wc.wc_flags & DIWARP_WC_WITH_INV) != 0;
                        if (inv != (s == 1) || (s == 1 && wc.invalidated_rkey != stag))
                                die("mboxinv %s: Send %d receive flags %#x rkey %#x, want %s %#x",
                                    what[k], s, wc.wc_flags, wc.invalidated_rkey,
                                    s ? "WITH_INV" : "no WITH_INV", s ? stag : 0);
                        CHECK(diwarpdv_mbox_release(b.qp, m));
                        if (poll_until(&a, &b, &wc, 1, 10000) != 1)
                                die("mboxinv %s: no completion for Send %d", what[k], s);
                        expect_wc(&wc, 2 + (uint64_t)s, DIWARP_WC_SUCCESS, what[k]);
                }

                /* The STag is gone: a's Write is refused, nothing written. */
                fill(a.buf, 4096, 99);
                wc = mw_rdma(&a, &b, DIWARP_WR_RDMA_WRITE, 4, (uintptr_t)xbuf, 4096, stag);
                expect_wc(&wc, 4, DIWARP_WC_REM_ACCESS_ERR, what[k]);
                fill(a.buf, 4096, 21);
                verify(a.buf, xbuf, 4096, "mboxinv: memory after the refused Write", 4096);
                if (mw)
                        CHECK(diwarp_mw_dealloc(mw));
                CHECK(diwarp_mr_dereg(xmr));
                side_close(&a);
                side_close(&b);
        }
        fprintf(stderr, "mboxinv ok\n");
        return 0;
}

/* ---------------------------------------------------------------- fds */

static int count_fds(void)
{
        int n = 0;
        DIR *d = opendir("/proc/self/fd");
        if (!d)
                return -1;
        while (readdir(d))
                n++;
        closedir(d);
        return n;
}

/* NQ QPs per side, each of a's sending to each of b's: NQ x NQ pseudo-streams
 * per device. heap: NQ = 100 (10 000 per device), and the heap growth over
 * the exchange, per pseudo-stream (glibc mallinfo2; 0 under ASan). */
static int case_fds(bool heap)
{
        const int NQ = heap ? 100 : 64;
        struct side a, b;
        buf_len = 1 * MiB;
        side_open(&a, DIWARP_ACCESS_LOCAL_WRITE);
        side_open(&b, DIWARP_ACCESS_LOCAL_WRITE);
        int before = count_fds();
        struct diwarp_qp *qa[100], *qb[100];
        struct side sa = a, sb = b;
        for (int i = 0; i < NQ; i++) {
                qp_make(&sa, 0);
                qp_make(&sb, 0);
                qa[i] = sa.qp;
                qb[i] = sb.qp;
                qp_connect(&sa, &b, 0);
                qp_connect(&sb, &a, 0);
                if (i != NQ - 1) {
                        CHECK(diwarp_ah_destroy(sa.ah));
                        CHECK(diwarp_ah_destroy(sb.ah));
                }
        }
        struct diwarp_ah *ah = sa.ah;
        CHECK(diwarp_ah_destroy(sb.ah));
        struct mallinfo2 m0 = mallinfo2();
        /* Each of a's QPs sends to every one of b's QPs: NQ x NQ pseudo-streams. */
        for (int j = 0; j < NQ; j++)
                for (int k = 0; k < NQ; k++)
                        post_recv(&(struct side){.qp = qb[j], .buf = b.buf, .lkey = b.lkey},
                                  (uint64_t)j << 16 | (uint64_t)k, 0, 64);
        /* One row of NQ sends at a time, each delivered before the next: the
         * point is NQ x NQ live pseudo-streams, not a 10 000-datagram burst
         * that a loaded machine's socket buffers turn into retransmission
         * storms. */
        int got = 0;
        struct diwarp_wc wc[64];
        uint64_t end = now_ms() + 120000;
        for (int i = 0; i < NQ; i++) {
                for (int j = 0; j < NQ; j++) {
                        struct diwarp_sge sge = {(uintptr_t)a.buf, 16, a.lkey};
                        struct diwarp_send_wr wr = {.wr_id = (uint64_t)i << 16 | (uint64_t)j,
                                                    .sg_list = &sge,
                                                    .num_sge = 1,
                                                    .opcode = DIWARP_WR_SEND};
                        wr.wr.ud.ah = ah;
                        wr.wr.ud.remote_qpn = diwarp_qp_num(qb[j]);
                        wr.wr.ud.remote_qkey = QKEY;
                        struct diwarp_send_wr *bad;
                        CHECK(diwarp_post_send(qa[i], &wr, &bad));
                }
                while (got < (i + 1) * NQ) {
                        int n = diwarp_cq_poll(b.cq, 64, wc);
                        for (int k = 0; k < n; k++)
                                if (wc[k].status != DIWARP_WC_SUCCESS)
                                        die("fds: receive status %d", wc[k].status);
                        got += n;
                        diwarp_cq_poll(a.cq, 64, wc);
                        if (now_ms() > end)
                                die("fds: %d/%d messages", got, NQ * NQ);
                }
        }
        /* Let the last ACKs arrive: every window drains, every ring returns. */
        for (int k = 0; k < 20; k++) {
                diwarp_progress(a.dev, 64);
                diwarp_progress(b.dev, 64);
                usleep(1000);
        }
        struct mallinfo2 m1 = mallinfo2();
        size_t grew = m1.uordblks - m0.uordblks;
        if (heap) {
                fprintf(stderr,
                        "heap: sizeof(struct dw_rd_peer) = %zu (idle pseudo-stream); %d "
                        "pseudo-streams on 2 devices: heap +%zu bytes = %zu bytes each\n",
                        dw_rd_peer_bytes(), 2 * NQ * NQ, grew, grew / (size_t)(2 * NQ * NQ));
                if (dw_rd_peer_bytes() > 256)
                        die("heap: per-peer state %zu bytes > 256", dw_rd_peer_bytes());
                if (grew && grew / (size_t)(2 * NQ * NQ) > 400)
                        die("heap: %zu bytes per pseudo-stream", grew / (size_t)(2 * NQ * NQ));
        }
        int after = count_fds();
        if (after != before)
                die("fds: %d descriptors before the QPs, %d with %d QPs and %d peers", before,
                    after, 2 * NQ, NQ * NQ);
        fprintf(stderr,
                "fds ok: %d fds for 2 devices, %d QPs, %d pseudo-streams; %zu bytes per "
                "pseudo-stream\n",
                after, 2 * NQ, 2 * NQ * NQ, dw_rd_peer_bytes());
        for (int i = 0; i < NQ; i++) {
                /* drain, then destroy */
                CHECK(diwarp_qp_destroy(qa[i]));
                CHECK(diwarp_qp_destroy(qb[i]));
        }
        CHECK(diwarp_ah_destroy(ah));
        a.qp = b.qp = NULL;
        CHECK(diwarp_mr_dereg(a.mr));
        CHECK(diwarp_mr_dereg(b.mr));
        while (diwarp_cq_poll(a.cq, 64, wc) > 0 || diwarp_cq_poll(b.cq, 64, wc) > 0)
                ;
        CHECK(diwarp_cq_destroy(a.cq));
        CHECK(diwarp_cq_destroy(b.cq));
        CHECK(diwarp_pd_dealloc(a.pd));
        CHECK(diwarp_pd_dealloc(b.pd));
        CHECK(diwarp_device_close(a.dev));
        CHECK(diwarp_device_close(b.dev));
        free(a.buf);
        free(b.buf);
        return 0;
}

/* ---------------------------------------------------------------- vanish */

static int case_vanish(const char *how)
{
        int up[2], down[2];
        buf_len = 1 * MiB;
        if (pipe(up) < 0 || pipe(down) < 0)
                die("pipe");
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid == 0) {
                struct side b, a_info;
                side_open(&b, DIWARP_ACCESS_LOCAL_WRITE);
                qp_make(&b, 0);
                uint32_t info[5] = {b.qpn};
                memcpy(&info[1], b.gid.raw, 16);
                if (write(up[1], info, sizeof(info)) != sizeof(info))
                        _exit(2);
                if (read(down[0], info, sizeof(info)) != sizeof(info))
                        _exit(2);
                memset(&a_info, 0, sizeof(a_info));
                memcpy(a_info.gid.raw, &info[1], 16);
                qp_connect(&b, &a_info, info[0]);
                for (int i = 0; i < 64; i++)
                        post_recv(&b, i, 0, 4096);
                for (;;) {
                        struct diwarp_wc wc[8];
                        diwarp_cq_poll(b.cq, 8, wc);
                        usleep(100);
                }
        }
        struct side a, b_info;
        side_open(&a, DIWARP_ACCESS_LOCAL_WRITE);
        qp_make(&a, 0);
        uint32_t info[5];
        if (read(up[0], info, sizeof(info)) != sizeof(info))
                die("child setup");
        memset(&b_info, 0, sizeof(b_info));
        memcpy(b_info.gid.raw, &info[1], 16);
        b_info.qpn = info[0];
        uint32_t mine[5] = {a.qpn};
        memcpy(&mine[1], a.gid.raw, 16);
        if (write(down[1], mine, sizeof(mine)) != sizeof(mine))
                die("pipe write");
        qp_connect(&a, &b_info, b_info.qpn);
        struct diwarp_wc wc[8];
        struct diwarp_sge sge = {(uintptr_t)a.buf, 1000, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        post(&a, &b_info, &wr);
        if (poll_until(&a, NULL, wc, 1, 10000) != 1)
                die("vanish: first send did not complete");
        expect_wc(wc, 1, DIWARP_WC_SUCCESS, "vanish first send");
        kill(pid, strcmp(how, "stop") == 0 ? SIGSTOP : SIGKILL);
        usleep(20000);
        uint64_t t0 = now_ms();
        wr.wr_id = 2;
        post(&a, &b_info, &wr);
        wr.wr_id = 3;
        post(&a, &b_info, &wr);
        const char *env = getenv("DIWARP_PEER_TIMEOUT_MS");
        unsigned limit = env ? (unsigned)atoi(env) : 5000;
        int n = poll_until(&a, NULL, wc, 2, limit + 2000);
        uint64_t dt = now_ms() - t0;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        if (n != 2)
                die("vanish: %d completions after %llu ms", n, (unsigned long long)dt);
        expect_wc(&wc[0], 2, DIWARP_WC_RETRY_EXC_ERR, "vanish send");
        expect_wc(&wc[1], 3, DIWARP_WC_WR_FLUSH_ERR, "vanish flushed send");
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_ERR)
                die("vanish: QP not in ERR");
        struct diwarp_async_event ev;
        int fl = diwarp_get_async_event(a.dev, &ev);
        if (fl < 0 || ev.event_type != DIWARP_EVENT_QP_FATAL)
                die("vanish: no QP_FATAL async event (%d)", fl);
        fprintf(stderr, "vanish (%s) ok: RETRY_EXC_ERR after %llu ms (limit %u)\n", how,
                (unsigned long long)dt, limit);
        side_close(&a);
        return 0;
}

/* ---------------------------------------------------------------- pingpong */

/* Message m (0 .. 2*PP_N-1) goes from side m % 2 to the other, from its own
 * source slot (a slot is not reused while its Send may be retransmitted), and
 * is answered by m + 1 as soon as it is received. The answer's ACK completes
 * the Send it answers; with one-WR send queues the next post must find room
 * even when that completion was not polled yet. */
#define PP_N   1000
#define PP_LEN 64
#define PP_SRC (64 * 1024)

static void pp_send(struct side *from, struct side *to, uint32_t m)
{
        uint8_t *src = from->buf + PP_SRC + (size_t)m * PP_LEN;
        fill(src, PP_LEN, m);
        struct diwarp_sge sge = {(uintptr_t)src, PP_LEN, from->lkey};
        struct diwarp_send_wr wr = {.wr_id = 0x5000 + m,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        post(from, to, &wr);
}

static int case_pingpong(void)
{
        struct side s[2];
        buf_len = 1 * MiB;
        sq_depth = 1;
        pair_open(&s[0], &s[1], DIWARP_ACCESS_LOCAL_WRITE);
        /* two receive slots per side, reposted as they complete */
        for (int k = 0; k < 2; k++)
                for (uint32_t slot = 0; slot < 2; slot++)
                        post_recv(&s[k], 0x100 + slot, slot * 4096, 4096);
        uint32_t sent[2] = {1, 0}, sdone[2] = {0, 0}, rdone[2] = {0, 0};
        pp_send(&s[0], &s[1], 0);
        uint64_t end = now_ms() + 60000;
        while (rdone[0] + rdone[1] < 2 * PP_N || sdone[0] + sdone[1] < 2 * PP_N) {
                if (now_ms() > end)
                        die("pingpong: %u+%u receives, %u+%u send completions", rdone[0], rdone[1],
                            sdone[0], sdone[1]);
                for (int k = 0; k < 2; k++) {
                        struct diwarp_wc wc;
                        int n = diwarp_cq_poll(s[k].cq, 1, &wc);
                        if (n < 0)
                                die("cq_poll: %s", strerror(-n));
                        if (n == 0)
                                continue;
                        if (wc.status != DIWARP_WC_SUCCESS)
                                die("pingpong: side %d wr_id %#llx: %s", k,
                                    (unsigned long long)wc.wr_id, diwarp_wc_status_str(wc.status));
                        if (wc.opcode != DIWARP_WC_RECV) {
                                /* this side's Sends: m = k, k + 2, ... in order */
                                uint32_t m = 2 * sdone[k] + (uint32_t)k;
                                expect_wc(&wc, 0x5000 + m, DIWARP_WC_SUCCESS, "pingpong send");
                                sdone[k]++;
                                continue;
                        }
                        uint32_t m = 2 * rdone[k] + 1 - (uint32_t)k; /* sent by the other side */
                        uint32_t slot = (uint32_t)(wc.wr_id - 0x100);
                        if (slot > 1 || wc.byte_len != PP_LEN)
                                die("pingpong: side %d message %u: wr_id %#llx, %u bytes", k, m,
                                    (unsigned long long)wc.wr_id, wc.byte_len);
                        verify(s[1 - k].buf + PP_SRC + (size_t)m * PP_LEN, s[k].buf + slot * 4096,
                               PP_LEN, "pingpong", m);
                        rdone[k]++;
                        /* the answer first, then the receive goes back */
                        if (m + 1 < 2 * PP_N) {
                                pp_send(&s[k], &s[1 - k], m + 1);
                                sent[k]++;
                        }
                        post_recv(&s[k], wc.wr_id, slot * 4096, 4096);
                }
        }
        if (sent[0] != PP_N || sent[1] != PP_N || rdone[0] != PP_N || rdone[1] != PP_N)
                die("pingpong: sent %u/%u, received %u/%u", sent[0], sent[1], rdone[0], rdone[1]);
        fprintf(stderr, "pingpong ok (%d exchanges, send queues of one WR)\n", PP_N);
        side_close(&s[0]);
        side_close(&s[1]);
        return 0;
}

/* ---------------------------------------------------------------- pull */

#define PULL_GAP   4099 /* guard bytes before each SGE: odd, so nothing is aligned */
#define BURST_BIG  24   /* receiver-paced Sends in the burst, more than RD_MAX_PULL */
#define BURST_SLOT (512 * 1024)

static uint32_t env_u32(const char *name, uint32_t def)
{
        const char *v = getenv(name);
        return v && *v ? (uint32_t)strtoul(v, NULL, 10) : def;
}

/* The Read Requests a receiver issues and the bytes they fetch for a Send of
 * len bytes, by rd.c's rule from the variables the engine reads. */
static void pull_expect(uint64_t len, uint64_t *reads, uint64_t *bytes)
{
        uint32_t min = env_u32("DIWARP_RD_PULL_MIN", 1024 * 1024);
        uint32_t chunk = env_u32("DIWARP_RD_PULL_CHUNK", 128 * 1024);
        *reads = *bytes = 0;
        if (!min || len < min || len <= chunk)
                return;
        *bytes = len - chunk;
        *reads = (*bytes + chunk - 1) / chunk;
}

struct sgl {
        struct diwarp_sge sge[3];
        int n;
        uint64_t end; /* offset in the buffer past the last SGE and its guard */
};

/* len bytes and `extra` bytes of spare room over n (1 or 3) SGEs of s's
 * buffer from offset at: the first holds `first` bytes, the middle one
 * `mid`, the last the rest; PULL_GAP bytes before each and after the last. */
static void sgl_make(struct sgl *g, const struct side *s, uint64_t at, uint32_t len, int n,
                     uint32_t first, uint32_t mid, uint32_t extra)
{
        uint32_t l[3] = {len, 0, 0};
        if (n == 3) {
                l[0] = first;
                l[1] = mid;
                l[2] = len - first - mid;
        }
        uint64_t off = at + PULL_GAP;
        for (int i = 0; i < n; i++) {
                uint32_t sz = l[i] + (i == n - 1 ? extra : 0);
                g->sge[i] = (struct diwarp_sge){(uintptr_t)s->buf + off, sz, s->lkey};
                off += sz + PULL_GAP;
        }
        g->n = n;
        g->end = off;
}

static void sgl_gather(const struct sgl *g, uint8_t *out)
{
        for (int i = 0; i < g->n; i++) {
                memcpy(out, (const void *)(uintptr_t)g->sge[i].addr, g->sge[i].length);
                out += g->sge[i].length;
        }
}

/* What s's buffer must hold over [at, g->end) once msg (len bytes) was
 * received into g: the message in the SGEs' first bytes, GUARD_BYTE in the
 * gaps and in the room the message did not use. */
static void image_expect(uint8_t *img, const struct side *s, const struct sgl *g, uint64_t at,
                         const uint8_t *msg, uint64_t len)
{
        memset(img + at, GUARD_BYTE, g->end - at);
        uint64_t pos = 0;
        for (int i = 0; i < g->n && pos < len; i++) {
                uint64_t n = g->sge[i].length < len - pos ? g->sge[i].length : len - pos;
                memcpy(img + (g->sge[i].addr - (uintptr_t)s->buf), msg + pos, n);
                pos += n;
        }
}

static void image_check(const uint8_t *img, const struct side *s, uint64_t at, uint64_t end,
                        const char *what, uint32_t len)
{
        if (memcmp(img + at, s->buf + at, end - at) == 0)
                return;
        uint64_t i = at;
        while (img[i] == s->buf[i])
                i++;
        die("%s (%u bytes): byte %llu of the receiving region [%llu, %llu) is %#x, want %#x "
            "(%s)",
            what, len, (unsigned long long)i, (unsigned long long)at, (unsigned long long)end,
            s->buf[i], img[i], img[i] == GUARD_BYTE ? "guard or message" : "message");
}

static void post_recv_sgl(struct side *s, uint64_t id, struct sgl *g)
{
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = g->sge, .num_sge = g->n}, *bad;
        CHECK(diwarp_post_recv(s->qp, &wr, &bad));
}

/* Waits for one completion on s and expects it to be id with status st. */
static struct diwarp_wc wait_one(struct side *s, struct side *other, uint64_t id,
                                 enum diwarp_wc_status st, const char *what)
{
        struct diwarp_wc wc;
        if (poll_until(s, other, &wc, 1, 60000) != 1)
                die("%s: no completion", what);
        expect_wc(&wc, id, st, what);
        return wc;
}

/* One signaled WR from a to b of len bytes at offset src of a's buffer, with
 * the wr_id as Immediate Data; remote_addr and rkey for RDMA, 0 for Sends. */
static void post_one(struct side *a, struct side *b, enum diwarp_wr_opcode op, uint64_t id,
                     uint64_t src, uint32_t len, uint64_t remote_addr, uint32_t rkey)
{
        struct diwarp_sge sge = {(uintptr_t)a->buf + src, len, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .imm_data = (uint32_t)id};
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        post(a, b, &wr);
}

static bool channel_fired(struct side *s)
{
        struct pollfd pfd = {.fd = diwarp_comp_channel_fd(s->ch), .events = POLLIN};
        if (poll(&pfd, 1, 0) != 1)
                return false;
        struct diwarp_cq *cq;
        void *ctx;
        CHECK(diwarp_comp_channel_get_event(s->ch, &cq, &ctx));
        if (cq != s->cq)
                die("channel event for another CQ");
        diwarp_cq_ack_events(s->cq, 1);
        return true;
}

enum { PULL_PLAIN, PULL_SE, PULL_INV };

static uint64_t dev_pulls(struct side *s, uint64_t *bytes)
{
        struct diwarp_counters c;
        CHECK(diwarp_device_counters(s->dev, &c));
        *bytes = c.pull_bytes;
        return c.pulls;
}

/* One Send of len bytes gathered from sn SGEs of a into rn SGEs of b (spare
 * room in the last), guard bytes around; kind adds a Solicited Event (b's CQ
 * is armed solicited-only for every Send: only those fire it) or an
 * Invalidate of *inv_rkey (an MR of b that a can Write to until then).
 * b's Read Requests must be what the size implies. */
static void pull_one(struct side *a, struct side *b, uint8_t *ref, uint8_t *img, uint32_t len,
                     int sn, int rn, int kind, uint32_t id, struct diwarp_mr *inv)
{
        char what[96];
        snprintf(what, sizeof(what), "pull %u bytes %d->%d SGEs %s", len, sn, rn,
                 kind == PULL_SE    ? "SE"
                 : kind == PULL_INV ? "Inv"
                                    : "plain");
        struct sgl gs, gr;
        sgl_make(&gs, a, 0, len, sn, len / 3 + 5, 7, 0);
        sgl_make(&gr, b, 0, len, rn, len / 2 + 3, 1000, 4096 + 13);
        for (int i = 0; i < gs.n; i++)
                fill((uint8_t *)(uintptr_t)gs.sge[i].addr, gs.sge[i].length, id * 3 + (uint32_t)i);
        sgl_gather(&gs, ref);
        memset(b->buf, GUARD_BYTE, gr.end);
        image_expect(img, b, &gr, 0, ref, len);
        struct diwarp_mr_info mi = {0};
        if (inv) {
                /* Until the Send, the STag takes Writes. */
                CHECK(diwarp_mr_info(inv, &mi));
                post_one(a, b, DIWARP_WR_RDMA_WRITE, 0x900 + id, 0, 8, (uintptr_t)mi.addr, mi.rkey);
                wait_one(a, b, 0x900 + id, DIWARP_WC_SUCCESS, "Write before the invalidation");
        }
        uint64_t pb0, pr0 = dev_pulls(b, &pb0), ab0, ar0 = dev_pulls(a, &ab0);
        CHECK(diwarp_cq_req_notify(b->cq, true));
        while (channel_fired(b))
                ;
        post_recv_sgl(b, 0x100 + id, &gr);
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = gs.sge,
                                    .num_sge = gs.n,
                                    .opcode = inv ? DIWARP_WR_SEND_WITH_INV : DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED |
                                                  (kind == PULL_SE ? DIWARP_SEND_SOLICITED : 0),
                                    .invalidate_rkey = mi.rkey};
        post(a, b, &wr);
        struct diwarp_wc wc = wait_one(b, a, 0x100 + id, DIWARP_WC_SUCCESS, what);
        if (wc.byte_len != len || wc.opcode != DIWARP_WC_RECV || wc.src_qp != a->qpn)
                die("%s: byte_len %u opcode %d src_qp %#x", what, wc.byte_len, wc.opcode,
                    wc.src_qp);
        if (inv ? !(wc.wc_flags & DIWARP_WC_WITH_INV) || wc.invalidated_rkey != mi.rkey
                : (wc.wc_flags & DIWARP_WC_WITH_INV) != 0)
                die("%s: wc_flags %#x invalidated_rkey %#x (STag %#x)", what, wc.wc_flags,
                    wc.invalidated_rkey, mi.rkey);
        bool fired = channel_fired(b);
        if (fired != (kind == PULL_SE))
                die("%s: the solicited-only CQ %s", what, fired ? "fired" : "did not fire");
        wait_one(a, b, id, DIWARP_WC_SUCCESS, what);
        image_check(img, b, 0, gr.end, what, len);
        uint64_t pb1, pr1 = dev_pulls(b, &pb1), ab1, ar1 = dev_pulls(a, &ab1);
        uint64_t want_r, want_b;
        pull_expect(len, &want_r, &want_b);
        if (pr1 - pr0 != want_r || pb1 - pb0 != want_b || ar1 != ar0 || ab1 != ab0)
                die("%s: receiver pulled %llu Reads / %llu bytes, want %llu / %llu; sender %llu / "
                    "%llu",
                    what, (unsigned long long)(pr1 - pr0), (unsigned long long)(pb1 - pb0),
                    (unsigned long long)want_r, (unsigned long long)want_b,
                    (unsigned long long)(ar1 - ar0), (unsigned long long)(ab1 - ab0));
        fprintf(stderr, "%s ok: %llu Reads\n", what, (unsigned long long)want_r);
}

static uint32_t burst_len(unsigned m)
{
        return m % 2 ? 100 + m : 300000 + (m / 2) * 4099;
}

/* 2 * BURST_BIG Sends posted before any completion is polled, a receiver-paced
 * one and a small one in turn: more receiver-paced Sends than the receiver has
 * pull entries, so later ones wait for an entry. Every receive completes in
 * posting order (a small Send never overtakes the large one before it),
 * byte-exact, nothing written outside its receive WR. */
static void pull_burst(struct side *a, struct side *b, uint8_t *img)
{
        const unsigned n = 2 * BURST_BIG;
        uint64_t want_r = 0, want_b = 0, pb0, pr0 = dev_pulls(b, &pb0);
        memset(b->buf, GUARD_BYTE, (size_t)n * BURST_SLOT);
        memset(img, GUARD_BYTE, (size_t)n * BURST_SLOT);
        for (unsigned m = 0; m < n; m++) {
                uint64_t off = (uint64_t)m * BURST_SLOT + PULL_GAP;
                fill(a->buf + off, burst_len(m), 1000 + m);
                memcpy(img + off, a->buf + off, burst_len(m));
                post_recv(b, 0x2000 + m, off, BURST_SLOT - 2 * PULL_GAP);
                uint64_t r, by;
                pull_expect(burst_len(m), &r, &by);
                want_r += r;
                want_b += by;
        }
        for (unsigned m = 0; m < n; m++)
                post_one(a, b, DIWARP_WR_SEND, 0x3000 + m, (uint64_t)m * BURST_SLOT + PULL_GAP,
                         burst_len(m), 0, 0);
        unsigned rdone = 0, sdone = 0;
        struct diwarp_wc wc[16];
        uint64_t end = now_ms() + 90000;
        while (rdone < n || sdone < n) {
                int k = diwarp_cq_poll(b->cq, 16, wc);
                for (int i = 0; i < k; i++, rdone++) {
                        expect_wc(&wc[i], 0x2000 + rdone, DIWARP_WC_SUCCESS, "burst recv (order)");
                        if (wc[i].byte_len != burst_len(rdone))
                                die("burst message %u: byte_len %u want %u", rdone, wc[i].byte_len,
                                    burst_len(rdone));
                }
                k = diwarp_cq_poll(a->cq, 16, wc);
                for (int i = 0; i < k; i++, sdone++)
                        expect_wc(&wc[i], 0x3000 + sdone, DIWARP_WC_SUCCESS, "burst send (order)");
                if (now_ms() > end)
                        die("burst: %u/%u received, %u/%u sent", rdone, n, sdone, n);
        }
        for (unsigned m = 0; m < n; m++)
                image_check(img, b, (uint64_t)m * BURST_SLOT, (uint64_t)(m + 1) * BURST_SLOT,
                            "burst", burst_len(m));
        uint64_t pb1, pr1 = dev_pulls(b, &pb1);
        if (pr1 - pr0 != want_r || pb1 - pb0 != want_b)
                die("burst: %llu Reads / %llu bytes pulled, want %llu / %llu",
                    (unsigned long long)(pr1 - pr0), (unsigned long long)(pb1 - pb0),
                    (unsigned long long)want_r, (unsigned long long)want_b);
        fprintf(stderr, "burst ok: %u Sends, %llu Reads\n", n, (unsigned long long)want_r);
}

/* Receiver-paced Sends (rd_pull.c): sizes on both sides of DIWARP_RD_PULL_MIN,
 * one and three SGEs on either side, plain, with Solicited Event and with
 * Invalidate; then a burst. meson runs it under DIWARP_FAULT and with
 * DIWARP_RD_PULL_MIN=0 (nothing pulled: the counters must stay at 0). */
static int case_pull(void)
{
        static const uint32_t lens[] = {256 * 1024 - 1, 256 * 1024, MiB + 17, 8 * MiB};
        static const int layout[][2] = {{1, 1}, {3, 1}, {1, 3}, {3, 3}};
        struct side a, b;
        buf_len = (size_t)2 * BURST_BIG * BURST_SLOT;
        max_sge = 3;
        pair_open_split(&a, &b, DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE, NULL, NULL,
                        true);
        uint8_t *ref = malloc(buf_len), *img = malloc(buf_len), *invbuf = calloc(1, 4096);
        if (!ref || !img || !invbuf)
                die("no memory");
        struct diwarp_mr *inv = NULL;
        uint32_t id = 0;
        for (unsigned k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
                for (unsigned l = 0; l < 4; l++, id++) {
                        int kind = (int)((k + l) % 3);
                        if (kind == PULL_INV) {
                                if (inv)
                                        CHECK(diwarp_mr_dereg(inv));
                                CHECK(diwarp_mr_reg(
                                    b.pd, invbuf, 4096, (uintptr_t)invbuf,
                                    DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE, &inv));
                        }
                        pull_one(&a, &b, ref, img, lens[k], layout[l][0], layout[l][1], kind, id,
                                 kind == PULL_INV ? inv : NULL);
                }
        pull_burst(&a, &b, img);
        /* The last Invalidate took effect at the receiver: the STag that took
         * a Write before it refuses one now. */
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(inv, &mi));
        post_one(&a, &b, DIWARP_WR_RDMA_WRITE, 0x999, 0, 8, (uintptr_t)mi.addr, mi.rkey);
        wait_one(&a, &b, 0x999, DIWARP_WC_REM_ACCESS_ERR, "Write to an invalidated STag");
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        fprintf(stderr,
                "pull ok: %llu Reads, %llu bytes pulled; retransmits %llu + %llu, fault drop "
                "%llu dup %llu reorder %llu corrupt %llu, crc errors %llu + %llu\n",
                (unsigned long long)cb.pulls, (unsigned long long)cb.pull_bytes,
                (unsigned long long)ca.retransmits, (unsigned long long)cb.retransmits,
                (unsigned long long)(ca.fault_dropped + cb.fault_dropped),
                (unsigned long long)(ca.fault_duplicated + cb.fault_duplicated),
                (unsigned long long)(ca.fault_reordered + cb.fault_reordered),
                (unsigned long long)(ca.fault_corrupted + cb.fault_corrupted),
                (unsigned long long)ca.crc_errors, (unsigned long long)cb.crc_errors);
        if (ca.fault_corrupted + cb.fault_corrupted > 0 && ca.crc_errors + cb.crc_errors == 0)
                die("pull: corrupted datagrams were not counted as CRC errors");
        if (ca.fault_dropped + cb.fault_dropped > 0 && ca.retransmits + cb.retransmits == 0)
                die("pull: drops without retransmissions");
        while (channel_fired(&b))
                ;
        side_close(&a);
        CHECK(diwarp_mr_dereg(inv));
        side_close(&b);
        free(ref);
        free(img);
        free(invbuf);
        return 0;
}

/* A receiver-paced Send (512 KiB) into a receive WR too small for it, one of
 * 128 KiB (more than the pushed chunk) and one of 1000 bytes: the receive
 * fails with LOC_LEN_ERR, the Send with REM_INV_REQ_ERR and the Send behind it
 * is flushed; the sender's QP goes to ERR, the receiver's too for RC while an
 * RD QP keeps serving other peers. Nothing outside the receive WR is
 * written and nothing is pulled. */
static int case_pulllen(void)
{
        static const uint32_t room[] = {128 * 1024, 1000};
        const uint32_t len = 512 * 1024;
        buf_len = 2 * MiB;
        for (unsigned k = 0; k < 2; k++) {
                struct side a, b;
                pair_open(&a, &b, DIWARP_ACCESS_LOCAL_WRITE);
                memset(b.buf, GUARD_BYTE, buf_len);
                fill(a.buf, len, k + 40);
                post_recv(&b, 0x77, 8192, room[k]);
                post_one(&a, &b, DIWARP_WR_SEND, 1, 0, len, 0, 0);
                post_one(&a, &b, DIWARP_WR_SEND, 2, 0, 100, 0, 0);
                wait_one(&b, &a, 0x77, DIWARP_WC_LOC_LEN_ERR, "pulllen receive");
                wait_one(&a, &b, 1, DIWARP_WC_REM_INV_REQ_ERR, "pulllen send");
                wait_one(&a, &b, 2, DIWARP_WC_WR_FLUSH_ERR, "pulllen send behind it");
                if (diwarp_qp_state(a.qp) != DIWARP_QPS_ERR)
                        die("pulllen: sender QP in state %d, not ERR", diwarp_qp_state(a.qp));
                enum diwarp_qp_state want = rc_mode ? DIWARP_QPS_ERR : DIWARP_QPS_RTS;
                if (diwarp_qp_state(b.qp) != want)
                        die("pulllen: receiver QP in state %d, want %d", diwarp_qp_state(b.qp),
                            want);
                for (size_t i = 0; i < buf_len; i++)
                        if ((i < 8192 || i >= 8192 + room[k]) && b.buf[i] != GUARD_BYTE)
                                die("pulllen: byte %zu outside the %u-byte receive WR written", i,
                                    room[k]);
                uint64_t pb, pr = dev_pulls(&b, &pb);
                if (pr || pb)
                        die("pulllen: %llu Reads pulled into a receive WR too small",
                            (unsigned long long)pr);
                if (!rc_mode) {
                        /* Another sender QP of a's device reaches b's QP. */
                        struct side c = a;
                        c.ah = NULL;
                        qp_make(&c, 0);
                        qp_connect(&c, &b, b.qpn);
                        post_recv(&b, 0x78, 0, (uint32_t)MiB);
                        post_one(&c, &b, DIWARP_WR_SEND, 3, 0, len, 0, 0);
                        struct diwarp_wc wc =
                            wait_one(&b, &c, 0x78, DIWARP_WC_SUCCESS, "pulllen other peer");
                        if (wc.byte_len != len || wc.src_qp != c.qpn)
                                die("pulllen other peer: byte_len %u src_qp %#x", wc.byte_len,
                                    wc.src_qp);
                        verify(a.buf, b.buf, len, "pulllen other peer", len);
                        wait_one(&c, &b, 3, DIWARP_WC_SUCCESS, "pulllen other peer send");
                        CHECK(diwarp_ah_destroy(c.ah));
                        CHECK(diwarp_qp_destroy(c.qp));
                }
                fprintf(stderr, "pulllen %u-byte receive WR ok\n", room[k]);
                side_close(&a);
                side_close(&b);
        }
        return 0;
}

/* ---------------------------------------------------------------- crc */

/* A plain UDP socket where the device of instance `inst` would listen: the
 * engine sends datagrams for QPN inst << 12 | 2 there. The highest free
 * instance, far from those the devices of running tests take. */
static int raw_peer(uint32_t *qpn)
{
        uint32_t base = env_u32("DIWARP_PORT_BASE", 17471);
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
        die("raw_peer: no free port");
        return -1;
}

/* A device opened with the env_push list `env`, one RD QP on it, and a
 * plain UDP socket on 127.0.0.1 (an address of this host) as its peer: the
 * QP's address handle names the socket. Returns the socket. */
static int raw_pair(struct side *a, struct side *peer, const char *env)
{
        struct env_saved sv;
        env_push(env, &sv);
        side_open(a, DIWARP_ACCESS_LOCAL_WRITE);
        env_pop(&sv);
        qp_make(a, 0);
        memset(peer, 0, sizeof(*peer));
        int fd = raw_peer(&peer->qpn);
        static const uint8_t lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
        memcpy(peer->gid.raw, lo, sizeof(lo));
        qp_connect(a, peer, peer->qpn);
        return fd;
}

/* The first datagram of a 100-byte Send from a device opened with
 * DIWARP_RD_CRC=crc, as a plain UDP socket standing in for the peer reads
 * it: with the NOCRC X-flag (version 2) and no trailer, or with the CRC32c
 * of every byte before it. An RD QP's stream says where it starts (version
 * 2, X2-flag START and its descriptor); RC over RD's starts at the agreed
 * PSN and MSN 1 (version 1 unless NOCRC). */
static void crc_wire(int crc)
{
        struct side a, peer;
        int fd = raw_pair(&a, &peer, crc ? "DIWARP_RD_CRC=1" : "DIWARP_RD_CRC=0");
        fill(a.buf, 100, 31);
        post_one(&a, &peer, DIWARP_WR_SEND, 1, 0, 100, 0, 0);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 5000) != 1)
                die("crc wire: no datagram from the DIWARP_RD_CRC=%d device", crc);
        uint8_t pkt[2048];
        ssize_t n = recv(fd, pkt, sizeof(pkt), 0);
        const size_t hlen = DW_DGRAM_HDR_LEN + (rc_mode ? 0 : DW_DGRAM_START_LEN);
        const size_t body = hlen + DW_DGRAM_DDP_UNTAGGED_LEN + 100;
        if (n < (ssize_t)body ||
            (pkt[1] & (DW_DGRAM_F_RD | DW_DGRAM_F_DATA)) != (DW_DGRAM_F_RD | DW_DGRAM_F_DATA))
                die("crc wire: a %zd-byte datagram, flags %#x", n, n > 1 ? pkt[1] : 0);
        if (memcmp(pkt + body - 100, a.buf, 100) != 0)
                die("crc wire: the Send's bytes are not where expected");
        /* The stream's first Send: untagged, L, queue 0, at the first MSN its
         * START descriptor gives (the first PSN's value, from the device's
         * keyed hash: docs/PROTOCOL.md), right after the descriptor. */
        const uint8_t *d = pkt + hlen;
        uint32_t psn =
            (uint32_t)pkt[16] << 24 | (uint32_t)pkt[17] << 16 | (uint32_t)pkt[18] << 8 | pkt[19];
        uint32_t first_psn =
            (uint32_t)pkt[28] << 24 | (uint32_t)pkt[29] << 16 | (uint32_t)pkt[30] << 8 | pkt[31];
        uint32_t first_msn =
            (uint32_t)pkt[32] << 24 | (uint32_t)pkt[33] << 16 | (uint32_t)pkt[34] << 8 | pkt[35];
        uint32_t msn = (uint32_t)d[10] << 24 | (uint32_t)d[11] << 16 | (uint32_t)d[12] << 8 | d[13];
        if (rc_mode) {
                first_psn = psn;
                first_msn = 1;
        }
        if (pkt[8] != (rc_mode ? 0 : DW_DGRAM_X2_START) || first_psn != psn || first_msn != msn)
                die("crc wire: first Send: X2-flags %#x, PSN %#x, MSN %#x, start descriptor "
                    "%#x %#x (want START, the PSN and the MSN)",
                    pkt[8], psn, msn, first_psn, first_msn);
        if (d[0] != 0x41 || (d[1] & 0x0f) != 0x3 || d[6] || d[7] || d[8] || d[9])
                die("crc wire: first Send: DDP control %#x, opcode %#x, QN %02x%02x%02x%02x "
                    "(want 0x41, 3, 0)",
                    d[0], d[1] & 0x0f, d[6], d[7], d[8], d[9]);
        if (crc) {
                uint32_t c = dw_crc32c(pkt, body);
                uint8_t be[4] = {(uint8_t)(c >> 24), (uint8_t)(c >> 16), (uint8_t)(c >> 8),
                                 (uint8_t)c};
                if (pkt[0] != (rc_mode ? DW_DGRAM_VERSION : DW_DGRAM_VERSION2) || pkt[4] != 0 ||
                    (size_t)n != body + DW_DGRAM_CRC_LEN || memcmp(pkt + body, be, 4) != 0)
                        die("crc wire: DIWARP_RD_CRC=1 sent version %u, X-flags %#x, %zd bytes "
                            "(want 2, none, %zu with its CRC32c)",
                            pkt[0], pkt[4], n, body + DW_DGRAM_CRC_LEN);
        } else if (pkt[0] != DW_DGRAM_VERSION2 || pkt[4] != DW_DGRAM_X_NOCRC || (size_t)n != body) {
                die("crc wire: DIWARP_RD_CRC=0 sent version %u, X-flags %#x, %zd bytes (want 2, "
                    "NOCRC, %zu)",
                    pkt[0], pkt[4], n, body);
        }
        close(fd);
        side_close(&a);
}

/* ------------------------------------------------- a late copy of a start */

/* One datagram from the raw peer P to the device's QP: an RD Send of the
 * bytes `msg` (DDP untagged, last, queue 0) at PSN psn and MSN msn, with
 * START (P's first PSN and MSN = first) when first is not 0, and an ACK of
 * every PSN of the device's stream before ack_psn. DIWARP_RD_CRC=0: NOCRC,
 * no trailer. Returns its length. */
static size_t rs_send_dgram(uint8_t *pkt, uint32_t dst_qpn, uint32_t src_qpn, uint32_t psn,
                            uint32_t msn, uint32_t first, uint32_t ack_psn, const uint8_t *msg,
                            uint32_t len)
{
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK,
                                 .xflags = DW_DGRAM_X_NOCRC,
                                 .xflags2 = first ? DW_DGRAM_X2_START : 0,
                                 .dst_qpn = dst_qpn,
                                 .src_qpn = src_qpn,
                                 .qkey = QKEY,
                                 .psn = psn,
                                 .ack_psn = ack_psn,
                                 .start_psn = first,
                                 .start_msn = first};
        ssize_t n = dw_dgram_encode(&h, pkt, 256);
        if (n < 0)
                die("restart: encoding P's header: %s", strerror((int)-n));
        uint8_t *d = pkt + n;
        memset(d, 0, DW_DGRAM_DDP_UNTAGGED_LEN);
        d[0] = DW_DDP_CTRL_L | DW_DDP_VERSION;
        d[1] = DW_RDMAP_VERSION << 6 | DW_RDMAP_SEND;
        d[10] = (uint8_t)(msn >> 24);
        d[11] = (uint8_t)(msn >> 16);
        d[12] = (uint8_t)(msn >> 8);
        d[13] = (uint8_t)msn;
        memcpy(d + DW_DGRAM_DDP_UNTAGGED_LEN, msg, len);
        return (size_t)n + DW_DGRAM_DDP_UNTAGGED_LEN + len;
}

/* The next datagram the device sent P, decoded; false after timeout_ms. */
static bool rs_recv(int fd, struct dw_dgram_hdr *h, struct sockaddr_in *from, unsigned timeout_ms)
{
        uint8_t pkt[2048];
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        for (;;) {
                if (poll(&pfd, 1, (int)timeout_ms) != 1)
                        return false;
                socklen_t fl = sizeof(*from);
                ssize_t n = recvfrom(fd, pkt, sizeof(pkt), 0, (struct sockaddr *)from, &fl);
                const char *why = NULL;
                if (n > 0 && dw_dgram_decode(pkt, (size_t)n, h, &why) >= 0)
                        return true;
        }
}

/* The device's next DATA datagram to P (ACK-only ones skipped). */
static void rs_expect_data(int fd, struct dw_dgram_hdr *h, struct sockaddr_in *from,
                           const char *what)
{
        uint64_t end = now_ms() + 5000;
        do {
                if (!rs_recv(fd, h, from, 1000))
                        continue;
                if (h->flags & DW_DGRAM_F_DATA)
                        return;
        } while (now_ms() < end);
        die("restart: %s: no DATA datagram from the device", what);
}

/* A stream's sender resends the datagrams of its first window (they carry
 * START) until the receiver's ACK reaches it; under load a copy can arrive
 * seconds late. The receiver must not take such a copy as the sender's new
 * start once it started its own side over (docs/PROTOCOL.md "Stream
 * start"), or the Sends of that start are delivered again. Here a UDP
 * socket plays the peer P: its first Send (START) is delivered, the stream
 * idles until the device starts its own side over, then the very same
 * datagram comes again: no second receive completes, and P's next Send is
 * delivered once. */
static int case_restart(void)
{
        struct side r, peer;
        buf_len = 1 * MiB;
        int fd = raw_pair(&r, &peer, "DIWARP_RD_IDLE_MS=100;DIWARP_RD_CRC=0;DIWARP_CREDIT=off");
        for (unsigned k = 0; k < 4; k++)
                post_recv(&r, 0x100 + k, 4096 * (uint64_t)(k + 1), 4096);
        /* The device's first Send to P; P's first Send answers it and
         * acknowledges it (the device's side is then synchronized). */
        post_one(&r, &peer, DIWARP_WR_SEND, 1, 0, 8, 0, 0);
        struct dw_dgram_hdr h;
        struct sockaddr_in dev_addr;
        rs_expect_data(fd, &h, &dev_addr, "the device's first Send");
        if (!(h.xflags2 & DW_DGRAM_X2_START))
                die("restart: the device's first Send carries no START");
        const uint32_t first = 0x5eed0001u;
        uint8_t m0[16], m1[16], pkt0[512], pkt[512];
        memset(m0, 0xa0, sizeof(m0));
        memset(m1, 0xa1, sizeof(m1));
        size_t n0 =
            rs_send_dgram(pkt0, r.qpn, peer.qpn, first, first, first, h.psn + 1, m0, sizeof(m0));
        if (sendto(fd, pkt0, n0, 0, (struct sockaddr *)&dev_addr, sizeof(dev_addr)) != (ssize_t)n0)
                die("restart: sendto: %s", strerror(errno));
        struct diwarp_wc wc[4];
        if (poll_until(&r, NULL, wc, 2, 5000) != 2)
                die("restart: P's first Send or the device's Send did not complete");
        for (int i = 0; i < 2; i++) {
                if (wc[i].status != DIWARP_WC_SUCCESS)
                        die("restart: wr_id %#llx: %s", (unsigned long long)wc[i].wr_id,
                            diwarp_wc_status_str(wc[i].status));
                if (wc[i].opcode == DIWARP_WC_RECV &&
                    (wc[i].wr_id != 0x100 || wc[i].byte_len != sizeof(m0) ||
                     memcmp(r.buf + 4096, m0, sizeof(m0)) != 0))
                        die("restart: P's first Send: wr_id %#llx, %u bytes",
                            (unsigned long long)wc[i].wr_id, wc[i].byte_len);
        }
        /* Idle past half the idle time: the device's next Send to P starts
         * its side over (START again), and it takes P's next start. */
        usleep(200 * 1000);
        post_one(&r, &peer, DIWARP_WR_SEND, 2, 0, 8, 0, 0);
        rs_expect_data(fd, &h, &dev_addr, "the device's Send after the idle time");
        if (!(h.xflags2 & DW_DGRAM_X2_START))
                die("restart: the device did not start its side over after the idle time");
        /* The late copy of P's first datagram. */
        if (sendto(fd, pkt0, n0, 0, (struct sockaddr *)&dev_addr, sizeof(dev_addr)) != (ssize_t)n0)
                die("restart: sendto: %s", strerror(errno));
        int got = poll_until(&r, NULL, wc, 1, 300);
        if (got && wc[0].opcode == DIWARP_WC_RECV)
                die("restart: the late copy of P's first Send was delivered again (wr_id %#llx, "
                    "%u bytes)",
                    (unsigned long long)wc[0].wr_id, wc[0].byte_len);
        /* P goes on where it was: its next Send, acknowledging the device's. */
        size_t n1 =
            rs_send_dgram(pkt, r.qpn, peer.qpn, first + 1, first + 1, 0, h.psn + 1, m1, sizeof(m1));
        if (sendto(fd, pkt, n1, 0, (struct sockaddr *)&dev_addr, sizeof(dev_addr)) != (ssize_t)n1)
                die("restart: sendto: %s", strerror(errno));
        int want = got ? 1 : 2; /* the device's second Send may have completed above */
        if (poll_until(&r, NULL, wc, want, 5000) != want)
                die("restart: P's second Send was not delivered");
        bool recv_seen = false;
        for (int i = 0; i < want; i++) {
                if (wc[i].status != DIWARP_WC_SUCCESS)
                        die("restart: wr_id %#llx: %s", (unsigned long long)wc[i].wr_id,
                            diwarp_wc_status_str(wc[i].status));
                if (wc[i].opcode != DIWARP_WC_RECV)
                        continue;
                recv_seen = true;
                if (wc[i].wr_id != 0x101 || wc[i].byte_len != sizeof(m1) ||
                    memcmp(r.buf + 2 * 4096, m1, sizeof(m1)) != 0)
                        die("restart: P's second Send: wr_id %#llx, %u bytes",
                            (unsigned long long)wc[i].wr_id, wc[i].byte_len);
        }
        if (!recv_seen || poll_until(&r, NULL, wc, 1, 200) != 0)
                die("restart: P's second Send not delivered exactly once");
        fprintf(stderr, "restart ok: a late copy of the first start was not taken\n");
        close(fd);
        side_close(&r);
        return 0;
}

/* b's device refuses what a's sends (its datagrams lack the CRC32c b asks
 * for, or b's ACKs lack the one a asks for): the refusing side counts them
 * in rx_dropped_nocrc and a's Send fails with RETRY_EXC_ERR within a's
 * DIWARP_PEER_TIMEOUT_MS, as if b were gone. */
static void crc_mismatch(int a_crc)
{
        struct side a, b;
        const unsigned limit = 1000;
        pair_open_split(&a, &b, 0,
                        a_crc ? "DIWARP_RD_CRC=1;DIWARP_PEER_TIMEOUT_MS=1000"
                              : "DIWARP_RD_CRC=0;DIWARP_PEER_TIMEOUT_MS=1000",
                        a_crc ? "DIWARP_RD_CRC=0" : "DIWARP_RD_CRC=1", false);
        post_recv(&b, 5, 0, 4096);
        uint64_t t0 = now_ms();
        post_one(&a, &b, DIWARP_WR_SEND, 1, 0, 1000, 0, 0);
        struct diwarp_wc wc;
        if (poll_until(&a, &b, &wc, 1, limit + 3000) != 1)
                die("crc mismatch (sender %d): no completion after %llu ms", a_crc,
                    (unsigned long long)(now_ms() - t0));
        uint64_t dt = now_ms() - t0;
        expect_wc(&wc, 1, DIWARP_WC_RETRY_EXC_ERR, "crc mismatch send");
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_ERR)
                die("crc mismatch: sender QP not in ERR");
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        struct diwarp_counters *refuser = a_crc ? &ca : &cb;
        if (!refuser->rx_dropped_nocrc || (a_crc ? cb : ca).rx_dropped_nocrc)
                die("crc mismatch (sender %d): rx_dropped_nocrc %llu at the sender, %llu at the "
                    "receiver",
                    a_crc, (unsigned long long)ca.rx_dropped_nocrc,
                    (unsigned long long)cb.rx_dropped_nocrc);
        /* The receiver that refuses everything never places the Send. */
        if (!a_crc && diwarp_cq_poll(b.cq, 1, &wc) != 0)
                die("crc mismatch: the refusing receiver completed a receive");
        fprintf(stderr,
                "crc mismatch (sender %d, receiver %d) ok: RETRY_EXC_ERR after %llu ms, %llu "
                "datagrams refused\n",
                a_crc, !a_crc, (unsigned long long)dt,
                (unsigned long long)refuser->rx_dropped_nocrc);
        side_close(&a);
        side_close(&b);
}

/* DIWARP_RD_CRC=0 (datagrams without CRC32c): on the wire, end to end with
 * both devices set (Sends of every shape, receiver-paced included, and
 * large RDMA Writes and Reads placed directly: byte-exact, nothing refused),
 * and against a device that keeps the CRC, either way round. */
static int case_crc(void)
{
        crc_wire(0);
        crc_wire(1);
        struct side a, b;
        buf_len = 8 * MiB;
        pair_open_split(&a, &b, DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ,
                        "DIWARP_RD_CRC=0", "DIWARP_RD_CRC=0", false);
        static const uint32_t lens[] = {0, 1, 4096, 100000, MiB + 3};
        for (unsigned k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
                fill(a.buf, lens[k], k + 50);
                post_recv(&b, 0x40 + k, 0, 2 * MiB);
                post_one(&a, &b, k % 2 ? DIWARP_WR_SEND_WITH_IMM : DIWARP_WR_SEND, k, 0, lens[k], 0,
                         0);
                struct diwarp_wc wc = wait_one(&b, &a, 0x40 + k, DIWARP_WC_SUCCESS, "crc0 recv");
                if (wc.byte_len != lens[k] || (k % 2 && wc.imm_data != k))
                        die("crc0: byte_len %u want %u, immediate %u", wc.byte_len, lens[k],
                            wc.imm_data);
                verify(a.buf, b.buf, lens[k], "crc0 send", lens[k]);
                wait_one(&a, &b, k, DIWARP_WC_SUCCESS, "crc0 send");
        }
        const uint32_t big = 4 * MiB;
        fill(a.buf, big, 60);
        post_one(&a, &b, DIWARP_WR_RDMA_WRITE, 10, 0, big, (uintptr_t)b.buf + MiB, b.rkey);
        wait_one(&a, &b, 10, DIWARP_WC_SUCCESS, "crc0 write");
        verify(a.buf, b.buf + MiB, big, "crc0 write", big);
        memset(a.buf, 0, big);
        post_one(&a, &b, DIWARP_WR_RDMA_READ, 11, 0, big, (uintptr_t)b.buf + MiB, b.rkey);
        wait_one(&a, &b, 11, DIWARP_WC_SUCCESS, "crc0 read");
        verify(b.buf + MiB, a.buf, big, "crc0 read", big);
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        if (ca.rx_dropped_nocrc || cb.rx_dropped_nocrc || ca.crc_errors || cb.crc_errors ||
            !cb.pulls)
                die("crc0: refused %llu + %llu, CRC errors %llu + %llu, %llu Reads pulled",
                    (unsigned long long)ca.rx_dropped_nocrc,
                    (unsigned long long)cb.rx_dropped_nocrc, (unsigned long long)ca.crc_errors,
                    (unsigned long long)cb.crc_errors, (unsigned long long)cb.pulls);
        if (lo_udp_mtu() > 32768 && (!ca.rx_placed_direct || !cb.rx_placed_direct))
                die("crc0: %llu + %llu segments placed directly",
                    (unsigned long long)ca.rx_placed_direct,
                    (unsigned long long)cb.rx_placed_direct);
        fprintf(stderr, "crc0 ok: %llu + %llu datagrams, %llu + %llu placed directly\n",
                (unsigned long long)ca.tx_packets, (unsigned long long)cb.tx_packets,
                (unsigned long long)ca.rx_placed_direct, (unsigned long long)cb.rx_placed_direct);
        side_close(&a);
        side_close(&b);
        crc_mismatch(0);
        crc_mismatch(1);
        return 0;
}

/* ---------------------------------------------------------------- caps */

#define CAPS_N 100

static uint32_t caps_len(unsigned i)
{
        return i % 25 == 24 ? 300000 : (i * 7919u) % 40000;
}

/* CAPS_N Writes and Sends (a few receiver-paced) from a to b, all posted at
 * once, slots laid out one after the other: every one completes, in order on
 * both sides, byte-exact. Returns a's QP's inflight_waits. */
static uint64_t caps_stream(struct side *a, struct side *b)
{
        uint64_t off[CAPS_N + 1];
        off[0] = 0;
        for (unsigned i = 0; i < CAPS_N; i++)
                off[i + 1] = off[i] + (caps_len(i) + 4095) / 4096 * 4096 + 4096;
        if (off[CAPS_N] > buf_len)
                die("caps: slots do not fit");
        unsigned nrecv = 0;
        for (unsigned i = 0; i < CAPS_N; i++) {
                fill(a->buf + off[i], caps_len(i), i + 70);
                if (i % 2)
                        post_recv(b, 0x500 + i, off[i], caps_len(i));
        }
        for (unsigned i = 0; i < CAPS_N; i++)
                post_one(a, b, i % 2 ? DIWARP_WR_SEND : DIWARP_WR_RDMA_WRITE, i, off[i],
                         caps_len(i), (uintptr_t)b->buf + off[i], b->rkey);
        unsigned sdone = 0;
        struct diwarp_wc wc[16];
        uint64_t end = now_ms() + 60000;
        while (sdone < CAPS_N || nrecv < CAPS_N / 2) {
                int k = diwarp_cq_poll(a->cq, 16, wc);
                for (int i = 0; i < k; i++, sdone++)
                        expect_wc(&wc[i], sdone, DIWARP_WC_SUCCESS, "caps send (order)");
                k = diwarp_cq_poll(b->cq, 16, wc);
                for (int i = 0; i < k; i++, nrecv++)
                        expect_wc(&wc[i], 0x500 + 2 * nrecv + 1, DIWARP_WC_SUCCESS,
                                  "caps recv (order)");
                if (now_ms() > end)
                        die("caps: %u/%u completed, %u/%u received", sdone, CAPS_N, nrecv,
                            CAPS_N / 2);
        }
        for (unsigned i = 0; i < CAPS_N; i++)
                verify(a->buf + off[i], b->buf + off[i], caps_len(i), "caps", caps_len(i));
        struct diwarp_counters c;
        CHECK(diwarp_qp_counters(a->qp, &c));
        return c.inflight_waits;
}

/* DIWARP_INFLIGHT_QP or _PROC (meson sets one): a burst larger than the cap
 * waits for tokens and still completes, in order. */
static int case_caps(void)
{
        if (!env_u32("DIWARP_INFLIGHT_QP", 0) && !env_u32("DIWARP_INFLIGHT_PROC", 0))
                die("caps: set DIWARP_INFLIGHT_QP or DIWARP_INFLIGHT_PROC");
        struct side a, b;
        buf_len = 8 * MiB;
        pair_open(&a, &b, DIWARP_ACCESS_REMOTE_WRITE);
        uint64_t waits = caps_stream(&a, &b);
        struct diwarp_counters c;
        CHECK(diwarp_device_counters(a.dev, &c));
        if (!waits || c.inflight_waits < waits)
                die("caps: inflight_waits %llu (QP), %llu (device)", (unsigned long long)waits,
                    (unsigned long long)c.inflight_waits);
        fprintf(stderr, "caps ok: %u messages, %llu waits for a token\n", CAPS_N,
                (unsigned long long)waits);
        side_close(&a);
        side_close(&b);
        return 0;
}

static char hostcap_shm[64];
static pid_t hostcap_parent;

static void hostcap_unlink(void)
{
        if (getpid() == hostcap_parent)
                shm_unlink(hostcap_shm);
}

/* A child: a pair of its own devices streaming through the host pool. It
 * starts streaming when go, a pipe's read end whose write end go_w it
 * closes, sees EOF (-1: at once), so that streamers forked together
 * overlap. With report >= 0 it writes its count of waits for a token there
 * and the parent judges the sum: whether one of several overlapping
 * streamers waits depends on how the scheduler interleaves them (its ACKs
 * may always come back before it asks again). With report < 0 it was
 * started while another process holds every token, so it must wait. */
static pid_t hostcap_streamer(int go, int go_w, int report)
{
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid)
                return pid;
        struct side a, b;
        buf_len = 8 * MiB;
        pair_open(&a, &b, DIWARP_ACCESS_REMOTE_WRITE);
        char x;
        if (go >= 0) {
                close(go_w); /* EOF once the parent closes its end */
                while (read(go, &x, 1) > 0)
                        ;
        }
        uint64_t waits = caps_stream(&a, &b);
        if (report >= 0) {
                if (write(report, &waits, sizeof(waits)) != (ssize_t)sizeof(waits))
                        die("hostcap streamer %d: report: %s", getpid(), strerror(errno));
        } else if (!waits) {
                die("hostcap streamer %d: never waited although another process held every "
                    "token of the 3-token pool",
                    getpid());
        }
        side_close(&a);
        side_close(&b);
        fprintf(stderr, "hostcap streamer %d ok (%llu waits)\n", getpid(),
                (unsigned long long)waits);
        fflush(NULL);
        _exit(0);
}

/* A child that takes tokens and never gives them back: 8 Sends to a QP of
 * its own with no receive posted, refused (RNR) and retried for ever, while
 * it keeps asking the pool for more. */
static pid_t hostcap_hog(void)
{
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid)
                return pid;
        struct side a, b;
        buf_len = MiB;
        pair_open(&a, &b, 0);
        for (int i = 0; i < 8; i++)
                post_one(&a, &b, DIWARP_WR_SEND, (uint64_t)i, 0, 100, 0, 0);
        for (;;) {
                struct diwarp_wc wc[8];
                if (diwarp_cq_poll(a.cq, 8, wc) != 0 || diwarp_cq_poll(b.cq, 8, wc) != 0)
                        _exit(3); /* its Sends must neither complete nor fail */
                usleep(1000);
        }
}

/* A child that stands in the pool's line (Writes posted while the hog holds
 * every token), then moves its QP to the error state and stays alive with
 * its devices open: it must leave the line, or the tokens the line hands it
 * would never be collected. Writes 1 byte to fd once its QP is in error. */
static pid_t hostcap_quitter(int fd)
{
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
                die("fork");
        if (pid)
                return pid;
        struct side a, b;
        buf_len = MiB;
        pair_open(&a, &b, DIWARP_ACCESS_REMOTE_WRITE);
        for (int i = 0; i < 8; i++)
                post_one(&a, &b, DIWARP_WR_RDMA_WRITE, (uint64_t)i, 0, 4096, (uintptr_t)b.buf,
                         b.rkey);
        uint64_t end = now_ms() + 10000;
        for (;;) {
                struct diwarp_wc wc[8];
                if (diwarp_cq_poll(a.cq, 8, wc) != 0)
                        _exit(3); /* no token: nothing may complete */
                diwarp_cq_poll(b.cq, 8, wc);
                struct diwarp_counters c;
                CHECK(diwarp_qp_counters(a.qp, &c));
                if (c.inflight_waits)
                        break;
                if (now_ms() > end)
                        _exit(4);
                usleep(1000);
        }
        struct diwarp_qp_attr attr = {.qp_state = DIWARP_QPS_ERR};
        CHECK(diwarp_qp_modify(a.qp, &attr, DIWARP_QP_STATE));
        if (write(fd, "x", 1) != 1)
                _exit(5);
        for (;;) {
                struct diwarp_wc wc[8];
                diwarp_cq_poll(a.cq, 8, wc); /* the flushed Writes */
                diwarp_cq_poll(b.cq, 8, wc);
                usleep(1000);
        }
}

static const struct dw_inflight_shm *hostcap_map(unsigned timeout_ms)
{
        uint64_t end = now_ms() + timeout_ms;
        for (;;) {
                int fd = shm_open(hostcap_shm, O_RDONLY, 0);
                struct stat st;
                if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == DW_INFLIGHT_SHM_SIZE) {
                        void *p = mmap(NULL, DW_INFLIGHT_SHM_SIZE, PROT_READ, MAP_SHARED, fd, 0);
                        close(fd);
                        if (p == MAP_FAILED)
                                die("hostcap: mmap: %s", strerror(errno));
                        const struct dw_inflight_shm *m = p;
                        while (__atomic_load_n(&m->magic, __ATOMIC_ACQUIRE) != DW_INFLIGHT_MAGIC) {
                                if (now_ms() > end)
                                        die("hostcap: the pool was never formatted");
                                usleep(1000);
                        }
                        return m;
                }
                if (fd >= 0)
                        close(fd);
                if (now_ms() > end)
                        die("hostcap: no pool %s", hostcap_shm);
                usleep(1000);
        }
}

/* Waits for the children in pids (0: done) to exit 0, until the deadline. */
static void hostcap_reap(pid_t *pids, int n, uint64_t deadline, const char *what)
{
        for (int left = n; left;) {
                for (int i = 0; i < n; i++) {
                        int st;
                        if (!pids[i] || waitpid(pids[i], &st, WNOHANG) != pids[i])
                                continue;
                        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                                die("%s: child %d ended with status %#x", what, pids[i], st);
                        pids[i] = 0;
                        left--;
                }
                if (left && now_ms() > deadline) {
                        for (int i = 0; i < n; i++)
                                if (pids[i])
                                        kill(pids[i], SIGKILL);
                        die("%s: %d children still running at the deadline", what, left);
                }
                usleep(5000);
        }
}

/* DIWARP_INFLIGHT_HOST=3 on a private pool (DIWARP_INFLIGHT_SHM) shared by
 * forked processes: 3 streamers all complete; then a process holding every
 * token, still asking for more, blocks 2 streamers until it is SIGKILLed,
 * after which they complete, the dead one's tokens reclaimed. */
static int case_hostcap(void)
{
        hostcap_parent = getpid();
        snprintf(hostcap_shm, sizeof(hostcap_shm), "/diwarp-rdtest-%d", (int)getpid());
        shm_unlink(hostcap_shm);
        atexit(hostcap_unlink);
        setenv("DIWARP_INFLIGHT_HOST", "3", 1);
        setenv("DIWARP_INFLIGHT_SHM", hostcap_shm, 1);
        pid_t pids[3];
        int go[2], report[2];
        if (pipe(go) != 0 || pipe(report) != 0)
                die("pipe: %s", strerror(errno));
        for (int i = 0; i < 3; i++)
                pids[i] = hostcap_streamer(go[0], go[1], report[1]);
        close(go[0]);
        close(go[1]); /* all three start together */
        close(report[1]);
        hostcap_reap(pids, 3, now_ms() + 60000, "hostcap streamers");
        uint64_t waits_sum = 0, waits;
        for (int i = 0; i < 3; i++) {
                if (read(report[0], &waits, sizeof(waits)) != (ssize_t)sizeof(waits))
                        die("hostcap: streamer %d of 3 reported no count of waits", i + 1);
                waits_sum += waits;
        }
        close(report[0]);
        /* Three streamers of 100 messages each against 3 tokens, started
         * together: the first to ask takes every token, so another that asks
         * before it returns them waits. One streamer may never wait (the
         * line hands it tokens before it asks again); all three, no. */
        if (!waits_sum)
                die("hostcap: 3 overlapping streamers never waited for a token of a 3-token pool");
        const struct dw_inflight_shm *m = hostcap_map(1000);
        if (m->capacity != 3 || m->free != 3 || m->qlen != 0)
                die("hostcap: pool capacity %u, %lld free, %u waiting after the streamers",
                    m->capacity, (long long)m->free, m->qlen);

        pid_t hog = hostcap_hog();
        /* Until the hog holds the whole pool. */
        uint64_t end = now_ms() + 10000;
        for (bool all = false; !all;) {
                for (unsigned i = 0; i < DW_INFLIGHT_SLOTS && !all; i++)
                        all = __atomic_load_n(&m->slot[i].state, __ATOMIC_ACQUIRE) ==
                                  DW_INFLIGHT_SLOT_USED &&
                              m->slot[i].pid == (uint32_t)hog && m->slot[i].inuse == 3;
                if (now_ms() > end) {
                        kill(hog, SIGKILL);
                        die("hostcap: the hog never held the 3 tokens");
                }
                usleep(1000);
        }
        uint64_t reclaimed0 = m->reclaimed;
        int qfd[2];
        if (pipe(qfd) != 0)
                die("pipe: %s", strerror(errno));
        pid_t quitter = hostcap_quitter(qfd[1]);
        close(qfd[1]);
        char x;
        if (read(qfd[0], &x, 1) != 1) {
                kill(hog, SIGKILL);
                die("hostcap: the quitter never stood in line (it died)");
        }
        close(qfd[0]);
        for (int i = 0; i < 2; i++)
                pids[i] = hostcap_streamer(-1, -1, -1);
        usleep(500000);
        for (int i = 0; i < 2; i++)
                if (waitpid(pids[i], NULL, WNOHANG) != 0) {
                        kill(hog, SIGKILL);
                        die("hostcap: streamer %d ended while the hog held every token", pids[i]);
                }
        kill(hog, SIGKILL);
        uint64_t t0 = now_ms();
        int st;
        if (waitpid(hog, &st, 0) != hog || !WIFSIGNALED(st))
                die("hostcap: the hog ended by itself (status %#x)", st);
        hostcap_reap(pids, 2, now_ms() + 30000, "hostcap streamers after the kill");
        uint64_t dt = now_ms() - t0;
        /* The quitter, alive, holds nothing and waits for nothing. */
        for (unsigned i = 0; i < DW_INFLIGHT_SLOTS; i++)
                if (__atomic_load_n(&m->slot[i].state, __ATOMIC_ACQUIRE) == DW_INFLIGHT_SLOT_USED &&
                    m->slot[i].pid == (uint32_t)quitter &&
                    (m->slot[i].inuse || m->slot[i].granted || m->slot[i].ticket)) {
                        kill(quitter, SIGKILL);
                        die("hostcap: a process whose waiting QP failed still holds %u tokens, "
                            "%u granted, ticket %llu",
                            m->slot[i].inuse, m->slot[i].granted,
                            (unsigned long long)m->slot[i].ticket);
                }
        if (waitpid(quitter, NULL, WNOHANG) != 0)
                die("hostcap: the quitter ended early");
        kill(quitter, SIGKILL);
        waitpid(quitter, NULL, 0);
        if (m->reclaimed < reclaimed0 + 3 || m->free != 3 || m->qlen != 0)
                die("hostcap: %llu tokens reclaimed, %lld free, %u waiting",
                    (unsigned long long)(m->reclaimed - reclaimed0), (long long)m->free, m->qlen);
        fprintf(stderr,
                "hostcap ok: streamers done %llu ms after the hog was killed, %llu tokens "
                "reclaimed\n",
                (unsigned long long)dt, (unsigned long long)(m->reclaimed - reclaimed0));
        munmap((void *)m, DW_INFLIGHT_SHM_SIZE);
        return 0;
}

/* ---------------------------------------------------------------- slowrx */

#define SLOWRX_BPS   2000000u
#define SLOWRX_BYTES (4 * MiB)
#define SLOWRX_MSG   MiB

/* Moves SLOWRX_BYTES from a to b in SLOWRX_MSG messages (receiver-paced Sends
 * or RDMA Writes), all posted at once; byte-exact. Returns the milliseconds
 * it took. */
static uint64_t slowrx_run(struct side *a, struct side *b, bool send, const char *what)
{
        const unsigned n = SLOWRX_BYTES / SLOWRX_MSG;
        fill(a->buf, SLOWRX_BYTES, send ? 90 : 91);
        memset(b->buf, 0, SLOWRX_BYTES);
        uint64_t t0 = now_ms();
        for (unsigned i = 0; i < n; i++) {
                uint64_t off = (uint64_t)i * SLOWRX_MSG;
                if (send)
                        post_recv(b, 0x600 + i, off, SLOWRX_MSG);
                post_one(a, b, send ? DIWARP_WR_SEND : DIWARP_WR_RDMA_WRITE, i, off, SLOWRX_MSG,
                         (uintptr_t)b->buf + off, b->rkey);
        }
        for (unsigned i = 0; i < n; i++) {
                if (send)
                        wait_one(b, a, 0x600 + i, DIWARP_WC_SUCCESS, what);
                wait_one(a, b, i, DIWARP_WC_SUCCESS, what);
        }
        uint64_t ms = now_ms() - t0;
        verify(a->buf, b->buf, SLOWRX_BYTES, what, SLOWRX_MSG);
        return ms;
}

/* A receiver reading its socket at DIWARP_FAULT=slowrx:2000000 (2 MB/s)
 * takes 4 MiB by RDMA Writes, then, on a fresh pair of devices (no path state
 * carried over), by receiver-paced Sends; mode "write" or "send" runs one
 * alone. Each transfer runs twice: the first teaches the sender the path (a
 * 64 KiB datagram is 32 ms of this receiver's time, so the first few time out
 * once before any RTT sample can arrive); the second is measured. The data
 * arrives intact, no sooner than the rate allows (less what the throttle lets
 * through at once: a 1 ms burst and one batch of 4 datagrams), with throttle
 * waits counted on the receiver only, and once the sender knows the path
 * next to nothing is retransmitted (at most 3 % of the datagrams): its RTO
 * follows the RTT the receiver's pace makes, its window the receiver's rate,
 * and the receiver-paced Sends ask for data only as it is placed. */
static int case_slowrx(const char *mode)
{
        if (mode && strcmp(mode, "send") != 0 && strcmp(mode, "write") != 0)
                die("slowrx: mode send or write, not %s", mode);
        buf_len = SLOWRX_BYTES;
        char spec[64];
        snprintf(spec, sizeof(spec), "DIWARP_FAULT=slowrx:%u", SLOWRX_BPS);
        const uint64_t slack = 4 * 65507 + SLOWRX_BPS / 1000;
        const uint64_t min_ms = (SLOWRX_BYTES - slack) * 1000 / SLOWRX_BPS;
        for (int send = 0; send < 2; send++) {
                if (mode && strcmp(mode, send ? "send" : "write") != 0)
                        continue;
                const char *what = send ? "slowrx pulled Sends" : "slowrx Writes";
                struct side a, b;
                pair_open_split(&a, &b, DIWARP_ACCESS_REMOTE_WRITE, NULL, spec, false);
                struct diwarp_counters ca0, cb0, ca, cb;
                slowrx_run(&a, &b, send, what);
                CHECK(diwarp_device_counters(a.dev, &ca0));
                CHECK(diwarp_device_counters(b.dev, &cb0));
                uint64_t ms = slowrx_run(&a, &b, send, what);
                CHECK(diwarp_device_counters(a.dev, &ca));
                CHECK(diwarp_device_counters(b.dev, &cb));
                uint64_t dgrams = ca.tx_packets - ca0.tx_packets + cb.tx_packets - cb0.tx_packets;
                uint64_t retx = ca.retransmits - ca0.retransmits + cb.retransmits - cb0.retransmits;
                uint64_t waits = cb.fault_slowrx_waits - cb0.fault_slowrx_waits;
                uint64_t pulls = cb.pulls - cb0.pulls;
                struct diwarpdv_rd_dest d = {a.ah, b.qpn, QKEY};
                struct diwarpdv_rd_path pa;
                CHECK(diwarpdv_query_rd_path(a.qp, rc_mode ? NULL : &d, &pa));
                fprintf(stderr,
                        "%s, second transfer: %u bytes in %llu ms (at least %llu), %llu throttle "
                        "waits, %llu datagrams, %llu retransmitted, %llu Reads; the sender's "
                        "stream: srtt %u ns, %u RTO expiries, %u tail probes in all\n",
                        what, SLOWRX_BYTES, (unsigned long long)ms, (unsigned long long)min_ms,
                        (unsigned long long)waits, (unsigned long long)dgrams,
                        (unsigned long long)retx, (unsigned long long)pulls, pa.srtt_ns,
                        pa.rto_expiries, pa.tail_probes);
                if (ms < min_ms)
                        die("%s: %llu ms, faster than %u bytes/s allows (%llu ms)", what,
                            (unsigned long long)ms, SLOWRX_BPS, (unsigned long long)min_ms);
                if (!waits || ca.fault_slowrx_waits)
                        die("%s: %llu throttle waits at the receiver, %llu at the sender", what,
                            (unsigned long long)waits, (unsigned long long)ca.fault_slowrx_waits);
                if (send) {
                        uint64_t r, by;
                        pull_expect(SLOWRX_MSG, &r, &by);
                        if (pulls != r * (SLOWRX_BYTES / SLOWRX_MSG))
                                die("%s: %llu Reads, want %llu", what, (unsigned long long)pulls,
                                    (unsigned long long)(r * (SLOWRX_BYTES / SLOWRX_MSG)));
                }
                /* Of the ~125 datagrams (64 KiB ones take 32 ms of the
                 * receiver's time apiece) allow the probe a sender may send
                 * while its RTT estimate still catches up with a receiver
                 * this slow, and one per time the host stalls a thread of
                 * the receiver for longer than that RTO (a busy CI host does
                 * now and then: 3 seen): at most 3 %. A sender whose RTO did
                 * not follow the receiver's pace resends far more. */
                if (retx * 100 > 3 * dgrams && retx > 1)
                        die("%s: %llu of %llu datagrams retransmitted (more than 3 %%)", what,
                            (unsigned long long)retx, (unsigned long long)dgrams);
                side_close(&a);
                side_close(&b);
        }
        return 0;
}

/* ---------------------------------------------------------------- cc */

/* After 8 MiB of Writes, a 1 MiB Read and 200 small Sends, the path to the
 * peer reports a window and RTTs, and the device's congestion counters (the
 * sum over its paths: one here) equal the path's. DIWARP_CC=off: no window
 * decrease, collapse or hold is ever counted; on under DIWARP_FAULT drops:
 * the losses cost the window something. */
static int case_cc(void)
{
        struct side a, b;
        buf_len = 8 * MiB;
        pair_open(&a, &b, DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ);
        for (unsigned i = 0; i < 8; i++)
                post_one(&a, &b, DIWARP_WR_RDMA_WRITE, i, (uint64_t)i * MiB, MiB,
                         (uintptr_t)b.buf + (uint64_t)i * MiB, b.rkey);
        for (unsigned i = 0; i < 8; i++)
                wait_one(&a, &b, i, DIWARP_WC_SUCCESS, "cc write");
        post_one(&a, &b, DIWARP_WR_RDMA_READ, 8, 0, MiB, (uintptr_t)b.buf, b.rkey);
        wait_one(&a, &b, 8, DIWARP_WC_SUCCESS, "cc read");
        for (unsigned i = 0; i < 200; i++)
                post_recv(&b, 0x700 + i, (uint64_t)i * 4096, 4096);
        for (unsigned i = 0; i < 200; i++)
                post_one(&a, &b, DIWARP_WR_SEND, 9 + i, 0, 64 + i, 0, 0);
        for (unsigned i = 0; i < 200; i++)
                wait_one(&b, &a, 0x700 + i, DIWARP_WC_SUCCESS, "cc recv");
        for (unsigned i = 0; i < 200; i++)
                wait_one(&a, &b, 9 + i, DIWARP_WC_SUCCESS, "cc send");
        struct diwarpdv_rd_dest d = {a.ah, b.qpn, QKEY};
        struct diwarpdv_rd_path p;
        struct diwarp_counters c;
        CHECK(diwarpdv_query_rd_path(a.qp, rc_mode ? NULL : &d, &p));
        CHECK(diwarp_device_counters(a.dev, &c));
        const char *cc = getenv("DIWARP_CC");
        const char *fault = getenv("DIWARP_FAULT");
        bool on = !(cc && strcmp(cc, "off") == 0);
        fprintf(stderr,
                "cc (%s): cwnd %u inflight %u min_rtt %u ns srtt %u ns pacing %llu bit/s; "
                "decreases delay %llu loss %llu, rto %llu, window waits %llu, pacing waits %llu; "
                "retransmits %u, %llu datagrams dropped by the fault hook\n",
                on ? "on" : "off", p.cwnd, p.inflight, p.min_rtt_ns, p.srtt_ns,
                (unsigned long long)p.pacing_bps, (unsigned long long)p.cc_decrease_delay,
                (unsigned long long)p.cc_decrease_loss, (unsigned long long)p.cc_rto,
                (unsigned long long)p.cc_window_waits, (unsigned long long)p.cc_pacing_waits,
                p.retransmits, (unsigned long long)c.fault_dropped);
        if (!p.cwnd || !p.srtt_ns || !p.min_rtt_ns)
                die("cc: cwnd %u, srtt %u ns, min_rtt %u ns after the run", p.cwnd, p.srtt_ns,
                    p.min_rtt_ns);
        if (c.cc_decrease_delay != p.cc_decrease_delay ||
            c.cc_decrease_loss != p.cc_decrease_loss || c.cc_rto != p.cc_rto ||
            c.cc_window_waits != p.cc_window_waits || c.cc_pacing_waits != p.cc_pacing_waits)
                die("cc: device counters (delay %llu loss %llu rto %llu window %llu pacing %llu) "
                    "differ from its one path's",
                    (unsigned long long)c.cc_decrease_delay, (unsigned long long)c.cc_decrease_loss,
                    (unsigned long long)c.cc_rto, (unsigned long long)c.cc_window_waits,
                    (unsigned long long)c.cc_pacing_waits);
        uint64_t events = p.cc_decrease_delay + p.cc_decrease_loss + p.cc_rto + p.cc_window_waits +
                          p.cc_pacing_waits;
        if (!on && (events || p.pacing_bps))
                die("cc off: %llu congestion events counted, pacing at %llu bit/s",
                    (unsigned long long)events, (unsigned long long)p.pacing_bps);
        if (on && fault && strstr(fault, "drop") && c.fault_dropped &&
            !(p.cc_decrease_loss + p.cc_rto))
                die("cc: %llu datagrams dropped and no window decrease for a loss",
                    (unsigned long long)c.fault_dropped);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- dereg */

/* Memory handed back the moment its use completed, as an MPI library's
 * registration cache does: every Write's source and every region a peer
 * Reads is a region registered for that one message and deregistered as
 * soon as its completion says the device is done with it (the Write's send
 * completion; for a Read source, the reader's FIN Send that follows the
 * Read's completion). Both sides at once, under DIWARP_FAULT. A
 * retransmission must never read such memory again: every completion
 * succeeds, and every byte arrives. */
#define DR_SLOTS 8u
#define DR_MAXL  (96u << 10)
#define DR_RECVS 64u
#define DR_MSG   32u
enum { DR_WRITE = 1, DR_FINW, DR_DONEW, DR_RTS, DR_READ, DR_FINR };

struct dr_msg {
        uint32_t type, slot, seq, len;
        uint64_t addr;
        uint32_t rkey, pad;
};

struct dr_side {
        struct side *s, *peer;
        struct dr_side *other;
        /* write slots: the source region (registered per message) and the
         * peer's target slot; busy until the Write completed and the peer
         * said it checked the bytes (DONEW) */
        struct diwarp_mr *wmr[DR_SLOTS];
        uint32_t wseq[DR_SLOTS], wlen[DR_SLOTS];
        bool wbusy[DR_SLOTS], wdone[DR_SLOTS], wchecked[DR_SLOTS];
        /* regions the peer Reads: registered for one Read, deregistered at
         * its FIN */
        struct diwarp_mr *rmr[DR_SLOTS];
        uint32_t rseq[DR_SLOTS];
        bool rbusy[DR_SLOTS];
        uint32_t writes, reads; /* started */
        uint32_t writes_done, reads_done, reads_served;
        uint32_t n;
};

static uint8_t *dr_src(struct side *s, unsigned slot)
{
        return s->buf + (uint64_t)slot * DR_MAXL;
}
static uint8_t *dr_exp(struct side *s, unsigned slot)
{
        return s->buf + (uint64_t)(DR_SLOTS + slot) * DR_MAXL;
}
static uint8_t *dr_tgt(struct side *s, unsigned slot)
{
        return s->buf + (uint64_t)(2 * DR_SLOTS + slot) * DR_MAXL;
}
static uint8_t *dr_sink(struct side *s, unsigned slot)
{
        return s->buf + (uint64_t)(3 * DR_SLOTS + slot) * DR_MAXL;
}
static uint64_t dr_recv_off(unsigned i)
{
        return (uint64_t)4 * DR_SLOTS * DR_MAXL + (uint64_t)i * DR_MSG;
}

static uint32_t dr_len(uint32_t seq, bool read)
{
        /* mostly multi-datagram messages, some of one datagram */
        uint32_t x = seq * 2654435761u + (read ? 77u : 0u);
        return (x >> 8) % 4 == 0 ? 1 + (x >> 12) % 1024 : 1 + (x >> 12) % DR_MAXL;
}

static struct diwarp_mr *dr_reg(struct side *s, uint8_t *p, uint32_t len, int access)
{
        struct diwarp_mr *mr;
        CHECK(diwarp_mr_reg(s->pd, p, len, (uintptr_t)p, access, &mr));
        return mr;
}

static uint32_t dr_key(struct diwarp_mr *mr, bool remote)
{
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(mr, &mi));
        return remote ? mi.rkey : mi.lkey;
}

static void dr_post(struct dr_side *d, enum diwarp_wr_opcode op, uint64_t id, uint8_t *addr,
                    uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, unsigned flags)
{
        struct diwarp_sge sge = {(uintptr_t)addr, len, lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED | flags};
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        post(d->s, d->peer, &wr);
}

static void dr_msg_send(struct dr_side *d, const struct dr_msg *m)
{
        dr_post(d, DIWARP_WR_SEND, (uint64_t)m->type << 32 | m->slot, (uint8_t *)m, sizeof(*m), 0,
                0, 0, DIWARP_SEND_INLINE);
}

static uint64_t dr_id(unsigned kind, unsigned slot)
{
        return (uint64_t)kind << 32 | slot;
}

/* Starts what the side may start: a Write (source registered now) with its
 * FIN, and a Read offer (the region registered now) to the peer. */
static void dr_start(struct dr_side *d)
{
        struct side *s = d->s;
        for (unsigned k = 0; k < DR_SLOTS && d->writes < d->n; k++) {
                if (d->wbusy[k])
                        continue;
                uint32_t seq = d->writes++, len = dr_len(seq, false);
                fill(dr_src(s, k), len, seq);
                d->wmr[k] = dr_reg(s, dr_src(s, k), len, 0);
                d->wseq[k] = seq;
                d->wlen[k] = len;
                d->wbusy[k] = true;
                d->wdone[k] = d->wchecked[k] = false;
                dr_post(d, DIWARP_WR_RDMA_WRITE, dr_id(DR_WRITE, k), dr_src(s, k), len,
                        dr_key(d->wmr[k], false), (uintptr_t)dr_tgt(d->peer, k), d->peer->rkey, 0);
                struct dr_msg m = {.type = DR_FINW, .slot = k, .seq = seq, .len = len};
                dr_msg_send(d, &m);
        }
        for (unsigned k = 0; k < DR_SLOTS && d->reads < d->n; k++) {
                if (d->rbusy[k])
                        continue;
                uint32_t seq = d->reads++, len = dr_len(seq, true);
                fill(dr_exp(s, k), len, seq ^ 0x5a5a5a5au);
                d->rmr[k] = dr_reg(s, dr_exp(s, k), len, DIWARP_ACCESS_REMOTE_READ);
                d->rseq[k] = seq;
                d->rbusy[k] = true;
                struct dr_msg m = {.type = DR_RTS,
                                   .slot = k,
                                   .seq = seq,
                                   .len = len,
                                   .addr = (uintptr_t)dr_exp(s, k),
                                   .rkey = dr_key(d->rmr[k], true)};
                dr_msg_send(d, &m);
        }
}

static void dr_free_w(struct dr_side *d, unsigned k)
{
        if (d->wdone[k] && d->wchecked[k]) {
                d->wbusy[k] = false;
                d->writes_done++;
        }
}

static uint8_t dr_ref[DR_MAXL];
static struct dr_msg dr_pending[2][DR_SLOTS]; /* the RTS each Read answers */

static void dr_handle(struct dr_side *d, struct diwarp_wc *wc, int idx)
{
        struct side *s = d->s;
        if (wc->status != DIWARP_WC_SUCCESS)
                die("dereg: side %d wc wr_id %#llx opcode %d status %d (%s) after %u writes, "
                    "%u reads",
                    idx, (unsigned long long)wc->wr_id, wc->opcode, wc->status,
                    diwarp_wc_status_str(wc->status), d->writes_done, d->reads_done);
        unsigned kind = (unsigned)(wc->wr_id >> 32), k = (unsigned)(wc->wr_id & 0xffff);
        if (wc->opcode == DIWARP_WC_RECV) {
                struct dr_msg m;
                memcpy(&m, s->buf + dr_recv_off(k), sizeof(m));
                post_recv(s, k, dr_recv_off(k), DR_MSG);
                if (m.slot >= DR_SLOTS || m.len > DR_MAXL)
                        die("dereg: bad message type %u slot %u", m.type, m.slot);
                switch (m.type) {
                case DR_FINW: {
                        /* The Write before it is placed: check, then say so. */
                        fill(dr_ref, m.len, m.seq);
                        verify(dr_tgt(s, m.slot), dr_ref, m.len, "dereg write", m.len);
                        struct dr_msg r = {.type = DR_DONEW, .slot = m.slot, .seq = m.seq};
                        dr_msg_send(d, &r);
                        break;
                }
                case DR_DONEW:
                        if (!d->wbusy[m.slot] || d->wseq[m.slot] != m.seq)
                                die("dereg: DONEW for slot %u seq %u", m.slot, m.seq);
                        d->wchecked[m.slot] = true;
                        dr_free_w(d, m.slot);
                        break;
                case DR_RTS:
                        dr_pending[idx][m.slot] = m;
                        dr_post(d, DIWARP_WR_RDMA_READ, dr_id(DR_READ, m.slot), dr_sink(s, m.slot),
                                m.len, s->lkey, m.addr, m.rkey, 0);
                        break;
                case DR_FINR:
                        /* The peer has the bytes: the region goes at once. */
                        if (!d->rbusy[m.slot] || d->rseq[m.slot] != m.seq)
                                die("dereg: FINR for slot %u seq %u", m.slot, m.seq);
                        CHECK(diwarp_mr_dereg(d->rmr[m.slot]));
                        d->rbusy[m.slot] = false;
                        d->reads_served++;
                        break;
                default:
                        die("dereg: bad message type %u", m.type);
                }
                return;
        }
        switch (kind) {
        case DR_WRITE:
                /* The device is done with the source: it goes at once. */
                CHECK(diwarp_mr_dereg(d->wmr[k]));
                d->wmr[k] = NULL;
                d->wdone[k] = true;
                dr_free_w(d, k);
                break;
        case DR_READ: {
                struct dr_msg *m = &dr_pending[idx][k];
                fill(dr_ref, m->len, m->seq ^ 0x5a5a5a5au);
                verify(dr_sink(s, k), dr_ref, m->len, "dereg read", m->len);
                struct dr_msg r = {.type = DR_FINR, .slot = k, .seq = m->seq};
                dr_msg_send(d, &r);
                d->reads_done++;
                break;
        }
        case DR_FINW:
        case DR_DONEW:
        case DR_RTS:
        case DR_FINR:
                break;
        default:
                die("dereg: unknown completion %#llx", (unsigned long long)wc->wr_id);
        }
}

/* The responder deregisters the region a peer's RDMA Read names while the
 * Read is served (DIWARP_FAULT=slowrx at the reader keeps it under way for
 * a while). The responder cannot send the rest of the response: its QP goes
 * to error with QP_ACCESS_ERR (a responder's access error), and none of its
 * own WRs is blamed (its posted receive is flushed, nothing completes with
 * LOC_PROT_ERR); the reader's Read never completes successfully. */
#define RG_LEN (8u * MiB)

static int case_readgone(void)
{
        struct side a, b;
        buf_len = RG_LEN + 4096;
        int all =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        pair_open(&a, &b, all);
        uint8_t *src = aligned_alloc(4096, RG_LEN);
        if (!src)
                die("no memory");
        fill(src, RG_LEN, 41);
        struct diwarp_mr *mr;
        CHECK(diwarp_mr_reg(b.pd, src, RG_LEN, (uintptr_t)src,
                            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_READ, &mr));
        struct diwarp_mr_info mi;
        diwarp_mr_info(mr, &mi);
        post_recv(&b, 0x77, 0, 64);
        post_one(&a, &b, DIWARP_WR_RDMA_READ, 9, 0, RG_LEN, (uintptr_t)src, mi.rkey);
        uint64_t t0 = now_ms();
        while (now_ms() < t0 + 50) {
                struct diwarp_wc wc;
                if (diwarp_cq_poll(a.cq, 1, &wc) == 1)
                        die("readgone: the Read completed (%d) before the region went: slowrx "
                            "did not slow it",
                            (int)wc.status);
                if (diwarp_cq_poll(b.cq, 1, &wc) == 1)
                        die("readgone: responder completion %#llx (%d) before the region went",
                            (unsigned long long)wc.wr_id, (int)wc.status);
                usleep(1000);
        }
        CHECK(diwarp_mr_dereg(mr));
        bool read_done = false, recv_flushed = false;
        uint64_t end = now_ms() + 60000;
        while (!read_done || !recv_flushed) {
                struct diwarp_wc wc;
                if (diwarp_cq_poll(a.cq, 1, &wc) == 1) {
                        if (wc.wr_id != 9 || wc.status == DIWARP_WC_SUCCESS)
                                die("readgone: reader completion %#llx status %d",
                                    (unsigned long long)wc.wr_id, (int)wc.status);
                        read_done = true;
                }
                if (diwarp_cq_poll(b.cq, 1, &wc) == 1) {
                        if (wc.wr_id != 0x77 || wc.status != DIWARP_WC_WR_FLUSH_ERR)
                                die("readgone: responder completion %#llx status %d (want its "
                                    "receive flushed, WR_FLUSH_ERR %d)",
                                    (unsigned long long)wc.wr_id, (int)wc.status,
                                    (int)DIWARP_WC_WR_FLUSH_ERR);
                        recv_flushed = true;
                }
                if (now_ms() > end)
                        die("readgone: after 60 s: reader done %d, responder's receive flushed %d",
                            read_done, recv_flushed);
                usleep(1000);
        }
        if (diwarp_qp_state(b.qp) != DIWARP_QPS_ERR)
                die("readgone: responder QP not in ERR");
        struct diwarp_async_event ev;
        int fl = diwarp_get_async_event(b.dev, &ev);
        if (fl < 0 || ev.event_type != DIWARP_EVENT_QP_ACCESS_ERR)
                die("readgone: responder's async event %d (%d), want QP_ACCESS_ERR %d",
                    fl < 0 ? -1 : (int)ev.event_type, fl, (int)DIWARP_EVENT_QP_ACCESS_ERR);
        fprintf(stderr,
                "readgone ok: responder QP_ACCESS_ERR, its receive flushed, the Read "
                "failed, %llu ms\n",
                (unsigned long long)(now_ms() - t0));
        free(src);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* Two Writes to the same 8 KiB of b, then a Fetch-and-Add of its first word
 * and a Read of it all, posted back to back, round after round: a responder
 * that ran a request as it arrived, ahead of an earlier datagram (reordered
 * or lost), would let the Atomic miss the Writes or the Read the Atomic; one
 * that placed a late segment of the first Write over what the second had
 * already written would leave the first's bytes. */
#define ORD_ROUNDS 300
#define ORD_LEN    8192u
static int case_order(void)
{
        struct side a, b;
        buf_len = 8 * ORD_LEN;
        int all = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                  DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_ATOMIC;
        pair_open(&a, &b, all);
        uint8_t *target = b.buf + ORD_LEN; /* 8-aligned */
        uint8_t *older = a.buf + 2 * ORD_LEN, *newer = a.buf + 3 * ORD_LEN;
        uint8_t *sink = a.buf + 4 * ORD_LEN;
        uint64_t t0 = now_ms();
        for (unsigned r = 0; r < ORD_ROUNDS; r++) {
                memset(older, 0x11, ORD_LEN);
                memset(newer, (int)(r % 200) + 0x20, ORD_LEN);
                uint64_t v;
                memcpy(&v, newer, 8);
                memset(a.buf, 0, 8);
                memset(sink, 0, ORD_LEN);
                post_one(&a, &b, DIWARP_WR_RDMA_WRITE, 1, 2 * ORD_LEN, ORD_LEN, (uintptr_t)target,
                         b.rkey);
                post_one(&a, &b, DIWARP_WR_RDMA_WRITE, 2, 3 * ORD_LEN, ORD_LEN, (uintptr_t)target,
                         b.rkey);
                post_atomic(&a, &b, DIWARP_WR_ATOMIC_FETCH_AND_ADD, 3, (uint64_t *)target, b.rkey,
                            1, 0);
                post_one(&a, &b, DIWARP_WR_RDMA_READ, 4, 4 * ORD_LEN, ORD_LEN, (uintptr_t)target,
                         b.rkey);
                struct diwarp_wc wc[4];
                if (poll_until(&a, &b, wc, 4, 60000) != 4)
                        die("order round %u: not all four completed", r);
                for (unsigned i = 0; i < 4; i++)
                        expect_wc(&wc[i], i + 1, DIWARP_WC_SUCCESS, "order");
                uint64_t got, read;
                memcpy(&got, a.buf, 8);
                memcpy(&read, sink, 8);
                if (got != v || read != v + 1)
                        die("order round %u: the Atomic returned %#llx (want %#llx, the second "
                            "Write's), the Read %#llx (want %#llx)",
                            r, (unsigned long long)got, (unsigned long long)v,
                            (unsigned long long)read, (unsigned long long)(v + 1));
                for (unsigned k = 8; k < ORD_LEN; k++)
                        if (sink[k] != newer[k])
                                die("order round %u: byte %u is %#x, the first Write's: a late "
                                    "segment of it overwrote the second",
                                    r, k, sink[k]);
        }
        fprintf(stderr, "order ok: %u rounds in %llu ms\n", ORD_ROUNDS,
                (unsigned long long)(now_ms() - t0));
        side_close(&a);
        side_close(&b);
        return 0;
}

/* Four Reads of a chunk each: both big Sends are pulled at once. The big
 * senders answer nothing while held: a peer timeout of a minute keeps the
 * server's QP from giving them up on a loaded machine. */
#define RQO_BIG (256u * 1024)
#define RQO_ENV                                                                                    \
        "DIWARP_RD_PULL_MIN=262144;DIWARP_RD_PULL_CHUNK=65536;DIWARP_RD_PULL_DEPTH=8;"             \
        "DIWARP_PEER_TIMEOUT_MS=60000"
#define RQO_SMALL 1000u

static uint64_t rqo_off(unsigned id)
{
        return (uint64_t)id * (RQO_BIG + 4096);
}

/* The server's pull counter once it stops growing (the pulls it can start
 * without answers are all out). */
static uint64_t rqo_pulls_settled(struct side *srv, uint64_t above, const char *what)
{
        uint64_t bytes, n, end = now_ms() + 10000;
        while ((n = dev_pulls(srv, &bytes)) <= above) {
                if (now_ms() > end)
                        die("rqorder: the server never started pulling %s (its QP state %d)", what,
                            (int)diwarp_qp_state(srv->qp));
                usleep(1000);
        }
        for (uint64_t m; usleep(50000), (m = dev_pulls(srv, &bytes)) != n;)
                n = m;
        return n;
}

/* n Sends of RQO_SMALL bytes from small to srv; their receives must complete
 * as ids[0..n), byte-exact, from small. */
static void rqo_smalls(struct side *srv, struct side *small, const unsigned *ids, unsigned n,
                       unsigned seed)
{
        struct diwarp_wc wc[4];
        for (unsigned i = 0; i < n; i++) {
                fill(small->buf + i * RQO_SMALL, RQO_SMALL, seed + i);
                post_one(small, srv, DIWARP_WR_SEND, seed + i, i * RQO_SMALL, RQO_SMALL, 0, 0);
        }
        if (poll_until(srv, small, wc, (int)n, 20000) != (int)n)
                die("rqorder: Sends %u..: their receives did not complete behind the big ones",
                    seed);
        for (unsigned i = 0; i < n; i++) {
                char what[64];
                snprintf(what, sizeof(what), "rqorder receive %u", ids[i]);
                expect_wc(&wc[i], ids[i], DIWARP_WC_SUCCESS, what);
                if (wc[i].src_qp != small->qpn || wc[i].byte_len != RQO_SMALL)
                        die("%s: src_qp %#x byte_len %u", what, wc[i].src_qp, wc[i].byte_len);
                uint8_t ref[RQO_SMALL];
                fill(ref, RQO_SMALL, seed + i);
                verify(ref, srv->buf + rqo_off(ids[i]), RQO_SMALL, what, RQO_SMALL);
        }
        if (poll_until(small, srv, wc, (int)n, 20000) != (int)n)
                die("rqorder: Sends %u..: the sender's completions missing", seed);
}

static struct diwarp_srq *rqo_srq; /* the server's receives go to it when set */

static void rqo_post_recv(struct side *srv, unsigned id)
{
        struct diwarp_sge sge = {(uintptr_t)srv->buf + rqo_off(id), RQO_BIG, srv->lkey};
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        int rc = rqo_srq ? diwarp_post_srq_recv(rqo_srq, &wr, &bad)
                         : diwarp_post_recv(srv->qp, &wr, &bad);
        if (rc)
                die("rqorder: posting receive %u (%s): %s", id, rqo_srq ? "SRQ" : "QP",
                    strerror(-rc));
}

/* Receives of one RD QP complete in the order their messages finish, which
 * across peers is not the order they were posted. The application may repost
 * each receive as it completes: an ibverbs RQ of max_recv_wr holds that many
 * outstanding WRs, whichever of them finished. */
static int case_rqorder(bool on_srq)
{
        struct side srv, big[2], small;
        struct env_saved sv, all;
        int acc =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        buf_len = 6 * (RQO_BIG + 4096);
        env_push(RQO_ENV, &all);
        side_open(&srv, acc);
        /* The big senders answer the server's pulls only when the test drives
         * them: their Sends stay under way for as long as the test wants. */
        env_push("DIWARP_PROGRESS=app", &sv);
        side_open(&big[0], acc);
        side_open(&big[1], acc);
        env_pop(&sv);
        side_open(&small, acc);
        env_pop(&all);
        if (on_srq) {
                struct diwarp_srq_attr sa = {.max_wr = 4, .max_sge = 1};
                CHECK(diwarp_srq_create(srv.pd, &sa, NULL, &rqo_srq));
                make_srq = rqo_srq;
        }
        rq_depth = 4;
        qp_make(&srv, 0);
        rq_depth = 4096;
        make_srq = NULL;
        qp_make(&big[0], 0);
        qp_make(&big[1], 0);
        qp_make(&small, 0);
        qp_connect(&srv, &small, small.qpn);
        for (int i = 0; i < 2; i++) {
                qp_connect(&big[i], &srv, srv.qpn);
                fill(big[i].buf, RQO_BIG, 77 + (uint32_t)i);
        }
        qp_connect(&small, &srv, srv.qpn);
        for (unsigned id = 0; id < 4; id++)
                rqo_post_recv(&srv, id);
        /* Receive WR 0 takes big 0, 1 a small Send, 2 big 1, 3 a small Send. */
        post_one(&big[0], &srv, DIWARP_WR_SEND, 0xb0, 0, RQO_BIG, 0, 0);
        uint64_t pulls = rqo_pulls_settled(&srv, 0, "big 0");
        rqo_smalls(&srv, &small, (unsigned[]){1}, 1, 10);
        post_one(&big[1], &srv, DIWARP_WR_SEND, 0xb1, 0, RQO_BIG, 0, 0);
        rqo_pulls_settled(&srv, pulls, "big 1");
        rqo_smalls(&srv, &small, (unsigned[]){3}, 1, 20);
        /* WRs 1 and 3 completed behind WRs 0 and 2: their two slots take
         * reposts (of the QP's queue, or of the QP's share of the SRQ's),
         * and WR 2 (being pulled into) moves to a new slot. */
        for (unsigned id = 4; id < 6; id++)
                rqo_post_recv(&srv, id);
        rqo_smalls(&srv, &small, (unsigned[]){4, 5}, 2, 30);
        /* Now the big senders run: both Sends complete into WRs 0 and 2,
         * byte-exact. */
        struct diwarp_wc wc[2];
        int got = 0;
        for (uint64_t end = now_ms() + 60000; got < 2 && now_ms() < end;) {
                int n = diwarp_cq_poll(srv.cq, 2 - got, wc + got);
                if (n < 0)
                        die("cq_poll: %s", strerror(-n));
                got += n;
                diwarp_progress(big[0].dev, 64);
                diwarp_progress(big[1].dev, 64);
        }
        if (got != 2)
                die("rqorder: %d of the big Sends completed", got);
        if (wc[0].wr_id > wc[1].wr_id) {
                struct diwarp_wc t = wc[0];
                wc[0] = wc[1];
                wc[1] = t;
        }
        for (int i = 0; i < 2; i++) {
                char what[64];
                snprintf(what, sizeof(what), "rqorder big %d's receive", i);
                expect_wc(&wc[i], 2 * (uint64_t)i, DIWARP_WC_SUCCESS, what);
                if (wc[i].src_qp != big[i].qpn || wc[i].byte_len != RQO_BIG)
                        die("%s: src_qp %#x byte_len %u", what, wc[i].src_qp, wc[i].byte_len);
                verify(big[i].buf, srv.buf + rqo_off(2 * (unsigned)i), RQO_BIG, what, RQO_BIG);
                wait_one(&big[i], &srv, 0xb0 + (uint64_t)i, DIWARP_WC_SUCCESS, what);
        }
        fprintf(stderr, "rqorder ok: %llu pulls before the big senders ran\n",
                (unsigned long long)pulls);
        side_close(&small);
        side_close(&big[1]);
        side_close(&big[0]);
        if (rqo_srq) {
                CHECK(diwarp_qp_destroy(srv.qp));
                srv.qp = NULL;
                CHECK(diwarp_srq_destroy(rqo_srq));
        }
        side_close(&srv);
        return 0;
}

static int case_dereg(void)
{
        struct side a, b;
        buf_len = (size_t)4 * DR_SLOTS * DR_MAXL + 4096; /* + the receive buffers */
        int all =
            DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ;
        pair_open(&a, &b, all);
        struct dr_side d[2] = {{.s = &a, .peer = &b}, {.s = &b, .peer = &a}};
        uint32_t n = 1500;
        const char *e = getenv("DR_MESSAGES");
        if (e)
                n = (uint32_t)strtoul(e, NULL, 0);
        for (int i = 0; i < 2; i++) {
                d[i].n = n;
                for (unsigned k = 0; k < DR_RECVS; k++)
                        post_recv(d[i].s, k, dr_recv_off(k), DR_MSG);
        }
        uint64_t t0 = now_ms(), end = t0 + 200000;
        struct diwarp_wc wc[16];
        for (;;) {
                bool all_done = true;
                for (int i = 0; i < 2; i++) {
                        struct dr_side *x = &d[i];
                        dr_start(x);
                        int m = diwarp_cq_poll(x->s->cq, 16, wc);
                        if (m < 0)
                                die("cq_poll: %s", strerror(-m));
                        for (int j = 0; j < m; j++)
                                dr_handle(x, &wc[j], i);
                        if (x->writes_done < n || x->reads_done < n || x->reads_served < n)
                                all_done = false;
                }
                if (all_done)
                        break;
                if (now_ms() > end)
                        die("dereg: timeout: writes %u/%u, reads %u/%u", d[0].writes_done,
                            d[1].writes_done, d[0].reads_done, d[1].reads_done);
        }
        struct diwarp_counters ca, cb;
        CHECK(diwarp_device_counters(a.dev, &ca));
        CHECK(diwarp_device_counters(b.dev, &cb));
        fprintf(stderr,
                "dereg ok: %u Writes and %u Reads each way from regions deregistered at "
                "completion, %llu ms; retransmits %llu + %llu, drops %llu + %llu\n",
                n, n, (unsigned long long)(now_ms() - t0), (unsigned long long)ca.retransmits,
                (unsigned long long)cb.retransmits, (unsigned long long)ca.fault_dropped,
                (unsigned long long)cb.fault_dropped);
        side_close(&a);
        side_close(&b);
        return 0;
}

int main(int argc, char **argv)
{
        if (argc < 2)
                die("usage: rd_test CASE [rd|rc] [kill|stop] (cases: see the header comment)");
        alarm(280);
        rc_mode = argc > 2 && strcmp(argv[2], "rc") == 0;
        if (rc_mode)
                setenv("DIWARP_RC_TRANSPORT", "rd", 1);
        if (!strcmp(argv[1], "ops"))
                return case_ops();
        if (!strcmp(argv[1], "stream"))
                return case_stream();
        if (!strcmp(argv[1], "loss"))
                return case_loss();
        if (!strcmp(argv[1], "gib"))
                return case_gib();
        if (!strcmp(argv[1], "guard"))
                return case_guard();
        if (!strcmp(argv[1], "prot"))
                return case_prot();
        if (!strcmp(argv[1], "mw"))
                return case_mw();
        if (!strcmp(argv[1], "rnr"))
                return case_rnr();
        if (!strcmp(argv[1], "mailbox"))
                return case_mailbox();
        if (!strcmp(argv[1], "mbox"))
                return case_mbox();
        if (!strcmp(argv[1], "path"))
                return case_path();
        if (!strcmp(argv[1], "srq"))
                return case_srq();
        if (!strcmp(argv[1], "srqpd"))
                return case_srqpd();
        if (!strcmp(argv[1], "invfail"))
                return case_invfail();
        if (!strcmp(argv[1], "mboxinv"))
                return case_mboxinv();
        if (!strcmp(argv[1], "fds"))
                return case_fds(false);
        if (!strcmp(argv[1], "heap"))
                return case_fds(true);
        if (!strcmp(argv[1], "order"))
                return case_order();
        if (!strcmp(argv[1], "pingpong"))
                return case_pingpong();
        if (!strcmp(argv[1], "vanish"))
                return case_vanish(argc > 3 ? argv[3] : "kill");
        if (!strcmp(argv[1], "pull"))
                return case_pull();
        if (!strcmp(argv[1], "pulllen"))
                return case_pulllen();
        if (!strcmp(argv[1], "crc"))
                return case_crc();
        if (!strcmp(argv[1], "caps"))
                return case_caps();
        if (!strcmp(argv[1], "hostcap"))
                return case_hostcap();
        if (!strcmp(argv[1], "slowrx"))
                return case_slowrx(argc > 3 ? argv[3] : NULL);
        if (!strcmp(argv[1], "cc"))
                return case_cc();
        if (!strcmp(argv[1], "dereg"))
                return case_dereg();
        if (!strcmp(argv[1], "restart") && !rc_mode)
                return case_restart();
        if (!strcmp(argv[1], "rqorder") && !rc_mode)
                return case_rqorder(argc > 3 && !strcmp(argv[3], "srq"));
        if (!strcmp(argv[1], "readgone"))
                return case_readgone();
        die("unknown case %s", argv[1]);
        return 1;
}
