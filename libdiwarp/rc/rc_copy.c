/* RC's local copy (DIWARP_LOCAL_COPY, on in the host daemon): a plain Send,
 * RDMA Write or Read whose other end is linked in this process (rc_local.h)
 * is done as one copy between the two programs' memory while the stream is
 * idle both ways, with every check the wire would make. */
#include "rc/rc.h"
#include "rc/rc_int.h"
#include "rc/rc_local.h"

#include <errno.h>
#include <string.h>

#include "progress/progress.h"
#include "rdmap/rdmap.h"
#include "util/copy.h"

/* The last byte of an iovec list (NULL when it has none). */
static uint8_t *iov_last_byte(const struct iovec *v, int n)
{
        while (n > 0 && v[n - 1].iov_len == 0)
                n--;
        return n ? (uint8_t *)v[n - 1].iov_base + v[n - 1].iov_len - 1 : NULL;
}

/* Copies src to dst (the same length in all), the last byte last and after
 * a full fence: a program that polls the last byte of a buffer written to
 * it (perftest's latency tests) then finds every other byte in place, as it
 * does when FPDUs arrive in order. memcpy alone may store its tail first, or
 * with non-temporal stores that a plain release does not order. */
static void copy_iov(const struct iovec *dst, int nd, const struct iovec *src, int ns)
{
        uint8_t *dlast = iov_last_byte(dst, nd);
        const uint8_t *slast = iov_last_byte(src, ns);
        size_t left = 0, doff = 0, soff = 0;

        if (!dlast || !slast)
                return;
        for (int j = 0; j < ns; j++)
                left += src[j].iov_len;
        left--; /* the very last byte goes after the rest */
        for (int i = 0, j = 0; left && i < nd && j < ns;) {
                size_t n = dst[i].iov_len - doff;
                if (n > src[j].iov_len - soff)
                        n = src[j].iov_len - soff;
                if (n > left)
                        n = left;
                memcpy((uint8_t *)dst[i].iov_base + doff, (const uint8_t *)src[j].iov_base + soff,
                       n);
                doff += n;
                soff += n;
                left -= n;
                if (doff == dst[i].iov_len) {
                        i++;
                        doff = 0;
                }
                if (soff == src[j].iov_len) {
                        j++;
                        soff = 0;
                }
        }
        dw_store_last_byte(dlast, *slast);
}

/* The responder p takes the WQE as if it had come in FPDUs: a Write or Read
 * lands in (or comes from) its registered memory, a Send in its next receive
 * WQE, which completes. Every rule of the wire applies, checked under p's
 * device lock before a byte moves: its QP's state and access flags, its MR
 * table (STag, PD, bounds, access) for a tagged WQE, a receive WQE with
 * room for a Send. false (nothing done): the WQE goes on the stream, where
 * a failure gets its Terminate. */
static bool local_take(struct dw_rc_conn *c, struct dw_rc_conn *p, struct dw_wqe *w,
                       const struct iovec *loc, int nloc)
{
        struct dw_qp *pq = p->qp;

        if (p->state != DW_RC_UP || p->rx_state != DW_RC_RX_HDR || p->rx_end != p->rx_start ||
            p->term_pending || p->imm_pending || p->rx_wait_recv || p->rx_wqe || p->irq_count ||
            p->orq_count || p->rtr_send_expected ||
            (pq->state != DIWARP_QPS_RTS && pq->state != DIWARP_QPS_RTR &&
             pq->state != DIWARP_QPS_SQD))
                return false;
        if (w->opcode == DIWARP_WR_SEND) {
                struct dw_wqe *rw = dw_qp_recv_head(pq);
                struct iovec tgt[DW_MAX_SGE];
                int n = rw ? dw_rdmap_send_target(dw_rdmap_qp_of(pq), rw, 0, w->total_len, tgt,
                                                  DW_MAX_SGE)
                           : -ENOENT;
                if (n < 0)
                        return false;
                rc_rx_comm_est(p);
                copy_iov(tgt, n, loc, nloc);
                c->msn_send++;
                p->msn_expect_send++;
                /* As the Send would have ended on the stream. */
                struct dw_rdmap_msg_end e = dw_rdmap_send_end(
                    dw_rdmap_send_opcode(w, (w->send_flags & DIWARP_SEND_SOLICITED) != 0),
                    (uint32_t)w->total_len, 0);
                struct dw_recv_done d;
                bool solicited = dw_rdmap_recv_end(dw_rdmap_qp_of(pq), &e, &d, NULL);
                rc_rx_complete_recv(p, rw, d, solicited);
                return true;
        }
        bool write = w->opcode == DIWARP_WR_RDMA_WRITE;
        int access = write ? DIWARP_ACCESS_REMOTE_WRITE : DIWARP_ACCESS_REMOTE_READ;
        uint8_t *host = NULL;
        if ((!write && !p->ird) ||
            dw_rdmap_check_remote(dw_rdmap_qp_of(pq), access, w->rkey, w->remote_addr, w->total_len,
                                  &host) != DW_PROT_OK)
                return false;
        rc_rx_comm_est(p);
        struct iovec mem = {host, w->total_len};
        if (write) {
                copy_iov(&mem, 1, loc, nloc);
                /* As a Write that came in FPDUs: its length is what an
                 * Immediate Data on its own would report. */
                p->rx_write_len = w->total_len;
                p->rx_write_bytes = 0;
        } else {
                copy_iov(loc, nloc, &mem, 1);
        }
        return true;
}

