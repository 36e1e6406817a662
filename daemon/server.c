/* diwarpd: a server (worker thread). Each turn it moves what its clients
 * posted in their rings into the engine, and the engine's completions into
 * their shared CQs; while turns find work it keeps turning, and after
 * spin_ns without any it sleeps in epoll_wait: on its doorbell (clients
 * write it when they post to a sleeping server), the clients' sockets, and
 * the engine's completion channel and async fd. The engine's own progress
 * thread serves the sockets and timers while the server sleeps. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/daemon.h"

#define POST_BATCH 16
#define CQ_BATCH   32
#define LOOK_EVERY 64 /* turns with work between two looks at the sockets */

void dd_client_active_add(struct dd_client *c, struct dd_obj *o)
{
        if (c->nactive == c->active_cap) {
                uint32_t n = c->active_cap ? 2 * c->active_cap : 16;
                struct dd_obj **a = realloc(c->active, n * sizeof(*a));
                if (!a)
                        return;
                c->active = a;
                c->active_cap = n;
        }
        c->active[c->nactive++] = o;
}

void dd_client_active_del(struct dd_client *c, struct dd_obj *o)
{
        for (uint32_t i = 0; i < c->nactive; i++)
                if (c->active[i] == o) {
                        c->active[i] = c->active[--c->nactive];
                        return;
                }
}

bool dd_client_log_ok(struct dd_client *c)
{
        return diwarpdv_log_limit_pass(&c->log_limit, DIWARPDV_LOG_WARN);
}

/* A ring index out of range: the client wrote over its rings. */
static void client_broken(struct dd_client *c, const char *ring, uint32_t h, uint32_t index)
{
        if (c->broken)
                return;
        c->broken = true;
        diwarpdv_warn("diwarpd: client pid %d: %s of handle %u: index %u beyond its entries; "
                      "dropping the client",
                      c->pid, ring, h, index);
}

static void fire(struct dd_obj *cq)
{
        cq->u.cq.armed = 0;
        if (!cq->u.cq.chan)
                return;
        struct dw_ipc_event ev = {.kind = DW_IPC_EV_CQ, .handle = cq->h};
        dw_ipc_send(cq->u.cq.chan->u.chan.fd, &ev, sizeof(ev), NULL, 0, true);
}

static uint32_t cq_room(struct dd_obj *o)
{
        uint32_t cons = atomic_load_explicit(&o->u.cq.ring->cons, memory_order_acquire);
        uint32_t used = o->u.cq.prod - cons;
        return used > o->u.cq.entries ? 0 : o->u.cq.entries - used;
}

static void cq_put(struct dd_obj *o, const struct diwarp_wc *wc)
{
        memcpy(dw_ipc_ring_entry(o->u.cq.ring, o->u.cq.esize, o->u.cq.entries, o->u.cq.prod), wc,
               sizeof(*wc));
        o->u.cq.prod++;
}

void dd_cq_push(struct dd_obj *o, const struct diwarp_wc *wc)
{
        if (!cq_room(o)) {
                if (!o->u.cq.overflow_told)
                        diwarpdv_warn("diwarpd: client pid %d: CQ handle %u overflows", o->c->pid,
                                      o->h);
                o->u.cq.overflow_told = true;
                return;
        }
        cq_put(o, wc);
        atomic_store_explicit(&o->u.cq.ring->prod, o->u.cq.prod, memory_order_release);
        dw_ipc_cq_published(o->u.cq.ring);
        if (o->u.cq.armed)
                fire(o);
}

static void qp_state_publish(struct dd_obj *qp)
{
        atomic_store_explicit(&qp->u.qp.sq->qp_state, diwarp_qp_state(qp->u.qp.qp),
                              memory_order_release);
}

/* A WR the engine refused: its completion says so, in its place. */
static void refuse(struct dd_obj *qp, struct dd_obj *cq, uint64_t wr_id, bool recv, int err)
{
        struct diwarp_wc wc = {.wr_id = wr_id,
                               .status = DIWARP_WC_LOC_QP_OP_ERR,
                               .opcode = recv ? DIWARP_WC_RECV : DIWARP_WC_SEND,
                               .qp_num = qp->u.qp.qpn};
        diwarpdv_warn("diwarpd: client pid %d: QP 0x%06x refused a %s WR (wr_id %" PRIu64 "): %s",
                      qp->c->pid, qp->u.qp.qpn, recv ? "receive" : "send", wr_id, strerror(-err));
        dd_cq_push(cq, &wc);
}

