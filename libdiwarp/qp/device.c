/* Device instances and the objects that hang off them without being QPs:
 * PD, MR, CQ, completion channel, async events, AH, SRQ, counters, and the
 * device registry. */
#include <arpa/inet.h>
#include <errno.h>
#include <sys/random.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/backend.h"
#include "dw.h"
#include "llp/netif.h"
#include "qp/stat_shm.h"
#include "wire/dgram.h"

/* ---- registry: the one global besides the log level ------------------- */

static pthread_mutex_t dw_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dw_device *dw_registry_head;

static void dw_registry_add(struct dw_device *dev)
{
        pthread_mutex_lock(&dw_registry_lock);
        dev->reg_next = dw_registry_head;
        dw_registry_head = dev;
        pthread_mutex_unlock(&dw_registry_lock);
}

static void dw_registry_remove(struct dw_device *dev)
{
        pthread_mutex_lock(&dw_registry_lock);
        for (struct dw_device **p = &dw_registry_head; *p; p = &(*p)->reg_next) {
                if (*p == dev) {
                        *p = dev->reg_next;
                        break;
                }
        }
        pthread_mutex_unlock(&dw_registry_lock);
}

static bool dw_device_owns(const struct dw_device *d, const struct sockaddr_in *dst)
{
        uint32_t ip = dst->sin_addr.s_addr;

        if (d->port != ntohs(dst->sin_port))
                return false;
        if (d->bind_addr.s_addr != htonl(INADDR_ANY))
                return d->bind_addr.s_addr == ip;
        if ((ntohl(ip) >> 24) == 127)
                return true;
        for (int i = 0; i < d->ngid; i++)
                if (d->gids[i].addr == ip)
                        return true;
        return false;
}

int dw_registry_local(struct dw_device *self, const struct sockaddr_in *dst, struct dw_device **out,
                      bool *locked)
{
        int r = -ENOENT;

        *locked = false;
        pthread_mutex_lock(&dw_registry_lock);
        for (struct dw_device *d = dw_registry_head; d; d = d->reg_next) {
                if (!dw_device_owns(d, dst))
                        continue;
                r = -EBUSY;
                if (d == self) {
                        r = 0;
                } else if (pthread_mutex_trylock(&d->lock) == 0) {
                        /* Held from here, the device cannot close. */
                        r = 0;
                        *locked = true;
                }
                *out = d;
                break;
        }
        pthread_mutex_unlock(&dw_registry_lock);
        return r;
}

/* The process's in-flight caps (in-flight token throttling, flow/inflight.h): the process cap
 * and this process's place in the host pool belong to the process, not to
 * one device, so they hang off the registry, opened with the first device
 * that sets a cap and closed with the last device. Devices serialize on its
 * own lock (each device has its own). */
static struct dw_host {
        pthread_mutex_t lock;
        struct dw_inflight_proc proc;
        unsigned refs;    /* devices attached */
        bool open;        /* proc is open (some device set a process or host cap) */
        uint32_t caps[2]; /* process and host caps it was opened with */
} dw_host = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int dw_host_attach(struct dw_device *dev)
{
        const struct dw_config *c = &dev->cfg;
        int err = 0;
        pthread_mutex_lock(&dw_host.lock);
        if (!dw_host.open && (c->inflight_proc || c->inflight_host)) {
                struct dw_inflight_params prm = {.host_cap = c->inflight_host,
                                                 .proc_cap = c->inflight_proc,
                                                 .shm_name = c->inflight_shm};
                char why[256] = "";
                err = dw_inflight_open(&dw_host.proc, &prm, why, sizeof(why));
                if (err < 0) {
                        dw_err("device open: in-flight caps (DIWARP_INFLIGHT_*): %s", why);
                        goto out;
                }
                dw_host.open = true;
                dw_host.caps[0] = c->inflight_proc;
                dw_host.caps[1] = c->inflight_host;
        } else if (dw_host.open &&
                   (c->inflight_proc != dw_host.caps[0] || c->inflight_host != dw_host.caps[1])) {
                dw_warn("device port %u: the process keeps the in-flight caps it opened with "
                        "(process %u, host %u), not %u and %u",
                        dev->port, dw_host.caps[0], dw_host.caps[1], c->inflight_proc,
                        c->inflight_host);
        }
        dw_host.refs++;
out:
        pthread_mutex_unlock(&dw_host.lock);
        return err;
}

static void dw_host_detach(void)
{
        pthread_mutex_lock(&dw_host.lock);
        if (dw_host.refs && --dw_host.refs == 0 && dw_host.open) {
                dw_inflight_close(&dw_host.proc);
                dw_host.open = false;
        }
        pthread_mutex_unlock(&dw_host.lock);
}

bool dw_host_capped(void)
{
        return dw_host.open;
}

int dw_host_admit(struct dw_inflight_qp *q, uint32_t want, uint64_t now)
{
        if (!dw_host.open) {
                /* The QP cap alone: a plain counter. */
                uint32_t n = dw_inflight_qp_room(q, want);
                q->inflight += n;
                return (int)n;
        }
        pthread_mutex_lock(&dw_host.lock);
        int n = dw_inflight_admit(&dw_host.proc, q, want, now);
        pthread_mutex_unlock(&dw_host.lock);
        return n;
}

void dw_host_complete(struct dw_inflight_qp *q, uint32_t n)
{
        if (!n)
                return;
        if (!dw_host.open) {
                q->inflight = n < q->inflight ? q->inflight - n : 0;
                return;
        }
        pthread_mutex_lock(&dw_host.lock);
        dw_inflight_complete(&dw_host.proc, q, n);
        pthread_mutex_unlock(&dw_host.lock);
}

bool dw_host_poll(uint64_t now)
{
        if (!dw_host.open)
                return false;
        pthread_mutex_lock(&dw_host.lock);
        bool more = dw_inflight_poll(&dw_host.proc, now) == 1 || dw_inflight_waiting(&dw_host.proc);
        pthread_mutex_unlock(&dw_host.lock);
        return more;
}

void dw_host_cancel(void)
{
        if (!dw_host.open)
                return;
        pthread_mutex_lock(&dw_host.lock);
        dw_inflight_cancel(&dw_host.proc);
        pthread_mutex_unlock(&dw_host.lock);
}

int dw_host_counters(struct dw_inflight_counters *out)
{
        memset(out, 0, sizeof(*out));
        if (!dw_host.open)
                return -ENOENT;
        pthread_mutex_lock(&dw_host.lock);
        dw_inflight_get_counters(&dw_host.proc, out);
        pthread_mutex_unlock(&dw_host.lock);
        return 0;
}

/* ---- small helpers ------------------------------------------------------ */

