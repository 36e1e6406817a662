/* Datagram header codec, versions 1 and 2. Layout and rules: docs/PROTOCOL.md. */
#include "dgram.h"

#include <string.h>

#include "crc32c.h"
#include "rdmap.h"

/* Flags that only mean something on a reliable-datagram packet. */
#define DW_DGRAM_F_RD_ONLY                                                                         \
        (DW_DGRAM_F_ACK | DW_DGRAM_F_SACK | DW_DGRAM_F_CREDIT | DW_DGRAM_F_ACKREQ | DW_DGRAM_F_NAK)

/* SACK blocks are checked as distances from ack_psn, so wrap-around at 2^32
 * needs no special case; a block must lie within 2^31 of ack_psn for serial
 * comparison to be meaningful at all. */
static int check_sacks(const struct dw_dgram_hdr *h, const char **why)
{
        uint32_t prev_end = 0;
        unsigned first = 0;

        if (h->xflags & DW_DGRAM_X_DSACK) {
                /* A duplicate was received before, so it lies below ack_psn or
                 * in a run that may not even be among the blocks sent (only
                 * the lowest runs fit): only its own shape can be checked. */
                uint32_t l = h->sack[0].end - h->sack[0].start;
                if (l == 0)
                        return dw_wire_fail(why, "sack: empty D-SACK block (start_psn == end_psn)",
                                            EBADMSG);
                if (l > 0x80000000u)
                        return dw_wire_fail(
                            why, "sack: D-SACK block reversed or longer than 2^31 PSNs", EBADMSG);
                first = 1;
        }
        for (unsigned i = first; i < h->sack_count; i++) {
                uint32_t s = h->sack[i].start - h->ack_psn;
                uint32_t e = h->sack[i].end - h->ack_psn;

                if (s == 0 || s >= 0x80000000u)
                        return dw_wire_fail(
                            why, "sack: block start_psn not after ack_psn (it would be acked)",
                            EBADMSG);
                if (e == s)
                        return dw_wire_fail(why, "sack: empty block (start_psn == end_psn)",
                                            EBADMSG);
                if (e < s)
                        return dw_wire_fail(why, "sack: block end_psn before its start_psn",
                                            EBADMSG);
                if (e > 0x80000000u)
                        return dw_wire_fail(why, "sack: block end_psn more than 2^31 past ack_psn",
                                            EBADMSG);
                /* Strictly after the previous end: touching blocks must be merged,
                 * so each set of received PSNs has exactly one encoding. */
                if (i > first && s <= prev_end)
                        return dw_wire_fail(
                            why, "sack: blocks not in ascending order with a gap between them",
                            EBADMSG);
                prev_end = e;
        }
        return 0;
}

/* The version-2 extension flags and the pull descriptor. Each flag names
 * the packets it can describe, so a flag on any other packet is an error
 * rather than something a receiver would have to guess about. */
