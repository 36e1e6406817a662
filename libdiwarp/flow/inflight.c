/* QP, process and host in-flight caps. The host pool's model, layout and
 * recovery argument are in README.md; the rules that make recovery work are
 * repeated where the code relies on them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* F_OFD_SETLK */
#endif
#include "flow/inflight.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/time.h"
#include "util/why.h"

_Static_assert(sizeof(struct dw_inflight_slot) == DW_INFLIGHT_SLOT_SIZE, "slot layout");
_Static_assert(offsetof(struct dw_inflight_shm, lock) == 64, "header layout");
_Static_assert(offsetof(struct dw_inflight_shm, last_reap_ns) == 128, "header layout");
_Static_assert(offsetof(struct dw_inflight_shm, slot) == DW_INFLIGHT_HDR_SIZE, "header layout");
_Static_assert(sizeof(struct dw_inflight_shm) == DW_INFLIGHT_SHM_SIZE, "pool layout");
_Static_assert(DW_INFLIGHT_MAX_CAP <= INT32_MAX, "grants are returned as int");

/* Other processes read and write these words, so every access is atomic;
 * relaxed is enough under the pool lock, whose acquire/release orders them. */
#define LD(x)    __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* The header's first line: what identifies a pool. */
#define LINE0 offsetof(struct dw_inflight_shm, lock)

/* A live holder leaves within a few hundred instructions; spinning longer only
 * burns the CPU a preempted holder needs to get out. */
#define LOCK_SPINS 128

static void sleep_ns(long ns)
{
        struct timespec ts = {0, ns};

        nanosleep(&ts, NULL);
}

/* ---- OFD locks: the kernel's word on who is alive ------------------------ */

static off_t slot_byte(uint32_t i)
{
        return (off_t)DW_INFLIGHT_HDR_SIZE + (off_t)i * DW_INFLIGHT_SLOT_SIZE;
}

/* 0 when our open file description now holds the byte (or already did);
 * -EAGAIN when another description holds it, i.e. its process is alive. */
static int ofd_trylock(int fd, off_t byte)
{
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};

        if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
                return 0;
        return errno == EACCES ? -EAGAIN : -errno;
}

static void ofd_unlock(int fd, off_t byte)
{
        struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};

        (void)fcntl(fd, F_OFD_SETLK, &fl);
}

/* ---- The line (under the pool lock) --------------------------------------- */

/* Invariant kept by every function below: a slot is in the line iff its
 * ticket is non-zero, and then its need is non-zero too. */

static void repair(struct dw_inflight_shm *s);

/* Whether the line's ends, read from the shared file, can be followed: each
 * NONE or a slot, both NONE or neither, the tail's next NONE. Anything else
 * was written by a stray process of the user (a live holder of the pool
 * lock keeps them so): the line is rebuilt from the slots' own fields
 * instead of writing through a bad index. */
static bool line_ends_sane(const struct dw_inflight_shm *s)
{
        uint32_t h = LD(s->qhead), t = LD(s->qtail);

        if (h == DW_INFLIGHT_NONE || t == DW_INFLIGHT_NONE)
                return h == t;
        return h < DW_INFLIGHT_SLOTS && t < DW_INFLIGHT_SLOTS &&
               LD(s->slot[t].next) == DW_INFLIGHT_NONE && LD(s->slot[t].ticket) != 0;
}

static void line_append(struct dw_inflight_shm *s, uint32_t i, uint32_t need)
{
        if (!line_ends_sane(s))
                repair(s);
        uint64_t t = LD(s->next_ticket);
        uint32_t tail = LD(s->qtail);

        ST(s->next_ticket, t + 1);
        ST(s->slot[i].need, need);
        ST(s->slot[i].next, DW_INFLIGHT_NONE);
        ST(s->slot[i].ticket, t);
        if (tail == DW_INFLIGHT_NONE)
                ST(s->qhead, i);
        else
                ST(s->slot[tail].next, i);
        ST(s->qtail, i);
        ST(s->qlen, LD(s->qlen) + 1);
}

/* Unlinks slot i wherever it stands (head when served, anywhere on cancel or
 * reap). The walk is bounded so a damaged list cannot loop forever. */
static void line_remove(struct dw_inflight_shm *s, uint32_t i)
{
        uint32_t prev = DW_INFLIGHT_NONE, cur = LD(s->qhead);

        ST(s->slot[i].ticket, 0);
        ST(s->slot[i].need, 0);
        for (uint32_t n = 0; cur != DW_INFLIGHT_NONE && cur != i; n++) {
                if (cur >= DW_INFLIGHT_SLOTS || n >= DW_INFLIGHT_SLOTS)
                        return;
                prev = cur;
                cur = LD(s->slot[cur].next);
        }
        if (cur != i)
                return;
        if (prev == DW_INFLIGHT_NONE)
                ST(s->qhead, LD(s->slot[i].next));
        else
                ST(s->slot[prev].next, LD(s->slot[i].next));
        if (LD(s->qtail) == i)
                ST(s->qtail, prev);
        ST(s->slot[i].next, DW_INFLIGHT_NONE);
        ST(s->qlen, LD(s->qlen) - 1);
}