static struct diwarp_ah *ah_of(struct dd_client *c, uint32_t h)
{
        if (h == 0 || h >= c->nobjs || !c->objs[h] || c->objs[h]->kind != DD_AH)
                return NULL;
        return c->objs[h]->u.ah.ah;
}

/* Entries a client's ring holds for us; 0 when it holds none, or when the
 * client wrote an index beyond the ring (it is dropped). */
static uint32_t ring_avail(struct dd_client *c, struct dw_ipc_ring *ring, uint32_t cons,
                           uint32_t entries, const char *what, uint32_t h)
{
        uint32_t prod = atomic_load_explicit(&ring->prod, memory_order_acquire);
        uint32_t avail = prod - cons;
        if (avail > entries) {
                client_broken(c, what, h, prod);
                return 0;
        }
        return avail;
}

/* The WR a send ring entry (e, read once into x) asks for, into w, with
 * its SGEs in sge and its inline data copied to inl; xd: its RD
 * destination. -EINVAL for an entry the engine must not see (more SGEs or
 * inline bytes than the QP has, an AH handle that names none, a memory
 * window bind). */
static int swr_from_ring(struct dd_obj *o, const struct dw_ipc_swr *e, const struct dw_ipc_swr *x,
                         const struct diwarpdv_rd_dest *xd, struct diwarp_send_wr *w,
                         struct diwarp_sge *sge, uint8_t *inl)
{
        struct dd_client *c = o->c;
        bool x_rd = x->rd != 0;
        memset(w, 0, sizeof(*w));
        w->wr_id = x->wr_id;
        w->opcode = (enum diwarp_wr_opcode)x->opcode;
        w->send_flags = x->send_flags;
        w->imm_data = x->imm_data;
        w->invalidate_rkey = x->invalidate_rkey;
        if (x->opcode == DIWARP_WR_ATOMIC_CMP_AND_SWP ||
            x->opcode == DIWARP_WR_ATOMIC_FETCH_AND_ADD) {
                w->wr.atomic.remote_addr = x->remote_addr;
                w->wr.atomic.compare_add = x->compare_add;
                w->wr.atomic.swap = x->swap;
                w->wr.atomic.rkey = x->rkey;
        } else if (o->u.qp.type == DIWARP_QPT_UD ||
                   (o->u.qp.type == DIWARP_QPT_RD && !x_rd && dw_ipc_send_op(x->opcode))) {
                /* The engine reads wr.ud here: the AH is ours, looked up in
                 * the client's table (NULL when the handle names none:
                 * refused below). */
                w->wr.ud.ah = ah_of(c, x->ah);
                w->wr.ud.remote_qpn = x->remote_qpn;
                w->wr.ud.remote_qkey = x->remote_qkey;
        } else {
                w->wr.rdma.remote_addr = x->remote_addr;
                w->wr.rdma.rkey = x->rkey;
        }
        w->sg_list = sge;
        if (x->send_flags & DIWARP_SEND_INLINE) {
                uint32_t len = x->inline_len;
                if (len > o->u.qp.cap.max_inline_data || len > DW_IPC_MAX_INLINE_COPY)
                        return -EINVAL;
                const uint8_t *src = (const uint8_t *)(dw_ipc_swr_sges((struct dw_ipc_swr *)e) +
                                                       o->u.qp.cap.max_send_sge);
                memcpy(inl, src, len);
                sge[0] = (struct diwarp_sge){(uintptr_t)inl, len, 0};
                w->num_sge = len ? 1 : 0;
        } else {
                if (x->num_sge > o->u.qp.cap.max_send_sge || x->num_sge > 8)
                        return -EINVAL;
                memcpy(sge, dw_ipc_swr_sges((struct dw_ipc_swr *)e),
                       x->num_sge * sizeof(struct diwarp_sge));
                w->num_sge = (int)x->num_sge;
        }
        /* BIND_MW names a window by pointer: never from a client (client
         * mode has no windows). */
        if ((o->u.qp.type == DIWARP_QPT_UD && !w->wr.ud.ah) || (x_rd && x->ah && !xd->ah) ||
            x->opcode == DIWARP_WR_BIND_MW)
                return -EINVAL;
        return 0;
}

