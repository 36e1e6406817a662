/* UD queue pairs over the instance UDP socket (docs/PROTOCOL.md, "UD over UDP").
 *
 * One message = one datagram: datagram header | untagged DDP/RDMAP Send |
 * payload | [RFC 7306 Immediate Data message] | CRC32c. A payload above
 * DW_UD_COPY_MAX bytes is gathered from the SGEs by sendmsg (no staging
 * copy; the CRC runs over the same iovecs); a smaller one is copied behind
 * the headers, so the datagram goes out as one iovec. A send completes when
 * the socket accepts the datagram; a full socket buffer (EAGAIN/ENOBUFS)
 * keeps the WQE for the next progress step.
 *
 * Receive: the datagram is checked (CRC, header, QPN, qkey, opcode) in its
 * bounce buffer, then a 40-byte GRH carrying the sender's IPv4-mapped GID and
 * the payload are copied into the head receive WQE.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "dw.h"
#include "rd/rd.h"
#include "rdmap/rdmap.h"
#include "util/time.h"
#include "wire/dgram.h"
#include "wire/rdmap.h"

static void dw_ud_count_tx(struct dw_qp *qp, uint64_t bytes)
{
        qp->dev->ctr.tx_packets++;
        qp->dev->ctr.tx_bytes += bytes;
        qp->ctr.tx_packets++;
        qp->ctr.tx_bytes += bytes;
}

static void dw_ud_set_pending(struct dw_qp *qp, bool pending)
{
        if (qp->tx_pending == pending)
                return;
        qp->tx_pending = pending;
        dw_progress_tx_wait(&qp->dev->prog, pending);
}

/* MSN of an untagged DDP header (RFC 5041 §4.3: control, RsvdULP 8 + 32 bits,
 * QN, MSN, MO). The cached header is checked at this offset when stored. */
#define DW_UD_MSN_OFF 10

/* Length of the cached headers: datagram header + untagged DDP/RDMAP Send;
 * the seal state cached with them covers the bytes before the MSN. */
#define DW_UD_HDR_LEN     (DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN)
#define DW_UD_HDR_CRC_PRE (DW_DGRAM_HDR_LEN + DW_UD_MSN_OFF)

/* Encodes the headers of one UD message with MSN msn into hdr (dgram + Send)
 * and imm (Immediate Data message, when with_imm). Returns the header length;
 * *run is the seal state over the first *pre bytes of hdr (a cached
 * prefix: everything before the MSN when the headers came from the cache). */
