/* Attacks on the datagram paths (RD QPs, RC over RD, UD) from a stranger:
 * datagrams forged with the codecs of libdiwarp/wire/ and sent from another
 * loopback address (127.0.0.9) to a victim device, beside a legitimate peer
 * whose traffic must still complete. docs/SECURITY.md, "The datagram paths" says what
 * each case defends.
 *
 *   security_dgram access   a QP whose access flags were never set refuses
 *                           every remote access (RD: forged Write, Read and
 *                           Atomic answered with NAK REM_ACCESS, memory
 *                           untouched; RC over TCP: a peer's Write fails with
 *                           REM_ACCESS_ERR); a QP that grants REMOTE_WRITE
 *                           takes the same forged Write; a Send completes
 *   security_dgram stag     1024 forged Writes into the victim's first MR,
 *                           guessing the STags an index counting from 1
 *                           gave (handles 1..4, every key): none lands; the
 *                           legitimate peer's Write with the real rkey does
 *   security_dgram nord     RD datagrams (a Write, a bare ACK) from a
 *                           stranger to a device that never made an RD QP:
 *                           dropped and counted (rx_dropped_no_qp), no crash,
 *                           nothing written; its first RD QP then serves its
 *                           peer
 *   security_dgram nak      error NAKs for a PSN in flight from the victim to a
 *                           silent peer: one from 127.0.0.9 naming the peer's
 *                           stream by a forged origin (X-flag RAIL:
 *                           rx_dropped_rail), one from the peer's address
 *                           for a PSN not outstanding (rx_dropped_nak):
 *                           both dropped and counted, the QP stays in RTS and
 *                           serves its legitimate peer; the peer's own NAK of
 *                           the PSN still fails the WR (REM_ACCESS_ERR)
 *   security_dgram window [srq]   a forged Send whose MSN is 90 ahead of the
 *                           stream's next: dropped and counted, it binds no
 *                           receive WR (of the RQ, or of an SRQ), so the
 *                           legitimate peer's 100 Sends all land in the 100
 *                           WRs posted, in order
 *   security_dgram isn      the first PSN and MSN of an RD stream: on the
 *                           wire (a silent peer reads the first Send) they
 *                           are those of its START descriptor, not the
 *                           public function of the QPNs nor MSN 1, and new
 *                           ones after a reset and on a new device; a
 *                           stranger on 127.0.0.9 naming the legitimate
 *                           peer's stream (forged origin) sends Sends at
 *                           every PSN of the window the public function
 *                           gives: none is delivered, the peer's own are
 *   security_dgram log      300 forged Writes with unknown STags: at most the
 *                           rate limit's burst of warning lines, then after
 *                           the period one line counting the rest
 *   security_dgram rcrd     an RC QP over RD, natively connected, that carried
 *                           a Write: the peer's next Write forged (right QPNs,
 *                           PSN and rkey) from 127.0.0.9 with a forged origin,
 *                           without and with a wrong token and with a forged
 *                           rail list, and (raw socket) from the peer's own
 *                           address: none lands, each counted in
 *                           rx_dropped_token; the peer's Write lands
 *   security_dgram rails    a multirail victim: a Write naming its peer by a
 *                           forged origin with the list [peer, 127.0.0.9]
 *                           from 127.0.0.9, and (raw socket) that list from
 *                           the peer's address with a wrong token and
 *                           without one: nothing lands, no list is taken
 *                           (the victim's 1 MiB Write to the peer sends
 *                           nothing by rail 1 nor to 127.0.0.9), counted in
 *                           rx_dropped_rail
 *   security_dgram peers    20 000 zero-length Writes opening streams, half
 *                           with forged origins, half from 8 addresses: the
 *                           victim keeps at most its cap of streams, answers
 *                           only those, and its memory stays within the cap;
 *                           idle streams are freed after DIWARP_RD_IDLE_MS
 *                           and the legitimate peer's stream restarts
 *   security_dgram auth     DIWARP_AUTH=file:PATH on RD QPs (case_auth)
 *   security_dgram authconn RC over RD with the connection's key
 *                           (DIWARP_AUTH=connection): the peer's next Write
 *                           forged without a tag, with a made-up one and
 *                           with a valid tag under another key: none lands,
 *                           each counted in rx_dropped_auth, the peer's
 *                           Writes land; file:PATH (the file key mixed in)
 *                           works between two ends of one key, and a peer
 *                           of another key file places nothing
 *   security_dgram authmismatch  DIWARP_AUTH differing at the two ends of
 *                           an RC-over-RD connection: refused at connect
 *                           time (-EPROTO), one line naming the setting
 *   security_dgram keyrun PROGRAM ARGS...  runs PROGRAM with a fresh key file
 *
 * Two devices in one process (the victim and the legitimate peer) and a plain
 * UDP socket on 127.0.0.9 (the stranger). Exit 0 pass, 1 fail, 77 skip (no
 * 127.0.0.9 to bind); alarm() bounds each run.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

/* Engine-internal codecs: the stranger builds its datagrams with them. */
#include "wire/dgram.h"
#include "wire/rdmap.h"
#include "wire/seal.h"

#define QKEY    0x11223344u
#define BUF_LEN (1u << 20)

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

/* ---------------------------------------------------------------- devices */

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        struct diwarp_ah *ah; /* to the other side */
        uint8_t *buf;
        uint32_t lkey, rkey;
        uint32_t qpn;
        union diwarp_gid gid;
        uint16_t port; /* the device's UDP port */
};

static void side_open(struct side *s)
{
        memset(s, 0, sizeof(*s));
        CHECK(diwarp_device_open(NULL, &s->dev));
        CHECK(diwarp_pd_alloc(s->dev, &s->pd));
        CHECK(diwarp_cq_create(s->dev, 4096, NULL, NULL, &s->cq));
        s->buf = aligned_alloc(4096, BUF_LEN);
        if (!s->buf)
                die("no memory");
        memset(s->buf, 0, BUF_LEN);
        int acc = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                  DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_ATOMIC;
        CHECK(diwarp_mr_reg(s->pd, s->buf, BUF_LEN, (uintptr_t)s->buf, acc, &s->mr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(s->mr, &mi));
        s->lkey = mi.lkey;
        s->rkey = mi.rkey;
        CHECK(diwarp_device_gid(s->dev, &s->gid));
        uint16_t inst;
        CHECK(diwarp_device_port(s->dev, &s->port, &inst));
}

/* An RD QP (or, rc, an RC QP) moved to INIT; with set_access its access
 * flags are `access`, without them the mask never names them. */
static struct diwarp_qp *qp_new(struct side *s, bool rc, bool set_access, int access,
                                struct diwarp_srq *srq)
{
        struct diwarp_qp_init_attr ia = {
            .send_cq = s->cq,
            .recv_cq = s->cq,
            .cap = {.max_send_wr = 256,
                    .max_recv_wr = 1024,
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = 64},
            .qp_type = DIWARP_QPT_RC,
            .srq = srq,
        };
        struct diwarp_qp *qp;
        if (rc)
                CHECK(diwarp_qp_create(s->pd, &ia, &qp));
        else
                CHECK(diwarpdv_create_qp(s->pd, &ia, &qp));
        struct diwarp_qp_attr a = {
            .qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .qp_access_flags = access, .port_num = 1};
        int mask = DIWARP_QP_STATE | (rc ? 0 : DIWARP_QP_QKEY);
        if (set_access)
                mask |= DIWARP_QP_ACCESS_FLAGS;
        CHECK(diwarp_qp_modify(qp, &a, mask));
        return qp;
}

/* RD: INIT -> RTR -> RTS. RC: IB-style connect to peer_qpn at peer_gid. */
static void qp_up(struct diwarp_qp *qp, bool rc, const union diwarp_gid *peer_gid,
                  uint32_t peer_qpn, uint32_t my_psn, uint32_t peer_psn)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTR};
        int mask = DIWARP_QP_STATE;
        if (rc) {
                a.dgid = *peer_gid;
                a.dest_qp_num = peer_qpn;
                a.rq_psn = peer_psn;
                a.max_dest_rd_atomic = 16;
                mask |= DIWARP_QP_AV | DIWARP_QP_DEST_QPN | DIWARP_QP_RQ_PSN |
                        DIWARP_QP_MAX_DEST_RD_ATOMIC;
        }
        CHECK(diwarp_qp_modify(qp, &a, mask));
        a.qp_state = DIWARP_QPS_RTS;
        a.sq_psn = my_psn;
        a.max_rd_atomic = 16;
        CHECK(diwarp_qp_modify(qp, &a,
                               DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_MAX_QP_RD_ATOMIC));
}

static void rd_pair(struct side *a, struct side *b, int a_access, bool a_set_access)
{
        side_open(a);
        side_open(b);
        a->qp = qp_new(a, false, a_set_access, a_access, NULL);
        b->qp =
            qp_new(b, false, true, DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ, NULL);
        a->qpn = diwarp_qp_num(a->qp);
        b->qpn = diwarp_qp_num(b->qp);
        qp_up(a->qp, false, NULL, 0, 0, 0);
        qp_up(b->qp, false, NULL, 0, 0, 0);
        CHECK(diwarp_ah_create(a->pd, &b->gid, &a->ah));
        CHECK(diwarp_ah_create(b->pd, &a->gid, &b->ah));
}

static void side_close(struct side *s)
{
        if (s->ah)
                CHECK(diwarp_ah_destroy(s->ah));
        if (s->qp)
                CHECK(diwarp_qp_destroy(s->qp));
        CHECK(diwarp_mr_dereg(s->mr));
        CHECK(diwarp_cq_destroy(s->cq));
        CHECK(diwarp_pd_dealloc(s->pd));
        CHECK(diwarp_device_close(s->dev));
        free(s->buf);
}

static void post_recv(struct side *s, struct diwarp_qp *qp, uint64_t id, uint64_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + off, len, s->lkey};
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        CHECK(diwarp_post_recv(qp, &wr, &bad));
}

/* A Send of len bytes at buf + off from a's QP to b's. */
static void rd_send(struct side *a, struct side *b, uint64_t id, uint64_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)a->buf + off, len, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarpdv_rd_dest d = {a->ah, b->qpn, QKEY};
        struct diwarp_send_wr *bad;
        CHECK(diwarpdv_post_send_rd(a->qp, &wr, &d, &bad));
}

/* Drives both devices until one completion arrives on s's CQ. */
static bool poll_one(struct side *s, struct side *other, struct diwarp_wc *wc, unsigned ms)
{
        uint64_t end = now_ms() + ms;
        while (now_ms() < end) {
                int n = diwarp_cq_poll(s->cq, 1, wc);
                if (n < 0)
                        die("cq_poll: %s", strerror(-n));
                if (n == 1)
                        return true;
                if (other)
                        diwarp_progress(other->dev, 64);
        }
        return false;
}

static void expect_wc(struct side *s, struct side *other, uint64_t id, enum diwarp_wc_status st,
                      const char *what)
{
        struct diwarp_wc wc;
        if (!poll_one(s, other, &wc, 5000))
                die("%s: no completion", what);
        if (wc.wr_id != id || wc.status != st)
                die("%s: wr_id %#llx status %s, want %#llx %s", what, (unsigned long long)wc.wr_id,
                    diwarp_wc_status_str(wc.status), (unsigned long long)id,
                    diwarp_wc_status_str(st));
}

/* The legitimate peer's traffic beside an attack: a Send from b to a's QP
 * completes at both ends with its bytes. */
static void legit_send(struct side *a, struct side *b, uint64_t id, const char *what)
{
        for (unsigned i = 0; i < 256; i++)
                b->buf[BUF_LEN / 2 + i] = (uint8_t)(id + i);
        post_recv(a, a->qp, id, BUF_LEN / 2, 4096);
        rd_send(b, a, id, BUF_LEN / 2, 256);
        expect_wc(a, b, id, DIWARP_WC_SUCCESS, what);
        expect_wc(b, a, id, DIWARP_WC_SUCCESS, what);
        if (memcmp(a->buf + BUF_LEN / 2, b->buf + BUF_LEN / 2, 256) != 0)
                die("%s: the Send's bytes differ", what);
}

static void counters(struct side *s, struct diwarp_counters *c)
{
        CHECK(diwarp_device_counters(s->dev, c));
}

/* ---------------------------------------------------------------- the stranger */

/* A plain UDP socket on 127.0.0.9 that speaks the datagram header to one
 * victim QP as a pseudo-stream of its own (source QPN src_qpn), which it
 * starts (X2-flag START) at a first PSN and MSN of its choosing. */
struct stranger {
        int fd;
        struct sockaddr_in to;
        uint32_t src_qpn, dst_qpn, qkey;
        uint32_t isn;  /* first PSN = first queue-0 MSN */
        uint32_t psn;  /* next PSN */
        uint32_t msn;  /* next queue-0 MSN */
        uint32_t rmsn; /* next queue-1 MSN */
};

/* The first PSN of the direction from QPN `from` to QPN `to` as it was
 * before RFC 6528's scheme: a public function of the two QPNs, which any
 * stranger computes (the isn case aims at it). */
static uint32_t public_isn(uint32_t from, uint32_t to)
{
        uint64_t k = ((uint64_t)from << 24 | to) * 0xff51afd7ed558ccdull;
        return (uint32_t)(k >> 29);
}

static int stranger_socket(const char *ip)
{
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET};
        inet_pton(AF_INET, ip, &sa.sin_addr);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                fprintf(stderr, "SKIP: cannot bind a UDP socket to %s: %s\n", ip, strerror(errno));
                exit(77);
        }
        return fd;
}

static void stranger_open(struct stranger *x, int fd, const struct side *victim, uint32_t dst_qpn,
                          uint32_t src_qpn)
{
        memset(x, 0, sizeof(*x));
        x->fd = fd;
        x->to.sin_family = AF_INET;
        x->to.sin_port = htons(victim->port);
        x->to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        x->src_qpn = src_qpn;
        x->dst_qpn = dst_qpn;
        x->qkey = QKEY;
        x->isn = 0x5eed0000u ^ src_qpn * 2654435761u;
        x->psn = x->isn;
        x->msn = x->isn;
        x->rmsn = 1;
}

