/* MPA (RFC 5044) framing for the TCP lower layer, with the RFC 6581 (MPA
 * revision 2) enhanced connection setup data.
 *
 * FPDU on the wire (markers are never used by diwarp):
 *     ULPDU_Length (2, big-endian) | ULPDU | PAD (0-3, zero) | CRC (4)
 * The CRC field is always present; it carries CRC32c over everything before
 * it when CRC was negotiated, and zero (not checked on receive) otherwise.
 * The CRC bytes are the CRC32c value stored least-significant byte first,
 * the representation RFC 3720 B.4 shows ("aa 36 91 8a" for 0x8A9136AA).
 *
 * Request/reply frame: Key (16) | M C R Res(5) | Rev | PD_Length (2) | PD.
 * With Rev 2 the first 4 bytes of the private data are the enhanced setup
 * block (P2P and RTR flags, IRD, ORD); PD_Length counts them.
 */
#ifndef DIWARP_WIRE_MPA_H
#define DIWARP_WIRE_MPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire/wire.h"

/* FPDU framing. */
#define DW_MPA_HDR_LEN         2u /* ULPDU_Length */
#define DW_MPA_CRC_LEN         4u
#define DW_MPA_TRAILER_MAX     7u      /* 3 pad + CRC */
#define DW_MPA_ULPDU_MAX       0xFFFFu /* what ULPDU_Length can express */
#define DW_MPA_MARKER_INTERVAL 512u    /* RFC 5044 marker spacing in TCP sequence space */
#define DW_MPA_MARKER_LEN      4u      /* 16 reserved bits + 16-bit FPDUPTR */

/* Request/reply frames. */
#define DW_MPA_KEY_LEN       16u
#define DW_MPA_FRAME_HDR_LEN 20u  /* Key + flags + Rev + PD_Length */
#define DW_MPA_PD_MAX        512u /* PD_Length limit, enhanced block included */
#define DW_MPA_V2_LEN        4u   /* RFC 6581 block at the start of the private data */
#define DW_MPA_IRD_ORD_MAX   0x3FFFu

#define DW_MPA_FLAG_M        0x80u /* markers */
#define DW_MPA_FLAG_C        0x40u /* CRC */
#define DW_MPA_FLAG_R        0x20u /* reject (reply only) */
#define DW_MPA_FLAG_RESERVED 0x1Fu

/* RFC 6581 bits in the two 16-bit words of the enhanced block. */
#define DW_MPA_V2_P2P       0x8000u /* IRD word: peer-to-peer */
#define DW_MPA_V2_RTR_SEND  0x4000u /* IRD word: zero-length Send as RTR */
#define DW_MPA_V2_RTR_WRITE 0x8000u /* ORD word: zero-length RDMA Write as RTR */
#define DW_MPA_V2_RTR_READ  0x4000u /* ORD word: zero-length RDMA Read as RTR */

extern const uint8_t dw_mpa_key_req[DW_MPA_KEY_LEN]; /* "MPA ID Req Frame" */
extern const uint8_t dw_mpa_key_rep[DW_MPA_KEY_LEN]; /* "MPA ID Rep Frame" */

/* 0-3 pad bytes that make the whole FPDU (header + ULPDU + pad) a multiple of 4. */
size_t dw_mpa_pad_len(size_t ulpdu_len);

/* Bytes of a whole FPDU. The CRC field is present whether or not CRC is in
 * use (RFC 5044 4.1), so crc does not change the result; it is taken so call
 * sites state the mode they are in. */
size_t dw_mpa_fpdu_len(size_t ulpdu_len, bool crc);

/* MULPDU (RFC 5044 section 6.1 / 7.1): the largest ULPDU whose whole FPDU
 * (ULPDU_Length + ULPDU + pad + CRC, no markers) fits in one TCP segment of
 * the effective MSS emss, so that every full-sized FPDU starts a segment:
 * (emss rounded down to a multiple of 4) - 6, at most DW_MPA_ULPDU_MAX.
 * Returns 0 when emss is too small to carry any ULPDU (< 8). */
