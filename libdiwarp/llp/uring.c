/* The io_uring backend of the instance UDP socket (see uring.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "llp/uring.h"

#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"

#define DW_URING_ENTRIES 64 /* SQ; the CQ is twice that: > 32 receives + 16 sends */
#define DW_URING_BGID    0
#define DW_URING_TAG_RX  (1ull << 62)
#define DW_URING_TAG_TX  (1ull << 61) /* | index in the batch */
#define DW_URING_STASH   (2 * DW_UDP_RX_BATCH)
/* Multishot receive ends that produced nothing in a row before we give up
 * re-arming it (a kernel that refuses multishot recvmsg would otherwise make
 * every step re-arm, and the progress thread spin on the ring fd). */
#define DW_URING_MAX_EMPTY_ARMS 16

struct dw_uring_cqe {
        uint64_t user_data;
        int32_t res;
        uint32_t flags;
};

struct dw_uring {
        struct io_uring ring;
        struct io_uring_buf_ring *br; /* DW_UDP_RX_BATCH entries, page aligned */
        struct msghdr rx_mh;          /* multishot recvmsg template: name only */
        bool rx_armed;
        bool rx_dead; /* gave up re-arming (see DW_URING_MAX_EMPTY_ARMS) */
        unsigned empty_arms;
        uint16_t held[DW_UDP_RX_BATCH]; /* buffer ids of the last batch */
        int nheld;
        /* Receive completions met while waiting for sends, in CQ order. */
        struct dw_uring_cqe stash[DW_URING_STASH];
        unsigned st_head, st_count;
        struct msghdr tx_mh[DW_UDP_TX_BATCH];
        int tx_res[DW_UDP_TX_BATCH];
};

static uint8_t *dw_uring_buf(struct dw_udp *u, unsigned bid)
{
        return u->rx_buf + (size_t)bid * DW_UDP_RX_BUF;
}

static void dw_uring_recycle(struct dw_udp *u, const uint16_t *bids, int n)
{
        struct dw_uring *ur = u->ur;
        int mask = io_uring_buf_ring_mask(DW_UDP_RX_BATCH);
        for (int i = 0; i < n; i++)
                io_uring_buf_ring_add(ur->br, dw_uring_buf(u, bids[i]), DW_UDP_RX_BUF, bids[i],
                                      mask, i);
        io_uring_buf_ring_advance(ur->br, n);
}

/* Queues the multishot receive (submitted by the caller). */
static int dw_uring_arm(struct dw_udp *u)
{
        struct dw_uring *ur = u->ur;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ur->ring);
        if (!sqe)
                return -EBUSY;
        io_uring_prep_recvmsg_multishot(sqe, u->fd, &ur->rx_mh, 0);
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = DW_URING_BGID;
        io_uring_sqe_set_data64(sqe, DW_URING_TAG_RX);
        ur->rx_armed = true;
        return 0;
}

static int dw_uring_submit(struct dw_uring *ur)
{
        for (;;) {
                int r = io_uring_submit(&ur->ring);
                /* -EAGAIN: the kernel is short of request memory for a moment;
                 * the SQEs may point at the caller's stack, so they must go now. */
                if (r >= 0)
                        return r;
                if (r != -EINTR && r != -EAGAIN)
                        return r;
        }
}

static void dw_uring_rearm(struct dw_udp *u)
{
        struct dw_uring *ur = u->ur;
        if (ur->rx_armed || ur->rx_dead)
                return;
        if (ur->empty_arms >= DW_URING_MAX_EMPTY_ARMS) {
                ur->rx_dead = true;
                dw_err("UDP socket: io_uring multishot recvmsg keeps failing; receive stopped "
                       "(run with DIWARP_IO=plain)");
                return;
        }
        if (dw_uring_arm(u) == 0)
                dw_uring_submit(ur);
}