static int check_xflags(const struct dw_dgram_hdr *h, const char **why)
{
        uint8_t f = h->flags, x = h->xflags;
        const uint8_t rd_data = DW_DGRAM_F_RD | DW_DGRAM_F_DATA;
        const uint8_t ack_sack = DW_DGRAM_F_ACK | DW_DGRAM_F_SACK;

        if (x & ~DW_DGRAM_X_ALL)
                return dw_wire_fail(why, "xflags: unknown bits set", EBADMSG);
        if ((x & DW_DGRAM_X_NOCRC) && !(f & DW_DGRAM_F_RD))
                return dw_wire_fail(
                    why, "xflags: NOCRC on a UD packet (UD always carries the CRC32c)", EBADMSG);
        if ((x & DW_DGRAM_X_PULL) && (x & DW_DGRAM_X_PULLREQ))
                return dw_wire_fail(why, "xflags: PULL and PULLREQ together", EBADMSG);
        if ((x & (DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ)) && (f & rd_data) != rd_data)
                return dw_wire_fail(why, "xflags: PULL or PULLREQ without RD and DATA", EBADMSG);
        if ((x & DW_DGRAM_X_DSACK) && (f & ack_sack) != ack_sack)
                return dw_wire_fail(why, "xflags: DSACK without ACK and SACK", EBADMSG);
        if ((x & DW_DGRAM_X_ECE) && !(f & DW_DGRAM_F_ACK))
                return dw_wire_fail(why, "xflags: ECE without ACK", EBADMSG);
        if ((x & DW_DGRAM_X_CCTL) && ((f & rd_data) != rd_data || (f & DW_DGRAM_F_IMM) ||
                                      (x & (DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ))))
                return dw_wire_fail(why,
                                    "xflags: CCTL without RD and DATA, or with IMM, PULL or "
                                    "PULLREQ",
                                    EBADMSG);

        if ((x & (DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL)) && !(f & DW_DGRAM_F_RD))
                return dw_wire_fail(why, "xflags: RAILS or RAIL on a UD packet (RD only)", EBADMSG);
        if (x & DW_DGRAM_X_RAILS) {
                if (h->rail_count == 0 || h->rail_count > DW_DGRAM_MAX_RAILS)
                        return dw_wire_fail(why, "rails: count not within 1..4", EBADMSG);
                for (unsigned i = 0; i < h->rail_count; i++)
                        if (h->rails[i] == 0)
                                return dw_wire_fail(why, "rails: address 0.0.0.0", EBADMSG);
        } else if (h->rail_count) {
                return dw_wire_fail(why, "rails: count non-zero without the RAILS flag", EBADMSG);
        }
        if ((x & DW_DGRAM_X_RAIL) ? h->origin == 0 : h->origin != 0)
                return dw_wire_fail(why,
                                    (x & DW_DGRAM_X_RAIL)
                                        ? "rail: origin address 0.0.0.0"
                                        : "rail: origin non-zero without the RAIL flag",
                                    EBADMSG);
        if (x & DW_DGRAM_X_PULL) {
                /* The descriptor rides on the first pushed segment, so at
                 * least one byte is pushed and at least one is pulled. */
                if (h->pull_pushed == 0)
                        return dw_wire_fail(why, "pull: pushed length is 0", EBADMSG);
                if (h->pull_pushed >= h->pull_len)
                        return dw_wire_fail(why, "pull: pushed length not below the message length",
                                            EBADMSG);
        } else if ((h->pull_len | h->pull_pushed) != 0) {
                return dw_wire_fail(why, "pull: lengths non-zero without the PULL flag", EBADMSG);
        }
        if (h->xflags2 & ~DW_DGRAM_X2_ALL)
                return dw_wire_fail(why, "xflags2: unknown bits set", EBADMSG);
        if (h->xflags2 & DW_DGRAM_X2_START) {
                if ((f & rd_data) != rd_data)
                        return dw_wire_fail(why, "xflags2: START without RD and DATA", EBADMSG);
        } else if ((h->start_psn | h->start_msn) != 0) {
                return dw_wire_fail(why, "start: descriptor non-zero without the START flag",
                                    EBADMSG);
        }
        if ((h->xflags2 & DW_DGRAM_X2_AUTH) && (x & DW_DGRAM_X_NOCRC))
                return dw_wire_fail(why, "xflags2: AUTH with NOCRC (the tag replaces the CRC)",
                                    EBADMSG);
        if ((h->xflags2 & (DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE)) && !(f & DW_DGRAM_F_RD))
                return dw_wire_fail(why, "xflags2: TOKEN or CHALLENGE on a UD packet (RD only)",
                                    EBADMSG);
        if ((h->xflags2 & DW_DGRAM_X2_TOKEN) ? h->token == 0 : h->token != 0)
                return dw_wire_fail(why,
                                    (h->xflags2 & DW_DGRAM_X2_TOKEN)
                                        ? "token: value 0"
                                        : "token: non-zero without the TOKEN flag",
                                    EBADMSG);
        if ((h->xflags2 & DW_DGRAM_X2_CHALLENGE) ? h->challenge == 0 : h->challenge != 0)
                return dw_wire_fail(why,
                                    (h->xflags2 & DW_DGRAM_X2_CHALLENGE)
                                        ? "challenge: value 0"
                                        : "challenge: non-zero without the CHALLENGE flag",
                                    EBADMSG);
        if (h->xflags2 & DW_DGRAM_X2_ACKDELAY) {
                if ((f & (DW_DGRAM_F_RD | DW_DGRAM_F_ACK)) != (DW_DGRAM_F_RD | DW_DGRAM_F_ACK))
                        return dw_wire_fail(why, "xflags2: ACKDELAY without RD and ACK", EBADMSG);
        } else if (h->ack_delay_us != 0) {
                return dw_wire_fail(why, "ack delay: non-zero without the ACKDELAY flag", EBADMSG);
        }
        return 0;
}

