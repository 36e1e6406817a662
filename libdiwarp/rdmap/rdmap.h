/* rdmap/: the RDMAP engine's transport-independent parts (RFC 5040, RFC 7306),
 * shared by RC over TCP (rc/rc_tx.c, rc/rc_rx.c) and RD over UDP (rd/rd_rx.c,
 * rd/rd_tx.c).
 *
 * What is here exists once for both transports: the opcode table (what
 * each RDMAP message is to the engine), the responder's remote-access check
 * (the QP's rights, the STag table, atomic alignment) and its acceptance of
 * a Write segment or a Read or Atomic Request, the responses to those
 * requests (one record per IRQ entry: an Atomic runs as it is accepted,
 * a Read is served segment by segment), where each segment's payload
 * lands (a Write's region, a Send's receive WR, a response's sink: the one
 * walk of a WR's SGEs, which the transport's payload source fills), the
 * Send rules of placement
 * (SE, Invalidate, a Send that does not fit its receive WR), the end of a
 * message that consumes a receive WR and the completion it becomes (the
 * Invalidate carried out there, once), the RFC 7306 atomic
 * operations and the building of an Atomic Request from a WR, and the
 * classification of errors: a failed check to the Terminate layer/type/code
 * (RFC 5040 §7, RFC 5041 §7) that RC sends in a Terminate and RD turns into
 * an error NAK, and a received Terminate or error NAK to the requester's
 * completion status.
 *
 * No socket, no clock, no allocation, no logging. The hot-path helpers are
 * static inline; the callers hold the device lock.
 */
#ifndef DIWARP_RDMAP_RDMAP_H
#define DIWARP_RDMAP_RDMAP_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include <diwarp/diwarp.h>

#include "mem/mr.h"
#include "queue/wq.h"
#include "wire/dgram.h"
#include "wire/rdmap.h"

/* ---- Opcode table ---- */

/* Which way a message goes between requester and responder. */
enum dw_rdmap_dir {
        DW_RDMAP_DIR_REQUEST,   /* requester to responder: Write, Read Request, Send*, Immediate,
                                   Atomic Request */
        DW_RDMAP_DIR_RESPONSE,  /* responder to requester: Read Response, Atomic Response */
        DW_RDMAP_DIR_TERMINATE, /* either end, once: Terminate */
};

/* Where a failed check happened: decides which layer reports it in the
 * Terminate (RFC 5040 §4.8, RFC 5041 §7.2). */
enum dw_prot_ctx {
        DW_PROT_CTX_TAGGED_SINK, /* tagged DDP placement: RDMA Write, Read Response */
        DW_PROT_CTX_READ_SOURCE, /* RDMA Read Request at the Data Source */
        DW_PROT_CTX_ATOMIC,      /* RFC 7306 Atomic Request target */
        DW_PROT_CTX_INVALIDATE,  /* Send with (SE and) Invalidate: the Invalidate STag */
};

/* What the responder does with a message: the receive handler each
 * transport keeps per kind, indexed by the opcode table's rx (RFC 5040
 * §4.2 groups the four Sends and the two Immediate Data messages). */
enum dw_rdmap_rx {
        DW_RDMAP_RX_WRITE,       /* tagged placement at the Data Sink */
        DW_RDMAP_RX_READ_REQ,    /* a Read Request: queued for the Read Response */
        DW_RDMAP_RX_READ_RESP,   /* tagged placement into the requester's Read sink */
        DW_RDMAP_RX_SEND,        /* the Send family: placed into a receive WR */
        DW_RDMAP_RX_TERMINATE,   /* the peer's Terminate */
        DW_RDMAP_RX_IMM,         /* Immediate Data (with or without SE) */
        DW_RDMAP_RX_ATOMIC_REQ,  /* an Atomic Request: queued for its Atomic Response */
        DW_RDMAP_RX_ATOMIC_RESP, /* an Atomic Response: the original value to its WR */
        DW_RDMAP_RX_NKINDS,
};

/* The engine's view of one RDMAP opcode. Its wire layout (T flag, QN, one
 * segment or many, RDMAP header length) is wire/'s dw_rdmap_opinfo;
 * hdr_len is the whole header before the payload that layout gives. */
struct dw_rdmap_op {
        enum dw_rdmap_dir dir;
        bool payload; /* carries ULP payload after its headers */
        int access;   /* the responder's remote right it needs (DIWARP_ACCESS_REMOTE_*), or 0 */
        enum dw_prot_ctx ctx; /* how a failed check of that right is reported */
        uint32_t hdr_len;     /* DDP + RDMAP header bytes (Terminate: the minimum) */
        enum dw_rdmap_rx rx;  /* the responder's handler of it */
};

#define DW_RDMAP_NOPS 12 /* RFC 5040 §4.2's opcodes and RFC 7306's: 0 to 0xb */

