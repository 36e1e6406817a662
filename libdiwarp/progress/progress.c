/* The progress engine: bounded steps and the optional progress thread. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* ppoll */
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <diwarp/diwarpdv.h>

#include "progress/progress.h"
#include "llp/udp.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/time.h"

/* epoll data: low 32 bits a tag, high 32 bits the fd (to spot a slot reused
 * between epoll_wait and processing). */
#define DW_TAG_UDP    0u
#define DW_TAG_WAKE   1u
#define DW_TAG_WATCH  2u /* + slot index */
#define DW_MAX_EVENTS 64
/* The driver's spin (dw_progress_wait_spin). */
#define DW_SPIN_TRUST       8u
#define DW_SPIN_PROBE_EVERY 16u

static uint64_t dw_ev_data(int fd, uint32_t tag)
{
        return (uint64_t)(uint32_t)fd << 32 | tag;
}

int dw_progress_init(struct dw_progress *p, const struct dw_progress_dev *dev)
{
        p->dev = *dev;
        p->epfd = -1;
        p->wake_fd = -1;
        p->deadline_ns = UINT64_MAX;
        p->spin_trust = DW_SPIN_TRUST; /* until waits prove long */
        p->watch = calloc(DW_MAX_WATCH, sizeof(*p->watch));
        if (!p->watch)
                return -ENOMEM;
        for (unsigned i = 0; i < DW_MAX_WATCH; i++)
                p->watch[i].fd = -1;
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&p->yield_cond, &ca);
        pthread_condattr_destroy(&ca);
        pthread_mutex_init(&p->yield_lock, NULL);
        p->yield_init = true;
        p->epfd = epoll_create1(EPOLL_CLOEXEC);
        p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (p->epfd < 0 || p->wake_fd < 0)
                goto fail;
        /* With io_uring the ring fd says "datagrams received"; the socket
         * itself is only watched (EPOLLOUT) while a send waits for room. The
         * plain socket joins the set for EPOLLIN only when a progress thread
         * starts (dw_progress_start): application-driven steps read it
         * directly, and a socket in an epoll set costs every datagram that
         * arrives an epoll callback in the sender's delivery path. */
        struct epoll_event ev = {.events = EPOLLIN};
        if (dw_udp_uring_on(p->dev.udp)) {
                int rx_fd = dw_udp_poll_fd(p->dev.udp);
                ev.data.u64 = dw_ev_data(rx_fd, DW_TAG_UDP);
                if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, rx_fd, &ev) < 0)
                        goto fail;
        }
        ev.data.u64 = dw_ev_data(p->wake_fd, DW_TAG_WAKE);
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->wake_fd, &ev) < 0)
                goto fail;
        return 0;
fail:;
        int err = -errno;
        dw_progress_fini(p);
        return err ? err : -ENOMEM;
}

int dw_progress_add_transport(struct dw_progress *p, const struct dw_transport_ops *ops)
{
        if (p->ntransport >= DW_MAX_TRANSPORT)
                return -ENOSPC;
        p->transport[p->ntransport++] = ops;
        return 0;
}

void dw_progress_fini(struct dw_progress *p)
{
        if (p->epfd >= 0)
                close(p->epfd);
        if (p->wake_fd >= 0)
                close(p->wake_fd);
        p->epfd = p->wake_fd = -1;
        free(p->watch);
        p->watch = NULL;
        if (p->yield_init) {
                pthread_cond_destroy(&p->yield_cond);
                pthread_mutex_destroy(&p->yield_lock);
                p->yield_init = false;
        }
}

void dw_progress_wake(struct dw_progress *p)
{
        uint64_t one = 1;
        if (p->wake_fd >= 0 && write(p->wake_fd, &one, sizeof(one)) < 0) {
                /* EAGAIN: the counter is already non-zero, the thread will wake. */
        }
}

void dw_progress_timer(struct dw_progress *p, uint64_t abs_ns)
{
        if (abs_ns >= p->deadline_ns)
                return;
        p->deadline_ns = abs_ns;
        /* Whoever sleeps on the set (the thread, a driver) wakes for it. */
        bool wake = false;
        if (abs_ns < atomic_load_explicit(&p->thread_sleep_until, memory_order_relaxed)) {
                atomic_store_explicit(&p->thread_sleep_until, abs_ns, memory_order_relaxed);
                wake = true;
        }
        if (abs_ns < atomic_load_explicit(&p->driver_sleep_until, memory_order_relaxed)) {
                atomic_store_explicit(&p->driver_sleep_until, abs_ns, memory_order_relaxed);
                wake = true;
        }
        if (wake)
                dw_progress_wake(p);
}

/* Does the epoll set watch the plain UDP socket for EPOLLIN? Only while
 * someone sleeps on the set for its datagrams (udp_in_epoll: a thread, or an
 * external loop), not while the fault throttle holds reading back
 * (udp_in_held) and not while the thread is parked (udp_in_parked: the
 * polling application reads the socket itself, and a socket in an epoll set
 * costs every arriving datagram an epoll callback on the ping-pong's
 * critical path). */
static bool dw_progress_udp_wants_in(const struct dw_progress *p)
{
        return !dw_udp_uring_on(p->dev.udp) && p->udp_in_epoll && !p->udp_in_held &&
               !p->udp_in_parked;
}

/* Puts the UDP socket's registration in the epoll set in line with what is
 * wanted (EPOLLIN above, EPOLLOUT while a send waits for room): added,
 * changed or removed. Lock held. */
static int dw_progress_udp_sync(struct dw_progress *p)
{
        bool in = dw_progress_udp_wants_in(p), out = p->udp_wants_out;
        uint32_t events = (in ? EPOLLIN : 0) | (out ? EPOLLOUT : 0);
        if (events == p->udp_events)
                return 0;
        struct epoll_event ev = {.events = events,
                                 .data.u64 = dw_ev_data(p->dev.udp->fd, DW_TAG_UDP)};
        int op = !p->udp_events ? EPOLL_CTL_ADD : events ? EPOLL_CTL_MOD : EPOLL_CTL_DEL;
        if (epoll_ctl(p->epfd, op, p->dev.udp->fd, &ev) < 0)
                return -errno;
        p->udp_events = events;
        return 0;
}

void dw_progress_tx_wait(struct dw_progress *p, bool wait)
{
        if (wait)
                p->ntx_pending++;
        else if (p->ntx_pending > 0)
                p->ntx_pending--;
        /* The thread sleeps until the socket has room again. */
        p->udp_wants_out = p->ntx_pending > 0;
        dw_progress_udp_sync(p);
}

/* ---- watched fds --------------------------------------------------------- */

static int dw_watch_find(struct dw_progress *p, int fd)
{
        for (unsigned i = 0; i < DW_MAX_WATCH; i++)
                if (p->watch[i].fd == fd)
                        return (int)i;
        return -1;
}

int dw_progress_watch_fd(struct dw_progress *p, int fd, uint32_t events, dw_watch_fn fn, void *ctx)
{
        if (fd < 0 || !fn)
                return -EINVAL;
        if (dw_watch_find(p, fd) >= 0)
                return -EEXIST;
        int slot = dw_watch_find(p, -1);
        if (slot < 0)
                return -ENOSPC;
        struct epoll_event ev = {.events = events,
                                 .data.u64 = dw_ev_data(fd, DW_TAG_WATCH + (uint32_t)slot)};
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
                return -errno;
        p->watch[slot] = (struct dw_watch){.fd = fd, .events = events, .fn = fn, .ctx = ctx};
        p->nwatch++;
        if (events & EPOLLOUT)
                p->nwatch_out++;
        return 0;
}

int dw_progress_modify_fd(struct dw_progress *p, int fd, uint32_t events)
{
        int slot = dw_watch_find(p, fd);
        if (slot < 0)
                return -ENOENT;
        if (p->watch[slot].events == events)
                return 0;
        struct epoll_event ev = {.events = events,
                                 .data.u64 = dw_ev_data(fd, DW_TAG_WATCH + (uint32_t)slot)};
        if (epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev) < 0)
                return -errno;
        if ((events & EPOLLOUT) && !(p->watch[slot].events & EPOLLOUT))
                p->nwatch_out++;
        else if (!(events & EPOLLOUT) && (p->watch[slot].events & EPOLLOUT))
                p->nwatch_out--;
        p->watch[slot].events = events;
        return 0;
}

int dw_progress_unwatch_fd(struct dw_progress *p, int fd)
{
        int slot = dw_watch_find(p, fd);
        if (slot < 0)
                return -ENOENT;
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, NULL);
        if (p->watch[slot].events & EPOLLOUT)
                p->nwatch_out--;
        p->watch[slot].fd = -1;
        p->watch[slot].fn = NULL;
        p->nwatch--;
        return 0;
}

/* ---- the step --------------------------------------------------------------- */

static int dw_progress_rx_direct(struct dw_progress *p)
{
        for (unsigned t = 0; t < p->ntransport; t++) {
                int dr = p->transport[t]->rx_direct ? p->transport[t]->rx_direct(p->dev.handle) : 0;
                if (dr != 0)
                        return dr;
        }
        return 0;
}

