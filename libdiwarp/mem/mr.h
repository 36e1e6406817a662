/* mem/: protection domains, the MR / STag table, access checks, invalidation.
 *
 * Registration is bookkeeping only (mem/README.md): data moves through socket
 * syscalls on virtual addresses, so nothing is pinned. An STag (= lkey = rkey)
 * is a 24-bit handle << 8 | an 8-bit key, all 32 bits random (getrandom()),
 * drawn at each registration; the handle names a slot of the table through
 * a small hash, so neither the order of registrations nor the slot shows in
 * it. A stale STag (deregistered) or a guessed one fails the check: a blind
 * guess hits one of n live STags with probability n / 2^32. STag 0 is never
 * valid (handle 0 is never handed out).
 *
 * Locking: nothing here takes a lock. The caller holds the device lock.
 * Hot path: the check functions never allocate, log, or make a syscall
 * (one hash probe finds the common case); dw_mr_register makes a
 * getrandom() call every 16 registrations.
 */
#ifndef DIWARP_MEM_MR_H
#define DIWARP_MEM_MR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

struct dw_device;

/* A protection domain. The engine embeds it in its diwarp_pd object; mem/
 * only counts its users (MRs here; QPs, SRQs and AHs through dw_pd_get/put)
 * so that dealloc can refuse with -EBUSY. */
struct dw_pd {
        struct dw_device *dev;
        uint32_t handle; /* unique per table, never 0; for logs */
        int use_count;
};

/* What an STag names. A memory window (RFC 5040 §2.1, the verbs' MW) is a
 * slot of the same table: its own STag, rights and bounds, a subrange of a
 * registered region (its parent) that it is bound to. */
enum dw_stag_kind {
        DW_STAG_MR = 0,  /* registered region */
        DW_STAG_MW1 = 1, /* window type 1: bound by diwarp_mw_bind, never invalidated */
        DW_STAG_MW2 = 2, /* window type 2: bound by a WR on one QP, invalidated by Local
                          * Invalidate or a remote Send with Invalidate */
};

/* One registered region or memory window. Lives inside the table (no
 * allocation per registration); the pointer stays stable until
 * dw_mr_deregister / dw_mw_dealloc. For a window, addr/length/iova/access
 * describe the bound range and its rights, and valid means "bound". */
struct dw_mr {
        uint32_t stag; /* = lkey = rkey (a window's STag is an rkey only) */
        struct dw_pd *pd;
        uint8_t *addr; /* host address of byte 0 */
        size_t length; /* bytes */
        uint64_t iova; /* TO of byte 0 (0 with DIWARP_ACCESS_ZERO_BASED) */
        int access;    /* enum diwarp_access_flags */
        bool valid;    /* region: false once invalidated; window: bound */
        uint8_t kind;  /* enum dw_stag_kind */
        /* private to mem/ */
        bool in_use; /* slot registered (valid or invalidated); its handle
                      * (stag >> 8) is in the table's hash meanwhile */
        uint32_t next_free;
        uint32_t nbound; /* region: windows bound to it */
        uint32_t parent; /* window: STag of the region it is bound to */
        uint32_t qpn;    /* type 2 window: the QP it was bound on (the only one it serves) */
};

/* Random STags drawn ahead, one getrandom() call for this many. */
#define DW_MR_RANDOM_POOL 16

struct dw_mr_table {
        struct dw_mr *slots; /* [max + 1]; slot 0 unused so STag 0 never matches */
        uint32_t max;        /* usable slots: indices 1..max */
        /* handle (STag >> 8) -> slot index, open addressing with linear
         * probing on the handle's low bits (random, so evenly spread), 0 =
         * empty; a power of two >= 2 * max entries, so probes stay short. */
        uint32_t *hash;
        uint32_t hmask;
        /* STags from getrandom() not handed out yet: pool[0..npool). */
        uint32_t pool[DW_MR_RANDOM_POOL];
        uint32_t npool;
        uint32_t count;     /* registered */
        uint32_t free_head; /* index of the first free slot, 0 = none */
        uint32_t free_tail;
        uint32_t next_pd_handle;
        uint32_t mw2_bound; /* type 2 windows bound (dw_mw_qp_gone scans only if any) */
};