extern const struct dw_rdmap_op dw_rdmap_ops[DW_RDMAP_NOPS];

/* NULL for an opcode RDMAP does not define (RFC 5040 §4.2, RFC 7306).
 * Inline: RD's receive asks it for every segment. */
static inline const struct dw_rdmap_op *dw_rdmap_op(unsigned int opcode)
{
        return opcode < DW_RDMAP_NOPS ? &dw_rdmap_ops[opcode] : NULL;
}

/* The Send family (Send, Send with SE, with Invalidate, with SE and
 * Invalidate: RFC 5040 §4.2): untagged, queue 0, each message fills one
 * receive WR. */
static inline bool dw_rdmap_is_send(unsigned int opcode)
{
        return opcode == DW_RDMAP_SEND || opcode == DW_RDMAP_SEND_SE ||
               opcode == DW_RDMAP_SEND_INVAL || opcode == DW_RDMAP_SEND_SE_INVAL;
}

/* A Send that asks for a solicited event at its receive completion. */
static inline bool dw_rdmap_send_se(unsigned int opcode)
{
        return opcode == DW_RDMAP_SEND_SE || opcode == DW_RDMAP_SEND_SE_INVAL;
}

/* A Send that carries an Invalidate STag. */
static inline bool dw_rdmap_send_inval(unsigned int opcode)
{
        return opcode == DW_RDMAP_SEND_INVAL || opcode == DW_RDMAP_SEND_SE_INVAL;
}

/* Terminate error triple (enum dw_term_layer, per-layer type and code from
 * wire/rdmap.h). */
struct dw_term_error {
        uint8_t layer;
        uint8_t etype;
        uint8_t ecode;
};

/* diwarp_wc.vendor_err encoding of a Terminate error: layer << 12 | type << 8 | code. */
static inline uint32_t dw_term_vendor_err(struct dw_term_error e)
{
        return (uint32_t)(e.layer & 0xf) << 12 | (uint32_t)(e.etype & 0xf) << 8 | e.ecode;
}

/* ---- Remote access (the responder) ---- */

/* What the responder's rules read of the QP they act for, and nothing
 * more: the transport builds it from its QP (dw_rdmap_qp_of, dw.h), so
 * rdmap/ knows no QP, device or transport. Passed by value: the hot checks
 * are inline, and the copy folds away. */
struct dw_rdmap_qp {
        struct dw_mr_table *mrs;     /* the device's STag table */
        struct dw_pd *pd;            /* the QP's PD: an STag must belong to it */
        const struct dw_pd *recv_pd; /* its receive WRs' PD (the SRQ's, if any) */
        uint32_t qpn;                /* a type 2 window must be bound to it */
        int access;                  /* the QP's remote rights: qp_access_flags, 0 until set */
};

/* The QP's own remote rights (ibverbs qp_access_flags): none until the
 * application sets them, as in ibverbs (a QP moved to INIT without the
 * access flags has qp_access_flags 0), natively connected QPs too.
 * access: one or more DIWARP_ACCESS_REMOTE_* rights. */
static inline bool dw_rdmap_qp_allows(struct dw_rdmap_qp qp, int access)
{
        return access && (qp.access & access) == access;
}

/* The responder's check of a remote access to [to, to + len) of STag stag
 * with one DIWARP_ACCESS_REMOTE_* right: the QP's rights (a zero-length
 * Write or Read needs none, an atomic always), then the STag table (key,
 * PD, rights, bounds: mem/), then for an atomic a naturally aligned 64-bit
 * word (len must be 8). *host (may be NULL) gets the host address. */
static inline enum dw_prot_status dw_rdmap_check_remote(struct dw_rdmap_qp qp, int access,
                                                        uint32_t stag, uint64_t to, uint64_t len,
                                                        uint8_t **host)
{
        bool atomic = access == DIWARP_ACCESS_REMOTE_ATOMIC;
        uint8_t *h = NULL;

        if ((len || atomic) && !dw_rdmap_qp_allows(qp, access))
                return DW_PROT_ACCESS;
        if (atomic && len != 8)
                return DW_PROT_BOUNDS;
        enum dw_prot_status st =
            dw_mr_check_remote(qp.mrs, stag, qp.pd, qp.qpn, access, to, len, &h);
        if (st == DW_PROT_OK && atomic && ((uintptr_t)h & 7))
                st = DW_PROT_BOUNDS;
        if (host)
                *host = h;
        return st;
}

/* The Data Source's check of len bytes at to of a Read's source STag: the
 * whole source as a Read Request is accepted (dw_rdmap_read_req_accept),
 * then each Read Response segment again as it is built, since the region
 * may have been deregistered or invalidated in between. *host (may be
 * NULL) gets the segment's address. */
