/* librdmacm public API over diwarp's connection management (see rdmacm.h).
 *
 * Locking: one mutex (g.lock) guards every id, channel queue and the id list.
 * Engine calls that may block (diwarp_connect, diwarp_accept, a listener's
 * get_request with a timeout) run without it. g.lock is taken before any
 * engine lock, never after, and the engine never calls back into this file.
 *
 * Lifetime: an id is reference counted (the application's handle, every
 * queued or unacknowledged event naming it, children pointing at their
 * listener, the helper thread while it works on it). rdma_destroy_id drops
 * the application's reference and purges events not yet retrieved; memory
 * goes when the last reference does, so a late rdma_ack_cm_event is safe.
 */
#define _GNU_SOURCE
#include "rdmacm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_verbs.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "provider.h"

#define RCM_SYMVER(impl, name, ver) DWV_SYMVER(impl, name, ver)

/* Helper-thread tick while listeners or connections exist: bounds how late a
 * peer's close becomes DISCONNECTED and how late a straggling MPA Request is
 * seen. */
#define RCM_TICK_MS 10
/* How long the helper waits for the MPA Request (or UD request) once a TCP
 * connection shows up on a listener. */
#define RCM_REQ_WAIT_MS 50
/* UD exchange: how long the active side waits for the reply. */
#define RCM_UD_TIMEOUT_MS 10000
/* Smallest inline size of a QP made by rdma_create_qp (see there). */
#define RCM_MIN_INLINE 64

enum rcm_state {
        RCM_IDLE,
        RCM_BOUND,
        RCM_ADDR,
        RCM_ROUTE,
        RCM_LISTEN,
        RCM_REQ, /* passive child: request delivered, not yet accepted/rejected */
        RCM_CONNECTING,
        RCM_CONNECTED,
        RCM_DISCONNECTED,
};

/* Longest rdma_destroy_id waits for the id's events to be acked. */
#define RCM_DESTROY_WAIT_S 5

struct rcm_chan {
        struct rdma_event_channel ch; /* first: the application's pointer */
        struct rcm_evt *head, *tail;
        bool internal; /* a synchronous id's own channel (rcm_id.own_chan) */
        /* Threads inside rdma_get_cm_event: a channel destroyed under them is
         * marked dead and freed by the last one out (g.lock). */
        int readers;
        bool dead;
        struct rcm_chan *live_next; /* g.chans: not destroyed yet */
};

struct rcm_id;

struct rcm_evt {
        struct rdma_cm_event ev; /* first: the application's pointer */
        struct rcm_evt *next;
        struct rcm_id *owner;  /* ev.id */
        struct rcm_id *listen; /* ev.listen_id (CONNECT_REQUEST) */
        uint8_t pd[RCM_PD_MAX];
};

/* librdmacm's rsocket code is compiled into librdmacm: besides the public
 * calls, which reach ours, it calls three internal functions of the library
 * directly on our ids (ucma_complete, ucma_max_qpsize, ucma_shutdown). They
 * read the fields that follow the public struct in librdmacm's private id
 * (struct cma_id_private, the same from rdma-core v25 to today): a pointer to
 * the library's device record, then after two words and two ints the flag
 * of a synchronous id. This block stands in that place. */
struct rcm_lib_view {
        void *cma_dev;        /* always NULL: ucma_max_qpsize then asks the
                               * library's own device list (diwarp0's max_qp_wr) */
        void *connect;        /* unused */
        size_t connect_len;   /* unused */
        int events_completed; /* unused */
        int connect_error;    /* unused */
        int sync;             /* created without a channel: each step completes on the id's
                               * own channel (sync_complete; ucma_complete reads it too) */
};

struct rcm_id {
        struct rdma_cm_id id;    /* first: the application's pointer */
        struct rcm_lib_view lib; /* second: where librdmacm looks (above) */
        struct rcm_id *next;     /* g.ids */
        int refs;
        bool destroyed;
        enum rcm_state state;
        struct rcm_chan *own_chan;  /* synchronous id: its channel (id.channel) */
        struct diwarp_listener *l;  /* RC listener */
        int ud_lfd;                 /* UD listener socket */
        int port_fd;                /* holds the port rdma_bind_addr chose, until listen */
        struct rcm_id *parent;      /* passive child: its listener */
        uint64_t req_id;            /* RC child: diwarp request id */
        int ud_fd;                  /* UD child: the request's socket */
        uint8_t peer_ird, peer_ord; /* from the request / reply */
        int busy;                   /* connect in progress (thread or caller) */
        int events_out;             /* events handed out by rdma_get_cm_event, not acked */
        bool polling;               /* the helper thread is using l / ud_lfd */
        uint32_t qpn;               /* connected RC QP (looked up, never dereferenced:
                                     * programs destroy QPs with ibv_destroy_qp) */
        bool disc_posted;
        bool own_cqs;                     /* rdma_create_qp made the CQs/channels */
        struct ibv_qp_init_attr *ep_attr; /* passive rdma_create_ep: QP per request */
        struct rcm_evt *req_event;        /* sync child: its CONNECT_REQUEST (id->event) */
        struct ibv_sa_path_rec path;      /* id.route.path_rec once the route is resolved */
        int ack_timeout; /* RDMA_OPTION_ID_ACK_TIMEOUT for the QP (IB encoding), -1: none */
        int rnr_retry;   /* conn_param->rnr_retry_count of rdma_connect/accept, -1: none yet */
};

_Static_assert(offsetof(struct rcm_id, id) == 0 &&
                   offsetof(struct rcm_id, lib) == sizeof(struct rdma_cm_id) &&
                   offsetof(struct rcm_lib_view, sync) ==
                       2 * sizeof(void *) + sizeof(size_t) + 2 * sizeof(int),
               "struct rcm_id must lay out as librdmacm's private id begins");

static struct {
        pthread_mutex_t lock;
        pthread_cond_t cond; /* busy counts dropped */
        struct rcm_id *ids;
        /* Channels not destroyed yet: rdma_get_cm_event looks its argument up
         * here before touching it (a program's event thread may call it once
         * more after rdma_destroy_event_channel freed the channel). */
        struct rcm_chan *chans;
        bool worker_started;
        int wake_fd;
        struct ibv_context *ctx; /* the one diwarp0 context rdma_cm uses */
        struct ibv_pd *pd;       /* default PD (rdma_create_ep/qp with pd NULL) */
        struct in_addr addr;     /* the device's IPv4 address (GID index 0) */
        int ngid;                /* the device's GID table: its addresses */
        struct diwarp_netif gids[DIWARP_MAX_GIDS];
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
    .wake_fd = -1,
};

static int fail(int err)
{
        errno = err;
        return -1;
}

static struct rcm_id *rid_of(struct rdma_cm_id *id)
{
        return (struct rcm_id *)id;
}

/* The id an application hands in, if it is one of ours and not destroyed: a
 * stale or stray pointer gets EINVAL and a log line instead of a crash
 * (perftest -R retried with such a pointer after a refused connect). Walks
 * the ids without touching *id. Takes g.lock: call it without. */
static struct rcm_id *live_rid(struct rdma_cm_id *id, const char *verb)
{
        struct rcm_id *found = NULL;
        pthread_mutex_lock(&g.lock);
        for (struct rcm_id *r = g.ids; r && !found; r = r->next)
                if (&r->id == id && !r->destroyed)
                        found = r;
        pthread_mutex_unlock(&g.lock);
        if (!found)
                diwarpdv_warn(
                    "rdma_cm: %s: %p is not a live rdma_cm id of this process (destroyed, "
                    "or never created)",
                    verb, (void *)id);
        return found;
}

/* ---- the device ---------------------------------------------------------- */

/* Opens diwarp0 once: every id's verbs, rdma_get_devices and the default PD
 * share this context (librdmacm refuses a PD of another context). g.lock held. */
static struct ibv_context *rcm_ctx_locked(void)
{
        if (g.ctx)
                return g.ctx;
        struct ibv_context *ctx = ibv_open_device(&dwv_device()->device);
        if (!ctx)
                return NULL;
        union diwarp_gid gid;
        if (diwarp_device_gid(dwv_ctx(ctx)->dev, &gid) < 0) {
                ibv_close_device(ctx);
                errno = ENODEV;
                return NULL;
        }
        memcpy(&g.addr, &gid.raw[12], 4);
        int n = diwarp_device_gid_table(dwv_ctx(ctx)->dev, g.gids, DIWARP_MAX_GIDS);
        g.ngid = n > 0 ? (n < DIWARP_MAX_GIDS ? n : DIWARP_MAX_GIDS) : 0;
        dwv_ctx(ctx)->keep_open = true;
        g.pd = ibv_alloc_pd(ctx);
        g.ctx = ctx;
        return ctx;
}

static struct ibv_context *rcm_ctx(void)
{
        pthread_mutex_lock(&g.lock);
        struct ibv_context *c = rcm_ctx_locked();
        pthread_mutex_unlock(&g.lock);
        return c;
}

/* The device answers at a: an address of its GID table. g.lock held, the
 * context open. */
static bool dev_has_addr(struct in_addr a)
{
        for (int i = 0; i < g.ngid; i++)
                if (g.gids[i].addr == a.s_addr)
                        return true;
        return false;
}

/* The address of ours an id bound to a takes: a itself when the device has
 * it; a loopback address it does not have maps to its loopback entry (or,
 * on a device pinned to one address, to that address), as the kernel binds
 * loopback to an RDMA device. INADDR_NONE when the device is not there.
 * g.lock held. */
static struct in_addr dev_local_addr(struct in_addr a)
{
        if (dev_has_addr(a))
                return a;
        struct in_addr none = {.s_addr = INADDR_NONE};
        if ((ntohl(a.s_addr) >> 24) != 127)
                return none;
        for (int i = 0; i < g.ngid; i++)
                if (g.gids[i].loopback || (ntohl(g.gids[i].addr) >> 24) == 127)
                        return (struct in_addr){.s_addr = g.gids[i].addr};
        return g.addr;
}

/* The source address of ours towards dst, as the kernel's routing picks it
 * (a connected UDP socket's local address, no datagram sent); GID index 0
 * when that is not an address of the device (pinned elsewhere). */
static struct in_addr route_src(struct in_addr dst)
{
        struct in_addr src = g.addr;
        if (g.ngid <= 1)
                return src;
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return src;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = dst, .sin_port = htons(9)};
        socklen_t sl = sizeof(sa);
        if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
            getsockname(s, (struct sockaddr *)&sa, &sl) == 0 && dev_has_addr(sa.sin_addr))
                src = sa.sin_addr;
        close(s);
        return src;
}

static void gid_of(struct in_addr a, union ibv_gid *gid)
{
        memset(gid, 0, sizeof(*gid));
        gid->raw[10] = gid->raw[11] = 0xff;
        memcpy(&gid->raw[12], &a, 4);
}

/* An IPv4 address out of a sockaddr (AF_INET, or IPv4-mapped / any AF_INET6).
 * -EAFNOSUPPORT otherwise. */
static int sa_ipv4(const struct sockaddr *sa, struct in_addr *a, uint16_t *port_be)
{
        if (!sa)
                return -EINVAL;
        if (sa->sa_family == AF_INET) {
                const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
                *a = s->sin_addr;
                *port_be = s->sin_port;
                return 0;
        }
        if (sa->sa_family == AF_INET6) {
                const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
                if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) {
                        memcpy(a, &s->sin6_addr.s6_addr[12], 4);
                } else if (IN6_IS_ADDR_UNSPECIFIED(&s->sin6_addr)) {
                        a->s_addr = INADDR_ANY;
                } else if (IN6_IS_ADDR_LOOPBACK(&s->sin6_addr)) {
                        a->s_addr = htonl(INADDR_LOOPBACK);
                } else {
                        return -EAFNOSUPPORT;
                }
                *port_be = s->sin6_port;
                return 0;
        }
        return -EAFNOSUPPORT;
}

static void set_sin(struct sockaddr_storage *ss, struct in_addr a, uint16_t port_be)
{
        struct sockaddr_in *s = (struct sockaddr_in *)ss;
        memset(ss, 0, sizeof(*ss));
        s->sin_family = AF_INET;
        s->sin_addr = a;
        s->sin_port = port_be;
}

static uint16_t src_port_be(const struct rcm_id *r)
{
        const struct sockaddr *sa = &r->id.route.addr.src_addr;
        if (sa->sa_family == AF_INET)
                return ((const struct sockaddr_in *)sa)->sin_port;
        if (sa->sa_family == AF_INET6)
                return ((const struct sockaddr_in6 *)sa)->sin6_port;
        return 0;
}

static void set_src_port_be(struct rcm_id *r, uint16_t port_be)
{
        struct sockaddr *sa = &r->id.route.addr.src_addr;
        if (sa->sa_family == AF_INET6)
                ((struct sockaddr_in6 *)sa)->sin6_port = port_be;
        else
                ((struct sockaddr_in *)sa)->sin_port = port_be;
}

