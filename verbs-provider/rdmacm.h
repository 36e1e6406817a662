/* Internal header of the librdmacm emulation in libdiwarp-verbs.so.
 *
 * librdmacm cannot be forwarded (it needs /dev/infiniband/rdma_cm), so the
 * preload implements its public API (RDMACM_1.0 .. 1.3) over diwarp's native
 * connection management. The objects handed to applications are the real
 * public structs of <rdma/rdma_cma.h> (struct rdma_cm_id, rdma_cm_event,
 * rdma_event_channel) embedded first in our wrappers, so the inline helpers
 * of rdma_cma.h / rdma_verbs.h (rdma_get_local_addr, rdma_post_send,
 * rdma_get_recv_comp...) work unchanged.
 *
 * Mapping (see README.md, "rdma_cm"):
 *  - RDMA_PS_TCP ids (RC QPs): rdma_listen = diwarp_listen on the application's
 *    port; rdma_connect = diwarp_connect (TCP + MPA request/reply with private
 *    data and IRD/ORD); rdma_accept/reject = diwarp_accept/reject.
 *  - RDMA_PS_UDP ids (UD QPs): a small TCP exchange on the application's port
 *    stands in for IB SIDR: the request carries private data, the reply the
 *    responder's QPN and qkey.
 *  - Events go through a per-channel queue whose fd is an eventfd in semaphore
 *    mode (one count per queued event): readable exactly while events wait.
 *  - One helper thread per process watches listeners and connected QPs (peer
 *    close -> DISCONNECTED); an asynchronous rdma_connect runs on a short-lived
 *    thread of its own because diwarp_connect blocks.
 */
#ifndef DWV_RDMACM_H
#define DWV_RDMACM_H

#include <rdma/rdma_cma.h>
#include <stdbool.h>
#include <stdint.h>

/* Bytes of private data an event can carry (rdma_conn_param's length is a
 * uint8_t). */
#define RCM_PD_MAX 255

/* UD address exchange on the application's TCP port (our stand-in for SIDR).
 * Fixed-size frames, network byte order:
 *   request: "DWUD" ver(1)=1 type(1)=1 pd_len(1) pad(1) qpn(4) pd[255] pad(1)
 *   reply:   "DWUD" ver(1)=1 type(1)=2 accept / 3 reject, pd_len(1) pad(1)
 *            qpn(4) qkey(4) pd[255] pad(1)  */
#define RCM_UD_MAGIC   "DWUD"
#define RCM_UD_VER     1
#define RCM_UD_REQ     1
#define RCM_UD_ACCEPT  2
#define RCM_UD_REJECT  3
#define RCM_UD_REQ_LEN (12 + RCM_PD_MAX + 1)
#define RCM_UD_REP_LEN (16 + RCM_PD_MAX + 1)

#endif