const char *diwarp_wc_status_str(enum diwarp_wc_status status)
{
        switch (status) {
        case DIWARP_WC_SUCCESS:
                return "success";
        case DIWARP_WC_LOC_LEN_ERR:
                return "local length error";
        case DIWARP_WC_LOC_QP_OP_ERR:
                return "local QP operation error";
        case DIWARP_WC_LOC_PROT_ERR:
                return "local protection error";
        case DIWARP_WC_WR_FLUSH_ERR:
                return "Work Request Flushed Error";
        case DIWARP_WC_MW_BIND_ERR:
                return "memory window bind error";
        case DIWARP_WC_BAD_RESP_ERR:
                return "bad response error";
        case DIWARP_WC_LOC_ACCESS_ERR:
                return "local access error";
        case DIWARP_WC_REM_INV_REQ_ERR:
                return "remote invalid request error";
        case DIWARP_WC_REM_ACCESS_ERR:
                return "remote access error";
        case DIWARP_WC_REM_OP_ERR:
                return "remote operation error";
        case DIWARP_WC_RETRY_EXC_ERR:
                return "transport retry counter exceeded";
        case DIWARP_WC_RNR_RETRY_EXC_ERR:
                return "RNR retry counter exceeded";
        case DIWARP_WC_REM_INV_RD_REQ_ERR:
                return "remote invalid RD request";
        case DIWARP_WC_REM_ABORT_ERR:
                return "operation aborted";
        case DIWARP_WC_FATAL_ERR:
                return "fatal error";
        case DIWARP_WC_RESP_TIMEOUT_ERR:
                return "response timeout error";
        case DIWARP_WC_GENERAL_ERR:
                return "general error";
        }
        return "unknown";
}

void dw_ipv4_to_gid(struct in_addr ip, union diwarp_gid *gid)
{
        memset(gid, 0, sizeof(*gid));
        gid->raw[10] = 0xff;
        gid->raw[11] = 0xff;
        memcpy(&gid->raw[12], &ip.s_addr, 4);
}

int dw_gid_to_ipv4(const union diwarp_gid *gid, struct in_addr *ip)
{
        static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(gid->raw, prefix, sizeof(prefix)) != 0)
                return -EINVAL;
        memcpy(&ip->s_addr, &gid->raw[12], 4);
        return 0;
}

struct in_addr dw_qp_src_addr(const struct dw_qp *qp)
{
        const struct dw_device *dev = qp->dev;
        struct in_addr a = dev->addr;
        if ((qp->attr_mask_set & DIWARP_QP_AV) && qp->attr.sgid_index < dev->ngid)
                a.s_addr = dev->gids[qp->attr.sgid_index].addr;
        return a;
}

void dw_peer_addr(const struct dw_device *dev, struct in_addr ip, uint32_t qpn,
                  struct sockaddr_in *out)
{
        memset(out, 0, sizeof(*out));
        out->sin_family = AF_INET;
        out->sin_addr = ip;
        out->sin_port = htons((uint16_t)(dev->cfg.port_base + dw_qpn_instance(qpn)));
}

/* ---- async events ------------------------------------------------------- */

static void dw_async_push(struct dw_device *dev, struct diwarp_async_event *ev)
{
        if (dw_async_queue_push(&dev->async, ev) < 0)
                dw_warn("device port %u: async event queue full, event %d dropped", dev->port,
                        ev->event_type);
}

void dw_async_qp(struct dw_qp *qp, enum diwarp_event_type type)
{
        struct diwarp_async_event ev = {.event_type = type};
        ev.element.qp = dw_qp_pub(qp);
        dw_async_push(qp->dev, &ev);
}

void dw_async_cq(struct dw_device *dev, struct dw_cq *cq, enum diwarp_event_type type)
{
        struct diwarp_async_event ev = {.event_type = type};
        ev.element.cq = dw_cq_pub(cq);
        dw_async_push(dev, &ev);
}

void dw_async_srq(struct dw_device *dev, struct dw_srq_obj *srq, enum diwarp_event_type type)
{
        struct diwarp_async_event ev = {.event_type = type};
        ev.element.srq = dw_srq_pub(srq);
        dw_async_push(dev, &ev);
}

void dw_async_dev(struct dw_device *dev, enum diwarp_event_type type)
{
        struct diwarp_async_event ev = {.event_type = type};
        dw_async_push(dev, &ev);
}

void dw_cq_complete(struct dw_device *dev, struct dw_cq *cq, const struct diwarp_wc *wc,
                    bool solicited)
{
        bool was_overflowed = cq->overflowed;
        if (dw_cq_push(cq, wc, solicited) == -EOVERFLOW && !was_overflowed) {
                dw_warn("device port %u: CQ %p overflow (cqe %u), completion of QP %#x lost",
                        dev->port, (void *)cq, cq->cqe, wc->qp_num);
                dw_async_cq(dev, cq, DIWARP_EVENT_CQ_ERR);
        }
}

/* ---- device --------------------------------------------------------------- */

static int dw_tcp_listen_open(struct in_addr addr, uint16_t port)
{
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
        int one = 1, err;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        /* TIME_WAIT leftovers of a previous run must not block the port; two
         * listeners on one port stay impossible without SO_REUSEPORT. */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 128) < 0) {
                err = -errno;
                close(fd);
                return err;
        }
        return fd;
}

/* The GID table: the pinned address alone, or the host's addresses with the
 * sockets on the wildcard address (127.0.0.1 when no interface is up, as in
 * a fresh network namespace, whose loopback is down). */
static int dw_device_gids(struct dw_device *dev)
{
        struct diwarp_netif *g = dev->gids;
        dev->nrails = 1;
        if (dev->cfg.addr[0]) {
                struct in_addr a[DW_CONFIG_MAX_RAILS];
                const char *why = NULL;
                int n = dw_config_parse_addrs(dev->cfg.addr, a, &why);
                if (n < 0) {
                        dw_err("device open: address '%s': %s", dev->cfg.addr, why);
                        return -EINVAL;
                }
                for (int i = 0; i < n; i++) {
                        memset(&g[i], 0, sizeof(g[i]));
                        if (dw_netif_find(a[i], &g[i]) < 0)
                                g[i].addr = a[i].s_addr; /* bind() reports it is not local */
                }
                dev->ngid = n;
                dev->nrails = n;
                /* Several rails share one socket on the wildcard address: the
                 * route to a peer's rail picks the interface and the source. */
                dev->bind_addr = a[0];
                if (n > 1)
                        dev->bind_addr.s_addr = htonl(INADDR_ANY);
        } else {
                int n = dw_netif_list(g, DIWARP_MAX_GIDS);
                if (n < 0)
                        dw_warn("device open: cannot list the host's addresses (%s); using "
                                "127.0.0.1",
                                strerror(-n));
                if (n <= 0) {
                        memset(g, 0, sizeof(*g));
                        g->addr = htonl(INADDR_LOOPBACK);
                        snprintf(g->ifname, sizeof(g->ifname), "lo");
                        g->loopback = true;
                        n = 1;
                }
                dev->ngid = n;
                dev->bind_addr.s_addr = htonl(INADDR_ANY);
        }
        dev->addr.s_addr = g->addr;
        dw_ipv4_to_gid(dev->addr, &dev->gid);
        return 0;
}