static uint16_t dst_port_be(const struct rcm_id *r)
{
        const struct sockaddr *sa = &r->id.route.addr.dst_addr;
        if (sa->sa_family == AF_INET)
                return ((const struct sockaddr_in *)sa)->sin_port;
        if (sa->sa_family == AF_INET6)
                return ((const struct sockaddr_in6 *)sa)->sin6_port;
        return 0;
}

static void gid_of(struct in_addr a, union ibv_gid *gid);

/* Fills verbs, port and the IB-address block of an id on the device whose
 * address is src. g.lock held. */
static void attach_device(struct rcm_id *r, struct in_addr src)
{
        r->id.verbs = g.ctx;
        /* As librdmacm: an id on a device has that device's PD, so
         * rdma_reg_msgs() works before any QP exists (rsockets registers its
         * datagram buffers right after rdma_bind_addr). */
        if (!r->id.pd)
                r->id.pd = g.pd;
        r->id.port_num = 1;
        gid_of(src, &r->id.route.addr.addr.ibaddr.sgid);
        r->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
}

/* The RTS attributes an InfiniBand CM gives a QP (rdma_init_qp_attr's RTS
 * step) that mean something here: the id's ACK timeout (rdma_set_option)
 * and the RNR retry count of its connection parameters, which says how
 * often a Send from the peer that finds no receive here may be retried. RC
 * over TCP holds its stream that long before it terminates
 * (libdiwarp/rc/rc_rx.c, rx_wait_for_recv), so the count is this QP's own.
 * Fills `a`; returns the mask, 0 when the id set neither. */
static int rts_attrs(const struct rcm_id *r, struct ibv_qp_attr *a)
{
        int mask = 0;
        if (r->ack_timeout >= 0) {
                a->timeout = (uint8_t)r->ack_timeout;
                mask |= IBV_QP_TIMEOUT;
        }
        if (r->rnr_retry >= 0) {
                a->rnr_retry = (uint8_t)r->rnr_retry;
                mask |= IBV_QP_RNR_RETRY;
        }
        return mask;
}

/* The QP takes rts_attrs once the CM made it ready. No lock held. */
static void apply_rts_attrs(const struct rcm_id *r, struct ibv_qp *qp)
{
        struct ibv_qp_attr a = {0};
        int mask = rts_attrs(r, &a);
        if (!mask || !qp || qp->state != IBV_QPS_RTS)
                return;
        int err = ibv_modify_qp(qp, &a, mask);
        if (err)
                diwarpdv_warn("rdma_cm: QP %#x: ACK timeout %d, RNR retry %d: %s", qp->qp_num,
                              r->ack_timeout, r->rnr_retry, strerror(err));
}

/* ---- ids, events, channels ----------------------------------------------- */

static void free_id(struct rcm_id *r);

static void put_locked(struct rcm_id *r)
{
        if (r && --r->refs == 0)
                free_id(r);
}

static void evt_free_locked(struct rcm_evt *e)
{
        put_locked(e->owner);
        put_locked(e->listen);
        free(e);
}

/* Queues an event on chan (NULL: the program destroyed the id's channel, drop).
 * g.lock held. Returns the event (for a sync child's id->event) or NULL. */
static struct rcm_evt *post_locked(struct rcm_chan *chan, struct rcm_id *owner,
                                   struct rcm_id *listen, enum rdma_cm_event_type type, int status,
                                   const void *pd, size_t pd_len)
{
        if (!chan || owner->destroyed)
                return NULL;
        struct rcm_evt *e = calloc(1, sizeof(*e));
        if (!e) {
                diwarpdv_warn("rdma_cm: out of memory queueing %s", rdma_event_str(type));
                return NULL;
        }
        if (pd_len > RCM_PD_MAX)
                pd_len = RCM_PD_MAX;
        if (pd && pd_len)
                memcpy(e->pd, pd, pd_len);
        e->ev.id = &owner->id;
        e->ev.listen_id = listen ? &listen->id : NULL;
        e->ev.event = type;
        e->ev.status = status;
        e->ev.param.conn.private_data = pd_len ? e->pd : NULL;
        e->ev.param.conn.private_data_len = (uint8_t)pd_len;
        e->owner = owner;
        e->listen = listen;
        owner->refs++;
        if (listen)
                listen->refs++;
        if (chan->tail)
                chan->tail->next = e;
        else
                chan->head = e;
        chan->tail = e;
        uint64_t one = 1;
        if (write(chan->ch.fd, &one, sizeof(one)) != sizeof(one))
                diwarpdv_warn("rdma_cm: event channel fd %d: %s", chan->ch.fd, strerror(errno));
        diwarpdv_dbg("rdma_cm[%d]: id %p: %s status %d", (int)getpid(), (void *)&owner->id,
                     rdma_event_str(type), status);
        return e;
}

static struct rcm_chan *chan_of(struct rcm_id *r)
{
        return (struct rcm_chan *)r->id.channel;
}

/* Takes one count off a channel's eventfd if it has one (never blocks: an
 * application thread may race us to it). */
static void chan_uncount(struct rcm_chan *c)
{
        /* A thread inside rdma_get_cm_event takes the count itself (and, finding
         * no event, waits on): a read here could then block, under g.lock,
         * on a count that thread consumed between poll and read. */
        if (c->readers > 0)
                return;
        struct pollfd p = {.fd = c->ch.fd, .events = POLLIN};
        uint64_t v;
        if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN))
                (void)!read(c->ch.fd, &v, sizeof(v));
}

/* Unlinks the events of chan that match (owner or listen == r). g.lock held.
 * With move_to, they are re-queued there instead of freed. */
static void chan_purge_locked(struct rcm_chan *c, struct rcm_id *r, struct rcm_chan *move_to)
{
        if (!c)
                return;
        struct rcm_evt **pp = &c->head, *prev = NULL;
        while (*pp) {
                struct rcm_evt *e = *pp;
                if (e->owner != r && e->listen != r) {
                        prev = e;
                        pp = &e->next;
                        continue;
                }
                *pp = e->next;
                if (c->tail == e)
                        c->tail = prev;
                e->next = NULL;
                chan_uncount(c);
                if (move_to) {
                        if (move_to->tail)
                                move_to->tail->next = e;
                        else
                                move_to->head = e;
                        move_to->tail = e;
                        uint64_t one = 1;
                        (void)!write(move_to->ch.fd, &one, sizeof(one));
                } else {
                        if (e->listen == r && e->owner != r &&
                            e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST)
                                e->owner->destroyed = true; /* never seen: an orphan */
                        evt_free_locked(e);
                }
        }
}

/* A new channel, on g.chans. g.lock held. */
static struct rcm_chan *chan_new(bool internal)
{
        struct rcm_chan *c = calloc(1, sizeof(*c));
        if (!c)
                return NULL;
        c->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
        if (c->ch.fd < 0) {
                int e = errno;
                free(c);
                errno = e;
                return NULL;
        }
        c->internal = internal;
        if (internal) {
                /* A synchronous id's fd is the number rsockets gives its
                 * socket. librspreload's select() maps its descriptors back to
                 * rsockets by scanning upward from 0 and takes the first
                 * descriptor whose rsocket number matches: an rsocket whose
                 * number is below its own descriptor (an accepted socket:
                 * its id exists before accept() opens the descriptor) is
                 * then reported on the wrong descriptor (iperf3's server
                 * never sees its data). Numbers from the middle of the
                 * descriptor range keep out of that scan. */
                struct rlimit rl;
                int base = 1024;
                if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur / 2 < (rlim_t)base)
                        base = (int)(rl.rlim_cur / 2);
                int hi = base > c->ch.fd ? fcntl(c->ch.fd, F_DUPFD_CLOEXEC, base) : -1;
                if (hi >= 0) {
                        close(c->ch.fd);
                        c->ch.fd = hi;
                }
        }
        c->live_next = g.chans;
        g.chans = c;
        return c;
}

/* Is c a channel not destroyed yet? g.lock held. */
static bool chan_live_locked(const struct rcm_chan *c)
{
        for (const struct rcm_chan *x = g.chans; x; x = x->live_next)
                if (x == c)
                        return true;
        return false;
}

static void chan_free_locked(struct rcm_chan *c)
{
        while (c->head) {
                struct rcm_evt *e = c->head;
                c->head = e->next;
                evt_free_locked(e);
        }
        close(c->ch.fd);
        free(c);
}

/* Destroys a channel. A thread waiting in rdma_get_cm_event on it (a program
 * that exits without stopping its event thread) is woken; it leaves the
 * channel alone from then on and the last one out frees it. g.lock held. */
static void chan_destroy_locked(struct rcm_chan *c)
{
        for (struct rcm_chan **pp = &g.chans; *pp; pp = &(*pp)->live_next)
                if (*pp == c) {
                        *pp = c->live_next;
                        break;
                }
        if (c->readers > 0) {
                c->dead = true;
                uint64_t one = 1;
                (void)!write(c->ch.fd, &one, sizeof(one));
        } else {
                chan_free_locked(c);
        }
}

static void free_id(struct rcm_id *r)
{
        for (struct rcm_id **pp = &g.ids; *pp; pp = &(*pp)->next)
                if (*pp == r) {
                        *pp = r->next;
                        break;
                }
        if (r->l)
                diwarp_listener_destroy(r->l);
        if (r->ud_lfd >= 0)
                close(r->ud_lfd);
        if (r->ud_fd >= 0)
                close(r->ud_fd);
        if (r->port_fd >= 0)
                close(r->port_fd);
        if (r->own_chan)
                chan_destroy_locked(r->own_chan);
        free(r->ep_attr);
        struct rcm_id *parent = r->parent;
        free(r);
        put_locked(parent);
}

static struct rcm_id *id_new_locked(struct rdma_event_channel *ch, void *context,
                                    enum rdma_port_space ps)
{
        struct rcm_id *r = calloc(1, sizeof(*r));
        if (!r)
                return NULL;
        if (!ch) {
                /* A synchronous id gets a channel of its own, as librdmacm
                 * gives it: rsockets polls its fd and uses it as the socket's
                 * number. */
                r->own_chan = chan_new(true);
                if (!r->own_chan) {
                        free(r);
                        return NULL;
                }
                ch = &r->own_chan->ch;
                r->lib.sync = 1;
        }
        r->id.channel = ch;
        r->id.context = context;
        r->id.ps = ps;
        r->id.qp_type = (ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB) ? IBV_QPT_UD : IBV_QPT_RC;
        r->refs = 1;
        r->ud_lfd = r->ud_fd = r->port_fd = -1;
        r->ack_timeout = -1;
        r->rnr_retry = -1;
        r->next = g.ids;
        g.ids = r;
        return r;
}

static bool is_ud(const struct rcm_id *r)
{
        return r->id.qp_type == IBV_QPT_UD;
}

/* Runs fn on the live engine QP numbered qpn of the rdma_cm context, under the
 * context's object lock (ibv_destroy_qp unlinks a QP before freeing it).
 * Returns fn's result, or -ENOENT when the program already destroyed it. */
static int with_qp(uint32_t qpn, int (*fn)(struct ibv_qp *qp, void *arg), void *arg)
{
        if (!g.ctx || !qpn)
                return -ENOENT;
        struct dwv_context *c = dwv_ctx(g.ctx);
        int r = -ENOENT;
        pthread_mutex_lock(&c->objs_lock);
        for (struct dwv_obj_link *l = c->qps.next; l != &c->qps; l = l->next) {
                struct dwv_qp *q = DWV_CONTAINER(l, struct dwv_qp, link);
                if (q->qpx.qp_base.qp_num == qpn) {
                        r = fn(&q->qpx.qp_base, arg);
                        break;
                }
        }
        pthread_mutex_unlock(&c->objs_lock);
        return r;
}

static int qp_failed(struct ibv_qp *qp, void *arg)
{
        (void)arg;
        if (diwarp_qp_state(dwv_qp(qp)->d) != DIWARP_QPS_ERR)
                return 0;
        qp->state = IBV_QPS_ERR;
        return 1;
}

static int qp_disconnect(struct ibv_qp *qp, void *arg)
{
        (void)arg;
        diwarp_disconnect(dwv_qp(qp)->d);
        qp->state = IBV_QPS_ERR;
        return 0;
}

/* ---- helper thread -------------------------------------------------------- */

static void *worker_main(void *arg);

static void wake_worker(void)
{
        if (g.wake_fd >= 0) {
                uint64_t one = 1;
                (void)!write(g.wake_fd, &one, sizeof(one));
        }
}

/* g.lock held. */
static int start_worker_locked(void)
{
        if (g.worker_started) {
                wake_worker();
                return 0;
        }
        g.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (g.wake_fd < 0)
                return -errno;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        int err = pthread_create(&t, &a, worker_main, NULL);
        pthread_attr_destroy(&a);
        if (err) {
                close(g.wake_fd);
                g.wake_fd = -1;
                return -err;
        }
        g.worker_started = true;
        return 0;
}

