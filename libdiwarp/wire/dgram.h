/* Datagram header (versions 1 and 2) for UD and RD queue pairs over UDP.
 *
 * One UDP payload is:
 *     dgram header | DDP/RDMAP segment (DATA only) | [Immediate Data message (IMM)] | CRC32c
 * The CRC32c covers every byte before it and is sent in network byte order;
 * a version-2 RD datagram with the NOCRC extension flag has no CRC32c.
 * Version 2 is version 1 plus extension flags (X-flags in byte 4, X2-flags
 * in byte 8) and the optional extensions they announce after the SACK
 * blocks; it is sent only when an extension flag is set, so every other
 * datagram stays version 1.
 * The layout, the flag rules and the size limits are in docs/PROTOCOL.md
 * (section "Datagram header"); keep the two in step.
 */
#ifndef DIWARP_WIRE_DGRAM_H
#define DIWARP_WIRE_DGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

#define DW_DGRAM_VERSION  1  /* every datagram without an X-flag */
#define DW_DGRAM_VERSION2 2  /* datagrams with at least one X-flag */
#define DW_DGRAM_HDR_LEN  28 /* fixed part, without SACK blocks */
#define DW_DGRAM_SACK_LEN 8  /* one {start_psn, end_psn} block */
#define DW_DGRAM_MAX_SACK 8
#define DW_DGRAM_PULL_LEN 8 /* pull descriptor: {Message Length, Pushed Length} */
/* Multirail (docs/PROTOCOL.md "Multirail"): a rail list of 1..DW_DGRAM_MAX_RAILS
 * IPv4 addresses behind a 4-byte count word, and a 4-byte origin address. */
#define DW_DGRAM_MAX_RAILS     4
#define DW_DGRAM_RAILS_LEN(n)  (4 + 4 * (n))
#define DW_DGRAM_RAIL_LEN      4
#define DW_DGRAM_MULTIRAIL_MAX (DW_DGRAM_RAILS_LEN(DW_DGRAM_MAX_RAILS) + DW_DGRAM_RAIL_LEN)
/* Stream start (X2-flag START): {First PSN, First MSN} of the sender's
 * pseudo-stream. */
#define DW_DGRAM_START_LEN 8
/* Token (X2-flag TOKEN) and challenge (X2-flag CHALLENGE): 8 bytes each. */
#define DW_DGRAM_TOKEN_LEN     8
#define DW_DGRAM_CHALLENGE_LEN 8
/* ACK delay (X2-flag ACKDELAY): 4 bytes, microseconds. */
#define DW_DGRAM_ACK_DELAY_LEN 4
#define DW_DGRAM_HDR_MAX_LEN                                                                       \
        (DW_DGRAM_HDR_LEN + DW_DGRAM_MAX_SACK * DW_DGRAM_SACK_LEN + DW_DGRAM_PULL_LEN +            \
         DW_DGRAM_MULTIRAIL_MAX + DW_DGRAM_START_LEN + DW_DGRAM_TOKEN_LEN +                        \
         DW_DGRAM_CHALLENGE_LEN + DW_DGRAM_ACK_DELAY_LEN) /* 152 */
#define DW_DGRAM_CRC_LEN   4
#define DW_UDP_MAX_PAYLOAD 65507 /* 65535 - 20 (IPv4) - 8 (UDP) */

/* Header sizes of the DDP/RDMAP segment a datagram carries (RFC 5041 §4,
 * RFC 5040 §4; the RDMAP control byte is part of the DDP header). */
#define DW_DGRAM_DDP_UNTAGGED_LEN 18
#define DW_DGRAM_DDP_TAGGED_LEN   14
/* RFC 7306 Immediate Data message: untagged DDP/RDMAP header + 8 bytes of data. */
#define DW_DGRAM_IMM_MSG_LEN (DW_DGRAM_DDP_UNTAGGED_LEN + 8) /* 26 */