/* Takes the first port at or above the base where both the UDP socket and
 * the TCP listener bind. */
static int dw_device_bind(struct dw_device *dev)
{
        int last = -EADDRINUSE;
        for (unsigned i = 0; i < DW_MAX_INSTANCE; i++) {
                unsigned port = dev->cfg.port_base + i;
                if (port > 65535)
                        break;
                int err = dw_udp_open(&dev->udp, dev->bind_addr, (uint16_t)port);
                if (err == -EADDRINUSE || err == -EACCES) {
                        last = err;
                        continue;
                }
                if (err < 0)
                        return err;
                int fd = dw_tcp_listen_open(dev->bind_addr, (uint16_t)port);
                if (fd == -EADDRINUSE || fd == -EACCES) {
                        dw_udp_close(&dev->udp);
                        last = fd;
                        continue;
                }
                if (fd < 0) {
                        dw_udp_close(&dev->udp);
                        return fd;
                }
                dev->tcp_listen_fd = fd;
                dev->port = (uint16_t)port;
                dev->instance = (uint16_t)i;
                return 0;
        }
        return last;
}

/* The transports' hooks for the progress step, in the order a step calls
 * them: UD takes every datagram of the UDP socket (and hands RD's on), RC's
 * progress runs before RD's. */
static const struct dw_transport_ops dw_ud_transport = {
    .rx_dgram = dw_ud_rx,
    .tx = dw_ud_tx_waiting,
};
static const struct dw_transport_ops dw_rc_transport = {
    .poll = dw_rc_poll,
    .progress = dw_rc_progress,
};
static const struct dw_transport_ops dw_rd_transport = {
    .rx_begin = dw_rd_rx_clock,
    .rx_direct = dw_rd_rx_direct,
    .progress = dw_rd_progress,
};
static const struct dw_transport_ops *const dw_transports[] = {
    &dw_ud_transport,
    &dw_rc_transport,
    &dw_rd_transport,
};

/* The device's settings: DIWARP_* from the environment, then what the
 * caller's options override. */
static int dw_device_settings(struct dw_device *dev, const struct diwarp_open_opts *opts)
{
        const char *why = NULL;
        int err = dw_config_from_env(&dev->cfg, &why);

        if (err < 0) {
                dw_err("device open: bad configuration: %s", why ? why : "?");
                return err;
        }
        dw_log_set_level(dev->cfg.log_level);
        if (opts && opts->addr) {
                if (strlen(opts->addr) >= sizeof(dev->cfg.addr))
                        return -EINVAL;
                strcpy(dev->cfg.addr, opts->addr);
        }
        if (opts && opts->port_base)
                dev->cfg.port_base = opts->port_base;
        if (opts && (opts->flags & DIWARP_OPEN_LOCAL_COPY) && dev->cfg.local_copy < 0)
                dev->cfg.local_copy = 1; /* DIWARP_LOCAL_COPY unset */
        return 0;
}

/* The UDP socket and the TCP listener on one port (dw_device_bind), with
 * io_uring under the socket when DIWARP_IO asks for it. On failure, says
 * why and leaves no socket open. */
static int dw_device_sockets(struct dw_device *dev)
{
        const char *where = dev->cfg.addr[0] ? dev->cfg.addr : "0.0.0.0";
        int err = dw_device_bind(dev);

        if (err < 0) {
                if (err == -EADDRNOTAVAIL)
                        /* Not a port problem: bind() cannot use an address no
                         * interface of this host (or namespace) has. */
                        dw_err("device open: address %s is not local (EADDRNOTAVAIL: no "
                               "interface of this host has it)",
                               where);
                else if (err == -EADDRINUSE || err == -EACCES)
                        dw_err("device open: no free UDP+TCP port on %s from %u: %s", where,
                               dev->cfg.port_base, strerror(-err));
                else
                        dw_err("device open: cannot bind UDP+TCP port %u on %s: %s",
                               dev->cfg.port_base, where, strerror(-err));
                return err;
        }
        if (dev->cfg.io != DW_IO_URING)
                return 0;
        err = dw_udp_enable_uring(&dev->udp);
        if (err == -ENOTSUP) {
                dw_err("device open: DIWARP_IO=uring, but this libdiwarp was built "
                       "without liburing (install liburing-dev and rebuild, or use "
                       "DIWARP_IO=plain)");
                dw_udp_close(&dev->udp);
                close(dev->tcp_listen_fd);
                return err;
        }
        if (err < 0)
                dw_warn("device port %u: io_uring unavailable (%s); using the plain "
                        "sendmmsg/recvmmsg backend",
                        dev->port, strerror(-err));
        return 0;
}

/* What the device does to its datagrams besides sending them: fault
 * injection (DIWARP_FAULT) and the seal (CRC32c, DIWARP_AUTH's AES-GMAC).
 * On failure, says why and leaves neither. */
static int dw_device_guards(struct dw_device *dev)
{
        const char *why = NULL;
        int err = dw_fault_init(&dev->fault, dev->cfg.fault_spec, dev->cfg.fault_seed, &why);

        if (err < 0) {
                dw_err("device open: DIWARP_FAULT: %s", why ? why : "?");
                return err;
        }
        dev->fault_on = dw_fault_enabled(&dev->fault);
        /* DIWARP_AUTH: the first nonce is random (wire/seal.h says why). */
        uint8_t start[DW_DGRAM_AUTH_NONCE_LEN];
        if (dev->cfg.auth_key_len && getrandom(start, sizeof(start), 0) != (ssize_t)sizeof(start)) {
                err = -errno;
                dw_err("device open: DIWARP_AUTH: getrandom failed: %s", strerror(errno));
                goto fail_fault;
        }
        err = dw_seal_init(&dev->seal, !dev->cfg.rd_crc, dev->cfg.auth_key, dev->cfg.auth_key_len,
                           start, &why);
        /* The contexts hold the key now; RC over RD keeps it for the key
         * of each connection (cm/, dw_seal_conn_key), until close. */
        if (dev->cfg.rc_transport != DW_RC_RD || !dev->cfg.auth_conn)
                memset(dev->cfg.auth_key, 0, sizeof(dev->cfg.auth_key));
        if (err < 0) {
                dw_err("device open: DIWARP_AUTH: %s", why ? why : "?");
                goto fail_fault;
        }
        return 0;

fail_fault:
        dw_fault_destroy(&dev->fault);
        return err;
}

/* What runs the device: the progress engine with the transports' hooks,
 * the host's shared state (in-flight caps), RC's listener, and the
 * progress thread when DIWARP_PROGRESS asks for it. On failure, leaves
 * none of them. */