static inline enum dw_prot_status dw_rdmap_read_source(struct dw_rdmap_qp qp, uint32_t stag,
                                                       uint64_t to, uint64_t len, uint8_t **host)
{
        return dw_rdmap_check_remote(qp, DIWARP_ACCESS_REMOTE_READ, stag, to, len, host);
}

/* The same for an Atomic Request's target: an aligned 8-byte word with
 * REMOTE_ATOMIC, checked as the request is accepted
 * (dw_rdmap_atomic_req_accept), where it also runs (dw_rdmap_resp_accept). */
static inline enum dw_prot_status
dw_rdmap_atomic_target(struct dw_rdmap_qp qp, const struct dw_rdmap_atomic_req *ar, uint8_t **host)
{
        return dw_rdmap_check_remote(qp, DIWARP_ACCESS_REMOTE_ATOMIC, ar->remote_stag,
                                     ar->remote_to, 8, host);
}

/* The header of a Read Response segment of the accepted Read Request rq:
 * its len bytes at offset off of the Read go to the Data Sink's STag at TO
 * + off, and the segment that ends the Read carries Last. The transport
 * checks the segment's source first (dw_rdmap_read_source). */
static inline void dw_rdmap_read_resp_hdr(const struct dw_rdmap_rreq *rq, uint64_t off,
                                          uint32_t len, struct dw_rdmap_hdr *h)
{
        dw_rdmap_hdr_init(h, DW_RDMAP_READ_RESP);
        h->ddp.stag = rq->sink_stag;
        h->ddp.to = rq->sink_to + off;
        h->ddp.last = off + len == rq->rdma_rd_sz;
}

/* What the responder's check of a request refused: the protection status
 * (DW_PROT_OK when the request did not decode), the Terminate error for it
 * (RC sends it, RD turns it into its error NAK: dw_rdmap_term_to_nak) and
 * the decoder's reason when it did not decode. */
struct dw_rdmap_refusal {
        enum dw_prot_status st;
        struct dw_term_error te;
        const char *why;
};

/* Fills *ref (may be NULL) for a failed check st in context ctx: its
 * status, Terminate error (dw_rdmap_prot_term) and reason. Returns
 * -EACCES. */
int dw_rdmap_refuse(struct dw_rdmap_refusal *ref, enum dw_prot_status st, enum dw_prot_ctx ctx);

/* The Data Sink's acceptance of a tagged RDMA Write segment: len bytes at
 * TO to of STag stag, checked for REMOTE_WRITE (dw_rdmap_check_remote: a
 * zero-length segment needs no right). Returns 0 with *host (may be NULL)
 * its place, or -EACCES with *ref (may be NULL) saying why: DDP Tagged
 * Buffer errors (invalid STag, bounds, PD, TO wrap), a missing right RDMAP
 * Remote Protection "access rights". Inline: RC and RD call it for every
 * Write segment. */
static inline int dw_rdmap_write_accept(struct dw_rdmap_qp qp, uint32_t stag, uint64_t to,
                                        uint64_t len, uint8_t **host, struct dw_rdmap_refusal *ref)
{
        enum dw_prot_status st =
            dw_rdmap_check_remote(qp, DIWARP_ACCESS_REMOTE_WRITE, stag, to, len, host);
        if (__builtin_expect(st == DW_PROT_OK, 1))
                return 0;
        return dw_rdmap_refuse(ref, st, DW_PROT_CTX_TAGGED_SINK);
}

/* The responder's acceptance of an RDMA Read Request: its RDMAP header
 * (ext, len: the bytes after the DDP header) decoded into *rq and its Data
 * Source checked for REMOTE_READ (dw_rdmap_check_remote). Returns 0,
 * -EBADMSG when it does not decode, -EACCES when the check fails; *ref
 * says why. */
int dw_rdmap_read_req_accept(struct dw_rdmap_qp qp, const uint8_t *ext, size_t len,
                             struct dw_rdmap_rreq *rq, struct dw_rdmap_refusal *ref);

/* The same for an Atomic Request: decoded into *ar, its target checked for
 * REMOTE_ATOMIC (an aligned 8-byte word), *host its address. */
int dw_rdmap_atomic_req_accept(struct dw_rdmap_qp qp, const uint8_t *ext, size_t len,
                               struct dw_rdmap_atomic_req *ar, uint8_t **host,
                               struct dw_rdmap_refusal *ref);

/* ---- Send placement (the responder's receive WR) ---- */

/* The Invalidate of a Send with Invalidate, as its message completes
 * (RFC 5040 §6.10): the STag, of the stream's PD (a type 2 window: bound on
 * this QP), is invalidated (mem/). DIWARP_WC_SUCCESS, or
 * DIWARP_WC_REM_INV_REQ_ERR for the receive WR with *te (may be NULL) the
 * Terminate error: Remote Protection, "STag cannot be invalidated". */
enum diwarp_wc_status dw_rdmap_send_invalidate(struct dw_rdmap_qp qp, uint32_t stag,
                                               struct dw_term_error *te);