/* Largest handle (24 bits, 0 reserved), and largest table: at most a
 * quarter of the handles live, so a fresh draw is free at once. */
#define DW_MR_MAX_INDEX 0xffffffu
#define DW_MR_MAX_SLOTS (1u << 22)

/* The handle of an STag: its 24 random high bits (a window keeps its handle
 * across binds; only the key changes). */
static inline uint32_t dw_stag_index(uint32_t stag)
{
        return stag >> 8;
}

static inline uint8_t dw_stag_key(uint32_t stag)
{
        return (uint8_t)stag;
}

/* max: number of MRs and windows (1..DW_MR_MAX_SLOTS). -EINVAL, -ENOMEM. */
int dw_mr_table_init(struct dw_mr_table *t, uint32_t max);
void dw_mr_table_destroy(struct dw_mr_table *t);

/* PD bookkeeping. dw_pd_init gives the PD a unique handle from the table.
 * dw_pd_fini returns -EBUSY while use_count > 0 (then nothing changes). */
void dw_pd_init(struct dw_mr_table *t, struct dw_pd *pd, struct dw_device *dev);
int dw_pd_fini(struct dw_pd *pd);
void dw_pd_get(struct dw_pd *pd);
void dw_pd_put(struct dw_pd *pd);

/* Registers [addr, addr+len) for pd. iova is the TO of byte 0 as remote peers
 * name it (the caller passes (uintptr_t)addr for plain ibv_reg_mr); with
 * DIWARP_ACCESS_ZERO_BASED the iova argument is ignored and TOs start at 0.
 * As in ibverbs, REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE is -EINVAL.
 * len may be 0. -EINVAL (bad arguments, addr+len or iova+len wraps, unknown
 * access bits), -ENOMEM (table full), -EIO (no randomness). */
int dw_mr_register(struct dw_mr_table *t, struct dw_pd *pd, void *addr, size_t len, uint64_t iova,
                   int access, struct dw_mr **out);
/* -EINVAL if mr is not a registered region of t; -EBUSY while windows are
 * bound to it (as hardware answers): nothing changes. The STag is dead at
 * once. */
int dw_mr_deregister(struct dw_mr_table *t, struct dw_mr *mr);

/* What dw_mr_rereg changes (the values of ibverbs' IBV_REREG_MR_CHANGE_*). */
enum {
        DW_MR_REREG_TRANSLATION = 1 << 0, /* addr, len, iova */
        DW_MR_REREG_PD = 1 << 1,
        DW_MR_REREG_ACCESS = 1 << 2,
};

/* Re-registers a registered region in place: the parts flags names take the
 * new values (checked as dw_mr_register checks them), the rest stay; the
 * STag stays, so every key a peer holds keeps naming the region, now with
 * its new bounds, PD and rights. An invalidated region becomes valid again
 * (a fresh registration). -EINVAL (not a registered region of t, flags 0 or
 * unknown, or a new value dw_mr_register would refuse), -EBUSY (windows are
 * bound to it): nothing changes. */
int dw_mr_rereg(struct dw_mr_table *t, struct dw_mr *mr, int flags, struct dw_pd *pd, void *addr,
                size_t len, uint64_t iova, int access);

/* Result of an access check. Values are stable (they may appear in logs). */
enum dw_prot_status {
        DW_PROT_OK = 0,
        DW_PROT_INVALID_STAG,      /* index out of range, slot free, key mismatch, STag 0 */
        DW_PROT_PD_MISMATCH,       /* registered for another PD ("not associated with stream") */
        DW_PROT_ACCESS,            /* a needed access right was not granted */
        DW_PROT_BOUNDS,            /* [TO, TO+len) not inside the region */
        DW_PROT_INVALIDATED,       /* valid index and key, but invalidated */
        DW_PROT_TO_WRAP,           /* TO + len wraps past 2^64 */
        DW_PROT_NOT_INVALIDATABLE, /* invalidate only: this STag cannot be invalidated */
};

/* The full check (every rule, in the documented order); the inline checks
 * below call it whenever their fast test does not pass. remote: a tagged
 * access from the peer (windows allowed; qpn is the QP it arrived on) rather
 * than a local lkey (regions only). */