/* Posts what the SQ ring holds. */
static int serve_sq(struct dd_obj *o)
{
        struct dd_client *c = o->c;
        uint32_t avail =
            ring_avail(c, o->u.qp.sq, o->u.qp.sq_cons, o->u.qp.sq_entries, "send ring", o->h);
        if (avail == 0)
                return 0;
        int work = 0;
        while (avail) {
                struct diwarp_send_wr wr[POST_BATCH];
                struct diwarp_sge sge[POST_BATCH][8];
                uint8_t inl[POST_BATCH][DW_IPC_MAX_INLINE_COPY];
                struct diwarpdv_rd_dest dest = {0};
                bool rd = false;
                uint32_t n = 0;
                int bad_at = -1, bad_err = 0;
                while (n < avail && n < POST_BATCH) {
                        const struct dw_ipc_swr *e = dw_ipc_ring_entry(
                            o->u.qp.sq, o->u.qp.sq_esize, o->u.qp.sq_entries, o->u.qp.sq_cons + n);
                        struct dw_ipc_swr x;
                        memcpy(&x, e, sizeof(x)); /* read once: the client may scribble */
                        bool x_rd = x.rd != 0;
                        struct diwarpdv_rd_dest xd = {
                            .ah = NULL, .remote_qpn = x.remote_qpn, .remote_qkey = x.remote_qkey};
                        if (x_rd && x.ah)
                                xd.ah = ah_of(c, x.ah);
                        if (n > 0 && (x_rd != rd || (rd && memcmp(&xd, &dest, sizeof(xd)))))
                                break; /* one destination per diwarpdv_post_send_rd */
                        rd = x_rd;
                        dest = xd;
                        struct diwarp_send_wr *w = &wr[n];
                        int err = swr_from_ring(o, e, &x, &xd, w, sge[n], inl[n]);
                        if (err < 0) {
                                bad_at = (int)n;
                                bad_err = err;
                                n++;
                                break;
                        }
                        if (n > 0)
                                wr[n - 1].next = w;
                        n++;
                }
                uint32_t good = bad_at >= 0 ? (uint32_t)bad_at : n;
                uint32_t done = good;
                if (good > 0) {
                        wr[good - 1].next = NULL;
                        struct diwarp_send_wr *bad = NULL;
                        int err = rd ? diwarpdv_post_send_rd(o->u.qp.qp, wr, &dest, &bad)
                                     : diwarp_post_send(o->u.qp.qp, wr, &bad);
                        if (err < 0) {
                                done = bad ? (uint32_t)(bad - wr) : 0;
                                if (err == -ENOMEM) {
                                        /* The engine's SQ is full: the rest waits. */
                                        o->u.qp.sq_cons += done;
                                        c->posted_send += done;
                                        work += (int)done;
                                        break;
                                }
                                refuse(o, o->u.qp.scq, wr[done].wr_id, false, err);
                                done++;
                                bad_at = -1;
                        }
                }
                if (bad_at >= 0) {
                        refuse(o, o->u.qp.scq, wr[bad_at].wr_id, false, bad_err);
                        done = (uint32_t)bad_at + 1;
                }
                o->u.qp.sq_cons += done;
                c->posted_send += done;
                avail -= done;
                work += (int)done;
                if (done == 0)
                        break;
        }
        atomic_store_explicit(&o->u.qp.sq->cons, o->u.qp.sq_cons, memory_order_release);
        return work;
}

