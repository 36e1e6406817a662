/* diwarpd: the requests a client sends on its Unix socket (ipc/ipc.h). Every
 * message passes dw_ipc_req_check first; handles are looked up in the
 * client's own table with the kind the operation needs, so a client names
 * only its own objects. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"

static struct dd_obj *obj_get(struct dd_client *c, uint32_t h, enum dd_kind kind)
{
        if (h == 0 || h >= c->nobjs || !c->objs[h] || c->objs[h]->kind != kind)
                return NULL;
        return c->objs[h];
}

static struct dd_obj *obj_new(struct dd_client *c, enum dd_kind kind)
{
        uint32_t h = 1;
        while (h < c->nobjs && c->objs[h])
                h++;
        if (h >= c->nobjs) {
                uint32_t n = c->nobjs ? 2 * c->nobjs : 64;
                if (n > (1u << 20))
                        return NULL;
                struct dd_obj **o = realloc(c->objs, n * sizeof(*o));
                if (!o)
                        return NULL;
                memset(o + c->nobjs, 0, (n - c->nobjs) * sizeof(*o));
                c->objs = o;
                c->nobjs = n;
        }
        struct dd_obj *x = calloc(1, sizeof(*x));
        if (!x)
                return NULL;
        x->kind = kind;
        x->h = h;
        x->c = c;
        c->objs[h] = x;
        return x;
}

static void obj_del(struct dd_obj *o)
{
        o->c->objs[o->h] = NULL;
        free(o);
}

/* A region of rings shared with the client: a sealed memfd, so the client
 * can neither shrink it under us nor grow it. */
static int shm_region(size_t len, void **map, int *fd_out)
{
        int fd = memfd_create("diwarpd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t)len) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                int err = -errno;
                close(fd);
                return err;
        }
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
                int err = -errno;
                close(fd);
                return err;
        }
        *map = p;
        *fd_out = fd;
        return 0;
}

/* Distinct devices (address, port base) the connections of client pid pid
 * hold open, every server's, counting (addr, port_base) once more unless it
 * is among them (D->lock held). */
static int client_devs(int32_t pid, const char *addr, uint16_t port_base)
{
        struct dd_daemon *D = dd_daemon();
        const struct dd_dev *seen[64];
        int n = 0;
        bool found = false;
        for (int i = 0; i < D->nservers; i++)
                for (struct dd_client *x = D->servers[i].clients; x; x = x->next) {
                        const struct dd_dev *d = x->dd;
                        if (!x->opened || x->pid != pid || !d)
                                continue;
                        bool dup = false;
                        for (int k = 0; k < n && !dup; k++)
                                dup = !strcmp(seen[k]->addr, d->addr) &&
                                      seen[k]->port_base == d->port_base;
                        if (dup)
                                continue;
                        found |= !strcmp(d->addr, addr) && d->port_base == port_base;
                        if (n < 64)
                                seen[n++] = d;
                }
        return found ? n : n + 1;
}

/* The device of (addr, port_base) on c's server, opened when none is. A
 * client may use DIWARPD_CLIENT_DEVICES distinct ones at a time (-EMFILE
 * past it), the daemon hold DIWARPD_MAX_DEVICES (-ENFILE): each costs
 * sockets, threads' worth of memory and ports. */
static struct dd_dev *dev_get(struct dd_client *c, const char *addr, uint16_t port_base)
{
        struct dd_server *s = c->srv;
        struct dd_daemon *D = dd_daemon();
        pthread_mutex_lock(&D->lock);
        int mine = client_devs(c->pid, addr, port_base);
        pthread_mutex_unlock(&D->lock);
        if (mine > D->client_devs) {
                if (dd_client_log_ok(c))
                        diwarpdv_warn(
                            "diwarpd: client pid %d (uid %u): OPEN of a device at %s (port base "
                            "%u) refused: it would use %d devices, the most one client may "
                            "(DIWARPD_CLIENT_DEVICES, --client-devices: %d)",
                            c->pid, c->uid, addr[0] ? addr : "every address", port_base, mine,
                            D->client_devs);
                errno = EMFILE;
                return NULL;
        }
        for (struct dd_dev *d = s->devs; d; d = d->next)
                if (!strcmp(d->addr, addr) && d->port_base == port_base)
                        return d;
        if (atomic_fetch_add(&D->ndevs, 1) >= D->max_devs) {
                atomic_fetch_sub(&D->ndevs, 1);
                if (dd_client_log_ok(c))
                        diwarpdv_warn(
                            "diwarpd: client pid %d (uid %u): OPEN of a device at %s (port base "
                            "%u) refused: the daemon holds %d devices, its most "
                            "(DIWARPD_MAX_DEVICES, --max-devices)",
                            c->pid, c->uid, addr[0] ? addr : "every address", port_base,
                            D->max_devs);
                errno = ENFILE;
                return NULL;
        }
        struct dd_dev *d = calloc(1, sizeof(*d));
        if (!d) {
                atomic_fetch_sub(&D->ndevs, 1);
                errno = ENOMEM;
                return NULL;
        }
        /* Every client's regions are mapped here: RC and UD traffic
         * between two clients is one copy (DIWARP_LOCAL_COPY, unless the
         * environment says 0). */
        struct diwarp_open_opts o = {
            .addr = addr[0] ? addr : NULL, .port_base = port_base, .flags = DIWARP_OPEN_LOCAL_COPY};
        int err = diwarp_device_open(&o, &d->dev);
        if (err < 0) {
                free(d);
                atomic_fetch_sub(&D->ndevs, 1);
                errno = -err;
                return NULL;
        }
        /* The server drives the device and sleeps on its epoll set: no
         * progress thread, so nothing but the server takes its lock. */
        d->prog_fd = diwarpdv_external_progress(d->dev);
        if (d->prog_fd < 0) {
                err = -d->prog_fd;
                diwarp_device_close(d->dev);
                free(d);
                atomic_fetch_sub(&D->ndevs, 1);
                errno = err;
                return NULL;
        }
        int afd = diwarp_async_fd(d->dev);
        fcntl(afd, F_SETFL, fcntl(afd, F_GETFL) | O_NONBLOCK);
        dd_server_watch_dev(s, d);
        snprintf(d->addr, sizeof(d->addr), "%s", addr);
        d->port_base = port_base;
        pthread_mutex_lock(&D->lock);
        d->next = s->devs;
        s->devs = d;
        pthread_mutex_unlock(&D->lock);
        return d;
}

