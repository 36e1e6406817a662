/* Completion queues and completion channels: see cq.h for the semantics. */
#include "queue/cq.h"
#include "util/time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ---- completion channel ---- */

int dw_comp_channel_init(struct dw_comp_channel *ch)
{
        memset(ch, 0, sizeof(*ch));
        ch->efd = eventfd(0, EFD_CLOEXEC);
        if (ch->efd < 0)
                return -errno;
        pthread_mutex_init(&ch->lock, NULL);
        return 0;
}

int dw_comp_channel_fini(struct dw_comp_channel *ch)
{
        pthread_mutex_lock(&ch->lock);
        if (ch->attached > 0) {
                pthread_mutex_unlock(&ch->lock);
                return -EBUSY;
        }
        pthread_mutex_unlock(&ch->lock);
        pthread_mutex_destroy(&ch->lock);
        close(ch->efd);
        ch->efd = -1;
        free(ch->fifo);
        ch->fifo = NULL;
        return 0;
}

int dw_comp_channel_fd(const struct dw_comp_channel *ch)
{
        return ch->efd;
}

/* The eventfd counter is non-zero exactly while the FIFO is non-empty. Both are
 * changed only under ch->lock, so reading the counter back to zero when the
 * FIFO empties can never block, whatever O_NONBLOCK the application set. */
static void channel_signal(struct dw_comp_channel *ch)
{
        if (!ch->signalled) {
                eventfd_write(ch->efd, 1);
                ch->signalled = true;
        }
}

static void channel_clear(struct dw_comp_channel *ch)
{
        eventfd_t v;

        if (ch->signalled) {
                eventfd_read(ch->efd, &v);
                ch->signalled = false;
        }
}

void dw_comp_channel_quiet(struct dw_comp_channel *ch, bool on)
{
        pthread_mutex_lock(&ch->lock);
        if (on) {
                ch->quiet = true;
                ch->quiet_owner = pthread_self();
        } else {
                /* Another thread may have taken the role since (it waits
                 * too): it is left on for that thread. */
                if (ch->quiet && pthread_equal(ch->quiet_owner, pthread_self()))
                        ch->quiet = false;
                if (ch->fifo_count > 0)
                        channel_signal(ch);
        }
        pthread_mutex_unlock(&ch->lock);
}

/* Called at CQ attach (not a hot path): make room for every CQ's bound of
 * pending events so that notify never allocates. */
static int channel_reserve(struct dw_comp_channel *ch, uint32_t attached)
{
        uint32_t need = attached * DW_CQ_MAX_PENDING_EVENTS;
        struct dw_cq **nf;
        uint32_t i;

        if (need <= ch->fifo_cap)
                return 0;
        nf = calloc(need, sizeof(*nf));
        if (!nf)
                return -ENOMEM;
        for (i = 0; i < ch->fifo_count; i++)
                nf[i] = ch->fifo[(ch->fifo_head + i) % ch->fifo_cap];
        free(ch->fifo);
        ch->fifo = nf;
        ch->fifo_cap = need;
        ch->fifo_head = 0;
        return 0;
}

static void channel_notify(struct dw_comp_channel *ch, struct dw_cq *cq)
{
        pthread_mutex_lock(&ch->lock);
        if (cq->pending_events >= DW_CQ_MAX_PENDING_EVENTS) {
                /* The application has not fetched this CQ's earlier events; one
                 * more in the queue tells it nothing new. */
                ch->coalesced++;
        } else {
                ch->fifo[(ch->fifo_head + ch->fifo_count) % ch->fifo_cap] = cq;
                ch->fifo_count++;
                cq->pending_events++;
                if (!ch->quiet || !pthread_equal(ch->quiet_owner, pthread_self()))
                        channel_signal(ch);
        }
        pthread_mutex_unlock(&ch->lock);
}

/* Removes every undelivered event of cq (the CQ is going away). */
static void channel_detach(struct dw_comp_channel *ch, struct dw_cq *cq)
{
        uint32_t i, kept = 0, n;

        pthread_mutex_lock(&ch->lock);
        n = ch->fifo_count;
        for (i = 0; i < n; i++) {
                struct dw_cq *c = ch->fifo[(ch->fifo_head + i) % ch->fifo_cap];

                if (c != cq)
                        ch->fifo[(ch->fifo_head + kept++) % ch->fifo_cap] = c;
        }
        ch->fifo_count = kept;
        cq->pending_events = 0;
        if (n > 0 && kept == 0)
                channel_clear(ch);
        ch->attached--;
        pthread_mutex_unlock(&ch->lock);
}

