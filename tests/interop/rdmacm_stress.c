/* The rdma_cm emulation under load, run under `diwarp run` (a plain
 * librdmacm program): 16 connects at once to one listener, all established
 * and all disconnected; a connect to a port nobody listens on is refused
 * within a bound; a destroyed id handed back gets EINVAL, not a crash; a peer
 * process killed while connected is reported as DISCONNECTED within a bound,
 * and so is a disconnect behind a Send that waits for a receive at the server;
 * an event channel destroyed while a thread waits in rdma_get_cm_event (as a
 * program exiting without stopping its event thread does) leaves that thread
 * waiting, without an event and without touching freed memory (ASan), and
 * one that asks after the channel was destroyed gets EBADF, as well without
 * touching it;
 * connects made one after another start no thread each: the connector
 * threads are reused, so none ends behind the program's back (a thread's end
 * madvise()s its stack, which MPI libraries' memory hooks intercept).
 * Exit 0 = all checks passed; each failure prints its line.
 */
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define NCONN 16
#define NSEQ  6

static int server_established; /* ESTABLISHED events seen on the server's channel */

/* Threads started in this process: the program exports its pthread_create
 * (export_dynamic), so the preloaded provider's calls reach it first. */
static int threads_started;

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
        static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
        if (!real)
                *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
        if (!real)
                return EAGAIN;
        __atomic_add_fetch(&threads_started, 1, __ATOMIC_RELAXED);
        return real(t, a, fn, arg);
}

static long now_ms(void)
{
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The next event of ch within ms, copied (and acknowledged); -1 on timeout. */
static int next_event(struct rdma_event_channel *ch, int ms, struct rdma_cm_event *out)
{
        struct pollfd p = {.fd = ch->fd, .events = POLLIN};
        if (poll(&p, 1, ms) != 1)
                return -1;
        struct rdma_cm_event *e;
        if (rdma_get_cm_event(ch, &e) != 0)
                return -1;
        *out = *e;
        rdma_ack_cm_event(e);
        return 0;
}

static struct sockaddr_in loopback(uint16_t port_be)
{
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = port_be};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return a;
}

static void make_qp(struct rdma_cm_id *id, struct ibv_pd **pd)
{
        if (!*pd)
                *pd = ibv_alloc_pd(id->verbs);
        REQUIRE(*pd);
        struct ibv_qp_init_attr a = {
            .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC,
        };
        REQUIRE(rdma_create_qp(id, *pd, &a) == 0);
}

/* A listener on an ephemeral loopback port of ch; returns the port. */
static uint16_t listen_on(struct rdma_event_channel *ch, struct rdma_cm_id **lid)
{
        REQUIRE(rdma_create_id(ch, lid, NULL, RDMA_PS_TCP) == 0);
        struct sockaddr_in a = loopback(0);
        REQUIRE(rdma_bind_addr(*lid, (struct sockaddr *)&a) == 0);
        /* Port 0 is given a port at bind, as the kernel does (qperf tells
         * it to its client before it listens); the listener keeps it. */
        uint16_t port = rdma_get_src_port(*lid);
        REQUIRE(port != 0);
        REQUIRE(rdma_listen(*lid, 64) == 0);
        CHECK(rdma_get_src_port(*lid) == port);
        return port;
}

/* Starts an asynchronous connect of a new id on ch to port. */
static struct rdma_cm_id *start_connect(struct rdma_event_channel *ch, uint16_t port_be)
{
        struct rdma_cm_id *id;
        REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
        struct sockaddr_in d = loopback(port_be);
        REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr *)&d, 2000) == 0);
        return id;
}

/* Drives the client side of ch (ADDR -> ROUTE -> connect) and the server
 * side of sch (accept every request) until `want` clients are established
 * or the deadline passes. Returns the number established. */
