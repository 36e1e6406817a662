/* An RC QP connected to itself (RTR names its own GID and QPN), as
 * InfiniBand and RoCE hardware accept and MVAPICH2's InfiniBand-style setup
 * does for a rank's channel to itself: its Sends arrive at its own receive
 * queue, its Writes, Reads and Atomics target its own memory. Every size
 * from 0 bytes to 4 MiB checked byte for byte, a batch of operations in
 * flight at once, RESET and a second connection to itself, then every
 * object destroyed without error. Over TCP and (DIWARP_RC_TRANSPORT=rd) RD.
 * Then a program that leaks such a QP (MVAPICH2 does, at finalize): its CQ
 * and PD cannot go (EBUSY, as the kernel answers), and the warning names
 * what still holds them; once the QP is gone they can.
 * Exit 0 = all checks passed; each failure prints its line.
 */
#include <infiniband/verbs.h>

#include <endian.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum { BIG = 4 << 20, DEPTH = 32 };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static uint8_t *src, *dst, *atom; /* three regions of one MR */
static union ibv_gid gid;

static uint8_t pat(size_t i, unsigned seed)
{
        return (uint8_t)(i * 31 + seed * 7 + 3);
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
        for (size_t i = 0; i < len; i++)
                p[i] = pat(i, seed);
}

/* Index of the first byte that differs from the pattern, or -1. */
static long differs(const uint8_t *p, size_t len, unsigned seed)
{
        for (size_t i = 0; i < len; i++)
                if (p[i] != pat(i, seed))
                        return (long)i;
        return -1;
}

