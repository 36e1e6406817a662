/* Fault injection on the datagram path: DIWARP_FAULT=drop:P,dup:P,reorder:P,
 * corrupt:P,delay:US on transmit, slowrx:BYTES_PER_S on receive (a receiver
 * that places data slowly, as into slow memory). Off unless a spec is given. Deterministic for a
 * given seed and packet sequence. Not thread-safe: the caller holds the device lock. */
#ifndef DW_UTIL_FAULT_H
#define DW_UTIL_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <diwarp/diwarp.h>

/* Hold-queue capacity (packets) and the largest packet that can be copied
 * (held or corrupted). Larger packets pass through unmodified except drop/dup. */
#define DW_FAULT_HOLD_SLOTS 64
#define DW_FAULT_MAX_PKT    65536
/* A reordered packet is released after 1..DW_FAULT_REORDER_MAX_LATER later
 * packets went out, or DW_FAULT_REORDER_MAX_NS after it was due, whichever
 * comes first, so an idle sender never strands it. */
#define DW_FAULT_REORDER_MAX_LATER 3
#define DW_FAULT_REORDER_MAX_NS    1000000ull
#define DW_FAULT_MAX_DELAY_US      10000000u
#define DW_FAULT_MAX_SLOWRX        1000000000000ull /* bytes per second */
/* slowrx: the receive bucket holds this long at the rate (a burst), and a
 * throttled step reads at most this many datagrams, so the debt one read
 * runs up stays small. */
#define DW_FAULT_SLOWRX_BURST_NS 1000000ull
#define DW_FAULT_SLOWRX_BATCH    4

typedef int (*dw_fault_send_fn)(void *ctx, const struct iovec *iov, int iovcnt, const void *addr,
                                socklen_t addrlen);

struct dw_fault_params {
        double drop, dup, reorder, corrupt; /* probabilities in [0, 1] */
        uint32_t delay_us;                  /* every packet held this long; 0 = none */
        uint64_t slowrx_bps; /* receive placement throttled to this many bytes/s; 0 = none */
};

struct dw_fault_held {
        uint8_t *buf; /* DW_FAULT_MAX_PKT bytes, owned by the fault object */
        size_t len;
        uint64_t due_ns;
        uint64_t after_seq; /* release only once tx_seq >= after_seq (reorder); 0 = no gate */
        struct sockaddr_storage addr;
        socklen_t addrlen;
        bool used;
};

struct dw_fault {
        struct dw_fault_params p;
        bool enabled;
        uint64_t rng;     /* splitmix64 state */
        uint64_t tx_seq;  /* packets handed to send_fn so far */
        uint8_t *scratch; /* DW_FAULT_MAX_PKT bytes for corrupted copies; NULL if corrupt == 0 */
        struct dw_fault_held
            *hold; /* ring of DW_FAULT_HOLD_SLOTS in insertion order; NULL if unused */
        uint32_t hold_head, hold_tail; /* free-running; head..tail are in the ring */
        uint32_t held;                 /* entries with used == true */
        char why_buf[160];             /* text *why points to after a failed init */
        /* slowrx: the virtual clock at which the bytes read so far would
         * have been placed at the throttled rate (ns). */
        uint64_t rx_clock;
};

/* Parses a spec without allocating: "" / "off" / "none" -> all zero. Items are
 * key:value separated by commas; probabilities as 0.01 or 1%; delay in
 * microseconds. Returns -EINVAL and writes a reason to why[whylen] on a
 * malformed spec (unknown key, value out of range, empty item, repeated key). */
int dw_fault_parse(const char *spec, struct dw_fault_params *out, char *why, size_t whylen);

/* Parses spec and allocates the hold queue / scratch buffer the spec needs.
 * spec may be NULL (off). Returns 0, -EINVAL (with *why) or -ENOMEM. */
int dw_fault_init(struct dw_fault *f, const char *spec, uint64_t seed, const char **why);
void dw_fault_destroy(struct dw_fault *f);

bool dw_fault_enabled(const struct dw_fault *f);

/* Transmits one datagram through the fault model: first releases held packets
 * that are due, then drops it, corrupts a copy (one random bit flipped; the
 * caller's buffers are never written), duplicates it, or holds a copy for
 * reorder/delay. Counters in *ctr (may be NULL) are incremented per event.
 * Returns what send_fn returned for the packet (bytes or -errno), or the packet
 * length when it was dropped or held (the network "accepted" it). When the
 * fault object is disabled it is a plain call to send_fn. */
int dw_fault_tx(struct dw_fault *f, const struct iovec *iov, int iovcnt, const void *dst_addr,
                socklen_t addrlen, uint64_t now_ns, dw_fault_send_fn send_fn, void *ctx,
                struct diwarp_counters *ctr);

/* Releases held packets that are due at now_ns, in insertion order. A packet
 * whose send fails with -EAGAIN/-ENOBUFS stays held and flushing stops there.
 * Returns the number released (>= 0) or that -errno. */
int dw_fault_flush_due(struct dw_fault *f, uint64_t now_ns, dw_fault_send_fn send_fn, void *ctx);

/* Sends every held packet now, regardless of deadline (teardown, tests).
 * Returns the number sent or the first -errno (remaining stay held). */
int dw_fault_flush_all(struct dw_fault *f, dw_fault_send_fn send_fn, void *ctx);

/* Packets currently held, and the earliest deadline among them (UINT64_MAX if
 * none) so the progress engine can bound its sleep. */
unsigned dw_fault_held_count(const struct dw_fault *f);
uint64_t dw_fault_next_due_ns(const struct dw_fault *f);

/* slowrx: 0 when the receiver may read now, else the ns (CLOCK_MONOTONIC) at
 * which it may; always 0 without slowrx. */
uint64_t dw_fault_rx_wait(const struct dw_fault *f, uint64_t now_ns);
/* slowrx: bytes were read (placed) at now_ns. */
void dw_fault_rx_took(struct dw_fault *f, uint64_t bytes, uint64_t now_ns);
static inline bool dw_fault_rx_throttled(const struct dw_fault *f)
{
        return f->p.slowrx_bps != 0;
}

#endif
