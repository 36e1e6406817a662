/* RC over TCP/MPA, end to end between two devices of one process (every byte
 * crosses a real loopback TCP stream): IB-style connect and the native CM,
 * every RDMAP operation at sizes 0..64 MiB checked byte for byte, and the
 * protection / error paths (Terminate -> both QPs in ERR, right statuses). */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#include "wire/crc32c.h"
#include "wire/mpa.h"

#define MAXBUF ((64u << 20) + 4096)
#define ALL_ACCESS                                                                                 \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC)

struct side {
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        uint8_t *buf;
        size_t len;
        bool mapped;                    /* buf is an mmap (pages touched only as used) */
        struct diwarp_comp_channel *ch; /* side_init_ex with a channel */
        uint32_t lkey, rkey;
        struct diwarp_pd *srq_pd; /* side_srq: a PD of its own, */
        struct diwarp_srq *srq;   /* the SRQ in it that the QP receives from */
        struct diwarp_mr *srq_mr; /* and a region of it, if the test makes one */
};

static struct side A, B;
/* Set: side_init_ex gives the QP an SRQ, in a second PD of the device. */
static bool side_srq;

static uint64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* with_channel: the CQ gets a completion channel (which also starts the
 * device's progress thread); mapped: the buffer is an anonymous mmap, so a
 * 1 GiB buffer costs RAM only for the pages a test touches. */
static void side_init_ex(struct side *s, size_t len, int access, bool with_channel, bool mapped)
{
        memset(s, 0, sizeof(*s));
        cr_assert_eq(diwarp_device_open(NULL, &s->dev), 0);
        cr_assert_eq(diwarp_pd_alloc(s->dev, &s->pd), 0);
        if (with_channel)
                cr_assert_eq(diwarp_comp_channel_create(s->dev, &s->ch), 0);
        cr_assert_eq(diwarp_cq_create(s->dev, 1024, NULL, s->ch, &s->cq), 0);
        struct diwarp_qp_init_attr ia = {.send_cq = s->cq,
                                         .recv_cq = s->cq,
                                         .qp_type = DIWARP_QPT_RC,
                                         .cap = {.max_send_wr = 256,
                                                 .max_recv_wr = 256,
                                                 .max_send_sge = 4,
                                                 .max_recv_sge = 4,
                                                 .max_inline_data = 64}};
        if (side_srq) {
                struct diwarp_srq_attr sa = {.max_wr = 16, .max_sge = 1};
                cr_assert_eq(diwarp_pd_alloc(s->dev, &s->srq_pd), 0);
                cr_assert_eq(diwarp_srq_create(s->srq_pd, &sa, NULL, &s->srq), 0);
                ia.srq = s->srq;
        }
        cr_assert_eq(diwarp_qp_create(s->pd, &ia, &s->qp), 0);
        s->len = len;
        s->mapped = mapped;
        if (mapped) {
                s->buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                cr_assert_neq(s->buf, MAP_FAILED);
        } else {
                s->buf = aligned_alloc(4096, len);
                cr_assert_not_null(s->buf);
                memset(s->buf, 0, len);
        }
        cr_assert_eq(diwarp_mr_reg(s->pd, s->buf, len, (uintptr_t)s->buf, access, &s->mr), 0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(s->mr, &mi);
        s->lkey = mi.lkey;
        s->rkey = mi.rkey;
}

static void side_init(struct side *s, size_t len, int access)
{
        side_init_ex(s, len, access, false, false);
}

static void side_fini(struct side *s)
{
        if (!s->dev)
                return;
        if (s->qp)
                cr_expect_eq(diwarp_qp_destroy(s->qp), 0);
        if (s->srq) {
                if (s->srq_mr)
                        cr_expect_eq(diwarp_mr_dereg(s->srq_mr), 0);
                cr_expect_eq(diwarp_srq_destroy(s->srq), 0);
                cr_expect_eq(diwarp_pd_dealloc(s->srq_pd), 0);
        }
        cr_expect_eq(diwarp_mr_dereg(s->mr), 0);
        cr_expect_eq(diwarp_cq_destroy(s->cq), 0);
        if (s->ch)
                cr_expect_eq(diwarp_comp_channel_destroy(s->ch), 0);
        cr_expect_eq(diwarp_pd_dealloc(s->pd), 0);
        cr_expect_eq(diwarp_device_close(s->dev), 0);
        if (s->mapped)
                munmap(s->buf, s->len);
        else
                free(s->buf);
        memset(s, 0, sizeof(*s));
}

static void to_init(struct side *s)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .qp_access_flags = DIWARP_ACCESS_REMOTE_WRITE |
                                                      DIWARP_ACCESS_REMOTE_READ |
                                                      DIWARP_ACCESS_REMOTE_ATOMIC,
                                   .port_num = 1};
        cr_assert_eq(diwarp_qp_modify(s->qp, &a,
                                      DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS | DIWARP_QP_PORT |
                                          DIWARP_QP_PKEY_INDEX),
                     0);
}

static void to_rtr_rts(struct side *s, struct side *peer)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTR,
                                   .dest_qp_num = diwarp_qp_num(peer->qp),
                                   .path_mtu = 4096,
                                   .max_dest_rd_atomic = 16};
        cr_assert_eq(diwarp_device_gid(peer->dev, &a.dgid), 0);
        cr_assert_eq(diwarp_qp_modify(s->qp, &a,
                                      DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN |
                                          DIWARP_QP_PATH_MTU | DIWARP_QP_RQ_PSN |
                                          DIWARP_QP_MAX_DEST_RD_ATOMIC | DIWARP_QP_MIN_RNR_TIMER),
                     0);
}

static void to_rts(struct side *s)
{
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTS, .max_rd_atomic = 16, .timeout = 14};
        cr_assert_eq(diwarp_qp_modify(s->qp, &a,
                                      DIWARP_QP_STATE | DIWARP_QP_SQ_PSN | DIWARP_QP_TIMEOUT |
                                          DIWARP_QP_RETRY_CNT | DIWARP_QP_RNR_RETRY |
                                          DIWARP_QP_MAX_QP_RD_ATOMIC),
                     0);
}

static void progress_both(void)
{
        diwarp_progress(A.dev, 64);
        if (B.dev)
                diwarp_progress(B.dev, 64);
}

/* IB-style: both to RTR (either order), then RTS; the stream comes up while
 * we drive progress. */
static void pair_ib(size_t len)
{
        side_init(&A, len, ALL_ACCESS);
        side_init(&B, len, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        to_rtr_rts(&A, &B);
        to_rtr_rts(&B, &A);
        to_rts(&A);
        to_rts(&B);
}

/* The same with mmap'd buffers (and optionally a channel on B). */
static void pair_ib_ex(size_t len, bool b_channel, bool mapped)
{
        side_init_ex(&A, len, ALL_ACCESS, false, mapped);
        side_init_ex(&B, len, ALL_ACCESS, b_channel, mapped);
        to_init(&A);
        to_init(&B);
        to_rtr_rts(&A, &B);
        to_rtr_rts(&B, &A);
        to_rts(&A);
        to_rts(&B);
}

static void pair_fini(void)
{
        side_fini(&A);
        side_fini(&B);
}

/* Waits for one completion on s; drives both devices. */
static struct diwarp_wc wait_wc(struct side *s, int timeout_ms)
{
        struct diwarp_wc wc;
        uint64_t end = now_ms() + (uint64_t)timeout_ms;
        for (;;) {
                int n = diwarp_cq_poll(s->cq, 1, &wc);
                cr_assert_geq(n, 0);
                if (n == 1)
                        return wc;
                progress_both();
                cr_assert_lt(now_ms(), end, "no completion within %d ms", timeout_ms);
        }
}

static bool poll_none(struct side *s, int ms)
{
        struct diwarp_wc wc;
        uint64_t end = now_ms() + (uint64_t)ms;
        while (now_ms() < end) {
                if (diwarp_cq_poll(s->cq, 1, &wc) != 0)
                        return false;
                progress_both();
        }
        return true;
}

static void post_recv(struct side *s, uint64_t id, size_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + off, len, s->lkey};
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};
        struct diwarp_recv_wr *bad;
        cr_assert_eq(diwarp_post_recv(s->qp, &wr, &bad), 0);
}

static int post_send(struct side *s, enum diwarp_wr_opcode op, uint64_t id, size_t off,
                     uint32_t len, uint64_t raddr, uint32_t rkey, unsigned flags)
{
        struct diwarp_sge sge = {(uintptr_t)s->buf + off, len, s->lkey};
        struct diwarp_send_wr wr = {.wr_id = id,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = op,
                                    .send_flags = DIWARP_SEND_SIGNALED | flags};
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        struct diwarp_send_wr *bad;
        return diwarp_post_send(s->qp, &wr, &bad);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
        uint32_t x = seed * 2654435761u + 1;
        for (size_t i = 0; i < n; i++) {
                x = x * 1103515245u + 12345u;
                p[i] = (uint8_t)(x >> 16);
        }
}

/* wc.vendor_err of a Terminate-caused error: layer << 12 | type << 8 | code
 * (RFC 5040 §4.8 values). */
#define VE(layer, type, code)      ((layer) << 12 | (type) << 8 | (code))
#define VE_RDMAP_INVALID_STAG      VE(0, 1, 0x00)
#define VE_RDMAP_BASE_BOUNDS       VE(0, 1, 0x01)
#define VE_RDMAP_ACCESS_RIGHTS     VE(0, 1, 0x02)
#define VE_DDP_TAGGED_INVALID_STAG VE(1, 1, 0x00)
#define VE_DDP_TAGGED_BOUNDS       VE(1, 1, 0x01)
#define VE_DDP_TAGGED_NOT_ON_QP    VE(1, 1, 0x02)
#define VE_DDP_NO_BUFFER           VE(1, 2, 0x02)
#define VE_DDP_MSG_TOO_LONG        VE(1, 2, 0x05)
#define VE_LLP_CRC                 VE(2, 0, 0x02)

static const uint32_t sizes[] = {0, 1, 4095, 4096, 65536, 1u << 20, 64u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

TestSuite(rc, .fini = pair_fini, .timeout = 120);

Test(rc, ib_connect_send_all_sizes)
{
        pair_ib(MAXBUF);
        for (unsigned i = 0; i < NSIZES; i++) {
                uint32_t n = sizes[i];
                fill(A.buf, n, i + 1);
                memset(B.buf, 0xee, n + 16);
                post_recv(&B, 100 + i, 0, n + 16);
                cr_assert_eq(post_send(&A, DIWARP_WR_SEND, i, 0, n, 0, 0, 0), 0);
                struct diwarp_wc w = wait_wc(&A, 20000);
                cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "size %u: %s", n,
                             diwarp_wc_status_str(w.status));
                cr_assert_eq(w.opcode, DIWARP_WC_SEND);
                cr_assert_eq(w.wr_id, i);
                w = wait_wc(&B, 20000);
                cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "size %u", n);
                cr_assert_eq(w.opcode, DIWARP_WC_RECV);
                cr_assert_eq(w.wr_id, 100 + i);
                cr_assert_eq(w.byte_len, n);
                cr_assert_eq(memcmp(A.buf, B.buf, n), 0, "size %u: data differs", n);
                cr_assert_eq(B.buf[n], 0xee, "size %u: wrote past the message", n);
        }
}

/* diwarpdv_qp_stat: a QP's line in `diwarp stat` (the daemon's answer and
 * every process's published statistics are filled by it). */
Test(rc, qp_stat_names_the_peer_and_counts_the_traffic)
{
        /* Through the stream, where the QP's packet counters count it. */
        setenv("DIWARP_LOCAL_COPY", "0", 1);
        pair_ib(4096);
        post_recv(&B, 1, 0, 512);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 2, 0, 300, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wait_wc(&B, 5000).status, DIWARP_WC_SUCCESS);
        struct diwarpdv_qp_stat st, sb;
        struct diwarp_counters ctr;
        union diwarp_gid gb;
        cr_assert_eq(diwarpdv_qp_stat(A.qp, &st), 0);
        cr_assert_eq(diwarp_qp_counters(A.qp, &ctr), 0);
        cr_assert_eq(diwarp_device_gid(B.dev, &gb), 0);
        cr_assert_eq(st.pid, getpid());
        cr_assert_eq(st.qpn, diwarp_qp_num(A.qp));
        cr_assert_eq(st.type, DIWARP_QPT_RC);
        cr_assert_eq(st.state, DIWARP_QPS_RTS);
        cr_assert_eq(st.peer_qpn, diwarp_qp_num(B.qp));
        cr_assert_arr_eq(st.peer.raw, gb.raw, sizeof(gb.raw));
        cr_assert_geq(st.tx_bytes, 300);
        cr_assert_eq(st.tx_bytes, ctr.tx_bytes);
        cr_assert_eq(st.tx_packets, ctr.tx_packets);
        cr_assert_eq(st.rx_packets, ctr.rx_packets);
        cr_assert_eq(diwarpdv_qp_stat(B.qp, &sb), 0);
        cr_assert_eq(sb.peer_qpn, diwarp_qp_num(A.qp));
        cr_assert_geq(sb.rx_bytes, 300);
        cr_assert_eq(diwarpdv_qp_stat(NULL, &st), -EINVAL);
        cr_assert_eq(diwarpdv_qp_stat(A.qp, NULL), -EINVAL);
}

Test(rc, write_and_read_all_sizes)
{
        pair_ib(MAXBUF);
        for (unsigned i = 0; i < NSIZES; i++) {
                uint32_t n = sizes[i];
                /* Write A -> B at offset 0. */
                fill(A.buf, n, 10 + i);
                memset(B.buf, 0, n + 16);
                cr_assert_eq(
                    post_send(&A, DIWARP_WR_RDMA_WRITE, i, 0, n, (uintptr_t)B.buf, B.rkey, 0), 0);
                struct diwarp_wc w = wait_wc(&A, 20000);
                cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "write %u: %s", n,
                             diwarp_wc_status_str(w.status));
                cr_assert_eq(w.opcode, DIWARP_WC_RDMA_WRITE);
                /* A Read behind the Write returns only after the Write is placed. */
                memset(A.buf, 0, n + 16);
                cr_assert_eq(
                    post_send(&A, DIWARP_WR_RDMA_READ, 1000 + i, 0, n, (uintptr_t)B.buf, B.rkey, 0),
                    0);
                w = wait_wc(&A, 20000);
                cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "read %u: %s", n,
                             diwarp_wc_status_str(w.status));
                cr_assert_eq(w.opcode, DIWARP_WC_RDMA_READ);
                cr_assert_eq(w.byte_len, n);
                uint8_t *ref = malloc(n + 1);
                fill(ref, n, 10 + i);
                cr_assert_eq(memcmp(B.buf, ref, n), 0, "write %u: target differs", n);
                cr_assert_eq(memcmp(A.buf, ref, n), 0, "read %u: sink differs", n);
                cr_assert_eq(A.buf[n], 0, "read %u: wrote past the sink", n);
                free(ref);
                cr_assert(poll_none(&B, 1), "RDMA Write/Read must not complete at the target");
        }
}