int dw_dgram_hdr_validate(const struct dw_dgram_hdr *h, const char **why)
{
        uint8_t f = h->flags;

        if (h->sack_count > DW_DGRAM_MAX_SACK)
                return dw_wire_fail(why, "sack_count: more than DW_DGRAM_MAX_SACK (8) blocks",
                                    EMSGSIZE);
        if (h->dst_qpn & ~DW_DGRAM_QPN_MASK)
                return dw_wire_fail(why, "dst_qpn: reserved high 8 bits set", EBADMSG);
        if (h->src_qpn & ~DW_DGRAM_QPN_MASK)
                return dw_wire_fail(why, "src_qpn: reserved high 8 bits set", EBADMSG);

        if (!(f & DW_DGRAM_F_RD)) {
                if (!(f & DW_DGRAM_F_DATA))
                        return dw_wire_fail(why, "flags: UD packet without DATA", EBADMSG);
                if (f & DW_DGRAM_F_RD_ONLY)
                        return dw_wire_fail(
                            why, "flags: UD packet with ACK/SACK/NAK/CREDIT/ACKREQ (RD only)",
                            EBADMSG);
        }
        if ((f & DW_DGRAM_F_SACK) && !(f & DW_DGRAM_F_ACK))
                return dw_wire_fail(why, "flags: SACK without ACK", EBADMSG);
        if ((f & DW_DGRAM_F_NAK) && (f & DW_DGRAM_F_DATA))
                return dw_wire_fail(why, "flags: NAK and DATA together", EBADMSG);
        /* Both would claim ack_psn, with different meanings. */
        if ((f & DW_DGRAM_F_NAK) && (f & DW_DGRAM_F_ACK))
                return dw_wire_fail(why, "flags: NAK and ACK together (both use ack_psn)", EBADMSG);
        if ((f & DW_DGRAM_F_IMM) && !(f & DW_DGRAM_F_DATA))
                return dw_wire_fail(why, "flags: IMM without DATA", EBADMSG);
        if (!(f & DW_DGRAM_F_DATA) && !(f & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK | DW_DGRAM_F_CREDIT)))
                return dw_wire_fail(why, "flags: control-only packet without ACK, NAK or CREDIT",
                                    EBADMSG);

        if (!(f & DW_DGRAM_F_SACK) && h->sack_count != 0)
                return dw_wire_fail(why, "sack_count: non-zero without the SACK flag", EBADMSG);
        if ((f & DW_DGRAM_F_SACK) && h->sack_count == 0)
                return dw_wire_fail(why, "sack_count: zero with the SACK flag", EBADMSG);

        if (f & DW_DGRAM_F_NAK) {
                if (h->nak_code == DW_DGRAM_NAK_NONE)
                        return dw_wire_fail(why, "nak_code: zero with the NAK flag", EBADMSG);
                if (h->nak_code > DW_DGRAM_NAK_MAX)
                        return dw_wire_fail(why, "nak_code: unknown code", EPROTO);
        } else if (h->nak_code != DW_DGRAM_NAK_NONE) {
                return dw_wire_fail(why, "nak_code: non-zero without the NAK flag", EBADMSG);
        }
        if (h->rnr_delay != 0 && !((f & DW_DGRAM_F_NAK) && h->nak_code == DW_DGRAM_NAK_RNR))
                return dw_wire_fail(why, "rnr_delay: non-zero outside an RNR NAK", EBADMSG);
        /* Fields that are not valid must be zero, so no bits travel unchecked. */
        if (h->ack_psn != 0 && !(f & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK)))
                return dw_wire_fail(why, "ack_psn: non-zero without ACK or NAK", EBADMSG);
        if (h->credits != 0 && !(f & DW_DGRAM_F_CREDIT))
                return dw_wire_fail(why, "credits: non-zero without the CREDIT flag", EBADMSG);

        int rc = check_xflags(h, why);
        if (rc != 0)
                return rc;
        return check_sacks(h, why);
}

ssize_t dw_dgram_hdr_len(const struct dw_dgram_hdr *h)
{
        if (h->sack_count > DW_DGRAM_MAX_SACK)
                return -EINVAL;
        if (h->rail_count > DW_DGRAM_MAX_RAILS)
                return -EINVAL;
        return DW_DGRAM_HDR_LEN + (ssize_t)h->sack_count * DW_DGRAM_SACK_LEN +
               ((h->xflags & DW_DGRAM_X_PULL) ? DW_DGRAM_PULL_LEN : 0) +
               ((h->xflags & DW_DGRAM_X_RAILS) ? DW_DGRAM_RAILS_LEN(h->rail_count) : 0) +
               ((h->xflags & DW_DGRAM_X_RAIL) ? DW_DGRAM_RAIL_LEN : 0) +
               ((h->xflags2 & DW_DGRAM_X2_START) ? DW_DGRAM_START_LEN : 0) +
               ((h->xflags2 & DW_DGRAM_X2_TOKEN) ? DW_DGRAM_TOKEN_LEN : 0) +
               ((h->xflags2 & DW_DGRAM_X2_CHALLENGE) ? DW_DGRAM_CHALLENGE_LEN : 0) +
               ((h->xflags2 & DW_DGRAM_X2_ACKDELAY) ? DW_DGRAM_ACK_DELAY_LEN : 0);
}

