/* A plain verbs program (linked to libibverbs only) that puts a known set of
 * datagrams on the wire, for the capture test (dgram_wire.sh). Run it under
 * `diwarp run` with DIWARP_RC_TRANSPORT=rd so that its RC QPs ride on RD.
 * In one process, over the device's own address:
 *   - UD: UD_SENDS Sends of UD_LEN bytes from one UD QP to another, the last
 *     one with immediate data;
 *   - RC over RD, between two RC QPs connected to each other:
 *     a Send posted before the receiver has a receive (an RNR NAK), then
 *     RC_SENDS Sends of RC_LEN bytes, one Send with Immediate, an RDMA Write
 *     of WRITE_LEN bytes, an RDMA Read of READ_LEN bytes, a Fetch-and-Add and
 *     a Compare-and-Swap.
 * Every result is checked. It prints one line per QP pair with the QPNs and
 * counts, which the capture test compares with what the dissector decodes:
 *   UD src=0x... dst=0x... sends=N len=L imm=0x...
 *   RC src=0x... dst=0x... rnr_sends=1 sends=N len=L imm_sends=1 imm=0x...
 *      write_len=W read_len=R fetch_add=1 cmp_swap=1 add=A old=O swap=S
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum {
        UD_SENDS = 5,
        UD_LEN = 100,
        RC_SENDS = 10,
        RC_LEN = 256,
        WRITE_LEN = 100000,
        READ_LEN = 3000,
        GRH = 40,
        QKEY = 0x11111111,
        UD_IMM = 0x0badcafe,
        RC_IMM = 0x12345678,
        ATOMIC_OLD = 40, /* the target's first value */
        ATOMIC_ADD = 2,  /* Fetch-and-Add, then Compare-and-Swap of OLD + ADD */
        ATOMIC_SWAP = 7,
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;
static uint8_t *buf; /* one region for everything, split below */
static struct ibv_mr *mr;

/* Offsets into buf. */
#define OFF_SRC    0u
#define OFF_DST    (OFF_SRC + 131072u)
#define OFF_RECV   (OFF_DST + 131072u)
#define OFF_ATOMIC (OFF_RECV + 65536u)
#define OFF_OLD    (OFF_ATOMIC + 64u)
#define BUF_LEN    (OFF_OLD + 64u)

/* Waits until every id in ids[0..n) has completed successfully, in any
 * order, with a 10 s limit; returns the completion of the last id. */
static struct ibv_wc wait_ids(const uint64_t *ids, int n)
{
        struct ibv_wc wc, last = {0};
        int seen = 0;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (seen < n) {
                int got = ibv_poll_cq(cq, 1, &wc);
                REQUIRE(got >= 0);
                if (got == 1) {
                        if (wc.status != IBV_WC_SUCCESS)
                                fprintf(stderr, "wr_id %" PRIu64 ": %s\n", wc.wr_id,
                                        ibv_wc_status_str(wc.status));
                        REQUIRE(wc.status == IBV_WC_SUCCESS);
                        int k = 0;
                        while (k < n && ids[k] != wc.wr_id)
                                k++;
                        REQUIRE(k < n);
                        if (k == n - 1)
                                last = wc;
                        seen++;
                        continue;
                }
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (t.tv_sec - t0.tv_sec > 10) {
                        fprintf(stderr, "completions missing after 10 s (%d of %d)\n", seen, n);
                        exit(1);
                }
        }
        return last;
}

static struct ibv_wc wait_wc(uint64_t id)
{
        return wait_ids(&id, 1);
}

/* The send id and the receive id, in any order; returns the receive's. */
static struct ibv_wc wait_pair(uint64_t send_id, uint64_t recv_id)
{
        uint64_t ids[2] = {send_id, recv_id};
        return wait_ids(ids, 2);
}

static void post_recv(struct ibv_qp *qp, uint64_t id, uint32_t off, uint32_t len)
{
        struct ibv_sge sge = {.addr = (uintptr_t)(buf + off), .length = len, .lkey = mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
        REQUIRE(ibv_post_recv(qp, &wr, &bad) == 0);
}

static void post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, uint32_t off, uint32_t len)
{
        struct ibv_sge sge = {.addr = (uintptr_t)(buf + off), .length = len, .lkey = mr->lkey};
        struct ibv_send_wr *bad;
        wr->sg_list = &sge;
        wr->num_sge = 1;
        wr->send_flags |= IBV_SEND_SIGNALED;
        REQUIRE(ibv_post_send(qp, wr, &bad) == 0);
}

