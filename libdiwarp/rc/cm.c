/* RC connection management: native CM calls and the IB-style connect.
 * See cm.h for the private data layout and README.md for the decisions. */
#include "rc/cm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rc/mpa_conn.h"
#include "api/backend.h"
#include "dw.h"
#include "llp/tcp.h"
#include "rc/rc.h"
#include "util/keyhash.h"
#include "util/time.h"

static const uint8_t ibcm_magic[4] = {'D', 'W', 'Q', 'P'};

int dw_ibcm_pd_encode(const struct dw_ibcm_pd *in, uint8_t *buf, size_t cap)
{
        if (cap < DW_IBCM_PD_LEN)
                return -ENOSPC;
        memcpy(buf, ibcm_magic, 4);
        buf[4] = in->version;
        buf[5] = in->reason;
        buf[6] = buf[7] = 0;
        dw_put_be32(buf + 8, in->init_qpn);
        dw_put_be32(buf + 12, in->resp_qpn);
        memcpy(buf + 16, in->gid.raw, 16);
        return DW_IBCM_PD_LEN;
}

int dw_ibcm_pd_decode(const uint8_t *buf, size_t len, struct dw_ibcm_pd *out)
{
        if (len < DW_IBCM_PD_LEN)
                return len >= 4 && memcmp(buf, ibcm_magic, 4) == 0 ? -ENODATA : -EPROTO;
        if (memcmp(buf, ibcm_magic, 4) != 0 || buf[4] != DW_IBCM_VERSION)
                return -EPROTO;
        out->version = buf[4];
        out->reason = buf[5];
        out->init_qpn = dw_get_be32(buf + 8);
        out->resp_qpn = dw_get_be32(buf + 12);
        memcpy(out->gid.raw, buf + 16, 16);
        return 0;
}

static bool is_rc(const struct dw_qp *qp)
{
        return qp->type == DIWARP_QPT_RC || qp->type == DIWARP_QPT_UC;
}

static uint64_t ms_from_now(uint32_t ms)
{
        return dw_now_ns() + (uint64_t)ms * 1000000ull;
}

static uint32_t connect_timeout_ms(const struct dw_device *dev)
{
        return dev->cfg.connect_timeout_ms ? dev->cfg.connect_timeout_ms : 10000;
}

/* ======================================================================
 * IB-style connect, responder side: sockets accepted on the instance
 * listener, waiting for their MPA Request and for the QP they name.
 * ====================================================================== */

enum pend_state { PEND_READING, PEND_WAITING_QP, PEND_REPLYING };

struct dw_cm_pend {
        struct dw_cm_pend *next;
        struct dw_device *dev;
        int fd;
        bool watched;
        uint32_t events;
        struct sockaddr_in peer;
        enum pend_state state;
        struct dw_qp *qp; /* PEND_REPLYING: the QP the stream goes to */
        bool accepting;   /* the Reply being written accepts */
        struct dw_ibcm_pd req;
        uint64_t deadline_ns;
        struct dw_mpa_conn mpa;
};

#define DW_CM_MAX_PEND 256

static int pend_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx);

static void pend_watch(struct dw_cm_pend *p, uint32_t ev)
{
        if (!p->watched) {
                if (dw_progress_watch_fd(&p->dev->prog, p->fd, ev, pend_cb, p) == 0) {
                        p->watched = true;
                        p->events = ev;
                }
        } else if (ev != p->events && dw_progress_modify_fd(&p->dev->prog, p->fd, ev) == 0) {
                p->events = ev;
        }
}

static void pend_unwatch(struct dw_cm_pend *p)
{
        if (p->watched)
                dw_progress_unwatch_fd(&p->dev->prog, p->fd);
        p->watched = false;
}

static void pend_free(struct dw_cm_pend *p, bool close_fd)
{
        struct dw_rc_dev *rd = p->dev->rc;

        for (struct dw_cm_pend **pp = &rd->pend; *pp; pp = &(*pp)->next)
                if (*pp == p) {
                        *pp = p->next;
                        rd->npend--;
                        break;
                }
        pend_unwatch(p);
        if (close_fd && p->fd >= 0)
                close(p->fd);
        free(p);
}

static void pend_reply(struct dw_cm_pend *p, struct dw_qp *qp, uint8_t reason)
{
        uint8_t pd[DW_IBCM_PD_LEN];
        struct dw_ibcm_pd r = {.version = DW_IBCM_VERSION,
                               .reason = reason,
                               .init_qpn = p->req.init_qpn,
                               .resp_qpn = p->req.resp_qpn,
                               .gid = p->dev->gid};
        if (qp)
                dw_ipv4_to_gid(dw_qp_src_addr(qp), &r.gid);

        dw_ibcm_pd_encode(&r, pd, sizeof(pd));
        bool accept = reason == DW_IBCM_ACCEPT;
        uint16_t ird = qp ? dw_rc_offer_ird(qp) : 0, ord = qp ? dw_rc_offer_ord(qp) : 0;
        if (accept)
                dw_rc_register_end(qp, p->fd, NULL);
        if (dw_mpa_respond(&p->mpa, accept, ird, ord, pd, sizeof(pd)) < 0) {
                pend_free(p, true);
                return;
        }
        p->state = PEND_REPLYING;
        p->accepting = accept;
        p->qp = accept ? qp : NULL;
        if (accept)
                dw_rc_set_state(qp->rc, DW_RC_CONNECTING, "IB-style Request accepted");
        pend_watch(p, EPOLLOUT);
        pend_cb(p->dev, p->fd, EPOLLOUT, p);
}

/* Decides what a complete Request gets: accept now, wait for the QP, or reject. */
static void pend_try_match(struct dw_cm_pend *p)
{
        struct dw_device *dev = p->dev;
        char pb[32];
        struct dw_qp *qp = dw_qp_lookup(dev, p->req.resp_qpn);

        if (!qp || !is_rc(qp) || !qp->rc) {
                dw_warn("IB-style connect from %s: no RC QP %#x here; rejecting",
                        dw_tcp_addr_str(&p->peer, pb, sizeof(pb)), p->req.resp_qpn);
                pend_reply(p, NULL, DW_IBCM_NO_QP);
                return;
        }
        struct dw_rc_conn *c = qp->rc;
        bool ready = (qp->state == DIWARP_QPS_RTR || qp->state == DIWARP_QPS_RTS) &&
                     (qp->attr_mask_set & DIWARP_QP_DEST_QPN) &&
                     (qp->attr_mask_set & DIWARP_QP_AV) && c->state == DW_RC_IDLE && c->ib_style;
        if (ready && qp->attr.dest_qp_num == p->req.init_qpn &&
            memcmp(qp->attr.dgid.raw, p->req.gid.raw, 16) == 0 &&
            qp->peer.sin_addr.s_addr == p->peer.sin_addr.s_addr) {
                pend_reply(p, qp, DW_IBCM_ACCEPT);
                return;
        }
        if (c->state == DW_RC_UP || c->state == DW_RC_CONNECTING) {
                dw_warn("IB-style connect from %s for QP %#x: already connected; rejecting",
                        dw_tcp_addr_str(&p->peer, pb, sizeof(pb)), qp->qpn);
                pend_reply(p, NULL, DW_IBCM_BUSY);
                return;
        }
        /* The peer reached RTR first: hold the Request until our QP does
         * (or the deadline passes). Nothing to read meanwhile. */
        p->state = PEND_WAITING_QP;
        pend_unwatch(p);
}