static int dw_progress_rx(struct dw_progress *p, int budget)
{
        struct dw_device *dev = p->dev.handle;
        struct dw_udp *udp = p->dev.udp;
        void (*rx_dgram)(struct dw_device *, uint8_t *, size_t, const struct sockaddr_in *,
                         uint64_t) = NULL;
        int work = 0;
        for (unsigned t = 0; t < p->ntransport; t++) {
                if (p->transport[t]->rx_begin)
                        p->transport[t]->rx_begin(dev);
                if (!rx_dgram)
                        rx_dgram = p->transport[t]->rx_dgram;
        }
        if (!rx_dgram)
                return 0;
        /* DIWARP_FAULT=slowrx: a receiver whose memory takes the data slowly
         * leaves it in the socket, as a slow NVM target stalls its NIC; the
         * direct placement path, which reads one datagram of unknown size at
         * a time, stays out of it. */
        bool slow = dw_fault_rx_throttled(p->dev.fault);
        while (work < budget) {
                if (slow) {
                        uint64_t now = dw_now_ns(), at = dw_fault_rx_wait(p->dev.fault, now);
                        if (at) {
                                (*p->dev.fault_slowrx_waits)++;
                                dw_progress_timer(p, at);
                                break;
                        }
                }
                int dr = slow ? 0 : dw_progress_rx_direct(p);
                if (dr == 1) {
                        work++;
                        continue;
                }
                if (dr < 0)
                        break; /* socket drained */
                int want = budget - work < DW_UDP_RX_BATCH ? budget - work : DW_UDP_RX_BATCH;
                if (dr == 2)
                        want = 1;
                if (slow && want > DW_FAULT_SLOWRX_BATCH)
                        want = DW_FAULT_SLOWRX_BATCH;
                int n = dw_udp_recv_batch(udp, want);
                if (n <= 0)
                        break;
                uint64_t bytes = 0;
                for (int i = 0; i < n; i++) {
                        if (dw_udp_rx_truncated(udp, i)) {
                                (*p->dev.rx_dropped_malformed)++;
                                continue;
                        }
                        bytes += dw_udp_rx_len(udp, i);
                        rx_dgram(dev, dw_udp_rx_pkt(udp, i), dw_udp_rx_len(udp, i),
                                 &udp->rx_addr[i], dw_udp_rx_stamp(udp, i));
                }
                if (slow)
                        dw_fault_rx_took(p->dev.fault, bytes, dw_now_ns());
                dw_udp_rx_done(udp);
                work += n;
                if (n < want)
                        break; /* socket drained */
        }
        return work;
}

/* Sends that wait for socket room: the first transport with a tx hook
 * serves its waiting QPs (round-robin, so one busy QP cannot starve the
 * others). */
static int dw_progress_tx(struct dw_progress *p, int budget)
{
        if (p->ntx_pending == 0)
                return 0;
        for (unsigned t = 0; t < p->ntransport; t++)
                if (p->transport[t]->tx)
                        return p->transport[t]->tx(p->dev.handle, budget);
        return 0;
}

/* looked: the application's own epoll look found evs. The wake eventfd is
 * then left to the thread, if one runs: reading it here would take the
 * wake-up from a thread asleep in epoll_wait, which then sleeps on with the
 * timeout it computed before the wake-up (a timer armed since, the one the
 * wake-up was for, would never be served while the application blocks on
 * its completion channel). */
static int dw_progress_watch_events(struct dw_progress *p, const struct epoll_event *evs, int n,
                                    bool looked)
{
        int work = 0;
        for (int i = 0; i < n; i++) {
                uint32_t tag = (uint32_t)evs[i].data.u64;
                int fd = (int)(evs[i].data.u64 >> 32);
                if (tag == DW_TAG_WAKE) {
                        if (looked && p->started)
                                continue;
                        uint64_t v;
                        if (read(p->wake_fd, &v, sizeof(v)) < 0) {
                                /* EAGAIN: already drained */
                        }
                        continue;
                }
                if (tag < DW_TAG_WATCH)
                        continue; /* UDP: the receive step below handles it */
                uint32_t slot = tag - DW_TAG_WATCH;
                if (slot >= DW_MAX_WATCH || p->watch[slot].fd != fd || !p->watch[slot].fn)
                        continue; /* unwatched since epoll_wait */
                int r = p->watch[slot].fn(p->dev.handle, fd, evs[i].events, p->watch[slot].ctx);
                if (r > 0)
                        work += r;
        }
        return work;
}

/* Application-driven steps: is it time for a look at the epoll set? The data
 * sockets are read directly every step (a busy-polling application then pays
 * one recvmmsg/recvmsg per step, as a raw-socket program would, instead of an
 * epoll_wait before it); what only epoll sees (listeners, CM handshakes, the
 * wake eventfd) is looked at every DW_PROGRESS_EPOLL_EVERY steps, and when
 * the coarse clock ticked (a few ms) since the last look, which is checked
 * every 4th step: an application calling rarely still sees it within 4
 * calls. A fd waiting for EPOLLOUT (a blocked RC stream) is looked at every
 * step. */
#define DW_PROGRESS_EPOLL_EVERY 64

static bool dw_progress_epoll_due(struct dw_progress *p)
{
        if (p->nwatch == 0)
                return false;
        if (p->nwatch_out > 0 || ++p->since_epoll >= DW_PROGRESS_EPOLL_EVERY)
                return true;
        if (p->since_epoll & 3)
                return false; /* the clock is read every 4th step */
        struct timespec ts;
        /* The coarse clock is a plain read of the vDSO page (no TSC read, which
         * costs ~200 ns on some VMs). */
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        int64_t tick = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        return tick != p->epoll_tick;
}

/* The epoll part of a step: looks at the epoll set when look (an
 * application-driven step), then serves the watched fds among evs[0..nev)
 * and says whether the UDP socket is readable (*udp_ready, left alone when
 * the event list may be incomplete). own: the looking thread is the one that
 * sleeps on the set (a driver, dw_progress_wait), so the wake eventfd is its
 * to read. Out of line: the event array and the loops stay out of the
 * busy-polling step that does not look. */
static __attribute__((noinline)) int dw_progress_events(struct dw_progress *p,
                                                        const struct epoll_event *evs, int nev,
                                                        bool look, bool own, bool *udp_ready)
{
        struct epoll_event local[DW_MAX_EVENTS];
        int64_t tick = 0;
        if (look || p->housekeeping) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
                tick = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        }
        if (look) {
                nev = epoll_wait(p->epfd, local, DW_MAX_EVENTS, 0);
                evs = local;
                p->since_epoll = 0;
                p->epoll_tick = tick;
        }
        if (p->housekeeping && tick - p->housekeeping_tick >= DW_PROGRESS_HOUSEKEEPING_NS) {
                p->housekeeping_tick = tick;
                p->housekeeping(p->dev.handle);
        }
        if (!dw_udp_uring_on(p->dev.udp) && !(p->udp_events & EPOLLIN)) {
                /* The set does not watch the socket (no thread runs, or it is
                 * parked): a look reads it, also from the step of post_*, so
                 * an application that only posts still receives. */
                if (look)
                        *udp_ready = p->ndgram > 0 || p->nwatch == 0;
        } else if (nev >= 0 && nev < DW_MAX_EVENTS) {
                /* epoll already told whether the UDP socket is readable: skip
                 * a recvmmsg that would only return EAGAIN. */
                *udp_ready = false;
                for (int i = 0; i < nev; i++)
                        if ((uint32_t)evs[i].data.u64 == DW_TAG_UDP &&
                            (evs[i].events & (EPOLLIN | EPOLLERR)))
                                *udp_ready = true;
        }
        return nev > 0 ? dw_progress_watch_events(p, evs, nev, look && !own) : 0;
}

/* The application polls while the thread sleeps on the set without end (no
 * timer due, its looks spent: the program was idle). Data that comes now is
 * read by the poller before the thread gets a core, and the kernel puts the
 * thread back to sleep without returning to it, so it never learns that the
 * program polls, nor, on a shared host, that the poller waits for its core:
 * beside three more fi_pingpong processes on one core, the devices turned
 * shared 145-275 ms after their first poll, where the two windows it takes
 * are 20-30 ms. So the first such step wakes the thread for a look (one
 * eventfd write): it parks, and its parked looks watch the poller. Lock
 * held. */
static void dw_progress_thread_look(struct dw_progress *p)
{
        atomic_store_explicit(&p->thread_sleep_until, 0, memory_order_relaxed);
        dw_progress_wake(p);
}

/* How a step runs (dw_progress_run's how): */
#define DW_RUN_READ  1u /* read the data sockets directly (not the steps of post_*) */
#define DW_RUN_COUNT 2u /* an application's reading step: counted in app_reads */
#define DW_RUN_LOOK  4u /* look at the epoll set whatever dw_progress_epoll_due says */
#define DW_RUN_OWN   8u /* the caller sleeps on the set: its look reads the wake eventfd */

/* evs: the events the caller's epoll_wait returned (the thread, an external
 * loop); NULL: an application-driven step, which reads the sockets directly
 * (DW_RUN_READ) and looks at the set when due. */