/* Posts what a receive ring holds, to a QP (qp) or an SRQ (srq). */
static int serve_recv(struct dd_obj *owner, struct dw_ipc_ring *ring, uint32_t entries,
                      uint32_t esize, uint32_t max_sge, uint32_t *cons, struct dd_obj *qp,
                      struct dd_obj *srq)
{
        struct dd_client *c = owner->c;
        uint32_t avail = ring_avail(c, ring, *cons, entries, "receive ring", owner->h);
        if (avail == 0)
                return 0;
        int work = 0;
        while (avail) {
                struct diwarp_recv_wr wr[POST_BATCH];
                struct diwarp_sge sge[POST_BATCH][8];
                uint32_t n = 0;
                int bad_at = -1;
                while (n < avail && n < POST_BATCH) {
                        const struct dw_ipc_rwr *e =
                            dw_ipc_ring_entry(ring, esize, entries, *cons + n);
                        struct dw_ipc_rwr x;
                        memcpy(&x, e, sizeof(x));
                        wr[n].wr_id = x.wr_id;
                        wr[n].next = NULL;
                        wr[n].sg_list = sge[n];
                        if (x.num_sge > max_sge || x.num_sge > 8) {
                                bad_at = (int)n;
                                n++;
                                break;
                        }
                        memcpy(sge[n], dw_ipc_rwr_sges((struct dw_ipc_rwr *)e),
                               x.num_sge * sizeof(struct diwarp_sge));
                        wr[n].num_sge = (int)x.num_sge;
                        if (n > 0)
                                wr[n - 1].next = &wr[n];
                        n++;
                }
                uint32_t good = bad_at >= 0 ? (uint32_t)bad_at : n;
                uint32_t done = good;
                if (good > 0) {
                        wr[good - 1].next = NULL;
                        struct diwarp_recv_wr *bad = NULL;
                        int err = srq ? diwarp_post_srq_recv(srq->u.srq.srq, wr, &bad)
                                      : diwarp_post_recv(qp->u.qp.qp, wr, &bad);
                        if (err < 0) {
                                done = bad ? (uint32_t)(bad - wr) : 0;
                                if (err == -ENOMEM) {
                                        *cons += done;
                                        c->posted_recv += done;
                                        work += (int)done;
                                        break;
                                }
                                if (qp)
                                        refuse(qp, qp->u.qp.rcq, wr[done].wr_id, true, err);
                                else
                                        diwarpdv_warn(
                                            "diwarpd: client pid %d: SRQ handle %u refused "
                                            "a receive WR: %s",
                                            c->pid, owner->h, strerror(-err));
                                done++;
                                bad_at = -1;
                        }
                }
                if (bad_at >= 0) {
                        if (qp)
                                refuse(qp, qp->u.qp.rcq, wr[bad_at].wr_id, true, -EINVAL);
                        done = (uint32_t)bad_at + 1;
                }
                *cons += done;
                c->posted_recv += done;
                avail -= done;
                work += (int)done;
                if (done == 0)
                        break;
        }
        atomic_store_explicit(&ring->cons, *cons, memory_order_release);
        return work;
}

/* Moves the engine CQ's completions into the client's ring; takes an arm. */
static int serve_cq(struct dd_obj *o)
{
        uint32_t arm = atomic_load_explicit(&o->u.cq.ring->arm, memory_order_relaxed);
        if (arm) {
                arm = atomic_exchange_explicit(&o->u.cq.ring->arm, 0, memory_order_acq_rel);
                if (arm) {
                        o->u.cq.armed = arm;
                        /* Completions it may not have seen when it armed. */
                        if (o->u.cq.prod !=
                            atomic_load_explicit(&o->u.cq.ring->cons, memory_order_acquire))
                                fire(o);
                }
        }
        uint32_t room = cq_room(o);
        if (room == 0)
                return 0;
        struct diwarp_wc wc[CQ_BATCH];
        int n = diwarp_cq_poll(o->u.cq.cq, room < CQ_BATCH ? (int)room : CQ_BATCH, wc);
        if (n <= 0)
                return 0;
        struct dd_dev *d = o->c->dd;
        for (int i = 0; i < n; i++) {
                cq_put(o, &wc[i]);
                if (wc[i].status != DIWARP_WC_SUCCESS) {
                        struct dd_obj *qp = d->by_qpn[wc[i].qp_num & (DD_QPN_SLOTS - 1)];
                        if (qp && qp->u.qp.qpn == wc[i].qp_num)
                                qp_state_publish(qp);
                }
        }
        atomic_store_explicit(&o->u.cq.ring->prod, o->u.cq.prod, memory_order_release);
        dw_ipc_cq_published(o->u.cq.ring);
        o->c->completions += (uint64_t)n;
        if (o->u.cq.armed)
                fire(o);
        return n;
}

int dd_client_serve(struct dd_client *c)
{
        int work = 0;
        for (uint32_t i = 0; i < c->nactive; i++) {
                struct dd_obj *o = c->active[i];
                switch (o->kind) {
                case DD_QP:
                        /* Receives first: a Send the client posted after
                         * them, to itself or to a client this server copies
                         * to, finds them in the engine. */
                        if (o->u.qp.rq)
                                work +=
                                    serve_recv(o, o->u.qp.rq, o->u.qp.rq_entries, o->u.qp.rq_esize,
                                               o->u.qp.cap.max_recv_sge, &o->u.qp.rq_cons, o, NULL);
                        work += serve_sq(o);
                        break;
                case DD_SRQ:
                        work += serve_recv(o, o->u.srq.ring, o->u.srq.entries, o->u.srq.esize,
                                           o->u.srq.max_sge, &o->u.srq.cons, NULL, o);
                        break;
                case DD_CQ:
                        work += serve_cq(o);
                        break;
                default:
                        break;
                }
        }
        return work;
}

/* ---- clients, devices, events ------------------------------------------------ */