enum dw_prot_status dw_mr_check_full(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd,
                                     bool remote, uint32_t qpn, int needed_access, uint64_t to,
                                     uint64_t len, uint8_t **host_addr);

/* Fast test of the common case, inline on the data path (one per SGE and per
 * placed segment): a live, valid registered region of pd with the rights,
 * and [to, to+len) inside it. Anything else, windows and zero length
 * included, takes the full check, which also decides which failure to
 * report. In bounds implies no TO wrap (registration refuses an iova +
 * length that wraps). */
static inline enum dw_prot_status dw_mr_check_inline(struct dw_mr_table *t, uint32_t stag,
                                                     const struct dw_pd *pd, bool remote,
                                                     uint32_t qpn, int needed_access, uint64_t to,
                                                     uint64_t len, uint8_t **host_addr)
{
        /* The slot the handle's first hash probe names: the handle's own
         * slot unless another handle sat there first (then the full check
         * probes on). An empty entry names slot 0, never in use. */
        if (__builtin_expect(len != 0 && t->hash, 1)) {
                const struct dw_mr *mr = &t->slots[t->hash[dw_stag_index(stag) & t->hmask]];
                uint64_t off = to - mr->iova;
                if (__builtin_expect(
                        mr->stag == stag && mr->in_use && mr->valid && mr->kind == DW_STAG_MR &&
                            mr->pd == pd && (mr->access & needed_access) == needed_access &&
                            to >= mr->iova && off <= mr->length && len <= mr->length - off,
                        1)) {
                        if (host_addr)
                                *host_addr = mr->addr + off;
                        return DW_PROT_OK;
                }
        }
        return dw_mr_check_full(t, stag, pd, remote, qpn, needed_access, to, len, host_addr);
}

/* Remote (tagged) access: RDMA Write / Read Response placement, RDMA Read
 * Request source, atomics. needed_access: DIWARP_ACCESS_REMOTE_{READ,WRITE,
 * ATOMIC} bits. to is the TO from the wire (iova-based, or 0-based with
 * ZERO_BASED). On DW_PROT_OK *host_addr (if non-NULL) is the host address of
 * byte TO.
 * A zero-length access is always DW_PROT_OK with *host_addr = NULL and no
 * STag check at all: it touches no memory (RFC 5040 allows zero-length RDMA
 * Read/Write, and peers send them with junk STags, e.g. STag 0).
 * TO wrap: to + len > 2^64 - 1 (the end is not representable).
 * The STag may name a region or a bound window; qpn is the QP the access
 * arrived on (a type 2 window serves only the QP it was bound on).
 * Order of checks (first failure wins): STag, invalidated (a window: not
 * bound), PD (a type 2 window: also its QP), access, a window's parent
 * region (still valid), TO wrap, bounds. */
static inline enum dw_prot_status dw_mr_check_remote(struct dw_mr_table *t, uint32_t stag,
                                                     const struct dw_pd *pd, uint32_t qpn,
                                                     int needed_access, uint64_t to, uint64_t len,
                                                     uint8_t **host_addr)
{
        return dw_mr_check_inline(t, stag, pd, true, qpn, needed_access, to, len, host_addr);
}
/* Local (lkey) access for an SGE. needed_access: DIWARP_ACCESS_LOCAL_WRITE for
 * receive buffers and RDMA Read / atomic sinks; 0 for send sources (any
 * registration may be read locally). addr is the SGE address, iova-based as in
 * ibverbs (0-based for ZERO_BASED MRs). Same zero-length rule. A window's
 * STag is never an lkey (DW_PROT_INVALID_STAG). */
static inline enum dw_prot_status dw_mr_check_local(struct dw_mr_table *t, uint32_t lkey,
                                                    const struct dw_pd *pd, int needed_access,
                                                    uint64_t addr, uint64_t len,
                                                    uint8_t **host_addr)
{
        return dw_mr_check_inline(t, lkey, pd, false, 0, needed_access, addr, len, host_addr);
}

