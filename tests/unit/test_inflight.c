/* flow/inflight: QP, process and host in-flight caps. The host pool is shared
 * between processes, so most tests fork; children report through an anonymous
 * shared mapping and their exit status (they never call criterion asserts). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>

#include "flow/inflight.h"
#include "util/time.h"

#define MAXKIDS 8
#define SEC     1000000000ull

/* What children and the parent share. */
struct board {
        uint32_t ready[MAXKIDS]; /* child i reached its waiting point */
        uint32_t order[MAXKIDS]; /* ids in the order they were served */
        uint32_t norder;
        uint64_t served_ns[MAXKIDS];
        uint64_t start_ns; /* when the parent let the tokens go... */
        uint32_t started;  /* ...set just after */
        /* Cap check: total = tokens the children say they hold; mine[i] =
         * child i's share. A child raises mine before total and lowers it
         * after, so mine[i] >= its share of total. */
        uint64_t total;
        uint64_t max_seen;
        uint32_t violations;
        uint32_t mine[MAXKIDS];
        uint32_t dead[MAXKIDS]; /* set while child i is stopped, before its SIGKILL */
        uint32_t epoch;         /* bumped with every dead[] change */
        uint64_t grants[MAXKIDS];
        pid_t grandchild;
};

static char pool[64];
static struct board *bd;
static pid_t kids[MAXKIDS];
static int nkids;