/* Whether that Invalidate would succeed now, changing nothing: 0, or
 * -EACCES with *ref (may be NULL) its refusal (Remote Protection, "STag
 * cannot be invalidated"). For a transport that acknowledges a segment of
 * the message before the message completes (RD): it checks each segment of
 * a Send with Invalidate as it arrives, so that a refusal reaches the sender
 * (its error NAK) instead of the segment's acknowledgment. */
int dw_rdmap_send_inval_accept(struct dw_rdmap_qp qp, uint32_t stag, struct dw_rdmap_refusal *ref);

/* The receive WR's completion status when a Send cannot be placed in it:
 * err is what the placement into the WR returned (dw_rdmap_send_target,
 * dw_rdmap_send_place): -EMSGSIZE, longer than the WR, is LOC_LEN_ERR; any
 * other (the WR's own lkey failed) LOC_PROT_ERR. The peer's error is
 * dw_rdmap_recv_term(err). */
static inline enum diwarp_wc_status dw_rdmap_recv_wc(int err)
{
        return err == -EMSGSIZE ? DIWARP_WC_LOC_LEN_ERR : DIWARP_WC_LOC_PROT_ERR;
}

/* Why a Send could not be placed in its receive WR (err as for
 * dw_rdmap_recv_wc): the reason of the transport's log line or Terminate. */
static inline const char *dw_rdmap_recv_why(int err)
{
        return err == -EMSGSIZE ? "Send longer than its receive WR"
                                : "receive WR's SGE fails its lkey check";
}

/* ---- Where a segment's payload goes: the SGEs of a WR ---- */

/* The engine resolves where the payload of each segment that carries one
 * lands, and the transport's payload source fills it: RC reads its stream
 * into the iovecs (or copies from its staging buffer), RD and UD copy from
 * the datagram. A Write's target is its STag's region
 * (dw_rdmap_write_accept); a Send's the receive WR it fills
 * (dw_rdmap_send_target, dw_rdmap_send_place); a Read Response's or an
 * Atomic Response's the sink SGEs of the requester's WR
 * (dw_rdmap_sink_target, dw_rdmap_sink_place). In what order a message's
 * segments are placed stays the transport's. */

/* Host iovecs for bytes [off, off + len) of a WR's SGE list (a send WR
 * posted inline, read with access 0: its inline area), each piece checked
 * against its lkey in pd for access (0: local read). The one walk of an SGE
 * list: placement into receive WRs, Read sinks and atomic results, and the
 * requesters' sources. Returns the count (0 for len 0), -EMSGSIZE when the
 * range runs past the SGEs or needs more than max iovecs, -EACCES on a
 * protection failure. */
int dw_rdmap_wr_iov(struct dw_mr_table *mrs, const struct dw_pd *pd, const struct dw_wqe *w,
                    uint64_t off, uint64_t len, int access, struct iovec *iov, int max);

/* dw_rdmap_wr_scatter past its single-SGE case. */
int dw_rdmap_wr_scatter_sges(struct dw_mr_table *mrs, const struct dw_pd *pd,
                             const struct dw_wqe *w, uint64_t off, const void *src, size_t len);

/* Copies len bytes of src into the WR's SGEs at byte offset off, each SGE
 * checked for LOCAL_WRITE in pd, all of them before any byte is written (a
 * protection failure leaves nothing behind). The single-SGE WR, the common
 * one, without a call. Returns 0, -EMSGSIZE (does not fit) or -EACCES. */
static inline int dw_rdmap_wr_scatter(struct dw_mr_table *mrs, const struct dw_pd *pd,
                                      const struct dw_wqe *w, uint64_t off, const void *src,
                                      size_t len)
{
        if (len == 0)
                return 0;
        if (off > w->total_len || len > w->total_len - off)
                return -EMSGSIZE;
        if (w->num_sge != 1)
                return dw_rdmap_wr_scatter_sges(mrs, pd, w, off, src, len);
        uint8_t *host;
        if (dw_mr_check_local(mrs, w->sge[0].lkey, pd, DIWARP_ACCESS_LOCAL_WRITE,
                              w->sge[0].addr + off, len, &host) != DW_PROT_OK)
                return -EACCES;
        memcpy(host, src, len);
        return 0;
}

/* A Send segment's target: bytes [mo, mo + len) of the receive WR w its
 * message fills, checked in qp.recv_pd. The count, or -EMSGSIZE / -EACCES,
 * which dw_rdmap_recv_wc, dw_rdmap_recv_term and dw_rdmap_recv_why
 * describe. */
static inline int dw_rdmap_send_target(struct dw_rdmap_qp qp, const struct dw_wqe *w, uint64_t mo,
                                       uint64_t len, struct iovec *iov, int max)
{
        return dw_rdmap_wr_iov(qp.mrs, qp.recv_pd, w, mo, len, DIWARP_ACCESS_LOCAL_WRITE, iov, max);
}