/* Largest UD message payload in one datagram: a Send (65457 bytes) and a Send
 * with Immediate, whose Immediate Data message rides in the same datagram
 * (65431 bytes). UD packets never carry SACK blocks, so the fixed header is all. */
#define DW_DGRAM_MAX_UD_MSG                                                                        \
        (DW_UDP_MAX_PAYLOAD - DW_DGRAM_HDR_LEN - DW_DGRAM_DDP_UNTAGGED_LEN - DW_DGRAM_CRC_LEN)
#define DW_DGRAM_MAX_UD_MSG_IMM (DW_DGRAM_MAX_UD_MSG - DW_DGRAM_IMM_MSG_LEN)

/* flags (byte 1) */
#define DW_DGRAM_F_RD     0x01 /* reliable datagram; clear = UD */
#define DW_DGRAM_F_ACK    0x02 /* ack_psn valid: every PSN before it was received */
#define DW_DGRAM_F_SACK   0x04 /* sack_count SACK blocks follow the fixed header */
#define DW_DGRAM_F_CREDIT 0x08 /* credits valid */
#define DW_DGRAM_F_ACKREQ 0x10 /* sender asks for an immediate ACK */
#define DW_DGRAM_F_NAK    0x20 /* nak_code says why; ack_psn names the PSN refused */
#define DW_DGRAM_F_DATA   0x40 /* a DDP/RDMAP segment follows the header */
#define DW_DGRAM_F_IMM    0x80 /* an RFC 7306 Immediate Data message ends the datagram */

/* X-flags (byte 4 of a version-2 header; version 1 has none) */
#define DW_DGRAM_X_NOCRC   0x01 /* RD only: no CRC32c trailer */
#define DW_DGRAM_X_PULL    0x02 /* RD DATA, MO 0 of a receiver-paced Send: pull descriptor follows */
#define DW_DGRAM_X_PULLREQ 0x04 /* RD DATA: an RDMA Read Request reading a receiver-paced Send */
#define DW_DGRAM_X_DSACK   0x08 /* with ACK and SACK: sack[0] is a duplicate (RFC 2883 D-SACK) */
#define DW_DGRAM_X_ECE     0x10 /* with ACK: congestion experienced echo (ECN); reserved */
/* RD DATA, no IMM: the segment is a credit control message of the dynamic
 * credit protocol (docs/PROTOCOL.md "Credits"), not RDMAP. */
#define DW_DGRAM_X_CCTL 0x20
/* RD: the sender's rail list follows (rail 0 first, its identity). */
#define DW_DGRAM_X_RAILS 0x40
/* RD: the datagram left by another rail than the sender's first: the origin
 * address follows, and the receiver takes the datagram as from origin. */
#define DW_DGRAM_X_RAIL 0x80
#define DW_DGRAM_X_ALL                                                                             \
        (DW_DGRAM_X_NOCRC | DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ | DW_DGRAM_X_DSACK |              \
         DW_DGRAM_X_ECE | DW_DGRAM_X_CCTL | DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL)

/* X2-flags (byte 8 of a version-2 header, the reserved high byte of the
 * Source QPN word; version 1 has none). RD DATA: the segment belongs to the
 * first window of the sender's pseudo-stream, whose first PSN and first
 * queue-0 MSN (the start descriptor) follow the origin. */
#define DW_DGRAM_X2_START 0x01
/* RD: the token follows (after the start descriptor): the 64-bit value the
 * receiver gave the sender for this purpose (RC over RD: on every datagram,
 * the connection's token from the MPA exchange; multirail: beside RAILS,
 * the echo of the receiver's challenge). docs/PROTOCOL.md "Tokens". */
#define DW_DGRAM_X2_TOKEN 0x02
/* RD: a challenge follows (after the token): a 64-bit value the receiver of
 * this datagram is to echo as the token of its rail lists to the sender. */
