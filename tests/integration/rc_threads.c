/* Thread safety: 4 poster threads, each with its own RC QP on one device X,
 * send Sends and RDMA Writes (each Write announced by a Send behind it) to
 * 4 QPs on device Y, while 2 poller threads both poll X's send CQ and Y's
 * receive CQ (the same CQs, concurrently), verify every message's data and
 * repost the receives. Every message must arrive exactly once, intact.
 *
 *   rc_threads [thread]   "thread": both devices also run DIWARP_PROGRESS=thread
 *
 * Meant to run under ASan (the default test build), helgrind and TSan.
 * Exit status: 0 pass, 1 fail. An alarm ends a hung run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>

#define NQP     4
#define NPOLL   2
#define SLOTS   16         /* messages in flight per QP */
#define MSGMAX  (64 << 10) /* largest payload */
#define HDR     32
#define ALL_ACC (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE)

static int nmsg = 1000; /* per QP */

static void die(const char *fmt, ...)
{
        va_list ap;
        fprintf(stderr, "rc_threads: FAIL: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
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

/* Message seq of QP q: even = Send with the payload, odd = RDMA Write of the
 * payload into Y's Write slot, then a Send with only the header. */
static uint32_t msg_len(int q, int seq)
{
        uint32_t x = (uint32_t)(q * 7919 + seq * 104729);
        x ^= x >> 7;
        x *= 2654435761u;
        return 1 + (x >> 8) % MSGMAX;
}

static uint8_t pat(int q, int seq, size_t i)
{
        return (uint8_t)(i * 31 + (size_t)seq * 7 + (size_t)q * 101 + 3);
}

struct hdr {
        uint32_t magic, q, seq, len;
};
#define MAGIC 0xd1a7c0deu

struct dev {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_mr *mr;
        uint8_t *buf;
        size_t len;
        uint32_t lkey, rkey;
};

static struct dev X, Y;
static struct diwarp_qp *xqp[NQP], *yqp[NQP];

/* X buffer: per QP, SLOTS source slots of HDR + MSGMAX.
 * Y buffer: per QP, SLOTS receive slots of HDR + MSGMAX, then SLOTS Write slots. */
#define SLOT_LEN (HDR + MSGMAX)
static uint8_t *x_src(int q, int k)
{
        return X.buf + ((size_t)q * SLOTS + (size_t)k) * SLOT_LEN;
}
static uint8_t *y_recv(int q, int k)
{
        return Y.buf + ((size_t)q * 2 * SLOTS + (size_t)k) * SLOT_LEN;
}
static uint8_t *y_write(int q, int k)
{
        return Y.buf + ((size_t)q * 2 * SLOTS + SLOTS + (size_t)k) * SLOT_LEN;
}

/* Per-QP state shared by a poster and the pollers. */
static struct qstate {
        atomic_int verified;           /* messages verified at Y (receive reposted first) */
        atomic_int slot_seq[SLOTS];    /* last seq verified per Write/source slot, -1 none */
        atomic_long send_done;         /* X send completions of this QP */
        long wr_posted_through[65536]; /* X WRs posted up to and including message seq */
        atomic_uchar *seen;            /* per seq: received at Y */
} qs[NQP];

static atomic_long recv_total, send_total, bytes_checked;
static long send_expected;
static atomic_bool failed;

static void dev_open(struct dev *d, size_t len)
{
        CHECK(diwarp_device_open(NULL, &d->dev));
        CHECK(diwarp_pd_alloc(d->dev, &d->pd));
        CHECK(diwarp_cq_create(d->dev, 4096, NULL, NULL, &d->cq));
        d->len = len;
        d->buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
        if (!d->buf)
                die("alloc");
        memset(d->buf, 0, len);
        CHECK(diwarp_mr_reg(d->pd, d->buf, len, (uintptr_t)d->buf, ALL_ACC, &d->mr));
        struct diwarp_mr_info mi;
        CHECK(diwarp_mr_info(d->mr, &mi));
        d->lkey = mi.lkey;
        d->rkey = mi.rkey;
}

static struct diwarp_qp *qp_make(struct dev *d)
{
        struct diwarp_qp *qp;
        struct diwarp_qp_init_attr ia = {.send_cq = d->cq,
                                         .recv_cq = d->cq,
                                         .qp_type = DIWARP_QPT_RC,
                                         .cap = {.max_send_wr = 4 * SLOTS,
                                                 .max_recv_wr = SLOTS,
                                                 .max_send_sge = 2,
                                                 .max_recv_sge = 1}};
        CHECK(diwarp_qp_create(d->pd, &ia, &qp));
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .qp_access_flags = DIWARP_ACCESS_REMOTE_WRITE};
        CHECK(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS));
        return qp;
}

static void qp_connect(struct diwarp_qp *qp, struct dev *peer, struct diwarp_qp *pqp)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTR, .dest_qp_num = diwarp_qp_num(pqp)};
        CHECK(diwarp_device_gid(peer->dev, &a.dgid));
        CHECK(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN));
        a.qp_state = DIWARP_QPS_RTS;
        CHECK(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE));
}

