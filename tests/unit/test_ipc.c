/* The daemon protocol of ipc/: dw_ipc_req_check is all that stands between
 * a client's bytes and the daemon's tables, so every framing rule (magic, op,
 * exact length, descriptor count) and every field rule is tried one at a
 * time on an otherwise valid request; then the ring sizing helpers, where
 * the daemon finds its socket, and the descriptor passing of
 * dw_ipc_send/dw_ipc_recv, including what happens to descriptors that come
 * with a message too long to take. */
#define _GNU_SOURCE /* pipe2 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ipc/ipc.h"

#define PAGE 4096u

/* The request of op the decoder accepts: the fields it checks hold values a
 * real client sends, the rest stay zero. Returns the message length. */
static size_t valid_req(unsigned int op, struct dw_ipc_req *r)
{
        size_t len = dw_ipc_req_size(op);
        memset(r, 0, sizeof(*r));
        r->h.magic = DW_IPC_MAGIC;
        r->h.op = (uint16_t)op;
        r->h.len = (uint16_t)len;
        r->h.seq = 7;
        r->h.handle = 1;
        switch (op) {
        case DW_IPC_OPEN:
                r->u.open.version = DW_IPC_VERSION;
                r->u.open.pid = 4242;
                strcpy(r->u.open.addr, "10.0.0.1");
                r->u.open.port_base = 18515;
                break;
        case DW_IPC_SEG_ADD:
                r->u.seg.base = 0x7f0000000000ull;
                r->u.seg.len = 16 * PAGE;
                r->u.seg.id = 1;
                break;
        case DW_IPC_MR_REG:
                r->u.mr.pd = 1;
                r->u.mr.seg = 1;
                r->u.mr.addr = 0x7f0000001000ull;
                r->u.mr.len = 8192;
                r->u.mr.iova = r->u.mr.addr;
                r->u.mr.access = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_READ;
                break;
        case DW_IPC_CQ_CREATE:
                r->u.cq.cqe = 128;
                break;
        case DW_IPC_QP_CREATE:
                r->u.qp.pd = 1;
                r->u.qp.send_cq = 2;
                r->u.qp.recv_cq = 3;
                r->u.qp.type = DIWARP_QPT_RC;
                r->u.qp.cap = (struct diwarp_qp_cap){64, 64, 4, 4, 128};
                break;
        case DW_IPC_QP_MODIFY:
                r->u.qpm.attr.qp_state = DIWARP_QPS_INIT;
                r->u.qpm.mask = DIWARP_QP_STATE;
                break;
        case DW_IPC_SRQ_CREATE:
                r->u.srq.pd = 1;
                r->u.srq.attr = (struct diwarp_srq_attr){256, 4, 0};
                break;
        case DW_IPC_SRQ_MODIFY:
                r->u.srqm.attr.srq_limit = 16;
                r->u.srqm.mask = 1;
                break;
        case DW_IPC_AH_CREATE:
                r->u.ah.pd = 1;
                r->u.ah.dgid.raw[10] = 0xff;
                r->u.ah.dgid.raw[11] = 0xff;
                r->u.ah.dgid.raw[12] = 10;
                r->u.ah.dgid.raw[15] = 2;
                break;
        case DW_IPC_RD_PATH:
                r->u.path.remote_qpn = 0x42;
                break;
        default:
                break;
        }
        return len;
}

static void expect_ok(const void *msg, size_t len, int nfds)
{
        const char *why = NULL;
        int rc = dw_ipc_req_check(msg, len, nfds, &why);
        cr_assert_eq(rc, 0, "len %zu nfds %d: %d (%s)", len, nfds, rc, why ? why : "-");
}

/* Refused with exactly err, and a reason for the daemon's log. */
static void expect_refused(const void *msg, size_t len, int nfds, int err)
{
        const char *why = NULL;
        int rc = dw_ipc_req_check(msg, len, nfds, &why);
        cr_assert_eq(rc, -err, "len %zu nfds %d: got %d, want %d (%s)", len, nfds, rc, -err,
                     why ? why : "-");
        cr_assert_not_null(why);
        cr_assert_gt(strlen(why), 0);
}