/* A paused client's socket leaves the server's epoll set: epoll reports a
 * hang-up (EPOLLHUP) whatever events were asked for, and reading then would
 * run the requests queued behind the slow one while its thread still uses
 * the objects they name. Its hang-up is seen once it is back. */
void dd_client_pause(struct dd_client *c, bool pause)
{
        if (pause == c->paused)
                return;
        if (pause) {
                epoll_ctl(c->srv->epfd, EPOLL_CTL_DEL, c->sock, NULL);
        } else {
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->w};
                epoll_ctl(c->srv->epfd, EPOLL_CTL_ADD, c->sock, &ev);
        }
        c->paused = pause;
}

void dd_server_resume(struct dd_server *s)
{
        uint64_t one = 1;
        ssize_t r = write(s->doorbell, &one, sizeof(one));
        (void)r;
}

static void client_drop(struct dd_server *s, struct dd_client *c)
{
        struct dd_daemon *D = dd_daemon();
        if (atomic_load(&c->busy) > 0) {
                /* Its slow request's thread still uses it: once that ends. */
                c->broken = true;
                return;
        }
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->sock, NULL);
        pthread_mutex_lock(&D->lock);
        for (struct dd_client **pp = &s->clients; *pp; pp = &(*pp)->next)
                if (*pp == c) {
                        *pp = c->next;
                        break;
                }
        s->nclients--;
        pthread_mutex_unlock(&D->lock);
        diwarpdv_info("diwarpd: client pid %d left: freeing what it held", c->pid);
        dd_client_free(c);
}

static void client_add(struct dd_server *s, const struct dd_hand *h)
{
        int fd = h->fd;
        struct dd_client *c = calloc(1, sizeof(*c));
        if (!c) {
                close(fd);
                return;
        }
        c->pid = h->pid;
        c->uid = h->uid;
        c->owner = h->uid == dd_daemon()->uid;
        c->sock = fd;
        c->ev_sock = -1;
        c->srv = s;
        c->w.kind = DD_W_CLIENT;
        c->w.p = c;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->w};
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev);
        struct dd_daemon *D = dd_daemon();
        pthread_mutex_lock(&D->lock);
        c->next = s->clients;
        s->clients = c;
        s->nclients++;
        pthread_mutex_unlock(&D->lock);
}

/* Requests waiting on c's socket. */
static void client_readable(struct dd_server *s, struct dd_client *c)
{
        for (int k = 0; k < 16; k++) {
                /* A slow request's thread uses its objects: nothing else of
                 * it runs meanwhile, not even on a hang-up (an event of this
                 * batch may predate the pause). */
                if (c->paused || atomic_load(&c->busy) > 0)
                        return;
                uint8_t buf[DW_IPC_MAX_MSG];
                int fds[DW_IPC_MAX_FDS], nfds = DW_IPC_MAX_FDS;
                ssize_t n = dw_ipc_recv(c->sock, buf, sizeof(buf), fds, &nfds);
                if (n == -EAGAIN)
                        return;
                if (n == -EMSGSIZE) {
                        atomic_fetch_add(&dd_daemon()->rejected, 1);
                        if (dd_client_log_ok(c))
                                diwarpdv_warn(
                                    "diwarpd: client pid %d: request rejected: longer than %u "
                                    "bytes",
                                    c->pid, DW_IPC_MAX_MSG);
                        continue;
                }
                if (n <= 0) {
                        client_drop(s, c);
                        return;
                }
                if (dd_request(c, buf, (size_t)n, fds, nfds) < 0) {
                        client_drop(s, c);
                        return;
                }
                if (c->paused)
                        return; /* a slow request runs: the rest waits for it */
        }
}

static struct dd_obj *obj_of_engine(struct dd_server *s, enum dd_kind kind, const void *eng,
                                    enum dw_ipc_ev_kind *ek)
{
        for (struct dd_client *c = s->clients; c; c = c->next)
                for (uint32_t i = 0; i < c->nactive; i++) {
                        struct dd_obj *o = c->active[i];
                        if (o->kind != kind)
                                continue;
                        if ((kind == DD_QP && (const void *)o->u.qp.qp == eng) ||
                            (kind == DD_CQ && (const void *)o->u.cq.cq == eng) ||
                            (kind == DD_SRQ && (const void *)o->u.srq.srq == eng)) {
                                *ek = kind == DD_QP   ? DW_IPC_EV_QP
                                      : kind == DD_CQ ? DW_IPC_EV_CQ
                                                      : DW_IPC_EV_SRQ;
                                return o;
                        }
                }
        return NULL;
}

