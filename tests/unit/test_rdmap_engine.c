/* Unit tests for rdmap/: the opcode table against wire/'s, the responder's
 * remote-access check over a fake QP and STag table (no transport), the
 * RFC 7306 atomics and the Atomic Request builder, and the error
 * classification shared by RC's Terminate and RD's error NAK. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dw.h"
#include "rdmap/rdmap.h"
#include "wire/ddp.h"

#define NSLOTS 8
#define BUFSZ  4096
#define IOVA   0x10000ull

#define RW  DIWARP_ACCESS_REMOTE_WRITE
#define RR  DIWARP_ACCESS_REMOTE_READ
#define RA  DIWARP_ACCESS_REMOTE_ATOMIC
#define ALL (DIWARP_ACCESS_LOCAL_WRITE | RW | RR | RA)

/* The fake transport's side: one device (its STag table), one QP on PD a;
 * rdmap/ sees the QP through dw_rdmap_qp_of, as the transports show it. */
static struct dw_device *dev;
static struct dw_qp qp;
static struct dw_pd pd_a, pd_b;
static uint64_t buf64[BUFSZ / 8]; /* 8-aligned, so IOVA + 8k is an aligned word */

static void setup(void)
{
        dev = calloc(1, sizeof(*dev));
        cr_assert_not_null(dev);
        cr_assert_eq(dw_mr_table_init(&dev->mrs, NSLOTS), 0);
        dw_pd_init(&dev->mrs, &pd_a, NULL);
        dw_pd_init(&dev->mrs, &pd_b, NULL);
        memset(&qp, 0, sizeof(qp));
        qp.dev = dev;
        qp.pd = &pd_a;
        qp.qpn = 0x1234;
        memset(buf64, 0, sizeof(buf64));
}

static void teardown(void)
{
        dw_mr_table_destroy(&dev->mrs);
        free(dev);
}

static uint32_t reg(struct dw_pd *pd, int access)
{
        struct dw_mr *mr = NULL;
        cr_assert_eq(dw_mr_register(&dev->mrs, pd, buf64, BUFSZ, IOVA, access, &mr), 0);
        return mr->stag;
}

static void qp_rights(bool set, int flags)
{
        qp.attr_mask_set = set ? DIWARP_QP_ACCESS_FLAGS : 0;
        qp.attr.qp_access_flags = flags;
}

TestSuite(rdmap_access, .init = setup, .fini = teardown);

/* ---- opcode table ------------------------------------------------------ */

Test(rdmap_op, consistent_with_wire)
{
        for (unsigned op = 0; op < 300; op++) {
                const struct dw_rdmap_op *o = dw_rdmap_op(op);
                const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(op);
                cr_assert_eq(o != NULL, oi != NULL, "op %u: both tables define it or neither", op);
                if (!o)
                        continue;
                size_t ddp = oi->tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN;
                cr_expect_eq(o->hdr_len, ddp + oi->ulp_hdr_len, "op %u header length", op);
                /* What dw_rdmap_encode writes is the DDP part of it. */
                struct dw_rdmap_hdr h;
                uint8_t b[DW_DDP_MAX_HDR_LEN];
                cr_assert_eq(dw_rdmap_hdr_init(&h, op), 0);
                cr_expect_eq(dw_rdmap_encode(&h, b, sizeof(b)), (ssize_t)ddp, "op %u", op);
                /* Payload-carrying messages are the multi-segment ones. */
                cr_expect_eq(o->payload, !oi->single_segment, "op %u payload", op);
                /* Responses: Read Response (tagged, to the requester's sink)
                 * and Atomic Response (its own queue). */
                bool resp =
                    op == DW_RDMAP_READ_RESP || (!oi->tagged && oi->qn == DW_RDMAP_QN_ATOMIC_RESP);
                cr_expect_eq(o->dir == DW_RDMAP_DIR_RESPONSE, resp, "op %u direction", op);
                cr_expect_eq(o->dir == DW_RDMAP_DIR_TERMINATE,
                             !oi->tagged && oi->qn == DW_RDMAP_QN_TERMINATE, "op %u", op);
        }
        /* The three requests that touch the responder's memory. */
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_WRITE)->access, RW);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_WRITE)->ctx, DW_PROT_CTX_TAGGED_SINK);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_READ_REQ)->access, RR);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_READ_REQ)->ctx, DW_PROT_CTX_READ_SOURCE);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_ATOMIC_REQ)->access, RA);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_ATOMIC_REQ)->ctx, DW_PROT_CTX_ATOMIC);
        unsigned with_access = 0;
        for (unsigned op = 0; dw_rdmap_op(op); op++)
                with_access += dw_rdmap_op(op)->access != 0;
        cr_expect_eq(with_access, 3);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_SEND_INVAL)->ctx, DW_PROT_CTX_INVALIDATE);
        cr_expect_eq(dw_rdmap_op(DW_RDMAP_SEND_SE_INVAL)->ctx, DW_PROT_CTX_INVALIDATE);
}

/* Each opcode's receive handler kind: the Sends are one kind, the two
 * Immediate Data messages one, and the kinds that carry payload are the
 * opcodes that do (a transport resolves their target as they stream in). */
Test(rdmap_op, receive_kinds)
{
        static const enum dw_rdmap_rx want[DW_RDMAP_NOPS] = {
            [DW_RDMAP_WRITE] = DW_RDMAP_RX_WRITE,
            [DW_RDMAP_READ_REQ] = DW_RDMAP_RX_READ_REQ,
            [DW_RDMAP_READ_RESP] = DW_RDMAP_RX_READ_RESP,
            [DW_RDMAP_SEND] = DW_RDMAP_RX_SEND,
            [DW_RDMAP_SEND_INVAL] = DW_RDMAP_RX_SEND,
            [DW_RDMAP_SEND_SE] = DW_RDMAP_RX_SEND,
            [DW_RDMAP_SEND_SE_INVAL] = DW_RDMAP_RX_SEND,
            [DW_RDMAP_TERMINATE] = DW_RDMAP_RX_TERMINATE,
            [DW_RDMAP_IMM_DATA] = DW_RDMAP_RX_IMM,
            [DW_RDMAP_IMM_DATA_SE] = DW_RDMAP_RX_IMM,
            [DW_RDMAP_ATOMIC_REQ] = DW_RDMAP_RX_ATOMIC_REQ,
            [DW_RDMAP_ATOMIC_RESP] = DW_RDMAP_RX_ATOMIC_RESP,
        };
        unsigned seen[DW_RDMAP_RX_NKINDS] = {0};
        for (unsigned op = 0; op < DW_RDMAP_NOPS; op++) {
                enum dw_rdmap_rx k = dw_rdmap_op(op)->rx;
                cr_assert_lt((unsigned)k, DW_RDMAP_RX_NKINDS, "op %u", op);
                cr_expect_eq(k, want[op], "op %u kind %d", op, k);
                cr_expect_eq(k == DW_RDMAP_RX_SEND, dw_rdmap_is_send(op), "op %u", op);
                bool data =
                    k == DW_RDMAP_RX_WRITE || k == DW_RDMAP_RX_READ_RESP || k == DW_RDMAP_RX_SEND;
                cr_expect_eq(dw_rdmap_op(op)->payload, data, "op %u", op);
                seen[k]++;
        }
        for (unsigned k = 0; k < DW_RDMAP_RX_NKINDS; k++)
                cr_expect_gt(seen[k], 0, "kind %u has an opcode", k);
        cr_expect_null(dw_rdmap_op(DW_RDMAP_NOPS));
}

/* ---- remote access ----------------------------------------------------- */

/* The checks of a Read's source (made again for each response segment: a
 * region deregistered since the request was accepted refuses the next one)
 * and of an atomic target: rights, alignment, bounds, a region gone. */
Test(rdmap_access, response_time_recheck)
{
        struct dw_mr *mr = NULL;
        cr_assert_eq(dw_mr_register(&dev->mrs, &pd_a, buf64, BUFSZ, IOVA, ALL, &mr), 0);
        uint32_t stag = mr->stag;
        uint8_t *host = NULL;
        struct dw_rdmap_atomic_req ar = {.remote_stag = stag, .remote_to = IOVA + 16};

        qp_rights(true, RR | RA);
        cr_expect_eq(dw_rdmap_read_source(dw_rdmap_qp_of(&qp), stag, IOVA + 100, 200, &host),
                     DW_PROT_OK);
        cr_expect_eq(host, (uint8_t *)buf64 + 100);
        cr_expect_eq(dw_rdmap_atomic_target(dw_rdmap_qp_of(&qp), &ar, &host), DW_PROT_OK);
        cr_expect_eq(host, (uint8_t *)buf64 + 16);
        ar.remote_to = IOVA + 12; /* not a naturally aligned word */
        cr_expect_eq(dw_rdmap_atomic_target(dw_rdmap_qp_of(&qp), &ar, &host), DW_PROT_BOUNDS);
        ar.remote_to = IOVA + 16;
        cr_expect_eq(dw_rdmap_read_source(dw_rdmap_qp_of(&qp), stag, IOVA + BUFSZ - 8, 16, &host),
                     DW_PROT_BOUNDS);
        qp_rights(true, RW); /* the QP's rights were taken away */
        cr_expect_eq(dw_rdmap_read_source(dw_rdmap_qp_of(&qp), stag, IOVA, 8, &host),
                     DW_PROT_ACCESS);
        cr_expect_eq(dw_rdmap_atomic_target(dw_rdmap_qp_of(&qp), &ar, &host), DW_PROT_ACCESS);
        qp_rights(true, RR | RA);
        cr_assert_eq(dw_mr_deregister(&dev->mrs, mr), 0);
        cr_expect_neq(dw_rdmap_read_source(dw_rdmap_qp_of(&qp), stag, IOVA, 8, &host), DW_PROT_OK);
        cr_expect_neq(dw_rdmap_atomic_target(dw_rdmap_qp_of(&qp), &ar, &host), DW_PROT_OK);
}