static void expect_req_refused(const struct dw_ipc_req *r, int err)
{
        expect_refused(r, r->h.len, dw_ipc_req_nfds(r->h.op), err);
}

/* ---- framing ------------------------------------------------------------- */

Test(ipc, sizes)
{
        cr_assert_eq(sizeof(struct dw_ipc_hdr), 16);
        cr_assert_eq(dw_ipc_req_size(0), 0);
        cr_assert_eq(dw_ipc_req_size(DW_IPC_OP_END), 0);
        cr_assert_eq(dw_ipc_req_size(DW_IPC_RSP | DW_IPC_PD_ALLOC), 0);
        for (unsigned int op = 1; op < DW_IPC_OP_END; op++) {
                size_t n = dw_ipc_req_size(op);
                cr_assert_geq(n, sizeof(struct dw_ipc_hdr), "op %u", op);
                /* A request must fit the daemon's buffer and its own h.len. */
                cr_assert_leq(n, sizeof(struct dw_ipc_req), "op %u", op);
                cr_assert_leq(n, DW_IPC_MAX_MSG, "op %u", op);
                cr_assert_lt(n, 65536, "op %u", op);
        }
        cr_assert_eq(dw_ipc_req_size(DW_IPC_OPEN), 16 + sizeof(struct dw_ipc_open));
        cr_assert_eq(dw_ipc_req_size(DW_IPC_SEG_ADD), 16 + sizeof(struct dw_ipc_seg));
        cr_assert_eq(dw_ipc_req_size(DW_IPC_QP_MODIFY), 16 + sizeof(struct dw_ipc_qp_modify));
        cr_assert_eq(dw_ipc_req_size(DW_IPC_PD_ALLOC), 16);
        cr_assert_eq(dw_ipc_req_size(DW_IPC_SHUTDOWN), 16);
}

Test(ipc, every_op_accepted_at_its_size)
{
        for (unsigned int op = 1; op < DW_IPC_OP_END; op++) {
                struct dw_ipc_req r;
                size_t len = valid_req(op, &r);
                cr_assert_gt(len, 0, "op %u has no size", op);
                expect_ok(&r, len, dw_ipc_req_nfds(op));
                /* Nothing reads beyond len: a copy of exactly len bytes on
                 * the heap gets the same verdict under ASan. */
                void *exact = malloc(len);
                cr_assert_not_null(exact);
                memcpy(exact, &r, len);
                expect_ok(exact, len, dw_ipc_req_nfds(op));
                free(exact);
        }
}

Test(ipc, one_byte_more_or_less)
{
        for (unsigned int op = 1; op < DW_IPC_OP_END; op++) {
                uint8_t buf[sizeof(struct dw_ipc_req) + 1];
                struct dw_ipc_req r;
                size_t len = valid_req(op, &r);
                int nfds = dw_ipc_req_nfds(op);
                memset(buf, 0, sizeof(buf));
                memcpy(buf, &r, len);

                /* Header and message agree on a length that is not the op's. */
                ((struct dw_ipc_hdr *)buf)->len = (uint16_t)(len + 1);
                expect_refused(buf, len + 1, nfds, EPROTO);
                ((struct dw_ipc_hdr *)buf)->len = (uint16_t)(len - 1);
                expect_refused(buf, len - 1, nfds, EPROTO);

                /* The op's length in the header, a byte more or less sent. */
                ((struct dw_ipc_hdr *)buf)->len = (uint16_t)len;
                expect_refused(buf, len + 1, nfds, EPROTO);
                expect_refused(buf, len - 1, nfds, EPROTO);

                /* The header lies about a message of the right length. */
                r.h.len = (uint16_t)(len + 1);
                expect_refused(&r, len, nfds, EPROTO);
                r.h.len = (uint16_t)(len - 1);
                expect_refused(&r, len, nfds, EPROTO);
                r.h.len = 0;
                expect_refused(&r, len, nfds, EPROTO);
        }
}

Test(ipc, shorter_than_header)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_PD_ALLOC, &r);
        for (size_t len = 0; len < sizeof(r.h); len++)
                expect_refused(&r, len, 0, EPROTO);
        expect_refused(NULL, 16, 0, EPROTO);
        expect_refused(NULL, 0, 0, EPROTO);
}