static int do_open(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp,
                   int *fds, int *nfds)
{
        if (c->opened)
                return -EALREADY;
        if (!c->pid)
                c->pid = r->u.open.pid; /* the kernel did not say */
        struct dd_dev *d = dev_get(c, r->u.open.addr, r->u.open.port_base);
        if (!d) {
                int err = -errno;
                if (err != -EMFILE && err != -ENFILE && dd_client_log_ok(c))
                        diwarpdv_warn("diwarpd: client pid %d: device at %s (port base %u): %s",
                                      c->pid, r->u.open.addr[0] ? r->u.open.addr : "every address",
                                      r->u.open.port_base, strerror(-err));
                return err;
        }
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
                int err = -errno;
                if (d->users == 0)
                        dd_server_dev_close(c->srv, d);
                return err;
        }
        fcntl(sp[0], F_SETFL, O_NONBLOCK);
        c->ev_sock = sp[0];
        /* Under the lock: other servers count this client's devices. */
        pthread_mutex_lock(&dd_daemon()->lock);
        c->dd = d;
        c->opened = true;
        pthread_mutex_unlock(&dd_daemon()->lock);
        d->users++;
        struct dw_ipc_open_rsp *o = &rsp->u.open;
        diwarp_device_port(d->dev, &o->port, &o->instance);
        o->ngid = diwarp_device_gid_table(d->dev, o->gids, DIWARP_MAX_GIDS);
        diwarp_device_gid(d->dev, &o->gid);
        diwarp_device_query(d->dev, &o->attr);
        o->server = (uint32_t)c->srv->id;
        fds[0] = sp[1];
        fds[1] = c->srv->doorbell;
        fds[2] = c->srv->page_fd;
        *nfds = 3;
        diwarpdv_info("diwarpd: client pid %d opened port %u (server %d)", c->pid, o->port,
                      c->srv->id);
        return 0;
}

static int do_seg_add(struct dd_client *c, const struct dw_ipc_req *r, int fd)
{
        const struct dw_ipc_seg *g = &r->u.seg;
        int seals = fcntl(fd, F_GET_SEALS);
        struct stat st;
        if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) < 0 ||
            (uint64_t)st.st_size < g->len) {
                diwarpdv_warn("diwarpd: client pid %d: segment [0x%" PRIx64 ", +%" PRIu64
                              ") refused: not a sealed memfd of that size",
                              c->pid, g->base, g->len);
                return -EINVAL;
        }
        for (uint32_t i = 1; i < c->nobjs; i++)
                if (c->objs[i] && c->objs[i]->kind == DD_SEG && c->objs[i]->u.seg.id == g->id)
                        return -EEXIST;
        struct dd_obj *old[16];
        for (uint32_t k = 0; k < g->nreplace && k < 16; k++) {
                old[k] = NULL;
                for (uint32_t i = 1; i < c->nobjs; i++)
                        if (c->objs[i] && c->objs[i]->kind == DD_SEG &&
                            c->objs[i]->u.seg.id == g->replace[k])
                                old[k] = c->objs[i];
                if (!old[k] || old[k]->u.seg.base < g->base ||
                    old[k]->u.seg.base + old[k]->u.seg.len > g->base + g->len)
                        return -EINVAL;
                /* Each is freed below once its regions moved: named twice,
                 * it would be freed twice (dw_ipc_req_check refuses it too). */
                for (uint32_t j = 0; j < k; j++)
                        if (old[j] == old[k]) {
                                if (dd_client_log_ok(c))
                                        diwarpdv_warn(
                                            "diwarpd: client pid %d: SEG_ADD of segment %u "
                                            "refused: segment %u named twice in its replace "
                                            "list",
                                            c->pid, g->id, g->replace[k]);
                                return -EINVAL;
                        }
        }
        void *map = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
                return -errno;
        struct dd_obj *s = obj_new(c, DD_SEG);
        if (!s) {
                munmap(map, g->len);
                return -ENOMEM;
        }
        s->u.seg.base = g->base;
        s->u.seg.len = g->len;
        s->u.seg.id = g->id;
        s->u.seg.map = map;
        /* The regions on the segments it covers move to it: same STag, same
         * TOs, new pages (the client copied the bytes before the remap). */
        for (uint32_t k = 0; k < g->nreplace; k++) {
                for (uint32_t i = 1; i < c->nobjs; i++) {
                        struct dd_obj *m = c->objs[i];
                        if (!m || m->kind != DD_MR || m->u.mr.seg != old[k])
                                continue;
                        uint8_t *at = s->u.seg.map + (m->u.mr.addr - g->base);
                        int err = diwarp_mr_rereg(m->u.mr.mr, DIWARP_REREG_TRANSLATION, NULL, at,
                                                  m->u.mr.len, m->u.mr.iova, m->u.mr.access);
                        if (err < 0)
                                diwarpdv_warn("diwarpd: client pid %d: MR handle %u could not move "
                                              "to its new segment: %s",
                                              c->pid, m->h, strerror(-err));
                        m->u.mr.seg = s;
                        s->refs++;
                        old[k]->refs--;
                }
                munmap(old[k]->u.seg.map, old[k]->u.seg.len);
                obj_del(old[k]);
        }
        return 0;
}