ssize_t dw_dgram_encode(const struct dw_dgram_hdr *h, uint8_t *buf, size_t cap)
{
        if (dw_dgram_hdr_validate(h, NULL) != 0)
                return -EINVAL;
        ssize_t n = dw_dgram_hdr_len(h);
        if (cap < (size_t)n)
                return -ENOSPC;

        /* Version 2 only when an extension needs it: every other datagram
         * stays readable by a version-1 receiver. */
        buf[0] = h->xflags || h->xflags2 ? DW_DGRAM_VERSION2 : DW_DGRAM_VERSION;
        buf[1] = h->flags;
        buf[2] = h->sack_count;
        buf[3] = h->nak_code;
        dw_put_be32(buf + 4, h->dst_qpn); /* high byte 0: validated */
        buf[4] = h->xflags;
        dw_put_be32(buf + 8, h->src_qpn);
        buf[8] = h->xflags2;
        dw_put_be32(buf + 12, h->qkey);
        dw_put_be32(buf + 16, h->psn);
        dw_put_be32(buf + 20, h->ack_psn);
        dw_put_be16(buf + 24, h->credits);
        dw_put_be16(buf + 26, h->rnr_delay);
        for (unsigned i = 0; i < h->sack_count; i++) {
                uint8_t *p = buf + DW_DGRAM_HDR_LEN + i * DW_DGRAM_SACK_LEN;
                dw_put_be32(p, h->sack[i].start);
                dw_put_be32(p + 4, h->sack[i].end);
        }
        uint8_t *p = buf + DW_DGRAM_HDR_LEN + h->sack_count * DW_DGRAM_SACK_LEN;
        if (h->xflags & DW_DGRAM_X_PULL) {
                dw_put_be32(p, h->pull_len);
                dw_put_be32(p + 4, h->pull_pushed);
                p += DW_DGRAM_PULL_LEN;
        }
        if (h->xflags & DW_DGRAM_X_RAILS) {
                p[0] = h->rail_count;
                p[1] = p[2] = p[3] = 0;
                /* Addresses are kept in network order: copied as they are. */
                memcpy(p + 4, h->rails, 4u * h->rail_count);
                p += DW_DGRAM_RAILS_LEN(h->rail_count);
        }
        if (h->xflags & DW_DGRAM_X_RAIL) {
                memcpy(p, &h->origin, DW_DGRAM_RAIL_LEN);
                p += DW_DGRAM_RAIL_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_START) {
                dw_put_be32(p, h->start_psn);
                dw_put_be32(p + 4, h->start_msn);
                p += DW_DGRAM_START_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_TOKEN) {
                dw_put_be64(p, h->token);
                p += DW_DGRAM_TOKEN_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_CHALLENGE) {
                dw_put_be64(p, h->challenge);
                p += DW_DGRAM_CHALLENGE_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_ACKDELAY)
                dw_put_be32(p, h->ack_delay_us);
        return n;
}

/* The 28-byte fixed header (len checked by the caller); a version-2
 * header without an extension flag is refused. */
static int decode_fixed(const uint8_t *buf, struct dw_dgram_hdr *h, const char **why)
{
        memset(h, 0, sizeof(*h));
        h->flags = buf[1];
        h->sack_count = buf[2];
        h->nak_code = buf[3];
        h->dst_qpn = dw_get_be32(buf + 4); /* version 1: byte 4 is validated as reserved */
        h->src_qpn = dw_get_be32(buf + 8); /* version 1: byte 8 is validated as reserved */
        if (buf[0] == DW_DGRAM_VERSION2) {
                h->xflags = buf[4];
                h->dst_qpn &= DW_DGRAM_QPN_MASK;
                h->xflags2 = buf[8];
                h->src_qpn &= DW_DGRAM_QPN_MASK;
                /* One encoding per header: without an extension flag it is
                 * version 1. */
                if (h->xflags == 0 && h->xflags2 == 0)
                        return dw_wire_fail(why, "xflags: none set in a version-2 header", EBADMSG);
        }
        h->qkey = dw_get_be32(buf + 12);
        h->psn = dw_get_be32(buf + 16);
        h->ack_psn = dw_get_be32(buf + 20);
        h->credits = dw_get_be16(buf + 24);
        h->rnr_delay = dw_get_be16(buf + 26);
        return 0;
}

/* The SACK blocks after the fixed header: the offset past them. */
static ssize_t decode_sack(const uint8_t *buf, size_t len, struct dw_dgram_hdr *h, const char **why)
{
        if (h->sack_count > DW_DGRAM_MAX_SACK)
                return dw_wire_fail(why, "sack_count: more than DW_DGRAM_MAX_SACK (8) blocks",
                                    EMSGSIZE);
        size_t n = DW_DGRAM_HDR_LEN + (size_t)h->sack_count * DW_DGRAM_SACK_LEN;
        if (len < n)
                return dw_wire_fail(why, "sack: blocks announced by sack_count are truncated",
                                    ENODATA);
        for (unsigned i = 0; i < h->sack_count; i++) {
                const uint8_t *p = buf + DW_DGRAM_HDR_LEN + i * DW_DGRAM_SACK_LEN;
                h->sack[i].start = dw_get_be32(p);
                h->sack[i].end = dw_get_be32(p + 4);
        }
        return (ssize_t)n;
}

/* The extensions the X-flags announce, in wire order from offset n: the
 * offset past them. */