static void setup(void)
{
        snprintf(pool, sizeof(pool), "/dwtest-inflight-%d", (int)getpid());
        dw_inflight_unlink(pool);
        bd = mmap(NULL, sizeof(*bd), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        cr_assert_neq(bd, MAP_FAILED);
        memset(bd, 0, sizeof(*bd));
        nkids = 0;
}

static void teardown(void)
{
        for (int i = 0; i < nkids; i++) {
                if (kids[i] > 0) {
                        kill(kids[i], SIGKILL);
                        waitpid(kids[i], NULL, 0);
                }
        }
        if (bd->grandchild > 0)
                kill(bd->grandchild, SIGKILL);
        dw_inflight_unlink(pool);
        munmap(bd, sizeof(*bd));
}

TestSuite(inflight, .init = setup, .fini = teardown, .timeout = 60);

static int open_pool(struct dw_inflight_proc *p, uint32_t host, uint32_t proc, char *why,
                     size_t whylen)
{
        struct dw_inflight_params prm = {host, proc, pool};

        return dw_inflight_open(p, &prm, why, whylen);
}

static void must_open(struct dw_inflight_proc *p, uint32_t host)
{
        char why[256] = "";

        cr_assert_eq(open_pool(p, host, 0, why, sizeof(why)), 0, "%s", why);
}

static struct dw_inflight_counters ctr(const struct dw_inflight_proc *p)
{
        struct dw_inflight_counters c;

        dw_inflight_get_counters(p, &c);
        return c;
}

static pid_t spawn(int (*fn)(int id, uint32_t arg), int id, uint32_t arg)
{
        pid_t pid = fork();

        cr_assert_geq(pid, 0);
        if (pid == 0)
                _exit(fn(id, arg));
        kids[nkids++] = pid;
        return pid;
}

/* Waits for child pid and checks it exited 0 (else the code says which step). */
static void reap_ok(pid_t pid)
{
        int st;

        cr_assert_eq(waitpid(pid, &st, 0), pid);
        for (int i = 0; i < nkids; i++)
                if (kids[i] == pid)
                        kids[i] = 0;
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status 0x%x (step %d)",
                  (int)pid, st, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static void kill_and_reap(pid_t pid)
{
        kill(pid, SIGKILL);
        cr_assert_eq(waitpid(pid, NULL, 0), pid);
        for (int i = 0; i < nkids; i++)
                if (kids[i] == pid)
                        kids[i] = 0;
}

/* Waits for a child that kills itself. */
static void reap_killed(pid_t pid)
{
        int st;

        cr_assert_eq(waitpid(pid, &st, 0), pid);
        for (int i = 0; i < nkids; i++)
                if (kids[i] == pid)
                        kids[i] = 0;
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status 0x%x (step %d)", st,
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

static bool wait_flag(const uint32_t *flag, uint64_t timeout_ns)
{
        uint64_t end = dw_now_ns() + timeout_ns;

        while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
                if (dw_now_ns() > end)
                        return false;
                usleep(500);
        }
        return true;
}

static void set_flag(uint32_t *flag)
{
        __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
}

/* Retries an acquire from a "progress loop" until `want` more tokens arrived
 * or the deadline passed; returns the tokens got. */
static int acquire_until(struct dw_inflight_proc *p, uint32_t want, uint64_t deadline)
{
        uint32_t have = 0;

        while (have < want && dw_now_ns() < deadline) {
                int g = dw_inflight_host_acquire(p, want - have, dw_now_ns());

                if (g < 0)
                        return g;
                have += (uint32_t)g;
                if (have < want)
                        usleep(200);
        }
        return (int)have;
}

/* Makes a first request for n tokens and retries until it stands in line, as
 * a progress loop would: a request that finds the pool lock held by a
 * preempted process gets 0 without a ticket. Returns 0 when queued, -1 if it
 * got tokens (the pool was meant to be full) or never queued. */
static int queue_up(struct dw_inflight_proc *p, uint32_t n)
{
        uint64_t end = dw_now_ns() + 5 * SEC;

        while (dw_now_ns() < end) {
                if (dw_inflight_host_acquire(p, n, dw_now_ns()) != 0)
                        return -1;
                if (dw_inflight_waiting(p))
                        return 0;
                usleep(100);
        }
        return -1;
}

/* Releases n tokens and polls until the release is applied. */
static int release_flushed(struct dw_inflight_proc *p, uint32_t n)
{
        uint64_t end = dw_now_ns() + 5 * SEC;
        int rc = dw_inflight_host_release(p, n);

        while (rc > 0 && dw_now_ns() < end) {
                usleep(100);
                rc = dw_inflight_poll(p, dw_now_ns());
        }
        return rc;
}

/* ---- Single process ------------------------------------------------------ */

Test(inflight, qp_and_process_caps_without_a_pool)
{
        struct dw_inflight_proc p;
        struct dw_inflight_qp a, b;
        char why[128];

        cr_assert_eq(open_pool(&p, 0, 3, why, sizeof(why)), 0);
        dw_inflight_qp_init(&a, 2);
        dw_inflight_qp_init(&b, 0);
        cr_assert_eq(dw_inflight_admit(&p, &a, 5, dw_now_ns()), 2);
        cr_assert_eq(dw_inflight_admit(&p, &a, 5, dw_now_ns()), 0, "QP cap");
        cr_assert_eq(dw_inflight_admit(&p, &b, 5, dw_now_ns()), 1, "process cap");
        cr_assert_eq(ctr(&p).qp_capped, 2);
        cr_assert_eq(ctr(&p).proc_capped, 1);
        cr_assert_eq(ctr(&p).inflight, 3);
        cr_assert_eq(dw_inflight_complete(&p, &a, 3), -EINVAL, "more than the QP has in flight");
        cr_assert_eq(dw_inflight_complete(&p, &a, 2), 0);
        cr_assert_eq(dw_inflight_admit(&p, &b, 5, dw_now_ns()), 2);
        cr_assert_eq(b.inflight, 3);
        cr_assert_eq(dw_inflight_admit(&p, NULL, 1, dw_now_ns()), 0);
        dw_inflight_close(&p);
}

Test(inflight, lower_level_refusal_takes_no_host_token)
{
        struct dw_inflight_proc p;
        struct dw_inflight_qp q, r;
        char why[256] = "";

        cr_assert_eq(open_pool(&p, 8, 3, why, sizeof(why)), 0, "%s", why);
        dw_inflight_qp_init(&q, 2);
        dw_inflight_qp_init(&r, 0);
        cr_assert_eq(dw_inflight_admit(&p, &q, 5, dw_now_ns()), 2);
        cr_assert_eq(ctr(&p).held, 2);
        cr_assert_eq(ctr(&p).pool_free, 6);
        cr_assert_eq(dw_inflight_admit(&p, &r, 5, dw_now_ns()), 1);
        cr_assert_eq(dw_inflight_admit(&p, &r, 5, dw_now_ns()), 0);
        cr_assert_eq(ctr(&p).pool_free, 5, "only what the QP and process caps let through");
        cr_assert_not(dw_inflight_waiting(&p));
        cr_assert_eq(dw_inflight_complete(&p, &q, 2), 0);
        cr_assert_eq(dw_inflight_complete(&p, &r, 1), 0);
        cr_assert_eq(ctr(&p).pool_free, 8);
        cr_assert_eq(ctr(&p).held, 0);
        dw_inflight_close(&p);
}

Test(inflight, short_request_queues_and_nobody_overtakes)
{
        struct dw_inflight_proc a, b;

        must_open(&a, 8);
        must_open(&b, 8);
        cr_assert_eq(dw_inflight_host_acquire(&a, 6, dw_now_ns()), 6);
        /* 2 now, a ticket for the rest (capped at a quarter of the pool). */
        cr_assert_eq(dw_inflight_host_acquire(&b, 5, dw_now_ns()), 2);
        cr_assert(dw_inflight_waiting(&b));
        cr_assert_eq(ctr(&b).waits, 1);
        cr_assert_eq(dw_inflight_host_release(&a, 1), 0);
        /* The freed token went to b's ticket: a later request gets nothing. */
        cr_assert_eq(ctr(&a).pool_free, 0);
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), 0);
        cr_assert(dw_inflight_waiting(&a), "a queues behind b");
        cr_assert_eq(ctr(&a).queue_len, 2);
        cr_assert_eq(dw_inflight_host_release(&a, 2), 0);
        /* b's ticket (2) is filled first, then a's (1). */
        cr_assert_not(dw_inflight_waiting(&b));
        cr_assert_not(dw_inflight_waiting(&a));
        cr_assert_eq(ctr(&a).queue_len, 0);
        cr_assert_eq(dw_inflight_host_acquire(&b, 2, dw_now_ns()), 2);
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), 1);
        cr_assert_eq(ctr(&a).held, 4);
        cr_assert_eq(ctr(&b).held, 4);
        cr_assert_eq(ctr(&b).pool_free, 0);
        dw_inflight_close(&a);
        cr_assert_eq(ctr(&b).pool_free, 4, "close gives the held tokens back");
        dw_inflight_close(&b);
}