static int pend_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx)
{
        struct dw_cm_pend *p = ctx;
        char pb[32];

        (void)fd;
        (void)events;
        if (!dw_mpa_step(&p->mpa)) {
                pend_watch(p, dw_mpa_poll_events(&p->mpa) == POLLOUT ? EPOLLOUT : EPOLLIN);
                return 0;
        }
        switch (p->mpa.state) {
        case DW_MPA_REQUEST:
                if (p->state != PEND_READING)
                        return 0;
                if (p->mpa.peer_markers ||
                    dw_ibcm_pd_decode(p->mpa.pd, p->mpa.pd_len, &p->req) < 0) {
                        dw_warn("IB-style connect from %s: %s; rejecting",
                                dw_tcp_addr_str(&p->peer, pb, sizeof(pb)),
                                p->mpa.peer_markers ? "MPA markers requested"
                                                    : "private data is not a diwarp QP request");
                        memset(&p->req, 0, sizeof(p->req));
                        pend_reply(p, NULL, DW_IBCM_BAD_REQUEST);
                        return 1;
                }
                pend_try_match(p);
                return 1;
        case DW_MPA_DONE: {
                struct dw_qp *qp = p->qp;
                struct dw_mpa_conn mc = p->mpa;
                struct sockaddr_in peer = p->peer;
                int sfd = p->fd;
                pend_unwatch(p);
                p->fd = -1;
                pend_free(p, false);
                dw_rc_handover(qp, &(struct dw_rc_stream){.fd = sfd, .mc = &mc, .peer = &peer},
                               DW_RC_SETUP_IB);
                return 1;
        }
        case DW_MPA_REJECTED:
                pend_free(p, true);
                return 1;
        default: /* FAILED */
                dw_info("IB-style connect from %s: %s (%s)",
                        dw_tcp_addr_str(&p->peer, pb, sizeof(pb)),
                        p->mpa.why ? p->mpa.why : "MPA setup failed", strerror(-p->mpa.err));
                if (p->state == PEND_REPLYING && p->accepting && p->qp && p->qp->rc)
                        dw_rc_set_state(p->qp->rc, DW_RC_IDLE, "IB-style Reply failed");
                pend_free(p, true);
                return 1;
        }
        (void)dev;
}

static int listen_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx)
{
        struct dw_rc_dev *rd = ctx;
        int work = 0;

        (void)events;
        for (int i = 0; i < 16; i++) {
                struct sockaddr_in peer;
                int s = dw_tcp_accept(fd, &peer);
                if (s < 0)
                        break;
                work++;
                if (rd->npend >= DW_CM_MAX_PEND) {
                        char pb[32];
                        dw_warn("instance listener: too many pending connects; dropping %s",
                                dw_tcp_addr_str(&peer, pb, sizeof(pb)));
                        close(s);
                        continue;
                }
                struct dw_cm_pend *p = calloc(1, sizeof(*p));
                if (!p) {
                        close(s);
                        continue;
                }
                p->dev = dev;
                p->fd = s;
                p->peer = peer;
                p->state = PEND_READING;
                p->deadline_ns = ms_from_now(connect_timeout_ms(dev));
                dw_mpa_init_responder(&p->mpa, s, dev->cfg.rc_crc, DW_RC_MAX_RD, DW_RC_MAX_RD);
                p->next = rd->pend;
                rd->pend = p;
                rd->npend++;
                dw_progress_timer(&dev->prog, p->deadline_ns);
                pend_watch(p, EPOLLIN);
                pend_cb(dev, s, EPOLLIN, p);
        }
        return work;
}

/* A QP reached RTR as the responder: a Request may already be waiting. */
static void pend_match_qp(struct dw_device *dev, struct dw_qp *qp)
{
        struct dw_rc_dev *rd = dev->rc;

        for (struct dw_cm_pend *p = rd->pend, *n; p; p = n) {
                n = p->next;
                if (p->state == PEND_WAITING_QP && p->req.resp_qpn == qp->qpn) {
                        pend_try_match(p);
                        if (qp->rc->state != DW_RC_IDLE)
                                return;
                }
        }
}

/* ======================================================================
 * IB-style connect, initiator side.
 * ====================================================================== */

struct dw_cm_att {
        struct dw_cm_att *next;
        struct dw_qp *qp;
        int fd;
        bool watched;
        uint32_t events;
        uint64_t deadline_ns; /* give up */
        uint64_t retry_ns;    /* fd < 0: next attempt */
        uint32_t backoff_ms;
        struct dw_mpa_conn mpa;
};

static int att_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx);

static void att_close_fd(struct dw_cm_att *a)
{
        if (a->fd < 0)
                return;
        if (a->watched)
                dw_progress_unwatch_fd(&a->qp->dev->prog, a->fd);
        a->watched = false;
        close(a->fd);
        a->fd = -1;
        dw_rc_unregister_end(a->qp);
}

static void att_free(struct dw_cm_att *a)
{
        struct dw_rc_dev *rd = a->qp->dev->rc;

        for (struct dw_cm_att **pp = &rd->atts; *pp; pp = &(*pp)->next)
                if (*pp == a) {
                        *pp = a->next;
                        break;
                }
        att_close_fd(a);
        if (a->qp->rc && a->qp->rc->cm == a)
                a->qp->rc->cm = NULL;
        free(a);
}

static void att_fatal(struct dw_cm_att *a, const char *why, int err)
{
        struct dw_qp *qp = a->qp;
        char pb[32];

        dw_warn("RC QP %#x: IB-style connect to %s (QP %#x) failed: %s%s%s", qp->qpn,
                dw_tcp_addr_str(&qp->peer, pb, sizeof(pb)), qp->attr.dest_qp_num, why,
                err ? ": " : "", err ? strerror(-err) : "");
        att_free(a);
        dw_rc_handover(qp, NULL, DW_RC_SETUP_IB);
}

static void att_watch(struct dw_cm_att *a)
{
        uint32_t ev = dw_mpa_poll_events(&a->mpa) == POLLOUT ? EPOLLOUT : EPOLLIN;

        if (!a->watched) {
                if (dw_progress_watch_fd(&a->qp->dev->prog, a->fd, ev, att_cb, a) == 0) {
                        a->watched = true;
                        a->events = ev;
                }
        } else if (ev != a->events && dw_progress_modify_fd(&a->qp->dev->prog, a->fd, ev) == 0) {
                a->events = ev;
        }
}

static void att_retry_later(struct dw_cm_att *a, int err, const char *why)
{
        struct dw_qp *qp = a->qp;
        uint64_t now = dw_now_ns();

        att_close_fd(a);
        if (now >= a->deadline_ns) {
                att_fatal(a, why, err);
                return;
        }
        dw_dbg("RC QP %#x: IB-style connect attempt failed (%s), retrying in %u ms", qp->qpn,
               strerror(-err), a->backoff_ms);
        a->retry_ns = now + (uint64_t)a->backoff_ms * 1000000ull;
        if (a->retry_ns > a->deadline_ns)
                a->retry_ns = a->deadline_ns;
        a->backoff_ms = a->backoff_ms * 2 > 500 ? 500 : a->backoff_ms * 2;
        dw_progress_timer(&qp->dev->prog, a->retry_ns);
}

static void att_start(struct dw_cm_att *a)
{
        struct dw_qp *qp = a->qp;
        struct dw_device *dev = qp->dev;
        uint8_t pd[DW_IBCM_PD_LEN];
        struct dw_ibcm_pd r = {
            .version = DW_IBCM_VERSION, .init_qpn = qp->qpn, .resp_qpn = qp->attr.dest_qp_num};
        bool inprog = false;
        /* The connection comes from the address of the QP's source GID: the
         * peer matches it, and the GID in the Request, to its QP's AV. */
        struct in_addr src = dw_qp_src_addr(qp);

        dw_ipv4_to_gid(src, &r.gid);
        dw_ibcm_pd_encode(&r, pd, sizeof(pd));
        int fd = dw_tcp_connect_start(src, &qp->peer, &inprog);
        if (fd < 0) {
                att_retry_later(a, fd, "TCP connect");
                return;
        }
        a->fd = fd;
        if (!dw_qp_on_rd(qp))
                dw_rc_register_end(qp, fd, &qp->peer); /* before the Request lets the peer send */
        dw_mpa_init_initiator(&a->mpa, fd, inprog, dev->cfg.rc_crc, dw_rc_offer_ird(qp),
                              dw_rc_offer_ord(qp), pd, sizeof(pd));
        att_watch(a);
        att_cb(dev, fd, 0, a);
}