#define DW_DGRAM_X2_CHALLENGE 0x04
/* UD and RD: the datagram ends with the authentication trailer (nonce and
 * AES-GMAC tag, DW_DGRAM_AUTH_LEN bytes) instead of the CRC32c; never with
 * NOCRC. Set by the sender's seal (wire/seal.h, DIWARP_AUTH).
 * docs/PROTOCOL.md "Authentication". */
#define DW_DGRAM_X2_AUTH 0x08
/* RD, with ACK: the ACK delay follows (after the challenge): how long, in
 * microseconds, the newest datagram this ACK reports waited in the
 * receiver's host (its socket, a descheduled thread) before the ACK went.
 * The sender takes it out of the delay its congestion control sees.
 * docs/PROTOCOL.md "ACK delay". */
#define DW_DGRAM_X2_ACKDELAY 0x10
/* The largest ACK delay a sender reports (1 s). */
#define DW_DGRAM_ACK_DELAY_MAX_US 1000000u
#define DW_DGRAM_X2_ALL                                                                            \
        (DW_DGRAM_X2_START | DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE | DW_DGRAM_X2_AUTH |        \
         DW_DGRAM_X2_ACKDELAY)
/* The authentication trailer: a 12-byte GCM nonce (4-byte salt, 8-byte
 * counter), then the 16-byte tag. */
#define DW_DGRAM_AUTH_NONCE_LEN 12
#define DW_DGRAM_AUTH_TAG_LEN   16
#define DW_DGRAM_AUTH_LEN       (DW_DGRAM_AUTH_NONCE_LEN + DW_DGRAM_AUTH_TAG_LEN)

/* nak_code (byte 3), only with DW_DGRAM_F_NAK */
enum dw_dgram_nak {
        DW_DGRAM_NAK_NONE = 0,
        DW_DGRAM_NAK_RNR = 1,        /* no receive posted; retry after rnr_delay */
        DW_DGRAM_NAK_SEQ = 2,        /* sequence error: ack_psn is the PSN expected */
        DW_DGRAM_NAK_REM_ACCESS = 3, /* remote access error (STag, bounds, rights) */
        DW_DGRAM_NAK_REM_OP = 4,     /* remote operation error */
        DW_DGRAM_NAK_INVALID = 5,    /* invalid request */
        DW_DGRAM_NAK_MAX = DW_DGRAM_NAK_INVALID,
};

/* rnr_delay is in units of 10 microseconds (0..655.35 ms, the range of the IB
 * RNR NAK timer); 0 means "use your own back-off". */
#define DW_DGRAM_RNR_DELAY_UNIT_US 10

#define DW_DGRAM_QPN_MASK 0x00FFFFFFu

/* Half-open PSN range [start, end) received beyond ack_psn (with
 * DW_DGRAM_X_DSACK, sack[0] is instead the range received twice). */
struct dw_dgram_sack {
        uint32_t start;
        uint32_t end;
};

/* The version is not a field: it follows from xflags and xflags2 (both 0:
 * version 1). */