Test(inflight, a_ticket_asks_for_a_share_of_the_pool)
{
        struct dw_inflight_proc a, b, c;

        /* A quarter of 2 rounds down to 0: a ticket still asks for 1. */
        must_open(&a, 2);
        must_open(&b, 2);
        must_open(&c, 2);
        cr_assert_eq(dw_inflight_host_acquire(&a, 2, dw_now_ns()), 2);
        cr_assert_eq(dw_inflight_host_acquire(&b, 100, dw_now_ns()), 0);
        cr_assert_eq(dw_inflight_host_acquire(&c, 1, dw_now_ns()), 0);
        cr_assert_eq(dw_inflight_host_release(&a, 2), 0);
        /* b's big backlog got one token, then c had its turn. */
        cr_assert_eq(dw_inflight_host_acquire(&b, 100, dw_now_ns()), 1);
        cr_assert_eq(dw_inflight_host_acquire(&c, 1, dw_now_ns()), 1);
        cr_assert_eq(ctr(&c).pool_free, 0);
        dw_inflight_close(&a);
        dw_inflight_close(&b);
        dw_inflight_close(&c);
}

Test(inflight, cancel_returns_uncollected_grants)
{
        struct dw_inflight_proc a, b;

        must_open(&a, 4);
        must_open(&b, 4);
        cr_assert_eq(dw_inflight_host_acquire(&a, 4, dw_now_ns()), 4);
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 0);
        cr_assert_eq(dw_inflight_host_release(&a, 1), 0);
        cr_assert_eq(ctr(&a).pool_free, 0, "granted to b, not yet collected");
        cr_assert_eq(dw_inflight_cancel(&b), 0);
        cr_assert_eq(ctr(&a).pool_free, 1);
        cr_assert_not(dw_inflight_waiting(&b));
        cr_assert_eq(dw_inflight_cancel(&b), 0, "nothing to cancel");
        cr_assert_eq(dw_inflight_host_release(&b, 1), -EINVAL, "b holds nothing");
        dw_inflight_close(&a);
        dw_inflight_close(&b);
}

Test(inflight, close_while_waiting_leaves_the_line)
{
        struct dw_inflight_proc a, b, c;

        must_open(&a, 4);
        must_open(&b, 4);
        must_open(&c, 4);
        cr_assert_eq(dw_inflight_host_acquire(&a, 4, dw_now_ns()), 4);
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 0);
        cr_assert_eq(dw_inflight_host_acquire(&c, 1, dw_now_ns()), 0);
        dw_inflight_close(&b);
        cr_assert_eq(ctr(&a).queue_len, 1);
        cr_assert_eq(dw_inflight_host_release(&a, 1), 0);
        cr_assert_eq(dw_inflight_host_acquire(&c, 1, dw_now_ns()), 1);
        dw_inflight_close(&a);
        dw_inflight_close(&c);
}

Test(inflight, slot_survives_its_descriptor_being_closed)
{
        struct dw_inflight_proc a, b;
        int devnull = open("/dev/null", O_RDONLY);

        must_open(&a, 4);
        must_open(&b, 4);
        cr_assert_eq(dw_inflight_host_acquire(&a, 2, dw_now_ns()), 2);
        /* The slot lock lives with the mapping, not with a.fd. */
        cr_assert_geq(dup2(devnull, a.fd), 0);
        cr_assert_eq(dw_inflight_reap(&b), 0);
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), 1);
        cr_assert_eq(ctr(&b).pool_free, 1);
        dw_inflight_close(&a);
        cr_assert_eq(ctr(&b).pool_free, 4);
        dw_inflight_close(&b);
        close(devnull);
}

Test(inflight, slot_taken_from_a_live_process_is_reported)
{
        struct dw_inflight_proc a;

        must_open(&a, 4);
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), 1);
        a.shm->slot[a.slot].gen++;
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), -EOWNERDEAD);
        cr_assert_eq(dw_inflight_host_release(&a, 1), -EOWNERDEAD);
        a.shm->slot[a.slot].gen--;
        dw_inflight_close(&a);
}

/* ---- Opening: bad files, names and capacities ------------------------------ */

static int shm_fd(void)
{
        int fd = shm_open(pool, O_RDWR | O_CREAT, 0600);

        cr_assert_geq(fd, 0);
        return fd;
}

static void expect_refused(int rc_want, const char *text)
{
        struct dw_inflight_proc p;
        char why[256] = "";
        int rc = open_pool(&p, 8, 0, why, sizeof(why));

        cr_assert_eq(rc, rc_want, "rc %d (%s)", rc, why);
        cr_assert_not_null(strstr(why, text), "reason: %s", why);
        cr_assert_null(p.shm);
}