static void seg_put(struct dd_obj *s)
{
        if (--s->refs > 0)
                return;
        munmap(s->u.seg.map, s->u.seg.len);
        obj_del(s);
}

static int do_mr_reg(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp)
{
        const struct dw_ipc_mr_reg *m = &r->u.mr;
        struct dd_obj *pd = obj_get(c, m->pd, DD_PD);
        struct dd_obj *seg = NULL;
        if (!pd)
                return -EINVAL;
        uint8_t *at = NULL;
        if (m->len) {
                for (uint32_t i = 1; i < c->nobjs && !seg; i++)
                        if (c->objs[i] && c->objs[i]->kind == DD_SEG &&
                            c->objs[i]->u.seg.id == m->seg)
                                seg = c->objs[i];
                /* Only bytes the client shared: nothing else of this process
                 * or of another client is reachable through an STag. */
                if (!seg || m->addr < seg->u.seg.base ||
                    m->addr + m->len > seg->u.seg.base + seg->u.seg.len) {
                        diwarpdv_warn("diwarpd: client pid %d: MR [0x%" PRIx64 ", +%" PRIu64
                                      ") refused: outside the memory it shared",
                                      c->pid, m->addr, m->len);
                        return -EFAULT;
                }
                at = seg->u.seg.map + (m->addr - seg->u.seg.base);
        }
        struct dd_obj *o = obj_new(c, DD_MR);
        if (!o)
                return -ENOMEM;
        int err = diwarp_mr_reg(pd->u.pd, at, m->len, m->iova, m->access, &o->u.mr.mr);
        if (err < 0) {
                obj_del(o);
                if (seg && seg->refs == 0)
                        seg_put(seg);
                return err;
        }
        struct diwarp_mr_info info;
        diwarp_mr_info(o->u.mr.mr, &info);
        o->u.mr.seg = seg;
        o->u.mr.pd = pd;
        o->u.mr.addr = m->addr;
        o->u.mr.len = m->len;
        o->u.mr.iova = m->iova;
        o->u.mr.access = m->access;
        if (seg)
                seg->refs++;
        pd->refs++;
        rsp->handle = o->h;
        rsp->key = info.lkey;
        return 0;
}

static int mr_dereg(struct dd_obj *o)
{
        int err = diwarp_mr_dereg(o->u.mr.mr);
        if (err < 0)
                return err;
        if (o->u.mr.seg)
                seg_put(o->u.mr.seg);
        o->u.mr.pd->refs--;
        obj_del(o);
        return 0;
}

static int do_channel_create(struct dd_client *c, struct dw_ipc_rsp *rsp, int *fds, int *nfds)
{
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
                return -errno;
        struct dd_obj *o = obj_new(c, DD_CHAN);
        if (!o) {
                close(sp[0]);
                close(sp[1]);
                return -ENOMEM;
        }
        fcntl(sp[0], F_SETFL, O_NONBLOCK);
        o->u.chan.fd = sp[0];
        rsp->handle = o->h;
        fds[0] = sp[1];
        *nfds = 1;
        return 0;
}

static int do_cq_create(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp,
                        int *fds, int *nfds)
{
        struct dd_obj *chan = NULL;
        if (r->u.cq.channel && !(chan = obj_get(c, r->u.cq.channel, DD_CHAN)))
                return -EINVAL;
        struct dd_obj *o = obj_new(c, DD_CQ);
        if (!o)
                return -ENOMEM;
        int err = diwarp_cq_create(c->dd->dev, r->u.cq.cqe, o, NULL, &o->u.cq.cq);
        if (err < 0) {
                obj_del(o);
                return err;
        }
        int cqe = diwarp_cq_cqe(o->u.cq.cq);
        o->u.cq.entries = dw_ipc_pow2((uint32_t)cqe);
        o->u.cq.esize = 64 * (uint32_t)((sizeof(struct diwarp_wc) + 63) / 64);
        o->u.cq.map_len = dw_ipc_ring_bytes(o->u.cq.entries, o->u.cq.esize);
        err = shm_region(o->u.cq.map_len, &o->u.cq.map, &fds[0]);
        if (err < 0) {
                diwarp_cq_destroy(o->u.cq.cq);
                obj_del(o);
                return err;
        }
        *nfds = 1;
        o->u.cq.ring = o->u.cq.map;
        o->u.cq.chan = chan;
        if (chan)
                chan->refs++;
        rsp->handle = o->h;
        rsp->u.cq.cqe = cqe;
        rsp->u.cq.map_len = o->u.cq.map_len;
        rsp->u.cq.ring = (struct dw_ipc_ring_geo){0, o->u.cq.entries, o->u.cq.esize};
        dd_client_active_add(c, o);
        return 0;
}

