/* Native RD QPs (diwarpdv_create_qp) putting a known set of datagrams on the
 * wire, for the capture test (dgram_wire.sh). In one process, over the
 * device's own address, from QP A to QP B:
 *   a Send posted before B has a receive (an RNR NAK), SENDS Sends of LEN
 *   bytes, one Send with Immediate, an RDMA Write of WRITE_LEN bytes, an
 *   RDMA Read of READ_LEN bytes, a Fetch-and-Add and a Compare-and-Swap.
 * Every result is checked. It prints
 *   RD src=0x... dst=0x... qkey=0x... rnr_sends=1 sends=N len=L imm_sends=1
 *      imm=0x... write_len=W read_len=R fetch_add=1 cmp_swap=1 add=A old=O swap=S
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

#include "check.h"

enum {
        SENDS = 3,
        LEN = 128,
        WRITE_LEN = 50000,
        READ_LEN = 5000,
        QKEY = 0x22222222,
        IMM = 0x0d1a6a4d,
        ATOMIC_OLD = 100, /* the target's first value */
        ATOMIC_ADD = 5,   /* Fetch-and-Add, then Compare-and-Swap of OLD + ADD */
        ATOMIC_SWAP = 9,
};

#define OFF_SRC    0u
#define OFF_DST    65536u
#define OFF_RECV   131072u
#define OFF_ATOMIC (OFF_RECV + 4096u)
#define OFF_OLD    (OFF_ATOMIC + 64u)
#define BUF_LEN    (OFF_OLD + 64u)

static struct diwarp_device *dev;
static struct diwarp_pd *pd;
static struct diwarp_cq *cq;
static struct diwarp_mr *mr;
static struct diwarp_mr_info mi;
static uint8_t *buf;
static struct diwarpdv_rd_dest dest;

/* Waits until every id in ids[0..n) completed successfully (any order, 10 s). */
static void wait_ids(const uint64_t *ids, int n)
{
        struct diwarp_wc wc;
        int seen = 0;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (seen < n) {
                int got = diwarp_cq_poll(cq, 1, &wc);
                REQUIRE(got >= 0);
                if (got == 1) {
                        if (wc.status != DIWARP_WC_SUCCESS)
                                fprintf(stderr, "wr_id %llu: %s\n", (unsigned long long)wc.wr_id,
                                        diwarp_wc_status_str(wc.status));
                        REQUIRE(wc.status == DIWARP_WC_SUCCESS);
                        int k = 0;
                        while (k < n && ids[k] != wc.wr_id)
                                k++;
                        REQUIRE(k < n);
                        seen++;
                        continue;
                }
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (t.tv_sec - t0.tv_sec > 10) {
                        fprintf(stderr, "completions missing after 10 s (%d of %d)\n", seen, n);
                        exit(1);
                }
        }
}

static void wait1(uint64_t id)
{
        wait_ids(&id, 1);
}

static void wait2(uint64_t a, uint64_t b)
{
        uint64_t ids[2] = {a, b};
        wait_ids(ids, 2);
}

static void post_recv(struct diwarp_qp *qp, uint64_t id)
{
        struct diwarp_sge sge = {(uintptr_t)(buf + OFF_RECV), LEN, mi.lkey};
        struct diwarp_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
        REQUIRE(diwarp_post_recv(qp, &wr, &bad) == 0);
}

static void post(struct diwarp_qp *qp, struct diwarp_send_wr *wr, uint32_t off, uint32_t len)
{
        struct diwarp_sge sge = {(uintptr_t)(buf + off), len, mi.lkey};
        struct diwarp_send_wr *bad;
        wr->sg_list = &sge;
        wr->num_sge = 1;
        wr->send_flags |= DIWARP_SEND_SIGNALED;
        REQUIRE(diwarpdv_post_send_rd(qp, wr, &dest, &bad) == 0);
}

static struct diwarp_qp *rd_qp(void)
{
        struct diwarp_qp_init_attr ia = {
            .send_cq = cq,
            .recv_cq = cq,
            .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
        };
        struct diwarp_qp *qp;
        REQUIRE(diwarpdv_create_qp(pd, &ia, &qp) == 0);
        struct diwarp_qp_attr a = {.qp_state = DIWARP_QPS_INIT,
                                   .port_num = 1,
                                   .qkey = QKEY,
                                   .qp_access_flags = DIWARP_ACCESS_REMOTE_WRITE |
                                                      DIWARP_ACCESS_REMOTE_READ |
                                                      DIWARP_ACCESS_REMOTE_ATOMIC};
        REQUIRE(diwarp_qp_modify(qp, &a,
                                 DIWARP_QP_STATE | DIWARP_QP_PKEY_INDEX | DIWARP_QP_PORT |
                                     DIWARP_QP_QKEY | DIWARP_QP_ACCESS_FLAGS) == 0);
        a.qp_state = DIWARP_QPS_RTR;
        REQUIRE(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE) == 0);
        a.qp_state = DIWARP_QPS_RTS;
        REQUIRE(diwarp_qp_modify(qp, &a, DIWARP_QP_STATE) == 0);
        return qp;
}

static void fill(uint32_t off, uint32_t len, uint8_t seed)
{
        for (uint32_t i = 0; i < len; i++)
                buf[off + i] = (uint8_t)(seed + i * 13);
}