static int drive(struct rdma_event_channel *ch, struct rdma_event_channel *sch, struct ibv_pd **pd,
                 struct rdma_cm_id **accepted, int want, long deadline, int *refused)
{
        int up = 0, nacc = 0;
        while (up < want && now_ms() < deadline) {
                struct rdma_cm_event e;
                if (sch && next_event(sch, 0, &e) == 0) {
                        if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
                                make_qp(e.id, pd);
                                struct rdma_conn_param cp = {.responder_resources = 1,
                                                             .initiator_depth = 1,
                                                             .rnr_retry_count = 7};
                                CHECK(rdma_accept(e.id, &cp) == 0);
                                if (accepted && nacc < NCONN)
                                        accepted[nacc++] = e.id;
                        } else {
                                CHECK(e.event == RDMA_CM_EVENT_ESTABLISHED);
                                server_established++;
                        }
                }
                if (next_event(ch, 10, &e) != 0)
                        continue;
                switch (e.event) {
                case RDMA_CM_EVENT_ADDR_RESOLVED:
                        CHECK(rdma_resolve_route(e.id, 2000) == 0);
                        break;
                case RDMA_CM_EVENT_ROUTE_RESOLVED: {
                        make_qp(e.id, pd);
                        struct rdma_conn_param cp = {.responder_resources = 1,
                                                     .initiator_depth = 1};
                        CHECK(rdma_connect(e.id, &cp) == 0);
                        break;
                }
                case RDMA_CM_EVENT_ESTABLISHED:
                        up++;
                        break;
                case RDMA_CM_EVENT_REJECTED:
                case RDMA_CM_EVENT_UNREACHABLE:
                case RDMA_CM_EVENT_CONNECT_ERROR:
                        if (refused)
                                (*refused)++;
                        return up;
                default:
                        fprintf(stderr, "unexpected event %s\n", rdma_event_str(e.event));
                        failures++;
                }
        }
        return up;
}

/* A child process: listens on a port it writes to fd, accepts one
 * connection, then waits to be killed. */
/* A thread that waits for events on a channel until one fails to come. */
struct waiter {
        struct rdma_event_channel *ch;
        volatile int got;      /* events received */
        volatile int returned; /* rdma_get_cm_event failed: the thread is done */
        volatile pid_t tid;
};

static void *wait_events(void *arg)
{
        struct waiter *w = arg;
        w->tid = (pid_t)syscall(SYS_gettid);
        for (;;) {
                struct rdma_cm_event *e;
                if (rdma_get_cm_event(w->ch, &e) != 0) {
                        w->returned = 1;
                        return NULL;
                }
                w->got++;
                rdma_ack_cm_event(e);
                if (w->got == 2)
                        return NULL; /* took the second event before its purge: done */
        }
}

/* Channels destroyed under a waiting thread, each just after an event was
 * posted and purged again (an id resolved and destroyed at once): the
 * waiter, woken by the event's count, must not read the freed channel. The
 * waiter is first seen blocked in rdma_get_cm_event's read (it took a first
 * event and went back to wait). */
/* Whether thread tid of this process sits in read(2) on fd (x86_64
 * /proc/self/task/TID/syscall: "0 0xFD ..."; other architectures: after a
 * pause, assumed). */
static int in_read(pid_t tid, int fd)
{
#if defined(__x86_64__)
        char path[64], line[256];
        snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
        FILE *f = fopen(path, "r");
        if (!f)
                return 0;
        int ok = 0;
        long nr;
        unsigned long a0;
        if (fgets(line, sizeof(line), f) && sscanf(line, "%ld %lx", &nr, &a0) == 2)
                ok = nr == 0 && a0 == (unsigned long)fd;
        fclose(f);
        return ok;
#else
        (void)tid;
        (void)fd;
        usleep(5000);
        return 1;
#endif
}