Test(inflight, foreign_file_refused)
{
        int fd = shm_fd();
        char junk[4096];

        memset(junk, 'x', sizeof(junk));
        cr_assert_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
        expect_refused(-EPROTO, "not a diwarp in-flight pool");
        /* It was not overwritten. */
        cr_assert_eq(pread(fd, junk, 8, 0), 8);
        cr_assert_eq(memcmp(junk, "xxxxxxxx", 8), 0);
        close(fd);
}

Test(inflight, tiny_file_refused)
{
        int fd = shm_fd();

        cr_assert_eq(write(fd, "hello", 5), 5);
        expect_refused(-EPROTO, "5 bytes");
        close(fd);
}

Test(inflight, other_version_and_damaged_header_refused)
{
        struct dw_inflight_proc p;
        struct dw_inflight_shm *s;
        int fd;

        must_open(&p, 8);
        dw_inflight_close(&p);
        fd = shm_fd();
        s = mmap(NULL, DW_INFLIGHT_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        cr_assert_neq(s, MAP_FAILED);
        s->version = 2;
        expect_refused(-EPROTO, "version 2");
        s->version = DW_INFLIGHT_VERSION;
        s->nslots = 7;
        expect_refused(-EPROTO, "damaged");
        s->nslots = DW_INFLIGHT_SLOTS;
        s->capacity = 0;
        expect_refused(-EPROTO, "damaged");
        s->capacity = 8;
        must_open(&p, 8);
        dw_inflight_close(&p);
        munmap(s, DW_INFLIGHT_SHM_SIZE);
        cr_assert_eq(ftruncate(fd, DW_INFLIGHT_SHM_SIZE + 4096), 0);
        expect_refused(-EPROTO, "damaged");
        close(fd);
}

Test(inflight, writable_by_others_refused)
{
        int fd = shm_fd();

        cr_assert_eq(fchmod(fd, 0622), 0);
        expect_refused(-EPERM, "not writable by others");
        close(fd);
}

/* A pool whose line indices are out of range or inconsistent (written by
 * something other than this code) is refused at open, never followed. */
Test(inflight, damaged_line_refused_at_open)
{
        struct dw_inflight_proc p;
        struct dw_inflight_shm *s;
        int fd;

        must_open(&p, 8);
        dw_inflight_close(&p);
        fd = shm_fd();
        s = mmap(NULL, DW_INFLIGHT_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        cr_assert_neq(s, MAP_FAILED);
        s->qtail = 5000;
        expect_refused(-EPROTO, "damaged pool (line from slot");
        s->qhead = 5000;
        expect_refused(-EPROTO, "damaged pool (line from slot");
        s->qhead = s->qtail = 2; /* slot 2 is not in line */
        expect_refused(-EPROTO, "damaged pool (the line loops");
        s->qhead = s->qtail = DW_INFLIGHT_NONE;
        s->slot[3].next = 7777;
        expect_refused(-EPROTO, "names slot 7777");
        s->slot[3].next = DW_INFLIGHT_NONE;
        s->slot[5].state = 9;
        expect_refused(-EPROTO, "in state 9");
        s->slot[5].state = DW_INFLIGHT_SLOT_FREE;
        s->slot[6].ticket = 3; /* in line, but the line is empty */
        s->slot[6].need = 1;
        expect_refused(-EPROTO, "damaged pool (line of 0 slots");
        s->slot[6].ticket = 0;
        s->slot[6].need = 0;
        s->qhead = s->qtail = 1; /* a loop: 1 -> 1 */
        s->slot[1].ticket = 1;
        s->slot[1].need = 1;
        s->slot[1].next = 1;
        s->qlen = 1;
        expect_refused(-EPROTO, "the line loops");
        s->qhead = s->qtail = DW_INFLIGHT_NONE;
        s->slot[1].ticket = s->slot[1].need = 0;
        s->slot[1].next = DW_INFLIGHT_NONE;
        s->qlen = 0;
        s->free = 9;
        expect_refused(-EPROTO, "9 tokens free of 8");
        s->free = 8;
        /* Repaired by hand: taken again. */
        must_open(&p, 8);
        cr_assert_eq(dw_inflight_host_acquire(&p, 8, dw_now_ns()), 8);
        dw_inflight_close(&p);
        munmap(s, DW_INFLIGHT_SHM_SIZE);
        close(fd);
}

/* The same damage while processes use the pool: the line is rebuilt from
 * the slots' own fields before anything is written through the bad tail
 * (a write at slot 5000 lands far outside the 65 792-byte mapping). */
Test(inflight, damaged_tail_is_never_written_through)
{
        struct dw_inflight_proc a, b;

        must_open(&a, 4);
        must_open(&b, 4);
        cr_assert_eq(dw_inflight_host_acquire(&a, 4, dw_now_ns()), 4);
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 0); /* b queues */
        cr_assert_eq(a.shm->qtail, b.slot);
        a.shm->qtail = 5000;
        a.shm->slot[b.slot].next = 5000;
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), 0); /* a queues behind b */
        cr_assert_eq(a.shm->qhead, b.slot);
        cr_assert_eq(a.shm->qtail, a.slot);
        cr_assert_eq(a.shm->slot[b.slot].next, a.slot);
        cr_assert_eq(a.shm->qlen, 2);
        cr_assert_geq(ctr(&a).pool_repairs, 1);
        /* The line works: b, then a. */
        cr_assert_eq(dw_inflight_host_release(&a, 4), 0);
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 1);
        cr_assert_eq(dw_inflight_host_acquire(&a, 1, dw_now_ns()), 1);
        dw_inflight_close(&b);
        dw_inflight_close(&a);
}