static int att_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx)
{
        struct dw_cm_att *a = ctx;
        struct dw_qp *qp = a->qp;
        struct dw_ibcm_pd rep;

        (void)dev;
        (void)fd;
        (void)events;
        if (a->fd < 0)
                return 0;
        if (!dw_mpa_step(&a->mpa)) {
                att_watch(a);
                return 0;
        }
        switch (a->mpa.state) {
        case DW_MPA_DONE: {
                if (dw_ibcm_pd_decode(a->mpa.pd, a->mpa.pd_len, &rep) < 0 ||
                    rep.init_qpn != qp->qpn || rep.resp_qpn != qp->attr.dest_qp_num) {
                        att_fatal(a, "the Reply's private data does not name our QPs", 0);
                        return 1;
                }
                struct dw_mpa_conn mc = a->mpa;
                int sfd = a->fd;
                if (a->watched)
                        dw_progress_unwatch_fd(&qp->dev->prog, a->fd);
                a->watched = false;
                a->fd = -1;
                att_free(a);
                dw_rc_handover(qp, &(struct dw_rc_stream){.fd = sfd, .mc = &mc, .peer = &qp->peer},
                               DW_RC_SETUP_IB);
                return 1;
        }
        case DW_MPA_REJECTED: {
                const char *why = "rejected by the peer";
                if (dw_ibcm_pd_decode(a->mpa.pd, a->mpa.pd_len, &rep) == 0) {
                        switch (rep.reason) {
                        case DW_IBCM_NO_QP:
                                why = "the peer has no such QP";
                                break;
                        case DW_IBCM_NOT_READY:
                                why = "the peer QP did not reach RTR for us in time";
                                break;
                        case DW_IBCM_BUSY:
                                why = "the peer QP is already connected";
                                break;
                        default:
                                why = "the peer did not understand the request";
                                break;
                        }
                }
                att_fatal(a, why, 0);
                return 1;
        }
        default:
                att_retry_later(a, a->mpa.err ? a->mpa.err : -EPROTO,
                                a->mpa.why ? a->mpa.why : "MPA setup");
                return 1;
        }
}

/* RTR named the QP itself (GID and QPN), as InfiniBand and RoCE accept: a
 * loopback connection. Its stream is one TCP socket connected to itself, so
 * every FPDU it sends comes back to it: Sends reach its own receive queue,
 * Writes and Reads its own memory, Read Responses its own requests. No MPA
 * exchange (the one peer agrees with itself): CRC as the device's policy
 * asks, the QP's own IRD/ORD on both sides. */
static int self_connect(struct dw_qp *qp)
{
        struct dw_device *dev = qp->dev;
        struct in_addr src = dw_qp_src_addr(qp);
        int fd = dw_tcp_self_connect(src, ms_from_now(connect_timeout_ms(dev)));
        if (fd < 0) {
                char ab[INET_ADDRSTRLEN];
                dw_warn("RC QP %#x: connection to itself (RTR names its own GID and QPN): TCP "
                        "loopback on %s: %s",
                        qp->qpn, inet_ntop(AF_INET, &src, ab, sizeof(ab)), strerror(-fd));
                return fd;
        }
        struct dw_mpa_conn mc = {.fd = fd,
                                 .initiator = true,
                                 .state = DW_MPA_DONE,
                                 .want_crc = dev->cfg.rc_crc,
                                 .ird = dw_rc_offer_ird(qp),
                                 .ord = dw_rc_offer_ord(qp),
                                 .revision = 2,
                                 .crc = dev->cfg.rc_crc};
        mc.peer_ird = mc.ird;
        mc.peer_ord = mc.ord;
        dw_dbg("RC QP %#x: connected to itself", qp->qpn);
        return dw_rc_handover(qp, &(struct dw_rc_stream){.fd = fd, .mc = &mc, .peer = &qp->peer},
                              DW_RC_SETUP_ATTACH);
}

void dw_cm_att_step(struct dw_qp *qp)
{
        struct dw_cm_att *a = qp->rc ? qp->rc->cm : NULL;

        if (a && a->fd >= 0)
                att_cb(qp->dev, a->fd, 0, a);
}

int dw_cm_ib_connect(struct dw_qp *qp)
{
        struct dw_device *dev = qp->dev;
        struct dw_rc_dev *rd = dev->rc;
        struct dw_rc_conn *c = qp->rc;

        if (!rd || !c)
                return -EINVAL;
        union diwarp_gid sgid;
        dw_ipv4_to_gid(dw_qp_src_addr(qp), &sgid);
        int cmp = memcmp(sgid.raw, qp->attr.dgid.raw, 16);
        if (cmp == 0)
                cmp = qp->qpn < qp->attr.dest_qp_num ? -1 : qp->qpn > qp->attr.dest_qp_num;
        c->ib_style = true;
        if (cmp == 0)
                return self_connect(qp);
        if (cmp > 0) {
                /* Larger (GID, QPN): the peer connects to us. */
                pend_match_qp(dev, qp);
                return 0;
        }
        struct dw_cm_att *a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a->qp = qp;
        a->fd = -1;
        a->backoff_ms = 10;
        a->deadline_ns = ms_from_now(connect_timeout_ms(dev));
        a->next = rd->atts;
        rd->atts = a;
        c->cm = a;
        dw_rc_set_state(c, DW_RC_CONNECTING, "IB-style connect started");
        dw_progress_timer(&dev->prog, a->deadline_ns);
        att_start(a);
        return 0;
}

/* ======================================================================
 * Native CM for RC QPs carried by RD (DIWARP_RC_TRANSPORT=rd).
 * The MPA exchange runs on TCP as for any native connection, with a block of
 * ours ahead of the application's private data in the Request and the Reply
 * (docs/PROTOCOL.md): magic "DWR2", the sender's QPN (BE32), its flags (one
 * byte: which DIWARP_AUTH it runs) and first PSN (BE24), and its token
 * (BE64): the random value every datagram of the connection must carry to
 * it (the receiver drops any other, rd/). With DIWARP_AUTH=connection or
 * file:PATH both ends derive the connection's key from the two tokens (and
 * the file key: wire/seal.h, dw_seal_conn_key) and seal every datagram of
 * the connection with it; both ends must run the same setting, which the
 * flags let each end check before it binds its QP.
 * Each side then binds its QP to the peer's QPN as an IB-style RTR does (one
 * RD pseudo-stream), so every RDMA message goes over UDP. The TCP stream
 * stays open and idle as the connection's CM channel: its close is the
 * disconnect notice (the peer's QP goes to ERR, rdma_cm's DISCONNECTED), its
 * keepalive a liveness check. Nothing else is ever written to it.
 * ====================================================================== */

#define DW_RDCM_LEN 20
/* How long a native connect retries a refused TCP connect (diwarp_connect). */
#define RDCM_REFUSED_GRACE_MS 500

static const uint8_t rdcm_magic[4] = {'D', 'W', 'R', '2'};
/* The block of the version before tokens: refused by name. */
static const uint8_t rdcm_magic_old[4] = {'D', 'W', 'R', 'D'};

struct dw_cm_rdch {
        struct dw_qp *qp;
        int fd; /* -1 while the QP is claimed by a connect/accept in progress */
        bool watched;
        /* The peer closed the stream: the QP goes to ERR at end_at (see
         * rdch_cb), with QP_FATAL when end_err (the stream failed). */
        uint64_t end_at;
        int end_err;
        struct dw_cm_rdch *next;
};

/* How long an RC-over-RD QP stays up after its peer closed the CM stream:
 * what the peer sent before closing (its last data, the ACK of ours) rides on
 * UDP and may be read after the close, which comes on TCP. */
#define RDCH_END_GRACE_NS (2u * 1000 * 1000)

static bool rc_on_rd(const struct dw_device *dev)
{
        return dev->cfg.rc_transport == DW_RC_RD;
}

/* The flags byte of the block (byte 8): DIWARP_AUTH. */
#define RDCM_F_AUTH      0x01 /* connection key (DIWARP_AUTH=connection or file:PATH) */
#define RDCM_F_AUTH_FILE 0x02 /* ... with the file key mixed in (file:PATH) */
#define RDCM_F_KNOWN     (RDCM_F_AUTH | RDCM_F_AUTH_FILE)

/* Our side of the block: QPN, first PSN, the token we take datagrams with,
 * and the flags. */
struct rdcm_blk {
        uint32_t qpn, psn;
        uint64_t token;
        uint8_t flags;
};

static uint8_t rdcm_flags(const struct dw_device *dev)
{
        if (!dev->cfg.auth_conn)
                return 0;
        return RDCM_F_AUTH | (dev->cfg.auth_key_len ? RDCM_F_AUTH_FILE : 0);
}

