/* DDP segment header codec (RFC 5041 section 4).
 *
 * A DDP segment starts with a 1-byte DDP control field (T, L, reserved, DV)
 * and a RsvdULP byte that the ULP (RDMAP) owns. Then:
 *   tagged   (T=1): STag (32) + TO (64)                              = 14 bytes
 *   untagged (T=0): RsvdULP (32) + QN (32) + MSN (32) + MO (32)      = 18 bytes
 * The payload (ULPDU) follows the header; this codec handles the header only.
 */
#ifndef DIWARP_WIRE_DDP_H
#define DIWARP_WIRE_DDP_H

#include <stdbool.h>

#include "wire.h"

#define DW_DDP_TAGGED_HDR_LEN   14
#define DW_DDP_UNTAGGED_HDR_LEN 18
#define DW_DDP_MAX_HDR_LEN      DW_DDP_UNTAGGED_HDR_LEN

/* DDP control field, first byte of every DDP segment. */
#define DW_DDP_CTRL_T    0x80 /* Tagged flag */
#define DW_DDP_CTRL_L    0x40 /* Last flag: last segment of a DDP message */
#define DW_DDP_CTRL_RSVD 0x3c /* Reserved, must be zero */
#define DW_DDP_CTRL_DV   0x03 /* DDP version */
#define DW_DDP_VERSION   1

struct dw_ddp_hdr {
        bool tagged;      /* T: tagged buffer model */
        bool last;        /* L: last DDP segment of the DDP message */
        uint8_t ulp_ctrl; /* RsvdULP byte 1; RDMAP keeps RV + opcode here */
        /* tagged buffer model */
        uint32_t stag; /* Data Sink STag */
        uint64_t to;   /* Data Sink Tagged Offset */
        /* untagged buffer model */
        uint32_t rsvdulp; /* RsvdULP bits 8..39; RDMAP's Invalidate STag */
        uint32_t qn;      /* Queue Number */
        uint32_t msn;     /* Message Sequence Number */
        uint32_t mo;      /* Message Offset */
};

/* Header length for the given buffer model: 14 tagged, 18 untagged. */
size_t dw_ddp_hdr_len(bool tagged);

/* Writes the header (fields of the other buffer model are ignored).
 * Returns bytes written or -ENOSPC. */
ssize_t dw_ddp_encode(const struct dw_ddp_hdr *in, uint8_t *buf, size_t cap);

/* Parses the header at buf. Returns the header length (14 or 18), or
 * -ENODATA (truncated), -EPROTO (DV != 1), -EBADMSG (reserved bits set).
 * Fields of the other buffer model are set to zero. */
ssize_t dw_ddp_decode(const uint8_t *buf, size_t len, struct dw_ddp_hdr *out, const char **why);

#endif
