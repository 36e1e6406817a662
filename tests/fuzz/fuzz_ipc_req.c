/* Feeds arbitrary bytes to the daemon's request decoder, dw_ipc_req_check:
 * the first byte is the number of descriptors the message came with (0 to
 * DW_IPC_MAX_FDS), the rest is the message. The daemon sizes rings and
 * indexes tables from whatever the decoder lets through, so an accepted
 * message must have exactly its op's length and descriptor count, every
 * field the decoder promises to range-check must be in range, and the ring
 * helpers must work on the decoded values without overflow or a stray
 * access. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/ipc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PAGE 4096u

/* Bounds that keep the ring the target allocates small: what is checked is
 * the arithmetic, not how much memory a client may ask for. */
#define FUZZ_MAX_ENTRIES 64u
#define FUZZ_MAX_SGE     32u

#define ACCESS_ALL                                                                                 \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC | DIWARP_ACCESS_MW_BIND | DIWARP_ACCESS_ZERO_BASED)

/* Keeps the walks over decoded arrays from being optimised away. */
static volatile uint32_t sink;

static void check_pow2(uint32_t n)
{
        /* dw_ipc_pow2 is defined for 1..2^31 only. */
        if (n == 0)
                n = 1;
        if (n > (1u << 31))
                n = 1u << 31;
        uint32_t p = dw_ipc_pow2(n);
        if (p < n || (p & (p - 1)) != 0 || (p > 1 && p / 2 >= n))
                abort();
}

static void check_ring_bytes(uint32_t entries, uint32_t entry_size)
{
        uint64_t b = dw_ipc_ring_bytes(entries, entry_size);
        uint64_t need = DW_IPC_RING_HDR + (uint64_t)entries * entry_size;
        if (b % PAGE != 0 || b < need || b - need >= PAGE)
                abort();
}

/* A ring laid out as the daemon lays it out, in an allocation of exactly
 * dw_ipc_ring_bytes: every index the other side may write must land inside. */
static void touch_ring(uint32_t entries, uint32_t entry_size, uint32_t index)
{
        uint64_t b = dw_ipc_ring_bytes(entries, entry_size);
        uint8_t *mem = malloc((size_t)b);
        if (!mem)
                abort();
        struct dw_ipc_ring *r = (struct dw_ipc_ring *)mem;
        uint8_t *first = dw_ipc_ring_entry(r, entry_size, entries, index);
        if (first < mem + DW_IPC_RING_HDR)
                abort();
        memset(first, 0xA5, entry_size);
        memset(dw_ipc_ring_entry(r, entry_size, entries, entries - 1), 0x5A, entry_size);
        free(mem);
}

static void check_swr(const struct diwarp_qp_cap *raw, uint32_t index)
{
        size_t s = dw_ipc_swr_size(raw);
        if (s % 64 != 0 || s < sizeof(struct dw_ipc_swr) +
                                   (size_t)raw->max_send_sge * sizeof(struct diwarp_sge) +
                                   raw->max_inline_data)
                abort();

        struct diwarp_qp_cap cap = *raw;
        cap.max_send_sge %= FUZZ_MAX_SGE + 1;
        cap.max_inline_data %= DW_IPC_MAX_INLINE_COPY + 1;
        s = dw_ipc_swr_size(&cap);
        if (s > UINT32_MAX)
                abort();
        uint32_t entries = dw_ipc_pow2(cap.max_send_wr % FUZZ_MAX_ENTRIES + 1);
        check_ring_bytes(entries, (uint32_t)s);
        touch_ring(entries, (uint32_t)s, index);
}

static void check_rwr(uint32_t max_sge, uint32_t max_wr, uint32_t index)
{
        size_t s = dw_ipc_rwr_size(max_sge);
        if (s % 64 != 0 ||
            s < sizeof(struct dw_ipc_rwr) + (size_t)max_sge * sizeof(struct diwarp_sge))
                abort();

        s = dw_ipc_rwr_size(max_sge % (FUZZ_MAX_SGE + 1));
        uint32_t entries = dw_ipc_pow2(max_wr % FUZZ_MAX_ENTRIES + 1);
        check_ring_bytes(entries, (uint32_t)s);
        touch_ring(entries, (uint32_t)s, index);
}