Test(rdmap_access, matrix)
{
        uint32_t stag = reg(&pd_a, ALL);
        const int rights[] = {RW, RR, RA};
        /* QP rights: never set, set to nothing, each one alone, all. */
        const struct {
                bool set;
                int flags;
        } qps[] = {{false, 0}, {false, RW | RR | RA}, {true, 0}, {true, RW}, {true, RR},
                   {true, RA}, {true, RW | RR | RA}};
        for (unsigned q = 0; q < sizeof(qps) / sizeof(qps[0]); q++) {
                qp_rights(qps[q].set, qps[q].flags);
                for (unsigned r = 0; r < 3; r++) {
                        int acc = rights[r];
                        bool atomic = acc == RA;
                        bool granted = qps[q].set && (qps[q].flags & acc);
                        for (uint64_t len = 0; len <= 8; len += 8) {
                                uint8_t *host = NULL;
                                enum dw_prot_status st = dw_rdmap_check_remote(
                                    dw_rdmap_qp_of(&qp), acc, stag, IOVA + 64, len, &host);
                                /* a zero-length Write or Read needs no QP right */
                                bool ok = granted || (len == 0 && !atomic);
                                if (atomic && len != 8)
                                        ok = false;
                                cr_expect_eq(st == DW_PROT_OK, ok, "qp %u right %#x len %llu: %s",
                                             q, acc, (unsigned long long)len,
                                             dw_prot_status_str(st));
                                if (st == DW_PROT_OK && len)
                                        cr_expect_eq(host, (uint8_t *)buf64 + 64);
                                if (!ok && !(atomic && len != 8))
                                        cr_expect_eq(st, DW_PROT_ACCESS, "qp %u right %#x", q, acc);
                        }
                }
                cr_expect_eq(dw_rdmap_qp_allows(dw_rdmap_qp_of(&qp), RW | RR),
                             qps[q].set && (qps[q].flags & (RW | RR)) == (RW | RR), "qp %u", q);
        }
}

Test(rdmap_access, mr_rights_and_pd)
{
        qp_rights(true, RW | RR | RA);
        uint32_t ro = reg(&pd_a, RR);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RR, ro, IOVA, 16, NULL),
                     DW_PROT_OK);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, ro, IOVA, 16, NULL),
                     DW_PROT_ACCESS);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, ro, IOVA, 8, NULL),
                     DW_PROT_ACCESS);
        uint32_t other = reg(&pd_b, ALL);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, other, IOVA, 16, NULL),
                     DW_PROT_PD_MISMATCH);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, ro ^ 0xff, IOVA, 16, NULL),
                     DW_PROT_INVALID_STAG);
        /* bounds: the last byte is in, one more is not */
        uint32_t all = reg(&pd_a, ALL);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, all, IOVA, BUFSZ, NULL),
                     DW_PROT_OK);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, all, IOVA + 1, BUFSZ, NULL),
                     DW_PROT_BOUNDS);
}

Test(rdmap_access, atomic_alignment_and_length)
{
        qp_rights(true, RA);
        uint32_t stag = reg(&pd_a, ALL);
        uint8_t *host = (uint8_t *)1;
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, stag, IOVA + 8, 8, &host),
                     DW_PROT_OK);
        cr_expect_eq(host, (uint8_t *)&buf64[1]);
        for (unsigned mis = 1; mis < 8; mis++)
                cr_expect_eq(
                    dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, stag, IOVA + 8 + mis, 8, NULL),
                    DW_PROT_BOUNDS, "misaligned by %u", mis);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, stag, IOVA + 8, 4, NULL),
                     DW_PROT_BOUNDS);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, stag, IOVA + 8, 16, NULL),
                     DW_PROT_BOUNDS);
        cr_expect_eq(
            dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, stag, IOVA + BUFSZ - 8, 8, NULL),
            DW_PROT_OK);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RA, stag, IOVA + BUFSZ, 8, NULL),
                     DW_PROT_BOUNDS);
        /* Write and Read have no alignment rule */
        qp_rights(true, RW | RR);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, stag, IOVA + 3, 8, NULL),
                     DW_PROT_OK);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RR, stag, IOVA + 5, 3, NULL),
                     DW_PROT_OK);
}

/* A Read or Atomic Request as the responder gets it: decoded, its target
 * checked, and what a refusal becomes. */
Test(rdmap_access, read_request_accept)
{
        uint32_t stag = reg(&pd_a, ALL);
        struct dw_rdmap_rreq in = {.sink_stag = 7,
                                   .sink_to = 0x99,
                                   .rdma_rd_sz = 100,
                                   .src_stag = stag,
                                   .src_to = IOVA + 8};
        uint8_t b[DW_RDMAP_RREQ_HDR_LEN];
        cr_assert_eq(dw_rdmap_rreq_encode(&in, b, sizeof(b)), DW_RDMAP_RREQ_HDR_LEN);
        struct dw_rdmap_rreq rq;
        struct dw_rdmap_refusal ref;

        qp_rights(true, RR);
        cr_expect_eq(dw_rdmap_read_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &rq, &ref), 0);
        cr_expect(rq.src_stag == stag && rq.src_to == IOVA + 8 && rq.rdma_rd_sz == 100 &&
                  rq.sink_stag == 7 && rq.sink_to == 0x99);

        qp_rights(true, RW); /* no REMOTE_READ on the QP */
        cr_expect_eq(dw_rdmap_read_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &rq, &ref),
                     -EACCES);
        cr_expect_eq(ref.st, DW_PROT_ACCESS);
        cr_expect(ref.te.layer == DW_TERM_LAYER_RDMAP &&
                  ref.te.etype == DW_TERM_RDMAP_REMOTE_PROTECTION &&
                  ref.te.ecode == DW_TERM_RDMAP_ACCESS_RIGHTS);
        cr_expect_not_null(ref.why);

        qp_rights(true, RR);
        in.rdma_rd_sz = BUFSZ; /* runs 8 bytes past the region */
        dw_rdmap_rreq_encode(&in, b, sizeof(b));
        cr_expect_eq(dw_rdmap_read_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &rq, &ref),
                     -EACCES);
        cr_expect_eq(ref.te.ecode, DW_TERM_RDMAP_BASE_BOUNDS);

        cr_expect_eq(dw_rdmap_read_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b) - 1, &rq, &ref),
                     -EBADMSG);
        cr_expect_eq(ref.st, DW_PROT_OK);
        cr_expect(ref.te.etype == DW_TERM_RDMAP_REMOTE_OPERATION);
        cr_expect_eq(dw_rdmap_term_to_nak(ref.te), DW_DGRAM_NAK_INVALID);
        cr_expect_not_null(ref.why);
}

Test(rdmap_access, atomic_request_accept)
{
        uint32_t stag = reg(&pd_a, ALL);
        struct dw_rdmap_atomic_req in = {.aopcode = DW_ATOMIC_FETCH_ADD,
                                         .req_id = 3,
                                         .remote_stag = stag,
                                         .remote_to = IOVA + 16,
                                         .add_swap_data = 1};
        uint8_t b[DW_RDMAP_ATOMIC_REQ_HDR_LEN];
        cr_assert_eq(dw_rdmap_atomic_req_encode(&in, b, sizeof(b)), DW_RDMAP_ATOMIC_REQ_HDR_LEN);
        struct dw_rdmap_atomic_req ar;
        struct dw_rdmap_refusal ref;
        uint8_t *host = NULL;

        qp_rights(true, RA);
        cr_expect_eq(
            dw_rdmap_atomic_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &ar, &host, &ref), 0);
        cr_expect_eq(host, (uint8_t *)&buf64[2]);
        buf64[2] = 41;
        cr_expect_eq(dw_rdmap_atomic_exec((uint64_t *)host, &ar), 41);
        cr_expect_eq(buf64[2], 42);

        in.remote_to = IOVA + 20; /* not an aligned word */
        dw_rdmap_atomic_req_encode(&in, b, sizeof(b));
        cr_expect_eq(
            dw_rdmap_atomic_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &ar, &host, &ref),
            -EACCES);
        cr_expect_eq(ref.st, DW_PROT_BOUNDS);
        cr_expect(ref.te.layer == DW_TERM_LAYER_RDMAP && ref.te.ecode == DW_TERM_RDMAP_BASE_BOUNDS);
        cr_expect_eq(dw_rdmap_term_to_nak(ref.te), DW_DGRAM_NAK_REM_ACCESS);

        qp_rights(false, 0);
        in.remote_to = IOVA + 16;
        dw_rdmap_atomic_req_encode(&in, b, sizeof(b));
        cr_expect_eq(
            dw_rdmap_atomic_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &ar, &host, &ref),
            -EACCES);
        cr_expect_eq(ref.st, DW_PROT_ACCESS);

        b[3] = 0x7; /* an AOpCode RFC 7306 does not define */
        cr_expect_eq(
            dw_rdmap_atomic_req_accept(dw_rdmap_qp_of(&qp), b, sizeof(b), &ar, &host, &ref),
            -EBADMSG);
        cr_expect_eq(ref.te.ecode, DW_TERM_RDMAP_UNEXPECTED_OPCODE);
}

