/* Asynchronous event queue: see event.h. */
#include "queue/event.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

int dw_async_queue_init(struct dw_async_queue *q, uint32_t cap)
{
        memset(q, 0, sizeof(*q));
        if (cap == 0)
                cap = DW_ASYNC_QUEUE_DEFAULT_CAP;
        q->ring = calloc(cap, sizeof(*q->ring));
        if (!q->ring)
                return -ENOMEM;
        q->efd = eventfd(0, EFD_CLOEXEC);
        if (q->efd < 0) {
                int err = -errno;

                free(q->ring);
                q->ring = NULL;
                return err;
        }
        q->cap = cap;
        pthread_mutex_init(&q->lock, NULL);
        return 0;
}

void dw_async_queue_fini(struct dw_async_queue *q)
{
        if (!q->ring)
                return;
        close(q->efd);
        q->efd = -1;
        pthread_mutex_destroy(&q->lock);
        free(q->ring);
        q->ring = NULL;
}

int dw_async_queue_fd(const struct dw_async_queue *q)
{
        return q->efd;
}

/* As for completion channels, the eventfd counter is non-zero exactly while
 * the ring holds events; both change only under q->lock. */
int dw_async_queue_push(struct dw_async_queue *q, const struct diwarp_async_event *ev)
{
        pthread_mutex_lock(&q->lock);
        if (q->count == q->cap) {
                q->dropped++;
                pthread_mutex_unlock(&q->lock);
                return -EOVERFLOW;
        }
        q->ring[(q->head + q->count) % q->cap] = *ev;
        q->count++;
        if (q->count == 1)
                eventfd_write(q->efd, 1);
        pthread_mutex_unlock(&q->lock);
        return 0;
}

int dw_async_queue_get(struct dw_async_queue *q, struct diwarp_async_event *ev)
{
        for (;;) {
                struct pollfd pfd;
                int fl;

                pthread_mutex_lock(&q->lock);
                if (q->count > 0) {
                        *ev = q->ring[q->head];
                        q->head = (q->head + 1) % q->cap;
                        q->count--;
                        if (q->count == 0) {
                                eventfd_t v;

                                eventfd_read(q->efd, &v);
                        }
                        pthread_mutex_unlock(&q->lock);
                        return 0;
                }
                pthread_mutex_unlock(&q->lock);
                fl = fcntl(q->efd, F_GETFL);
                if (fl < 0)
                        return -errno;
                if (fl & O_NONBLOCK)
                        return -EAGAIN;
                pfd.fd = q->efd;
                pfd.events = POLLIN;
                pfd.revents = 0;
                if (poll(&pfd, 1, -1) < 0)
                        return -errno;
        }
}

int dw_async_queue_purge(struct dw_async_queue *q, const void *element)
{
        uint32_t i, kept = 0, n;

        pthread_mutex_lock(&q->lock);
        n = q->count;
        for (i = 0; i < n; i++) {
                struct diwarp_async_event e = q->ring[(q->head + i) % q->cap];

                /* Every member of the element union is a pointer at offset 0. */
                if ((const void *)e.element.qp != element)
                        q->ring[(q->head + kept++) % q->cap] = e;
        }
        q->count = kept;
        if (n > 0 && kept == 0) {
                eventfd_t v;

                eventfd_read(q->efd, &v);
        }
        pthread_mutex_unlock(&q->lock);
        return (int)(n - kept);
}