static const char *rdcm_auth_name(uint8_t flags)
{
        return !(flags & RDCM_F_AUTH)       ? "off"
               : (flags & RDCM_F_AUTH_FILE) ? "file:PATH"
                                            : "connection";
}

static void rdcm_encode(uint8_t *buf, const struct rdcm_blk *b)
{
        memcpy(buf, rdcm_magic, 4);
        dw_put_be32(buf + 4, b->qpn);
        dw_put_be32(buf + 8, b->psn);
        buf[8] = b->flags;
        dw_put_be64(buf + 12, b->token);
}

/* Our block for qp: a fresh first PSN and token, both from getrandom.
 * The PSN is fresh per connection (IB's CM picks one at random too) and
 * unpredictable, so a stranger cannot aim datagrams at the stream's window;
 * a stale segment of an earlier connection of the same QP pair is dropped
 * anyway, for it carries that connection's token. 0 or -EIO. */
static int rdcm_ours(struct dw_qp *qp, struct rdcm_blk *b)
{
        uint32_t psn;
        int r = dw_random(&psn, sizeof(psn));
        if (r < 0)
                return r;
        b->qpn = qp->qpn;
        b->psn = psn & 0xffffff;
        b->flags = rdcm_flags(qp->dev);
        return dw_random64(&b->token);
}

/* 0 when the peer's block says it runs the DIWARP_AUTH we run; else
 * -EPROTO and *why names the setting at both ends. */
static int rdcm_auth_check(const struct dw_device *dev, const struct rdcm_blk *peer,
                           const char **why)
{
        static __thread char buf[160];
        uint8_t ours = rdcm_flags(dev);
        if (peer->flags == ours)
                return 0;
        snprintf(buf, sizeof(buf),
                 "DIWARP_AUTH differs: the peer runs with %s, this end with %s (both ends must "
                 "set the same)",
                 rdcm_auth_name(peer->flags), rdcm_auth_name(ours));
        *why = buf;
        return -EPROTO;
}

/* The private data an RC-over-RD Request/Reply carries: the block, then the
 * application's bytes; *pd and *pd_len are updated to point at buf. */
static void rdcm_wrap(uint8_t *buf, const struct rdcm_blk *b, const void **pd, uint16_t *pd_len)
{
        rdcm_encode(buf, b);
        if (*pd_len)
                memcpy(buf + DW_RDCM_LEN, *pd, *pd_len);
        *pd = buf;
        *pd_len += DW_RDCM_LEN;
}

/* 0 and the sender's block, or -EPROTO when it is absent (*why says how). */
static int rdcm_decode(const uint8_t *pd, uint16_t len, struct rdcm_blk *b, const char **why)
{
        if (len >= 4 && memcmp(pd, rdcm_magic_old, 4) == 0) {
                *why = "its block has no connection token (the peer runs an older diwarp: both "
                       "ends must run this version)";
                return -EPROTO;
        }
        if (len < DW_RDCM_LEN || memcmp(pd, rdcm_magic, 4) != 0) {
                *why = "it carries no QPN (is the peer's DIWARP_RC_TRANSPORT rd?)";
                return -EPROTO;
        }
        b->qpn = dw_get_be32(pd + 4);
        b->flags = pd[8];
        b->psn = dw_get_be32(pd + 8) & 0xffffff;
        b->token = dw_get_be64(pd + 12);
        if (b->flags & ~RDCM_F_KNOWN) {
                *why = "its block has flags this version does not know (both ends must run the "
                       "same version)";
                return -EPROTO;
        }
        if (b->token == 0) {
                *why = "its connection token is 0";
                return -EPROTO;
        }
        return 0;
}

static struct dw_cm_rdch *rdch_of(const struct dw_qp *qp)
{
        struct dw_rc_dev *rd = qp->dev->rc;
        for (struct dw_cm_rdch *ch = rd ? rd->rdchs : NULL; ch; ch = ch->next)
                if (ch->qp == qp)
                        return ch;
        return NULL;
}

static void rdch_close_fd(struct dw_cm_rdch *ch)
{
        if (ch->watched)
                dw_progress_unwatch_fd(&ch->qp->dev->prog, ch->fd);
        ch->watched = false;
        if (ch->fd >= 0)
                close(ch->fd);
        ch->fd = -1;
}

static void rdch_free(struct dw_cm_rdch *ch)
{
        struct dw_device *dev = ch->qp->dev;
        struct dw_rc_dev *rd = dev->rc;

        for (struct dw_cm_rdch **pp = &rd->rdchs; *pp; pp = &(*pp)->next)
                if (*pp == ch) {
                        *pp = ch->next;
                        break;
                }
        if (ch->end_at)
                rd->rdchs_ending--;
        rdch_close_fd(ch);
        free(ch);
}

static void rdch_drop(struct dw_qp *qp)
{
        struct dw_cm_rdch *ch = rdch_of(qp);
        if (ch)
                rdch_free(ch);
}

/* The peer closed its CM stream (rdma_disconnect, QP destroyed, process
 * gone) or the stream failed: the connection is over, as when a native
 * connection's stream ends, once the datagrams the peer sent before the close
 * had RDCH_END_GRACE_NS to be read (dw_cm_progress ends it). */
static int rdch_cb(struct dw_device *dev, int fd, uint32_t events, void *ctx)
{
        struct dw_cm_rdch *ch = ctx;
        struct dw_qp *qp = ch->qp;
        uint8_t buf[64];
        ssize_t n;
        char pb[32];

        /* Nothing is ever sent on it; whatever arrives is dropped. */
        while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
                ;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) &&
            !(events & (EPOLLERR | EPOLLHUP)))
                return 0;
        int err = n < 0 ? errno : 0;
        dw_info("RC QP %#x over RD: CM stream to %s %s%s", qp->qpn,
                dw_tcp_addr_str(&qp->peer, pb, sizeof(pb)), err ? "failed: " : "closed by the peer",
                err ? strerror(err) : "");
        rdch_close_fd(ch);
        ch->end_err = err;
        ch->end_at = dw_now_ns() + RDCH_END_GRACE_NS;
        dev->rc->rdchs_ending++;
        dw_progress_timer(&dev->prog, ch->end_at);
        return 1;
}

/* Claims an RC-over-RD QP in INIT for a native connect/accept. */
static int claim_rd(struct dw_qp *qp)
{
        if (!is_rc(qp))
                return -EINVAL;
        if (rdch_of(qp) || qp->state == DIWARP_QPS_RTR)
                return -EISCONN; /* RTR over RD already names a peer QP */
        if (qp->state != DIWARP_QPS_INIT)
                return -EINVAL;
        struct dw_cm_rdch *ch = calloc(1, sizeof(*ch));
        if (!ch)
                return -ENOMEM;
        struct dw_rc_dev *rd = qp->dev->rc;
        ch->qp = qp;
        ch->fd = -1;
        ch->next = rd->rdchs;
        rd->rdchs = ch;
        return 0;
}

void dw_cm_qp_cancel(struct dw_qp *qp)
{
        struct dw_rc_dev *rd = qp->dev->rc;

        if (!rd)
                return;
        if (qp->rc && qp->rc->cm) {
                att_free(qp->rc->cm);
                if (qp->rc->state == DW_RC_CONNECTING)
                        dw_rc_set_state(qp->rc, DW_RC_IDLE, "connect cancelled");
        }
        for (struct dw_cm_pend *p = rd->pend, *n; p; p = n) {
                n = p->next;
                if (p->qp == qp) {
                        if (qp->rc && qp->rc->state == DW_RC_CONNECTING)
                                dw_rc_set_state(qp->rc, DW_RC_IDLE, "connect cancelled");
                        pend_free(p, true);
                }
        }
        rdch_drop(qp);
}