/* Hands free tokens to the line in order: the head gets all its ticket asks
 * for before the next waiter gets any. Called whenever free grows, so free > 0
 * implies an empty line. */
static void serve(struct dw_inflight_shm *s)
{
        int64_t f = LD(s->free);
        uint32_t h;

        while (f > 0 && (h = LD(s->qhead)) < DW_INFLIGHT_SLOTS) {
                struct dw_inflight_slot *w = &s->slot[h];
                uint32_t need = LD(w->need);
                uint32_t g = (int64_t)need < f ? need : (uint32_t)f;

                ST(w->granted, LD(w->granted) + g);
                ST(w->need, need - g);
                f -= g;
                ST(s->free, f);
                if (need == g)
                        line_remove(s, h);
        }
}

/* ---- Recovery (under the pool lock) --------------------------------------- */

/* Takes back slot i of a dead process (the caller holds its OFD lock, or it
 * was the dead lock holder): its tokens, collected or only granted, return to
 * the pool and its ticket leaves the line. */
static void reap_slot(struct dw_inflight_proc *p, uint32_t i)
{
        struct dw_inflight_shm *s = p->shm;
        struct dw_inflight_slot *d = &s->slot[i];
        uint32_t t = LD(d->inuse) + LD(d->granted);

        line_remove(s, i);
        /* free first: if we die here, repair() recounts from the fields left. */
        ST(s->free, LD(s->free) + t);
        ST(d->inuse, 0);
        ST(d->granted, 0);
        ST(d->pid, 0);
        ST(d->state, DW_INFLIGHT_SLOT_FREE);
        ST(s->reclaimed, LD(s->reclaimed) + t);
        ST(s->reaped, LD(s->reaped) + 1);
        p->reclaimed += t;
        serve(s);
}

/* A holder died inside its critical section, which may have updated some
 * fields and not others. Each slot's own fields are always usable (README:
 * "Recovery"), so the derived state is rebuilt from them: free is recounted
 * and the line is relinked in ticket order. */
static void repair(struct dw_inflight_shm *s)
{
        uint32_t order[DW_INFLIGHT_SLOTS], n = 0;
        uint64_t held = 0, top = LD(s->next_ticket);

        for (uint32_t i = 0; i < DW_INFLIGHT_SLOTS; i++) {
                struct dw_inflight_slot *w = &s->slot[i];
                uint64_t t = LD(w->ticket);
                uint32_t k;

                held += (uint64_t)LD(w->inuse) + LD(w->granted);
                ST(w->next, DW_INFLIGHT_NONE);
                if (!t || !LD(w->need)) {
                        ST(w->ticket, 0);
                        ST(w->need, 0);
                        continue;
                }
                if (t >= top)
                        top = t + 1;
                for (k = n; k > 0 && LD(s->slot[order[k - 1]].ticket) > t; k--)
                        order[k] = order[k - 1];
                order[k] = i;
                n++;
        }
        ST(s->next_ticket, top);
        ST(s->qhead, n ? order[0] : DW_INFLIGHT_NONE);
        ST(s->qtail, n ? order[n - 1] : DW_INFLIGHT_NONE);
        for (uint32_t k = 0; k + 1 < n; k++)
                ST(s->slot[order[k]].next, order[k + 1]);
        ST(s->qlen, n);
        ST(s->free, (int64_t)LD(s->capacity) - (int64_t)held);
        ST(s->repairs, LD(s->repairs) + 1);
        serve(s);
}

/* ---- The pool lock ------------------------------------------------------- */

static bool lock_spin(struct dw_inflight_shm *s, uint64_t mine)
{
        for (int i = 0; i < LOCK_SPINS; i++) {
                uint64_t v = 0;

                if (LD(s->lock) == 0 &&
                    __atomic_compare_exchange_n(&s->lock, &v, mine, false, __ATOMIC_ACQUIRE,
                                                __ATOMIC_RELAXED))
                        return true;
                dw_cpu_relax();
        }
        return false;
}

static void pool_unlock(struct dw_inflight_shm *s)
{
        __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
}

/* The lock stays taken: if its holder is dead (nobody holds its slot byte)
 * take the lock over, repair, and reap the holder's slot. The lock word names
 * the holder's incarnation (gen), so a slot reused since cannot be mistaken
 * for the holder. `adopted` is a slot whose byte the caller already holds: it
 * counts as dead without a probe and stays locked. Returns true with the lock. */