static int dw_device_engine(struct dw_device *dev)
{
        /* What the progress engine reaches of the device (progress/ does not
         * include dw.h): set before it runs, fixed while the device is open. */
        const struct dw_progress_dev prog = {
            .handle = dev,
            .lock = &dev->lock,
            .udp = &dev->udp,
            .fault = &dev->fault,
            .fault_on = dev->fault_on,
            .rx_dropped_malformed = &dev->ctr.rx_dropped_malformed,
            .fault_slowrx_waits = &dev->ctr.fault_slowrx_waits,
            .port = dev->port,
            .wait_spin_us = dev->cfg.wait_spin_us,
        };
        int err = dw_progress_init(&dev->prog, &prog);

        if (err < 0)
                return err;
        for (size_t i = 0; i < sizeof(dw_transports) / sizeof(dw_transports[0]) && err >= 0; i++)
                err = dw_progress_add_transport(&dev->prog, dw_transports[i]);
        if (err < 0)
                goto fail_prog;
        dev->next_qp_index = DW_FIRST_QP_INDEX;
        err = dw_host_attach(dev);
        if (err < 0)
                goto fail_prog;
        pthread_mutex_lock(&dev->lock);
        err = dw_rc_dev_init(dev);
        pthread_mutex_unlock(&dev->lock);
        if (err < 0)
                goto fail_host;
        if (dev->cfg.progress_thread) {
                err = dw_progress_start(&dev->prog);
                if (err < 0)
                        goto fail_rc;
        }
        return 0;

fail_rc:
        pthread_mutex_lock(&dev->lock);
        dw_rc_dev_fini(dev);
        pthread_mutex_unlock(&dev->lock);
fail_host:
        dw_host_detach();
fail_prog:
        dw_progress_fini(&dev->prog);
        return err;
}

/* The open device becomes visible: in the registry, in its statistics
 * object, and in one line of the log. */
static void dw_device_announce(struct dw_device *dev)
{
        char a0[INET_ADDRSTRLEN];

        dw_registry_add(dev);
        pthread_mutex_lock(&dev->lock);
        dw_stat_shm_open(dev);
        pthread_mutex_unlock(&dev->lock);
        inet_ntop(AF_INET, &dev->addr, a0, sizeof(a0));
        dw_info(
            "device open: %s (%s, %d GIDs) port %u instance %u, %s I/O%s%s", a0,
            dev->nrails > 1    ? "multirail"
            : dev->cfg.addr[0] ? "pinned"
                               : "every host address",
            dev->ngid, dev->port, dev->instance, dw_udp_uring_on(&dev->udp) ? "io_uring" : "plain",
            dev->fault_on ? ", fault injection " : "", dev->fault_on ? dev->cfg.fault_spec : "");
}

int dwe_device_open(const struct diwarp_open_opts *opts, struct diwarp_device **out)
{
        int err;

        struct dw_device *dev = calloc(1, sizeof(*dev));
        if (!dev)
                return -ENOMEM;
        dev->udp.fd = -1;
        dev->tcp_listen_fd = -1;
        dev->prog.epfd = -1;
        dev->prog.wake_fd = -1;
        err = dw_device_settings(dev, opts);
        if (err >= 0)
                err = dw_device_gids(dev);
        if (err < 0) {
                free(dev);
                return err;
        }

        pthread_mutex_init(&dev->lock, NULL);
        err = dw_device_sockets(dev);
        if (err < 0)
                goto fail_lock;
        err = dw_mr_table_init(&dev->mrs, DW_MAX_MR);
        if (err < 0)
                goto fail_sock;
        err = dw_async_queue_init(&dev->async, 0);
        if (err < 0)
                goto fail_mr;
        err = dw_device_guards(dev);
        if (err < 0)
                goto fail_async;
        err = dw_device_engine(dev);
        if (err < 0)
                goto fail_guards;
        dw_device_announce(dev);
        *out = dw_dev_pub(dev);
        return 0;

fail_guards:
        dw_seal_fini(&dev->seal);
        memset(dev->cfg.auth_key, 0, sizeof(dev->cfg.auth_key));
        dw_fault_destroy(&dev->fault);
fail_async:
        dw_async_queue_fini(&dev->async);
fail_mr:
        dw_mr_table_destroy(&dev->mrs);
fail_sock:
        dw_udp_close(&dev->udp);
        close(dev->tcp_listen_fd);
fail_lock:
        pthread_mutex_destroy(&dev->lock);
        free(dev);
        return err;
}

int dwe_device_close(struct diwarp_device *d)
{
        struct dw_device *dev = dw_dev_of(d);
        pthread_mutex_lock(&dev->lock);
        if (dev->nqp || dev->ncq || dev->npd || dev->nsrq || dev->nah || dev->nchannel) {
                dw_warn("device port %u: close refused, objects still exist (qp %d cq %d pd %d "
                        "srq %d ah %d channel %d)",
                        dev->port, dev->nqp, dev->ncq, dev->npd, dev->nsrq, dev->nah,
                        dev->nchannel);
                pthread_mutex_unlock(&dev->lock);
                return -EBUSY;
        }
        dw_stat_shm_close(dev);
        pthread_mutex_unlock(&dev->lock);
        dw_registry_remove(dev);
        dw_progress_stop(&dev->prog);
        pthread_mutex_lock(&dev->lock);
        dw_rc_dev_fini(dev);
        dw_rd_dev_fini(dev);
        /* Packets still held by the fault model leave now: a reorder or delay
         * must not turn into a loss at close. */
        if (dev->fault_on)
                dw_fault_flush_all(&dev->fault, dw_udp_send_fn, &dev->udp);
        pthread_mutex_unlock(&dev->lock);
        dw_host_detach();
        dw_progress_fini(&dev->prog);
        dw_seal_fini(&dev->seal);
        memset(dev->cfg.auth_key, 0, sizeof(dev->cfg.auth_key));
        dw_fault_destroy(&dev->fault);
        dw_async_queue_fini(&dev->async);
        dw_mr_table_destroy(&dev->mrs);
        dw_udp_close(&dev->udp);
        if (dev->tcp_listen_fd >= 0)
                close(dev->tcp_listen_fd);
        pthread_mutex_destroy(&dev->lock);
        free(dev);
        return 0;
}