int dw_cm_progress(struct dw_device *dev)
{
        struct dw_rc_dev *rd = dev->rc;
        uint64_t now = dw_now_ns();
        int work = 0;

        if (!rd)
                return 0;
        for (struct dw_cm_pend *p = rd->pend, *n; p; p = n) {
                n = p->next;
                if (now < p->deadline_ns) {
                        dw_progress_timer(&dev->prog, p->deadline_ns);
                        continue;
                }
                work++;
                if (p->state == PEND_WAITING_QP) {
                        char pb[32];
                        dw_warn("IB-style connect from %s for QP %#x: the QP did not reach RTR "
                                "for that peer in time; rejecting",
                                dw_tcp_addr_str(&p->peer, pb, sizeof(pb)), p->req.resp_qpn);
                        p->deadline_ns = now + 1000000000ull; /* for the Reply itself */
                        pend_reply(p, NULL, DW_IBCM_NOT_READY);
                } else {
                        if (p->state == PEND_REPLYING && p->accepting && p->qp && p->qp->rc)
                                dw_rc_set_state(p->qp->rc, DW_RC_IDLE, "IB-style Reply timed out");
                        pend_free(p, true);
                }
        }
        for (struct dw_cm_rdch *ch = rd->rdchs, *n; ch; ch = n) {
                n = ch->next;
                if (!ch->end_at)
                        continue;
                if (now < ch->end_at) {
                        dw_progress_timer(&dev->prog, ch->end_at);
                        continue;
                }
                struct dw_qp *qp = ch->qp;
                int err = ch->end_err;
                rdch_free(ch);
                if (err)
                        dw_rc_handover(qp, NULL, DW_RC_SETUP_RD);
                else
                        dw_rc_disconnect(qp);
                work++;
        }
        for (struct dw_cm_att *a = rd->atts, *n; a; a = n) {
                n = a->next;
                if (a->fd < 0 && now >= a->retry_ns) {
                        work++;
                        att_start(a);
                } else if (a->fd >= 0 && now >= a->deadline_ns) {
                        work++;
                        att_fatal(a, "no MPA Reply in time", -ETIMEDOUT);
                } else {
                        dw_progress_timer(&dev->prog, a->fd < 0 ? a->retry_ns : a->deadline_ns);
                }
        }
        return work;
}

int dw_cm_dev_init(struct dw_device *dev)
{
        struct dw_rc_dev *rd = dev->rc;

        if (dev->tcp_listen_fd >= 0) {
                int r =
                    dw_progress_watch_fd(&dev->prog, dev->tcp_listen_fd, EPOLLIN, listen_cb, rd);
                if (r < 0)
                        return r;
                rd->listen_watched = true;
        }
        return 0;
}

void dw_cm_dev_fini(struct dw_device *dev)
{
        struct dw_rc_dev *rd = dev->rc;

        if (!rd)
                return;
        while (rd->pend)
                pend_free(rd->pend, true);
        while (rd->atts)
                att_free(rd->atts);
        if (rd->listen_watched)
                dw_progress_unwatch_fd(&dev->prog, dev->tcp_listen_fd);
        rd->listen_watched = false;
}

/* ======================================================================
 * Native CM (diwarp.h): listeners, accept/reject, connect, disconnect.
 * These block the caller (poll on the socket) WITHOUT the device lock; the
 * lock is taken only to check and attach the QP.
 * ====================================================================== */

#define DW_LISTEN_MAX 64

struct dw_lconn {
        bool used;
        bool delivered; /* handed to the application by get_request */
        int fd;
        uint64_t id;
        uint64_t deadline_ns;
        struct sockaddr_in peer;
        struct dw_mpa_conn mpa;
};

struct diwarp_listener {
        struct dw_device *dev;
        int fd;
        uint16_t port;
        pthread_mutex_t lock;
        uint64_t next_id;
        uint64_t evicted;              /* silent connections pushed out by newer ones */
        struct dw_log_limit log_limit; /* lines a flood of connections can cause */
        struct dw_lconn conns[DW_LISTEN_MAX];
};

int dwe_listen(struct diwarp_device *d, uint16_t port, int backlog, struct diwarp_listener **out)
{
        struct dw_device *dev = dw_dev_of(d);

        struct diwarp_listener *l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        int fd = dw_tcp_listen(dev->bind_addr, port, backlog, &l->port);
        if (fd < 0) {
                char a[INET_ADDRSTRLEN];
                dw_warn("diwarp_listen: %s:%u: %s",
                        inet_ntop(AF_INET, &dev->bind_addr, a, sizeof(a)), port, strerror(-fd));
                free(l);
                return fd;
        }
        l->dev = dev;
        l->fd = fd;
        l->next_id = 1;
        pthread_mutex_init(&l->lock, NULL);
        *out = l;
        return 0;
}

static void lconn_drop(struct dw_lconn *lc)
{
        if (lc->fd >= 0)
                close(lc->fd);
        lc->fd = -1;
        lc->used = false;
}

int dwe_listener_destroy(struct diwarp_listener *l)
{
        for (int i = 0; i < DW_LISTEN_MAX; i++)
                if (l->conns[i].used)
                        lconn_drop(&l->conns[i]);
        close(l->fd);
        pthread_mutex_destroy(&l->lock);
        free(l);
        return 0;
}

int dwe_listener_fd(const struct diwarp_listener *l)
{
        return l->fd;
}

/* A slot for a new connection when all DW_LISTEN_MAX are taken: the oldest
 * connection that has not sent its MPA Request yet. A peer that connects
 * and stays silent (or a flood of them) would otherwise hold every slot for
 * the connect timeout and shut real peers out, which send their Request at
 * once and so stay out of reach of the newer connections that push silent
 * ones out. NULL when every slot holds a Request the application has yet
 * to take, or took: the newcomer is the one refused then. */
static struct dw_lconn *listener_evict_silent(struct diwarp_listener *l, uint64_t now)
{
        struct dw_lconn *old = NULL;
        for (int i = 0; i < DW_LISTEN_MAX; i++) {
                struct dw_lconn *c = &l->conns[i];
                if (c->used && !c->delivered && c->mpa.state != DW_MPA_REQUEST &&
                    (!old || c->id < old->id))
                        old = c;
        }
        if (!old)
                return NULL;
        char pb[32];
        l->evicted++;
        if (dw_log_limit_pass(&l->log_limit, DW_LOG_WARN, now))
                dw_warn("listener port %u: every slot taken; closing %s, silent for %llu ms "
                        "(%llu such so far)",
                        l->port, dw_tcp_addr_str(&old->peer, pb, sizeof(pb)),
                        (unsigned long long)((now + connect_timeout_ms(l->dev) * 1000000ull -
                                              old->deadline_ns) /
                                             1000000ull),
                        (unsigned long long)l->evicted);
        lconn_drop(old);
        return old;
}

static void listener_accept_all(struct diwarp_listener *l)
{
        struct dw_device *dev = l->dev;

        for (;;) {
                struct sockaddr_in peer;
                int s = dw_tcp_accept(l->fd, &peer);
                if (s < 0)
                        return;
                struct dw_lconn *lc = NULL;
                for (int i = 0; i < DW_LISTEN_MAX && !lc; i++)
                        if (!l->conns[i].used)
                                lc = &l->conns[i];
                if (!lc)
                        lc = listener_evict_silent(l, dw_now_ns());
                if (!lc) {
                        char pb[32];
                        if (dw_log_limit_pass(&l->log_limit, DW_LOG_WARN, dw_now_ns()))
                                dw_warn("listener port %u: %d requests wait for the application; "
                                        "dropping %s",
                                        l->port, DW_LISTEN_MAX,
                                        dw_tcp_addr_str(&peer, pb, sizeof(pb)));
                        close(s);
                        continue;
                }
                memset(lc, 0, sizeof(*lc));
                lc->used = true;
                lc->fd = s;
                lc->peer = peer;
                lc->id = l->next_id++;
                lc->deadline_ns = ms_from_now(connect_timeout_ms(dev));
                dw_mpa_init_responder(&lc->mpa, s, dev->cfg.rc_crc, DW_RC_MAX_RD, DW_RC_MAX_RD);
        }
}

/* Steps the undelivered sockets; returns a ready one or NULL. */
static struct dw_lconn *listener_scan(struct diwarp_listener *l)
{
        uint64_t now = dw_now_ns();
        char pb[32];