static int dw_progress_run(struct dw_progress *p, int budget, const struct epoll_event *evs,
                           int nev, unsigned how)
{
        int work = 0;
        bool read = how & DW_RUN_READ;

        p->steps++;
        p->deadline_ns = UINT64_MAX;
        if (budget <= 0)
                budget = DW_PROGRESS_BUDGET;
        bool app = evs == NULL;
        if (app && (how & DW_RUN_COUNT)) { /* single writer (lock held); the thread only loads it */
                if (atomic_load_explicit(&p->thread_sleep_until, memory_order_relaxed) ==
                    UINT64_MAX)
                        dw_progress_thread_look(p);
                atomic_store_explicit(&p->app_reads,
                                      atomic_load_explicit(&p->app_reads, memory_order_relaxed) + 1,
                                      memory_order_relaxed);
                atomic_store_explicit(&p->app_tid, dw_progress_tid(), memory_order_relaxed);
                /* The first poll after a driven wait (dw_progress_wait): the
                 * wait's step has just read the sockets dry; reading them
                 * again would only return EAGAIN. Data that came since keeps
                 * the set readable for the next wait, or the next poll reads
                 * it. */
                if (p->drained) {
                        p->drained = false;
                        read = false;
                }
        } else {
                p->drained = false;
        }
        bool look = app && ((how & DW_RUN_LOOK) || dw_progress_epoll_due(p));
        if (app && !look && read) {
                /* Streams read directly; a transport with more live streams
                 * than it polls (or none pollable) falls back to the epoll
                 * look. */
                for (unsigned t = 0; t < p->ntransport; t++) {
                        if (!p->transport[t]->poll)
                                continue;
                        int r = p->transport[t]->poll(p->dev.handle, budget);
                        if (r < 0)
                                look = p->nwatch > 0;
                        else
                                work += r;
                }
        }
        /* Without an epoll look the UDP socket is read when datagram QPs
         * exist (or nothing else is watched, as before). */
        bool udp_ready = read && (p->ndgram > 0 || p->nwatch == 0);
        if (look || evs)
                work += dw_progress_events(p, evs, nev, look, how & DW_RUN_OWN, &udp_ready);
        /* io_uring: receive completions reaped while the sends waited. */
        bool uring = dw_udp_uring_on(p->dev.udp);
        if (uring && dw_udp_rx_stashed(p->dev.udp))
                udp_ready = true;
        if (udp_ready)
                work += dw_progress_rx(p, budget);
        if (p->dev.fault_on && dw_fault_held_count(p->dev.fault) > 0) {
                int r = dw_fault_flush_due(p->dev.fault, dw_now_ns(), dw_udp_send_fn, p->dev.udp);
                if (r > 0)
                        work += r;
        }
        work += dw_progress_tx(p, budget);
        if (uring && dw_udp_rx_stashed(p->dev.udp))
                work += dw_progress_rx(p, budget);
        /* Each asks for a step at its next deadline through dw_progress_timer. */
        for (unsigned t = 0; t < p->ntransport; t++) {
                int r = p->transport[t]->progress ? p->transport[t]->progress(p->dev.handle, budget)
                                                  : 0;
                if (r > 0)
                        work += r;
        }
        return work;
}

int dw_progress_step(struct dw_progress *p, int budget)
{
        return dw_progress_run(p, budget, NULL, 0, DW_RUN_READ | DW_RUN_COUNT);
}

int dw_progress_step_post(struct dw_progress *p, int budget)
{
        return dw_progress_run(p, budget, NULL, 0, 0);
}

/* ---- the progress thread ------------------------------------------------------ */

/* How long the thread may sleep: ns, -1 = until a fd is ready. Transports'
 * timers are µs-scale (delayed ACKs, pacing, tail loss probes): the sleep
 * keeps nanosecond resolution (epoll_pwait2), a millisecond round-up would
 * hold every delayed ACK of a passive target a whole millisecond. */
static int64_t dw_progress_timeout_ns(struct dw_progress *p)
{
        uint64_t due = p->deadline_ns;
        if (p->dev.fault_on && dw_fault_held_count(p->dev.fault) > 0) {
                uint64_t f = dw_fault_next_due_ns(p->dev.fault);
                if (f < due)
                        due = f;
        }
        if (dw_udp_rx_stashed(p->dev.udp))
                return 0;
        if (p->udp_in_held) {
                /* Until the throttle lets reading resume (now 0: its time even
                 * when that has just passed), the socket cannot wake us. */
                uint64_t f = dw_fault_rx_wait(p->dev.fault, 0);
                if (f < due)
                        due = f;
        }
        if (due == UINT64_MAX)
                return -1; /* idle: sleep until a fd is ready */
        uint64_t now = dw_now_ns();
        if (due <= now)
                return 0;
        uint64_t ns = due - now;
        return ns > 60000000000ull ? 60000000000ll : (int64_t)ns;
}

/* epoll_wait with a nanosecond timeout (-1: none); kernels before 5.11 have
 * no epoll_pwait2 and get the millisecond rounded up. */
static int dw_progress_epoll(struct dw_progress *p, struct epoll_event *evs, int64_t timeout_ns)
{
        if (!p->no_pwait2) {
                struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
                int n =
                    epoll_pwait2(p->epfd, evs, DW_MAX_EVENTS, timeout_ns < 0 ? NULL : &ts, NULL);
                if (n >= 0 || errno != ENOSYS)
                        return n;
                p->no_pwait2 = true;
        }
        int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
        return epoll_wait(p->epfd, evs, DW_MAX_EVENTS, ms);
}

/* Hybrid progress. The thread exists for passive targets (an RDMA Write or
 * Read target, a program computing or polling its own memory, one blocked on
 * a completion channel): nothing else drives their streams. A program that
 * busy-polls its CQ drives progress itself, and a thread woken by every
 * datagram it is about to read only competes with it for the device lock and,
 * on a machine with as many spinning programs as cores, for the core (the
 * wake-up waits for the spinner's time slice: milliseconds).
 *
 * So when data wakes the thread and the application ran at least
 * DW_PARK_READS reading steps (cq_poll on a short CQ, diwarp_progress: the
 * app_reads count) since the thread's previous wake-up, the thread leaves the
 * data to the application and parks: it sleeps on the wake eventfd only, for
 * DW_PARK_MIN_NS, doubling up to DW_PARK_MAX_NS while the application keeps
 * reading, and returns to epoll_wait on the data fds (level-triggered: data
 * left unread wakes it at once) as soon as one park interval saw fewer than
 * DW_PARK_READS reading steps. A program that polls memory or computes makes
 * no reading steps (post_* steps do not count: they do not read the sockets),
 * so the thread serves it at once; one that switches from polling its CQ to
 * computing waits for the thread's next look but one, once. Parked, the
 * thread costs one wake-up per look; idle, none.
 *
 * That wake-up is not free where the thread shares the poller's core: on a
 * 2-core VM, pinned 64 B ping-pongs lost 0.3 µs (UD) and 0.45 µs (RD) a
 * half round trip to 1 ms looks against DIWARP_PROGRESS=app, mostly for the
 * timer interrupt each look programs. So a look at the full interval,
 * begun while no CQ of the device is armed, carries DW_PARK_SLACK times
 * its length in timer slack: it may wait for the scheduler tick that a
 * core running a poller takes anyway (4 ms at HZ=250). A program about to
 * sleep on its completion channel arms a CQ first (ibv_req_notify_cq, as
 * rsockets' rpoll does before its own poll(2) on the channel fd): that
 * arm wakes a thread in such a sleep at once (dwe_cq_req_notify,
 * dw_progress_parked_late), and while any CQ is armed the looks keep to
 * the interval without slack. Only a program that stops polling without
 * arming (it computes) waits for the later look: 5-9 ms instead of 1-5
 * (rc_progress_parked; 15 ms beside a build loop). Slack alone, without
 * the arm's wake-up, slowed iperf3 over rsockets from 1.2-1.7 to 0.8-1.0
 * Gbit/s beside a build loop;
 * a timerfd the poller's steps push ahead cost more than it saved (each
 * push reprograms a timer, 2.3 µs a call there): docs/PERFORMANCE.md,
 * "The parked thread's look". */
#define DW_PARK_READS  4u
#define DW_PARK_MIN_NS 100000L
#define DW_PARK_MAX_NS 1000000L
#define DW_PARK_SLACK  4ul
#define DW_RUN_LOOKS   2u

/* EEVDF (Linux >= 6.12) lets a task with a shorter slice preempt the running
 * one when it wakes. The thread runs in short bursts; with the default slice
 * its wake-up on a core where the application spins waits until the
 * spinner's slice ends (up to milliseconds, measured: ib_write_lat at 8 ms).
 * Asking for a 100 us slice (the minimum; no privilege needed for
 * SCHED_OTHER) makes it run at once. Older kernels ignore or refuse it:
 * harmless either way. */
struct dw_sched_attr {
        uint32_t size, sched_policy;
        uint64_t sched_flags;
        int32_t sched_nice;
        uint32_t sched_priority;
        uint64_t sched_runtime, sched_deadline, sched_period;
};

int dw_progress_short_slice(void)
{
#if defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
        struct dw_sched_attr a;
        memset(&a, 0, sizeof(a));
        if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) != 0)
                return -errno;
        if (a.sched_policy != SCHED_OTHER)
                return -EOPNOTSUPP;
        a.size = sizeof(a);
        a.sched_flags = 0;
        a.sched_runtime = 100000;
        if (syscall(SYS_sched_setattr, 0, &a, 0) != 0) {
                int err = errno;
                dw_dbg("short time slice not available: %s", strerror(err));
                return err == EINVAL || err == E2BIG ? -EOPNOTSUPP : -err;
        }
        return 0;
#else
        return -EOPNOTSUPP;
