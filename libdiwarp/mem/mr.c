/* PD bookkeeping, the MR / STag table, access checks, invalidation.
 * See mr.h for the contract and mem/README.md for the decisions. */
#include "mem/mr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define DW_ACCESS_KNOWN                                                                            \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC | DIWARP_ACCESS_MW_BIND | DIWARP_ACCESS_ZERO_BASED)

int dw_mr_table_init(struct dw_mr_table *t, uint32_t max)
{
        if (!t || max == 0 || max > DW_MR_MAX_INDEX)
                return -EINVAL;
        memset(t, 0, sizeof(*t));
        /* Slot 0 exists but is never handed out, so index 0 (and STag 0)
         * always fails the lookup without a special case. */
        t->slots = calloc((size_t)max + 1, sizeof(*t->slots));
        if (!t->slots)
                return -ENOMEM;
        t->max = max;
        /* FIFO free list: a freed slot is reused as late as possible, so a
         * stale STag meets the same index (with a new key) as rarely as
         * possible. */
        for (uint32_t i = 1; i <= max; i++)
                t->slots[i].next_free = i < max ? i + 1 : 0;
        t->free_head = 1;
        t->free_tail = max;
        t->next_pd_handle = 1;
        return 0;
}

void dw_mr_table_destroy(struct dw_mr_table *t)
{
        if (!t)
                return;
        free(t->slots);
        memset(t, 0, sizeof(*t));
}

void dw_pd_init(struct dw_mr_table *t, struct dw_pd *pd, struct dw_device *dev)
{
        pd->dev = dev;
        pd->use_count = 0;
        pd->handle = t->next_pd_handle++;
        if (t->next_pd_handle == 0)
                t->next_pd_handle = 1;
}

int dw_pd_fini(struct dw_pd *pd)
{
        if (pd->use_count > 0)
                return -EBUSY;
        pd->handle = 0;
        return 0;
}

void dw_pd_get(struct dw_pd *pd)
{
        pd->use_count++;
}

void dw_pd_put(struct dw_pd *pd)
{
        if (pd->use_count > 0)
                pd->use_count--;
}

/* One random byte per registration: registration is not a hot path, so a
 * getrandom() call each time is simpler than keeping a pool. */
static int random_key(uint8_t *key)
{
        for (;;) {
                ssize_t n = getrandom(key, 1, 0);
                if (n == 1)
                        return 0;
                if (n < 0 && errno == EINTR)
                        continue;
                return -EIO;
        }
}

/* The checks every registration makes; iova becomes 0 for a zero-based one. */
static bool mr_args_ok(const void *addr, size_t len, uint64_t *iova, int access)
{
        if (access & ~DW_ACCESS_KNOWN)
                return false;
        /* ibverbs rule: remote write or atomic needs local write. */
        if ((access & (DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_ATOMIC)) &&
            !(access & DIWARP_ACCESS_LOCAL_WRITE))
                return false;
        if (!addr && len > 0)
                return false;
        if ((uint64_t)len > UINTPTR_MAX - (uintptr_t)addr)
                return false;
        if (access & DIWARP_ACCESS_ZERO_BASED)
                *iova = 0;
        /* The last TO, iova + len - 1, and the exclusive end must both be
         * representable so the checks need no 128-bit arithmetic. */
        return (uint64_t)len <= UINT64_MAX - *iova;
}

/* What a registration sets besides the slot and the PD; a valid region. */
static void mr_place(struct dw_mr *mr, void *addr, size_t len, uint64_t iova, int access)
{
        mr->addr = addr;
        mr->length = len;
        mr->iova = iova;
        mr->access = access;
        mr->valid = true;
}

int dw_mr_register(struct dw_mr_table *t, struct dw_pd *pd, void *addr, size_t len, uint64_t iova,
                   int access, struct dw_mr **out)
{
        if (!t || !t->slots || !pd || !out)
                return -EINVAL;
        if (!mr_args_ok(addr, len, &iova, access))
                return -EINVAL;
        if (t->free_head == 0)
                return -ENOMEM;

        uint32_t idx = t->free_head;
        struct dw_mr *mr = &t->slots[idx];
        uint8_t key;
        int rc = random_key(&key);
        if (rc)
                return rc;
        /* Never repeat the slot's previous key: the STag of the last
         * registration in this slot must die for certain, not with
         * probability 255/256. */
        if (mr->stag != 0 && key == dw_stag_key(mr->stag))
                key++;

        t->free_head = mr->next_free;
        if (t->free_head == 0)
                t->free_tail = 0;
        mr->next_free = 0;
        mr->stag = idx << 8 | key;
        mr->pd = pd;
        mr_place(mr, addr, len, iova, access);
        mr->in_use = true;
        t->count++;
        pd->use_count++;
        *out = mr;
        return 0;
}

static bool mr_is_registered(const struct dw_mr_table *t, const struct dw_mr *mr)
{
        if (!t || !t->slots || !mr || mr <= t->slots || mr > t->slots + t->max)
                return false;
        if ((size_t)((const char *)mr - (const char *)t->slots) % sizeof(*mr) != 0)
                return false;
        return mr->in_use;
}

