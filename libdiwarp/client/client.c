/* Client mode of the native API: see client.h and client/README.md. */
#define _GNU_SOURCE
#include "client/client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define DW_NO_VALGRIND_REPORTS_BEGIN VALGRIND_DISABLE_ERROR_REPORTING
#define DW_NO_VALGRIND_REPORTS_END   VALGRIND_ENABLE_ERROR_REPORTING
#endif
#endif
#ifndef DW_NO_VALGRIND_REPORTS_BEGIN
#define DW_NO_VALGRIND_REPORTS_BEGIN
#define DW_NO_VALGRIND_REPORTS_END
#endif

#include "api/backend.h"
#include "ipc/ipc.h"
#include "queue/wq.h"
#include "util/log.h"

#define RPC_TIMEOUT_MS   10000
#define CM_TIMEOUT_MS    30000 /* beyond the daemon's own connect timeout */
#define EMPTY_POLL_CHECK 4096  /* empty CQ polls between two looks at the daemon's socket */
#define QPN_SLOTS        4096  /* the low 12 bits of a QPN */
/* Empty polls of a CQ after which each further one yields the core: the
 * daemon's server may need it (more busy threads than cores). */
#define YIELD_AFTER 32
/* ... and after which each further one naps on the ring (dw_ipc_cq_nap)
 * until the daemon publishes a completion, NAP_NS at most: a poller that
 * spins, even yielding, stays runnable and takes its share of a core the
 * daemon needs beside CPU hogs. 256 yielding polls alone on a core take
 * 50-130 us, longer than a ping-pong's round trip through the daemon, so an
 * exchange in progress keeps spinning; a bulk transfer waiting for its
 * window naps. */
#define NAP_AFTER 256
#define NAP_NS    100000L

/* What client mode does not offer yet: a warning naming it, -EOPNOTSUPP. */
static int unsupported(const char *what)
{
        dw_warn("%s: not available through the daemon (DIWARP_PROGRESS=daemon)", what);
        return -EOPNOTSUPP;
}

/* ---- objects --------------------------------------------------------------- */

struct dwc_seg {
        uint64_t base, len;
        uint32_t id;
        int refs;
        struct dwc_seg *next;
};

struct dwc_cq;
struct dwc_qp;

struct dwc_dev {
        int sock, ev_sock, doorbell;
        struct dw_ipc_server_page *page;
        pthread_mutex_t lock; /* one request at a time; the object lists */
        uint32_t seq;
        _Atomic bool dead;
        bool fatal_told;
        struct dw_ipc_open_rsp info;
        void **objs; /* by daemon handle: for events */
        uint32_t nobjs;
        struct dwc_seg *segs;
        uint32_t next_seg_id;
        struct dwc_qp *by_qpn[QPN_SLOTS];
        _Atomic uint32_t progress_calls;
};

struct dwc_pd {
        struct dwc_dev *dev;
        uint32_t h;
};

struct dwc_mr {
        struct dwc_dev *dev;
        uint32_t h, key;
        struct diwarp_mr_info info;
};

/* An object of the daemon's that comes with a descriptor: a completion
 * channel (its socket), a listener (the daemon's TCP listener, duplicated:
 * readable when a peer connects). */
struct dwc_fdobj {
        struct dwc_dev *dev;
        uint32_t h;
        int fd;
};

/* WRs posted and not yet retired, in order (for the flush of a lost daemon). */
struct dwc_track {
        uint64_t *wr_id;
        uint8_t *op; /* enum diwarp_wc_opcode of a send; 1 = done for a receive */
        uint32_t mask;
        uint32_t posted, retired;
};

struct dwc_cq {
        struct dwc_dev *dev;
        uint32_t h;
        pthread_mutex_t lock;
        struct dw_ipc_ring *ring;
        void *map;
        size_t map_len;
        uint32_t entries, esize, cons;
        int cqe;
        void *context;
        struct dwc_fdobj *channel;
        struct diwarp_wc *flushed; /* completions made here after the daemon went away */
        uint32_t nflushed, flushed_cap, flushed_head;
        uint32_t empty; /* polls in a row that found nothing */
};

struct dwc_srq {
        struct dwc_dev *dev;
        uint32_t h;
        pthread_mutex_t lock;
        struct dw_ipc_ring *ring;
        void *map;
        size_t map_len;
        uint32_t entries, esize, prod;
        struct diwarp_srq_attr attr;
        void *context;
        _Atomic uint32_t done; /* receives completed: prod - done are outstanding */
};

struct dwc_qp {
        struct dwc_dev *dev;
        uint32_t h, qpn;
        enum diwarp_qp_type type;
        struct diwarp_qp_cap cap;
        struct dwc_cq *send_cq, *recv_cq;
        struct dwc_srq *srq;
        struct dwc_pd *pd;
        void *context;
        bool sq_sig_all;
        pthread_mutex_t sq_lock, rq_lock;
        void *map;
        size_t map_len;
        struct dw_ipc_ring *sq, *rq;
        uint32_t sq_entries, sq_esize, rq_entries, rq_esize;
        struct dwc_track st, rt;
        enum diwarp_qp_state state; /* as last set or queried here */
};

struct dwc_ah {
        struct dwc_dev *dev;
        uint32_t h;
};

/* ---- the connection -------------------------------------------------------- */

/* d->lock held (the lists of QPs); dev_fatal_lock takes it. */
static void dev_fatal(struct dwc_dev *d);
static void dev_fatal_lock(struct dwc_dev *d);

/* One request and its response, under d->lock, waiting up to tmo_ms for
 * the answer. fds_in: descriptors sent; fds_out: room for those received
 * (*nout in/out). */
static int rpc_wait(struct dwc_dev *d, struct dw_ipc_req *req, const int *fds_in, int nin,
                    struct dw_ipc_rsp *rsp, int *fds_out, int *nout, int tmo_ms)
{
        if (atomic_load(&d->dead))
                return -EIO;
        size_t len = dw_ipc_req_size(req->h.op);
        req->h.magic = DW_IPC_MAGIC;
        req->h.len = (uint16_t)len;
        req->h.seq = ++d->seq;
        ssize_t n = dw_ipc_send(d->sock, req, len, fds_in, nin, false);
        if (n < 0)
                goto gone;
        int room0 = nout ? *nout : 0;
        for (;;) {
                struct pollfd p = {.fd = d->sock, .events = POLLIN};
                int r = poll(&p, 1, tmo_ms);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r == 0) {
                        dw_err("daemon: no answer to request %u within %d ms", req->h.op, tmo_ms);
                        return -ETIMEDOUT;
                }
                int room = room0;
                int tmp[DW_IPC_MAX_FDS];
                int *fds = fds_out ? fds_out : tmp;
                n = dw_ipc_recv(d->sock, rsp, sizeof(*rsp), fds, &room);
                if (n <= 0)
                        goto gone;
                if ((size_t)n < offsetof(struct dw_ipc_rsp, u) || rsp->h.seq != req->h.seq) {
                        /* A stale answer (to a timed-out request): its
                         * descriptors are not ours to keep. */
                        for (int i = 0; i < room; i++)
                                close(fds[i]);
                        continue;
                }
                if (nout)
                        *nout = room;
                else
                        for (int i = 0; i < room; i++)
                                close(tmp[i]);
                return rsp->status;
        }
gone:
        dev_fatal(d);
        return -EIO;
}

static int rpc_locked(struct dwc_dev *d, struct dw_ipc_req *req, const int *fds_in, int nin,
                      struct dw_ipc_rsp *rsp, int *fds_out, int *nout)
{
        return rpc_wait(d, req, fds_in, nin, rsp, fds_out, nout, RPC_TIMEOUT_MS);
}

static int rpc(struct dwc_dev *d, struct dw_ipc_req *req, struct dw_ipc_rsp *rsp)
{
        pthread_mutex_lock(&d->lock);
        int err = rpc_locked(d, req, NULL, 0, rsp, NULL, NULL);
        pthread_mutex_unlock(&d->lock);
        return err;
}

/* A request answered with one descriptor (a ring's memfd, a socket): -EPROTO
 * when the answer carries another count; nothing is left open on failure. */
static int rpc_fd_locked(struct dwc_dev *d, struct dw_ipc_req *req, struct dw_ipc_rsp *rsp, int *fd)
{
        int fds[DW_IPC_MAX_FDS], n = DW_IPC_MAX_FDS;
        int err = rpc_locked(d, req, NULL, 0, rsp, fds, &n);
        if (err == 0 && n != 1)
                err = -EPROTO;
        if (err < 0) {
                for (int i = 0; i < n; i++)
                        close(fds[i]);
                return err;
        }
        *fd = fds[0];
        return 0;
}

static void objs_set(struct dwc_dev *d, uint32_t h, void *obj);

/* Destroys handle h of the daemon's table and forgets it here (events
 * naming it are dropped). A lost daemon (-EIO) freed it already: the caller
 * frees its side too. */
static int rpc_destroy_locked(struct dwc_dev *d, unsigned int op, uint32_t h)
{
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        memset(&req, 0, sizeof(req));
        req.h.op = (uint16_t)op;
        req.h.handle = h;
        int err = rpc_locked(d, &req, NULL, 0, &rsp, NULL, NULL);
        if (err < 0 && err != -EIO)
                return err;
        objs_set(d, h, NULL);
        return 0;
}

