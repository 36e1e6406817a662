/* The daemon protocol's sizes, the request decoder and the socket helpers:
 * see ipc.h. */
#include "ipc/ipc.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u

size_t dw_ipc_req_size(unsigned int op)
{
        const size_t h = sizeof(struct dw_ipc_hdr);
        switch (op) {
        case DW_IPC_OPEN:
                return h + sizeof(struct dw_ipc_open);
        case DW_IPC_SEG_ADD:
                return h + sizeof(struct dw_ipc_seg);
        case DW_IPC_MR_REG:
                return h + sizeof(struct dw_ipc_mr_reg);
        case DW_IPC_CQ_CREATE:
                return h + sizeof(struct dw_ipc_cq_create);
        case DW_IPC_QP_CREATE:
                return h + sizeof(struct dw_ipc_qp_create);
        case DW_IPC_QP_MODIFY:
                return h + sizeof(struct dw_ipc_qp_modify);
        case DW_IPC_SRQ_CREATE:
                return h + sizeof(struct dw_ipc_srq_create);
        case DW_IPC_SRQ_MODIFY:
                return h + sizeof(struct dw_ipc_srq_modify);
        case DW_IPC_AH_CREATE:
                return h + sizeof(struct dw_ipc_ah_create);
        case DW_IPC_RD_PATH:
                return h + sizeof(struct dw_ipc_rd_path);
        case DW_IPC_LISTEN:
                return h + sizeof(struct dw_ipc_listen);
        case DW_IPC_ACCEPT:
        case DW_IPC_REJECT:
        case DW_IPC_CONNECT:
                return h + sizeof(struct dw_ipc_conn);
        case DW_IPC_PD_ALLOC:
        case DW_IPC_PD_DEALLOC:
        case DW_IPC_MR_DEREG:
        case DW_IPC_CHANNEL_CREATE:
        case DW_IPC_CHANNEL_DESTROY:
        case DW_IPC_CQ_DESTROY:
        case DW_IPC_QP_DESTROY:
        case DW_IPC_QP_QUERY:
        case DW_IPC_SRQ_DESTROY:
        case DW_IPC_SRQ_QUERY:
        case DW_IPC_AH_DESTROY:
        case DW_IPC_COUNTERS:
        case DW_IPC_STAT:
        case DW_IPC_SHUTDOWN:
        case DW_IPC_STAT_QPS:
        case DW_IPC_LISTENER_DESTROY:
        case DW_IPC_GET_REQUEST:
        case DW_IPC_DISCONNECT:
                return h;
        default:
                return 0;
        }
}

const char *dw_ipc_op_name(unsigned int op)
{
        static const char *const names[DW_IPC_OP_END] = {
            [DW_IPC_OPEN] = "OPEN",
            [DW_IPC_PD_ALLOC] = "PD_ALLOC",
            [DW_IPC_PD_DEALLOC] = "PD_DEALLOC",
            [DW_IPC_SEG_ADD] = "SEG_ADD",
            [DW_IPC_MR_REG] = "MR_REG",
            [DW_IPC_MR_DEREG] = "MR_DEREG",
            [DW_IPC_CHANNEL_CREATE] = "CHANNEL_CREATE",
            [DW_IPC_CHANNEL_DESTROY] = "CHANNEL_DESTROY",
            [DW_IPC_CQ_CREATE] = "CQ_CREATE",
            [DW_IPC_CQ_DESTROY] = "CQ_DESTROY",
            [DW_IPC_QP_CREATE] = "QP_CREATE",
            [DW_IPC_QP_DESTROY] = "QP_DESTROY",
            [DW_IPC_QP_MODIFY] = "QP_MODIFY",
            [DW_IPC_QP_QUERY] = "QP_QUERY",
            [DW_IPC_SRQ_CREATE] = "SRQ_CREATE",
            [DW_IPC_SRQ_DESTROY] = "SRQ_DESTROY",
            [DW_IPC_SRQ_MODIFY] = "SRQ_MODIFY",
            [DW_IPC_SRQ_QUERY] = "SRQ_QUERY",
            [DW_IPC_AH_CREATE] = "AH_CREATE",
            [DW_IPC_AH_DESTROY] = "AH_DESTROY",
            [DW_IPC_COUNTERS] = "COUNTERS",
            [DW_IPC_RD_PATH] = "RD_PATH",
            [DW_IPC_STAT] = "STAT",
            [DW_IPC_SHUTDOWN] = "SHUTDOWN",
            [DW_IPC_STAT_QPS] = "STAT_QPS",
            [DW_IPC_LISTEN] = "LISTEN",
            [DW_IPC_LISTENER_DESTROY] = "LISTENER_DESTROY",
            [DW_IPC_GET_REQUEST] = "GET_REQUEST",
            [DW_IPC_ACCEPT] = "ACCEPT",
            [DW_IPC_REJECT] = "REJECT",
            [DW_IPC_CONNECT] = "CONNECT",
            [DW_IPC_DISCONNECT] = "DISCONNECT",
        };
        return op < DW_IPC_OP_END && names[op] ? names[op] : "unknown";
}