/* Sends one DATA datagram of the stream: the DDP/RDMAP header r, then
 * `ext` (an RDMAP header of its own) and the payload. Takes the next PSN. */
static void stranger_data(struct stranger *x, const struct dw_rdmap_hdr *r, const void *ext,
                          size_t extlen, const void *pay, size_t plen)
{
        uint8_t pkt[4096];
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACKREQ,
                                 .xflags2 = DW_DGRAM_X2_START,
                                 .dst_qpn = x->dst_qpn,
                                 .src_qpn = x->src_qpn,
                                 .qkey = x->qkey,
                                 .psn = x->psn++,
                                 .start_psn = x->isn,
                                 .start_msn = x->isn};
        ssize_t n = dw_dgram_encode(&h, pkt, sizeof(pkt));
        if (n < 0)
                die("stranger: header: %s", strerror((int)-n));
        ssize_t k = dw_rdmap_encode(r, pkt + n, sizeof(pkt) - (size_t)n);
        if (k < 0)
                die("stranger: DDP header: %s", strerror((int)-k));
        n += k;
        if (n + extlen + plen + DW_DGRAM_CRC_LEN > sizeof(pkt))
                die("stranger: datagram too large");
        if (extlen)
                memcpy(pkt + n, ext, extlen);
        n += (ssize_t)extlen;
        if (plen)
                memcpy(pkt + n, pay, plen);
        n += (ssize_t)plen;
        n = dw_dgram_packet_seal(pkt, (size_t)n, sizeof(pkt));
        if (n < 0 ||
            sendto(x->fd, pkt, (size_t)n, 0, (struct sockaddr *)&x->to, sizeof(x->to)) != n)
                die("stranger: sendto: %s", strerror(errno));
}

static void stranger_write(struct stranger *x, uint32_t stag, uint64_t to, const void *pay,
                           size_t len)
{
        struct dw_rdmap_hdr r;
        dw_rdmap_hdr_init(&r, DW_RDMAP_WRITE);
        r.ddp.stag = stag;
        r.ddp.to = to;
        r.ddp.last = true;
        stranger_data(x, &r, NULL, 0, pay, len);
}

static void stranger_read(struct stranger *x, uint32_t stag, uint64_t to, uint32_t len)
{
        struct dw_rdmap_hdr r;
        dw_rdmap_hdr_init(&r, DW_RDMAP_READ_REQ);
        r.ddp.msn = x->rmsn;
        struct dw_rdmap_rreq rq = {.sink_stag = x->rmsn++,
                                   .sink_to = 0,
                                   .rdma_rd_sz = len,
                                   .src_stag = stag,
                                   .src_to = to};
        uint8_t ext[DW_RDMAP_RREQ_HDR_LEN];
        dw_rdmap_rreq_encode(&rq, ext, sizeof(ext));
        stranger_data(x, &r, ext, sizeof(ext), NULL, 0);
}

static void stranger_fetch_add(struct stranger *x, uint32_t stag, uint64_t to, uint64_t add)
{
        struct dw_rdmap_hdr r;
        dw_rdmap_hdr_init(&r, DW_RDMAP_ATOMIC_REQ);
        r.ddp.msn = x->rmsn;
        struct dw_rdmap_atomic_req ar = {.aopcode = DW_ATOMIC_FETCH_ADD,
                                         .req_id = x->rmsn++,
                                         .remote_stag = stag,
                                         .remote_to = to,
                                         .add_swap_data = add};
        uint8_t ext[DW_RDMAP_ATOMIC_REQ_HDR_LEN];
        dw_rdmap_atomic_req_encode(&ar, ext, sizeof(ext));
        stranger_data(x, &r, ext, sizeof(ext), NULL, 0);
}

/* A Send of len bytes with MSN msn (the stream's next one unless the caller
 * forges another). */
static void stranger_send(struct stranger *x, uint32_t msn, const void *pay, size_t len)
{
        struct dw_rdmap_hdr r;
        dw_rdmap_hdr_init(&r, DW_RDMAP_SEND);
        r.ddp.msn = msn;
        r.ddp.mo = 0;
        r.ddp.last = true;
        stranger_data(x, &r, NULL, 0, pay, len);
}

/* The next datagram the victim sends the stranger, decoded; false after
 * `ms` of silence (the victim's device is driven meanwhile). */
static bool stranger_recv(struct stranger *x, struct side *victim, struct dw_dgram_hdr *h,
                          unsigned ms)
{
        uint64_t end = now_ms() + ms;
        uint8_t pkt[65536];
        while (now_ms() < end) {
                diwarp_progress(victim->dev, 64);
                struct pollfd pfd = {.fd = x->fd, .events = POLLIN};
                if (poll(&pfd, 1, 1) != 1)
                        continue;
                ssize_t n = recv(x->fd, pkt, sizeof(pkt), 0);
                if (n < 0)
                        continue;
                const char *why = NULL;
                ssize_t body = dw_dgram_packet_body(pkt, (size_t)n, true, &why);
                if (body < 0 || dw_dgram_decode(pkt, (size_t)body, h, &why) < 0)
                        die("stranger: the victim sent a datagram we cannot decode: %s", why);
                return true;
        }
        return false;
}

/* Waits for the victim's NAK of `psn` with `code` (ACKs pass by). */
static void stranger_expect_nak(struct stranger *x, struct side *victim, uint32_t psn, uint8_t code,
                                const char *what)
{
        struct dw_dgram_hdr h;
        while (stranger_recv(x, victim, &h, 2000))
                if ((h.flags & DW_DGRAM_F_NAK) && h.ack_psn == psn) {
                        if (h.nak_code != code)
                                die("%s: NAK code %u, want %u", what, h.nak_code, code);
                        return;
                }
        die("%s: no NAK for PSN %#x", what, psn);
}

/* Drives the victim for ms, reading (and dropping) what it sends x. */
static void drive(struct side *victim, struct stranger *x, unsigned ms)
{
        struct dw_dgram_hdr h;
        uint64_t end = now_ms() + ms;
        while (now_ms() < end) {
                if (x)
                        (void)stranger_recv(x, victim, &h, 1);
                else
                        diwarp_progress(victim->dev, 64);
        }
}

/* ---------------------------------------------------------------- access */

static bool all_zero(const uint8_t *p, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (p[i])
                        return false;
        return true;
}

/* An RC QP over TCP whose access flags were never set: its peer's RDMA Write
 * fails with REM_ACCESS_ERR and writes nothing. */
static void access_rc(void)
{
        struct side a, b;
        side_open(&a);
        side_open(&b);
        a.qp = qp_new(&a, true, false, 0, NULL);
        b.qp = qp_new(&b, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        a.qpn = diwarp_qp_num(a.qp);
        b.qpn = diwarp_qp_num(b.qp);
        qp_up(a.qp, true, &b.gid, b.qpn, 100, 200);
        qp_up(b.qp, true, &a.gid, a.qpn, 200, 100);
        memset(b.buf, 0x5a, 4096);
        struct diwarp_sge sge = {(uintptr_t)b.buf, 4096, b.lkey};
        struct diwarp_send_wr wr = {.wr_id = 9,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)a.buf;
        wr.wr.rdma.rkey = a.rkey;
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(b.qp, &wr, &bad));
        struct diwarp_wc wc;
        if (!poll_one(&b, &a, &wc, 5000))
                die("RC Write into a QP without access flags: no completion");
        /* The responder refuses it with a Terminate: the requester's QP ends
         * in ERR (its WR reports REM_ACCESS_ERR, or success when it completed
         * as sent before the Terminate came back). */
        uint64_t end = now_ms() + 3000;
        while (diwarp_qp_state(b.qp) != DIWARP_QPS_ERR && now_ms() < end) {
                diwarp_progress(a.dev, 64);
                diwarp_progress(b.dev, 64);
        }
        if (!all_zero(a.buf, 4096))
                die("RC: a Write into a QP whose access flags were never set wrote its bytes");
        if (diwarp_qp_state(b.qp) != DIWARP_QPS_ERR ||
            (wc.status != DIWARP_WC_REM_ACCESS_ERR && wc.status != DIWARP_WC_SUCCESS))
                die("RC Write into a QP without access flags: status %s, requester QP state %d",
                    diwarp_wc_status_str(wc.status), diwarp_qp_state(b.qp));
        fprintf(stderr, "access rc ok: refused with a Terminate (%s), nothing written\n",
                diwarp_wc_status_str(wc.status));
        side_close(&a);
        side_close(&b);
}

static int case_access(void)
{
        struct side a, b;
        /* a's QP: INIT with its Q_Key only, never its access flags. */
        rd_pair(&a, &b, 0, false);
        int fd = stranger_socket("127.0.0.9");
        struct stranger x;
        stranger_open(&x, fd, &a, a.qpn, 0x0c0001);
        uint8_t pay[64];
        memset(pay, 0xee, sizeof(pay));
        uint32_t p0 = x.psn;
        stranger_write(&x, a.rkey, (uintptr_t)a.buf, pay, sizeof(pay));
        stranger_expect_nak(&x, &a, p0, DW_DGRAM_NAK_REM_ACCESS, "forged Write");
        stranger_read(&x, a.rkey, (uintptr_t)a.buf + 4096, 4096);
        stranger_expect_nak(&x, &a, p0 + 1, DW_DGRAM_NAK_REM_ACCESS, "forged Read");
        stranger_fetch_add(&x, a.rkey, (uintptr_t)a.buf + 8192, 5);
        stranger_expect_nak(&x, &a, p0 + 2, DW_DGRAM_NAK_REM_ACCESS, "forged Atomic");
        if (!all_zero(a.buf, BUF_LEN))
                die("access: the victim's memory changed");
        struct diwarp_counters c;
        counters(&a, &c);
        if (c.rx_dropped_protection < 3)
                die("access: rx_dropped_protection %llu, want >= 3",
                    (unsigned long long)c.rx_dropped_protection);
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_RTS)
                die("access: the victim QP left RTS");
        legit_send(&a, &b, 0x77, "access: legitimate Send");
        /* The same forged Write into a QP that grants REMOTE_WRITE lands: the
         * refusal above was the access flags'. */
        struct diwarp_qp *q2 = qp_new(&a, false, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        qp_up(q2, false, NULL, 0, 0, 0);
        struct stranger y;
        stranger_open(&y, fd, &a, diwarp_qp_num(q2), 0x0c0002);
        stranger_write(&y, a.rkey, (uintptr_t)a.buf, pay, sizeof(pay));
        struct dw_dgram_hdr h;
        uint64_t end = now_ms() + 3000;
        while (memcmp(a.buf, pay, sizeof(pay)) != 0 && now_ms() < end)
                (void)stranger_recv(&y, &a, &h, 10);
        if (memcmp(a.buf, pay, sizeof(pay)) != 0)
                die("access: a QP granting REMOTE_WRITE did not take the Write");
        CHECK(diwarp_qp_destroy(q2));
        fprintf(stderr, "access rd ok: Write, Read and Atomic refused, legitimate Send done\n");
        close(fd);
        side_close(&a);
        side_close(&b);
        access_rc();
        return 0;
}

/* ---------------------------------------------------------------- stag */

#define STAG_GUESSES 1024