/* A request arrived on an RC listener: a child id and CONNECT_REQUEST. */
static void rc_request(struct rcm_id *lr, const struct diwarp_conn_request *req)
{
        pthread_mutex_lock(&g.lock);
        if (lr->destroyed || lr->state != RCM_LISTEN) {
                pthread_mutex_unlock(&g.lock);
                diwarp_reject(lr->l, req->id, NULL, 0);
                return;
        }
        struct rcm_id *c =
            id_new_locked(lr->lib.sync ? NULL : lr->id.channel, lr->id.context, lr->id.ps);
        if (!c) {
                pthread_mutex_unlock(&g.lock);
                diwarp_reject(lr->l, req->id, NULL, 0);
                return;
        }
        struct in_addr local;
        memcpy(&local, &req->local_gid.raw[12], 4);
        attach_device(c, local);
        c->id.qp_type = lr->id.qp_type;
        if (lr->id.pd)
                c->id.pd = lr->id.pd;
        set_sin(&c->id.route.addr.src_storage, local, src_port_be(lr));
        struct in_addr peer;
        memcpy(&peer, &req->peer_gid.raw[12], 4);
        set_sin(&c->id.route.addr.dst_storage, peer, htons(req->peer_port));
        gid_of(peer, &c->id.route.addr.addr.ibaddr.dgid);
        c->parent = lr;
        lr->refs++;
        c->req_id = req->id;
        c->peer_ird = req->ird;
        c->peer_ord = req->ord;
        c->state = RCM_REQ;
        struct rcm_evt *e = post_locked(chan_of(lr), c, lr, RDMA_CM_EVENT_CONNECT_REQUEST, 0,
                                        req->private_data, req->private_data_len);
        if (e) {
                /* The requester's ORD bounds our responder resources and its
                 * IRD our initiator depth. */
                e->ev.param.conn.responder_resources = req->ord;
                e->ev.param.conn.initiator_depth = req->ird;
        } else {
                /* Nobody will see it: refuse the request, forget the child. */
                c->destroyed = true;
                c->state = RCM_IDLE;
                put_locked(c);
                pthread_mutex_unlock(&g.lock);
                diwarp_reject(lr->l, req->id, NULL, 0);
                return;
        }
        /* The child keeps its first reference: the application's handle. */
        pthread_mutex_unlock(&g.lock);
}

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
        size_t got = 0;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (got < len) {
                ssize_t n = recv(fd, (char *)buf + got, len - got, MSG_DONTWAIT);
                if (n > 0) {
                        got += (size_t)n;
                        continue;
                }
                if (n == 0)
                        return -ECONNRESET;
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                        return -errno;
                struct timespec t1;
                clock_gettime(CLOCK_MONOTONIC, &t1);
                long el = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
                if (el >= timeout_ms)
                        return -ETIMEDOUT;
                struct pollfd p = {.fd = fd, .events = POLLIN};
                poll(&p, 1, (int)(timeout_ms - el));
        }
        return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
        size_t off = 0;
        while (off < len) {
                ssize_t n = send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN) {
                                struct pollfd p = {.fd = fd, .events = POLLOUT};
                                poll(&p, 1, 1000);
                                continue;
                        }
                        return -errno;
                }
                off += (size_t)n;
        }
        return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
        v = htonl(v);
        memcpy(p, &v, 4);
}

static uint32_t get_be32(const uint8_t *p)
{
        uint32_t v;
        memcpy(&v, p, 4);
        return ntohl(v);
}

/* UD requests being read. A UD connect is a TCP connection that carries
 * one request; a peer that connects and stays silent must not hold the
 * helper thread (every rdma_cm event of the process waits on it), so
 * accepted sockets are read as their bytes come, each within
 * RCM_UD_REQ_TIMEOUT_MS; when all RCM_UD_PENDING places are taken the
 * oldest silent one makes room. The helper thread alone touches them. */
#define RCM_UD_PENDING        64
#define RCM_UD_REQ_TIMEOUT_MS (RCM_REQ_WAIT_MS * 20)

struct rcm_ud_pending {
        int fd;            /* -1: a free place */
        struct rcm_id *lr; /* its listener, referenced */
        struct sockaddr_in peer;
        uint64_t deadline_ns;
        size_t got;
        uint8_t req[RCM_UD_REQ_LEN];
};

static struct rcm_ud_pending ud_pend[RCM_UD_PENDING];
static struct diwarpdv_log_limit ud_log_limit; /* helper thread only */

static void ud_pending_init(void)
{
        for (int i = 0; i < RCM_UD_PENDING; i++)
                ud_pend[i].fd = -1;
}

static void ud_pending_drop(struct rcm_ud_pending *p, const char *why)
{
        if (why) {
                char a[INET_ADDRSTRLEN];
                diwarpdv_warn_limited(
                    &ud_log_limit, "rdma_cm: UD listener port %u: request from %s:%u: %s",
                    ntohs(src_port_be(p->lr)), inet_ntop(AF_INET, &p->peer.sin_addr, a, sizeof(a)),
                    ntohs(p->peer.sin_port), why);
        }
        if (p->fd >= 0)
                close(p->fd);
        p->fd = -1;
        pthread_mutex_lock(&g.lock);
        put_locked(p->lr);
        pthread_mutex_unlock(&g.lock);
        p->lr = NULL;
}

/* A whole request from the socket s (now the child's): a child id and
 * CONNECT_REQUEST (param.ud). */
static void ud_request(struct rcm_id *lr, int s, const struct sockaddr_in *peer_in,
                       const uint8_t *req)
{
        struct sockaddr_in peer = *peer_in;
        pthread_mutex_lock(&g.lock);
        if (lr->destroyed || lr->state != RCM_LISTEN) {
                pthread_mutex_unlock(&g.lock);
                close(s);
                return;
        }
        struct rcm_id *c =
            id_new_locked(lr->lib.sync ? NULL : lr->id.channel, lr->id.context, lr->id.ps);
        if (!c) {
                pthread_mutex_unlock(&g.lock);
                close(s);
                return;
        }
        struct sockaddr_in la;
        socklen_t ll = sizeof(la);
        if (getsockname(s, (struct sockaddr *)&la, &ll) < 0)
                la.sin_addr = g.addr;
        attach_device(c, la.sin_addr);
        c->id.qp_type = IBV_QPT_UD;
        if (lr->id.pd)
                c->id.pd = lr->id.pd;
        set_sin(&c->id.route.addr.src_storage, la.sin_addr, src_port_be(lr));
        set_sin(&c->id.route.addr.dst_storage, peer.sin_addr, peer.sin_port);
        gid_of(peer.sin_addr, &c->id.route.addr.addr.ibaddr.dgid);
        c->parent = lr;
        lr->refs++;
        c->ud_fd = s;
        c->state = RCM_REQ;
        struct rcm_evt *e =
            post_locked(chan_of(lr), c, lr, RDMA_CM_EVENT_CONNECT_REQUEST, 0, req + 12, req[6]);
        if (e) {
                struct rdma_ud_param *u = &e->ev.param.ud;
                u->private_data = req[6] ? e->pd : NULL;
                u->private_data_len = req[6];
                u->ah_attr.is_global = 1;
                u->ah_attr.port_num = 1;
                u->ah_attr.grh.hop_limit = 64;
                gid_of(peer.sin_addr, &u->ah_attr.grh.dgid);
                u->qp_num = get_be32(req + 8);
                u->qkey = RDMA_UDP_QKEY;
        } else {
                c->destroyed = true;
                put_locked(c); /* closes the socket: the requester sees a refusal */
        }
        pthread_mutex_unlock(&g.lock);
}

/* A TCP connection arrived on a UD listener: a place to read its request. */
static void ud_accept(struct rcm_id *lr)
{
        struct sockaddr_in peer;
        socklen_t pl = sizeof(peer);
        int s = accept4(lr->ud_lfd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (s < 0)
                return;
        struct rcm_ud_pending *p = NULL, *oldest = &ud_pend[0];
        for (int i = 0; i < RCM_UD_PENDING && !p; i++) {
                if (ud_pend[i].fd < 0)
                        p = &ud_pend[i];
                else if (ud_pend[i].deadline_ns < oldest->deadline_ns)
                        oldest = &ud_pend[i];
        }
        if (!p) {
                ud_pending_drop(oldest, "closed unfinished to make room (too many UD "
                                        "connects waiting for their requests)");
                p = oldest;
        }
        pthread_mutex_lock(&g.lock);
        lr->refs++;
        pthread_mutex_unlock(&g.lock);
        *p = (struct rcm_ud_pending){.fd = s,
                                     .lr = lr,
                                     .peer = peer,
                                     .deadline_ns = diwarpdv_now_ns() +
                                                    (uint64_t)RCM_UD_REQ_TIMEOUT_MS * 1000000u};
}

/* Reads what a pending request's socket holds; a whole request goes on. */
static void ud_pending_step(struct rcm_ud_pending *p, uint64_t now)
{
        while (p->got < sizeof(p->req)) {
                ssize_t n = recv(p->fd, p->req + p->got, sizeof(p->req) - p->got, MSG_DONTWAIT);
                if (n > 0) {
                        p->got += (size_t)n;
                        continue;
                }
                if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                        if (now >= p->deadline_ns)
                                ud_pending_drop(p, "no whole request within "
                                                   "1000 ms: closed");
                        return;
                }
                ud_pending_drop(p, n == 0 ? "closed before its request was whole"
                                          : "read failed before its request was whole");
                return;
        }
        if (memcmp(p->req, RCM_UD_MAGIC, 4) || p->req[4] != RCM_UD_VER || p->req[5] != RCM_UD_REQ) {
                ud_pending_drop(p, "bad request (not a diwarp UD request)");
                return;
        }
        int s = p->fd;
        p->fd = -1; /* the child's now */
        ud_request(p->lr, s, &p->peer, p->req);
        ud_pending_drop(p, NULL);
}

#define RCM_WATCH_MAX 256

/* The listeners to watch, held (refs, polling) until worker_release:
 * their count; *conns: some RC id is connected (its close must be seen). */
static int worker_collect(struct rcm_id **lst, struct pollfd *pfd, bool *conns,
                          struct diwarp_device **dev)
{
        int n = 0;
        *conns = false;
        pthread_mutex_lock(&g.lock);
        for (struct rcm_id *r = g.ids; r; r = r->next) {
                if (r->destroyed)
                        continue;
                if (r->state == RCM_LISTEN && n < RCM_WATCH_MAX) {
                        r->refs++;
                        r->polling = true;
                        lst[n] = r;
                        pfd[n].fd = r->l ? diwarp_listener_fd(r->l) : r->ud_lfd;
                        pfd[n].events = POLLIN;
                        pfd[n].revents = 0;
                        n++;
                } else if (r->state == RCM_CONNECTED && !is_ud(r)) {
                        *conns = true;
                }
        }
        *dev = g.ctx ? dwv_ctx(g.ctx)->dev : NULL;
        pthread_mutex_unlock(&g.lock);
        return n;
}

/* Takes what the n listeners hold: RC connection requests, UD first
 * datagrams. */
static void worker_listeners(struct rcm_id **lst, const struct pollfd *pfd, int n)
{
        for (int i = 0; i < n; i++) {
                struct rcm_id *lr = lst[i];
                bool ready = pfd[i].revents & POLLIN;
                if (lr->l) {
                        /* The MPA Request follows the TCP connect at once:
                         * wait a little for it when the listener fired,
                         * else just step the pending sockets. */
                        int tmo = ready ? RCM_REQ_WAIT_MS : 0;
                        for (;;) {
                                struct diwarp_conn_request req;
                                if (lr->destroyed ||
                                    diwarp_listener_get_request(lr->l, tmo, &req) < 0)
                                        break;
                                rc_request(lr, &req);
                                tmo = 0;
                        }
                } else if (ready && !lr->destroyed) {
                        ud_accept(lr);
                }
        }
}

/* Steps the UD handshakes under way; drops those whose listener went. */
static void worker_ud_pending(void)
{
        uint64_t now = diwarpdv_now_ns();
        for (int i = 0; i < RCM_UD_PENDING; i++) {
                struct rcm_ud_pending *p = &ud_pend[i];
                if (p->fd < 0)
                        continue;
                pthread_mutex_lock(&g.lock);
                bool gone = p->lr->destroyed || p->lr->state != RCM_LISTEN;
                pthread_mutex_unlock(&g.lock);
                if (gone)
                        ud_pending_drop(p, NULL);
                else
                        ud_pending_step(p, now);
        }
}

/* Lets the n listeners go, and posts DISCONNECTED for every RC id whose QP
 * failed: a peer's close (or a fatal error) moves the QP to ERR. */