/* The same target, filled from a payload in memory (a datagram): 0, or
 * -EMSGSIZE / -EACCES with nothing written. */
static inline int dw_rdmap_send_place(struct dw_rdmap_qp qp, const struct dw_wqe *w, uint64_t mo,
                                      const void *src, size_t len)
{
        return dw_rdmap_wr_scatter(qp.mrs, qp.recv_pd, w, mo, src, len);
}

/* A response's target in the requester's own WR: bytes [off, off + len) of
 * a Read's sink SGEs, or an Atomic's result buffer, checked in the QP's
 * PD. The count, or -EMSGSIZE / -EACCES (a sink deregistered since the WR
 * was posted). */
static inline int dw_rdmap_sink_target(struct dw_rdmap_qp qp, const struct dw_wqe *w, uint64_t off,
                                       uint64_t len, struct iovec *iov, int max)
{
        return dw_rdmap_wr_iov(qp.mrs, qp.pd, w, off, len, DIWARP_ACCESS_LOCAL_WRITE, iov, max);
}

/* The same target, filled from memory: 0, or -EMSGSIZE / -EACCES with
 * nothing written. */
static inline int dw_rdmap_sink_place(struct dw_rdmap_qp qp, const struct dw_wqe *w, uint64_t off,
                                      const void *src, size_t len)
{
        return dw_rdmap_wr_scatter(qp.mrs, qp.pd, w, off, src, len);
}

/* ---- A received message's end and its completion ---- */

/* What a message that consumed a receive WR delivered: its receive
 * completion, as RC, RD, RD's mailbox and UD report it (qp/'s
 * dw_qp_recv_done writes it to the CQ). */
struct dw_recv_done {
        enum diwarp_wc_status status;
        uint32_t byte_len;
        uint32_t src_qp;
        bool write_imm; /* an RDMA Write with Immediate Data, or an Immediate Data
                           message on its own: RECV_RDMA_WITH_IMM (else RECV) */
        bool has_imm;   /* WITH_IMM, imm_data = imm */
        uint32_t imm;
        bool inval; /* WITH_INV, invalidated_rkey = inval_rkey (a Send with
                       Invalidate whose Invalidate was carried out) */
        uint32_t inval_rkey;
        uint32_t vendor_err; /* of an error: the Terminate error that says why */
};

/* How a message that consumes a receive WR ended, as its last segment told:
 * a Send of the family (its length, SE, Invalidate STag), RFC 7306's
 * Immediate Data after an RDMA Write (the Write's length) or on its own,
 * diwarp's Send with Immediate (both). RC gathers it as the message ends and
 * completes the WR at once; RD keeps it in the WR (dw_rdmap_wqe_end_note)
 * until rel/'s cursor passes the message, and its application mailbox in
 * the mailbox entry. The completion is made of it in one place,
 * dw_rdmap_recv_end. */
enum dw_rdmap_end_flags {
        DW_RDMAP_END_SE = 1 << 0,   /* a solicited event */
        DW_RDMAP_END_INV = 1 << 1,  /* a Send with Invalidate of inval_stag */
        DW_RDMAP_END_IMM = 1 << 2,  /* Immediate Data: imm */
        DW_RDMAP_END_WIMM = 1 << 3, /* no Send: Immediate Data after a Write or alone */
};

struct dw_rdmap_msg_end {
        uint32_t len;        /* bytes of the Send, or of the Write before the Immediate Data */
        uint32_t inval_stag; /* DW_RDMAP_END_INV */
        uint32_t imm;        /* DW_RDMAP_END_IMM, network byte order */
        uint8_t flags;       /* enum dw_rdmap_end_flags */
};

/* The end of a Send of the family, by its opcode, len bytes in all. */
static inline struct dw_rdmap_msg_end dw_rdmap_send_end(unsigned int opcode, uint32_t len,
                                                        uint32_t inval_stag)
{
        struct dw_rdmap_msg_end e = {.len = len};
        if (dw_rdmap_send_se(opcode))
                e.flags |= DW_RDMAP_END_SE;
        if (dw_rdmap_send_inval(opcode)) {
                e.flags |= DW_RDMAP_END_INV;
                e.inval_stag = inval_stag;
        }
        return e;
}

/* Immediate Data imm goes with the message that ends as e (diwarp's Send
 * with Immediate; a Write with Immediate's e is dw_rdmap_imm_end's). se: the
 * Immediate Data message's own SE bit. */
static inline void dw_rdmap_end_imm(struct dw_rdmap_msg_end *e, uint32_t imm, bool se)
{
        e->imm = imm;
        e->flags |= DW_RDMAP_END_IMM | (se ? DW_RDMAP_END_SE : 0);
}