static int case_stag(void)
{
        struct side a, b;
        rd_pair(&a, &b, DIWARP_ACCESS_REMOTE_WRITE, true);
        int fd = stranger_socket("127.0.0.9");
        uint8_t pay[64];
        memset(pay, 0xee, sizeof(pay));
        /* The first MR of the device: with STag = index << 8 | key, index 1,
         * so one of the first 256 guesses was it. */
        for (uint32_t g = 0; g < STAG_GUESSES; g++) {
                struct stranger x;
                stranger_open(&x, fd, &a, a.qpn, 0x0f0000 + g);
                uint32_t stag = (1 + g / 256) << 8 | (g % 256);
                stranger_write(&x, stag, (uintptr_t)a.buf, pay, sizeof(pay));
                if (g % 16 == 15)
                        drive(&a, NULL, 2);
        }
        drive(&a, NULL, 300);
        if (!all_zero(a.buf, BUF_LEN))
                die("stag: a guessed STag wrote into the victim's MR (its rkey is %#x)", a.rkey);
        struct diwarp_counters c;
        counters(&a, &c);
        if (c.rx_dropped_protection < STAG_GUESSES)
                die("stag: %llu of the %u guesses refused",
                    (unsigned long long)c.rx_dropped_protection, STAG_GUESSES);
        /* The legitimate peer's Write with the real rkey lands. */
        memset(b.buf, 0x3c, 4096);
        struct diwarp_sge sge = {(uintptr_t)b.buf, 4096, b.lkey};
        struct diwarp_send_wr wr = {.wr_id = 5,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)a.buf;
        wr.wr.rdma.rkey = a.rkey;
        struct diwarpdv_rd_dest d = {b.ah, a.qpn, QKEY};
        struct diwarp_send_wr *bad;
        CHECK(diwarpdv_post_send_rd(b.qp, &wr, &d, &bad));
        expect_wc(&b, &a, 5, DIWARP_WC_SUCCESS, "stag: legitimate Write");
        if (memcmp(a.buf, b.buf, 4096) != 0)
                die("stag: the legitimate Write's bytes are not there");
        legit_send(&a, &b, 0x7a, "stag: legitimate Send");
        fprintf(stderr, "stag ok: %u guesses refused (rkey %#x), the legitimate Write landed\n",
                STAG_GUESSES, a.rkey);
        close(fd);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- nord */

/* A device that never made an RD QP keeps no RD state (it is made with the
 * first RD QP), while a UD QP has it read its datagrams: RD datagrams from a
 * stranger, a Write and a bare ACK, are dropped and counted there, and the
 * device's first RD QP afterwards serves its peer. */
static int case_nord(void)
{
        struct side a, b;
        side_open(&a);
        side_open(&b);
        struct diwarp_qp_init_attr ia = {
            .send_cq = a.cq,
            .recv_cq = a.cq,
            .qp_type = DIWARP_QPT_UD,
            .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
        struct diwarp_qp *ud;
        CHECK(diwarp_qp_create(a.pd, &ia, &ud));
        struct diwarp_qp_attr ua = {.qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .port_num = 1};
        CHECK(diwarp_qp_modify(ud, &ua, DIWARP_QP_STATE | DIWARP_QP_QKEY | DIWARP_QP_PORT));
        ua.qp_state = DIWARP_QPS_RTR;
        CHECK(diwarp_qp_modify(ud, &ua, DIWARP_QP_STATE));
        ua.qp_state = DIWARP_QPS_RTS;
        CHECK(diwarp_qp_modify(ud, &ua, DIWARP_QP_STATE | DIWARP_QP_SQ_PSN));
        post_recv(&a, ud, 0x99, 0, 4096);
        int fd = stranger_socket("127.0.0.9");
        uint8_t pay[64];
        memset(pay, 0xee, sizeof(pay));
        struct stranger x;
        stranger_open(&x, fd, &a, 0x000102, 0x0f0001);
        stranger_write(&x, a.rkey, (uintptr_t)a.buf, pay, sizeof(pay));
        uint8_t pkt[256];
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK,
                                 .dst_qpn = 0x000102,
                                 .src_qpn = 0x0f0001,
                                 .qkey = QKEY,
                                 .ack_psn = x.isn + 1};
        ssize_t n = dw_dgram_encode(&h, pkt, sizeof(pkt));
        if (n < 0 || (n = dw_dgram_packet_seal(pkt, (size_t)n, sizeof(pkt))) < 0)
                die("nord: cannot build the ACK");
        if (sendto(fd, pkt, (size_t)n, 0, (struct sockaddr *)&x.to, sizeof(x.to)) != n)
                die("nord: sendto: %s", strerror(errno));
        drive(&a, NULL, 300);
        struct diwarp_counters c;
        counters(&a, &c);
        if (c.rx_dropped_no_qp < 2)
                die("nord: %llu of the 2 RD datagrams counted as for no QP",
                    (unsigned long long)c.rx_dropped_no_qp);
        if (!all_zero(a.buf, BUF_LEN))
                die("nord: the stranger's Write wrote into the victim's MR");
        a.qp = qp_new(&a, false, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        b.qp = qp_new(&b, false, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        a.qpn = diwarp_qp_num(a.qp);
        b.qpn = diwarp_qp_num(b.qp);
        qp_up(a.qp, false, NULL, 0, 0, 0);
        qp_up(b.qp, false, NULL, 0, 0, 0);
        CHECK(diwarp_ah_create(a.pd, &b.gid, &a.ah));
        CHECK(diwarp_ah_create(b.pd, &a.gid, &b.ah));
        legit_send(&a, &b, 0x51, "nord: the first RD QP's Send");
        fprintf(stderr,
                "nord ok: %llu RD datagrams to a device without RD dropped, then its "
                "first RD QP served its peer\n",
                (unsigned long long)c.rx_dropped_no_qp);
        close(fd);
        CHECK(diwarp_qp_destroy(ud));
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- nak */

/* A plain UDP socket where a device of instance `inst` on 127.0.0.1 would
 * be (the engine sends datagrams for QPN inst << 12 | 2 there): a peer that
 * never answers. The highest free instance, far from the tests' devices. */
static int silent_peer(uint32_t *qpn, uint16_t *port)
{
        const char *b = getenv("DIWARP_PORT_BASE");
        uint32_t base = b && *b ? (uint32_t)strtoul(b, NULL, 10) : 17471;
        for (uint32_t inst = 4000; inst > 2048; inst--) {
                if (base + inst > 65535)
                        continue;
                int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in sa = {.sin_family = AF_INET,
                                         .sin_port = htons((uint16_t)(base + inst)),
                                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
                        *qpn = inst << 12 | 2;
                        *port = (uint16_t)(base + inst);
                        return fd;
                }
                if (fd >= 0)
                        close(fd);
        }
        die("silent_peer: no free port");
        return -1;
}

/* An error NAK (REM_ACCESS) of psn for the stream victim QPN <- src_qpn,
 * sent by fd; origin != 0: with X-flag RAIL naming that origin. */
static void send_nak(int fd, const struct side *victim, uint32_t src_qpn, uint32_t psn,
                     uint32_t origin)
{
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_NAK,
                                 .nak_code = DW_DGRAM_NAK_REM_ACCESS,
                                 .dst_qpn = victim->qpn,
                                 .src_qpn = src_qpn,
                                 .ack_psn = psn};
        if (origin) {
                h.xflags = DW_DGRAM_X_RAIL;
                h.origin = origin;
        }
        uint8_t pkt[256];
        ssize_t n = dw_dgram_encode(&h, pkt, sizeof(pkt));
        if (n < 0)
                die("nak: encode: %s", strerror((int)-n));
        n = dw_dgram_packet_seal(pkt, (size_t)n, sizeof(pkt));
        struct sockaddr_in to = {.sin_family = AF_INET,
                                 .sin_port = htons(victim->port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (n < 0 || sendto(fd, pkt, (size_t)n, 0, (struct sockaddr *)&to, sizeof(to)) != n)
                die("nak: sendto: %s", strerror(errno));
}

static int case_nak(void)
{
        struct side a, b;
        rd_pair(&a, &b, 0, true);
        uint32_t rqpn;
        uint16_t rport;
        int rfd = silent_peer(&rqpn, &rport);
        /* a's Send to the silent peer: its PSN stays outstanding. */
        struct diwarp_ah *rah;
        union diwarp_gid lo = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
        CHECK(diwarp_ah_create(a.pd, &lo, &rah));
        struct diwarp_sge sge = {(uintptr_t)a.buf, 100, a.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarpdv_rd_dest d = {rah, rqpn, QKEY};
        struct diwarp_send_wr *bad;
        CHECK(diwarpdv_post_send_rd(a.qp, &wr, &d, &bad));
        uint8_t pkt[2048];
        struct pollfd pfd = {.fd = rfd, .events = POLLIN};
        uint64_t end = now_ms() + 3000;
        while (poll(&pfd, 1, 0) != 1 && now_ms() < end)
                diwarp_progress(a.dev, 64);
        ssize_t n = recv(rfd, pkt, sizeof(pkt), 0);
        struct dw_dgram_hdr h;
        const char *why = NULL;
        if (n <= 0 || dw_dgram_decode(pkt, (size_t)n - DW_DGRAM_CRC_LEN, &h, &why) < 0 ||
            !(h.flags & DW_DGRAM_F_DATA))
                die("nak: no Send from the victim at the silent peer");
        uint32_t psn = h.psn;
        /* The stranger, on 127.0.0.9 at the silent peer's port, names the
         * peer's stream by its origin. */
        int xfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in xa = {.sin_family = AF_INET, .sin_port = htons(rport)};
        inet_pton(AF_INET, "127.0.0.9", &xa.sin_addr);
        if (xfd < 0 || bind(xfd, (struct sockaddr *)&xa, sizeof(xa)) < 0) {
                fprintf(stderr, "SKIP: cannot bind 127.0.0.9:%u: %s\n", rport, strerror(errno));
                return 77;
        }
        send_nak(xfd, &a, rqpn, psn, htonl(INADDR_LOOPBACK));
        drive(&a, NULL, 100);
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_RTS)
                die("nak: a NAK from 127.0.0.9 with a forged origin moved the QP to state %d",
                    diwarp_qp_state(a.qp));
        /* From the peer's address, but for a PSN never sent. */
        send_nak(rfd, &a, rqpn, psn + 7, 0);
        drive(&a, NULL, 100);
        if (diwarp_qp_state(a.qp) != DIWARP_QPS_RTS)
                die("nak: a NAK for a PSN not outstanding moved the QP to state %d",
                    diwarp_qp_state(a.qp));
        struct diwarp_wc wc;
        if (diwarp_cq_poll(a.cq, 1, &wc) != 0)
                die("nak: the Send to the silent peer completed (%s)",
                    diwarp_wc_status_str(wc.status));
        legit_send(&a, &b, 0x79, "nak: legitimate Send beside the forged NAKs");
        struct diwarp_counters c;
        counters(&a, &c);
        /* The forged origin is refused before the NAK is looked at. */
        if (c.rx_dropped_nak != 1 || c.rx_dropped_rail != 1)
                die("nak: rx_dropped_nak %llu, rx_dropped_rail %llu, want 1 each",
                    (unsigned long long)c.rx_dropped_nak, (unsigned long long)c.rx_dropped_rail);
        /* The peer's own NAK of the PSN in flight still ends the WR. */
        send_nak(rfd, &a, rqpn, psn, 0);
        expect_wc(&a, NULL, 1, DIWARP_WC_REM_ACCESS_ERR, "nak: the peer's real NAK");
        fprintf(stderr, "nak ok: 2 forged NAKs dropped, the real one fails the WR\n");
        close(xfd);
        close(rfd);
        CHECK(diwarp_ah_destroy(rah));
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- isn */

/* The first datagram a's QP sends to a silent peer after a Send is posted:
 * its header, and its DDP MSN. */
static void first_send(struct side *a, struct diwarp_qp *qp, int rfd, uint32_t rqpn,
                       struct dw_dgram_hdr *h, uint32_t *msn)
{
        struct diwarp_ah *rah;
        union diwarp_gid lo = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
        CHECK(diwarp_ah_create(a->pd, &lo, &rah));
        struct diwarp_sge sge = {(uintptr_t)a->buf, 100, a->lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarpdv_rd_dest d = {rah, rqpn, QKEY};
        struct diwarp_send_wr *bad;
        CHECK(diwarpdv_post_send_rd(qp, &wr, &d, &bad));
        uint8_t pkt[2048];
        struct pollfd pfd = {.fd = rfd, .events = POLLIN};
        uint64_t end = now_ms() + 3000;
        while (poll(&pfd, 1, 0) != 1 && now_ms() < end)
                diwarp_progress(a->dev, 64);
        ssize_t n = recv(rfd, pkt, sizeof(pkt), 0);
        const char *why = NULL;
        ssize_t body = n > 0 ? dw_dgram_packet_body(pkt, (size_t)n, true, &why) : -1;
        ssize_t hl = body > 0 ? dw_dgram_decode(pkt, (size_t)body, h, &why) : -1;
        struct dw_rdmap_hdr r;
        if (hl < 0 || !(h->flags & DW_DGRAM_F_DATA) ||
            dw_rdmap_decode(pkt + hl, (size_t)(body - hl), &r, &why) < 0 ||
            r.opcode != DW_RDMAP_SEND)
                die("isn: no Send from the victim at the silent peer (%s)", why ? why : "");
        *msn = r.ddp.msn;
        CHECK(diwarp_ah_destroy(rah));
}

static void reset_up(struct diwarp_qp *qp)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RESET};
        CHECK(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE));
        a = (struct diwarp_qp_attr){.qp_state = DIWARP_QPS_INIT, .qkey = QKEY, .port_num = 1};
        CHECK(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_QKEY));
        qp_up(qp, false, NULL, 0, 0, 0);
}

/* What a stranger reads of the first Send of a stream: nothing it could
 * have computed. */
static void isn_wire(void)
{
        uint32_t rqpn;
        uint16_t rport;
        int rfd = silent_peer(&rqpn, &rport);
        uint32_t seen[3];
        struct side a;
        for (int round = 0; round < 3; round++) {
                if (round != 1) {
                        side_open(&a);
                        a.qp = qp_new(&a, false, true, 0, NULL);
                        a.qpn = diwarp_qp_num(a.qp);
                        qp_up(a.qp, false, NULL, 0, 0, 0);
                } else {
                        reset_up(a.qp); /* round 1: the same QP, reset */
                }
                struct dw_dgram_hdr h;
                uint32_t msn;
                first_send(&a, a.qp, rfd, rqpn, &h, &msn);
                if (!(h.xflags2 & DW_DGRAM_X2_START) || h.start_psn != h.psn || h.start_msn != msn)
                        die("isn: the first Send (PSN %#x, MSN %#x) does not carry its START "
                            "descriptor (X2-flags %#x, first PSN %#x, first MSN %#x)",
                            h.psn, msn, h.xflags2, h.start_psn, h.start_msn);
                if (h.psn == public_isn(a.qpn, rqpn) || msn == 1)
                        die("isn: the stream starts where anyone can compute it (PSN %#x, MSN "
                            "%u)",
                            h.psn, msn);
                seen[round] = h.psn;
                fprintf(stderr, "isn wire round %d: QPN %#x first PSN %#x MSN %#x\n", round, a.qpn,
                        h.psn, msn);
                if (round != 0) {
                        side_close(&a);
                }
        }
        if (seen[0] == seen[1] || seen[0] == seen[2] || seen[1] == seen[2])
                die("isn: a stream of the same QPs started at the same PSN again (%#x %#x %#x)",
                    seen[0], seen[1], seen[2]);
        close(rfd);
}

static int case_isn(void)
{
        isn_wire();
        /* b, pinned to 127.0.0.1 so that 127.0.0.9 can take its port too,
         * sends to a. */
        struct side a, b;
        side_open(&a);
        setenv("DIWARP_ADDR", "127.0.0.1", 1);
        side_open(&b);
        unsetenv("DIWARP_ADDR");
        a.qp = qp_new(&a, false, true, 0, NULL);
        b.qp = qp_new(&b, false, true, 0, NULL);
        a.qpn = diwarp_qp_num(a.qp);
        b.qpn = diwarp_qp_num(b.qp);
        qp_up(a.qp, false, NULL, 0, 0, 0);
        qp_up(b.qp, false, NULL, 0, 0, 0);
        union diwarp_gid lo = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
        CHECK(diwarp_ah_create(b.pd, &lo, &b.ah));
        for (unsigned i = 0; i < 4; i++)
                post_recv(&a, a.qp, 0x100 + i, i * 4096u, 4096);
        memset(b.buf, 0x11, 256);
        rd_send(&b, &a, 1, 0, 256);
        expect_wc(&a, &b, 0x100, DIWARP_WC_SUCCESS, "isn: the peer's first Send");
        expect_wc(&b, &a, 1, DIWARP_WC_SUCCESS, "isn: the peer's first Send");
        /* The stranger names b's stream by its origin and aims at the
         * window the public function gives: the next PSN after the first
         * is there, with the next MSN after 1. */
        int xfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in xa = {.sin_family = AF_INET, .sin_port = htons(b.port)};
        inet_pton(AF_INET, "127.0.0.9", &xa.sin_addr);
        if (xfd < 0 || bind(xfd, (struct sockaddr *)&xa, sizeof(xa)) < 0) {
                fprintf(stderr, "SKIP: cannot bind 127.0.0.9:%u: %s\n", b.port, strerror(errno));
                return 77;
        }
        uint32_t guess = public_isn(b.qpn, a.qpn);
        uint8_t pay[256];
        memset(pay, 0xee, sizeof(pay));
        for (uint32_t k = 0; k < 128; k++) {
                uint8_t pkt[1024];
                struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                         .xflags = DW_DGRAM_X_RAIL,
                                         .dst_qpn = a.qpn,
                                         .src_qpn = b.qpn,
                                         .qkey = QKEY,
                                         .psn = guess + k,
                                         .origin = htonl(INADDR_LOOPBACK)};
                ssize_t n = dw_dgram_encode(&h, pkt, sizeof(pkt));
                struct dw_rdmap_hdr r;
                dw_rdmap_hdr_init(&r, DW_RDMAP_SEND);
                r.ddp.msn = 2;
                r.ddp.last = true;
                n += dw_rdmap_encode(&r, pkt + n, sizeof(pkt) - (size_t)n);
                memcpy(pkt + n, pay, sizeof(pay));
                n = dw_dgram_packet_seal(pkt, (size_t)n + sizeof(pay), sizeof(pkt));
                struct sockaddr_in to = {.sin_family = AF_INET,
                                         .sin_port = htons(a.port),
                                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                if (n < 0 ||
                    sendto(xfd, pkt, (size_t)n, 0, (struct sockaddr *)&to, sizeof(to)) != n)
                        die("isn: sendto: %s", strerror(errno));
                if (k % 16 == 15)
                        drive(&a, NULL, 2);
        }
        drive(&a, NULL, 200);
        struct diwarp_wc wc;
        if (diwarp_cq_poll(a.cq, 1, &wc) != 0)
                die("isn: a forged Send was delivered into the peer's stream (wr_id %#llx, byte "
                    "%#x)",
                    (unsigned long long)wc.wr_id, a.buf[4096]);
        memset(b.buf, 0x22, 256);
        rd_send(&b, &a, 2, 0, 256);
        expect_wc(&a, &b, 0x101, DIWARP_WC_SUCCESS, "isn: the peer's second Send");
        expect_wc(&b, &a, 2, DIWARP_WC_SUCCESS, "isn: the peer's second Send");
        if (a.buf[0] != 0x11 || a.buf[4096] != 0x22 || a.buf[4096 + 255] != 0x22)
                die("isn: the receives hold %#x and %#x, want the peer's 0x11 and 0x22", a.buf[0],
                    a.buf[4096]);
        fprintf(stderr, "isn ok: 128 Sends at the public window refused, the peer's two Sends "
                        "delivered\n");
        close(xfd);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- window */

#define WIN_RECVS 100

static int case_window(bool srq)
{
        struct side a, b;
        side_open(&a);
        side_open(&b);
        struct diwarp_srq *q = NULL;
        if (srq) {
                struct diwarp_srq_attr sa = {.max_wr = 1024, .max_sge = 1};
                CHECK(diwarp_srq_create(a.pd, &sa, NULL, &q));
        }
        a.qp = qp_new(&a, false, true, 0, q);
        b.qp = qp_new(&b, false, true, 0, NULL);
        a.qpn = diwarp_qp_num(a.qp);
        b.qpn = diwarp_qp_num(b.qp);
        qp_up(a.qp, false, NULL, 0, 0, 0);
        qp_up(b.qp, false, NULL, 0, 0, 0);
        CHECK(diwarp_ah_create(a.pd, &b.gid, &a.ah));
        CHECK(diwarp_ah_create(b.pd, &a.gid, &b.ah));
        for (unsigned i = 0; i < WIN_RECVS; i++) {
                struct diwarp_sge sge = {(uintptr_t)a.buf + i * 256u, 256, a.lkey};
                struct diwarp_recv_wr wr = {.wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1};
                struct diwarp_recv_wr *bad;
                if (q)
                        CHECK(diwarp_post_srq_recv(q, &wr, &bad));
                else
                        CHECK(diwarp_post_recv(a.qp, &wr, &bad));
        }
        int fd = stranger_socket("127.0.0.9");
        struct stranger x;
        stranger_open(&x, fd, &a, a.qpn, 0x0e0001);
        uint8_t pay[64];
        memset(pay, 0xee, sizeof(pay));
        /* MSN 90 ahead of the stream's next: before, it bound 91 receive WRs
         * at once, 90 of them to messages that never come. */
        stranger_send(&x, x.msn + 90, pay, sizeof(pay));
        drive(&a, &x, 200);
        struct diwarp_wc wc;
        if (diwarp_cq_poll(a.cq, 1, &wc) != 0)
                die("window: a receive completed after the forged Send (wr_id %#llx)",
                    (unsigned long long)wc.wr_id);
        /* The legitimate peer's 100 Sends take the 100 WRs, in order. */
        for (unsigned i = 0; i < WIN_RECVS; i++) {
                for (unsigned k = 0; k < 64; k++)
                        b.buf[i * 64u + k] = (uint8_t)(i * 3 + k);
                rd_send(&b, &a, 2000 + i, i * 64u, 64);
        }
        for (unsigned i = 0; i < WIN_RECVS; i++) {
                if (!poll_one(&a, &b, &wc, 5000))
                        die("window: receive %u of the legitimate peer's %u never completed "
                            "(WRs bound to the forged stream?)",
                            i, WIN_RECVS);
                if (wc.status != DIWARP_WC_SUCCESS || wc.wr_id != 1000 + i || wc.byte_len != 64 ||
                    wc.src_qp != b.qpn)
                        die("window: receive %u: wr_id %#llx status %s byte_len %u src %#x", i,
                            (unsigned long long)wc.wr_id, diwarp_wc_status_str(wc.status),
                            wc.byte_len, wc.src_qp);
                if (memcmp(a.buf + i * 256u, b.buf + i * 64u, 64) != 0)
                        die("window: receive %u: bytes differ", i);
        }
        for (unsigned i = 0; i < WIN_RECVS; i++)
                expect_wc(&b, &a, 2000 + i, DIWARP_WC_SUCCESS, "window: legitimate Send");
        struct diwarp_counters c;
        counters(&a, &c);
        if (c.rx_dropped_msn < 1)
                die("window: rx_dropped_msn %llu, want >= 1", (unsigned long long)c.rx_dropped_msn);
        fprintf(stderr, "window%s ok: the forged Send dropped (%llu), %u legitimate Sends landed\n",
                srq ? " srq" : "", (unsigned long long)c.rx_dropped_msn, WIN_RECVS);
        close(fd);
        CHECK(diwarp_ah_destroy(a.ah));
        a.ah = NULL;
        CHECK(diwarp_qp_destroy(a.qp));
        a.qp = NULL;
        if (q)
                CHECK(diwarp_srq_destroy(q));
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- log */

/* Runs fn with stderr going to a file; returns the lines it wrote there
 * that contain `needle` (and, in *other, those with `needle2`). */
static unsigned count_lines(const char *path, const char *needle, const char *needle2,
                            unsigned *other)
{
        FILE *f = fopen(path, "r");
        if (!f)
                die("log: %s: %s", path, strerror(errno));
        char line[2048];
        unsigned n = 0;
        *other = 0;
        while (fgets(line, sizeof(line), f)) {
                if (strstr(line, needle))
                        n++;
                if (needle2 && strstr(line, needle2))
                        (*other)++;
        }
        fclose(f);
        return n;
}

/* The process's stderr (the engine's log lines) goes to a fresh file until
 * capture_end, which returns its path in path. */
struct capture {
        char path[64];
        int fd, saved;
};

static void capture_begin(struct capture *c)
{
        snprintf(c->path, sizeof(c->path), "/tmp/diwarp-security-log-XXXXXX");
        c->fd = mkstemp(c->path);
        if (c->fd < 0)
                die("log: mkstemp: %s", strerror(errno));
        fflush(stderr);
        c->saved = dup(STDERR_FILENO);
        dup2(c->fd, STDERR_FILENO);
}

static void capture_end(struct capture *c)
{
        fflush(stderr);
        dup2(c->saved, STDERR_FILENO);
        close(c->saved);
        close(c->fd);
}

#define LOG_FLOOD 300

static int case_log(void)
{
        struct side a, b;
        rd_pair(&a, &b, DIWARP_ACCESS_REMOTE_WRITE, true);
        int fd = stranger_socket("127.0.0.9");
        struct capture cap;
        capture_begin(&cap);
        /* Each forged Write opens a stream of its own (a refused PSN is never
         * accepted, so one stream would stop after its window), with an STag
         * no region has. */
        uint8_t pay[32] = {1};
        for (unsigned i = 0; i < LOG_FLOOD; i++) {
                struct stranger x;
                stranger_open(&x, fd, &a, a.qpn, 0x0d0000 + i);
                stranger_write(&x, 0xdead0000u + i, 0x1000, pay, sizeof(pay));
                if (i % 16 == 15)
                        drive(&a, NULL, 2);
        }
        drive(&a, NULL, 200);
        legit_send(&a, &b, 0x78, "log: legitimate Send during the flood");
        /* A period later, one more refused Write: its line comes after the
         * count of those held back. */
        drive(&a, NULL, 5200);
        struct stranger x;
        stranger_open(&x, fd, &a, a.qpn, 0x0d0000 + LOG_FLOOD);
        stranger_write(&x, 0xdeadffffu, 0x1000, pay, sizeof(pay));
        drive(&a, NULL, 200);
        capture_end(&cap);
        unsigned sup;
        unsigned lines =
            count_lines(cap.path, "RDMA Write to STag", "similar lines suppressed", &sup);
        unlink(cap.path);
        struct diwarp_counters c;
        counters(&a, &c);
        if (c.rx_dropped_protection < LOG_FLOOD)
                die("log: only %llu of the %u forged Writes were refused",
                    (unsigned long long)c.rx_dropped_protection, LOG_FLOOD);
        if (lines > 11)
                die("log: %u warning lines for %u refused Writes (want at most the burst, 10, "
                    "and the one after the period)",
                    lines, LOG_FLOOD + 1);
        if (sup != 1)
                die("log: %u lines counting suppressed warnings, want 1", sup);
        fprintf(stderr, "log ok: %u refused Writes, %u warning lines, %u count line\n",
                LOG_FLOOD + 1, lines, sup);
        close(fd);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- forged datagrams, any header */

/* One datagram with header h (DATA: then the Write of len bytes of pay at
 * stag:to), sealed with its CRC into pkt; returns its length. */
static size_t forge(uint8_t *pkt, size_t cap, struct dw_dgram_hdr *h, uint32_t stag, uint64_t to,
                    const void *pay, size_t len)
{
        ssize_t n = dw_dgram_encode(h, pkt, cap);
        if (n < 0)
                die("forge: header: %s", strerror((int)-n));
        if (h->flags & DW_DGRAM_F_DATA) {
                struct dw_rdmap_hdr r;
                dw_rdmap_hdr_init(&r, DW_RDMAP_WRITE);
                r.ddp.stag = stag;
                r.ddp.to = to;
                r.ddp.last = true;
                ssize_t k = dw_rdmap_encode(&r, pkt + n, cap - (size_t)n);
                if (k < 0 || (size_t)(n + k) + len + DW_DGRAM_CRC_LEN > cap)
                        die("forge: DDP header or payload does not fit");
                n += k;
                if (len)
                        memcpy(pkt + n, pay, len);
                n += (ssize_t)len;
        }
        n = dw_dgram_packet_seal(pkt, (size_t)n, cap);
        if (n < 0)
                die("forge: seal");
        return (size_t)n;
}

static void send_to(int fd, const uint8_t *pkt, size_t n, uint16_t port)
{
        struct sockaddr_in to = {.sin_family = AF_INET,
                                 .sin_port = htons(port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (sendto(fd, pkt, n, 0, (struct sockaddr *)&to, sizeof(to)) != (ssize_t)n)
                die("sendto: %s", strerror(errno));
}

/* A datagram whose IPv4 source is src:sport (a spoofed address, a raw
 * socket: root or CAP_NET_RAW), to dst:dport. -EPERM when raw sockets are
 * not allowed. */
static int spoof_to(const char *src, const char *dst, uint16_t sport, uint16_t dport,
                    const uint8_t *pay, size_t n)
{
        int fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
        if (fd < 0)
                return -errno;
        uint8_t pkt[2048];
        if (n + 28 > sizeof(pkt))
                die("spoof: datagram too large");
        memset(pkt, 0, 28);
        pkt[0] = 0x45;
        pkt[2] = (uint8_t)((n + 28) >> 8);
        pkt[3] = (uint8_t)(n + 28);
        pkt[8] = 64;
        pkt[9] = IPPROTO_UDP;
        inet_pton(AF_INET, src, pkt + 12);
        inet_pton(AF_INET, dst, pkt + 16);
        uint32_t sum = 0;
        for (int i = 0; i < 20; i += 2)
                sum += (uint32_t)(pkt[i] << 8 | pkt[i + 1]);
        while (sum >> 16)
                sum = (sum & 0xffff) + (sum >> 16);
        pkt[10] = (uint8_t)(~sum >> 8);
        pkt[11] = (uint8_t)~sum;
        pkt[20] = (uint8_t)(sport >> 8);
        pkt[21] = (uint8_t)sport;
        pkt[22] = (uint8_t)(dport >> 8);
        pkt[23] = (uint8_t)dport;
        pkt[24] = (uint8_t)((n + 8) >> 8);
        pkt[25] = (uint8_t)(n + 8); /* UDP checksum 0: none (IPv4) */
        memcpy(pkt + 28, pay, n);
        struct sockaddr_in to = {.sin_family = AF_INET};
        inet_pton(AF_INET, dst, &to.sin_addr);
        ssize_t r = sendto(fd, pkt, n + 28, 0, (struct sockaddr *)&to, sizeof(to));
        int e = r < 0 ? -errno : 0;
        close(fd);
        return e;
}

static uint32_t ip_of(const char *s)
{
        struct in_addr a;
        inet_pton(AF_INET, s, &a);
        return a.s_addr;
}

/* ---------------------------------------------------------------- rcrd */

struct acc_arg {
        struct diwarp_listener *l;
        struct diwarp_qp *qp;
        int result;
};

/* The responder: takes one request with a->qp; one it cannot accept is
 * rejected, as an application would, so the initiator learns at once. */
static void *acc_main(void *v)
{
        struct acc_arg *a = v;
        struct diwarp_conn_request req;
        a->result = diwarp_listener_get_request(a->l, 5000, &req);
        if (a->result == 0) {
                a->result = diwarp_accept(a->l, req.id, a->qp, NULL);
                if (a->result < 0)
                        diwarp_reject(a->l, req.id, NULL, 0);
        }
        return NULL;
}

/* RC over RD (DIWARP_RC_TRANSPORT=rd): p's RC QP connects natively to v's
 * (its MPA exchange gives each end the other's token). Returns
 * diwarp_connect's result; *accepted is diwarp_accept's; *l the listener. */
static int rcrd_connect(struct side *v, struct side *p, struct diwarp_listener **l, int *accepted)
{
        struct acc_arg aa = {.qp = v->qp};
        CHECK(diwarp_listen(v->dev, 0, 4, &aa.l));
        struct sockaddr_in la;
        socklen_t ll = sizeof(la);
        if (getsockname(diwarp_listener_fd(aa.l), (struct sockaddr *)&la, &ll) < 0)
                die("rcrd: getsockname: %s", strerror(errno));
        pthread_t th;
        pthread_create(&th, NULL, acc_main, &aa);
        struct diwarp_conn_param cp = {.ird = 4, .ord = 4};
        int r = diwarp_connect(p->qp, &v->gid, ntohs(la.sin_port), &cp, 5000, NULL, NULL);
        pthread_join(th, NULL);
        *accepted = aa.result;
        *l = aa.l;
        return r;
}

/* Two sides with an RC QP each (REMOTE_WRITE), p connected to v over RD. */
static void rcrd_pair(struct side *v, struct side *p, struct diwarp_listener **l)
{
        side_open(v);
        side_open(p);
        v->qp = qp_new(v, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        p->qp = qp_new(p, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        v->qpn = diwarp_qp_num(v->qp);
        p->qpn = diwarp_qp_num(p->qp);
        int acc;
        CHECK(rcrd_connect(v, p, l, &acc));
        CHECK(acc);
}

/* b's RC QP Writes len bytes of b's buffer at off to a's at off. */
static void rc_write(struct side *b, struct side *a, uint64_t id, uint64_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)b->buf + off, len, b->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .wr.rdma = {(uintptr_t)a->buf + off, a->rkey}};
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(b->qp, &wr, &bad));
        expect_wc(b, a, id, DIWARP_WC_SUCCESS, "rcrd: a Write of the connection");
        if (memcmp(a->buf + off, b->buf + off, len) != 0)
                die("rcrd: the Write's bytes did not land");
}

/* An RC QP carried by RD (DIWARP_RC_TRANSPORT=rd), connected through the
 * native CM (its MPA exchange gives each end the other's token), that has
 * carried a Write. The stranger then forges the peer's next Write (the
 * right QPNs and PSN, the victim's real rkey): from 127.0.0.9 naming the
 * peer by origin (X-flag RAIL), without a token and with a wrong one, with a
 * forged rail list beside; and, with a raw socket, from the peer's own
 * address and port. None lands; each is counted in rx_dropped_token; the
 * peer's next Write lands. */
static int case_rcrd(void)
{
        struct side v, p;
        struct diwarp_listener *l;
        rcrd_pair(&v, &p, &l);
        struct diwarp_qp_attr pa;
        struct diwarp_qp_init_attr pia;
        CHECK(diwarp_qp_query(p.qp, &pa, &pia));
        memcpy(p.buf, "legitimate 1", 12);
        rc_write(&p, &v, 1, 0, 12);
        /* The peer's next PSN: its first plus the one Write; its address
         * as the victim knows it (its GID: the host's first address). */
        uint32_t psn = pa.sq_psn + 1;
        uint32_t pip;
        memcpy(&pip, p.gid.raw + 12, 4);
        char pips[INET_ADDRSTRLEN], vips[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &pip, pips, sizeof(pips));
        inet_ntop(AF_INET, v.gid.raw + 12, vips, sizeof(vips));
        int xfd = stranger_socket("127.0.0.9");
        static const char owned[] = "OWNED-by-a-stranger";
        uint8_t pkt[512];
        unsigned sent = 0;
        for (int k = 0; k < 3; k++) {
                struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                         .xflags = DW_DGRAM_X_RAIL,
                                         .dst_qpn = v.qpn,
                                         .src_qpn = p.qpn,
                                         .psn = psn,
                                         .origin = pip};
                if (k >= 1) {
                        h.xflags2 = DW_DGRAM_X2_TOKEN;
                        h.token = 0x0123456789abcdefull + (uint64_t)k;
                }
                if (k == 2) {
                        h.xflags |= DW_DGRAM_X_RAILS;
                        h.rail_count = 2;
                        h.rails[0] = pip;
                        h.rails[1] = ip_of("127.0.0.9");
                }
                size_t n = forge(pkt, sizeof(pkt), &h, v.rkey, (uintptr_t)v.buf + 64, owned,
                                 sizeof(owned));
                send_to(xfd, pkt, n, v.port);
                sent++;
        }
        bool spoofed = false;
        for (int k = 0; k < 2; k++) {
                struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                         .dst_qpn = v.qpn,
                                         .src_qpn = p.qpn,
                                         .psn = psn};
                if (k) {
                        h.xflags2 = DW_DGRAM_X2_TOKEN;
                        h.token = 0xfeedfacecafebeefull;
                }
                size_t n = forge(pkt, sizeof(pkt), &h, v.rkey, (uintptr_t)v.buf + 64, owned,
                                 sizeof(owned));
                int e = spoof_to(pips, vips, p.port, v.port, pkt, n);
                if (e == -EPERM || e == -EACCES) {
                        fprintf(stderr, "rcrd: no raw socket (%s): the spoofed cases are skipped\n",
                                strerror(-e));
                        break;
                }
                if (e < 0)
                        die("rcrd: spoofed send: %s", strerror(-e));
                sent++;
                spoofed = true;
        }
        drive(&v, NULL, 200);
        if (memcmp(v.buf + 64, owned, 5) == 0)
                die("rcrd: a forged Write landed in the connection's memory");
        if (diwarp_qp_state(v.qp) != DIWARP_QPS_RTS)
                die("rcrd: the forged datagrams moved the QP to state %d", diwarp_qp_state(v.qp));
        struct diwarp_counters c;
        counters(&v, &c);
        if (c.rx_dropped_token != sent)
                die("rcrd: rx_dropped_token %llu, want %u", (unsigned long long)c.rx_dropped_token,
                    sent);
        /* The peer's own next Write (the PSN the forgeries named) lands. */
        memcpy(p.buf + 64, "legitimate 2", 12);
        rc_write(&p, &v, 2, 64, 12);
        memcpy(v.buf + 128, "answer", 6);
        rc_write(&v, &p, 3, 128, 6);
        fprintf(stderr, "rcrd ok: %u forged Writes (%s) dropped for want of the token\n", sent,
                spoofed ? "3 from 127.0.0.9, 2 from the peer's own address"
                        : "from 127.0.0.9; raw sockets not allowed");
        close(xfd);
        CHECK(diwarp_disconnect(p.qp));
        CHECK(diwarp_listener_destroy(l));
        side_close(&p);
        side_close(&v);
        return 0;
}

/* ---------------------------------------------------------------- rails */

/* A multirail victim (DIWARP_ADDR=127.0.0.1,127.0.0.2) and a peer on
 * 127.0.0.1 exchange RD traffic. The stranger forges (1) from 127.0.0.9 a
 * Write naming the peer by origin (X-flag RAIL) with the rail list [peer,
 * 127.0.0.9], and, with a raw socket, from the peer's own address and port,
 * (2) that rail list with a wrong token and (3) without one. The Write does
 * not land, no list is taken (the victim's 1 MiB Write to the peer then
 * sends nothing to 127.0.0.9 and nothing by its rail 1), the forged origin
 * and the wrong token are counted in rx_dropped_rail. */
static int case_rails(void)
{
        struct side v, p;
        setenv("DIWARP_ADDR", "127.0.0.1,127.0.0.2", 1);
        side_open(&v);
        setenv("DIWARP_ADDR", "127.0.0.1", 1);
        side_open(&p);
        unsetenv("DIWARP_ADDR");
        int acc = DIWARP_ACCESS_REMOTE_WRITE;
        v.qp = qp_new(&v, false, true, acc, NULL);
        p.qp = qp_new(&p, false, true, acc, NULL);
        v.qpn = diwarp_qp_num(v.qp);
        p.qpn = diwarp_qp_num(p.qp);
        qp_up(v.qp, false, NULL, 0, 0, 0);
        qp_up(p.qp, false, NULL, 0, 0, 0);
        CHECK(diwarp_ah_create(v.pd, &p.gid, &v.ah));
        CHECK(diwarp_ah_create(p.pd, &v.gid, &p.ah));
        legit_send(&v, &p, 0x51, "rails: legitimate Send before");
        legit_send(&p, &v, 0x52, "rails: legitimate Send back");
        /* What reaches 127.0.0.9 at the peer's port: where a forged list
         * would send the victim's striped segments. */
        int xfd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in xa = {.sin_family = AF_INET, .sin_port = htons(p.port)};
        inet_pton(AF_INET, "127.0.0.9", &xa.sin_addr);
        if (xfd < 0 || bind(xfd, (struct sockaddr *)&xa, sizeof(xa)) < 0) {
                fprintf(stderr, "SKIP: cannot bind 127.0.0.9:%u: %s\n", p.port, strerror(errno));
                return 77;
        }
        static const char owned[] = "OWNED-by-a-stranger";
        uint8_t pkt[512];
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                 .xflags = DW_DGRAM_X_RAIL | DW_DGRAM_X_RAILS,
                                 .xflags2 = DW_DGRAM_X2_START,
                                 .dst_qpn = v.qpn,
                                 .src_qpn = p.qpn,
                                 .qkey = QKEY,
                                 .psn = 0x1000,
                                 .rail_count = 2,
                                 .rails = {htonl(INADDR_LOOPBACK), ip_of("127.0.0.9")},
                                 .origin = htonl(INADDR_LOOPBACK),
                                 .start_psn = 0x1000,
                                 .start_msn = 0x1000};
        size_t n = forge(pkt, sizeof(pkt), &h, v.rkey, (uintptr_t)v.buf + 64, owned, sizeof(owned));
        send_to(xfd, pkt, n, v.port);
        unsigned want = 1;
        bool spoofed = false;
        for (int k = 0; k < 2; k++) {
                /* An ACK-only datagram of the peer's stream with the list. */
                struct dw_dgram_hdr a = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK,
                                         .xflags = DW_DGRAM_X_RAILS,
                                         .dst_qpn = v.qpn,
                                         .src_qpn = p.qpn,
                                         .rail_count = 2,
                                         .rails = {htonl(INADDR_LOOPBACK), ip_of("127.0.0.9")}};
                if (k == 0) {
                        a.xflags2 = DW_DGRAM_X2_TOKEN;
                        a.token = 0x5151515151515151ull;
                }
                n = forge(pkt, sizeof(pkt), &a, 0, 0, NULL, 0);
                int e = spoof_to("127.0.0.1", "127.0.0.1", p.port, v.port, pkt, n);
                if (e == -EPERM || e == -EACCES) {
                        fprintf(stderr,
                                "rails: no raw socket (%s): the spoofed lists are skipped\n",
                                strerror(-e));
                        break;
                }
                if (e < 0)
                        die("rails: spoofed send: %s", strerror(-e));
                spoofed = true;
                want += k == 0;
        }
        drive(&v, NULL, 200);
        if (memcmp(v.buf + 64, owned, 5) == 0)
                die("rails: the Write naming the peer by a forged origin landed");
        struct diwarp_counters c;
        counters(&v, &c);
        if (c.rx_dropped_rail != want)
                die("rails: rx_dropped_rail %llu, want %u", (unsigned long long)c.rx_dropped_rail,
                    want);
        /* The victim's 1 MiB Write to the peer: above DIWARP_STRIPE_MIN, so
         * striped if it believed the peer had a second rail. */
        struct diwarp_rail_stats r0[DIWARP_MAX_RAILS], r1[DIWARP_MAX_RAILS];
        int nr = diwarp_device_rails(v.dev, r0, DIWARP_MAX_RAILS);
        if (nr != 2)
                die("rails: the victim has %d rails, want 2", nr);
        for (uint32_t i = 0; i < (1u << 20); i++)
                v.buf[(1u << 20) / 2 + i % 4096] = (uint8_t)i;
        struct diwarp_sge sge = {(uintptr_t)v.buf, 1u << 20, v.lkey};
        struct diwarp_send_wr wr = {.wr_id = 0x53,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .wr.rdma = {(uintptr_t)p.buf, p.rkey}};
        struct diwarpdv_rd_dest d = {v.ah, p.qpn, QKEY};
        struct diwarp_send_wr *bad;
        CHECK(diwarpdv_post_send_rd(v.qp, &wr, &d, &bad));
        expect_wc(&v, &p, 0x53, DIWARP_WC_SUCCESS, "rails: the victim's 1 MiB Write");
        if (memcmp(v.buf, p.buf, 1u << 20) != 0)
                die("rails: the 1 MiB Write's bytes differ");
        CHECK(diwarp_device_rails(v.dev, r1, DIWARP_MAX_RAILS));
        if (r1[1].tx_packets != r0[1].tx_packets)
                die("rails: the victim sent %llu datagrams by its rail 1 after the forged list",
                    (unsigned long long)(r1[1].tx_packets - r0[1].tx_packets));
        struct pollfd pfd = {.fd = xfd, .events = POLLIN};
        if (poll(&pfd, 1, 0) == 1)
                die("rails: the victim sent a datagram to 127.0.0.9");
        legit_send(&v, &p, 0x54, "rails: legitimate Send after");
        fprintf(stderr, "rails ok: %u forged origins and lists refused (%s)\n", want,
                spoofed ? "spoofed lists included" : "raw sockets not allowed");
        close(xfd);
        side_close(&v);
        side_close(&p);
        return 0;
}

/* ---------------------------------------------------------------- peers */

static size_t rss_bytes(void)
{
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long size = 0, res = 0;
        if (!f || fscanf(f, "%lu %lu", &size, &res) != 2)
                die("peers: cannot read /proc/self/statm");
        fclose(f);
        return res * (size_t)sysconf(_SC_PAGESIZE);
}

#define PEERS_FLOOD 20000u
#define PEERS_CAP   1000u /* DIWARP_RD_MAX_PEERS and _DEV_PEERS of the run */
#define PEERS_SRCS  8u    /* source addresses 127.0.1.1.. of the second half */
/* The victim's memory may grow by this much per stream it holds (its
 * state, ≤ 256 bytes, and the hash table's share, with the allocator's
 * and the sanitizer's overheads), plus a fixed allowance. */
#define PEERS_BYTES_PER 2048u
#define PEERS_FIXED     (2u << 20)

/* Datagrams waiting on fd, read and counted. */
static unsigned drain_count(int fd)
{
        uint8_t b[2048];
        unsigned n = 0;
        while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
                n++;
        return n;
}

/* 20 000 zero-length Writes with START, each a new stream: half name a
 * distinct forged origin (X-flag RAIL) from 127.0.0.9, half come from 8
 * source addresses with distinct source QPNs. The forged origins are
 * dropped (rx_dropped_rail) and answered by nothing; of the others, the
 * victim keeps at most PEERS_CAP streams (DIWARP_RD_MAX_PEERS and
 * DIWARP_RD_DEV_PEERS of the run), answers only those, and drops and
 * counts the rest (rx_dropped_peers); its resident memory grows by at most
 * PEERS_CAP × PEERS_BYTES_PER + PEERS_FIXED. The legitimate peer's Send
 * completes beside the flood. After DIWARP_RD_IDLE_MS (500 ms here) the
 * idle streams are freed (rd_peers_reclaimed), the legitimate peer's among
 * them (credits are off: a stream with a credit index stays): both ends'
 * next Sends restart their streams (START) and complete, and so they do
 * after an idle time too short for the streams to go; a new stranger's
 * stream is taken again. */
static int case_peers(void)
{
        struct side a, b;
        rd_pair(&a, &b, DIWARP_ACCESS_REMOTE_WRITE, true);
        legit_send(&a, &b, 0x61, "peers: legitimate Send before");
        legit_send(&b, &a, 0x62, "peers: legitimate Send back");
        int xfd = stranger_socket("127.0.0.9");
        int sfd[PEERS_SRCS];
        for (unsigned i = 0; i < PEERS_SRCS; i++) {
                char ip[32];
                snprintf(ip, sizeof(ip), "127.0.1.%u", i + 1);
                sfd[i] = stranger_socket(ip);
        }
        drive(&a, NULL, 50);
        size_t rss0 = rss_bytes();
        uint8_t pkt[256];
        for (uint32_t i = 0; i < PEERS_FLOOD; i++) {
                bool rail = i < PEERS_FLOOD / 2;
                struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                         .xflags2 = DW_DGRAM_X2_START,
                                         .dst_qpn = a.qpn,
                                         .src_qpn = 0x100000 + i,
                                         .qkey = QKEY,
                                         .psn = 0x7000 + i,
                                         .start_psn = 0x7000 + i,
                                         .start_msn = 0x7000 + i};
                if (rail) {
                        h.xflags = DW_DGRAM_X_RAIL;
                        h.origin = htonl(0x0a000000u + i + 1); /* 10.0.x.y */
                }
                size_t n = forge(pkt, sizeof(pkt), &h, a.rkey, (uintptr_t)a.buf, NULL, 0);
                send_to(rail ? xfd : sfd[i % PEERS_SRCS], pkt, n, a.port);
                if (i % 32 == 31)
                        diwarp_progress(a.dev, 64);
        }
        drive(&a, NULL, 200);
        size_t rss1 = rss_bytes();
        legit_send(&a, &b, 0x63, "peers: legitimate Send beside the flood");
        struct diwarp_counters c;
        counters(&a, &c);
        unsigned to_x = drain_count(xfd), to_s = 0;
        for (unsigned i = 0; i < PEERS_SRCS; i++)
                to_s += drain_count(sfd[i]);
        uint64_t kept = PEERS_FLOOD / 2 - c.rx_dropped_peers;
        fprintf(stderr,
                "peers: rx_dropped_rail %llu, rx_dropped_peers %llu, streams taken %llu; "
                "answers: %u to the forged origins, %u to the other sources; RSS %zu -> %zu "
                "(+%zu bytes)\n",
                (unsigned long long)c.rx_dropped_rail, (unsigned long long)c.rx_dropped_peers,
                (unsigned long long)kept, to_x, to_s, rss0, rss1, rss1 - rss0);
        if (c.rx_dropped_rail != PEERS_FLOOD / 2)
                die("peers: rx_dropped_rail %llu, want %u", (unsigned long long)c.rx_dropped_rail,
                    PEERS_FLOOD / 2);
        if (kept > PEERS_CAP || kept + 10 < PEERS_CAP - 2)
                die("peers: %llu strangers' streams taken, want the cap (%u) less the "
                    "legitimate peer's",
                    (unsigned long long)kept, PEERS_CAP);
        if (to_x)
                die("peers: %u answers went to 127.0.0.9 for forged origins", to_x);
        if (to_s > 2 * kept)
                die("peers: %u answers for %llu streams taken: refused sources were answered", to_s,
                    (unsigned long long)kept);
        if (rss1 > rss0 + (size_t)PEERS_CAP * PEERS_BYTES_PER + PEERS_FIXED)
                die("peers: resident memory grew by %zu bytes, above the cap %zu", rss1 - rss0,
                    (size_t)PEERS_CAP * PEERS_BYTES_PER + PEERS_FIXED);
        /* Idle for more than DIWARP_RD_IDLE_MS: every stream goes. */
        uint64_t end = now_ms() + 1200;
        while (now_ms() < end) {
                diwarp_progress(a.dev, 64);
                diwarp_progress(b.dev, 64);
                usleep(1000);
        }
        counters(&a, &c);
        if (c.rd_peers_reclaimed < kept)
                die("peers: %llu streams freed after the idle time, want at least the %llu "
                    "strangers'",
                    (unsigned long long)c.rd_peers_reclaimed, (unsigned long long)kept);
        uint64_t refused = c.rx_dropped_peers;
        legit_send(&a, &b, 0x64, "peers: legitimate Send after the streams were freed");
        legit_send(&b, &a, 0x65, "peers: legitimate Send back after the streams were freed");
        /* Idle for more than half the idle time and less than all of it:
         * the streams are kept, and each end's next Send starts its side
         * over (START at its next MSN), which the other takes. */
        end = now_ms() + 320;
        while (now_ms() < end) {
                diwarp_progress(a.dev, 64);
                diwarp_progress(b.dev, 64);
                usleep(1000);
        }
        legit_send(&a, &b, 0x66, "peers: legitimate Send after half the idle time");
        legit_send(&b, &a, 0x67, "peers: legitimate Send back after half the idle time");
        struct stranger x;
        stranger_open(&x, xfd, &a, a.qpn, 0x0e0000);
        stranger_write(&x, a.rkey, (uintptr_t)a.buf + 4096, "room", 4);
        drive(&a, &x, 100);
        counters(&a, &c);
        if (c.rx_dropped_peers != refused || memcmp(a.buf + 4096, "room", 4) != 0)
                die("peers: a new stream was refused after the idle ones were freed");
        fprintf(stderr,
                "peers ok: %u forged streams, %llu kept (cap %u), +%zu bytes resident (cap "
                "%zu), %llu freed when idle\n",
                PEERS_FLOOD, (unsigned long long)kept, PEERS_CAP, rss1 - rss0,
                (size_t)PEERS_CAP * PEERS_BYTES_PER + PEERS_FIXED,
                (unsigned long long)c.rd_peers_reclaimed);
        close(xfd);
        for (unsigned i = 0; i < PEERS_SRCS; i++)
                close(sfd[i]);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* Sends n Sends of 256 bytes from b to a, each with a receive posted first,
 * and waits for all: more than the ring's quota per peer (CREDITS_RING /
 * CREDITS_PEERS slots), so the credits must come back for the last ones. */
static void legit_sends(struct side *a, struct side *b, uint64_t id, unsigned n, const char *what)
{
        for (unsigned i = 0; i < n; i++)
                legit_send(a, b, id + i, what);
}

/* A Send from c to a with no receive posted at a: parked in a's ring when
 * c's stream holds a credit index there, else refused with an RNR NAK until
 * the receive comes. Returns whether it was parked. */
static bool unexpected_send(struct side *a, struct side *c, uint64_t id, const char *what)
{
        struct diwarp_counters ca, cc;
        counters(a, &ca);
        counters(c, &cc);
        for (unsigned i = 0; i < 256; i++)
                c->buf[BUF_LEN / 2 + i] = (uint8_t)(id * 3 + i);
        rd_send(c, a, id, BUF_LEN / 2, 256);
        uint64_t end = now_ms() + 300;
        while (now_ms() < end) {
                diwarp_progress(a->dev, 64);
                diwarp_progress(c->dev, 64);
        }
        struct diwarp_counters ca2, cc2;
        counters(a, &ca2);
        counters(c, &cc2);
        bool parked = ca2.mbox_parked > ca.mbox_parked;
        bool refused = cc2.rnr_naks > cc.rnr_naks;
        if (parked == refused)
                die("%s: parked %llu, RNR NAKs %llu: want exactly one of them", what,
                    (unsigned long long)(ca2.mbox_parked - ca.mbox_parked),
                    (unsigned long long)(cc2.rnr_naks - cc.rnr_naks));
        post_recv(a, a->qp, id, BUF_LEN / 2, 4096);
        expect_wc(a, c, id, DIWARP_WC_SUCCESS, what);
        expect_wc(c, a, id, DIWARP_WC_SUCCESS, what);
        if (memcmp(a->buf + BUF_LEN / 2, c->buf + BUF_LEN / 2, 256) != 0)
                die("%s: the Send's bytes differ", what);
        return parked;
}

/* Sends from src to dst's QP, without a receive posted at dst, n Sends of
 * 256 bytes from src's buffer at BUF_LEN / 4 + k * 4096 (a pattern of
 * id + k); drives both ends for 300 ms and returns how many dst parked
 * (the others got RNR NAKs and wait for their receives). */
static unsigned park_sends(struct side *dst, struct side *src, uint64_t id, unsigned n,
                           const char *what)
{
        struct diwarp_counters cd, cd2;
        counters(dst, &cd);
        for (unsigned k = 0; k < n; k++) {
                uint64_t off = BUF_LEN / 4 + (uint64_t)k * 4096;
                for (unsigned i = 0; i < 256; i++)
                        src->buf[off + i] = (uint8_t)(id + k + i);
                rd_send(src, dst, id + k, off, 256);
        }
        uint64_t end = now_ms() + 300;
        while (now_ms() < end) {
                diwarp_progress(dst->dev, 64);
                diwarp_progress(src->dev, 64);
        }
        counters(dst, &cd2);
        fprintf(stderr, "%s: %llu of %u parked\n", what,
                (unsigned long long)(cd2.mbox_parked - cd.mbox_parked), n);
        return (unsigned)(cd2.mbox_parked - cd.mbox_parked);
}

/* Posts n receives at dst for the Sends park_sends(dst, src, id, n) left,
 * oldest first, checks each one's bytes, then reaps src's completions of
 * them from the src_done-th on. */
static void take_sends(struct side *dst, struct side *src, uint64_t id, unsigned n,
                       unsigned src_done, const char *what)
{
        for (unsigned k = 0; k < n; k++) {
                uint64_t off = BUF_LEN / 4 + (uint64_t)k * 4096;
                post_recv(dst, dst->qp, id + k, off, 4096);
                expect_wc(dst, src, id + k, DIWARP_WC_SUCCESS, what);
                for (unsigned i = 0; i < 256; i++)
                        if (dst->buf[off + i] != (uint8_t)(id + k + i))
                                die("%s: Send %u: byte %u differs (%#x, want %#x)", what, k, i,
                                    dst->buf[off + i], (uint8_t)(id + k + i));
        }
        for (unsigned k = src_done; k < n; k++)
                expect_wc(src, dst, id + k, DIWARP_WC_SUCCESS, what);
}

static void idle_for(struct side *a, struct side *b, struct side *c, unsigned ms)
{
        uint64_t end = now_ms() + ms;
        while (now_ms() < end) {
                diwarp_progress(a->dev, 64);
                diwarp_progress(b->dev, 64);
                diwarp_progress(c->dev, 64);
                usleep(1000);
        }
}

#define CREDITS_PEERS "4"
#define CREDITS_RING  "16"

/* a's Send parked at b over an idle time of `ms`, then a quota of a's
 * Sends (CREDITS_RING / CREDITS_PEERS slots, as many as a's credits allow)
 * parked beside it: b takes a's START as a new start, the parked Send of
 * the old start is delivered first, and the quota parks whole, so both
 * ends' credit counters started over together (docs/PROTOCOL.md, "Stream
 * start" and "Credits"). */
static void park_over_idle(struct side *a, struct side *b, struct side *c, uint64_t id, unsigned ms,
                           const char *what)
{
        char w[160];
        snprintf(w, sizeof(w), "credits: a's Send parked at b %s", what);
        if (park_sends(b, a, id, 1, w) != 1)
                die("%s: not parked", w);
        expect_wc(a, b, id, DIWARP_WC_SUCCESS, w);
        idle_for(a, b, c, ms);
        unsigned quota = (unsigned)(atoi(CREDITS_RING) / atoi(CREDITS_PEERS));
        snprintf(w, sizeof(w), "credits: a's Sends to b %s", what);
        unsigned parked = park_sends(b, a, id + 0x10, quota, w);
        if (parked != quota)
                die("%s: %u of %u parked: the two ends' credit counters differ", w, parked, quota);
        take_sends(b, a, id, 1, 1, w);
        take_sends(b, a, id + 0x10, quota, 0, w);
}

/* Credit indices come back with idle streams (docs/PROTOCOL.md, "Credits"):
 * strangers' streams take every credit index of a's QP (CREDITS_PEERS), so
 * a new legitimate peer c gets none (its Send to a without a receive posted
 * is refused with an RNR NAK, not parked); once the strangers' streams are
 * idle for DIWARP_RD_IDLE_MS they go with their indices, and c's next such
 * Send is parked. Meanwhile a Send of a's waits parked at b: b keeps its
 * stream of a, a frees its stream of b, and a's next Sends start a new one
 * (park_over_idle). The same after an idle time of about half
 * DIWARP_RD_IDLE_MS, when both ends keep their streams and start them
 * over. Between them b and a exchange more Sends than a quota holds:
 * counters that disagreed would stall them. */
static int case_credits(void)
{
        struct side a, b, c;
        rd_pair(&a, &b, DIWARP_ACCESS_REMOTE_WRITE, true);
        side_open(&c);
        c.qp = qp_new(&c, false, true, 0, NULL);
        c.qpn = diwarp_qp_num(c.qp);
        qp_up(c.qp, false, NULL, 0, 0, 0);
        CHECK(diwarp_ah_create(c.pd, &a.gid, &c.ah));
        legit_sends(&a, &b, 0x100, 12, "credits: b to a");
        legit_sends(&b, &a, 0x200, 12, "credits: a to b");
        int xfd = stranger_socket("127.0.0.9");
        for (uint32_t i = 0; i < 6; i++) {
                struct stranger x;
                stranger_open(&x, xfd, &a, a.qpn, 0x0c0000 + i);
                stranger_write(&x, a.rkey, (uintptr_t)a.buf + 4096, "", 0);
                drive(&a, &x, 20);
        }
        if (unexpected_send(&a, &c, 0x300, "credits: c's Send while strangers hold the indices"))
                die("credits: c's Send was parked: a stranger's stream left a credit index free");
        park_over_idle(&a, &b, &c, 0x400, 1200, "over the idle time");
        struct diwarp_counters ca;
        counters(&a, &ca);
        if (ca.rd_peers_reclaimed < 6)
                die("credits: %llu streams freed after the idle time, want at least the 6 "
                    "strangers'",
                    (unsigned long long)ca.rd_peers_reclaimed);
        if (!unexpected_send(&a, &c, 0x500, "credits: c's Send after the strangers' streams went"))
                die("credits: c's Send was refused: the freed streams' credit indices did not "
                    "come back");
        legit_sends(&a, &b, 0x600, 12, "credits: b to a after the idle time");
        legit_sends(&b, &a, 0x700, 12, "credits: a to b after the idle time");
        /* park_sends drove 300 ms: with 0 more, about half the idle time. */
        park_over_idle(&a, &b, &c, 0x800, 0, "over half the idle time");
        legit_sends(&a, &b, 0x900, 12, "credits: b to a after half the idle time");
        legit_sends(&b, &a, 0xa00, 12, "credits: a to b after half the idle time");
        counters(&a, &ca);
        fprintf(stderr, "credits ok: %llu streams freed, %llu parked, %llu credit stalls at a\n",
                (unsigned long long)ca.rd_peers_reclaimed, (unsigned long long)ca.mbox_parked,
                (unsigned long long)ca.credit_stalls);
        close(xfd);
        side_close(&c);
        side_close(&a);
        side_close(&b);
        return 0;
}

/* ---------------------------------------------------------------- main */

/* ---------------------------------------------------------------- auth */

/* Writes a key file of n random bytes with the given mode into dir. */
static void key_file(char *path, size_t cap, const char *dir, const char *name, size_t n,
                     mode_t mode)
{
        snprintf(path, cap, "%s/%s", dir, name);
        uint8_t k[32];
        for (size_t i = 0; i < n; i++)
                k[i] = (uint8_t)rand();
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || write(fd, k, n) != (ssize_t)n)
                die("auth: key file %s: %s", path, strerror(errno));
        fchmod(fd, mode);
        close(fd);
}

static void auth_env(const char *path)
{
        char v[300];
        if (!path) {
                unsetenv("DIWARP_AUTH");
                return;
        }
        snprintf(v, sizeof(v), "file:%s", path);
        setenv("DIWARP_AUTH", v, 1);
}

/* An RD Write of len bytes at off from b's QP into a's memory at off. */
static void rd_write(struct side *b, struct side *a, uint64_t id, uint64_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)b->buf + off, len, b->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = (uintptr_t)a->buf + off;
        wr.wr.rdma.rkey = a->rkey;
        struct diwarpdv_rd_dest d = {b->ah, a->qpn, QKEY};
        struct diwarp_send_wr *bad;
        CHECK(diwarpdv_post_send_rd(b->qp, &wr, &d, &bad));
}

