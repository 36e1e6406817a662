/* progress/: the progress engine of a device.
 *
 * A step (dw_progress_step) is bounded work under the device lock: receive a
 * batch of datagrams and place them, transmit datagram sends that waited for
 * socket room (round-robin over QPs), release fault-held packets that are
 * due, call the watch callbacks of ready fds (RC TCP sockets, listeners) and
 * the transports' own progress. post_* and cq_poll run one step; so does
 * diwarp_progress. The transports are reached only through the tables of
 * hooks qp/ registers at device open (struct dw_transport_ops).
 *
 * Every device has a thread (DIWARP_PROGRESS=thread, the default; with
 * DIWARP_PROGRESS=app a completion channel starts it) that sleeps in
 * epoll_wait on the UDP socket, a wake-up eventfd and the watched fds, and
 * runs a step whenever one is ready or a timer is due. The thread is hybrid:
 * when it finds the application busy driving progress itself (polling the
 * CQ), it parks (stops watching the data fds, looks at the application's
 * step count every 0.1-1 ms) and takes over again when the application stops
 * calling in; when the poller waits for a core (a shared host), the device
 * turns shared and the thread makes all the progress. An application thread
 * blocked in a completion channel wait drives the device itself
 * (dw_progress_wait) and the thread yields to it. See README.md.
 */
#ifndef DIWARP_PROGRESS_H
#define DIWARP_PROGRESS_H

#include <pthread.h>
#include <sched.h>
#include <sys/types.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dw_device; /* opaque here: handed back to the hooks and watch callbacks */
struct dw_fault;
struct dw_udp;
struct sockaddr_in;

#define DW_PROGRESS_BUDGET 64 /* work units of the step post_* and cq_poll run */

/* Called from a step (device lock held) when a watched fd is ready; events
 * are EPOLLIN/EPOLLOUT/EPOLLERR/EPOLLHUP bits. Returns work done (>= 0).
 * It may unwatch its own fd. */
typedef int (*dw_watch_fn)(struct dw_device *dev, int fd, uint32_t events, void *ctx);

#define DW_MAX_WATCH 4160 /* every QP's TCP socket + listeners */

/* What a step asks of one transport, so that progress/ depends on no
 * transport: qp/ registers a table per transport at device open
 * (dw_progress_add_transport). A step calls each hook where README.md's
 * order of a step puts it, for every table that has it in registration
 * order (rx_dgram and tx: for the first one only); NULL: the transport
 * has no such work. Lock held. */
struct dw_transport_ops {
        /* Application-driven steps: reads the transport's streams directly
         * (no epoll). Work done, or -1 when it cannot read them all this way:
         * the step then looks at them through epoll. */
        int (*poll)(struct dw_device *dev, int budget);
        /* The step is about to receive from the UDP socket. */
        void (*rx_begin)(struct dw_device *dev);
        /* Receives the next datagram straight into its target: 1 done, 0 use
         * the batch receive, 2 receive one datagram the ordinary way, -1
         * nothing is waiting. The first table whose hook returns nonzero
         * decides. */
        int (*rx_direct)(struct dw_device *dev);
        /* One datagram from the UDP socket (CRC not yet checked), for the
         * transport that demultiplexes the socket's datagrams (UD, which
         * hands RD's on); stamp: when the kernel received it (CLOCK_MONOTONIC
         * ns, 0: unknown; dw_udp_rx_stamp). */
        void (*rx_dgram)(struct dw_device *dev, uint8_t *pkt, size_t len,
                         const struct sockaddr_in *from, uint64_t stamp);
        /* Sends that waited for socket room, while any QP waits
         * (dw_progress_tx_wait; only the transport with rx_dgram makes one
         * wait): round-robin over those QPs, each with a fair share of the
         * budget. Work done. */
        int (*tx)(struct dw_device *dev, int budget);
        /* The transport's own progress (timers, backlogs); it asks for its
         * next deadline with dw_progress_timer. Work done. */
        int (*progress)(struct dw_device *dev, int budget);
};

#define DW_MAX_TRANSPORT 4

struct dw_watch {
        int fd; /* -1: free slot */
        uint32_t events;
        dw_watch_fn fn;
        void *ctx;
};

#define DW_PROGRESS_HOUSEKEEPING_NS (250ll * 1000 * 1000)