struct dw_dgram_hdr {
        uint8_t flags;
        uint8_t xflags;  /* DW_DGRAM_X_*; 0 on every version-1 datagram */
        uint8_t xflags2; /* DW_DGRAM_X2_*; 0 on every version-1 datagram */
        uint8_t sack_count;
        uint8_t nak_code;
        uint32_t dst_qpn;
        uint32_t src_qpn;
        uint32_t qkey;
        uint32_t psn;
        uint32_t ack_psn;
        uint16_t credits;
        uint16_t rnr_delay;
        /* With DW_DGRAM_X_PULL (0 otherwise): the Send's whole length, and
         * how much of it the sender pushes as ordinary segments; the receiver
         * reads [pull_pushed, pull_len) with PULLREQ Read Requests. */
        uint32_t pull_len;
        uint32_t pull_pushed;
        /* With DW_DGRAM_X_RAILS: rail_count addresses (network order); with
         * DW_DGRAM_X_RAIL: origin (network order). 0 otherwise. */
        uint8_t rail_count;
        uint32_t rails[DW_DGRAM_MAX_RAILS];
        uint32_t origin;
        /* With DW_DGRAM_X2_START (0 otherwise): the sender's first PSN and
         * first queue-0 MSN of this pseudo-stream. */
        uint32_t start_psn;
        uint32_t start_msn;
        /* With DW_DGRAM_X2_TOKEN / _CHALLENGE (0 otherwise; never 0 with
         * the flag): 64 bits, big-endian on the wire. */
        uint64_t token;
        uint64_t challenge;
        /* With DW_DGRAM_X2_ACKDELAY (0 otherwise): microseconds. */
        uint32_t ack_delay_us;
        struct dw_dgram_sack sack[DW_DGRAM_MAX_SACK];
};

/* PSN serial arithmetic modulo 2^32 (RFC 1982 style). dw_psn_diff(a, b) is the
 * signed distance a - b; dw_psn_before(a, b) is true when a precedes b. Two
 * PSNs exactly 2^31 apart compare as "before" both ways: keep windows < 2^31. */
static inline int32_t dw_psn_diff(uint32_t a, uint32_t b)
{
        uint32_t d = a - b;
        /* Spelled out so the conversion never depends on implementation-defined
         * unsigned-to-signed behaviour. */
        return d <= (uint32_t)INT32_MAX ? (int32_t)d : -(int32_t)(~d) - 1;
}

static inline bool dw_psn_before(uint32_t a, uint32_t b)
{
        return dw_psn_diff(a, b) < 0;
}

/* Checks every flag rule and field range of a header; returns 0 or the
 * negative errno the decoder would return for it (see wire.h). */
int dw_dgram_hdr_validate(const struct dw_dgram_hdr *h, const char **why);

/* Encoded header length (fixed part + SACK blocks + pull descriptor + rail
 * list + origin + start descriptor + token + challenge), or -EINVAL. */
ssize_t dw_dgram_hdr_len(const struct dw_dgram_hdr *h);

/* Bytes written, -EINVAL for a header dw_dgram_hdr_validate refuses, -ENOSPC.
 * Writes version 2 exactly when h->xflags or h->xflags2 is non-zero. */
ssize_t dw_dgram_encode(const struct dw_dgram_hdr *h, uint8_t *buf, size_t cap);

/* Header length (where the DDP segment starts when DATA), or a negative errno.
 * Accepts versions 1 and 2. buf/len are the datagram without its CRC (see
 * dw_dgram_packet_body). */
ssize_t dw_dgram_decode(const uint8_t *buf, size_t len, struct dw_dgram_hdr *out, const char **why);

/* dw_dgram_decode for the datagrams RD exchanges most (RD flag; DATA and/or
 * ACK, with ACKREQ or IMM; no SACK, NAK or credits; version 1, or version 2
 * with NOCRC as the only X-flag and TOKEN as the only X2-flag, either or
 * both): fixed-offset compares and the fields,
 * anything else through dw_dgram_decode. Same verdict, errno and fields,
 * except that out->sack[] past out->sack_count is left as it was. */
ssize_t dw_dgram_decode_rd(const uint8_t *buf, size_t len, struct dw_dgram_hdr *out,
                           const char **why);

/* Where the parts of a datagram body are; offsets from the start of the datagram. */
struct dw_dgram_layout {
        size_t seg_off; /* DDP/RDMAP segment (first message); 0 when not DATA */
        size_t seg_len;
        size_t imm_off; /* Immediate Data message (DW_DGRAM_IMM_MSG_LEN bytes); 0 when not IMM */
};

/* Splits a decoded datagram of len bytes (without CRC) whose header is h and
 * hdr_len long (pull descriptor included). -ENODATA when the segment is
 * shorter than a DDP header, -EBADMSG when a control-only packet has trailing
 * bytes. */