Test(rc, multi_sge_and_many_outstanding_reads)
{
        pair_ib(1 << 20);
        fill(B.buf, 1 << 20, 77);
        /* 32 reads of 8 KiB, two SGEs each, posted at once: more than ORD (16),
         * the excess waits on our side and all complete in order. */
        for (int i = 0; i < 32; i++) {
                struct diwarp_sge sge[2] = {{(uintptr_t)A.buf + i * 8192, 3000, A.lkey},
                                            {(uintptr_t)A.buf + i * 8192 + 3000, 5192, A.lkey}};
                struct diwarp_send_wr wr = {.wr_id = (uint64_t)i,
                                            .sg_list = sge,
                                            .num_sge = 2,
                                            .opcode = DIWARP_WR_RDMA_READ,
                                            .send_flags = DIWARP_SEND_SIGNALED};
                wr.wr.rdma.remote_addr = (uintptr_t)B.buf + i * 8192;
                wr.wr.rdma.rkey = B.rkey;
                struct diwarp_send_wr *bad;
                cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        }
        for (int i = 0; i < 32; i++) {
                struct diwarp_wc w = wait_wc(&A, 10000);
                cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
                cr_assert_eq(w.wr_id, (uint64_t)i, "completions in order");
        }
        cr_assert_eq(memcmp(A.buf, B.buf, 32 * 8192), 0);
}

Test(rc, immediate_data)
{
        pair_ib(1 << 20);
        /* RDMA Write with Immediate: data placed, one receive WQE consumed. */
        fill(A.buf, 5000, 3);
        post_recv(&B, 7, 0, 0);
        struct diwarp_sge sge = {(uintptr_t)A.buf, 5000, A.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .imm_data = htonl(0xabcd1234)};
        wr.wr.rdma.remote_addr = (uintptr_t)B.buf + 8192;
        wr.wr.rdma.rkey = B.rkey;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_RDMA_WRITE);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_RECV_RDMA_WITH_IMM);
        cr_assert_eq(w.wr_id, 7);
        cr_assert(w.wc_flags & DIWARP_WC_WITH_IMM);
        cr_assert_eq(ntohl(w.imm_data), 0xabcd1234);
        cr_assert_eq(w.byte_len, 5000);
        cr_assert_eq(memcmp(A.buf, B.buf + 8192, 5000), 0);

        /* A plain Write before it does not count: byte_len is the Write
         * with Immediate's own length. */
        wr.opcode = DIWARP_WR_RDMA_WRITE;
        sge.length = 512;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        post_recv(&B, 9, 0, 0);
        wr.opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM;
        sge.length = 64;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_RECV_RDMA_WITH_IMM);
        cr_assert_eq(w.wr_id, 9);
        cr_assert_eq(w.byte_len, 64);

        /* Send with Immediate: one receive WQE gets data and immediate. */
        post_recv(&B, 8, 0, 4096);
        wr.opcode = DIWARP_WR_SEND_WITH_IMM;
        wr.imm_data = htonl(42);
        wr.wr_id = 2;
        sge.length = 100;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_RECV);
        cr_assert_eq(w.wr_id, 8);
        cr_assert_eq(w.byte_len, 100);
        cr_assert(w.wc_flags & DIWARP_WC_WITH_IMM);
        cr_assert_eq(ntohl(w.imm_data), 42);
        cr_assert_eq(memcmp(A.buf, B.buf, 100), 0);
        cr_assert(poll_none(&B, 50), "exactly one receive completion per message");
}

Test(rc, atomics)
{
        pair_ib(1 << 16);
        uint64_t *target = (uint64_t *)(B.buf + 64);
        *target = 1000;
        struct diwarp_sge sge = {(uintptr_t)A.buf, 8, A.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_ATOMIC_FETCH_AND_ADD,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = B.rkey;
        wr.wr.atomic.compare_add = 23;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_FETCH_ADD);
        cr_assert_eq(*(uint64_t *)A.buf, 1000);
        cr_assert_eq(*target, 1023);

        /* CAS that matches, then one that does not. */
        wr.opcode = DIWARP_WR_ATOMIC_CMP_AND_SWP;
        wr.wr.atomic.compare_add = 1023;
        wr.wr.atomic.swap = 7;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_COMP_SWAP);
        cr_assert_eq(*(uint64_t *)A.buf, 1023);
        cr_assert_eq(*target, 7);
        wr.wr.atomic.compare_add = 1;
        wr.wr.atomic.swap = 99;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(*(uint64_t *)A.buf, 7);
        cr_assert_eq(*target, 7);
}

/* An Atomic and a Write to the same word, posted as one list, reach the
 * responder in one stream batch: the Atomic runs as it arrives, before the
 * Write behind it is placed (stream order), so it returns the value from
 * before both and the Write's value is what stays. Run when its response
 * was built instead, it returned the Write's value and added to it. */
Test(rc, atomic_runs_before_the_write_behind_it)
{
        pair_ib(1 << 16);
        uint64_t *target = (uint64_t *)(B.buf + 64);
        for (int round = 0; round < 20; round++) {
                *target = 1000;
                uint64_t later = 5000 + (uint64_t)round;
                memcpy(A.buf + 64, &later, 8);
                memset(A.buf, 0, 8);
                struct diwarp_sge asge = {(uintptr_t)A.buf, 8, A.lkey};
                struct diwarp_sge wsge = {(uintptr_t)A.buf + 64, 8, A.lkey};
                struct diwarp_send_wr wr[2] = {{.wr_id = 1,
                                                .sg_list = &asge,
                                                .num_sge = 1,
                                                .opcode = DIWARP_WR_ATOMIC_FETCH_AND_ADD,
                                                .send_flags = DIWARP_SEND_SIGNALED},
                                               {.wr_id = 2,
                                                .sg_list = &wsge,
                                                .num_sge = 1,
                                                .opcode = DIWARP_WR_RDMA_WRITE,
                                                .send_flags = DIWARP_SEND_SIGNALED}};
                wr[0].next = &wr[1];
                wr[0].wr.atomic.remote_addr = (uintptr_t)target;
                wr[0].wr.atomic.rkey = B.rkey;
                wr[0].wr.atomic.compare_add = 23;
                wr[1].wr.rdma.remote_addr = (uintptr_t)target;
                wr[1].wr.rdma.rkey = B.rkey;
                struct diwarp_send_wr *bad;
                cr_assert_eq(diwarp_post_send(A.qp, wr, &bad), 0);
                for (int i = 0; i < 2; i++)
                        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
                cr_assert_eq(*(uint64_t *)A.buf, 1000, "round %d: the Atomic returned %llu", round,
                             (unsigned long long)*(uint64_t *)A.buf);
                cr_assert_eq(*target, later, "round %d: the word holds %llu", round,
                             (unsigned long long)*target);
        }
}

Test(rc, send_with_invalidate_and_local_invalidate)
{
        pair_ib(1 << 16);
        /* A second MR on B that A will invalidate remotely. */
        struct diwarp_mr *mr2;
        cr_assert_eq(
            diwarp_mr_reg(B.pd, B.buf + 4096, 4096, (uintptr_t)B.buf + 4096, ALL_ACCESS, &mr2), 0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(mr2, &mi);
        post_recv(&B, 5, 0, 64);
        struct diwarp_sge sge = {(uintptr_t)A.buf, 10, A.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND_WITH_INV,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .invalidate_rkey = mi.rkey};
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert(w.wc_flags & DIWARP_WC_WITH_INV);
        cr_assert_eq(w.invalidated_rkey, mi.rkey);

        /* The invalidated STag is dead: an RDMA Read from it fails remotely. */
        cr_assert_eq(
            post_send(&A, DIWARP_WR_RDMA_READ, 3, 0, 16, (uintptr_t)B.buf + 4096, mi.rkey, 0), 0);
        w = wait_wc(&A, 5000);
        cr_assert_eq(w.wr_id, 3);
        cr_assert_eq(w.status, DIWARP_WC_REM_ACCESS_ERR, "got %s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.vendor_err, VE_RDMAP_INVALID_STAG, "vendor_err %#x", w.vendor_err);
        diwarp_mr_dereg(mr2);
}

Test(rc, local_invalidate)
{
        pair_ib(1 << 16);
        struct diwarp_mr *mr2;
        cr_assert_eq(
            diwarp_mr_reg(A.pd, A.buf + 4096, 4096, (uintptr_t)A.buf + 4096, ALL_ACCESS, &mr2), 0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(mr2, &mi);
        /* Before: B can read it. */
        cr_assert_eq(
            post_send(&B, DIWARP_WR_RDMA_READ, 1, 0, 16, (uintptr_t)A.buf + 4096, mi.rkey, 0), 0);
        cr_assert_eq(wait_wc(&B, 5000).status, DIWARP_WC_SUCCESS);
        struct diwarp_send_wr li = {.wr_id = 2,
                                    .opcode = DIWARP_WR_LOCAL_INV,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .invalidate_rkey = mi.rkey};
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &li, &bad), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_LOCAL_INV);
        /* After: the Read fails with a remote access error, both QPs go to ERR. */
        cr_assert_eq(
            post_send(&B, DIWARP_WR_RDMA_READ, 3, 0, 16, (uintptr_t)A.buf + 4096, mi.rkey, 0), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 3);
        cr_assert_eq(w.status, DIWARP_WC_REM_ACCESS_ERR, "got %s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.vendor_err, VE_RDMAP_INVALID_STAG, "vendor_err %#x", w.vendor_err);
        uint64_t end = now_ms() + 5000;
        while (diwarp_qp_state(A.qp) != DIWARP_QPS_ERR && now_ms() < end)
                progress_both();
        cr_assert_eq(diwarp_qp_state(A.qp), DIWARP_QPS_ERR);
        cr_assert_eq(diwarp_qp_state(B.qp), DIWARP_QPS_ERR);
        diwarp_mr_dereg(mr2);
}

/* ---- protection and error paths ---- */

static bool got_async(struct side *s, enum diwarp_event_type type, int ms)
{
        int fd = diwarp_async_fd(s->dev);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        uint64_t end = now_ms() + (uint64_t)ms;
        while (now_ms() < end) {
                struct diwarp_async_event ev;
                int r = diwarp_get_async_event(s->dev, &ev);
                if (r == 0 && ev.event_type == type && ev.element.qp == s->qp)
                        return true;
                progress_both();
        }
        return false;
}

static void wait_err(struct side *s)
{
        uint64_t end = now_ms() + 5000;
        while (diwarp_qp_state(s->qp) != DIWARP_QPS_ERR && now_ms() < end)
                progress_both();
        cr_assert_eq(diwarp_qp_state(s->qp), DIWARP_QPS_ERR);
}

/* After an error both QPs are in ERR and new work flushes. */
static void check_dead(void)
{
        wait_err(&A);
        wait_err(&B);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 99, 0, 1, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&A, 2000);
        cr_assert_eq(w.wr_id, 99);
        cr_assert_eq(w.status, DIWARP_WC_WR_FLUSH_ERR);
}

Test(rc, read_bad_stag)
{
        pair_ib(1 << 16);
        cr_assert_eq(
            post_send(&A, DIWARP_WR_RDMA_READ, 1, 0, 64, (uintptr_t)B.buf, B.rkey ^ 0x5a, 0), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_REM_ACCESS_ERR, "got %s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.vendor_err, VE_RDMAP_INVALID_STAG, "vendor_err %#x", w.vendor_err);
        cr_assert(got_async(&A, DIWARP_EVENT_QP_ACCESS_ERR, 2000));
        cr_assert(got_async(&B, DIWARP_EVENT_QP_ACCESS_ERR, 2000));
        check_dead();
}

Test(rc, read_out_of_bounds)
{
        pair_ib(1 << 16);
        cr_assert_eq(post_send(&A, DIWARP_WR_RDMA_READ, 1, 0, 64, (uintptr_t)B.buf + (1 << 16) - 32,
                               B.rkey, 0),
                     0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_REM_ACCESS_ERR);
        cr_assert_eq(w.vendor_err, VE_RDMAP_BASE_BOUNDS, "vendor_err %#x", w.vendor_err);
        check_dead();
}

/* vendor_err: the Terminate's code, asserted when the Terminate still found
 * the Write outstanding (else the Write completed at hand-off to TCP). */
static void write_must_fail(uint64_t raddr, uint32_t rkey, uint32_t len, uint8_t *guard,
                            size_t guard_len, uint32_t vendor_err)
{
        uint8_t *copy = malloc(guard_len);
        memcpy(copy, guard, guard_len);
        memset(A.buf, 0x77, len);
        cr_assert_eq(post_send(&A, DIWARP_WR_RDMA_WRITE, 1, 0, len, raddr, rkey, 0), 0);
        /* The Write completes when handed to TCP (iWARP semantics) unless the
         * Terminate overtakes it; either way the QP then dies. */
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert(w.status == DIWARP_WC_SUCCESS || w.status == DIWARP_WC_REM_ACCESS_ERR, "got %s",
                  diwarp_wc_status_str(w.status));
        if (w.status == DIWARP_WC_REM_ACCESS_ERR)
                cr_assert_eq(w.vendor_err, vendor_err, "vendor_err %#x, want %#x", w.vendor_err,
                             vendor_err);
        else
                cr_assert_eq(w.vendor_err, 0);
        cr_log_info("write of %u bytes: %s, vendor_err %#x", len, diwarp_wc_status_str(w.status),
                    w.vendor_err);
        cr_assert(got_async(&A, DIWARP_EVENT_QP_ACCESS_ERR, 3000));
        check_dead();
        cr_assert_eq(memcmp(copy, guard, guard_len), 0, "target memory was touched");
        free(copy);
}

Test(rc, write_bad_stag)
{
        pair_ib(1 << 16);
        write_must_fail((uintptr_t)B.buf, B.rkey + 0x100, 128, B.buf, B.len,
                        VE_DDP_TAGGED_INVALID_STAG);
}

Test(rc, write_out_of_bounds)
{
        pair_ib(1 << 16);
        write_must_fail((uintptr_t)B.buf + B.len - 64, B.rkey, 128, B.buf, B.len,
                        VE_DDP_TAGGED_BOUNDS);
}

Test(rc, write_large_bad_stag)
{
        pair_ib(8 << 20);
        write_must_fail((uintptr_t)B.buf, B.rkey ^ 1, 8 << 20, B.buf, B.len,
                        VE_DDP_TAGGED_INVALID_STAG);
}

Test(rc, write_without_remote_write_right)
{
        side_init(&A, 1 << 16, ALL_ACCESS);
        side_init(&B, 1 << 16, DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_READ);
        to_init(&A);
        to_init(&B);
        to_rtr_rts(&A, &B);
        to_rtr_rts(&B, &A);
        to_rts(&A);
        to_rts(&B);
        write_must_fail((uintptr_t)B.buf, B.rkey, 100, B.buf, B.len, VE_RDMAP_ACCESS_RIGHTS);
}

Test(rc, write_pd_mismatch)
{
        pair_ib(1 << 16);
        struct diwarp_pd *pd2;
        struct diwarp_mr *mr2;
        cr_assert_eq(diwarp_pd_alloc(B.dev, &pd2), 0);
        uint8_t *other = calloc(1, 4096);
        cr_assert_eq(diwarp_mr_reg(pd2, other, 4096, (uintptr_t)other, ALL_ACCESS, &mr2), 0);
        struct diwarp_mr_info mi;
        diwarp_mr_info(mr2, &mi);
        write_must_fail((uintptr_t)other, mi.rkey, 100, other, 4096, VE_DDP_TAGGED_NOT_ON_QP);
        diwarp_mr_dereg(mr2);
        diwarp_pd_dealloc(pd2);
        free(other);
}

Test(rc, atomic_misaligned)
{
        pair_ib(1 << 16);
        struct diwarp_sge sge = {(uintptr_t)A.buf, 8, A.lkey};
        struct diwarp_send_wr wr = {.wr_id = 1,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_ATOMIC_FETCH_AND_ADD,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        wr.wr.atomic.remote_addr = (uintptr_t)B.buf + 4;
        wr.wr.atomic.rkey = B.rkey;
        wr.wr.atomic.compare_add = 1;
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_REM_ACCESS_ERR);
        cr_assert_eq(w.vendor_err, VE_RDMAP_BASE_BOUNDS, "vendor_err %#x", w.vendor_err);
        check_dead();
}

Test(rc, send_without_receive)
{
        pair_ib(1 << 16);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 10, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert(w.status == DIWARP_WC_SUCCESS || w.status == DIWARP_WC_RNR_RETRY_EXC_ERR);
        cr_assert_eq(w.vendor_err, w.status == DIWARP_WC_SUCCESS ? 0 : VE_DDP_NO_BUFFER);
        cr_assert(got_async(&B, DIWARP_EVENT_QP_REQ_ERR, 3000));
        cr_assert(got_async(&A, DIWARP_EVENT_QP_REQ_ERR, 3000));
        check_dead();
}

Test(rc, send_longer_than_receive)
{
        pair_ib(1 << 16);
        post_recv(&B, 5, 0, 16);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 100, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 5);
        cr_assert_eq(w.status, DIWARP_WC_LOC_LEN_ERR);
        cr_assert_eq(w.vendor_err, VE_DDP_MSG_TOO_LONG, "the Terminate B sent");
        w = wait_wc(&A, 5000);
        cr_assert_eq(w.wr_id, 1);
        cr_assert(w.status == DIWARP_WC_SUCCESS || w.status == DIWARP_WC_REM_INV_REQ_ERR);
        cr_assert_eq(w.vendor_err, w.status == DIWARP_WC_SUCCESS ? 0 : VE_DDP_MSG_TOO_LONG);
        check_dead();
}

/* A Send too large to be out of our hands before the Terminate comes back:
 * the Terminate names it (by MSN), so it completes with RNR_RETRY_EXC_ERR and
 * the Terminate's code in vendor_err, deterministically. */
Test(rc, large_send_without_receive_named_by_terminate)
{
        pair_ib_ex(64u << 20, false, true);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 64u << 20, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&A, 20000);
        cr_assert_eq(w.wr_id, 1);
        cr_assert_eq(w.status, DIWARP_WC_RNR_RETRY_EXC_ERR, "got %s",
                     diwarp_wc_status_str(w.status));
        cr_assert_eq(w.vendor_err, VE_DDP_NO_BUFFER, "vendor_err %#x", w.vendor_err);
        cr_assert(got_async(&A, DIWARP_EVENT_QP_REQ_ERR, 3000));
        check_dead();
}

