/* In-flight limits (inline token throttling): caps on the messages one QP, one process
 * and the whole host (every diwarp process of the user) have on the wire at
 * once, a message being in flight from its posting to the wire until its
 * completion. README.md has the model, the shared-memory layout, the recovery
 * argument and how a transport drives it.
 *
 * Not thread-safe per process: the calls on one struct dw_inflight_proc (and
 * its QPs) are serialized by the caller (the device lock). Processes, and
 * several dw_inflight_proc of one process, share a host pool safely. */
#ifndef DW_FLOW_INFLIGHT_H
#define DW_FLOW_INFLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DW_INFLIGHT_SLOTS   1024     /* processes that can share one host pool */
#define DW_INFLIGHT_MAX_CAP 1000000u /* the largest cap at any level */
/* A waiting process's ticket asks for at most capacity / DW_INFLIGHT_TICKET_SHARE
 * tokens (at least 1), so one large backlog cannot hold the head of the line
 * until it has the whole pool: it takes its share and queues again. */
#define DW_INFLIGHT_TICKET_SHARE 4
/* Dead processes are looked for (one fcntl per slot in use) at most this often
 * host-wide, and only while a request waits: their tokens return within it. */
#define DW_INFLIGHT_REAP_NS 100000000ull
/* A process probes a lock holder that does not let go at most this often. */
#define DW_INFLIGHT_PROBE_NS 1000000ull
/* open and close wait at most this long for the pool's locks. */
#define DW_INFLIGHT_WAIT_NS  2000000000ull
#define DW_INFLIGHT_NAME_MAX 128 /* shm name with its '/' and NUL */

struct dw_inflight_params {
        uint32_t host_cap;    /* tokens in the host pool; 0 = no pool, nothing is opened */
        uint32_t proc_cap;    /* messages in flight in this process; 0 = no cap */
        const char *shm_name; /* "/name"; NULL or "" = "/diwarp-inflight-<euid>" */
};

/* The per-QP level; the caller embeds it in its QP. */
struct dw_inflight_qp {
        uint32_t cap;      /* 0 = no cap */
        uint32_t inflight; /* admitted, not yet completed */
};

/* The process level and this process's place in the host pool. The caller
 * owns the memory (no global state in the library); the fields are private to
 * inflight.c: read them through dw_inflight_get_counters. */
struct dw_inflight_proc {
        uint32_t proc_cap;
        uint32_t inflight;           /* admitted by dw_inflight_admit, not completed */
        struct dw_inflight_shm *shm; /* NULL: no host pool */
        int fd;                      /* the shm object, to probe and adopt others' slots */
        uint32_t slot;               /* our slot in shm->slot[] */
        uint64_t lockword;           /* what we write into shm->lock: gen << 32 | slot + 1 */
        uint32_t held;               /* host tokens collected and not released */
        uint32_t deferred_release;   /* released while the pool lock was busy */
        bool deferred_cancel;        /* cancel asked while the pool lock was busy */
        uint64_t next_probe_ns;      /* rate limit of lock-holder probes */
        uint64_t grants, waits, reclaimed, busy, qp_capped, proc_capped;
        char name[DW_INFLIGHT_NAME_MAX]; /* the pool's shm name */
};

struct dw_inflight_counters {
        /* This process. */
        uint64_t grants;      /* host tokens granted */
        uint64_t waits;       /* requests that got fewer tokens than asked (each took a ticket) */
        uint64_t reclaimed;   /* tokens this process took back from dead processes */
        uint64_t busy;        /* calls that found the pool lock held by a stalled process */
        uint64_t qp_capped;   /* dw_inflight_admit calls cut short by the QP cap */
        uint64_t proc_capped; /* ... by the process cap */
        uint32_t inflight;    /* messages admitted and not completed (process level) */
        uint32_t held;        /* host tokens held: collected, not released */
        bool waiting;         /* in the host pool's line */
        /* The host pool: a snapshot read without its lock; zero without a pool. */
        uint32_t capacity;
        uint32_t queue_len;      /* processes waiting in line */
        int64_t pool_free;       /* tokens nobody holds */
        uint64_t pool_reclaimed; /* tokens taken back from dead processes, since creation */
        uint64_t pool_reaped;    /* dead processes cleaned up, since creation */
        uint64_t pool_repairs;   /* pool locks taken over from a dead holder */
};