static struct ibv_qp *make_qp(enum ibv_qp_type type)
{
        struct ibv_qp_init_attr ia = {
            .send_cq = cq,
            .recv_cq = cq,
            .qp_type = type,
            .cap = {.max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1, .max_recv_sge = 1},
        };
        struct ibv_qp *qp = ibv_create_qp(pd, &ia);
        REQUIRE(qp);
        return qp;
}

static void ud_up(struct ibv_qp *qp)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
        a.qp_state = IBV_QPS_RTR;
        REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0;
        REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

static void rc_up(struct ibv_qp *qp, uint32_t dest_qpn, uint32_t sq_psn, uint32_t rq_psn)
{
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                                .port_num = 1,
                                .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
                                                   IBV_ACCESS_REMOTE_READ |
                                                   IBV_ACCESS_REMOTE_ATOMIC};
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS) == 0);
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = dest_qpn;
        a.rq_psn = rq_psn;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.hop_limit = 1;
        a.ah_attr.port_num = 1;
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER) == 0);
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = sq_psn;
        a.max_rd_atomic = 4;
        REQUIRE(ibv_modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void fill(uint32_t off, uint32_t len, uint8_t seed)
{
        for (uint32_t i = 0; i < len; i++)
                buf[off + i] = (uint8_t)(seed + i * 7);
}

static void ud_part(void)
{
        struct ibv_qp *a = make_qp(IBV_QPT_UD), *b = make_qp(IBV_QPT_UD);
        ud_up(a);
        ud_up(b);
        struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1};
        aa.grh.dgid = gid;
        aa.grh.hop_limit = 1;
        struct ibv_ah *ah = ibv_create_ah(pd, &aa);
        REQUIRE(ah);
        for (int i = 0; i < UD_SENDS; i++)
                post_recv(b, 100 + i, OFF_RECV + i * (GRH + UD_LEN), GRH + UD_LEN);
        for (int i = 0; i < UD_SENDS; i++) {
                fill(OFF_SRC, UD_LEN, (uint8_t)i);
                struct ibv_send_wr wr = {.wr_id = 200 + i, .opcode = IBV_WR_SEND};
                if (i == UD_SENDS - 1) {
                        wr.opcode = IBV_WR_SEND_WITH_IMM;
                        wr.imm_data = htonl(UD_IMM);
                }
                wr.wr.ud.ah = ah;
                wr.wr.ud.remote_qpn = b->qp_num;
                wr.wr.ud.remote_qkey = QKEY;
                post_send(a, &wr, OFF_SRC, UD_LEN);
                struct ibv_wc wc = wait_pair(200 + i, 100 + i);
                CHECK(wc.byte_len == GRH + UD_LEN);
                CHECK(wc.src_qp == a->qp_num);
                CHECK(!!(wc.wc_flags & IBV_WC_WITH_IMM) == (i == UD_SENDS - 1));
                CHECK(!memcmp(buf + OFF_RECV + i * (GRH + UD_LEN) + GRH, buf + OFF_SRC, UD_LEN));
        }
        printf("UD src=0x%06x dst=0x%06x sends=%d len=%d imm=0x%08x\n", a->qp_num, b->qp_num,
               UD_SENDS, UD_LEN, UD_IMM);
        CHECK(ibv_destroy_ah(ah) == 0);
        CHECK(ibv_destroy_qp(a) == 0);
        CHECK(ibv_destroy_qp(b) == 0);
}