int dwe_device_query(struct diwarp_device *d, struct diwarp_device_attr *a)
{
        struct dw_device *dev = dw_dev_of(d);
        memset(a, 0, sizeof(*a));
        snprintf(a->fw_ver, sizeof(a->fw_ver), "diwarp %s", diwarp_version());
        pthread_mutex_lock(&dev->lock);
        /* GUID: the IPv4 address and the port, unique per instance on a host. */
        a->node_guid =
            (uint64_t)ntohl(dev->addr.s_addr) << 32 | (uint64_t)dev->port << 16 | dev->instance;
        pthread_mutex_unlock(&dev->lock);
        a->vendor_id = 0x444957; /* "DIW": our own, not a hardware vendor's */
        a->vendor_part_id = 0x1;
        a->hw_ver = 1;
        a->max_mr_size = UINT64_MAX;
        a->max_qp = DW_MAX_QP - DW_FIRST_QP_INDEX;
        a->max_qp_wr = DW_MAX_QP_WR;
        a->max_sge = DW_MAX_SGE;
        a->max_cq = DW_MAX_CQ;
        a->max_cqe = DW_MAX_CQE;
        a->max_mr = DW_MAX_MR;
        a->max_pd = DW_MAX_PD;
        a->max_qp_rd_atom = DW_MAX_RD_ATOM;
        a->max_qp_init_rd_atom = DW_MAX_RD_ATOM;
        a->max_res_rd_atom = DW_MAX_RD_ATOM * (DW_MAX_QP - DW_FIRST_QP_INDEX);
        a->max_srq = DW_MAX_SRQ;
        a->max_srq_wr = DW_MAX_SRQ_WR;
        a->max_srq_sge = DW_MAX_SGE;
        a->max_ah = DW_MAX_AH;
        a->max_inline_data = DW_MAX_INLINE;
        a->max_msg_size_rc = DW_MAX_MSG_RC;
        /* One datagram per UD message; the Send-with-Immediate limit is the
         * smaller one, and the one every UD message size stays within. */
        a->max_msg_size_ud =
            DW_DGRAM_MAX_UD_MSG_IMM - (dev->seal.mac ? DW_DGRAM_AUTH_LEN - DW_DGRAM_CRC_LEN : 0);
        a->atomics = true;
        a->max_mw = DW_MAX_MR;
        return 0;
}

int dwe_device_gid(struct diwarp_device *d, union diwarp_gid *gid)
{
        struct dw_device *dev = dw_dev_of(d);
        *gid = dev->gid;
        return 0;
}

int dwe_device_rails(struct diwarp_device *d, struct diwarp_rail_stats *out, int max)
{
        struct dw_device *dev = dw_dev_of(d);
        pthread_mutex_lock(&dev->lock);
        int n = dw_device_rails_locked(dev, out, max);
        pthread_mutex_unlock(&dev->lock);
        return n;
}

int dw_device_rails_locked(struct dw_device *dev, struct diwarp_rail_stats *out, int max)
{
        bool down[DIWARP_MAX_RAILS];
        dw_rd_rails_down(dev, down);
        for (int i = 0; i < dev->nrails && i < max; i++) {
                const struct dw_rail_ctr *c = &dev->rail[i];
                out[i] = (struct diwarp_rail_stats){.addr = dev->gids[i].addr,
                                                    .tx_bytes = c->tx_bytes,
                                                    .tx_packets = c->tx_packets,
                                                    .retransmits = c->retransmits,
                                                    .downs = c->downs,
                                                    .up = !down[i]};
        }
        return dev->nrails;
}

int dwe_device_gid_table(struct diwarp_device *d, struct diwarp_netif *out, int max)
{
        struct dw_device *dev = dw_dev_of(d);
        for (int i = 0; i < dev->ngid && i < max; i++)
                out[i] = dev->gids[i];
        return dev->ngid;
}

int diwarp_host_netifs(struct diwarp_netif *out, int max)
{
        if (max < 0 || (max > 0 && !out))
                return -EINVAL;
        struct diwarp_netif all[DIWARP_MAX_GIDS];
        int n = dw_netif_list(all, DIWARP_MAX_GIDS);
        for (int i = 0; i < n && i < max; i++)
                out[i] = all[i];
        return n;
}

int dwe_device_port(struct diwarp_device *d, uint16_t *port, uint16_t *instance)
{
        struct dw_device *dev = dw_dev_of(d);
        if (port)
                *port = dev->port;
        if (instance)
                *instance = dev->instance;
        return 0;
}

/* dw_progress_nap_drive's test for diwarp_progress: none; its nap ends
 * with the first step that did work (or the bound). */
static int progress_never_done(void *ctx)
{
        (void)ctx;
        return 0;
}

int dwe_progress(struct diwarp_device *d, int budget)
{
        struct dw_device *dev = dw_dev_of(d);
        /* On a shared host the progress thread makes the progress (see
         * diwarp_cq_poll); the caller naps until some progress was made (or
         * the nap's bound passed), so that the core goes to whoever has
         * work: as the driver, making it itself, unless another thread
         * drives (then until the thread did some). A sched_yield here kept every such loop
         * runnable: with 8 RD Write pairs on the 2 cores, each responder looping on
         * diwarp_progress, yields and their context switches were 30 % of
         * all CPU (perf). */
        if (dw_progress_app_poll(&dev->prog)) {
                if (dw_progress_nap_drive(&dev->prog, progress_never_done, NULL) == -EBUSY)
                        dw_progress_nap(&dev->prog, dw_progress_nap_begin(&dev->prog, true), true);
                return 0;
        }
        pthread_mutex_lock(&dev->lock);
        int n = dw_progress_step(&dev->prog, budget ? budget : DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&dev->lock);
        return n;
}

int dwe_progress_thread_start(struct diwarp_device *d)
{
        struct dw_device *dev = dw_dev_of(d);
        return dw_progress_start(&dev->prog);
}

int dwe_external_progress(struct diwarp_device *d)
{
        return dw_progress_external(&dw_dev_of(d)->prog);
}

int dwe_external_timeout(struct diwarp_device *d, int64_t *ns)
{
        return dw_progress_external_timeout(&dw_dev_of(d)->prog, ns);
}

int dwe_external_run(struct diwarp_device *d)
{
        return dw_progress_external_run(&dw_dev_of(d)->prog);
}

int dwe_device_counters(struct diwarp_device *d, struct diwarp_counters *out)
{
        struct dw_device *dev = dw_dev_of(d);
        pthread_mutex_lock(&dev->lock);
        dw_device_counters_locked(dev, out);
        pthread_mutex_unlock(&dev->lock);
        return 0;
}

void dw_device_counters_locked(struct dw_device *dev, struct diwarp_counters *out)
{
        *out = dev->ctr;
        out->progress_takeovers = atomic_load_explicit(&dev->prog.takeovers, memory_order_relaxed);
        out->progress_park_wakes =
            atomic_load_explicit(&dev->prog.park_wakes, memory_order_relaxed);
        out->progress_nap_drives =
            atomic_load_explicit(&dev->prog.nap_drives, memory_order_relaxed);
        out->progress_timer_wakes =
            atomic_load_explicit(&dev->prog.timer_wakes, memory_order_relaxed);
        dw_rd_dev_counters(dev, out);
}

/* ---- protection domains ---------------------------------------------------- */

int dwe_pd_alloc(struct diwarp_device *d, struct diwarp_pd **out)
{
        struct dw_device *dev = dw_dev_of(d);
        struct dw_pd *pd = calloc(1, sizeof(*pd));
        if (!pd)
                return -ENOMEM;
        pthread_mutex_lock(&dev->lock);
        if (dev->npd >= DW_MAX_PD) {
                pthread_mutex_unlock(&dev->lock);
                free(pd);
                return -ENOMEM;
        }
        dw_pd_init(&dev->mrs, pd, dev);
        dev->npd++;
        pthread_mutex_unlock(&dev->lock);
        *out = (struct diwarp_pd *)pd;
        return 0;
}