Test(ipc, bad_magic)
{
        struct dw_ipc_req r;
        size_t len = valid_req(DW_IPC_PD_ALLOC, &r);
        r.h.magic = DW_IPC_MAGIC ^ 1;
        expect_refused(&r, len, 0, EPROTO);
        r.h.magic = __builtin_bswap32(DW_IPC_MAGIC);
        expect_refused(&r, len, 0, EPROTO);
        r.h.magic = 0;
        expect_refused(&r, len, 0, EPROTO);
}

Test(ipc, unknown_op)
{
        const unsigned int bad[] = {
            0, DW_IPC_OP_END, DW_IPC_OP_END + 1, 0x7fff, DW_IPC_RSP | DW_IPC_OPEN, 0xffff};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct dw_ipc_req r;
                valid_req(DW_IPC_PD_ALLOC, &r);
                r.h.op = (uint16_t)bad[i];
                /* At every length a known op could have. */
                for (unsigned int op = 1; op < DW_IPC_OP_END; op++) {
                        size_t len = dw_ipc_req_size(op);
                        r.h.len = (uint16_t)len;
                        expect_refused(&r, len, 0, EPROTO);
                        expect_refused(&r, len, 1, EPROTO);
                }
        }
}

Test(ipc, descriptor_count)
{
        cr_assert_eq(dw_ipc_req_nfds(DW_IPC_SEG_ADD), 1);
        for (unsigned int op = 1; op < DW_IPC_OP_END; op++) {
                struct dw_ipc_req r;
                size_t len = valid_req(op, &r);
                int want = op == DW_IPC_SEG_ADD ? 1 : 0;
                cr_assert_eq(dw_ipc_req_nfds(op), want, "op %u", op);
                for (int nfds = -1; nfds <= DW_IPC_MAX_FDS + 1; nfds++) {
                        if (nfds == want)
                                expect_ok(&r, len, nfds);
                        else
                                expect_refused(&r, len, nfds, EPROTO);
                }
        }
}

/* ---- fields -------------------------------------------------------------- */

Test(ipc, open)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_OPEN, &r);
        r.u.open.addr[0] = 0;
        expect_ok(&r, r.h.len, 0);
        memset(r.u.open.addr, 'x', sizeof(r.u.open.addr) - 1);
        r.u.open.addr[sizeof(r.u.open.addr) - 1] = 0;
        expect_ok(&r, r.h.len, 0);

        memset(r.u.open.addr, '1', sizeof(r.u.open.addr));
        expect_req_refused(&r, EINVAL);

        const uint32_t versions[] = {0, DW_IPC_VERSION + 1, 0xffffffffu};
        for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
                valid_req(DW_IPC_OPEN, &r);
                r.u.open.version = versions[i];
                /* Another protocol: the framing may not mean what it means to us. */
                expect_req_refused(&r, EPROTO);
        }
}

Test(ipc, seg_add)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_SEG_ADD, &r);
        r.u.seg.nreplace = 16;
        for (uint32_t i = 0; i < 16; i++)
                r.u.seg.replace[i] = i + 2;
        expect_ok(&r, r.h.len, 1);
        r.u.seg.nreplace = 17;
        expect_req_refused(&r, EINVAL);
        r.u.seg.nreplace = UINT32_MAX;
        expect_req_refused(&r, EINVAL);
        /* Each segment replaced once, and never the new one itself. */
        r.u.seg.nreplace = 16;
        r.u.seg.replace[15] = 2;
        expect_req_refused(&r, EINVAL);
        r.u.seg.replace[15] = 17;
        expect_ok(&r, r.h.len, 1);
        r.u.seg.replace[15] = r.u.seg.id;
        expect_req_refused(&r, EINVAL);

        valid_req(DW_IPC_SEG_ADD, &r);
        r.u.seg.base += PAGE / 2;
        expect_req_refused(&r, EINVAL);
        r.u.seg.base += PAGE / 2 - 1;
        expect_req_refused(&r, EINVAL);

        valid_req(DW_IPC_SEG_ADD, &r);
        r.u.seg.len = PAGE + 1;
        expect_req_refused(&r, EINVAL);
        r.u.seg.len = PAGE - 1;
        expect_req_refused(&r, EINVAL);
        r.u.seg.len = 0;
        expect_req_refused(&r, EINVAL);

        valid_req(DW_IPC_SEG_ADD, &r);
        r.u.seg.id = 0;
        expect_req_refused(&r, EINVAL);

        valid_req(DW_IPC_SEG_ADD, &r);
        r.u.seg.base = 0 - (uint64_t)PAGE;
        r.u.seg.len = 2 * PAGE;
        expect_req_refused(&r, EINVAL);
        r.u.seg.base = 0 - 2 * (uint64_t)PAGE;
        r.u.seg.len = UINT64_MAX - PAGE + 1;
        expect_req_refused(&r, EINVAL);
        r.u.seg.base = 0 - 2 * (uint64_t)PAGE;
        r.u.seg.len = PAGE;
        expect_ok(&r, r.h.len, 1);
}