static void dev_async(struct dd_server *s, struct dd_dev *d)
{
        struct diwarp_async_event ev;
        while (diwarp_get_async_event(d->dev, &ev) == 0) {
                struct dw_ipc_event m = {.type = ev.event_type};
                struct dd_obj *o = NULL;
                enum dw_ipc_ev_kind ek = DW_IPC_EV_DEV;
                switch (ev.event_type) {
                case DIWARP_EVENT_CQ_ERR:
                        o = obj_of_engine(s, DD_CQ, ev.element.cq, &ek);
                        break;
                case DIWARP_EVENT_SRQ_ERR:
                case DIWARP_EVENT_SRQ_LIMIT_REACHED:
                        o = obj_of_engine(s, DD_SRQ, ev.element.srq, &ek);
                        break;
                case DIWARP_EVENT_DEVICE_FATAL:
                case DIWARP_EVENT_PORT_ACTIVE:
                        break;
                default:
                        o = obj_of_engine(s, DD_QP, ev.element.qp, &ek);
                        if (o)
                                qp_state_publish(o);
                        break;
                }
                if (ek == DW_IPC_EV_DEV) {
                        for (struct dd_client *c = s->clients; c; c = c->next)
                                if (c->dd == d && c->ev_sock >= 0)
                                        dw_ipc_send(c->ev_sock, &m, sizeof(m), NULL, 0, true);
                        continue;
                }
                if (!o)
                        continue;
                m.kind = ek;
                m.handle = o->h;
                dw_ipc_send(o->c->ev_sock, &m, sizeof(m), NULL, 0, true);
        }
}

void dd_server_watch_dev(struct dd_server *s, struct dd_dev *d)
{
        d->w_prog = (struct dd_watch){DD_W_DEV_PROGRESS, d};
        d->w_async = (struct dd_watch){DD_W_DEV_ASYNC, d};
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &d->w_prog};
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, d->prog_fd, &ev);
        ev.data.ptr = &d->w_async;
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, diwarp_async_fd(d->dev), &ev);
}

void dd_server_dev_close(struct dd_server *s, struct dd_dev *d)
{
        /* diwarp stat walks every server's devices under the lock, and
         * goes on counting what the closed ones did. */
        struct dd_daemon *D = dd_daemon();
        struct diwarp_counters k;
        bool counted = diwarp_device_counters(d->dev, &k) == 0;
        pthread_mutex_lock(&D->lock);
        for (struct dd_dev **pp = &s->devs; *pp; pp = &(*pp)->next)
                if (*pp == d) {
                        *pp = d->next;
                        break;
                }
        if (counted) {
                uint64_t *a = (uint64_t *)&D->gone;
                const uint64_t *b = (const uint64_t *)&k;
                for (size_t j = 0; j < sizeof(k) / sizeof(uint64_t); j++)
                        a[j] += b[j];
        }
        pthread_mutex_unlock(&D->lock);
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, d->prog_fd, NULL);
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, diwarp_async_fd(d->dev), NULL);
        int err = diwarp_device_close(d->dev);
        if (err < 0)
                diwarpdv_warn("diwarpd: server %d: closing the device at %s (port base %u): %s",
                              s->id, d->addr[0] ? d->addr : "every address", d->port_base,
                              strerror(-err));
        else
                diwarpdv_info(
                    "diwarpd: server %d: device at %s (port base %u) closed: no client uses it",
                    s->id, d->addr[0] ? d->addr : "every address", d->port_base);
        free(d);
        atomic_fetch_sub(&dd_daemon()->ndevs, 1);
}

static void handle_events(struct dd_server *s, struct epoll_event *evs, int n)
{
        for (int i = 0; i < n; i++) {
                struct dd_watch *w = evs[i].data.ptr;
                switch (w->kind) {
                case DD_W_DOORBELL: {
                        uint64_t v;
                        ssize_t r = read(s->doorbell, &v, sizeof(v));
                        (void)r;
                        pthread_mutex_lock(&s->hand_lock);
                        struct dd_hand hand[64];
                        int nh = s->nhand;
                        memcpy(hand, s->hand, sizeof(hand[0]) * (size_t)nh);
                        s->nhand = 0;
                        pthread_mutex_unlock(&s->hand_lock);
                        for (int k = 0; k < nh; k++)
                                client_add(s, &hand[k]);
                        for (struct dd_client *c = s->clients; c; c = c->next)
                                if (c->paused && atomic_load(&c->busy) == 0)
                                        dd_client_pause(c, false);
                        break;
                }
                case DD_W_CLIENT:
                        client_readable(s, w->p);
                        /* A dropped client's later events in this batch: its
                         * watch is freed, so stop here and look again. */
                        return;
                case DD_W_DEV_PROGRESS:
                        diwarpdv_external_run(((struct dd_dev *)w->p)->dev);
                        break;
                case DD_W_DEV_ASYNC:
                        dev_async(s, w->p);
                        break;
                }
        }
}