int dwe_pd_dealloc(struct diwarp_pd *p)
{
        struct dw_pd *pd = dw_pd_of(p);
        struct dw_device *dev = pd->dev;
        pthread_mutex_lock(&dev->lock);
        int err = dw_pd_fini(pd);
        if (err == 0)
                dev->npd--;
        pthread_mutex_unlock(&dev->lock);
        if (err == 0)
                free(pd);
        return err;
}

/* ---- memory regions ---------------------------------------------------------- */

int dwe_mr_reg(struct diwarp_pd *p, void *addr, size_t length, uint64_t iova, int access,
               struct diwarp_mr **out)
{
        struct dw_pd *pd = dw_pd_of(p);
        struct dw_mr *mr = NULL;
        struct dw_device *dev = pd->dev;
        pthread_mutex_lock(&dev->lock);
        int err = dw_mr_register(&dev->mrs, pd, addr, length, iova, access, &mr);
        pthread_mutex_unlock(&dev->lock);
        if (err < 0)
                return err;
        *out = (struct diwarp_mr *)mr;
        return 0;
}

int dwe_mr_dereg(struct diwarp_mr *m)
{
        struct dw_mr *mr = (struct dw_mr *)m;
        if (!mr->pd)
                return -EINVAL;
        struct dw_device *dev = mr->pd->dev;
        pthread_mutex_lock(&dev->lock);
        int err = dw_mr_deregister(&dev->mrs, mr);
        pthread_mutex_unlock(&dev->lock);
        if (err == -EBUSY)
                dw_warn("MR STag %#x: deregistration refused: memory windows are bound to it",
                        mr->stag);
        return err;
}

int dwe_mr_rereg(struct diwarp_mr *m, int flags, struct diwarp_pd *p, void *addr, size_t length,
                 uint64_t iova, int access)
{
        struct dw_mr *mr = (struct dw_mr *)m;
        if (!mr->pd)
                return -EINVAL;
        struct dw_device *dev = mr->pd->dev;
        struct dw_pd *pd = NULL;
        if (flags & DIWARP_REREG_PD) {
                pd = dw_pd_of(p);
                if (!pd || pd->dev != dev)
                        return -EINVAL;
        }
        pthread_mutex_lock(&dev->lock);
        int err = dw_mr_rereg(&dev->mrs, mr, flags, pd, addr, length, iova, access);
        pthread_mutex_unlock(&dev->lock);
        return err;
}

/* ---- memory windows ------------------------------------------------------------ */

int dwe_mw_alloc(struct diwarp_pd *p, enum diwarp_mw_type type, struct diwarp_mw **out)
{
        struct dw_pd *pd = dw_pd_of(p);
        struct dw_mr *mw = NULL;
        struct dw_device *dev = pd->dev;
        pthread_mutex_lock(&dev->lock);
        int err =
            dw_mw_alloc(&dev->mrs, pd, type == DIWARP_MW_TYPE_1 ? DW_STAG_MW1 : DW_STAG_MW2, &mw);
        pthread_mutex_unlock(&dev->lock);
        if (err < 0)
                return err;
        *out = (struct diwarp_mw *)mw;
        return 0;
}

int dwe_mw_dealloc(struct diwarp_mw *m)
{
        struct dw_mr *mw = (struct dw_mr *)m;
        if (!mw->pd)
                return -EINVAL;
        struct dw_device *dev = mw->pd->dev;
        pthread_mutex_lock(&dev->lock);
        int err = dw_mw_dealloc(&dev->mrs, mw);
        pthread_mutex_unlock(&dev->lock);
        return err;
}

int dwe_mw_info(const struct diwarp_mw *m, struct diwarp_mw_info *info)
{
        const struct dw_mr *mw = (const struct dw_mr *)m;
        if (!mw->pd || (mw->kind != DW_STAG_MW1 && mw->kind != DW_STAG_MW2))
                return -EINVAL;
        struct dw_device *dev = mw->pd->dev;
        pthread_mutex_lock(&dev->lock);
        info->rkey = mw->stag;
        info->type = mw->kind == DW_STAG_MW1 ? DIWARP_MW_TYPE_1 : DIWARP_MW_TYPE_2;
        info->bound = mw->valid;
        info->addr = mw->iova;
        info->length = mw->length;
        info->access = mw->access;
        pthread_mutex_unlock(&dev->lock);
        return 0;
}

int dwe_mr_info(const struct diwarp_mr *m, struct diwarp_mr_info *info)
{
        const struct dw_mr *mr = (const struct dw_mr *)m;
        info->addr = mr->addr;
        info->length = mr->length;
        info->iova = mr->iova;
        info->lkey = mr->stag;
        info->rkey = mr->stag;
        info->access = mr->access;
        return 0;
}

/* ---- completion channels and CQs ---------------------------------------------- */

int dwe_comp_channel_create(struct diwarp_device *d, struct diwarp_comp_channel **out)
{
        struct dw_device *dev = dw_dev_of(d);
        struct dw_channel_obj *ch = calloc(1, sizeof(*ch));
        if (!ch)
                return -ENOMEM;
        int err = dw_comp_channel_init(&ch->ch);
        if (err < 0) {
                free(ch);
                return err;
        }
        ch->dev = dev;
        /* An application that sleeps on a channel fd calls nothing that could
         * drive progress, so a channel brings the progress thread up. */
        err = dw_progress_start(&dev->prog);
        if (err < 0) {
                dw_comp_channel_fini(&ch->ch);
                free(ch);
                return err;
        }
        pthread_mutex_lock(&dev->lock);
        dev->nchannel++;
        pthread_mutex_unlock(&dev->lock);
        *out = (struct diwarp_comp_channel *)ch;
        return 0;
}

int dwe_comp_channel_destroy(struct diwarp_comp_channel *c)
{
        struct dw_channel_obj *ch = (struct dw_channel_obj *)c;
        struct dw_device *dev = ch->dev;
        pthread_mutex_lock(&dev->lock);
        int err = dw_comp_channel_fini(&ch->ch);
        if (err == 0)
                dev->nchannel--;
        pthread_mutex_unlock(&dev->lock);
        if (err == 0)
                free(ch);
        return err;
}

int dwe_comp_channel_fd(const struct diwarp_comp_channel *c)
{
        const struct dw_channel_obj *ch = (const struct dw_channel_obj *)c;
        return dw_comp_channel_fd(&ch->ch);
}

/* dw_progress_wait's test of a completion channel wait: an event taken. */
struct dw_channel_take {
        struct dw_comp_channel *ch;
        struct dw_cq *cq;
        void *ctx;
};

static int dw_channel_take_done(void *arg)
{
        struct dw_channel_take *t = arg;
        return dw_comp_channel_take(t->ch, &t->cq, &t->ctx) == 0;
}