Test(ipc, mr_reg)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_MR_REG, &r);
        r.u.mr.access = DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE |
                        DIWARP_ACCESS_REMOTE_READ | DIWARP_ACCESS_REMOTE_ATOMIC |
                        DIWARP_ACCESS_MW_BIND | DIWARP_ACCESS_ZERO_BASED;
        expect_ok(&r, r.h.len, 0);
        r.u.mr.access = 0;
        expect_ok(&r, r.h.len, 0);
        for (int bit = 6; bit < 32; bit++) {
                r.u.mr.access = (int32_t)(1u << bit) | DIWARP_ACCESS_LOCAL_WRITE;
                expect_req_refused(&r, EINVAL);
        }
        r.u.mr.access = -1;
        expect_req_refused(&r, EINVAL);

        valid_req(DW_IPC_MR_REG, &r);
        r.u.mr.addr = UINT64_MAX - 4095;
        r.u.mr.len = 8192;
        expect_req_refused(&r, EINVAL);
        r.u.mr.addr = 1;
        r.u.mr.len = UINT64_MAX;
        expect_req_refused(&r, EINVAL);
        r.u.mr.addr = UINT64_MAX - 8191;
        r.u.mr.len = 4096;
        expect_ok(&r, r.h.len, 0);
}

Test(ipc, cq_create)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_CQ_CREATE, &r);
        r.u.cq.cqe = 1;
        expect_ok(&r, r.h.len, 0);
        r.u.cq.cqe = INT32_MAX;
        expect_ok(&r, r.h.len, 0);
        const int32_t bad[] = {0, -1, INT32_MIN};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                r.u.cq.cqe = bad[i];
                expect_req_refused(&r, EINVAL);
        }
}

Test(ipc, qp_create)
{
        struct dw_ipc_req r;
        const uint32_t types[] = {DIWARP_QPT_RC, DIWARP_QPT_UC, DIWARP_QPT_UD, DIWARP_QPT_RD};
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
                valid_req(DW_IPC_QP_CREATE, &r);
                r.u.qp.type = types[i];
                expect_ok(&r, r.h.len, 0);
        }
        const uint32_t bad[] = {0, 1, 5, 9, DIWARP_QPT_RD | DIWARP_QPT_RC, 0xffffffffu};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                valid_req(DW_IPC_QP_CREATE, &r);
                r.u.qp.type = bad[i];
                expect_req_refused(&r, EINVAL);
        }

        valid_req(DW_IPC_QP_CREATE, &r);
        r.u.qp.send_cq = 0;
        expect_req_refused(&r, EINVAL);
        valid_req(DW_IPC_QP_CREATE, &r);
        r.u.qp.recv_cq = 0;
        expect_req_refused(&r, EINVAL);
        r.u.qp.send_cq = 0;
        expect_req_refused(&r, EINVAL);
}

Test(ipc, qp_modify)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_QP_MODIFY, &r);
        r.u.qpm.mask = 0;
        expect_req_refused(&r, EINVAL);
        r.u.qpm.mask = DIWARP_QP_DEST_QPN;
        expect_ok(&r, r.h.len, 0);
}