static bool lock_takeover(struct dw_inflight_proc *p, uint32_t adopted)
{
        struct dw_inflight_shm *s = p->shm;
        uint64_t v = LD(s->lock);
        uint32_t h = (uint32_t)v - 1;
        bool probed = false;

        if (v == 0 || v == p->lockword)
                return false;
        /* A holder outside the slot range is garbage: nobody alive wrote it. */
        if (h < DW_INFLIGHT_SLOTS && h != adopted && h != p->slot) {
                if (ofd_trylock(p->fd, slot_byte(h)))
                        return false; /* alive (preempted, stopped), or cannot tell */
                probed = true;
        }
        if (!__atomic_compare_exchange_n(&s->lock, &v, p->lockword, false, __ATOMIC_ACQUIRE,
                                         __ATOMIC_RELAXED)) {
                if (probed)
                        ofd_unlock(p->fd, slot_byte(h));
                return false;
        }
        repair(s);
        if (h < DW_INFLIGHT_SLOTS && h != p->slot && LD(s->slot[h].state) != DW_INFLIGHT_SLOT_FREE)
                reap_slot(p, h);
        if (probed)
                ofd_unlock(p->fd, slot_byte(h));
        return true;
}

/* The message path's lock: never blocks. After the spin, a holder is probed
 * at most every DW_INFLIGHT_PROBE_NS (a syscall), and only when may_probe. */
static bool pool_trylock(struct dw_inflight_proc *p, uint64_t now, bool may_probe)
{
        if (lock_spin(p->shm, p->lockword))
                return true;
        if (may_probe && now - p->next_probe_ns < (1ull << 63)) {
                p->next_probe_ns = now + DW_INFLIGHT_PROBE_NS;
                if (lock_takeover(p, DW_INFLIGHT_NONE) || lock_spin(p->shm, p->lockword))
                        return true;
        }
        p->busy++;
        return false;
}

/* For open, close and explicit reaping: waits for a live holder, probing it
 * every millisecond, up to DW_INFLIGHT_WAIT_NS. */
static int pool_lock_wait(struct dw_inflight_proc *p, uint32_t adopted)
{
        uint64_t end = dw_now_ns() + DW_INFLIGHT_WAIT_NS;

        for (;;) {
                if (lock_spin(p->shm, p->lockword) || lock_takeover(p, adopted))
                        return 0;
                if (dw_now_ns() >= end)
                        return -ETIMEDOUT;
                sleep_ns(1000000);
        }
}

/* Our slot is no longer ours if someone took it back while we live: our lock
 * lives as long as our mapping, so only a process of the same user writing
 * into the pool (or removing it and formatting a new one under the same
 * inode) can do that. Then nothing we hold is counted any more. */
static bool slot_lost(const struct dw_inflight_proc *p)
{
        const struct dw_inflight_slot *me = &p->shm->slot[p->slot];

        return LD(me->state) != DW_INFLIGHT_SLOT_USED ||
               LD(me->gen) != (uint32_t)(p->lockword >> 32);
}

/* Applies releases and a cancel that found the lock busy (under the lock). */
static void flush_deferred(struct dw_inflight_proc *p)
{
        struct dw_inflight_shm *s = p->shm;
        struct dw_inflight_slot *me = &s->slot[p->slot];
        uint32_t back = p->deferred_release;

        if (p->deferred_cancel) {
                line_remove(s, p->slot);
                back += LD(me->granted);
                ST(me->granted, 0);
                p->deferred_cancel = false;
        }
        if (!back)
                return;
        ST(me->inuse, LD(me->inuse) - p->deferred_release);
        p->deferred_release = 0;
        ST(s->free, LD(s->free) + back);
        serve(s);
}

/* ---- Reaping ------------------------------------------------------------- */

/* Looks for processes that died with a slot (one fcntl per slot in use) and
 * takes their tokens back. With wait false it never blocks: a busy pool lock
 * leaves the dead slot to the next scan. Returns the tokens taken back. */
static uint32_t reap_scan(struct dw_inflight_proc *p, bool wait)
{
        struct dw_inflight_shm *s = p->shm;
        uint64_t before = p->reclaimed;

        for (uint32_t i = 0; i < DW_INFLIGHT_SLOTS; i++) {
                bool locked;

                if (i == p->slot || LD(s->slot[i].state) != DW_INFLIGHT_SLOT_USED)
                        continue;
                if (ofd_trylock(p->fd, slot_byte(i)))
                        continue;
                locked = wait ? pool_lock_wait(p, i) == 0
                              : lock_spin(s, p->lockword) || lock_takeover(p, i);
                if (locked) {
                        /* A takeover may have reaped it already. */
                        if (LD(s->slot[i].state) == DW_INFLIGHT_SLOT_USED)
                                reap_slot(p, i);
                        pool_unlock(s);
                }
                ofd_unlock(p->fd, slot_byte(i));
                if (!locked && !wait)
                        break;
        }
        return (uint32_t)(p->reclaimed - before);
}