static ssize_t decode_ext(const uint8_t *buf, size_t len, size_t n, struct dw_dgram_hdr *h,
                          const char **why)
{
        if (h->xflags & DW_DGRAM_X_PULL) {
                if (len - n < DW_DGRAM_PULL_LEN)
                        return dw_wire_fail(
                            why, "pull: descriptor announced by the PULL flag is truncated",
                            ENODATA);
                h->pull_len = dw_get_be32(buf + n);
                h->pull_pushed = dw_get_be32(buf + n + 4);
                n += DW_DGRAM_PULL_LEN;
        }
        if (h->xflags & DW_DGRAM_X_RAILS) {
                if (!(h->flags & DW_DGRAM_F_RD))
                        return dw_wire_fail(why, "xflags: RAILS or RAIL on a UD packet (RD only)",
                                            EBADMSG);
                if (len - n < 4)
                        return dw_wire_fail(
                            why, "rails: list announced by the RAILS flag is truncated", ENODATA);
                if (buf[n] == 0 || buf[n] > DW_DGRAM_MAX_RAILS)
                        return dw_wire_fail(why, "rails: count not within 1..4", EBADMSG);
                if (buf[n + 1] | buf[n + 2] | buf[n + 3])
                        return dw_wire_fail(why, "rails: reserved bytes non-zero", EBADMSG);
                if (len - n < (size_t)DW_DGRAM_RAILS_LEN(buf[n]))
                        return dw_wire_fail(
                            why, "rails: list announced by the RAILS flag is truncated", ENODATA);
                h->rail_count = buf[n];
                memcpy(h->rails, buf + n + 4, 4u * h->rail_count);
                n += DW_DGRAM_RAILS_LEN(h->rail_count);
        }
        if (h->xflags & DW_DGRAM_X_RAIL) {
                if (len - n < DW_DGRAM_RAIL_LEN)
                        return dw_wire_fail(
                            why, "rail: origin announced by the RAIL flag is truncated", ENODATA);
                memcpy(&h->origin, buf + n, DW_DGRAM_RAIL_LEN);
                n += DW_DGRAM_RAIL_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_START) {
                if (len - n < DW_DGRAM_START_LEN)
                        return dw_wire_fail(
                            why, "start: descriptor announced by the START flag is truncated",
                            ENODATA);
                h->start_psn = dw_get_be32(buf + n);
                h->start_msn = dw_get_be32(buf + n + 4);
                n += DW_DGRAM_START_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_TOKEN) {
                if (len - n < DW_DGRAM_TOKEN_LEN)
                        return dw_wire_fail(
                            why, "token: value announced by the TOKEN flag is truncated", ENODATA);
                h->token = dw_get_be64(buf + n);
                n += DW_DGRAM_TOKEN_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_CHALLENGE) {
                if (len - n < DW_DGRAM_CHALLENGE_LEN)
                        return dw_wire_fail(
                            why, "challenge: value announced by the CHALLENGE flag is truncated",
                            ENODATA);
                h->challenge = dw_get_be64(buf + n);
                n += DW_DGRAM_CHALLENGE_LEN;
        }
        if (h->xflags2 & DW_DGRAM_X2_ACKDELAY) {
                if (len - n < DW_DGRAM_ACK_DELAY_LEN)
                        return dw_wire_fail(
                            why, "ack delay: value announced by the ACKDELAY flag is truncated",
                            ENODATA);
                h->ack_delay_us = dw_get_be32(buf + n);
                n += DW_DGRAM_ACK_DELAY_LEN;
        }

        return (ssize_t)n;
}

ssize_t dw_dgram_decode(const uint8_t *buf, size_t len, struct dw_dgram_hdr *out, const char **why)
{
        struct dw_dgram_hdr h;

        if (len < 1)
                return dw_wire_fail(why, "version: datagram is empty", ENODATA);
        /* Version first: another version may have another length, and the
         * receiver counts it as "unknown version", not as "truncated". */
        if (buf[0] != DW_DGRAM_VERSION && buf[0] != DW_DGRAM_VERSION2)
                return dw_wire_fail(why, "version: neither 1 nor 2", EPROTO);
        if (len < DW_DGRAM_HDR_LEN)
                return dw_wire_fail(why, "header: shorter than the 28-byte fixed header", ENODATA);
        int rc = decode_fixed(buf, &h, why);
        if (rc < 0)
                return rc;
        ssize_t n = decode_sack(buf, len, &h, why);
        if (n < 0)
                return n;
        n = decode_ext(buf, len, (size_t)n, &h, why);
        if (n < 0)
                return n;
        rc = dw_dgram_hdr_validate(&h, why);
        if (rc != 0)
                return rc;
        *out = h;
        return n;
}