static void post_recv(int q, int k)
{
        struct diwarp_sge sge = {(uintptr_t)y_recv(q, k), SLOT_LEN, Y.lkey};
        struct diwarp_recv_wr wr = {
            .wr_id = (uint64_t)q << 32 | (uint64_t)k, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        CHECK(diwarp_post_recv(yqp[q], &wr, &bad));
}

static void post_send_retry(struct diwarp_qp *qp, struct diwarp_send_wr *wr)
{
        struct diwarp_send_wr *bad;
        uint64_t end = now_ms() + 30000;
        for (;;) {
                int r = diwarp_post_send(qp, wr, &bad);
                if (r == 0)
                        return;
                if (r != -ENOMEM)
                        die("post_send: %s", strerror(-r));
                if (now_ms() > end || atomic_load(&failed))
                        die("SQ stays full");
                sched_yield();
        }
}

static void *poster(void *arg)
{
        int q = (int)(intptr_t)arg;
        struct qstate *s = &qs[q];
        long posted = 0;
        for (int seq = 0; seq < nmsg; seq++) {
                int k = seq % SLOTS;
                uint64_t end = now_ms() + 30000;
                /* A receive is free, the Write slot's previous message was
                 * verified, and the source slot's previous WRs completed. */
                while (seq - atomic_load(&s->verified) >= SLOTS ||
                       (seq >= SLOTS && atomic_load(&s->slot_seq[k]) != seq - SLOTS) ||
                       (seq >= SLOTS &&
                        atomic_load(&s->send_done) < s->wr_posted_through[seq - SLOTS])) {
                        if (atomic_load(&failed))
                                return NULL;
                        if (now_ms() > end)
                                die("QP %d: message %d waits for credit forever", q, seq);
                        sched_yield();
                }
                uint8_t *src = x_src(q, k);
                uint32_t len = msg_len(q, seq);
                struct hdr h = {MAGIC, (uint32_t)q, (uint32_t)seq, len};
                memcpy(src, &h, sizeof(h));
                for (uint32_t i = 0; i < len; i++)
                        src[HDR + i] = pat(q, seq, i);
                bool write = seq & 1;
                if (write) {
                        struct diwarp_sge sge = {(uintptr_t)src + HDR, len, X.lkey};
                        struct diwarp_send_wr w = {.wr_id = (uint64_t)q << 32 | 0x80000000u |
                                                            (uint64_t)seq,
                                                   .sg_list = &sge,
                                                   .num_sge = 1,
                                                   .opcode = DIWARP_WR_RDMA_WRITE,
                                                   .send_flags = DIWARP_SEND_SIGNALED};
                        w.wr.rdma.remote_addr = (uintptr_t)y_write(q, k);
                        w.wr.rdma.rkey = Y.rkey;
                        post_send_retry(xqp[q], &w);
                        posted++;
                }
                /* The Send: header (+ payload for a Send message), as two SGEs. */
                struct diwarp_sge sge[2] = {{(uintptr_t)src, HDR, X.lkey},
                                            {(uintptr_t)src + HDR, len, X.lkey}};
                struct diwarp_send_wr w = {.wr_id = (uint64_t)q << 32 | (uint64_t)seq,
                                           .sg_list = sge,
                                           .num_sge = write ? 1 : 2,
                                           .opcode = DIWARP_WR_SEND,
                                           .send_flags = DIWARP_SEND_SIGNALED};
                post_send_retry(xqp[q], &w);
                posted++;
                s->wr_posted_through[seq] = posted;
        }
        return NULL;
}

static void verify_recv(const struct diwarp_wc *wc)
{
        if (wc->status != DIWARP_WC_SUCCESS)
                die("receive completion: %s", diwarp_wc_status_str(wc->status));
        int q = (int)(wc->wr_id >> 32), k = (int)(wc->wr_id & 0xffffffffu);
        if (q < 0 || q >= NQP || k < 0 || k >= SLOTS)
                die("receive wr_id %#llx", (unsigned long long)wc->wr_id);
        if (wc->qp_num != diwarp_qp_num(yqp[q]))
                die("receive of QP %d completed for QPN %#x", q, wc->qp_num);
        const uint8_t *r = y_recv(q, k);
        struct hdr h;
        memcpy(&h, r, sizeof(h));
        if (h.magic != MAGIC || (int)h.q != q || h.seq >= (uint32_t)nmsg ||
            h.len != msg_len(q, (int)h.seq))
                die("QP %d: bad message header (q %u seq %u len %u)", q, h.q, h.seq, h.len);
        int seq = (int)h.seq;
        bool write = seq & 1;
        const uint8_t *data = write ? y_write(q, seq % SLOTS) : r + HDR;
        if (wc->byte_len != (write ? HDR : HDR + h.len))
                die("QP %d seq %d: byte_len %u", q, seq, wc->byte_len);
        for (uint32_t i = 0; i < h.len; i++)
                if (data[i] != pat(q, seq, i))
                        die("QP %d seq %d (%s): byte %u differs", q, seq, write ? "Write" : "Send",
                            i);
        atomic_fetch_add(&bytes_checked, (long)h.len);
        if (atomic_exchange(&qs[q].seen[seq], 1))
                die("QP %d seq %d received twice", q, seq);
        /* Repost before the credit goes back, so the poster always finds a
         * receive for its next Send. */
        post_recv(q, k);
        atomic_store(&qs[q].slot_seq[seq % SLOTS], seq);
        atomic_fetch_add(&qs[q].verified, 1);
        atomic_fetch_add(&recv_total, 1);
}

static void *poller(void *arg)
{
        (void)arg;
        struct diwarp_wc wc[16];
        uint64_t end = now_ms() + 90000;
        while (atomic_load(&recv_total) < (long)NQP * nmsg ||
               atomic_load(&send_total) < send_expected) {
                if (atomic_load(&failed))
                        return NULL;
                int n = diwarp_cq_poll(X.cq, 16, wc);
                if (n < 0)
                        die("poll X: %s", strerror(-n));
                for (int i = 0; i < n; i++) {
                        if (wc[i].status != DIWARP_WC_SUCCESS)
                                die("send completion %#llx: %s", (unsigned long long)wc[i].wr_id,
                                    diwarp_wc_status_str(wc[i].status));
                        int q = (int)(wc[i].wr_id >> 32);
                        if (q < 0 || q >= NQP)
                                die("send wr_id %#llx", (unsigned long long)wc[i].wr_id);
                        atomic_fetch_add(&qs[q].send_done, 1);
                        atomic_fetch_add(&send_total, 1);
                }
                n = diwarp_cq_poll(Y.cq, 16, wc);
                if (n < 0)
                        die("poll Y: %s", strerror(-n));
                for (int i = 0; i < n; i++)
                        verify_recv(&wc[i]);
                if (now_ms() > end)
                        die("not done in 90 s (recv %ld, send %ld)", atomic_load(&recv_total),
                            atomic_load(&send_total));
        }
        return NULL;
}

int main(int argc, char **argv)
{
        bool thread = argc > 1 && strcmp(argv[1], "thread") == 0;
        if (argc > 2)
                nmsg = atoi(argv[2]);
        if (nmsg < 1 || nmsg > 65536)
                die("bad message count");
        alarm(150);
        setenv("DIWARP_PROGRESS", thread ? "thread" : "app", 1);
        dev_open(&X, (size_t)NQP * SLOTS * SLOT_LEN);
        dev_open(&Y, (size_t)NQP * 2 * SLOTS * SLOT_LEN);
        for (int q = 0; q < NQP; q++) {
                xqp[q] = qp_make(&X);
                yqp[q] = qp_make(&Y);
                for (int k = 0; k < SLOTS; k++) {
                        post_recv(q, k);
                        atomic_store(&qs[q].slot_seq[k], -1);
                }
                qs[q].seen = calloc((size_t)nmsg, 1);
                if (!qs[q].seen)
                        die("alloc");
        }
        for (int q = 0; q < NQP; q++) {
                qp_connect(xqp[q], &Y, yqp[q]);
                qp_connect(yqp[q], &X, xqp[q]);
        }
        send_expected = (long)NQP * (nmsg + nmsg / 2);
        uint64_t t0 = now_ms();
        pthread_t post[NQP], poll[NPOLL];
        for (int i = 0; i < NPOLL; i++)
                pthread_create(&poll[i], NULL, poller, NULL);
        for (int q = 0; q < NQP; q++)
                pthread_create(&post[q], NULL, poster, (void *)(intptr_t)q);
        for (int q = 0; q < NQP; q++)
                pthread_join(post[q], NULL);
        for (int i = 0; i < NPOLL; i++)
                pthread_join(poll[i], NULL);
        for (int q = 0; q < NQP; q++) {
                for (int seq = 0; seq < nmsg; seq++)
                        if (!qs[q].seen[seq])
                                die("QP %d: message %d never arrived", q, seq);
                if (diwarp_qp_state(xqp[q]) != DIWARP_QPS_RTS ||
                    diwarp_qp_state(yqp[q]) != DIWARP_QPS_RTS)
                        die("QP %d left RTS", q);
        }
        if (atomic_load(&send_total) != send_expected)
                die("%ld send completions, expected %ld", atomic_load(&send_total), send_expected);
        printf("rc_threads%s: %d QPs x %d messages (%ld payload bytes checked), %d pollers: ok in "
               "%llu ms\n",
               thread ? " (progress thread)" : "", NQP, nmsg, atomic_load(&bytes_checked), NPOLL,
               (unsigned long long)(now_ms() - t0));
        for (int q = 0; q < NQP; q++) {
                CHECK(diwarp_qp_destroy(xqp[q]));
                CHECK(diwarp_qp_destroy(yqp[q]));
                free(qs[q].seen);
        }
        struct dev *ds[2] = {&X, &Y};
        for (int i = 0; i < 2; i++) {
                CHECK(diwarp_mr_dereg(ds[i]->mr));
                CHECK(diwarp_cq_destroy(ds[i]->cq));
                CHECK(diwarp_pd_dealloc(ds[i]->pd));
                CHECK(diwarp_device_close(ds[i]->dev));
                free(ds[i]->buf);
        }
        return 0;
}