/* At most one scan per DW_INFLIGHT_REAP_NS host-wide: whoever swaps the stamp
 * scans. A stamp from the future (another time namespace) does not count. */
static bool reap_due(struct dw_inflight_shm *s, uint64_t now)
{
        uint64_t last = LD(s->last_reap_ns);

        if (last <= now && now - last < DW_INFLIGHT_REAP_NS)
                return false;
        return __atomic_compare_exchange_n(&s->last_reap_ns, &last, now, false, __ATOMIC_RELAXED,
                                           __ATOMIC_RELAXED);
}

int dw_inflight_reap(struct dw_inflight_proc *p)
{
        if (!p->shm)
                return 0;
        return (int)reap_scan(p, true);
}

/* ---- Acquire and release ------------------------------------------------- */

/* One critical section of acquire: collect what the line handed over, then,
 * if not in line, take from the pool while nobody waits, and queue for the
 * rest. Returns the tokens granted or -EOWNERDEAD. */
static int take(struct dw_inflight_proc *p, uint32_t want, uint64_t now)
{
        struct dw_inflight_shm *s = p->shm;
        struct dw_inflight_slot *me = &s->slot[p->slot];
        uint32_t got, granted;

        if (!pool_trylock(p, now, true))
                return 0;
        if (slot_lost(p)) {
                pool_unlock(s);
                return -EOWNERDEAD;
        }
        flush_deferred(p);
        granted = LD(me->granted);
        got = granted < want ? granted : want;
        ST(me->granted, granted - got);
        if (got < want && !LD(me->ticket)) {
                int64_t f = LD(s->free);

                if (LD(s->qhead) == DW_INFLIGHT_NONE && f > 0) {
                        uint32_t g = (int64_t)(want - got) < f ? want - got : (uint32_t)f;

                        ST(s->free, f - g);
                        got += g;
                }
                if (got < want) {
                        uint32_t share = LD(s->capacity) / DW_INFLIGHT_TICKET_SHARE;
                        uint32_t need = want - got;

                        if (!share)
                                share = 1;
                        line_append(s, p->slot, need < share ? need : share);
                        p->waits++;
                }
        }
        ST(me->inuse, LD(me->inuse) + got);
        pool_unlock(s);
        p->held += got;
        p->grants += got;
        return (int)got;
}

int dw_inflight_host_acquire(struct dw_inflight_proc *p, uint32_t want, uint64_t now_ns)
{
        int got, more;

        if (want > DW_INFLIGHT_MAX_CAP)
                want = DW_INFLIGHT_MAX_CAP;
        if (!p->shm || want == 0)
                return (int)want;
        got = take(p, want, now_ns);
        if (got < 0 || (uint32_t)got == want || !reap_due(p->shm, now_ns))
                return got;
        /* Short: tokens of a dead process go to the line, maybe to us. */
        if (!reap_scan(p, false))
                return got;
        more = take(p, want - (uint32_t)got, now_ns);
        return more < 0 ? more : got + more;
}

int dw_inflight_host_release(struct dw_inflight_proc *p, uint32_t n)
{
        if (!p->shm)
                return 0;
        if (n > p->held)
                return -EINVAL;
        p->held -= n;
        p->deferred_release += n;
        return dw_inflight_poll(p, 0);
}

int dw_inflight_cancel(struct dw_inflight_proc *p)
{
        const struct dw_inflight_slot *me;

        if (!p->shm)
                return 0;
        me = &p->shm->slot[p->slot];
        if (!LD(me->ticket) && !LD(me->granted))
                return 0;
        p->deferred_cancel = true;
        return dw_inflight_poll(p, 0);
}

int dw_inflight_poll(struct dw_inflight_proc *p, uint64_t now_ns)
{
        int rc = 0;

        if (!p->shm || (!p->deferred_release && !p->deferred_cancel))
                return 0;
        if (!pool_trylock(p, now_ns, now_ns != 0))
                return 1;
        if (slot_lost(p))
                rc = -EOWNERDEAD;
        else
                flush_deferred(p);
        pool_unlock(p->shm);
        return rc;
}

bool dw_inflight_waiting(const struct dw_inflight_proc *p)
{
        return p->shm && LD(p->shm->slot[p->slot].ticket) != 0;
}

/* ---- The QP and process levels ------------------------------------------- */

int dw_inflight_admit(struct dw_inflight_proc *p, struct dw_inflight_qp *q, uint32_t want,
                      uint64_t now_ns)
{
        uint32_t n = q ? dw_inflight_qp_room(q, want) : want;
        int got;

        if (n < want)
                p->qp_capped++;
        if (p->proc_cap) {
                uint32_t room = p->inflight < p->proc_cap ? p->proc_cap - p->inflight : 0;

                if (n > room) {
                        n = room;
                        p->proc_capped++;
                }
        }
        if (n == 0)
                return 0;
        got = dw_inflight_host_acquire(p, n, now_ns);
        if (got <= 0)
                return got;
        if (q)
                q->inflight += (uint32_t)got;
        p->inflight += (uint32_t)got;
        return got;
}