ssize_t dw_dgram_decode_rd(const uint8_t *buf, size_t len, struct dw_dgram_hdr *out,
                           const char **why)
{
        /* Every rule dw_dgram_hdr_validate applies, for these shapes: a
         * control-only packet has ACK, IMM comes with DATA, sack_count,
         * nak_code, rnr_delay and the QPNs' reserved bytes are zero, credits
         * too without CREDIT,
         * and so is ack_psn without ACK. Byte 4 is reserved in version 1; in
         * version 2 it may be NOCRC alone, which needs only the RD flag:
         * with CRCs off, every RD datagram is of that kind. */
        if (len < DW_DGRAM_HDR_LEN)
                return dw_dgram_decode(buf, len, out, why);
        uint8_t f = buf[1], x = buf[4], x2 = buf[8];
        /* RC over RD: every datagram carries its connection's token, the
         * only extension after the fixed header here (no SACK blocks). */
        bool tok = x2 & DW_DGRAM_X2_TOKEN;
        size_t hl = tok ? DW_DGRAM_HDR_LEN + DW_DGRAM_TOKEN_LEN : DW_DGRAM_HDR_LEN;
        uint64_t token = tok && len >= hl ? dw_get_be64(buf + 28) : 0;
        /* AUTH adds nothing to the header (its trailer is gone by now), but
         * never comes with NOCRC. */
        if (!((buf[0] == DW_DGRAM_VERSION && x == 0 && x2 == 0) ||
              (buf[0] == DW_DGRAM_VERSION2 && (x | x2) != 0 && (x & ~DW_DGRAM_X_NOCRC) == 0 &&
               (x2 & ~(DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_AUTH)) == 0 && (!tok || token != 0) &&
               !(x && (x2 & DW_DGRAM_X2_AUTH)))) ||
            !(f & DW_DGRAM_F_RD) || (f & (DW_DGRAM_F_SACK | DW_DGRAM_F_NAK)) ||
            !(f & (DW_DGRAM_F_DATA | DW_DGRAM_F_ACK)) ||
            (f & (DW_DGRAM_F_DATA | DW_DGRAM_F_IMM)) == DW_DGRAM_F_IMM ||
            (buf[2] | buf[3] | buf[26] | buf[27]) != 0 ||
            (!(f & DW_DGRAM_F_CREDIT) && (buf[24] | buf[25]) != 0) ||
            (!(f & DW_DGRAM_F_ACK) && dw_get_be32(buf + 20) != 0))
                return dw_dgram_decode(buf, len, out, why);
        out->flags = f;
        out->xflags = x;
        out->xflags2 = x2;
        out->start_psn = 0;
        out->start_msn = 0;
        out->token = token;
        out->challenge = 0;
        out->ack_delay_us = 0;
        out->sack_count = 0;
        out->nak_code = 0;
        out->dst_qpn = dw_get_be32(buf + 4) & DW_DGRAM_QPN_MASK;
        out->src_qpn = dw_get_be32(buf + 8) & DW_DGRAM_QPN_MASK; /* byte 8: the X2-flags */
        out->qkey = dw_get_be32(buf + 12);
        out->psn = dw_get_be32(buf + 16);
        out->ack_psn = dw_get_be32(buf + 20);
        out->credits = dw_get_be16(buf + 24);
        out->rnr_delay = 0;
        out->pull_len = 0;
        out->pull_pushed = 0;
        out->rail_count = 0;
        out->origin = 0;
        return (ssize_t)hl;
}

int dw_dgram_layout(const struct dw_dgram_hdr *h, size_t hdr_len, size_t len,
                    struct dw_dgram_layout *out, const char **why)
{
        memset(out, 0, sizeof(*out));
        if (len < hdr_len)
                return dw_wire_fail(why, "header: datagram shorter than its header", ENODATA);
        size_t body = len - hdr_len;

        if (!(h->flags & DW_DGRAM_F_DATA)) {
                if (body != 0)
                        return dw_wire_fail(why, "body: bytes after a control-only header",
                                            EBADMSG);
                return 0;
        }
        size_t imm = (h->flags & DW_DGRAM_F_IMM) ? DW_DGRAM_IMM_MSG_LEN : 0;
        if (body < imm + DW_DGRAM_DDP_TAGGED_LEN)
                return dw_wire_fail(why, "segment: shorter than the smallest DDP header", ENODATA);
        out->seg_off = hdr_len;
        out->seg_len = body - imm;
        if (imm)
                out->imm_off = len - imm;
        return 0;
}