int dw_comp_channel_take(struct dw_comp_channel *ch, struct dw_cq **cq, void **cq_context)
{
        pthread_mutex_lock(&ch->lock);
        if (ch->fifo_count == 0) {
                pthread_mutex_unlock(&ch->lock);
                return -EAGAIN;
        }
        struct dw_cq *c = ch->fifo[ch->fifo_head];

        ch->fifo_head = (ch->fifo_head + 1) % ch->fifo_cap;
        ch->fifo_count--;
        c->pending_events--;
        if (ch->fifo_count == 0)
                channel_clear(ch);
        pthread_mutex_lock(&c->ack_lock);
        c->events_reported++;
        pthread_mutex_unlock(&c->ack_lock);
        pthread_mutex_unlock(&ch->lock);
        if (cq)
                *cq = c;
        if (cq_context)
                *cq_context = c->cq_context;
        return 0;
}

int dw_comp_channel_blocking(const struct dw_comp_channel *ch)
{
        int fl = fcntl(ch->efd, F_GETFL);
        if (fl < 0)
                return -errno;
        return !(fl & O_NONBLOCK);
}

int dw_comp_channel_get_event(struct dw_comp_channel *ch, struct dw_cq **cq, void **cq_context)
{
        for (;;) {
                int err = dw_comp_channel_take(ch, cq, cq_context);
                if (err != -EAGAIN)
                        return err;
                int b = dw_comp_channel_blocking(ch);
                if (b <= 0)
                        return b < 0 ? b : -EAGAIN;
                /* Sleep until the FIFO becomes non-empty; another thread may
                 * win the event, then we loop and sleep again. */
                struct pollfd pfd = {.fd = ch->efd, .events = POLLIN};
                if (poll(&pfd, 1, -1) < 0)
                        return -errno; /* -EINTR lets a signal interrupt the wait */
        }
}

/* ---- completion queue ---- */

int dw_cq_init(struct dw_cq *cq, int cqe, struct dw_comp_channel *channel, void *cq_context)
{
        int rc;

        if (!cq || cqe < 1)
                return -EINVAL;
        memset(cq, 0, sizeof(*cq));
        cq->ring = calloc((size_t)cqe, sizeof(*cq->ring));
        if (!cq->ring)
                return -ENOMEM;
        cq->cqe = (uint32_t)cqe;
        cq->cq_context = cq_context;
        if (channel) {
                pthread_mutex_lock(&channel->lock);
                rc = channel_reserve(channel, channel->attached + 1);
                if (rc == 0)
                        channel->attached++;
                pthread_mutex_unlock(&channel->lock);
                if (rc) {
                        free(cq->ring);
                        cq->ring = NULL;
                        return rc;
                }
                cq->channel = channel;
        }
        pthread_mutex_init(&cq->ack_lock, NULL);
        pthread_cond_init(&cq->ack_cond, NULL);
        return 0;
}

void dw_cq_fini(struct dw_cq *cq)
{
        if (!cq || !cq->ring)
                return;
        if (cq->channel)
                channel_detach(cq->channel, cq);
        dw_cq_wait_acks(cq);
        pthread_cond_destroy(&cq->ack_cond);
        pthread_mutex_destroy(&cq->ack_lock);
        free(cq->ring);
        cq->ring = NULL;
        cq->channel = NULL;
}

/* The armed case of dw_cq_push, out of line so the common push (not armed:
 * busy-polling applications) stays a leaf function. */
__attribute__((noinline)) static void cq_armed_push(struct dw_cq *cq, const struct diwarp_wc *wc,
                                                    bool solicited)
{
        /* ibverbs: solicited_only fires on a solicited receive completion or
         * on any unsuccessful completion. */
        bool fire = !cq->armed_solicited_only || wc->status != DIWARP_WC_SUCCESS ||
                    (solicited && (wc->opcode & DIWARP_WC_RECV));
        if (fire) {
                cq->armed = false;
                cq->armed_solicited_only = false;
                if (cq->armed_count)
                        --*cq->armed_count;
                if (cq->channel)
                        channel_notify(cq->channel, cq);
        }
}