        for (int i = 0; i < DW_LISTEN_MAX; i++) {
                struct dw_lconn *lc = &l->conns[i];
                if (!lc->used || lc->delivered)
                        continue;
                if (!dw_mpa_step(&lc->mpa)) {
                        if (now >= lc->deadline_ns) {
                                if (dw_log_limit_pass(&l->log_limit, DW_LOG_INFO, now))
                                        dw_info("listener port %u: no MPA Request from %s in time",
                                                l->port,
                                                dw_tcp_addr_str(&lc->peer, pb, sizeof(pb)));
                                lconn_drop(lc);
                        }
                        continue;
                }
                if (lc->mpa.state != DW_MPA_REQUEST) {
                        if (dw_log_limit_pass(&l->log_limit, DW_LOG_INFO, now))
                                dw_info("listener port %u: connect from %s failed: %s", l->port,
                                        dw_tcp_addr_str(&lc->peer, pb, sizeof(pb)),
                                        lc->mpa.why ? lc->mpa.why : "?");
                        lconn_drop(lc);
                        continue;
                }
                if (lc->mpa.peer_markers) {
                        /* We never insert markers: refuse cleanly with a Reject. */
                        dw_warn("listener port %u: %s asks for MPA markers; rejecting", l->port,
                                dw_tcp_addr_str(&lc->peer, pb, sizeof(pb)));
                        if (dw_mpa_respond(&lc->mpa, false, 0, 0, NULL, 0) == 0)
                                dw_mpa_run(&lc->mpa, now + 1000000000ull);
                        lconn_drop(lc);
                        continue;
                }
                return lc;
        }
        return NULL;
}

int dwe_listener_get_request(struct diwarp_listener *l, int timeout_ms,
                             struct diwarp_conn_request *req)
{
        uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : ms_from_now((uint32_t)timeout_ms);