#endif
}

int diwarpdv_short_time_slice(void)
{
        return dw_progress_short_slice();
}

/* DIWARP_FAULT=slowrx: while the throttle holds reading back, the socket's
 * readiness (level-triggered) must not wake the thread, which would spin
 * until the throttle's time (dw_progress_timeout_ns) and take the core from
 * the processes beside it. */
static void dw_progress_udp_hold(struct dw_progress *p, bool hold)
{
        p->udp_in_held = hold;
        dw_progress_udp_sync(p);
}

/* The thread parks (stops watching the data) or comes back to it. A driver
 * (dw_progress_wait) sleeps on the set for the datagrams: the thread does
 * not take the UDP socket out of it then, and says so (false). */
static bool dw_progress_udp_park(struct dw_progress *p, bool park)
{
        pthread_mutex_lock(p->dev.lock);
        bool ok = !park || !atomic_load(&p->driver);
        if (ok) {
                p->udp_in_parked = park;
                dw_progress_udp_sync(p);
        }
        pthread_mutex_unlock(p->dev.lock);
        return ok;
}

/* Before whoever sleeps on the set (the thread, a driver) sleeps: the
 * DIWARP_FAULT=slowrx throttle's hold on the UDP socket, and how long it
 * may sleep (ns, -1: until a fd is ready). Lock held. */
static int64_t dw_progress_sleep_prepare(struct dw_progress *p)
{
        if (dw_fault_rx_throttled(p->dev.fault))
                dw_progress_udp_hold(p, dw_fault_rx_wait(p->dev.fault, dw_now_ns()) != 0);
        return dw_progress_timeout_ns(p);
}

/* Shared hosts (below): a poll that finds its CQ empty naps instead of
 * spinning. A spinning poller, even one that calls sched_yield, stays
 * runnable and takes its share of a core that the CPU hogs beside it share
 * too: the thread that has the work (datagrams to read, ACKs to send) then
 * waits for its turn. Asleep, the poller leaves the core to the thread, and
 * the thread's step that pushes a completion wakes it (one FUTEX_WAKE, only
 * while somebody naps). Measured, one RD Write pair through a 2 Gbit/s tbf
 * beside a nice-0 `yes` per core: 0.62-0.69 Gbit/s with sched_yield, 1.15-1.29
 * with a 50-200 us sleep, against TCP's 1.3-1.4 (progress/README.md). The
 * nap is bounded (DW_SHARED_NAP_NS) for a program that polls its CQ between
 * other work: memory it polls, a completion pushed outside a thread step.
 * A nap that ran out doubles the next, up to DW_SHARED_NAP_MAX_NS: with 8
 * independent pairs on the 2 cores every empty nap's wake-up was a context
 * switch for nothing (8 RD pairs through 2 Gbit/s: x0.40-0.64 of TCP with
 * 100 us naps, x0.48-0.86 doubling up to 1 ms). */
__thread unsigned dw_progress_empty_polls;

#define DW_SHARED_NAP_NS     100000L
#define DW_SHARED_NAP_MAX_NS 1000000L

void dw_progress_nap(struct dw_progress *p, uint32_t gen, bool for_work)
{
        /* Per polling thread: DW_SHARED_NAP_NS after a nap a completion
         * ended, doubled by each that ran out, up to DW_SHARED_NAP_MAX_NS. */
        static __thread long nap_ns;
        if (!nap_ns)
                nap_ns = DW_SHARED_NAP_NS;
        struct timespec ts = {0, nap_ns};
        syscall(SYS_futex, &p->nap_gen, FUTEX_WAIT_PRIVATE, gen, &ts, NULL, 0);
        dw_progress_nap_cancel(p, for_work);
        if (atomic_load(&p->nap_gen) != gen)
                nap_ns = DW_SHARED_NAP_NS;
        else if (nap_ns < DW_SHARED_NAP_MAX_NS)
                nap_ns = nap_ns * 2 < DW_SHARED_NAP_MAX_NS ? nap_ns * 2 : DW_SHARED_NAP_MAX_NS;
}

/* After a thread step (lock held): completions were pushed and pollers nap,
 * or the step did work and diwarp_progress callers nap: true if they are to
 * be woken (dw_progress_nap_wake, once the lock is released). The fence
 * orders the pushes before the look at nappers, as the napper's count
 * orders itself before its last look at its CQ. A diwarp_progress napper
 * has nothing to look at before it sleeps, so its case takes no fence (a
 * step that did work pays one relaxed load): a wake-up it misses ends with
 * its bound. */
static bool dw_progress_nap_due(struct dw_progress *p, int work)
{
        if (p->cq_pushes != p->cq_pushes_seen) {
                p->cq_pushes_seen = p->cq_pushes;
                atomic_thread_fence(memory_order_seq_cst);
                if (!atomic_load_explicit(&p->nappers, memory_order_relaxed))
                        return false;
        } else if (work <= 0 || !atomic_load_explicit(&p->work_nappers, memory_order_relaxed)) {
                return false;
        }
        atomic_fetch_add(&p->nap_gen, 1);
        return true;
}

/* Wakes the nappers after the device lock is released: a napper woken on
 * the waker's core runs at once (wake-up preemption) and its first act is
 * to take the lock (to pop, to post the reply); woken under the lock it
 * blocks on it and the core goes back to the waker only to release it,
 * two context switches more per message. */