static int cq_destroy(struct dd_obj *o)
{
        if (o->refs)
                return -EBUSY;
        int err = diwarp_cq_destroy(o->u.cq.cq);
        if (err < 0)
                return err;
        dd_client_active_del(o->c, o);
        if (o->u.cq.chan)
                o->u.cq.chan->refs--;
        munmap(o->u.cq.map, o->u.cq.map_len);
        obj_del(o);
        return 0;
}

static int do_qp_create(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp,
                        int *fds, int *nfds)
{
        const struct dw_ipc_qp_create *q = &r->u.qp;
        struct dd_obj *pd = obj_get(c, q->pd, DD_PD);
        struct dd_obj *scq = obj_get(c, q->send_cq, DD_CQ);
        struct dd_obj *rcq = obj_get(c, q->recv_cq, DD_CQ);
        struct dd_obj *srq = q->srq ? obj_get(c, q->srq, DD_SRQ) : NULL;
        if (!pd || !scq || !rcq || (q->srq && !srq))
                return -EINVAL;
        struct dd_obj *o = obj_new(c, DD_QP);
        if (!o)
                return -ENOMEM;
        struct diwarp_qp_init_attr a = {.qp_context = o,
                                        .send_cq = scq->u.cq.cq,
                                        .recv_cq = rcq->u.cq.cq,
                                        .srq = srq ? srq->u.srq.srq : NULL,
                                        .cap = q->cap,
                                        .qp_type = (enum diwarp_qp_type)q->type,
                                        .sq_sig_all = q->sq_sig_all != 0};
        int err = q->type == DIWARP_QPT_RD ? diwarpdv_create_qp(pd->u.pd, &a, &o->u.qp.qp)
                                           : diwarp_qp_create(pd->u.pd, &a, &o->u.qp.qp);
        if (err < 0) {
                obj_del(o);
                return err;
        }
        struct dw_ipc_qp_rsp *x = &rsp->u.qp;
        o->u.qp.cap = a.cap;
        o->u.qp.type = q->type;
        o->u.qp.qpn = diwarp_qp_num(o->u.qp.qp);
        o->u.qp.sq_entries = dw_ipc_pow2(a.cap.max_send_wr ? a.cap.max_send_wr : 1);
        o->u.qp.sq_esize = (uint32_t)dw_ipc_swr_size(&a.cap);
        uint64_t sq_bytes = dw_ipc_ring_bytes(o->u.qp.sq_entries, o->u.qp.sq_esize);
        uint64_t rq_bytes = 0;
        if (!srq) {
                o->u.qp.rq_entries = dw_ipc_pow2(a.cap.max_recv_wr ? a.cap.max_recv_wr : 1);
                o->u.qp.rq_esize = (uint32_t)dw_ipc_rwr_size(a.cap.max_recv_sge);
                rq_bytes = dw_ipc_ring_bytes(o->u.qp.rq_entries, o->u.qp.rq_esize);
        }
        o->u.qp.map_len = sq_bytes + rq_bytes;
        err = shm_region(o->u.qp.map_len, &o->u.qp.map, &fds[0]);
        if (err < 0) {
                diwarp_qp_destroy(o->u.qp.qp);
                obj_del(o);
                return err;
        }
        *nfds = 1;
        o->u.qp.sq = o->u.qp.map;
        o->u.qp.rq = srq ? NULL : (struct dw_ipc_ring *)((uint8_t *)o->u.qp.map + sq_bytes);
        o->u.qp.pd = pd;
        o->u.qp.scq = scq;
        o->u.qp.rcq = rcq;
        o->u.qp.srq = srq;
        pd->refs++;
        scq->refs++;
        rcq->refs++;
        if (srq)
                srq->refs++;
        c->dd->by_qpn[o->u.qp.qpn & (DD_QPN_SLOTS - 1)] = o;
        rsp->handle = o->h;
        x->qpn = o->u.qp.qpn;
        x->cap = a.cap;
        x->map_len = o->u.qp.map_len;
        x->sq = (struct dw_ipc_ring_geo){0, o->u.qp.sq_entries, o->u.qp.sq_esize};
        if (!srq)
                x->rq = (struct dw_ipc_ring_geo){sq_bytes, o->u.qp.rq_entries, o->u.qp.rq_esize};
        dd_client_active_add(c, o);
        return 0;
}

static int qp_destroy(struct dd_obj *o)
{
        int err = diwarp_qp_destroy(o->u.qp.qp);
        if (err < 0)
                return err;
        struct dd_dev *d = o->c->dd;
        if (d->by_qpn[o->u.qp.qpn & (DD_QPN_SLOTS - 1)] == o)
                d->by_qpn[o->u.qp.qpn & (DD_QPN_SLOTS - 1)] = NULL;
        dd_client_active_del(o->c, o);
        o->u.qp.pd->refs--;
        o->u.qp.scq->refs--;
        o->u.qp.rcq->refs--;
        if (o->u.qp.srq)
                o->u.qp.srq->refs--;
        munmap(o->u.qp.map, o->u.qp.map_len);
        obj_del(o);
        return 0;
}

