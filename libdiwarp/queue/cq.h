/* Completion queues and completion channels.
 *
 * A dw_cq is a fixed ring of struct diwarp_wc allocated at init; pushing and
 * popping never allocate. Callers hold the device lock around init, push, pop
 * and arm (queue/ takes no device lock itself).
 *
 * Arming follows ibverbs (ibv_req_notify_cq): an armed CQ generates exactly one
 * event on its channel at the next completion pushed, or, when armed with
 * solicited_only, at the next receive completion that was solicited or any
 * completion whose status is not SUCCESS; it then disarms. Completions that
 * were already in the ring when it was armed generate nothing.
 *
 * A completion channel is an eventfd plus a FIFO of the CQs with an event due.
 * Its fd is readable exactly while the FIFO is non-empty (we write/read the
 * eventfd only under the channel's own mutex), so applications can poll/epoll
 * it; the one exception is a waiting thread's own notifications while it
 * holds the device lock (dw_comp_channel_quiet). The channel and the ack counters are used WITHOUT
 * the device lock: they have their own mutexes (lock order: channel->lock, then cq->ack_lock).
 *
 * Ack counting mirrors ibv_get_cq_event / ibv_ack_cq_events / ibv_destroy_cq:
 * every event handed out by dw_comp_channel_get_event must be acknowledged with
 * dw_cq_ack_events before the CQ can be destroyed; dw_cq_wait_acks blocks until
 * that is so.
 */
#ifndef DIWARP_QUEUE_CQ_H
#define DIWARP_QUEUE_CQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

struct dw_cq;

/* At most this many undelivered events per CQ sit in a channel's FIFO; a CQ
 * re-armed and completed again before the application fetched its earlier
 * events has the extra ones coalesced (counted in ch->coalesced). The FIFO is
 * sized for this bound when a CQ attaches, so notifying never allocates. */
#define DW_CQ_MAX_PENDING_EVENTS 4

struct dw_comp_channel {
        int efd;              /* eventfd, EFD_CLOEXEC; readable iff fifo_count > 0 */
        pthread_mutex_t lock; /* guards everything below; not the device lock */
        struct dw_cq **fifo;  /* ring of CQs with an event due, oldest first */
        uint32_t fifo_cap, fifo_head, fifo_count;
        uint32_t attached;  /* CQs bound to this channel (destroy: -EBUSY if > 0) */
        uint64_t coalesced; /* events merged because a CQ had too many pending */
        bool signalled;     /* the eventfd's counter is non-zero */
        /* dw_comp_channel_quiet: the thread waiting for an event on this
         * channel that also pushes it (it drives progress while it waits)
         * takes it without the eventfd write and read. */
        bool quiet;
        pthread_t quiet_owner;
};

struct dw_cq {
        struct diwarp_wc *ring;
        uint32_t cqe;   /* capacity */
        uint32_t head;  /* next to pop */
        uint32_t tail;  /* next free slot */
        uint32_t count; /* completions in the ring */
        bool armed, armed_solicited_only;
        bool overflowed;                 /* a push found the ring full: the CQ is in error */
        bool timestamps;                 /* push stamps ts_ns (CLOCK_MONOTONIC ns) */
        struct dw_comp_channel *channel; /* may be NULL */
        void *cq_context;
        uint32_t pending_events; /* in channel FIFO, not yet fetched (channel->lock) */
        /* ack accounting, guarded by ack_lock (not the device lock) */
        pthread_mutex_t ack_lock;
        pthread_cond_t ack_cond;
        unsigned events_reported;  /* handed out by dw_comp_channel_get_event */
        unsigned events_completed; /* acknowledged by dw_cq_ack_events */
        int use_count;             /* QPs/SRQs using it; maintained by qp/ */
        /* Counted up by each push (lock held) when set: its owner's count of
         * completions over all its CQs (the device's, to wake pollers that
         * nap on a shared host). */
        uint32_t *pushes;
        /* Counted up when the CQ becomes armed, down when the arm fires or
         * the CQ goes (lock held), when set: its owner's count of armed CQs
         * (the device's: a program that armed one may sleep on its channel
         * next, so the progress thread keeps its looks prompt). */
        uint32_t *armed_count;
};

/* ---- completion channel ---- */