int dw_cq_push(struct dw_cq *cq, const struct diwarp_wc *wc, bool solicited)
{
        uint32_t tail = cq->tail;

        if (__builtin_expect(cq->count == cq->cqe, 0)) {
                cq->overflowed = true;
                return -EOVERFLOW;
        }
        cq->ring[tail] = *wc;
        cq->ring[tail].ts_ns = __builtin_expect(cq->timestamps, 0) ? dw_now_ns() : 0;
        cq->tail = tail + 1 == cq->cqe ? 0 : tail + 1;
        cq->count++;
        if (cq->pushes)
                ++*cq->pushes;
        if (cq->armed)
                cq_armed_push(cq, wc, solicited);
        return 0;
}

int dw_cq_resize(struct dw_cq *cq, int cqe)
{
        if (!cq || cqe < 1 || (uint32_t)cqe < cq->count)
                return -EINVAL;
        struct diwarp_wc *ring = calloc((size_t)cqe, sizeof(*ring));
        if (!ring)
                return -ENOMEM;
        uint32_t n = cq->count;
        for (uint32_t i = 0, h = cq->head; i < n; i++, h = h + 1 == cq->cqe ? 0 : h + 1)
                ring[i] = cq->ring[h];
        free(cq->ring);
        cq->ring = ring;
        cq->cqe = (uint32_t)cqe;
        cq->head = 0;
        cq->tail = n == (uint32_t)cqe ? 0 : n;
        return 0;
}

uint32_t dw_cq_purge_qp(struct dw_cq *cq, uint32_t qpn)
{
        uint32_t kept = 0, n = cq->count, cqe = cq->cqe;
        uint32_t src = cq->head, dst = cq->head;

        for (uint32_t i = 0; i < n; i++, src = src + 1 == cqe ? 0 : src + 1) {
                if (cq->ring[src].qp_num == qpn)
                        continue;
                if (dst != src)
                        cq->ring[dst] = cq->ring[src];
                dst = dst + 1 == cqe ? 0 : dst + 1;
                kept++;
        }
        cq->count = kept;
        cq->tail = dst;
        return n - kept;
}

int dw_cq_pop(struct dw_cq *cq, int n, struct diwarp_wc *wc)
{
        /* Cursor and count in locals: the stores to wc[] may alias *cq as far
         * as the compiler knows, which would reload them every iteration. */
        uint32_t head = cq->head, count = cq->count, cqe = cq->cqe;
        const struct diwarp_wc *ring = cq->ring;
        int i = 0;

        while (i < n && count > 0) {
                wc[i++] = ring[head];
                head = head + 1 == cqe ? 0 : head + 1;
                count--;
        }
        cq->head = head;
        cq->count = count;
        return i;
}

int dw_cq_arm(struct dw_cq *cq, bool solicited_only)
{
        if (!cq)
                return -EINVAL;
        /* Arming for "next completion" while already armed for solicited only
         * widens the request, as ibverbs allows; the converse keeps the wider
         * one. */
        if (cq->armed) {
                cq->armed_solicited_only = cq->armed_solicited_only && solicited_only;
        } else {
                cq->armed_solicited_only = solicited_only;
                if (cq->armed_count)
                        ++*cq->armed_count;
        }
        cq->armed = true;
        return 0;
}

void dw_cq_ack_events(struct dw_cq *cq, unsigned nevents)
{
        pthread_mutex_lock(&cq->ack_lock);
        cq->events_completed += nevents;
        pthread_cond_broadcast(&cq->ack_cond);
        pthread_mutex_unlock(&cq->ack_lock);
}

void dw_cq_wait_acks(struct dw_cq *cq)
{
        pthread_mutex_lock(&cq->ack_lock);
        /* Unsigned difference: robust if the counters wrap. */
        while ((int)(cq->events_reported - cq->events_completed) > 0)
                pthread_cond_wait(&cq->ack_cond, &cq->ack_lock);
        pthread_mutex_unlock(&cq->ack_lock);
}