static int to_rts_self(void)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                                .port_num = 1,
                                .qp_access_flags =
                                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC};
        if (ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
                return -1;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = qp->qp_num; /* itself */
        a.rq_psn = 77;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid; /* its own GID */
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = 1;
        if (ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
                return -1;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = 77; /* what it receives is what it sends */
        a.max_rd_atomic = 16;
        return ibv_modify_qp(qp, &a,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* n completions within 10 s, in wcs (returns how many came). */
static int poll_n(struct ibv_wc *wcs, int n)
{
        struct timespec t0, t;
        int got = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (got < n) {
                int r = ibv_poll_cq(cq, n - got, wcs + got);
                if (r < 0)
                        return got;
                got += r;
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (t.tv_sec - t0.tv_sec > 10)
                        break;
        }
        return got;
}

static int post(enum ibv_wr_opcode op, uint64_t wr_id, void *from, uint32_t len, void *to,
                unsigned flags)
{
        struct ibv_sge sge = {.addr = (uintptr_t)from, .length = len, .lkey = mr->lkey};
        struct ibv_send_wr wr = {.wr_id = wr_id,
                                 .sg_list = &sge,
                                 .num_sge = len ? 1 : 0,
                                 .opcode = op,
                                 .send_flags = IBV_SEND_SIGNALED | flags,
                                 .imm_data = htobe32((uint32_t)wr_id)},
                           *bad;
        wr.wr.rdma.remote_addr = (uintptr_t)to;
        wr.wr.rdma.rkey = mr->rkey;
        return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(uint64_t wr_id, void *to, uint32_t len)
{
        struct ibv_sge sge = {.addr = (uintptr_t)to, .length = len, .lkey = mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
        return ibv_post_recv(qp, &wr, &bad);
}

/* The send completion and the receive completion of one message, either order. */
static bool both(struct ibv_wc *s, struct ibv_wc *r)
{
        struct ibv_wc wc[2];
        if (poll_n(wc, 2) != 2)
                return false;
        int ri = wc[0].opcode & IBV_WC_RECV ? 0 : 1;
        *r = wc[ri];
        *s = wc[1 - ri];
        return true;
}

static void one_size(uint32_t len, unsigned seed)
{
        struct ibv_wc s, r, wc;
        long bad;

        /* Send: to its own receive queue */
        fill(src, len, seed);
        memset(dst, 0, len + 1);
        CHECK(post_recv(100 + seed, dst, BIG) == 0);
        CHECK(post(IBV_WR_SEND, 1, src, len, NULL, 0) == 0);
        REQUIRE(both(&s, &r));
        CHECK(s.status == IBV_WC_SUCCESS && s.opcode == IBV_WC_SEND && s.wr_id == 1);
        CHECK(r.status == IBV_WC_SUCCESS && r.opcode == IBV_WC_RECV && r.wr_id == 100 + seed);
        CHECK(r.byte_len == len);
        CHECK(r.qp_num == qp->qp_num);
        if ((bad = differs(dst, len, seed)) >= 0 || dst[len] != 0) {
                fprintf(stderr, "send of %u bytes: byte %ld differs\n", len, bad);
                CHECK(!"send data");
        }

        /* RDMA Write into its own memory */
        fill(src, len, seed + 1);
        memset(dst, 0, len + 1);
        CHECK(post(IBV_WR_RDMA_WRITE, 2, src, len, dst, 0) == 0);
        REQUIRE(poll_n(&wc, 1) == 1);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 2);
        /* placed once the next message (a Send behind it) arrives */
        CHECK(post_recv(200, atom, 64) == 0);
        CHECK(post(IBV_WR_SEND, 3, src, 0, NULL, 0) == 0);
        REQUIRE(both(&s, &r));
        CHECK(s.status == IBV_WC_SUCCESS && r.status == IBV_WC_SUCCESS && r.byte_len == 0);
        if ((bad = differs(dst, len, seed + 1)) >= 0 || dst[len] != 0) {
                fprintf(stderr, "write of %u bytes: byte %ld differs\n", len, bad);
                CHECK(!"write data");
        }

        /* RDMA Write with immediate: data and a receive completion */
        fill(src, len, seed + 2);
        CHECK(post_recv(300, atom, 64) == 0);
        CHECK(post(IBV_WR_RDMA_WRITE_WITH_IMM, 4, src, len, dst, 0) == 0);
        REQUIRE(both(&s, &r));
        CHECK(s.status == IBV_WC_SUCCESS && s.wr_id == 4);
        CHECK(r.status == IBV_WC_SUCCESS && r.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
        CHECK((r.wc_flags & IBV_WC_WITH_IMM) && be32toh(r.imm_data) == 4);
        CHECK(differs(dst, len, seed + 2) < 0);

        /* RDMA Read from its own memory */
        fill(dst, len, seed + 3);
        memset(src, 0, len + 1);
        CHECK(post(IBV_WR_RDMA_READ, 5, src, len, dst, 0) == 0);
        REQUIRE(poll_n(&wc, 1) == 1);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.wr_id == 5);
        CHECK(wc.byte_len == len);
        if ((bad = differs(src, len, seed + 3)) >= 0 || src[len] != 0) {
                fprintf(stderr, "read of %u bytes: byte %ld differs\n", len, bad);
                CHECK(!"read data");
        }
}

static void atomics(void)
{
        struct ibv_wc wc;
        uint64_t *word = (uint64_t *)(atom + 64), *old = (uint64_t *)(atom + 128);
        struct ibv_sge sge = {.addr = (uintptr_t)old, .length = 8, .lkey = mr->lkey};
        struct ibv_send_wr wr = {.wr_id = 9,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        *word = 1000;
        wr.wr.atomic.remote_addr = (uintptr_t)word;
        wr.wr.atomic.rkey = mr->rkey;
        wr.wr.atomic.compare_add = 5;
        CHECK(ibv_post_send(qp, &wr, &bad) == 0);
        REQUIRE(poll_n(&wc, 1) == 1);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD);
        CHECK(*old == 1000 && *word == 1005);
        /* compare and swap: a match swaps, a mismatch leaves the word */
        wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        wr.wr.atomic.compare_add = 1005;
        wr.wr.atomic.swap = 42;
        CHECK(ibv_post_send(qp, &wr, &bad) == 0);
        REQUIRE(poll_n(&wc, 1) == 1);
        CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP);
        CHECK(*old == 1005 && *word == 42);
        wr.wr.atomic.compare_add = 1005;
        wr.wr.atomic.swap = 7;
        CHECK(ibv_post_send(qp, &wr, &bad) == 0);
        REQUIRE(poll_n(&wc, 1) == 1);
        CHECK(wc.status == IBV_WC_SUCCESS && *old == 42 && *word == 42);
}

/* Many operations in flight at once: 1 MiB Writes, Reads and Sends of the
 * QP to itself, posted back to back before any completion is polled. */
static void batch(void)
{
        enum { N = 12, LEN = 1 << 20 };
        struct ibv_wc wc[2 * N];
        uint8_t *w = src, *rd = src + 2 * LEN, *rs = dst + 2 * LEN;
        fill(w, LEN, 50);
        fill(dst, LEN, 51);
        int recvs = 0;
        for (int i = 0; i < N; i++) {
                switch (i % 3) {
                case 0:
                        CHECK(post(IBV_WR_RDMA_WRITE, 1000 + i, w, LEN, dst + LEN, 0) == 0);
                        break;
                case 1:
                        CHECK(post(IBV_WR_RDMA_READ, 1000 + i, rd, LEN, dst, 0) == 0);
                        break;
                default:
                        CHECK(post_recv(2000 + i, rs, LEN) == 0);
                        CHECK(post(IBV_WR_SEND, 1000 + i, w, LEN, NULL, 0) == 0);
                        recvs++;
                }
        }
        CHECK(poll_n(wc, N + recvs) == N + recvs);
        for (int i = 0; i < N + recvs; i++)
                CHECK(wc[i].status == IBV_WC_SUCCESS);
        CHECK(differs(dst + LEN, LEN, 50) < 0);
        CHECK(differs(rd, LEN, 51) < 0);
        CHECK(differs(rs, LEN, 50) < 0);
}

/* The CQ and PD of a QP still alive are not destroyed (EBUSY), and the
 * provider's warning (captured from stderr) names the QP that holds them. */
static void leaked_qp(void)
{
        struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
        struct ibv_cq *cq2 = ibv_create_cq(ctx, 8, NULL, NULL, 0);
        REQUIRE(pd2 && cq2);
        struct ibv_mr *mr2 = ibv_reg_mr(pd2, atom, 4096, IBV_ACCESS_LOCAL_WRITE);
        struct ibv_qp_init_attr ia = {
            .send_cq = cq2,
            .recv_cq = cq2,
            .qp_type = IBV_QPT_RC,
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        };
        struct ibv_qp *q2 = ibv_create_qp(pd2, &ia);
        REQUIRE(mr2 && q2);

        FILE *log = tmpfile();
        REQUIRE(log);
        fflush(stderr);
        int saved = dup(2);
        REQUIRE(saved >= 0 && dup2(fileno(log), 2) == 2);
        errno = 0;
        int rc_cq = ibv_destroy_cq(cq2);
        int e_cq = errno;
        errno = 0;
        int rc_pd = ibv_dealloc_pd(pd2);
        int e_pd = errno;
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        CHECK(rc_cq == EBUSY && e_cq == EBUSY);
        CHECK(rc_pd == EBUSY && e_pd == EBUSY);

        char text[4096] = "", want_cq[160], want_pd[160];
        rewind(log);
        size_t got = fread(text, 1, sizeof(text) - 1, log);
        text[got] = 0;
        fclose(log);
        fputs(text, stderr); /* into the test log as well */
        snprintf(want_cq, sizeof(want_cq),
                 "ibv_destroy_cq: CQ (handle %u) is still used by 1 QP (QPN %#x)", cq2->handle,
                 q2->qp_num);
        snprintf(want_pd, sizeof(want_pd),
                 "ibv_dealloc_pd: PD (handle %u) is still used by 1 QP (QPN %#x), 1 MR",
                 pd2->handle, q2->qp_num);
        if (!strstr(text, want_cq) || !strstr(text, want_pd)) {
                fprintf(stderr, "expected the lines to hold \"%s\" and \"%s\"\n", want_cq, want_pd);
                CHECK(!"the EBUSY warnings name the QP that holds the CQ and PD");
        }

        /* once the QP is gone (and the MR), both go */
        CHECK(ibv_destroy_qp(q2) == 0);
        CHECK(ibv_destroy_cq(cq2) == 0);
        CHECK(ibv_dereg_mr(mr2) == 0);
        CHECK(ibv_dealloc_pd(pd2) == 0);
}

int main(void)
{
        int n = 0;
        struct ibv_device **list = ibv_get_device_list(&n);
        REQUIRE(list && n > 0);
        ctx = ibv_open_device(list[0]);
        REQUIRE(ctx);
        struct ibv_device_attr da;
        REQUIRE(ibv_query_device(ctx, &da) == 0);
        REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);
        pd = ibv_alloc_pd(ctx);
        cq = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
        REQUIRE(pd && cq);
        uint8_t *buf = aligned_alloc(4096, 3 * (size_t)BIG);
        REQUIRE(buf);
        memset(buf, 0, 3 * (size_t)BIG);
        src = buf;
        dst = buf + BIG;
        atom = buf + 2 * (size_t)BIG;
        mr = ibv_reg_mr(pd, buf, 3 * (size_t)BIG,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC);
        REQUIRE(mr);
        struct ibv_qp_init_attr ia = {
            .send_cq = cq,
            .recv_cq = cq,
            .qp_type = IBV_QPT_RC,
            .cap = {.max_send_wr = DEPTH,
                    .max_recv_wr = DEPTH,
                    .max_send_sge = 1,
                    .max_recv_sge = 1},
        };
        qp = ibv_create_qp(pd, &ia);
        REQUIRE(qp);
        REQUIRE(to_rts_self() == 0);

        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qia;
        CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qia) == 0);
        CHECK(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == qp->qp_num);

        static const uint32_t sizes[] = {0, 1, 7, 4096, 65537, 1 << 20, BIG - 1};
        for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                one_size(sizes[i], i * 5);
        if (da.atomic_cap != IBV_ATOMIC_NONE)
                atomics();
        else
                fprintf(stderr, "atomics: the device reports none; skipped\n");
        batch();

        /* RESET and connected to itself again: the first connection's stream
         * is gone, the second moves data as well. */
        struct ibv_qp_attr r = {.qp_state = IBV_QPS_RESET};
        CHECK(ibv_modify_qp(qp, &r, IBV_QP_STATE) == 0);
        CHECK(to_rts_self() == 0);
        one_size(4096, 90);

        leaked_qp();

        CHECK(ibv_destroy_qp(qp) == 0);
        CHECK(ibv_dereg_mr(mr) == 0);
        CHECK(ibv_destroy_cq(cq) == 0);
        CHECK(ibv_dealloc_pd(pd) == 0);
        CHECK(ibv_close_device(ctx) == 0);
        ibv_free_device_list(list);
        free(buf);
        if (failures)
                fprintf(stderr, "%d check(s) failed\n", failures);
        else
                printf("ok: an RC QP connected to itself: Send, Write, Write with immediate, "
                       "Read%s, 0 B to 4 MiB, a batch in flight, RESET and again; "
                       "its CQ and PD busy while it lives, named in the warning\n",
                       da.atomic_cap != IBV_ATOMIC_NONE ? ", atomics" : "");
        return failures ? 1 : 0;
}