Test(rc, local_protection_error)
{
        pair_ib(1 << 16);
        struct diwarp_sge sge = {(uintptr_t)A.buf, 64, A.lkey ^ 0x33};
        struct diwarp_send_wr wr = {.wr_id = 9,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND,
                                    .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.wr_id, 9);
        cr_assert_eq(w.status, DIWARP_WC_LOC_PROT_ERR);
        check_dead();
}

/* A receive WR posted to an SRQ is checked in the SRQ's PD, not the QP's: B's
 * QP is in one PD, its SRQ in another. A receive whose buffer is registered
 * in the SRQ's PD takes A's Send; one registered in the QP's PD completes
 * with LOC_PROT_ERR and nothing written, and the connection ends as for any
 * receive WR that fails its lkey (Terminate, QP_ACCESS_ERR, both QPs in
 * ERR). */
Test(rc, srq_receive_checked_in_srq_pd)
{
        side_init(&A, 1 << 16, ALL_ACCESS);
        side_srq = true;
        side_init(&B, 1 << 16, ALL_ACCESS);
        side_srq = false;
        to_init(&A);
        to_init(&B);
        to_rtr_rts(&A, &B);
        to_rtr_rts(&B, &A);
        to_rts(&A);
        to_rts(&B);
        uint8_t *sbuf = B.buf + 32768;
        cr_assert_eq(diwarp_mr_reg(B.srq_pd, sbuf, 16384, (uintptr_t)sbuf,
                                   DIWARP_ACCESS_LOCAL_WRITE, &B.srq_mr),
                     0);
        struct diwarp_mr_info mi;
        cr_assert_eq(diwarp_mr_info(B.srq_mr, &mi), 0);
        struct diwarp_sge sge = {(uintptr_t)sbuf, 4096, mi.lkey};
        struct diwarp_recv_wr rwr = {.wr_id = 5, .sg_list = &sge, .num_sge = 1}, *rbad;
        cr_assert_eq(diwarp_post_srq_recv(B.srq, &rwr, &rbad), 0);
        fill(A.buf, 100, 3);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 100, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 5);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "receive in the SRQ's PD: %s",
                     diwarp_wc_status_str(w.status));
        cr_assert_eq(w.byte_len, 100);
        cr_assert_eq(memcmp(sbuf, A.buf, 100), 0);
        w = wait_wc(&A, 5000);
        cr_assert_eq(w.wr_id, 1);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);

        /* B's own MR is in the QP's PD, which does not apply. */
        memset(B.buf, 0, 4096);
        sge = (struct diwarp_sge){(uintptr_t)B.buf, 4096, B.lkey};
        rwr.wr_id = 6;
        cr_assert_eq(diwarp_post_srq_recv(B.srq, &rwr, &rbad), 0);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 2, 0, 100, 0, 0, 0), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 6);
        cr_assert_eq(w.status, DIWARP_WC_LOC_PROT_ERR, "receive in the QP's PD: %s",
                     diwarp_wc_status_str(w.status));
        for (unsigned i = 0; i < 4096; i++)
                cr_assert_eq(B.buf[i], 0, "byte %u written by a refused receive", i);
        w = wait_wc(&A, 5000);
        cr_assert_eq(w.wr_id, 2);
        cr_assert(w.status == DIWARP_WC_SUCCESS || w.status == DIWARP_WC_REM_OP_ERR, "%s",
                  diwarp_wc_status_str(w.status));
        cr_assert(got_async(&B, DIWARP_EVENT_QP_ACCESS_ERR, 3000));
        check_dead();
}

Test(rc, work_posted_before_connect_waits)
{
        side_init(&A, 1 << 16, ALL_ACCESS);
        side_init(&B, 1 << 16, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        /* B (the connecting or the awaiting side, whichever) is fully up and
         * posts at once; A lags behind. Nothing may be lost. */
        to_rtr_rts(&B, &A);
        to_rts(&B);
        fill(B.buf, 1000, 5);
        cr_assert_eq(
            post_send(&B, DIWARP_WR_RDMA_WRITE, 1, 0, 1000, (uintptr_t)A.buf + 2000, A.rkey, 0), 0);
        cr_assert_eq(post_send(&B, DIWARP_WR_SEND, 2, 0, 1000, 0, 0, 0), 0);
        cr_assert(poll_none(&B, 100));
        post_recv(&A, 3, 0, 1000);
        to_rtr_rts(&A, &B);
        to_rts(&A);
        cr_assert_eq(wait_wc(&B, 5000).wr_id, 1);
        cr_assert_eq(wait_wc(&B, 5000).wr_id, 2);
        struct diwarp_wc w = wait_wc(&A, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(memcmp(A.buf, B.buf, 1000), 0);
        cr_assert_eq(memcmp(A.buf + 2000, B.buf, 1000), 0);
}

static uint16_t listener_port(struct diwarp_listener *l);

/* ---- Solicited Event ---- */

/* True when the channel fd becomes readable within ms. */
static bool channel_readable(struct side *s, int ms)
{
        struct pollfd p = {.fd = diwarp_comp_channel_fd(s->ch), .events = POLLIN};
        return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* Takes the one pending event: it must name s's CQ. */
static void take_event(struct side *s)
{
        struct diwarp_cq *cq = NULL;
        void *ctx;
        cr_assert_eq(diwarp_comp_channel_get_event(s->ch, &cq, &ctx), 0);
        cr_assert_eq(cq, s->cq);
        diwarp_cq_ack_events(s->cq, 1);
}

/* Polls s's CQ (the progress thread of B does the receiving) for one wc. */
static struct diwarp_wc wait_wc_only(struct side *s, int timeout_ms)
{
        struct diwarp_wc wc;
        uint64_t end = now_ms() + (uint64_t)timeout_ms;
        for (;;) {
                int n = diwarp_cq_poll(s->cq, 1, &wc);
                cr_assert_geq(n, 0);
                if (n == 1)
                        return wc;
                diwarp_progress(A.dev, 64);
                cr_assert_lt(now_ms(), end, "no completion within %d ms", timeout_ms);
        }
}

Test(rc, solicited_event)
{
        /* B's CQ has a channel (so B has a progress thread); only A is driven here. */
        pair_ib_ex(1 << 16, true, false);
        for (int i = 0; i < 8; i++)
                post_recv(&B, 10 + (uint64_t)i, 4096 * (size_t)i, 4096);

        /* Armed for solicited only: a plain Send completes without an event. */
        cr_assert_eq(diwarp_cq_req_notify(B.cq, true), 0);
        fill(A.buf, 100, 1);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 100, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        struct diwarp_wc w = wait_wc_only(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.wr_id, 10);
        cr_assert_not(channel_readable(&B, 300), "a plain Send fired a solicited-only CQ");

        /* Send with Solicited Event: the fd becomes readable by itself (B's
         * progress thread), before anyone polls B's CQ. */
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 2, 0, 100, 0, 0, DIWARP_SEND_SOLICITED), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert(channel_readable(&B, 5000), "a solicited Send fired no event");
        take_event(&B);
        w = wait_wc_only(&B, 5000);
        cr_assert_eq(w.wr_id, 11);
        cr_assert_eq(w.byte_len, 100);
        cr_assert_eq(memcmp(A.buf, B.buf + 4096, 100), 0);
        cr_assert_not(channel_readable(&B, 100), "exactly one event per arming");

        /* Not armed: a solicited Send fires nothing. */
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 3, 0, 10, 0, 0, DIWARP_SEND_SOLICITED), 0);
        cr_assert_eq(wait_wc(&A, 5000).wr_id, 3);
        cr_assert_eq(wait_wc_only(&B, 5000).wr_id, 12);
        cr_assert_not(channel_readable(&B, 200));

        /* Send with Immediate + SE and RDMA Write with Immediate + SE fire it too. */
        struct diwarp_sge sge = {(uintptr_t)A.buf, 16, A.lkey};
        struct diwarp_send_wr wr = {.wr_id = 4,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND_WITH_IMM,
                                    .send_flags = DIWARP_SEND_SIGNALED | DIWARP_SEND_SOLICITED,
                                    .imm_data = htonl(77)};
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_cq_req_notify(B.cq, true), 0);
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert(channel_readable(&B, 5000), "Send with Immediate + SE fired no event");
        take_event(&B);
        w = wait_wc_only(&B, 5000);
        cr_assert_eq(w.wr_id, 13);
        cr_assert_eq(ntohl(w.imm_data), 77);
        cr_assert_eq(wait_wc(&A, 5000).wr_id, 4);
        wr.opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM;
        wr.wr_id = 5;
        wr.wr.rdma.remote_addr = (uintptr_t)B.buf + 60000;
        wr.wr.rdma.rkey = B.rkey;
        cr_assert_eq(diwarp_cq_req_notify(B.cq, true), 0);
        cr_assert_eq(diwarp_post_send(A.qp, &wr, &bad), 0);
        cr_assert(channel_readable(&B, 5000), "Write with Immediate + SE fired no event");
        take_event(&B);
        w = wait_wc_only(&B, 5000);
        cr_assert_eq(w.wr_id, 14);
        cr_assert_eq(w.opcode, DIWARP_WC_RECV_RDMA_WITH_IMM);
        cr_assert_eq(wait_wc(&A, 5000).wr_id, 5);

        /* An error completion fires a solicited-only CQ: a plain Send longer
         * than the receive WQE (LOC_LEN_ERR at B). */
        cr_assert_eq(diwarp_cq_req_notify(B.cq, true), 0);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 6, 0, 8000, 0, 0, 0), 0);
        cr_assert(channel_readable(&B, 5000), "an error completion fired no event");
        take_event(&B);
        w = wait_wc_only(&B, 5000);
        cr_assert_eq(w.wr_id, 15);
        cr_assert_eq(w.status, DIWARP_WC_LOC_LEN_ERR);
        cr_assert_eq(w.vendor_err, VE_DDP_MSG_TOO_LONG);
}

/* ---- COMM_EST ---- */

/* Every pending async event of s (non-blocking). */
static int drain_async(struct side *s, enum diwarp_event_type *types, int max)
{
        int fd = diwarp_async_fd(s->dev), n = 0;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        struct diwarp_async_event ev;
        while (diwarp_get_async_event(s->dev, &ev) == 0)
                if (n < max)
                        types[n++] = ev.event_type;
        return n;
}

static bool has_event(const enum diwarp_event_type *t, int n, enum diwarp_event_type want)
{
        for (int i = 0; i < n; i++)
                if (t[i] == want)
                        return true;
        return false;
}

/* IB-style: the passive side (larger QPN; both GIDs are the same address)
 * stays in RTR; the first message it receives raises COMM_EST, once, and the
 * receive completes in RTR as on IB. The active side raises none. */