/* b's 1 MiB Write into a, which must not land: b's WR ends in error (its
 * peer never acknowledges), a's memory stays zero, and a counts drops. */
static void auth_refused(struct side *a, struct side *b, const char *what)
{
        struct diwarp_counters c0, c;
        counters(a, &c0);
        memset(b->buf, 0x5a, BUF_LEN / 2);
        memset(a->buf, 0, BUF_LEN);
        rd_write(b, a, 0x77, 0, BUF_LEN / 2);
        struct diwarp_wc wc;
        if (!poll_one(b, a, &wc, 60000))
                die("%s: the refused Write never completed", what);
        if (wc.status == DIWARP_WC_SUCCESS)
                die("%s: the Write completed successfully", what);
        if (!all_zero(a->buf, BUF_LEN))
                die("%s: bytes were placed", what);
        counters(a, &c);
        if (c.rx_dropped_auth <= c0.rx_dropped_auth)
                die("%s: rx_dropped_auth did not grow", what);
        fprintf(stderr, "%s: refused (%s), %llu datagrams dropped\n", what,
                diwarp_wc_status_str(wc.status),
                (unsigned long long)(c.rx_dropped_auth - c0.rx_dropped_auth));
}

/* A forged datagram of n bytes (forge: CRC32c) claims AUTH instead, with a
 * made-up nonce and tag; returns its new length (pkt has room). */