static void destroyed_under_waiter(int rounds)
{
        static struct waiter w[64];
        for (int i = 0; i < rounds && i < 64; i++) {
                struct waiter *wi = &w[i];
                wi->ch = rdma_create_event_channel();
                REQUIRE(wi->ch);
                pthread_t t;
                REQUIRE(pthread_create(&t, NULL, wait_events, wi) == 0);
                pthread_detach(t);
                struct sockaddr_in d = loopback(htons(7));
                struct rdma_cm_id *first, *id;
                REQUIRE(rdma_create_id(wi->ch, &first, NULL, RDMA_PS_TCP) == 0);
                CHECK(rdma_resolve_addr(first, NULL, (struct sockaddr *)&d, 1000) == 0);
                long end = now_ms() + 5000;
                while ((wi->got < 1 || !in_read(wi->tid, wi->ch->fd)) && now_ms() < end)
                        usleep(100);
                REQUIRE(wi->got == 1); /* and back in rdma_get_cm_event, blocked */
                REQUIRE(rdma_create_id(wi->ch, &id, NULL, RDMA_PS_TCP) == 0);
                CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&d, 1000) == 0);
                /* From at once to after the waiter woke: some round lands
                 * between its wake-up and its look at the channel. */
                struct timespec s0, s1;
                clock_gettime(CLOCK_MONOTONIC, &s0);
                do
                        clock_gettime(CLOCK_MONOTONIC, &s1);
                while ((s1.tv_sec - s0.tv_sec) * 1000000000L + s1.tv_nsec - s0.tv_nsec <
                       (long)(i % 16) * 4000);
                CHECK(rdma_destroy_id(id) == 0);
                CHECK(rdma_destroy_id(first) == 0);
                rdma_destroy_event_channel(wi->ch);
                usleep(2000);
                /* A blocking waiter on a destroyed channel never returns. */
                CHECK(!wi->returned);
        }
}

/* rdma_get_cm_event on a channel destroyed before the call (rping's and
 * MVAPICH2's event threads loop back to it while the main thread destroys
 * the channel): the caller waits, as one already in the call does, without
 * touching the freed channel (ASan), and ends by cancellation. */
static void *late_reader(void *arg)
{
        struct rdma_cm_event *e = NULL;
        int r = rdma_get_cm_event(arg, &e);
        fprintf(stderr, "FAIL: rdma_get_cm_event on a destroyed channel returned %d (%s)\n", r,
                strerror(errno));
        return (void *)1;
}

static void called_after_destroy(void)
{
        struct rdma_event_channel *ch = rdma_create_event_channel();
        REQUIRE(ch);
        rdma_destroy_event_channel(ch);
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, late_reader, ch) == 0);
        usleep(20000);
        REQUIRE(pthread_cancel(t) == 0);
        void *res = NULL;
        REQUIRE(pthread_join(t, &res) == 0);
        CHECK(res == PTHREAD_CANCELED);
}

static pid_t vanishing_server(int fd)
{
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid)
                return pid;
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
        if (getppid() == 1)
                _exit(4);
        struct rdma_event_channel *ch = rdma_create_event_channel();
        REQUIRE(ch);
        struct rdma_cm_id *lid;
        uint16_t port = listen_on(ch, &lid);
        if (write(fd, &port, sizeof(port)) != sizeof(port))
                _exit(2);
        struct ibv_pd *pd = NULL;
        for (;;) {
                struct rdma_cm_event e;
                if (next_event(ch, 1000, &e) == 0 && e.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
                        make_qp(e.id, &pd);
                        struct rdma_conn_param cp = {.responder_resources = 1,
                                                     .initiator_depth = 1};
                        if (rdma_accept(e.id, &cp) != 0)
                                _exit(3);
                }
        }
}