/* The same, taking d->lock: on success it is left held, for the caller to
 * unlink its object from its lists before it lets go. */
static int destroy_begin(struct dwc_dev *d, unsigned int op, uint32_t h)
{
        pthread_mutex_lock(&d->lock);
        int err = rpc_destroy_locked(d, op, h);
        if (err < 0)
                pthread_mutex_unlock(&d->lock);
        return err;
}

static int rpc_destroy(struct dwc_dev *d, unsigned int op, uint32_t h)
{
        int err = destroy_begin(d, op, h);
        if (err == 0)
                pthread_mutex_unlock(&d->lock);
        return err;
}

static void req_init(struct dw_ipc_req *r, unsigned int op, uint32_t handle)
{
        memset(r, 0, sizeof(*r));
        r->h.op = (uint16_t)op;
        r->h.handle = handle;
}

/* The uid our daemon must run as: DIWARP_DAEMON_UID, else our own. */
static int daemon_uid(uint32_t *uid)
{
        const char *v = getenv("DIWARP_DAEMON_UID");
        if (!v || !*v) {
                *uid = (uint32_t)geteuid();
                return 0;
        }
        char *end;
        errno = 0;
        unsigned long n = strtoul(v, &end, 10);
        if (*end || errno || n >= UINT32_MAX || v[0] == '-') {
                dw_err("daemon: DIWARP_DAEMON_UID=%s: expected a numeric uid", v);
                return -EINVAL;
        }
        *uid = (uint32_t)n;
        return 0;
}

static int connect_daemon(void)
{
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        int err = dw_ipc_socket_path(un.sun_path, sizeof(un.sun_path));
        if (err < 0)
                return err;
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -errno;
        if (connect(s, (struct sockaddr *)&un, sizeof(un)) < 0) {
                err = -errno;
                dw_err("daemon: cannot reach diwarpd at %s: %s (start it with `diwarp daemon "
                       "start`)",
                       un.sun_path, strerror(-err));
                close(s);
                return err;
        }
        /* Whatever listens there gets this process's registered memory:
         * only a daemon of our own uid (or the one DIWARP_DAEMON_UID names). */
        uint32_t want;
        err = daemon_uid(&want);
        struct ucred cr;
        socklen_t crlen = sizeof(cr);
        if (err == 0 && getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0)
                err = -errno;
        if (err < 0) {
                dw_err("daemon: %s: cannot tell who listens there: %s", un.sun_path,
                       strerror(-err));
                close(s);
                return err;
        }
        if ((uint32_t)cr.uid != want) {
                dw_err("daemon: %s is served by uid %u, not by uid %u (%s): refusing to hand it "
                       "this process's memory; set DIWARP_DAEMON_UID=%u to trust that daemon",
                       un.sun_path, (unsigned)cr.uid, want,
                       getenv("DIWARP_DAEMON_UID") ? "DIWARP_DAEMON_UID" : "this process's",
                       (unsigned)cr.uid);
                close(s);
                return -EACCES;
        }
        return s;
}

static void objs_set(struct dwc_dev *d, uint32_t h, void *obj)
{
        if (h >= d->nobjs) {
                uint32_t n = d->nobjs ? d->nobjs : 64;
                while (n <= h)
                        n *= 2;
                void **o = realloc(d->objs, n * sizeof(*o));
                if (!o)
                        return; /* events for it are dropped with a warning */
                memset(o + d->nobjs, 0, (n - d->nobjs) * sizeof(*o));
                d->objs = o;
                d->nobjs = n;
        }
        d->objs[h] = obj;
}

static void *objs_get(struct dwc_dev *d, uint32_t h)
{
        return h < d->nobjs ? d->objs[h] : NULL;
}

static void wake_daemon(struct dwc_dev *d)
{
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&d->page->sleeping, memory_order_relaxed)) {
                uint64_t one = 1;
                ssize_t n = write(d->doorbell, &one, sizeof(one));
                (void)n;
        }
}

int dwc_device_open(const struct diwarp_open_opts *opts, struct diwarp_device **out)
{
        int lvl = dw_log_level_from_env();
        if (lvl >= 0)
                dw_log_set_level(lvl);
        struct dwc_dev *d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        d->ev_sock = d->doorbell = -1;
        pthread_mutex_init(&d->lock, NULL);
        d->sock = connect_daemon();
        if (d->sock < 0) {
                int err = d->sock;
                free(d);
                return err;
        }
        struct dw_ipc_req req;
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        int fds[DW_IPC_MAX_FDS], nfds = DW_IPC_MAX_FDS;
        int err = -ENOMEM;
        if (!rsp)
                goto fail;
        req_init(&req, DW_IPC_OPEN, 0);
        req.u.open.version = DW_IPC_VERSION;
        req.u.open.pid = getpid();
        const char *addr = opts && opts->addr ? opts->addr : getenv("DIWARP_ADDR");
        if (addr && (strlen(addr) >= sizeof(req.u.open.addr) || strchr(addr, ','))) {
                dw_err("device open: address '%s': a list of rails (multirail) is set on "
                       "diwarpd, not on its clients",
                       addr);
                err = -EINVAL;
                goto fail;
        }
        if (addr)
                strcpy(req.u.open.addr, addr);
        req.u.open.port_base = opts ? opts->port_base : 0;
        pthread_mutex_lock(&d->lock);
        err = rpc_locked(d, &req, NULL, 0, rsp, fds, &nfds);
        pthread_mutex_unlock(&d->lock);
        if (err < 0) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                dw_err("device open through the daemon: %s", strerror(-err));
                goto fail;
        }
        if (nfds != 3) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                err = -EPROTO;
                goto fail;
        }
        d->ev_sock = fds[0];
        d->doorbell = fds[1];
        d->page = mmap(NULL, sizeof(*d->page), PROT_READ, MAP_SHARED, fds[2], 0);
        close(fds[2]);
        if (d->page == MAP_FAILED) {
                err = -errno;
                d->page = NULL;
                goto fail;
        }
        d->info = rsp->u.open;
        free(rsp);
        *out = (struct diwarp_device *)d;
        dw_info("device opened through the daemon: port %u instance %u", d->info.port,
                d->info.instance);
        return 0;
fail:
        free(rsp);
        if (d->ev_sock >= 0)
                close(d->ev_sock);
        if (d->doorbell >= 0)
                close(d->doorbell);
        close(d->sock);
        free(d);
        return err;
}

int dwc_device_close(struct diwarp_device *dv)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        /* The daemon frees whatever the connection still holds when it ends. */
        close(d->sock);
        close(d->ev_sock);
        close(d->doorbell);
        munmap(d->page, sizeof(*d->page));
        while (d->segs) {
                struct dwc_seg *s = d->segs;
                d->segs = s->next;
                free(s);
        }
        free(d->objs);
        pthread_mutex_destroy(&d->lock);
        free(d);
        return 0;
}

int dwc_device_query(struct diwarp_device *dv, struct diwarp_device_attr *attr)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        *attr = d->info.attr;
        return 0;
}

int dwc_device_gid(struct diwarp_device *dv, union diwarp_gid *gid)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        *gid = d->info.gid;
        return 0;
}

int dwc_device_gid_table(struct diwarp_device *dv, struct diwarp_netif *out, int max)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        for (int i = 0; i < d->info.ngid && i < max; i++)
                out[i] = d->info.gids[i];
        return d->info.ngid;
}

int dwc_device_port(struct diwarp_device *dv, uint16_t *port, uint16_t *instance)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        if (port)
                *port = d->info.port;
        if (instance)
                *instance = d->info.instance;
        return 0;
}

/* The daemon's socket closed: the device is lost. Every QP goes to ERR and
 * its outstanding WRs complete with WR_FLUSH_ERR (made here, after what the
 * rings hold); posts fail with -EIO; the async fd reports DEVICE_FATAL. */
static bool daemon_gone(struct dwc_dev *d)
{
        struct pollfd p = {.fd = d->sock, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0)
                return false;
        if (p.revents & (POLLHUP | POLLERR))
                return true;
        char c;
        return recv(d->sock, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

int dwc_progress(struct diwarp_device *dv, int budget)
{
        (void)budget; /* the daemon makes the progress */
        struct dwc_dev *d = (struct dwc_dev *)dv;
        if (atomic_load(&d->dead))
                return -EIO;
        /* The daemon makes the progress: a program that loops on this call
         * (a passive target) lends it the core, and looks at the daemon's
         * socket as a busy CQ poll does. */
        if (atomic_fetch_add_explicit(&d->progress_calls, 1, memory_order_relaxed) %
                    EMPTY_POLL_CHECK ==
                EMPTY_POLL_CHECK - 1 &&
            daemon_gone(d)) {
                dev_fatal_lock(d);
                return -EIO;
        }
        sched_yield();
        return 0;
}

/* ---- protection domains and memory ------------------------------------------ */

int dwc_pd_alloc(struct diwarp_device *dv, struct diwarp_pd **out)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        struct dwc_pd *pd = calloc(1, sizeof(*pd));
        if (!pd)
                return -ENOMEM;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_PD_ALLOC, 0);
        int err = rpc(d, &req, &rsp);
        if (err < 0) {
                free(pd);
                return err;
        }
        pd->dev = d;
        pd->h = rsp.handle;
        *out = (struct diwarp_pd *)pd;
        return 0;
}