/* ---- atomics ----------------------------------------------------------- */

/* Reference: add each field (a 1 in mask ends one) modulo its width. */
static uint64_t fields_add(uint64_t a, uint64_t b, uint64_t mask)
{
        uint64_t r = 0;
        unsigned lo = 0;
        for (unsigned i = 0; i < 64; i++) {
                if (i == 63 || ((mask >> i) & 1)) {
                        unsigned w = i - lo + 1;
                        uint64_t m = w == 64 ? ~0ull : ((1ull << w) - 1);
                        r |= ((((a >> lo) & m) + ((b >> lo) & m)) & m) << lo;
                        lo = i + 1;
                }
        }
        return r;
}

Test(rdmap_atomic, masked_add)
{
        cr_expect_eq(dw_rdmap_masked_add(5, 7, 0), 12);
        cr_expect_eq(dw_rdmap_masked_add(~0ull, 1, 0), 0);
        /* two 32-bit fields: the low one wraps without carrying */
        cr_expect_eq(dw_rdmap_masked_add(0x00000001ffffffffull, 1, 0x8000000080000000ull),
                     0x0000000100000000ull);
        /* every bit its own field: XOR */
        cr_expect_eq(dw_rdmap_masked_add(0xf0f0, 0xff00, ~0ull), 0xf0f0 ^ 0xff00);
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < 2000; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                uint64_t a = x;
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                uint64_t b = x;
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                uint64_t m = x & x >> 3; /* sparse: fields of a few bits to dozens */
                cr_assert_eq(dw_rdmap_masked_add(a, b, m), fields_add(a, b, m),
                             "a %#llx b %#llx mask %#llx", (unsigned long long)a,
                             (unsigned long long)b, (unsigned long long)m);
        }
}

Test(rdmap_atomic, exec)
{
        uint64_t v = 100;
        struct dw_rdmap_atomic_req fa = {.aopcode = DW_ATOMIC_FETCH_ADD, .add_swap_data = 5};
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &fa), 100);
        cr_expect_eq(v, 105);
        /* masked Fetch-and-Add: two 32-bit counters in one word */
        v = 0x00000007ffffffffull;
        fa = (struct dw_rdmap_atomic_req){.aopcode = DW_ATOMIC_FETCH_ADD,
                                          .add_swap_data = 0x0000000100000001ull,
                                          .add_swap_mask = 0x8000000080000000ull};
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &fa), 0x00000007ffffffffull);
        cr_expect_eq(v, 0x0000000800000000ull);
        /* Swap writes the bits of its mask only */
        v = 0x1111111111111111ull;
        struct dw_rdmap_atomic_req sw = {.aopcode = DW_ATOMIC_SWAP,
                                         .add_swap_data = 0xaaaaaaaaaaaaaaaaull,
                                         .add_swap_mask = 0x00000000ffffffffull};
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &sw), 0x1111111111111111ull);
        cr_expect_eq(v, 0x11111111aaaaaaaaull);
        /* Compare-and-Swap: compares under its mask, swaps under its own */
        v = 0x1234;
        struct dw_rdmap_atomic_req cs = {.aopcode = DW_ATOMIC_CMP_SWAP,
                                         .add_swap_data = 0xbeef,
                                         .add_swap_mask = ~0ull,
                                         .compare_data = 0xff34,
                                         .compare_mask = 0x00ff};
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &cs), 0x1234);
        cr_expect_eq(v, 0xbeef, "the masked compare matched");
        cs.compare_mask = 0xffff;
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &cs), 0xbeef);
        cr_expect_eq(v, 0xbeef, "no match: unchanged");
}

Test(rdmap_atomic, request_from_wr)
{
        struct dw_wqe w = {.opcode = DIWARP_WR_ATOMIC_CMP_AND_SWP,
                           .rkey = 0xabcd0001,
                           .remote_addr = IOVA + 16,
                           .compare_add = 7,
                           .swap = 9};
        struct dw_rdmap_atomic_req ar;
        dw_rdmap_atomic_req_build(&w, 42, &ar);
        cr_expect_eq(ar.aopcode, DW_ATOMIC_CMP_SWAP);
        cr_expect_eq(ar.req_id, 42);
        cr_expect_eq(ar.remote_stag, 0xabcd0001);
        cr_expect_eq(ar.remote_to, IOVA + 16);
        /* through the wire and executed: the verbs' semantics */
        uint8_t b[DW_RDMAP_ATOMIC_REQ_HDR_LEN];
        struct dw_rdmap_atomic_req back;
        cr_assert_eq(dw_rdmap_atomic_req_encode(&ar, b, sizeof(b)), DW_RDMAP_ATOMIC_REQ_HDR_LEN);
        cr_assert_eq(dw_rdmap_atomic_req_decode(b, sizeof(b), &back, NULL),
                     DW_RDMAP_ATOMIC_REQ_HDR_LEN);
        uint64_t v = 7;
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &back), 7);
        cr_expect_eq(v, 9);
        v = 0x8000000000000007ull; /* differs in bit 63: all 64 bits compared */
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &back), 0x8000000000000007ull);
        cr_expect_eq(v, 0x8000000000000007ull);

        w.opcode = DIWARP_WR_ATOMIC_FETCH_AND_ADD;
        w.compare_add = 0x100000001ull;
        dw_rdmap_atomic_req_build(&w, 43, &ar);
        cr_expect_eq(ar.aopcode, DW_ATOMIC_FETCH_ADD);
        cr_expect_eq(ar.add_swap_mask, 0, "verbs Fetch-and-Add has no fields");
        v = 0xffffffffull;
        cr_expect_eq(dw_rdmap_atomic_exec(&v, &ar), 0xffffffffull);
        cr_expect_eq(v, 0x200000000ull, "the carry crosses bit 31");
}

/* A Read Response segment's header names the Data Sink at the segment's
 * offset, and only the segment that ends the Read is Last. */
Test(rdmap_responder, read_resp_hdr)
{
        struct dw_rdmap_rreq rq = {.sink_stag = 0xabcd01,
                                   .sink_to = 0x7000,
                                   .rdma_rd_sz = 3000,
                                   .src_stag = 0x1234,
                                   .src_to = 0x9000};
        struct dw_rdmap_hdr h;
        dw_rdmap_read_resp_hdr(&rq, 0, 1440, &h);
        cr_expect_eq(h.opcode, DW_RDMAP_READ_RESP);
        cr_expect(h.ddp.tagged);
        cr_expect_eq(h.ddp.stag, 0xabcd01);
        cr_expect_eq(h.ddp.to, 0x7000);
        cr_expect(!h.ddp.last);
        dw_rdmap_read_resp_hdr(&rq, 1440, 1440, &h);
        cr_expect_eq(h.ddp.to, 0x7000 + 1440);
        cr_expect(!h.ddp.last);
        dw_rdmap_read_resp_hdr(&rq, 2880, 120, &h);
        cr_expect_eq(h.ddp.to, 0x7000 + 2880);
        cr_expect(h.ddp.last, "the segment that ends the Read");
        rq.rdma_rd_sz = 0; /* a zero-length Read: one empty, last segment */
        dw_rdmap_read_resp_hdr(&rq, 0, 0, &h);
        cr_expect(h.ddp.last);
}

/* The responder's record of a Read Request, as both transports keep it in
 * their IRQ: accepted with its header's MSN, then served segment by segment
 * from the region, each segment's source checked again. */
Test(rdmap_responder, read_request_served, .init = setup, .fini = teardown)
{
        struct dw_mr *mr = NULL;
        cr_assert_eq(dw_mr_register(&dev->mrs, &pd_a, buf64, BUFSZ, IOVA, ALL, &mr), 0);
        struct dw_rdmap_rreq in = {.sink_stag = 0x55,
                                   .sink_to = 0x7000,
                                   .rdma_rd_sz = 3000,
                                   .src_stag = mr->stag,
                                   .src_to = IOVA + 64};
        uint8_t b[DW_RDMAP_RREQ_HDR_LEN];
        cr_assert_eq(dw_rdmap_rreq_encode(&in, b, sizeof(b)), DW_RDMAP_RREQ_HDR_LEN);
        struct dw_rdmap_hdr h;
        dw_rdmap_hdr_init(&h, DW_RDMAP_READ_REQ);
        h.ddp.msn = 9;
        struct dw_rdmap_resp r;
        struct dw_rdmap_refusal ref;
        struct dw_rdmap_resp_seg sg;

        qp_rights(true, RR);
        cr_assert_eq(dw_rdmap_resp_accept(dw_rdmap_qp_of(&qp), &h, b, sizeof(b), &r, &ref), 0);
        cr_expect(!r.atomic);
        cr_expect_eq(r.msn, 9);
        cr_expect(r.rq.src_stag == mr->stag && r.rq.rdma_rd_sz == 3000);
        uint64_t off = 0;
        unsigned n = 0;
        do {
                cr_assert_eq(dw_rdmap_resp_segment(dw_rdmap_qp_of(&qp), &r, off, 1440, &sg),
                             DW_PROT_OK);
                cr_expect_eq(sg.h.opcode, DW_RDMAP_READ_RESP);
                cr_expect_eq(sg.h.ddp.stag, 0x55);
                cr_expect_eq(sg.h.ddp.to, 0x7000 + off);
                cr_expect_eq(sg.src, (uint8_t *)buf64 + 64 + off);
                cr_expect_eq(sg.len, off + 1440 <= 3000 ? 1440 : 3000 - off);
                cr_expect_eq(sg.extlen, 0);
                cr_expect_eq(sg.ends, sg.h.ddp.last);
                off += sg.len;
                n++;
        } while (!sg.ends && n < 10);
        cr_expect_eq(n, 3);
        cr_expect_eq(off, 3000);

        /* Deregistered after the request was accepted: the next segment is
         * refused, with the status its Terminate or NAK reports. */
        cr_assert_eq(dw_mr_deregister(&dev->mrs, mr), 0);
        cr_expect_neq(dw_rdmap_resp_segment(dw_rdmap_qp_of(&qp), &r, 1440, 1440, &sg), DW_PROT_OK);

        /* Refused as it comes: a source it may not read, or a request that
         * does not decode. */
        cr_expect_eq(dw_rdmap_resp_accept(dw_rdmap_qp_of(&qp), &h, b, sizeof(b), &r, &ref),
                     -EACCES);
        cr_expect_neq(ref.st, DW_PROT_OK);
        cr_expect_eq(dw_rdmap_resp_accept(dw_rdmap_qp_of(&qp), &h, b, sizeof(b) - 1, &r, &ref),
                     -EBADMSG);
}