static ssize_t dw_ud_headers(struct dw_qp *qp, const struct dw_wqe *w, uint32_t msn, uint8_t *hdr,
                             size_t cap, uint8_t *imm, bool with_imm, struct dw_seal_run *run,
                             size_t *pre)
{
        struct dw_seal *seal = &qp->dev->seal;
        bool se = w->send_flags & DIWARP_SEND_SOLICITED;
        /* IB rule: a remote qkey with the high bit set means "use the QP's own". */
        uint32_t qkey = (w->remote_qkey & 0x80000000u) ? qp->attr.qkey : w->remote_qkey;
        uint8_t op = se ? 2 : 1; /* header cache key (Sends without immediate) */
        if (!with_imm && qp->ud_hdr_op == op && qp->ud_hdr_dst == w->remote_qpn &&
            qp->ud_hdr_qkey == qkey && cap >= DW_UD_HDR_LEN) {
                /* A constant size: an inline copy, not a memcpy call. */
                memcpy(hdr, qp->ud_hdr, DW_UD_HDR_LEN);
                dw_put_be32(hdr + DW_DGRAM_HDR_LEN + DW_UD_MSN_OFF, msn);
                *run = qp->ud_hdr_run;
                *pre = DW_UD_HDR_CRC_PRE;
                return DW_UD_HDR_LEN;
        }
        *pre = 0;
        struct dw_dgram_hdr h = {
            .flags = DW_DGRAM_F_DATA | (with_imm ? DW_DGRAM_F_IMM : 0),
            .dst_qpn = w->remote_qpn,
            .src_qpn = qp->qpn,
            .qkey = qkey,
        };
        ssize_t n = dw_dgram_encode(&h, hdr, cap);
        if (n < 0)
                return n;
        dw_seal_begin(seal, run, hdr);
        struct dw_rdmap_hdr r;
        /* With immediate data the SE bit rides on the Immediate Data message,
         * the one that completes the receive. One segment: the whole Send. */
        dw_rdmap_data_hdr(w, 0, w->total_len, msn, se && !with_imm, &r);
        ssize_t m = dw_rdmap_encode(&r, hdr + n, cap - (size_t)n);
        if (m < 0)
                return m;
        if (!with_imm && dw_seal_keeps_runs(seal) && n + m == DW_UD_HDR_LEN &&
            (size_t)(n + m) <= sizeof(qp->ud_hdr) && dw_get_be32(hdr + n + DW_UD_MSN_OFF) == msn) {
                memcpy(qp->ud_hdr, hdr, (size_t)(n + m));
                qp->ud_hdr_len = (uint8_t)(n + m);
                qp->ud_hdr_run = *run;
                dw_seal_add(seal, &qp->ud_hdr_run, hdr, DW_UD_HDR_CRC_PRE);
                qp->ud_hdr_op = op;
                qp->ud_hdr_dst = w->remote_qpn;
                qp->ud_hdr_qkey = qkey;
        }
        if (with_imm) {
                struct dw_rdmap_hdr ri;
                if (dw_rdmap_hdr_init(&ri, dw_rdmap_imm_opcode(se)) < 0)
                        return -EINVAL;
                ri.ddp.last = true;
                ri.ddp.msn = msn + 1;
                ri.ddp.mo = 0;
                ssize_t k = dw_rdmap_encode(&ri, imm, DW_DGRAM_IMM_MSG_LEN);
                if (k != DW_DGRAM_DDP_UNTAGGED_LEN)
                        return -EINVAL;
                /* 8 bytes of Immediate Data: the 32-bit verbs immediate (already in
                 * network order) then zeros. */
                memcpy(imm + k, &w->imm_data, 4);
                memset(imm + k + 4, 0, 4);
        }
        return n + m;
}

static bool dw_ud_net_error(int e)
{
        return e == ENETUNREACH || e == EHOSTUNREACH || e == ECONNREFUSED || e == EPERM ||
               e == EHOSTDOWN || e == ENETDOWN;
}

/* The whole source of a send WQE (dw_rdmap_wr_iov); the common single-SGE
 * send (not inline) is checked and mapped here without the general loop.
 * Same result. */
static inline int dw_ud_gather(struct dw_qp *qp, const struct dw_wqe *w, struct iovec *iov)
{
        if (w->num_sge == 1 && !(w->flags & DW_WQE_INLINE) && w->sge[0].length != 0) {
                uint8_t *h;
                if (dw_mr_check_local(&qp->dev->mrs, w->sge[0].lkey, qp->pd, 0, w->sge[0].addr,
                                      w->sge[0].length, &h) != DW_PROT_OK)
                        return -EACCES;
                iov[0].iov_base = h;
                iov[0].iov_len = w->sge[0].length;
                return 1;
        }
        return dw_rdmap_wr_iov(&qp->dev->mrs, qp->pd, w, 0, w->total_len, 0, iov, DW_MAX_SGE);
}

/* One datagram being built: headers, trailer and the iovecs gathering
 * them around the payload, which stays in registered memory. */
/* Payloads up to this size are copied behind the headers instead: one
 * contiguous datagram is one iovec for the kernel to import and walk and one
 * CRC pass, which costs less than the copy at these sizes. */
#define DW_UD_COPY_MAX 256

struct dw_ud_txm {
        /* the headers; for a payload of at most DW_UD_COPY_MAX bytes the whole
         * datagram (payload, Immediate Data message and CRC behind them) */
        uint8_t hdr[DW_UD_HDR_LEN + DW_UD_COPY_MAX + DW_DGRAM_IMM_MSG_LEN + DW_SEAL_TRAILER_MAX];
        uint8_t imm[DW_DGRAM_IMM_MSG_LEN];
        uint8_t trl[DW_SEAL_TRAILER_MAX];
        struct iovec iov[DW_MAX_SGE + 3];
        struct sockaddr_in dst;
        uint32_t msn_next; /* qp->ud_msn once this one is sent */
};