int dwc_pd_dealloc(struct diwarp_pd *p)
{
        struct dwc_pd *pd = (struct dwc_pd *)p;
        int err = rpc_destroy(pd->dev, DW_IPC_PD_DEALLOC, pd->h);
        if (err < 0)
                return err;
        free(pd);
        return 0;
}

/* Whether [base, base + len) is mapped readable in this process, and not a
 * shared mapping of a file of someone else's (remapping it would cut it
 * from that file). *writable: every page of it is writable. */
static int range_ok(uint64_t base, uint64_t len, bool *writable)
{
        FILE *f = fopen("/proc/self/maps", "re");
        if (!f)
                return -errno;
        char line[512];
        uint64_t at = base, end = base + len;
        int err = -EFAULT;
        *writable = true;
        while (at < end && fgets(line, sizeof(line), f)) {
                uint64_t lo, hi;
                char perms[8] = "";
                int pathpos = 0;
                if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %*s %*s %*s %n", &lo, &hi, perms,
                           &pathpos) < 3)
                        continue;
                if (hi <= at)
                        continue;
                if (lo > at)
                        break; /* a hole */
                if (perms[0] != 'r')
                        break;
                if (perms[1] != 'w')
                        *writable = false;
                const char *path = line + pathpos;
                if (perms[3] == 's' && strncmp(path, "/memfd:diwarp", 13) != 0) {
                        err = -EOPNOTSUPP;
                        break;
                }
                at = hi;
        }
        fclose(f);
        return at >= end ? 0 : err;
}

/* Segments one registration may join: the length of SEG_ADD's replace list. */
#define SEG_MERGE_MAX (sizeof(((struct dw_ipc_req *)0)->u.seg.replace) / sizeof(uint32_t))

/* Widens [*b, *e) to its union with every segment of d it overlaps, until
 * nothing more joins; old[] gets those segments. Their count, or -ENOMEM
 * beyond SEG_MERGE_MAX. */
static int seg_union(struct dwc_dev *d, uint64_t *b, uint64_t *e, struct dwc_seg **old)
{
        uint32_t nold = 0;
        bool grew = true;
        while (grew) {
                grew = false;
                for (struct dwc_seg *s = d->segs; s; s = s->next) {
                        bool in = false;
                        for (uint32_t i = 0; i < nold; i++)
                                in |= old[i] == s;
                        if (in || s->base >= *e || s->base + s->len <= *b)
                                continue;
                        if (nold == SEG_MERGE_MAX)
                                return -ENOMEM;
                        old[nold++] = s;
                        *b = s->base < *b ? s->base : *b;
                        *e = s->base + s->len > *e ? s->base + s->len : *e;
                        grew = true;
                }
        }
        return (int)nold;
}

/* Moves [b, b + len) of this process into a new sealed memfd mapped at the
 * same addresses: the fd, or a negative errno. */
static int seg_memfd(uint64_t b, uint64_t len)
{
        bool writable = true;
        int err = range_ok(b, len, &writable);
        if (err < 0) {
                dw_err("memory registration through the daemon: [0x%" PRIx64 ", 0x%" PRIx64
                       ") is %s",
                       b, b + len,
                       err == -EOPNOTSUPP ? "a shared mapping of a file (not supported)"
                                          : "not readable memory of this process");
                return err;
        }
        int fd = memfd_create("diwarp-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t)len) < 0)
                goto fail_errno;
        /* Copy, then put the shared pages in place at the same addresses: the
         * program keeps its pointers and contents. A write by another thread
         * between the copy and the remap would be lost (docs/USAGE.md). The
         * kernel copies (pwrite): the whole pages, beyond the region's own
         * bytes, are read, and a sanitizer would take its neighbours' bytes
         * for an overflow. */
        for (uint64_t done = 0; done < len;) {
                /* Bytes never written are copied as they are: not a use. */
                DW_NO_VALGRIND_REPORTS_BEGIN;
                long n = syscall(SYS_pwrite64, fd, (const char *)(uintptr_t)b + done, len - done,
                                 (off_t)done);
                DW_NO_VALGRIND_REPORTS_END;
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        goto fail_errno;
                done += (uint64_t)n;
        }
        if (mmap((void *)(uintptr_t)b, len, PROT_READ | (writable ? PROT_WRITE : 0),
                 MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
                goto fail_errno;
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                goto fail_errno;
        return fd;
fail_errno:
        err = -errno;
        close(fd);
        return err;
}

/* Puts [b, e) of this process in one sealed memfd shared with the daemon,
 * merging the segments it overlaps; d->lock held. */
static int seg_share(struct dwc_dev *d, uint64_t b, uint64_t e, struct dwc_seg **out)
{
        for (struct dwc_seg *s = d->segs; s; s = s->next)
                if (s->base <= b && e <= s->base + s->len) {
                        *out = s;
                        return 0;
                }
        struct dwc_seg *old[SEG_MERGE_MAX];
        int merged = seg_union(d, &b, &e, old);
        if (merged < 0)
                return merged;
        uint32_t nold = (uint32_t)merged;
        uint64_t len = e - b;
        int fd = seg_memfd(b, len);
        if (fd < 0)
                return fd;
        struct dwc_seg *s = calloc(1, sizeof(*s));
        if (!s) {
                close(fd);
                return -ENOMEM;
        }
        s->base = b;
        s->len = len;
        s->id = ++d->next_seg_id ? d->next_seg_id : ++d->next_seg_id;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_SEG_ADD, 0);
        req.u.seg.base = b;
        req.u.seg.len = len;
        req.u.seg.id = s->id;
        req.u.seg.nreplace = nold;
        for (uint32_t i = 0; i < nold; i++)
                req.u.seg.replace[i] = old[i]->id;
        int err = rpc_locked(d, &req, &fd, 1, &rsp, NULL, NULL);
        close(fd);
        if (err < 0) {
                free(s);
                return err;
        }
        /* The new segment replaces the old ones: it takes over their
         * regions' references (an MR finds its segment by address at
         * deregistration, so nothing points at the old objects). */
        for (uint32_t i = 0; i < nold; i++) {
                s->refs += old[i]->refs;
                for (struct dwc_seg **pp = &d->segs; *pp; pp = &(*pp)->next)
                        if (*pp == old[i]) {
                                *pp = old[i]->next;
                                break;
                        }
                free(old[i]);
        }
        s->next = d->segs;
        d->segs = s;
        *out = s;
        return 0;
}

static struct dwc_seg *seg_by_id(struct dwc_dev *d, uint32_t id)
{
        for (struct dwc_seg *s = d->segs; s; s = s->next)
                if (s->id == id)
                        return s;
        return NULL;
}

static void seg_put(struct dwc_dev *d, uint32_t id)
{
        struct dwc_seg *s = seg_by_id(d, id);
        if (!s || --s->refs > 0)
                return;
        for (struct dwc_seg **pp = &d->segs; *pp; pp = &(*pp)->next)
                if (*pp == s) {
                        *pp = s->next;
                        break;
                }
        free(s);
}

int dwc_mr_reg(struct diwarp_pd *p, void *addr, size_t length, uint64_t iova, int access,
               struct diwarp_mr **out)
{
        struct dwc_pd *pd = (struct dwc_pd *)p;
        if (!addr && length)
                return -EINVAL;
        struct dwc_dev *d = pd->dev;
        struct dwc_mr *mr = calloc(1, sizeof(*mr));
        if (!mr)
                return -ENOMEM;
        pthread_mutex_lock(&d->lock);
        struct dwc_seg *s = NULL;
        int err = 0;
        uint64_t a = (uintptr_t)addr;
        if (length) {
                if (a + length < a) {
                        err = -EINVAL;
                        goto out;
                }
                err = seg_share(d, a & ~4095ull, (a + length + 4095) & ~4095ull, &s);
                if (err < 0)
                        goto out;
        }
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_MR_REG, 0);
        req.u.mr.pd = pd->h;
        req.u.mr.seg = s ? s->id : 0;
        req.u.mr.addr = a;
        req.u.mr.len = length;
        req.u.mr.iova = iova;
        req.u.mr.access = access;
        err = rpc_locked(d, &req, NULL, 0, &rsp, NULL, NULL);
        if (err < 0) {
                if (s && s->refs == 0)
                        seg_put(d, s->id);
                goto out;
        }
        if (s)
                s->refs++;
        mr->dev = d;
        mr->h = rsp.handle;
        mr->key = rsp.key;
        mr->info.addr = addr;
        mr->info.length = length;
        mr->info.iova = (access & DIWARP_ACCESS_ZERO_BASED) ? 0 : iova;
        mr->info.lkey = mr->info.rkey = rsp.key;
        mr->info.access = access;
out:
        pthread_mutex_unlock(&d->lock);
        if (err < 0) {
                free(mr);
                return err;
        }
        *out = (struct diwarp_mr *)mr;
        return 0;
}

int dwc_mr_dereg(struct diwarp_mr *m)
{
        struct dwc_mr *mr = (struct dwc_mr *)m;
        struct dwc_dev *d = mr->dev;
        int err = destroy_begin(d, DW_IPC_MR_DEREG, mr->h);
        if (err < 0)
                return err;
        /* The region's segment: found by address (merges replace segments). */
        if (mr->info.length) {
                uint64_t a = (uintptr_t)mr->info.addr;
                for (struct dwc_seg *s = d->segs; s; s = s->next)
                        if (s->base <= a && a < s->base + s->len) {
                                seg_put(d, s->id);
                                break;
                        }
        }
        pthread_mutex_unlock(&d->lock);
        free(mr);
        return 0;
}

int dwc_mr_info(const struct diwarp_mr *m, struct diwarp_mr_info *info)
{
        const struct dwc_mr *mr = (const struct dwc_mr *)m;
        *info = mr->info;
        return 0;
}

/* ---- completion channels and CQs --------------------------------------------- */

static int fdobj_create(struct dwc_dev *d, struct dw_ipc_req *req, struct dwc_fdobj **out)
{
        struct dwc_fdobj *o = calloc(1, sizeof(*o));
        if (!o)
                return -ENOMEM;
        struct dw_ipc_rsp rsp;
        pthread_mutex_lock(&d->lock);
        int err = rpc_fd_locked(d, req, &rsp, &o->fd);
        pthread_mutex_unlock(&d->lock);
        if (err < 0) {
                free(o);
                return err;
        }
        o->dev = d;
        o->h = rsp.handle;
        *out = o;
        return 0;
}

static int fdobj_destroy(struct dwc_fdobj *o, unsigned int op)
{
        int err = rpc_destroy(o->dev, op, o->h);
        if (err < 0)
                return err;
        close(o->fd);
        free(o);
        return 0;
}

int dwc_comp_channel_create(struct diwarp_device *dv, struct diwarp_comp_channel **out)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        struct dw_ipc_req req;
        req_init(&req, DW_IPC_CHANNEL_CREATE, 0);
        return fdobj_create(d, &req, (struct dwc_fdobj **)out);
}