static void worker_release(struct rcm_id **lst, int n)
{
        pthread_mutex_lock(&g.lock);
        for (int i = 0; i < n; i++) {
                lst[i]->polling = false;
                put_locked(lst[i]);
        }
        pthread_cond_broadcast(&g.cond);
        for (struct rcm_id *r = g.ids; r; r = r->next) {
                if (r->destroyed || r->state != RCM_CONNECTED || is_ud(r))
                        continue;
                if (with_qp(r->qpn, qp_failed, NULL) == 0)
                        continue; /* up; -ENOENT: destroyed, as good as closed */
                r->state = RCM_DISCONNECTED;
                if (!r->disc_posted) {
                        r->disc_posted = true;
                        post_locked(chan_of(r), r, NULL, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, 0);
                }
        }
        pthread_mutex_unlock(&g.lock);
}

static void *worker_main(void *arg)
{
        (void)arg;
        struct rcm_id *lst[RCM_WATCH_MAX];
        /* The wake eventfd, the listeners, the UD handshakes. */
        struct pollfd pfd[1 + RCM_WATCH_MAX + RCM_UD_PENDING];

        ud_pending_init();
        for (;;) {
                bool conns;
                struct diwarp_device *dev;
                int n = worker_collect(lst, pfd + 1, &conns, &dev);
                pfd[0] = (struct pollfd){.fd = g.wake_fd, .events = POLLIN};
                int np = 0;
                for (int i = 0; i < RCM_UD_PENDING; i++) {
                        if (ud_pend[i].fd >= 0)
                                pfd[n + 1 + np++] =
                                    (struct pollfd){.fd = ud_pend[i].fd, .events = POLLIN};
                }
                poll(pfd, (nfds_t)(n + 1 + np), (n || conns || np) ? RCM_TICK_MS : -1);
                uint64_t v;
                (void)!read(g.wake_fd, &v, sizeof(v));

                worker_listeners(lst, pfd + 1, n);
                worker_ud_pending();
                /* Also drives the engine under DIWARP_PROGRESS=app, so a
                 * peer's close is seen while the program sleeps on events. */
                if (conns && dev)
                        diwarp_progress(dev, 0);
                worker_release(lst, n);
        }
        return NULL;
}

/* ---- event channels -------------------------------------------------------- */

RCM_SYMVER(rcm_create_event_channel, rdma_create_event_channel, "RDMACM_1.0");
struct rdma_event_channel *rcm_create_event_channel(void)
{
        if (!rcm_ctx())
                return NULL;
        pthread_mutex_lock(&g.lock);
        struct rcm_chan *c = chan_new(false);
        pthread_mutex_unlock(&g.lock);
        return c ? &c->ch : NULL;
}

RCM_SYMVER(rcm_destroy_event_channel, rdma_destroy_event_channel, "RDMACM_1.0");
void rcm_destroy_event_channel(struct rdma_event_channel *channel)
{
        if (!channel)
                return;
        pthread_mutex_lock(&g.lock);
        /* Ids still on it (a sloppy exit) stop getting events rather than
         * writing into freed memory. */
        for (struct rcm_id *r = g.ids; r; r = r->next)
                if (r->id.channel == channel)
                        r->id.channel = NULL;
        chan_destroy_locked((struct rcm_chan *)channel);
        pthread_mutex_unlock(&g.lock);
}

RCM_SYMVER(rcm_get_cm_event, rdma_get_cm_event, "RDMACM_1.0");
int rcm_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
        if (!channel || !event)
                return fail(EINVAL);
        struct rcm_chan *c = (struct rcm_chan *)channel;
        pthread_mutex_lock(&g.lock);
        if (!chan_live_locked(c)) {
                /* Destroyed before this call, and perhaps freed: nothing of
                 * it is read. Event threads (rping's, MVAPICH2's) loop back
                 * to this call while the main thread destroys the channel;
                 * with the kernel's librdmacm they are nearly always back in
                 * the read by then, which a close never answers, and they
                 * end with the program or by cancellation. A late caller
                 * gets the same: it waits, in a cancellation point. (An
                 * error here made rping's event thread exit the program with
                 * 255.) */
                pthread_mutex_unlock(&g.lock);
                for (;;)
                        pause();
        }
        c->readers++;
        int fd = c->ch.fd;
        pthread_mutex_unlock(&g.lock);
        for (;;) {
                uint64_t v;
                /* Blocks (or EAGAIN) as the application set the fd up. */
                ssize_t n = read(fd, &v, sizeof(v));
                int err = errno;
                pthread_mutex_lock(&g.lock);
                if (c->dead) {
                        /* Destroyed while we waited. The kernel's rdma_cm never
                         * answers a waiter on a destroyed channel; the thread
                         * then usually exits with the program. A blocking
                         * caller waits on, without the channel; a
                         * non-blocking one gets EBADF. */
                        bool last = --c->readers == 0;
                        if (last)
                                chan_free_locked(c);
                        pthread_mutex_unlock(&g.lock);
                        if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
                                errno = EBADF;
                                return -1;
                        }
                        for (;;)
                                pause();
                }
                struct rcm_evt *e = n == sizeof(v) ? c->head : NULL;
                if (e) {
                        c->head = e->next;
                        if (!c->head)
                                c->tail = NULL;
                        e->next = NULL;
                        /* Only the application's events: a synchronous id's
                         * (rdma_get_request, an internal channel) are
                         * released without an ack. */
                        if (!c->internal)
                                e->owner->events_out++;
                }
                if (e || n != sizeof(v))
                        c->readers--;
                pthread_mutex_unlock(&g.lock);
                if (e) {
                        *event = &e->ev;
                        return 0;
                }
                if (n != sizeof(v)) {
                        errno = err;
                        return -1;
                }
                /* A count whose event was purged (destroy_id/migrate): read on. */
        }
}

static void ack_locked(struct rcm_evt *e)
{
        if (e->owner->events_out > 0 && --e->owner->events_out == 0)
                pthread_cond_broadcast(&g.cond);
        if (e->owner->req_event == e)
                e->owner->req_event = NULL;
        if (e->owner->id.event == &e->ev)
                e->owner->id.event = NULL;
        evt_free_locked(e);
}

RCM_SYMVER(rcm_ack_cm_event, rdma_ack_cm_event, "RDMACM_1.0");
int rcm_ack_cm_event(struct rdma_cm_event *event)
{
        if (!event)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        ack_locked((struct rcm_evt *)event);
        pthread_mutex_unlock(&g.lock);
        return 0;
}

/* The end of each step of a synchronous id, as rdma_create_id(3) describes
 * such ids: the step's event, taken from the id's own channel, becomes
 * id->event (the previous one is acked) and a failure event is the call's
 * error (REJECTED: ECONNREFUSED, else its status). The channel's fd decides
 * whether this waits: a program that made it non-blocking (rsockets) gets
 * EAGAIN and collects the event later, through librdmacm's ucma_complete. */
static int sync_complete(struct rcm_id *r)
{
        if (!r->lib.sync)
                return 0;
        if (r->id.event) {
                rcm_ack_cm_event(r->id.event);
                r->id.event = NULL;
        }
        struct rdma_cm_event *ev;
        if (rcm_get_cm_event(r->id.channel, &ev) < 0)
                return -1;
        r->id.event = ev;
        if (!ev->status)
                return 0;
        if (ev->event == RDMA_CM_EVENT_REJECTED)
                return fail(ECONNREFUSED);
        return fail(ev->status < 0 ? -ev->status : ev->status);
}

static const char *const rcm_event_names[] = {
    "RDMA_CM_EVENT_ADDR_RESOLVED",   "RDMA_CM_EVENT_ADDR_ERROR",
    "RDMA_CM_EVENT_ROUTE_RESOLVED",  "RDMA_CM_EVENT_ROUTE_ERROR",
    "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",   "RDMA_CM_EVENT_UNREACHABLE",
    "RDMA_CM_EVENT_REJECTED",        "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",  "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE",     "RDMA_CM_EVENT_TIMEWAIT_EXIT",
};

RCM_SYMVER(rcm_event_str, rdma_event_str, "RDMACM_1.0");
const char *rcm_event_str(enum rdma_cm_event_type event)
{
        if ((unsigned)event < sizeof(rcm_event_names) / sizeof(rcm_event_names[0]))
                return rcm_event_names[event];
        return "UNKNOWN EVENT";
}

/* ---- ids ------------------------------------------------------------------ */

RCM_SYMVER(rcm_create_id, rdma_create_id, "RDMACM_1.0");
int rcm_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
                  enum rdma_port_space ps)
{
        if (!id)
                return fail(EINVAL);
        if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB) {
                diwarpdv_warn("rdma_cm: rdma_create_id: port space %#x not supported", ps);
                return fail(EINVAL);
        }
        pthread_mutex_lock(&g.lock);
        if (!rcm_ctx_locked()) {
                int e = errno;
                pthread_mutex_unlock(&g.lock);
                return fail(e ? e : ENODEV);
        }
        struct rcm_id *r = id_new_locked(channel, context, ps);
        pthread_mutex_unlock(&g.lock);
        if (!r)
                return fail(ENOMEM);
        *id = &r->id;
        return 0;
}

/* Waits for a running connect (it still uses the QP), g.lock held. */
static void wait_idle_locked(struct rcm_id *r)
{
        while (r->busy)
                pthread_cond_wait(&g.cond, &g.lock);
}

RCM_SYMVER(rcm_destroy_id, rdma_destroy_id, "RDMACM_1.0");
int rcm_destroy_id(struct rdma_cm_id *id)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_destroy_id") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        wait_idle_locked(r);
        if (r->destroyed) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL);
        }
        /* As librdmacm: wait until every event handed out on the id is acked
         * (rping's event thread still handles its DISCONNECTED while main
         * tears down; going on would destroy the channel under it). Bounded:
         * an event never acked costs a warning, not a hang. */
        if (r->events_out > 0) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += RCM_DESTROY_WAIT_S;
                while (r->events_out > 0 &&
                       pthread_cond_timedwait(&g.cond, &g.lock, &until) != ETIMEDOUT)
                        ;
                if (r->events_out > 0)
                        diwarpdv_warn("rdma_cm: rdma_destroy_id: %d event(s) of the id never acked "
                                      "(rdma_ack_cm_event) after %d s; destroying it anyway",
                                      r->events_out, RCM_DESTROY_WAIT_S);
        }
        r->destroyed = true;
        diwarpdv_dbg("rdma_cm[%d]: id %p: rdma_destroy_id in state %d", (int)getpid(), (void *)id,
                     (int)r->state);
        /* A request never answered: refuse it so the peer does not wait. */
        if (r->state == RCM_REQ && r->parent) {
                if (r->parent->l)
                        diwarp_reject(r->parent->l, r->req_id, NULL, 0);
        }
        if (r->state == RCM_LISTEN) {
                /* Free the port now (perftest -R listens on it again at once),
                 * unless a child still has to answer its request through it. */
                wake_worker();
                while (r->polling)
                        pthread_cond_wait(&g.cond, &g.lock);
                if (r->ud_lfd >= 0) {
                        close(r->ud_lfd);
                        r->ud_lfd = -1;
                }
                bool pending = false;
                for (struct rcm_id *c = g.ids; c; c = c->next)
                        if (c->parent == r && !c->destroyed &&
                            (c->state == RCM_REQ || c->state == RCM_CONNECTING))
                                pending = true;
                if (r->l && !pending) {
                        diwarp_listener_destroy(r->l);
                        r->l = NULL;
                }
                r->state = RCM_IDLE;
        }
        chan_purge_locked(chan_of(r), r, NULL);
        if (r->req_event) {
                struct rcm_evt *e = r->req_event;
                r->req_event = NULL;
                if (id->event == &e->ev)
                        id->event = NULL;
                evt_free_locked(e);
        }
        /* As librdmacm: the event a synchronous step left in id->event. */
        if (id->event)
                ack_locked((struct rcm_evt *)id->event);
        put_locked(r);
        pthread_mutex_unlock(&g.lock);
        return 0;
}

/* rdma_bind_addr with port 0: the kernel picks a free port there and then,
 * and programs read it (rdma_get_src_port) to tell their peer before they
 * listen (qperf -cm1). A TCP socket on the wildcard address, SO_REUSEADDR and
 * never listening, holds the port against other programs until the id's
 * listener (SO_REUSEADDR too, so it may bind beside it) takes it over, or the
 * id goes. Both port spaces are TCP ports here: the RC listener and the UD
 * exchange. */
static int reserve_port(struct rcm_id *r, uint16_t *port_be)
{
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return -errno;
        int one = 1;
        struct sockaddr_in sa = {.sin_family = AF_INET};
        socklen_t sl = sizeof(sa);
        if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
            getsockname(s, (struct sockaddr *)&sa, &sl) < 0) {
                int err = -errno;
                close(s);
                return err;
        }
        r->port_fd = s;
        *port_be = sa.sin_port;
        return 0;
}