Test(rc, comm_est_on_passive_side_in_rtr)
{
        side_init(&A, 1 << 16, ALL_ACCESS);
        side_init(&B, 1 << 16, ALL_ACCESS);
        struct side *act = &A, *pas = &B;
        if (diwarp_qp_num(A.qp) > diwarp_qp_num(B.qp)) {
                act = &B;
                pas = &A;
        }
        to_init(act);
        to_init(pas);
        post_recv(pas, 1, 0, 100);
        post_recv(pas, 2, 100, 100);
        to_rtr_rts(pas, act);
        to_rtr_rts(act, pas);
        to_rts(act);
        cr_assert_eq(post_send(act, DIWARP_WR_SEND, 7, 0, 50, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(pas, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.wr_id, 1);
        cr_assert_eq(diwarp_qp_state(pas->qp), DIWARP_QPS_RTR);
        enum diwarp_event_type ev[16];
        int n = drain_async(pas, ev, 16);
        cr_assert_eq(n, 1, "exactly one async event on the passive side, got %d", n);
        cr_assert_eq(ev[0], DIWARP_EVENT_COMM_EST);
        /* A second message in RTR raises nothing more. */
        cr_assert_eq(post_send(act, DIWARP_WR_SEND, 8, 0, 50, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(pas, 5000).wr_id, 2);
        cr_assert_eq(drain_async(pas, ev, 16), 0);
        to_rts(pas);
        post_recv(act, 3, 0, 100);
        cr_assert_eq(post_send(pas, DIWARP_WR_SEND, 9, 0, 50, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(act, 5000).wr_id, 7);
        cr_assert_eq(wait_wc(act, 5000).wr_id, 8);
        cr_assert_eq(wait_wc(act, 5000).wr_id, 3);
        n = drain_async(act, ev, 16);
        cr_assert_not(has_event(ev, n, DIWARP_EVENT_COMM_EST), "active side raised COMM_EST");
}

/* ---- error log lines ---- */

/* stderr (where diwarp logs) captured into a temporary file. */
static int cap_saved = -1;
static FILE *cap_file;

static void capture_start(void)
{
        fflush(stderr);
        cap_file = tmpfile();
        cr_assert_not_null(cap_file);
        cap_saved = dup(STDERR_FILENO);
        dup2(fileno(cap_file), STDERR_FILENO);
}

/* Stops capturing; returns what was logged (malloc'd), echoed to stderr too. */
static char *capture_end(void)
{
        fflush(stderr);
        dup2(cap_saved, STDERR_FILENO);
        close(cap_saved);
        long n = ftell(cap_file);
        char *text = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
        rewind(cap_file);
        if (n > 0 && fread(text, 1, (size_t)n, cap_file) != (size_t)n)
                text[0] = 0;
        fclose(cap_file);
        fputs(text, stderr);
        return text;
}

/* The log line containing what must name the QP and the peer ip:port. */
static void assert_line_names(const char *log, const char *what, uint32_t qpn)
{
        const char *hit = strstr(log, what);
        cr_assert_not_null(hit, "no log line with \"%s\"", what);
        const char *bol = hit;
        while (bol > log && bol[-1] != '\n')
                bol--;
        const char *eol = strchr(hit, '\n');
        size_t len = eol ? (size_t)(eol - bol) : strlen(bol);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)(len < 511 ? len : 511), bol);
        char want[32];
        snprintf(want, sizeof(want), "QP %#x ", qpn);
        cr_assert_not_null(strstr(line, want), "line does not name QP %#x: %s", qpn, line);
        const char *p = strstr(line, " peer ");
        cr_assert_not_null(p, "line names no peer: %s", line);
        unsigned a, b, c, d, port;
        cr_assert_eq(sscanf(p, " peer %u.%u.%u.%u:%u", &a, &b, &c, &d, &port), 5,
                     "peer is not ip:port: %s", line);
        cr_assert(port > 0 && port < 65536 && a < 256, "bad peer address: %s", line);
}

Test(rc, error_log_lines_name_qp_and_peer)
{
        pair_ib(1 << 16);
        capture_start();
        cr_assert_eq(
            post_send(&A, DIWARP_WR_RDMA_READ, 1, 0, 64, (uintptr_t)B.buf, B.rkey ^ 0x5a, 0), 0);
        struct diwarp_wc w = wait_wc(&A, 5000);
        wait_err(&A);
        wait_err(&B);
        char *log = capture_end();
        cr_assert_eq(w.status, DIWARP_WC_REM_ACCESS_ERR);
        assert_line_names(log, "terminating", diwarp_qp_num(B.qp));
        assert_line_names(log, "Terminate received", diwarp_qp_num(A.qp));
        free(log);
}

/* ---- CRC error from a raw MPA peer ---- */

static void read_full(int s, void *buf, size_t n)
{
        size_t got = 0;
        struct pollfd p = {.fd = s, .events = POLLIN};
        while (got < n && poll(&p, 1, 5000) > 0) {
                ssize_t r = read(s, (uint8_t *)buf + got, n - got);
                if (r <= 0)
                        break;
                got += (size_t)r;
        }
        cr_assert_eq(got, n, "short read (%zu of %zu)", got, n);
}

struct accept_arg {
        struct diwarp_listener *l;
        int r;
        struct diwarp_conn_request req;
};

static void *accept_main(void *p)
{
        struct accept_arg *t = p;
        t->r = diwarp_listener_get_request(t->l, 5000, &t->req);
        if (t->r == 0)
                t->r = diwarp_accept(t->l, t->req.id, B.qp, NULL);
        return NULL;
}

/* A foreign peer sends a Send FPDU with a wrong CRC: the QP logs it (QP and
 * peer), counts it, sends a Terminate (LLP / MPA / CRC error) and goes to ERR
 * with QP_FATAL; the posted receive flushes. */
Test(rc, crc_error_from_raw_peer)
{
        setenv("DIWARP_RC_CRC", "1", 1);
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&B);
        post_recv(&B, 1, 0, 1024);
        struct accept_arg t = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &t.l), 0);
        uint16_t port = listener_port(t.l);
        pthread_t th;
        pthread_create(&th, NULL, accept_main, &t);

        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                 .sin_port = htons(port)};
        cr_assert_eq(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        uint8_t req[24] = "MPA ID Req Frame";
        req[16] = 0x40; /* C */
        req[17] = 2;
        req[19] = 4; /* PD_Length: the IRD/ORD block only */
        req[20] = 0; /* IRD 1 */
        req[21] = 1;
        req[22] = 0;
        req[23] = 1; /* ORD 1 */
        cr_assert_eq(write(s, req, sizeof(req)), 24);
        uint8_t rep[20 + 512];
        read_full(s, rep, 20);
        cr_assert_eq(memcmp(rep, "MPA ID Rep Frame", 16), 0);
        cr_assert(rep[16] & 0x40, "CRC in use");
        uint16_t pdl = (uint16_t)(rep[18] << 8 | rep[19]);
        read_full(s, rep + 20, pdl);
        /* Accepted without private data: the Reply carries the IRD/ORD block
         * and nothing else (nothing of ours is added to the ULP's bytes). */
        cr_assert_eq(pdl, 4);
        pthread_join(th, NULL);
        cr_assert_eq(t.r, 0);

        /* Send, last segment, QN 0, MSN 1, MO 0, 6 payload bytes, bad CRC. */
        uint8_t f[2 + 18 + 6 + 2 + 4] = {0};
        f[1] = 18 + 6;      /* ULPDU_Length */
        f[2] = 0x40 | 0x01; /* L, DDP version 1 */
        f[3] = 0x40 | 0x03; /* RDMAP version 1, Send */
        f[15] = 1;          /* MSN */
        memcpy(f + 20, "abcdef", 6);
        f[sizeof(f) - 1] = 0x5a; /* CRC (wrong) */
        capture_start();
        cr_assert_eq(write(s, f, sizeof(f)), (ssize_t)sizeof(f));
        uint64_t end = now_ms() + 5000;
        while (diwarp_qp_state(B.qp) != DIWARP_QPS_ERR && now_ms() < end)
                diwarp_progress(B.dev, 64);
        /* Keep B progressing while its Terminate reaches us. */
        uint8_t term[64];
        size_t got = 0;
        end = now_ms() + 5000;
        while (got < 2 + 18 + 4 && now_ms() < end) {
                diwarp_progress(B.dev, 64);
                struct pollfd p = {.fd = s, .events = POLLIN};
                if (poll(&p, 1, 10) == 1) {
                        ssize_t r = read(s, term + got, sizeof(term) - got);
                        if (r <= 0)
                                break;
                        got += (size_t)r;
                }
        }
        char *log = capture_end();
        cr_assert_eq(diwarp_qp_state(B.qp), DIWARP_QPS_ERR);
        cr_assert_geq(got, 2 + 18 + 4, "no Terminate came back (%zu bytes)", got);
        cr_assert_eq(term[3] & 0x0f, 0x7, "RDMAP opcode Terminate");
        cr_assert_eq(term[2 + 18], 0x20, "layer LLP, type MPA");
        cr_assert_eq(term[2 + 19], 0x02, "code: MPA CRC error");
        struct diwarp_counters ctr;
        cr_assert_eq(diwarp_qp_counters(B.qp, &ctr), 0);
        cr_assert_eq(ctr.crc_errors, 1);
        cr_assert_eq(ctr.terminates_sent, 1);
        cr_assert(got_async(&B, DIWARP_EVENT_QP_FATAL, 1000));
        struct diwarp_wc w = wait_wc(&B, 2000);
        cr_assert_eq(w.wr_id, 1);
        cr_assert_eq(w.status, DIWARP_WC_WR_FLUSH_ERR);
        assert_line_names(log, "MPA CRC mismatch", diwarp_qp_num(B.qp));
        free(log);
        close(s);
        diwarp_listener_destroy(t.l);
}

/* ---- what RC puts on the wire, byte by byte, against a raw MPA peer ---- */

/* A raw MPA peer connected to B's listener (B accepts into its QP). CRC is
 * asked for; *crc says whether B's Reply kept it. mss, rcvbuf: the peer
 * socket's TCP_MAXSEG and SO_RCVBUF when not 0. */
static int raw_peer_connect_opts(struct accept_arg *t, bool *crc, int mss, int rcvbuf)
{
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &t->l), 0);
        uint16_t port = listener_port(t->l);
        pthread_t th;
        pthread_create(&th, NULL, accept_main, t);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        /* The MSS our SYN announces bounds what B may send in a segment. */
        if (mss)
                cr_assert_eq(setsockopt(s, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof(mss)), 0);
        /* Before connect: the window the SYN announces follows it. */
        if (rcvbuf)
                cr_assert_eq(setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                 .sin_port = htons(port)};
        cr_assert_eq(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        uint8_t req[24] = "MPA ID Req Frame";
        req[16] = 0x40; /* C */
        req[17] = 2;
        req[19] = 4;
        req[21] = 1; /* IRD 1 */
        req[23] = 1; /* ORD 1 */
        cr_assert_eq(write(s, req, sizeof(req)), 24);
        uint8_t rep[20 + 512];
        read_full(s, rep, 20);
        cr_assert_eq(memcmp(rep, "MPA ID Rep Frame", 16), 0);
        *crc = rep[16] & 0x40;
        read_full(s, rep + 20, (size_t)(rep[18] << 8 | rep[19]));
        pthread_join(th, NULL);
        cr_assert_eq(t->r, 0);
        return s;
}

static int raw_peer_connect_mss(struct accept_arg *t, bool *crc, int mss)
{
        return raw_peer_connect_opts(t, crc, mss, 0);
}

static int raw_peer_connect(struct accept_arg *t, bool *crc)
{
        return raw_peer_connect_mss(t, crc, 0);
}

/* Sends ULPDU u as one FPDU (pad, CRC least-significant byte first). */
static void raw_send(int s, bool crc, const uint8_t *u, size_t len)
{
        uint8_t f[2 + 128 + 3 + 4] = {0};
        cr_assert_leq(len, 128);
        f[0] = (uint8_t)(len >> 8);
        f[1] = (uint8_t)len;
        memcpy(f + 2, u, len);
        size_t n = dw_mpa_fpdu_len(len, crc);
        if (crc) {
                uint32_t c = dw_crc32c_final(dw_crc32c_update(dw_crc32c_init(), f, n - 4));
                for (int i = 0; i < 4; i++)
                        f[n - 4 + i] = (uint8_t)(c >> (8 * i));
        }
        cr_assert_eq(write(s, f, n), (ssize_t)n);
}

/* Reads one FPDU from B (driving B's progress meanwhile); returns the ULPDU
 * length, the ULPDU in u. */
static size_t raw_recv(int s, uint8_t *u, size_t cap)
{
        uint8_t f[2 + 4096 + 7];
        size_t got = 0, need = 2;
        uint64_t end = now_ms() + 5000;
        while (got < need) {
                cr_assert_lt(now_ms(), end, "no FPDU from B within 5 s (%zu bytes)", got);
                diwarp_progress(B.dev, 64);
                struct pollfd p = {.fd = s, .events = POLLIN};
                if (poll(&p, 1, 1) != 1)
                        continue;
                ssize_t r = read(s, f + got, need - got);
                cr_assert_gt(r, 0, "stream ended");
                got += (size_t)r;
                if (got == 2) {
                        need = dw_mpa_fpdu_len((size_t)(f[0] << 8 | f[1]), true);
                        cr_assert_leq(need, sizeof(f));
                }
        }
        size_t len = (size_t)(f[0] << 8 | f[1]);
        cr_assert_leq(len, cap);
        memcpy(u, f + 2, len);
        return len;
}

/* 18-byte untagged DDP/RDMAP header, L = 1, MO 0. */
static void untagged_hdr(uint8_t *u, uint8_t opcode, uint32_t qn, uint32_t msn)
{
        memset(u, 0, 18);
        u[0] = 0x41; /* T 0, L 1, DV 1 */
        u[1] = (uint8_t)(0x40 | opcode);
        for (int i = 0; i < 4; i++) {
                u[6 + i] = (uint8_t)(qn >> (24 - 8 * i));
                u[10 + i] = (uint8_t)(msn >> (24 - 8 * i));
        }
}

static void raw_imm(int s, bool crc, uint8_t opcode, uint32_t msn, const uint8_t imm[8])
{
        uint8_t u[26];
        untagged_hdr(u, opcode, 0, msn);
        memcpy(u + 18, imm, 8);
        raw_send(s, crc, u, sizeof(u));
}

static void expect_imm_wc(uint64_t id, enum diwarp_wc_opcode op, uint32_t len, const uint8_t *imm4)
{
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "wr %llu: status %d", (unsigned long long)id,
                     w.status);
        cr_assert_eq(w.wr_id, id);
        cr_assert_eq(w.opcode, op, "wr %llu: opcode %d", (unsigned long long)id, w.opcode);
        cr_assert_eq(w.byte_len, len);
        if (imm4) {
                cr_assert(w.wc_flags & DIWARP_WC_WITH_IMM, "wr %llu: WITH_IMM",
                          (unsigned long long)id);
                cr_assert_eq(memcmp(&w.imm_data, imm4, 4), 0, "wr %llu: immediate",
                             (unsigned long long)id);
        } else {
                cr_assert_not(w.wc_flags & DIWARP_WC_WITH_IMM, "wr %llu: no immediate",
                              (unsigned long long)id);
        }
}

/* An RFC 7306 peer's Immediate Data operations (opcode 0x8 and 0x9, each a
 * message of its own on queue 0) complete receive WQEs the verbs way, one
 * each, with WITH_IMM, and are not refused; a flag-like byte 4 that no Send
 * follows, or that comes with SE, does not swallow the message. diwarp's own
 * Send with Immediate (0x01 in byte 4, then the Send) is one completion. */