int main(void)
{
        signal(SIGPIPE, SIG_IGN);
        /* The peer to be killed is forked first: a process that already uses
         * the device cannot fork a working one (as with verbs without fork
         * support). */
        int pfd[2];
        REQUIRE(pipe(pfd) == 0);
        pid_t child = vanishing_server(pfd[1]);
        struct rdma_event_channel *sch = rdma_create_event_channel();
        struct rdma_event_channel *cch = rdma_create_event_channel();
        REQUIRE(sch && cch);
        struct ibv_pd *spd = NULL, *cpd = NULL;

        /* 1. NCONN connects at once to one listener. */
        struct rdma_cm_id *lid;
        uint16_t port = listen_on(sch, &lid);
        struct rdma_cm_id *cid[NCONN], *acc[NCONN] = {0};
        for (int i = 0; i < NCONN; i++)
                cid[i] = start_connect(cch, port);
        long t0 = now_ms();
        int up = drive(cch, sch, &spd, acc, NCONN, t0 + 20000, NULL);
        CHECK(up == NCONN);
        fprintf(stderr, "%d of %d connections established in %ld ms\n", up, NCONN, now_ms() - t0);
        /* The server's ESTABLISHED events. */
        while (server_established < NCONN) {
                struct rdma_cm_event e;
                if (next_event(sch, 5000, &e) != 0)
                        break;
                if (e.event == RDMA_CM_EVENT_ESTABLISHED)
                        server_established++;
        }
        CHECK(server_established == NCONN);

        /* Everyone disconnects; both sides see DISCONNECTED. */
        for (int i = 0; i < NCONN; i++)
                CHECK(rdma_disconnect(cid[i]) == 0);
        int cdis = 0, sdis = 0;
        long end = now_ms() + 10000;
        while ((cdis < NCONN || sdis < NCONN) && now_ms() < end) {
                struct rdma_cm_event e;
                if (next_event(cch, 10, &e) == 0 && e.event == RDMA_CM_EVENT_DISCONNECTED)
                        cdis++;
                if (next_event(sch, 0, &e) == 0 && e.event == RDMA_CM_EVENT_DISCONNECTED)
                        sdis++;
        }
        CHECK(cdis == NCONN && sdis == NCONN);
        for (int i = 0; i < NCONN; i++) {
                rdma_destroy_qp(cid[i]);
                CHECK(rdma_destroy_id(cid[i]) == 0);
                if (acc[i]) {
                        rdma_destroy_qp(acc[i]);
                        CHECK(rdma_destroy_id(acc[i]) == 0);
                }
        }

        /* 1b. Connects one after another, each established before the next:
         * the connector threads of part 1 take them, no thread starts (and
         * so none ends later, behind the program's back). */
        int started = __atomic_load_n(&threads_started, __ATOMIC_RELAXED);
        CHECK(started > 0); /* the count sees the provider's threads */
        struct rdma_cm_id *seq[NSEQ], *sacc[NCONN] = {0};
        int seq_up = 0;
        for (int i = 0; i < NSEQ; i++) {
                seq[i] = start_connect(cch, port);
                seq_up += drive(cch, sch, &spd, sacc + i, 1, now_ms() + 10000, NULL);
        }
        CHECK(seq_up == NSEQ);
        int seq_started = __atomic_load_n(&threads_started, __ATOMIC_RELAXED) - started;
        fprintf(stderr, "%d sequential connects started %d thread(s)\n", NSEQ, seq_started);
        CHECK(seq_started == 0);
        for (int i = 0; i < NSEQ; i++) {
                rdma_destroy_qp(seq[i]);
                CHECK(rdma_destroy_id(seq[i]) == 0);
                if (sacc[i]) {
                        rdma_destroy_qp(sacc[i]);
                        CHECK(rdma_destroy_id(sacc[i]) == 0);
                }
        }
        /* Their server side events (ESTABLISHED, DISCONNECTED) are dropped
         * with the ids. */

        /* 2. A destroyed id handed back: EINVAL, no crash. */
        struct rdma_cm_id *stale = cid[0];
        struct sockaddr_in d = loopback(port);
        errno = 0;
        CHECK(rdma_resolve_addr(stale, NULL, (struct sockaddr *)&d, 1000) == -1 && errno == EINVAL);
        CHECK(rdma_destroy_id(stale) == -1 && errno == EINVAL);

        /* 3. Nobody listens: refused, within the connect's retry grace. */
        CHECK(rdma_destroy_id(lid) == 0);
        struct rdma_cm_id *rid = start_connect(cch, port);
        int refused = 0;
        t0 = now_ms();
        CHECK(drive(cch, NULL, &cpd, NULL, 1, t0 + 5000, &refused) == 0);
        CHECK(refused == 1);
        long refused_ms = now_ms() - t0;
        CHECK(refused_ms < 3000);
        fprintf(stderr, "connect to a closed port refused after %ld ms\n", refused_ms);
        rdma_destroy_qp(rid);
        CHECK(rdma_destroy_id(rid) == 0);

        /* 4. A peer process killed while connected. */
        uint16_t cport = 0;
        REQUIRE(read(pfd[0], &cport, sizeof(cport)) == sizeof(cport));
        struct rdma_cm_id *vid = start_connect(cch, cport);
        CHECK(drive(cch, NULL, &cpd, NULL, 1, now_ms() + 10000, NULL) == 1);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        t0 = now_ms();
        int gone = 0;
        while (!gone && now_ms() < t0 + 15000) {
                struct rdma_cm_event e;
                if (next_event(cch, 100, &e) == 0 && e.id == vid &&
                    e.event == RDMA_CM_EVENT_DISCONNECTED)
                        gone = 1;
        }
        CHECK(gone);
        fprintf(stderr, "killed peer reported after %ld ms\n", now_ms() - t0);
        rdma_destroy_qp(vid);
        CHECK(rdma_destroy_id(vid) == 0);

        /* 5. A Send waits at a server that posted no receive (it accepted
         * with rnr_retry_count 7: InfiniBand would retry for ever); the
         * client's disconnect still reaches the server as DISCONNECTED. */
        port = listen_on(sch, &lid);
        struct rdma_cm_id *hid = start_connect(cch, port);
        memset(acc, 0, sizeof(acc));
        CHECK(drive(cch, sch, &spd, acc, 1, now_ms() + 10000, NULL) == 1);
        static char msg[64];
        struct ibv_mr *mr = ibv_reg_mr(hid->qp->pd, msg, sizeof(msg), IBV_ACCESS_LOCAL_WRITE);
        REQUIRE(mr);
        struct ibv_sge sge = {.addr = (uintptr_t)msg, .length = sizeof(msg), .lkey = mr->lkey};
        struct ibv_send_wr wr = {.wr_id = 1,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        CHECK(ibv_post_send(hid->qp, &wr, &bad) == 0);
        int held_over = 0;
        t0 = now_ms();
        while (now_ms() < t0 + 200) { /* held: the server's connection stays */
                struct rdma_cm_event e;
                if (next_event(sch, 10, &e) == 0 && e.event == RDMA_CM_EVENT_DISCONNECTED)
                        held_over = 1;
        }
        CHECK(!held_over);
        CHECK(rdma_disconnect(hid) == 0);
        t0 = now_ms();
        gone = 0;
        while (!gone && now_ms() < t0 + 5000) {
                struct rdma_cm_event e;
                if (next_event(sch, 10, &e) == 0 && e.id == acc[0] &&
                    e.event == RDMA_CM_EVENT_DISCONNECTED)
                        gone = 1;
        }
        CHECK(gone);
        fprintf(stderr, "disconnect behind a held Send reported after %ld ms\n", now_ms() - t0);
        rdma_destroy_qp(hid);
        CHECK(rdma_destroy_id(hid) == 0);
        if (acc[0]) {
                rdma_destroy_qp(acc[0]);
                CHECK(rdma_destroy_id(acc[0]) == 0);
        }
        CHECK(rdma_destroy_id(lid) == 0);
        CHECK(ibv_dereg_mr(mr) == 0);

        rdma_destroy_event_channel(cch);
        rdma_destroy_event_channel(sch);

        /* 6. Channels destroyed under waiting threads. */
        destroyed_under_waiter(64);
        called_after_destroy();

        if (failures) {
                fprintf(stderr, "%d check(s) failed\n", failures);
                return 1;
        }
        printf("ok\n");
        return 0;
}