int dwc_comp_channel_destroy(struct diwarp_comp_channel *c)
{
        return fdobj_destroy((struct dwc_fdobj *)c, DW_IPC_CHANNEL_DESTROY);
}

int dwc_comp_channel_fd(const struct diwarp_comp_channel *c)
{
        const struct dwc_fdobj *ch = (const struct dwc_fdobj *)c;
        return ch->fd;
}

int dwc_comp_channel_get_event(struct diwarp_comp_channel *c, struct diwarp_cq **cq,
                               void **cq_context)
{
        struct dwc_fdobj *ch = (struct dwc_fdobj *)c;
        struct dw_ipc_event ev;
        ssize_t n;
        do
                n = recv(ch->fd, &ev, sizeof(ev), 0);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        if (n == 0) {
                dev_fatal_lock(ch->dev);
                return -EIO;
        }
        if ((size_t)n != sizeof(ev))
                return -EPROTO;
        pthread_mutex_lock(&ch->dev->lock);
        struct dwc_cq *q = objs_get(ch->dev, ev.handle);
        pthread_mutex_unlock(&ch->dev->lock);
        if (!q)
                return -EAGAIN; /* its CQ is gone */
        if (cq)
                *cq = (struct diwarp_cq *)q;
        if (cq_context)
                *cq_context = q->context;
        return 0;
}

static void *map_fd(int fd, size_t len)
{
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        return p;
}

int dwc_cq_create(struct diwarp_device *dv, int cqe, void *cq_context,
                  struct diwarp_comp_channel *channel, struct diwarp_cq **out)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        struct dwc_cq *cq = calloc(1, sizeof(*cq));
        if (!cq)
                return -ENOMEM;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        int fd = -1;
        req_init(&req, DW_IPC_CQ_CREATE, 0);
        req.u.cq.cqe = cqe;
        req.u.cq.channel = channel ? ((struct dwc_fdobj *)channel)->h : 0;
        req.u.cq.context = (uintptr_t)cq_context;
        pthread_mutex_lock(&d->lock);
        int err = rpc_fd_locked(d, &req, &rsp, &fd);
        if (err < 0)
                goto fail;
        cq->map_len = rsp.u.cq.map_len;
        cq->map = map_fd(fd, cq->map_len);
        fd = -1;
        if (cq->map == MAP_FAILED) {
                err = -errno;
                goto fail_daemon;
        }
        cq->dev = d;
        cq->h = rsp.handle;
        cq->ring = (struct dw_ipc_ring *)((uint8_t *)cq->map + rsp.u.cq.ring.off);
        cq->entries = rsp.u.cq.ring.entries;
        cq->esize = rsp.u.cq.ring.entry_size;
        cq->cqe = rsp.u.cq.cqe;
        cq->context = cq_context;
        cq->channel = (struct dwc_fdobj *)channel;
        pthread_mutex_init(&cq->lock, NULL);
        objs_set(d, cq->h, cq);
        pthread_mutex_unlock(&d->lock);
        *out = (struct diwarp_cq *)cq;
        return 0;
fail_daemon:
        rpc_destroy_locked(d, DW_IPC_CQ_DESTROY, rsp.handle);
fail:
        pthread_mutex_unlock(&d->lock);
        free(cq);
        return err;
}

int dwc_cq_destroy(struct diwarp_cq *c)
{
        struct dwc_cq *cq = (struct dwc_cq *)c;
        struct dwc_dev *d = cq->dev;
        int err = rpc_destroy(d, DW_IPC_CQ_DESTROY, cq->h);
        if (err < 0)
                return err;
        munmap(cq->map, cq->map_len);
        free(cq->flushed);
        pthread_mutex_destroy(&cq->lock);
        free(cq);
        return 0;
}

/* A completion seen by the application retires its WR from the tracking
 * of its QP (or SRQ). */
static void track_retire(struct dwc_dev *d, const struct diwarp_wc *wc)
{
        struct dwc_qp *qp = d->by_qpn[wc->qp_num & (QPN_SLOTS - 1)];
        if (!qp || qp->qpn != wc->qp_num)
                return;
        struct dwc_track *t;
        if (wc->opcode & DIWARP_WC_RECV) {
                if (qp->srq) {
                        atomic_fetch_add_explicit(&qp->srq->done, 1, memory_order_relaxed);
                        return;
                }
                t = &qp->rt;
                /* Receives complete in the order they were posted, except on
                 * RD, whose late MSNs may pass a parked one: mark, then advance. */
                for (uint32_t i = t->retired; i != t->posted; i++)
                        if (t->wr_id[i & t->mask] == wc->wr_id && !t->op[i & t->mask]) {
                                t->op[i & t->mask] = 1;
                                break;
                        }
                while (t->retired != t->posted && t->op[t->retired & t->mask])
                        t->retired++;
                return;
        }
        /* Sends complete in order; unsignaled ones before it are retired too. */
        t = &qp->st;
        for (uint32_t i = t->retired; i != t->posted; i++)
                if (t->wr_id[i & t->mask] == wc->wr_id) {
                        t->retired = i + 1;
                        break;
                }
}

static void flushed_push(struct dwc_cq *cq, const struct diwarp_wc *wc)
{
        if (cq->nflushed == cq->flushed_cap) {
                uint32_t n = cq->flushed_cap ? 2 * cq->flushed_cap : 64;
                struct diwarp_wc *f = malloc(n * sizeof(*f));
                if (!f)
                        return;
                for (uint32_t i = 0; i < cq->nflushed; i++)
                        f[i] = cq->flushed[(cq->flushed_head + i) % cq->flushed_cap];
                free(cq->flushed);
                cq->flushed = f;
                cq->flushed_cap = n;
                cq->flushed_head = 0;
        }
        cq->flushed[(cq->flushed_head + cq->nflushed++) % cq->flushed_cap] = *wc;
}

int dwc_cq_poll(struct diwarp_cq *c, int n, struct diwarp_wc *wc)
{
        struct dwc_cq *cq = (struct dwc_cq *)c;
        pthread_mutex_lock(&cq->lock);
        uint32_t cons = cq->cons;
        uint32_t prod = atomic_load_explicit(&cq->ring->prod, memory_order_acquire);
        int got = 0;
        while (got < n && cons != prod) {
                memcpy(&wc[got], dw_ipc_ring_entry(cq->ring, cq->esize, cq->entries, cons),
                       sizeof(*wc));
                track_retire(cq->dev, &wc[got]);
                cons++;
                got++;
        }
        if (got)
                atomic_store_explicit(&cq->ring->cons, cons, memory_order_release);
        cq->cons = cons;
        while (got < n && cq->nflushed) {
                wc[got++] = cq->flushed[cq->flushed_head];
                cq->flushed_head = (cq->flushed_head + 1) % cq->flushed_cap;
                cq->nflushed--;
        }
        /* Empty polls in a row: yield the core after a few (the daemon may
         * need it), look at the daemon's socket every EMPTY_POLL_CHECK. */
        uint32_t empty = 0;
        if (got)
                cq->empty = 0;
        else if (n > 0)
                empty = ++cq->empty;
        pthread_mutex_unlock(&cq->lock);
        if (empty > NAP_AFTER)
                dw_ipc_cq_nap(cq->ring, prod, NAP_NS);
        else if (empty > YIELD_AFTER)
                sched_yield();
        if (empty && empty % EMPTY_POLL_CHECK == 0 && !atomic_load(&cq->dev->dead) &&
            daemon_gone(cq->dev)) {
                dev_fatal_lock(cq->dev);
                return dwc_cq_poll(c, n, wc);
        }
        return got;
}