/* Invalidates an STag (Local Invalidate; Send with Invalidate at the Data
 * Sink, RFC 5040 §6.10) for a QP of pd numbered qpn. Any MR of pd may be
 * invalidated (decision: see mem/README.md); afterwards every access and a
 * second invalidate fail until the MR is deregistered. A type 2 window bound
 * on that QP becomes unbound (its parent's window count drops) until it is
 * bound again with a new key; a type 1 window is never invalidated. Returns
 * the status: OK, INVALID_STAG, NOT_INVALIDATABLE (type 1 window),
 * INVALIDATED (already invalid, or a window not bound), PD_MISMATCH (another
 * PD, or a type 2 window bound on another QP); nothing changes on failure. */
enum dw_prot_status dw_mr_invalidate_status(struct dw_mr_table *t, uint32_t stag,
                                            const struct dw_pd *pd, uint32_t qpn);
/* The status dw_mr_invalidate_status would give now, changing nothing. */
enum dw_prot_status dw_mr_invalidate_check(struct dw_mr_table *t, uint32_t stag,
                                           const struct dw_pd *pd, uint32_t qpn);
/* Same, as an errno: 0, -EINVAL (no such STag, or already invalidated),
 * -EACCES (another PD or QP), -EPERM (type 1 window). */
int dw_mr_invalidate(struct dw_mr_table *t, uint32_t stag, const struct dw_pd *pd, uint32_t qpn);

/* ---- memory windows --------------------------------------------------- */

/* Allocates an unbound window of pd; kind DW_STAG_MW1 or DW_STAG_MW2. Its
 * STag (index and a random key) fails every access until it is bound.
 * -EINVAL (bad kind), -ENOMEM (table full), -EIO (no randomness). */
int dw_mw_alloc(struct dw_mr_table *t, struct dw_pd *pd, int kind, struct dw_mr **out);
/* Frees a window, bound or not (a bound one leaves its parent region
 * first); its STag dies at once. -EINVAL if mw is not a window of t. */
int dw_mw_dealloc(struct dw_mr_table *t, struct dw_mr *mw);

/* One bind (RFC 5040's Bind Memory Window; the verbs' ibv_bind_mw or a
 * BIND_MW work request). */
struct dw_mw_bind {
        uint32_t new_stag; /* the window's handle << 8 | the key it takes */
        uint32_t mr_stag;  /* the parent region; ignored when length is 0 */
        uint64_t addr;     /* first TO of the window, in the region's TO space */
        uint64_t length;   /* 0: unbind */
        int access;        /* REMOTE_READ/WRITE/ATOMIC, LOCAL_WRITE (ignored), ZERO_BASED */
};

/* Binds (or, with length 0, unbinds) the window whose handle new_stag names,
 * for a QP of pd numbered qpn, expecting a window of kind. The window takes
 * the key of new_stag, which must differ from its current key so that every
 * STag handed out before dies; a type 2 window must not be bound already
 * (invalidate it first). The parent must be a valid registered region of pd
 * with MW_BIND, the range inside it; REMOTE_WRITE/ATOMIC need the region's
 * LOCAL_WRITE (the verbs' rule). Rebinding a bound type 1 window moves it.
 * 0, or -EINVAL / -EACCES / -EBUSY with *why (if non-NULL) a short constant
 * reason; nothing changes on failure. */
int dw_mw_bind(struct dw_mr_table *t, int kind, const struct dw_pd *pd, uint32_t qpn,
               const struct dw_mw_bind *b, const char **why);

/* The QP numbered qpn is gone: type 2 windows bound on it become unbound
 * (a QP number may come back for a new QP). */
void dw_mw_qp_gone(struct dw_mr_table *t, uint32_t qpn);

/* Looks up a live registration by STag (key checked), valid or invalidated;
 * NULL if none. For the engine's diwarp_mr wrapper and for tests. */
struct dw_mr *dw_mr_lookup(struct dw_mr_table *t, uint32_t stag);

/* Short constant name, e.g. "invalid STag". Never NULL. */
const char *dw_prot_status_str(enum dw_prot_status st);

/* Work-completion status for a failed check, as a hardware RNIC reports it:
 * remote = the peer refused our access (it sent a Terminate) ->
 * DIWARP_WC_REM_ACCESS_ERR; local = one of our own lkeys failed ->
 * DIWARP_WC_LOC_PROT_ERR. DW_PROT_OK -> DIWARP_WC_SUCCESS. */
enum diwarp_wc_status dw_prot_status_to_wc(enum dw_prot_status st, bool remote);

#endif