Test(inflight, unfinished_creation_is_redone)
{
        struct dw_inflight_proc p;
        int fd = shm_fd();

        /* A creator that died after ftruncate, before writing its magic. */
        cr_assert_eq(ftruncate(fd, DW_INFLIGHT_SHM_SIZE), 0);
        must_open(&p, 8);
        cr_assert_eq(ctr(&p).capacity, 8);
        cr_assert_eq(dw_inflight_host_acquire(&p, 8, dw_now_ns()), 8);
        dw_inflight_close(&p);
        close(fd);
}

Test(inflight, capacity_mismatch_refused_while_in_use)
{
        struct dw_inflight_proc a, b;
        char why[256] = "";

        must_open(&a, 8);
        cr_assert_eq(open_pool(&b, 16, 0, why, sizeof(why)), -EBUSY);
        cr_assert_not_null(strstr(why, "capacity is 8"), "%s", why);
        cr_assert_not_null(strstr(why, "asks for 16"), "%s", why);
        dw_inflight_close(&a);
        /* Nobody uses it any more: it takes the new capacity. */
        must_open(&b, 16);
        cr_assert_eq(ctr(&b).capacity, 16);
        cr_assert_eq(ctr(&b).pool_free, 16);
        dw_inflight_close(&b);
}

Test(inflight, bad_parameters_refused)
{
        struct dw_inflight_proc p;
        struct dw_inflight_params prm = {8, 0, "no-slash"};
        char why[256] = "";

        cr_assert_eq(dw_inflight_open(&p, &prm, why, sizeof(why)), -EINVAL);
        cr_assert_not_null(strstr(why, "no-slash"), "%s", why);
        prm.shm_name = "/a/b";
        cr_assert_eq(dw_inflight_open(&p, &prm, why, sizeof(why)), -EINVAL);
        prm.shm_name = pool;
        prm.host_cap = DW_INFLIGHT_MAX_CAP + 1;
        cr_assert_eq(dw_inflight_open(&p, &prm, NULL, 0), -EINVAL);
        cr_assert_eq(dw_inflight_unlink("/a/b"), -EINVAL);
}

/* ---- Several processes ---------------------------------------------------- */

static uint32_t cap_arg; /* set before forking */

/* Children hammer acquire/release and check, each time they hold tokens, that
 * the tokens held by live children never exceed the cap (see struct board). */
static int hammer(int id, uint32_t run_ms)
{
        struct dw_inflight_proc p;
        uint64_t rnd = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1), end;

        if (open_pool(&p, cap_arg, 0, NULL, 0))
                return 10;
        end = dw_now_ns() + run_ms * 1000000ull;
        while (dw_now_ns() < end) {
                uint32_t want, e1, e2;
                int64_t dead = 0;
                uint64_t t;
                int g;

                rnd ^= rnd << 13;
                rnd ^= rnd >> 7;
                rnd ^= rnd << 17;
                want = 1 + (uint32_t)(rnd % 3);
                g = dw_inflight_host_acquire(&p, want, dw_now_ns());
                if (g < 0)
                        return 11;
                if (g == 0) {
                        if (rnd & 0x100)
                                sched_yield();
                        continue;
                }
                __atomic_add_fetch(&bd->mine[id], (uint32_t)g, __ATOMIC_SEQ_CST);
                e1 = __atomic_load_n(&bd->epoch, __ATOMIC_SEQ_CST);
                for (int j = 0; j < MAXKIDS; j++)
                        if (__atomic_load_n(&bd->dead[j], __ATOMIC_SEQ_CST))
                                dead += __atomic_load_n(&bd->mine[j], __ATOMIC_SEQ_CST);
                t = __atomic_add_fetch(&bd->total, (uint64_t)g, __ATOMIC_SEQ_CST);
                e2 = __atomic_load_n(&bd->epoch, __ATOMIC_SEQ_CST);
                /* A death between the two epoch reads may count a dead child's
                 * tokens twice: skip the check then. */
                if (e1 == e2) {
                        /* Negative when a child stopped between raising its
                         * mine and the total: then it is no bound at all. */
                        int64_t live = (int64_t)t - dead;
                        uint64_t m = __atomic_load_n(&bd->max_seen, 0);

                        if (live > (int64_t)cap_arg)
                                __atomic_add_fetch(&bd->violations, 1, __ATOMIC_SEQ_CST);
                        while (live > (int64_t)m &&
                               !__atomic_compare_exchange_n(&bd->max_seen, &m, (uint64_t)live,
                                                            false, 0, 0))
                                ;
                }
                for (volatile int k = 0; k < (int)(rnd % 2000); k++)
                        ;
                __atomic_sub_fetch(&bd->total, (uint64_t)g, __ATOMIC_SEQ_CST);
                __atomic_sub_fetch(&bd->mine[id], (uint32_t)g, __ATOMIC_SEQ_CST);
                if (dw_inflight_host_release(&p, (uint32_t)g) < 0)
                        return 12;
                __atomic_add_fetch(&bd->grants[id], (uint64_t)g, __ATOMIC_SEQ_CST);
        }
        dw_inflight_cancel(&p);
        dw_inflight_close(&p);
        return 0;
}