int dwc_cq_req_notify(struct diwarp_cq *c, bool solicited_only)
{
        struct dwc_cq *cq = (struct dwc_cq *)c;
        if (!cq->channel)
                return -EINVAL;
        if (atomic_load(&cq->dev->dead))
                return -EIO;
        atomic_store_explicit(&cq->ring->arm, solicited_only ? 2u : 1u, memory_order_release);
        wake_daemon(cq->dev);
        return 0;
}

void dwc_cq_ack_events(struct diwarp_cq *c, unsigned int nevents)
{
        (void)c;
        (void)nevents; /* events are messages: nothing to count back */
}

int dwc_cq_cqe(const struct diwarp_cq *c)
{
        const struct dwc_cq *cq = (const struct dwc_cq *)c;
        return cq->cqe;
}

/* ---- QPs ----------------------------------------------------------------------- */

static int track_init(struct dwc_track *t, uint32_t entries)
{
        t->mask = entries - 1;
        t->wr_id = calloc(entries, sizeof(*t->wr_id));
        t->op = calloc(entries, 1);
        return t->wr_id && t->op ? 0 : -ENOMEM;
}

static void track_fini(struct dwc_track *t)
{
        free(t->wr_id);
        free(t->op);
}

static void qp_free(struct dwc_qp *qp)
{
        if (qp->map && qp->map != MAP_FAILED)
                munmap(qp->map, qp->map_len);
        track_fini(&qp->st);
        track_fini(&qp->rt);
        pthread_mutex_destroy(&qp->sq_lock);
        pthread_mutex_destroy(&qp->rq_lock);
        free(qp);
}

int dwc_qp_create(struct diwarp_pd *p, struct diwarp_qp_init_attr *attr, struct diwarp_qp **out)
{
        struct dwc_pd *pd = (struct dwc_pd *)p;
        struct dwc_dev *d = pd->dev;
        struct dwc_qp *qp = calloc(1, sizeof(*qp));
        if (!qp)
                return -ENOMEM;
        pthread_mutex_init(&qp->sq_lock, NULL);
        pthread_mutex_init(&qp->rq_lock, NULL);
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        int fd;
        req_init(&req, DW_IPC_QP_CREATE, 0);
        req.u.qp.pd = pd->h;
        req.u.qp.send_cq = ((struct dwc_cq *)attr->send_cq)->h;
        req.u.qp.recv_cq = ((struct dwc_cq *)attr->recv_cq)->h;
        req.u.qp.srq = attr->srq ? ((struct dwc_srq *)attr->srq)->h : 0;
        req.u.qp.type = attr->qp_type;
        req.u.qp.sq_sig_all = attr->sq_sig_all;
        req.u.qp.cap = attr->cap;
        pthread_mutex_lock(&d->lock);
        int err = rpc_fd_locked(d, &req, &rsp, &fd);
        if (err < 0) {
                pthread_mutex_unlock(&d->lock);
                qp_free(qp);
                return err;
        }
        const struct dw_ipc_qp_rsp *r = &rsp.u.qp;
        qp->map_len = r->map_len;
        qp->map = map_fd(fd, qp->map_len);
        if (qp->map == MAP_FAILED || track_init(&qp->st, r->sq.entries) < 0 ||
            track_init(&qp->rt, r->rq.entries ? r->rq.entries : 1) < 0) {
                err = qp->map == MAP_FAILED ? -errno : -ENOMEM;
                rpc_destroy_locked(d, DW_IPC_QP_DESTROY, rsp.handle);
                pthread_mutex_unlock(&d->lock);
                qp_free(qp);
                return err;
        }
        qp->dev = d;
        qp->h = rsp.handle;
        qp->qpn = r->qpn;
        qp->type = attr->qp_type;
        qp->cap = r->cap;
        qp->send_cq = (struct dwc_cq *)attr->send_cq;
        qp->recv_cq = (struct dwc_cq *)attr->recv_cq;
        qp->srq = (struct dwc_srq *)attr->srq;
        qp->pd = pd;
        qp->context = attr->qp_context;
        qp->sq_sig_all = attr->sq_sig_all;
        qp->sq = (struct dw_ipc_ring *)((uint8_t *)qp->map + r->sq.off);
        qp->sq_entries = r->sq.entries;
        qp->sq_esize = r->sq.entry_size;
        if (r->rq.entries) {
                qp->rq = (struct dw_ipc_ring *)((uint8_t *)qp->map + r->rq.off);
                qp->rq_entries = r->rq.entries;
                qp->rq_esize = r->rq.entry_size;
        }
        qp->state = DIWARP_QPS_RESET;
        attr->cap = qp->cap;
        objs_set(d, qp->h, qp);
        d->by_qpn[qp->qpn & (QPN_SLOTS - 1)] = qp;
        pthread_mutex_unlock(&d->lock);
        *out = (struct diwarp_qp *)qp;
        return 0;
}

int dwc_qp_destroy(struct diwarp_qp *q)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dwc_dev *d = qp->dev;
        int err = destroy_begin(d, DW_IPC_QP_DESTROY, qp->h);
        if (err < 0)
                return err;
        if (d->by_qpn[qp->qpn & (QPN_SLOTS - 1)] == qp)
                d->by_qpn[qp->qpn & (QPN_SLOTS - 1)] = NULL;
        pthread_mutex_unlock(&d->lock);
        qp_free(qp);
        return 0;
}

int dwc_qp_modify(struct diwarp_qp *q, const struct diwarp_qp_attr *attr, int mask)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_QP_MODIFY, qp->h);
        req.u.qpm.attr = *attr;
        req.u.qpm.mask = mask;
        int err = rpc(qp->dev, &req, &rsp);
        if (err == 0 && (mask & DIWARP_QP_STATE))
                qp->state = attr->qp_state;
        return err;
}

static int qp_query(struct dwc_qp *qp, struct dw_ipc_qp_query_rsp *out)
{
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_QP_QUERY, qp->h);
        int err = rpc(qp->dev, &req, &rsp);
        if (err < 0)
                return err;
        *out = rsp.u.qpq;
        qp->state = rsp.u.qpq.state;
        return 0;
}

int dwc_qp_query(struct diwarp_qp *q, struct diwarp_qp_attr *attr,
                 struct diwarp_qp_init_attr *init_attr)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dw_ipc_qp_query_rsp r;
        int err = qp_query(qp, &r);
        if (err < 0)
                return err;
        if (attr)
                *attr = r.attr;
        if (init_attr) {
                memset(init_attr, 0, sizeof(*init_attr));
                init_attr->qp_context = qp->context;
                init_attr->send_cq = (struct diwarp_cq *)qp->send_cq;
                init_attr->recv_cq = (struct diwarp_cq *)qp->recv_cq;
                init_attr->srq = (struct diwarp_srq *)qp->srq;
                init_attr->cap = r.cap;
                init_attr->qp_type = qp->type;
                init_attr->sq_sig_all = qp->sq_sig_all;
        }
        return 0;
}

uint32_t dwc_qp_num(const struct diwarp_qp *q)
{
        const struct dwc_qp *qp = (const struct dwc_qp *)q;
        return qp->qpn;
}

enum diwarp_qp_state dwc_qp_state(const struct diwarp_qp *q)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        if (atomic_load(&qp->dev->dead))
                return DIWARP_QPS_ERR;
        uint32_t s = atomic_load_explicit(&qp->sq->qp_state, memory_order_acquire);
        return s <= DIWARP_QPS_ERR ? (enum diwarp_qp_state)s : qp->state;
}

bool dwc_qp_data_in_order(const struct diwarp_qp *q)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dw_ipc_qp_query_rsp r;
        return qp_query(qp, &r) == 0 && r.data_in_order;
}

/* ---- posting ------------------------------------------------------------------ */

static int fill_swr(struct dwc_qp *qp, struct dw_ipc_swr *e, const struct diwarp_send_wr *wr,
                    const struct diwarpdv_rd_dest *rd)
{
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge)
                return -EINVAL;
        memset(e, 0, sizeof(*e));
        e->wr_id = wr->wr_id;
        e->opcode = wr->opcode;
        e->send_flags = wr->send_flags;
        e->imm_data = wr->imm_data;
        e->invalidate_rkey = wr->invalidate_rkey;
        e->num_sge = (uint32_t)wr->num_sge;
        switch (wr->opcode) {
        case DIWARP_WR_ATOMIC_CMP_AND_SWP:
        case DIWARP_WR_ATOMIC_FETCH_AND_ADD:
                e->remote_addr = wr->wr.atomic.remote_addr;
                e->compare_add = wr->wr.atomic.compare_add;
                e->swap = wr->wr.atomic.swap;
                e->rkey = wr->wr.atomic.rkey;
                break;
        case DIWARP_WR_BIND_MW:
                return -EOPNOTSUPP;
        default:
                e->remote_addr = wr->wr.rdma.remote_addr;
                e->rkey = wr->wr.rdma.rkey;
                break;
        }
        if (rd) {
                e->rd = 1;
                e->ah = rd->ah ? ((struct dwc_ah *)rd->ah)->h : 0;
                e->remote_qpn = rd->remote_qpn;
                e->remote_qkey = rd->remote_qkey;
        } else if (qp->type == DIWARP_QPT_UD ||
                   (qp->type == DIWARP_QPT_RD && dw_ipc_send_op(wr->opcode))) {
                /* A datagram QP's Sends name their destination in wr.ud. */
                if (!wr->wr.ud.ah)
                        return -EINVAL;
                e->ah = ((struct dwc_ah *)wr->wr.ud.ah)->h;
                e->remote_qpn = wr->wr.ud.remote_qpn;
                e->remote_qkey = wr->wr.ud.remote_qkey;
        }
        struct diwarp_sge *sg = dw_ipc_swr_sges(e);
        if (wr->send_flags & DIWARP_SEND_INLINE) {
                /* The bytes go in the ring: the daemon cannot read
                 * unregistered memory of ours. */
                uint8_t *dst = (uint8_t *)(sg + qp->cap.max_send_sge);
                uint64_t total = 0;
                for (int i = 0; i < wr->num_sge; i++)
                        total += wr->sg_list[i].length;
                if (total > qp->cap.max_inline_data)
                        return -EINVAL;
                for (int i = 0; i < wr->num_sge; i++) {
                        memcpy(dst, (const void *)(uintptr_t)wr->sg_list[i].addr,
                               wr->sg_list[i].length);
                        dst += wr->sg_list[i].length;
                }
                e->inline_len = (uint32_t)total;
                e->num_sge = 0;
        } else {
                for (int i = 0; i < wr->num_sge; i++)
                        sg[i] = wr->sg_list[i];
        }
        return 0;
}

