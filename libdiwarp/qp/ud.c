/* UD queue pairs over the instance UDP socket (DESIGN.md §4, §5).
 *
 * One message = one datagram: datagram header | untagged DDP/RDMAP Send |
 * payload | [RFC 7306 Immediate Data message] | CRC32c. The payload is
 * gathered from the SGEs by sendmsg (no staging copy); the CRC runs over the
 * same iovecs. A send completes when the socket accepts the datagram; a full
 * socket buffer (EAGAIN/ENOBUFS) keeps the WQE for the next progress step.
 *
 * Receive: the datagram is checked (CRC, header, QPN, qkey, opcode) in its
 * bounce buffer, then a 40-byte GRH carrying the sender's IPv4-mapped GID and
 * the payload are copied into the head receive WQE.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "dw.h"
#include "qp/rd.h"
#include "util/time.h"
#include "wire/crc32c.h"
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
        dw_progress_tx_wait(qp->dev, pending);
}

/* MSN of an untagged DDP header (RFC 5041 §4.3: control, RsvdULP 8 + 32 bits,
 * QN, MSN, MO). The cached header is checked at this offset when stored. */
#define DW_UD_MSN_OFF 10

/* Encodes the headers of one UD message with MSN msn into hdr (dgram + Send)
 * and imm (Immediate Data message, when with_imm). Returns the header length. */
