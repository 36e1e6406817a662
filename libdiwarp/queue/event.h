/* The device's asynchronous event queue (diwarp_get_async_event).
 *
 * A fixed ring of struct diwarp_async_event plus an eventfd that is readable
 * exactly while the ring is non-empty. It has its own mutex and is used
 * without the device lock (the application blocks in get while the engine
 * pushes). When the ring is full the NEWEST event is dropped and counted in
 * q->dropped: the ones already queued are older and usually the cause
 * (a QP's first fatal error matters more than its repeats).
 */
#ifndef DIWARP_QUEUE_EVENT_H
#define DIWARP_QUEUE_EVENT_H

#include <pthread.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

#define DW_ASYNC_QUEUE_DEFAULT_CAP 256

struct dw_async_queue {
        int efd; /* eventfd, EFD_CLOEXEC; readable iff count > 0 */
        pthread_mutex_t lock;
        struct diwarp_async_event *ring;
        uint32_t cap, head, count;
        uint64_t dropped; /* events lost because the ring was full */
};

/* cap 0 → DW_ASYNC_QUEUE_DEFAULT_CAP. 0 or -errno. */
int dw_async_queue_init(struct dw_async_queue *q, uint32_t cap);
void dw_async_queue_fini(struct dw_async_queue *q);
int dw_async_queue_fd(const struct dw_async_queue *q);
/* 0, or -EOVERFLOW when full (event dropped, q->dropped incremented). */
int dw_async_queue_push(struct dw_async_queue *q, const struct diwarp_async_event *ev);
/* Oldest event; blocks unless the fd is O_NONBLOCK (then -EAGAIN when empty). */
int dw_async_queue_get(struct dw_async_queue *q, struct diwarp_async_event *ev);
/* Removes pending events naming element (a QP/CQ/SRQ being destroyed, so the
 * application never receives a dangling pointer). Returns how many. */
int dw_async_queue_purge(struct dw_async_queue *q, const void *element);

#endif