static size_t made_up_tag(uint8_t *pkt, size_t n)
{
        n -= DW_DGRAM_CRC_LEN;
        pkt[0] = DW_DGRAM_VERSION2;
        pkt[8] |= DW_DGRAM_X2_AUTH;
        for (size_t j = 0; j < DW_DGRAM_AUTH_LEN; j++)
                pkt[n + j] = (uint8_t)rand();
        return n + DW_DGRAM_AUTH_LEN;
}

static int case_auth(void)
{
        char dir[] = "/tmp/diwarp-auth-XXXXXX";
        if (!mkdtemp(dir))
                die("auth: mkdtemp: %s", strerror(errno));
        char k1[200], k2[200], kw[200];
        srand(1);
        key_file(k1, sizeof(k1), dir, "k1", 32, 0600);
        key_file(k2, sizeof(k2), dir, "k2", 16, 0600);
        key_file(kw, sizeof(kw), dir, "kw", 32, 0644);
        /* A key file others can read is refused at open. */
        auth_env(kw);
        struct diwarp_device *d;
        if (diwarp_device_open(NULL, &d) != -EINVAL)
                die("auth: a world-readable key file was accepted");
        /* Same key: Sends and a 1 MiB Write land. */
        auth_env(k1);
        setenv("DIWARP_PEER_TIMEOUT_MS", "1500", 1);
        struct side a, b;
        rd_pair(&a, &b, DIWARP_ACCESS_REMOTE_WRITE, true);
        legit_send(&a, &b, 0x70, "auth: Send with the same key");
        for (size_t i = 0; i < BUF_LEN; i++)
                b.buf[i] = (uint8_t)(i * 7 + 1);
        rd_write(&b, &a, 0x71, 0, BUF_LEN);
        expect_wc(&b, &a, 0x71, DIWARP_WC_SUCCESS, "auth: 1 MiB Write with the same key");
        if (memcmp(a.buf, b.buf, BUF_LEN) != 0)
                die("auth: the Write's bytes differ");
        struct diwarp_counters c0, c;
        counters(&a, &c0);
        if (c0.rx_dropped_auth || c0.crc_errors)
                die("auth: %llu datagrams dropped between two ends of one key",
                    (unsigned long long)c0.rx_dropped_auth);
        /* A stranger without the key: a forged Write without a tag, and one
         * that claims AUTH with a tag it made up. Nothing lands. */
        memset(a.buf, 0, BUF_LEN);
        int fd = stranger_socket("127.0.0.9");
        struct stranger x;
        stranger_open(&x, fd, &a, a.qpn, 0x0e0001);
        uint8_t pay[64];
        memset(pay, 0xee, sizeof(pay));
        for (int i = 0; i < 8; i++)
                stranger_write(&x, a.rkey, (uintptr_t)a.buf + 64 * (unsigned)i, pay, sizeof(pay));
        for (int i = 0; i < 8; i++) {
                struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                         .xflags2 = DW_DGRAM_X2_START,
                                         .dst_qpn = a.qpn,
                                         .src_qpn = 0x0e0002,
                                         .qkey = QKEY,
                                         .psn = 100 + (uint32_t)i,
                                         .start_psn = 100,
                                         .start_msn = 100};
                uint8_t pkt[512];
                size_t n = forge(pkt, sizeof(pkt), &h, a.rkey, (uintptr_t)a.buf, pay, sizeof(pay));
                send_to(fd, pkt, made_up_tag(pkt, n), a.port);
        }
        drive(&a, NULL, 300);
        counters(&a, &c);
        if (c.rx_dropped_auth - c0.rx_dropped_auth != 16)
                die("auth: rx_dropped_auth grew by %llu for 16 forged datagrams",
                    (unsigned long long)(c.rx_dropped_auth - c0.rx_dropped_auth));
        if (!all_zero(a.buf, BUF_LEN))
                die("auth: a forged datagram placed bytes");
        legit_send(&a, &b, 0x72, "auth: Send beside the forgeries");
        close(fd);
        /* A peer with another key, and one without DIWARP_AUTH: nothing of
         * theirs is placed, in either direction. */
        auth_env(k2);
        struct side o;
        side_open(&o);
        auth_env(NULL);
        struct side n;
        side_open(&n);
        auth_env(k1);
        struct side *peers[2] = {&o, &n};
        const char *names[2] = {"auth: a peer with another key",
                                "auth: a peer without DIWARP_AUTH"};
        for (int i = 0; i < 2; i++) {
                struct side *p = peers[i];
                p->qp = qp_new(p, false, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
                p->qpn = diwarp_qp_num(p->qp);
                qp_up(p->qp, false, NULL, 0, 0, 0);
                CHECK(diwarp_ah_create(p->pd, &a.gid, &p->ah));
                auth_refused(&a, p, names[i]);
                if (a.ah)
                        CHECK(diwarp_ah_destroy(a.ah));
                CHECK(diwarp_ah_create(a.pd, &p->gid, &a.ah));
                char what[96];
                snprintf(what, sizeof(what), "%s (the other way)", names[i]);
                auth_refused(p, &a, what);
                reset_up(a.qp); /* its WR failed: the QP is in ERR */
        }
        side_close(&o);
        side_close(&n);
        side_close(&a);
        side_close(&b);
        unlink(k1);
        unlink(k2);
        unlink(kw);
        rmdir(dir);
        return 0;
}