static void check_pool_whole(uint32_t cap)
{
        struct dw_inflight_proc p;
        struct dw_inflight_counters c;

        must_open(&p, cap);
        dw_inflight_reap(&p);
        c = ctr(&p);
        cr_assert_eq(c.pool_free, cap, "tokens lost: %lld of %u free", (long long)c.pool_free, cap);
        cr_assert_eq(c.queue_len, 0);
        dw_inflight_close(&p);
}

Test(inflight, cap_never_exceeded_by_forked_processes)
{
        pid_t pid[4];

        cap_arg = 5;
        for (int i = 0; i < 4; i++)
                pid[i] = spawn(hammer, i, 600);
        for (int i = 0; i < 4; i++)
                reap_ok(pid[i]);
        cr_assert_eq(bd->violations, 0, "cap %u exceeded (%llu held at most)", cap_arg,
                     (unsigned long long)bd->max_seen);
        cr_assert_eq(bd->max_seen, cap_arg, "the pool was never full: the test proves nothing");
        for (int i = 0; i < 4; i++)
                cr_assert_gt(bd->grants[i], 0, "child %d starved", i);
        check_pool_whole(cap_arg);
}

/* Stops child i (wherever it is, possibly inside the pool's critical
 * section), marks it dead, then kills it. */
static void stop_mark_kill(pid_t pid, int i)
{
        int st;

        kill(pid, SIGSTOP);
        cr_assert_eq(waitpid(pid, &st, WUNTRACED), pid);
        cr_assert(WIFSTOPPED(st));
        __atomic_store_n(&bd->dead[i], 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&bd->epoch, 1, __ATOMIC_SEQ_CST);
        kill_and_reap(pid);
}

Test(inflight, cap_kept_and_tokens_recovered_when_processes_die)
{
        pid_t pid[4];
        uint64_t after[4];

        cap_arg = 5;
        for (int i = 0; i < 4; i++)
                pid[i] = spawn(hammer, i, 900);
        usleep(150000);
        stop_mark_kill(pid[0], 0);
        usleep(150000);
        stop_mark_kill(pid[1], 1);
        for (int i = 2; i < 4; i++)
                after[i] = __atomic_load_n(&bd->grants[i], __ATOMIC_SEQ_CST);
        for (int i = 2; i < 4; i++)
                reap_ok(pid[i]);
        cr_assert_eq(bd->violations, 0, "cap %u exceeded (%llu held at most)", cap_arg,
                     (unsigned long long)bd->max_seen);
        for (int i = 2; i < 4; i++)
                cr_assert_gt(bd->grants[i], after[i], "survivor %d stalled after the deaths", i);
        check_pool_whole(cap_arg);
}

/* Queues for one token, says so, then polls until served and records the order. */
static int fcfs_waiter(int id, uint32_t unused)
{
        struct dw_inflight_proc p;
        uint64_t end = dw_now_ns() + 10 * SEC;
        int g;

        (void)unused;
        if (open_pool(&p, 4, 0, NULL, 0))
                return 20;
        if (queue_up(&p, 1))
                return 21;
        set_flag(&bd->ready[id]);
        g = acquire_until(&p, 1, end);
        if (g != 1)
                return 23;
        bd->order[__atomic_fetch_add(&bd->norder, 1, __ATOMIC_SEQ_CST)] = (uint32_t)id;
        if (release_flushed(&p, 1))
                return 24;
        dw_inflight_close(&p);
        return 0;
}