Test(ipc, srq_create)
{
        struct dw_ipc_req r;
        valid_req(DW_IPC_SRQ_CREATE, &r);
        r.u.srq.attr.max_wr = 0;
        expect_req_refused(&r, EINVAL);
        r.u.srq.attr.max_wr = 1;
        expect_ok(&r, r.h.len, 0);
}

Test(ipc, conn_private_data)
{
        static const unsigned int ops[] = {DW_IPC_ACCEPT, DW_IPC_REJECT, DW_IPC_CONNECT};
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                struct dw_ipc_req r;
                valid_req(ops[i], &r);
                r.u.conn.pd_len = DIWARP_MAX_PRIVATE_DATA;
                expect_ok(&r, r.h.len, 0);
                r.u.conn.pd_len = DIWARP_MAX_PRIVATE_DATA + 1;
                expect_req_refused(&r, EINVAL);
                r.u.conn.pd_len = 0xffff;
                expect_req_refused(&r, EINVAL);
        }
}

/* ---- ring sizing --------------------------------------------------------- */

Test(ipc, pow2)
{
        cr_assert_eq(dw_ipc_pow2(1), 1);
        cr_assert_eq(dw_ipc_pow2(2), 2);
        cr_assert_eq(dw_ipc_pow2(3), 4);
        cr_assert_eq(dw_ipc_pow2(4), 4);
        cr_assert_eq(dw_ipc_pow2(5), 8);
        cr_assert_eq(dw_ipc_pow2(1000), 1024);
        cr_assert_eq(dw_ipc_pow2((1u << 30) + 1), 1u << 31);
        cr_assert_eq(dw_ipc_pow2((1u << 31) - 1), 1u << 31);
        cr_assert_eq(dw_ipc_pow2(1u << 31), 1u << 31);
}

Test(ipc, ring_bytes)
{
        /* The header alone takes a page. */
        cr_assert_eq(dw_ipc_ring_bytes(0, 64), PAGE);
        cr_assert_eq(dw_ipc_ring_bytes(1, 64), PAGE);
        cr_assert_eq(dw_ipc_ring_bytes((PAGE - DW_IPC_RING_HDR) / 64, 64), PAGE);
        cr_assert_eq(dw_ipc_ring_bytes((PAGE - DW_IPC_RING_HDR) / 64 + 1, 64), 2 * PAGE);
        /* Entries filling pages exactly still need one more for the header. */
        cr_assert_eq(dw_ipc_ring_bytes(64, 64), 2 * PAGE);
        cr_assert_eq(dw_ipc_ring_bytes(1024, 128), 33 * PAGE);
        /* Computed in 64 bits: 2^31 entries of 4 KiB do not wrap. */
        cr_assert_eq(dw_ipc_ring_bytes(1u << 31, PAGE), ((uint64_t)1 << 43) + PAGE);
        cr_assert_eq(dw_ipc_ring_bytes(UINT32_MAX, UINT32_MAX),
                     ((uint64_t)UINT32_MAX * UINT32_MAX + DW_IPC_RING_HDR + PAGE - 1) / PAGE *
                         PAGE);
        cr_assert_leq(sizeof(struct dw_ipc_ring), DW_IPC_RING_HDR);
}

Test(ipc, wr_sizes)
{
        cr_assert_eq(dw_ipc_rwr_size(0), 64);
        cr_assert_eq(dw_ipc_rwr_size(3), 64);
        cr_assert_eq(dw_ipc_rwr_size(4), 128);
        cr_assert_eq(
            dw_ipc_rwr_size(UINT32_MAX),
            (sizeof(struct dw_ipc_rwr) + (size_t)UINT32_MAX * sizeof(struct diwarp_sge) + 63) / 64 *
                64);

        struct diwarp_qp_cap cap = {0};
        cr_assert_eq(dw_ipc_swr_size(&cap), 128);
        cap.max_send_sge = 3;
        cap.max_inline_data = 0;
        cr_assert_eq(dw_ipc_swr_size(&cap), 128);
        cap.max_send_sge = 4;
        cap.max_inline_data = DW_IPC_MAX_INLINE_COPY;
        /* 80 + 4 * 16 + 512 = 656, rounded up to a multiple of 64. */
        cr_assert_eq(dw_ipc_swr_size(&cap), 704);
        cap.max_send_sge = UINT32_MAX;
        cap.max_inline_data = UINT32_MAX;
        cr_assert_geq(dw_ipc_swr_size(&cap), (size_t)UINT32_MAX * 17);
}