/* A zero-length Read is one empty segment that ends it. */
Test(rdmap_responder, zero_length_read, .init = setup, .fini = teardown)
{
        struct dw_rdmap_resp r = {.rq = {.sink_stag = 3, .rdma_rd_sz = 0, .src_stag = 0x77}};
        struct dw_rdmap_resp_seg sg;
        qp_rights(false, 0); /* a zero-length Read needs no right */
        cr_expect_eq(dw_rdmap_resp_segment(dw_rdmap_qp_of(&qp), &r, 0, 1440, &sg), DW_PROT_OK);
        cr_expect(sg.ends && sg.h.ddp.last);
        cr_expect_eq(sg.len, 0);
        cr_expect_eq(sg.h.ddp.stag, 3);
}

/* An Atomic runs once, as it is accepted; its response carries the value
 * from then however often it is built (RD sends it again after a loss) and
 * whatever the word holds since (a later Write on the stream). */
Test(rdmap_responder, atomic_runs_once_at_acceptance, .init = setup, .fini = teardown)
{
        uint32_t stag = reg(&pd_a, ALL);
        struct dw_rdmap_atomic_req in = {.aopcode = DW_ATOMIC_FETCH_ADD,
                                         .req_id = 0xbeef,
                                         .remote_stag = stag,
                                         .remote_to = IOVA + 24,
                                         .add_swap_data = 5};
        uint8_t b[DW_RDMAP_ATOMIC_REQ_HDR_LEN];
        cr_assert_eq(dw_rdmap_atomic_req_encode(&in, b, sizeof(b)), DW_RDMAP_ATOMIC_REQ_HDR_LEN);
        struct dw_rdmap_hdr h;
        dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_REQ);
        h.ddp.msn = 4;
        struct dw_rdmap_resp r;
        struct dw_rdmap_refusal ref;
        struct dw_rdmap_resp_seg sg;

        buf64[3] = 100;
        qp_rights(true, RA);
        /* The check alone runs nothing. */
        cr_expect_eq(dw_rdmap_resp_check(dw_rdmap_qp_of(&qp), &h, b, sizeof(b), &ref), 0);
        cr_expect_eq(buf64[3], 100);
        cr_assert_eq(dw_rdmap_resp_accept(dw_rdmap_qp_of(&qp), &h, b, sizeof(b), &r, &ref), 0);
        cr_expect(r.atomic);
        cr_expect_eq(buf64[3], 105, "executed as it was accepted");
        cr_expect_eq(r.orig, 100);
        buf64[3] = 7; /* a later Write */
        for (int i = 0; i < 2; i++) {
                cr_assert_eq(dw_rdmap_resp_segment(dw_rdmap_qp_of(&qp), &r, 0, 1440, &sg),
                             DW_PROT_OK);
                cr_expect_eq(sg.h.opcode, DW_RDMAP_ATOMIC_RESP);
                cr_expect_eq(sg.h.ddp.msn, 4);
                cr_expect(sg.ends);
                cr_expect_eq(sg.len, 0);
                struct dw_rdmap_atomic_resp ar;
                const char *why = NULL;
                cr_assert_eq(sg.extlen, DW_RDMAP_ATOMIC_RESP_HDR_LEN);
                cr_assert_geq(dw_rdmap_atomic_resp_decode(sg.ext, sg.extlen, &ar, &why), 0);
                cr_expect_eq(ar.req_id, 0xbeef);
                cr_expect_eq(ar.orig_data, 100);
        }
        cr_expect_eq(buf64[3], 7, "building the response ran nothing again");

        /* Refused: nothing runs. */
        qp_rights(true, RR);
        buf64[3] = 100;
        cr_expect_eq(dw_rdmap_resp_accept(dw_rdmap_qp_of(&qp), &h, b, sizeof(b), &r, &ref),
                     -EACCES);
        cr_expect_eq(ref.st, DW_PROT_ACCESS);
        cr_expect_eq(buf64[3], 100);
        cr_expect_eq(dw_rdmap_resp_check(dw_rdmap_qp_of(&qp), &h, b, sizeof(b), &ref), -EACCES);
        cr_expect_eq(ref.st, DW_PROT_ACCESS);
        cr_expect_eq(dw_rdmap_resp_check(dw_rdmap_qp_of(&qp), &h, b, sizeof(b) - 1, &ref),
                     -EBADMSG);
}

/* The Immediate Data message's opcode (RFC 7306): SE from the transport's
 * choice, and the receive path reads it as Immediate Data. */
Test(rdmap_requester, imm_opcode)
{
        cr_expect_eq(dw_rdmap_imm_opcode(false), DW_RDMAP_IMM_DATA);
        cr_expect_eq(dw_rdmap_imm_opcode(true), DW_RDMAP_IMM_DATA_SE);
        for (int se = 0; se < 2; se++) {
                const struct dw_rdmap_op *op = dw_rdmap_op(dw_rdmap_imm_opcode(se));
                cr_assert_not_null(op);
                cr_expect_eq(op->rx, DW_RDMAP_RX_IMM);
                cr_expect(!dw_rdmap_is_send(dw_rdmap_imm_opcode(se)));
        }
}

/* The Send family's RDMAP opcode from a WR (RFC 5040 §4.2): Invalidate from
 * the WR's opcode, SE from the transport's choice. */
Test(rdmap_requester, send_opcode)
{
        struct dw_wqe w = {.opcode = DIWARP_WR_SEND};
        cr_expect_eq(dw_rdmap_send_opcode(&w, false), DW_RDMAP_SEND);
        cr_expect_eq(dw_rdmap_send_opcode(&w, true), DW_RDMAP_SEND_SE);
        w.opcode = DIWARP_WR_SEND_WITH_IMM;
        cr_expect_eq(dw_rdmap_send_opcode(&w, false), DW_RDMAP_SEND);
        cr_expect_eq(dw_rdmap_send_opcode(&w, true), DW_RDMAP_SEND_SE);
        w.opcode = DIWARP_WR_SEND_WITH_INV;
        cr_expect_eq(dw_rdmap_send_opcode(&w, false), DW_RDMAP_SEND_INVAL);
        cr_expect_eq(dw_rdmap_send_opcode(&w, true), DW_RDMAP_SEND_SE_INVAL);
        /* each is the Send family, and its SE and Invalidate read back */
        const int sends[] = {DIWARP_WR_SEND, DIWARP_WR_SEND_WITH_IMM, DIWARP_WR_SEND_WITH_INV};
        for (int se = 0; se < 2; se++)
                for (size_t i = 0; i < sizeof(sends) / sizeof(sends[0]); i++) {
                        w.opcode = sends[i];
                        uint8_t o = dw_rdmap_send_opcode(&w, se);
                        cr_expect(dw_rdmap_is_send(o));
                        cr_expect_eq(dw_rdmap_send_se(o), se);
                        cr_expect_eq(dw_rdmap_send_inval(o), sends[i] == DIWARP_WR_SEND_WITH_INV);
                }
}

/* The header of each data segment of a WR, as RC, RD and UD send it: a
 * Write's tagged at the remote address + offset, a Send's untagged at its
 * MO with the MSN given, Last only on the segment that ends the WR. */
