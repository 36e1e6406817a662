/* Send / receive work queues and shared receive queues.
 *
 * A dw_wq is a fixed ring of struct dw_wqe allocated at init, with an inline
 * area of max_inline bytes per slot. Posting is reserve → fill → commit, so a
 * WR that fails validation is never visible (reserve the same slot again).
 * Consumption: head is the oldest WQE not yet completed; a separate cursor
 * marks how many from the head the engine has already started (sent), so the
 * send path walks dw_wq_next/dw_wq_advance and the completion path pops from
 * the head. Callers hold the device lock; nothing here allocates after init.
 */
#ifndef DIWARP_QUEUE_WQ_H
#define DIWARP_QUEUE_WQ_H

#include <stdbool.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

#define DW_MAX_SGE 8
/* Largest inline area per WQE we grant (max_inline_data). */
#define DW_MAX_INLINE 512

enum dw_wqe_flags {
        DW_WQE_INLINE = 1 << 0, /* sge[0] points into the ring's inline area */
        DW_WQE_STARTED = 1 << 1,
        DW_WQE_DONE = 1 << 2,  /* engine finished; waiting to be completed in order */
        DW_WQE_ERROR = 1 << 3, /* finished with an error status */
};

struct dw_wqe {
        uint64_t wr_id;
        int opcode; /* enum diwarp_wr_opcode (send); unused for receives */
        unsigned int send_flags;
        uint32_t imm_data; /* network byte order */
        uint32_t invalidate_rkey;
        uint64_t remote_addr;
        uint32_t rkey;
        uint64_t compare_add;
        uint64_t swap;
        void *ah; /* struct dw_ah * (UD/RD) */
        uint32_t remote_qpn;
        uint32_t remote_qkey;
        uint32_t num_sge;
        struct diwarp_sge sge[DW_MAX_SGE];
        uint8_t *inline_buf; /* this slot's inline area (NULL when max_inline is 0) */
        uint32_t inline_len;
        uint64_t total_len; /* sum of sge lengths */
        /* engine progress, zeroed at reserve; meaning is the engine's */
        uint64_t bytes_done;
        uint64_t bytes_acked;
        uint32_t msn;
        uint32_t psn;      /* RD: first PSN of this message */
        uint32_t flags;    /* enum dw_wqe_flags */
        int status;        /* enum diwarp_wc_status once DONE */
        uint32_t byte_len; /* for the completion */
        uint32_t recv_end; /* receive: how its message ended (rdmap/'s enum dw_rdmap_end_flags) */
        uint64_t ts_ns;
        void *priv;
        /* RD receiver-paced Send: bytes pushed as segments (send and
         * receive), bytes pulled and acknowledged (send) or placed (receive). */
        uint32_t pull_pushed;
        uint64_t pull_done;
};

struct dw_wq {
        struct dw_wqe *ring;
        uint8_t *inline_area; /* capacity * max_inline bytes */
        uint32_t capacity;    /* max_wr */
        uint32_t max_sge;
        uint32_t max_inline;
        uint32_t head;    /* oldest */
        uint32_t tail;    /* next slot to reserve */
        uint32_t count;   /* committed WQEs */
        uint32_t started; /* of the count, how many from head the engine has begun */
};

/* max_wr >= 1, max_sge <= DW_MAX_SGE, max_inline <= DW_MAX_INLINE; -EINVAL /
 * -ENOMEM. */
int dw_wq_init(struct dw_wq *wq, uint32_t max_wr, uint32_t max_sge, uint32_t max_inline);
void dw_wq_fini(struct dw_wq *wq);

/* Slot at the tail, zeroed except sge[] (inline_buf set), or NULL when full
 * (the caller returns -ENOMEM as ibverbs does). Not visible until
 * dw_wq_commit. sge[i] is meaningful for i < num_sge only (the fill helpers
 * below write exactly those). */
struct dw_wqe *dw_wq_reserve(struct dw_wq *wq);

/* The ring accessors below are inline: they run several times per message. */

static inline void dw_wq_commit(struct dw_wq *wq)
{
        wq->tail = wq->tail + 1 == wq->capacity ? 0 : wq->tail + 1;
        wq->count++;
}

/* Oldest WQE, or NULL when empty. */
static inline struct dw_wqe *dw_wq_head(struct dw_wq *wq)
{
        return wq->count ? &wq->ring[wq->head] : NULL;
}

/* Drops the oldest WQE (after its completion was generated). */
static inline void dw_wq_pop(struct dw_wq *wq)
{
        if (wq->count == 0)
                return;
        wq->head = wq->head + 1 == wq->capacity ? 0 : wq->head + 1;
        wq->count--;
        /* A WQE may complete without having been started (flush). */
        if (wq->started > 0)
                wq->started--;
}

/* i-th WQE from the head (0 = oldest), or NULL if i >= count. For flushing:
 * for (i = 0; (w = dw_wq_at(wq, i)); i++) ... */
static inline struct dw_wqe *dw_wq_at(struct dw_wq *wq, uint32_t i)
{
        if (i >= wq->count)
                return NULL;
        uint32_t k = wq->head + i;
        return &wq->ring[k >= wq->capacity ? k - wq->capacity : k];
}

/* First WQE the engine has not started yet, or NULL. */
static inline struct dw_wqe *dw_wq_next(struct dw_wq *wq)
{
        return dw_wq_at(wq, wq->started);
}
/* Marks dw_wq_next's WQE started (sets DW_WQE_STARTED). */
void dw_wq_advance(struct dw_wq *wq);