int dw_inflight_complete(struct dw_inflight_proc *p, struct dw_inflight_qp *q, uint32_t n)
{
        int rc;

        if (n > p->inflight || (q && n > q->inflight))
                return -EINVAL;
        if (q)
                q->inflight -= n;
        p->inflight -= n;
        rc = dw_inflight_host_release(p, n);
        return rc < 0 ? rc : 0;
}

/* ---- Open and close ------------------------------------------------------ */

static int pool_name(char *buf, size_t len, const char *name)
{
        size_t n;

        if (!name || !*name) {
                snprintf(buf, len, "/diwarp-inflight-%u", (unsigned)geteuid());
                return 0;
        }
        n = strlen(name);
        if (name[0] != '/' || n < 2 || n >= len || strchr(name + 1, '/'))
                return -EINVAL;
        memcpy(buf, name, n + 1);
        return 0;
}

/* Writes a fresh header; magic goes last, so a creator that dies half way
 * leaves a header that the next opener recognizes as unfinished. */
static void pool_format(struct dw_inflight_shm *s, uint32_t cap)
{
        ST(s->magic, 0);
        memset((char *)s + sizeof(s->magic), 0, sizeof(*s) - sizeof(s->magic));
        s->version = DW_INFLIGHT_VERSION;
        s->hdr_size = DW_INFLIGHT_HDR_SIZE;
        s->slot_size = DW_INFLIGHT_SLOT_SIZE;
        s->nslots = DW_INFLIGHT_SLOTS;
        s->capacity = cap;
        s->free = cap;
        s->next_ticket = 1;
        s->qhead = s->qtail = DW_INFLIGHT_NONE;
        for (uint32_t i = 0; i < DW_INFLIGHT_SLOTS; i++)
                s->slot[i].next = DW_INFLIGHT_NONE;
        __atomic_store_n(&s->magic, DW_INFLIGHT_MAGIC, __ATOMIC_RELEASE);
}

/* Slots whose byte another description holds: processes attached now (or
 * closing). Leaves no lock of ours behind. */
static uint32_t live_slots(int fd)
{
        uint32_t n = 0;

        for (uint32_t i = 0; i < DW_INFLIGHT_SLOTS; i++) {
                if (ofd_trylock(fd, slot_byte(i)) == 0)
                        ofd_unlock(fd, slot_byte(i));
                else
                        n++;
        }
        return n;
}

/* Under the init lock: creates the pool, or checks an existing one, and maps
 * it through idfd (our identity: see dw_inflight_open). A foreign or damaged
 * object is refused, never reformatted. */
static int pool_attach(struct dw_inflight_proc *p, int idfd, uint32_t cap, char *why, size_t whylen)
{
        struct dw_inflight_shm h = {0};
        struct stat st;
        bool fresh;
        void *m;

        if (fstat(p->fd, &st))
                return dw_why(why, whylen, -errno, "%s: fstat: %s", p->name, strerror(errno));
        fresh = st.st_size == 0;
        if (!fresh) {
                if (st.st_size < (off_t)LINE0 || pread(p->fd, &h, LINE0, 0) != (ssize_t)LINE0)
                        return dw_why(why, whylen, -EPROTO,
                                      "/dev/shm%s: %lld bytes, not a diwarp in-flight pool; remove "
                                      "it or set DIWARP_INFLIGHT_SHM to another name",
                                      p->name, (long long)st.st_size);
                /* Magic is written last: a creator (or a re-format) that died
                 * half way left it zero. */
                fresh = st.st_size == DW_INFLIGHT_SHM_SIZE && h.magic == 0;
        }
        if (fresh) {
                if (ftruncate(p->fd, DW_INFLIGHT_SHM_SIZE))
                        return dw_why(why, whylen, -errno, "%s: ftruncate: %s", p->name,
                                      strerror(errno));
        } else if (h.magic != DW_INFLIGHT_MAGIC) {
                return dw_why(why, whylen, -EPROTO,
                              "/dev/shm%s is not a diwarp in-flight pool (bad magic); remove it or "
                              "set DIWARP_INFLIGHT_SHM to another name",
                              p->name);
        } else if (h.version != DW_INFLIGHT_VERSION) {
                return dw_why(why, whylen, -EPROTO,
                              "/dev/shm%s has pool layout version %u, this library uses %u; remove "
                              "it once no diwarp process of the older version runs",
                              p->name, h.version, DW_INFLIGHT_VERSION);
        } else if (h.hdr_size != DW_INFLIGHT_HDR_SIZE || h.slot_size != DW_INFLIGHT_SLOT_SIZE ||
                   h.nslots != DW_INFLIGHT_SLOTS || st.st_size != DW_INFLIGHT_SHM_SIZE ||
                   h.capacity == 0 || h.capacity > DW_INFLIGHT_MAX_CAP) {
                return dw_why(why, whylen, -EPROTO,
                              "/dev/shm%s: damaged pool header (size %lld, %u slots of %u bytes, "
                              "capacity %u); remove it",
                              p->name, (long long)st.st_size, h.nslots, h.slot_size, h.capacity);
        }
        m = mmap(NULL, DW_INFLIGHT_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, idfd, 0);
        if (m == MAP_FAILED)
                return dw_why(why, whylen, -errno, "%s: mmap: %s", p->name, strerror(errno));
        p->shm = m;
        /* A child forked without exec must not keep our identity (and so our
         * tokens) alive after we die. */
        if (madvise(m, DW_INFLIGHT_SHM_SIZE, MADV_DONTFORK))
                return dw_why(why, whylen, -errno, "%s: madvise(MADV_DONTFORK): %s", p->name,
                              strerror(errno));
        if (fresh) {
                pool_format(p->shm, cap);
        } else if (h.capacity != cap) {
                uint32_t live = live_slots(p->fd);

                if (live)
                        return dw_why(why, whylen, -EBUSY,
                                      "%s: the pool's capacity is %u, in use by %u process(es); "
                                      "this one asks for %u (DIWARP_INFLIGHT_HOST): processes "
                                      "sharing a pool must agree",
                                      p->name, h.capacity, live, cap);
                /* Nobody uses it: the pool takes the new capacity. */
                pool_format(p->shm, cap);
        }
        return 0;
}