/* The end of an Immediate Data message that consumes a receive WR itself:
 * after an RDMA Write of write_len bytes (0: on its own, RFC 7306). */
static inline struct dw_rdmap_msg_end dw_rdmap_imm_end(uint32_t write_len, uint32_t imm, bool se)
{
        struct dw_rdmap_msg_end e = {.len = write_len, .flags = DW_RDMAP_END_WIMM};
        dw_rdmap_end_imm(&e, imm, se);
        return e;
}

/* Keeps e in receive WR w until the message completes (RD), in the WR's
 * completion fields, and reads it back. */
static inline void dw_rdmap_wqe_end_note(struct dw_wqe *w, const struct dw_rdmap_msg_end *e)
{
        w->byte_len = e->len;
        w->invalidate_rkey = e->inval_stag;
        w->imm_data = e->imm;
        w->recv_end = e->flags;
}

static inline struct dw_rdmap_msg_end dw_rdmap_wqe_end(const struct dw_wqe *w)
{
        return (struct dw_rdmap_msg_end){.len = w->byte_len,
                                         .inval_stag = w->invalidate_rkey,
                                         .imm = w->imm_data,
                                         .flags = (uint8_t)w->recv_end};
}

/* The receive completion of a message that ended as e says, made as the
 * message completes, in message order: a Send with Invalidate's Invalidate
 * is carried out here, once (dw_rdmap_send_invalidate); when it is refused
 * the WR completes with REM_INV_REQ_ERR, the Terminate error in vendor_err
 * and in *te (may be NULL: RD already refused the message's segments, so
 * its sender knows). src_qp is the transport's. Returns whether the
 * completion is solicited. */
static inline bool dw_rdmap_recv_end(struct dw_rdmap_qp qp, const struct dw_rdmap_msg_end *e,
                                     struct dw_recv_done *d, struct dw_term_error *te)
{
        *d = (struct dw_recv_done){.status = DIWARP_WC_SUCCESS,
                                   .byte_len = e->len,
                                   .write_imm = (e->flags & DW_RDMAP_END_WIMM) != 0,
                                   .has_imm = (e->flags & DW_RDMAP_END_IMM) != 0,
                                   .imm = e->imm};
        if (e->flags & DW_RDMAP_END_INV) {
                struct dw_term_error own;
                if (!te)
                        te = &own;
                d->status = dw_rdmap_send_invalidate(qp, e->inval_stag, te);
                d->inval = d->status == DIWARP_WC_SUCCESS;
                d->inval_rkey = e->inval_stag;
                if (!d->inval)
                        d->vendor_err = dw_term_vendor_err(*te);
        }
        return (e->flags & DW_RDMAP_END_SE) != 0;
}

/* ---- Atomics (RFC 7306) ---- */

/* Field-wise add of Fetch-and-Add with an Add Mask: a 1 in mask marks the
 * top bit of a field, so no carry leaves that bit. mask 0 is a plain 64-bit
 * add. */
static inline uint64_t dw_rdmap_masked_add(uint64_t a, uint64_t b, uint64_t mask)
{
        if (!mask)
                return a + b;
        uint64_t r = 0, carry = 0;
        for (int i = 0; i < 64; i++) {
                uint64_t s = ((a >> i) & 1) + ((b >> i) & 1) + carry;
                r |= (s & 1) << i;
                carry = ((mask >> i) & 1) ? 0 : s >> 1;
        }
        return r;
}

/* Executes a decoded Atomic Request on the naturally aligned word p
 * (dw_rdmap_check_remote gave it) with __atomic operations, so the owner's
 * own CPU accesses stay coherent. Returns the original value. Swap and
 * Compare-and-Swap write only the bits of the Swap Mask; Compare-and-Swap
 * compares only the bits of the Compare Mask. */
static inline uint64_t dw_rdmap_atomic_exec(uint64_t *p, const struct dw_rdmap_atomic_req *a)
{
        uint64_t old = __atomic_load_n(p, __ATOMIC_SEQ_CST), nv;

        for (;;) {
                switch (a->aopcode) {
                case DW_ATOMIC_FETCH_ADD:
                        if (!a->add_swap_mask)
                                return __atomic_fetch_add(p, a->add_swap_data, __ATOMIC_SEQ_CST);
                        nv = dw_rdmap_masked_add(old, a->add_swap_data, a->add_swap_mask);
                        break;
                case DW_ATOMIC_CMP_SWAP:
                        if ((old & a->compare_mask) != (a->compare_data & a->compare_mask))
                                return old;
                        /* fall through */
                default: /* DW_ATOMIC_SWAP (the decoder refuses other AOpCodes) */
                        nv = (old & ~a->add_swap_mask) | (a->add_swap_data & a->add_swap_mask);
                        break;
                }
                if (__atomic_compare_exchange_n(p, &old, nv, false, __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST))
                        return old;
        }
}