/* Gathered datagram (a payload above DW_UD_COPY_MAX): headers in iov[0], the
 * payload in iov[1..cnt), then the Immediate Data message and the
 * trailer. run is the seal state over hdr[0..pre). Returns the iovec count. */
static int dw_ud_iov_tail(struct dw_seal *seal, struct dw_ud_txm *m, ssize_t hl, int cnt,
                          bool with_imm, struct dw_seal_run *run, size_t pre)
{
        if (with_imm) {
                m->iov[cnt].iov_base = m->imm;
                m->iov[cnt].iov_len = sizeof(m->imm);
                cnt++;
        }
        dw_seal_add(seal, run, m->hdr + pre, (size_t)hl - pre);
        dw_seal_add_iov(seal, run, m->iov + 1, (size_t)cnt - 1);
        m->iov[cnt].iov_base = m->trl;
        m->iov[cnt].iov_len = dw_seal_end(seal, run, m->hdr, m->trl);
        return cnt + 1;
}

/* Builds the datagram of WQE w with MSN msn into m. Returns the iovec count,
 * or the completion status that fails the WQE (negative: -1 encode, -2 lkey). */
static int dw_ud_build(struct dw_qp *qp, const struct dw_wqe *w, uint32_t msn, struct dw_ud_txm *m)
{
        bool with_imm = dw_wr_op(w->opcode)->imm;
        struct dw_seal *seal = &qp->dev->seal;
        struct dw_seal_run run;
        size_t pre;
        ssize_t hl = dw_ud_headers(qp, w, msn, m->hdr, DW_UD_HDR_LEN, m->imm, with_imm, &run, &pre);
        if (hl < 0)
                return -1;
        m->iov[0].iov_base = m->hdr;
        m->iov[0].iov_len = (size_t)hl;
        int g = dw_ud_gather(qp, w, m->iov + 1);
        if (g < 0)
                return -2;
        int cnt = 1 + g;
        if (w->total_len <= DW_UD_COPY_MAX) {
                uint8_t *q = m->hdr + hl;
                for (int i = 1; i < cnt; i++) {
                        memcpy(q, m->iov[i].iov_base, m->iov[i].iov_len);
                        q += m->iov[i].iov_len;
                }
                if (with_imm) {
                        memcpy(q, m->imm, sizeof(m->imm));
                        q += sizeof(m->imm);
                }
                dw_seal_add(seal, &run, m->hdr + pre, (size_t)(q - m->hdr) - pre);
                m->iov[0].iov_len = (size_t)(q - m->hdr) + dw_seal_end(seal, &run, m->hdr, q);
                cnt = 1;
        } else {
                cnt = dw_ud_iov_tail(seal, m, hl, cnt, with_imm, &run, pre);
        }
        dw_peer_addr(qp->dev, ((struct dw_ah *)w->ah)->ip, w->remote_qpn, &m->dst);
        m->msn_next = msn + (with_imm ? 2 : 1);
        return cnt;
}

/* The head WQE was sent (or lost in the network: UD is unreliable, an ICMP
 * error is not the sender's failure). */
static void dw_ud_sent(struct dw_qp *qp, const struct dw_ud_txm *m)
{
        uint32_t len = (uint32_t)dw_wq_head(&qp->sq)->total_len;
        qp->ud_msn = m->msn_next;
        qp->ud_hold_until = 0;
        dw_ud_count_tx(qp, len);
        dw_qp_complete_send(qp, DIWARP_WC_SUCCESS, len);
}

/* The head WQE's send failed locally with -r (not back-pressure). Completes it
 * with an error and moves the QP to SQE (IB: a UD send error stops the send
 * queue only); returns false then. */