/* What the decoder promises about the fields of an accepted request. */
static void check_fields(const struct dw_ipc_req *r)
{
        switch (r->h.op) {
        case DW_IPC_OPEN:
                if (r->u.open.version != DW_IPC_VERSION ||
                    !memchr(r->u.open.addr, 0, sizeof(r->u.open.addr)))
                        abort();
                break;
        case DW_IPC_SEG_ADD: {
                const struct dw_ipc_seg *s = &r->u.seg;
                if (s->id == 0 || s->len == 0 || s->base % PAGE || s->len % PAGE ||
                    s->base + s->len < s->base || s->nreplace > 16)
                        abort();
                /* The daemon walks replace[] by nreplace: UBSan's bounds
                 * check catches an index past the array. */
                uint32_t sum = 0;
                for (uint32_t i = 0; i < s->nreplace; i++)
                        sum += s->replace[i];
                sink = sum;
                break;
        }
        case DW_IPC_MR_REG:
                if ((r->u.mr.access & ~ACCESS_ALL) != 0 ||
                    r->u.mr.addr + r->u.mr.len < r->u.mr.addr)
                        abort();
                break;
        case DW_IPC_CQ_CREATE: {
                if (r->u.cq.cqe < 1)
                        abort();
                check_pow2((uint32_t)r->u.cq.cqe);
                /* The entry size the daemon gives a CQ ring. */
                uint32_t esize = 64 * (uint32_t)((sizeof(struct diwarp_wc) + 63) / 64);
                check_ring_bytes(dw_ipc_pow2((uint32_t)r->u.cq.cqe), esize);
                touch_ring(dw_ipc_pow2((uint32_t)r->u.cq.cqe % FUZZ_MAX_ENTRIES + 1), esize,
                           r->h.seq);
                break;
        }
        case DW_IPC_QP_CREATE: {
                const struct dw_ipc_qp_create *q = &r->u.qp;
                if ((q->type != DIWARP_QPT_RC && q->type != DIWARP_QPT_UC &&
                     q->type != DIWARP_QPT_UD && q->type != DIWARP_QPT_RD) ||
                    q->send_cq == 0 || q->recv_cq == 0)
                        abort();
                check_pow2(q->cap.max_send_wr);
                check_pow2(q->cap.max_recv_wr);
                check_swr(&q->cap, r->h.seq);
                check_rwr(q->cap.max_recv_sge, q->cap.max_recv_wr, r->h.seq);
                break;
        }
        case DW_IPC_QP_MODIFY:
                if (r->u.qpm.mask == 0)
                        abort();
                break;
        case DW_IPC_SRQ_CREATE:
                if (r->u.srq.attr.max_wr == 0)
                        abort();
                check_pow2(r->u.srq.attr.max_wr);
                check_rwr(r->u.srq.attr.max_sge, r->u.srq.attr.max_wr, r->h.seq);
                break;
        case DW_IPC_SRQ_MODIFY:
                check_rwr(r->u.srqm.attr.max_sge, r->u.srqm.attr.max_wr, r->h.seq);
                break;
        default:
                break;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (size == 0)
                return 0;
        int nfds = data[0] % (DW_IPC_MAX_FDS + 1);
        const uint8_t *msg = data + 1;
        size_t len = size - 1;
        const char *why = NULL;
        int rc = dw_ipc_req_check(msg, len, nfds, &why);

        /* The verdict must not depend on whether the caller wants a reason. */
        if (dw_ipc_req_check(msg, len, nfds, NULL) != rc)
                abort();
        if (rc < 0) {
                if ((rc != -EPROTO && rc != -EINVAL) || !why || !*why)
                        abort();
                return 0;
        }
        if (rc != 0)
                abort();

        struct dw_ipc_req r;
        if (len < sizeof(r.h) || len > sizeof(r) || len > DW_IPC_MAX_MSG)
                abort();
        memset(&r, 0, sizeof(r));
        memcpy(&r, msg, len);
        if (r.h.magic != DW_IPC_MAGIC || len != dw_ipc_req_size(r.h.op) || r.h.len != len ||
            nfds != dw_ipc_req_nfds(r.h.op))
                abort();

        /* Exactly one descriptor count and one length are right for an op. */
        for (int k = 0; k <= DW_IPC_MAX_FDS; k++)
                if (k != nfds && dw_ipc_req_check(msg, len, k, NULL) != -EPROTO)
                        abort();
        if (dw_ipc_req_check(msg, len - 1, nfds, NULL) != -EPROTO)
                abort();

        check_fields(&r);
        return 0;
}