RCM_SYMVER(rcm_bind_addr, rdma_bind_addr, "RDMACM_1.0");
int rcm_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
        struct rcm_id *r = id && addr ? live_rid(id, "rdma_bind_addr") : NULL;
        if (!r)
                return fail(EINVAL);
        struct in_addr a;
        uint16_t port;
        int err = sa_ipv4(addr, &a, &port);
        if (err < 0) {
                diwarpdv_dbg("rdma_cm: rdma_bind_addr: address family %d not supported",
                             addr->sa_family);
                return fail(-err);
        }
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_IDLE) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL);
        }
        if (!rcm_ctx_locked()) {
                pthread_mutex_unlock(&g.lock);
                return fail(ENODEV);
        }
        /* The kernel's rdma_cm takes a loopback address as it takes the
         * wildcard (cma_any_addr): the id is bound, on no device yet, and
         * libfabric's verbs provider relies on it: it binds "localhost" and,
         * finding no device on the id, names its endpoints by the device's
         * interface addresses; given a device there, it would name them
         * 127.0.0.1, which no other host can reach. librdmacm's own rsockets
         * are the exception: the datagram service binds a QP's id to the
         * source address and at once registers buffers on the id's device,
         * which over loopback only diwarp0 can give it. */
        bool loopback = (ntohl(a.s_addr) >> 24) == 127;
        bool as_any = a.s_addr == INADDR_ANY ||
                      (loopback && !dwv_called_from_librdmacm(__builtin_return_address(0)));
        struct in_addr local = as_any ? a : dev_local_addr(a);
        if (local.s_addr == INADDR_NONE) {
                /* As the kernel: a specific address with no RDMA device on it. */
                pthread_mutex_unlock(&g.lock);
                char b[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
                diwarpdv_dbg("rdma_cm: rdma_bind_addr %s: not an address of diwarp0 (GID 0 %s, %d "
                             "GIDs)",
                             inet_ntop(AF_INET, &a, b, sizeof(b)),
                             inet_ntop(AF_INET, &g.addr, d, sizeof(d)), g.ngid);
                return fail(ENODEV);
        }
        if (!port) {
                err = reserve_port(r, &port);
                if (err < 0) {
                        pthread_mutex_unlock(&g.lock);
                        diwarpdv_warn("rdma_cm: rdma_bind_addr: no free port: %s", strerror(-err));
                        return fail(-err);
                }
        }
        if (local.s_addr != a.s_addr) {
                /* A loopback address the device has not: the kernel binds it
                 * to the first RDMA device, whose loopback address it takes. */
                diwarpdv_dbg("rdma_cm: rdma_bind_addr: loopback address taken as the device's");
                set_sin(&id->route.addr.src_storage, local, port);
                attach_device(r, local);
                r->state = RCM_BOUND;
                pthread_mutex_unlock(&g.lock);
                return 0;
        }
        size_t len =
            addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
        memset(&id->route.addr.src_storage, 0, sizeof(id->route.addr.src_storage));
        memcpy(&id->route.addr.src_storage, addr, len);
        set_src_port_be(r, port);
        if (!as_any)
                attach_device(r, a);
        r->state = RCM_BOUND;
        pthread_mutex_unlock(&g.lock);
        return 0;
}

RCM_SYMVER(rcm_resolve_addr, rdma_resolve_addr, "RDMACM_1.0");
int rcm_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
                     int timeout_ms)
{
        (void)timeout_ms;
        struct rcm_id *r = id && dst_addr ? live_rid(id, "rdma_resolve_addr") : NULL;
        if (!r)
                return fail(EINVAL);
        struct in_addr dst, src;
        uint16_t dport, sport = 0;
        int err = sa_ipv4(dst_addr, &dst, &dport);
        if (err == 0 && src_addr)
                err = sa_ipv4(src_addr, &src, &sport);
        if (err < 0) {
                diwarpdv_warn("rdma_cm: rdma_resolve_addr: only IPv4 addresses are supported");
                return fail(-err);
        }
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_IDLE && r->state != RCM_BOUND) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL);
        }
        if (!rcm_ctx_locked()) {
                pthread_mutex_unlock(&g.lock);
                return fail(ENODEV);
        }
        struct in_addr local = {.s_addr = INADDR_ANY};
        if (src_addr && src.s_addr != INADDR_ANY) {
                local = dev_local_addr(src);
                if (local.s_addr == INADDR_NONE) {
                        pthread_mutex_unlock(&g.lock);
                        char b[INET_ADDRSTRLEN];
                        diwarpdv_warn(
                            "rdma_cm: rdma_resolve_addr: source address %s is not an address "
                            "of diwarp0",
                            inet_ntop(AF_INET, &src, b, sizeof(b)));
                        return fail(ENODEV);
                }
        } else if (r->state == RCM_BOUND) {
                uint16_t p;
                if (sa_ipv4(&id->route.addr.src_addr, &local, &p) < 0)
                        local.s_addr = INADDR_ANY;
        }
        if (local.s_addr == INADDR_ANY)
                local = route_src(dst);
        if (!sport && r->state == RCM_BOUND)
                sport = src_port_be(r);
        set_sin(&id->route.addr.src_storage, local, sport);
        set_sin(&id->route.addr.dst_storage, dst, dport);
        attach_device(r, local);
        gid_of(dst, &id->route.addr.addr.ibaddr.dgid);
        r->state = RCM_ADDR;
        post_locked(chan_of(r), r, NULL, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, 0);
        pthread_mutex_unlock(&g.lock);
        return sync_complete(r);
}

RCM_SYMVER(rcm_resolve_route, rdma_resolve_route, "RDMACM_1.0");
int rcm_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
        (void)timeout_ms;
        struct rcm_id *r = id ? live_rid(id, "rdma_resolve_route") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_ADDR) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL);
        }
        /* One path, as the kernel gives a RoCE v2 id: GIDs from the resolved
         * addresses, no LIDs, and a hop limit above 1, which tells programs
         * that build an AH from it (rsockets) to use a GRH. */
        struct ibv_sa_path_rec *p = &r->path;
        memset(p, 0, sizeof(*p));
        p->sgid = id->route.addr.addr.ibaddr.sgid;
        p->dgid = id->route.addr.addr.ibaddr.dgid;
        p->hop_limit = 64;
        p->reversible = 1;
        p->numb_path = 1;
        p->pkey = htons(0xffff);
        p->mtu = IBV_MTU_4096;
        id->route.path_rec = p;
        id->route.num_paths = 1;
        r->state = RCM_ROUTE;
        post_locked(chan_of(r), r, NULL, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, 0);
        pthread_mutex_unlock(&g.lock);
        return sync_complete(r);
}

RCM_SYMVER(rcm_listen, rdma_listen, "RDMACM_1.0");
int rcm_listen(struct rdma_cm_id *id, int backlog)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_listen") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_BOUND) {
                pthread_mutex_unlock(&g.lock);
                diwarpdv_warn("rdma_cm: rdma_listen: the id is not bound (rdma_bind_addr first)");
                return fail(EINVAL);
        }
        uint16_t port = ntohs(src_port_be(r));
        int err = 0;
        if (is_ud(r)) {
                int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                int one = 1;
                struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
                uint16_t pb;
                if (sa_ipv4(&id->route.addr.src_addr, &sa.sin_addr, &pb) < 0)
                        sa.sin_addr.s_addr = INADDR_ANY;
                socklen_t sl = sizeof(sa);
                if (s < 0)
                        err = -errno;
                else if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
                         bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
                         listen(s, backlog > 0 ? backlog : 128) < 0 ||
                         getsockname(s, (struct sockaddr *)&sa, &sl) < 0)
                        err = -errno;
                if (err < 0 && s >= 0)
                        close(s);
                if (!err) {
                        r->ud_lfd = s;
                        port = ntohs(sa.sin_port);
                }
        } else {
                err = diwarp_listen(dwv_ctx(g.ctx)->dev, port, backlog > 0 ? backlog : 128, &r->l);
                if (!err && !port) {
                        struct sockaddr_in sa;
                        socklen_t sl = sizeof(sa);
                        if (getsockname(diwarp_listener_fd(r->l), (struct sockaddr *)&sa, &sl) == 0)
                                port = ntohs(sa.sin_port);
                }
        }
        if (err < 0) {
                pthread_mutex_unlock(&g.lock);
                diwarpdv_warn("rdma_cm: rdma_listen on port %u: %s", port, strerror(-err));
                return fail(-err);
        }
        set_src_port_be(r, htons(port));
        /* The listener holds the port now. */
        if (r->port_fd >= 0) {
                close(r->port_fd);
                r->port_fd = -1;
        }
        if (!id->verbs)
                id->port_num = 0;
        r->state = RCM_LISTEN;
        err = start_worker_locked();
        pthread_mutex_unlock(&g.lock);
        if (err < 0)
                return fail(-err);
        return 0;
}

/* ---- QPs ------------------------------------------------------------------ */

static void destroy_own_cqs(struct rdma_cm_id *id)
{
        if (id->send_cq && id->send_cq != id->recv_cq)
                ibv_destroy_cq(id->send_cq);
        if (id->recv_cq)
                ibv_destroy_cq(id->recv_cq);
        if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
                ibv_destroy_comp_channel(id->send_cq_channel);
        if (id->recv_cq_channel)
                ibv_destroy_comp_channel(id->recv_cq_channel);
        id->send_cq = id->recv_cq = NULL;
        id->send_cq_channel = id->recv_cq_channel = NULL;
}

/* rdma_create_qp without CQs: one CQ and completion channel per direction, as
 * the rdma_get_send_comp / rdma_get_recv_comp inlines expect. */
static int create_own_cqs(struct rdma_cm_id *id, struct ibv_qp_init_attr *attr)
{
        struct ibv_context *ctx = id->verbs;
        id->recv_cq_channel = ibv_create_comp_channel(ctx);
        id->send_cq_channel = id->recv_cq_channel ? ibv_create_comp_channel(ctx) : NULL;
        if (id->send_cq_channel) {
                int rq = attr->cap.max_recv_wr ? (int)attr->cap.max_recv_wr : 1;
                int sq = attr->cap.max_send_wr ? (int)attr->cap.max_send_wr : 1;
                id->recv_cq = ibv_create_cq(ctx, rq, id, id->recv_cq_channel, 0);
                id->send_cq =
                    id->recv_cq ? ibv_create_cq(ctx, sq, id, id->send_cq_channel, 0) : NULL;
        }
        if (!id->send_cq) {
                int e = errno ? errno : ENOMEM;
                destroy_own_cqs(id);
                return -e;
        }
        rid_of(id)->own_cqs = true;
        return 0;
}

/* Moves a fresh QP to what rdma_cm hands out: RC in INIT (the connect takes it
 * to RTS), UD straight to RTS with the well-known qkey. */
static int ready_qp(struct rdma_cm_id *id, struct ibv_qp *qp)
{
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.pkey_index = 0;
        if (qp->qp_type == IBV_QPT_UD) {
                a.qkey = RDMA_UDP_QKEY;
                int err = ibv_modify_qp(
                    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
                if (err)
                        return -err;
                a.qp_state = IBV_QPS_RTR;
                if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE)))
                        return -err;
                a.qp_state = IBV_QPS_RTS;
                a.sq_psn = 0;
                err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
                return -err;
        }
        (void)id;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        int err = ibv_modify_qp(
            qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        return -err;
}

RCM_SYMVER(rcm_create_qp, rdma_create_qp, "RDMACM_1.0");
int rcm_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
        if (!id || !attr)
                return fail(EINVAL);
        if (!pd)
                pd = id->pd ? id->pd : g.pd;
        if (!pd)
                return fail(EINVAL);
        if (!id->verbs && pd->context == g.ctx)
                id->verbs = g.ctx; /* bound to a wildcard address */
        if (pd->context != id->verbs) {
                diwarpdv_warn("rdma_cm: rdma_create_qp: the PD belongs to another device context "
                              "than id->verbs");
                return fail(EINVAL);
        }
        if (id->qp)
                return fail(EINVAL);
        /* rdma_create_ep callers (rdma_client...) leave qp_type 0: the id's. */
        if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC &&
            attr->qp_type != IBV_QPT_UD)
                attr->qp_type = id->qp_type;
        /* A copy: callers reuse one attr for many ids (cmtime), and the CQs
         * made here belong to this id only. */
        struct ibv_qp_init_attr a = *attr;
        bool made = false;
        if (!a.send_cq || !a.recv_cq) {
                int err = create_own_cqs(id, &a);
                if (err < 0)
                        return fail(-err);
                a.send_cq = id->send_cq;
                a.recv_cq = id->recv_cq;
                made = true;
        } else {
                id->send_cq = a.send_cq;
                id->recv_cq = a.recv_cq;
        }
        if (!a.srq && id->srq)
                a.srq = id->srq;
        /* Hardware grants some inline space even when asked for none, and
         * programs rely on it (rdma_xclient sends 16 bytes inline after asking
         * for 0); the granted value goes back in attr->cap. */
        if (a.cap.max_inline_data < RCM_MIN_INLINE)
                a.cap.max_inline_data = RCM_MIN_INLINE;
        struct ibv_qp *qp = ibv_create_qp(pd, &a);
        int err = qp ? ready_qp(id, qp) : -(errno ? errno : ENOMEM);
        if (err < 0) {
                if (qp)
                        ibv_destroy_qp(qp);
                if (made)
                        destroy_own_cqs(id);
                else
                        id->send_cq = id->recv_cq = NULL;
                rid_of(id)->own_cqs = false;
                return fail(-err);
        }
        diwarpdv_dbg(
            "rdma_cm: id %p: QP %#x (type %d): send_wr %u recv_wr %u send_sge %u recv_sge %u "
            "inline %u",
            (void *)id, qp->qp_num, qp->qp_type, a.cap.max_send_wr, a.cap.max_recv_wr,
            a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data);
        attr->cap = a.cap; /* the granted capabilities */
        id->qp = qp;
        id->pd = pd;
        return 0;
}