/* ---- the socket's path --------------------------------------------------- */

Test(ipc, socket_path_env)
{
        char out[256];
        setenv("DIWARP_DAEMON_SOCKET", "/tmp/test-ipc/d.sock", 1);
        setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_str_eq(out, "/tmp/test-ipc/d.sock");

        unsetenv("DIWARP_DAEMON_SOCKET");
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_str_eq(out, "/run/user/1000/diwarpd.sock");
        /* Set but empty is not set. */
        setenv("DIWARP_DAEMON_SOCKET", "", 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_str_eq(out, "/run/user/1000/diwarpd.sock");

        unsetenv("XDG_RUNTIME_DIR");
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_str_eq(out, "/run/diwarp/diwarpd.sock");
        setenv("XDG_RUNTIME_DIR", "", 1);
        unsetenv("DIWARP_DAEMON_SOCKET");
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_str_eq(out, "/run/diwarp/diwarpd.sock");
}

Test(ipc, socket_path_too_long)
{
        struct sockaddr_un un;
        const size_t room = sizeof(un.sun_path) - 1; /* and its NUL */
        char path[512], out[512];

        memset(path, 'a', sizeof(path));
        path[0] = '/';
        path[room] = 0;
        setenv("DIWARP_DAEMON_SOCKET", path, 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_str_eq(out, path);

        path[room] = 'a';
        path[room + 1] = 0;
        setenv("DIWARP_DAEMON_SOCKET", path, 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), -ENAMETOOLONG);
        path[room + 1] = 'a';
        path[300] = 0;
        setenv("DIWARP_DAEMON_SOCKET", path, 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), -ENAMETOOLONG);

        /* The fallback's file name counts too. */
        unsetenv("DIWARP_DAEMON_SOCKET");
        const size_t name = strlen("/diwarpd.sock");
        path[room - name] = 0;
        setenv("XDG_RUNTIME_DIR", path, 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), 0);
        cr_assert_eq(strlen(out), room);
        path[room - name] = 'a';
        path[room - name + 1] = 0;
        setenv("XDG_RUNTIME_DIR", path, 1);
        cr_assert_eq(dw_ipc_socket_path(out, sizeof(out)), -ENAMETOOLONG);

        /* A caller's buffer too small for a path that would fit the socket. */
        unsetenv("XDG_RUNTIME_DIR");
        cr_assert_eq(dw_ipc_socket_path(out, 8), -ENAMETOOLONG);
        cr_assert_eq(dw_ipc_socket_path(out, strlen("/run/diwarp/diwarpd.sock")), -ENAMETOOLONG);
        cr_assert_eq(dw_ipc_socket_path(out, strlen("/run/diwarp/diwarpd.sock") + 1), 0);
}

/* ---- send and receive ---------------------------------------------------- */