Test(rdmap_requester, data_segment_headers)
{
        struct dw_wqe w = {.opcode = DIWARP_WR_RDMA_WRITE,
                           .total_len = 3000,
                           .rkey = 0xabc,
                           .remote_addr = 0x10000};
        struct dw_rdmap_hdr h;
        dw_rdmap_data_hdr(&w, 0, 1440, 0, false, &h);
        cr_expect(h.opcode == DW_RDMAP_WRITE && h.ddp.tagged);
        cr_expect(h.ddp.stag == 0xabc && h.ddp.to == 0x10000 && !h.ddp.last);
        dw_rdmap_data_hdr(&w, 2880, 120, 0, false, &h);
        cr_expect(h.ddp.to == 0x10000 + 2880 && h.ddp.last);
        w.opcode = DIWARP_WR_RDMA_WRITE_WITH_IMM;
        dw_rdmap_data_hdr(&w, 1440, 1560, 0, false, &h);
        cr_expect(h.opcode == DW_RDMAP_WRITE && h.ddp.last);

        w.opcode = DIWARP_WR_SEND_WITH_INV;
        w.invalidate_rkey = 0x4242;
        dw_rdmap_data_hdr(&w, 1440, 1440, 17, true, &h);
        cr_expect(h.opcode == DW_RDMAP_SEND_SE_INVAL && !h.ddp.tagged);
        cr_expect(h.ddp.qn == 0 && h.ddp.msn == 17 && h.ddp.mo == 1440 && !h.ddp.last);
        cr_expect_eq(h.inval_stag, 0x4242);
        w.opcode = DIWARP_WR_SEND;
        dw_rdmap_data_hdr(&w, 2880, 120, 18, false, &h);
        cr_expect(h.opcode == DW_RDMAP_SEND && h.ddp.msn == 18 && h.ddp.last);
        w.total_len = 0; /* a zero-length Send: one segment, Last */
        dw_rdmap_data_hdr(&w, 0, 0, 19, false, &h);
        cr_expect(h.ddp.last && h.ddp.mo == 0);
        /* what the decoder reads back is what was built */
        uint8_t b[DW_DDP_MAX_HDR_LEN];
        struct dw_rdmap_hdr back;
        const char *why = NULL;
        w.opcode = DIWARP_WR_SEND_WITH_INV;
        w.total_len = 3000;
        dw_rdmap_data_hdr(&w, 1440, 1440, 17, false, &h);
        ssize_t n = dw_rdmap_encode(&h, b, sizeof(b));
        cr_assert_gt(n, 0);
        cr_assert_eq(dw_rdmap_decode(b, (size_t)n, &back, &why), n);
        cr_expect(back.opcode == DW_RDMAP_SEND_INVAL && back.ddp.msn == 17 && back.ddp.mo == 1440 &&
                  back.inval_stag == 0x4242 && !back.ddp.last);
}

/* A Read WR's request: its remote source and length, the sink as the
 * transport names it. */
Test(rdmap_requester, read_request_from_wr)
{
        struct dw_wqe w = {
            .opcode = DIWARP_WR_RDMA_READ, .total_len = 5000, .rkey = 0x77, .remote_addr = 0x2000};
        struct dw_rdmap_rreq rq;
        dw_rdmap_read_req_build(&w, 0x31, 0x9000, &rq);
        cr_expect(rq.src_stag == 0x77 && rq.src_to == 0x2000 && rq.rdma_rd_sz == 5000);
        cr_expect(rq.sink_stag == 0x31 && rq.sink_to == 0x9000);
}

/* ---- error classification ---------------------------------------------- */

static const enum dw_prot_status all_fail[] = {
    DW_PROT_INVALID_STAG,
    DW_PROT_PD_MISMATCH,
    DW_PROT_ACCESS,
    DW_PROT_BOUNDS,
    DW_PROT_INVALIDATED,
    DW_PROT_TO_WRAP,
    DW_PROT_NOT_INVALIDATABLE,
};
#define NFAIL (sizeof(all_fail) / sizeof(all_fail[0]))

struct term_case {
        enum dw_prot_status st;
        enum dw_prot_ctx ctx;
        uint8_t layer, etype, ecode;
};

Test(rdmap_class, terminate_errors)
{
        const struct term_case cases[] = {
            /* tagged placement: DDP Tagged Buffer Error (RFC 5041) */
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x00},
            {DW_PROT_INVALIDATED, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x00},
            {DW_PROT_BOUNDS, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x01},
            {DW_PROT_PD_MISMATCH, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x02},
            {DW_PROT_TO_WRAP, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x03},
            /* no DDP code for rights: RDMAP Remote Protection / access */
            {DW_PROT_ACCESS, DW_PROT_CTX_TAGGED_SINK, 0, 1, 0x02},
            /* Read Request source: RDMAP Remote Protection Error */
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x00},
            {DW_PROT_INVALIDATED, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x00},
            {DW_PROT_BOUNDS, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x01},
            {DW_PROT_ACCESS, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x02},
            {DW_PROT_PD_MISMATCH, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x03},
            {DW_PROT_TO_WRAP, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x04},
            {DW_PROT_ACCESS, DW_PROT_CTX_ATOMIC, 0, 1, 0x02},
            {DW_PROT_BOUNDS, DW_PROT_CTX_ATOMIC, 0, 1, 0x01},
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_ATOMIC, 0, 1, 0x00},
            /* Send with Invalidate: STag cannot be invalidated */
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
            {DW_PROT_INVALIDATED, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
            {DW_PROT_PD_MISMATCH, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
            {DW_PROT_NOT_INVALIDATABLE, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
        };
        for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct dw_term_error e = {0xee, 0xee, 0xee};
                cr_assert_eq(dw_prot_status_to_term(cases[i].st, cases[i].ctx, &e), 0, "case %u",
                             i);
                cr_expect_eq(e.layer, cases[i].layer, "case %u layer", i);
                cr_expect_eq(e.etype, cases[i].etype, "case %u etype", i);
                cr_expect_eq(e.ecode, cases[i].ecode, "case %u ecode", i);
        }
        /* every failing status maps in every access context */
        const enum dw_prot_ctx ctxs[] = {DW_PROT_CTX_TAGGED_SINK, DW_PROT_CTX_READ_SOURCE,
                                         DW_PROT_CTX_ATOMIC};
        for (unsigned c = 0; c < 3; c++)
                for (unsigned i = 0; i < NFAIL; i++) {
                        struct dw_term_error e;
                        cr_expect_eq(dw_prot_status_to_term(all_fail[i], ctxs[c], &e), 0);
                }
}

Test(rdmap_class, terminate_rejects_nonsense)
{
        struct dw_term_error e;
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_OK, DW_PROT_CTX_TAGGED_SINK, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_ACCESS, DW_PROT_CTX_INVALIDATE, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_BOUNDS, DW_PROT_CTX_INVALIDATE, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_BOUNDS, (enum dw_prot_ctx)42, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term((enum dw_prot_status)77, DW_PROT_CTX_READ_SOURCE, &e),
                     -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_BOUNDS, DW_PROT_CTX_READ_SOURCE, NULL),
                     -EINVAL);
}

Test(rdmap_class, vendor_err_encoding)
{
        struct dw_term_error e = {.layer = 1, .etype = 1, .ecode = 3};
        cr_expect_eq(dw_term_vendor_err(e), 0x1103u);
        struct dw_term_error f = {.layer = 0, .etype = 2, .ecode = 0xff};
        cr_expect_eq(dw_term_vendor_err(f), 0x02ffu);
}

Test(rdmap_class, protection_is_rem_access_nak)
{
        /* Every failed remote-access check is REM_ACCESS for RD, as the
         * Terminate RC sends for it is a protection error. */
        const enum dw_prot_ctx ctxs[] = {DW_PROT_CTX_TAGGED_SINK, DW_PROT_CTX_READ_SOURCE,
                                         DW_PROT_CTX_ATOMIC};
        for (unsigned c = 0; c < 3; c++)
                for (unsigned i = 0; i < NFAIL; i++) {
                        struct dw_term_error e;
                        cr_assert_eq(dw_prot_status_to_term(all_fail[i], ctxs[c], &e), 0);
                        cr_expect_eq(dw_rdmap_term_to_nak(e), DW_DGRAM_NAK_REM_ACCESS,
                                     "ctx %u status %u", c, i);
                        int ev = -1;
                        cr_expect_eq(dw_rdmap_term_to_wc(e, &ev), DIWARP_WC_REM_ACCESS_ERR);
                        cr_expect_eq(ev, DIWARP_EVENT_QP_ACCESS_ERR);
                        cr_expect_eq(dw_rdmap_nak_to_wc(dw_rdmap_term_to_nak(e)),
                                     DIWARP_WC_REM_ACCESS_ERR);
                }
}

Test(rdmap_class, prot_term_never_fails)
{
        struct dw_term_error e = dw_rdmap_prot_term(DW_PROT_BOUNDS, DW_PROT_CTX_TAGGED_SINK);
        cr_expect(e.layer == DW_TERM_LAYER_DDP && e.etype == DW_TERM_DDP_TAGGED &&
                  e.ecode == DW_TERM_DDP_T_BASE_BOUNDS);
        e = dw_rdmap_prot_term(DW_PROT_BOUNDS, DW_PROT_CTX_INVALIDATE); /* no mapping */
        cr_expect(e.layer == DW_TERM_LAYER_RDMAP && e.etype == DW_TERM_RDMAP_REMOTE_PROTECTION &&
                  e.ecode == DW_TERM_RDMAP_UNSPECIFIED);
}

Test(rdmap_class, receive_and_malformed)
{
        struct dw_term_error e = dw_rdmap_recv_term(-EMSGSIZE);
        cr_expect(e.layer == DW_TERM_LAYER_DDP && e.etype == DW_TERM_DDP_UNTAGGED &&
                  e.ecode == DW_TERM_DDP_U_MSG_TOO_LONG);
        cr_expect_eq(dw_rdmap_term_to_nak(e), DW_DGRAM_NAK_INVALID);
        cr_expect_eq(dw_rdmap_term_to_wc(e, NULL), DIWARP_WC_REM_INV_REQ_ERR);
        cr_expect_eq(dw_rdmap_nak_to_wc(DW_DGRAM_NAK_INVALID), DIWARP_WC_REM_INV_REQ_ERR);

        e = dw_rdmap_recv_term(-EACCES); /* the receive WR's own lkey */
        cr_expect(e.layer == DW_TERM_LAYER_RDMAP && e.etype == DW_TERM_RDMAP_REMOTE_OPERATION &&
                  e.ecode == DW_TERM_RDMAP_CATASTROPHIC_STREAM);
        cr_expect_eq(dw_rdmap_term_to_nak(e), DW_DGRAM_NAK_REM_OP);
        cr_expect_eq(dw_rdmap_term_to_wc(e, NULL), DIWARP_WC_REM_OP_ERR);
        cr_expect_eq(dw_rdmap_nak_to_wc(DW_DGRAM_NAK_REM_OP), DIWARP_WC_REM_OP_ERR);

        e = dw_rdmap_malformed_term(DW_RDMAP_READ_REQ);
        cr_expect(e.layer == DW_TERM_LAYER_RDMAP && e.etype == DW_TERM_RDMAP_REMOTE_OPERATION &&
                  e.ecode == DW_TERM_RDMAP_UNSPECIFIED);
        cr_expect_eq(dw_rdmap_term_to_nak(e), DW_DGRAM_NAK_INVALID);
        e = dw_rdmap_malformed_term(DW_RDMAP_ATOMIC_REQ);
        cr_expect(e.layer == DW_TERM_LAYER_RDMAP && e.etype == DW_TERM_RDMAP_REMOTE_OPERATION &&
                  e.ecode == DW_TERM_RDMAP_UNEXPECTED_OPCODE);
        cr_expect_eq(dw_rdmap_term_to_nak(e), DW_DGRAM_NAK_INVALID);
}