Test(rc, rfc7306_immediate_data_from_raw_peer)
{
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&B);
        for (uint64_t i = 1; i <= 8; i++)
                post_recv(&B, i, 256 * i, 256);
        struct accept_arg t = {0};
        bool crc;
        int s = raw_peer_connect(&t, &crc);

        const uint8_t i1[8] = {0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0};
        const uint8_t i2[8] = {0x01, 0x02, 0x03, 0x04, 0x01, 0, 0, 0}; /* SE: alone */
        const uint8_t i3[8] = {0x55, 0x66, 0x77, 0x88, 0x01, 0, 0, 0}; /* no Send follows */
        const uint8_t i4[8] = {0x99, 0xaa, 0xbb, 0xcc, 0xde, 0xad, 0xbe, 0xef};
        const uint8_t i6[8] = {0xca, 0xfe, 0xf0, 0x0d, 0x01, 0, 0, 0}; /* diwarp's Send with Imm */
        raw_imm(s, crc, 0x8, 1, i1);
        expect_imm_wc(1, DIWARP_WC_RECV_RDMA_WITH_IMM, 0, i1);
        raw_imm(s, crc, 0x9, 2, i2);
        expect_imm_wc(2, DIWARP_WC_RECV_RDMA_WITH_IMM, 0, i2);
        raw_imm(s, crc, 0x8, 3, i3);
        raw_imm(s, crc, 0x8, 4, i4);
        expect_imm_wc(3, DIWARP_WC_RECV_RDMA_WITH_IMM, 0, i3);
        expect_imm_wc(4, DIWARP_WC_RECV_RDMA_WITH_IMM, 0, i4);
        uint8_t u[18 + 6];
        untagged_hdr(u, 0x3, 0, 5);
        memcpy(u + 18, "abcdef", 6);
        raw_send(s, crc, u, sizeof(u));
        expect_imm_wc(5, DIWARP_WC_RECV, 6, NULL);
        raw_imm(s, crc, 0x8, 6, i6);
        untagged_hdr(u, 0x3, 0, 7);
        raw_send(s, crc, u, sizeof(u));
        expect_imm_wc(6, DIWARP_WC_RECV, 6, i6);
        cr_assert_eq(memcmp(B.buf + 256 * 6, "abcdef", 6), 0);
        cr_assert(poll_none(&B, 50), "one completion per message");
        cr_assert_eq(diwarp_qp_state(B.qp), DIWARP_QPS_RTS);

        /* What B sends: Send with Immediate = Immediate Data (0x8, byte 4 =
         * 0x01, bytes 5-7 zero) then the Send, MSNs 1 and 2; Write with
         * Immediate = the Write then Immediate Data with byte 4 = 0, MSN 3. */
        memcpy(B.buf, "xyz", 3);
        struct diwarp_sge sge = {(uintptr_t)B.buf, 3, B.lkey};
        struct diwarp_send_wr wr = {.wr_id = 50,
                                    .sg_list = &sge,
                                    .num_sge = 1,
                                    .opcode = DIWARP_WR_SEND_WITH_IMM,
                                    .send_flags = DIWARP_SEND_SIGNALED,
                                    .imm_data = htonl(0x0a0b0c0d)};
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(B.qp, &wr, &bad), 0);
        uint8_t r[64];
        cr_assert_eq(raw_recv(s, r, sizeof(r)), 26);
        uint8_t want[26];
        untagged_hdr(want, 0x8, 0, 1);
        const uint8_t wimm[8] = {0x0a, 0x0b, 0x0c, 0x0d, 0x01, 0, 0, 0};
        memcpy(want + 18, wimm, 8);
        cr_assert_arr_eq(r, want, 26, "Immediate Data of a Send with Immediate");
        cr_assert_eq(raw_recv(s, r, sizeof(r)), 21);
        untagged_hdr(want, 0x3, 0, 2);
        cr_assert_arr_eq(r, want, 18, "the Send after it");
        cr_assert_eq(memcmp(r + 18, "xyz", 3), 0);

        wr.opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(0x01020304);
        wr.wr.rdma.remote_addr = 0x1000;
        wr.wr.rdma.rkey = 0x12345678;
        cr_assert_eq(diwarp_post_send(B.qp, &wr, &bad), 0);
        cr_assert_eq(raw_recv(s, r, sizeof(r)), 14 + 3);
        const uint8_t wwr[14] = {0xc1, 0x40, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0, 0, 0, 0x10, 0};
        cr_assert_arr_eq(r, wwr, 14, "RDMA Write");
        cr_assert_eq(raw_recv(s, r, sizeof(r)), 26);
        untagged_hdr(want, 0x8, 0, 3);
        const uint8_t wimm2[8] = {0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0};
        memcpy(want + 18, wimm2, 8);
        cr_assert_arr_eq(r, want, 26, "Immediate Data of a Write with Immediate");
        close(s);
        diwarp_listener_destroy(t.l);
}

/* RFC 5040 section 4.8: a Terminate that carries the offending segment's DDP
 * header (D) carries its DDP Segment Length too, marked valid (M): an RDMA
 * Write of 6 bytes to an unknown STag comes back as Terminate with HdrCt
 * M|D, DDP Segment Length 20 (14-byte tagged header + 6) and the header as
 * sent. */
Test(rc, terminate_carries_segment_length)
{
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&B);
        struct accept_arg t = {0};
        bool crc;
        int s = raw_peer_connect(&t, &crc);
        const uint8_t w[14 + 6] = {0xc1, 0x40, 0xde, 0xad, 0xbe, 0xef, 0,   0,   0,   0,
                                   0,    0,    0x20, 0x00, 'a',  'b',  'c', 'd', 'e', 'f'};
        raw_send(s, crc, w, sizeof(w));
        uint8_t r[128];
        size_t n = raw_recv(s, r, sizeof(r));
        cr_assert_eq(n, 18 + 4 + 2 + 14, "Terminate ULPDU length %zu", n);
        uint8_t want[18];
        untagged_hdr(want, 0x7, 2, 1);
        cr_assert_arr_eq(r, want, 18, "Terminate DDP/RDMAP header (QN 2, MSN 1)");
        cr_assert_eq(r[18], 0x11, "layer DDP, tagged buffer error");
        cr_assert_eq(r[19], 0x00, "invalid STag");
        cr_assert_eq(r[20], 0xc0, "HdrCt M|D, got %#x", r[20]);
        cr_assert_eq(r[21], 0x00);
        cr_assert_eq(r[22] << 8 | r[23], 20, "DDP Segment Length");
        cr_assert_arr_eq(r + 24, w, 14, "the terminated DDP header as sent");
        uint64_t end = now_ms() + 2000;
        while (diwarp_qp_state(B.qp) != DIWARP_QPS_ERR && now_ms() < end)
                diwarp_progress(B.dev, 64);
        cr_assert_eq(diwarp_qp_state(B.qp), DIWARP_QPS_ERR);
        close(s);
        diwarp_listener_destroy(t.l);
}

/* RFC 5044 MULPDU: B's FPDUs fill the TCP segments its stream may send. The
 * raw peer announces MSS 1000 in its SYN; a 10000-byte RDMA Write from B
 * then comes as FPDUs whose whole length (2 + ULPDU + CRC, no pad) is B's
 * effective MSS rounded down to 4 (at most 1000, less the TCP options), all
 * equal but the last, the Write's bytes in order behind 14-byte tagged
 * headers with consecutive TOs. */
Test(rc, fpdus_fill_the_segments_of_the_stream_mss)
{
        side_init(&B, 16384, ALL_ACCESS);
        to_init(&B);
        struct accept_arg t = {0};
        bool crc;
        int s = raw_peer_connect_mss(&t, &crc, 1000);
        fill(B.buf, 10000, 77);
        cr_assert_eq(post_send(&B, DIWARP_WR_RDMA_WRITE, 9, 0, 10000, 0x100000, 0x4242, 0), 0);
        uint8_t r[4096];
        size_t off = 0, first = 0;
        int n = 0;
        while (off < 10000) {
                size_t len = raw_recv(s, r, sizeof(r));
                cr_assert_geq(len, 14u + 1, "FPDU %d: ULPDU %zu", n, len);
                size_t pay = len - 14;
                bool last = off + pay == 10000;
                cr_assert_eq(r[0], last ? 0xc1 : 0x81, "FPDU %d: DDP control %#x", n, r[0]);
                cr_assert_eq(r[1], 0x40, "RDMA Write");
                uint64_t to = 0;
                for (int i = 0; i < 8; i++)
                        to = to << 8 | r[6 + i];
                cr_assert_eq(to, 0x100000 + off, "FPDU %d: TO", n);
                cr_assert_eq(memcmp(r + 14, B.buf + off, pay), 0, "FPDU %d: payload", n);
                if (n == 0)
                        first = len;
                else if (!last)
                        cr_assert_eq(len, first, "FPDU %d: %zu-byte ULPDU, the first had %zu", n,
                                     len, first);
                off += pay;
                n++;
        }
        /* The full FPDU: no pad, whole length a multiple of 4, within the
         * announced 1000 and no more than the TCP options below it. */
        size_t whole = 2 + first + 4;
        cr_assert_eq(whole % 4, 0, "FPDU of %zu bytes", whole);
        cr_assert_leq(whole, 1000);
        cr_assert_geq(whole, 1000 - 44, "FPDU of %zu bytes for MSS 1000", whole);
        cr_assert_eq(n, (int)((10000 + first - 14 - 1) / (first - 14)), "%d FPDUs", n);
        close(s);
        diwarp_listener_destroy(t.l);
}

/* A program that starts to poll while the progress thread sleeps without
 * end (nothing came since its looks after the device opened ran out): the
 * first poll wakes the thread, which parks and looks at the poller. Before,
 * nothing woke it but data or a timer, and data a busy poller reads first
 * never returns the thread from its sleep: on a shared core the devices of
 * fi_pingpong pairs turned shared 145-275 ms after their first poll, where
 * the two windows it takes are 20-30 ms (progress/README.md). */
Test(rc, polling_wakes_a_progress_thread_asleep_without_end)
{
        setenv("DIWARP_PROGRESS", "thread", 1);
        side_init(&B, 4096, ALL_ACCESS);
        unsetenv("DIWARP_PROGRESS");
        to_init(&B);
        usleep(50000); /* the thread's looks after the device opened are spent */
        struct diwarp_counters c0, c1;
        cr_assert_eq(diwarp_device_counters(B.dev, &c0), 0);
        struct diwarp_wc wc;
        uint64_t end = now_ms() + 200;
        while (now_ms() < end)
                cr_assert_eq(diwarp_cq_poll(B.cq, 1, &wc), 0);
        cr_assert_eq(diwarp_device_counters(B.dev, &c1), 0);
        /* On a busy host the thread may take the progress over instead
         * (the poller waits for its core): it looked then too. */
        cr_assert(c1.progress_park_wakes - c0.progress_park_wakes >= 2 ||
                      c1.progress_takeovers > c0.progress_takeovers,
                  "the thread looked at the poller %llu times in 200 ms of polling",
                  (unsigned long long)(c1.progress_park_wakes - c0.progress_park_wakes));
}

/* The peer sends a Send and resets the connection before B has read it; B's
 * next Send finds the stream gone (ECONNRESET). The peer's Send still
 * arrives: the kernel keeps what came before the reset readable, and B
 * reads it before the stream fails, as an RNIC has placed what arrived
 * before a reset. Before, the write's failure flushed the receive. */
Test(rc, send_that_meets_a_reset_first_delivers_what_arrived)
{
        setenv("DIWARP_PROGRESS", "app", 1);
        side_init(&B, 65536, ALL_ACCESS);
        unsetenv("DIWARP_PROGRESS");
        to_init(&B);
        post_recv(&B, 1, 0, 256);
        struct accept_arg t = {0};
        bool crc;
        int s = raw_peer_connect(&t, &crc);
        uint8_t u[18 + 6];
        untagged_hdr(u, 0x3, 0, 1);
        memcpy(u + 18, "abcdef", 6);
        raw_send(s, crc, u, sizeof(u));
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        cr_assert_eq(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
        close(s);
        usleep(20000); /* the Send and the reset reach B's socket; B reads nothing */
        cr_assert_eq(post_send(&B, DIWARP_WR_SEND, 2, 1024, 16, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 1, "first completion: wr %llu", (unsigned long long)w.wr_id);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "the peer's Send: status %d", w.status);
        cr_assert_eq(w.byte_len, 6);
        cr_assert_eq(memcmp(B.buf, "abcdef", 6), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 2);
        cr_assert_neq(w.status, DIWARP_WC_SUCCESS, "B's Send after the reset");
        wait_err(&B);
        diwarp_listener_destroy(t.l);
}

/* The peer's reader, late: it starts after delay_ms and reads the stream to
 * its end; got counts the bytes, err the errno that ended it (0: EOF). */
struct late_reader {
        int s;
        int delay_ms;
        size_t got;
        int err;
};

static void *late_reader_main(void *p)
{
        struct late_reader *r = p;
        uint8_t buf[16384];
        usleep((useconds_t)r->delay_ms * 1000);
        struct pollfd pfd = {.fd = r->s, .events = POLLIN};
        while (poll(&pfd, 1, 5000) == 1) {
                ssize_t n = read(r->s, buf, sizeof(buf));
                if (n <= 0) {
                        r->err = n < 0 ? errno : 0;
                        return NULL;
                }
                r->got += (size_t)n;
        }
        r->err = ETIMEDOUT;
        return NULL;
}

/* A QP destroyed right after its disconnect, while its peer is slow to read
 * (a small receive window: part of a completed Send still waits in B's
 * socket) and has sent bytes B never read: the peer still gets the whole
 * Send, then B's FIN. A plain close with unread data resets the connection,
 * and the reset throws away what B's socket had not sent yet (rsockets'
 * rstream lost its last echo so beside a compile). */
Test(rc, destroy_after_disconnect_delivers_completed_sends)
{
        /* No progress thread: nothing reads B's socket but the test's calls. */
        setenv("DIWARP_PROGRESS", "app", 1);
        side_init(&B, 65536, ALL_ACCESS);
        unsetenv("DIWARP_PROGRESS");
        to_init(&B);
        struct accept_arg t = {0};
        bool crc;
        int s = raw_peer_connect_opts(&t, &crc, 0, 4096);
        const size_t len = 12288;
        fill(B.buf, len, 5);
        cr_assert_eq(post_send(&B, DIWARP_WR_SEND, 1, 0, len, 0, 0, 0), 0);
        /* Complete: all of it is in B's socket or the peer's. */
        cr_assert_eq(wait_wc(&B, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(diwarp_disconnect(B.qp), 0);
        cr_assert_eq(write(s, "unread", 6), 6);
        usleep(20000); /* the bytes reach B's socket; B reads nothing now */
        struct late_reader r = {.s = s, .delay_ms = 20};
        pthread_t th;
        pthread_create(&th, NULL, late_reader_main, &r);
        cr_assert_eq(diwarp_qp_destroy(B.qp), 0);
        B.qp = NULL;
        pthread_join(th, NULL);
        /* The Send's FPDUs: each ULPDU has an 18-byte header, each FPDU 2
         * bytes of length, pad and the CRC (4, whether used or not). */
        cr_assert_eq(r.err, 0, "the stream ended with %s after %zu bytes", strerror(r.err), r.got);
        cr_assert_geq(r.got, len + 18, "the peer got %zu bytes of a %zu-byte Send", r.got, len);
        close(s);
        diwarp_listener_destroy(t.l);
}

/* ---- 1 GiB messages ---- */

#define GIB (1ull << 30)

/* Every 64-bit word of a buffer gets a value derived from its offset and a
 * seed: a misplaced, missing or duplicated segment changes some word. */
static void fill_words(uint8_t *p, size_t len, uint64_t seed)
{
        uint64_t *w = (uint64_t *)p;
        for (size_t i = 0; i < len / 8; i++)
                w[i] = (i * 0x9e3779b97f4a7c15ull) ^ seed;
}

/* Index of the first word that differs, or SIZE_MAX. */
static size_t check_words(const uint8_t *p, size_t len, uint64_t seed)
{
        const uint64_t *w = (const uint64_t *)p;
        for (size_t i = 0; i < len / 8; i++)
                if (w[i] != ((i * 0x9e3779b97f4a7c15ull) ^ seed))
                        return i;
        return SIZE_MAX;
}

static bool all_zero(const uint8_t *p, size_t len)
{
        for (size_t i = 0; i < len; i++)
                if (p[i])
                        return false;
        return true;
}

Test(rc, send_1gib, .timeout = 240)
{
        uint64_t t0 = now_ms();
        pair_ib_ex(GIB + 4096, false, true);
        fill_words(A.buf, GIB, 0x1111);
        post_recv(&B, 1, 0, (uint32_t)(GIB + 4096));
        uint64_t t1 = now_ms();
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 2, 0, (uint32_t)GIB, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&A, 200000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.byte_len, GIB);
        w = wait_wc(&B, 200000);
        uint64_t t2 = now_ms();
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.wr_id, 1);
        cr_assert_eq(w.byte_len, GIB);
        size_t bad = check_words(B.buf, GIB, 0x1111);
        cr_assert_eq(bad, SIZE_MAX, "word %zu (offset %zu) differs", bad, bad * 8);
        cr_assert(all_zero(B.buf + GIB, 4096), "wrote past the message");
        cr_log_info("1 GiB Send: %llu ms transfer, %llu ms total", (unsigned long long)(t2 - t1),
                    (unsigned long long)(now_ms() - t0));
}

Test(rc, write_read_1gib, .timeout = 240)
{
        uint64_t t0 = now_ms();
        pair_ib_ex(GIB + 4096, false, true);
        fill_words(A.buf, GIB, 0x2222);
        uint64_t t1 = now_ms();
        cr_assert_eq(post_send(&A, DIWARP_WR_RDMA_WRITE, 1, 0, (uint32_t)GIB,
                               (uintptr_t)B.buf + 4096, B.rkey, 0),
                     0);
        struct diwarp_wc w = wait_wc(&A, 200000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.opcode, DIWARP_WC_RDMA_WRITE);
        /* Drop A's copy (the pages read back as zero), then Read it back. */
        cr_assert_eq(madvise(A.buf, GIB + 4096, MADV_DONTNEED), 0);
        cr_assert_eq(post_send(&A, DIWARP_WR_RDMA_READ, 2, 0, (uint32_t)GIB,
                               (uintptr_t)B.buf + 4096, B.rkey, 0),
                     0);
        w = wait_wc(&A, 200000);
        uint64_t t2 = now_ms();
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.opcode, DIWARP_WC_RDMA_READ);
        cr_assert_eq(w.byte_len, GIB);
        size_t bad = check_words(B.buf + 4096, GIB, 0x2222);
        cr_assert_eq(bad, SIZE_MAX, "write: word %zu differs", bad);
        cr_assert(all_zero(B.buf, 4096), "write placed before its TO");
        bad = check_words(A.buf, GIB, 0x2222);
        cr_assert_eq(bad, SIZE_MAX, "read: word %zu differs", bad);
        cr_assert(all_zero(A.buf + GIB, 4096), "read wrote past the sink");
        cr_assert(poll_none(&B, 1), "RDMA Write/Read must not complete at the target");
        cr_log_info("1 GiB Write + Read: %llu ms transfer, %llu ms total",
                    (unsigned long long)(t2 - t1), (unsigned long long)(now_ms() - t0));
}