static void drop_broken(struct dd_server *s)
{
        for (struct dd_client *c = s->clients; c;) {
                struct dd_client *next = c->next;
                if (c->broken && atomic_load(&c->busy) == 0)
                        client_drop(s, c);
                c = next;
        }
}

/* How long the server may sleep: until the earliest timer of its devices
 * (ns, -1: until a fd is ready). */
static int64_t sleep_ns(struct dd_server *s)
{
        int64_t t = -1;
        for (struct dd_dev *d = s->devs; d; d = d->next) {
                int64_t x = -1;
                if (diwarpdv_external_timeout(d->dev, &x) == 0 && x >= 0 && (t < 0 || x < t))
                        t = x;
        }
        return t;
}

/* Timers that came due while the server slept. */
static void run_devs(struct dd_server *s)
{
        for (struct dd_dev *d = s->devs; d; d = d->next)
                diwarpdv_external_run(d->dev);
}

static int serve_all(struct dd_server *s)
{
        int work = 0;
        for (struct dd_client *c = s->clients; c; c = c->next)
                work += dd_client_serve(c);
        return work;
}

/* A server spins (polls, yielding) for spin_ns after its last work before it
 * sleeps: on a core of its own that saves a wake-up per message. Beside CPU
 * hogs the spin is counted against it, and its wake-ups then wait for a
 * hog's slice (perf sched: up to 4 ms), long enough for the peer's RTO to
 * fire: one RD Write pair through the daemons beside a nice-0 `yes` per core
 * made x0.26-0.50 of TCP spinning 50 us, x0.40-0.74 not spinning. So the
 * server watches its own run-queue delay over windows of
 * DIWARPDV_CORE_WINDOW_NS; a window in which it waited for its core (the
 * engine's rule, diwarpdv_waited_for_core) turns the spin off for
 * SPIN_OFF_NS. */
#define SPIN_OFF_NS 100000000ull

struct spin_watch {
        uint64_t at_ns, off_until;
        int64_t delay_ns; /* the run-queue delay at at_ns; <0: unknown */
};

/* Whether the server may spin at now. */
static bool spin_allowed(struct spin_watch *w, uint64_t now)
{
        if (now - w->at_ns >= DIWARPDV_CORE_WINDOW_NS) {
                int64_t d = diwarpdv_thread_run_delay_ns();
                if (d >= 0 && w->delay_ns >= 0 &&
                    diwarpdv_waited_for_core((uint64_t)(d - w->delay_ns), now - w->at_ns))
                        w->off_until = now + SPIN_OFF_NS;
                w->delay_ns = d;
                w->at_ns = now;
        }
        return now >= w->off_until;
}

static void *server_main(void *arg)
{
        struct dd_server *s = arg;
        struct dd_daemon *D = dd_daemon();
        uint64_t last_work = diwarpdv_now_ns();
        struct spin_watch spin = {last_work, 0, diwarpdv_thread_run_delay_ns()};
        unsigned int turn = 0;
        struct epoll_event evs[32];
        diwarpdv_short_time_slice();
        /* Its sleeps end at the engine's timers (delayed ACKs, pacing:
         * microseconds); the default 50 us slack would stretch each. */
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
        while (!atomic_load(&s->stop)) {
                int work = serve_all(s);
                if (work > 0) {
                        last_work = diwarpdv_now_ns();
                        if (++turn % LOOK_EVERY)
                                continue;
                        handle_events(s, evs, epoll_wait(s->epfd, evs, 32, 0));
                        drop_broken(s);
                        continue;
                }
                uint64_t now = diwarpdv_now_ns();
                if (now - last_work < D->spin_ns && spin_allowed(&spin, now)) {
                        /* Polling, not hogging: with more busy threads than
                         * cores the clients may need this core. */
                        sched_yield();
                        if (++turn % 8 == 0) {
                                handle_events(s, evs, epoll_wait(s->epfd, evs, 32, 0));
                                drop_broken(s);
                        }
                        continue;
                }
                atomic_store(&s->page->sleeping, 1);
                /* Anything posted or armed between our last look and the
                 * flag (the clients read it after they publish). */
                int n = 0;
                if (serve_all(s) == 0) {
                        /* A client the serving found broken (a ring index
                         * beyond its entries) goes before the sleep, not at
                         * the next event: with the spin off (a busy host)
                         * that may never come. */
                        drop_broken(s);
                        int64_t t = sleep_ns(s);
                        struct timespec ts = {t / 1000000000, t % 1000000000};
                        n = epoll_pwait2(s->epfd, evs, 32, t < 0 ? NULL : &ts, NULL);
                        atomic_fetch_add_explicit(&s->wakeups, 1, memory_order_relaxed);
                        if (n == 0)
                                run_devs(s);
                }
                atomic_store(&s->page->sleeping, 0);
                if (n > 0) {
                        /* The rings before the devices: a receive a client
                         * posted (its doorbell woke us) before the datagram
                         * that needs it was sent must be in the engine when
                         * the device reads that datagram, or UD drops it. A
                         * Send from a client of another server waits for the
                         * receive only DW_UD_HOLD_NS (1 ms) before it goes as
                         * a datagram; a server slow to wake let it through
                         * first (a UD ping-pong of daemon_nice lost a message
                         * once in CI). */
                        serve_all(s);
                        handle_events(s, evs, n);
                }
                drop_broken(s);
                last_work = diwarpdv_now_ns();
        }
        return NULL;
}