int dw_uring_open(struct dw_udp *u)
{
        struct dw_uring *ur = calloc(1, sizeof(*ur));
        if (!ur)
                return -ENOMEM;
        int err = io_uring_queue_init(DW_URING_ENTRIES, &ur->ring, 0);
        if (err < 0) {
                free(ur);
                return err;
        }
        long page = sysconf(_SC_PAGESIZE);
        void *mem = NULL;
        if (posix_memalign(&mem, page > 0 ? (size_t)page : 4096,
                           DW_UDP_RX_BATCH * sizeof(struct io_uring_buf)) != 0) {
                io_uring_queue_exit(&ur->ring);
                free(ur);
                return -ENOMEM;
        }
        memset(mem, 0, DW_UDP_RX_BATCH * sizeof(struct io_uring_buf));
        ur->br = mem;
        io_uring_buf_ring_init(ur->br);
        struct io_uring_buf_reg reg = {
            .ring_addr = (uintptr_t)mem, .ring_entries = DW_UDP_RX_BATCH, .bgid = DW_URING_BGID};
        err = io_uring_register_buf_ring(&ur->ring, &reg, 0);
        if (err < 0) {
                io_uring_queue_exit(&ur->ring);
                free(mem);
                free(ur);
                return err;
        }
        ur->rx_mh.msg_namelen = sizeof(struct sockaddr_in);
        u->ur = ur;
        uint16_t all[DW_UDP_RX_BATCH];
        for (int i = 0; i < DW_UDP_RX_BATCH; i++)
                all[i] = (uint16_t)i;
        dw_uring_recycle(u, all, DW_UDP_RX_BATCH);
        err = dw_uring_arm(u);
        if (err == 0) {
                err = dw_uring_submit(ur);
                if (err > 0)
                        err = 0;
        }
        if (err < 0) {
                dw_uring_close(u);
                return err;
        }
        return 0;
}

void dw_uring_close(struct dw_udp *u)
{
        struct dw_uring *ur = u->ur;
        if (!ur)
                return;
        io_uring_queue_exit(&ur->ring); /* cancels the multishot receive */
        free(ur->br);
        free(ur);
        u->ur = NULL;
}

int dw_uring_fd(const struct dw_udp *u)
{
        return u->ur->ring.ring_fd;
}

bool dw_uring_rx_stashed(const struct dw_udp *u)
{
        return u->ur->st_count > 0;
}

static void dw_uring_stash(struct dw_udp *u, const struct io_uring_cqe *cqe)
{
        struct dw_uring *ur = u->ur;
        if (ur->st_count == DW_URING_STASH) {
                /* Cannot happen (at most one completion per buffer plus the
                 * end of a multishot); drop rather than leak the buffer. */
                if (cqe->flags & IORING_CQE_F_BUFFER) {
                        uint16_t bid = (uint16_t)(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
                        dw_uring_recycle(u, &bid, 1);
                }
                if (!(cqe->flags & IORING_CQE_F_MORE))
                        ur->rx_armed = false;
                return;
        }
        ur->stash[(ur->st_head + ur->st_count) % DW_URING_STASH] =
            (struct dw_uring_cqe){cqe->user_data, cqe->res, cqe->flags};
        ur->st_count++;
}

int dw_uring_send_batch(struct dw_udp *u, const struct dw_udp_msg *msgs, int n)
{
        struct dw_uring *ur = u->ur;
        for (int attempt = 0; attempt < 2; attempt++) {
                for (int i = 0; i < n; i++) {
                        struct io_uring_sqe *sqe = io_uring_get_sqe(&ur->ring);
                        if (!sqe) {
                                /* only a pending re-arm can be there: push it out */
                                dw_uring_submit(ur);
                                sqe = io_uring_get_sqe(&ur->ring);
                                if (!sqe)
                                        return -EAGAIN;
                        }
                        struct msghdr *mh = &ur->tx_mh[i];
                        memset(mh, 0, sizeof(*mh));
                        mh->msg_name = (void *)msgs[i].dst;
                        mh->msg_namelen = sizeof(*msgs[i].dst);
                        mh->msg_iov = (struct iovec *)msgs[i].iov;
                        mh->msg_iovlen = (size_t)msgs[i].iovcnt;
                        /* MSG_DONTWAIT: a full socket buffer completes with
                         * -EAGAIN (back-pressure) instead of parking the request. */
                        io_uring_prep_sendmsg(sqe, u->fd, mh, MSG_DONTWAIT | MSG_NOSIGNAL);
                        if (i + 1 < n)
                                sqe->flags |= IOSQE_IO_LINK; /* a failure cancels the rest */
                        io_uring_sqe_set_data64(sqe, DW_URING_TAG_TX | (uint64_t)i);
                        ur->tx_res[i] = INT_MIN;
                }
                int r = dw_uring_submit(ur);
                if (r < 0)
                        return r;
                int remaining = n;
                while (remaining > 0) {
                        struct io_uring_cqe *cqe;
                        r = io_uring_wait_cqe(&ur->ring, &cqe);
                        if (r == -EINTR)
                                continue;
                        if (r < 0)
                                return r;
                        uint64_t ud = cqe->user_data;
                        if (ud & DW_URING_TAG_TX) {
                                unsigned idx = (unsigned)(ud & 0xffff);
                                if (idx < (unsigned)n && ur->tx_res[idx] == INT_MIN) {
                                        ur->tx_res[idx] = cqe->res;
                                        remaining--;
                                }
                        } else if (ud == DW_URING_TAG_RX) {
                                dw_uring_stash(u, cqe);
                        }
                        io_uring_cqe_seen(&ur->ring, cqe);
                }
                int k = 0;
                while (k < n && ur->tx_res[k] >= 0)
                        k++;
                if (k > 0)
                        return k;
                int e = -ur->tx_res[0];
                if (e == EINTR)
                        continue;
                if (dw_udp_is_icmp_err(e)) {
                        /* a report about an earlier datagram, not this one */
                        dw_udp_drain_errors(u);
                        continue;
                }
                if (e == EWOULDBLOCK)
                        e = EAGAIN;
                return -e;
        }
        return -EAGAIN;
}

/* Takes the next receive completion: stashed ones first, then the CQ. */
static bool dw_uring_next_rx(struct dw_udp *u, struct dw_uring_cqe *out)
{
        struct dw_uring *ur = u->ur;
        if (ur->st_count > 0) {
                *out = ur->stash[ur->st_head];
                ur->st_head = (ur->st_head + 1) % DW_URING_STASH;
                ur->st_count--;
                return true;
        }
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&ur->ring, &cqe) == 0) {
                *out = (struct dw_uring_cqe){cqe->user_data, cqe->res, cqe->flags};
                io_uring_cqe_seen(&ur->ring, cqe);
                if (out->user_data == DW_URING_TAG_RX)
                        return true;
                /* a send completion cannot be left over: each send call reaps its own */
        }
        return false;
}