/* ---- native CM ---- */

struct server_arg {
        struct diwarp_listener *l;
        bool reject;
        int result;
        struct diwarp_conn_request req;
};

static void *server_main(void *p)
{
        struct server_arg *s = p;
        s->result = diwarp_listener_get_request(s->l, 5000, &s->req);
        if (s->result < 0)
                return NULL;
        if (s->reject) {
                s->result = diwarp_reject(s->l, s->req.id, "nope", 4);
                return NULL;
        }
        struct diwarp_conn_param rep = {
            .private_data = "welcome", .private_data_len = 7, .ird = 4, .ord = 4};
        s->result = diwarp_accept(s->l, s->req.id, B.qp, &rep);
        return NULL;
}

static uint16_t listener_port(struct diwarp_listener *l)
{
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        cr_assert_eq(getsockname(diwarp_listener_fd(l), (struct sockaddr *)&sa, &sl), 0);
        return ntohs(sa.sin_port);
}

/* What diwarp_qp_query says about a natively connected QP. */
static void check_native_peer(struct side *s, struct side *peer, uint8_t ord, uint8_t ird)
{
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(s->qp, &a, &ia), 0);
        cr_assert_eq(a.qp_state, DIWARP_QPS_RTS);
        /* MPA carries no QPN (the private data is the application's alone):
         * as on an RNIC connected through rdma_cm, the peer QPN is unknown. */
        cr_assert_eq(a.dest_qp_num, 0, "dest_qp_num %#x", a.dest_qp_num);
        union diwarp_gid g;
        diwarp_device_gid(peer->dev, &g);
        cr_assert_eq(memcmp(a.dgid.raw, g.raw, 16), 0);
        cr_assert_eq(a.max_rd_atomic, ord);
        cr_assert_eq(a.max_dest_rd_atomic, ird);
}

Test(rc, native_connect_accept)
{
        side_init(&A, 1 << 20, ALL_ACCESS);
        side_init(&B, 1 << 20, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        struct server_arg sa = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &sa.l), 0);
        uint16_t port = listener_port(sa.l);
        post_recv(&B, 1, 0, 4096);
        pthread_t th;
        pthread_create(&th, NULL, server_main, &sa);
        union diwarp_gid gid;
        diwarp_device_gid(B.dev, &gid);
        struct diwarp_conn_param p = {
            .private_data = "hello", .private_data_len = 5, .ird = 8, .ord = 8};
        char rpd[64];
        uint16_t rlen = sizeof(rpd);
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, &p, 5000, rpd, &rlen), 0);
        pthread_join(th, NULL);
        cr_assert_eq(sa.result, 0);
        cr_assert_eq(sa.req.private_data_len, 5);
        cr_assert_eq(memcmp(sa.req.private_data, "hello", 5), 0);
        cr_assert_eq(sa.req.ird, 8);
        cr_assert_eq(sa.req.ord, 8);
        cr_assert_eq(rlen, 7);
        cr_assert_eq(memcmp(rpd, "welcome", 7), 0);
        cr_assert_eq(diwarp_qp_state(A.qp), DIWARP_QPS_RTS);
        cr_assert_eq(diwarp_qp_state(B.qp), DIWARP_QPS_RTS);
        /* Both QPs went INIT -> RTR -> RTS with the peer's GID and the
         * negotiated IRD/ORD (no peer QPN: dest_qp_num 0). */
        check_native_peer(&A, &B, 4, 8);
        check_native_peer(&B, &A, 4, 4);
        /* The passive side never processed a message in RTR: no COMM_EST. */
        enum diwarp_event_type ev[16];
        int nev = drain_async(&B, ev, 16);
        cr_assert_not(has_event(ev, nev, DIWARP_EVENT_COMM_EST));
        nev = drain_async(&A, ev, 16);
        cr_assert_not(has_event(ev, nev, DIWARP_EVENT_COMM_EST));

        fill(A.buf, 3000, 9);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 3000, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.byte_len, 3000);
        /* src_qp is defined for UD only (ibv_poll_cq); RC reports dest_qp_num. */
        cr_assert_eq(w.src_qp, 0);
        cr_assert_eq(memcmp(A.buf, B.buf, 3000), 0);
        /* 64 MiB would need a bigger buffer; 1 MiB read back over the native stream. */
        fill(B.buf, 1 << 20, 4);
        cr_assert_eq(post_send(&A, DIWARP_WR_RDMA_READ, 2, 0, 1 << 20, (uintptr_t)B.buf, B.rkey, 0),
                     0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(memcmp(A.buf, B.buf, 1 << 20), 0);

        /* Graceful disconnect: both sides end in ERR, posted receives flush. */
        post_recv(&B, 3, 0, 16);
        cr_assert_eq(diwarp_disconnect(A.qp), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 3);
        cr_assert_eq(w.status, DIWARP_WC_WR_FLUSH_ERR);
        wait_err(&A);
        wait_err(&B);
        diwarp_listener_destroy(sa.l);
}

/* Peers that connect to a listener and say nothing, twice as many as it has
 * slots for unanswered connections (64), before a real peer connects: the
 * real peer's connect goes through well within its timeout (the silent ones
 * would otherwise hold every slot for the whole connect timeout, 10 s), and
 * the oldest silent ones are closed to make room. */
#define SILENT_PEERS 128
Test(rc, native_listener_outlasts_silent_peers)
{
        side_init(&A, 1 << 16, ALL_ACCESS);
        side_init(&B, 1 << 16, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        struct server_arg sa = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 2 * SILENT_PEERS, &sa.l), 0);
        uint16_t port = listener_port(sa.l);
        union diwarp_gid gid;
        diwarp_device_gid(B.dev, &gid);
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
        memcpy(&to.sin_addr, gid.raw + 12, 4);
        int silent[SILENT_PEERS];
        for (int i = 0; i < SILENT_PEERS; i++) {
                silent[i] = socket(AF_INET, SOCK_STREAM, 0);
                cr_assert_geq(silent[i], 0);
                cr_assert_eq(connect(silent[i], (struct sockaddr *)&to, sizeof(to)), 0,
                             "silent peer %d: %s", i, strerror(errno));
        }
        post_recv(&B, 1, 0, 4096);
        pthread_t th;
        pthread_create(&th, NULL, server_main, &sa);
        uint64_t t0 = now_ms();
        struct diwarp_conn_param p = {.ird = 4, .ord = 4};
        char rpd[64];
        uint16_t rlen = sizeof(rpd);
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, &p, 5000, rpd, &rlen), 0);
        pthread_join(th, NULL);
        uint64_t ms = now_ms() - t0;
        cr_assert_eq(sa.result, 0, "the listener did not deliver the real peer: %d", sa.result);
        cr_assert_lt(ms, 4000, "the real peer waited %llu ms behind silent ones",
                     (unsigned long long)ms);
        fill(A.buf, 3000, 21);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 3000, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wait_wc(&B, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(memcmp(A.buf, B.buf, 3000), 0);
        /* The oldest silent peers were closed (EOF); the newest may stay. */
        int closed = 0;
        for (int i = 0; i < SILENT_PEERS; i++) {
                char c;
                if (recv(silent[i], &c, 1, MSG_DONTWAIT) == 0)
                        closed++;
                close(silent[i]);
        }
        cr_assert_geq(closed, SILENT_PEERS - 64, "only %d silent peers closed", closed);
        diwarp_listener_destroy(sa.l);
}

/* RC QPs carried by RD (DIWARP_RC_TRANSPORT=rd) through the native CM: the
 * MPA exchange on TCP also carries each side's QPN and first PSN, which the
 * application never sees; the QPs are bound to each other (dest_qp_num is
 * the peer's), the data goes as datagrams, and closing the idle TCP stream is
 * the disconnect. A TCP-mode device on the other end is refused (-EPROTO). */
Test(rc, native_connect_accept_over_rd)
{
        setenv("DIWARP_RC_TRANSPORT", "rd", 1);
        side_init(&A, 1 << 20, ALL_ACCESS);
        side_init(&B, 1 << 20, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        struct server_arg sa = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &sa.l), 0);
        uint16_t port = listener_port(sa.l);
        post_recv(&B, 1, 0, 4096);
        union diwarp_gid gid;
        diwarp_device_gid(B.dev, &gid);
        /* The block of ours takes 12 of the 508 bytes. */
        static char big[497];
        struct diwarp_conn_param p = {.private_data = big, .private_data_len = 497};
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, &p, 5000, NULL, NULL), -EINVAL);
        cr_assert_eq(diwarp_qp_state(A.qp), DIWARP_QPS_INIT);
        pthread_t th;
        pthread_create(&th, NULL, server_main, &sa);
        p = (struct diwarp_conn_param){
            .private_data = "hello", .private_data_len = 5, .ird = 8, .ord = 8};
        char rpd[64];
        uint16_t rlen = sizeof(rpd);
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, &p, 5000, rpd, &rlen), 0);
        pthread_join(th, NULL);
        cr_assert_eq(sa.result, 0);
        cr_assert_eq(sa.req.private_data_len, 5);
        cr_assert_eq(memcmp(sa.req.private_data, "hello", 5), 0);
        cr_assert_eq(rlen, 7);
        cr_assert_eq(memcmp(rpd, "welcome", 7), 0);
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(A.qp, &a, &ia), 0);
        cr_assert_eq(a.qp_state, DIWARP_QPS_RTS);
        cr_assert_eq(a.dest_qp_num, diwarp_qp_num(B.qp));
        cr_assert_eq(a.max_rd_atomic, 4);
        cr_assert_eq(diwarp_qp_query(B.qp, &a, &ia), 0);
        cr_assert_eq(a.qp_state, DIWARP_QPS_RTS);
        cr_assert_eq(a.dest_qp_num, diwarp_qp_num(A.qp));
        cr_assert_eq(a.max_dest_rd_atomic, 4);

        fill(A.buf, 3000, 9);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 1, 0, 3000, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.byte_len, 3000);
        cr_assert_eq(memcmp(A.buf, B.buf, 3000), 0);
        fill(B.buf, 1 << 20, 4);
        cr_assert_eq(post_send(&A, DIWARP_WR_RDMA_READ, 2, 0, 1 << 20, (uintptr_t)B.buf, B.rkey, 0),
                     0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(memcmp(A.buf, B.buf, 1 << 20), 0);

        /* The disconnect reaches B through the CM stream: its receive flushes. */
        post_recv(&B, 3, 0, 16);
        cr_assert_eq(diwarp_disconnect(A.qp), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 3);
        cr_assert_eq(w.status, DIWARP_WC_WR_FLUSH_ERR);
        wait_err(&A);
        wait_err(&B);
        /* An orderly end, on both sides (A disconnected, B saw its CM stream
         * close): ERR without an async event; QP_FATAL is for a CM stream
         * that broke. */
        enum diwarp_event_type ev[8];
        cr_assert_eq(drain_async(&A, ev, 8), 0);
        cr_assert_eq(drain_async(&B, ev, 8), 0);
        diwarp_listener_destroy(sa.l);
        side_fini(&A);
        side_fini(&B);

        /* B runs RC over TCP: it accepts (it sees our block as private data,
         * as any iWARP peer would), but the reply has no QPN. */
        side_init(&A, 4096, ALL_ACCESS);
        unsetenv("DIWARP_RC_TRANSPORT");
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        sa = (struct server_arg){0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &sa.l), 0);
        port = listener_port(sa.l);
        diwarp_device_gid(B.dev, &gid);
        pthread_create(&th, NULL, server_main, &sa);
        p = (struct diwarp_conn_param){.private_data = "hello", .private_data_len = 5};
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, &p, 5000, NULL, NULL), -EPROTO);
        pthread_join(th, NULL);
        /* our 20-byte block (magic, QPN, first PSN, connection token) + 5 */
        cr_assert_eq(sa.req.private_data_len, 25);
        cr_assert_eq(diwarp_qp_state(A.qp), DIWARP_QPS_INIT);
        diwarp_listener_destroy(sa.l);
}

Test(rc, native_reject_with_private_data)
{
        side_init(&A, 4096, ALL_ACCESS);
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        struct server_arg sa = {.reject = true};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &sa.l), 0);
        uint16_t port = listener_port(sa.l);
        pthread_t th;
        pthread_create(&th, NULL, server_main, &sa);
        union diwarp_gid gid;
        diwarp_device_gid(B.dev, &gid);
        char rpd[64];
        uint16_t rlen = sizeof(rpd);
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, NULL, 5000, rpd, &rlen), -ECONNREFUSED);
        pthread_join(th, NULL);
        cr_assert_eq(sa.result, 0);
        cr_assert_eq(rlen, 4);
        cr_assert_eq(memcmp(rpd, "nope", 4), 0);
        cr_assert_eq(diwarp_qp_state(A.qp), DIWARP_QPS_INIT);
        diwarp_listener_destroy(sa.l);
}

/* Private data of any length up to 508 (the MPA maximum after the IRD/ORD
 * block) arrives exactly; the peer QPN stays unknown (0) either way. */
static void native_with_pd(uint16_t len)
{
        side_init(&A, 4096, ALL_ACCESS);
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        struct server_arg sa = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &sa.l), 0);
        uint16_t port = listener_port(sa.l);
        pthread_t th;
        pthread_create(&th, NULL, server_main, &sa);
        union diwarp_gid gid;
        diwarp_device_gid(B.dev, &gid);
        uint8_t pd[508];
        fill(pd, sizeof(pd), len);
        struct diwarp_conn_param p = {.private_data = pd, .private_data_len = len};
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, &p, 5000, NULL, NULL), 0);
        pthread_join(th, NULL);
        cr_assert_eq(sa.result, 0);
        cr_assert_eq(sa.req.private_data_len, len);
        cr_assert_eq(memcmp(sa.req.private_data, pd, len), 0);
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(B.qp, &a, &ia), 0);
        cr_assert_eq(a.dest_qp_num, 0);
        cr_assert_eq(diwarp_qp_query(A.qp, &a, &ia), 0);
        cr_assert_eq(a.dest_qp_num, 0);
        diwarp_listener_destroy(sa.l);
}