int dw_ipc_req_nfds(unsigned int op)
{
        return op == DW_IPC_SEG_ADD ? 1 : 0;
}

static bool has_nul(const char *s, size_t n)
{
        return memchr(s, 0, n) != NULL;
}

static int fail(const char **why, const char *reason, int err)
{
        if (why)
                *why = reason;
        return err;
}

/* Every access bit the verbs know (enum diwarp_access_flags). */
#define ACCESS_KNOWN                                                                               \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC | DIWARP_ACCESS_MW_BIND | DIWARP_ACCESS_ZERO_BASED)

int dw_ipc_req_check(const void *msg, size_t len, int nfds, const char **why)
{
        struct dw_ipc_req r;
        if (!msg || len < sizeof(struct dw_ipc_hdr))
                return fail(why, "shorter than a header", -EPROTO);
        memset(&r, 0, sizeof(r));
        memcpy(&r, msg, len < sizeof(r) ? len : sizeof(r));
        if (r.h.magic != DW_IPC_MAGIC)
                return fail(why, "bad magic", -EPROTO);
        size_t want = dw_ipc_req_size(r.h.op);
        if (want == 0)
                return fail(why, "unknown operation", -EPROTO);
        if (r.h.len != len || len != want)
                return fail(why, "length does not match the operation", -EPROTO);
        if (nfds != dw_ipc_req_nfds(r.h.op))
                return fail(why, "wrong number of descriptors for the operation", -EPROTO);
        switch (r.h.op) {
        case DW_IPC_OPEN:
                if (r.u.open.version != DW_IPC_VERSION)
                        return fail(why, "protocol version not served", -EPROTO);
                if (!has_nul(r.u.open.addr, sizeof(r.u.open.addr)))
                        return fail(why, "address not terminated", -EINVAL);
                break;
        case DW_IPC_SEG_ADD:
                if (r.u.seg.id == 0 || r.u.seg.len == 0 || r.u.seg.base % PAGE ||
                    r.u.seg.len % PAGE || r.u.seg.base + r.u.seg.len < r.u.seg.base)
                        return fail(why, "segment not whole pages", -EINVAL);
                if (r.u.seg.nreplace > 16)
                        return fail(why, "too many segments replaced", -EINVAL);
                /* Each segment it covers once: the daemon frees each one it
                 * names after moving its regions. */
                for (uint32_t k = 0; k < r.u.seg.nreplace; k++) {
                        if (r.u.seg.replace[k] == r.u.seg.id)
                                return fail(why, "segment replaces itself", -EINVAL);
                        for (uint32_t j = 0; j < k; j++)
                                if (r.u.seg.replace[j] == r.u.seg.replace[k])
                                        return fail(why,
                                                    "a segment named twice in the replace list",
                                                    -EINVAL);
                }
                break;
        case DW_IPC_MR_REG:
                if (r.u.mr.access & ~ACCESS_KNOWN)
                        return fail(why, "unknown access bits", -EINVAL);
                if (r.u.mr.addr + r.u.mr.len < r.u.mr.addr)
                        return fail(why, "region wraps", -EINVAL);
                break;
        case DW_IPC_CQ_CREATE:
                if (r.u.cq.cqe < 1)
                        return fail(why, "CQ size below 1", -EINVAL);
                break;
        case DW_IPC_QP_CREATE:
                if (r.u.qp.type != DIWARP_QPT_RC && r.u.qp.type != DIWARP_QPT_UC &&
                    r.u.qp.type != DIWARP_QPT_UD && r.u.qp.type != DIWARP_QPT_RD)
                        return fail(why, "unknown QP type", -EINVAL);
                if (r.u.qp.send_cq == 0 || r.u.qp.recv_cq == 0)
                        return fail(why, "QP without CQs", -EINVAL);
                break;
        case DW_IPC_QP_MODIFY:
                if (r.u.qpm.mask == 0)
                        return fail(why, "empty attribute mask", -EINVAL);
                break;
        case DW_IPC_SRQ_CREATE:
                if (r.u.srq.attr.max_wr == 0)
                        return fail(why, "SRQ of no WR", -EINVAL);
                break;
        case DW_IPC_ACCEPT:
        case DW_IPC_REJECT:
        case DW_IPC_CONNECT:
                if (r.u.conn.pd_len > DIWARP_MAX_PRIVATE_DATA)
                        return fail(why, "private data longer than the limit", -EINVAL);
                break;
        default:
                break;
        }
        return 0;
}