static int do_srq_create(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp,
                         int *fds, int *nfds)
{
        struct dd_obj *pd = obj_get(c, r->u.srq.pd, DD_PD);
        if (!pd)
                return -EINVAL;
        struct dd_obj *o = obj_new(c, DD_SRQ);
        if (!o)
                return -ENOMEM;
        struct diwarp_srq_attr a = r->u.srq.attr;
        int err = diwarp_srq_create(pd->u.pd, &a, o, &o->u.srq.srq);
        if (err < 0) {
                obj_del(o);
                return err;
        }
        o->u.srq.entries = dw_ipc_pow2(a.max_wr);
        o->u.srq.esize = (uint32_t)dw_ipc_rwr_size(a.max_sge);
        o->u.srq.max_sge = a.max_sge;
        o->u.srq.max_wr = a.max_wr;
        o->u.srq.map_len = dw_ipc_ring_bytes(o->u.srq.entries, o->u.srq.esize);
        err = shm_region(o->u.srq.map_len, &o->u.srq.map, &fds[0]);
        if (err < 0) {
                diwarp_srq_destroy(o->u.srq.srq);
                obj_del(o);
                return err;
        }
        *nfds = 1;
        o->u.srq.ring = o->u.srq.map;
        o->u.srq.pd = pd;
        pd->refs++;
        rsp->handle = o->h;
        rsp->u.srq.attr = a;
        rsp->u.srq.map_len = o->u.srq.map_len;
        rsp->u.srq.ring = (struct dw_ipc_ring_geo){0, o->u.srq.entries, o->u.srq.esize};
        dd_client_active_add(c, o);
        return 0;
}

static int srq_destroy(struct dd_obj *o)
{
        if (o->refs)
                return -EBUSY;
        int err = diwarp_srq_destroy(o->u.srq.srq);
        if (err < 0)
                return err;
        dd_client_active_del(o->c, o);
        o->u.srq.pd->refs--;
        munmap(o->u.srq.map, o->u.srq.map_len);
        obj_del(o);
        return 0;
}

static int do_ah_create(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp)
{
        struct dd_obj *pd = obj_get(c, r->u.ah.pd, DD_PD);
        if (!pd)
                return -EINVAL;
        struct dd_obj *o = obj_new(c, DD_AH);
        if (!o)
                return -ENOMEM;
        int err = diwarp_ah_create(pd->u.pd, &r->u.ah.dgid, &o->u.ah.ah);
        if (err < 0) {
                obj_del(o);
                return err;
        }
        o->u.ah.pd = pd;
        pd->refs++;
        rsp->handle = o->h;
        return 0;
}

static int ah_destroy(struct dd_obj *o)
{
        int err = diwarp_ah_destroy(o->u.ah.ah);
        if (err < 0)
                return err;
        o->u.ah.pd->refs--;
        obj_del(o);
        return 0;
}

static int pd_dealloc(struct dd_obj *o)
{
        if (o->refs)
                return -EBUSY;
        int err = diwarp_pd_dealloc(o->u.pd);
        if (err < 0)
                return err;
        obj_del(o);
        return 0;
}

static int chan_destroy(struct dd_obj *o)
{
        if (o->refs)
                return -EBUSY;
        close(o->u.chan.fd);
        obj_del(o);
        return 0;
}

/* ---- connection management ---------------------------------------------------
 * Listening and asking for a request never wait. Connect, accept and reject
 * run the MPA exchange, which waits for the peer (up to the connect
 * timeout): each runs in a thread of its own, so the server goes on serving
 * everyone. Meanwhile the client's socket is out of the server's epoll set
 * (its next request waits for this answer anyway): neither a queued request
 * nor a hang-up of it runs until the thread ended, so nothing it uses is
 * freed under it. */

static int do_listen(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp,
                     int *fds, int *nfds)
{
        struct dd_obj *o = obj_new(c, DD_LISTENER);
        if (!o)
                return -ENOMEM;
        int err = diwarp_listen(c->dd->dev, r->u.listen.port, r->u.listen.backlog, &o->u.lis);
        if (err < 0) {
                obj_del(o);
                return err;
        }
        int fd = fcntl(diwarp_listener_fd(o->u.lis), F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
                err = -errno;
                diwarp_listener_destroy(o->u.lis);
                obj_del(o);
                return err;
        }
        fds[0] = fd;
        *nfds = 1;
        rsp->handle = o->h;
        return 0;
}

static int listener_destroy(struct dd_obj *o)
{
        int err = diwarp_listener_destroy(o->u.lis);
        if (err < 0)
                return err;
        obj_del(o);
        return 0;
}

struct slow {
        struct dd_client *c;
        struct dw_ipc_req req;
        struct diwarp_listener *l;
        struct dd_obj *qp;
};

static void conn_param(const struct dw_ipc_conn *x, struct diwarp_conn_param *p)
{
        *p = (struct diwarp_conn_param){.private_data = x->pd,
                                        .private_data_len = x->pd_len,
                                        .ird = x->ird,
                                        .ord = x->ord,
                                        .sgid = x->has_sgid ? &x->sgid : NULL};
}

static void *slow_main(void *arg)
{
        struct slow *w = arg;
        struct dd_client *c = w->c;
        const struct dw_ipc_conn *x = &w->req.u.conn;
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        struct diwarp_conn_param p;
        conn_param(x, &p);
        int err = -ENOMEM;
        if (rsp) {
                switch (w->req.h.op) {
                case DW_IPC_ACCEPT:
                        err = diwarp_accept(w->l, x->request_id, w->qp->u.qp.qp, &p);
                        break;
                case DW_IPC_REJECT:
                        err = diwarp_reject(w->l, x->request_id, x->pd, x->pd_len);
                        break;
                default: {
                        uint16_t n = sizeof(rsp->u.reply_pd.data);
                        err = diwarp_connect(w->qp->u.qp.qp, &x->dgid, x->port, &p, x->timeout_ms,
                                             rsp->u.reply_pd.data, &n);
                        rsp->u.reply_pd.len = n;
                        break;
                }
                }
                if (w->qp)
                        atomic_store_explicit(&w->qp->u.qp.sq->qp_state,
                                              diwarp_qp_state(w->qp->u.qp.qp),
                                              memory_order_release);
                if (err < 0)
                        diwarpdv_info("diwarpd: client pid %d: %s: %s", c->pid,
                                      dw_ipc_op_name(w->req.h.op), strerror(-err));
                rsp->h.magic = DW_IPC_MAGIC;
                rsp->h.op = (uint16_t)(w->req.h.op | DW_IPC_RSP);
                rsp->h.len = sizeof(*rsp);
                rsp->h.seq = w->req.h.seq;
                rsp->status = err;
                dw_ipc_send(c->sock, rsp, sizeof(*rsp), NULL, 0, false);
                free(rsp);
        }
        struct dd_server *s = c->srv;
        free(w);
        atomic_fetch_sub(&c->busy, 1);
        dd_server_resume(s);
        return NULL;
}