Test(rdmap_class, received_terminate)
{
        const struct {
                struct dw_term_error e;
                enum diwarp_wc_status st;
                int ev;
        } cases[] = {
            {{DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_BASE_BOUNDS},
             DIWARP_WC_REM_ACCESS_ERR,
             DIWARP_EVENT_QP_ACCESS_ERR},
            {{DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED, DW_TERM_DDP_U_NO_BUFFER},
             DIWARP_WC_RNR_RETRY_EXC_ERR,
             DIWARP_EVENT_QP_REQ_ERR},
            {{DW_TERM_LAYER_DDP, DW_TERM_DDP_UNTAGGED, DW_TERM_DDP_U_MSN_RANGE},
             DIWARP_WC_REM_OP_ERR,
             DIWARP_EVENT_QP_REQ_ERR},
            {{DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION,
              DW_TERM_RDMAP_STAG_NOT_INVALIDATED},
             DIWARP_WC_REM_ACCESS_ERR,
             DIWARP_EVENT_QP_ACCESS_ERR},
            {{DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION,
              DW_TERM_RDMAP_STAG_NOT_INVALIDATED},
             DIWARP_WC_REM_INV_REQ_ERR,
             DIWARP_EVENT_QP_REQ_ERR},
            {{DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_OPERATION, DW_TERM_RDMAP_UNEXPECTED_OPCODE},
             DIWARP_WC_REM_OP_ERR,
             DIWARP_EVENT_QP_REQ_ERR},
            {{DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_LOCAL_CATASTROPHIC,
              DW_TERM_RDMAP_CATASTROPHIC_STREAM},
             DIWARP_WC_REM_ABORT_ERR,
             DIWARP_EVENT_QP_FATAL},
            {{DW_TERM_LAYER_LLP, DW_TERM_LLP_MPA, DW_TERM_LLP_CRC},
             DIWARP_WC_REM_ABORT_ERR,
             DIWARP_EVENT_QP_FATAL},
        };
        for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                int ev = -1;
                cr_expect_eq(dw_rdmap_term_to_wc(cases[i].e, &ev), cases[i].st, "case %u", i);
                cr_expect_eq(ev, cases[i].ev, "case %u event", i);
        }
        /* an RNR NAK or anything unknown as an error NAK: invalid request */
        cr_expect_eq(dw_rdmap_nak_to_wc(DW_DGRAM_NAK_INVALID + 1), DIWARP_WC_REM_INV_REQ_ERR);
}

/* ---- Send placement ---------------------------------------------------- */

/* The opcodes of the Send family are the untagged, queue-0 messages that
 * carry payload; SE and Invalidate as the opcode's name says, the
 * Invalidate ones exactly those whose RsvdULP word is an STag. */
Test(rdmap_op, send_family)
{
        unsigned sends = 0, se = 0;
        for (unsigned op = 0; op < 300; op++) {
                const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(op);
                bool send = oi && !oi->tagged && oi->qn == DW_RDMAP_QN_SEND && !oi->single_segment;
                cr_expect_eq(dw_rdmap_is_send(op), send, "op %u", op);
                cr_expect_eq(dw_rdmap_send_inval(op), oi && oi->inval_stag, "op %u", op);
                cr_expect(!dw_rdmap_send_se(op) || send, "op %u: SE only on a Send", op);
                sends += send;
                se += dw_rdmap_send_se(op);
        }
        cr_expect_eq(sends, 4);
        cr_expect_eq(se, 2);
        cr_expect(dw_rdmap_send_se(DW_RDMAP_SEND_SE) && dw_rdmap_send_se(DW_RDMAP_SEND_SE_INVAL));
}

/* A receive WR of two SGEs (32 + 32 bytes) at buf64 + 64 and + 256. */
static void recv_wr(struct dw_wqe *w, uint32_t lkey)
{
        memset(w, 0, sizeof(*w));
        w->num_sge = 2;
        w->sge[0] = (struct diwarp_sge){.addr = IOVA + 64, .length = 32, .lkey = lkey};
        w->sge[1] = (struct diwarp_sge){.addr = IOVA + 256, .length = 32, .lkey = lkey};
        w->total_len = 64;
}

static bool untouched(size_t from, size_t len)
{
        const uint8_t *b = (const uint8_t *)buf64;
        for (size_t i = from; i < from + len; i++)
                if (b[i])
                        return false;
        return true;
}

/* A Send's payload lands across the WR's SGEs at its offset (MO). */
Test(rdmap_access, send_scatter_across_sges)
{
        uint32_t lkey = reg(&pd_a, DIWARP_ACCESS_LOCAL_WRITE);
        struct dw_wqe w;
        recv_wr(&w, lkey);
        uint8_t src[40];
        for (unsigned i = 0; i < sizeof(src); i++)
                src[i] = (uint8_t)(i + 1);
        cr_assert_eq(dw_rdmap_send_place(dw_rdmap_qp_of(&qp), &w, 16, src, sizeof(src)), 0);
        const uint8_t *b = (const uint8_t *)buf64;
        cr_expect_eq(memcmp(b + 64 + 16, src, 16), 0, "first SGE from offset 16");
        cr_expect_eq(memcmp(b + 256, src + 16, 24), 0, "the rest at the second SGE");
        cr_expect(untouched(64, 16) && untouched(256 + 24, 8) && untouched(96, 160));
        /* the same walk as iovecs (RC reads the payload into them) */
        struct iovec iov[DW_MAX_SGE];
        cr_expect_eq(dw_rdmap_send_target(dw_rdmap_qp_of(&qp), &w, 16, 40, iov, DW_MAX_SGE), 2);
        cr_expect(iov[0].iov_base == b + 80 && iov[0].iov_len == 16);
        cr_expect(iov[1].iov_base == b + 256 && iov[1].iov_len == 24);
        cr_expect_eq(dw_rdmap_send_target(dw_rdmap_qp_of(&qp), &w, 16, 40, iov, 1), -EMSGSIZE,
                     "more pieces than iovecs");
        cr_expect_eq(dw_rdmap_send_target(dw_rdmap_qp_of(&qp), &w, 0, 0, iov, 1), 0);
}

/* A Send longer than its receive WR (or whose MO runs past it) is refused
 * before a byte lands: LOC_LEN_ERR, and DDP "message too long" to the peer
 * (RD: error NAK INVALID). */
Test(rdmap_access, send_longer_than_wr)
{
        uint32_t lkey = reg(&pd_a, DIWARP_ACCESS_LOCAL_WRITE);
        struct dw_wqe w;
        recv_wr(&w, lkey);
        uint8_t src[65];
        memset(src, 0xab, sizeof(src));
        struct dw_rdmap_qp rq = dw_rdmap_qp_of(&qp);
        int e = dw_rdmap_send_place(rq, &w, 0, src, 65);
        cr_expect_eq(e, -EMSGSIZE);
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 60, src, 8), -EMSGSIZE, "MO + length past the WR");
        cr_expect_eq(dw_rdmap_send_target(rq, &w, 60, 8, (struct iovec[DW_MAX_SGE]){0}, DW_MAX_SGE),
                     -EMSGSIZE);
        cr_expect_str_eq(dw_rdmap_recv_why(e), "Send longer than its receive WR");
        cr_expect(untouched(0, BUFSZ), "nothing placed");
        cr_expect_eq(dw_rdmap_recv_wc(e), DIWARP_WC_LOC_LEN_ERR);
        struct dw_term_error te = dw_rdmap_recv_term(e);
        cr_expect(te.layer == DW_TERM_LAYER_DDP && te.etype == DW_TERM_DDP_UNTAGGED &&
                  te.ecode == DW_TERM_DDP_U_MSG_TOO_LONG);
        cr_expect_eq(dw_rdmap_term_to_nak(te), DW_DGRAM_NAK_INVALID);
        /* exactly its length fits */
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 0, src, 64), 0);
}

/* A receive WR whose own lkey fails (another PD, no LOCAL_WRITE) is the
 * responder's fault: LOC_PROT_ERR, a Remote Operation Error to the peer
 * (RD: REM_OP), and nothing written, not even into an SGE that passes. */