Test(inflight, waiting_processes_are_served_first_come_first_served)
{
        struct dw_inflight_proc h;
        pid_t pid[5];

        must_open(&h, 4);
        cr_assert_eq(dw_inflight_host_acquire(&h, 4, dw_now_ns()), 4);
        /* Each waiter's first refused request comes after the previous one's. */
        for (int i = 0; i < 5; i++) {
                pid[i] = spawn(fcfs_waiter, i, 0);
                cr_assert(wait_flag(&bd->ready[i], 5 * SEC), "waiter %d never queued", i);
        }
        cr_assert_eq(ctr(&h).queue_len, 5);
        /* A newcomer does not overtake them, though it holds tokens already. */
        cr_assert_eq(queue_up(&h, 1), 0);
        cr_assert_eq(ctr(&h).queue_len, 6);
        /* One token goes round: each waiter passes it on when served. */
        cr_assert_eq(release_flushed(&h, 1), 0);
        for (int i = 0; i < 5; i++)
                reap_ok(pid[i]);
        cr_assert_eq(bd->norder, 5);
        for (uint32_t i = 0; i < 5; i++)
                cr_assert_eq(bd->order[i], i, "served %u at place %u", bd->order[i], i);
        cr_assert_eq(acquire_until(&h, 1, dw_now_ns() + SEC), 1, "the newcomer comes last");
        cr_assert_eq(ctr(&h).held, 4);
        dw_inflight_close(&h);
}

/* Takes `n` tokens, says so, then sleeps until killed. */
static int holder(int id, uint32_t n)
{
        struct dw_inflight_proc p;

        if (open_pool(&p, cap_arg, 0, NULL, 0))
                return 30;
        if (acquire_until(&p, n, dw_now_ns() + 5 * SEC) != (int)n)
                return 31;
        set_flag(&bd->ready[id]);
        for (int i = 0; i < 100; i++)
                usleep(100000);
        return 32;
}

/* Queues for `n` tokens, says so, then polls until it has them and notes when. */
static int waiter(int id, uint32_t n)
{
        struct dw_inflight_proc p;

        if (open_pool(&p, cap_arg, 0, NULL, 0))
                return 40;
        if (queue_up(&p, n))
                return 41;
        set_flag(&bd->ready[id]);
        if (!wait_flag(&bd->started, 10 * SEC))
                return 42;
        if (acquire_until(&p, n, dw_now_ns() + 10 * SEC) != (int)n)
                return 43;
        bd->served_ns[id] = dw_now_ns();
        dw_inflight_close(&p);
        return 0;
}

static void assert_served_within_a_second(int i)
{
        uint64_t ms = (bd->served_ns[i] - bd->start_ns) / 1000000;

        cr_log_info("waiter %d served after %llu ms", i, (unsigned long long)ms);
        cr_assert_lt(ms, 1000, "waiter %d: %llu ms", i, (unsigned long long)ms);
}

static void go(void)
{
        bd->start_ns = dw_now_ns();
        set_flag(&bd->started);
}

Test(inflight, tokens_of_a_killed_holder_come_back_within_a_second)
{
        pid_t victim, w[2];

        cap_arg = 8;
        victim = spawn(holder, 0, 8);
        cr_assert(wait_flag(&bd->ready[0], 5 * SEC));
        for (int i = 1; i <= 2; i++) {
                w[i - 1] = spawn(waiter, i, 4);
                cr_assert(wait_flag(&bd->ready[i], 5 * SEC));
        }
        kill_and_reap(victim);
        go();
        for (int i = 0; i < 2; i++)
                reap_ok(w[i]);
        for (int i = 1; i <= 2; i++)
                assert_served_within_a_second(i);
        check_pool_whole(cap_arg);
}

Test(inflight, killed_head_of_line_does_not_stall_the_others)
{
        struct dw_inflight_proc h;
        struct dw_inflight_counters c;
        pid_t head, w[2];

        cap_arg = 8;
        must_open(&h, cap_arg);
        cr_assert_eq(dw_inflight_host_acquire(&h, 8, dw_now_ns()), 8);
        head = spawn(waiter, 0, 2);
        cr_assert(wait_flag(&bd->ready[0], 5 * SEC));
        for (int i = 1; i <= 2; i++) {
                w[i - 1] = spawn(waiter, i, 1);
                cr_assert(wait_flag(&bd->ready[i], 5 * SEC));
        }
        kill_and_reap(head);
        /* The first two tokens go to the dead head's ticket; the reaper must
         * take them back and pass them on. */
        cr_assert_eq(release_flushed(&h, 2), 0);
        go();
        for (int i = 0; i < 2; i++)
                reap_ok(w[i]);
        for (int i = 1; i <= 2; i++)
                assert_served_within_a_second(i);
        c = ctr(&h);
        cr_assert_geq(c.pool_reclaimed, 2);
        cr_assert_eq(c.queue_len, 0);
        dw_inflight_close(&h);
        check_pool_whole(cap_arg);
}

/* Like holder, but first forks a child that inherits everything and lingers
 * without calling dw_inflight_forget. */
static int forking_holder(int id, uint32_t n)
{
        struct dw_inflight_proc p;
        pid_t g;

        if (open_pool(&p, cap_arg, 0, NULL, 0))
                return 60;
        if (acquire_until(&p, n, dw_now_ns() + 5 * SEC) != (int)n)
                return 61;
        g = fork();
        if (g < 0)
                return 62;
        if (g == 0) {
                for (int i = 0; i < 100; i++)
                        usleep(100000);
                _exit(0);
        }
        bd->grandchild = g;
        set_flag(&bd->ready[id]);
        for (int i = 0; i < 100; i++)
                usleep(100000);
        return 63;
}