/* 1: the request went to its thread (it answers); else a negative errno. */
static int slow_start(struct dd_client *c, const struct dw_ipc_req *r)
{
        struct dd_obj *l = NULL, *qp = NULL;
        if (r->h.op != DW_IPC_CONNECT && !(l = obj_get(c, r->u.conn.listener, DD_LISTENER)))
                return -EINVAL;
        if (r->h.op != DW_IPC_REJECT && !(qp = obj_get(c, r->u.conn.qp, DD_QP)))
                return -EINVAL;
        struct slow *w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->c = c;
        w->req = *r;
        w->l = l ? l->u.lis : NULL;
        w->qp = qp;
        atomic_fetch_add(&c->busy, 1);
        dd_client_pause(c, true);
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        int e = pthread_create(&t, &a, slow_main, w);
        pthread_attr_destroy(&a);
        if (e) {
                atomic_fetch_sub(&c->busy, 1);
                dd_client_pause(c, false);
                free(w);
                return -e;
        }
        return 1;
}

static void stat_fill(struct dw_ipc_stat_rsp *st)
{
        struct dd_daemon *D = dd_daemon();
        pthread_mutex_lock(&D->lock);
        st->daemon_pid = getpid();
        st->nservers = (uint32_t)D->nservers;
        st->requests = atomic_load(&D->requests);
        st->rejected = atomic_load(&D->rejected);
        st->dev = D->gone; /* the devices closed so far; the open ones are added below */
        for (int i = 0; i < D->nservers; i++) {
                struct dd_server *s = &D->servers[i];
                st->wakeups += atomic_load(&s->wakeups);
                for (struct dd_client *c = s->clients; c; c = c->next) {
                        if (!c->opened)
                                continue;
                        if (st->nclients < DW_IPC_STAT_MAX) {
                                struct dw_ipc_stat_client *x = &st->c[st->nclients];
                                x->pid = c->pid;
                                x->server = (uint32_t)s->id;
                                for (uint32_t h = 1; h < c->nobjs; h++) {
                                        struct dd_obj *o = c->objs[h];
                                        if (!o)
                                                continue;
                                        x->nqp += o->kind == DD_QP;
                                        x->ncq += o->kind == DD_CQ;
                                        x->nmr += o->kind == DD_MR;
                                        x->npd += o->kind == DD_PD;
                                        if (o->kind == DD_MR)
                                                x->mr_bytes += o->u.mr.len;
                                }
                                x->posted_send = c->posted_send;
                                x->posted_recv = c->posted_recv;
                                x->completions = c->completions;
                        }
                        st->nclients++;
                }
                for (struct dd_dev *d = s->devs; d; d = d->next) {
                        struct diwarp_counters k;
                        if (diwarp_device_counters(d->dev, &k) == 0) {
                                uint64_t *a = (uint64_t *)&st->dev;
                                const uint64_t *b = (const uint64_t *)&k;
                                for (size_t j = 0; j < sizeof(k) / sizeof(uint64_t); j++)
                                        a[j] += b[j];
                        }
                }
        }
        pthread_mutex_unlock(&D->lock);
}

static void stat_qps(uint32_t first, struct dw_ipc_stat_qps_rsp *out)
{
        struct dd_daemon *D = dd_daemon();
        pthread_mutex_lock(&D->lock);
        for (int i = 0; i < D->nservers; i++)
                for (struct dd_client *c = D->servers[i].clients; c; c = c->next)
                        for (uint32_t k = 0; k < c->nactive; k++) {
                                struct dd_obj *o = c->active[k];
                                if (o->kind != DD_QP)
                                        continue;
                                uint32_t at = out->total++;
                                if (at < first || out->n == DW_IPC_STAT_QPS_MAX)
                                        continue;
                                struct diwarpdv_qp_stat *q = &out->q[out->n++];
                                /* Fails only on a NULL argument. */
                                (void)diwarpdv_qp_stat(o->u.qp.qp, q);
                                q->pid = c->pid; /* the client's, not the daemon's */
                        }
        pthread_mutex_unlock(&D->lock);
}

/* STAT, STAT_QPS and SHUTDOWN: the daemon's owner only. */
static int run_owner_op(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp)
{
        if (!c->owner) {
                /* Every client's pids and counters, and the daemon's life:
                 * its own user's business, not a group member's. */
                if (dd_client_log_ok(c))
                        diwarpdv_warn(
                            "diwarpd: client pid %d (uid %u): %s refused: only the daemon's "
                            "owner (uid %u) may ask",
                            c->pid, c->uid, dw_ipc_op_name(r->h.op), dd_daemon()->uid);
                return -EPERM;
        }
        if (r->h.op == DW_IPC_STAT) {
                stat_fill(&rsp->u.stat);
                return 0;
        }
        if (r->h.op == DW_IPC_STAT_QPS) {
                stat_qps(r->h.handle, &rsp->u.qps);
                return 0;
        }
        diwarpdv_warn("diwarpd: stop asked by client pid %d (uid %u)", c->pid, c->uid);
        atomic_store(&dd_daemon()->stop, true);
        return 0;
}