static void seqpacket_pair(int sv[2])
{
        cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

/* 1 while some descriptor still holds the write end of the pipe whose read
 * end is rfd, 0 once all are closed (the reader sees end of file). */
static int pipe_has_writer(int rfd)
{
        char c;
        ssize_t n = read(rfd, &c, 1);
        if (n == 0)
                return 0;
        cr_assert_eq(n, -1);
        cr_assert_eq(errno, EAGAIN);
        return 1;
}

static void nonblocking_pipe(int p[2])
{
        cr_assert_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
}

Test(ipc, send_recv_descriptor)
{
        int sv[2];
        seqpacket_pair(sv);
        int efd = eventfd(0, EFD_CLOEXEC);
        cr_assert_geq(efd, 0);

        struct dw_ipc_req r;
        size_t len = valid_req(DW_IPC_SEG_ADD, &r);
        cr_assert_eq(dw_ipc_send(sv[0], &r, len, &efd, 1, false), (ssize_t)len);

        uint8_t buf[DW_IPC_MAX_MSG];
        int fds[DW_IPC_MAX_FDS] = {-1, -1, -1}, nfds = DW_IPC_MAX_FDS;
        ssize_t n = dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds);
        cr_assert_eq(n, (ssize_t)len);
        cr_assert_eq(nfds, 1);
        cr_assert_eq(memcmp(buf, &r, len), 0);
        expect_ok(buf, (size_t)n, nfds);

        /* A new descriptor of the same eventfd, not to be inherited. */
        cr_assert_geq(fds[0], 0);
        cr_assert_neq(fds[0], efd);
        cr_assert_eq(fcntl(fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        cr_assert_eq(eventfd_write(fds[0], 5), 0);
        eventfd_t v = 0;
        cr_assert_eq(eventfd_read(efd, &v), 0);
        cr_assert_eq(v, 5);

        close(fds[0]);
        close(efd);
        close(sv[0]);
        close(sv[1]);
}

Test(ipc, send_recv_no_descriptor)
{
        int sv[2];
        seqpacket_pair(sv);
        struct dw_ipc_req r;
        size_t len = valid_req(DW_IPC_PD_ALLOC, &r);
        cr_assert_eq(dw_ipc_send(sv[0], &r, len, NULL, 0, true), (ssize_t)len);

        uint8_t buf[DW_IPC_MAX_MSG];
        int fds[DW_IPC_MAX_FDS], nfds = DW_IPC_MAX_FDS;
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), (ssize_t)len);
        cr_assert_eq(nfds, 0);

        /* Message boundaries hold: two sends, two receives. */
        cr_assert_eq(dw_ipc_send(sv[0], &r, len, NULL, 0, false), (ssize_t)len);
        cr_assert_eq(dw_ipc_send(sv[0], &r, 1, NULL, 0, false), 1);
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), NULL, NULL), (ssize_t)len);
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), NULL, NULL), 1);

        close(sv[0]);
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), 0);
        close(sv[1]);
}

Test(ipc, send_bad_descriptor_count)
{
        int sv[2];
        seqpacket_pair(sv);
        int fds[DW_IPC_MAX_FDS + 1] = {0, 0, 0, 0};
        struct dw_ipc_req r;
        size_t len = valid_req(DW_IPC_PD_ALLOC, &r);
        cr_assert_eq(dw_ipc_send(sv[0], &r, len, fds, DW_IPC_MAX_FDS + 1, false), -EINVAL);
        cr_assert_eq(dw_ipc_send(sv[0], &r, len, fds, -1, false), -EINVAL);
        close(sv[1]);
        /* The peer gone: an error, not SIGPIPE. */
        cr_assert_eq(dw_ipc_send(sv[0], &r, len, NULL, 0, false), -EPIPE);
        close(sv[0]);
}

Test(ipc, send_dontwait_full)
{
        int sv[2];
        seqpacket_pair(sv);
        uint8_t buf[DW_IPC_MAX_MSG] = {0};
        ssize_t n = 0;
        for (int i = 0; i < 100000; i++) {
                n = dw_ipc_send(sv[0], buf, sizeof(buf), NULL, 0, true);
                if (n < 0)
                        break;
        }
        cr_assert_eq(n, -EAGAIN);
        close(sv[0]);
        close(sv[1]);
}

Test(ipc, recv_too_long_closes_descriptors)
{
        int sv[2], p[2];
        seqpacket_pair(sv);
        nonblocking_pipe(p);

        uint8_t msg[200];
        memset(msg, 0xab, sizeof(msg));
        cr_assert_eq(dw_ipc_send(sv[0], msg, sizeof(msg), &p[1], 1, false), (ssize_t)sizeof(msg));
        close(p[1]);
        cr_assert_eq(pipe_has_writer(p[0]), 1);

        uint8_t buf[64];
        int fds[DW_IPC_MAX_FDS] = {-1, -1, -1}, nfds = DW_IPC_MAX_FDS;
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), -EMSGSIZE);
        cr_assert_eq(nfds, 0);
        cr_assert_eq(pipe_has_writer(p[0]), 0, "the descriptor of a truncated message leaked");

        /* The next message is whole and on its own. */
        cr_assert_eq(dw_ipc_send(sv[0], msg, 10, NULL, 0, false), 10);
        nfds = DW_IPC_MAX_FDS;
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), 10);
        cr_assert_eq(nfds, 0);

        close(p[0]);
        close(sv[0]);
        close(sv[1]);
}