        pthread_mutex_lock(&l->lock);
        for (;;) {
                listener_accept_all(l);
                struct dw_lconn *lc = listener_scan(l);
                if (lc) {
                        memset(req, 0, sizeof(*req));
                        req->id = lc->id;
                        dw_ipv4_to_gid(lc->peer.sin_addr, &req->peer_gid);
                        req->peer_port = ntohs(lc->peer.sin_port);
                        struct sockaddr_in la;
                        socklen_t ll = sizeof(la);
                        if (getsockname(lc->fd, (struct sockaddr *)&la, &ll) < 0)
                                la.sin_addr = l->dev->addr;
                        dw_ipv4_to_gid(la.sin_addr, &req->local_gid);
                        const uint8_t *pd = lc->mpa.pd;
                        uint16_t n = lc->mpa.pd_len;
                        struct rdcm_blk b;
                        const char *why;
                        /* Ours (RC over RD): the application sees only its own. */
                        if (rc_on_rd(l->dev) && rdcm_decode(pd, n, &b, &why) == 0) {
                                pd += DW_RDCM_LEN;
                                n -= DW_RDCM_LEN;
                        }
                        req->private_data_len = n;
                        memcpy(req->private_data, pd, n);
                        req->ird = (uint8_t)(lc->mpa.peer_ird > 255 ? 255 : lc->mpa.peer_ird);
                        req->ord = (uint8_t)(lc->mpa.peer_ord > 255 ? 255 : lc->mpa.peer_ord);
                        lc->delivered = true;
                        pthread_mutex_unlock(&l->lock);
                        return 0;
                }
                uint64_t now = dw_now_ns();
                if (now >= deadline) {
                        pthread_mutex_unlock(&l->lock);
                        return timeout_ms == 0 ? -EAGAIN : -ETIMEDOUT;
                }
                struct pollfd pfd[DW_LISTEN_MAX + 1];
                int n = 0;
                uint64_t wake = deadline;
                pfd[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
                for (int i = 0; i < DW_LISTEN_MAX; i++) {
                        struct dw_lconn *c = &l->conns[i];
                        if (!c->used || c->delivered)
                                continue;
                        pfd[n++] =
                            (struct pollfd){.fd = c->fd, .events = dw_mpa_poll_events(&c->mpa)};
                        if (c->deadline_ns < wake)
                                wake = c->deadline_ns;
                }
                int ms = -1;
                if (wake != UINT64_MAX)
                        ms = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
                pthread_mutex_unlock(&l->lock);
                poll(pfd, (nfds_t)n, ms);
                pthread_mutex_lock(&l->lock);
        }
}

static struct dw_lconn *find_request(struct diwarp_listener *l, uint64_t id)
{
        for (int i = 0; i < DW_LISTEN_MAX; i++)
                if (l->conns[i].used && l->conns[i].delivered && l->conns[i].id == id)
                        return &l->conns[i];
        return NULL;
}

static uint16_t param_or(uint8_t v, uint16_t dflt)
{
        return v ? (v > DW_RC_MAX_RD ? DW_RC_MAX_RD : v) : dflt;
}

/* Claims an RC QP in INIT (or RTR) for a native connect/accept. */
static int claim_qp(struct dw_qp *qp)
{
        if (dw_qp_on_rd(qp))
                return claim_rd(qp);
        if (!is_rc(qp) || !qp->rc)
                return -EINVAL;
        /* RTS too: a program that hands librdmacm an external QP moves it to
         * RTS itself (rdma_init_qp_attr) before it accepts or connects; with
         * no stream yet the QP is still idle, as an iWARP QP in RTS awaiting
         * its LLP. */
        if (qp->state != DIWARP_QPS_INIT && qp->state != DIWARP_QPS_RTR &&
            qp->state != DIWARP_QPS_RTS)
                return -EINVAL;
        /* ib_style: RTR named a peer QP, the IB-style connect owns the QP. */
        if (qp->rc->state != DW_RC_IDLE || qp->rc->fd >= 0 || qp->rc->ib_style)
                return -EISCONN;
        dw_rc_set_state(qp->rc, DW_RC_CONNECTING, "native connect/accept");
        return 0;
}

/* Releases a claim_qp that led nowhere (device lock held). */
static void unclaim_qp(struct dw_qp *qp)
{
        if (dw_qp_on_rd(qp)) {
                struct dw_cm_rdch *ch = rdch_of(qp);
                if (ch && ch->fd < 0)
                        rdch_free(ch);
        } else if (qp->rc && qp->rc->state == DW_RC_CONNECTING) {
                dw_rc_set_state(qp->rc, DW_RC_IDLE, "native connect/accept abandoned");
        }
}

/* RC over RD: binds the QP to the peer's QPN (INIT -> RTR with the peer's
 * address, QPN, first PSN and our IRD, and from there on the connection's
 * tokens and, with DIWARP_AUTH, its key). The responder does it before it
 * sends the Reply, as IB's passive side reaches RTR before its REP: the
 * initiator may send the moment the Reply arrives, and a datagram finds no
 * stream to wait in. Device lock held. */
static int rd_to_rtr(struct dw_qp *qp, const struct sockaddr_in *addr, const struct rdcm_blk *ours,
                     const struct rdcm_blk *peer, uint16_t ird)
{
        struct dw_device *dev = qp->dev;
        uint8_t key[DW_SEAL_CONN_KEY_LEN];
        const char *why = NULL;
        int r = 0;
        if (dev->cfg.auth_conn)
                r = dw_seal_conn_key(ours->token, peer->token, dev->cfg.auth_key,
                                     dev->cfg.auth_key_len, key, &why);
        if (r < 0) {
                dw_warn("RC QP %#x over RD: DIWARP_AUTH: %s", qp->qpn, why ? why : strerror(-r));
                return r;
        }
        struct dw_rc_rd_bind b = {.peer_qpn = peer->qpn,
                                  .peer_psn = peer->psn,
                                  .ird = ird,
                                  .rx_token = ours->token,
                                  .tx_token = peer->token,
                                  .conn_key = dev->cfg.auth_conn ? key : NULL};
        r = dw_rc_handover(qp, &(struct dw_rc_stream){.fd = -1, .peer = addr, .rd = &b},
                           DW_RC_SETUP_RD_BIND);
        explicit_bzero(key, sizeof(key));
        return r;
}

/* RC over RD: the MPA exchange is done; the QP goes to RTR (initiator) and
 * RTS with our first PSN and the negotiated ORD, and the stream becomes the
 * idle CM channel. */
static int attach_rd(struct dw_qp *qp, int fd, const struct dw_mpa_conn *mc,
                     const struct sockaddr_in *peer, const struct rdcm_blk *ours,
                     const struct rdcm_blk *theirs)
{
        struct dw_device *dev = qp->dev;
        char pb[32];
        int r = 0;

        pthread_mutex_lock(&dev->lock);
        struct dw_cm_rdch *ch = rdch_of(qp);
        if (!ch || ch->fd >= 0 || (qp->state != DIWARP_QPS_INIT && qp->state != DIWARP_QPS_RTR)) {
                r = -ECANCELED; /* reset, destroyed or moved meanwhile */
                goto fail;
        }
        uint16_t ord = dw_mpa_result_ord(mc);
        if (ord > DW_RC_MAX_RD)
                ord = DW_RC_MAX_RD;
        if (qp->state == DIWARP_QPS_INIT) {
                r = rd_to_rtr(qp, peer, ours, theirs, mc->ird);
                if (r < 0)
                        goto fail;
        }
        struct dw_rc_rd_bind b = {.sq_psn = ours->psn, .ord = ord};
        r = dw_rc_handover(qp, &(struct dw_rc_stream){.fd = -1, .peer = peer, .rd = &b},
                           DW_RC_SETUP_RD);
        if (r < 0)
                goto fail;
        dw_tcp_configure(fd, dev->cfg.peer_timeout_ms);
        ch->fd = fd;
        fd = -1;
        r = dw_progress_watch_fd(&dev->prog, ch->fd, EPOLLIN | EPOLLRDHUP, rdch_cb, ch);
        if (r < 0)
                goto fail;
        ch->watched = true;
        dw_info("RC QP %#x connected over RD to %s (peer QP %#x, IRD %u, ORD %u; TCP only for "
                "the CM)",
                qp->qpn, dw_tcp_addr_str(&qp->peer, pb, sizeof(pb)), theirs->qpn,
                qp->attr.max_dest_rd_atomic, ord);
        pthread_mutex_unlock(&dev->lock);
        return 0;

fail:
        dw_warn("RC QP %#x over RD peer %s: native connection setup failed: %s", qp->qpn,
                dw_tcp_addr_str(peer, pb, sizeof(pb)), strerror(-r));
        if (fd >= 0)
                close(fd);
        if (ch && rdch_of(qp) == ch)
                rdch_free(ch);
        dw_rc_handover(qp, NULL, DW_RC_SETUP_RD);
        pthread_mutex_unlock(&dev->lock);
        return r;
}

/* Stream established: rc.c takes it and moves the QP to RTS
 * (DW_RC_SETUP_NATIVE), all under one hold of the device lock. */
static int attach_native(struct dw_qp *qp, int fd, const struct dw_mpa_conn *mc,
                         const struct sockaddr_in *peer)
{
        struct dw_device *dev = qp->dev;

        pthread_mutex_lock(&dev->lock);
        int r = dw_rc_handover(qp, &(struct dw_rc_stream){.fd = fd, .mc = mc, .peer = peer},
                               DW_RC_SETUP_NATIVE);
        if (r == 0)
                dw_progress_step(&dev->prog, DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&dev->lock);
        return r;
}

int dwe_accept(struct diwarp_listener *l, uint64_t request_id, struct diwarp_qp *q,
               const struct diwarp_conn_param *reply)
{
        struct dw_qp *qp = dw_qp_of(q);

        if (qp->dev != l->dev)
                return -EINVAL;
        if (reply && reply->private_data_len > DW_MPA_ULP_PD_MAX)
                return -EINVAL;
        pthread_mutex_lock(&l->lock);
        struct dw_lconn *lc = find_request(l, request_id);
        if (!lc) {
                pthread_mutex_unlock(&l->lock);
                return -ENOENT;
        }
        pthread_mutex_lock(&qp->dev->lock);
        int r = claim_qp(qp);
        if (r < 0)
                dw_warn("diwarp_accept: RC QP %#x (state %d) cannot take the connection: %s",
                        qp->qpn, qp->state, strerror(-r));
        uint16_t ird = param_or(reply ? reply->ird : 0, dw_rc_offer_ird(qp));
        uint16_t ord = param_or(reply ? reply->ord : 0, dw_rc_offer_ord(qp));
        bool rd = dw_qp_on_rd(qp);
        struct rdcm_blk ours = {0}, theirs = {0};
        if (r == 0 && rd) {
                const char *why = NULL;
                if (reply && reply->private_data_len > DW_MPA_ULP_PD_MAX - DW_RDCM_LEN)
                        r = -EINVAL;
                else if (rdcm_decode(lc->mpa.pd, lc->mpa.pd_len, &theirs, &why) < 0 ||
                         rdcm_auth_check(qp->dev, &theirs, &why) < 0)
                        r = -EPROTO;
                else if (rdcm_ours(qp, &ours) < 0)
                        r = -EIO;
                if (r == -EPROTO)
                        dw_warn("RC QP %#x over RD: the connection request is refused: %s", qp->qpn,
                                why);
                if (r == 0)
                        r = rd_to_rtr(qp, &lc->peer, &ours, &theirs, ird);
                if (r < 0)
                        unclaim_qp(qp);
        } else if (r == 0) {
                dw_rc_register_end(qp, lc->fd, NULL); /* before the reply lets the peer send */
        }
        pthread_mutex_unlock(&qp->dev->lock);
        if (r < 0) {
                pthread_mutex_unlock(&l->lock);
                return r;
        }
        uint8_t rpd[DW_MPA_ULP_PD_MAX];
        const void *pd = reply ? reply->private_data : NULL;
        uint16_t pd_len = reply ? reply->private_data_len : 0;
        if (rd)
                rdcm_wrap(rpd, &ours, &pd, &pd_len);
        r = dw_mpa_respond(&lc->mpa, true, ird, ord, pd, pd_len);
        if (r == 0) {
                r = dw_mpa_run(&lc->mpa, ms_from_now(connect_timeout_ms(l->dev)));
                if (r >= 0)
                        r = lc->mpa.state == DW_MPA_DONE ? 0 : (lc->mpa.err ? lc->mpa.err : -EIO);
        }
        if (r < 0) {
                pthread_mutex_lock(&qp->dev->lock);
                unclaim_qp(qp);
                if (rd && qp->state == DIWARP_QPS_RTR)
                        dw_rc_disconnect(qp); /* bound to a peer that is gone */
                pthread_mutex_unlock(&qp->dev->lock);
                lconn_drop(lc);
                pthread_mutex_unlock(&l->lock);
                return r;
        }
        int fd = lc->fd;
        struct dw_mpa_conn mc = lc->mpa;
        struct sockaddr_in peer = lc->peer;
        lc->fd = -1;
        lconn_drop(lc);
        pthread_mutex_unlock(&l->lock);
        if (rd)
                return attach_rd(qp, fd, &mc, &peer, &ours, &theirs);
        return attach_native(qp, fd, &mc, &peer);
}

int dwe_reject(struct diwarp_listener *l, uint64_t request_id, const void *private_data,
               uint16_t private_data_len)
{
        if (private_data_len > DW_MPA_ULP_PD_MAX)
                return -EINVAL;
        pthread_mutex_lock(&l->lock);
        struct dw_lconn *lc = find_request(l, request_id);
        if (!lc) {
                pthread_mutex_unlock(&l->lock);
                return -ENOENT;
        }
        int r = dw_mpa_respond(&lc->mpa, false, 0, 0, private_data, private_data_len);
        if (r == 0) {
                r = dw_mpa_run(&lc->mpa, ms_from_now(connect_timeout_ms(l->dev)));
                r = r < 0 ? r : 0;
        }
        lconn_drop(lc);
        pthread_mutex_unlock(&l->lock);
        return r;
}

/* An active connect's settings, taken under the device lock when the QP is
 * claimed. */
struct connect_plan {
        struct sockaddr_in dst;
        struct in_addr src; /* the wildcard: the route picks */
        uint16_t ird, ord;
        bool crc, rd;
        uint32_t tmo;
        struct rdcm_blk ours, theirs; /* RC over RD: the CM blocks of both ends */
};

/* The source address param->sgid names, when it is one of the device's. */
static int connect_source(struct dw_qp *qp, const struct diwarp_conn_param *param,
                          struct in_addr *src)
{
        struct dw_device *dev = qp->dev;
        struct in_addr s = {0};
        bool found = false;