/* Removes the WQEs marked DW_WQE_DONE wherever they are in the ring and
 * closes the gaps, keeping the order of the others: for a queue whose WQEs
 * finish out of order (an RD receive queue serves many peers), whose done
 * WQEs would otherwise hold their slots until every older one finished, and
 * refuse posts the consumer is entitled to. moved(ctx, from, to), when not
 * NULL, is told of each WQE that changes slot (before `from` is reused), for
 * the pointers the engine keeps to it. Returns how many were removed. */
typedef void (*dw_wq_moved_fn)(void *ctx, const struct dw_wqe *from, struct dw_wqe *to);
uint32_t dw_wq_drop_done(struct dw_wq *wq, dw_wq_moved_fn moved, void *ctx);

static inline uint32_t dw_wq_count(const struct dw_wq *wq)
{
        return wq->count;
}
static inline bool dw_wq_empty(const struct dw_wq *wq)
{
        return wq->count == 0;
}
static inline bool dw_wq_full(const struct dw_wq *wq)
{
        return wq->count == wq->capacity;
}

/* Fill helpers (validate, then copy into a reserved WQE). -EINVAL when num_sge
 * exceeds max_sge or is negative, or inline data exceeds max_inline. Inline
 * (DIWARP_SEND_INLINE): the bytes the sg_list names are copied into the slot's
 * inline area NOW, so the caller may reuse its buffer as soon as post returns;
 * the WQE then has one sge (addr = inline area, lkey 0) and DW_WQE_INLINE. */
int dw_wqe_from_send_wr(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_send_wr *wr);
int dw_wqe_from_recv_wr(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_recv_wr *wr);
/* Copies num_sge buffers (addresses are process virtual addresses) into the
 * inline area; used by dw_wqe_from_send_wr. */
int dw_wqe_set_inline(struct dw_wq *wq, struct dw_wqe *wqe, const struct diwarp_sge *sg,
                      int num_sge);

/* ---- shared receive queue ---- */

struct dw_srq {
        struct dw_wq wq;
        uint32_t limit;   /* srq_limit; meaningful while limit_armed */
        bool limit_armed; /* fires DIWARP_EVENT_SRQ_LIMIT_REACHED once, then disarms */
        void *srq_context;
        int use_count; /* QPs using it; maintained by qp/ */
};

int dw_srq_init(struct dw_srq *srq, uint32_t max_wr, uint32_t max_sge, void *srq_context);
void dw_srq_fini(struct dw_srq *srq);
/* Arms the limit event (ibv_modify_srq with IBV_SRQ_LIMIT): limit 0 disarms;
 * -EINVAL if limit > capacity. */
int dw_srq_arm_limit(struct dw_srq *srq, uint32_t limit);
/* Takes the oldest receive WQE (copied to *out, so the slot can be reused at
 * once). -ENOENT when empty. *limit_event (may be NULL) is set true when this
 * take made the count drop below an armed limit: the limit is disarmed and the
 * caller raises DIWARP_EVENT_SRQ_LIMIT_REACHED. */
int dw_srq_take(struct dw_srq *srq, struct dw_wqe *out, bool *limit_event);

/* ---- The send WR opcode table ----
 * What each send WR opcode (enum diwarp_wr_opcode) asks of the engine,
 * written once: post-time checks (qp/), RC's and RD's requesters, the local
 * copy and the daemon client classify a WR here, never by a list of opcodes
 * of their own. Which RDMAP message a WR becomes is rdmap/'s
 * (dw_rdmap_send_opcode). */
enum dw_wr_kind {
        DW_WR_INVALID = 0, /* not a send WR opcode */
        DW_WR_SEND,        /* Send, Send with Immediate, Send with Invalidate */
        DW_WR_WRITE,       /* RDMA Write, RDMA Write with Immediate */
        DW_WR_READ,        /* RDMA Read */
        DW_WR_ATOMIC,      /* Compare-and-Swap, Fetch-and-Add (RFC 7306) */
        DW_WR_LOCAL,       /* Local Invalidate, Bind Memory Window: no message */
};

struct dw_wr_op {
        uint8_t kind;             /* enum dw_wr_kind */
        bool payload;             /* its SGEs are the message's source (inline allowed) */
        bool response;            /* the responder answers (Read, Atomic): an ORQ slot, and the
                                     answer lands in its SGEs (local write access) */
        bool imm;                 /* carries Immediate Data */
        bool inval;               /* Send with Invalidate: carries an STag to invalidate */
        bool consumes_recv;       /* takes a receive WR at the peer (a Send MSN): the Send
                                     family and RDMA Write with Immediate */
        enum diwarp_wc_opcode wc; /* its completion's opcode */
};

#define DW_WR_NOPS 10 /* DIWARP_WR_RDMA_WRITE (0) to DIWARP_WR_SEND_WITH_INV (9) */

/* Indexed by opcode; entry DW_WR_NOPS is every other value (DW_WR_INVALID). */
extern const struct dw_wr_op dw_wr_ops[DW_WR_NOPS + 1];

/* Never NULL: an opcode outside the table gets the DW_WR_INVALID entry.
 * Inline: the send paths ask it per WR. */
static inline const struct dw_wr_op *dw_wr_op(int opcode)
{
        return &dw_wr_ops[(unsigned int)opcode < DW_WR_NOPS ? (unsigned int)opcode : DW_WR_NOPS];
}

static inline bool dw_wr_is_send(int opcode)
{
        return dw_wr_op(opcode)->kind == DW_WR_SEND;
}

#endif