Test(inflight, forked_child_does_not_keep_a_dead_parents_tokens)
{
        pid_t victim, w;

        cap_arg = 4;
        victim = spawn(forking_holder, 0, 4);
        cr_assert(wait_flag(&bd->ready[0], 5 * SEC));
        w = spawn(waiter, 1, 1);
        cr_assert(wait_flag(&bd->ready[1], 5 * SEC));
        kill_and_reap(victim);
        go();
        reap_ok(w);
        cr_assert_eq(kill(bd->grandchild, 0), 0, "the inheriting child still runs");
        assert_served_within_a_second(1);
        kill(bd->grandchild, SIGKILL);
        bd->grandchild = 0;
        check_pool_whole(cap_arg);
}

/* Takes 2 tokens, says so, waits for the go, then takes the pool lock and
 * dies inside its critical section after wrecking the derived state (the
 * free count and the line). */
static int die_in_critical_section(int id, uint32_t unused)
{
        struct dw_inflight_proc p;
        struct dw_inflight_shm *s;

        (void)unused;
        if (open_pool(&p, cap_arg, 0, NULL, 0))
                return 50;
        if (acquire_until(&p, 2, dw_now_ns() + 5 * SEC) != 2)
                return 51;
        set_flag(&bd->ready[id]);
        if (!wait_flag(&bd->ready[id + 1], 10 * SEC))
                return 52;
        s = p.shm;
        __atomic_store_n(&s->lock, p.lockword, __ATOMIC_SEQ_CST);
        s->free = 1000;
        s->qhead = DW_INFLIGHT_NONE;
        s->qtail = DW_INFLIGHT_NONE;
        s->qlen = 0;
        raise(SIGKILL);
        return 53;
}

Test(inflight, lock_holder_death_is_repaired)
{
        struct dw_inflight_proc a, b;
        struct dw_inflight_counters c;
        pid_t x;

        cap_arg = 8;
        must_open(&a, cap_arg);
        must_open(&b, cap_arg);
        cr_assert_eq(dw_inflight_host_acquire(&a, 6, dw_now_ns()), 6);
        x = spawn(die_in_critical_section, 0, 0);
        cr_assert(wait_flag(&bd->ready[0], 5 * SEC));
        set_flag(&bd->ready[1]);
        reap_killed(x);
        /* The lock is stuck: a release is deferred, not lost. */
        cr_assert_eq(dw_inflight_host_release(&a, 1), 1);
        cr_assert_geq(ctr(&a).busy, 1);
        /* b probes the holder, finds it dead, takes over: free is recounted
         * (8 - 6 - 2 = 0), x's 2 tokens come back; b's request is served. */
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 1);
        c = ctr(&b);
        cr_assert_eq(c.pool_repairs, 1);
        cr_assert_eq(c.pool_reclaimed, 2);
        cr_assert_eq(c.pool_free, 1);
        cr_assert_eq(c.queue_len, 0);
        cr_assert_eq(dw_inflight_poll(&a, dw_now_ns()), 0);
        cr_assert_eq(ctr(&a).pool_free, 2, "the deferred release arrived");
        dw_inflight_close(&a);
        dw_inflight_close(&b);
        check_pool_whole(cap_arg);
}

Test(inflight, line_rebuilt_after_lock_holder_death)
{
        struct dw_inflight_proc a, b, c;
        pid_t x;

        cap_arg = 8;
        must_open(&a, cap_arg);
        must_open(&b, cap_arg);
        must_open(&c, cap_arg);
        cr_assert_eq(dw_inflight_host_acquire(&a, 6, dw_now_ns()), 6);
        x = spawn(die_in_critical_section, 0, 0);
        cr_assert(wait_flag(&bd->ready[0], 5 * SEC));
        /* The pool is full: b, then c, queue. Then x wrecks the line and dies. */
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 0);
        cr_assert_eq(dw_inflight_host_acquire(&c, 2, dw_now_ns()), 0);
        set_flag(&bd->ready[1]);
        reap_killed(x);
        /* c's retry takes the lock over: the line is rebuilt in ticket order,
         * so x's 2 tokens go to b first (1), then c (1 of its 2). */
        cr_assert_eq(dw_inflight_host_acquire(&c, 2, dw_now_ns()), 1);
        cr_assert_eq(ctr(&c).pool_repairs, 1);
        cr_assert(dw_inflight_waiting(&c));
        cr_assert_not(dw_inflight_waiting(&b));
        cr_assert_eq(ctr(&c).queue_len, 1);
        cr_assert_eq(dw_inflight_host_acquire(&b, 1, dw_now_ns()), 1);
        cr_assert_eq(dw_inflight_host_release(&a, 1), 0);
        cr_assert_eq(dw_inflight_host_acquire(&c, 1, dw_now_ns()), 1);
        cr_assert_eq(ctr(&c).pool_free, 0);
        dw_inflight_close(&a);
        dw_inflight_close(&b);
        dw_inflight_close(&c);
        check_pool_whole(cap_arg);
}