/* What the device hands its progress engine at init (dw_progress_init):
 * progress/ reaches the device through these only. */
struct dw_progress_dev {
        struct dw_device *handle;       /* opaque: passed to the hooks and watch callbacks */
        pthread_mutex_t *lock;          /* the device lock */
        struct dw_udp *udp;             /* its UDP socket (llp/udp.h) */
        struct dw_fault *fault;         /* its fault injector (util/fault.h) */
        bool fault_on;                  /* ... injects something (DIWARP_FAULT) */
        uint64_t *rx_dropped_malformed; /* its counters (struct diwarp_counters) */
        uint64_t *fault_slowrx_waits;
        uint16_t port;         /* names the device in log lines */
        uint32_t wait_spin_us; /* DIWARP_WAIT_SPIN_US (dw_progress_wait) */
};

struct dw_progress {
        struct dw_progress_dev dev;
        bool thread_mode; /* the progress thread runs (or is asked to) */
        bool stop;        /* asks the thread to exit */
        bool started;
        bool external; /* driven from its owner's loop (dw_progress_external): no thread */
        pthread_t thread;
        int epfd;               /* epoll: wake eventfd, watched fds, UDP fd (see udp_in_epoll) */
        int wake_fd;            /* eventfd written by dw_progress_wake */
        bool udp_wants_out;     /* EPOLLOUT registered for the UDP fd (back-pressure) */
        bool udp_in_epoll;      /* EPOLLIN registered for the plain UDP fd (a thread started) */
        bool udp_in_held;       /* ... but masked while DIWARP_FAULT=slowrx holds reading back */
        bool udp_in_parked;     /* ... and left out while the thread is parked */
        uint32_t udp_events;    /* what the set watches of the UDP fd now (0: not in it) */
        bool no_pwait2;         /* the kernel lacks epoll_pwait2: millisecond sleeps */
        unsigned ntx_pending;   /* QPs whose sends wait for socket room (dw_progress_tx_wait) */
        struct dw_watch *watch; /* DW_MAX_WATCH slots, allocated at init */
        unsigned nwatch;
        uint64_t deadline_ns; /* earliest timer asked for by dw_progress_timer; UINT64_MAX none */
        uint64_t steps;
        /* Application-driven steps read the data sockets directly (UDP
         * recvmmsg, RC streams through the poll hook) and look at the epoll set
         * (listeners, CM sockets, EPOLLOUT waits) only every
         * DW_PROGRESS_EPOLL_EVERY steps, once per coarse clock tick, or every
         * step while a watched fd waits for EPOLLOUT. */
        unsigned nwatch_out;  /* watched fds with EPOLLOUT in their events */
        unsigned ndgram;      /* QPs using the UDP socket (UD, RD): recvmmsg each step */
        unsigned since_epoll; /* app-driven steps since the last epoll_wait */
        int64_t epoll_tick;   /* CLOCK_MONOTONIC_COARSE (ns) of the last epoll_wait */
        const struct dw_transport_ops *transport[DW_MAX_TRANSPORT]; /* registration order */
        unsigned ntransport;
        /* Device upkeep off the message path (qp/stat_shm.c's refresh):
         * called, lock held, from a step that reads the coarse clock anyway
         * (an application's epoll look, a thread wake-up) once
         * DW_PROGRESS_HOUSEKEEPING_NS passed since the last call. NULL: none. */
        void (*housekeeping)(struct dw_device *dev);
        int64_t housekeeping_tick;
        /* Hybrid progress: application-driven steps that read the data
         * sockets count themselves here (one relaxed store under the device
         * lock, no clock, no syscall). The progress thread reads it without
         * the lock: while the count keeps moving the application drives
         * progress and the thread stays parked off the data fds. */
        _Atomic uint64_t app_reads;
        /* When the thread's sleep on the data fds ends (ns; UINT64_MAX: only
         * a fd wakes it; 0: it is not asleep there, running or parked). Set
         * by the thread under the device lock before it sleeps, cleared when
         * it wakes; dw_progress_timer wakes it for an earlier deadline (an
         * application that arms a timer and then blocks on its completion
         * channel drives nothing itself). */
        _Atomic uint64_t thread_sleep_until;
        /* The host is shared (see progress.c): the thread makes all the
         * progress and the application's cq_poll only pops completions
         * (dw_progress_app_poll). Set and cleared by the thread. */
        _Atomic bool shared;
        /* The thread that made the last polling step or poll: the thread
         * tells a poller that waits for a core from one blocked in a
         * syscall by its state (/proc/self/task/TID/stat). */
        _Atomic pid_t app_tid;
        _Atomic uint64_t takeovers;  /* times the device turned shared (written by the thread) */
        _Atomic uint64_t park_wakes; /* the parked thread's looks (written by the thread) */
        _Atomic uint64_t nap_drives; /* naps that drove (dw_progress_nap_drive) */
        /* A driver's sleeps that ended at a transport's timer, not at data
         * or at the end of its wait (dw_progress_drive). */
        _Atomic uint64_t timer_wakes;
        /* Shared: a poll that finds its CQ empty naps (dw_progress_nap) on
         * nap_gen instead of spinning, so that the core goes to whoever has
         * work; nappers counts the pollers asleep there. cq_pushes counts
         * the completions pushed to the device's CQs (dw_cq_push, lock
         * held); a thread step that pushed some while pollers nap bumps
         * nap_gen and wakes them (dw_progress_nap_wake). work_nappers
         * counts those among them that wait for any work, not only a
         * completion: diwarp_progress callers (a program that watches its
         * memory for Writes), woken by every thread step that did work. */
        _Atomic uint32_t nap_gen;
        _Atomic unsigned nappers, work_nappers;
        uint32_t cq_pushes, cq_pushes_seen;
        /* CQs of the device armed for an event and not fired yet (queue/'s
         * armed_count, lock held; the parked thread reads it without). While
         * none is, the parked thread's look may wait for the scheduler tick
         * (parked_late, set by the thread around that sleep). */
        uint32_t armed_cqs;
        _Atomic bool parked_late;
        /* Event-driven waits (dw_progress_wait). driver: the application
         * thread that drives the device while it waits (its tid; 0: none),
         * set and cleared by that thread, cleared under the device lock.
         * drives: waits that a driver began; while it moves the progress
         * thread stays off the data set (yielded). waiters: threads waiting
         * on a channel without driving (another thread drives); a driver
         * that leaves while some wait hands them to the progress thread.
         * driver_sleep_until: as thread_sleep_until, for the driver's sleep
         * (dw_progress_timer wakes it for an earlier deadline). */
        _Atomic pid_t driver;
        _Atomic uint64_t drives;
        _Atomic unsigned waiters;
        _Atomic uint64_t driver_sleep_until;
        /* The yielded thread sleeps on this condition (neither the data set
         * nor the wake eventfd, which are the driver's), kicked by
         * dw_progress_stop and by a driver that leaves waiters behind. */
        /* A driven wait has just ended with a step that read the sockets
         * (lock held): the application's next reading step does not read
         * them again (dw_progress_run). */
        bool drained;
        /* The driver's spin before it sleeps (dw_progress_wait_spin):
         * spin_trust, how far recent spins ended in a completion (full
         * DW_SPIN_TRUST, halved by a spin that ended asleep; 0: waits do not
         * spin but for a probe every DW_SPIN_PROBE_EVERY, counted in
         * spin_probe). Lock held. */
        unsigned spin_trust;
        unsigned spin_probe;
        /* ... and no spin before spin_off_until: the spin was turned off
         * at spin_stolen_at; spin_off_ns, the current off period. The core
         * was last taken from a spin at spin_taken_at, spin_takes times in
         * a row each soon after the one before. */
        uint64_t spin_off_until, spin_off_ns, spin_stolen_at, spin_taken_at;
        unsigned spin_takes;
        pthread_mutex_t yield_lock;
        pthread_cond_t yield_cond;
        bool yield_kick;
        bool yield_init; /* yield_lock and yield_cond are initialised */
};