int dw_mr_rereg(struct dw_mr_table *t, struct dw_mr *mr, int flags, struct dw_pd *pd, void *addr,
                size_t len, uint64_t iova, int access)
{
        const int known = DW_MR_REREG_TRANSLATION | DW_MR_REREG_PD | DW_MR_REREG_ACCESS;
        if (!mr_is_registered(t, mr) || !flags || (flags & ~known))
                return -EINVAL;
        if ((flags & DW_MR_REREG_PD) && !pd)
                return -EINVAL;
        if (!(flags & DW_MR_REREG_TRANSLATION)) {
                addr = mr->addr;
                len = mr->length;
                iova = mr->iova;
        }
        if (!(flags & DW_MR_REREG_ACCESS))
                access = mr->access;
        /* A zero-based region keeps TO 0 at byte 0 when only its rights
         * change; a region that stops being zero-based needs a new iova. */
        if ((mr->access & DIWARP_ACCESS_ZERO_BASED) && !(access & DIWARP_ACCESS_ZERO_BASED) &&
            !(flags & DW_MR_REREG_TRANSLATION))
                return -EINVAL;
        if (!mr_args_ok(addr, len, &iova, access))
                return -EINVAL;
        if (flags & DW_MR_REREG_PD) {
                dw_pd_get(pd);
                dw_pd_put(mr->pd);
                mr->pd = pd;
        }
        mr_place(mr, addr, len, iova, access);
        return 0;
}

int dw_mr_deregister(struct dw_mr_table *t, struct dw_mr *mr)
{
        if (!mr_is_registered(t, mr))
                return -EINVAL;
        uint32_t idx = (uint32_t)(mr - t->slots);

        dw_pd_put(mr->pd);
        /* Keep mr->stag: its key is the one the next registration of this
         * slot must not reuse. */
        mr->in_use = false;
        mr->valid = false;
        mr->pd = NULL;
        mr->addr = NULL;
        mr->length = 0;
        mr->iova = 0;
        mr->access = 0;
        mr->next_free = 0;
        if (t->free_tail)
                t->slots[t->free_tail].next_free = idx;
        else
                t->free_head = idx;
        t->free_tail = idx;
        t->count--;
        return 0;
}

struct dw_mr *dw_mr_lookup(struct dw_mr_table *t, uint32_t stag)
{
        uint32_t idx = dw_stag_index(stag);

        if (!t || !t->slots || idx == 0 || idx > t->max)
                return NULL;
        struct dw_mr *mr = &t->slots[idx];
        if (!mr->in_use || mr->stag != stag)
                return NULL;
        return mr;
}

/* Shared by the remote and local checks; they differ only in which access
 * bits the caller may ask for. */
static enum dw_prot_status check(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd,
                                 int needed_access, uint64_t to, uint64_t len, uint8_t **host_addr)
{
        if (host_addr)
                *host_addr = NULL;
        /* Zero length touches no memory: allowed without looking at the
         * STag, as peers send zero-length Reads/Writes with any STag. */
        if (len == 0)
                return DW_PROT_OK;

        struct dw_mr *mr = dw_mr_lookup(t, stag);
        if (!mr)
                return DW_PROT_INVALID_STAG;
        if (!mr->valid)
                return DW_PROT_INVALIDATED;
        if (mr->pd != pd)
                return DW_PROT_PD_MISMATCH;
        if ((mr->access & needed_access) != needed_access)
                return DW_PROT_ACCESS;
        if (len > UINT64_MAX - to)
                return DW_PROT_TO_WRAP;
        /* [to, to+len) within [iova, iova+length); no sum can overflow:
         * to >= iova, off <= length and len <= length - off. */
        if (to < mr->iova)
                return DW_PROT_BOUNDS;
        uint64_t off = to - mr->iova;
        if (off > mr->length || len > mr->length - off)
                return DW_PROT_BOUNDS;
        if (host_addr)
                *host_addr = mr->addr + off;
        return DW_PROT_OK;
}

/* dw_mr_check_remote / dw_mr_check_local (mr.h) test the common case inline
 * and come here for everything else. */
enum dw_prot_status dw_mr_check_full(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd,
                                     int needed_access, uint64_t to, uint64_t len,
                                     uint8_t **host_addr)
{
        return check(t, stag, pd, needed_access, to, len, host_addr);
}

enum dw_prot_status dw_mr_invalidate_status(struct dw_mr_table *t, uint32_t stag,
                                            const struct dw_pd *pd)
{
        struct dw_mr *mr = dw_mr_lookup(t, stag);

        if (!mr)
                return DW_PROT_INVALID_STAG;
        if (!mr->valid)
                return DW_PROT_INVALIDATED;
        /* RFC 5040: the STag must belong to the PD of the stream that
         * carries the Send with Invalidate (or of the QP posting the Local
         * Invalidate); otherwise nothing changes. */
        if (mr->pd != pd)
                return DW_PROT_PD_MISMATCH;
        mr->valid = false;
        return DW_PROT_OK;
}