/* Sets up *p. With prm->host_cap != 0, opens (creating it if needed) the host
 * pool and takes a slot in it; may wait up to DW_INFLIGHT_WAIT_NS for a process
 * that is opening or closing the pool at the same time. Returns 0, or a
 * negative errno with a reason in why[whylen] (why may be NULL):
 *   -EINVAL  a cap above DW_INFLIGHT_MAX_CAP, or a bad shm name;
 *   -EPERM   the shm object belongs to another user or others may write it;
 *   -EPROTO  the object is not a diwarp in-flight pool of this layout version
 *            (bad magic, version, geometry or size): it is refused, never
 *            trusted or overwritten;
 *   -EBUSY   the pool has another capacity and live processes use it (a pool
 *            nobody uses takes the new capacity);
 *   -ENOSPC  all DW_INFLIGHT_SLOTS slots are taken by live processes;
 *   -ETIMEDOUT a live process held the pool's locks too long;
 *   other    from shm_open, fstat, ftruncate, mmap, fcntl. */
int dw_inflight_open(struct dw_inflight_proc *p, const struct dw_inflight_params *prm, char *why,
                     size_t whylen);

/* Gives back every host token the process holds or was granted, leaves the
 * line, frees the slot, unmaps. Always succeeds: if the pool lock stays held
 * by a live process, the slot is left to the others' reaping, as if we died. */
void dw_inflight_close(struct dw_inflight_proc *p);

/* In a child after fork (and only there): drops the inherited descriptor
 * without touching the pool; the mapping was not inherited. The slot stays the
 * parent's, and the child may open its own. */
void dw_inflight_forget(struct dw_inflight_proc *p);

static inline void dw_inflight_qp_init(struct dw_inflight_qp *q, uint32_t cap)
{
        q->cap = cap;
        q->inflight = 0;
}

/* How many of want messages the QP cap lets through now. */
static inline uint32_t dw_inflight_qp_room(const struct dw_inflight_qp *q, uint32_t want)
{
        uint32_t room;

        if (!q->cap)
                return want;
        room = q->inflight < q->cap ? q->cap - q->inflight : 0;
        return want < room ? want : room;
}

/* Admits up to want messages of QP q (q may be NULL: no QP cap). Checks the QP
 * cap, then the process cap, and only then asks the host pool for what both
 * allow, so a refusal at a lower level never takes a host token. Returns the
 * number admitted now (0..want) or a negative errno from the host pool
 * (-EOWNERDEAD). Never blocks; a shortfall at the host level leaves the
 * process in line (see dw_inflight_host_acquire). */
int dw_inflight_admit(struct dw_inflight_proc *p, struct dw_inflight_qp *q, uint32_t want,
                      uint64_t now_ns);

/* n admitted messages of q completed (successfully or not): returns their
 * tokens at every level (the host's maybe deferred: see dw_inflight_poll).
 * Returns 0, -EINVAL if q or the process has fewer in flight (nothing
 * changes), or -EOWNERDEAD. */
int dw_inflight_complete(struct dw_inflight_proc *p, struct dw_inflight_qp *q, uint32_t n);

/* The host level alone. Grants up to want tokens now, first what the line
 * handed this process while it waited, then from the pool while nobody waits.
 * A shortfall takes a ticket for it (at most a share of the pool; later
 * requests queue behind it) and the caller retries later, e.g. from its
 * progress loop: each retry collects what the line handed over meanwhile.
 * A short request may scan for dead processes (at most every
 * DW_INFLIGHT_REAP_NS host-wide). Without a pool it grants want. Returns the
 * tokens granted (0 also when the pool lock is held by a stalled process) or
 * -EOWNERDEAD when the pool no longer knows our slot (someone wrote into the
 * shared memory): the process must stop using the pool. No allocation; no
 * syscall unless the request waits or the pool lock stays held. */
int dw_inflight_host_acquire(struct dw_inflight_proc *p, uint32_t want, uint64_t now_ns);

/* Returns n host tokens. If the pool lock is busy they are returned by the
 * next call that gets it (dw_inflight_poll at the latest). Returns 0, 1 when
 * deferred so (as dw_inflight_poll), -EINVAL if n exceeds what the process
 * holds, or -EOWNERDEAD. */
int dw_inflight_host_release(struct dw_inflight_proc *p, uint32_t n);

/* Leaves the line and gives back tokens granted but not yet collected. Call
 * it when nothing waits for admission any more (cheap when not in line).
 * Returns as dw_inflight_poll. */