static ssize_t dw_ud_headers(struct dw_qp *qp, const struct dw_wqe *w, uint32_t msn, uint8_t *hdr,
                             size_t cap, uint8_t *imm, bool with_imm)
{
        bool se = w->send_flags & DIWARP_SEND_SOLICITED;
        /* IB rule: a remote qkey with the high bit set means "use the QP's own". */
        uint32_t qkey = (w->remote_qkey & 0x80000000u) ? qp->attr.qkey : w->remote_qkey;
        uint8_t op = se ? 2 : 1; /* header cache key (Sends without immediate) */
        if (!with_imm && qp->ud_hdr_op == op && qp->ud_hdr_dst == w->remote_qpn &&
            qp->ud_hdr_qkey == qkey && cap >= qp->ud_hdr_len) {
                memcpy(hdr, qp->ud_hdr, qp->ud_hdr_len);
                dw_put_be32(hdr + DW_DGRAM_HDR_LEN + DW_UD_MSN_OFF, msn);
                return qp->ud_hdr_len;
        }
        struct dw_dgram_hdr h = {
            .flags = DW_DGRAM_F_DATA | (with_imm ? DW_DGRAM_F_IMM : 0),
            .dst_qpn = w->remote_qpn,
            .src_qpn = qp->qpn,
            .qkey = qkey,
        };
        ssize_t n = dw_dgram_encode(&h, hdr, cap);
        if (n < 0)
                return n;
        struct dw_rdmap_hdr r;
        /* With immediate data the SE bit rides on the Immediate Data message,
         * the one that completes the receive. */
        if (dw_rdmap_hdr_init(&r, se && !with_imm ? DW_RDMAP_SEND_SE : DW_RDMAP_SEND) < 0)
                return -EINVAL;
        r.ddp.last = true;
        r.ddp.msn = msn;
        r.ddp.mo = 0;
        ssize_t m = dw_rdmap_encode(&r, hdr + n, cap - (size_t)n);
        if (m < 0)
                return m;
        if (!with_imm && n == DW_DGRAM_HDR_LEN && (size_t)(n + m) <= sizeof(qp->ud_hdr) &&
            dw_get_be32(hdr + n + DW_UD_MSN_OFF) == msn) {
                memcpy(qp->ud_hdr, hdr, (size_t)(n + m));
                qp->ud_hdr_len = (uint8_t)(n + m);
                qp->ud_hdr_op = op;
                qp->ud_hdr_dst = w->remote_qpn;
                qp->ud_hdr_qkey = qkey;
        }
        if (with_imm) {
                struct dw_rdmap_hdr ri;
                if (dw_rdmap_hdr_init(&ri, se ? DW_RDMAP_IMM_DATA_SE : DW_RDMAP_IMM_DATA) < 0)
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

/* One datagram being built: headers, CRC trailer and the iovecs gathering
 * them around the payload, which stays in registered memory. */
struct dw_ud_txm {
        uint8_t hdr[DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN];
        uint8_t imm[DW_DGRAM_IMM_MSG_LEN];
        uint8_t crc[DW_DGRAM_CRC_LEN];
        struct iovec iov[DW_MAX_SGE + 3];
        struct sockaddr_in dst;
        uint32_t msn_next; /* qp->ud_msn once this one is sent */
};

/* Builds the datagram of WQE w with MSN msn into m. Returns the iovec count,
 * or the completion status that fails the WQE (negative: -1 encode, -2 lkey). */
static int dw_ud_build(struct dw_qp *qp, const struct dw_wqe *w, uint32_t msn, struct dw_ud_txm *m)
{
        bool with_imm = w->opcode == DIWARP_WR_SEND_WITH_IMM;
        ssize_t hl = dw_ud_headers(qp, w, msn, m->hdr, sizeof(m->hdr), m->imm, with_imm);
        if (hl < 0)
                return -1;
        m->iov[0].iov_base = m->hdr;
        m->iov[0].iov_len = (size_t)hl;
        int g = dw_qp_gather(qp, w, m->iov + 1, DW_MAX_SGE);
        if (g < 0)
                return -2;
        int cnt = 1 + g;
        if (with_imm) {
                m->iov[cnt].iov_base = m->imm;
                m->iov[cnt].iov_len = sizeof(m->imm);
                cnt++;
        }
        uint32_t st = dw_crc32c_update_iov(dw_crc32c_init(), m->iov, (size_t)cnt);
        dw_dgram_crc_trailer(m->crc, st);
        m->iov[cnt].iov_base = m->crc;
        m->iov[cnt].iov_len = sizeof(m->crc);
        cnt++;
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
        dw_ud_count_tx(qp, len);
        dw_qp_complete_send(qp, DIWARP_WC_SUCCESS, len);
}

/* The head WQE's send failed locally with -r (not back-pressure). Completes it
 * with an error; returns false when the QP went to ERR. */
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
        bool prot = r == -EFAULT;
        dw_qp_complete_send(qp,
                            prot ? DIWARP_WC_LOC_PROT_ERR
                                 : (r == -EMSGSIZE ? DIWARP_WC_LOC_LEN_ERR : DIWARP_WC_GENERAL_ERR),
                            0);
        if (prot) {
                dw_qp_to_error(qp, -1);
                return false;
        }
        return true;
}

/* Sends the SQ from its head, up to budget WQEs. Several ready WQEs go out
 * with one sendmmsg (dw_udp_send_batch); a lone one with one sendmsg, the
 * latency path. With fault injection each datagram passes the fault hook. */
int dw_ud_tx(struct dw_qp *qp, int budget)
{
        struct dw_device *dev = qp->dev;
        struct dw_ud_txm m[DW_UDP_TX_BATCH];
        struct dw_udp_msg msgs[DW_UDP_TX_BATCH];
        int work = 0;

        while (work < budget && qp->state == DIWARP_QPS_RTS && !dw_wq_empty(&qp->sq)) {
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
                                continue;
                        }
                        dw_warn("QP %#x: send wr_id %#llx: local protection error (lkey)", qp->qpn,
                                (unsigned long long)w->wr_id);
                        dw_qp_complete_send(qp, DIWARP_WC_LOC_PROT_ERR, 0);
                        dw_qp_to_error(qp, -1);
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

/* GRH as an IPv6 header (what ibverbs' struct ibv_grh lays out): version 6,
 * payload length, next header, hop limit, source GID, destination GID. */
static void dw_ud_grh(uint8_t grh[DW_GRH_LEN], const union diwarp_gid *sgid,
                      const union diwarp_gid *dgid, uint32_t payload)
{
        memset(grh, 0, DW_GRH_LEN);
        grh[0] = 0x60;
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

void dw_ud_rx(struct dw_device *dev, uint8_t *pkt, size_t len, const struct sockaddr_in *from)
{
        const char *why = NULL;
        ssize_t body = dw_dgram_packet_check(pkt, len, &why);
        if (body == -EILSEQ) {
                dev->ctr.crc_errors++;
                dw_dbg("UD rx from port %u: CRC32c mismatch, dropped", ntohs(from->sin_port));
                return;
        }
        if (body < 0)
                goto malformed;
        struct dw_dgram_hdr h;
        ssize_t hl = dw_dgram_decode(pkt, (size_t)body, &h, &why);
        if (hl < 0)
                goto malformed;
        if (h.flags & DW_DGRAM_F_RD) {
                dw_rd_rx(dev, pkt, (size_t)body, (size_t)hl, &h, from); /* qp/rd.c */
                return;
        }
        if (!(h.flags & DW_DGRAM_F_DATA)) {
                why = "UD datagram without DATA";
                goto malformed;
        }
        struct dw_dgram_layout lay;
        if (dw_dgram_layout(&h, (size_t)hl, (size_t)body, &lay, &why) < 0)
                goto malformed;

        struct dw_qp *qp = dw_qp_lookup(dev, h.dst_qpn);
        if (!qp || qp->type != DIWARP_QPT_UD ||
            (qp->state != DIWARP_QPS_RTR && qp->state != DIWARP_QPS_RTS)) {
                dev->ctr.rx_dropped_no_qp++;
                dw_dbg("UD rx: no UD QP %#x ready, dropped", h.dst_qpn);
                return;
        }
        if (h.qkey != qp->attr.qkey) {
                dev->ctr.rx_dropped_qkey++;
                qp->ctr.rx_dropped_qkey++;
                dw_dbg("QP %#x: qkey %#x != %#x, dropped", qp->qpn, h.qkey, qp->attr.qkey);
                return;
        }
        struct dw_rdmap_hdr r;
        ssize_t rl = dw_rdmap_decode(pkt + lay.seg_off, lay.seg_len, &r, &why);
        if (rl < 0)
                goto malformed;
        if (r.ddp.tagged || (r.opcode != DW_RDMAP_SEND && r.opcode != DW_RDMAP_SEND_SE) ||
            !r.ddp.last || r.ddp.mo != 0) {
                why = "UD carries only single-segment Send messages";
                goto malformed;
        }
        const uint8_t *payload = pkt + lay.seg_off + rl;
        size_t plen = lay.seg_len - (size_t)rl;
        bool se = r.opcode == DW_RDMAP_SEND_SE;
        bool with_imm = false;
        uint32_t imm_data = 0;
        if (h.flags & DW_DGRAM_F_IMM) {
                struct dw_rdmap_hdr ri;
                ssize_t il = dw_rdmap_decode(pkt + lay.imm_off, DW_DGRAM_IMM_MSG_LEN, &ri, &why);
                if (il < 0)
                        goto malformed;
                if (ri.opcode != DW_RDMAP_IMM_DATA && ri.opcode != DW_RDMAP_IMM_DATA_SE) {
                        why = "IMM flag without an Immediate Data message";
                        goto malformed;
                }
                se = se || ri.opcode == DW_RDMAP_IMM_DATA_SE;
                memcpy(&imm_data, pkt + lay.imm_off + il, 4);
                with_imm = true;
        }

        struct dw_wqe *w = dw_qp_recv_head(qp);
        if (!w) {
                dev->ctr.rx_dropped_no_recv++;
                qp->ctr.rx_dropped_no_recv++;
                dw_dbg("QP %#x: no receive posted, UD message dropped", qp->qpn);
                return;
        }
        if (dw_ud_duplicate(qp, from, h.src_qpn, r.ddp.msn)) {
                dev->ctr.rx_dropped_duplicate++;
                qp->ctr.rx_dropped_duplicate++;
                dw_dbg("QP %#x: duplicate of MSN %#x from QP %#x dropped", qp->qpn, r.ddp.msn,
                       h.src_qpn);
                return;
        }
        dev->ctr.rx_packets++;
        dev->ctr.rx_bytes += plen;
        qp->ctr.rx_packets++;
        qp->ctr.rx_bytes += plen;

        struct diwarp_wc wc = {
            .wr_id = w->wr_id,
            .status = DIWARP_WC_SUCCESS,
            .opcode = DIWARP_WC_RECV,
            .src_qp = h.src_qpn,
            .wc_flags = DIWARP_WC_GRH | (with_imm ? DIWARP_WC_WITH_IMM : 0),
            .imm_data = with_imm ? imm_data : 0,
        };
        if (DW_GRH_LEN + plen > w->total_len) {
                dw_dbg("QP %#x: receive of %llu bytes too small for %zu + GRH", qp->qpn,
                       (unsigned long long)w->total_len, plen);
                wc.status = DIWARP_WC_LOC_LEN_ERR;
                dw_qp_complete_recv(qp, &wc, se);
                dw_qp_recv_pop(qp);
                return;
        }
        uint8_t grh[DW_GRH_LEN];
        union diwarp_gid sgid;
        dw_ipv4_to_gid(from->sin_addr, &sgid);
        int sr;
        if (payload - pkt >= DW_GRH_LEN) {
                /* The headers in front of the payload are decoded already: the
                 * GRH goes over them, and one scatter (one lkey check per SGE,
                 * all or nothing) places GRH + payload. */
                uint8_t *g = (uint8_t *)payload - DW_GRH_LEN;
                dw_ud_grh(g, &sgid, &dev->gid, (uint32_t)plen);
                sr = dw_qp_scatter(qp, w, 0, g, DW_GRH_LEN + plen);
        } else {
                dw_ud_grh(grh, &sgid, &dev->gid, (uint32_t)plen);
                sr = dw_qp_scatter(qp, w, 0, grh, DW_GRH_LEN);
                if (sr == 0)
                        sr = dw_qp_scatter(qp, w, DW_GRH_LEN, payload, plen);
        }
        if (sr < 0) {
                dw_warn("QP %#x: receive wr_id %#llx: local protection error (lkey)", qp->qpn,
                        (unsigned long long)w->wr_id);
                wc.status = DIWARP_WC_LOC_PROT_ERR;
                dw_qp_complete_recv(qp, &wc, se);
                dw_qp_recv_pop(qp);
                dw_qp_to_error(qp, -1);
                return;
        }
        wc.byte_len = (uint32_t)(DW_GRH_LEN + plen);
        dw_qp_complete_recv(qp, &wc, se);
        dw_qp_recv_pop(qp);
        return;

malformed:
        dev->ctr.rx_dropped_malformed++;
        dw_dbg("UD rx from port %u: malformed datagram dropped: %s", ntohs(from->sin_port),
               why ? why : "?");
}