Test(rdmap_access, send_into_bad_lkey)
{
        uint32_t good = reg(&pd_a, DIWARP_ACCESS_LOCAL_WRITE);
        uint32_t other_pd = reg(&pd_b, DIWARP_ACCESS_LOCAL_WRITE);
        uint32_t read_only = reg(&pd_a, 0);
        uint8_t src[64];
        memset(src, 0xcd, sizeof(src));
        const uint32_t bad[] = {other_pd, read_only, good ^ 0xff};
        for (unsigned i = 0; i < 3; i++) {
                struct dw_wqe w;
                recv_wr(&w, good);
                w.sge[1].lkey = bad[i];
                int e = dw_rdmap_send_place(dw_rdmap_qp_of(&qp), &w, 0, src, 64);
                cr_expect_eq(e, -EACCES, "case %u", i);
                cr_expect(untouched(0, BUFSZ), "case %u: nothing placed", i);
                cr_expect_eq(dw_rdmap_recv_wc(e), DIWARP_WC_LOC_PROT_ERR);
                cr_expect_str_eq(dw_rdmap_recv_why(e), "receive WR's SGE fails its lkey check");
                struct dw_term_error te = dw_rdmap_recv_term(e);
                cr_expect(te.layer == DW_TERM_LAYER_RDMAP &&
                          te.etype == DW_TERM_RDMAP_REMOTE_OPERATION &&
                          te.ecode == DW_TERM_RDMAP_CATASTROPHIC_STREAM);
                cr_expect_eq(dw_rdmap_term_to_nak(te), DW_DGRAM_NAK_REM_OP);
                /* a source is read with access 0: any registration of the PD */
                struct iovec iov[DW_MAX_SGE];
                cr_expect_eq(dw_rdmap_wr_iov(&dev->mrs, qp.pd, &w, 0, 64, 0, iov, DW_MAX_SGE),
                             bad[i] == read_only ? 2 : -EACCES, "case %u as a source", i);
        }
}

/* A single-SGE receive WR, which placement fills without its general walk:
 * the same answers as the walk (fits, too long, MO past it, bad lkey with
 * nothing written). */
Test(rdmap_access, send_into_one_sge)
{
        uint32_t lkey = reg(&pd_a, DIWARP_ACCESS_LOCAL_WRITE);
        uint32_t other_pd = reg(&pd_b, DIWARP_ACCESS_LOCAL_WRITE);
        struct dw_wqe w;
        memset(&w, 0, sizeof(w));
        w.num_sge = 1;
        w.sge[0] = (struct diwarp_sge){.addr = IOVA + 128, .length = 48, .lkey = lkey};
        w.total_len = 48;
        struct dw_rdmap_qp rq = dw_rdmap_qp_of(&qp);
        uint8_t src[49];
        memset(src, 0x5a, sizeof(src));
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 49, src, 1), -EMSGSIZE, "MO past the WR");
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 0, src, 49), -EMSGSIZE);
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 40, src, 9), -EMSGSIZE);
        w.sge[0].lkey = other_pd;
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 0, src, 8), -EACCES, "another PD's lkey");
        cr_expect(untouched(0, BUFSZ), "nothing placed");
        w.sge[0].lkey = lkey;
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 40, src, 8), 0);
        const uint8_t *b = (const uint8_t *)buf64;
        cr_expect_eq(memcmp(b + 128 + 40, src, 8), 0);
        cr_expect(untouched(128, 40) && untouched(128 + 48, 64), "only [40, 48) of the WR");
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 48, src, 0), 0, "nothing to place");
}

/* A QP on an SRQ takes its receive WRs from the SRQ, whose lkeys belong to
 * the SRQ's PD, which may not be the QP's: a Send is placed in that PD,
 * while a response's sink (the QP's own Read or Atomic WR) stays in the
 * QP's PD. */
Test(rdmap_access, receive_pd_of_srq)
{
        struct dw_srq_obj srq = {.pd = &pd_b};
        uint32_t in_b = reg(&pd_b, DIWARP_ACCESS_LOCAL_WRITE);
        uint32_t in_a = reg(&pd_a, DIWARP_ACCESS_LOCAL_WRITE);
        uint8_t src[64];
        memset(src, 0x77, sizeof(src));
        struct dw_wqe w;
        qp.srq = &srq;
        struct dw_rdmap_qp rq = dw_rdmap_qp_of(&qp);
        cr_expect(rq.recv_pd == &pd_b && rq.pd == &pd_a);
        recv_wr(&w, in_a);
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 0, src, 64), -EACCES, "QP's PD, not the SRQ's");
        cr_expect(untouched(0, BUFSZ));
        recv_wr(&w, in_b);
        cr_expect_eq(dw_rdmap_send_place(rq, &w, 0, src, 64), 0, "the SRQ's PD");
        struct iovec iov[DW_MAX_SGE];
        cr_expect_eq(dw_rdmap_sink_target(rq, &w, 0, 64, iov, DW_MAX_SGE), -EACCES,
                     "a sink is the QP's own: the SRQ's PD does not serve it");
        cr_expect_eq(dw_rdmap_sink_place(rq, &w, 0, src, 8), -EACCES);
        recv_wr(&w, in_a);
        cr_expect_eq(dw_rdmap_sink_target(rq, &w, 24, 16, iov, DW_MAX_SGE), 2);
        uint64_t v = 0x0102030405060708ull;
        cr_expect_eq(dw_rdmap_sink_place(rq, &w, 0, &v, 8), 0);
        cr_expect_eq(memcmp((const uint8_t *)buf64 + 64, &v, 8), 0);
        qp.srq = NULL;
        cr_expect(dw_rdmap_qp_of(&qp).recv_pd == &pd_a, "without an SRQ: the QP's PD");
}

/* A Send with Invalidate: the STag of the QP's PD is invalidated (a Write
 * to it is then refused); one that cannot be (another PD's, unknown, already
 * invalid) fails the receive WR with REM_INV_REQ_ERR and Remote Protection
 * "STag cannot be invalidated", and stays as it was. */
Test(rdmap_access, send_with_invalidate)
{
        qp_rights(true, RW);
        uint32_t mine = reg(&pd_a, ALL);
        uint32_t theirs = reg(&pd_b, ALL);
        struct dw_term_error te = {0};

        cr_expect_eq(dw_rdmap_send_invalidate(dw_rdmap_qp_of(&qp), mine, &te), DIWARP_WC_SUCCESS);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, mine, IOVA, 8, NULL),
                     DW_PROT_INVALIDATED);

        const uint32_t refused[] = {mine, theirs, 0x7f7f7f00};
        for (unsigned i = 0; i < 3; i++) {
                memset(&te, 0, sizeof(te));
                cr_expect_eq(dw_rdmap_send_invalidate(dw_rdmap_qp_of(&qp), refused[i], &te),
                             DIWARP_WC_REM_INV_REQ_ERR, "case %u", i);
                cr_expect(te.layer == DW_TERM_LAYER_RDMAP &&
                              te.etype == DW_TERM_RDMAP_REMOTE_PROTECTION &&
                              te.ecode == DW_TERM_RDMAP_STAG_NOT_INVALIDATED,
                          "case %u", i);
                cr_expect_eq(dw_rdmap_send_invalidate(dw_rdmap_qp_of(&qp), refused[i], NULL),
                             DIWARP_WC_REM_INV_REQ_ERR);
        }
        uint8_t *host = NULL;
        cr_expect_eq(dw_mr_check_remote(&dev->mrs, theirs, &pd_b, 0, RW, IOVA, 8, &host),
                     DW_PROT_OK, "another PD's STag stays valid");
}

/* The check RD makes of each segment of a Send with Invalidate as it
 * arrives: the rule of dw_rdmap_send_invalidate, changing nothing; a refusal
 * is Remote Protection "STag cannot be invalidated", RD's error NAK
 * REM_ACCESS, REM_ACCESS_ERR at the sender (as RC's Terminate gives). */
Test(rdmap_access, send_inval_accept)
{
        qp_rights(true, RW);
        uint32_t mine = reg(&pd_a, ALL);
        uint32_t theirs = reg(&pd_b, ALL);
        struct dw_rdmap_refusal ref;

        cr_expect_eq(dw_rdmap_send_inval_accept(dw_rdmap_qp_of(&qp), mine, &ref), 0);
        cr_expect_eq(dw_rdmap_send_inval_accept(dw_rdmap_qp_of(&qp), mine, NULL), 0,
                     "the check changed nothing");
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, mine, IOVA, 8, NULL),
                     DW_PROT_OK);
        cr_expect_eq(dw_rdmap_send_invalidate(dw_rdmap_qp_of(&qp), mine, NULL), DIWARP_WC_SUCCESS);

        const uint32_t refused[] = {mine, theirs, 0x7f7f7f00};
        const enum dw_prot_status st[] = {DW_PROT_INVALIDATED, DW_PROT_PD_MISMATCH,
                                          DW_PROT_INVALID_STAG};
        for (unsigned i = 0; i < 3; i++) {
                memset(&ref, 0, sizeof(ref));
                cr_expect_eq(dw_rdmap_send_inval_accept(dw_rdmap_qp_of(&qp), refused[i], &ref),
                             -EACCES, "case %u", i);
                cr_expect_eq(ref.st, st[i], "case %u", i);
                cr_expect(ref.te.layer == DW_TERM_LAYER_RDMAP &&
                              ref.te.etype == DW_TERM_RDMAP_REMOTE_PROTECTION &&
                              ref.te.ecode == DW_TERM_RDMAP_STAG_NOT_INVALIDATED,
                          "case %u", i);
                cr_expect_eq(dw_rdmap_term_to_nak(ref.te), DW_DGRAM_NAK_REM_ACCESS);
                cr_expect_eq(dw_rdmap_nak_to_wc(dw_rdmap_term_to_nak(ref.te)),
                             DIWARP_WC_REM_ACCESS_ERR);
                cr_expect_eq(dw_rdmap_term_to_wc(ref.te, NULL), DIWARP_WC_REM_ACCESS_ERR);
        }
        uint8_t *host = NULL;
        cr_expect_eq(dw_mr_check_remote(&dev->mrs, theirs, &pd_b, 0, RW, IOVA, 8, &host),
                     DW_PROT_OK, "a refused STag stays valid");
}