static bool dw_ud_send_failed(struct dw_qp *qp, const struct dw_ud_txm *m, int r)
{
        if (dw_ud_net_error(-r)) {
                dw_ud_sent(qp, m);
                return true;
        }
        char ip[INET_ADDRSTRLEN];
        struct dw_wqe *w = dw_wq_head(&qp->sq);
        inet_ntop(AF_INET, &m->dst.sin_addr, ip, sizeof(ip));
        dw_warn("QP %#x: UD send to %s:%u QPN %#x failed: %s", qp->qpn, ip, ntohs(m->dst.sin_port),
                w->remote_qpn, strerror(-r));
        dw_qp_complete_send(qp,
                            r == -EFAULT     ? DIWARP_WC_LOC_PROT_ERR
                            : r == -EMSGSIZE ? DIWARP_WC_LOC_LEN_ERR
                                             : DIWARP_WC_GENERAL_ERR,
                            0);
        dw_qp_to_sqe(qp);
        return false;
}

static bool ud_deliver(struct dw_device *dev, const struct dw_dgram_ud *u,
                       const struct sockaddr_in *from, uint8_t *pkt, const struct iovec *pay,
                       int npay, bool local);

/* The head WQE, when its destination is a device of this process
 * (DIWARP_LOCAL_COPY; on in the host daemon): the message is delivered as
 * one copy from the sender's memory into the receive WQE, with the checks
 * and counters of a received datagram (ud_deliver), instead of a datagram
 * through the loopback socket. 1: done; 0: not local, or a source that fails
 * its lkey check (the datagram path takes it); -EBUSY: the WQE waits for the
 * next step, because the destination's device is busy (a datagram now could
 * be overtaken by the copies behind it) or its QP has no receive WQE. That
 * receive may be on its way: the host daemon moves a client's posts into the
 * engine a turn at a time, so a program that posted its receive before it
 * let the sender know may not have it in the engine yet. After
 * DW_UD_HOLD_NS without one the message goes as a datagram (and is dropped
 * there unless a receive came), as on the wire. */
#define DW_UD_HOLD_NS (1000u * 1000)
static int ud_tx_local(struct dw_qp *qp)
{
        struct dw_device *dev = qp->dev;
        struct dw_wqe *w = dw_wq_head(&qp->sq);
        struct sockaddr_in dst, from;
        struct iovec pay[DW_MAX_SGE];
        bool locked;

        dw_peer_addr(dev, ((struct dw_ah *)w->ah)->ip, w->remote_qpn, &dst);
        struct dw_device *to;
        int r = dw_registry_local(dev, &dst, &to, &locked);
        if (r < 0)
                return r == -EBUSY ? r : 0;
        int n = dw_ud_gather(qp, w, pay);
        if (n < 0) {
                if (locked)
                        pthread_mutex_unlock(&to->lock);
                return 0;
        }
        bool with_imm = dw_wr_op(w->opcode)->imm;
        struct dw_dgram_ud u = {
            .dst_qpn = w->remote_qpn,
            .src_qpn = qp->qpn,
            .qkey = (w->remote_qkey & 0x80000000u) ? qp->attr.qkey : w->remote_qkey,
            .msn = qp->ud_msn,
            .payload_len = (uint32_t)w->total_len,
            .imm_data = with_imm ? w->imm_data : 0,
            .with_imm = with_imm,
            .se = (w->send_flags & DIWARP_SEND_SOLICITED) != 0,
        };
        /* The source address the kernel would give the datagram: the pinned
         * address, else the destination itself (a local address is its own
         * route's source; on loopback 127.0.0.1). */
        from = dst;
        from.sin_port = htons(dev->port);
        if (dev->bind_addr.s_addr != htonl(INADDR_ANY))
                from.sin_addr = dev->bind_addr;
        else if ((ntohl(dst.sin_addr.s_addr) >> 24) == 127)
                from.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool taken = ud_deliver(to, &u, &from, NULL, pay, n, true);
        /* A receive completed on a device another loop drives: wake it. */
        if (locked) {
                if (taken)
                        dw_progress_wake(&to->prog);
                pthread_mutex_unlock(&to->lock);
        }
        if (!taken) {
                uint64_t now = dw_now_ns();
                if (!qp->ud_hold_until)
                        qp->ud_hold_until = now + DW_UD_HOLD_NS;
                if (now < qp->ud_hold_until)
                        return -EBUSY;
                qp->ud_hold_until = 0;
                return 0;
        }
        qp->ud_hold_until = 0;
        qp->ud_msn += with_imm ? 2 : 1;
        dw_ud_count_tx(qp, w->total_len);
        qp->ctr.local_copies++;
        qp->ctr.local_copy_bytes += w->total_len;
        dev->ctr.local_copies++;
        dev->ctr.local_copy_bytes += w->total_len;
        dw_qp_complete_send(qp, DIWARP_WC_SUCCESS, (uint32_t)w->total_len);
        return 1;
}