void rcm_destroy_qp(struct rdma_cm_id *id);

RCM_SYMVER(rcm_create_qp_ex, rdma_create_qp_ex, "RDMACM_1.0");
int rcm_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *ax)
{
        if (!id || !ax)
                return fail(EINVAL);
        if (ax->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
                diwarpdv_warn("rdma_cm: rdma_create_qp_ex: comp_mask %#x not supported (PD and "
                              "SEND_OPS_FLAGS only)",
                              ax->comp_mask);
                return fail(EOPNOTSUPP);
        }
        bool ex = ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        int e = ex ? dwv_send_ops_check("rdma_create_qp_ex", ax->qp_type, ax->send_ops_flags) : 0;
        if (e)
                return fail(e);
        struct ibv_qp_init_attr a = {
            .qp_context = ax->qp_context,
            .send_cq = ax->send_cq,
            .recv_cq = ax->recv_cq,
            .srq = ax->srq,
            .cap = ax->cap,
            .qp_type = ax->qp_type,
            .sq_sig_all = ax->sq_sig_all,
        };
        int r = rcm_create_qp(id, (ax->comp_mask & IBV_QP_INIT_ATTR_PD) ? ax->pd : NULL, &a);
        if (r == 0 && ex && (e = dwv_qp_ext_enable(id->qp, ax->send_ops_flags, &a.cap))) {
                rcm_destroy_qp(id);
                return fail(e);
        }
        if (r == 0) {
                ax->cap = a.cap;
                ax->send_cq = a.send_cq;
                ax->recv_cq = a.recv_cq;
        }
        return r;
}

RCM_SYMVER(rcm_destroy_qp, rdma_destroy_qp, "RDMACM_1.0");
void rcm_destroy_qp(struct rdma_cm_id *id)
{
        if (!id)
                return;
        struct rcm_id *r = rid_of(id);
        pthread_mutex_lock(&g.lock);
        wait_idle_locked(r);
        struct ibv_qp *qp = id->qp;
        id->qp = NULL;
        pthread_mutex_unlock(&g.lock);
        if (qp)
                ibv_destroy_qp(qp);
        if (r->own_cqs) {
                destroy_own_cqs(id);
                r->own_cqs = false;
        }
}

RCM_SYMVER(rcm_create_srq, rdma_create_srq, "RDMACM_1.0");
int rcm_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
        if (!id || !attr)
                return fail(EINVAL);
        if (!pd)
                pd = id->pd ? id->pd : g.pd;
        if (!pd || (id->verbs && pd->context != id->verbs))
                return fail(EINVAL);
        struct ibv_srq *srq = ibv_create_srq(pd, attr);
        if (!srq)
                return -1;
        id->srq = srq;
        id->pd = pd;
        return 0;
}

RCM_SYMVER(rcm_create_srq_ex, rdma_create_srq_ex, "RDMACM_1.0");
int rcm_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *ax)
{
        if (!id || !ax)
                return fail(EINVAL);
        if ((ax->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && ax->srq_type != IBV_SRQT_BASIC) {
                diwarpdv_warn("rdma_cm: rdma_create_srq_ex: only basic SRQs (no XRC/tag matching)");
                return fail(EOPNOTSUPP);
        }
        struct ibv_srq_init_attr a = {.srq_context = ax->srq_context, .attr = ax->attr};
        int r = rcm_create_srq(id, (ax->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? ax->pd : NULL, &a);
        if (r == 0)
                ax->attr = a.attr;
        return r;
}

RCM_SYMVER(rcm_destroy_srq, rdma_destroy_srq, "RDMACM_1.0");
void rcm_destroy_srq(struct rdma_cm_id *id)
{
        if (id && id->srq) {
                ibv_destroy_srq(id->srq);
                id->srq = NULL;
        }
}

/* ---- connecting ------------------------------------------------------------- */

/* The QP a connect/accept works on: the id's, or one the application created
 * itself and names in conn_param->qp_num. */
static struct ibv_qp *conn_qp(struct rdma_cm_id *id, const struct rdma_conn_param *p)
{
        if (id->qp)
                return id->qp;
        if (!p || !p->qp_num || !id->verbs)
                return NULL;
        struct dwv_context *c = dwv_ctx(id->verbs);
        struct ibv_qp *found = NULL;
        pthread_mutex_lock(&c->objs_lock);
        for (struct dwv_obj_link *l = c->qps.next; l != &c->qps; l = l->next) {
                struct dwv_qp *q = DWV_CONTAINER(l, struct dwv_qp, link);
                if (q->qpx.qp_base.qp_num == p->qp_num) {
                        found = &q->qpx.qp_base;
                        break;
                }
        }
        pthread_mutex_unlock(&c->objs_lock);
        return found;
}

struct rcm_job {
        struct rcm_job *next; /* the connectors' queue */
        struct rcm_id *r;
        struct ibv_qp *qp;
        uint8_t pd[RCM_PD_MAX];
        uint8_t pd_len;
        uint8_t ird, ord;
};

/* Maps a failed connect to the event an iWARP rdma_cm gives. */
static enum rdma_cm_event_type fail_event(int err)
{
        if (err == -ECONNREFUSED || err == -ECONNRESET)
                return RDMA_CM_EVENT_REJECTED;
        if (err == -ETIMEDOUT || err == -EHOSTUNREACH || err == -ENETUNREACH)
                return RDMA_CM_EVENT_UNREACHABLE;
        return RDMA_CM_EVENT_CONNECT_ERROR;
}

static int connect_tcp(struct in_addr from, struct in_addr dst, uint16_t port_be, int timeout_ms)
{
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s < 0)
                return -errno;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = dst, .sin_port = port_be};
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = from};
        (void)bind(s, (struct sockaddr *)&src, sizeof(src));
        if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
                int e = -errno;
                close(s);
                return e;
        }
        struct pollfd p = {.fd = s, .events = POLLOUT};
        if (poll(&p, 1, timeout_ms) != 1) {
                close(s);
                return -ETIMEDOUT;
        }
        int soerr = 0;
        socklen_t l = sizeof(soerr);
        getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &l);
        if (soerr) {
                close(s);
                return -soerr;
        }
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return s;
}

/* UD: the request/reply exchange. On success fills the ESTABLISHED event. */
static int ud_exchange(struct rcm_job *j, struct rdma_ud_param *out, uint8_t *rpd, uint8_t *rpd_len)
{
        struct rcm_id *r = j->r;
        struct sockaddr_in *d = &r->id.route.addr.dst_sin;
        int s = connect_tcp(r->id.route.addr.src_sin.sin_addr, d->sin_addr, d->sin_port,
                            RCM_UD_TIMEOUT_MS);
        if (s < 0)
                return s == -ECONNREFUSED ? -ETIMEDOUT : s; /* no SIDR responder */
        uint8_t req[RCM_UD_REQ_LEN] = {0};
        memcpy(req, RCM_UD_MAGIC, 4);
        req[4] = RCM_UD_VER;
        req[5] = RCM_UD_REQ;
        req[6] = j->pd_len;
        put_be32(req + 8, j->qp ? j->qp->qp_num : 0);
        memcpy(req + 12, j->pd, j->pd_len);
        uint8_t rep[RCM_UD_REP_LEN];
        int err = write_full(s, req, sizeof(req));
        if (!err)
                err = read_full(s, rep, sizeof(rep), RCM_UD_TIMEOUT_MS);
        close(s);
        if (err == -ECONNRESET)
                return -ECONNREFUSED; /* the listener went away or refused */
        if (err < 0)
                return err;
        if (memcmp(rep, RCM_UD_MAGIC, 4) || rep[4] != RCM_UD_VER)
                return -EPROTO;
        *rpd_len = rep[6];
        memcpy(rpd, rep + 16, rep[6]);
        if (rep[5] == RCM_UD_REJECT)
                return -ECONNREFUSED;
        if (rep[5] != RCM_UD_ACCEPT)
                return -EPROTO;
        memset(out, 0, sizeof(*out));
        out->ah_attr.is_global = 1;
        out->ah_attr.port_num = 1;
        out->ah_attr.grh.hop_limit = 64;
        gid_of(d->sin_addr, &out->ah_attr.grh.dgid);
        out->qp_num = get_be32(rep + 8);
        out->qkey = get_be32(rep + 12);
        return 0;
}

/* Runs a connect to completion; posts the outcome (async ids). Returns 0 or
 * -errno. Drops the busy count taken by rcm_connect. */
static int run_connect(struct rcm_job *j)
{
        struct rcm_id *r = j->r;
        uint8_t rpd[DIWARP_MAX_PRIVATE_DATA];
        uint16_t rlen = sizeof(rpd);
        uint8_t ulen = 0;
        struct rdma_ud_param ud;
        int err;

        if (is_ud(r)) {
                err = ud_exchange(j, &ud, rpd, &ulen);
                rlen = ulen;
        } else {
                union diwarp_gid dgid;
                memcpy(dgid.raw, r->id.route.addr.addr.ibaddr.dgid.raw, 16);
                /* From the id's source address (bound, given, or the route's:
                 * rdma_resolve_addr), which the peer then sees. */
                union diwarp_gid sgid;
                memcpy(sgid.raw, r->id.route.addr.addr.ibaddr.sgid.raw, 16);
                struct diwarp_conn_param p = {
                    .private_data = j->pd_len ? j->pd : NULL,
                    .private_data_len = j->pd_len,
                    .ird = j->ird,
                    .ord = j->ord,
                    .sgid = &sgid,
                };
                err = diwarp_connect(dwv_qp(j->qp)->d, &dgid, ntohs(dst_port_be(r)), &p, -1, rpd,
                                     &rlen);
                if (err == 0) {
                        j->qp->state = IBV_QPS_RTS;
                        apply_rts_attrs(r, j->qp);
                } else if (err != -ECONNREFUSED)
                        rlen = 0;
        }
        pthread_mutex_lock(&g.lock);
        struct rcm_evt *e;
        if (err == 0) {
                r->state = RCM_CONNECTED;
                r->qpn = j->qp ? j->qp->qp_num : 0;
                if (!is_ud(r))
                        start_worker_locked(); /* watches for the peer's close */
                /* An id without a QP of its own (the program's QP named in
                 * conn_param->qp_num) gets CONNECT_RESPONSE, and the program
                 * calls rdma_establish, as rdma_connect(3) and
                 * rdma_establish(3) describe. The MPA exchange made the stream
                 * ready already: rdma_establish has nothing left to do. */
                enum rdma_cm_event_type t = RDMA_CM_EVENT_ESTABLISHED;
                if (!is_ud(r) && !r->id.qp && j->qp) {
                        t = RDMA_CM_EVENT_CONNECT_RESPONSE;
                        dwv_qp(j->qp)->cm_readied = true;
                }
                e = post_locked(chan_of(r), r, NULL, t, 0, rpd, rlen);
                if (e && is_ud(r)) {
                        ud.private_data = e->ev.param.conn.private_data;
                        ud.private_data_len = e->ev.param.conn.private_data_len;
                        e->ev.param.ud = ud;
                } else if (e) {
                        e->ev.param.conn.responder_resources = j->ird;
                        e->ev.param.conn.initiator_depth = j->ord;
                }
        } else {
                r->state = RCM_ROUTE;
                enum rdma_cm_event_type t = fail_event(err);
                post_locked(chan_of(r), r, NULL, t, err, rpd, rlen);
        }
        r->busy--;
        pthread_cond_broadcast(&g.cond);
        put_locked(r);
        pthread_mutex_unlock(&g.lock);
        return err;
}

/* The connects of asynchronous ids run on connector threads that, once
 * started, stay for the life of the process and take the next job when idle:
 * up to RCM_CONNECTORS at once, more jobs wait in the queue. A thread per
 * connect would end after it posted the connect's event, at a moment the
 * program does not see: glibc then madvise()s the thread's stack away
 * (MADV_DONTNEED), and Open MPI's memory hooks turn that call into
 * callbacks that are not safe against its own MPI_Finalize (the callback
 * can run while Open MPI removes it and unloads its ofi components). A
 * barrier just before MPI_Finalize makes the connections whose threads
 * would end during it. */
#define RCM_CONNECTORS 8