/* A QP already in RTR (without a peer) only takes the RTR -> RTS step. */
Test(rc, native_connect_from_rtr)
{
        side_init(&A, 4096, ALL_ACCESS);
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&A);
        to_init(&B);
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_RTR};
        cr_assert_eq(diwarp_qp_modify(A.qp, &a, DIWARP_QP_STATE), 0);
        struct server_arg sa = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &sa.l), 0);
        uint16_t port = listener_port(sa.l);
        pthread_t th;
        pthread_create(&th, NULL, server_main, &sa);
        union diwarp_gid gid;
        diwarp_device_gid(B.dev, &gid);
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, NULL, 5000, NULL, NULL), 0);
        pthread_join(th, NULL);
        cr_assert_eq(sa.result, 0);
        struct diwarp_qp_attr q;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(A.qp, &q, &ia), 0);
        cr_assert_eq(q.qp_state, DIWARP_QPS_RTS);
        cr_assert_eq(q.dest_qp_num, 0);
        cr_assert_eq(memcmp(q.dgid.raw, gid.raw, 16), 0);
        post_recv(&B, 1, 0, 64);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 2, 0, 64, 0, 0, 0), 0);
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.src_qp, 0);
        diwarp_listener_destroy(sa.l);
}

Test(rc, native_private_data_500)
{
        native_with_pd(500);
}

Test(rc, native_private_data_508)
{
        native_with_pd(508);
}

/* On the wire, a native connect is standard MPA: a foreign responder (a raw
 * socket here) finds in the Request exactly the IRD/ORD block and the
 * application's private data, and the initiator's application gets exactly
 * the Reply's private data back. */
struct connect_arg {
        uint16_t port;
        int r;
        char rpd[64];
        uint16_t rlen;
};

static void *connect_main(void *p)
{
        struct connect_arg *c = p;
        /* The raw listener is on 127.0.0.1, an address of this host. */
        union diwarp_gid gid = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
        struct diwarp_conn_param prm = {.private_data = "hello", .private_data_len = 5};
        c->rlen = sizeof(c->rpd);
        c->r = diwarp_connect(A.qp, &gid, c->port, &prm, 5000, c->rpd, &c->rlen);
        return NULL;
}

Test(rc, native_private_data_exact_on_wire)
{
        side_init(&A, 4096, ALL_ACCESS);
        to_init(&A);
        int l = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
        cr_assert_eq(listen(l, 1), 0);
        socklen_t sl = sizeof(sa);
        getsockname(l, (struct sockaddr *)&sa, &sl);
        struct connect_arg c = {.port = ntohs(sa.sin_port)};
        pthread_t th;
        pthread_create(&th, NULL, connect_main, &c);
        struct pollfd pl = {.fd = l, .events = POLLIN};
        cr_assert_eq(poll(&pl, 1, 5000), 1);
        int s = accept(l, NULL, NULL);
        cr_assert_geq(s, 0);
        uint8_t req[20 + 512];
        read_full(s, req, 20);
        cr_assert_eq(memcmp(req, "MPA ID Req Frame", 16), 0);
        cr_assert_eq(req[17], 2);
        uint16_t pdl = (uint16_t)(req[18] << 8 | req[19]);
        cr_assert_eq(pdl, 4 + 5, "Request private data: IRD/ORD block + the application's 5");
        read_full(s, req + 20, pdl);
        cr_assert_eq(memcmp(req + 24, "hello", 5), 0);
        /* Accept: same C, revision 2, IRD/ORD 1/1, then our ULP's 3 bytes. */
        uint8_t rep[20 + 4 + 3] = "MPA ID Rep Frame";
        rep[16] = req[16] & 0x40;
        rep[17] = 2;
        rep[19] = 4 + 3;
        rep[21] = 1;
        rep[23] = 1;
        memcpy(rep + 24, "hi!", 3);
        cr_assert_eq(write(s, rep, sizeof(rep)), (ssize_t)sizeof(rep));
        pthread_join(th, NULL);
        cr_assert_eq(c.r, 0);
        cr_assert_eq(c.rlen, 3);
        cr_assert_eq(memcmp(c.rpd, "hi!", 3), 0);
        struct diwarp_qp_attr a;
        struct diwarp_qp_init_attr ia;
        cr_assert_eq(diwarp_qp_query(A.qp, &a, &ia), 0);
        cr_assert_eq(a.qp_state, DIWARP_QPS_RTS);
        cr_assert_eq(a.dest_qp_num, 0);
        close(s);
        close(l);
        wait_err(&A); /* the foreign peer went away */
}

Test(rc, native_connect_refused_and_timeout)
{
        side_init(&A, 4096, ALL_ACCESS);
        to_init(&A);
        /* The raw socket below is on 127.0.0.1, an address of this host. */
        union diwarp_gid gid = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
        /* Nobody listens: refused at once. */
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        socklen_t sl = sizeof(sa);
        getsockname(s, (struct sockaddr *)&sa, &sl);
        uint16_t port = ntohs(sa.sin_port);
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, NULL, 2000, NULL, NULL), -ECONNREFUSED);
        /* A TCP listener that never answers MPA: -ETIMEDOUT in about the timeout. */
        cr_assert_eq(listen(s, 4), 0);
        uint64_t t0 = now_ms();
        cr_assert_eq(diwarp_connect(A.qp, &gid, port, NULL, 300, NULL, NULL), -ETIMEDOUT);
        uint64_t dt = now_ms() - t0;
        cr_assert(dt >= 250 && dt < 2000, "timed out after %llu ms", (unsigned long long)dt);
        close(s);
}

/* Raw MPA peer: a Request with markers gets a Reject; a Request with C = 0
 * still gets CRC from a default (CRC on) responder. */
static void raw_request(uint16_t port, uint8_t flags, uint8_t *reply, size_t *rlen)
{
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                 .sin_port = htons(port)};
        cr_assert_eq(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        uint8_t req[24] = "MPA ID Req Frame";
        req[16] = flags;
        req[17] = 2;
        req[18] = 0;
        req[19] = 4;
        req[20] = 0;
        req[21] = 1; /* IRD 1 */
        req[22] = 0;
        req[23] = 1; /* ORD 1 */
        cr_assert_eq(write(s, req, sizeof(req)), 24);
        struct pollfd p = {.fd = s, .events = POLLIN};
        size_t got = 0;
        while (got < 24 && poll(&p, 1, 3000) > 0) {
                ssize_t n = read(s, reply + got, 24 - got);
                if (n <= 0)
                        break;
                got += (size_t)n;
        }
        *rlen = got;
        close(s);
}

struct lthread {
        struct diwarp_listener *l;
        int r;
        struct diwarp_conn_request req;
};

static void *get_req_main(void *p)
{
        struct lthread *t = p;
        t->r = diwarp_listener_get_request(t->l, 1500, &t->req);
        if (t->r == 0)
                t->r = diwarp_accept(t->l, t->req.id, B.qp, NULL);
        return NULL;
}

Test(rc, mpa_markers_rejected_crc_negotiated)
{
        setenv("DIWARP_RC_CRC", "1", 1);
        side_init(&B, 4096, ALL_ACCESS);
        to_init(&B);
        struct lthread t = {0};
        cr_assert_eq(diwarp_listen(B.dev, 0, 8, &t.l), 0);
        uint16_t port = listener_port(t.l);
        pthread_t th;
        pthread_create(&th, NULL, get_req_main, &t);
        uint8_t rep[24];
        size_t n;
        raw_request(port, 0x80 | 0x40, rep, &n); /* M and C */
        cr_assert_eq(n, 24);
        cr_assert_eq(memcmp(rep, "MPA ID Rep Frame", 16), 0);
        cr_assert(rep[16] & 0x20, "markers request must be rejected (R = 1)");
        cr_assert_eq(rep[16] & 0x80, 0, "we never ask for markers");
        pthread_join(th, NULL);
        cr_assert_eq(t.r, -ETIMEDOUT, "a markers request is not handed to the application");

        pthread_create(&th, NULL, get_req_main, &t);
        raw_request(port, 0x00, rep, &n); /* no CRC asked */
        pthread_join(th, NULL);
        cr_assert_eq(n, 24);
        cr_assert_eq(t.r, 0);
        cr_assert_eq(rep[16] & 0x20, 0, "accepted");
        cr_assert(rep[16] & 0x40, "responder with DIWARP_RC_CRC=1 turns CRC on");
        cr_assert_eq(rep[17], 2);
        diwarp_listener_destroy(t.l);
}

/* ---- peer death (multi-process) ---- */

#include <signal.h>
#include <sys/wait.h>

struct exch {
        union diwarp_gid gid;
        uint32_t qpn;
};

/* Child: B side. Receives forever until killed. Never returns. */
static void child_main(int rfd, int wfd)
{
        struct side s;
        memset(&s, 0, sizeof(s));
        if (diwarp_device_open(NULL, &s.dev) || diwarp_pd_alloc(s.dev, &s.pd) ||
            diwarp_cq_create(s.dev, 1024, NULL, NULL, &s.cq))
                _exit(2);
        struct diwarp_qp_init_attr ia = {
            .send_cq = s.cq,
            .recv_cq = s.cq,
            .qp_type = DIWARP_QPT_RC,
            .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1}};
        if (diwarp_qp_create(s.pd, &ia, &s.qp))
                _exit(2);
        size_t len = 1 << 20;
        s.buf = malloc(len);
        if (diwarp_mr_reg(s.pd, s.buf, len, (uintptr_t)s.buf, ALL_ACCESS, &s.mr))
                _exit(2);
        struct diwarp_mr_info mi;
        diwarp_mr_info(s.mr, &mi);
        struct exch me = {.qpn = diwarp_qp_num(s.qp)}, peer;
        diwarp_device_gid(s.dev, &me.gid);
        if (write(wfd, &me, sizeof(me)) != sizeof(me) ||
            read(rfd, &peer, sizeof(peer)) != sizeof(peer))
                _exit(3);
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .qp_access_flags = DIWARP_ACCESS_REMOTE_WRITE};
        diwarp_qp_modify(s.qp, &a, DIWARP_QP_STATE | DIWARP_QP_ACCESS_FLAGS);
        for (int i = 0; i < 64; i++) {
                struct diwarp_sge sge = {(uintptr_t)s.buf, (uint32_t)len, mi.lkey};
                struct diwarp_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1};
                struct diwarp_recv_wr *bad;
                diwarp_post_recv(s.qp, &wr, &bad);
        }
        a = (struct diwarp_qp_attr){
            .qp_state = DIWARP_QPS_RTR, .dgid = peer.gid, .dest_qp_num = peer.qpn};
        if (diwarp_qp_modify(s.qp, &a, DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN))
                _exit(4);
        a.qp_state = DIWARP_QPS_RTS;
        diwarp_qp_modify(s.qp, &a, DIWARP_QP_STATE);
        char go = 1;
        if (write(wfd, &go, 1) != 1)
                _exit(5);
        for (;;) {
                struct diwarp_wc wc;
                if (diwarp_cq_poll(s.cq, 1, &wc) == 1 && wc.status == DIWARP_WC_SUCCESS) {
                        struct diwarp_sge sge = {(uintptr_t)s.buf, (uint32_t)len, mi.lkey};
                        struct diwarp_recv_wr wr = {
                            .wr_id = wc.wr_id, .sg_list = &sge, .num_sge = 1};
                        struct diwarp_recv_wr *bad;
                        diwarp_post_recv(s.qp, &wr, &bad);
                }
        }
}

/* Parent: A side; streams 1 MiB Sends at the child, then the child dies
 * (sig) mid-transfer. The error must arrive within the peer timeout. */