/* Sends the SQ from its head, up to budget WQEs. Several ready WQEs go out
 * with one sendmmsg (dw_udp_send_batch); a lone one with one sendmsg, the
 * latency path. With fault injection each datagram passes the fault hook. */
int dw_ud_tx(struct dw_qp *qp, int budget)
{
        struct dw_device *dev = qp->dev;
        struct dw_ud_txm m[DW_UDP_TX_BATCH];
        struct dw_udp_msg msgs[DW_UDP_TX_BATCH];
        bool local = dev->cfg.local_copy == 1 && !dev->fault_on;
        int work = 0;

        while (work < budget && qp->state == DIWARP_QPS_RTS && !dw_wq_empty(&qp->sq)) {
                if (local) {
                        int r = ud_tx_local(qp);
                        if (r == -EBUSY) {
                                dw_ud_set_pending(qp, true);
                                return work;
                        }
                        if (r) {
                                work++;
                                continue;
                        }
                }
                int want = budget - work;
                if (want > DW_UDP_TX_BATCH)
                        want = DW_UDP_TX_BATCH;
                if ((uint32_t)want > dw_wq_count(&qp->sq))
                        want = (int)dw_wq_count(&qp->sq);
                /* Build datagrams for the first WQEs; a WQE that cannot be
                 * built ends the batch and is failed when it reaches the head. */
                int n = 0, bad = 0;
                uint32_t msn = qp->ud_msn;
                while (n < want) {
                        int c = dw_ud_build(qp, dw_wq_at(&qp->sq, (uint32_t)n), msn, &m[n]);
                        if (c < 0) {
                                bad = c;
                                break;
                        }
                        msgs[n] =
                            (struct dw_udp_msg){.iov = m[n].iov, .iovcnt = c, .dst = &m[n].dst};
                        msn = m[n].msn_next;
                        n++;
                }
                if (n == 0) {
                        struct dw_wqe *w = dw_wq_head(&qp->sq);
                        work++;
                        if (bad == -1) {
                                dw_warn("QP %#x: cannot encode UD headers", qp->qpn);
                                dw_qp_complete_send(qp, DIWARP_WC_LOC_QP_OP_ERR, 0);
                        } else {
                                dw_warn("QP %#x: send wr_id %#llx: local protection error (lkey); "
                                        "send queue to SQE",
                                        qp->qpn, (unsigned long long)w->wr_id);
                                dw_qp_complete_send(qp, DIWARP_WC_LOC_PROT_ERR, 0);
                        }
                        dw_qp_to_sqe(qp);
                        return work;
                }
                for (int off = 0; off < n;) {
                        int r;
                        if (dev->fault_on) {
                                r = dw_fault_tx(&dev->fault, msgs[off].iov, msgs[off].iovcnt,
                                                &m[off].dst, sizeof(m[off].dst), dw_now_ns(),
                                                dw_udp_send_fn, &dev->udp, &dev->ctr);
                                r = r >= 0 ? 1 : r;
                        } else if (n - off == 1) {
                                r = dw_udp_send(&dev->udp, msgs[off].iov, msgs[off].iovcnt,
                                                &m[off].dst);
                                r = r >= 0 ? 1 : r;
                        } else {
                                r = dw_udp_send_batch(&dev->udp, msgs + off, n - off);
                        }
                        if (r == -EAGAIN || r == -ENOBUFS) {
                                /* Back-pressure: keep the WQEs, retry on the next step;
                                 * their MSNs are assigned again then. */
                                dev->ctr.tx_backpressure++;
                                qp->ctr.tx_backpressure++;
                                dw_ud_set_pending(qp, true);
                                return work;
                        }
                        if (r < 0) {
                                work++;
                                if (!dw_ud_send_failed(qp, &m[off], r))
                                        return work;
                                off++;
                                continue;
                        }
                        for (int i = 0; i < r; i++)
                                dw_ud_sent(qp, &m[off + i]);
                        work += r;
                        off += r;
                }
        }
        if (dw_wq_empty(&qp->sq) || qp->state != DIWARP_QPS_RTS)
                dw_ud_set_pending(qp, false);
        else if (work >= budget)
                dw_ud_set_pending(qp, true); /* more to send: the next step continues */
        return work;
}