int dw_uring_recv_batch(struct dw_udp *u, int max)
{
        struct dw_uring *ur = u->ur;
        struct dw_uring_cqe c;
        int n = 0;

        if (ur->nheld > 0)
                dw_uring_rx_done(u); /* the caller skipped it */
        else
                dw_uring_rearm(u);
        while (n < max && dw_uring_next_rx(u, &c)) {
                if (!(c.flags & IORING_CQE_F_MORE))
                        ur->rx_armed = false; /* re-armed by dw_uring_rx_done */
                if (!(c.flags & IORING_CQE_F_BUFFER)) {
                        /* The multishot receive ended without data: -ENOBUFS (every
                         * buffer is held), an ICMP error, -ECANCELED (the thread that
                         * armed it exited). */
                        if (c.res < 0 && dw_udp_is_icmp_err(-c.res))
                                dw_udp_drain_errors(u);
                        else if (c.res != -ENOBUFS && c.res != -ECANCELED)
                                ur->empty_arms++;
                        continue;
                }
                ur->empty_arms = 0;
                uint16_t bid = (uint16_t)(c.flags >> IORING_CQE_BUFFER_SHIFT);
                ur->held[ur->nheld++] = bid;
                uint8_t *buf = dw_uring_buf(u, bid);
                struct io_uring_recvmsg_out *o =
                    c.res > 0 ? io_uring_recvmsg_validate(buf, c.res, &ur->rx_mh) : NULL;
                if (!o) {
                        u->rx_pkt[n] = buf;
                        u->rx_len[n] = 0;
                        u->rx_trunc[n] = true; /* counted as malformed by the caller */
                        memset(&u->rx_addr[n], 0, sizeof(u->rx_addr[n]));
                        n++;
                        continue;
                }
                memset(&u->rx_addr[n], 0, sizeof(u->rx_addr[n]));
                size_t nl = o->namelen < sizeof(u->rx_addr[n]) ? o->namelen : sizeof(u->rx_addr[n]);
                memcpy(&u->rx_addr[n], io_uring_recvmsg_name(o), nl);
                u->rx_pkt[n] = io_uring_recvmsg_payload(o, &ur->rx_mh);
                u->rx_len[n] = io_uring_recvmsg_payload_length(o, c.res, &ur->rx_mh);
                u->rx_trunc[n] = (o->flags & MSG_TRUNC) != 0;
                n++;
        }
        /* Ended with no buffer of ours held (nothing for dw_uring_rx_done to
         * hand back): re-arm now, or nothing would wake the ring fd again. */
        if (ur->nheld == 0)
                dw_uring_rearm(u);
        return n;
}

void dw_uring_rx_done(struct dw_udp *u)
{
        struct dw_uring *ur = u->ur;
        if (ur->nheld > 0) {
                dw_uring_recycle(u, ur->held, ur->nheld);
                ur->nheld = 0;
        }
        dw_uring_rearm(u);
}