uint32_t dw_ipc_pow2(uint32_t n)
{
        uint32_t p = 1;
        while (p < n && p < (1u << 31))
                p <<= 1;
        return p;
}

uint64_t dw_ipc_ring_bytes(uint32_t entries, uint32_t entry_size)
{
        uint64_t b = DW_IPC_RING_HDR + (uint64_t)entries * entry_size;
        return (b + PAGE - 1) / PAGE * PAGE;
}

static size_t round64(size_t n)
{
        return (n + 63) & ~(size_t)63;
}

size_t dw_ipc_swr_size(const struct diwarp_qp_cap *cap)
{
        return round64(sizeof(struct dw_ipc_swr) + cap->max_send_sge * sizeof(struct diwarp_sge) +
                       cap->max_inline_data);
}

size_t dw_ipc_rwr_size(uint32_t max_sge)
{
        return round64(sizeof(struct dw_ipc_rwr) + max_sge * sizeof(struct diwarp_sge));
}

int dw_ipc_socket_path(char *out, size_t len)
{
        struct sockaddr_un un;
        const char *p = getenv("DIWARP_DAEMON_SOCKET");
        const char *rt = getenv("XDG_RUNTIME_DIR");
        int n;
        if (p && *p)
                n = snprintf(out, len, "%s", p);
        else if (rt && *rt)
                n = snprintf(out, len, "%s/diwarpd.sock", rt);
        else
                n = snprintf(out, len, "/run/diwarp/diwarpd.sock");
        if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(un.sun_path))
                return -ENAMETOOLONG;
        return 0;
}

ssize_t dw_ipc_send(int sock, const void *msg, size_t len, const int *fds, int nfds, bool dontwait)
{
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int) * DW_IPC_MAX_FDS)];
        } c;
        struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (nfds < 0 || nfds > DW_IPC_MAX_FDS)
                return -EINVAL;
        if (nfds > 0) {
                memset(&c, 0, sizeof(c));
                mh.msg_control = c.buf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
                memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
        }
        ssize_t n;
        do
                n = sendmsg(sock, &mh, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
        while (n < 0 && errno == EINTR);
        return n < 0 ? -errno : n;
}

ssize_t dw_ipc_recv(int sock, void *msg, size_t len, int *fds, int *nfds)
{
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int) * 8)];
        } c;
        struct iovec iov = {.iov_base = msg, .iov_len = len};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = c.buf,
                            .msg_controllen = sizeof(c.buf)};
        int room = nfds ? *nfds : 0, got = 0;
        ssize_t n;
        do
                n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < k; i++) {
                        int fd;
                        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                        if (got < room)
                                fds[got++] = fd;
                        else
                                close(fd);
                }
        }
        if (nfds)
                *nfds = got;
        /* An empty message reads as end of stream: callers drop the peer on 0
         * without looking at descriptors, so it must not hand any over. */
        if (n == 0 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
                for (int i = 0; i < got; i++)
                        close(fds[i]);
                if (nfds)
                        *nfds = 0;
                return n == 0 ? 0 : -EMSGSIZE;
        }
        return n;
}

/* The word is prod itself, in the page both processes map (a shared, not a
 * private, futex). The napper counts itself before its last look at prod and
 * the daemon looks at the count after it stored prod, each behind a full
 * fence: one of the two sees the other. */
void dw_ipc_cq_nap(struct dw_ipc_ring *r, uint32_t seen_prod, long ns)
{
        atomic_fetch_add(&r->nappers, 1);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&r->prod, memory_order_relaxed) == seen_prod) {
                struct timespec ts = {0, ns};
                syscall(SYS_futex, &r->prod, FUTEX_WAIT, seen_prod, &ts, NULL, 0);
        }
        atomic_fetch_sub(&r->nappers, 1);
}

void dw_ipc_cq_published(struct dw_ipc_ring *r)
{
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&r->nappers, memory_order_relaxed))
                syscall(SYS_futex, &r->prod, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