Test(ipc, recv_closes_descriptors_beyond_room)
{
        int sv[2], p[3][2];
        seqpacket_pair(sv);
        int w[3];
        for (int i = 0; i < 3; i++) {
                nonblocking_pipe(p[i]);
                w[i] = p[i][1];
        }
        uint8_t msg[16] = {0}, buf[64];
        cr_assert_eq(dw_ipc_send(sv[0], msg, sizeof(msg), w, 3, false), (ssize_t)sizeof(msg));
        for (int i = 0; i < 3; i++)
                close(w[i]);

        int fds[1] = {-1}, nfds = 1;
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), (ssize_t)sizeof(msg));
        cr_assert_eq(nfds, 1);
        cr_assert_eq(pipe_has_writer(p[0][0]), 1);
        cr_assert_eq(pipe_has_writer(p[1][0]), 0);
        cr_assert_eq(pipe_has_writer(p[2][0]), 0);
        close(fds[0]);
        cr_assert_eq(pipe_has_writer(p[0][0]), 0);

        /* No room at all, and no array. */
        int q[2];
        nonblocking_pipe(q);
        cr_assert_eq(dw_ipc_send(sv[0], msg, sizeof(msg), &q[1], 1, false), (ssize_t)sizeof(msg));
        close(q[1]);
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), NULL, NULL), (ssize_t)sizeof(msg));
        cr_assert_eq(pipe_has_writer(q[0]), 0);

        for (int i = 0; i < 3; i++)
                close(p[i][0]);
        close(q[0]);
        close(sv[0]);
        close(sv[1]);
}

/* A zero-length message reads as end of stream, and callers drop the
 * connection on 0 without looking at descriptors: any that came with it
 * must not outlive the call. */
Test(ipc, recv_empty_message_closes_descriptors)
{
        int sv[2], p[2];
        seqpacket_pair(sv);
        nonblocking_pipe(p);
        cr_assert_eq(dw_ipc_send(sv[0], "", 0, &p[1], 1, false), 0);
        close(p[1]);

        uint8_t buf[64];
        int fds[DW_IPC_MAX_FDS] = {-1, -1, -1}, nfds = DW_IPC_MAX_FDS;
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), 0);
        cr_assert_eq(nfds, 0);
        cr_assert_eq(pipe_has_writer(p[0]), 0, "the descriptor of an empty message leaked");

        close(p[0]);
        close(sv[0]);
        close(sv[1]);
}

/* More descriptors than dw_ipc_recv has control room for (a peer that does
 * not use dw_ipc_send): the kernel drops the rest, and the message is
 * refused whole. */
Test(ipc, recv_control_truncated)
{
        enum { N = 12 };
        int sv[2], p[N][2], w[N];
        seqpacket_pair(sv);
        for (int i = 0; i < N; i++) {
                nonblocking_pipe(p[i]);
                w[i] = p[i][1];
        }
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int) * N)];
        } c;
        memset(&c, 0, sizeof(c));
        uint8_t msg[16] = {0};
        struct iovec iov = {.iov_base = msg, .iov_len = sizeof(msg)};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = c.buf,
                            .msg_controllen = sizeof(c.buf)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * N);
        memcpy(CMSG_DATA(cm), w, sizeof(w));
        cr_assert_eq(sendmsg(sv[0], &mh, 0), (ssize_t)sizeof(msg));
        for (int i = 0; i < N; i++)
                close(w[i]);

        uint8_t buf[64];
        int fds[DW_IPC_MAX_FDS] = {-1, -1, -1}, nfds = DW_IPC_MAX_FDS;
        cr_assert_eq(dw_ipc_recv(sv[1], buf, sizeof(buf), fds, &nfds), -EMSGSIZE);
        cr_assert_eq(nfds, 0);
        for (int i = 0; i < N; i++) {
                cr_assert_eq(pipe_has_writer(p[i][0]), 0, "descriptor %d leaked", i);
                close(p[i][0]);
        }
        close(sv[0]);
        close(sv[1]);
}
