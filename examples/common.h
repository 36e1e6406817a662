/* Shared plumbing of the example programs: options, the out-of-band TCP side
 * channel, device/QP setup for UD and RC, buffers and the validation pattern.
 * Copy freely: every diwarp call an application needs is in common.c. */
#ifndef DIWARP_EXAMPLES_COMMON_H
#define DIWARP_EXAMPLES_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

/* EX_RD: an RD QP (diwarpdv_create_qp): reliable datagrams, an address handle
 * per WR like UD, RDMA Write/Read through diwarpdv_post_send_rd. */
enum ex_transport { EX_UD = 0, EX_RC = 1, EX_RD = 2 };
enum ex_op { EX_SEND = 0, EX_WRITE = 1, EX_READ = 2 };

struct ex_opts {
        enum ex_transport transport;
        enum ex_op op;
        uint64_t size;
        uint64_t iters;
        bool validate;
        uint16_t port;    /* side channel TCP port */
        const char *addr; /* diwarp device address (and side-channel bind address) */
        const char *host; /* NULL: serve */
        uint32_t window;  /* bw: messages in flight (0: automatic) */
        int timeout_ms;   /* give up after this long without progress */
        const char *prog; /* for messages */
};

#define EX_GRH          40
#define EX_QKEY         0x1ee7c0deu
#define EX_CREDIT_SLOTS 16
/* The largest message: the device's max_msg_size_rc. */
#define EX_MAX_SIZE (1ull << 31)

struct ex_ctx {
        struct ex_opts o;
        bool server;
        int oob; /* side-channel socket */
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_cq *cq;
        struct diwarp_qp *qp;
        struct diwarp_mr *mr;
        struct diwarp_ah *ah;
        uint8_t *buf; /* [send area][recv slots][credit area] */
        size_t buf_len;
        uint32_t lkey;
        uint8_t *send_area; /* o.size bytes (RC write/read: also the target of the peer) */
        uint8_t *recv_area; /* nrecv slots of slot_len bytes (nrecv 0: the send area) */
        size_t slot_len;    /* o.size (+ 40 on UD) */
        uint32_t nrecv;
        uint8_t *credit_area; /* EX_CREDIT_SLOTS slots of 64 bytes: credit messages (bw) */
        uint8_t sgid_index;   /* our GID: the address the side channel left from */
        /* the peer */
        uint32_t peer_qpn;
        union diwarp_gid peer_gid;
        uint32_t peer_rkey;
        uint64_t peer_addr;      /* its send_area as a TO (RDMA Read source) */
        uint64_t peer_recv_addr; /* its receive slot 0 as a TO (RDMA Write target) */
};

/* Parses argv; prints usage and exits on error. */
void ex_parse(int argc, char **argv, struct ex_opts *o, const char *prog, bool bw);
const char *ex_transport_name(enum ex_transport t);
const char *ex_op_name(enum ex_op op);

/* The buffers a program needs for the parameters (known on the server only
 * once the client sent them): send_len bytes of send area and nrecv receive
 * slots of o.size (+ 40 on UD). nrecv 0: no receive slots; receive slot 0
 * (the target of the peer's RDMA Write, the destination of an RDMA Read) is
 * the send area itself, one region for both. */
struct ex_layout {
        uint64_t send_len;
        uint32_t nrecv;
};
typedef struct ex_layout (*ex_layout_fn)(const struct ex_opts *o, bool server);

/* Side channel, device, buffers, QP, exchange, connect; the buffers as
 * layout() says. The client's options win: the server learns
 * transport/op/size/iters/validate/window from the client. Buffers larger
 * than the memory the host has available (or the process may map) are
 * refused before anything is allocated, on the side that cannot hold them;
 * a server that refuses tells the client why. Returns 0 or prints why and
 * returns -1. */
int ex_setup(struct ex_ctx *c, const struct ex_opts *o, ex_layout_fn layout);
void ex_teardown(struct ex_ctx *c);

/* Both sides wait for each other (side channel). */
int ex_sync(struct ex_ctx *c);
/* Exchange of a 64-bit value over the side channel (each sends its, gets the peer's). */
int ex_exchange_u64(struct ex_ctx *c, uint64_t mine, uint64_t *theirs);

/* Posts receive slot i (of recv_area). */
int ex_post_recv_slot(struct ex_ctx *c, uint32_t i);
/* Posts a credit receive (credit slot i). wr_id = EX_WRID_CREDIT | i. */
int ex_post_credit_recv(struct ex_ctx *c, uint32_t i);
/* Posts a send of len bytes from addr (inside buf); UD and RD add the AH. */
int ex_post_send(struct ex_ctx *c, uint64_t wr_id, void *addr, uint32_t len, bool signaled,
                 enum diwarp_wr_opcode op, uint32_t imm);
/* RC and RD: RDMA Write of len bytes from send_area to the peer's receive slot 0, or
 * RDMA Read of len bytes from the peer's send_area into receive slot 0. */
int ex_post_rdma(struct ex_ctx *c, uint64_t wr_id, bool read, uint32_t len);

/* Serves one-sided operations: drives progress until the peer says it is
 * done on the side channel (the peer calls ex_done). Returns 0 or -1. */
int ex_serve_until_done(struct ex_ctx *c);
int ex_done(struct ex_ctx *c);
/* Final handshake: each side's ok flag and a 64-bit value; returns both. */
int ex_finish(struct ex_ctx *c, bool ok, uint64_t val, bool *peer_ok, uint64_t *peer_val);

/* Polls one completion (busy). Returns 1, 0 on timeout (o.timeout_ms), or -1
 * (poll error). */
int ex_poll1(struct ex_ctx *c, struct diwarp_wc *wc);

#define EX_WRID_RECV   0x1000000000000000ull
#define EX_WRID_CREDIT 0x2000000000000000ull
#define EX_WRID_SEND   0x3000000000000000ull
#define EX_WRID_MASK   0xf000000000000000ull

/* Validation pattern: byte i of message s. */
static inline uint8_t ex_pat(uint64_t i, uint64_t s)
{
        return (uint8_t)(i * 7 + s * 13 + 1);
}
void ex_fill(uint8_t *p, uint64_t len, uint64_t s);
/* Index of the first wrong byte, or -1. */
int64_t ex_check(const uint8_t *p, uint64_t len, uint64_t s);

uint64_t ex_now_ns(void);

#endif