static int do_qp_modify(struct dd_client *c, const struct dw_ipc_req *r)
{
        struct dd_obj *o = obj_get(c, r->h.handle, DD_QP);
        if (!o)
                return -EINVAL;
        int err = diwarp_qp_modify(o->u.qp.qp, &r->u.qpm.attr, r->u.qpm.mask);
        atomic_store_explicit(&o->u.qp.sq->qp_state, diwarp_qp_state(o->u.qp.qp),
                              memory_order_release);
        return err;
}

static int do_qp_query(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp)
{
        struct dd_obj *o = obj_get(c, r->h.handle, DD_QP);
        if (!o)
                return -EINVAL;
        struct diwarp_qp_init_attr ia;
        int err = diwarp_qp_query(o->u.qp.qp, &rsp->u.qpq.attr, &ia);
        rsp->u.qpq.cap = ia.cap;
        rsp->u.qpq.state = diwarp_qp_state(o->u.qp.qp);
        rsp->u.qpq.data_in_order = diwarp_qp_data_in_order(o->u.qp.qp);
        return err;
}

static int do_rd_path(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp)
{
        struct dd_obj *o = obj_get(c, r->h.handle, DD_QP);
        if (!o)
                return -EINVAL;
        struct dd_obj *ah = r->u.path.ah ? obj_get(c, r->u.path.ah, DD_AH) : NULL;
        if (r->u.path.ah && !ah)
                return -EINVAL;
        struct diwarpdv_rd_dest dest = {.ah = ah ? ah->u.ah.ah : NULL,
                                        .remote_qpn = r->u.path.remote_qpn,
                                        .remote_qkey = r->u.path.remote_qkey};
        return diwarpdv_query_rd_path(o->u.qp.qp, ah ? &dest : NULL, &rsp->u.path);
}

static int run(struct dd_client *c, const struct dw_ipc_req *r, struct dw_ipc_rsp *rsp, int *in,
               int *out, int *nout)
{
        uint32_t h = r->h.handle;
        struct dd_obj *o;
        if (r->h.op == DW_IPC_STAT || r->h.op == DW_IPC_STAT_QPS || r->h.op == DW_IPC_SHUTDOWN)
                return run_owner_op(c, r, rsp);
        if (r->h.op == DW_IPC_OPEN)
                return do_open(c, r, rsp, out, nout);
        if (!c->opened)
                return -EPROTO;
        switch (r->h.op) {
        case DW_IPC_PD_ALLOC:
                if (!(o = obj_new(c, DD_PD)))
                        return -ENOMEM;
                if (diwarp_pd_alloc(c->dd->dev, &o->u.pd) < 0) {
                        obj_del(o);
                        return -ENOMEM;
                }
                rsp->handle = o->h;
                return 0;
        case DW_IPC_PD_DEALLOC:
                return (o = obj_get(c, h, DD_PD)) ? pd_dealloc(o) : -EINVAL;
        case DW_IPC_SEG_ADD: {
                int err = do_seg_add(c, r, in[0]);
                close(in[0]);
                in[0] = -1;
                return err;
        }
        case DW_IPC_MR_REG:
                return do_mr_reg(c, r, rsp);
        case DW_IPC_MR_DEREG:
                return (o = obj_get(c, h, DD_MR)) ? mr_dereg(o) : -EINVAL;
        case DW_IPC_CHANNEL_CREATE:
                return do_channel_create(c, rsp, out, nout);
        case DW_IPC_CHANNEL_DESTROY:
                return (o = obj_get(c, h, DD_CHAN)) ? chan_destroy(o) : -EINVAL;
        case DW_IPC_CQ_CREATE:
                return do_cq_create(c, r, rsp, out, nout);
        case DW_IPC_CQ_DESTROY:
                return (o = obj_get(c, h, DD_CQ)) ? cq_destroy(o) : -EINVAL;
        case DW_IPC_QP_CREATE:
                return do_qp_create(c, r, rsp, out, nout);
        case DW_IPC_QP_DESTROY:
                return (o = obj_get(c, h, DD_QP)) ? qp_destroy(o) : -EINVAL;
        case DW_IPC_QP_MODIFY:
                return do_qp_modify(c, r);
        case DW_IPC_QP_QUERY:
                return do_qp_query(c, r, rsp);
        case DW_IPC_SRQ_CREATE:
                return do_srq_create(c, r, rsp, out, nout);
        case DW_IPC_SRQ_DESTROY:
                return (o = obj_get(c, h, DD_SRQ)) ? srq_destroy(o) : -EINVAL;
        case DW_IPC_SRQ_MODIFY:
                if (!(o = obj_get(c, h, DD_SRQ)))
                        return -EINVAL;
                return diwarp_srq_modify(o->u.srq.srq, &r->u.srqm.attr, r->u.srqm.mask);
        case DW_IPC_SRQ_QUERY:
                if (!(o = obj_get(c, h, DD_SRQ)))
                        return -EINVAL;
                return diwarp_srq_query(o->u.srq.srq, &rsp->u.srq_attr);
        case DW_IPC_AH_CREATE:
                return do_ah_create(c, r, rsp);
        case DW_IPC_AH_DESTROY:
                return (o = obj_get(c, h, DD_AH)) ? ah_destroy(o) : -EINVAL;
        case DW_IPC_COUNTERS:
                if (h == 0)
                        return diwarp_device_counters(c->dd->dev, &rsp->u.ctr);
                if (!(o = obj_get(c, h, DD_QP)))
                        return -EINVAL;
                return diwarp_qp_counters(o->u.qp.qp, &rsp->u.ctr);
        case DW_IPC_LISTEN:
                return do_listen(c, r, rsp, out, nout);
        case DW_IPC_LISTENER_DESTROY:
                return (o = obj_get(c, h, DD_LISTENER)) ? listener_destroy(o) : -EINVAL;
        case DW_IPC_GET_REQUEST:
                if (!(o = obj_get(c, h, DD_LISTENER)))
                        return -EINVAL;
                return diwarp_listener_get_request(o->u.lis, 0, &rsp->u.creq);
        case DW_IPC_ACCEPT:
        case DW_IPC_REJECT:
        case DW_IPC_CONNECT:
                return slow_start(c, r);
        case DW_IPC_DISCONNECT:
                if (!(o = obj_get(c, h, DD_QP)))
                        return -EINVAL;
                return diwarp_disconnect(o->u.qp.qp);
        case DW_IPC_RD_PATH:
                return do_rd_path(c, r, rsp);
        default:
                return -EPROTO;
        }
}