int dw_ud_tx_waiting(struct dw_device *dev, int budget)
{
        const struct dw_progress *p = &dev->prog;
        int work = 0;
        for (unsigned k = 0; k < DW_MAX_QP && work < budget && p->ntx_pending; k++) {
                unsigned idx = (dev->tx_rr + k) % DW_MAX_QP;
                struct dw_qp *qp = dev->qps[idx];
                if (!qp || !qp->tx_pending)
                        continue;
                /* Each QP gets a share so the budget spreads over the pending ones. */
                int share = (budget - work) / (int)p->ntx_pending;
                work += dw_ud_tx(qp, share > 0 ? share : 1);
                dev->tx_rr = idx + 1;
        }
        return work;
}

/* GRH as an IPv6 header (what ibverbs' struct ibv_grh lays out): version 6,
 * payload length, next header, hop limit, source GID, destination GID. */
static void dw_ud_grh(uint8_t grh[DW_GRH_LEN], const union diwarp_gid *sgid,
                      const union diwarp_gid *dgid, uint32_t payload)
{
        /* Bytes 0-3: version 6, traffic class and flow label 0. Every byte is
         * written once (no memset first: this runs for every UD receive). */
        grh[0] = 0x60;
        grh[1] = grh[2] = grh[3] = 0;
        dw_put_be16(grh + 4, (uint16_t)(payload > 0xffff ? 0xffff : payload));
        grh[6] = 0x11; /* UDP */
        grh[7] = 64;
        memcpy(grh + 8, sgid->raw, 16);
        memcpy(grh + 24, dgid->raw, 16);
}

/* True when this (source, MSN) was delivered recently; records it otherwise. */
static bool dw_ud_duplicate(struct dw_qp *qp, const struct sockaddr_in *from, uint32_t src_qpn,
                            uint32_t msn)
{
        uint64_t a = (uint64_t)ntohl(from->sin_addr.s_addr) << 16 | ntohs(from->sin_port);
        uint64_t b = (uint64_t)src_qpn << 32 | msn;
        uint64_t h = (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full);
        struct dw_ud_seen *e = &qp->ud_seen[(h >> 40) % DW_UD_SEEN_SLOTS];
        if (e->addr == a && e->qpn_msn == b)
                return true;
        e->addr = a;
        e->qpn_msn = b;
        return false;
}

/* Delivers UD message u from address from to its QP on dev: the QP, its
 * Q_Key, a receive WQE with room for GRH + payload, the duplicate filter;
 * then the GRH and the payload are placed and the receive completes. The
 * payload is u->payload_len bytes at pkt (a received datagram, its decoded
 * headers in front of it: the GRH goes over them) or, with pkt NULL, the
 * npay iovecs of pay (local: a sender in this process, ud_tx_local). Lock
 * held. false, with nothing done, only for a local sender whose destination
 * QP has no receive WQE. */