/* 0 or -errno (eventfd/malloc failure). */
int dw_comp_channel_init(struct dw_comp_channel *ch);
/* -EBUSY while CQs are attached; else closes the fd and frees. */
int dw_comp_channel_fini(struct dw_comp_channel *ch);
int dw_comp_channel_fd(const struct dw_comp_channel *ch);
/* Takes the oldest due event: *cq and *cq_context name its CQ. Blocks (poll on
 * the eventfd) while none is due, unless the fd has O_NONBLOCK: then -EAGAIN.
 * Call without the device lock. Each event returned must later be acked. */
int dw_comp_channel_get_event(struct dw_comp_channel *ch, struct dw_cq **cq, void **cq_context);
/* While on, events that the calling thread itself notifies (from a step it
 * runs while it waits) do not write the eventfd: it takes them with
 * dw_comp_channel_take before it lets go of the device lock. Turned off by
 * the same thread, which writes the eventfd then if events are still due,
 * so the fd is readable whenever events are due outside that window. */
void dw_comp_channel_quiet(struct dw_comp_channel *ch, bool on);
/* The same without blocking: -EAGAIN while none is due, whatever the fd's
 * flags. May be called with the device lock held. */
int dw_comp_channel_take(struct dw_comp_channel *ch, struct dw_cq **cq, void **cq_context);
/* 1: a wait for an event blocks (the fd has no O_NONBLOCK); 0: it does not;
 * -errno. */
int dw_comp_channel_blocking(const struct dw_comp_channel *ch);

/* ---- completion queue ---- */

/* cqe >= 1 (-EINVAL otherwise); -ENOMEM. Attaches to channel (may be NULL). */
int dw_cq_init(struct dw_cq *cq, int cqe, struct dw_comp_channel *channel, void *cq_context);
/* Detaches from the channel (dropping its undelivered events), waits until
 * every delivered event was acked (like ibv_destroy_cq), frees the ring. Do not
 * hold the device lock if another thread may still need it to ack. */
void dw_cq_fini(struct dw_cq *cq);
/* Appends one completion. solicited: this is a receive completion of a message
 * sent with the Solicited Event flag. Fires the armed event if due.
 * With cq->timestamps the stored copy gets ts_ns = now, else ts_ns = 0.
 * -EOVERFLOW when full (the completion is lost, cq->overflowed is set; the
 * caller raises DIWARP_EVENT_CQ_ERR). */
int dw_cq_push(struct dw_cq *cq, const struct diwarp_wc *wc, bool solicited);
/* Gives the ring room for cqe completions, keeping those it holds in order
 * (ibv_resize_cq). -EINVAL if cqe < 1 or fewer than it holds; -ENOMEM. */
int dw_cq_resize(struct dw_cq *cq, int cqe);
/* Pops up to n completions, oldest first; returns how many (0..n). */
int dw_cq_pop(struct dw_cq *cq, int n, struct diwarp_wc *wc);
/* Removes the completions of QP qpn, keeping the others in order; returns
 * how many went. A QP moved to RESET takes its completions with it, as
 * hardware providers clean their CQs then: a program that restarts a QP
 * after an error does not poll the flushes of its earlier life. */
uint32_t dw_cq_purge_qp(struct dw_cq *cq, uint32_t qpn);
/* Arms for one event (see top). 0, or -EINVAL for a NULL cq. */
int dw_cq_arm(struct dw_cq *cq, bool solicited_only);
/* Acknowledges nevents delivered events (ibv_ack_cq_events). No device lock. */
void dw_cq_ack_events(struct dw_cq *cq, unsigned nevents);
/* Blocks until every event handed out for this CQ has been acknowledged. */
void dw_cq_wait_acks(struct dw_cq *cq);

static inline uint32_t dw_cq_count(const struct dw_cq *cq)
{
        return cq->count;
}

/* The count without the device lock: a hint (0 may be stale by the time the
 * caller acts on it; the next look sees the new completions). */
static inline uint32_t dw_cq_count_peek(const struct dw_cq *cq)
{
        return __atomic_load_n(&cq->count, __ATOMIC_RELAXED);
}

static inline bool dw_cq_full(const struct dw_cq *cq)
{
        return cq->count == cq->cqe;
}

#endif