static struct {
        pthread_mutex_t lock;
        pthread_cond_t cond; /* a job was queued */
        struct rcm_job *head, *tail;
        int queued, idle, threads; /* jobs waiting, threads waiting for one, threads */
        pid_t pid;                 /* the process the threads run in (not a forked child) */
} conn_pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *connector_main(void *arg)
{
        (void)arg;
        pthread_mutex_lock(&conn_pool.lock);
        for (;;) {
                while (!conn_pool.head) {
                        conn_pool.idle++;
                        pthread_cond_wait(&conn_pool.cond, &conn_pool.lock);
                        conn_pool.idle--;
                }
                struct rcm_job *j = conn_pool.head;
                conn_pool.head = j->next;
                if (!conn_pool.head)
                        conn_pool.tail = NULL;
                conn_pool.queued--;
                pthread_mutex_unlock(&conn_pool.lock);
                run_connect(j);
                free(j);
                pthread_mutex_lock(&conn_pool.lock);
        }
        return NULL;
}

/* Queues a connect for the connectors, starting one when none is idle (and
 * fewer than RCM_CONNECTORS run). 0, or a positive errno when no connector
 * runs and none could be started: the caller then connects itself. */
static int connector_submit(struct rcm_job *j)
{
        pthread_mutex_lock(&conn_pool.lock);
        if (conn_pool.pid != getpid()) {
                /* A forked child has none of its parent's threads. */
                conn_pool.pid = getpid();
                conn_pool.head = conn_pool.tail = NULL;
                conn_pool.queued = conn_pool.idle = conn_pool.threads = 0;
        }
        int err = 0;
        if (conn_pool.queued + 1 > conn_pool.idle && conn_pool.threads < RCM_CONNECTORS) {
                pthread_attr_t a;
                pthread_attr_init(&a);
                pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
                pthread_t t;
                err = pthread_create(&t, &a, connector_main, NULL);
                pthread_attr_destroy(&a);
                if (err == 0)
                        conn_pool.threads++;
                else if (conn_pool.threads > 0)
                        err = 0; /* a running connector takes it later */
        }
        if (err == 0) {
                j->next = NULL;
                if (conn_pool.tail)
                        conn_pool.tail->next = j;
                else
                        conn_pool.head = j;
                conn_pool.tail = j;
                conn_pool.queued++;
                pthread_cond_signal(&conn_pool.cond);
        }
        pthread_mutex_unlock(&conn_pool.lock);
        return err;
}

RCM_SYMVER(rcm_connect, rdma_connect, "RDMACM_1.0");
int rcm_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_connect") : NULL;
        if (!r)
                return fail(EINVAL);
        struct rcm_job *j = calloc(1, sizeof(*j));
        if (!j)
                return fail(ENOMEM);
        j->r = r;
        j->qp = conn_qp(id, param);
        if (param) {
                j->pd_len = param->private_data ? param->private_data_len : 0;
                if (j->pd_len)
                        memcpy(j->pd, param->private_data, j->pd_len);
                j->ird = param->responder_resources;
                j->ord = param->initiator_depth;
        }
        pthread_mutex_lock(&g.lock);
        if (param)
                r->rnr_retry = param->rnr_retry_count;
        int err = 0;
        if (r->state != RCM_ROUTE && r->state != RCM_ADDR)
                err = EINVAL;
        else if (!is_ud(r) && !j->qp) {
                diwarpdv_warn(
                    "rdma_cm: rdma_connect: no QP (rdma_create_qp, or conn_param->qp_num)");
                err = EINVAL;
        }
        if (err) {
                pthread_mutex_unlock(&g.lock);
                free(j);
                return fail(err);
        }
        r->state = RCM_CONNECTING;
        r->busy++;
        r->refs++;
        diwarpdv_dbg("rdma_cm[%d]: id %p: rdma_connect QP %#x to port %u", (int)getpid(),
                     (void *)id, j->qp ? j->qp->qp_num : 0, ntohs(dst_port_be(r)));
        pthread_mutex_unlock(&g.lock);

        /* A synchronous id connects here, unless its channel is non-blocking
         * (rsockets' non-blocking connect): then, as for an asynchronous id,
         * a thread connects and sync_complete answers EAGAIN until the
         * outcome is on the channel. */
        if (r->lib.sync && !(fcntl(id->channel->fd, F_GETFL) & O_NONBLOCK)) {
                run_connect(j);
                free(j);
                return sync_complete(r);
        }
        err = connector_submit(j);
        if (err) {
                /* No thread: connect here, the event still goes to the channel. */
                diwarpdv_dbg("rdma_cm: rdma_connect: no connector thread (%s); connecting inline",
                             strerror(err));
                run_connect(j);
                free(j);
        }
        return sync_complete(r);
}

/* Releases a sync child's request event after it was answered. g.lock held. */
static void drop_req_event_locked(struct rcm_id *r)
{
        if (r->req_event) {
                struct rcm_evt *e = r->req_event;
                r->req_event = NULL;
                if (r->id.event == &e->ev)
                        r->id.event = NULL;
                evt_free_locked(e);
        }
}

static int ud_reply(struct rcm_id *r, uint8_t type, uint32_t qpn, const void *pd, uint8_t pd_len)
{
        uint8_t rep[RCM_UD_REP_LEN] = {0};
        memcpy(rep, RCM_UD_MAGIC, 4);
        rep[4] = RCM_UD_VER;
        rep[5] = type;
        rep[6] = pd_len;
        put_be32(rep + 8, qpn);
        put_be32(rep + 12, RDMA_UDP_QKEY);
        if (pd_len)
                memcpy(rep + 16, pd, pd_len);
        int err = write_full(r->ud_fd, rep, sizeof(rep));
        close(r->ud_fd);
        r->ud_fd = -1;
        return err;
}

RCM_SYMVER(rcm_accept, rdma_accept, "RDMACM_1.0");
int rcm_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_accept") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_REQ || !r->parent) {
                pthread_mutex_unlock(&g.lock);
                diwarpdv_warn("rdma_cm: rdma_accept: the id is not a pending connection request");
                return fail(EINVAL);
        }
        r->state = RCM_CONNECTING;
        r->busy++;
        if (param)
                r->rnr_retry = param->rnr_retry_count;
        pthread_mutex_unlock(&g.lock);

        const void *pd = param ? param->private_data : NULL;
        uint8_t pd_len = pd ? param->private_data_len : 0;
        struct ibv_qp *qp = conn_qp(id, param);
        int err;
        if (is_ud(r)) {
                uint32_t qpn = qp ? qp->qp_num : (param ? param->qp_num : 0);
                err = ud_reply(r, RCM_UD_ACCEPT, qpn, pd, pd_len);
        } else if (!qp) {
                diwarpdv_warn(
                    "rdma_cm: rdma_accept: no QP (rdma_create_qp, or conn_param->qp_num)");
                err = -EINVAL;
        } else {
                struct diwarp_conn_param p = {
                    .private_data = pd,
                    .private_data_len = pd_len,
                    .ird = param ? param->responder_resources : 0,
                    .ord = param ? param->initiator_depth : 0,
                };
                err = diwarp_accept(r->parent->l, r->req_id, dwv_qp(qp)->d, &p);
                if (err == 0) {
                        qp->state = IBV_QPS_RTS;
                        apply_rts_attrs(r, qp);
                }
        }
        diwarpdv_dbg("rdma_cm[%d]: id %p: rdma_accept QP %#x: %d", (int)getpid(), (void *)id,
                     qp ? qp->qp_num : 0, err);
        pthread_mutex_lock(&g.lock);
        r->busy--;
        pthread_cond_broadcast(&g.cond);
        if (err == 0) {
                r->state = RCM_CONNECTED;
                r->qpn = qp ? qp->qp_num : 0;
                /* UD has no ESTABLISHED on the passive side (as with SIDR). */
                if (!is_ud(r)) {
                        struct rcm_evt *e =
                            post_locked(chan_of(r), r, NULL, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, 0);
                        if (e && param) {
                                e->ev.param.conn.responder_resources = param->responder_resources;
                                e->ev.param.conn.initiator_depth = param->initiator_depth;
                        }
                }
                drop_req_event_locked(r);
        } else if (err != -EINVAL) {
                r->state = RCM_IDLE;
                drop_req_event_locked(r);
        } else {
                r->state = RCM_REQ;
        }
        if (err == 0 && !is_ud(r))
                start_worker_locked(); /* watches the connection for a peer close */
        pthread_mutex_unlock(&g.lock);
        if (err < 0)
                return fail(-err);
        return is_ud(r) ? 0 : sync_complete(r); /* ESTABLISHED */
}

RCM_SYMVER(rcm_reject, rdma_reject, "RDMACM_1.0");
int rcm_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_reject") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_REQ || !r->parent) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL);
        }
        r->state = RCM_IDLE;
        drop_req_event_locked(r);
        diwarpdv_dbg("rdma_cm[%d]: id %p: rdma_reject", (int)getpid(), (void *)id);
        uint8_t len = private_data ? private_data_len : 0;
        int err = is_ud(r) ? ud_reply(r, RCM_UD_REJECT, 0, private_data, len)
                           : diwarp_reject(r->parent->l, r->req_id, private_data, len);
        pthread_mutex_unlock(&g.lock);
        return err < 0 ? fail(-err) : 0;
}

RCM_SYMVER(rcm_reject_ece, rdma_reject_ece, "RDMACM_1.3");
int rcm_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
        return rcm_reject(id, private_data, private_data_len);
}

RCM_SYMVER(rcm_set_local_ece, rdma_set_local_ece, "RDMACM_1.3");
int rcm_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
        (void)id;
        (void)ece;
        return fail(EOPNOTSUPP);
}

RCM_SYMVER(rcm_get_remote_ece, rdma_get_remote_ece, "RDMACM_1.3");
int rcm_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
        (void)id;
        (void)ece;
        return fail(EOPNOTSUPP);
}

RCM_SYMVER(rcm_establish, rdma_establish, "RDMACM_1.2");
int rcm_establish(struct rdma_cm_id *id)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_establish") : NULL;
        if (!r)
                return fail(EINVAL);
        /* The MPA exchange already made the stream (and the QP) ready. */
        pthread_mutex_lock(&g.lock);
        bool ok = r->state == RCM_CONNECTED;
        pthread_mutex_unlock(&g.lock);
        if (!ok) {
                diwarpdv_warn(
                    "rdma_cm: rdma_establish: the id is not connected (no CONNECT_RESPONSE)");
                return fail(EINVAL);
        }
        return 0;
}

RCM_SYMVER(rcm_notify, rdma_notify, "RDMACM_1.0");
int rcm_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
        (void)event;
        return id ? 0 : fail(EINVAL);
}

RCM_SYMVER(rcm_disconnect, rdma_disconnect, "RDMACM_1.0");
int rcm_disconnect(struct rdma_cm_id *id)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_disconnect") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        if (r->state != RCM_CONNECTED && r->state != RCM_DISCONNECTED) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL);
        }
        uint32_t qpn = r->qpn;
        pthread_mutex_unlock(&g.lock);
        if (!is_ud(r))
                with_qp(qpn, qp_disconnect, NULL);
        pthread_mutex_lock(&g.lock);
        r->state = RCM_DISCONNECTED;
        if (!r->disc_posted) {
                r->disc_posted = true;
                post_locked(chan_of(r), r, NULL, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, 0);
        }
        /* A synchronous id takes its DISCONNECTED, unless something took it
         * already (rsockets' service thread, on a peer's close): none comes
         * again, and waiting for one would hang. */
        bool queued = false;
        if (r->lib.sync)
                for (struct rcm_evt *e = r->own_chan->head; e && !queued; e = e->next)
                        queued = e->owner == r;
        pthread_mutex_unlock(&g.lock);
        return queued ? sync_complete(r) : 0;
}

/* ---- synchronous endpoints -------------------------------------------------- */

RCM_SYMVER(rcm_get_request, rdma_get_request, "RDMACM_1.0");
int rcm_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
        if (!listen || !id)
                return fail(EINVAL);
        struct rcm_id *lr = live_rid(listen, "rdma_get_request");
        if (!lr)
                return fail(EINVAL);
        if (!lr->lib.sync) {
                diwarpdv_warn("rdma_cm: rdma_get_request: the listener has an event channel "
                              "(rdma_get_cm_event gives its requests)");
                return fail(EINVAL);
        }
        for (;;) {
                /* Blocks, or EAGAIN on a non-blocking channel (rsockets). */
                struct rdma_cm_event *ev;
                if (rcm_get_cm_event(&lr->own_chan->ch, &ev) < 0)
                        return -1;
                if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
                        rcm_ack_cm_event(ev);
                        continue;
                }
                struct rcm_evt *e = (struct rcm_evt *)ev;
                struct rcm_id *c = e->owner;
                pthread_mutex_lock(&g.lock);
                c->req_event = e;
                c->id.event = ev;
                pthread_mutex_unlock(&g.lock);
                if (lr->ep_attr) {
                        struct ibv_qp_init_attr a = *lr->ep_attr;
                        if (rcm_create_qp(&c->id, listen->pd, &a) < 0) {
                                int err = errno;
                                rcm_reject(&c->id, NULL, 0);
                                rcm_destroy_id(&c->id);
                                return fail(err);
                        }
                }
                *id = &c->id;
                return 0;
        }
}