static void dw_progress_nap_wake(struct dw_progress *p)
{
        syscall(SYS_futex, &p->nap_gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* The thread's (or an external loop's) step for the events its epoll_wait
 * returned. Not while a driver drives (checked under the lock: a driver
 * registers before it takes the lock): the wake eventfd among the events is
 * then the driver's, and reading it could take a timer's wake-up from it.
 * false: a driver drives, nothing was done. */
static bool dw_progress_locked_run(struct dw_progress *p, const struct epoll_event *evs, int n)
{
        bool wake = false;
        pthread_mutex_lock(p->dev.lock);
        bool driven = atomic_load(&p->driver) != 0;
        if (!p->stop && !driven) {
                int work = dw_progress_run(p, DW_PROGRESS_BUDGET * 4, evs, n, DW_RUN_READ);
                wake = dw_progress_nap_due(p, work);
        }
        pthread_mutex_unlock(p->dev.lock);
        if (wake)
                dw_progress_nap_wake(p);
        return !driven;
}

/* ---- event-driven waits ------------------------------------------------------ */

static int dw_progress_udp_watch(struct dw_progress *p);

/* Wakes a yielded thread (see dw_progress_thread). Any thread. */
static void dw_progress_kick(struct dw_progress *p)
{
        pthread_mutex_lock(&p->yield_lock);
        p->yield_kick = true;
        pthread_cond_signal(&p->yield_cond);
        pthread_mutex_unlock(&p->yield_lock);
}

/* The yielded thread's sleep: ns, or until kicked. */
static void dw_progress_yield_sleep(struct dw_progress *p, long ns)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += ns;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_mutex_lock(&p->yield_lock);
        while (!p->yield_kick && !__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
                if (pthread_cond_timedwait(&p->yield_cond, &p->yield_lock, &ts) == ETIMEDOUT)
                        break;
        p->yield_kick = false;
        pthread_mutex_unlock(&p->yield_lock);
}

/* Does an application thread still drive the device from its waits (the
 * yielded thread's test): one drives now, or one began a wait since the
 * thread last looked (*seen) and no thread waits without driving (those
 * need the thread once the driver has gone)? Updates *seen. */
static bool dw_progress_driven(struct dw_progress *p, uint64_t *seen)
{
        uint64_t d = atomic_load(&p->drives);
        bool moved = d != *seen;
        *seen = d;
        if (atomic_load(&p->driver))
                return true;
        return moved && atomic_load(&p->waiters) == 0;
}

/* A waiter cancelled in its sleep (poll and ppoll are cancellation points;
 * no lock is held there) leaves no count behind, and a driver no role: the
 * thread would stay yielded to it for ever. */
static void dw_progress_beside_cancelled(void *arg)
{
        struct dw_progress *p = arg;
        atomic_fetch_sub(&p->waiters, 1);
}

static void dw_progress_driver_cancelled(void *arg)
{
        struct dw_progress *p = arg;
        atomic_store_explicit(&p->driver_sleep_until, 0, memory_order_relaxed);
        atomic_store(&p->driver, 0);
        dw_progress_kick(p);
}

/* A waiter that is not the driver: sleeps on fd alone until it turns
 * readable or the driver leaves. 0: woken, look at done again; 1: the
 * driver's role is free, try to take it; -errno. */
static int dw_progress_wait_beside(struct dw_progress *p, int fd)
{
        /* Counted first, then the driver looked at again: either the
         * driver, leaving, sees the count (and hands this waiter to the
         * thread), or this sees it gone (sequentially consistent, both). */
        atomic_fetch_add(&p->waiters, 1);
        if (!atomic_load(&p->driver)) {
                atomic_fetch_sub(&p->waiters, 1);
                return 1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int n;
        pthread_cleanup_push(dw_progress_beside_cancelled, p);
        n = poll(&pfd, 1, -1);
        pthread_cleanup_pop(0);
        int err = n < 0 ? -errno : 0;
        atomic_fetch_sub(&p->waiters, 1);
        return err;
}

/* Event-driven waits spin before they sleep (DIWARP_WAIT_SPIN_US, default
 * 50 us), as a kernel socket with busy_poll does. A sleeping waiter is woken
 * by the sender's write, and the kernel puts it on the waker's core only
 * when both ran there before; once a ping-pong's two ends sit on different
 * cores every message wakes an idle core (an interprocessor interrupt; on a
 * VM's halted vCPU 25-60 us here), where a waiter that still runs sees the
 * data at once. So the driver first looks without sleeping (zero-timeout
 * ppoll, no lock held), giving its core away between looks (sched_yield: a
 * peer woken on the same core runs first), and sleeps when the spin ends.
 *
 * Adaptive, so that a program whose waits are long pays nothing: a spin that
 * ends in a completion restores full trust, a spin that ends in a sleep
 * halves it; with none left, one wait in DW_SPIN_PROBE_EVERY spins to find
 * out whether waits have turned short again.
 *
 * And only on a core of its own. Beside a CPU hog (a build, more programs
 * than cores) the time a waiter spins is counted against it by the
 * scheduler, which then runs the hog a whole slice before it again, where a
 * waiter that sleeps preempts the hog when woken: beside a nice-19 `yes` per
 * core the spinning ping-pong once took 139 us a round trip, the sleeping
 * one 18 (on a later day of this VM that hog took the core far less often
 * than a nice-0 one, and spinning on beside it paid; see below).
 * A spin sees this as a gap between two of its looks far longer than a
 * peer's turn on the same core (a message's handling, some microseconds):
 * DW_SPIN_STOLEN_NS or more, the core was taken from it. One such gap
 * proves little: a VM's vCPU stall, or a peer's step on the same core
 * under a sanitizer, takes 0.1-0.3 ms now and then (1-12 times a second
 * on a quiet host here), and turning the spin off for each cost an
 * event-driven ping-pong more than the spin saved (RC over RD, release,
 * quiet, ends on cores 0 and 1: 59 us a round trip against 36 spinning on
 * regardless; beside a nice-19 yes per core 69-99 against 29-62). A hog
 * takes the core every few milliseconds (465 gaps in 3 000 round trips
 * beside a nice-0 yes per core, where spinning on regardless took 660 us
 * a round trip). So the spin turns off once the core was taken
 * DW_SPIN_TAKEN_RUN times in a row, each within DW_SPIN_TAKEN_WINDOW_NS
 * of the one before. Waits then sleep at once for spin_off_ns:
 * DW_SPIN_OFF_MIN_NS, doubled (to DW_SPIN_OFF_MAX_NS) when the spin turns
 * off again within 4 off periods of the last time. */
#define DW_SPIN_STOLEN_NS       100000u
#define DW_SPIN_TAKEN_RUN       3u
#define DW_SPIN_TAKEN_WINDOW_NS 20000000u
#define DW_SPIN_OFF_MIN_NS      50000000u
#define DW_SPIN_OFF_MAX_NS      1600000000u

/* Lock not held. >0: a fd is ready, 0: the spin ended (until passed),
 * -EBUSY: the core was taken from the spinner, -errno. */
static int dw_progress_spin_loop(struct pollfd *pfd, uint64_t until)
{
        static const struct timespec zero = {0, 0};
        uint64_t last = dw_now_ns();
        for (;;) {
                pfd[0].revents = pfd[1].revents = 0;
                int n = ppoll(pfd, 2, &zero, NULL);
                if (n != 0)
                        return n < 0 ? -errno : n;
                uint64_t now = dw_now_ns();
                if (now - last >= DW_SPIN_STOLEN_NS)
                        return -EBUSY;
                if (now >= until)
                        return 0;
                sched_yield();
                last = now;
        }
}

/* The spin, as dw_progress_spin_loop. ppoll is a cancellation point: a
 * driver cancelled there leaves no role behind, as in its sleep. */
static int dw_progress_wait_spin(struct dw_progress *p, struct pollfd *pfd, uint64_t until)
{
        int r;
        pthread_cleanup_push(dw_progress_driver_cancelled, p);
        r = dw_progress_spin_loop(pfd, until);
        pthread_cleanup_pop(0);
        return r;
}

/* The core was taken from a spin: after a run of such, no spin for a
 * while. Lock held. */
static void dw_progress_spin_stolen(struct dw_progress *p, uint64_t now)
{
        if (p->spin_takes && now - p->spin_taken_at < DW_SPIN_TAKEN_WINDOW_NS)
                p->spin_takes++;
        else
                p->spin_takes = 1;
        p->spin_taken_at = now;
        if (p->spin_takes < DW_SPIN_TAKEN_RUN)
                return;
        p->spin_takes = 0;
        if (p->spin_off_ns && now - p->spin_stolen_at < 4 * p->spin_off_ns)
                p->spin_off_ns = p->spin_off_ns * 2 < DW_SPIN_OFF_MAX_NS ? p->spin_off_ns * 2
                                                                         : DW_SPIN_OFF_MAX_NS;
        else
                p->spin_off_ns = DW_SPIN_OFF_MIN_NS;
        p->spin_stolen_at = now;
        p->spin_off_until = now + p->spin_off_ns;
}

/* The driver's sleep on pfd (t ns; <0: no timeout), a cancellation point
 * (in a function of its own: the cleanup handler's setjmp would otherwise
 * make the caller's locals unreliable). ppoll's result. */
static int dw_progress_driver_sleep(struct dw_progress *p, struct pollfd *pfd, int64_t t)
{
        struct timespec ts = {t / 1000000000, t % 1000000000};
        int n;
        pfd[0].revents = pfd[1].revents = 0;
        pthread_cleanup_push(dw_progress_driver_cancelled, p);
        n = ppoll(pfd, 2, t < 0 ? NULL : &ts, NULL);
        pthread_cleanup_pop(0);
        return n;
}

/* How long this wait may spin (ns; 0: not at all). Lock held. */
static uint64_t dw_progress_spin_budget(struct dw_progress *p)
{
        uint64_t ns = (uint64_t)p->dev.wait_spin_us * 1000u;
        if (!ns || (p->spin_off_until && dw_now_ns() < p->spin_off_until))
                return 0;
        if (p->spin_trust == 0 && ++p->spin_probe % DW_SPIN_PROBE_EVERY != 0)
                return 0;
        return ns;
}

/* One pause of the driver, lock released: spins while its spin lasts (not
 * past the transports' next timer at wake_at; t: ns to it, -1 none), else
 * sleeps. What ppoll returns, 0 when a timer came due while spinning;
 * *spin_until goes to 0 once the spin is over, *slept says it slept. */
static int dw_progress_driver_pause(struct dw_progress *p, struct pollfd *pfd, uint64_t *spin_until,
                                    int64_t t, uint64_t wake_at, bool *slept)
{
        int n = 0;
        if (*spin_until) {
                /* A timer armed meanwhile writes the wake eventfd, which the
                 * spin sees in the set: a step for it, and the spin goes on. */
                n = dw_progress_wait_spin(p, pfd, *spin_until < wake_at ? *spin_until : wake_at);
                uint64_t now = dw_now_ns();
                if (n == 0 && now < *spin_until)
                        return 0; /* the timer is due */
                if (n == -EBUSY) {
                        n = 0;
                        pthread_mutex_lock(p->dev.lock);
                        dw_progress_spin_stolen(p, now);
                        pthread_mutex_unlock(p->dev.lock);
                }
                if (n == 0) {
                        *spin_until = 0; /* spent or stolen: sleep from now on */
                        if (t >= 0)
                                t = wake_at > now ? (int64_t)(wake_at - now) : 0;
                }
        }
        if (n == 0) {
                n = dw_progress_driver_sleep(p, pfd, t);
                *slept = true;
        }
        return n;
}

/* The driver leaves: the spin's trust follows whether it slept, threads
 * that wait beside go to the progress thread, and a thread asleep on the
 * set with an older timeout (its wake-up for a timer may have been read by
 * this driver's look) is woken for the transports' next deadline. Lock
 * held; released. */
static void dw_progress_driver_leave(struct dw_progress *p, uint64_t spin_ns, bool slept)
{
        if (spin_ns) {
                if (!slept)
                        p->spin_trust = DW_SPIN_TRUST;
                else
                        p->spin_trust /= 2;
        }
        atomic_store(&p->driver, 0);
        bool kick = atomic_load(&p->waiters) > 0;
        uint64_t t = atomic_load_explicit(&p->thread_sleep_until, memory_order_relaxed);
        if (t && p->deadline_ns < t) {
                atomic_store_explicit(&p->thread_sleep_until, p->deadline_ns, memory_order_relaxed);
                dw_progress_wake(p);
        }
        pthread_mutex_unlock(p->dev.lock);
        if (kick)
                dw_progress_kick(p);
}

/* What a driver waits for: fd turning readable (-1: none) or done(ctx)
 * turning nonzero, until deadline (ns; 0: none). A napping poller's drive
 * (nap) does not spin: it drives only on a shared device, whose cores are
 * wanted by others. */
struct dw_drive {
        int fd;
        int (*done)(void *ctx);
        void *ctx;
        uint64_t deadline;
        bool nap;
};

/* The driver's sleeps and steps, the role already taken: done's value, 0
 * when the deadline passed, -errno. Driver steps wake the threads that nap
 * on nap_gen (other pollers of a shared device) as the thread's steps do. */
static int dw_progress_drive(struct dw_progress *p, const struct dw_drive *d)
{
        int r;
        atomic_fetch_add(&p->drives, 1);
        /* fd, then the set: the sockets (the UDP socket is in it while a
         * driver drives, see dw_progress_udp_park), the watched fds, the wake
         * eventfd (a timer armed for earlier than this sleep's end). */
        struct pollfd pfd[2] = {{.fd = d->fd, .events = POLLIN}, {.fd = p->epfd, .events = POLLIN}};
        bool stepped = false; /* the last thing done was this thread's step */
        pthread_mutex_lock(p->dev.lock);
        uint64_t spin_ns = d->nap ? 0 : dw_progress_spin_budget(p);
        uint64_t spin_until = spin_ns ? dw_now_ns() + spin_ns : 0;
        bool slept = false;
        if (!p->udp_in_epoll) {
                dw_progress_udp_watch(p); /* no thread started yet */
        } else if (p->udp_in_parked) {
                /* A parked thread left the UDP socket out; it is the
                 * driver's now (the thread yields as soon as it looks). */
                p->udp_in_parked = false;
                dw_progress_udp_sync(p);
        }
        for (;;) {
                /* Data already waiting keeps the set readable: no step
                 * before the first sleep. */
                if ((r = d->done(d->ctx)) != 0)
                        break;
                int64_t t = dw_progress_sleep_prepare(p);
                uint64_t now = dw_now_ns();
                if (d->deadline) {
                        if (now >= d->deadline)
                                break; /* r == 0 */
                        if (t < 0 || (uint64_t)t > d->deadline - now)
                                t = (int64_t)(d->deadline - now);
                }
                uint64_t wake_at = t < 0 ? UINT64_MAX : now + (uint64_t)t;
                atomic_store_explicit(&p->driver_sleep_until, wake_at, memory_order_relaxed);
                pthread_mutex_unlock(p->dev.lock);
                int n = dw_progress_driver_pause(p, pfd, &spin_until, t, wake_at, &slept);
                r = n < 0 ? -errno : 0;
                if (n == 0 && t >= 0 && (!d->deadline || wake_at < d->deadline))
                        atomic_fetch_add_explicit(&p->timer_wakes, 1, memory_order_relaxed);
                atomic_store_explicit(&p->driver_sleep_until, 0, memory_order_relaxed);
                pthread_mutex_lock(p->dev.lock);
                stepped = false;
                if (r < 0)
                        break; /* -EINTR lets a signal interrupt the wait */
                if (pfd[0].revents && (r = d->done(d->ctx)) != 0)
                        break;
                /* The sockets read directly first (what a ping-pong's
                 * message needs: one receive); when that found nothing, the
                 * set's readiness is something else (a listener, more
                 * streams than are read directly, the wake eventfd): a look. */
                int w = dw_progress_run(p, DW_PROGRESS_BUDGET, NULL, 0, DW_RUN_READ | DW_RUN_OWN);
                if (w == 0 && pfd[1].revents)
                        w = dw_progress_run(p, DW_PROGRESS_BUDGET, NULL, 0,
                                            DW_RUN_READ | DW_RUN_OWN | DW_RUN_LOOK);
                if (dw_progress_nap_due(p, w)) {
                        pthread_mutex_unlock(p->dev.lock);
                        dw_progress_nap_wake(p);
                        pthread_mutex_lock(p->dev.lock);
                }
                stepped = true;
                /* A nap ends with any work: the program may watch its
                 * memory for an RDMA Write, which completes nothing. */
                if (d->nap && w > 0 && (r = d->done(d->ctx)) == 0)
                        break;
        }
        p->drained = r > 0 && stepped;
        dw_progress_driver_leave(p, spin_ns, slept);
        return r;
}

int dw_progress_wait(struct dw_progress *p, int fd, int (*done)(void *ctx), void *ctx)
{
        pid_t self = dw_progress_tid();
        int r;
        for (;;) {
                if ((r = done(ctx)) != 0)
                        return r;
                pid_t none = 0;
                if (atomic_compare_exchange_strong(&p->driver, &none, self))
                        break;
                if ((r = dw_progress_wait_beside(p, fd)) < 0)
                        return r;
        }
        return dw_progress_drive(p, &(struct dw_drive){.fd = fd, .done = done, .ctx = ctx});
}

int dw_progress_nap_drive(struct dw_progress *p, int (*done)(void *ctx), void *ctx)
{
        /* A napping driver's role holds its tid negated: the thread then
         * keeps the device shared (a channel's driver turns it back). */
        pid_t none = 0;
        if (!atomic_compare_exchange_strong(&p->driver, &none, -dw_progress_tid()))
                return -EBUSY;
        atomic_fetch_add_explicit(&p->nap_drives, 1, memory_order_relaxed);
        return dw_progress_drive(p,
                                 &(struct dw_drive){.fd = -1,
                                                    .done = done,
                                                    .ctx = ctx,
                                                    .deadline = dw_now_ns() + DW_SHARED_NAP_MAX_NS,
                                                    .nap = true});
}

/* Shared hosts. A busy-polling application drives progress well only while
 * it has a core: on a host where more threads want the cores than there are
 * (several programs, a build or a CPU hog beside it) it waits for whole time
 * slices (milliseconds), mostly while it holds the device lock, since a
 * polling step is nearly all of its loop. The datagrams it would read (ACKs,
 * data to acknowledge) then wait, the peer's RTO fires and the window
 * collapses, where TCP's ACKs and timers run in the kernel whoever has the
 * core. So when the thread finds that the application's poller spends more
 * than 1/DIWARPDV_CORE_WAIT_SHARE of its time runnable but without a core
 * (diwarpdv_waited_for_core: the kernel's run-queue delay of that thread,
 * /proc/self/task/TID/schedstat, over
 * windows of at least DW_WAIT_WINDOW_NS, DW_SHARED_WAIT_LOOKS of them in a
 * row), the device turns *shared*: the thread, which the
 * kernel wakes as soon as a datagram or a timer is due, makes all the
 * progress, and the application's cq_poll only takes what the CQ holds
 * (dw_progress_app_poll: no device lock while the CQ is empty, no receive
 * syscall, and a sched_yield on each empty poll, so that the threads with
 * work get the cores). The device turns back when the poller waited less
 * than that in DW_SHARED_CALM_LOOKS windows in a row: alone on its core
 * again, it reads its own datagrams (the lower latency of a busy-poller, no
 * thread wake-up per message).
 *
 * Why the run-queue delay and not "is its poll count moving": the thread
 * cannot look without giving the core away (it may share the poller's core)
 * and a poller that waits for a core gets one within a slice, so any look
 * long enough to be fair saw it move; and a VM's vCPU stalls of 0.1-0.2 ms
 * made short looks take over on an idle host. The delay counts exactly the
 * waiting: a poller blocked in a syscall, computing on its core or stalled
 * with its vCPU adds nothing. */
#define DW_WAIT_WINDOW_NS    DIWARPDV_CORE_WINDOW_NS
#define DW_SHARED_CALM_LOOKS 10u
#define DW_SHARED_WAIT_LOOKS 2u

pid_t dw_progress_tid(void)
{
        static __thread pid_t tid;
        if (!tid)
                tid = (pid_t)syscall(SYS_gettid);
        return tid;
}

/* The thread's view of the application's poller: the run-queue delay at the
 * start of the current window. */
struct dw_app_watch {
        pid_t tid;
        uint64_t delay_ns, at_ns;
        uint64_t self_ns;      /* the thread's own CPU time at the window's start */
        uint64_t thr_delay_ns; /* the thread's own run-queue delay then */
        bool waits;            /* the last window's verdict */
        unsigned streak;       /* windows in a row, up to the last, that waited */
};

/* The calling thread's CPU time (ns). */
static uint64_t dw_self_cpu_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The run-queue delay of tid so far (ns), or UINT64_MAX. The file is opened
 * for each look (one per window): a descriptor kept open would be one more
 * per device for the program to count. */
static uint64_t dw_app_delay(pid_t tid)
{
        char path[64], buf[96];
        snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", (int)tid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return UINT64_MAX;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return UINT64_MAX;
        buf[n] = 0;
        unsigned long long run, delay;
        return sscanf(buf, "%llu %llu", &run, &delay) == 2 ? delay : UINT64_MAX;
}

int64_t diwarpdv_thread_run_delay_ns(void)
{
        uint64_t d = dw_app_delay(dw_progress_tid());
        return d == UINT64_MAX ? -ENOENT : (int64_t)d;
}

/* Does the poller wait for a core (see above)? Judged over a window of at
 * least DW_WAIT_WINDOW_NS; before the window is full, the last verdict. */
static bool dw_app_waits(struct dw_progress *p, struct dw_app_watch *w)
{
        pid_t tid = atomic_load_explicit(&p->app_tid, memory_order_relaxed);
        uint64_t now = dw_now_ns();
        if (tid == w->tid && w->at_ns && now - w->at_ns < DW_WAIT_WINDOW_NS)
                return w->waits;
        bool fresh = tid != w->tid || !w->at_ns;
        w->tid = tid;
        uint64_t d = tid > 0 ? dw_app_delay(tid) : UINT64_MAX;
        if (d == UINT64_MAX) {
                w->waits = false;
                w->streak = 0;
                w->at_ns = 0;
                return false;
        }
        /* The thread's own CPU time may be what the poller waited for (the
         * two share a core when the program is pinned): it does not count. */
        uint64_t self = dw_self_cpu_ns(), waited = d - w->delay_ns, own = self - w->self_ns;
        waited = waited > own ? waited - own : 0;
        /* Shared, the poller naps (dw_progress_nap) and the thread does the
         * work: the thread's own waiting for a core says as much. Without it
         * a napping poller looked calm beside CPU hogs, the device turned
         * back, and the poller collapsed again (7-10 take-overs a run). */
        uint64_t thr = dw_app_delay(dw_progress_tid());
        if (atomic_load_explicit(&p->shared, memory_order_relaxed) && thr != UINT64_MAX &&
            w->thr_delay_ns && thr >= w->thr_delay_ns)
                waited += thr - w->thr_delay_ns;
        w->thr_delay_ns = thr == UINT64_MAX ? 0 : thr;
        w->waits = !fresh && diwarpdv_waited_for_core(waited, now - w->at_ns);
        w->streak = w->waits ? w->streak + 1 : 0;
        w->delay_ns = d;
        w->self_ns = self;
        w->at_ns = now;
        return w->waits;
}

/* Does the poller keep waiting for a core: DW_SHARED_WAIT_LOOKS windows in
 * a row? One window is not enough: the first ones after a connection came
 * up saw 3 ms of 11 waited by a pinned, idle ping-pong's server (work of
 * the start-up beside it on its core), and the device then stayed shared
 * for the ten calm windows it takes to turn back, most of a short run. */
static bool dw_app_keeps_waiting(struct dw_progress *p, struct dw_app_watch *w)
{
        return dw_app_waits(p, w) && w->streak >= DW_SHARED_WAIT_LOOKS;
}

static void dw_progress_set_shared(struct dw_progress *p, bool on)
{
        if (atomic_load_explicit(&p->shared, memory_order_relaxed) == on)
                return;
        atomic_store_explicit(&p->shared, on, memory_order_relaxed);
        if (on)
                atomic_store_explicit(&p->takeovers,
                                      atomic_load_explicit(&p->takeovers, memory_order_relaxed) + 1,
                                      memory_order_relaxed);
        dw_dbg("device port %u: %s", p->dev.port,
               on ? "the application waits for a core: the progress thread makes progress"
                  : "the application has a core: it makes progress itself");
}

/* The progress thread's state from one turn of its loop to the next. It is
 * in one of three states: running (it sleeps on the device's set and runs
 * the steps), parked (the application polls: it leaves the data and the
 * timers to it) or yielded (an application thread drives from its waits). */
struct dw_progress_turns {
        struct dw_progress *p;
        uint64_t seen;        /* app_reads at the last look */
        uint64_t seen_drives; /* drives at the last look */
        bool parked, yielded;
        /* Running: sleeps left that end within a park interval, to see
         * whether the application polls (dw_turns_watch_app). */
        unsigned looks;
        long park_ns;
        struct dw_app_watch watch;
        unsigned calm; /* shared: windows in a row the poller did not wait */
        /* Calm windows it takes to turn back (dw_turns_take_over), and when
         * the device last turned back (ns). */
        unsigned calm_need;
        uint64_t back_at_ns;
        struct epoll_event evs[DW_MAX_EVENTS];
};

/* The next sleep of a parked or yielded thread: twice the last, up to the cap. */
static inline void dw_turns_back_off(struct dw_progress_turns *t)
{
        if (t->park_ns < DW_PARK_MAX_NS)
                t->park_ns = t->park_ns * 2 < DW_PARK_MAX_NS ? t->park_ns * 2 : DW_PARK_MAX_NS;
}

/* The poller waits for its core: the thread takes the progress over. A
 * napping poller (dw_progress_nap) no longer shows the waiting it would do
 * if it spun, so turning back is a trial; one that fails soon after (the
 * device turns shared again within DW_SHARED_RETRY_NS) doubles the calm
 * windows the next trial waits for, up to DW_SHARED_CALM_MAX (10 s): beside
 * CPU hogs the device flipped 10-24 times a 7 s run, each flip a collapse
 * of 20 ms or more, before this. */
#define DW_SHARED_RETRY_NS 1000000000ull
#define DW_SHARED_CALM_MAX 1000u

static void dw_turns_take_over(struct dw_progress_turns *t)
{
        t->calm = 0;
        if (!t->calm_need || !t->back_at_ns || dw_now_ns() - t->back_at_ns > DW_SHARED_RETRY_NS)
                t->calm_need = DW_SHARED_CALM_LOOKS;
        else if (t->calm_need < DW_SHARED_CALM_MAX)
                t->calm_need =
                    t->calm_need * 2 < DW_SHARED_CALM_MAX ? t->calm_need * 2 : DW_SHARED_CALM_MAX;
        dw_progress_set_shared(t->p, true);
}

/* Shared: back to the application once it polls with a core of its own,
 * window after window (c: app_reads now; polled: it polled since the last
 * look). Running, and yielded to a napping poller. */
static void dw_turns_watch_calm(struct dw_progress_turns *t, uint64_t c, bool polled)
{
        struct dw_progress *p = t->p;
        if (t->watch.at_ns && dw_now_ns() - t->watch.at_ns >= DW_WAIT_WINDOW_NS) {
                if (!polled || dw_app_waits(p, &t->watch)) {
                        t->calm = 0;
                } else if (++t->calm >= t->calm_need) {
                        t->back_at_ns = dw_now_ns();
                        dw_progress_set_shared(p, false);
                }
                t->seen = c;
        } else if (!t->watch.at_ns) {
                dw_app_waits(p, &t->watch); /* a baseline */
        }
}

/* Leaves the device to the thread that drives it. */
static inline void dw_turns_yield(struct dw_progress_turns *t)
{
        t->parked = false;
        t->yielded = true;
        t->park_ns = DW_PARK_MIN_NS;
}

/* Yielded: an application thread drives from its waits (dw_progress_wait):
 * the data set, the wake eventfd and the timers are the driver's. Back to
 * them once an interval passed in which no wait began and nobody drives, or
 * at once when a driver left threads waiting beside it (it kicks). False:
 * the thread stops. */
static bool dw_turns_yielded(struct dw_progress_turns *t)
{
        struct dw_progress *p = t->p;

        if (__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
                return false;
        dw_progress_yield_sleep(p, t->park_ns);
        if (__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
                return false;
        if (atomic_load_explicit(&p->shared, memory_order_relaxed)) {
                /* Yielded to a napping poller: it turns back as the running
                 * thread would have it (the poller's waits for its core). */
                uint64_t c = atomic_load_explicit(&p->app_reads, memory_order_relaxed);
                dw_turns_watch_calm(t, c, c - t->seen >= DW_PARK_READS);
        }
        if (!dw_progress_driven(p, &t->seen_drives)) {
                t->yielded = false;
                t->seen = atomic_load_explicit(&p->app_reads, memory_order_relaxed);
        } else {
                dw_turns_back_off(t);
        }
        return true;
}

/* Parked: timers are the application's too while it drives (each of its
 * steps runs the transports' timers): waking for them would take the lock
 * from it on every delayed ACK. Back on the data fds, a timer still due is
 * served at once. Parked, the thread takes the device lock only for a
 * wake-up: the polling application holds it most of the time. False: the
 * thread stops. */
static bool dw_turns_parked(struct dw_progress_turns *t)
{
        struct dw_progress *p = t->p;

        if (__atomic_load_n(&p->stop, __ATOMIC_RELAXED))
                return false;
        struct timespec ts = {0, t->park_ns};
        struct pollfd pfd = {.fd = p->wake_fd, .events = POLLIN};
        /* With no CQ armed, a look at the full interval may wait for the
         * scheduler tick: an arm wakes it (dwe_cq_req_notify). */
        bool late =
            t->park_ns >= DW_PARK_MAX_NS && !__atomic_load_n(&p->armed_cqs, __ATOMIC_RELAXED);
        if (late) {
                atomic_store(&p->parked_late, true); /* seq_cst: before the look below */
                prctl(PR_SET_TIMERSLACK, (unsigned long)t->park_ns * DW_PARK_SLACK);
                /* An arm between the check and the flag would not wake us. */
                if (__atomic_load_n(&p->armed_cqs, __ATOMIC_SEQ_CST))
                        ts.tv_nsec = 0;
        }
        int r = ppoll(&pfd, 1, &ts, NULL);
        if (late) {
                prctl(PR_SET_TIMERSLACK, 0ul); /* the default again: µs timers follow */
                atomic_store_explicit(&p->parked_late, false, memory_order_relaxed);
        }
        atomic_store_explicit(&p->park_wakes,
                              atomic_load_explicit(&p->park_wakes, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        if (atomic_load(&p->driver) || atomic_load(&p->drives) != t->seen_drives) {
                /* It waits for events now: yield (the driver already put the
                 * UDP socket back). */
                t->seen_drives = atomic_load(&p->drives);
                dw_turns_yield(t);
                return true;
        }
        uint64_t c = atomic_load_explicit(&p->app_reads, memory_order_relaxed);
        if (c - t->seen < DW_PARK_READS) {
                t->parked = false; /* it stopped: back to the data fds */
                t->looks = DW_RUN_LOOKS;
        } else if (dw_app_keeps_waiting(p, &t->watch)) {
                t->parked = false;
                dw_turns_take_over(t);
        } else {
                dw_turns_back_off(t);
        }
        t->seen = c;
        if (!t->parked)
                dw_progress_udp_park(p, false);
        if (r > 0) {
                /* A wake-up: one step, as unparked. */
                struct epoll_event wake = {.events = EPOLLIN,
                                           .data.u64 = dw_ev_data(p->wake_fd, DW_TAG_WAKE)};
                if (!dw_progress_locked_run(p, &wake, 1))
                        dw_turns_yield(t);
        }
        return true;
}

#define DW_TURN_STOP  (-1) /* the device stops (or epoll failed) */
#define DW_TURN_AGAIN (-2) /* a signal cut the sleep short */

/* Running: sleeps on the device's set until the next timer (a window at
 * most while the thread shares the work, to see the poller calm down),
 * unless a driver has it. Returns the events (0 when driven), or
 * DW_TURN_STOP or DW_TURN_AGAIN; *shared and *driven as they were before
 * the sleep. */
static int dw_turns_sleep(struct dw_progress_turns *t, bool *shared, bool *driven)
{
        struct dw_progress *p = t->p;

        pthread_mutex_lock(p->dev.lock);
        bool stop = p->stop;
        int64_t timeout = dw_progress_sleep_prepare(p);
        *shared = atomic_load_explicit(&p->shared, memory_order_relaxed);
        if (*shared && (timeout < 0 || timeout > (int64_t)DW_WAIT_WINDOW_NS))
                timeout = DW_WAIT_WINDOW_NS;
        else if (t->looks && (timeout < 0 || timeout > DW_PARK_MAX_NS))
                timeout = DW_PARK_MAX_NS;
        *driven = atomic_load(&p->driver) != 0;
        if (!*driven)
                atomic_store_explicit(&p->thread_sleep_until,
                                      timeout < 0 ? UINT64_MAX : dw_now_ns() + (uint64_t)timeout,
                                      memory_order_relaxed);
        pthread_mutex_unlock(p->dev.lock);
        if (stop)
                return DW_TURN_STOP;
        int n = *driven ? 0 : dw_progress_epoll(p, t->evs, timeout);
        atomic_store_explicit(&p->thread_sleep_until, 0, memory_order_relaxed);
        if (n < 0) {
                if (errno == EINTR)
                        return DW_TURN_AGAIN;
                dw_err("device port %u: progress thread epoll_wait: %s", p->dev.port,
                       strerror(errno));
                return DW_TURN_STOP;
        }
        return n;
}

/* Running, after a sleep that brought n events: does the application poll,
 * and does it wait for a core to do so? True: the thread runs the step.
 * False: it parked (or yielded to a driver that came), leaving the data and
 * the timers to the application that reads them. */
static bool dw_turns_watch_app(struct dw_progress_turns *t, bool shared, int n)
{
        struct dw_progress *p = t->p;
        uint64_t c = atomic_load_explicit(&p->app_reads, memory_order_relaxed);
        bool polled = c - t->seen >= DW_PARK_READS;

        /* A thread asleep in epoll_wait wakes only for data still unread
         * when it gets a core: an application that polls on another core
         * may read everything first, and the thread would never see that
         * it polls. So after data, and after it unparked, its next sleeps
         * are looks; DW_RUN_LOOKS of them that find the application idle
         * end them. */
        if (n > 0)
                t->looks = DW_RUN_LOOKS;
        else if (!polled && t->looks)
                t->looks--;
        if (shared) {
                dw_turns_watch_calm(t, c, polled);
                return true;
        }
        if (polled) {
                bool wake = false;
                for (int i = 0; i < n; i++)
                        if ((uint32_t)t->evs[i].data.u64 == DW_TAG_WAKE)
                                wake = true;
                if (dw_app_keeps_waiting(p, &t->watch)) {
                        dw_turns_take_over(t);
                } else if (!wake) {
                        t->seen = c;
                        t->seen_drives = atomic_load(&p->drives);
                        t->park_ns = DW_PARK_MIN_NS;
                        if (dw_progress_udp_park(t->p, true))
                                t->parked = true;
                        else
                                t->yielded = true; /* a driver came */
                        return false;
                }
        }
        t->seen = c;
        return true;
}

/* Running: one sleep, then the step over what woke the thread. False: the
 * thread stops. */
static bool dw_turns_run(struct dw_progress_turns *t)
{
        struct dw_progress *p = t->p;
        bool shared, driven;
        int n = dw_turns_sleep(t, &shared, &driven);

        if (n == DW_TURN_STOP)
                return false;
        if (n == DW_TURN_AGAIN)
                return true;
        pid_t driver = atomic_load(&p->driver);
        if (driven || driver) {
                /* The wake-up (data, a timer, the eventfd) is the driver's:
                 * it sleeps on the same set. A channel's driver is an
                 * event-driven program, no poller to share for; a napping
                 * poller drives only while the device is shared. */
                t->seen_drives = atomic_load(&p->drives);
                dw_turns_yield(t);
                if (driver > 0) {
                        t->calm = 0;
                        dw_progress_set_shared(t->p, false);
                }
                return true;
        }
        if (dw_turns_watch_app(t, shared, n) && !dw_progress_locked_run(t->p, t->evs, n))
                dw_turns_yield(t);
        return true;
}

static void *dw_progress_thread(void *arg)
{
        struct dw_progress *p = arg;
        struct dw_progress_turns t = {
            .p = p,
            .seen = atomic_load_explicit(&p->app_reads, memory_order_relaxed),
            .seen_drives = atomic_load(&p->drives),
            .park_ns = DW_PARK_MIN_NS,
            .looks = DW_RUN_LOOKS,
        };

        dw_progress_short_slice();
        for (;;) {
                bool go;
                if (t.yielded)
                        go = dw_turns_yielded(&t);
                else if (t.parked)
                        go = dw_turns_parked(&t);
                else
                        go = dw_turns_run(&t);
                if (!go)
                        break;
        }
        return NULL;
}

/* The socket's datagrams must wake whoever sleeps on the set: the progress
 * thread, or a process that drives the device itself (dw_progress_external).
 * Lock held. */
static int dw_progress_udp_watch(struct dw_progress *p)
{
        if (dw_udp_uring_on(p->dev.udp) || p->udp_in_epoll)
                return 0;
        p->udp_in_epoll = true;
        int err = dw_progress_udp_sync(p);
        if (err < 0) {
                p->udp_in_epoll = false;
                dw_err("device port %u: cannot watch the UDP socket: %s", p->dev.port,
                       strerror(-err));
        }
        return err;
}

int dw_progress_external(struct dw_progress *p)
{
        pthread_mutex_lock(p->dev.lock);
        int err = p->started ? -EBUSY : dw_progress_udp_watch(p);
        if (err == 0)
                __atomic_store_n(&p->external, true, __ATOMIC_RELAXED);
        pthread_mutex_unlock(p->dev.lock);
        return err < 0 ? err : p->epfd;
}

int dw_progress_external_timeout(struct dw_progress *p, int64_t *ns)
{
        pthread_mutex_lock(p->dev.lock);
        int err = p->external ? 0 : -EINVAL;
        if (err == 0)
                *ns = dw_progress_timeout_ns(p);
        pthread_mutex_unlock(p->dev.lock);
        return err;
}

int dw_progress_external_run(struct dw_progress *p)
{
        if (!__atomic_load_n(&p->external, __ATOMIC_RELAXED))
                return -EINVAL;
        struct epoll_event evs[DW_MAX_EVENTS];
        int n = epoll_wait(p->epfd, evs, DW_MAX_EVENTS, 0);
        if (n < 0)
                n = 0;
        dw_progress_locked_run(p, evs, n);
        return n;
}

int dw_progress_start(struct dw_progress *p)
{
        pthread_mutex_lock(p->dev.lock);
        if (p->started) {
                pthread_mutex_unlock(p->dev.lock);
                return 0;
        }
        if (p->external) {
                /* Its owner drives it (dw_progress_external): a thread
                 * beside it would take the set's events from it. */
                pthread_mutex_unlock(p->dev.lock);
                return -EBUSY;
        }
        int werr = dw_progress_udp_watch(p);
        if (werr < 0) {
                pthread_mutex_unlock(p->dev.lock);
                return werr;
        }
        p->started = true;
        p->thread_mode = true;
        __atomic_store_n(&p->stop, false, __ATOMIC_RELAXED);
        int err = pthread_create(&p->thread, NULL, dw_progress_thread, p);
        if (err) {
                p->started = false;
                p->thread_mode = false;
        }
        pthread_mutex_unlock(p->dev.lock);
        if (err)
                dw_err("device port %u: cannot start the progress thread: %s", p->dev.port,
                       strerror(err));
        return -err;
}

void dw_progress_stop(struct dw_progress *p)
{
        pthread_mutex_lock(p->dev.lock);
        bool started = p->started;
        __atomic_store_n(&p->stop, true, __ATOMIC_RELAXED);
        pthread_mutex_unlock(p->dev.lock);
        if (!started)
                return;
        dw_progress_wake(p);
        dw_progress_kick(p);
        pthread_join(p->thread, NULL);
        pthread_mutex_lock(p->dev.lock);
        p->udp_in_parked = false;
        dw_progress_udp_hold(p, false); /* application steps look at the set */
        p->started = false;
        p->thread_mode = false;
        pthread_mutex_unlock(p->dev.lock);
}