/* Under the pool lock, with no dead holder: every index the pool holds can
 * be followed and the line is what the slots say. A pool that fails this
 * was written by something other than this code; it is refused, never used
 * (-EPROTO, why says what is wrong). */
static int pool_check(const struct dw_inflight_proc *p, char *why, size_t whylen)
{
        const struct dw_inflight_shm *s = p->shm;
        uint32_t h = LD(s->qhead), t = LD(s->qtail), n = 0, last = DW_INFLIGHT_NONE;
        uint32_t queued = 0;
        uint64_t prev = 0;

        for (uint32_t i = 0; i < DW_INFLIGHT_SLOTS; i++) {
                const struct dw_inflight_slot *w = &s->slot[i];
                uint32_t st = LD(w->state), nx = LD(w->next);

                if (st != DW_INFLIGHT_SLOT_FREE && st != DW_INFLIGHT_SLOT_USED)
                        return dw_why(why, whylen, -EPROTO,
                                      "/dev/shm%s: damaged pool (slot %u in state %u); remove it",
                                      p->name, i, st);
                if (nx != DW_INFLIGHT_NONE && nx >= DW_INFLIGHT_SLOTS)
                        return dw_why(why, whylen, -EPROTO,
                                      "/dev/shm%s: damaged pool (slot %u names slot %u next, of "
                                      "%u); remove it",
                                      p->name, i, nx, DW_INFLIGHT_SLOTS);
                queued += LD(w->ticket) != 0;
        }
        if ((h != DW_INFLIGHT_NONE && h >= DW_INFLIGHT_SLOTS) ||
            (t != DW_INFLIGHT_NONE && t >= DW_INFLIGHT_SLOTS) ||
            (h == DW_INFLIGHT_NONE) != (t == DW_INFLIGHT_NONE))
                return dw_why(why, whylen, -EPROTO,
                              "/dev/shm%s: damaged pool (line from slot %u to slot %u, of %u); "
                              "remove it",
                              p->name, h, t, DW_INFLIGHT_SLOTS);
        for (uint32_t cur = h; cur != DW_INFLIGHT_NONE; cur = LD(s->slot[cur].next)) {
                const struct dw_inflight_slot *w = &s->slot[cur];

                if (n++ >= DW_INFLIGHT_SLOTS || !LD(w->ticket) || !LD(w->need) ||
                    LD(w->ticket) <= prev)
                        return dw_why(why, whylen, -EPROTO,
                                      "/dev/shm%s: damaged pool (the line loops or holds slot %u "
                                      "out of order); remove it",
                                      p->name, cur);
                prev = LD(w->ticket);
                last = cur;
        }
        if (last != t || n != queued || n != LD(s->qlen) || LD(s->free) > (int64_t)LD(s->capacity))
                return dw_why(why, whylen, -EPROTO,
                              "/dev/shm%s: damaged pool (line of %u slots ending at slot %u; "
                              "%u in line, %u counted, tail %u, %lld tokens free of %u); remove it",
                              p->name, n, last, queued, LD(s->qlen), t, (long long)LD(s->free),
                              LD(s->capacity));
        return 0;
}