static void rc_part(void)
{
        struct ibv_qp *c = make_qp(IBV_QPT_RC), *d = make_qp(IBV_QPT_RC);
        rc_up(c, d->qp_num, 1000, 2000);
        rc_up(d, c->qp_num, 2000, 1000);
        uint64_t id = 1;

        /* A Send before the receiver posts its receive: refused (RNR NAK),
         * then accepted once the receive is there. */
        fill(OFF_SRC, RC_LEN, 0x40);
        struct ibv_send_wr wr = {.wr_id = id, .opcode = IBV_WR_SEND};
        post_send(c, &wr, OFF_SRC, RC_LEN);
        usleep(30000);
        post_recv(d, id + 1, OFF_RECV, RC_LEN);
        struct ibv_wc wc = wait_pair(id, id + 1);
        CHECK(wc.byte_len == RC_LEN && !memcmp(buf + OFF_RECV, buf + OFF_SRC, RC_LEN));
        id += 2;

        for (int i = 0; i < RC_SENDS; i++) {
                post_recv(d, id + 1, OFF_RECV, RC_LEN);
                fill(OFF_SRC, RC_LEN, (uint8_t)i);
                wr = (struct ibv_send_wr){.wr_id = id, .opcode = IBV_WR_SEND};
                post_send(c, &wr, OFF_SRC, RC_LEN);
                wc = wait_pair(id, id + 1);
                CHECK(wc.byte_len == RC_LEN && !memcmp(buf + OFF_RECV, buf + OFF_SRC, RC_LEN));
                id += 2;
        }

        post_recv(d, id + 1, OFF_RECV, RC_LEN);
        wr = (struct ibv_send_wr){
            .wr_id = id, .opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htonl(RC_IMM)};
        post_send(c, &wr, OFF_SRC, RC_LEN);
        wc = wait_pair(id, id + 1);
        CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == RC_IMM);
        id += 2;

        fill(OFF_SRC, WRITE_LEN, 0x21);
        memset(buf + OFF_DST, 0, WRITE_LEN);
        wr = (struct ibv_send_wr){.wr_id = id, .opcode = IBV_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = (uintptr_t)(buf + OFF_DST);
        wr.wr.rdma.rkey = mr->rkey;
        post_send(c, &wr, OFF_SRC, WRITE_LEN);
        wait_wc(id++);
        CHECK(!memcmp(buf + OFF_DST, buf + OFF_SRC, WRITE_LEN));

        fill(OFF_DST, READ_LEN, 0x55);
        memset(buf + OFF_SRC, 0, READ_LEN);
        wr = (struct ibv_send_wr){.wr_id = id, .opcode = IBV_WR_RDMA_READ};
        wr.wr.rdma.remote_addr = (uintptr_t)(buf + OFF_DST);
        wr.wr.rdma.rkey = mr->rkey;
        post_send(c, &wr, OFF_SRC, READ_LEN);
        wait_wc(id++);
        CHECK(!memcmp(buf + OFF_DST, buf + OFF_SRC, READ_LEN));

        uint64_t *target = (uint64_t *)(buf + OFF_ATOMIC), *old = (uint64_t *)(buf + OFF_OLD);
        *target = ATOMIC_OLD;
        wr = (struct ibv_send_wr){.wr_id = id, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD};
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = mr->rkey;
        wr.wr.atomic.compare_add = ATOMIC_ADD;
        post_send(c, &wr, OFF_OLD, 8);
        wait_wc(id++);
        CHECK(*old == ATOMIC_OLD && *target == ATOMIC_OLD + ATOMIC_ADD);

        wr = (struct ibv_send_wr){.wr_id = id, .opcode = IBV_WR_ATOMIC_CMP_AND_SWP};
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = mr->rkey;
        wr.wr.atomic.compare_add = ATOMIC_OLD + ATOMIC_ADD;
        wr.wr.atomic.swap = ATOMIC_SWAP;
        post_send(c, &wr, OFF_OLD, 8);
        wait_wc(id++);
        CHECK(*old == ATOMIC_OLD + ATOMIC_ADD && *target == ATOMIC_SWAP);

        printf("RC src=0x%06x dst=0x%06x rnr_sends=1 sends=%d len=%d imm_sends=1 imm=0x%08x "
               "write_len=%d read_len=%d fetch_add=1 cmp_swap=1 add=%d old=%d swap=%d\n",
               c->qp_num, d->qp_num, RC_SENDS, RC_LEN, RC_IMM, WRITE_LEN, READ_LEN, ATOMIC_ADD,
               ATOMIC_OLD, ATOMIC_SWAP);
        CHECK(ibv_destroy_qp(c) == 0);
        CHECK(ibv_destroy_qp(d) == 0);
}

int main(void)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        struct ibv_device **list = ibv_get_device_list(NULL);
        REQUIRE(list && list[0]);
        ctx = ibv_open_device(list[0]);
        REQUIRE(ctx);
        REQUIRE(ibv_query_gid(ctx, 1, 0, &gid) == 0);
        pd = ibv_alloc_pd(ctx);
        REQUIRE(pd);
        cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
        REQUIRE(cq);
        void *mem;
        REQUIRE(posix_memalign(&mem, 4096, BUF_LEN) == 0);
        buf = mem;
        memset(buf, 0, BUF_LEN);
        mr = ibv_reg_mr(pd, buf, BUF_LEN,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC);
        REQUIRE(mr);

        ud_part();
        rc_part();

        CHECK(ibv_dereg_mr(mr) == 0);
        free(buf);
        CHECK(ibv_destroy_cq(cq) == 0);
        CHECK(ibv_dealloc_pd(pd) == 0);
        CHECK(ibv_close_device(ctx) == 0);
        ibv_free_device_list(list);
        if (failures)
                fprintf(stderr, "%d check(s) failed\n", failures);
        return failures ? 1 : 0;
}
