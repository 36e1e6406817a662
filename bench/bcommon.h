/* Shared plumbing of the bench/ programs (msgrate, multiqp, reuse, overlap,
 * mempeer): options, the TCP side channel, k QPs of one type between two
 * processes over one registered buffer, posting, polling and RESULT lines.
 *
 * Every program serves without HOST and drives the run with HOST; the
 * client's options are sent to the server, so the harness may pass the same
 * arguments to both. A transport the engine does not support (-EOPNOTSUPP at
 * QP creation or connection) ends the program with exit status 3 and
 * `RESULT ... status=unsupported`, so the harness can tell "not available"
 * from "failed". */
#ifndef DIWARP_BENCH_BCOMMON_H
#define DIWARP_BENCH_BCOMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diwarp/diwarp.h>

enum bc_transport { BC_UD = 0, BC_RC = 1, BC_RD = 2 };

#define BC_GRH         40
#define BC_QKEY        0x1ee7c0deu
#define BC_EXIT_UNSUPP 3
#define BC_MAX_SIZES   32

struct bc_opts {
        enum bc_transport transport;
        uint64_t size;
        uint64_t iters;
        uint32_t qps;    /* QPs (multiqp) or peers (mempeer) */
        uint32_t window; /* messages in flight per QP */
        uint32_t duration_ms;
        uint32_t reps; /* repetitions inside one run (overlap, regcost) */
        uint32_t mode; /* program specific */
        uint32_t op;   /* program specific (overlap: 0 read, 1 write) */
        uint32_t bidir;
        uint32_t block; /* wait on the completion channel instead of spinning */
        uint64_t pool;  /* reuse: bytes of each buffer pool */
        uint16_t port;  /* side channel TCP port */
        int cpu;        /* pin the main thread here after device open (-1: no) */
        int timeout_ms;
        const char *addr;
        const char *host;
        const char *mode_name;
};

struct bc_qp {
        struct diwarp_qp *qp;
        struct diwarp_ah *ah;
        uint32_t peer_qpn;
        uint32_t peer_rkey;
        uint64_t peer_base;
        union diwarp_gid peer_gid;
};

struct bc_ctx {
        struct bc_opts o;
        bool server;
        int oob;
        struct diwarp_device *dev;
        struct diwarp_pd *pd;
        struct diwarp_comp_channel *ch;
        struct diwarp_cq *cq;
        struct diwarp_mr *mr;
        uint8_t *buf;
        size_t buf_len;
        uint32_t lkey, rkey;
        uint8_t sgid_index; /* our GID: the address the side channel left from */
        uint32_t nqp;
        struct bc_qp *q;
        bool unsupported; /* set when a step failed with -EOPNOTSUPP */
};

/* Mode names a program accepts (index = o.mode); NULL-terminated. */
void bc_parse(int argc, char **argv, struct bc_opts *o, const char *prog, const char *const *modes);
const char *bc_transport_name(enum bc_transport t);
uint64_t bc_now_ns(void);

/* Side channel only (no device): connects or serves, sends the client's
 * options to the server. */
int bc_oob_open(struct bc_ctx *c, const struct bc_opts *o);
/* Device, PD, CQ (and channel when o.block), a buf_len buffer (touched, so
 * page faults stay out of the timings) registered for local and remote
 * access, nqp QPs (send_wr / recv_wr deep), exchange, connect. */
int bc_setup(struct bc_ctx *c, uint32_t nqp, size_t buf_len, uint32_t send_wr, uint32_t recv_wr);
/* The first half of bc_setup, for programs that pair QPs their own way (one
 * process with several devices, QPs shared by several peers): device at
 * o.addr, pin to o.cpu, PD, channel when o.block, a CQ of cqe entries, the
 * registered buffer. c->oob may be -1 (a second device of the same process). */
int bc_open(struct bc_ctx *c, uint32_t cqe, size_t buf_len);
/* One QP of type o.transport on c's PD, both queues on c->cq, in RESET. */
int bc_qp_create(struct bc_ctx *c, uint32_t send_wr, uint32_t recv_wr, struct diwarp_qp **out);
void bc_teardown(struct bc_ctx *c);
/* Moves q->qp (type from o.transport) to RTS towards q->peer_gid/peer_qpn;
 * UD/RD also get q->ah. */
int bc_qp_rts(struct bc_ctx *c, struct bc_qp *q);
/* Prints "what: strerror" and returns -1 (sets c->unsupported on -EOPNOTSUPP). */
int bc_fail(struct bc_ctx *c, const char *what, int err);

int bc_write_all(int fd, const void *p, size_t n);
int bc_read_all(int fd, void *p, size_t n);
int bc_sync(struct bc_ctx *c);
int bc_exchange_u64(struct bc_ctx *c, uint64_t mine, uint64_t *theirs);
/* Final handshake: each side's ok flag; false when either side failed. */
bool bc_finish(struct bc_ctx *c, bool ok);

/* Receive slots on UD/RD reserve 40 bytes for a GRH in front of the payload;
 * a completion says whether one is there (DIWARP_WC_GRH: UD; RD has none). */
size_t bc_hdr(const struct bc_ctx *c);
static inline size_t bc_wc_hdr(const struct diwarp_wc *wc)
{
        return (wc->wc_flags & DIWARP_WC_GRH) ? BC_GRH : 0;
}
int bc_post_recv(struct bc_ctx *c, uint32_t qi, uint64_t wr_id, void *addr, uint32_t len);
int bc_post_send(struct bc_ctx *c, uint32_t qi, uint64_t wr_id, const void *addr, uint32_t len,
                 unsigned flags);
/* RDMA Read (read) or Write of len bytes between local addr and peer offset
 * roff of the peer's buffer. */
int bc_post_rdma(struct bc_ctx *c, uint32_t qi, uint64_t wr_id, bool read, void *addr, uint32_t len,
                 uint64_t roff);
/* Up to n completions: spins (or blocks on the channel with o.block) until at
 * least one arrives. Returns the count, 0 after o.timeout_ms, -1 on error. */
int bc_poll(struct bc_ctx *c, struct diwarp_wc *wc, int n);
/* Pins the calling thread to cpu (-1: nothing). */
int bc_pin(int cpu);

#define BC_WR_TYPE(id) ((id) >> 56)
#define BC_WR_QP(id)   ((uint32_t)(((id) >> 32) & 0xffffffu))
#define BC_WR_SLOT(id) ((uint32_t)(id))
#define BC_WR(type, qi, slot)                                                                      \
        (((uint64_t)(type) << 56) | ((uint64_t)(qi) << 32) | (uint64_t)(uint32_t)(slot))

#endif