/* rd: diwarpdv_post_send_rd's destination, else NULL. all: all or nothing. */
static int post_send(struct diwarp_qp *q, struct diwarp_send_wr *wr,
                     const struct diwarpdv_rd_dest *rd, bool all, struct diwarp_send_wr **bad_wr)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        if (atomic_load(&qp->dev->dead)) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EIO;
        }
        if (qp->state == DIWARP_QPS_RESET || qp->state == DIWARP_QPS_INIT ||
            qp->state == DIWARP_QPS_RTR) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EINVAL;
        }
        pthread_mutex_lock(&qp->sq_lock);
        struct dwc_track *t = &qp->st;
        uint32_t prod = t->posted, n = 0;
        int err = 0;
        if (all) {
                for (struct diwarp_send_wr *w = wr; w; w = w->next)
                        n++;
                if (t->posted - t->retired + n > qp->cap.max_send_wr) {
                        err = -ENOMEM;
                        if (bad_wr)
                                *bad_wr = wr;
                        goto out;
                }
        }
        for (; wr; wr = wr->next) {
                if (t->posted - t->retired >= qp->cap.max_send_wr) {
                        err = -ENOMEM;
                        break;
                }
                struct dw_ipc_swr *e =
                    dw_ipc_ring_entry(qp->sq, qp->sq_esize, qp->sq_entries, t->posted);
                err = fill_swr(qp, e, wr, rd);
                if (err < 0)
                        break;
                t->wr_id[t->posted & t->mask] = wr->wr_id;
                t->op[t->posted & t->mask] = (uint8_t)dw_wr_op(wr->opcode)->wc;
                t->posted++;
        }
        if (err < 0) {
                if (bad_wr)
                        *bad_wr = wr;
                if (all)
                        t->posted = prod; /* nothing of the list was published */
        }
        if (t->posted != prod) {
                atomic_store_explicit(&qp->sq->prod, t->posted, memory_order_release);
                wake_daemon(qp->dev);
        }
out:
        pthread_mutex_unlock(&qp->sq_lock);
        return err;
}

/* Writes receive WRs into a ring; t tracks them (NULL: an SRQ). */
static int post_recv_ring(struct dwc_dev *d, struct dw_ipc_ring *ring, uint32_t entries,
                          uint32_t esize, uint32_t max_sge, uint32_t max_wr, uint32_t *prodp,
                          uint32_t outstanding, struct dwc_track *t, struct diwarp_recv_wr *wr,
                          struct diwarp_recv_wr **bad_wr)
{
        uint32_t prod = *prodp, start = prod;
        int err = 0;
        for (; wr; wr = wr->next) {
                if (outstanding + (prod - start) >= max_wr) {
                        err = -ENOMEM;
                        break;
                }
                if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge) {
                        err = -EINVAL;
                        break;
                }
                struct dw_ipc_rwr *e = dw_ipc_ring_entry(ring, esize, entries, prod);
                e->wr_id = wr->wr_id;
                e->num_sge = (uint32_t)wr->num_sge;
                memcpy(dw_ipc_rwr_sges(e), wr->sg_list, sizeof(struct diwarp_sge) * e->num_sge);
                if (t) {
                        t->wr_id[prod & t->mask] = wr->wr_id;
                        t->op[prod & t->mask] = 0;
                }
                prod++;
        }
        if (err < 0 && bad_wr)
                *bad_wr = wr;
        if (prod != start) {
                *prodp = prod;
                atomic_store_explicit(&ring->prod, prod, memory_order_release);
                wake_daemon(d);
        }
        return err;
}

int dwc_post_send(struct diwarp_qp *q, struct diwarp_send_wr *wr, struct diwarp_send_wr **bad_wr)
{
        return post_send(q, wr, NULL, false, bad_wr);
}

int dwc_post_send_all(struct diwarp_qp *q, struct diwarp_send_wr *wr,
                      struct diwarp_send_wr **bad_wr)
{
        return post_send(q, wr, NULL, true, bad_wr);
}

int dwc_post_send_rd(struct diwarp_qp *q, struct diwarp_send_wr *wr,
                     const struct diwarpdv_rd_dest *dest, struct diwarp_send_wr **bad_wr)
{
        return post_send(q, wr, dest, false, bad_wr);
}

int dwc_post_recv(struct diwarp_qp *q, struct diwarp_recv_wr *wr, struct diwarp_recv_wr **bad_wr)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        if (qp->srq || !qp->rq) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EINVAL;
        }
        if (atomic_load(&qp->dev->dead)) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EIO;
        }
        if (qp->state == DIWARP_QPS_RESET) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EINVAL;
        }
        pthread_mutex_lock(&qp->rq_lock);
        struct dwc_track *t = &qp->rt;
        int err =
            post_recv_ring(qp->dev, qp->rq, qp->rq_entries, qp->rq_esize, qp->cap.max_recv_sge,
                           qp->cap.max_recv_wr, &t->posted, t->posted - t->retired, t, wr, bad_wr);
        pthread_mutex_unlock(&qp->rq_lock);
        return err;
}

/* ---- SRQs and AHs ----------------------------------------------------------------- */

int dwc_srq_create(struct diwarp_pd *p, struct diwarp_srq_attr *attr, void *srq_context,
                   struct diwarp_srq **out)
{
        struct dwc_pd *pd = (struct dwc_pd *)p;
        struct dwc_dev *d = pd->dev;
        struct dwc_srq *srq = calloc(1, sizeof(*srq));
        if (!srq)
                return -ENOMEM;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        int fd;
        req_init(&req, DW_IPC_SRQ_CREATE, 0);
        req.u.srq.pd = pd->h;
        req.u.srq.attr = *attr;
        pthread_mutex_lock(&d->lock);
        int err = rpc_fd_locked(d, &req, &rsp, &fd);
        if (err < 0) {
                pthread_mutex_unlock(&d->lock);
                free(srq);
                return err;
        }
        srq->map_len = rsp.u.srq.map_len;
        srq->map = map_fd(fd, srq->map_len);
        if (srq->map == MAP_FAILED) {
                err = -errno;
                rpc_destroy_locked(d, DW_IPC_SRQ_DESTROY, rsp.handle);
                pthread_mutex_unlock(&d->lock);
                free(srq);
                return err;
        }
        srq->dev = d;
        srq->h = rsp.handle;
        srq->ring = (struct dw_ipc_ring *)((uint8_t *)srq->map + rsp.u.srq.ring.off);
        srq->entries = rsp.u.srq.ring.entries;
        srq->esize = rsp.u.srq.ring.entry_size;
        srq->attr = rsp.u.srq.attr;
        srq->context = srq_context;
        pthread_mutex_init(&srq->lock, NULL);
        *attr = srq->attr;
        objs_set(d, srq->h, srq);
        pthread_mutex_unlock(&d->lock);
        *out = (struct diwarp_srq *)srq;
        return 0;
}

int dwc_srq_destroy(struct diwarp_srq *s)
{
        struct dwc_srq *srq = (struct dwc_srq *)s;
        struct dwc_dev *d = srq->dev;
        int err = rpc_destroy(d, DW_IPC_SRQ_DESTROY, srq->h);
        if (err < 0)
                return err;
        munmap(srq->map, srq->map_len);
        pthread_mutex_destroy(&srq->lock);
        free(srq);
        return 0;
}

int dwc_srq_modify(struct diwarp_srq *s, const struct diwarp_srq_attr *attr, int mask)
{
        struct dwc_srq *srq = (struct dwc_srq *)s;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_SRQ_MODIFY, srq->h);
        req.u.srqm.attr = *attr;
        req.u.srqm.mask = mask;
        return rpc(srq->dev, &req, &rsp);
}

int dwc_srq_query(struct diwarp_srq *s, struct diwarp_srq_attr *attr)
{
        struct dwc_srq *srq = (struct dwc_srq *)s;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_SRQ_QUERY, srq->h);
        int err = rpc(srq->dev, &req, &rsp);
        if (err == 0)
                *attr = rsp.u.srq_attr;
        return err;
}

