/* rc/cm: RC connection management.
 *
 *  - mpa_conn.{c,h}: the MPA request/reply exchange on one socket.
 *  - cm.c: the native CM calls of diwarp.h (diwarp_listen, *_get_request,
 *    accept, reject, connect, disconnect) and the IB-style connect that starts
 *    when an RC QP reaches RTR with DEST_QPN + AV (docs/PROTOCOL.md).
 * Established streams are handed to rc.c (dw_rc_handover).
 *
 * IB-style connect private data (MPA Request and Reply, 32 bytes, after the
 * RFC 6581 IRD/ORD block; see docs/PROTOCOL.md):
 *     0  magic "DWQP"            4  version (1)   5  reason (Reply: 0 accept)
 *     6  reserved (2, zero)      8  initiator QPN (32, BE)
 *    12  responder QPN (32, BE) 16  sender's GID (16: initiator's in the
 *                                    Request, responder's in the Reply)
 */
#ifndef DIWARP_RC_CM_H
#define DIWARP_RC_CM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

struct dw_device;
struct dw_qp;
struct dw_rc_conn;
struct dw_cm_pend;
struct dw_cm_att;
struct dw_cm_rdch;

#define DW_IBCM_PD_LEN  32
#define DW_IBCM_VERSION 1

enum dw_ibcm_reason {
        DW_IBCM_ACCEPT = 0,
        DW_IBCM_NO_QP = 1,      /* no QP with that number */
        DW_IBCM_NOT_READY = 2,  /* the QP did not reach RTR for this peer in time */
        DW_IBCM_BUSY = 3,       /* the QP is already connected */
        DW_IBCM_BAD_REQUEST = 4 /* private data not understood / markers asked */
};

struct dw_ibcm_pd {
        uint8_t version;
        uint8_t reason;
        uint32_t init_qpn;
        uint32_t resp_qpn;
        union diwarp_gid gid;
};

/* Returns DW_IBCM_PD_LEN or -ENOSPC. */
int dw_ibcm_pd_encode(const struct dw_ibcm_pd *in, uint8_t *buf, size_t cap);
/* Returns 0, or -EPROTO (not ours: magic/version), -ENODATA (short). */
int dw_ibcm_pd_decode(const uint8_t *buf, size_t len, struct dw_ibcm_pd *out);

/* Per-device RC/CM state (dev->rc). */
struct dw_rc_dev {
        struct dw_device *dev;
        struct dw_rc_conn *timers; /* rc.c: conns with a deadline */
        struct dw_cm_pend *pend;   /* IB-style: accepted sockets not yet matched */
        int npend;
        struct dw_cm_att *atts; /* IB-style: our outgoing attempts */
        bool listen_watched;
        struct dw_rc_conn *live; /* rc.c: conns with an open stream (dw_rc_poll reads them) */
        unsigned nlive;
        struct dw_cm_rdch *rdchs; /* RC over RD: the idle CM streams of native connections */
        uint32_t rdchs_ending;    /* of them, closed by the peer: their QPs end soon */
};

/* All below: device lock held (dw_cm_qp_cancel: dw.h). */
int dw_cm_dev_init(struct dw_device *dev);
void dw_cm_dev_fini(struct dw_device *dev);
/* The QP just reached RTR with DEST_QPN + AV: start (smaller (GID, QPN)) or
 * await (larger) the stream. 0 or -errno (-EINVAL: AV is not an IPv4 GID or
 * the QP names itself). */
int dw_cm_ib_connect(struct dw_qp *qp);
/* One step of qp's IB-style connect (smaller (GID, QPN)) while it waits for
 * the Reply: with the Reply in, its stream attaches. For a responder in
 * this process whose completion waits for this end (rc_local.h): it wrote
 * the Reply before it could send, so it is there to be read. */
void dw_cm_att_step(struct dw_qp *qp);
/* Timers: retries, deadlines. Returns work done. */
int dw_cm_progress(struct dw_device *dev);

#endif