int dw_dgram_decode_ud_strict(const uint8_t *buf, size_t len, struct dw_dgram_ud *out,
                              const char **why)
{
        struct dw_dgram_hdr h;
        ssize_t hl = dw_dgram_decode(buf, len, &h, why);
        if (hl < 0)
                return (int)hl;
        if (h.flags & DW_DGRAM_F_RD)
                return dw_wire_fail(why, "flags: reliable-datagram packet, not UD", EBADMSG);
        struct dw_dgram_layout lay;
        int rc = dw_dgram_layout(&h, (size_t)hl, len, &lay, why);
        if (rc < 0)
                return rc;
        struct dw_rdmap_hdr r;
        ssize_t rl = dw_rdmap_decode(buf + lay.seg_off, lay.seg_len, &r, why);
        if (rl < 0)
                return (int)rl;
        if (r.ddp.tagged || (r.opcode != DW_RDMAP_SEND && r.opcode != DW_RDMAP_SEND_SE) ||
            !r.ddp.last || r.ddp.mo != 0)
                return dw_wire_fail(why, "UD carries only single-segment Send messages", EBADMSG);
        bool se = r.opcode == DW_RDMAP_SEND_SE;
        uint32_t imm_data = 0;
        if (h.flags & DW_DGRAM_F_IMM) {
                struct dw_rdmap_hdr ri;
                ssize_t il = dw_rdmap_decode(buf + lay.imm_off, DW_DGRAM_IMM_MSG_LEN, &ri, why);
                if (il < 0)
                        return (int)il;
                if (ri.opcode != DW_RDMAP_IMM_DATA && ri.opcode != DW_RDMAP_IMM_DATA_SE)
                        return dw_wire_fail(why, "IMM flag without an Immediate Data message",
                                            EBADMSG);
                se = se || ri.opcode == DW_RDMAP_IMM_DATA_SE;
                memcpy(&imm_data, buf + lay.imm_off + il, 4);
        }
        out->dst_qpn = h.dst_qpn;
        out->src_qpn = h.src_qpn;
        out->qkey = h.qkey;
        out->msn = r.ddp.msn;
        out->payload_off = (uint32_t)(lay.seg_off + (size_t)rl);
        out->payload_len = (uint32_t)(lay.seg_len - (size_t)rl);
        out->imm_data = imm_data;
        out->with_imm = (h.flags & DW_DGRAM_F_IMM) != 0;
        out->se = se;
        return 0;
}

/* The fast path's way out: anything not of the one canonical UD shape. */
__attribute__((noinline, cold)) static int ud_slow(const uint8_t *buf, size_t len,
                                                   struct dw_dgram_ud *out, const char **why)
{
        return dw_dgram_decode_ud_strict(buf, len, out, why);
}

/* Bytes 0-7 of a UD header, with the IMM flag and dst_qpn's low 24 bits
 * masked: version 1, flags DATA, sack_count 0, nak_code 0, QPN byte 0. UD is
 * version 1, or version 2 with the X2-flag AUTH alone (DIWARP_AUTH): every
 * other extension flag needs RD or ACK, so any other version-2 UD datagram
 * is malformed, and the strict route says why. */
#define UD_H0_MASK 0xff7fffffff000000ull
#define UD_H0      ((uint64_t)DW_DGRAM_VERSION << 56 | (uint64_t)DW_DGRAM_F_DATA << 48)
#define UD_H0_IMM  ((uint64_t)DW_DGRAM_F_IMM << 48)
/* First 2 bytes of a single-segment untagged message: DDP control T = 0,
 * L = 1, DV = 1, then the RDMAP control byte RV = 1 and the opcode. */
#define UD_MSG(op)                                                                                 \
        ((uint16_t)((DW_DDP_CTRL_L | DW_DDP_VERSION) << 8 | DW_RDMAP_VERSION << 6 | (op)))

/* One untagged single-segment message header at p (Send or Immediate Data)
 * whose first two bytes must be a or b: the RsvdULP word (no Invalidate
 * STag), the QN (queue 0) and the MO are zero. */
static inline bool ud_msg_ok(const uint8_t *p, uint16_t a, uint16_t b)
{
        uint64_t w = dw_get_be64(p); /* control, RsvdULP, QN bytes 0-1 */
        uint16_t c = (uint16_t)(w >> 48);
        return (c == a || c == b) && (w & 0xffffffffffffull) == 0 &&
               (dw_get_be16(p + 8) | dw_get_be32(p + 14)) == 0;
}

