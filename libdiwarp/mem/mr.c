/* PD bookkeeping, the MR / STag table, access checks, invalidation.
 * See mr.h for the contract and mem/README.md for the decisions. */
#include "mem/mr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/keyhash.h"

#define DW_ACCESS_KNOWN                                                                            \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC | DIWARP_ACCESS_MW_BIND | DIWARP_ACCESS_ZERO_BASED)

int dw_mr_table_init(struct dw_mr_table *t, uint32_t max)
{
        if (!t || max == 0 || max > DW_MR_MAX_SLOTS)
                return -EINVAL;
        memset(t, 0, sizeof(*t));
        /* Slot 0 exists but is never handed out, so an empty hash entry (0)
         * and STag 0 always fail the lookup without a special case. */
        t->slots = calloc((size_t)max + 1, sizeof(*t->slots));
        uint32_t hn = 16;
        while (hn < 2 * max)
                hn <<= 1;
        t->hash = calloc(hn, sizeof(*t->hash));
        if (!t->slots || !t->hash) {
                free(t->slots);
                free(t->hash);
                t->slots = NULL;
                t->hash = NULL;
                return -ENOMEM;
        }
        t->hmask = hn - 1;
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
        free(t->hash);
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

/* A random STag candidate: from the table's pool, refilled by one
 * getrandom() call every DW_MR_RANDOM_POOL draws (the call costs as much
 * as the rest of a registration). */
static int random_stag(struct dw_mr_table *t, uint32_t *v)
{
        if (t->npool == 0) {
                if (dw_random(t->pool, sizeof(t->pool)) < 0)
                        return -EIO;
                t->npool = DW_MR_RANDOM_POOL;
        }
        /* In the order getrandom() wrote them. */
        uint32_t i = DW_MR_RANDOM_POOL - t->npool--;
        *v = t->pool[i];
        t->pool[i] = 0; /* handed out: not kept beside the table */
        return 0;
}

/* The hash entry holding handle h, or the empty entry where it would go. */
static uint32_t hash_pos(const struct dw_mr_table *t, uint32_t h)
{
        uint32_t i = h & t->hmask;
        while (t->hash[i] && dw_stag_index(t->slots[t->hash[i]].stag) != h)
                i = (i + 1) & t->hmask;
        return i;
}

/* Removes the entry at i, moving later entries of its probe run back so
 * every remaining handle is still found (linear probing's deletion). */
static void hash_remove(struct dw_mr_table *t, uint32_t i)
{
        uint32_t j = i;
        for (;;) {
                t->hash[i] = 0;
                for (;;) {
                        j = (j + 1) & t->hmask;
                        if (!t->hash[j])
                                return;
                        uint32_t home = dw_stag_index(t->slots[t->hash[j]].stag) & t->hmask;
                        /* The entry at j may move to i unless its home lies
                         * cyclically in (i, j]. */
                        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
                        if (!stays)
                                break;
                }
                t->hash[i] = t->hash[j];
                i = j;
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

/* Takes the next free slot with a fresh key for pd: the common part of
 * registering a region and allocating a window. */
static int slot_take(struct dw_mr_table *t, struct dw_pd *pd, uint8_t kind, struct dw_mr **out)
{
        if (t->free_head == 0)
                return -ENOMEM;

        uint32_t idx = t->free_head;
        struct dw_mr *mr = &t->slots[idx];
        /* A random STag whose handle no live STag has (at most a quarter of
         * the handles are taken, so a draw or two). */
        uint32_t v = 0, pos = 0;
        for (int tries = 0;; tries++) {
                if (tries == 64)
                        return -EIO; /* a broken random source */
                int rc = random_stag(t, &v);
                if (rc)
                        return rc;
                if (dw_stag_index(v) == 0)
                        continue;
                pos = hash_pos(t, dw_stag_index(v));
                if (!t->hash[pos])
                        break;
        }
        /* Never repeat the slot's previous STag: the last registration's
         * must die for certain. */
        if (v == mr->stag)
                v ^= 1;

        t->free_head = mr->next_free;
        if (t->free_head == 0)
                t->free_tail = 0;
        mr->next_free = 0;
        mr->stag = v;
        t->hash[pos] = idx;
        mr->pd = pd;
        mr->kind = kind;
        mr->nbound = 0;
        mr->parent = 0;
        mr->qpn = 0;
        mr->in_use = true;
        t->count++;
        pd->use_count++;
        *out = mr;
        return 0;
}

int dw_mr_register(struct dw_mr_table *t, struct dw_pd *pd, void *addr, size_t len, uint64_t iova,
                   int access, struct dw_mr **out)
{
        if (!t || !t->slots || !pd || !out)
                return -EINVAL;
        if (!mr_args_ok(addr, len, &iova, access))
                return -EINVAL;
        struct dw_mr *mr;
        int rc = slot_take(t, pd, DW_STAG_MR, &mr);
        if (rc)
                return rc;
        mr_place(mr, addr, len, iova, access);
        *out = mr;
        return 0;
}

static bool slot_is_live(const struct dw_mr_table *t, const struct dw_mr *mr)
{
        if (!t || !t->slots || !mr || mr <= t->slots || mr > t->slots + t->max)
                return false;
        if ((size_t)((const char *)mr - (const char *)t->slots) % sizeof(*mr) != 0)
                return false;
        return mr->in_use;
}

static bool mr_is_registered(const struct dw_mr_table *t, const struct dw_mr *mr)
{
        return slot_is_live(t, mr) && mr->kind == DW_STAG_MR;
}

static bool is_window(const struct dw_mr *mr)
{
        return mr->kind == DW_STAG_MW1 || mr->kind == DW_STAG_MW2;
}

int dw_mr_rereg(struct dw_mr_table *t, struct dw_mr *mr, int flags, struct dw_pd *pd, void *addr,
                size_t len, uint64_t iova, int access)
{
        const int known = DW_MR_REREG_TRANSLATION | DW_MR_REREG_PD | DW_MR_REREG_ACCESS;
        if (!mr_is_registered(t, mr) || !flags || (flags & ~known))
                return -EINVAL;
        if ((flags & DW_MR_REREG_PD) && !pd)
                return -EINVAL;
        /* Bound windows name this region's bounds, PD and memory. */
        if (mr->nbound)
                return -EBUSY;
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

/* Returns a slot to the free list (the tail: reused as late as possible). */
static void slot_free(struct dw_mr_table *t, struct dw_mr *mr)
{
        uint32_t idx = (uint32_t)(mr - t->slots);

        dw_pd_put(mr->pd);
        hash_remove(t, hash_pos(t, dw_stag_index(mr->stag)));
        /* Keep mr->stag: the next registration of this slot must not reuse
         * it. */
        mr->in_use = false;
        mr->valid = false;
        mr->pd = NULL;
        mr->addr = NULL;
        mr->length = 0;
        mr->iova = 0;
        mr->access = 0;
        mr->kind = DW_STAG_MR;
        mr->nbound = 0;
        mr->parent = 0;
        mr->qpn = 0;
        mr->next_free = 0;
        if (t->free_tail)
                t->slots[t->free_tail].next_free = idx;
        else
                t->free_head = idx;
        t->free_tail = idx;
        t->count--;
}

int dw_mr_deregister(struct dw_mr_table *t, struct dw_mr *mr)
{
        if (!mr_is_registered(t, mr))
                return -EINVAL;
        /* Decision (mem/README.md): refused while windows are bound, as
         * hardware refuses it; the program unbinds, invalidates or frees
         * them first. */
        if (mr->nbound)
                return -EBUSY;
        slot_free(t, mr);
        return 0;
}

/* The live slot whose handle is that of stag (any key), or NULL. */
static struct dw_mr *slot_of_handle(struct dw_mr_table *t, uint32_t stag)
{
        uint32_t h = dw_stag_index(stag);
        if (!t || !t->slots || !t->hash || h == 0)
                return NULL;
        uint32_t s = t->hash[hash_pos(t, h)];
        return s && t->slots[s].in_use ? &t->slots[s] : NULL;
}

struct dw_mr *dw_mr_lookup(struct dw_mr_table *t, uint32_t stag)
{
        struct dw_mr *mr = slot_of_handle(t, stag);
        return mr && mr->stag == stag ? mr : NULL;
}

/* TO wrap and bounds of [to, to+len) against a region or bound window; on
 * success the host address of byte TO. */
static enum dw_prot_status check_range(const struct dw_mr *mr, uint64_t to, uint64_t len,
                                       uint8_t **host_addr)
{
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

/* A window's region: live, still a region, and not invalidated. While a
 * window is bound its region can be neither deregistered nor re-registered
 * (-EBUSY), but it can be invalidated. */
static const struct dw_mr *window_parent(struct dw_mr_table *t, const struct dw_mr *mw)
{
        const struct dw_mr *p = dw_mr_lookup(t, mw->parent);
        return p && p->kind == DW_STAG_MR && p->valid ? p : NULL;
}

/* Shared by the remote and local checks. */
static enum dw_prot_status check(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd,
                                 bool remote, uint32_t qpn, int needed_access, uint64_t to,
                                 uint64_t len, uint8_t **host_addr)
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
        if (is_window(mr)) {
                /* A window grants remote access only (its STag is no lkey). */
                if (!remote)
                        return DW_PROT_INVALID_STAG;
                if (!mr->valid)
                        return DW_PROT_INVALIDATED;
                if (mr->pd != pd || (mr->kind == DW_STAG_MW2 && mr->qpn != qpn))
                        return DW_PROT_PD_MISMATCH;
                if ((mr->access & needed_access) != needed_access)
                        return DW_PROT_ACCESS;
                if (!window_parent(t, mr))
                        return DW_PROT_INVALIDATED;
                return check_range(mr, to, len, host_addr);
        }
        if (!mr->valid)
                return DW_PROT_INVALIDATED;
        if (mr->pd != pd)
                return DW_PROT_PD_MISMATCH;
        if ((mr->access & needed_access) != needed_access)
                return DW_PROT_ACCESS;
        return check_range(mr, to, len, host_addr);
}

/* dw_mr_check_remote / dw_mr_check_local (mr.h) test the common case inline
 * and come here for everything else. */
enum dw_prot_status dw_mr_check_full(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd,
                                     bool remote, uint32_t qpn, int needed_access, uint64_t to,
                                     uint64_t len, uint8_t **host_addr)
{
        return check(t, stag, pd, remote, qpn, needed_access, to, len, host_addr);
}

/* A bound window leaves its region (unbind, invalidation, dealloc). */
static void window_unbind(struct dw_mr_table *t, struct dw_mr *mw)
{
        if (!mw->valid)
                return;
        struct dw_mr *p = dw_mr_lookup(t, mw->parent);
        if (p && p->kind == DW_STAG_MR && p->nbound)
                p->nbound--;
        if (mw->kind == DW_STAG_MW2 && t->mw2_bound)
                t->mw2_bound--;
        mw->valid = false;
        mw->parent = 0;
        mw->qpn = 0;
        mw->addr = NULL;
        mw->length = 0;
        mw->iova = 0;
        mw->access = 0;
}

enum dw_prot_status dw_mr_invalidate_check(struct dw_mr_table *t, uint32_t stag,
                                           const struct dw_pd *pd, uint32_t qpn)
{
        struct dw_mr *mr = dw_mr_lookup(t, stag);

        if (!mr)
                return DW_PROT_INVALID_STAG;
        /* A type 1 window is unbound by a zero-length bind, never by an
         * invalidation (RFC 5040 §6.10: "STag cannot be invalidated"). */
        if (mr->kind == DW_STAG_MW1)
                return DW_PROT_NOT_INVALIDATABLE;
        if (!mr->valid)
                return DW_PROT_INVALIDATED;
        /* RFC 5040: the STag must belong to the PD of the stream that
         * carries the Send with Invalidate (or of the QP posting the Local
         * Invalidate); otherwise nothing changes. A type 2 window belongs to
         * the one QP it was bound on. */
        if (mr->pd != pd || (mr->kind == DW_STAG_MW2 && mr->qpn != qpn))
                return DW_PROT_PD_MISMATCH;
        return DW_PROT_OK;
}

enum dw_prot_status dw_mr_invalidate_status(struct dw_mr_table *t, uint32_t stag,
                                            const struct dw_pd *pd, uint32_t qpn)
{
        enum dw_prot_status st = dw_mr_invalidate_check(t, stag, pd, qpn);

        if (st != DW_PROT_OK)
                return st;
        struct dw_mr *mr = dw_mr_lookup(t, stag);
        if (mr->kind == DW_STAG_MW2)
                window_unbind(t, mr);
        else
                mr->valid = false;
        return DW_PROT_OK;
}

int dw_mr_invalidate(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd, uint32_t qpn)
{
        switch (dw_mr_invalidate_status(t, stag, pd, qpn)) {
        case DW_PROT_OK:
                return 0;
        case DW_PROT_PD_MISMATCH:
                return -EACCES;
        case DW_PROT_NOT_INVALIDATABLE:
                return -EPERM;
        default:
                return -EINVAL;
        }
}

/* ---- memory windows ------------------------------------------------------ */

int dw_mw_alloc(struct dw_mr_table *t, struct dw_pd *pd, int kind, struct dw_mr **out)
{
        if (!t || !t->slots || !pd || !out || (kind != DW_STAG_MW1 && kind != DW_STAG_MW2))
                return -EINVAL;
        struct dw_mr *mw;
        int rc = slot_take(t, pd, (uint8_t)kind, &mw);
        if (rc)
                return rc;
        mw->valid = false; /* not bound */
        mw->addr = NULL;
        mw->length = 0;
        mw->iova = 0;
        mw->access = 0;
        *out = mw;
        return 0;
}

int dw_mw_dealloc(struct dw_mr_table *t, struct dw_mr *mw)
{
        if (!slot_is_live(t, mw) || !is_window(mw))
                return -EINVAL;
        window_unbind(t, mw);
        slot_free(t, mw);
        return 0;
}

#define DW_MW_ACCESS_KNOWN                                                                         \
        (DIWARP_ACCESS_LOCAL_WRITE | DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_READ |      \
         DIWARP_ACCESS_REMOTE_ATOMIC | DIWARP_ACCESS_ZERO_BASED)

static int bind_fail(const char **why, const char *reason, int err)
{
        if (why)
                *why = reason;
        return err;
}

int dw_mw_bind(struct dw_mr_table *t, int kind, const struct dw_pd *pd, uint32_t qpn,
               const struct dw_mw_bind *b, const char **why)
{
        if (!t || !t->slots || !b)
                return bind_fail(why, "bad arguments", -EINVAL);
        struct dw_mr *mw = slot_of_handle(t, b->new_stag);
        if (!mw)
                return bind_fail(why, "no such window", -EINVAL);
        if (mw->kind != kind)
                return bind_fail(why,
                                 mw->in_use && is_window(mw) ? "window of the other type"
                                                             : "no such window",
                                 -EINVAL);
        if (mw->pd != pd)
                return bind_fail(why, "window of another protection domain", -EACCES);
        if (dw_stag_key(b->new_stag) == dw_stag_key(mw->stag))
                return bind_fail(why, "new key equals the window's current key", -EINVAL);
        if (kind == DW_STAG_MW2 && mw->valid)
                return bind_fail(why, "type 2 window still bound (invalidate it first)", -EBUSY);

        if (b->length == 0) {
                window_unbind(t, mw);
                mw->stag = b->new_stag;
                return 0;
        }

        struct dw_mr *mr = dw_mr_lookup(t, b->mr_stag);
        if (!mr || mr->kind != DW_STAG_MR)
                return bind_fail(why, "no such region", -EINVAL);
        if (!mr->valid)
                return bind_fail(why, "region invalidated", -EINVAL);
        if (mr->pd != pd)
                return bind_fail(why, "region of another protection domain", -EACCES);
        if (!(mr->access & DIWARP_ACCESS_MW_BIND))
                return bind_fail(why, "region registered without MW_BIND", -EACCES);
        if (b->access & ~DW_MW_ACCESS_KNOWN)
                return bind_fail(why, "unknown window access bits", -EINVAL);
        if ((b->access & (DIWARP_ACCESS_REMOTE_WRITE | DIWARP_ACCESS_REMOTE_ATOMIC)) &&
            !(mr->access & DIWARP_ACCESS_LOCAL_WRITE))
                return bind_fail(why, "remote write or atomic on a region without LOCAL_WRITE",
                                 -EACCES);
        if (b->addr < mr->iova || b->addr - mr->iova > mr->length ||
            b->length > mr->length - (b->addr - mr->iova))
                return bind_fail(why, "range outside the region", -EINVAL);

        window_unbind(t, mw); /* a bound type 1 window moves */
        uint64_t off = b->addr - mr->iova;
        mw->addr = mr->addr + off;
        mw->length = (size_t)b->length;
        mw->iova = (b->access & DIWARP_ACCESS_ZERO_BASED) ? 0 : b->addr;
        mw->access = b->access & ~DIWARP_ACCESS_LOCAL_WRITE;
        mw->parent = mr->stag;
        mw->qpn = kind == DW_STAG_MW2 ? qpn : 0;
        mw->valid = true;
        mw->stag = b->new_stag;
        mr->nbound++;
        if (kind == DW_STAG_MW2)
                t->mw2_bound++;
        return 0;
}

void dw_mw_qp_gone(struct dw_mr_table *t, uint32_t qpn)
{
        if (!t || !t->slots || !t->mw2_bound)
                return;
        for (uint32_t i = 1; i <= t->max && t->mw2_bound; i++) {
                struct dw_mr *mw = &t->slots[i];
                if (mw->in_use && mw->kind == DW_STAG_MW2 && mw->valid && mw->qpn == qpn)
                        window_unbind(t, mw);
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