/* Under the init lock: the first slot whose byte we can lock is ours; a slot
 * still marked used there belonged to a dead process and is reaped first. Free
 * slots are tried first, so an open costs one fcntl in the common case. */
static int claim_slot(struct dw_inflight_proc *p, int idfd, char *why, size_t whylen)
{
        struct dw_inflight_shm *s = p->shm;

        for (int pass = 0; pass < 2; pass++) {
                for (uint32_t i = 0; i < DW_INFLIGHT_SLOTS; i++) {
                        struct dw_inflight_slot *me = &s->slot[i];
                        bool used = LD(me->state) != DW_INFLIGHT_SLOT_FREE;
                        uint32_t gen;
                        int rc;

                        if (used != (pass == 1))
                                continue;
                        rc = ofd_trylock(idfd, slot_byte(i));
                        if (rc == -EAGAIN)
                                continue;
                        if (rc)
                                return dw_why(why, whylen, rc, "%s: fcntl(F_OFD_SETLK): %s",
                                              p->name, strerror(-rc));
                        /* gen changes only under this byte's lock, which we hold. */
                        gen = LD(me->gen) + 1;
                        p->lockword = (uint64_t)gen << 32 | (i + 1);
                        if (pool_lock_wait(p, i)) {
                                ofd_unlock(idfd, slot_byte(i));
                                return dw_why(why, whylen, -ETIMEDOUT,
                                              "%s: the pool lock stayed held by a live process",
                                              p->name);
                        }
                        rc = pool_check(p, why, whylen);
                        if (rc) {
                                pool_unlock(s);
                                ofd_unlock(idfd, slot_byte(i));
                                return rc;
                        }
                        if (LD(me->state) != DW_INFLIGHT_SLOT_FREE)
                                reap_slot(p, i);
                        ST(me->gen, gen);
                        ST(me->inuse, 0);
                        ST(me->granted, 0);
                        ST(me->pid, (uint32_t)getpid());
                        ST(me->state, DW_INFLIGHT_SLOT_USED);
                        pool_unlock(s);
                        p->slot = i;
                        return 0;
                }
        }
        return dw_why(why, whylen, -ENOSPC, "%s: all %u slots are used by live processes", p->name,
                      DW_INFLIGHT_SLOTS);
}

/* Unmapping drops our identity, hence our slot lock. */
static void unmap(struct dw_inflight_proc *p)
{
        if (p->shm)
                munmap(p->shm, DW_INFLIGHT_SHM_SIZE);
        if (p->fd >= 0)
                close(p->fd);
        p->shm = NULL;
        p->fd = -1;
        p->slot = DW_INFLIGHT_NONE;
}

/* A pool file we must not use: another user's, or one others may write
 * (they could forge or steal tokens). The device open fails with this: a
 * private pool instead would quietly turn the host cap the user asked for
 * into a per-process one. */
static int refuse_owner(const char *name, const struct stat *st, char *why, size_t whylen)
{
        return dw_why(why, whylen, -EPERM,
                      "/dev/shm%s belongs to uid %u (mode %03o), not to uid %u: a host in-flight "
                      "pool must be the user's own and not writable by others; have it removed, "
                      "or set DIWARP_INFLIGHT_SHM to a name of your own",
                      name, (unsigned)st->st_uid, (unsigned)(st->st_mode & 0777),
                      (unsigned)geteuid());
}

/* shm_open refused us (EACCES): someone else's file holds the name. Its
 * owner, as far as the name's place in /dev/shm tells. */
static int foreign(const char *name, char *why, size_t whylen)
{
        char path[DW_INFLIGHT_NAME_MAX + 16];
        struct stat st;

        snprintf(path, sizeof(path), "/dev/shm%s", name);
        if (lstat(path, &st) == 0)
                return refuse_owner(name, &st, why, whylen);
        return dw_why(why, whylen, -EPERM,
                      "shm_open(%s): %s: another user's object holds the name; set "
                      "DIWARP_INFLIGHT_SHM to a name of your own",
                      name, strerror(EACCES));
}