/* The calling thread's id, cached per thread (gettid is a syscall). */
pid_t dw_progress_tid(void);

/* cq_poll of a device whose thread makes all the progress: counts the poll
 * (the thread sees the application polling) and says so, without the lock.
 * false: the application drives progress, run a step as usual. */
static inline bool dw_progress_app_poll(struct dw_progress *p)
{
        if (!atomic_load_explicit(&p->shared, memory_order_relaxed))
                return false;
        /* Several threads may poll: a lost increment only delays the count. */
        atomic_store_explicit(&p->app_reads,
                              atomic_load_explicit(&p->app_reads, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        atomic_store_explicit(&p->app_tid, dw_progress_tid(), memory_order_relaxed);
        return true;
}

/* Programs drain a CQ in a loop and act on what they popped only after the
 * poll that finds it empty; an MPI library goes round its progress engine a
 * few more times before it sends the reply. A nap in those polls held the
 * reply back until the nap's bound (Open MPI's NetPIPE, 4 ranks on the 2
 * cores, RC over RD: 260-800 us a one-way trip, where the first empty poll
 * alone exempt still left 260 and the first 4 gave 40; progress/README.md,
 * "Shared hosts"). So the first `after` (DIWARP_SHARED_NAP_AFTER, 4) empty
 * polls of a thread after the last one that popped a completion return at
 * once; later ones nap. Per thread: the polls of one program thread follow
 * each other. */
extern __thread unsigned dw_progress_empty_polls;

/* A shared device's poll popped completions: the caller acts on them next. */
static inline void dw_progress_poll_got(void)
{
        dw_progress_empty_polls = 0;
}

/* A shared device's poll found its CQ empty: may it nap now? */
static inline bool dw_progress_poll_may_nap(unsigned after)
{
        if (dw_progress_empty_polls >= after)
                return true;
        dw_progress_empty_polls++;
        return false;
}

/* A shared device's poll found its CQ empty: it naps (dw_progress_nap)
 * rather than spin. Begin counts the caller among the nappers (with
 * for_work, among those woken by any work too) and returns the generation
 * to sleep on; the caller then looks at its CQ once more (a completion
 * pushed before the count rose wakes nobody) and either naps or cancels
 * (with the same for_work). */
static inline uint32_t dw_progress_nap_begin(struct dw_progress *p, bool for_work)
{
        if (for_work)
                atomic_fetch_add(&p->work_nappers, 1);
        atomic_fetch_add(&p->nappers, 1);
        atomic_thread_fence(memory_order_seq_cst);
        return atomic_load(&p->nap_gen);
}

static inline void dw_progress_nap_cancel(struct dw_progress *p, bool for_work)
{
        atomic_fetch_sub(&p->nappers, 1);
        if (for_work)
                atomic_fetch_sub(&p->work_nappers, 1);
}

/* Sleeps until the thread pushes a completion, or with for_work does any
 * work (nap_gen moves from gen), or the calling thread's bound passed
 * (DW_SHARED_NAP_NS, doubled by each nap that ran out, up to
 * DW_SHARED_NAP_MAX_NS), then leaves the nappers. */
void dw_progress_nap(struct dw_progress *p, uint32_t gen, bool for_work);

/* A shared device's poll found its CQ empty and may nap: it naps as the
 * driver (dw_progress_wait's role), asleep on the device's set and running
 * the steps itself, until done(ctx) turns nonzero (its value is returned),
 * a step did other work, or DW_SHARED_NAP_MAX_NS passed (0 for both: a
 * program may watch its memory for an RDMA Write, which completes nothing;
 * -EINTR: a signal). The thread yields to it and keeps the
 * device shared. Each message then costs the program one wake-up, the
 * poller's, instead of two (the thread's for the data, the poller's for
 * the completion). -EBUSY: another thread drives; nap on nap_gen instead. */
int dw_progress_nap_drive(struct dw_progress *p, int (*done)(void *ctx), void *ctx);

/* One bounded step. Lock held. Returns work done (>= 0). */
int dw_progress_step(struct dw_progress *p, int budget);

/* Blocks the calling application thread until done(ctx) returns nonzero,
 * and returns that value (-errno: the wait failed; -EINTR: a signal). fd
 * turns readable when another thread makes done true (a completion
 * channel's eventfd). While it waits the caller drives the device itself:
 * it sleeps in the kernel on fd and the device's epoll set (its sockets and
 * the wake eventfd) until the transports' next timer, and runs a step when
 * they fire, so the message that ends the wait wakes this thread and no
 * other; the progress thread stays off the data set meanwhile (README.md,
 * "Event-driven programs"). One driver at a time: a thread that finds
 * another driving sleeps on fd alone, served by the driver's steps, then by
 * the progress thread once the driver is gone. done runs with or without
 * the device lock held (it takes only locks ordered after it). Call
 * without the device lock. */
int dw_progress_wait(struct dw_progress *p, int fd, int (*done)(void *ctx), void *ctx);
/* The step of post_send / post_recv: the same, except that the data sockets
 * are not read directly (the work just posted needs no receive, and a
 * busy-polling application reads them in its next poll anyway); they are read
 * when the periodic epoll look reports them, so an application that only
 * posts still makes receive progress. */
int dw_progress_step_post(struct dw_progress *p, int budget);

/* Watches fd; fn runs from a step when it is ready. Lock held. -ENOSPC, -EEXIST. */
int dw_progress_watch_fd(struct dw_progress *p, int fd, uint32_t events, dw_watch_fn fn, void *ctx);
/* Changes the events of a watched fd (e.g. add EPOLLOUT while a send backlog exists). */
int dw_progress_modify_fd(struct dw_progress *p, int fd, uint32_t events);
int dw_progress_unwatch_fd(struct dw_progress *p, int fd);
/* Asks for a step no later than abs_ns (CLOCK_MONOTONIC, dw_now_ns): the thread
 * bounds its sleep by it. Transports call it from their progress for their
 * retransmit / keepalive timers; it is cleared before each step. Lock held. */
void dw_progress_timer(struct dw_progress *p, uint64_t abs_ns);
/* Wakes the progress thread (new work to do). Any thread, lock not needed. */
void dw_progress_wake(struct dw_progress *p);
/* The thread is parked in a sleep whose end may wait for the scheduler tick
 * (no CQ was armed when it began): an arm should wake it. */
static inline bool dw_progress_parked_late(struct dw_progress *p)
{
        /* Orders the caller's arm before this load; the thread orders its
         * flag before its look at armed_cqs: one of the two sees the other. */
        atomic_thread_fence(memory_order_seq_cst);
        return atomic_load_explicit(&p->parked_late, memory_order_relaxed);
}
/* A QP's sends wait for socket room / no longer wait: while any waits, the
 * thread watches the UDP socket for room and a step calls the tx hook. */
void dw_progress_tx_wait(struct dw_progress *p, bool wait);

/* Sets up the engine of the device dev describes (copied: its pointers must
 * stay valid until dw_progress_fini). */
int dw_progress_init(struct dw_progress *p, const struct dw_progress_dev *dev);
/* Adds a transport's hooks after those registered before it. -ENOSPC. */
int dw_progress_add_transport(struct dw_progress *p, const struct dw_transport_ops *ops);
/* Starts the thread if not running; call WITHOUT the device lock. */
int dw_progress_start(struct dw_progress *p);
/* Stops and joins the thread; call WITHOUT the device lock. */
void dw_progress_stop(struct dw_progress *p);
void dw_progress_fini(struct dw_progress *p);

/* Asks the kernel for the shortest time slice (100 us) for the calling
 * thread, so its wake-ups preempt a busy-polling thread on its core at once
 * (EEVDF, Linux >= 6.12). 0 when granted, -EOPNOTSUPP where the kernel or the
 * thread's policy has none (harmless: the thread runs as before). The
 * progress thread calls it; diwarpdv_short_time_slice is the same for the
 * callers of the public API. */
int dw_progress_short_slice(void);

/* A process that drives the device from its own loop and sleeps on its own
 * epoll set (diwarpdv_external_progress, which the daemon's servers use),
 * instead of a progress thread: dw_progress_external puts the UDP socket in
 * the device's epoll set, marks the device external (dw_progress_start then
 * refuses with -EBUSY) and returns that set's fd, which the caller watches
 * from its own set (-EBUSY when a progress thread runs); before it sleeps it
 * bounds the sleep by dw_progress_external_timeout (ns, -1: none); when the
 * set is ready or the time has come, dw_progress_external_run runs one step
 * with the set's ready events. The last two answer -EINVAL on a device that
 * is not external. Each takes the device lock. */
int dw_progress_external(struct dw_progress *p);
int dw_progress_external_timeout(struct dw_progress *p, int64_t *ns);
int dw_progress_external_run(struct dw_progress *p);

#endif