/* authconn: RC over RD with the connection's key (DIWARP_AUTH=connection
 * at both ends). A connection that carried a Write; the stranger forges the
 * peer's next Write (right QPNs, PSN and rkey; it cannot know the token)
 * from 127.0.0.9 naming the peer by origin and, with a raw socket, from the
 * peer's own address: without a tag, with a made-up tag, and sealed
 * properly (a valid GMAC) under a key derived as the connection's is but
 * from other tokens. None lands, each is counted in rx_dropped_auth (the
 * tag is checked before the token: rx_dropped_token stays 0), the QP stays
 * in RTS, and the peer's Writes land both ways. Then with file:PATH (the
 * file key mixed in): two ends of one key connect and write; a peer with
 * another key file connects (its setting is the same) but nothing of its
 * Write lands, counted in rx_dropped_auth, and its WR fails. */
static int case_authconn(void)
{
        setenv("DIWARP_AUTH", "connection", 1);
        setenv("DIWARP_PEER_TIMEOUT_MS", "1500", 1);
        struct side v, p;
        struct diwarp_listener *l;
        rcrd_pair(&v, &p, &l);
        struct diwarp_qp_attr pa;
        struct diwarp_qp_init_attr pia;
        CHECK(diwarp_qp_query(p.qp, &pa, &pia));
        memcpy(p.buf, "legitimate 1", 12);
        rc_write(&p, &v, 1, 0, 12);
        struct diwarp_counters c0, c;
        counters(&v, &c0);
        if (c0.rx_dropped_auth || c0.rx_dropped_token)
                die("authconn: %llu datagrams of the connection dropped",
                    (unsigned long long)(c0.rx_dropped_auth + c0.rx_dropped_token));
        uint32_t psn = pa.sq_psn + 1;
        uint32_t pip;
        memcpy(&pip, p.gid.raw + 12, 4);
        char pips[INET_ADDRSTRLEN], vips[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &pip, pips, sizeof(pips));
        inet_ntop(AF_INET, v.gid.raw + 12, vips, sizeof(vips));
        /* A key as the connection's is derived, from tokens the stranger
         * made up: its tags are valid GMACs, under the wrong key. */
        uint8_t wk[DW_SEAL_CONN_KEY_LEN], start[DW_DGRAM_AUTH_NONCE_LEN] = {1};
        const char *why = NULL;
        struct dw_seal wrong;
        CHECK(dw_seal_conn_key(0x1111, 0x2222, NULL, 0, wk, &why));
        CHECK(dw_seal_init(&wrong, false, wk, sizeof(wk), start, &why));
        int xfd = stranger_socket("127.0.0.9");
        static const char owned[] = "OWNED-by-a-stranger";
        uint8_t pkt[512];
        unsigned sent = 0;
        bool spoofed = false, raw = true;
        for (int k = 0; k < 6; k++) {
                bool spoof = k >= 3;
                if (spoof && !raw)
                        break;
                struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_DATA,
                                         .xflags = spoof ? 0 : DW_DGRAM_X_RAIL,
                                         .xflags2 = DW_DGRAM_X2_TOKEN,
                                         .dst_qpn = v.qpn,
                                         .src_qpn = p.qpn,
                                         .psn = psn,
                                         .origin = spoof ? 0 : pip,
                                         .token = 0x0123456789abcdefull + (uint64_t)k};
                size_t n = forge(pkt, sizeof(pkt), &h, v.rkey, (uintptr_t)v.buf + 64, owned,
                                 sizeof(owned));
                if (k % 3 == 1) {
                        n = made_up_tag(pkt, n);
                } else if (k % 3 == 2) {
                        ssize_t m = dw_seal_packet(&wrong, pkt, n - DW_DGRAM_CRC_LEN, sizeof(pkt));
                        if (m < 0)
                                die("authconn: seal: %s", strerror((int)-m));
                        n = (size_t)m;
                }
                if (!spoof) {
                        send_to(xfd, pkt, n, v.port);
                } else {
                        int e = spoof_to(pips, vips, p.port, v.port, pkt, n);
                        if (e == -EPERM || e == -EACCES) {
                                fprintf(stderr,
                                        "authconn: no raw socket (%s): the spoofed "
                                        "cases are skipped\n",
                                        strerror(-e));
                                raw = false;
                                continue;
                        }
                        if (e < 0)
                                die("authconn: spoofed send: %s", strerror(-e));
                        spoofed = true;
                }
                sent++;
        }
        dw_seal_fini(&wrong);
        drive(&v, NULL, 200);
        if (memcmp(v.buf + 64, owned, 5) == 0)
                die("authconn: a forged Write landed in the connection's memory");
        if (diwarp_qp_state(v.qp) != DIWARP_QPS_RTS)
                die("authconn: the forged datagrams moved the QP to state %d",
                    diwarp_qp_state(v.qp));
        counters(&v, &c);
        if (c.rx_dropped_auth - c0.rx_dropped_auth != sent)
                die("authconn: rx_dropped_auth grew by %llu for %u forged datagrams",
                    (unsigned long long)(c.rx_dropped_auth - c0.rx_dropped_auth), sent);
        if (c.rx_dropped_token != c0.rx_dropped_token)
                die("authconn: a forged datagram reached the token check");
        memcpy(p.buf + 64, "legitimate 2", 12);
        rc_write(&p, &v, 2, 64, 12);
        memcpy(v.buf + 128, "answer", 6);
        rc_write(&v, &p, 3, 128, 6);
        counters(&v, &c);
        if (c.rx_dropped_auth - c0.rx_dropped_auth != sent)
                die("authconn: the connection's own datagrams were dropped");
        fprintf(stderr, "authconn ok: %u forged Writes (%s) dropped for want of the key\n", sent,
                spoofed ? "3 from 127.0.0.9, 3 from the peer's own address"
                        : "from 127.0.0.9; raw sockets not allowed");
        close(xfd);
        CHECK(diwarp_disconnect(p.qp));
        CHECK(diwarp_listener_destroy(l));
        side_close(&p);
        side_close(&v);

        /* file:PATH: the file key mixed in. */
        char dir[] = "/tmp/diwarp-auth-XXXXXX";
        if (!mkdtemp(dir))
                die("authconn: mkdtemp: %s", strerror(errno));
        char k1[200], k2[200];
        srand(2);
        key_file(k1, sizeof(k1), dir, "k1", 32, 0600);
        key_file(k2, sizeof(k2), dir, "k2", 32, 0600);
        auth_env(k1);
        rcrd_pair(&v, &p, &l);
        memcpy(p.buf, "file key 1", 10);
        rc_write(&p, &v, 4, 0, 10);
        memcpy(v.buf + 128, "file key 2", 10);
        rc_write(&v, &p, 5, 128, 10);
        counters(&v, &c);
        if (c.rx_dropped_auth)
                die("authconn: %llu datagrams dropped between two ends of one key file",
                    (unsigned long long)c.rx_dropped_auth);
        CHECK(diwarp_disconnect(p.qp));
        CHECK(diwarp_listener_destroy(l));
        side_close(&p);
        side_close(&v);
        /* A peer of another key file: the same setting, so it connects;
         * nothing of its Write lands. */
        side_open(&v);
        auth_env(k2);
        side_open(&p);
        v.qp = qp_new(&v, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        p.qp = qp_new(&p, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
        int acc;
        CHECK(rcrd_connect(&v, &p, &l, &acc));
        CHECK(acc);
        counters(&v, &c0);
        memset(p.buf, 0x5a, 4096);
        memset(v.buf, 0, 4096);
        struct diwarp_sge sge = {(uintptr_t)p.buf, 4096, p.lkey};
        struct diwarp_send_wr wr = {.wr_id = 6,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .wr.rdma = {(uintptr_t)v.buf, v.rkey}};
        struct diwarp_send_wr *bad;
        CHECK(diwarp_post_send(p.qp, &wr, &bad));
        struct diwarp_wc wc;
        if (!poll_one(&p, &v, &wc, 60000))
                die("authconn: the Write under another key file never completed");
        if (wc.status == DIWARP_WC_SUCCESS)
                die("authconn: a Write under another key file completed successfully");
        if (!all_zero(v.buf, 4096))
                die("authconn: a Write under another key file placed bytes");
        counters(&v, &c);
        if (c.rx_dropped_auth <= c0.rx_dropped_auth)
                die("authconn: rx_dropped_auth did not grow for another key file");
        fprintf(stderr,
                "authconn ok: file key: one key works, another key file's Write refused "
                "(%s, %llu datagrams dropped)\n",
                diwarp_wc_status_str(wc.status),
                (unsigned long long)(c.rx_dropped_auth - c0.rx_dropped_auth));
        CHECK(diwarp_listener_destroy(l));
        side_close(&p);
        side_close(&v);
        unlink(k1);
        unlink(k2);
        rmdir(dir);
        return 0;
}

/* authmismatch: the two ends of an RC-over-RD connection run different
 * DIWARP_AUTH settings (connection against off, off against connection,
 * file:PATH against connection): the responder refuses the request at
 * connect time with -EPROTO and one line naming DIWARP_AUTH and both
 * settings; the initiator's connect fails (the request is rejected). */
static int case_authmismatch(void)
{
        char dir[] = "/tmp/diwarp-auth-XXXXXX";
        if (!mkdtemp(dir))
                die("authmismatch: mkdtemp: %s", strerror(errno));
        char k1[200], fk[220];
        srand(3);
        key_file(k1, sizeof(k1), dir, "k1", 16, 0600);
        snprintf(fk, sizeof(fk), "file:%s", k1);
        const char *pairs[3][2] = {
            {"connection", "off"}, {"off", "connection"}, {fk, "connection"}};
        const char *want[3] = {"the peer runs with off, this end with connection",
                               "the peer runs with connection, this end with off",
                               "the peer runs with connection, this end with file:PATH"};
        for (int i = 0; i < 3; i++) {
                struct side v, p;
                setenv("DIWARP_AUTH", pairs[i][0], 1);
                side_open(&v);
                setenv("DIWARP_AUTH", pairs[i][1], 1);
                side_open(&p);
                v.qp = qp_new(&v, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
                p.qp = qp_new(&p, true, true, DIWARP_ACCESS_REMOTE_WRITE, NULL);
                struct capture cap;
                capture_begin(&cap);
                struct diwarp_listener *l;
                int acc;
                int r = rcrd_connect(&v, &p, &l, &acc);
                capture_end(&cap);
                unsigned other;
                unsigned lines = count_lines(cap.path, "DIWARP_AUTH differs", want[i], &other);
                unlink(cap.path);
                if (r >= 0 || acc != -EPROTO)
                        die("authmismatch: %s against %s: connect %d, accept %d (want a failed "
                            "connect, accept -EPROTO)",
                            pairs[i][1], pairs[i][0], r, acc);
                if (lines != 1 || other != 1)
                        die("authmismatch: %s against %s: %u lines naming DIWARP_AUTH, %u "
                            "naming both settings (want 1, 1)",
                            pairs[i][1], pairs[i][0], lines, other);
                if (diwarp_qp_state(v.qp) == DIWARP_QPS_RTS ||
                    diwarp_qp_state(p.qp) == DIWARP_QPS_RTS)
                        die("authmismatch: a QP reached RTS");
                fprintf(stderr, "authmismatch ok: initiator %s, responder %s: refused (%s)\n",
                        pairs[i][1], pairs[i][0], strerror(-r));
                CHECK(diwarp_listener_destroy(l));
                side_close(&p);
                side_close(&v);
        }
        unsetenv("DIWARP_AUTH");
        unlink(k1);
        rmdir(dir);
        return 0;
}

/* keyrun PROGRAM ARGS...: runs PROGRAM with DIWARP_AUTH set to a fresh
 * key file (both ends of the examples and tests it runs share the key). */
static int keyrun(char **argv)
{
        char dir[] = "/tmp/diwarp-auth-XXXXXX";
        if (!mkdtemp(dir))
                die("keyrun: mkdtemp: %s", strerror(errno));
        char k[200];
        srand((unsigned)getpid());
        key_file(k, sizeof(k), dir, "key", 16, 0600);
        auth_env(k);
        pid_t pid = fork();
        if (pid == 0) {
                execv(argv[0], argv);
                _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0)
                st = 1 << 8;
        unlink(k);
        rmdir(dir);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(int argc, char **argv)
{
        if (argc < 2)
                die("usage: security_dgram access|stag|nak|isn|window "
                    "[srq]|log|rcrd|rails|peers|auth|"
                    "authconn|authmismatch|keyrun PROGRAM ARGS...");
        alarm(120);
        setenv("DIWARP_PROGRESS", "app", 0);
        if (strcmp(argv[1], "access") == 0)
                return case_access();
        if (strcmp(argv[1], "stag") == 0)
                return case_stag();
        if (strcmp(argv[1], "nord") == 0)
                return case_nord();
        if (strcmp(argv[1], "nak") == 0)
                return case_nak();
        if (strcmp(argv[1], "isn") == 0)
                return case_isn();
        if (strcmp(argv[1], "window") == 0)
                return case_window(argc > 2 && strcmp(argv[2], "srq") == 0);
        if (strcmp(argv[1], "log") == 0)
                return case_log();
        if (strcmp(argv[1], "rcrd") == 0) {
                setenv("DIWARP_RC_TRANSPORT", "rd", 1);
                return case_rcrd();
        }
        if (strcmp(argv[1], "keyrun") == 0 && argc > 2)
                return keyrun(argv + 2);
        if (strcmp(argv[1], "auth") == 0)
                return case_auth();
        if (strcmp(argv[1], "authconn") == 0 || strcmp(argv[1], "authmismatch") == 0) {
                setenv("DIWARP_RC_TRANSPORT", "rd", 1);
                return argv[1][4] == 'c' ? case_authconn() : case_authmismatch();
        }
        if (strcmp(argv[1], "rails") == 0)
                return case_rails();
        if (strcmp(argv[1], "peers") == 0) {
                setenv("DIWARP_RD_MAX_PEERS", "1000", 1);
                setenv("DIWARP_RD_DEV_PEERS", "1000", 1);
                setenv("DIWARP_RD_IDLE_MS", "500", 1);
                /* A stream holding a credit index is never freed: without
                 * credits every idle stream goes, the legitimate peer's
                 * too, and the restart is tested. */
                setenv("DIWARP_CREDIT", "off", 1);
                return case_peers();
        }
        if (strcmp(argv[1], "credits") == 0) {
                setenv("DIWARP_RD_IDLE_MS", "500", 1);
                setenv("DIWARP_CREDIT", "static", 1);
                setenv("DIWARP_CREDIT_PEERS", CREDITS_PEERS, 1);
                setenv("DIWARP_CREDIT_RING", CREDITS_RING, 1);
                return case_credits();
        }
        die("unknown case %s", argv[1]);
        return 1;
}