int dw_inflight_open(struct dw_inflight_proc *p, const struct dw_inflight_params *prm, char *why,
                     size_t whylen)
{
        uint64_t end = dw_now_ns() + DW_INFLIGHT_WAIT_NS;
        struct stat st, idst;
        int rc, idfd = -1;

        memset(p, 0, sizeof(*p));
        p->fd = -1;
        p->slot = DW_INFLIGHT_NONE;
        if (prm->host_cap > DW_INFLIGHT_MAX_CAP || prm->proc_cap > DW_INFLIGHT_MAX_CAP)
                return dw_why(why, whylen, -EINVAL, "in-flight cap above %u", DW_INFLIGHT_MAX_CAP);
        p->proc_cap = prm->proc_cap;
        if (!prm->host_cap)
                return 0;
        if (pool_name(p->name, sizeof(p->name), prm->shm_name))
                return dw_why(why, whylen, -EINVAL, "bad shm name '%.64s': expected /name",
                              prm->shm_name);
        p->fd = shm_open(p->name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (p->fd < 0 && (errno == EACCES || errno == EPERM))
                return foreign(p->name, why, whylen);
        if (p->fd < 0)
                return dw_why(why, whylen, -errno, "shm_open(%s): %s", p->name, strerror(errno));
        /* Another user's object could be made to lie about tokens: trust only ours. */
        if (fstat(p->fd, &st)) {
                rc = dw_why(why, whylen, -errno, "%s: fstat: %s", p->name, strerror(errno));
                goto out;
        }
        if (st.st_uid != geteuid() || (st.st_mode & 022)) {
                rc = refuse_owner(p->name, &st, why, whylen);
                goto out;
        }
        /* Creation, attach and detach are serialized by byte 0. */
        while ((rc = ofd_trylock(p->fd, 0)) == -EAGAIN && dw_now_ns() < end)
                sleep_ns(1000000);
        if (rc) {
                rc = dw_why(why, whylen, rc == -EAGAIN ? -ETIMEDOUT : rc, "%s: pool setup lock: %s",
                            p->name,
                            rc == -EAGAIN ? "held by a live process for too long" : strerror(-rc));
                goto out;
        }
        /* Our slot lock lives on an open file description of its own that
         * only the mapping references (idfd is closed below): it goes away
         * exactly when this process unmaps or dies, whatever happens to p->fd,
         * and a forked child inherits neither. p->fd serves to probe and
         * adopt other slots. */
        idfd = shm_open(p->name, O_RDWR | O_CLOEXEC, 0);
        if (idfd < 0 || fstat(idfd, &idst)) {
                rc = dw_why(why, whylen, -errno, "shm_open(%s): %s", p->name, strerror(errno));
        } else if (idst.st_ino != st.st_ino || idst.st_dev != st.st_dev) {
                rc = dw_why(why, whylen, -ESTALE, "%s was replaced while opening it; try again",
                            p->name);
        } else {
                rc = pool_attach(p, idfd, prm->host_cap, why, whylen);
                if (!rc)
                        rc = claim_slot(p, idfd, why, whylen);
        }
        if (idfd >= 0)
                close(idfd);
        ofd_unlock(p->fd, 0);
        if (rc)
                goto out;
        reap_scan(p, false);
        return 0;
out:
        unmap(p);
        return rc;
}

void dw_inflight_close(struct dw_inflight_proc *p)
{
        struct dw_inflight_shm *s = p->shm;

        if (s && pool_lock_wait(p, DW_INFLIGHT_NONE) == 0) {
                if (!slot_lost(p)) {
                        struct dw_inflight_slot *me = &s->slot[p->slot];

                        /* Held tokens go back with the granted ones: their
                         * messages go with the device. */
                        p->deferred_cancel = true;
                        p->deferred_release = LD(me->inuse);
                        flush_deferred(p);
                        ST(me->pid, 0);
                        ST(me->state, DW_INFLIGHT_SLOT_FREE);
                }
                pool_unlock(s);
        }
        /* Unmapping drops our slot lock; if the pool lock was unavailable,
         * the others reap the slot as a dead one. */
        unmap(p);
        p->held = 0;
        p->inflight = 0;
}

void dw_inflight_forget(struct dw_inflight_proc *p)
{
        /* The mapping was not inherited (MADV_DONTFORK); its address may hold
         * something else by now, so it is not unmapped. */
        p->shm = NULL;
        unmap(p);
        p->held = 0;
        p->inflight = 0;
        p->deferred_release = 0;
        p->deferred_cancel = false;
}

void dw_inflight_get_counters(const struct dw_inflight_proc *p, struct dw_inflight_counters *c)
{
        const struct dw_inflight_shm *s = p->shm;

        memset(c, 0, sizeof(*c));
        c->grants = p->grants;
        c->waits = p->waits;
        c->reclaimed = p->reclaimed;
        c->busy = p->busy;
        c->qp_capped = p->qp_capped;
        c->proc_capped = p->proc_capped;
        c->inflight = p->inflight;
        c->held = p->held;
        c->waiting = dw_inflight_waiting(p);
        if (!s)
                return;
        c->capacity = LD(s->capacity);
        c->queue_len = LD(s->qlen);
        c->pool_free = LD(s->free);
        c->pool_reclaimed = LD(s->reclaimed);
        c->pool_reaped = LD(s->reaped);
        c->pool_repairs = LD(s->repairs);
}

int dw_inflight_unlink(const char *shm_name)
{
        char name[DW_INFLIGHT_NAME_MAX];

        if (pool_name(name, sizeof(name), shm_name))
                return -EINVAL;
        return shm_unlink(name) ? -errno : 0;
}