/* ---- The responder's Read and Atomic Requests ---- */

/* One accepted Read or Atomic Request, all its responses are built from:
 * each transport keeps one in each entry of its queue of inbound requests
 * (IRQ), beside what that transport tracks of its sending (RC: bytes sent;
 * RD: segments sent and acknowledged, the peer, a pull's Send). */
struct dw_rdmap_resp {
        bool atomic;
        uint32_t msn;            /* the request's queue-1 MSN */
        struct dw_rdmap_rreq rq; /* Read: the request as accepted */
        uint32_t req_id;         /* Atomic: the requester's Request Identifier */
        uint64_t orig;           /* Atomic: the target's value before it ran */
};

/* The responder's acceptance of a Read Request or Atomic Request (h its
 * decoded DDP/RDMAP header, ext and len the request's fields after it):
 * decoded and checked (dw_rdmap_read_req_accept, dw_rdmap_atomic_req_accept)
 * into *out. An Atomic runs here, once, as the request arrives: a message
 * that follows it on the stream never changes the value it returns, and a
 * response sent again (RD) carries the value kept. So the transport makes
 * room for the entry first (a request it refuses for want of room must not
 * have run). Returns 0, -EBADMSG (does not decode) or -EACCES; *ref says
 * why. */
int dw_rdmap_resp_accept(struct dw_rdmap_qp qp, const struct dw_rdmap_hdr *h, const uint8_t *ext,
                         size_t len, struct dw_rdmap_resp *out, struct dw_rdmap_refusal *ref);

/* Whether dw_rdmap_resp_accept would accept that request now, running and
 * recording nothing: 0, or its -EBADMSG / -EACCES with *ref. For a
 * transport that accepts a request only in stream order (RD): one that
 * arrives ahead of an earlier datagram waits, but a request it would
 * refuse anyway gets its refusal at once. */
int dw_rdmap_resp_check(struct dw_rdmap_qp qp, const struct dw_rdmap_hdr *h, const uint8_t *ext,
                        size_t len, struct dw_rdmap_refusal *ref);

/* One segment of a response, as dw_rdmap_resp_segment builds it. */
struct dw_rdmap_resp_seg {
        struct dw_rdmap_hdr h;                     /* the response's DDP/RDMAP header */
        uint8_t ext[DW_RDMAP_ATOMIC_RESP_HDR_LEN]; /* Atomic Response: its fields */
        size_t extlen;                             /* 0 for a Read Response */
        uint8_t *src;                              /* Read Response: its payload */
        uint32_t len;                              /* Read Response: payload bytes */
        bool ends;                                 /* the response's last segment */
};

/* The segment of r's response that starts at byte off of the Read (an
 * Atomic has one, off 0) and carries at most max bytes: a Read Response's
 * header (dw_rdmap_read_resp_hdr) and source, checked again here since the
 * region may have been deregistered or invalidated since the request came
 * (dw_rdmap_read_source); an Atomic Response's header, MSN r->msn (RC
 * numbers its own: it sets h.ddp.msn after), and fields with the value
 * kept. Returns DW_PROT_OK, or the failed status of the Read's source
 * (reported in context DW_PROT_CTX_READ_SOURCE). */
enum dw_prot_status dw_rdmap_resp_segment(struct dw_rdmap_qp qp, const struct dw_rdmap_resp *r,
                                          uint64_t off, uint32_t max,
                                          struct dw_rdmap_resp_seg *seg);

/* ---- The requester ---- */

/* The RDMAP opcode of a Send WR's segments (queue/'s DW_WR_SEND: RFC 5040
 * §4.2): Send with Invalidate for DIWARP_WR_SEND_WITH_INV, the Solicited
 * Event variant when se. se is the transport's: RC sets it from the WR,
 * RD leaves it to the Immediate Data message when the Send carries one. */
static inline uint8_t dw_rdmap_send_opcode(const struct dw_wqe *w, bool se)
{
        if (dw_wr_op(w->opcode)->inval)
                return se ? DW_RDMAP_SEND_SE_INVAL : DW_RDMAP_SEND_INVAL;
        return se ? DW_RDMAP_SEND_SE : DW_RDMAP_SEND;
}

/* The opcode of an RFC 7306 Immediate Data message: the Solicited Event
 * variant when se (the transport says which message of a Send with
 * Immediate carries the SE bit). */
static inline uint8_t dw_rdmap_imm_opcode(bool se)
{
        return se ? DW_RDMAP_IMM_DATA_SE : DW_RDMAP_IMM_DATA;
}