int dw_inflight_cancel(struct dw_inflight_proc *p);

/* Once per progress step: applies releases and cancels deferred by a busy pool
 * lock. Nothing (no atomic) when there are none. Returns 0 when nothing is
 * left deferred, 1 while something is (the pool lock is still busy: do not
 * sleep long), or -EOWNERDEAD. */
int dw_inflight_poll(struct dw_inflight_proc *p, uint64_t now_ns);

/* True while the process holds a ticket in the host pool's line. */
bool dw_inflight_waiting(const struct dw_inflight_proc *p);

/* Scans for dead processes now, whatever the rate limit (may wait for the pool
 * lock up to DW_INFLIGHT_WAIT_NS). Returns the tokens taken back. */
int dw_inflight_reap(struct dw_inflight_proc *p);

void dw_inflight_get_counters(const struct dw_inflight_proc *p, struct dw_inflight_counters *c);

/* Removes the pool's name (NULL = the per-user default) from /dev/shm, for
 * tests and tools; processes that have it open keep using the old object.
 * Returns 0 or a negative errno. */
int dw_inflight_unlink(const char *shm_name);

/* ---- Shared-memory layout, version 1 (README.md: "Shared memory") ---------- */

#define DW_INFLIGHT_MAGIC     0x4649505241574944ull /* "DIWARPIF" in file order */
#define DW_INFLIGHT_VERSION   1
#define DW_INFLIGHT_HDR_SIZE  256
#define DW_INFLIGHT_SLOT_SIZE 64
#define DW_INFLIGHT_SHM_SIZE  (DW_INFLIGHT_HDR_SIZE + DW_INFLIGHT_SLOTS * DW_INFLIGHT_SLOT_SIZE)
#define DW_INFLIGHT_NONE      0xffffffffu /* no slot (end of the line) */
#define DW_INFLIGHT_SLOT_FREE 0
#define DW_INFLIGHT_SLOT_USED 1

/* One process's record; byte DW_INFLIGHT_HDR_SIZE + i * DW_INFLIGHT_SLOT_SIZE
 * of the file (the first byte of slot i) carries its owner's OFD lock. */
struct dw_inflight_slot {
        uint32_t state;   /* DW_INFLIGHT_SLOT_FREE or _USED */
        uint32_t gen;     /* incremented at every claim: each owner is a new incarnation */
        uint32_t pid;     /* the owner, for diagnostics only: liveness is the OFD lock */
        uint32_t inuse;   /* tokens the owner collected and has not returned */
        uint32_t granted; /* tokens the line handed over, not yet collected */
        uint32_t need;    /* tokens the line still owes it */
        uint32_t next;    /* next slot in the line, or DW_INFLIGHT_NONE */
        uint32_t pad;
        uint64_t ticket; /* place in line (smaller = earlier); 0 = not in line */
        uint8_t reserved[24];
};

struct dw_inflight_shm {
        /* Bytes 0..63: written once at creation, magic last. Byte 0 carries
         * the OFD lock that serializes creation, attach and detach. */
        uint64_t magic;
        uint32_t version;
        uint32_t hdr_size;  /* DW_INFLIGHT_HDR_SIZE */
        uint32_t slot_size; /* DW_INFLIGHT_SLOT_SIZE */
        uint32_t nslots;    /* DW_INFLIGHT_SLOTS */
        uint32_t capacity;  /* the host cap, in tokens */
        uint8_t pad0[36];
        /* Bytes 64..127: the pool, changed only under lock. */
        uint64_t lock;        /* 0, or the holder's gen << 32 | slot + 1 */
        int64_t free;         /* capacity - sum of (inuse + granted) over the slots */
        uint64_t next_ticket; /* the next ticket handed out; starts at 1 */
        uint32_t qhead;       /* the line: first and last slot, or DW_INFLIGHT_NONE */
        uint32_t qtail;
        uint32_t qlen;
        uint8_t pad1[28];
        /* Bytes 128..191: statistics and the reap clock. */
        uint64_t last_reap_ns; /* CLOCK_MONOTONIC of the last scan for dead slots */
        uint64_t reclaimed;
        uint64_t reaped;
        uint64_t repairs;
        uint8_t pad2[32];
        uint8_t reserved[64];
        struct dw_inflight_slot slot[DW_INFLIGHT_SLOTS];
};

#endif