int dwc_post_srq_recv(struct diwarp_srq *s, struct diwarp_recv_wr *wr,
                      struct diwarp_recv_wr **bad_wr)
{
        struct dwc_srq *srq = (struct dwc_srq *)s;
        if (atomic_load(&srq->dev->dead)) {
                if (bad_wr)
                        *bad_wr = wr;
                return -EIO;
        }
        pthread_mutex_lock(&srq->lock);
        uint32_t outstanding = srq->prod - atomic_load_explicit(&srq->done, memory_order_relaxed);
        int err = post_recv_ring(srq->dev, srq->ring, srq->entries, srq->esize, srq->attr.max_sge,
                                 srq->attr.max_wr, &srq->prod, outstanding, NULL, wr, bad_wr);
        pthread_mutex_unlock(&srq->lock);
        return err;
}

int dwc_ah_create(struct diwarp_pd *p, const union diwarp_gid *dgid, struct diwarp_ah **out)
{
        struct dwc_pd *pd = (struct dwc_pd *)p;
        struct dwc_ah *ah = calloc(1, sizeof(*ah));
        if (!ah)
                return -ENOMEM;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_AH_CREATE, 0);
        req.u.ah.pd = pd->h;
        req.u.ah.dgid = *dgid;
        int err = rpc(pd->dev, &req, &rsp);
        if (err < 0) {
                free(ah);
                return err;
        }
        ah->dev = pd->dev;
        ah->h = rsp.handle;
        *out = (struct diwarp_ah *)ah;
        return 0;
}

int dwc_ah_destroy(struct diwarp_ah *a)
{
        struct dwc_ah *ah = (struct dwc_ah *)a;
        int err = rpc_destroy(ah->dev, DW_IPC_AH_DESTROY, ah->h);
        if (err < 0)
                return err;
        free(ah);
        return 0;
}

/* ---- events, counters --------------------------------------------------------------- */

int dwc_async_fd(struct diwarp_device *dv)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        return d->ev_sock;
}

int dwc_get_async_event(struct diwarp_device *dv, struct diwarp_async_event *ev)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        struct dw_ipc_event m;
        ssize_t n;
        do
                n = recv(d->ev_sock, &m, sizeof(m), 0);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        memset(ev, 0, sizeof(*ev));
        if (n == 0) {
                pthread_mutex_lock(&d->lock);
                dev_fatal(d);
                bool told = d->fatal_told;
                d->fatal_told = true;
                pthread_mutex_unlock(&d->lock);
                if (told)
                        return -EIO;
                ev->event_type = DIWARP_EVENT_DEVICE_FATAL;
                return 0;
        }
        if ((size_t)n != sizeof(m))
                return -EPROTO;
        ev->event_type = m.type;
        pthread_mutex_lock(&d->lock);
        void *obj = m.kind == DW_IPC_EV_DEV ? NULL : objs_get(d, m.handle);
        pthread_mutex_unlock(&d->lock);
        if (m.kind == DW_IPC_EV_QP) {
                ev->element.qp = obj;
                struct dwc_qp *qp = obj;
                if (qp && (m.type == DIWARP_EVENT_QP_FATAL || m.type == DIWARP_EVENT_QP_REQ_ERR ||
                           m.type == DIWARP_EVENT_QP_ACCESS_ERR))
                        qp->state = DIWARP_QPS_ERR;
        } else if (m.kind == DW_IPC_EV_CQ) {
                ev->element.cq = obj;
        } else if (m.kind == DW_IPC_EV_SRQ) {
                ev->element.srq = obj;
        }
        if (m.kind != DW_IPC_EV_DEV && !obj)
                return -EAGAIN; /* its object is gone */
        return 0;
}

static int counters(struct dwc_dev *d, uint32_t h, struct diwarp_counters *out)
{
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_COUNTERS, h);
        int err = rpc(d, &req, &rsp);
        if (err == 0)
                *out = rsp.u.ctr;
        return err;
}

int dwc_device_counters(struct diwarp_device *dv, struct diwarp_counters *out)
{
        return counters((struct dwc_dev *)dv, 0, out);
}

int dwc_qp_counters(struct diwarp_qp *q, struct diwarp_counters *out)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        return counters(qp->dev, qp->h, out);
}

/* The daemon's QP as the engine's would be listed, composed of the answers
 * the daemon gives for it (no request of its own). */
int dwc_qp_stat(struct diwarp_qp *q, struct diwarpdv_qp_stat *out)
{
        struct diwarp_qp_attr attr;
        struct diwarp_qp_init_attr init;
        struct diwarp_counters ctr;
        int err = dwc_qp_query(q, &attr, &init);
        if (err == 0)
                err = dwc_qp_counters(q, &ctr);
        if (err)
                return err;
        memset(out, 0, sizeof(*out));
        out->pid = (int32_t)getpid();
        out->qpn = ((struct dwc_qp *)q)->qpn;
        out->type = init.qp_type;
        out->state = attr.qp_state;
        if (init.qp_type == DIWARP_QPT_RC || init.qp_type == DIWARP_QPT_UC) {
                out->peer_qpn = attr.dest_qp_num;
                out->peer = attr.dgid;
        }
        out->tx_packets = ctr.tx_packets;
        out->tx_bytes = ctr.tx_bytes;
        out->rx_packets = ctr.rx_packets;
        out->rx_bytes = ctr.rx_bytes;
        out->retransmits = ctr.retransmits;
        out->rnr_naks = ctr.rnr_naks;
        return 0;
}

int dwc_query_rd_path(struct diwarp_qp *q, const struct diwarpdv_rd_dest *dest,
                      struct diwarpdv_rd_path *out)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_RD_PATH, qp->h);
        if (dest) {
                req.u.path.ah = dest->ah ? ((struct dwc_ah *)dest->ah)->h : 0;
                req.u.path.remote_qpn = dest->remote_qpn;
                req.u.path.remote_qkey = dest->remote_qkey;
        }
        int err = rpc(qp->dev, &req, &rsp);
        if (err == 0)
                *out = rsp.u.path;
        return err;
}

/* ---- connection management (rdma_cm) ------------------------------------------ */

int dwc_listen(struct diwarp_device *dv, uint16_t port, int backlog, struct diwarp_listener **out)
{
        struct dwc_dev *d = (struct dwc_dev *)dv;
        struct dw_ipc_req req;
        req_init(&req, DW_IPC_LISTEN, 0);
        req.u.listen.port = port;
        req.u.listen.backlog = backlog;
        return fdobj_create(d, &req, (struct dwc_fdobj **)out);
}

int dwc_listener_destroy(struct diwarp_listener *ls)
{
        return fdobj_destroy((struct dwc_fdobj *)ls, DW_IPC_LISTENER_DESTROY);
}

int dwc_listener_fd(const struct diwarp_listener *ls)
{
        const struct dwc_fdobj *l = (const struct dwc_fdobj *)ls;
        return l->fd;
}

/* The daemon never waits for a request (its server serves every client):
 * we ask, and between asks sleep on the listener's socket, at most 1 ms
 * (the MPA Request follows the TCP connection it saw). */
int dwc_listener_get_request(struct diwarp_listener *ls, int timeout_ms,
                             struct diwarp_conn_request *out)
{
        struct dwc_fdobj *l = (struct dwc_fdobj *)ls;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
                struct dw_ipc_req req;
                struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
                if (!rsp)
                        return -ENOMEM;
                req_init(&req, DW_IPC_GET_REQUEST, l->h);
                int err = rpc(l->dev, &req, rsp);
                if (err == 0)
                        *out = rsp->u.creq;
                free(rsp);
                if (err != -EAGAIN)
                        return err;
                struct timespec t;
                clock_gettime(CLOCK_MONOTONIC, &t);
                long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
                if (timeout_ms >= 0 && el >= timeout_ms)
                        return timeout_ms == 0 ? -EAGAIN : -ETIMEDOUT;
                struct pollfd p = {.fd = l->fd, .events = POLLIN};
                poll(&p, 1, 1);
        }
}

static void conn_fill(struct dw_ipc_conn *c, const struct diwarp_conn_param *p)
{
        if (!p)
                return;
        c->ird = p->ird;
        c->ord = p->ord;
        if (p->sgid) {
                c->has_sgid = 1;
                c->sgid = *p->sgid;
        }
        c->pd_len = p->private_data_len;
        if (p->private_data && p->private_data_len <= DIWARP_MAX_PRIVATE_DATA)
                memcpy(c->pd, p->private_data, p->private_data_len);
}

int dwc_accept(struct diwarp_listener *ls, uint64_t request_id, struct diwarp_qp *q,
               const struct diwarp_conn_param *reply)
{
        struct dwc_fdobj *l = (struct dwc_fdobj *)ls;
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dw_ipc_req req;
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        if (!rsp)
                return -ENOMEM;
        req_init(&req, DW_IPC_ACCEPT, 0);
        req.u.conn.listener = l->h;
        req.u.conn.qp = qp->h;
        req.u.conn.request_id = request_id;
        conn_fill(&req.u.conn, reply);
        pthread_mutex_lock(&l->dev->lock);
        int err = rpc_wait(l->dev, &req, NULL, 0, rsp, NULL, NULL, CM_TIMEOUT_MS);
        pthread_mutex_unlock(&l->dev->lock);
        free(rsp);
        if (err == 0)
                qp->state = DIWARP_QPS_RTS;
        return err;
}