uint32_t dw_mpa_mulpdu(uint32_t emss);

/* Writes the 2-byte ULPDU_Length header. Returns 2, -ENOSPC, or -EINVAL if
 * ulpdu_len > DW_MPA_ULPDU_MAX. */
ssize_t dw_mpa_fpdu_hdr_encode(size_t ulpdu_len, uint8_t *buf, size_t cap);

/* Writes pad + CRC after a ULPDU that the caller sent from wherever it lives.
 * crc_state is the running dw_crc32c state over header and ULPDU (ignored
 * when !crc; the CRC field is then zero). trailer must hold
 * DW_MPA_TRAILER_MAX bytes. Returns the trailer length (4-7) or -EINVAL. */
ssize_t dw_mpa_fpdu_trailer(uint8_t *trailer, size_t ulpdu_len, uint32_t crc_state, bool crc);

/* Contiguous FPDU: header, ULPDU, pad, CRC into buf. ulpdu may already sit at
 * buf + 2 (the copy is a memmove). Returns the FPDU length, -ENOSPC or -EINVAL. */
ssize_t dw_mpa_fpdu_encode(const void *ulpdu, size_t len, bool crc, uint8_t *buf, size_t cap);

struct dw_mpa_fpdu {
        const uint8_t *ulpdu; /* points into the decoded buffer */
        uint16_t ulpdu_len;
        uint8_t pad_len;
        uint32_t crc; /* CRC field as received (value, not bytes) */
        size_t need;  /* whole FPDU length once the header is known, else 2 */
};

/* Reads the header only, for a receiver that places the ULPDU itself.
 * Returns the whole FPDU length; -ENODATA (len < 2) or -EMSGSIZE when
 * ULPDU_Length > max_ulpdu. *ulpdu_len may be NULL. */
ssize_t dw_mpa_fpdu_peek(const uint8_t *buf, size_t len, size_t max_ulpdu, size_t *ulpdu_len,
                         const char **why);

/* Decodes one FPDU from the start of a receive buffer. Returns the bytes it
 * occupies; -ENODATA when the buffer does not yet hold all of it (out->need
 * is then the total needed), -EMSGSIZE when ULPDU_Length > max_ulpdu, -EILSEQ
 * on CRC mismatch (only when crc). Non-zero pad is accepted: RFC 5044 4.1 has
 * the receiver ignore pad contents apart from the CRC. */
ssize_t dw_mpa_fpdu_decode(const uint8_t *buf, size_t len, bool crc, size_t max_ulpdu,
                           struct dw_mpa_fpdu *out, const char **why);

struct dw_mpa_frame {
        bool is_reply; /* key "MPA ID Rep Frame" */
        bool markers;  /* M */
        bool crc;      /* C */
        bool reject;   /* R */
        uint8_t revision;
        bool enhanced; /* RFC 6581 block present; true exactly when revision == 2 */
        uint16_t ird, ord;
        bool peer2peer;
        bool rtr_send, rtr_write, rtr_read;
        const uint8_t *private_data; /* ULP private data, after the enhanced block */
        uint16_t private_data_len;
        size_t need; /* on -ENODATA: bytes needed in total */
};

/* Returns the frame length, -ENOSPC, or -EINVAL (revision not 1 or 2,
 * enhanced != (revision == 2), IRD/ORD > 0x3FFF, rev-2 fields set in a rev-1
 * frame, reject in a request, or PD_Length over 512). */
ssize_t dw_mpa_frame_encode(const struct dw_mpa_frame *in, uint8_t *buf, size_t cap);

/* Returns the frame length, or -ENODATA (out->need set), -EPROTO (unknown key
 * or revision), -EBADMSG (reserved bits, R in a request, rev-2 PD_Length < 4),
 * -EMSGSIZE (PD_Length > 512). */
ssize_t dw_mpa_frame_decode(const uint8_t *buf, size_t len, struct dw_mpa_frame *out,
                            const char **why);

#endif