int dw_mr_invalidate(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd)
{
        switch (dw_mr_invalidate_status(t, stag, pd)) {
        case DW_PROT_OK:
                return 0;
        case DW_PROT_PD_MISMATCH:
                return -EACCES;
        default:
                return -EINVAL;
        }
}

const char *dw_prot_status_str(enum dw_prot_status st)
{
        switch (st) {
        case DW_PROT_OK:
                return "ok";
        case DW_PROT_INVALID_STAG:
                return "invalid STag";
        case DW_PROT_PD_MISMATCH:
                return "STag of another protection domain";
        case DW_PROT_ACCESS:
                return "access right not granted";
        case DW_PROT_BOUNDS:
                return "base or bounds violation";
        case DW_PROT_INVALIDATED:
                return "STag invalidated";
        case DW_PROT_TO_WRAP:
                return "tagged offset wrap";
        case DW_PROT_NOT_INVALIDATABLE:
                return "STag cannot be invalidated";
        }
        return "unknown protection status";
}

enum diwarp_wc_status dw_prot_status_to_wc(enum dw_prot_status st, bool remote)
{
        if (st == DW_PROT_OK)
                return DIWARP_WC_SUCCESS;
        return remote ? DIWARP_WC_REM_ACCESS_ERR : DIWARP_WC_LOC_PROT_ERR;
}

static struct dw_term_error term(uint8_t layer, uint8_t etype, uint8_t ecode)
{
        struct dw_term_error e = {.layer = layer, .etype = etype, .ecode = ecode};
        return e;
}

/* RDMAP-layer Remote Protection Error: the Read Request source check and
 * the atomic target check are RDMAP's own (RFC 5040 §4.8, RFC 7306). */
static int rdmap_prot(enum dw_prot_status st, struct dw_term_error *out)
{
        uint8_t code;

        switch (st) {
        case DW_PROT_INVALID_STAG:
        case DW_PROT_INVALIDATED:
                code = DW_TERM_RDMAP_INVALID_STAG;
                break;
        case DW_PROT_PD_MISMATCH:
                code = DW_TERM_RDMAP_STAG_NOT_ON_STREAM;
                break;
        case DW_PROT_ACCESS:
                code = DW_TERM_RDMAP_ACCESS_RIGHTS;
                break;
        case DW_PROT_BOUNDS:
                code = DW_TERM_RDMAP_BASE_BOUNDS;
                break;
        case DW_PROT_TO_WRAP:
                code = DW_TERM_RDMAP_TO_WRAP;
                break;
        case DW_PROT_NOT_INVALIDATABLE:
                code = DW_TERM_RDMAP_STAG_NOT_INVALIDATED;
                break;
        default:
                return -EINVAL;
        }
        *out = term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION, code);
        return 0;
}

int dw_prot_status_to_term(enum dw_prot_status st, enum dw_prot_ctx ctx, struct dw_term_error *out)
{
        if (!out || st == DW_PROT_OK)
                return -EINVAL;
        switch (ctx) {
        case DW_PROT_CTX_TAGGED_SINK:
                /* Tagged placement is validated by DDP (RFC 5041 §7.2 Tagged
                 * Buffer Error); DDP has no access-rights code, so a missing
                 * REMOTE_WRITE is reported by RDMAP. */
                switch (st) {
                case DW_PROT_INVALID_STAG:
                case DW_PROT_INVALIDATED:
                        *out =
                            term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_INVALID_STAG);
                        return 0;
                case DW_PROT_PD_MISMATCH:
                        *out = term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED,
                                    DW_TERM_DDP_T_STAG_NOT_ON_STREAM);
                        return 0;
                case DW_PROT_BOUNDS:
                        *out =
                            term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_BASE_BOUNDS);
                        return 0;
                case DW_PROT_TO_WRAP:
                        *out = term(DW_TERM_LAYER_DDP, DW_TERM_DDP_TAGGED, DW_TERM_DDP_T_TO_WRAP);
                        return 0;
                default:
                        return rdmap_prot(st, out);
                }
        case DW_PROT_CTX_READ_SOURCE:
        case DW_PROT_CTX_ATOMIC:
                return rdmap_prot(st, out);
        case DW_PROT_CTX_INVALIDATE:
                /* Every failure to invalidate is "STag cannot be
                 * invalidated" (RFC 5040 §4.8, Remote Protection Error). */
                switch (st) {
                case DW_PROT_INVALID_STAG:
                case DW_PROT_INVALIDATED:
                case DW_PROT_PD_MISMATCH:
                case DW_PROT_NOT_INVALIDATABLE:
                        *out = term(DW_TERM_LAYER_RDMAP, DW_TERM_RDMAP_REMOTE_PROTECTION,
                                    DW_TERM_RDMAP_STAG_NOT_INVALIDATED);
                        return 0;
                default:
                        return -EINVAL;
                }
        }
        return -EINVAL;
}