        if (dw_gid_to_ipv4(param->sgid, &s) == 0)
                for (int i = 0; i < dev->ngid && !found; i++)
                        found = dev->gids[i].addr == s.s_addr;
        if (!found) {
                char b[INET_ADDRSTRLEN];
                dw_warn("diwarp_connect: RC QP %#x: source %s is not an address of the device",
                        qp->qpn, inet_ntop(AF_INET, &s, b, sizeof(b)));
                return -EINVAL;
        }
        *src = s;
        return 0;
}

/* Claims the QP for the connect and fills the plan: source address, IRD and
 * ORD offered, CRC, timeout, and over RD our CM block (which must fit in the
 * private data beside the caller's). On failure the QP is not claimed. */
static int connect_claim(struct dw_qp *qp, const struct diwarp_conn_param *param, int timeout_ms,
                         struct connect_plan *plan)
{
        struct dw_device *dev = qp->dev;

        pthread_mutex_lock(&dev->lock);
        int r = claim_qp(qp);
        bool claimed = r == 0;
        plan->ird = param_or(param ? param->ird : 0, dw_rc_offer_ird(qp));
        plan->ord = param_or(param ? param->ord : 0, dw_rc_offer_ord(qp));
        plan->crc = dev->cfg.rc_crc;
        plan->src = dev->bind_addr;
        plan->tmo = timeout_ms < 0 ? connect_timeout_ms(dev) : (uint32_t)timeout_ms;
        plan->rd = dw_qp_on_rd(qp);
        if (r == 0 && param && param->sgid)
                r = connect_source(qp, param, &plan->src);
        if (r == 0 && plan->rd && param &&
            param->private_data_len > DW_MPA_ULP_PD_MAX - DW_RDCM_LEN)
                r = -EINVAL;
        if (r == 0 && plan->rd && rdcm_ours(qp, &plan->ours) < 0)
                r = -EIO;
        if (r < 0 && claimed)
                unclaim_qp(qp);
        pthread_mutex_unlock(&dev->lock);
        return r;
}

/* The TCP connect and the MPA exchange, as initiator, into *mc. A peer
 * program that re-creates its listener right after a message exchange
 * (perftest -R: one connection for its parameters, then the test's) may not
 * listen yet when our connect arrives, over TCP as over RD (there a Send
 * completes only once the peer ACKs it, so later still); on loopback about
 * every other run. A refused TCP connect is retried for a short grace
 * (RDCM_REFUSED_GRACE_MS) before it is reported; an MPA reject is reported
 * at once. Returns 0 (the exchange done) or a negative errno; *fd is the
 * stream, or negative when none is open. */
static int connect_exchange(struct dw_qp *qp, const struct connect_plan *plan,
                            struct dw_mpa_conn *mc, const void *pd, uint16_t pd_len, int *fd)
{
        bool inprog = false;
        uint64_t t0 = dw_now_ns();
        int r;

        for (uint32_t backoff_us = 500;; backoff_us *= 2) {
                *fd = mc ? dw_tcp_connect_start(plan->src, &plan->dst, &inprog) : -ENOMEM;
                r = *fd;
                if (*fd >= 0) {
                        r = dw_mpa_init_initiator(mc, *fd, inprog, plan->crc, plan->ird, plan->ord,
                                                  pd, pd_len);
                        if (r == 0)
                                r = dw_mpa_run(mc, ms_from_now(plan->tmo));
                        if (r >= 0) {
                                if (mc->state == DW_MPA_DONE)
                                        r = 0;
                                else if (mc->state == DW_MPA_REJECTED)
                                        r = -ECONNREFUSED;
                                else
                                        r = mc->err ? mc->err : -EIO;
                        }
                }
                bool refused = r == -ECONNREFUSED && (*fd < 0 || mc->state != DW_MPA_REJECTED);
                uint32_t grace_ms =
                    plan->tmo < RDCM_REFUSED_GRACE_MS ? plan->tmo : RDCM_REFUSED_GRACE_MS;
                if (!refused || dw_now_ns() - t0 + backoff_us * 1000ull > grace_ms * 1000000ull)
                        return r;
                if (*fd >= 0)
                        close(*fd);
                dw_dbg("RC QP %#x: connect refused, retrying in %u us", qp->qpn, backoff_us);
                usleep(backoff_us);
        }
}

/* The peer's reply (accepted or rejected): over RD, its CM block first
 * (decoded into plan->theirs and authenticated), then the private data,
 * copied to the caller's buffer (reply_cap bytes at most). Returns r, or
 * -EPROTO when the CM block is bad. */
static int connect_reply(struct dw_qp *qp, struct connect_plan *plan, struct dw_mpa_conn *mc, int r,
                         void *reply_pd, uint16_t *reply_pd_len, uint16_t reply_cap)
{
        const uint8_t *reply = mc->pd;
        uint16_t n = mc->pd_len;

        if (plan->rd && mc->state == DW_MPA_DONE) {
                const char *why = NULL;
                if (rdcm_decode(mc->pd, mc->pd_len, &plan->theirs, &why) == 0 &&
                    rdcm_auth_check(qp->dev, &plan->theirs, &why) == 0) {
                        reply += DW_RDCM_LEN;
                        n -= DW_RDCM_LEN;
                } else {
                        r = -EPROTO;
                        mc->why = why;
                }
        }
        if (mc->state == DW_MPA_DONE || mc->state == DW_MPA_REJECTED) {
                if (reply_pd_len) {
                        if (n > reply_cap)
                                n = reply_cap;
                        *reply_pd_len = n;
                }
                if (reply_pd && reply_pd_len && n)
                        memcpy(reply_pd, reply, n);
        }
        return r;
}

int dwe_connect(struct diwarp_qp *q, const union diwarp_gid *dgid, uint16_t port,
                const struct diwarp_conn_param *param, int timeout_ms, void *reply_pd,
                uint16_t *reply_pd_len)
{
        struct dw_qp *qp = dw_qp_of(q);
        struct connect_plan plan = {.dst = {.sin_family = AF_INET, .sin_port = htons(port)}};
        /* No reply yet: a failure before the peer's MPA reply carries no
         * private data (the caller's buffer stays unread). */
        uint16_t reply_cap = reply_pd_len ? *reply_pd_len : 0;
        if (reply_pd_len)
                *reply_pd_len = 0;

        if (dw_gid_to_ipv4(dgid, &plan.dst.sin_addr) < 0)
                return -EINVAL;
        if (param && param->private_data_len > DW_MPA_ULP_PD_MAX)
                return -EINVAL;
        int r = connect_claim(qp, param, timeout_ms, &plan);
        if (r < 0)
                return r;
        uint8_t rpd[DW_MPA_ULP_PD_MAX];
        const void *pd = param ? param->private_data : NULL;
        uint16_t pd_len = param ? param->private_data_len : 0;
        if (plan.rd)
                rdcm_wrap(rpd, &plan.ours, &pd, &pd_len);

        struct dw_mpa_conn *mc = malloc(sizeof(*mc));
        int fd;
        r = connect_exchange(qp, &plan, mc, pd, pd_len, &fd);
        if (fd >= 0)
                r = connect_reply(qp, &plan, mc, r, reply_pd, reply_pd_len, reply_cap);
        if (r < 0) {
                char pb[32];
                dw_info("RC QP %#x: connect to %s: %s%s%s", qp->qpn,
                        dw_tcp_addr_str(&plan.dst, pb, sizeof(pb)), strerror(-r),
                        mc && mc->why ? " — " : "", mc && mc->why ? mc->why : "");
                if (fd >= 0)
                        close(fd);
                free(mc);
                pthread_mutex_lock(&qp->dev->lock);
                unclaim_qp(qp);
                pthread_mutex_unlock(&qp->dev->lock);
                return r;
        }
        r = plan.rd ? attach_rd(qp, fd, mc, &plan.dst, &plan.ours, &plan.theirs)
                    : attach_native(qp, fd, mc, &plan.dst);
        free(mc);
        return r;
}

int dwe_disconnect(struct diwarp_qp *q)
{
        struct dw_qp *qp = dw_qp_of(q);

        if (!is_rc(qp))
                return -EINVAL;
        pthread_mutex_lock(&qp->dev->lock);
        /* Over RD closing the CM stream is the disconnect notice; the ACKs
         * still owed go out first (dw_rd_qp_error), so the peer's last
         * sends complete. */
        int r = dw_rc_disconnect(qp);
        if (dw_qp_on_rd(qp))
                rdch_drop(qp);
        dw_progress_step(&qp->dev->prog, DW_PROGRESS_BUDGET);
        pthread_mutex_unlock(&qp->dev->lock);
        return r;
}
