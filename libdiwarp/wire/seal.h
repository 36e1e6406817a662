/* The trailer of a diwarp datagram: the one place where a datagram's
 * integrity is written (seal) and checked (open), for UD and RD alike.
 *
 * A datagram ends with
 *   - CRC32c (4 bytes, network order) over every byte before it: the default;
 *   - nothing: a version-2 RD datagram with the NOCRC X-flag
 *     (DIWARP_RD_CRC=0), taken only by a receiver whose seal allows it.
 * The header alone says which (dw_dgram_packet_body's rule): the trailer
 * follows from the bytes the seal is handed, so senders only build headers.
 * docs/PROTOCOL.md, "Packet layout". */
#ifndef DIWARP_WIRE_SEAL_H
#define DIWARP_WIRE_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "dgram.h"

/* The longest trailer any datagram has. */
#define DW_SEAL_TRAILER_MAX DW_DGRAM_CRC_LEN

/* One device's integrity policy (owned by the caller; one per device). */
struct dw_seal {
        bool nocrc; /* accept RD datagrams without CRC32c (the sender's NOCRC) */
};

/* One datagram being sealed: the running state over the bytes added so far.
 * A run over a prefix may be kept and continued for several datagrams. */
struct dw_seal_run {
        uint32_t crc;
};

void dw_seal_init(struct dw_seal *s, bool nocrc);

/* Trailer bytes of a datagram: RD (rd) with NOCRC (nocrc_hdr) has none. */
static inline size_t dw_seal_trailer_len(const struct dw_seal *s, bool nocrc_hdr)
{
        (void)s;
        return nocrc_hdr ? 0 : DW_DGRAM_CRC_LEN;
}

/* Sealing in pieces: begin over the encoded header hdr (at least
 * DW_DGRAM_HDR_LEN bytes, before any byte of it is added), add every byte of
 * the datagram in order (the header first), end. end writes the trailer for
 * the datagram whose header starts at hdr into trl (room for
 * DW_SEAL_TRAILER_MAX) and returns its length. */
void dw_seal_begin(const struct dw_seal *s, struct dw_seal_run *r, uint8_t *hdr);
void dw_seal_add(const struct dw_seal *s, struct dw_seal_run *r, const void *p, size_t n);
void dw_seal_add_iov(const struct dw_seal *s, struct dw_seal_run *r, const struct iovec *iov,
                     size_t n);
size_t dw_seal_end(struct dw_seal *s, struct dw_seal_run *r, const uint8_t *hdr, uint8_t *trl);

/* Seals a contiguous datagram of len bytes in a buffer of cap: the trailer
 * goes behind it. Returns the length on the wire, or -ENOSPC. */
ssize_t dw_seal_packet(struct dw_seal *s, uint8_t *pkt, size_t len, size_t cap);

/* Opens a received datagram: checks its trailer. Returns the length without
 * the trailer, or (wire.h) -ENODATA shorter than a header + trailer,
 * -EILSEQ CRC32c mismatch, -ENOTSUP a NOCRC datagram this seal refuses. */
ssize_t dw_seal_open(const struct dw_seal *s, const uint8_t *pkt, size_t len, const char **why);

/* The same for a datagram received in pieces: body[0..n) is everything
 * before the trailer, trl its trailer of trl_len bytes (what
 * dw_seal_trailer_len says for the header in body[0], which must hold at
 * least DW_DGRAM_HDR_LEN bytes). Returns 0 or the errors of dw_seal_open. */
int dw_seal_open_iov(const struct dw_seal *s, const struct iovec *body, size_t n,
                     const uint8_t *trl, size_t trl_len, const char **why);

#endif