int dw_dgram_decode_ud(const uint8_t *buf, size_t len, struct dw_dgram_ud *out, const char **why)
{
        /* Every rule the strict route applies to a UD datagram, as compares
         * at fixed offsets: the header (flags exactly DATA or DATA|IMM; no
         * SACK, NAK, ACK, credits or RNR delay, so bytes 2-3 and 20-27 are
         * zero; QPN reserved bytes zero), the Send header right after it and
         * the Immediate Data message at the end. Anything else (including
         * every malformed input) goes the strict way, which finds the reason. */
        const size_t fixed = DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN;
        if (len < fixed)
                return ud_slow(buf, len, out, why);
        uint64_t h0 = dw_get_be64(buf);
        /* Version 2 with AUTH as the only extension flag is the same shape
         * (the trailer is gone by now). */
        uint8_t x2 = 0;
        if (buf[0] == DW_DGRAM_VERSION2 && buf[8] == DW_DGRAM_X2_AUTH) {
                h0 ^= (uint64_t)(DW_DGRAM_VERSION ^ DW_DGRAM_VERSION2) << 56;
                x2 = DW_DGRAM_X2_AUTH;
        }
        bool imm = (h0 & UD_H0_IMM) != 0;
        size_t tail = imm ? DW_DGRAM_IMM_MSG_LEN : 0;
        const uint8_t *seg = buf + DW_DGRAM_HDR_LEN;
        if ((h0 & UD_H0_MASK) != UD_H0 || buf[8] != x2 || dw_get_be64(buf + 20) != 0 ||
            len - fixed < tail || !ud_msg_ok(seg, UD_MSG(DW_RDMAP_SEND), UD_MSG(DW_RDMAP_SEND_SE)))
                return ud_slow(buf, len, out, why);
        bool se = seg[1] == UD_MSG(DW_RDMAP_SEND_SE) % 256;
        uint32_t imm_data = 0;
        if (imm) {
                const uint8_t *im = buf + len - DW_DGRAM_IMM_MSG_LEN;
                if (!ud_msg_ok(im, UD_MSG(DW_RDMAP_IMM_DATA), UD_MSG(DW_RDMAP_IMM_DATA_SE)))
                        return ud_slow(buf, len, out, why);
                se = se || im[1] == UD_MSG(DW_RDMAP_IMM_DATA_SE) % 256;
                memcpy(&imm_data, im + DW_DGRAM_DDP_UNTAGGED_LEN, 4);
        }
        out->dst_qpn = (uint32_t)h0 & DW_DGRAM_QPN_MASK;
        out->src_qpn = dw_get_be32(buf + 8) & DW_DGRAM_QPN_MASK; /* byte 8: the X2-flags */
        out->qkey = dw_get_be32(buf + 12);
        out->msn = dw_get_be32(seg + 10);
        out->payload_off = (uint32_t)fixed;
        out->payload_len = (uint32_t)(len - tail - fixed);
        out->imm_data = imm_data;
        out->with_imm = imm;
        out->se = se;
        return 0;
}

/* Whether a datagram says it has no CRC32c trailer. These are the only
 * bytes read before the CRC is (or is not) checked, and they are all that
 * says whether a trailer exists: the version (only version 2 has X-flags),
 * the X-flags byte (NOCRC, and no reserved bit: a byte no sender writes is
 * not trusted to turn a check off) and the RD flag (UD always carries the
 * CRC, so a UD datagram that claims NOCRC is checked and fails). Every other
 * field is checked by the decoder over the same bytes afterwards, trailer
 * or not; testing it here would only change which error is reported. A CRC
 * cannot protect the bit that waives it: a receiver that accepts NOCRC
 * relies on the UDP checksum for byte 4 as for the rest. */
bool dw_dgram_nocrc(const uint8_t *pkt, size_t len)
{
        return len >= DW_DGRAM_HDR_LEN && pkt[0] == DW_DGRAM_VERSION2 && (pkt[1] & DW_DGRAM_F_RD) &&
               (pkt[4] & DW_DGRAM_X_NOCRC) && !(pkt[4] & ~DW_DGRAM_X_ALL);
}

ssize_t dw_dgram_packet_check(const uint8_t *pkt, size_t len, const char **why)
{
        if (len < DW_DGRAM_HDR_LEN + DW_DGRAM_CRC_LEN)
                return dw_wire_fail(why, "crc: datagram shorter than header + CRC32c", ENODATA);
        size_t body = len - DW_DGRAM_CRC_LEN;
        uint32_t crc = dw_crc32c(pkt, body);
        if (crc != dw_get_be32(pkt + body))
                return dw_wire_fail(why, "crc: CRC32c mismatch", EILSEQ);
        return (ssize_t)body;
}

void dw_dgram_crc_trailer(uint8_t out[DW_DGRAM_CRC_LEN], uint32_t crc_state)
{
        dw_put_be32(out, dw_crc32c_final(crc_state));
}

ssize_t dw_dgram_packet_body(const uint8_t *pkt, size_t len, bool accept_nocrc, const char **why)
{
        if (!dw_dgram_nocrc(pkt, len))
                return dw_dgram_packet_check(pkt, len, why);
        if (!accept_nocrc)
                return dw_wire_fail(why, "crc: datagram without CRC32c refused", ENOTSUP);
        return (ssize_t)len;
}

ssize_t dw_dgram_packet_seal(uint8_t *pkt, size_t len, size_t cap)
{
        if (cap < DW_DGRAM_CRC_LEN || len > cap - DW_DGRAM_CRC_LEN)
                return -ENOSPC;
        dw_put_be32(pkt + len, dw_crc32c(pkt, len));
        return (ssize_t)(len + DW_DGRAM_CRC_LEN);
}

ssize_t dw_dgram_packet_finish(uint8_t *pkt, size_t len, size_t cap)
{
        if (dw_dgram_nocrc(pkt, len))
                return len <= cap ? (ssize_t)len : -ENOSPC;
        return dw_dgram_packet_seal(pkt, len, cap);
}