/* ---- A received message's end and its completion ----------------------- */

/* What each kind of message end becomes: a Send's length and SE, diwarp's
 * Send with Immediate (the Immediate's own SE counts), a Write with
 * Immediate (RECV_RDMA_WITH_IMM with the Write's length), the same kept in
 * a receive WR and read back. */
Test(rdmap_recv_end, completions, .init = setup, .fini = teardown)
{
        struct dw_recv_done d;
        struct dw_rdmap_msg_end e = dw_rdmap_send_end(DW_RDMAP_SEND, 100, 0x1234);
        cr_expect(!dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, NULL), "no SE");
        cr_expect(d.status == DIWARP_WC_SUCCESS && d.byte_len == 100 && !d.has_imm &&
                      !d.write_imm && !d.inval && d.inval_rkey == 0,
                  "a plain Send reports its length only (no Invalidate STag)");

        e = dw_rdmap_send_end(DW_RDMAP_SEND_SE, 7, 0);
        cr_expect(dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, NULL), "SE");

        e = dw_rdmap_send_end(DW_RDMAP_SEND, 9, 0);
        dw_rdmap_end_imm(&e, 0xa1b2c3d4, true);
        cr_expect(dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, NULL),
                  "the Immediate Data's SE asks for the event");
        cr_expect(d.byte_len == 9 && d.has_imm && d.imm == 0xa1b2c3d4 && !d.write_imm);

        e = dw_rdmap_imm_end(4096, 0x55, false);
        cr_expect(!dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, NULL));
        cr_expect(d.byte_len == 4096 && d.has_imm && d.imm == 0x55 && d.write_imm,
                  "a Write with Immediate: RECV_RDMA_WITH_IMM, the Write's length");

        struct dw_wqe w = {0};
        struct dw_rdmap_msg_end kept = dw_rdmap_send_end(DW_RDMAP_SEND_SE, 33, 0);
        dw_rdmap_end_imm(&kept, 0x77, false);
        dw_rdmap_wqe_end_note(&w, &kept);
        struct dw_rdmap_msg_end back = dw_rdmap_wqe_end(&w);
        cr_expect(back.len == 33 && back.imm == 0x77 && back.flags == kept.flags &&
                      back.inval_stag == 0,
                  "kept in the receive WR and read back whole");
}

/* A Send with Invalidate's Invalidate is carried out as its end becomes a
 * completion, once: the second end naming the same STag fails with
 * REM_INV_REQ_ERR and the Terminate error in vendor_err and *te. */
Test(rdmap_recv_end, invalidate_once, .init = setup, .fini = teardown)
{
        qp_rights(true, RW);
        uint32_t mine = reg(&pd_a, ALL);
        struct dw_recv_done d;
        struct dw_term_error te = {0};
        struct dw_rdmap_msg_end e = dw_rdmap_send_end(DW_RDMAP_SEND_SE_INVAL, 64, mine);

        cr_expect(dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, &te));
        cr_expect(d.status == DIWARP_WC_SUCCESS && d.inval && d.inval_rkey == mine &&
                  d.byte_len == 64 && d.vendor_err == 0);
        cr_expect_eq(dw_rdmap_check_remote(dw_rdmap_qp_of(&qp), RW, mine, IOVA, 8, NULL),
                     DW_PROT_INVALIDATED, "the STag is invalid after the completion");

        dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, &te);
        cr_expect_eq(d.status, DIWARP_WC_REM_INV_REQ_ERR);
        cr_expect(!d.inval, "no WITH_INV for an Invalidate not carried out");
        cr_expect(te.layer == DW_TERM_LAYER_RDMAP && te.etype == DW_TERM_RDMAP_REMOTE_PROTECTION &&
                  te.ecode == DW_TERM_RDMAP_STAG_NOT_INVALIDATED);
        cr_expect_eq(d.vendor_err, dw_term_vendor_err(te));
        dw_rdmap_recv_end(dw_rdmap_qp_of(&qp), &e, &d, NULL);
        cr_expect(d.status == DIWARP_WC_REM_INV_REQ_ERR && d.vendor_err == dw_term_vendor_err(te),
                  "the same without *te");
}

/* ---- Tagged placement -------------------------------------------------- */

/* Terminate errors of a tagged sink: DDP Tagged Buffer, RDMAP Remote
 * Protection. */
/* clang-format off */
#define TB(c) {DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, c}
#define RP(c) {DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION, c}
/* clang-format on */

/* An RDMA Write segment at the Data Sink: placed inside its region, or
 * refused with the Terminate error of its reason: DDP Tagged Buffer errors
 * for STag, bounds, PD and TO wrap, RDMAP "access rights" for a right the
 * QP or the region lacks; all of them REM_ACCESS as an RD error NAK. */
Test(rdmap_access, write_segment_accept)
{
        uint32_t stag = reg(&pd_a, ALL);
        uint32_t ro = reg(&pd_a, RR);
        uint32_t other = reg(&pd_b, ALL);
        struct dw_rdmap_refusal ref;
        uint8_t *host = NULL;

        qp_rights(true, RW);
        cr_expect_eq(dw_rdmap_write_accept(dw_rdmap_qp_of(&qp), stag, IOVA + 100, 28, &host, &ref),
                     0);
        cr_expect_eq(host, (uint8_t *)buf64 + 100);
        cr_expect_eq(
            dw_rdmap_write_accept(dw_rdmap_qp_of(&qp), stag, IOVA + BUFSZ - 28, 28, NULL, NULL), 0,
            "the region's last bytes");

        const struct {
                uint32_t stag;
                uint64_t to, len;
                bool qp_rw;
                enum dw_prot_status st;
                struct dw_term_error te;
        } cases[] = {
            /* clang-format off */
            {stag, IOVA + BUFSZ - 27, 28, true, DW_PROT_BOUNDS, TB(DW_TERM_DDP_T_BASE_BOUNDS)},
            {stag, IOVA - 1, 2, true, DW_PROT_BOUNDS, TB(DW_TERM_DDP_T_BASE_BOUNDS)},
            {stag, UINT64_MAX - 3, 8, true, DW_PROT_TO_WRAP, TB(DW_TERM_DDP_T_TO_WRAP)},
            {stag ^ 0xff, IOVA, 8, true, DW_PROT_INVALID_STAG, TB(DW_TERM_DDP_T_INVALID_STAG)},
            {other, IOVA, 8, true, DW_PROT_PD_MISMATCH, TB(DW_TERM_DDP_T_STAG_NOT_ON_STREAM)},
            {ro, IOVA, 8, true, DW_PROT_ACCESS, RP(DW_TERM_RDMAP_ACCESS_RIGHTS)},
            {stag, IOVA, 8, false, DW_PROT_ACCESS, RP(DW_TERM_RDMAP_ACCESS_RIGHTS)},
            /* clang-format on */
        };
        for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                qp_rights(true, cases[i].qp_rw ? RW : RR);
                memset(&ref, 0, sizeof(ref));
                cr_expect_eq(dw_rdmap_write_accept(dw_rdmap_qp_of(&qp), cases[i].stag, cases[i].to,
                                                   cases[i].len, NULL, &ref),
                             -EACCES, "case %u", i);
                cr_expect_eq(ref.st, cases[i].st, "case %u", i);
                cr_expect(ref.te.layer == cases[i].te.layer && ref.te.etype == cases[i].te.etype &&
                              ref.te.ecode == cases[i].te.ecode,
                          "case %u: %u/%u/%#x", i, ref.te.layer, ref.te.etype, ref.te.ecode);
                cr_expect_str_eq(ref.why, dw_prot_status_str(cases[i].st));
                cr_expect_eq(dw_rdmap_term_to_nak(ref.te), DW_DGRAM_NAK_REM_ACCESS);
                cr_expect_eq(dw_rdmap_term_to_wc(ref.te, NULL), DIWARP_WC_REM_ACCESS_ERR);
                cr_expect_eq(dw_rdmap_write_accept(dw_rdmap_qp_of(&qp), cases[i].stag, cases[i].to,
                                                   cases[i].len, NULL, NULL),
                             -EACCES, "case %u without a refusal to fill", i);
        }
        /* A zero-length Write needs no right of the QP (the RFC 6581 RTR
         * message may be one). */
        qp_rights(false, 0);
        cr_expect_eq(dw_rdmap_write_accept(dw_rdmap_qp_of(&qp), stag, IOVA, 0, NULL, &ref), 0);
        /* an invalidated region refuses as an invalid STag */
        qp_rights(true, RW);
        cr_assert_eq(dw_rdmap_send_invalidate(dw_rdmap_qp_of(&qp), stag, NULL), DIWARP_WC_SUCCESS);
        cr_expect_eq(dw_rdmap_write_accept(dw_rdmap_qp_of(&qp), stag, IOVA, 8, NULL, &ref),
                     -EACCES);
        cr_expect(ref.st == DW_PROT_INVALIDATED && ref.te.layer == DW_TERM_LAYER_DDP &&
                  ref.te.ecode == DW_TERM_DDP_T_INVALID_STAG);
}