int dwc_reject(struct diwarp_listener *ls, uint64_t request_id, const void *private_data,
               uint16_t private_data_len)
{
        struct dwc_fdobj *l = (struct dwc_fdobj *)ls;
        struct dw_ipc_req req;
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        if (!rsp)
                return -ENOMEM;
        req_init(&req, DW_IPC_REJECT, 0);
        req.u.conn.listener = l->h;
        req.u.conn.request_id = request_id;
        req.u.conn.pd_len = private_data_len;
        if (private_data)
                memcpy(req.u.conn.pd, private_data, private_data_len);
        pthread_mutex_lock(&l->dev->lock);
        int err = rpc_wait(l->dev, &req, NULL, 0, rsp, NULL, NULL, CM_TIMEOUT_MS);
        pthread_mutex_unlock(&l->dev->lock);
        free(rsp);
        return err;
}

int dwc_connect(struct diwarp_qp *q, const union diwarp_gid *dgid, uint16_t port,
                const struct diwarp_conn_param *param, int timeout_ms, void *reply_pd,
                uint16_t *reply_pd_len)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        uint16_t cap = reply_pd_len ? *reply_pd_len : 0;
        if (reply_pd_len)
                *reply_pd_len = 0;
        struct dw_ipc_req req;
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        if (!rsp)
                return -ENOMEM;
        req_init(&req, DW_IPC_CONNECT, 0);
        req.u.conn.qp = qp->h;
        req.u.conn.dgid = *dgid;
        req.u.conn.port = port;
        req.u.conn.timeout_ms = timeout_ms;
        conn_fill(&req.u.conn, param);
        /* The daemon answers when the connect ends, within its own timeout. */
        int wait = timeout_ms >= 0 ? timeout_ms + CM_TIMEOUT_MS : CM_TIMEOUT_MS * 4;
        pthread_mutex_lock(&qp->dev->lock);
        int err = rpc_wait(qp->dev, &req, NULL, 0, rsp, NULL, NULL, wait);
        pthread_mutex_unlock(&qp->dev->lock);
        if ((err == 0 || err == -ECONNREFUSED) && reply_pd && reply_pd_len) {
                uint16_t n = rsp->u.reply_pd.len < cap ? rsp->u.reply_pd.len : cap;
                if (n > DIWARP_MAX_PRIVATE_DATA)
                        n = DIWARP_MAX_PRIVATE_DATA;
                memcpy(reply_pd, rsp->u.reply_pd.data, n);
                *reply_pd_len = n;
        }
        free(rsp);
        if (err == 0)
                qp->state = DIWARP_QPS_RTS;
        return err;
}

int dwc_disconnect(struct diwarp_qp *q)
{
        struct dwc_qp *qp = (struct dwc_qp *)q;
        struct dw_ipc_req req;
        struct dw_ipc_rsp rsp;
        req_init(&req, DW_IPC_DISCONNECT, qp->h);
        return rpc(qp->dev, &req, &rsp);
}

/* ---- a lost daemon ---------------------------------------------------------------- */

static void flush_track(struct dwc_qp *qp, struct dwc_track *t, struct dwc_cq *cq, bool recv)
{
        if (!cq)
                return;
        pthread_mutex_lock(&cq->lock);
        for (uint32_t i = t->retired; i != t->posted; i++) {
                if (recv && t->op[i & t->mask])
                        continue;
                struct diwarp_wc wc = {.wr_id = t->wr_id[i & t->mask],
                                       .status = DIWARP_WC_WR_FLUSH_ERR,
                                       .opcode = recv ? DIWARP_WC_RECV
                                                      : (enum diwarp_wc_opcode)t->op[i & t->mask],
                                       .qp_num = qp->qpn};
                flushed_push(cq, &wc);
        }
        t->retired = t->posted;
        pthread_mutex_unlock(&cq->lock);
}

static void dev_fatal_lock(struct dwc_dev *d)
{
        pthread_mutex_lock(&d->lock);
        dev_fatal(d);
        pthread_mutex_unlock(&d->lock);
}

static void dev_fatal(struct dwc_dev *d)
{
        bool was = atomic_exchange(&d->dead, true);
        if (was)
                return;
        dw_err("daemon: the connection to diwarpd was lost: device port %u is gone, every QP "
               "is in ERR, outstanding WRs complete with WR_FLUSH_ERR",
               d->info.port);
        for (uint32_t i = 0; i < QPN_SLOTS; i++) {
                struct dwc_qp *qp = d->by_qpn[i];
                if (!qp)
                        continue;
                pthread_mutex_lock(&qp->sq_lock);
                pthread_mutex_lock(&qp->rq_lock);
                /* What the application has not seen yet stays first in its
                 * CQ's ring; the flushes follow it. */
                flush_track(qp, &qp->st, qp->send_cq, false);
                if (!qp->srq)
                        flush_track(qp, &qp->rt, qp->recv_cq, true);
                qp->state = DIWARP_QPS_ERR;
                pthread_mutex_unlock(&qp->rq_lock);
                pthread_mutex_unlock(&qp->sq_lock);
        }
}

/* ---- what client mode does not offer ---------------------------------------- */

int dwc_device_rails(struct diwarp_device *dev, struct diwarp_rail_stats *out, int max)
{
        (void)dev, (void)out, (void)max;
        return -EOPNOTSUPP; /* the daemon's rails are not the client's to read */
}

int dwc_progress_thread_start(struct diwarp_device *dev)
{
        (void)dev;
        return 0; /* the daemon makes the progress */
}

int dwc_mr_rereg(struct diwarp_mr *mr, int flags, struct diwarp_pd *pd, void *addr, size_t length,
                 uint64_t iova, int access)
{
        (void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)iova, (void)access;
        return unsupported("diwarp_mr_rereg");
}

int dwc_mw_alloc(struct diwarp_pd *pd, enum diwarp_mw_type type, struct diwarp_mw **out)
{
        (void)pd, (void)type, (void)out;
        return unsupported("memory windows");
}

int dwc_mw_dealloc(struct diwarp_mw *mw)
{
        (void)mw;
        return unsupported("memory windows");
}

int dwc_mw_info(const struct diwarp_mw *mw, struct diwarp_mw_info *info)
{
        (void)mw, (void)info;
        return unsupported("memory windows");
}

int dwc_mw_bind(struct diwarp_qp *qp, struct diwarp_mw *mw, uint32_t rkey,
                const struct diwarp_mw_bind_info *info, uint64_t wr_id, unsigned int send_flags)
{
        (void)qp, (void)mw, (void)rkey, (void)info, (void)wr_id, (void)send_flags;
        return unsupported("memory windows");
}

int dwc_cq_resize(struct diwarp_cq *cq, int cqe)
{
        (void)cq, (void)cqe;
        return unsupported("diwarp_cq_resize");
}

int dwc_cq_set_timestamps(struct diwarp_cq *cq, bool on)
{
        (void)cq, (void)on;
        return unsupported("CQ timestamps");
}

int dwc_mbox_open(struct diwarp_qp *qp, struct diwarpdv_mbox *out)
{
        (void)qp, (void)out;
        return unsupported("the application mailbox");
}

int dwc_external_progress(struct diwarp_device *dev)
{
        (void)dev;
        return unsupported("diwarpdv_external_progress");
}

int dwc_external_timeout(struct diwarp_device *dev, int64_t *ns)
{
        (void)dev, (void)ns;
        return unsupported("diwarpdv_external_timeout");
}

int dwc_external_run(struct diwarp_device *dev)
{
        (void)dev;
        return unsupported("diwarpdv_external_run");
}

int dwc_mbox_release(struct diwarp_qp *qp, const void *msg)
{
        (void)qp, (void)msg;
        return unsupported("the application mailbox");
}

/* ---- tools --------------------------------------------------------------------- */

static int tool_rpc(unsigned int op, uint32_t handle, struct dw_ipc_rsp *rsp)
{
        int s = connect_daemon();
        if (s < 0)
                return s;
        struct dwc_dev d = {.sock = s, .lock = PTHREAD_MUTEX_INITIALIZER};
        struct dw_ipc_req req;
        req_init(&req, op, handle);
        int err = rpc_locked(&d, &req, NULL, 0, rsp, NULL, NULL);
        close(s);
        return err;
}

int dwc_daemon_stat(struct dw_ipc_stat_rsp *out)
{
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        if (!rsp)
                return -ENOMEM;
        int err = tool_rpc(DW_IPC_STAT, 0, rsp);
        if (err == 0)
                *out = rsp->u.stat;
        free(rsp);
        return err;
}

int dwc_daemon_stat_qps(uint32_t first, struct dw_ipc_stat_qps_rsp *out)
{
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        if (!rsp)
                return -ENOMEM;
        int err = tool_rpc(DW_IPC_STAT_QPS, first, rsp);
        if (err == 0)
                *out = rsp->u.qps;
        free(rsp);
        return err;
}

int dwc_daemon_shutdown(void)
{
        struct dw_ipc_rsp *rsp = calloc(1, sizeof(*rsp));
        if (!rsp)
                return -ENOMEM;
        int err = tool_rpc(DW_IPC_SHUTDOWN, 0, rsp);
        free(rsp);
        return err;
}