RCM_SYMVER(rcm_create_ep, rdma_create_ep, "RDMACM_1.0");
int rcm_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
                  struct ibv_qp_init_attr *qp_init_attr)
{
        if (!id || !res)
                return fail(EINVAL);
        enum rdma_port_space ps = res->ai_port_space ? (enum rdma_port_space)res->ai_port_space
                                  : res->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP
                                                                  : RDMA_PS_TCP;
        struct rdma_cm_id *cid;
        if (rcm_create_id(NULL, &cid, NULL, ps) < 0)
                return -1;
        struct rcm_id *r = rid_of(cid);
        int err = 0;
        if (res->ai_qp_type)
                cid->qp_type = (enum ibv_qp_type)res->ai_qp_type;
        if (res->ai_flags & RAI_PASSIVE) {
                if (res->ai_src_addr && rcm_bind_addr(cid, res->ai_src_addr) < 0)
                        err = errno;
                cid->pd = pd;
                if (!err && qp_init_attr) {
                        r->ep_attr = malloc(sizeof(*r->ep_attr));
                        if (r->ep_attr)
                                *r->ep_attr = *qp_init_attr;
                        else
                                err = ENOMEM;
                }
        } else {
                if (rcm_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) < 0 ||
                    rcm_resolve_route(cid, 2000) < 0)
                        err = errno;
                cid->pd = pd;
                if (!err && qp_init_attr && rcm_create_qp(cid, pd, qp_init_attr) < 0)
                        err = errno;
        }
        if (err) {
                rcm_destroy_id(cid);
                return fail(err);
        }
        *id = cid;
        return 0;
}

RCM_SYMVER(rcm_destroy_ep, rdma_destroy_ep, "RDMACM_1.0");
void rcm_destroy_ep(struct rdma_cm_id *id)
{
        if (!id)
                return;
        if (id->qp)
                rcm_destroy_qp(id);
        if (id->srq)
                rcm_destroy_srq(id);
        rcm_destroy_id(id);
}

RCM_SYMVER(rcm_migrate_id, rdma_migrate_id, "RDMACM_1.0");
int rcm_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
        struct rcm_id *r = id ? live_rid(id, "rdma_migrate_id") : NULL;
        if (!r)
                return fail(EINVAL);
        pthread_mutex_lock(&g.lock);
        if (r->lib.sync && !channel) {
                pthread_mutex_unlock(&g.lock);
                return fail(EINVAL); /* as librdmacm: synchronous already */
        }
        struct rcm_chan *from = chan_of(r);
        struct rcm_chan *to = (struct rcm_chan *)channel;
        struct rcm_chan *own = NULL;
        if (!to) {
                /* To synchronous: a channel of its own, as rdma_create_id
                 * gives an id created without one. */
                own = to = chan_new(true);
                if (!own) {
                        pthread_mutex_unlock(&g.lock);
                        return fail(ENOMEM);
                }
        }
        /* Events not yet retrieved follow the id. */
        if (from != to)
                chan_purge_locked(from, r, to);
        if (r->own_chan) {
                /* From synchronous: the event of its last step is done with,
                 * and its own channel goes. */
                if (id->event)
                        ack_locked((struct rcm_evt *)id->event);
                chan_destroy_locked(r->own_chan);
        }
        r->own_chan = own;
        r->lib.sync = own != NULL;
        id->channel = &to->ch;
        pthread_mutex_unlock(&g.lock);
        return 0;
}

/* ---- options, ports, QP attributes -------------------------------------------- */

RCM_SYMVER(rcm_set_option, rdma_set_option, "RDMACM_1.0");
int rcm_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
        if (!id)
                return fail(EINVAL);
        if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT) {
                struct rcm_id *r = live_rid(id, "rdma_set_option");
                if (!r || !optval || optlen != sizeof(uint8_t))
                        return fail(EINVAL);
                /* The QP's transport timeout (4.096 us * 2^t), as for
                 * ibv_modify_qp(IBV_QP_TIMEOUT): RD's retransmission uses it. */
                pthread_mutex_lock(&g.lock);
                r->ack_timeout = *(const uint8_t *)optval;
                struct ibv_qp *qp = id->qp;
                pthread_mutex_unlock(&g.lock);
                apply_rts_attrs(r, qp);
                return 0;
        }
        /* TOS, REUSEADDR, AFONLY and IB path records have no meaning (or no
         * effect worth emulating) for diwarp's TCP/UDP. */
        diwarpdv_dbg("rdma_cm: rdma_set_option(level %d, option %d) accepted and ignored", level,
                     optname);
        return 0;
}

RCM_SYMVER(rcm_get_src_port, rdma_get_src_port, "RDMACM_1.0");
__be16 rcm_get_src_port(struct rdma_cm_id *id)
{
        return id ? src_port_be(rid_of(id)) : 0;
}

RCM_SYMVER(rcm_get_dst_port, rdma_get_dst_port, "RDMACM_1.0");
__be16 rcm_get_dst_port(struct rdma_cm_id *id)
{
        return id ? dst_port_be(rid_of(id)) : 0;
}

RCM_SYMVER(rcm_init_qp_attr, rdma_init_qp_attr, "RDMACM_1.2");
int rcm_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *attr, int *mask)
{
        if (!id || !attr || !mask)
                return fail(EINVAL);
        enum ibv_qp_state want = attr->qp_state;
        memset(attr, 0, sizeof(*attr));
        attr->qp_state = want;
        /* As an iWARP CM: access flags for INIT/RTR, the state alone for RTS;
         * the MPA exchange does the rest. */
        switch (want) {
        case IBV_QPS_INIT:
                attr->port_num = 1;
                attr->pkey_index = 0;
                if (is_ud(rid_of(id))) {
                        attr->qkey = RDMA_UDP_QKEY;
                        *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
                } else {
                        attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                IBV_ACCESS_REMOTE_READ;
                        *mask =
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
                }
                return 0;
        case IBV_QPS_RTR:
                if (is_ud(rid_of(id))) {
                        *mask = IBV_QP_STATE;
                } else {
                        attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                IBV_ACCESS_REMOTE_READ;
                        *mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS;
                }
                return 0;
        case IBV_QPS_RTS:
                *mask = IBV_QP_STATE;
                if (is_ud(rid_of(id)))
                        *mask |= IBV_QP_SQ_PSN;
                if (!is_ud(rid_of(id)))
                        *mask |= rts_attrs(rid_of(id), attr);
                return 0;
        default:
                return fail(EINVAL);
        }
}

/* ---- multicast: not on iWARP ------------------------------------------------- */

RCM_SYMVER(rcm_join_multicast, rdma_join_multicast, "RDMACM_1.0");
int rcm_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
        (void)id;
        (void)addr;
        (void)context;
        diwarpdv_warn("rdma_cm: rdma_join_multicast: multicast is not supported (iWARP)");
        return fail(EOPNOTSUPP);
}

RCM_SYMVER(rcm_join_multicast_ex, rdma_join_multicast_ex, "RDMACM_1.1");
int rcm_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr,
                          void *context)
{
        (void)attr;
        return rcm_join_multicast(id, NULL, context);
}

RCM_SYMVER(rcm_leave_multicast, rdma_leave_multicast, "RDMACM_1.0");
int rcm_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
        (void)id;
        (void)addr;
        return fail(EADDRNOTAVAIL);
}

/* ---- devices -------------------------------------------------------------------- */

RCM_SYMVER(rcm_get_devices, rdma_get_devices, "RDMACM_1.0");
struct ibv_context **rcm_get_devices(int *num_devices)
{
        struct ibv_context *ctx = rcm_ctx();
        struct ibv_context **list = calloc(2, sizeof(*list));
        if (!list) {
                errno = ENOMEM;
                return NULL;
        }
        list[0] = ctx;
        if (num_devices)
                *num_devices = ctx ? 1 : 0;
        return list;
}

RCM_SYMVER(rcm_free_devices, rdma_free_devices, "RDMACM_1.0");
void rcm_free_devices(struct ibv_context **list)
{
        free(list); /* the context itself lives as long as the process */
}

/* ---- address info (IPv4) ---------------------------------------------------------
 * Our own rather than librdmacm's: the real one would open diwarp0 again (a
 * second device instance) through ucma_init. */

RCM_SYMVER(rcm_freeaddrinfo, rdma_freeaddrinfo, "RDMACM_1.0");
void rcm_freeaddrinfo(struct rdma_addrinfo *res)
{
        while (res) {
                struct rdma_addrinfo *n = res->ai_next;
                free(res->ai_src_addr);
                free(res->ai_dst_addr);
                free(res->ai_src_canonname);
                free(res->ai_dst_canonname);
                free(res->ai_route);
                free(res->ai_connect);
                free(res);
                res = n;
        }
}

static struct sockaddr *dup_sa(const struct sockaddr *sa, socklen_t len)
{
        struct sockaddr *d = malloc(len);
        if (d)
                memcpy(d, sa, len);
        return d;
}

RCM_SYMVER(rcm_getaddrinfo, rdma_getaddrinfo, "RDMACM_1.0");
int rcm_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
                    struct rdma_addrinfo **res)
{
        if (!res)
                return fail(EINVAL);
        int flags = hints ? hints->ai_flags : 0;
        if (!node && !service) {
                /* Addresses in the hints only (libfabric passes them so). */
                if (!hints || (!hints->ai_src_addr && !hints->ai_dst_addr)) {
                        errno = EINVAL;
                        return EAI_NONAME;
                }
                struct rdma_addrinfo *o = calloc(1, sizeof(*o));
                if (!o)
                        return fail(ENOMEM);
                o->ai_flags = flags;
                o->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
                o->ai_port_space = hints->ai_port_space          ? hints->ai_port_space
                                   : o->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP
                                                                 : RDMA_PS_TCP;
                bool ok = true;
                if (hints->ai_src_addr && hints->ai_src_len) {
                        o->ai_src_addr = dup_sa(hints->ai_src_addr, hints->ai_src_len);
                        o->ai_src_len = hints->ai_src_len;
                        o->ai_family = hints->ai_src_addr->sa_family;
                        ok = o->ai_src_addr != NULL;
                }
                if (ok && hints->ai_dst_addr && hints->ai_dst_len) {
                        o->ai_dst_addr = dup_sa(hints->ai_dst_addr, hints->ai_dst_len);
                        o->ai_dst_len = hints->ai_dst_len;
                        o->ai_family = hints->ai_dst_addr->sa_family;
                        ok = o->ai_dst_addr != NULL;
                }
                if (!ok) {
                        rcm_freeaddrinfo(o);
                        return fail(ENOMEM);
                }
                *res = o;
                return 0;
        }
        int family = hints ? hints->ai_family : 0;
        if (family && family != AF_INET && family != AF_INET6) {
                errno = EAFNOSUPPORT;
                return EAI_FAMILY;
        }
        struct addrinfo h = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
        if (flags & RAI_PASSIVE)
                h.ai_flags |= AI_PASSIVE;
        if (flags & RAI_NUMERICHOST)
                h.ai_flags |= AI_NUMERICHOST;
        struct addrinfo *ai = NULL;
        int r = getaddrinfo(node, service, &h, &ai);
        if (r) {
                errno = r == EAI_SYSTEM ? errno : ENOENT;
                return r;
        }
        struct rdma_addrinfo *out = calloc(1, sizeof(*out));
        if (!out) {
                freeaddrinfo(ai);
                errno = ENOMEM;
                return EAI_MEMORY;
        }
        out->ai_flags = flags;
        out->ai_family = AF_INET;
        out->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
        out->ai_port_space = hints && hints->ai_port_space   ? hints->ai_port_space
                             : out->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP
                                                             : RDMA_PS_TCP;
        bool ok = true;
        if (flags & RAI_PASSIVE) {
                out->ai_src_addr = dup_sa(ai->ai_addr, ai->ai_addrlen);
                out->ai_src_len = ai->ai_addrlen;
                ok = out->ai_src_addr != NULL;
        } else {
                out->ai_dst_addr = dup_sa(ai->ai_addr, ai->ai_addrlen);
                out->ai_dst_len = ai->ai_addrlen;
                ok = out->ai_dst_addr != NULL;
                if (ok && hints && hints->ai_src_addr && hints->ai_src_len) {
                        out->ai_src_addr = dup_sa(hints->ai_src_addr, hints->ai_src_len);
                        out->ai_src_len = hints->ai_src_len;
                        ok = out->ai_src_addr != NULL;
                }
        }
        freeaddrinfo(ai);
        if (!ok) {
                rcm_freeaddrinfo(out);
                errno = ENOMEM;
                return EAI_MEMORY;
        }
        *res = out;
        return 0;
}