int main(void)
{
        setvbuf(stdout, NULL, _IOLBF, 0);
        REQUIRE(diwarp_device_open(NULL, &dev) == 0);
        REQUIRE(diwarp_pd_alloc(dev, &pd) == 0);
        REQUIRE(diwarp_cq_create(dev, 64, NULL, NULL, &cq) == 0);
        void *mem;
        REQUIRE(posix_memalign(&mem, 4096, BUF_LEN) == 0);
        buf = mem;
        memset(buf, 0, BUF_LEN);
        REQUIRE(diwarp_mr_reg(pd, buf, BUF_LEN, (uintptr_t)buf,
                              DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                                  DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_ATOMIC,
                              &mr) == 0);
        REQUIRE(diwarp_mr_info(mr, &mi) == 0);
        struct diwarp_qp *a = rd_qp(), *b = rd_qp();
        union diwarp_gid gid;
        REQUIRE(diwarp_device_gid(dev, &gid) == 0);
        struct diwarp_ah *ah;
        REQUIRE(diwarp_ah_create(pd, &gid, &ah) == 0);
        dest = (struct diwarpdv_rd_dest){
            .ah = ah, .remote_qpn = diwarp_qp_num(b), .remote_qkey = QKEY};
        uint64_t id = 1;

        /* Refused for RNR first, accepted once the receive is posted. */
        fill(OFF_SRC, LEN, 1);
        struct diwarp_send_wr wr = {.wr_id = id, .opcode = DIWARP_WR_SEND};
        post(a, &wr, OFF_SRC, LEN);
        usleep(30000);
        post_recv(b, id + 1);
        wait2(id, id + 1);
        CHECK(!memcmp(buf + OFF_RECV, buf + OFF_SRC, LEN));
        id += 2;

        for (int i = 0; i < SENDS + 1; i++) {
                post_recv(b, id + 1);
                fill(OFF_SRC, LEN, (uint8_t)(i + 2));
                wr = (struct diwarp_send_wr){.wr_id = id, .opcode = DIWARP_WR_SEND};
                if (i == SENDS) {
                        wr.opcode = DIWARP_WR_SEND_WITH_IMM;
                        wr.imm_data = htonl(IMM);
                }
                post(a, &wr, OFF_SRC, LEN);
                wait2(id, id + 1);
                CHECK(!memcmp(buf + OFF_RECV, buf + OFF_SRC, LEN));
                id += 2;
        }

        fill(OFF_SRC, WRITE_LEN, 0x31);
        wr = (struct diwarp_send_wr){.wr_id = id, .opcode = DIWARP_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = (uintptr_t)(buf + OFF_DST);
        wr.wr.rdma.rkey = mi.rkey;
        post(a, &wr, OFF_SRC, WRITE_LEN);
        wait1(id++);
        CHECK(!memcmp(buf + OFF_DST, buf + OFF_SRC, WRITE_LEN));

        fill(OFF_DST, READ_LEN, 0x77);
        wr = (struct diwarp_send_wr){.wr_id = id, .opcode = DIWARP_WR_RDMA_READ};
        wr.wr.rdma.remote_addr = (uintptr_t)(buf + OFF_DST);
        wr.wr.rdma.rkey = mi.rkey;
        post(a, &wr, OFF_SRC, READ_LEN);
        wait1(id++);
        CHECK(!memcmp(buf + OFF_DST, buf + OFF_SRC, READ_LEN));

        uint64_t *target = (uint64_t *)(buf + OFF_ATOMIC), *old = (uint64_t *)(buf + OFF_OLD);
        *target = ATOMIC_OLD;
        wr = (struct diwarp_send_wr){.wr_id = id, .opcode = DIWARP_WR_ATOMIC_FETCH_AND_ADD};
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = mi.rkey;
        wr.wr.atomic.compare_add = ATOMIC_ADD;
        post(a, &wr, OFF_OLD, 8);
        wait1(id++);
        CHECK(*old == ATOMIC_OLD && *target == ATOMIC_OLD + ATOMIC_ADD);

        wr = (struct diwarp_send_wr){.wr_id = id, .opcode = DIWARP_WR_ATOMIC_CMP_AND_SWP};
        wr.wr.atomic.remote_addr = (uintptr_t)target;
        wr.wr.atomic.rkey = mi.rkey;
        wr.wr.atomic.compare_add = ATOMIC_OLD + ATOMIC_ADD;
        wr.wr.atomic.swap = ATOMIC_SWAP;
        post(a, &wr, OFF_OLD, 8);
        wait1(id++);
        CHECK(*old == ATOMIC_OLD + ATOMIC_ADD && *target == ATOMIC_SWAP);

        printf("RD src=0x%06x dst=0x%06x qkey=0x%08x rnr_sends=1 sends=%d len=%d imm_sends=1 "
               "imm=0x%08x write_len=%d read_len=%d fetch_add=1 cmp_swap=1 add=%d old=%d swap=%d\n",
               diwarp_qp_num(a), diwarp_qp_num(b), QKEY, SENDS, LEN, IMM, WRITE_LEN, READ_LEN,
               ATOMIC_ADD, ATOMIC_OLD, ATOMIC_SWAP);
        CHECK(diwarp_ah_destroy(ah) == 0);
        CHECK(diwarp_qp_destroy(a) == 0);
        CHECK(diwarp_qp_destroy(b) == 0);
        CHECK(diwarp_mr_dereg(mr) == 0);
        free(buf);
        CHECK(diwarp_cq_destroy(cq) == 0);
        CHECK(diwarp_pd_dealloc(pd) == 0);
        CHECK(diwarp_device_close(dev) == 0);
        if (failures)
                fprintf(stderr, "%d check(s) failed\n", failures);
        return failures ? 1 : 0;
}