int dd_server_init(struct dd_server *s, int id)
{
        s->id = id;
        pthread_mutex_init(&s->hand_lock, NULL);
        s->epfd = epoll_create1(EPOLL_CLOEXEC);
        s->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        s->page_fd = memfd_create("diwarpd-server", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (s->epfd < 0 || s->doorbell < 0 || s->page_fd < 0 || ftruncate(s->page_fd, 4096) < 0 ||
            fcntl(s->page_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return -errno;
        s->page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, s->page_fd, 0);
        if (s->page == MAP_FAILED)
                return -errno;
        s->w_door = (struct dd_watch){DD_W_DOORBELL, s};
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->w_door};
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->doorbell, &ev);
        return 0;
}

int dd_server_start(struct dd_server *s, int id)
{
        int err = dd_server_init(s, id);
        if (err < 0)
                return err;
        return -pthread_create(&s->th, NULL, server_main, s);
}

int dd_server_turn(struct dd_server *s, int timeout_ms)
{
        struct epoll_event evs[32];
        int work = serve_all(s);
        int n = epoll_wait(s->epfd, evs, 32, work ? 0 : timeout_ms);
        if (n > 0)
                handle_events(s, evs, n);
        else
                run_devs(s);
        drop_broken(s);
        return work + (n > 0 ? n : 0);
}

void dd_server_hand(struct dd_server *s, int fd, int32_t pid, uint32_t uid)
{
        pthread_mutex_lock(&s->hand_lock);
        if (s->nhand == 64) {
                pthread_mutex_unlock(&s->hand_lock);
                diwarpdv_warn("diwarpd: server %d: too many connections waiting; one refused",
                              s->id);
                close(fd);
                return;
        }
        s->hand[s->nhand++] = (struct dd_hand){fd, pid, uid};
        pthread_mutex_unlock(&s->hand_lock);
        uint64_t one = 1;
        ssize_t r = write(s->doorbell, &one, sizeof(one));
        (void)r;
}

void dd_server_stop(struct dd_server *s)
{
        atomic_store(&s->stop, true);
        uint64_t one = 1;
        ssize_t r = write(s->doorbell, &one, sizeof(one));
        (void)r;
        pthread_join(s->th, NULL);
        /* Slow requests still running: their threads end within the
         * connect timeout. */
        for (int i = 0; i < 6000; i++) {
                bool busy = false;
                for (struct dd_client *c = s->clients; c; c = c->next)
                        busy |= atomic_load(&c->busy) > 0;
                if (!busy)
                        break;
                usleep(10000);
        }
        /* A thread that still runs keeps its client and the devices: the
         * process is exiting, and freeing them under it would crash it. */
        bool left = false;
        for (struct dd_client *c = s->clients, *next; c; c = next) {
                next = c->next;
                if (atomic_load(&c->busy) > 0) {
                        diwarpdv_warn(
                            "diwarpd: server %d: client pid %d: a connect still runs; its "
                            "objects are left to the exit",
                            s->id, c->pid);
                        left = true;
                        continue;
                }
                client_drop(s, c);
        }
        if (left)
                return;
        for (struct dd_dev *d = s->devs; d;) {
                struct dd_dev *next = d->next;
                diwarp_device_close(d->dev);
                free(d);
                d = next;
        }
}