/* Also when the waiting thread is cancelled in its sleep. */
static void dw_channel_unquiet(void *ch)
{
        dw_comp_channel_quiet(ch, false);
}

int dwe_comp_channel_get_event(struct diwarp_comp_channel *c, struct diwarp_cq **cq,
                               void **cq_context)
{
        struct dw_channel_obj *ch = (struct dw_channel_obj *)c;
        struct dw_cq *q = NULL;
        void *ctx = NULL;
        int err = dw_comp_channel_take(&ch->ch, &q, &ctx);
        if (err == -EAGAIN) {
                err = dw_comp_channel_blocking(&ch->ch);
                if (err == 0)
                        return -EAGAIN;
                if (err > 0) {
                        /* The waiting thread drives the device itself
                         * (progress/README.md, "Event-driven programs"). */
                        struct dw_channel_take t = {.ch = &ch->ch};
                        dw_comp_channel_quiet(&ch->ch, true);
                        pthread_cleanup_push(dw_channel_unquiet, &ch->ch);
                        err = dw_progress_wait(&ch->dev->prog, dw_comp_channel_fd(&ch->ch),
                                               dw_channel_take_done, &t);
                        pthread_cleanup_pop(1);
                        q = t.cq;
                        ctx = t.ctx;
                }
        }
        if (err < 0)
                return err;
        if (cq)
                *cq = dw_cq_pub(q);
        if (cq_context)
                *cq_context = ctx;
        return 0;
}

int dwe_cq_create(struct diwarp_device *d, int cqe, void *cq_context,
                  struct diwarp_comp_channel *channel, struct diwarp_cq **out)
{
        struct dw_device *dev = dw_dev_of(d);
        if (cqe > DW_MAX_CQE)
                return -EINVAL;
        struct dw_cq_obj *cq = calloc(1, sizeof(*cq));
        if (!cq)
                return -ENOMEM;
        struct dw_channel_obj *ch = (struct dw_channel_obj *)channel;
        if (ch && ch->dev != dev) {
                free(cq);
                return -EINVAL;
        }
        pthread_mutex_lock(&dev->lock);
        /* The max_cq the device reports (diwarp_device_query) is enforced. */
        int err = dev->ncq >= DW_MAX_CQ ? -ENOMEM
                                        : dw_cq_init(&cq->cq, cqe, ch ? &ch->ch : NULL, cq_context);
        if (err == 0) {
                dev->ncq++;
                cq->cq.pushes = &dev->prog.cq_pushes;
                cq->cq.armed_count = &dev->prog.armed_cqs;
        }
        pthread_mutex_unlock(&dev->lock);
        if (err < 0) {
                free(cq);
                return err;
        }
        cq->dev = dev;
        *out = dw_cq_pub(&cq->cq);
        return 0;
}

int dwe_cq_destroy(struct diwarp_cq *c)
{
        struct dw_cq_obj *cq = dw_cq_of(c);
        struct dw_device *dev = cq->dev;
        pthread_mutex_lock(&dev->lock);
        if (cq->cq.use_count > 0) {
                pthread_mutex_unlock(&dev->lock);
                return -EBUSY;
        }
        dev->ncq--;
        dw_async_queue_purge(&dev->async, c);
        if (cq->cq.armed) { /* an arm that never fired counts no more */
                cq->cq.armed = false;
                dev->prog.armed_cqs--;
        }
        pthread_mutex_unlock(&dev->lock);
        /* Without the lock: dw_cq_fini waits until every delivered channel
         * event was acknowledged, which another thread may still be doing. */
        dw_cq_fini(&cq->cq);
        free(cq);
        return 0;
}

int dwe_cq_resize(struct diwarp_cq *c, int cqe)
{
        struct dw_cq_obj *cq = dw_cq_of(c);
        if (cqe > DW_MAX_CQE)
                return -EINVAL;
        pthread_mutex_lock(&cq->dev->lock);
        int err = dw_cq_resize(&cq->cq, cqe);
        pthread_mutex_unlock(&cq->dev->lock);
        return err;
}

/* dw_progress_nap_drive's test: the CQ holds a completion. */
static int cq_nonempty(void *ctx)
{
        return dw_cq_count_peek(ctx) != 0;
}

int dwe_cq_poll(struct diwarp_cq *c, int n, struct diwarp_wc *wc)
{
        struct dw_cq_obj *cq = dw_cq_of(c);
        struct dw_device *dev = cq->dev;
        bool shared = dw_progress_app_poll(&dev->prog);
        /* On a shared host the progress thread makes the progress; the lock
         * is taken only to pop, so a poller descheduled while it polls an
         * empty CQ holds nothing the thread needs, and it naps: as the
         * device's driver, asleep on its sockets, so that a message wakes
         * this poller alone (dw_progress_nap_drive), or, when another
         * thread drives, until the thread pushes a completion (or a bound
         * passed); not in the first empty polls after one that popped
         * something, which a program makes before it acts on what it popped
         * (dw_progress_poll_may_nap). */
        if (shared && dw_cq_count_peek(&cq->cq) == 0) {
                if (!dw_progress_poll_may_nap(dev->cfg.shared_nap_after))
                        return 0;
                int r = dw_progress_nap_drive(&dev->prog, cq_nonempty, &cq->cq);
                if (r == -EBUSY) {
                        uint32_t gen = dw_progress_nap_begin(&dev->prog, false);
                        if (dw_cq_count_peek(&cq->cq) == 0)
                                dw_progress_nap(&dev->prog, gen, false);
                        else
                                dw_progress_nap_cancel(&dev->prog, false);
                }
                if (dw_cq_count_peek(&cq->cq) == 0)
                        return 0;
        }
        pthread_mutex_lock(&dev->lock);
        if (!shared && dw_cq_count(&cq->cq) < (uint32_t)n)
                dw_progress_step(&dev->prog, DW_PROGRESS_BUDGET);
        int got = dw_cq_pop(&cq->cq, n, wc);
        pthread_mutex_unlock(&dev->lock);
        if (shared && got > 0)
                dw_progress_poll_got();
        return got;
}

int dwe_cq_set_timestamps(struct diwarp_cq *c, bool on)
{
        struct dw_cq_obj *cq = dw_cq_of(c);
        pthread_mutex_lock(&cq->dev->lock);
        cq->cq.timestamps = on;
        pthread_mutex_unlock(&cq->dev->lock);
        return 0;
}

int dwe_cq_req_notify(struct diwarp_cq *c, bool solicited_only)
{
        struct dw_cq_obj *cq = dw_cq_of(c);
        struct dw_progress *p = &cq->dev->prog;
        pthread_mutex_lock(&cq->dev->lock);
        uint32_t armed = p->armed_cqs;
        int err = dw_cq_arm(&cq->cq, solicited_only);
        /* The first armed CQ: a program that sleeps on its channel next
         * needs the parked thread's look now, not at the scheduler tick. */
        if (!armed && p->armed_cqs && dw_progress_parked_late(p))
                dw_progress_wake(p);
        pthread_mutex_unlock(&cq->dev->lock);
        return err;
}