static bool ud_deliver(struct dw_device *dev, const struct dw_dgram_ud *u,
                       const struct sockaddr_in *from, uint8_t *pkt, const struct iovec *pay,
                       int npay, bool local)
{
        struct dw_qp *qp = dw_qp_lookup(dev, u->dst_qpn);
        if (!qp || qp->type != DIWARP_QPT_UD || qp->state < DIWARP_QPS_RTR ||
            qp->state > DIWARP_QPS_SQE) {
                dev->ctr.rx_dropped_no_qp++;
                dw_dbg("UD rx: no UD QP %#x ready, dropped", u->dst_qpn);
                return true;
        }
        if (u->qkey != qp->attr.qkey) {
                dev->ctr.rx_dropped_qkey++;
                qp->ctr.rx_dropped_qkey++;
                dw_dbg("QP %#x: qkey %#x != %#x, dropped", qp->qpn, u->qkey, qp->attr.qkey);
                return true;
        }
        size_t plen = u->payload_len;
        bool se = u->se;

        struct dw_wqe *w = dw_qp_recv_head(qp);
        if (!w && local)
                return false;
        if (!w) {
                dev->ctr.rx_dropped_no_recv++;
                qp->ctr.rx_dropped_no_recv++;
                dw_dbg("QP %#x: no receive posted, UD message dropped", qp->qpn);
                return true;
        }
        if (dw_ud_duplicate(qp, from, u->src_qpn, u->msn)) {
                dev->ctr.rx_dropped_duplicate++;
                qp->ctr.rx_dropped_duplicate++;
                dw_dbg("QP %#x: duplicate of MSN %#x from QP %#x dropped", qp->qpn, u->msn,
                       u->src_qpn);
                return true;
        }
        dev->ctr.rx_packets++;
        dev->ctr.rx_bytes += plen;
        qp->ctr.rx_packets++;
        qp->ctr.rx_bytes += plen;

        struct diwarp_wc wc = {
            .wr_id = w->wr_id,
            .status = DIWARP_WC_SUCCESS,
            .opcode = DIWARP_WC_RECV,
            .src_qp = u->src_qpn,
            .wc_flags = DIWARP_WC_GRH | (u->with_imm ? DIWARP_WC_WITH_IMM : 0),
            .imm_data = u->imm_data,
        };
        if (DW_GRH_LEN + plen > w->total_len) {
                dw_dbg("QP %#x: receive of %llu bytes too small for %zu + GRH", qp->qpn,
                       (unsigned long long)w->total_len, plen);
                wc.status = DIWARP_WC_LOC_LEN_ERR;
                dw_qp_complete_recv(qp, &wc, se);
                dw_qp_recv_pop(qp);
                return true;
        }
        union diwarp_gid sgid;
        dw_ipv4_to_gid(from->sin_addr, &sgid);
        int sr;
        if (pkt) {
                /* The headers in front of the payload are decoded already: the
                 * GRH goes over them, and one scatter (one lkey check per SGE,
                 * all or nothing) places GRH + payload. */
                uint8_t *g = pkt - DW_GRH_LEN;
                dw_ud_grh(g, &sgid, &dev->gid, (uint32_t)plen);
                sr = dw_rdmap_send_place(dw_rdmap_qp_of(qp), w, 0, g, DW_GRH_LEN + plen);
        } else {
                uint8_t grh[DW_GRH_LEN];
                size_t off = DW_GRH_LEN;
                dw_ud_grh(grh, &sgid, &dev->gid, (uint32_t)plen);
                struct dw_rdmap_qp rq = dw_rdmap_qp_of(qp);
                sr = dw_rdmap_send_place(rq, w, 0, grh, DW_GRH_LEN);
                for (int i = 0; i < npay && sr == 0; off += pay[i].iov_len, i++)
                        sr = dw_rdmap_send_place(rq, w, off, pay[i].iov_base, pay[i].iov_len);
        }
        if (sr < 0) {
                dw_warn_limited(&qp->dev->log_limit,
                                "QP %#x: receive wr_id %#llx: local protection error (lkey)",
                                qp->qpn, (unsigned long long)w->wr_id);
                wc.status = dw_rdmap_recv_wc(sr);
                dw_qp_complete_recv(qp, &wc, se);
                dw_qp_recv_pop(qp);
                dw_qp_to_error(qp, -1);
                return true;
        }
        wc.byte_len = (uint32_t)(DW_GRH_LEN + plen);
        dw_qp_complete_recv(qp, &wc, se);
        dw_qp_recv_pop(qp);
        return true;
}