int dw_dgram_layout(const struct dw_dgram_hdr *h, size_t hdr_len, size_t len,
                    struct dw_dgram_layout *out, const char **why);

/* What a UD receive needs of a datagram (RD flag clear): the header fields,
 * the single-segment untagged Send (RFC 5040 Send or Send with SE; L = 1,
 * MO = 0) and, with the IMM flag, the RFC 7306 Immediate Data message. */
struct dw_dgram_ud {
        uint32_t dst_qpn;
        uint32_t src_qpn;
        uint32_t qkey;
        uint32_t msn;         /* MSN of the Send */
        uint32_t payload_off; /* Send payload, from the start of the datagram */
        uint32_t payload_len;
        uint32_t imm_data; /* first 4 bytes of the Immediate Data as received; 0 without IMM */
        bool with_imm;
        bool se; /* Send with SE, or Immediate Data with SE */
};

/* Decodes a UD datagram of len bytes (without its CRC) in one pass over fixed
 * offsets: no SACK array, no intermediate header structs. Accepts exactly
 * what dw_dgram_decode_ud_strict accepts and fills the same fields; on a
 * rejection it returns the strict route's errno and reason (it runs it). A
 * datagram with the RD flag is rejected (-EBADMSG): route those to
 * dw_dgram_decode before calling this. Returns 0 or a negative errno. */
int dw_dgram_decode_ud(const uint8_t *buf, size_t len, struct dw_dgram_ud *out, const char **why);

/* The same through the general codecs in turn (dw_dgram_decode,
 * dw_dgram_layout, dw_rdmap_decode of the Send and of the Immediate Data
 * message) plus the UD rules; the reference the fast path is tested against. */
int dw_dgram_decode_ud_strict(const uint8_t *buf, size_t len, struct dw_dgram_ud *out,
                              const char **why);

/* Verifies the trailing CRC32c of a whole datagram. Returns the length without
 * the CRC, -ENODATA when shorter than a fixed header + CRC, -EILSEQ on mismatch.
 * Every datagram must carry the CRC here (a NOCRC one fails as a mismatch):
 * for UD, whose datagrams always do; RD receivers use dw_dgram_packet_body. */
ssize_t dw_dgram_packet_check(const uint8_t *pkt, size_t len, const char **why);

/* dw_dgram_packet_check, except for a datagram whose first bytes say version
 * 2, RD and the NOCRC X-flag (and no reserved X-flag): that one has no
 * trailer, and the result is len when accept_nocrc, else -ENOTSUP. Only
 * those bytes are read before the CRC; the header still has to be decoded. */
ssize_t dw_dgram_packet_body(const uint8_t *pkt, size_t len, bool accept_nocrc, const char **why);

/* Whether a datagram's first bytes say it has no CRC32c trailer (version 2,
 * RD, X-flag NOCRC, no reserved X-flag): the only bytes read before the
 * trailer is checked. */
bool dw_dgram_nocrc(const uint8_t *pkt, size_t len);

/* Writes the CRC trailer for a CRC32c state (dw_crc32c_init/update over every
 * byte sent before it, e.g. over an iovec for a gathered send). */
void dw_dgram_crc_trailer(uint8_t out[DW_DGRAM_CRC_LEN], uint32_t crc_state);

/* Appends the CRC to a contiguous datagram of len bytes in a buffer of cap
 * bytes; returns the total length or -ENOSPC. */
ssize_t dw_dgram_packet_seal(uint8_t *pkt, size_t len, size_t cap);

/* Ends a contiguous datagram of len bytes as its header asks: returns len
 * when dw_dgram_packet_body would take it as a NOCRC datagram, otherwise
 * dw_dgram_packet_seal's result. */
ssize_t dw_dgram_packet_finish(uint8_t *pkt, size_t len, size_t cap);

#endif