void dwe_cq_ack_events(struct diwarp_cq *c, unsigned int nevents)
{
        struct dw_cq_obj *cq = dw_cq_of(c);
        dw_cq_ack_events(&cq->cq, nevents);
}

int dwe_cq_cqe(const struct diwarp_cq *c)
{
        const struct dw_cq_obj *cq = (const struct dw_cq_obj *)c;
        return (int)cq->cq.cqe;
}

/* ---- async events ---------------------------------------------------------------- */

int dwe_async_fd(struct diwarp_device *d)
{
        struct dw_device *dev = dw_dev_of(d);
        return dw_async_queue_fd(&dev->async);
}

int dwe_get_async_event(struct diwarp_device *d, struct diwarp_async_event *ev)
{
        struct dw_device *dev = dw_dev_of(d);
        /* The queue has its own mutex; blocking here must not stall the engine. */
        return dw_async_queue_get(&dev->async, ev);
}

/* ---- address handles ----------------------------------------------------------------- */

int dwe_ah_create(struct diwarp_pd *p, const union diwarp_gid *dgid, struct diwarp_ah **out)
{
        struct dw_pd *pd = dw_pd_of(p);
        struct in_addr ip;
        if (dw_gid_to_ipv4(dgid, &ip) < 0) {
                dw_warn("AH create: GID is not an IPv4-mapped address");
                return -EINVAL;
        }
        struct dw_ah *ah = calloc(1, sizeof(*ah));
        if (!ah)
                return -ENOMEM;
        ah->pd = pd;
        ah->dgid = *dgid;
        ah->ip = ip;
        struct dw_device *dev = pd->dev;
        pthread_mutex_lock(&dev->lock);
        if (dev->nah >= DW_MAX_AH) {
                pthread_mutex_unlock(&dev->lock);
                free(ah);
                return -ENOMEM;
        }
        dw_pd_get(pd);
        dev->nah++;
        pthread_mutex_unlock(&dev->lock);
        *out = (struct diwarp_ah *)ah;
        return 0;
}

int dwe_ah_destroy(struct diwarp_ah *a)
{
        struct dw_ah *ah = dw_ah_of(a);
        struct dw_device *dev = ah->pd->dev;
        pthread_mutex_lock(&dev->lock);
        dw_pd_put(ah->pd);
        dev->nah--;
        pthread_mutex_unlock(&dev->lock);
        free(ah);
        return 0;
}

/* ---- shared receive queues ------------------------------------------------------------ */

/* ibverbs IBV_SRQ_MAX_WR / IBV_SRQ_LIMIT */
#define DW_SRQ_MAX_WR 1
#define DW_SRQ_LIMIT  2

int dwe_srq_create(struct diwarp_pd *p, struct diwarp_srq_attr *attr, void *srq_context,
                   struct diwarp_srq **out)
{
        struct dw_pd *pd = dw_pd_of(p);
        if (attr->max_wr < 1 || attr->max_wr > DW_MAX_SRQ_WR || attr->max_sge > DW_MAX_SGE)
                return -EINVAL;
        struct dw_srq_obj *srq = calloc(1, sizeof(*srq));
        if (!srq)
                return -ENOMEM;
        uint32_t max_sge = attr->max_sge ? attr->max_sge : 1;
        int err = dw_srq_init(&srq->q, attr->max_wr, max_sge, srq_context);
        if (err < 0) {
                free(srq);
                return err;
        }
        srq->dev = pd->dev;
        srq->pd = pd;
        srq->max_sge = max_sge;
        struct dw_device *dev = pd->dev;
        pthread_mutex_lock(&dev->lock);
        if (dev->nsrq >= DW_MAX_SRQ) {
                pthread_mutex_unlock(&dev->lock);
                dw_srq_fini(&srq->q);
                free(srq);
                return -ENOMEM;
        }
        dw_pd_get(pd);
        dev->nsrq++;
        pthread_mutex_unlock(&dev->lock);
        attr->max_wr = srq->q.wq.capacity;
        attr->max_sge = max_sge;
        *out = dw_srq_pub(srq);
        return 0;
}

int dwe_srq_destroy(struct diwarp_srq *s)
{
        struct dw_srq_obj *srq = dw_srq_of(s);
        struct dw_device *dev = srq->dev;
        pthread_mutex_lock(&dev->lock);
        if (srq->q.use_count > 0) {
                pthread_mutex_unlock(&dev->lock);
                return -EBUSY;
        }
        dw_pd_put(srq->pd);
        dev->nsrq--;
        dw_async_queue_purge(&dev->async, s);
        pthread_mutex_unlock(&dev->lock);
        dw_srq_fini(&srq->q);
        free(srq);
        return 0;
}

int dwe_srq_modify(struct diwarp_srq *s, const struct diwarp_srq_attr *attr, int mask)
{
        struct dw_srq_obj *srq = dw_srq_of(s);
        /* Resizing is not supported (as on many RNICs). */
        if (mask & DW_SRQ_MAX_WR)
                return -EINVAL;
        if (mask & ~(DW_SRQ_MAX_WR | DW_SRQ_LIMIT))
                return -EINVAL;
        int err = 0;
        pthread_mutex_lock(&srq->dev->lock);
        if (mask & DW_SRQ_LIMIT)
                err = dw_srq_arm_limit(&srq->q, attr->srq_limit);
        pthread_mutex_unlock(&srq->dev->lock);
        return err;
}

int dwe_srq_query(struct diwarp_srq *s, struct diwarp_srq_attr *attr)
{
        struct dw_srq_obj *srq = dw_srq_of(s);
        pthread_mutex_lock(&srq->dev->lock);
        attr->max_wr = srq->q.wq.capacity;
        attr->max_sge = srq->max_sge;
        attr->srq_limit = srq->q.limit_armed ? srq->q.limit : 0;
        pthread_mutex_unlock(&srq->dev->lock);
        return 0;
}

int dwe_post_srq_recv(struct diwarp_srq *s, struct diwarp_recv_wr *wr,
                      struct diwarp_recv_wr **bad_wr)
{
        struct dw_srq_obj *srq = dw_srq_of(s);
        int err = 0;
        struct dw_device *dev = srq->dev;
        pthread_mutex_lock(&dev->lock);
        for (; wr; wr = wr->next) {
                struct dw_wqe *w = dw_wq_reserve(&srq->q.wq);
                if (!w) {
                        err = -ENOMEM;
                        break;
                }
                err = dw_wqe_from_recv_wr(&srq->q.wq, w, wr);
                if (err < 0)
                        break;
                dw_wq_commit(&srq->q.wq);
        }
        if (err < 0 && bad_wr)
                *bad_wr = wr;
        dw_rd_srq_posted(dev, srq);
        dw_progress_step(&dev->prog, DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&dev->lock);
        return err;
}