void dw_ud_rx_auth_fail(struct dw_device *dev, const struct dw_qp *qp, int e,
                        const struct sockaddr_in *from)
{
        char a[INET_ADDRSTRLEN];
        dev->ctr.rx_dropped_auth++;
        inet_ntop(AF_INET, &from->sin_addr, a, sizeof(a));
        if (qp) {
                dw_warn_limited(
                    &dev->log_limit, "RC QP %#x over RD: datagram from %s:%u dropped: %s", qp->qpn,
                    a, ntohs(from->sin_port),
                    e == -ENOKEY ? "no authentication tag (DIWARP_AUTH: this connection "
                                   "authenticates with its own key; the sender did not)"
                                 : "authentication tag wrong (DIWARP_AUTH: not sealed with "
                                   "this connection's key, or altered)");
                return;
        }
        dw_warn_limited(&dev->log_limit, "device port %u: datagram from %s:%u dropped: %s",
                        dev->port, a, ntohs(from->sin_port),
                        e == -ENOKEY ? "no authentication tag (DIWARP_AUTH is set here; the "
                                       "sender runs without DIWARP_AUTH)"
                        : e == -EKEYREJECTED
                            ? "authentication tag wrong (DIWARP_AUTH: the sender's key differs, "
                              "or the datagram was altered)"
                            : "it carries an authentication tag and DIWARP_AUTH is off here");
}

void dw_ud_rx(struct dw_device *dev, uint8_t *pkt, size_t len, const struct sockaddr_in *from,
              uint64_t stamp)
{
        const char *why = NULL;
        /* RC over RD with its connection's key (DIWARP_AUTH): opened with
         * that key (rd/rd_rx.c). */
        if (__builtin_expect(dev->conn_keys != 0, 0) && dw_rd_rx_keyed(dev, pkt, len, from, stamp))
                return;
        /* An RD datagram without CRC32c is taken only when DIWARP_RD_CRC=0
         * says so here too: integrity is this receiver's call. */
        ssize_t body = dw_seal_open(&dev->seal, pkt, len, &why);
        if (body == -ENOKEY || body == -EKEYREJECTED || body == -ENOPROTOOPT) {
                dw_ud_rx_auth_fail(dev, NULL, (int)body, from);
                return;
        }
        if (body == -EILSEQ) {
                dev->ctr.crc_errors++;
                dw_dbg("UD rx from port %u: CRC32c mismatch, dropped", ntohs(from->sin_port));
                return;
        }
        if (body == -ENOTSUP) {
                dev->ctr.rx_dropped_nocrc++;
                dw_dbg("RD rx from port %u: a datagram without CRC32c, refused (DIWARP_RD_CRC=1)",
                       ntohs(from->sin_port));
                return;
        }
        if (body < 0)
                goto malformed;
        /* packet_check guarantees a fixed header. RD datagrams need the
         * whole header (ACK, SACK, credits): the general decoder, with a fast
         * path for the common shapes; UD ones only what dw_dgram_decode_ud
         * extracts in one pass. */
        if (pkt[1] & DW_DGRAM_F_RD) {
                struct dw_dgram_hdr h;
                ssize_t hl = dw_dgram_decode_rd(pkt, (size_t)body, &h, &why);
                if (hl < 0)
                        goto malformed;
                dw_rd_rx(dev, pkt, (size_t)body, (size_t)hl, &h, from, stamp); /* rd/rd_rx.c */
                return;
        }
        struct dw_dgram_ud u;
        if (dw_dgram_decode_ud(pkt, (size_t)body, &u, &why) < 0)
                goto malformed;

        uint8_t *payload = pkt + u.payload_off;
        if (u.payload_off >= DW_GRH_LEN) {
                ud_deliver(dev, &u, from, payload, NULL, 0, false);
        } else {
                struct iovec one = {payload, u.payload_len};
                ud_deliver(dev, &u, from, NULL, &one, 1, false);
        }
        return;

malformed:
        dev->ctr.rx_dropped_malformed++;
        dw_dbg("UD rx from port %u: malformed datagram dropped: %s", ntohs(from->sin_port),
               why ? why : "?");
}