static void peer_dies(int sig, uint32_t timeout_ms)
{
        char env[32];
        snprintf(env, sizeof(env), "%u", timeout_ms);
        setenv("DIWARP_PEER_TIMEOUT_MS", env, 1);
        int p2c[2], c2p[2];
        cr_assert_eq(pipe(p2c), 0);
        cr_assert_eq(pipe(c2p), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
                child_main(p2c[0], c2p[1]);
        side_init(&A, 1 << 20, ALL_ACCESS);
        to_init(&A);
        struct exch me = {.qpn = diwarp_qp_num(A.qp)}, peer;
        diwarp_device_gid(A.dev, &me.gid);
        cr_assert_eq(read(c2p[0], &peer, sizeof(peer)), (ssize_t)sizeof(peer));
        cr_assert_eq(write(p2c[1], &me, sizeof(me)), (ssize_t)sizeof(me));
        struct diwarp_qp_attr a = {
            .qp_state = DIWARP_QPS_RTR, .dgid = peer.gid, .dest_qp_num = peer.qpn};
        cr_assert_eq(
            diwarp_qp_modify(A.qp, &a, DIWARP_QP_STATE | DIWARP_QP_AV | DIWARP_QP_DEST_QPN), 0);
        a.qp_state = DIWARP_QPS_RTS;
        cr_assert_eq(diwarp_qp_modify(A.qp, &a, DIWARP_QP_STATE), 0);
        char go;
        cr_assert_eq(read(c2p[0], &go, 1), 1);

        /* Keep 8 x 1 MiB in flight; after 20 completions, the peer dies. */
        capture_start();
        int posted = 0, done = 0;
        uint64_t t_kill = 0, t_err = 0;
        uint64_t end = now_ms() + 60000;
        while (now_ms() < end) {
                while (posted - done < 8) {
                        if (post_send(&A, DIWARP_WR_SEND, (uint64_t)posted, 0, 1 << 20, 0, 0, 0))
                                break;
                        posted++;
                }
                struct diwarp_wc wc;
                int n = diwarp_cq_poll(A.cq, 1, &wc);
                if (n == 1) {
                        done++;
                        if (wc.status != DIWARP_WC_SUCCESS) {
                                t_err = now_ms();
                                break;
                        }
                }
                if (!t_kill && done >= 20) {
                        kill(pid, sig);
                        t_kill = now_ms();
                }
                if (t_kill && diwarp_qp_state(A.qp) == DIWARP_QPS_ERR) {
                        t_err = now_ms();
                        break;
                }
        }
        char *log = capture_end();
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        /* The error line names our QP and the vanished peer's ip:port. */
        assert_line_names(log,
                          strstr(log, "connection lost") ? "connection lost" : "peer QP closed",
                          diwarp_qp_num(A.qp));
        free(log);
        cr_assert(t_kill, "transfer never started");
        cr_assert(t_err, "no error after the peer died");
        cr_assert_eq(diwarp_qp_state(A.qp), DIWARP_QPS_ERR);
        cr_assert_leq(t_err - t_kill, timeout_ms + 3000, "error after %llu ms",
                      (unsigned long long)(t_err - t_kill));
        cr_log_info("peer %s: error %llu ms after the signal", strsignal(sig),
                    (unsigned long long)(t_err - t_kill));
}

Test(rc, peer_killed_mid_transfer)
{
        peer_dies(SIGKILL, 2000);
}

/* A stopped peer's kernel still acknowledges, but its receive window stays
 * shut: TCP_USER_TIMEOUT ends the stream within about the peer timeout. */
Test(rc, peer_frozen_mid_transfer)
{
        peer_dies(SIGSTOP, 2000);
}

/* ---- one copy between two ends in this process (DIWARP_LOCAL_COPY) ----
 * On in the host daemon, where both clients' streams end in one process;
 * here the two devices of this process stand for them. */

static uint64_t local_copies(struct side *s)
{
        struct diwarp_counters c;
        cr_assert_eq(diwarp_device_counters(s->dev, &c), 0);
        return c.local_copies;
}

/* A's completion, driving A's device only: what B has to do, A's copy did. */
static struct diwarp_wc wait_wc_a_only(int timeout_ms)
{
        struct diwarp_wc wc;
        uint64_t end = now_ms() + (uint64_t)timeout_ms;
        while (diwarp_cq_poll(A.cq, 1, &wc) != 1) {
                diwarp_progress(A.dev, 64);
                cr_assert_lt(now_ms(), end, "no completion within %d ms", timeout_ms);
        }
        return wc;
}

/* A Send and its receive, so the stream is up and idle. */
static void exchange_one_send(void)
{
        post_recv(&B, 500, 0, 64);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 501, 0, 16, 0, 0, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(wait_wc(&B, 5000).status, DIWARP_WC_SUCCESS);
}

static int post_rdma_sges(struct side *s, enum diwarp_wr_opcode op, uint64_t id,
                          struct diwarp_sge *sge, int nsge, uint64_t raddr, uint32_t rkey,
                          unsigned flags)
{
        struct diwarp_send_wr wr = {
            .wr_id = id, .sg_list = sge, .num_sge = nsge, .opcode = op, .send_flags = flags};
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
        struct diwarp_send_wr *bad;
        return diwarp_post_send(s->qp, &wr, &bad);
}

Test(rc, local_copy_write_and_read)
{
        setenv("DIWARP_LOCAL_COPY", "1", 1);
        pair_ib(4 << 20);
        exchange_one_send();
        uint64_t base = local_copies(&A);
        size_t n = 1 << 20;
        /* A Write from three SGEs: B's memory holds it when A's completion
         * comes, though only A's device was driven. */
        fill(A.buf + 4096, n, 41);
        struct diwarp_sge w3[3] = {{(uintptr_t)A.buf + 4096, 1000, A.lkey},
                                   {(uintptr_t)A.buf + 4096 + 1000, 5000, A.lkey},
                                   {(uintptr_t)A.buf + 4096 + 6000, (uint32_t)n - 6000, A.lkey}};
        cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_RDMA_WRITE, 1, w3, 3, (uintptr_t)B.buf + 8192,
                                    B.rkey, DIWARP_SEND_SIGNALED),
                     0);
        struct diwarp_wc w = wait_wc_a_only(5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.opcode, DIWARP_WC_RDMA_WRITE);
        cr_assert_eq(w.byte_len, n);
        cr_assert_eq(memcmp(B.buf + 8192, A.buf + 4096, n), 0, "write: target differs");
        cr_assert_eq(B.buf[8191], 0, "write: before the target range");
        cr_assert_eq(B.buf[8192 + n], 0, "write: past the target range");
        cr_assert_eq(local_copies(&A), base + 1);
        /* A Read into two SGEs. */
        fill(B.buf + (2 << 20), n, 42);
        struct diwarp_sge r2[2] = {
            {(uintptr_t)A.buf + (2 << 20), 3333, A.lkey},
            {(uintptr_t)A.buf + (2 << 20) + 3333, (uint32_t)n - 3333, A.lkey}};
        cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_RDMA_READ, 2, r2, 2, (uintptr_t)B.buf + (2 << 20),
                                    B.rkey, DIWARP_SEND_SIGNALED),
                     0);
        w = wait_wc_a_only(5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        cr_assert_eq(w.opcode, DIWARP_WC_RDMA_READ);
        cr_assert_eq(w.byte_len, n);
        cr_assert_eq(memcmp(A.buf + (2 << 20), B.buf + (2 << 20), n), 0, "read: sink differs");
        cr_assert_eq(local_copies(&A), base + 2);
        cr_assert(poll_none(&B, 1), "RDMA Write/Read must not complete at the target");
        /* Unsignaled Writes complete with the next signaled WR, in order. */
        for (int i = 0; i < 8; i++) {
                struct diwarp_sge s = {(uintptr_t)A.buf + (size_t)i * 4096, 4096, A.lkey};
                cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_RDMA_WRITE, 10 + i, &s, 1,
                                            (uintptr_t)B.buf + (size_t)i * 4096, B.rkey,
                                            i == 7 ? DIWARP_SEND_SIGNALED : 0),
                             0);
        }
        w = wait_wc_a_only(5000);
        cr_assert_eq(w.wr_id, 17);
        cr_assert_eq(memcmp(A.buf, B.buf, 8 * 4096), 0);
        /* A copy takes B's device lock with a trylock; while B's progress
         * thread holds it the Write goes on the stream instead, as it may on
         * a busy host (one of the eight did in a run beside a compile). */
        cr_assert_geq(local_copies(&A), base + 9);
}

/* A Write behind a Send the responder has not taken yet stays behind it: it
 * is a copy only once B has read the Send (A has B read what A's stream put
 * in its socket first), else it goes on the stream behind the Send. (A Send
 * with Immediate is never a copy, so it waits in the stream.) */
static uint64_t qp_rx_packets(struct side *s)
{
        struct diwarp_counters c;
        cr_assert_eq(diwarp_qp_counters(s->qp, &c), 0);
        return c.rx_packets;
}

Test(rc, local_copy_keeps_the_stream_order)
{
        setenv("DIWARP_LOCAL_COPY", "1", 1);
        pair_ib(1 << 20);
        exchange_one_send();
        uint64_t base = local_copies(&A);
        post_recv(&B, 600, 0, 256);
        uint64_t rx0 = qp_rx_packets(&B);
        struct diwarp_sge s = {(uintptr_t)A.buf, 200, A.lkey};
        fill(A.buf, 200, 7);
        struct diwarp_send_wr swr = {
            .wr_id = 601, .sg_list = &s, .num_sge = 1, .opcode = DIWARP_WR_SEND_WITH_IMM};
        swr.imm_data = htonl(0x1234);
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &swr, &bad), 0);
        for (int i = 0; i < 16; i++)
                diwarp_progress(A.dev, 64);
        fill(A.buf + 65536, 65536, 8);
        struct diwarp_sge ws = {(uintptr_t)A.buf + 65536, 65536, A.lkey};
        cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_RDMA_WRITE, 602, &ws, 1, (uintptr_t)B.buf + 65536,
                                    B.rkey, 0),
                     0);
        for (int i = 0; i < 16; i++)
                diwarp_progress(A.dev, 64);
        if (local_copies(&A) == base + 1) {
                cr_assert_gt(qp_rx_packets(&B), rx0, "a Write copied ahead of an unconsumed Send");
        } else {
                cr_assert_eq(local_copies(&A), base);
                /* Not a copy: the Write went on the stream behind the Send.
                 * B's progress thread may have read both meanwhile; then the
                 * Send's bytes were placed before any of the Write's. */
                bool written = false;
                for (int i = 0; i < 65536 && !written; i++)
                        written = B.buf[65536 + i] != 0;
                if (written)
                        cr_assert_eq(memcmp(B.buf, A.buf, 200), 0,
                                     "the Write was placed before the Send");
        }
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 600);
        cr_assert_eq(w.byte_len, 200);
        cr_assert_eq(w.imm_data, htonl(0x1234));
        cr_assert_eq(memcmp(B.buf, A.buf, 200), 0);
        uint64_t end = now_ms() + 5000;
        while (memcmp(B.buf + 65536, A.buf + 65536, 65536) && now_ms() < end)
                progress_both();
        cr_assert_eq(memcmp(B.buf + 65536, A.buf + 65536, 65536), 0);
        /* Idle again: the next Write is a copy, and a Send behind it finds
         * its data in place. */
        for (int i = 0; i < 100 && !poll_none(&A, 0); i++)
                ;
        post_recv(&B, 603, 0, 256);
        fill(A.buf + 131072, 4096, 9);
        struct diwarp_sge ws2 = {(uintptr_t)A.buf + 131072, 4096, A.lkey};
        cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_RDMA_WRITE, 604, &ws2, 1,
                                    (uintptr_t)B.buf + 131072, B.rkey, DIWARP_SEND_SIGNALED),
                     0);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 605, 0, 8, 0, 0, 0), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 603);
        cr_assert_eq(w.byte_len, 8);
        cr_assert_eq(memcmp(B.buf + 131072, A.buf + 131072, 4096), 0);
        cr_assert_geq(local_copies(&A), base + 2, "the Write and the Send behind it");
}

/* A program that keeps its queue full of 1 MiB Writes (diwarp-bw, perftest)
 * has them copied again once one of them went on the stream: a WQE that
 * could be a copy does not start in a batch that still holds the FPDUs of
 * the WQE before it. Here a Send that B holds (no receive WQE yet) puts
 * the first window of Writes on the stream. */
Test(rc, local_copy_resumes_behind_the_stream)
{
        setenv("DIWARP_LOCAL_COPY", "1", 1);
        pair_ib(4 << 20);
        /* B holds a Send that finds no receive WQE (rnr_retry 7) until one
         * is posted, as an InfiniBand requester would retry it. */
        struct diwarp_qp_attr ra = {.qp_state = DIWARP_QPS_RTS, .rnr_retry = 7};
        cr_assert_eq(diwarp_qp_modify(B.qp, &ra, DIWARP_QP_STATE | DIWARP_QP_RNR_RETRY), 0);
        exchange_one_send();
        uint64_t base = local_copies(&A);
        size_t n = (1 << 20) + 1000;
        const int writes = 64, window = 8;
        fill(A.buf, n, 51);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 801, 0, 8, 0, 0, 0), 0);
        int posted = 0, done = 0;
        bool received = false;
        while (done < writes) {
                for (; posted < writes && posted - done < window; posted++) {
                        struct diwarp_sge one = {(uintptr_t)A.buf, (uint32_t)n, A.lkey};
                        cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_RDMA_WRITE, 810 + posted, &one, 1,
                                                    (uintptr_t)B.buf + n, B.rkey,
                                                    DIWARP_SEND_SIGNALED),
                                     0);
                }
                if (!received) {
                        /* Meanwhile the first Writes went on the stream,
                         * behind the Send B holds. */
                        for (int i = 0; i < 16; i++)
                                diwarp_progress(A.dev, 64);
                        post_recv(&B, 800, 0, 64);
                        received = true;
                }
                struct diwarp_wc w = wait_wc_a_only(5000);
                if (w.wr_id == 801)
                        w = wait_wc_a_only(5000);
                cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
                cr_assert_eq(w.wr_id, (uint64_t)(810 + done), "Writes complete in order");
                done++;
        }
        cr_assert_eq(memcmp(B.buf + n, A.buf, n), 0, "the Writes' target differs");
        struct diwarp_wc w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 800);
        /* The first window of Writes went on the stream: once B has
         * consumed them, later Writes are copies, though the queue never
         * empties. Two windows at most: B's thread, waiting for a core on a
         * busy host, may read the first window late, and a copy that finds
         * B's device lock held goes on the stream (53 of 64 were copies in
         * a CI run beside other tests; when copies did not resume behind the
         * stream, all 64 went on it). */
        cr_assert_geq(local_copies(&A), base + (uint64_t)(writes - 2 * window),
                      "%llu of %d Writes were copies",
                      (unsigned long long)(local_copies(&A) - base), writes);
}

/* A Send into a receive WQE of several SGEs, with only A's device driven;
 * one longer than the receive WQE is not a copy: it goes on the stream and
 * B terminates it as on the wire. */
Test(rc, local_copy_send)
{
        setenv("DIWARP_LOCAL_COPY", "1", 1);
        pair_ib(1 << 20);
        exchange_one_send();
        uint64_t base = local_copies(&A);
        struct diwarp_sge rs[3] = {{(uintptr_t)B.buf + 4096, 100, B.lkey},
                                   {(uintptr_t)B.buf + 8192, 5000, B.lkey},
                                   {(uintptr_t)B.buf + 16384, 65536, B.lkey}};
        struct diwarp_recv_wr rwr = {.wr_id = 700, .sg_list = rs, .num_sge = 3};
        struct diwarp_recv_wr *rbad;
        cr_assert_eq(diwarp_post_recv(B.qp, &rwr, &rbad), 0);
        fill(A.buf + 65536, 60000, 12);
        struct diwarp_sge ss[2] = {{(uintptr_t)A.buf + 65536, 7, A.lkey},
                                   {(uintptr_t)A.buf + 65536 + 7, 60000 - 7, A.lkey}};
        cr_assert_eq(post_rdma_sges(&A, DIWARP_WR_SEND, 701, ss, 2, 0, 0, DIWARP_SEND_SIGNALED), 0);
        struct diwarp_wc w = wait_wc_a_only(5000);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_SEND);
        cr_assert_eq(local_copies(&A), base + 1);
        cr_assert_eq(diwarp_cq_poll(B.cq, 1, &w), 1, "B's receive completed with A's copy");
        cr_assert_eq(w.wr_id, 700);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS);
        cr_assert_eq(w.opcode, DIWARP_WC_RECV);
        cr_assert_eq(w.byte_len, 60000);
        cr_assert_eq(memcmp(B.buf + 4096, A.buf + 65536, 100), 0);
        cr_assert_eq(memcmp(B.buf + 8192, A.buf + 65536 + 100, 5000), 0);
        cr_assert_eq(memcmp(B.buf + 16384, A.buf + 65536 + 5100, 60000 - 5100), 0);
        cr_assert_eq(B.buf[16384 + 60000 - 5100], 0, "past the message");
        /* The MSNs stay in step: a Send on the stream after it is taken. */
        post_recv(&B, 702, 0, 64);
        struct diwarp_send_wr imm = {
            .wr_id = 703, .opcode = DIWARP_WR_SEND_WITH_IMM, .send_flags = DIWARP_SEND_SIGNALED};
        struct diwarp_send_wr *bad;
        cr_assert_eq(diwarp_post_send(A.qp, &imm, &bad), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 702);
        cr_assert_eq(w.status, DIWARP_WC_SUCCESS, "%s", diwarp_wc_status_str(w.status));
        /* Longer than the receive WQE. */
        post_recv(&B, 704, 0, 64);
        cr_assert_eq(post_send(&A, DIWARP_WR_SEND, 705, 0, 65, 0, 0, 0), 0);
        w = wait_wc(&B, 5000);
        cr_assert_eq(w.wr_id, 704);
        cr_assert_eq(w.status, DIWARP_WC_LOC_LEN_ERR, "%s", diwarp_wc_status_str(w.status));
        w = wait_wc(&A, 5000);
        cr_assert_eq(w.wr_id, 705);
        cr_assert_eq(local_copies(&A), base + 1);
        check_dead();
}

/* A failed check is not a copy: the Write goes on the stream and the
 * responder terminates it as it would any other (vendor_err, async events,
 * both QPs in ERR), its memory untouched. */
Test(rc, local_copy_refused_falls_back_to_the_stream)
{
        setenv("DIWARP_LOCAL_COPY", "1", 1);
        pair_ib(1 << 16);
        exchange_one_send();
        uint64_t base = local_copies(&A);
        write_must_fail((uintptr_t)B.buf + B.len - 64, B.rkey, 128, B.buf, B.len,
                        VE_DDP_TAGGED_BOUNDS);
        cr_assert_eq(local_copies(&A), base);
}

/* Off unless asked for, outside the daemon: the bytes cross the stream. */
Test(rc, local_copy_off_by_default)
{
        unsetenv("DIWARP_LOCAL_COPY");
        pair_ib(1 << 16);
        exchange_one_send();
        fill(A.buf, 4096, 3);
        cr_assert_eq(
            post_send(&A, DIWARP_WR_RDMA_WRITE, 1, 0, 4096, (uintptr_t)B.buf + 4096, B.rkey, 0), 0);
        cr_assert_eq(wait_wc(&A, 5000).status, DIWARP_WC_SUCCESS);
        cr_assert_eq(memcmp(A.buf, B.buf + 4096, 4096), 0);
        cr_assert_eq(local_copies(&A), 0);
}