int dd_request(struct dd_client *c, void *msg, size_t len, int *fds, int nfds)
{
        struct dd_daemon *D = dd_daemon();
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        const struct dw_ipc_req *r = msg;
        const char *why = NULL;
        int out[DW_IPC_MAX_FDS], nout = 0;
        if (!rsp)
                return -1;
        atomic_fetch_add(&D->requests, 1);
        int err = dw_ipc_req_check(msg, len, nfds, &why);
        if (err < 0) {
                atomic_fetch_add(&D->rejected, 1);
                if (dd_client_log_ok(c))
                        diwarpdv_warn("diwarpd: client pid %d: %s request rejected: %s", c->pid,
                                      dw_ipc_op_name(len >= sizeof(r->h) ? r->h.op : 0), why);
        } else {
                err = run(c, r, rsp, fds, out, &nout);
                if (err == 1) {
                        /* Its thread answers. */
                        for (int i = 0; i < nfds; i++)
                                if (fds[i] >= 0)
                                        close(fds[i]);
                        free(rsp);
                        return 0;
                }
                if (err < 0 && err != -EBUSY && err != -EAGAIN)
                        diwarpdv_info("diwarpd: client pid %d: %s (handle %u): %s", c->pid,
                                      dw_ipc_op_name(r->h.op), r->h.handle, strerror(-err));
        }
        for (int i = 0; i < nfds; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        rsp->h.magic = DW_IPC_MAGIC;
        rsp->h.op = (uint16_t)((len >= sizeof(r->h) ? r->h.op : 0) | DW_IPC_RSP);
        rsp->h.len = sizeof(*rsp);
        rsp->h.seq = len >= sizeof(r->h) ? r->h.seq : 0;
        rsp->status = err;
        ssize_t n = dw_ipc_send(c->sock, rsp, sizeof(*rsp), out, err < 0 ? 0 : nout, true);
        /* Descriptors we made for the client (not the server's own). */
        for (int i = 0; i < nout; i++)
                if (out[i] != c->srv->doorbell && out[i] != c->srv->page_fd)
                        close(out[i]);
        free(rsp);
        if (n < 0 && n != -EAGAIN)
                return -1;
        return 0;
}

void dd_client_free(struct dd_client *c)
{
        static const enum dd_kind order[] = {DD_LISTENER, DD_QP,   DD_SRQ, DD_AH,
                                             DD_CQ,       DD_CHAN, DD_MR,  DD_PD};
        for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++)
                for (uint32_t h = 1; h < c->nobjs; h++) {
                        struct dd_obj *o = c->objs[h];
                        if (!o || o->kind != order[k])
                                continue;
                        int err = 0;
                        switch (o->kind) {
                        case DD_LISTENER:
                                err = listener_destroy(o);
                                break;
                        case DD_QP:
                                err = qp_destroy(o);
                                break;
                        case DD_SRQ:
                                err = srq_destroy(o);
                                break;
                        case DD_AH:
                                err = ah_destroy(o);
                                break;
                        case DD_CQ:
                                err = cq_destroy(o);
                                break;
                        case DD_CHAN:
                                err = chan_destroy(o);
                                break;
                        case DD_MR:
                                err = mr_dereg(o);
                                break;
                        case DD_PD:
                                err = pd_dealloc(o);
                                break;
                        default:
                                break;
                        }
                        if (err < 0)
                                diwarpdv_warn("diwarpd: client pid %d: freeing handle %u: %s",
                                              c->pid, h, strerror(-err));
                }
        for (uint32_t h = 1; h < c->nobjs; h++)
                if (c->objs[h] && c->objs[h]->kind == DD_SEG) {
                        munmap(c->objs[h]->u.seg.map, c->objs[h]->u.seg.len);
                        obj_del(c->objs[h]);
                }
        /* The device goes with its last client: its sockets, ports and
         * memory are not kept for a client that may never come back. */
        if (c->dd && --c->dd->users == 0)
                dd_server_dev_close(c->srv, c->dd);
        free(c->objs);
        free(c->active);
        if (c->ev_sock >= 0)
                close(c->ev_sock);
        close(c->sock);
        free(c);
}