/* The DDP/RDMAP header of the segment of send WR w (a Send of any kind, or
 * an RDMA Write) that carries the WR's bytes [off, off + len): a Send's
 * untagged on queue 0 with MSN msn, MO off, the WR's Invalidate STag and
 * SE when se (dw_rdmap_send_opcode); a Write's tagged, the WR's remote
 * STag at its address + off. Last on the segment that ends the WR's bytes
 * (a transport that sends a Send's tail later, RD's receiver-paced Send,
 * clears it). RC, RD and UD build every data segment with it. */
static inline void dw_rdmap_data_hdr(const struct dw_wqe *w, uint64_t off, uint64_t len,
                                     uint32_t msn, bool se, struct dw_rdmap_hdr *h)
{
        const struct dw_wr_op *op = dw_wr_op(w->opcode);
        if (op->kind == DW_WR_WRITE) {
                dw_rdmap_hdr_init(h, DW_RDMAP_WRITE);
                h->ddp.stag = w->rkey;
                h->ddp.to = w->remote_addr + off;
        } else {
                dw_rdmap_hdr_init(h, dw_rdmap_send_opcode(w, se));
                if (op->inval)
                        h->inval_stag = w->invalidate_rkey;
                h->ddp.msn = msn;
                h->ddp.mo = (uint32_t)off;
        }
        h->ddp.last = off + len == w->total_len;
}

/* The Read Request of a Read WR w: its whole length from the WR's remote
 * STag and address, into the Data Sink the transport names (RC: its first
 * SGE's lkey and address, placed as tagged DDP; RD: the request's MSN and
 * TO 0, placed by offset into the SGE list). */
static inline void dw_rdmap_read_req_build(const struct dw_wqe *w, uint32_t sink_stag,
                                           uint64_t sink_to, struct dw_rdmap_rreq *out)
{
        *out = (struct dw_rdmap_rreq){.sink_stag = sink_stag,
                                      .sink_to = sink_to,
                                      .rdma_rd_sz = (uint32_t)w->total_len,
                                      .src_stag = w->rkey,
                                      .src_to = w->remote_addr};
}

/* The Atomic Request of an atomic send WR (DIWARP_WR_ATOMIC_CMP_AND_SWP or
 * _FETCH_AND_ADD): the verbs' unmasked operations, so Compare-and-Swap
 * compares and swaps all 64 bits and Fetch-and-Add adds without fields.
 * req_id is the transport's Request Identifier. */
static inline void dw_rdmap_atomic_req_build(const struct dw_wqe *w, uint32_t req_id,
                                             struct dw_rdmap_atomic_req *out)
{
        bool cas = w->opcode == DIWARP_WR_ATOMIC_CMP_AND_SWP;
        *out = (struct dw_rdmap_atomic_req){
            .aopcode = cas ? DW_ATOMIC_CMP_SWAP : DW_ATOMIC_FETCH_ADD,
            .req_id = req_id,
            .remote_stag = w->rkey,
            .remote_to = w->remote_addr,
            .add_swap_data = cas ? w->swap : w->compare_add,
            .add_swap_mask = cas ? ~0ull : 0,
            .compare_data = cas ? w->compare_add : 0,
            .compare_mask = cas ? ~0ull : 0,
        };
}

/* ---- Error classification ---- */

/* Maps a failed status to the Terminate error the Data Sink/Source sends.
 * Returns 0, or -EINVAL for DW_PROT_OK or an unknown status/context. */
int dw_prot_status_to_term(enum dw_prot_status st, enum dw_prot_ctx ctx, struct dw_term_error *out);

/* The same, never failing: a status or context it does not know is RDMAP
 * Remote Protection, unspecified. */
struct dw_term_error dw_rdmap_prot_term(enum dw_prot_status st, enum dw_prot_ctx ctx);

/* A Send that cannot be placed in its receive WR: err is what the
 * scatter into the WR returned (-EMSGSIZE: longer than the WR, DDP
 * "message too long"; anything else: the WR's own lkey failed, to the peer
 * a Remote Operation Error of this stream, RFC 5040 §7.2, InfiniBand's
 * Remote Operational Error). */
struct dw_term_error dw_rdmap_recv_term(int err);

/* A Read or Atomic Request whose RDMAP header does not decode. */
struct dw_term_error dw_rdmap_malformed_term(uint8_t opcode);

/* The RD error NAK code (wire/dgram.h) that carries a Terminate error:
 * protection errors (RDMAP Remote Protection, DDP Tagged Buffer) are
 * REM_ACCESS; untagged buffer errors and requests RDMAP could not parse
 * (unexpected opcode, bad version, unspecified) are INVALID; any other
 * error is REM_OP. */
uint8_t dw_rdmap_term_to_nak(struct dw_term_error e);

/* The requester's completion status for a received RD error NAK code. */
enum diwarp_wc_status dw_rdmap_nak_to_wc(uint8_t nak_code);

/* The requester's completion status and async event (*event) for a
 * received Terminate. */
enum diwarp_wc_status dw_rdmap_term_to_wc(struct dw_term_error e, int *event);

#endif