/* A plain Send, RDMA Write or Read whose other end is linked in this process
 * (rc_local.h) is done as one copy between the two programs' memory instead
 * of FPDUs through the loopback stream (DIWARP_LOCAL_COPY; on in the host
 * daemon, where every client's regions are mapped). Only while the stream is
 * idle both ways, so its order is kept: the responder has consumed every
 * byte sent before, no Read is outstanding in either direction, nothing is
 * queued. The responder's device is only tried (never waited for). loc: the
 * WQE's checked local SGEs (the source of a Send or Write, the sink of a
 * Read). true: the WQE completed. */

#define DW_RC_LOCAL_DRAIN_READS 4

bool rc_local_copy_candidate(const struct dw_rc_conn *c, const struct dw_wqe *w)
{
        return c->qp->dev->cfg.local_copy == 1 && c->end_slot >= 0 &&
               dw_rc_end_linked(c->end_slot) &&
               (w->opcode == DIWARP_WR_SEND ||
                ((w->opcode == DIWARP_WR_RDMA_WRITE || w->opcode == DIWARP_WR_RDMA_READ) &&
                 w->total_len));
}

bool rc_local_copy(struct dw_rc_conn *c, struct dw_wqe *w, const struct iovec *loc, int nloc)
{
        bool locked;

        if (!rc_local_copy_candidate(c, w) || c->state != DW_RC_UP || c->nslot || c->term_pending ||
            c->orq_count || c->irq_count)
                return false;
        struct dw_rc_conn *p = dw_rc_end_lock_peer(c->end_slot, c->qp->dev, &locked);
        if (!p)
                return false;
        /* With its lock held, the other end's rx_done is what it publishes
         * as consumed. What this end sent before is in its socket: it reads
         * it now (only reads, as local_peer_wait has it do), so a Write
         * posted right behind a Send need not join the stream, and a stream
         * that carried a few does not keep every WQE behind on it. Up to
         * DW_RC_LOCAL_DRAIN_READS reads of at most DW_RC_RX_STEP_BYTES: a
         * deep queue of 1 MiB Writes that went by the stream once (the
         * other end's lock was busy) leaves more in the socket than one
         * read takes, and a program that keeps the queue full would
         * otherwise keep every later Write on the stream. A terminated end
         * fails local_take's state checks. */
        for (int i = 0; i < DW_RC_LOCAL_DRAIN_READS && p->rx_done != c->tx_sent; i++) {
                uint64_t before = p->rx_done;
                rc_rx(p);
                if (p->rx_done == before)
                        break;
        }
        bool done = p->rx_done == c->tx_sent && local_take(c, p, w, loc, nloc);
        /* A receive completed on a device another loop drives: wake it. */
        if (done && locked && w->opcode == DIWARP_WR_SEND)
                dw_progress_wake(&p->qp->dev->prog);
        dw_rc_end_unlock_peer(p, locked);
        if (!done)
                return false;
        c->qp->ctr.local_copies++;
        c->qp->ctr.local_copy_bytes += w->total_len;
        c->qp->dev->ctr.local_copies++;
        c->qp->dev->ctr.local_copy_bytes += w->total_len;
        w->status = DIWARP_WC_SUCCESS;
        w->byte_len = (uint32_t)w->total_len;
        w->flags |= DW_WQE_DONE;
        rc_retire(c);
        return true;
}
