/* Datagram header v1 and v2: byte positions against the layout in
 * docs/PROTOCOL.md, every flag and X-flag rule (multirail's rail list and
 * origin included), PSN serial arithmetic, and the CRC32c trailer with and
 * without NOCRC. */
#include <criterion/criterion.h>
#include <string.h>

#include "wire/crc32c.h"
#include "wire/dgram.h"
#include "wire/rdmap.h"

#define QPN_D 0x00123456u
#define QPN_S 0x00ABCDEFu

static struct dw_dgram_hdr hdr(uint8_t flags)
{
        struct dw_dgram_hdr h;
        memset(&h, 0, sizeof(h));
        h.flags = flags;
        h.dst_qpn = QPN_D;
        h.src_qpn = QPN_S;
        return h;
}

/* An IPv4 address in network byte order, as the rail fields hold it. */
static uint32_t ip4(uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
        const uint8_t x[4] = {a, b, c, d};
        uint32_t v;
        memcpy(&v, x, sizeof(v));
        return v;
}

static void assert_same(const struct dw_dgram_hdr *a, const struct dw_dgram_hdr *b)
{
        cr_assert_eq(a->flags, b->flags);
        cr_assert_eq(a->xflags, b->xflags);
        cr_assert_eq(a->sack_count, b->sack_count);
        cr_assert_eq(a->nak_code, b->nak_code);
        cr_assert_eq(a->dst_qpn, b->dst_qpn);
        cr_assert_eq(a->src_qpn, b->src_qpn);
        cr_assert_eq(a->qkey, b->qkey);
        cr_assert_eq(a->psn, b->psn);
        cr_assert_eq(a->ack_psn, b->ack_psn);
        cr_assert_eq(a->credits, b->credits);
        cr_assert_eq(a->rnr_delay, b->rnr_delay);
        cr_assert_eq(a->pull_len, b->pull_len);
        cr_assert_eq(a->pull_pushed, b->pull_pushed);
        cr_assert_eq(a->rail_count, b->rail_count);
        for (unsigned i = 0; i < a->rail_count && i < DW_DGRAM_MAX_RAILS; i++)
                cr_assert_eq(a->rails[i], b->rails[i], "rails[%u]", i);
        cr_assert_eq(a->origin, b->origin);
        cr_assert_eq(a->xflags2, b->xflags2);
        cr_assert_eq(a->start_psn, b->start_psn);
        cr_assert_eq(a->start_msn, b->start_msn);
        cr_assert_eq(a->token, b->token);
        cr_assert_eq(a->challenge, b->challenge);
        for (unsigned i = 0; i < a->sack_count; i++) {
                cr_assert_eq(a->sack[i].start, b->sack[i].start, "sack[%u].start", i);
                cr_assert_eq(a->sack[i].end, b->sack[i].end, "sack[%u].end", i);
        }
}

/* Encodes h, compares with the expected bytes, decodes them back. */
static void check_bytes(const struct dw_dgram_hdr *h, const uint8_t *exp, size_t exp_len)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN + 8];
        memset(buf, 0xEE, sizeof(buf));
        cr_assert_eq(dw_dgram_hdr_len(h), (ssize_t)exp_len);
        ssize_t n = dw_dgram_encode(h, buf, sizeof(buf));
        cr_assert_eq(n, (ssize_t)exp_len, "encode returned %zd", n);
        for (size_t i = 0; i < exp_len; i++)
                cr_assert_eq(buf[i], exp[i], "byte %zu: got 0x%02x want 0x%02x", i, buf[i], exp[i]);
        cr_assert_eq(buf[exp_len], 0xEE, "encode wrote past the header");

        struct dw_dgram_hdr out;
        const char *why = NULL;
        n = dw_dgram_decode(exp, exp_len, &out, &why);
        cr_assert_eq(n, (ssize_t)exp_len, "decode: %zd (%s)", n, why ? why : "");
        assert_same(h, &out);
}

/* Decode must fail with exactly err and a reason that starts with prefix
 * (the field or rule the test is about, not another that happens to fire). */
static void expect_reject_why(const uint8_t *buf, size_t len, int err, const char *prefix)
{
        struct dw_dgram_hdr out;
        const char *why = NULL;
        ssize_t n = dw_dgram_decode(buf, len, &out, &why);
        cr_assert_eq(n, -err, "decode returned %zd, want %d (%s)", n, -err, why ? why : "-");
        cr_assert_not_null(why);
        cr_assert_gt(strlen(why), 0);
        cr_assert_eq(strncmp(why, prefix, strlen(prefix)), 0, "reason \"%s\", want \"%s...\"", why,
                     prefix);
}

/* Decode must fail with exactly err and name a reason. */
static void expect_reject(const uint8_t *buf, size_t len, int err)
{
        expect_reject_why(buf, len, err, "");
}

/* Encodes a valid header, applies a mutation at byte off, expects err. */
static void expect_reject_mut(const struct dw_dgram_hdr *h, size_t off, uint8_t val, int err)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        ssize_t n = dw_dgram_encode(h, buf, sizeof(buf));
        cr_assert_gt(n, 0);
        buf[off] = val;
        expect_reject(buf, (size_t)n, err);
}

/* Validator and encoder must agree with the decoder on an invalid struct. */
static void expect_invalid_why(const struct dw_dgram_hdr *h, int err, const char *prefix)
{
        const char *why = NULL;
        cr_assert_eq(dw_dgram_hdr_validate(h, &why), -err);
        cr_assert_not_null(why);
        cr_assert_eq(strncmp(why, prefix, strlen(prefix)), 0, "reason \"%s\", want \"%s...\"", why,
                     prefix);
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(h, buf, sizeof(buf)), -EINVAL);
}

static void expect_invalid(const struct dw_dgram_hdr *h, int err)
{
        expect_invalid_why(h, err, "");
}

Test(dgram, constants)
{
        cr_assert_eq(DW_DGRAM_VERSION, 1);
        cr_assert_eq(DW_DGRAM_VERSION2, 2);
        cr_assert_eq(DW_DGRAM_HDR_LEN, 28);
        cr_assert_eq(DW_DGRAM_PULL_LEN, 8);
        cr_assert_eq(DW_DGRAM_MAX_RAILS, 4);
        cr_assert_eq(DW_DGRAM_RAILS_LEN(1), 8);
        cr_assert_eq(DW_DGRAM_RAILS_LEN(4), 20);
        cr_assert_eq(DW_DGRAM_RAIL_LEN, 4);
        cr_assert_eq(DW_DGRAM_MULTIRAIL_MAX, 24);
        /* 28 + 8 SACK blocks (64) + pull descriptor (8) + 4 rails (20) + origin (4)
         * + start descriptor (8) + token (8) + challenge (8) + ACK delay (4) */
        cr_assert_eq(DW_DGRAM_HDR_MAX_LEN, 152);
        cr_assert_eq(DW_DGRAM_ACK_DELAY_LEN, 4);
        cr_assert_eq(DW_DGRAM_START_LEN, 8);
        cr_assert_eq(DW_DGRAM_TOKEN_LEN, 8);
        cr_assert_eq(DW_DGRAM_CHALLENGE_LEN, 8);
        cr_assert_eq(DW_DGRAM_X2_START, 0x01);
        cr_assert_eq(DW_DGRAM_X2_TOKEN, 0x02);
        cr_assert_eq(DW_DGRAM_X2_CHALLENGE, 0x04);
        cr_assert_eq(DW_DGRAM_X_NOCRC, 0x01);
        cr_assert_eq(DW_DGRAM_X_PULL, 0x02);
        cr_assert_eq(DW_DGRAM_X_PULLREQ, 0x04);
        cr_assert_eq(DW_DGRAM_X_DSACK, 0x08);
        cr_assert_eq(DW_DGRAM_X_ECE, 0x10);
        cr_assert_eq(DW_DGRAM_X_CCTL, 0x20);
        cr_assert_eq(DW_DGRAM_X_RAILS, 0x40);
        cr_assert_eq(DW_DGRAM_X_RAIL, 0x80);
        cr_assert_eq(DW_DGRAM_X_ALL, 0xFF);
        cr_assert_eq(DW_DGRAM_CRC_LEN, 4);
        cr_assert_eq(DW_UDP_MAX_PAYLOAD, 65507);
        cr_assert_eq(DW_DGRAM_MAX_UD_MSG, 65457);
        cr_assert_eq(DW_DGRAM_MAX_UD_MSG_IMM, 65431);
        cr_assert_eq(DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN + DW_DGRAM_MAX_UD_MSG +
                         DW_DGRAM_CRC_LEN,
                     DW_UDP_MAX_PAYLOAD);
}

Test(dgram, ud_data_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        h.qkey = 0x11223344;
        static const uint8_t exp[28] = {
            0x01, 0x40, 0x00, 0x00, /* version, flags DATA, sack_count, nak_code */
            0x00, 0x12, 0x34, 0x56, /* dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* src_qpn */
            0x11, 0x22, 0x33, 0x44, /* qkey */
            0x00, 0x00, 0x00, 0x00, /* psn */
            0x00, 0x00, 0x00, 0x00, /* ack_psn */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, ud_data_with_imm_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA | DW_DGRAM_F_IMM);
        uint8_t exp[28] = {0x01, 0xC0, 0, 0, 0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF};
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, rd_data_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.qkey = 0xCAFEBABE;
        h.psn = 0x89ABCDEF;
        static const uint8_t exp[28] = {
            0x01, 0x41, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56, 0x00, 0xAB,
            0xCD, 0xEF, 0xCA, 0xFE, 0xBA, 0xBE, 0x89, 0xAB, 0xCD, 0xEF,
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, rd_data_piggyback_ack_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_CREDIT |
                                    DW_DGRAM_F_ACKREQ | DW_DGRAM_F_DATA);
        h.psn = 0xFFFFFFFE;
        h.ack_psn = 0x01020304;
        h.credits = 0x0102;
        static const uint8_t exp[28] = {
            0x01, 0x5B, 0x00, 0x00, /* flags RD|ACK|CREDIT|ACKREQ|DATA */
            0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF,
            0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFE, /* psn */
            0x01, 0x02, 0x03, 0x04,                         /* ack_psn */
            0x01, 0x02, 0x00, 0x00,                         /* credits */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, ack_without_sack_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.ack_psn = 100;
        uint8_t exp[28] = {0x01, 0x03, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF};
        exp[23] = 100;
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, ack_one_sack_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        h.ack_psn = 100;
        h.sack_count = 1;
        h.sack[0] = (struct dw_dgram_sack){102, 105};
        static const uint8_t exp[36] = {
            0x01, 0x07, 0x01, 0x00, /* flags RD|ACK|SACK, sack_count 1 */
            0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x64, /* ack_psn 100 */
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x66,             /* start 102 */
            0x00, 0x00, 0x00, 0x69,                                     /* end 105 */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, ack_eight_sacks_across_wrap)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        static const struct dw_dgram_sack blocks[8] = {
            {0xFFFFFFF2, 0xFFFFFFF4},
            {0xFFFFFFF6, 0xFFFFFFF8},
            {0xFFFFFFFA, 0xFFFFFFFC},
            {0xFFFFFFFE, 0x00000001},
            {3, 4},
            {6, 8},
            {10, 11},
            {20, 30},
        };
        h.ack_psn = 0xFFFFFFF0;
        h.sack_count = 8;
        memcpy(h.sack, blocks, sizeof(blocks));

        uint8_t exp[92];
        memset(exp, 0, sizeof(exp));
        exp[0] = 1;
        exp[1] = 0x07;
        exp[2] = 8;
        memcpy(exp + 4, (uint8_t[]){0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF}, 8);
        memcpy(exp + 20, (uint8_t[]){0xFF, 0xFF, 0xFF, 0xF0}, 4);
        for (unsigned i = 0; i < 8; i++) {
                uint8_t *p = exp + 28 + 8 * i;
                uint32_t s = blocks[i].start, e = blocks[i].end;
                p[0] = s >> 24, p[1] = s >> 16, p[2] = s >> 8, p[3] = s;
                p[4] = e >> 24, p[5] = e >> 16, p[6] = e >> 8, p[7] = e;
        }
        /* Spot-check the hand-built array itself at the wrapping block. */
        cr_assert_eq(exp[28 + 24], 0xFF);
        cr_assert_eq(exp[28 + 24 + 3], 0xFE);
        cr_assert_eq(exp[28 + 24 + 7], 0x01);
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, nak_rnr_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK);
        h.nak_code = DW_DGRAM_NAK_RNR;
        h.ack_psn = 0x4D;
        h.rnr_delay = 50; /* 500 us */
        static const uint8_t exp[28] = {
            0x01, 0x21, 0x00, 0x01, /* flags RD|NAK, nak_code RNR */
            0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x4D, /* ack_psn = PSN refused */
            0x00, 0x00, 0x00, 0x32,                                     /* rnr_delay 50 */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, nak_codes_round_trip)
{
        for (uint8_t c = DW_DGRAM_NAK_RNR; c <= DW_DGRAM_NAK_MAX; c++) {
                struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK | DW_DGRAM_F_CREDIT);
                h.nak_code = c;
                h.ack_psn = 9;
                h.credits = 3;
                uint8_t buf[DW_DGRAM_HDR_LEN], exp[DW_DGRAM_HDR_LEN];
                cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 28);
                memcpy(exp, buf, sizeof(exp));
                cr_assert_eq(exp[3], c);
                check_bytes(&h, exp, sizeof(exp));
        }
}

Test(dgram, credit_only_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_CREDIT);
        h.credits = 0xFFFF;
        uint8_t exp[28] = {0x01, 0x09, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF};
        exp[24] = 0xFF;
        exp[25] = 0xFF;
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, max_qpn_round_trip)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        h.dst_qpn = 0x00FFFFFF;
        h.src_qpn = 0x00FFFFFF;
        h.qkey = 0xFFFFFFFF;
        h.psn = 0xFFFFFFFF;
        uint8_t exp[28] = {0x01, 0x40, 0,    0,    0x00, 0xFF, 0xFF, 0xFF, 0x00, 0xFF,
                           0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
        check_bytes(&h, exp, sizeof(exp));
}

/* ---- rejections ---- */

Test(dgram, reject_empty_and_truncated)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 28);
        expect_reject(buf, 0, ENODATA);
        for (size_t l = 1; l < 28; l++)
                expect_reject(buf, l, ENODATA);
}

Test(dgram, reject_truncated_sack_blocks)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        h.ack_psn = 1;
        h.sack_count = 2;
        h.sack[0] = (struct dw_dgram_sack){3, 4};
        h.sack[1] = (struct dw_dgram_sack){6, 7};
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 44);
        for (size_t l = 28; l < 44; l++)
                expect_reject(buf, l, ENODATA);
}

Test(dgram, reject_version)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        expect_reject_mut(&h, 0, 0, EPROTO);
        expect_reject_mut(&h, 0, 3, EPROTO);
        expect_reject_mut(&h, 0, 0xFF, EPROTO);
        /* An unknown version is reported as such even when short. */
        uint8_t three[1] = {3};
        expect_reject(three, 1, EPROTO);
        /* Version 2 is known: a short one is truncated, not unknown. */
        uint8_t two[1] = {2};
        expect_reject(two, 1, ENODATA);
}

Test(dgram, reject_sack_count_too_big)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        h.ack_psn = 1;
        h.sack_count = 1;
        h.sack[0] = (struct dw_dgram_sack){3, 4};
        uint8_t buf[256];
        memset(buf, 0, sizeof(buf));
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 36);
        buf[2] = 9;
        expect_reject(buf, sizeof(buf), EMSGSIZE);
        buf[2] = 0xFF;
        expect_reject(buf, sizeof(buf), EMSGSIZE);
        h.sack_count = 9;
        expect_invalid(&h, EMSGSIZE);
        cr_assert_eq(dw_dgram_hdr_len(&h), -EINVAL);
}

Test(dgram, reject_qpn_high_bits)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        expect_reject_mut(&h, 4, 0x01, EBADMSG);
        expect_reject_mut(&h, 8, 0x80, EBADMSG);
        h.dst_qpn = 0x01000000;
        expect_invalid(&h, EBADMSG);
        h = hdr(DW_DGRAM_F_DATA);
        h.src_qpn = 0xFF000001;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_ud_without_data)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        expect_reject_mut(&h, 1, 0x00, EBADMSG);
        h.flags = 0;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_ud_with_rd_only_flags)
{
        static const uint8_t bad[] = {DW_DGRAM_F_ACK, DW_DGRAM_F_SACK, DW_DGRAM_F_CREDIT,
                                      DW_DGRAM_F_ACKREQ, DW_DGRAM_F_NAK};
        for (size_t i = 0; i < sizeof(bad); i++) {
                struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
                expect_reject_mut(&h, 1, DW_DGRAM_F_DATA | bad[i], EBADMSG);
                h.flags |= bad[i];
                expect_invalid(&h, EBADMSG);
        }
}

Test(dgram, reject_sack_without_ack)
{
        struct dw_dgram_hdr h =
            hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK | DW_DGRAM_F_CREDIT);
        h.ack_psn = 1;
        h.credits = 1;
        h.sack_count = 1;
        h.sack[0] = (struct dw_dgram_sack){3, 4};
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_SACK | DW_DGRAM_F_CREDIT, EBADMSG);
        h.flags &= (uint8_t)~DW_DGRAM_F_ACK;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_nak_with_data)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK);
        h.nak_code = DW_DGRAM_NAK_SEQ;
        h.ack_psn = 5;
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_NAK | DW_DGRAM_F_DATA, EBADMSG);
        h.flags |= DW_DGRAM_F_DATA;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_nak_with_ack)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK);
        h.nak_code = DW_DGRAM_NAK_SEQ;
        h.ack_psn = 5;
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_NAK | DW_DGRAM_F_ACK, EBADMSG);
        h.flags |= DW_DGRAM_F_ACK;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_imm_without_data)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_CREDIT);
        h.credits = 1;
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_CREDIT | DW_DGRAM_F_IMM, EBADMSG);
        h.flags |= DW_DGRAM_F_IMM;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_control_only_without_ack_nak_credit)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_CREDIT);
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD, EBADMSG);
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_ACKREQ, EBADMSG);
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACKREQ;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_sack_count_without_sack_flag)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        h.ack_psn = 1;
        h.sack_count = 1;
        h.sack[0] = (struct dw_dgram_sack){3, 4};
        expect_reject_mut(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_ACK, EBADMSG);
        h.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_sack_flag_with_zero_count)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        h.ack_psn = 1;
        h.sack_count = 1;
        h.sack[0] = (struct dw_dgram_sack){3, 4};
        expect_reject_mut(&h, 2, 0, EBADMSG);
        h.sack_count = 0;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_nak_code_rules)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK);
        h.nak_code = DW_DGRAM_NAK_INVALID;
        h.ack_psn = 5;
        expect_reject_mut(&h, 3, 0, EBADMSG); /* NAK with code 0 */
        expect_reject_mut(&h, 3, 6, EPROTO);  /* unknown code */
        expect_reject_mut(&h, 3, 0xFF, EPROTO);
        h.nak_code = 0;
        expect_invalid(&h, EBADMSG);
        h.nak_code = 6;
        expect_invalid(&h, EPROTO);

        struct dw_dgram_hdr d = hdr(DW_DGRAM_F_DATA); /* code without NAK */
        expect_reject_mut(&d, 3, DW_DGRAM_NAK_RNR, EBADMSG);
        d.nak_code = DW_DGRAM_NAK_RNR;
        expect_invalid(&d, EBADMSG);
}

Test(dgram, reject_rnr_delay_outside_rnr_nak)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        expect_reject_mut(&h, 27, 1, EBADMSG);
        expect_reject_mut(&h, 26, 0x80, EBADMSG);
        h.rnr_delay = 1;
        expect_invalid(&h, EBADMSG);

        struct dw_dgram_hdr n = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK);
        n.nak_code = DW_DGRAM_NAK_REM_ACCESS;
        n.ack_psn = 5;
        expect_reject_mut(&n, 27, 1, EBADMSG);
        n.rnr_delay = 1;
        expect_invalid(&n, EBADMSG);
}

Test(dgram, reject_ack_psn_without_ack_or_nak)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        expect_reject_mut(&h, 23, 1, EBADMSG);
        h.ack_psn = 1;
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_credits_without_credit)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        expect_reject_mut(&h, 24, 1, EBADMSG);
        h.credits = 1;
        expect_invalid(&h, EBADMSG);
}

static struct dw_dgram_hdr sack_hdr(uint32_t ack, unsigned n, const struct dw_dgram_sack *b)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK);
        h.ack_psn = ack;
        h.sack_count = (uint8_t)n;
        memcpy(h.sack, b, n * sizeof(*b));
        return h;
}

/* Writes h's bytes without the encoder's checks so the decoder sees them. */
static size_t raw_sack_bytes(const struct dw_dgram_hdr *h, uint8_t *buf)
{
        struct dw_dgram_hdr ok = *h;
        ok.sack_count = 1;
        ok.sack[0] = (struct dw_dgram_sack){ok.ack_psn + 2, ok.ack_psn + 3};
        cr_assert_eq(dw_dgram_encode(&ok, buf, DW_DGRAM_HDR_MAX_LEN), 36);
        buf[2] = h->sack_count;
        for (unsigned i = 0; i < h->sack_count; i++) {
                dw_put_be32(buf + 28 + 8 * i, h->sack[i].start);
                dw_put_be32(buf + 32 + 8 * i, h->sack[i].end);
        }
        return 28 + 8u * h->sack_count;
}

static void expect_bad_sack(uint32_t ack, unsigned n, const struct dw_dgram_sack *b)
{
        struct dw_dgram_hdr h = sack_hdr(ack, n, b);
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        size_t len = raw_sack_bytes(&h, buf);
        expect_reject(buf, len, EBADMSG);
        expect_invalid(&h, EBADMSG);
}

Test(dgram, reject_sack_blocks)
{
        /* empty */
        expect_bad_sack(10, 1, (struct dw_dgram_sack[]){{12, 12}});
        /* reversed */
        expect_bad_sack(10, 1, (struct dw_dgram_sack[]){{15, 12}});
        /* starts at ack_psn: it would have been acked */
        expect_bad_sack(10, 1, (struct dw_dgram_sack[]){{10, 12}});
        /* starts before ack_psn */
        expect_bad_sack(10, 1, (struct dw_dgram_sack[]){{5, 12}});
        /* out of order */
        expect_bad_sack(10, 2, (struct dw_dgram_sack[]){{20, 22}, {12, 14}});
        /* overlapping */
        expect_bad_sack(10, 2, (struct dw_dgram_sack[]){{12, 16}, {15, 18}});
        /* touching: must have been merged */
        expect_bad_sack(10, 2, (struct dw_dgram_sack[]){{12, 14}, {14, 18}});
        /* beyond half the PSN space */
        expect_bad_sack(0, 1, (struct dw_dgram_sack[]){{1, 0x80000001u}});
        /* across wrap: reversed and out of order */
        expect_bad_sack(0xFFFFFFF0u, 1, (struct dw_dgram_sack[]){{0x00000002, 0xFFFFFFF8u}});
        expect_bad_sack(
            0xFFFFFFF0u, 2,
            (struct dw_dgram_sack[]){{0x00000002, 0x00000004}, {0xFFFFFFF4u, 0xFFFFFFF6u}});
}

Test(dgram, sack_edges_accepted)
{
        /* Largest block: from ack_psn + 1 to exactly 2^31 past it. */
        struct dw_dgram_hdr h =
            sack_hdr(0xFFFFFFFFu, 1, (struct dw_dgram_sack[]){{0, 0x7FFFFFFFu}});
        cr_assert_eq(dw_dgram_hdr_validate(&h, NULL), 0);
        h = sack_hdr(7, 2, (struct dw_dgram_sack[]){{9, 10}, {11, 12}});
        cr_assert_eq(dw_dgram_hdr_validate(&h, NULL), 0);
}

Test(dgram, encode_nospace)
{
        struct dw_dgram_hdr h = sack_hdr(1, 2, (struct dw_dgram_sack[]){{3, 4}, {6, 7}});
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(&h, buf, 43), -ENOSPC);
        cr_assert_eq(dw_dgram_encode(&h, buf, 0), -ENOSPC);
        cr_assert_eq(dw_dgram_encode(&h, buf, 44), 44);
}

Test(dgram, decode_ignores_trailing_bytes_and_leaves_out_on_error)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA), out;
        uint8_t buf[64];
        memset(buf, 0xAA, sizeof(buf));
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 28);
        cr_assert_eq(dw_dgram_decode(buf, sizeof(buf), &out, NULL), 28);

        memset(&out, 0x5A, sizeof(out));
        buf[0] = 9;
        cr_assert_eq(dw_dgram_decode(buf, sizeof(buf), &out, NULL), -EPROTO);
        cr_assert_eq(out.flags, 0x5A, "out written on failure");
}

/* ---- PSN arithmetic ---- */

Test(dgram, psn_serial_arithmetic)
{
        cr_assert(dw_psn_before(1, 2));
        cr_assert_not(dw_psn_before(2, 1));
        cr_assert_not(dw_psn_before(5, 5));
        cr_assert(dw_psn_before(0xFFFFFFFFu, 0));
        cr_assert_not(dw_psn_before(0, 0xFFFFFFFFu));
        cr_assert(dw_psn_before(0xFFFFFFF0u, 0x10));
        cr_assert(dw_psn_before(0, 0x7FFFFFFFu));
        cr_assert_not(dw_psn_before(0x7FFFFFFFu, 0));
        cr_assert_eq(dw_psn_diff(2, 1), 1);
        cr_assert_eq(dw_psn_diff(1, 2), -1);
        cr_assert_eq(dw_psn_diff(0, 0xFFFFFFFFu), 1);
        cr_assert_eq(dw_psn_diff(0xFFFFFFFFu, 0), -1);
        cr_assert_eq(dw_psn_diff(0x10, 0xFFFFFFF0u), 0x20);
        cr_assert_eq(dw_psn_diff(0x7FFFFFFFu, 0), INT32_MAX);
        cr_assert_eq(dw_psn_diff(0x80000000u, 0), INT32_MIN);
        cr_assert_eq(dw_psn_diff(0, 0x80000000u), INT32_MIN);
}

/* ---- layout ---- */

Test(dgram, layout_data_imm_control)
{
        struct dw_dgram_layout l;
        const char *why = NULL;
        struct dw_dgram_hdr d = hdr(DW_DGRAM_F_DATA);
        cr_assert_eq(dw_dgram_layout(&d, 28, 28 + 18 + 100, &l, &why), 0);
        cr_assert_eq(l.seg_off, 28);
        cr_assert_eq(l.seg_len, 118);
        cr_assert_eq(l.imm_off, 0);
        cr_assert_eq(dw_dgram_layout(&d, 28, 28 + 13, &l, &why), -ENODATA);
        cr_assert_not_null(why);

        d.flags |= DW_DGRAM_F_IMM;
        cr_assert_eq(dw_dgram_layout(&d, 28, 28 + 18 + 100 + 26, &l, NULL), 0);
        cr_assert_eq(l.seg_off, 28);
        cr_assert_eq(l.seg_len, 118);
        cr_assert_eq(l.imm_off, 28 + 118);
        why = NULL;
        cr_assert_eq(dw_dgram_layout(&d, 28, 28 + 26 + 13, &l, &why), -ENODATA);
        cr_assert_not_null(why);

        struct dw_dgram_hdr c = sack_hdr(1, 1, (struct dw_dgram_sack[]){{3, 4}});
        cr_assert_eq(dw_dgram_layout(&c, 36, 36, &l, NULL), 0);
        cr_assert_eq(l.seg_len, 0);
        why = NULL;
        cr_assert_eq(dw_dgram_layout(&c, 36, 37, &l, &why), -EBADMSG);
        cr_assert_not_null(why);
        why = NULL;
        cr_assert_eq(dw_dgram_layout(&c, 36, 35, &l, &why), -ENODATA);
        cr_assert_not_null(why);
}

/* ---- CRC32c trailer ---- */

static size_t build_packet(uint8_t *pkt, size_t cap)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.psn = 42;
        ssize_t n = dw_dgram_encode(&h, pkt, cap);
        cr_assert_eq(n, 28);
        for (size_t i = 0; i < 18 + 64; i++) /* stand-in DDP header + payload */
                pkt[28 + i] = (uint8_t)(i * 7 + 3);
        ssize_t total = dw_dgram_packet_seal(pkt, 28 + 18 + 64, cap);
        cr_assert_eq(total, 28 + 18 + 64 + 4);
        return (size_t)total;
}

Test(dgram, crc_trailer_is_big_endian_crc32c)
{
        /* CRC32c("123456789") = 0xE3069283, the standard check value. */
        uint32_t s = dw_crc32c_update(dw_crc32c_init(), "123456789", 9);
        uint8_t out[4];
        dw_dgram_crc_trailer(out, s);
        cr_assert_eq(out[0], 0xE3);
        cr_assert_eq(out[1], 0x06);
        cr_assert_eq(out[2], 0x92);
        cr_assert_eq(out[3], 0x83);
}

Test(dgram, crc_seal_matches_gathered_trailer)
{
        uint8_t pkt[256];
        size_t len = build_packet(pkt, sizeof(pkt));
        /* The same trailer computed over two pieces, as a gathered send does. */
        struct iovec iov[2] = {{pkt, 28}, {pkt + 28, len - 4 - 28}};
        uint8_t out[4];
        dw_dgram_crc_trailer(out, dw_crc32c_update_iov(dw_crc32c_init(), iov, 2));
        cr_assert_eq(memcmp(out, pkt + len - 4, 4), 0);
        cr_assert_eq(dw_dgram_packet_seal(pkt, 200, 203), -ENOSPC);
        cr_assert_eq(dw_dgram_packet_seal(pkt, 0, 3), -ENOSPC);
}

Test(dgram, crc_check_ok)
{
        uint8_t pkt[256];
        size_t len = build_packet(pkt, sizeof(pkt));
        const char *why = NULL;
        cr_assert_eq(dw_dgram_packet_check(pkt, len, &why), (ssize_t)(len - 4));
}

Test(dgram, crc_check_detects_every_single_bit_flip)
{
        uint8_t pkt[256];
        size_t len = build_packet(pkt, sizeof(pkt));
        /* Header (bytes 0..27), payload (28..len-5) and the CRC itself. */
        for (size_t byte = 0; byte < len; byte++) {
                for (unsigned bit = 0; bit < 8; bit++) {
                        pkt[byte] ^= (uint8_t)(1u << bit);
                        const char *why = NULL;
                        ssize_t rc = dw_dgram_packet_check(pkt, len, &why);
                        cr_assert_eq(rc, -EILSEQ, "flip byte %zu bit %u not detected", byte, bit);
                        cr_assert_not_null(why);
                        pkt[byte] ^= (uint8_t)(1u << bit);
                }
        }
        cr_assert_eq(dw_dgram_packet_check(pkt, len, NULL), (ssize_t)(len - 4));
}

Test(dgram, crc_check_too_short)
{
        uint8_t pkt[64] = {0};
        for (size_t l = 0; l < 32; l++) {
                const char *why = NULL;
                cr_assert_eq(dw_dgram_packet_check(pkt, l, &why), -ENODATA);
                cr_assert_not_null(why);
        }
        /* 32 bytes of zeros: long enough, but the CRC does not match. */
        cr_assert_eq(dw_dgram_packet_check(pkt, 32, NULL), -EILSEQ);
}

/* ---- UD fast-path decoder (dw_dgram_decode_ud) against the strict route ---- */

/* A UD datagram as ud/ud.c sends it (without the CRC): header, Send (or Send
 * with SE) with MSN msn and plen payload bytes, and with imm_op (an RDMAP
 * Immediate Data opcode, or 0) the Immediate Data message. Returns the length. */
static size_t build_ud(uint8_t *buf, size_t cap, unsigned send_op, uint32_t msn, size_t plen,
                       unsigned imm_op)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA | (imm_op ? DW_DGRAM_F_IMM : 0));
        h.qkey = 0x80001234u;
        h.psn = 0x01020304u; /* UD ignores the PSN; any value is accepted */
        ssize_t n = dw_dgram_encode(&h, buf, cap);
        cr_assert_eq(n, DW_DGRAM_HDR_LEN);
        struct dw_rdmap_hdr r;
        cr_assert_eq(dw_rdmap_hdr_init(&r, send_op), 0);
        r.ddp.last = true;
        r.ddp.msn = msn;
        ssize_t m = dw_rdmap_encode(&r, buf + n, cap - (size_t)n);
        cr_assert_eq(m, DW_DGRAM_DDP_UNTAGGED_LEN);
        size_t len = (size_t)(n + m);
        for (size_t i = 0; i < plen; i++)
                buf[len++] = (uint8_t)(i * 7 + 1);
        if (imm_op) {
                struct dw_rdmap_hdr ri;
                cr_assert_eq(dw_rdmap_hdr_init(&ri, imm_op), 0);
                ri.ddp.last = true;
                ri.ddp.msn = msn + 1;
                cr_assert_eq(dw_rdmap_encode(&ri, buf + len, cap - len), DW_DGRAM_DDP_UNTAGGED_LEN);
                len += DW_DGRAM_DDP_UNTAGGED_LEN;
                const uint8_t imm[8] = {0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0};
                memcpy(buf + len, imm, 8);
                len += 8;
        }
        cr_assert_leq(len, cap);
        return len;
}

/* Fast and strict decoders must give the same verdict, errno and fields. */
static int ud_both(const uint8_t *buf, size_t len, struct dw_dgram_ud *out, const char *what,
                   size_t a, unsigned b)
{
        struct dw_dgram_ud f, s;
        const char *wf = NULL, *ws = NULL;
        memset(&f, 0xAA, sizeof(f));
        memset(&s, 0x55, sizeof(s));
        int rf = dw_dgram_decode_ud(buf, len, &f, &wf);
        int rs = dw_dgram_decode_ud_strict(buf, len, &s, &ws);
        cr_assert_eq(rf, rs, "%s %zu %u: fast %d, strict %d (%s)", what, a, b, rf, rs,
                     ws ? ws : "-");
        if (rf < 0) {
                cr_assert_not_null(wf, "%s %zu %u: no reason", what, a, b);
                cr_assert_str_eq(wf, ws, "%s %zu %u", what, a, b);
                return rf;
        }
        cr_assert_eq(f.dst_qpn, s.dst_qpn);
        cr_assert_eq(f.src_qpn, s.src_qpn);
        cr_assert_eq(f.qkey, s.qkey);
        cr_assert_eq(f.msn, s.msn, "%s %zu %u: msn", what, a, b);
        cr_assert_eq(f.payload_off, s.payload_off);
        cr_assert_eq(f.payload_len, s.payload_len, "%s %zu %u: payload_len", what, a, b);
        cr_assert_eq(f.imm_data, s.imm_data);
        cr_assert_eq(f.with_imm, s.with_imm);
        cr_assert_eq(f.se, s.se, "%s %zu %u: se", what, a, b);
        if (out)
                *out = f;
        return 0;
}

Test(dgram, decode_ud_fields)
{
        uint8_t buf[256];
        struct dw_dgram_ud u;
        size_t len = build_ud(buf, sizeof(buf), DW_RDMAP_SEND, 0xfffffffeu, 64, 0);
        cr_assert_eq(ud_both(buf, len, &u, "send", 0, 0), 0);
        cr_assert_eq(u.dst_qpn, QPN_D);
        cr_assert_eq(u.src_qpn, QPN_S);
        cr_assert_eq(u.qkey, 0x80001234u);
        cr_assert_eq(u.msn, 0xfffffffeu);
        cr_assert_eq(u.payload_off, DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN);
        cr_assert_eq(u.payload_len, 64);
        cr_assert_eq(buf[u.payload_off + 5], 36);
        cr_assert_not(u.with_imm);
        cr_assert_not(u.se);
        cr_assert_eq(u.imm_data, 0);

        len = build_ud(buf, sizeof(buf), DW_RDMAP_SEND_SE, 7, 0, 0);
        cr_assert_eq(ud_both(buf, len, &u, "send se", 0, 0), 0);
        cr_assert_eq(u.payload_len, 0);
        cr_assert(u.se);

        len = build_ud(buf, sizeof(buf), DW_RDMAP_SEND, 9, 3, DW_RDMAP_IMM_DATA);
        cr_assert_eq(ud_both(buf, len, &u, "imm", 0, 0), 0);
        cr_assert(u.with_imm);
        cr_assert_not(u.se);
        cr_assert_eq(u.payload_len, 3);
        const uint8_t want[4] = {0xde, 0xad, 0xbe, 0xef};
        cr_assert_eq(memcmp(&u.imm_data, want, 4), 0);

        len = build_ud(buf, sizeof(buf), DW_RDMAP_SEND, 9, 0, DW_RDMAP_IMM_DATA_SE);
        cr_assert_eq(ud_both(buf, len, &u, "imm se", 0, 0), 0);
        cr_assert(u.se);
        cr_assert_eq(u.payload_len, 0);
}

Test(dgram, decode_ud_rejects_what_ud_does_not_carry)
{
        uint8_t buf[256];
        const char *why;
        size_t len = build_ud(buf, sizeof(buf), DW_RDMAP_SEND, 1, 16, 0);
        size_t seg = DW_DGRAM_HDR_LEN;
        struct {
                size_t off;
                uint8_t val;
                int err;
        } cases[] = {
            {0, 3, EPROTO},                                 /* datagram version */
            {0, 2, EBADMSG},                                /* version 2 without X-flag */
            {1, DW_DGRAM_F_DATA | DW_DGRAM_F_RD, EBADMSG},  /* RD datagram */
            {1, DW_DGRAM_F_DATA | DW_DGRAM_F_ACK, EBADMSG}, /* RD-only flag */
            {1, DW_DGRAM_F_IMM, EBADMSG},                   /* no DATA */
            {4, 0x01, EBADMSG},                             /* dst_qpn reserved byte */
            {23, 0x01, EBADMSG},                            /* ack_psn without ACK */
            {seg, 0xC1, EBADMSG},                           /* tagged */
            {seg, 0x01, EBADMSG},                           /* L = 0 */
            {seg, 0x42, EPROTO},                            /* DDP version 2 */
            {seg + 1, 0x44, EBADMSG},                       /* Send with Invalidate */
            {seg + 1, 0x40, EBADMSG},                       /* RDMA Write */
            {seg + 1, 0x83, EPROTO},                        /* RDMAP version 2 */
            {seg + 5, 0x01, EBADMSG},                       /* RsvdULP word */
            {seg + 9, 0x01, EBADMSG},                       /* QN 1 */
            {seg + 17, 0x01, EBADMSG},                      /* MO != 0 */
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                uint8_t save = buf[cases[i].off];
                buf[cases[i].off] = cases[i].val;
                struct dw_dgram_ud u;
                why = NULL;
                int rc = dw_dgram_decode_ud(buf, len, &u, &why);
                cr_assert_eq(rc, -cases[i].err, "case %zu: %d (%s)", i, rc, why ? why : "-");
                cr_assert_not_null(why);
                ud_both(buf, len, NULL, "case", i, 0);
                buf[cases[i].off] = save;
        }
        /* An IMM flag whose trailer is a Send, not an Immediate Data message. */
        len = build_ud(buf, sizeof(buf), DW_RDMAP_SEND, 1, 4, DW_RDMAP_IMM_DATA);
        buf[len - 26 + 1] = 0x43;
        cr_assert_eq(ud_both(buf, len, NULL, "imm trailer", 0, 0), -EBADMSG);
}

/* Every value of every byte of valid datagrams (and every truncation):
 * the fast path and the strict route agree on all of them. */
Test(dgram, decode_ud_agrees_with_strict_on_every_byte_value)
{
        static const unsigned shapes[][3] = {
            {DW_RDMAP_SEND, 8, 0},
            {DW_RDMAP_SEND_SE, 0, 0},
            {DW_RDMAP_SEND, 5, DW_RDMAP_IMM_DATA},
            {DW_RDMAP_SEND_SE, 0, DW_RDMAP_IMM_DATA_SE},
        };
        unsigned accepted = 0, rejected = 0;
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
                uint8_t buf[128];
                size_t len = build_ud(buf, sizeof(buf), shapes[k][0], 0x11223344u, shapes[k][1],
                                      shapes[k][2]);
                for (size_t l = 0; l <= len; l++)
                        ud_both(buf, l, NULL, "truncated to", l, (unsigned)k);
                for (size_t off = 0; off < len; off++) {
                        uint8_t save = buf[off];
                        for (unsigned v = 0; v < 256; v++) {
                                buf[off] = (uint8_t)v;
                                if (ud_both(buf, len, NULL, "byte", off, v) == 0)
                                        accepted++;
                                else
                                        rejected++;
                        }
                        buf[off] = save;
                }
        }
        /* Both outcomes occur (the test would be vacuous otherwise). */
        cr_assert_gt(accepted, 1000);
        cr_assert_gt(rejected, 1000);
}

/* ---- RD header fast path (dw_dgram_decode_rd) against dw_dgram_decode ---- */

/* Same verdict, errno, reason and fields (SACK blocks up to sack_count). */
static int rd_both(const uint8_t *buf, size_t len, const char *what, size_t a, unsigned b)
{
        struct dw_dgram_hdr f, s;
        const char *wf = NULL, *ws = NULL;
        memset(&f, 0xAA, sizeof(f));
        memset(&s, 0x55, sizeof(s));
        ssize_t rf = dw_dgram_decode_rd(buf, len, &f, &wf);
        ssize_t rs = dw_dgram_decode(buf, len, &s, &ws);
        cr_assert_eq(rf, rs, "%s %zu %u: fast %zd, general %zd (%s)", what, a, b, rf, rs,
                     ws ? ws : "-");
        if (rf < 0) {
                cr_assert_not_null(wf, "%s %zu %u: no reason", what, a, b);
                cr_assert_str_eq(wf, ws, "%s %zu %u", what, a, b);
                return -1;
        }
        cr_assert_eq(f.flags, s.flags, "%s %zu %u: flags", what, a, b);
        cr_assert_eq(f.xflags, s.xflags, "%s %zu %u: xflags", what, a, b);
        cr_assert_eq(f.xflags2, s.xflags2, "%s %zu %u: xflags2", what, a, b);
        cr_assert_eq(f.token, s.token, "%s %zu %u: token", what, a, b);
        cr_assert_eq(f.challenge, s.challenge, "%s %zu %u: challenge", what, a, b);
        cr_assert_eq(f.pull_len, s.pull_len, "%s %zu %u", what, a, b);
        cr_assert_eq(f.pull_pushed, s.pull_pushed, "%s %zu %u", what, a, b);
        cr_assert_eq(f.rail_count, s.rail_count, "%s %zu %u: rail_count", what, a, b);
        for (unsigned i = 0; i < f.rail_count && i < DW_DGRAM_MAX_RAILS; i++)
                cr_assert_eq(f.rails[i], s.rails[i], "%s %zu %u: rails[%u]", what, a, b, i);
        cr_assert_eq(f.origin, s.origin, "%s %zu %u: origin", what, a, b);
        cr_assert_eq(f.sack_count, s.sack_count, "%s %zu %u", what, a, b);
        cr_assert_eq(f.nak_code, s.nak_code, "%s %zu %u", what, a, b);
        cr_assert_eq(f.dst_qpn, s.dst_qpn, "%s %zu %u", what, a, b);
        cr_assert_eq(f.src_qpn, s.src_qpn, "%s %zu %u", what, a, b);
        cr_assert_eq(f.qkey, s.qkey, "%s %zu %u", what, a, b);
        cr_assert_eq(f.psn, s.psn, "%s %zu %u", what, a, b);
        cr_assert_eq(f.ack_psn, s.ack_psn, "%s %zu %u", what, a, b);
        cr_assert_eq(f.credits, s.credits, "%s %zu %u", what, a, b);
        cr_assert_eq(f.rnr_delay, s.rnr_delay, "%s %zu %u", what, a, b);
        for (unsigned i = 0; i < f.sack_count; i++) {
                cr_assert_eq(f.sack[i].start, s.sack[i].start, "%s %zu %u", what, a, b);
                cr_assert_eq(f.sack[i].end, s.sack[i].end, "%s %zu %u", what, a, b);
        }
        return 0;
}

Test(dgram, decode_rd_fields)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK |
                                    DW_DGRAM_F_ACKREQ),
                            o;
        h.qkey = 0x80001234u;
        h.psn = 0xfffffff0u;
        h.ack_psn = 0x00000007u;
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, DW_DGRAM_HDR_LEN);
        cr_assert_eq(dw_dgram_decode_rd(buf, (size_t)n, &o, NULL), DW_DGRAM_HDR_LEN);
        cr_assert_eq(rd_both(buf, (size_t)n, "data+ack", 0, 0), 0);
        cr_assert_eq(o.flags, h.flags);
        cr_assert_eq(o.psn, 0xfffffff0u);
        cr_assert_eq(o.ack_psn, 7);
        cr_assert_eq(o.qkey, 0x80001234u);
        cr_assert_eq(o.dst_qpn, QPN_D);
        cr_assert_eq(o.src_qpn, QPN_S);
        cr_assert_eq(o.sack_count, 0);
}

/* Every value of every header byte (and every truncation) of the shapes the
 * fast path takes (version 1, and version 2 with NOCRC alone, as every RD
 * datagram is with CRCs off), and of ones it leaves to the general decoder
 * (SACK, NAK, credits, the other X-flags, the rail list and the origin of
 * multirail): both decoders agree on all of them. */
Test(dgram, decode_rd_agrees_with_general_on_every_byte_value)
{
        static const struct {
                uint8_t flags, xflags, xflags2;
        } shapes[] = {
            /* RC over RD: the connection's token on every datagram. */
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK | DW_DGRAM_F_ACKREQ, 0,
             DW_DGRAM_X2_TOKEN},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, DW_DGRAM_X_NOCRC, DW_DGRAM_X2_TOKEN},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK, 0, DW_DGRAM_X2_TOKEN},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, DW_DGRAM_X_RAILS,
             DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, 0, DW_DGRAM_X2_START | DW_DGRAM_X2_TOKEN},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK | DW_DGRAM_F_ACKREQ, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_IMM | DW_DGRAM_F_ACK, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_NAK, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_CREDIT | DW_DGRAM_F_DATA, 0, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, DW_DGRAM_X_NOCRC, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK | DW_DGRAM_F_ACKREQ, DW_DGRAM_X_NOCRC,
             0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_IMM | DW_DGRAM_F_ACK, DW_DGRAM_X_NOCRC,
             0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, DW_DGRAM_X_NOCRC, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK, DW_DGRAM_X_NOCRC, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_NAK, DW_DGRAM_X_NOCRC, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, DW_DGRAM_X_NOCRC | DW_DGRAM_X_PULL, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK, DW_DGRAM_X_PULLREQ | DW_DGRAM_X_ECE,
             0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK, DW_DGRAM_X_NOCRC | DW_DGRAM_X_DSACK,
             0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, DW_DGRAM_X_ECE, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, DW_DGRAM_X_RAIL, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK | DW_DGRAM_F_ACKREQ,
             DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAIL, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, DW_DGRAM_X_RAIL, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK, DW_DGRAM_X_RAILS, 0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK, DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAILS,
             0},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, DW_DGRAM_X_PULL | DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL,
             0},
        };
        unsigned accepted = 0, rejected = 0;
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
                uint8_t buf[DW_DGRAM_HDR_MAX_LEN + 8];
                uint8_t fl = shapes[k].flags;
                struct dw_dgram_hdr h = hdr(fl);
                h.xflags = shapes[k].xflags;
                h.xflags2 = shapes[k].xflags2;
                if (h.xflags2 & DW_DGRAM_X2_START)
                        h.start_psn = h.start_msn = 0x01020304u;
                if (h.xflags2 & DW_DGRAM_X2_TOKEN)
                        h.token = 0x0102030405060708ull;
                if (h.xflags2 & DW_DGRAM_X2_CHALLENGE)
                        h.challenge = 0x1112131415161718ull;
                h.qkey = 0x11223344u;
                h.psn = 0x01020304u;
                if (fl & DW_DGRAM_F_ACK)
                        h.ack_psn = 0x01020300u;
                if (fl & DW_DGRAM_F_SACK) {
                        h.sack_count = 1;
                        h.sack[0] = (struct dw_dgram_sack){0x01020302u, 0x01020303u};
                }
                if (h.xflags & DW_DGRAM_X_DSACK) {
                        h.sack_count = 2;
                        h.sack[1] = h.sack[0];
                        h.sack[0] = (struct dw_dgram_sack){0x010202f0u, 0x010202f1u};
                }
                if (fl & DW_DGRAM_F_NAK) {
                        h.nak_code = DW_DGRAM_NAK_RNR;
                        h.ack_psn = 0x01020300u;
                        h.rnr_delay = 3;
                }
                if (fl & DW_DGRAM_F_CREDIT)
                        h.credits = 5;
                if (h.xflags & DW_DGRAM_X_PULL) {
                        h.pull_len = 0x00100000u;
                        h.pull_pushed = 0x00004000u;
                }
                if (h.xflags & DW_DGRAM_X_RAILS) {
                        h.rail_count = 2;
                        h.rails[0] = ip4(10, 0, 0, 1);
                        h.rails[1] = ip4(10, 0, 1, 1);
                }
                if (h.xflags & DW_DGRAM_X_RAIL)
                        h.origin = ip4(10, 0, 0, 1);
                ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
                cr_assert_gt(n, 0, "shape %zu", k);
                size_t len = (size_t)n + 8; /* a body behind the header */
                memset(buf + n, 0x5a, 8);
                for (size_t l = 0; l <= len; l++)
                        rd_both(buf, l, "truncated to", l, (unsigned)k);
                for (size_t off = 0; off < (size_t)n; off++) {
                        uint8_t save = buf[off];
                        for (unsigned v = 0; v < 256; v++) {
                                buf[off] = (uint8_t)v;
                                if (rd_both(buf, len, "byte", off, v) == 0)
                                        accepted++;
                                else
                                        rejected++;
                        }
                        buf[off] = save;
                }
        }
        cr_assert_gt(accepted, 1000);
        cr_assert_gt(rejected, 1000);
}

Test(dgram, decode_rd_fields_nocrc)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK), o;
        h.xflags = DW_DGRAM_X_NOCRC;
        h.psn = 0x10;
        h.ack_psn = 0x20;
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), DW_DGRAM_HDR_LEN);
        cr_assert_eq(buf[0], 2);
        cr_assert_eq(buf[4], DW_DGRAM_X_NOCRC);
        memset(&o, 0xAA, sizeof(o));
        cr_assert_eq(dw_dgram_decode_rd(buf, DW_DGRAM_HDR_LEN, &o, NULL), DW_DGRAM_HDR_LEN);
        cr_assert_eq(o.xflags, DW_DGRAM_X_NOCRC);
        cr_assert_eq(o.dst_qpn, QPN_D);
        cr_assert_eq(o.pull_len, 0);
        cr_assert_eq(o.pull_pushed, 0);
        cr_assert_eq(o.rail_count, 0);
        cr_assert_eq(o.origin, 0);
        cr_assert_eq(rd_both(buf, DW_DGRAM_HDR_LEN, "nocrc", 0, 0), 0);
}

/* ---- version 1 stays byte for byte what it was ---- */

static uint64_t v1_rng(uint64_t *s)
{
        /* xorshift64: a fixed sequence, so the golden value below is stable. */
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        return *s;
}

/* A header with random flags and fields consistent with them; the caller
 * keeps only those the validator accepts. */
static struct dw_dgram_hdr v1_random(uint64_t *s)
{
        struct dw_dgram_hdr h;
        memset(&h, 0, sizeof(h));
        uint64_t r = v1_rng(s);
        h.flags = (uint8_t)r;
        h.dst_qpn = (uint32_t)(r >> 8) & DW_DGRAM_QPN_MASK;
        h.src_qpn = (uint32_t)(r >> 32) & DW_DGRAM_QPN_MASK;
        r = v1_rng(s);
        h.qkey = (uint32_t)r;
        h.psn = (uint32_t)(r >> 32);
        r = v1_rng(s);
        if (h.flags & (DW_DGRAM_F_ACK | DW_DGRAM_F_NAK))
                h.ack_psn = (uint32_t)r;
        if (h.flags & DW_DGRAM_F_CREDIT)
                h.credits = (uint16_t)(r >> 32);
        if (h.flags & DW_DGRAM_F_NAK) {
                h.nak_code = (uint8_t)(1 + (r >> 48) % DW_DGRAM_NAK_MAX);
                if (h.nak_code == DW_DGRAM_NAK_RNR)
                        h.rnr_delay = (uint16_t)(r >> 52);
        }
        if (h.flags & DW_DGRAM_F_SACK) {
                h.sack_count = (uint8_t)(1 + (r >> 56) % DW_DGRAM_MAX_SACK);
                uint32_t at = h.ack_psn;
                for (unsigned i = 0; i < h.sack_count; i++) {
                        uint64_t g = v1_rng(s);
                        h.sack[i].start = at + 1 + (uint32_t)(g % 1000);
                        h.sack[i].end = h.sack[i].start + 1 + (uint32_t)((g >> 32) % 1000);
                        at = h.sack[i].end;
                }
        }
        return h;
}

/* CRC32c over the encodings of thousands of valid version-1 headers, taken
 * with the codec as it was before version 2 existed: any change to how a
 * version-1 header is encoded changes it. */
Test(dgram, v1_encoding_unchanged)
{
        uint64_t s = 0x9E3779B97F4A7C15ull;
        uint32_t crc = dw_crc32c_init();
        unsigned kept = 0;
        for (unsigned i = 0; i < 20000; i++) {
                struct dw_dgram_hdr h = v1_random(&s);
                if (dw_dgram_hdr_validate(&h, NULL) != 0)
                        continue;
                uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
                ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
                cr_assert_gt(n, 0);
                cr_assert_eq(buf[0], 1);
                crc = dw_crc32c_update(crc, buf, (size_t)n);
                kept++;
        }
        cr_assert_eq(kept, 3080u);
        cr_assert_eq(dw_crc32c_final(crc), 0x7d795424u);
}

/* ---- version 2: X-flags and the pull descriptor ---- */

/* Encodes a valid h, sets byte off to val, expects err with that reason. */
static void expect_mut_why(const struct dw_dgram_hdr *h, size_t off, uint8_t val, int err,
                           const char *prefix)
{
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        ssize_t n = dw_dgram_encode(h, buf, sizeof(buf));
        cr_assert_gt(n, 0);
        cr_assert_lt(off, (size_t)n);
        buf[off] = val;
        expect_reject_why(buf, (size_t)n, err, prefix);
}

/* A valid header for any allowed X-flag set: the least flags each X-flag
 * needs (RD, DATA for PULL/PULLREQ, ACK for ECE, ACK and SACK for DSACK),
 * or with all of DATA, ACK, SACK, ACKREQ and IMM when full. RAILS brings a
 * list of 1 rail (4 when full), RAIL an origin. */
static struct dw_dgram_hdr v2_hdr(uint8_t x, bool full)
{
        uint8_t f = DW_DGRAM_F_RD;
        if (full)
                f |= DW_DGRAM_F_DATA | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK | DW_DGRAM_F_ACKREQ |
                     DW_DGRAM_F_IMM;
        if (x & (DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ | DW_DGRAM_X_CCTL))
                f |= DW_DGRAM_F_DATA;
        if (x & DW_DGRAM_X_CCTL)
                f &= (uint8_t)~DW_DGRAM_F_IMM;
        if (x & (DW_DGRAM_X_ECE | DW_DGRAM_X_DSACK))
                f |= DW_DGRAM_F_ACK;
        if (x & DW_DGRAM_X_DSACK)
                f |= DW_DGRAM_F_SACK;
        if (!(f & (DW_DGRAM_F_DATA | DW_DGRAM_F_ACK)))
                f |= DW_DGRAM_F_DATA;
        struct dw_dgram_hdr h = hdr(f);
        h.xflags = x;
        h.psn = 0x7FFFFFF0u;
        if (f & DW_DGRAM_F_ACK)
                h.ack_psn = 1000;
        if (x & DW_DGRAM_X_DSACK)
                h.sack[h.sack_count++] = (struct dw_dgram_sack){990, 992};
        if (f & DW_DGRAM_F_SACK) {
                h.sack[h.sack_count++] = (struct dw_dgram_sack){1002, 1005};
                h.sack[h.sack_count++] = (struct dw_dgram_sack){1010, 1011};
        }
        if (x & DW_DGRAM_X_PULL) {
                h.pull_len = 1u << 20;
                h.pull_pushed = 1396;
        }
        if (x & DW_DGRAM_X_RAILS) {
                h.rail_count = full ? DW_DGRAM_MAX_RAILS : 1;
                for (unsigned i = 0; i < h.rail_count; i++)
                        h.rails[i] = ip4(10, (uint8_t)i, 0, 1);
        }
        if (x & DW_DGRAM_X_RAIL)
                h.origin = ip4(10, 0, 0, 1);
        return h;
}

Test(dgram, v2_bytes_pull_dsack_nocrc)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK |
                                    DW_DGRAM_F_ACKREQ | DW_DGRAM_F_DATA);
        h.xflags = DW_DGRAM_X_NOCRC | DW_DGRAM_X_PULL | DW_DGRAM_X_DSACK;
        h.qkey = 0xCAFEBABE;
        h.psn = 0x01020304;
        h.ack_psn = 100;
        h.sack_count = 2;
        h.sack[0] = (struct dw_dgram_sack){90, 91}; /* D-SACK: below ack_psn */
        h.sack[1] = (struct dw_dgram_sack){102, 105};
        h.pull_len = 0x00012345;
        h.pull_pushed = 0x00001000;
        static const uint8_t exp[52] = {
            0x02, 0x57, 0x02, 0x00, /* version 2, flags RD|ACK|SACK|ACKREQ|DATA, 2 blocks */
            0x0B, 0x12, 0x34, 0x56, /* X-flags NOCRC|PULL|DSACK, dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* reserved, src_qpn */
            0xCA, 0xFE, 0xBA, 0xBE, /* qkey */
            0x01, 0x02, 0x03, 0x04, /* psn */
            0x00, 0x00, 0x00, 0x64, /* ack_psn 100 */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x00, 0x00, 0x00, 0x5A, /* D-SACK start 90 */
            0x00, 0x00, 0x00, 0x5B, /* D-SACK end 91 */
            0x00, 0x00, 0x00, 0x66, /* SACK start 102 */
            0x00, 0x00, 0x00, 0x69, /* SACK end 105 */
            0x00, 0x01, 0x23, 0x45, /* pull: Message Length */
            0x00, 0x00, 0x10, 0x00, /* pull: Pushed Length */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, v2_bytes_pull_without_sack)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags = DW_DGRAM_X_PULL;
        h.pull_len = 0xFFFFFFFFu;
        h.pull_pushed = 1;
        uint8_t exp[36] = {0x02, 0x41, 0x00, 0x00, 0x02, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF};
        memcpy(exp + 28, (uint8_t[]){0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x01}, 8);
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, v2_bytes_single_flags)
{
        static const uint8_t xs[] = {DW_DGRAM_X_NOCRC, DW_DGRAM_X_PULLREQ, DW_DGRAM_X_ECE};
        for (size_t i = 0; i < sizeof(xs); i++) {
                struct dw_dgram_hdr h = hdr(
                    DW_DGRAM_F_RD | (xs[i] == DW_DGRAM_X_ECE ? DW_DGRAM_F_ACK : DW_DGRAM_F_DATA));
                h.xflags = xs[i];
                h.ack_psn = xs[i] == DW_DGRAM_X_ECE ? 0x0A0B0C0D : 0;
                uint8_t exp[28] = {0x02, h.flags, 0,    0,    xs[i], 0x12,
                                   0x34, 0x56,    0x00, 0xAB, 0xCD,  0xEF};
                if (h.ack_psn)
                        memcpy(exp + 20, (uint8_t[]){0x0A, 0x0B, 0x0C, 0x0D}, 4);
                check_bytes(&h, exp, sizeof(exp));
        }
}

/* Every X-flag set: the allowed ones (all but PULL with PULLREQ, and CCTL
 * with either) encode as version 2 with byte 4 = the set and round-trip,
 * alone and with every other flag; the fast RD decoder agrees. */
Test(dgram, v2_round_trip_every_combination)
{
        unsigned ok = 0;
        for (unsigned x = 1; x <= DW_DGRAM_X_ALL; x++) {
                for (int full = 0; full < 2; full++) {
                        struct dw_dgram_hdr h = v2_hdr((uint8_t)x, full);
                        if ((x & DW_DGRAM_X_PULL) && (x & DW_DGRAM_X_PULLREQ)) {
                                expect_invalid_why(&h, EBADMSG, "xflags: PULL and PULLREQ");
                                continue;
                        }
                        if ((x & DW_DGRAM_X_CCTL) && (x & (DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ))) {
                                expect_invalid_why(&h, EBADMSG, "xflags: CCTL");
                                continue;
                        }
                        uint8_t buf[DW_DGRAM_HDR_MAX_LEN + 8];
                        memset(buf, 0xEE, sizeof(buf));
                        const char *why = NULL;
                        cr_assert_eq(dw_dgram_hdr_validate(&h, &why), 0, "x %#x: %s", x, why);
                        size_t want = DW_DGRAM_HDR_LEN + 8u * h.sack_count +
                                      ((x & DW_DGRAM_X_PULL) ? DW_DGRAM_PULL_LEN : 0) +
                                      ((x & DW_DGRAM_X_RAILS) ? 4 + 4u * h.rail_count : 0) +
                                      ((x & DW_DGRAM_X_RAIL) ? 4 : 0);
                        cr_assert_eq(dw_dgram_hdr_len(&h), (ssize_t)want);
                        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
                        cr_assert_eq(n, (ssize_t)want, "x %#x", x);
                        cr_assert_eq(buf[0], 2);
                        cr_assert_eq(buf[4], x);
                        cr_assert_eq(buf[n], 0xEE);
                        struct dw_dgram_hdr out;
                        cr_assert_eq(dw_dgram_decode(buf, (size_t)n, &out, &why), n, "x %#x: %s", x,
                                     why ? why : "");
                        assert_same(&h, &out);
                        cr_assert_eq(rd_both(buf, (size_t)n, "x", x, (unsigned)full), 0);
                        ok++;
                }
        }
        /* Of the 64 sets of the six low bits (the empty one included), less
         * the 16 with PULL and PULLREQ and the 16 with CCTL and one of them,
         * 32 remain; RAILS and RAIL go with any of them (4 ways), and the
         * empty set is no version-2 header: 127, each alone and with every
         * other flag. */
        cr_assert_eq(ok, 2 * (32 * 4 - 1), "ok %u", ok);
}

/* Every X-flag bit is defined now: 0x40 and 0x80 (once reserved) announce
 * the rail list and the origin, so setting one on a header that has none
 * makes the decoder look for it; a struct with the flag and no field is
 * refused. */
Test(dgram, v2_reject_empty_xflags_and_unannounced_extensions)
{
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_NOCRC, false); /* RD|DATA, 28 bytes */
        expect_mut_why(&h, 4, DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAILS, ENODATA,
                       "rails: list announced by the RAILS flag is truncated");
        expect_mut_why(&h, 4, DW_DGRAM_X_RAILS, ENODATA, "rails: list announced");
        expect_mut_why(&h, 4, DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAIL, ENODATA,
                       "rail: origin announced by the RAIL flag is truncated");
        expect_mut_why(&h, 4, DW_DGRAM_X_RAIL, ENODATA, "rail: origin announced");
        struct dw_dgram_hdr r = h;
        r.xflags |= DW_DGRAM_X_RAILS;
        expect_invalid_why(&r, EBADMSG, "rails: count not within 1..4");
        r = h;
        r.xflags |= DW_DGRAM_X_RAIL;
        expect_invalid_why(&r, EBADMSG, "rail: origin address 0.0.0.0");
        /* Version 2 without an X-flag would be a second encoding of version 1. */
        expect_mut_why(&h, 4, 0, EBADMSG, "xflags: none set");
        /* Byte 8 holds the X2-flags in version 2: START announces a
         * descriptor this datagram does not have room for, the other bits
         * are reserved. */
        expect_mut_why(&h, 8, DW_DGRAM_X2_START, ENODATA, "start: descriptor announced");
        expect_mut_why(&h, 8, DW_DGRAM_X2_TOKEN, ENODATA, "token: value announced");
        expect_mut_why(&h, 8, DW_DGRAM_X2_CHALLENGE, ENODATA, "challenge: value announced");
        expect_mut_why(&h, 8, 0x20, EBADMSG, "xflags2: unknown bits set");
        /* In version 1, byte 4 is still the reserved high byte of dst_qpn. */
        struct dw_dgram_hdr v1 = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        expect_mut_why(&v1, 4, DW_DGRAM_X_NOCRC, EBADMSG, "dst_qpn");
}

/* A credit control message is an RD DATA segment and nothing else. */
Test(dgram, v2_reject_cctl_rules)
{
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_CCTL, false);
        const char *why = NULL;
        cr_assert_eq(dw_dgram_hdr_validate(&h, &why), 0, "%s", why ? why : "");
        struct dw_dgram_hdr r = h;
        r.flags &= (uint8_t)~DW_DGRAM_F_DATA;
        r.flags |= DW_DGRAM_F_ACK;
        r.ack_psn = 5;
        expect_invalid_why(&r, EBADMSG, "xflags: CCTL");
        r = h;
        r.flags &= (uint8_t)~DW_DGRAM_F_RD;
        expect_invalid_why(&r, EBADMSG, "xflags");
        r = h;
        r.flags |= DW_DGRAM_F_IMM;
        expect_invalid_why(&r, EBADMSG, "xflags: CCTL");
}

Test(dgram, v2_reject_nocrc_on_ud)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        h.xflags = DW_DGRAM_X_NOCRC;
        expect_invalid_why(&h, EBADMSG, "xflags: NOCRC on a UD packet");
        uint8_t buf[DW_DGRAM_HDR_LEN];
        h.xflags = 0;
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), DW_DGRAM_HDR_LEN);
        buf[0] = 2;
        buf[4] = DW_DGRAM_X_NOCRC;
        expect_reject_why(buf, sizeof(buf), EBADMSG, "xflags: NOCRC on a UD packet");
}

Test(dgram, v2_reject_pull_and_pullreq_rules)
{
        static const uint8_t xs[] = {DW_DGRAM_X_PULL, DW_DGRAM_X_PULLREQ};
        for (size_t i = 0; i < sizeof(xs); i++) {
                struct dw_dgram_hdr h = v2_hdr(xs[i], false);
                /* Without RD (UD), without DATA (a control-only ACK). */
                expect_mut_why(&h, 1, DW_DGRAM_F_DATA, EBADMSG, "xflags: PULL or PULLREQ");
                expect_mut_why(&h, 1, DW_DGRAM_F_RD | DW_DGRAM_F_ACK, EBADMSG,
                               "xflags: PULL or PULLREQ");
                struct dw_dgram_hdr r = h;
                r.flags = DW_DGRAM_F_DATA;
                expect_invalid_why(&r, EBADMSG, "xflags: PULL or PULLREQ");
                r.flags = DW_DGRAM_F_RD | DW_DGRAM_F_CREDIT;
                r.credits = 1;
                expect_invalid_why(&r, EBADMSG, "xflags: PULL or PULLREQ");
                /* Adding PULL to a PULLREQ datagram announces a descriptor
                 * it does not have. */
                if (xs[i] == DW_DGRAM_X_PULL)
                        expect_mut_why(&h, 4, DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ, EBADMSG,
                                       "xflags: PULL and PULLREQ");
                else
                        expect_mut_why(&h, 4, DW_DGRAM_X_PULL | DW_DGRAM_X_PULLREQ, ENODATA,
                                       "pull: descriptor");
        }
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_PULL, false);
        h.xflags |= DW_DGRAM_X_PULLREQ;
        expect_invalid_why(&h, EBADMSG, "xflags: PULL and PULLREQ");
}

Test(dgram, v2_reject_pull_lengths)
{
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_PULL, false); /* descriptor at 28 */
        cr_assert_eq(dw_dgram_hdr_len(&h), 36);
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 36);
        dw_put_be32(buf + 32, 0);
        expect_reject_why(buf, 36, EBADMSG, "pull: pushed length is 0");
        dw_put_be32(buf + 32, h.pull_len);
        expect_reject_why(buf, 36, EBADMSG, "pull: pushed length not below");
        dw_put_be32(buf + 32, h.pull_len + 1);
        expect_reject_why(buf, 36, EBADMSG, "pull: pushed length not below");
        dw_put_be32(buf + 32, h.pull_len - 1);
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(buf, 36, &out, NULL), 36);
        cr_assert_eq(out.pull_pushed, h.pull_len - 1);

        struct dw_dgram_hdr r = h;
        r.pull_pushed = 0;
        expect_invalid_why(&r, EBADMSG, "pull: pushed length is 0");
        r.pull_pushed = r.pull_len;
        expect_invalid_why(&r, EBADMSG, "pull: pushed length not below");
        r.pull_len = 0;
        r.pull_pushed = 0;
        expect_invalid_why(&r, EBADMSG, "pull: pushed length is 0");

        /* The lengths exist only with PULL: a header that sets them without
         * it would lose them on the wire. */
        r = v2_hdr(DW_DGRAM_X_PULLREQ, false);
        r.pull_len = 5;
        expect_invalid_why(&r, EBADMSG, "pull: lengths non-zero");
        r = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        r.pull_pushed = 5;
        expect_invalid_why(&r, EBADMSG, "pull: lengths non-zero");
}

Test(dgram, v2_reject_truncated_pull_descriptor)
{
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_PULL, true); /* 2 SACK blocks: descriptor at 44 */
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, 52);
        for (size_t l = 44; l < 52; l++)
                expect_reject_why(buf, l, ENODATA, "pull: descriptor");
        for (size_t l = 28; l < 44; l++)
                expect_reject_why(buf, l, ENODATA, "sack:");
        /* Everything after the header belongs to the body. */
        cr_assert_eq(dw_dgram_decode(buf, 52, &h, NULL), 52);
}

Test(dgram, v2_reject_dsack_and_ece_rules)
{
        /* DSACK needs ACK and SACK; ECE needs ACK. */
        struct dw_dgram_hdr e = v2_hdr(DW_DGRAM_X_ECE, false); /* RD|ACK */
        expect_mut_why(&e, 4, DW_DGRAM_X_DSACK, EBADMSG, "xflags: DSACK without ACK and SACK");
        struct dw_dgram_hdr d = v2_hdr(DW_DGRAM_X_NOCRC, false); /* RD|DATA */
        expect_mut_why(&d, 4, DW_DGRAM_X_ECE, EBADMSG, "xflags: ECE without ACK");
        expect_mut_why(&d, 4, DW_DGRAM_X_DSACK, EBADMSG, "xflags: DSACK without ACK and SACK");

        struct dw_dgram_hdr r = v2_hdr(DW_DGRAM_X_NOCRC, false);
        r.xflags = DW_DGRAM_X_ECE;
        expect_invalid_why(&r, EBADMSG, "xflags: ECE without ACK");
        r.xflags = DW_DGRAM_X_DSACK;
        expect_invalid_why(&r, EBADMSG, "xflags: DSACK without ACK and SACK");
        r = v2_hdr(DW_DGRAM_X_ECE, false);
        r.xflags = DW_DGRAM_X_DSACK;
        expect_invalid_why(&r, EBADMSG, "xflags: DSACK without ACK and SACK");
        /* ECE on a NAK: NAK excludes ACK, so there is nothing to echo on. */
        r = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_NAK);
        r.nak_code = DW_DGRAM_NAK_SEQ;
        r.ack_psn = 3;
        r.xflags = DW_DGRAM_X_ECE;
        expect_invalid_why(&r, EBADMSG, "xflags: ECE without ACK");
}

static struct dw_dgram_hdr dsack_hdr(uint32_t ack, unsigned n, const struct dw_dgram_sack *b)
{
        struct dw_dgram_hdr h = sack_hdr(ack, n, b);
        h.xflags = DW_DGRAM_X_DSACK;
        return h;
}

static void expect_dsack(uint32_t ack, unsigned n, const struct dw_dgram_sack *b, int err,
                         const char *prefix)
{
        struct dw_dgram_hdr h = dsack_hdr(ack, n, b);
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        struct dw_dgram_hdr ok = dsack_hdr(ack, 1, (struct dw_dgram_sack[]){{ack - 2, ack - 1}});
        cr_assert_eq(dw_dgram_encode(&ok, buf, sizeof(buf)), 36);
        buf[2] = (uint8_t)n;
        for (unsigned i = 0; i < n; i++) {
                dw_put_be32(buf + 28 + 8 * i, b[i].start);
                dw_put_be32(buf + 32 + 8 * i, b[i].end);
        }
        size_t len = 28 + 8u * n;
        if (err == 0) {
                const char *why = NULL;
                cr_assert_eq(dw_dgram_hdr_validate(&h, &why), 0, "%s", why ? why : "");
                struct dw_dgram_hdr out;
                cr_assert_eq(dw_dgram_decode(buf, len, &out, &why), (ssize_t)len, "%s",
                             why ? why : "");
                assert_same(&h, &out);
                return;
        }
        expect_reject_why(buf, len, err, prefix);
        expect_invalid_why(&h, err, prefix);
}

Test(dgram, v2_dsack_blocks)
{
        /* Where a duplicate may be: below ack_psn, across it, inside a later
         * block, in a run above the blocks sent, alone. */
        expect_dsack(100, 1, (struct dw_dgram_sack[]){{90, 91}}, 0, NULL);
        expect_dsack(100, 1, (struct dw_dgram_sack[]){{98, 103}}, 0, NULL);
        expect_dsack(100, 2, (struct dw_dgram_sack[]){{103, 104}, {102, 105}}, 0, NULL);
        expect_dsack(100, 2, (struct dw_dgram_sack[]){{200, 201}, {102, 105}}, 0, NULL);
        expect_dsack(100, 3, (struct dw_dgram_sack[]){{50, 60}, {102, 105}, {107, 108}}, 0, NULL);
        /* Across the wrap, and the longest block: 2^31 PSNs. */
        expect_dsack(5, 1, (struct dw_dgram_sack[]){{0xFFFFFFFEu, 2}}, 0, NULL);
        expect_dsack(5, 1, (struct dw_dgram_sack[]){{0x80000000u, 0}}, 0, NULL);
        /* The D-SACK block's own shape. */
        expect_dsack(100, 1, (struct dw_dgram_sack[]){{90, 90}}, EBADMSG, "sack: empty D-SACK");
        expect_dsack(100, 1, (struct dw_dgram_sack[]){{91, 90}}, EBADMSG,
                     "sack: D-SACK block reversed");
        expect_dsack(5, 1, (struct dw_dgram_sack[]){{0x80000000u, 1}}, EBADMSG,
                     "sack: D-SACK block reversed");
        /* The other blocks keep every usual rule. */
        expect_dsack(100, 2, (struct dw_dgram_sack[]){{90, 91}, {100, 102}}, EBADMSG,
                     "sack: block start_psn not after ack_psn");
        expect_dsack(100, 2, (struct dw_dgram_sack[]){{90, 91}, {104, 104}}, EBADMSG,
                     "sack: empty block");
        expect_dsack(100, 3, (struct dw_dgram_sack[]){{90, 91}, {102, 105}, {105, 107}}, EBADMSG,
                     "sack: blocks not in ascending order");
        expect_dsack(100, 3, (struct dw_dgram_sack[]){{90, 91}, {110, 112}, {102, 105}}, EBADMSG,
                     "sack: blocks not in ascending order");
        /* Without DSACK the same first block is an ordinary one, and refused. */
        struct dw_dgram_hdr h = dsack_hdr(100, 1, (struct dw_dgram_sack[]){{90, 91}});
        h.xflags = 0;
        expect_invalid_why(&h, EBADMSG, "sack: block start_psn not after ack_psn");
}

Test(dgram, v2_max_len_and_nospace)
{
        /* Every extension at its largest: 8 SACK blocks, the pull
         * descriptor, 4 rails, the origin, the start descriptor, the token,
         * the challenge and the ACK delay. */
        struct dw_dgram_hdr h =
            v2_hdr(DW_DGRAM_X_PULL | DW_DGRAM_X_DSACK | DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL, true);
        h.xflags2 =
            DW_DGRAM_X2_START | DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE | DW_DGRAM_X2_ACKDELAY;
        h.ack_delay_us = 77;
        h.start_psn = h.psn;
        h.start_msn = 1;
        h.token = 0x1122334455667788ull;
        h.challenge = 0x8877665544332211ull;
        cr_assert_eq(h.rail_count, DW_DGRAM_MAX_RAILS);
        h.sack_count = 1;
        for (uint32_t i = 0; h.sack_count < DW_DGRAM_MAX_SACK; i++)
                h.sack[h.sack_count++] = (struct dw_dgram_sack){1001 + 2 * i, 1002 + 2 * i};
        cr_assert_eq(dw_dgram_hdr_validate(&h, NULL), 0);
        cr_assert_eq(dw_dgram_hdr_len(&h), DW_DGRAM_HDR_MAX_LEN);
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(&h, buf, DW_DGRAM_HDR_MAX_LEN - 1), -ENOSPC);
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), DW_DGRAM_HDR_MAX_LEN);
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(buf, sizeof(buf), &out, NULL), DW_DGRAM_HDR_MAX_LEN);
        assert_same(&h, &out);
}

Test(dgram, v2_layout_after_pull_descriptor)
{
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_PULL, true); /* 52-byte header, IMM */
        uint8_t buf[256];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, 52);
        size_t len = 52 + 18 + 10 + 26;
        memset(buf + n, 0x11, len - (size_t)n);
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(buf, len, &out, NULL), 52);
        struct dw_dgram_layout l;
        cr_assert_eq(dw_dgram_layout(&out, 52, len, &l, NULL), 0);
        cr_assert_eq(l.seg_off, 52);
        cr_assert_eq(l.seg_len, 28);
        cr_assert_eq(l.imm_off, 52 + 28);
        const char *why = NULL;
        cr_assert_eq(dw_dgram_layout(&out, 52, 52 + 26 + 13, &l, &why), -ENODATA);
        cr_assert_not_null(why);
}

/* UD never carries an X-flag: every version-2 UD datagram is refused, by the
 * fast path and the strict route alike. With RAILS, the decoder reads the
 * Send's first byte (DDP control 0x41) as a rail count of 65 before the
 * flag rules are checked, so the refusal may name the list instead. */
Test(dgram, v2_decode_ud_rejects_every_xflag)
{
        uint8_t buf[128];
        for (unsigned imm = 0; imm < 2; imm++) {
                size_t len =
                    build_ud(buf, sizeof(buf), DW_RDMAP_SEND, 3, 8, imm ? DW_RDMAP_IMM_DATA : 0);
                buf[0] = 2;
                for (unsigned x = 0; x < 256; x++) {
                        buf[4] = (uint8_t)x;
                        int rc = ud_both(buf, len, NULL, "ud v2 x", x, imm);
                        if ((x & DW_DGRAM_X_RAILS) && rc == -ENODATA)
                                continue;
                        cr_assert_eq(rc, -EBADMSG, "x %#x: %d", x, rc);
                }
                buf[0] = 1;
                buf[4] = 0;
                cr_assert_eq(ud_both(buf, len, NULL, "ud v1", 0, imm), 0);
        }
}

/* ---- version 2: multirail (X-flags RAILS and RAIL) ---- */

Test(dgram, v2_rails_one_rail_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags = DW_DGRAM_X_RAILS;
        h.psn = 0x01020304;
        h.rail_count = 1;
        h.rails[0] = ip4(10, 0, 0, 1);
        static const uint8_t exp[36] = {
            0x02, 0x41, 0x00, 0x00, /* version 2, flags RD|DATA */
            0x40, 0x12, 0x34, 0x56, /* X-flags RAILS, dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* reserved, src_qpn */
            0x00, 0x00, 0x00, 0x00, /* qkey */
            0x01, 0x02, 0x03, 0x04, /* psn */
            0x00, 0x00, 0x00, 0x00, /* ack_psn */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x01, 0x00, 0x00, 0x00, /* 28: rail count 1, reserved */
            0x0A, 0x00, 0x00, 0x01, /* 32: rail 0 = 10.0.0.1 */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, v2_rails_four_rails_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.xflags = DW_DGRAM_X_RAILS;
        h.ack_psn = 100;
        h.rail_count = 4;
        h.rails[0] = ip4(10, 0, 0, 1);
        h.rails[1] = ip4(10, 1, 0, 1);
        h.rails[2] = ip4(192, 168, 7, 254);
        h.rails[3] = ip4(172, 16, 255, 2);
        static const uint8_t exp[48] = {
            0x02, 0x03, 0x00, 0x00, /* version 2, flags RD|ACK */
            0x40, 0x12, 0x34, 0x56, /* X-flags RAILS, dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* reserved, src_qpn */
            0x00, 0x00, 0x00, 0x00, /* qkey */
            0x00, 0x00, 0x00, 0x00, /* psn */
            0x00, 0x00, 0x00, 0x64, /* ack_psn 100 */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x04, 0x00, 0x00, 0x00, /* 28: rail count 4, reserved */
            0x0A, 0x00, 0x00, 0x01, /* 32: rail 0 = 10.0.0.1 (identity) */
            0x0A, 0x01, 0x00, 0x01, /* 36: rail 1 = 10.1.0.1 */
            0xC0, 0xA8, 0x07, 0xFE, /* 40: rail 2 = 192.168.7.254 */
            0xAC, 0x10, 0xFF, 0x02, /* 44: rail 3 = 172.16.255.2 */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, v2_rail_origin_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACKREQ);
        h.xflags = DW_DGRAM_X_RAIL;
        h.psn = 7;
        h.origin = ip4(192, 168, 1, 10);
        static const uint8_t exp[32] = {
            0x02, 0x51, 0x00, 0x00, /* version 2, flags RD|ACKREQ|DATA */
            0x80, 0x12, 0x34, 0x56, /* X-flags RAIL, dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* reserved, src_qpn */
            0x00, 0x00, 0x00, 0x00, /* qkey */
            0x00, 0x00, 0x00, 0x07, /* psn */
            0x00, 0x00, 0x00, 0x00, /* ack_psn */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0xC0, 0xA8, 0x01, 0x0A, /* 28: origin = 192.168.1.10 */
        };
        check_bytes(&h, exp, sizeof(exp));
}

Test(dgram, v2_rails_and_origin_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags = DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL;
        h.psn = 0x10;
        h.rail_count = 2;
        h.rails[0] = ip4(10, 0, 0, 1);
        h.rails[1] = ip4(10, 0, 1, 1);
        h.origin = ip4(10, 0, 0, 1);
        static const uint8_t exp[44] = {
            0x02, 0x41, 0x00, 0x00, /* version 2, flags RD|DATA */
            0xC0, 0x12, 0x34, 0x56, /* X-flags RAILS|RAIL, dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* reserved, src_qpn */
            0x00, 0x00, 0x00, 0x00, /* qkey */
            0x00, 0x00, 0x00, 0x10, /* psn */
            0x00, 0x00, 0x00, 0x00, /* ack_psn */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x02, 0x00, 0x00, 0x00, /* 28: rail count 2, reserved */
            0x0A, 0x00, 0x00, 0x01, /* 32: rail 0 */
            0x0A, 0x00, 0x01, 0x01, /* 36: rail 1 */
            0x0A, 0x00, 0x00, 0x01, /* 40: origin, after the list */
        };
        check_bytes(&h, exp, sizeof(exp));
}

/* Every extension at once, in its order: SACK blocks, pull descriptor, rail
 * list, origin; the DDP segment starts after the origin. */
static struct dw_dgram_hdr all_ext_hdr(void)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK | DW_DGRAM_F_SACK |
                                    DW_DGRAM_F_ACKREQ | DW_DGRAM_F_DATA);
        h.xflags = DW_DGRAM_X_NOCRC | DW_DGRAM_X_PULL | DW_DGRAM_X_DSACK | DW_DGRAM_X_RAILS |
                   DW_DGRAM_X_RAIL;
        h.qkey = 0xCAFEBABE;
        h.psn = 0x01020304;
        h.ack_psn = 100;
        h.sack_count = 2;
        h.sack[0] = (struct dw_dgram_sack){90, 91}; /* D-SACK */
        h.sack[1] = (struct dw_dgram_sack){102, 105};
        h.pull_len = 0x00012345;
        h.pull_pushed = 0x00001000;
        h.rail_count = 3;
        h.rails[0] = ip4(10, 0, 0, 1);
        h.rails[1] = ip4(10, 0, 1, 1);
        h.rails[2] = ip4(10, 0, 2, 1);
        h.origin = ip4(10, 0, 0, 1);
        return h;
}

Test(dgram, v2_multirail_with_sack_and_pull_bytes)
{
        struct dw_dgram_hdr h = all_ext_hdr();
        static const uint8_t exp[72] = {
            0x02, 0x57, 0x02, 0x00, /* version 2, flags RD|ACK|SACK|ACKREQ|DATA, 2 blocks */
            0xCB, 0x12, 0x34, 0x56, /* X-flags NOCRC|PULL|DSACK|RAILS|RAIL, dst_qpn */
            0x00, 0xAB, 0xCD, 0xEF, /* reserved, src_qpn */
            0xCA, 0xFE, 0xBA, 0xBE, /* qkey */
            0x01, 0x02, 0x03, 0x04, /* psn */
            0x00, 0x00, 0x00, 0x64, /* ack_psn 100 */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x00, 0x00, 0x00, 0x5A, /* 28: D-SACK start 90 */
            0x00, 0x00, 0x00, 0x5B, /* 32: D-SACK end 91 */
            0x00, 0x00, 0x00, 0x66, /* 36: SACK start 102 */
            0x00, 0x00, 0x00, 0x69, /* 40: SACK end 105 */
            0x00, 0x01, 0x23, 0x45, /* 44: pull: Message Length */
            0x00, 0x00, 0x10, 0x00, /* 48: pull: Pushed Length */
            0x03, 0x00, 0x00, 0x00, /* 52: rail count 3, reserved */
            0x0A, 0x00, 0x00, 0x01, /* 56: rail 0 */
            0x0A, 0x00, 0x01, 0x01, /* 60: rail 1 */
            0x0A, 0x00, 0x02, 0x01, /* 64: rail 2 */
            0x0A, 0x00, 0x00, 0x01, /* 68: origin */
        };
        check_bytes(&h, exp, sizeof(exp));

        /* The body starts after the origin; NOCRC: no trailer. */
        uint8_t pkt[256];
        cr_assert_eq(dw_dgram_encode(&h, pkt, sizeof(pkt)), 72);
        size_t len = 72 + 18 + 10;
        memset(pkt + 72, 0x11, len - 72);
        cr_assert_eq(dw_dgram_packet_finish(pkt, len, sizeof(pkt)), (ssize_t)len);
        cr_assert_eq(dw_dgram_packet_body(pkt, len, true, NULL), (ssize_t)len);
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(pkt, len, &out, NULL), 72);
        assert_same(&h, &out);
        struct dw_dgram_layout l;
        cr_assert_eq(dw_dgram_layout(&out, 72, len, &l, NULL), 0);
        cr_assert_eq(l.seg_off, 72);
        cr_assert_eq(l.seg_len, 28);
        cr_assert_eq(l.imm_off, 0);
        cr_assert_eq(rd_both(pkt, len, "all extensions", 0, 0), 0);
}

/* An RD DATA header with n rails (10.0.i.1) and, when origin, the origin
 * 10.0.0.1, encoded into buf and followed by body bytes of 0x5A; returns the
 * header length. */
static size_t rails_pkt(uint8_t *buf, size_t cap, unsigned n, bool origin, size_t body,
                        struct dw_dgram_hdr *hp)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.psn = 5;
        if (n) {
                h.xflags |= DW_DGRAM_X_RAILS;
                h.rail_count = (uint8_t)n;
                for (unsigned i = 0; i < n; i++)
                        h.rails[i] = ip4(10, 0, (uint8_t)i, 1);
        }
        if (origin) {
                h.xflags |= DW_DGRAM_X_RAIL;
                h.origin = ip4(10, 0, 0, 1);
        }
        ssize_t len = dw_dgram_encode(&h, buf, cap);
        cr_assert_gt(len, 0);
        cr_assert_leq((size_t)len + body, cap);
        memset(buf + len, 0x5A, body);
        if (hp)
                *hp = h;
        return (size_t)len;
}

Test(dgram, v2_reject_rail_count)
{
        uint8_t buf[1200];
        struct dw_dgram_hdr h;
        /* Count 0: no address at all. */
        size_t n = rails_pkt(buf, sizeof(buf), 1, false, 0, &h);
        cr_assert_eq(n, 36);
        buf[28] = 0;
        expect_reject_why(buf, n, EBADMSG, "rails: count not within 1..4");
        /* Count 5 and 255, with enough bytes behind the header that only the
         * count is wrong. */
        n = rails_pkt(buf, sizeof(buf), 4, false, sizeof(buf) - 48, &h);
        cr_assert_eq(n, 48);
        buf[28] = 5;
        expect_reject_why(buf, sizeof(buf), EBADMSG, "rails: count not within 1..4");
        buf[28] = 0xFF;
        expect_reject_why(buf, sizeof(buf), EBADMSG, "rails: count not within 1..4");
        /* The same counts in the struct. */
        struct dw_dgram_hdr r = h;
        r.rail_count = 0;
        expect_invalid_why(&r, EBADMSG, "rails: count not within 1..4");
        r.rail_count = 5;
        expect_invalid_why(&r, EBADMSG, "rails: count not within 1..4");
        cr_assert_eq(dw_dgram_hdr_len(&r), -EINVAL);
        r.rail_count = 4;
        cr_assert_eq(dw_dgram_hdr_len(&r), 48);
}

Test(dgram, v2_reject_rails_reserved_bytes)
{
        struct dw_dgram_hdr h;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        rails_pkt(buf, sizeof(buf), 4, true, 0, &h);
        for (size_t off = 29; off < 32; off++) {
                expect_mut_why(&h, off, 0x01, EBADMSG, "rails: reserved bytes non-zero");
                expect_mut_why(&h, off, 0x80, EBADMSG, "rails: reserved bytes non-zero");
        }
}

Test(dgram, v2_reject_rails_zero_address)
{
        struct dw_dgram_hdr h;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        for (unsigned n = 1; n <= DW_DGRAM_MAX_RAILS; n++) {
                for (unsigned i = 0; i < n; i++) {
                        size_t len = rails_pkt(buf, sizeof(buf), n, false, 0, &h);
                        memset(buf + 32 + 4 * i, 0, 4);
                        expect_reject_why(buf, len, EBADMSG, "rails: address 0.0.0.0");
                        struct dw_dgram_hdr r = h;
                        r.rails[i] = 0;
                        expect_invalid_why(&r, EBADMSG, "rails: address 0.0.0.0");
                        /* Only the whole address counts: 0.0.0.1 is one. */
                        buf[32 + 4 * i + 3] = 1;
                        struct dw_dgram_hdr out;
                        cr_assert_eq(dw_dgram_decode(buf, len, &out, NULL), (ssize_t)len);
                        cr_assert_eq(out.rails[i], ip4(0, 0, 0, 1));
                }
        }
}

/* Each extension truncated names itself, in the wire order: SACK blocks
 * 28-43, pull descriptor 44-51, rail list 52-71, origin 72-75. */
Test(dgram, v2_reject_truncated_rails_and_origin)
{
        struct dw_dgram_hdr h = v2_hdr(DW_DGRAM_X_PULL | DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL, true);
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(h.sack_count, 2);
        cr_assert_eq(h.rail_count, 4);
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 76);
        for (size_t l = 1; l < 28; l++)
                expect_reject_why(buf, l, ENODATA, "header:");
        for (size_t l = 28; l < 44; l++)
                expect_reject_why(buf, l, ENODATA, "sack:");
        for (size_t l = 44; l < 52; l++)
                expect_reject_why(buf, l, ENODATA, "pull: descriptor");
        for (size_t l = 52; l < 72; l++)
                expect_reject_why(buf, l, ENODATA,
                                  "rails: list announced by the RAILS flag is truncated");
        for (size_t l = 72; l < 76; l++)
                expect_reject_why(buf, l, ENODATA,
                                  "rail: origin announced by the RAIL flag is truncated");
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(buf, 76, &out, NULL), 76);
        assert_same(&h, &out);

        /* Alone: the list right after the fixed header, the origin too. */
        size_t n = rails_pkt(buf, sizeof(buf), 2, false, 0, NULL);
        cr_assert_eq(n, 40);
        for (size_t l = 28; l < 40; l++)
                expect_reject_why(buf, l, ENODATA, "rails: list announced");
        n = rails_pkt(buf, sizeof(buf), 0, true, 0, NULL);
        cr_assert_eq(n, 32);
        for (size_t l = 28; l < 32; l++)
                expect_reject_why(buf, l, ENODATA, "rail: origin announced");
}

Test(dgram, v2_reject_zero_origin)
{
        struct dw_dgram_hdr h;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        size_t n = rails_pkt(buf, sizeof(buf), 0, true, 0, &h);
        memset(buf + 28, 0, 4);
        expect_reject_why(buf, n, EBADMSG, "rail: origin address 0.0.0.0");
        n = rails_pkt(buf, sizeof(buf), 3, true, 0, &h);
        cr_assert_eq(n, 48);
        memset(buf + 44, 0, 4);
        expect_reject_why(buf, n, EBADMSG, "rail: origin address 0.0.0.0");
        h.origin = 0;
        expect_invalid_why(&h, EBADMSG, "rail: origin address 0.0.0.0");
}

Test(dgram, v2_reject_rails_on_ud)
{
        static const uint8_t xs[] = {DW_DGRAM_X_RAILS, DW_DGRAM_X_RAIL,
                                     DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL};
        for (size_t i = 0; i < sizeof(xs); i++) {
                struct dw_dgram_hdr h;
                uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
                size_t n = rails_pkt(buf, sizeof(buf), (xs[i] & DW_DGRAM_X_RAILS) ? 2 : 0,
                                     (xs[i] & DW_DGRAM_X_RAIL) != 0, 0, &h);
                /* The same bytes with the RD flag cleared: a UD DATA header. */
                buf[1] = DW_DGRAM_F_DATA;
                expect_reject_why(buf, n, EBADMSG,
                                  "xflags: RAILS or RAIL on a UD packet (RD only)");
                h.flags = DW_DGRAM_F_DATA;
                expect_invalid_why(&h, EBADMSG, "xflags: RAILS or RAIL on a UD packet (RD only)");
        }
}

/* The fields exist only with their flag: set without it, they would be lost
 * on the wire. */
Test(dgram, v2_reject_rail_fields_without_flag)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.origin = ip4(10, 0, 0, 1);
        expect_invalid_why(&h, EBADMSG, "rail: origin non-zero without the RAIL flag");
        h.xflags = DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAILS;
        h.rail_count = 1;
        h.rails[0] = ip4(10, 0, 0, 1);
        expect_invalid_why(&h, EBADMSG, "rail: origin non-zero without the RAIL flag");

        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.rail_count = 1;
        h.rails[0] = ip4(10, 0, 0, 1);
        expect_invalid_why(&h, EBADMSG, "rails: count non-zero without the RAILS flag");
        h.xflags = DW_DGRAM_X_RAIL;
        h.origin = ip4(10, 0, 0, 1);
        expect_invalid_why(&h, EBADMSG, "rails: count non-zero without the RAILS flag");
        /* Addresses past rail_count are not on the wire and not looked at. */
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.rails[0] = ip4(10, 0, 0, 1);
        cr_assert_eq(dw_dgram_hdr_validate(&h, NULL), 0);
        cr_assert_eq(dw_dgram_hdr_len(&h), DW_DGRAM_HDR_LEN);
}

/* The RD fast path leaves every multirail datagram to dw_dgram_decode and
 * gives exactly its answer: accepted with the same origin and rails, or
 * refused with the same errno and reason. */
Test(dgram, v2_decode_rd_with_rail)
{
        static const uint8_t shapes[][2] = {
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA, DW_DGRAM_X_RAIL},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK | DW_DGRAM_F_ACKREQ,
             DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAIL},
            {DW_DGRAM_F_RD | DW_DGRAM_F_ACK, DW_DGRAM_X_RAIL},
            {DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_IMM,
             DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL},
        };
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
                struct dw_dgram_hdr h = hdr(shapes[k][0]), o;
                h.xflags = shapes[k][1];
                h.psn = 0x7FFFFFFFu;
                if (h.flags & DW_DGRAM_F_ACK)
                        h.ack_psn = 0x12345678u;
                if (h.xflags & DW_DGRAM_X_RAILS) {
                        h.rail_count = 2;
                        h.rails[0] = ip4(10, 0, 0, 1);
                        h.rails[1] = ip4(10, 0, 1, 1);
                }
                h.origin = ip4(10, 0, 0, 1);
                uint8_t buf[DW_DGRAM_HDR_MAX_LEN + 64];
                ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
                cr_assert_gt(n, DW_DGRAM_HDR_LEN, "shape %zu", k);
                size_t len = (size_t)n + 18 + 4;
                memset(buf + n, 0x41, len - (size_t)n);

                memset(&o, 0xAA, sizeof(o));
                const char *why = NULL;
                cr_assert_eq(dw_dgram_decode_rd(buf, len, &o, &why), n, "shape %zu: %s", k,
                             why ? why : "");
                assert_same(&h, &o);
                cr_assert_eq(o.origin, ip4(10, 0, 0, 1));
                cr_assert_eq(rd_both(buf, len, "rail", k, 0), 0);
                for (size_t l = 0; l < len; l++)
                        rd_both(buf, l, "rail truncated to", l, (unsigned)k);
                /* A refused origin: the same reason from both. */
                memset(buf + n - 4, 0, 4);
                cr_assert_eq(rd_both(buf, len, "rail origin 0", k, 0), -1);
                why = NULL;
                cr_assert_eq(dw_dgram_decode_rd(buf, len, &o, &why), -EBADMSG);
                cr_assert_str_eq(why, "rail: origin address 0.0.0.0");
        }
}

/* ---- CRC32c with NOCRC: dw_dgram_packet_body, dw_dgram_packet_finish ---- */

/* An RD DATA datagram with the given X-flags, sealed as its header asks
 * (dw_dgram_packet_finish). Returns the length on the wire. */
static size_t build_v2_packet(uint8_t *pkt, size_t cap, uint8_t xflags, size_t *body)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags = xflags;
        h.psn = 42;
        ssize_t n = dw_dgram_encode(&h, pkt, cap);
        cr_assert_eq(n, 28);
        for (size_t i = 0; i < 18 + 64; i++)
                pkt[28 + i] = (uint8_t)(i * 7 + 3);
        *body = 28 + 18 + 64;
        ssize_t total = dw_dgram_packet_finish(pkt, *body, cap);
        cr_assert_gt(total, 0);
        return (size_t)total;
}

static void expect_body(const uint8_t *pkt, size_t len, bool accept, ssize_t want)
{
        const char *why = NULL;
        ssize_t got = dw_dgram_packet_body(pkt, len, accept, &why);
        cr_assert_eq(got, want, "accept %d: got %zd want %zd (%s)", accept, got, want,
                     why ? why : "-");
        if (want < 0)
                cr_assert_not_null(why);
}

Test(dgram, packet_body_with_crc)
{
        uint8_t pkt[256];
        size_t body;
        /* Version 1, and version 2 with X-flags other than NOCRC: CRC checked. */
        static const uint8_t xs[] = {0, DW_DGRAM_X_PULLREQ};
        for (size_t i = 0; i < sizeof(xs); i++) {
                size_t len = build_v2_packet(pkt, sizeof(pkt), xs[i], &body);
                cr_assert_eq(len, body + 4);
                for (int accept = 0; accept < 2; accept++) {
                        expect_body(pkt, len, accept, (ssize_t)body);
                        pkt[40] ^= 0x10;
                        expect_body(pkt, len, accept, -EILSEQ);
                        pkt[40] ^= 0x10;
                        pkt[len - 1] ^= 0x01;
                        expect_body(pkt, len, accept, -EILSEQ);
                        pkt[len - 1] ^= 0x01;
                }
                cr_assert_eq(dw_dgram_packet_check(pkt, len, NULL), (ssize_t)body);
        }
}

Test(dgram, packet_body_nocrc)
{
        uint8_t pkt[256];
        size_t body;
        size_t len = build_v2_packet(pkt, sizeof(pkt), DW_DGRAM_X_NOCRC, &body);
        cr_assert_eq(len, body, "finish appended a CRC to a NOCRC datagram");
        expect_body(pkt, len, true, (ssize_t)len);
        expect_body(pkt, len, false, -ENOTSUP);
        const char *why = NULL;
        dw_dgram_packet_body(pkt, len, false, &why);
        cr_assert_str_eq(why, "crc: datagram without CRC32c refused");
        /* Nothing to verify: a damaged payload is not noticed here. */
        pkt[60] ^= 0xFF;
        expect_body(pkt, len, true, (ssize_t)len);
        /* The shortest such datagram is a bare header; shorter is truncated. */
        expect_body(pkt, 28, true, 28);
        expect_body(pkt, 27, true, -ENODATA);
        expect_body(pkt, 27, false, -ENODATA);
        /* Decoded as usual afterwards. */
        struct dw_dgram_hdr h;
        cr_assert_eq(dw_dgram_decode(pkt, len, &h, NULL), 28);
        cr_assert_eq(h.xflags, DW_DGRAM_X_NOCRC);
}

/* Only version 2, the RD flag and the NOCRC X-flag can waive the CRC:
 * anything else in those bytes means the CRC is checked. (Every X-flag bit
 * is defined, so no other bit of byte 4 can make it untrusted.) */
Test(dgram, packet_body_untrusted_nocrc_is_checked)
{
        uint8_t pkt[256];
        size_t body;
        size_t len = build_v2_packet(pkt, sizeof(pkt), DW_DGRAM_X_NOCRC, &body);
        struct {
                size_t off;
                uint8_t val;
        } cases[] = {
            {0, 1},                                  /* version 1 */
            {0, 3},                                  /* unknown version */
            {1, DW_DGRAM_F_DATA},                    /* UD */
            {4, DW_DGRAM_X_PULLREQ},                 /* no NOCRC */
            {4, DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL}, /* no NOCRC */
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                uint8_t save = pkt[cases[i].off];
                pkt[cases[i].off] = cases[i].val;
                /* No trailer was written: the last 4 bytes do not match. */
                expect_body(pkt, len, true, -EILSEQ);
                expect_body(pkt, len, false, -EILSEQ);
                /* With a right CRC, the CRC stage passes and the decoder judges. */
                cr_assert_eq(dw_dgram_packet_seal(pkt, len, sizeof(pkt)), (ssize_t)len + 4);
                expect_body(pkt, len + 4, true, (ssize_t)len);
                expect_body(pkt, len + 4, false, (ssize_t)len);
                pkt[cases[i].off] = save;
        }
        /* NOCRC on UD, sealed: CRC good, then the decoder refuses it. */
        pkt[1] = DW_DGRAM_F_DATA;
        cr_assert_eq(dw_dgram_packet_seal(pkt, len, sizeof(pkt)), (ssize_t)len + 4);
        expect_body(pkt, len + 4, true, (ssize_t)len);
        struct dw_dgram_hdr h;
        const char *why = NULL;
        cr_assert_eq(dw_dgram_decode(pkt, len, &h, &why), -EBADMSG);
        cr_assert_str_eq(why, "xflags: NOCRC on a UD packet (UD always carries the CRC32c)");
}

/* Every single-bit flip of a version-2 datagram with a CRC is caught, except
 * the one that sets NOCRC itself when the receiver takes NOCRC datagrams:
 * a CRC cannot cover the bit that waives it (the UDP checksum does). */
Test(dgram, packet_body_single_bit_flips)
{
        uint8_t pkt[256];
        size_t body;
        size_t len = build_v2_packet(pkt, sizeof(pkt), DW_DGRAM_X_PULLREQ, &body);
        unsigned waived = 0;
        for (size_t byte = 0; byte < len; byte++) {
                for (unsigned bit = 0; bit < 8; bit++) {
                        pkt[byte] ^= (uint8_t)(1u << bit);
                        bool nocrc = byte == 4 && (1u << bit) == DW_DGRAM_X_NOCRC;
                        expect_body(pkt, len, false, nocrc ? -ENOTSUP : -EILSEQ);
                        ssize_t r = dw_dgram_packet_body(pkt, len, true, NULL);
                        if (nocrc) {
                                cr_assert_eq(r, (ssize_t)len);
                                waived++;
                        } else {
                                cr_assert_eq(r, -EILSEQ, "flip byte %zu bit %u", byte, bit);
                        }
                        pkt[byte] ^= (uint8_t)(1u << bit);
                }
        }
        cr_assert_eq(waived, 1);
}

Test(dgram, packet_finish)
{
        uint8_t a[256], b[256];
        size_t body;
        /* With a CRC: the same bytes as dw_dgram_packet_seal. */
        size_t len = build_v2_packet(a, sizeof(a), 0, &body);
        memcpy(b, a, body);
        cr_assert_eq(dw_dgram_packet_seal(b, body, sizeof(b)), (ssize_t)len);
        cr_assert_eq(memcmp(a, b, len), 0);
        cr_assert_eq(dw_dgram_packet_finish(a, body, body + 3), -ENOSPC);
        /* Without: nothing written past the body, even with room. */
        len = build_v2_packet(a, sizeof(a), DW_DGRAM_X_NOCRC, &body);
        cr_assert_eq(len, body);
        memset(a + body, 0xEE, 8);
        cr_assert_eq(dw_dgram_packet_finish(a, body, sizeof(a)), (ssize_t)body);
        cr_assert_eq(a[body], 0xEE);
        cr_assert_eq(dw_dgram_packet_finish(a, body, body), (ssize_t)body);
        cr_assert_eq(dw_dgram_packet_finish(a, body, body - 1), -ENOSPC);
}

/* ---- stream start (X2-flag START) ---------------------------------------- */

Test(dgram, v2_start_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACKREQ);
        h.xflags2 = DW_DGRAM_X2_START;
        h.qkey = 0x11223344;
        h.psn = 0x9ABCDEF0;
        h.start_psn = 0x9ABCDEF0;
        h.start_msn = 0x9ABCDEF0;
        static const uint8_t exp[36] = {
            0x02, 0x51, 0x00, 0x00, /* version 2, flags RD|ACKREQ|DATA */
            0x00, 0x12, 0x34, 0x56, /* no X-flag, dst_qpn */
            0x01, 0xAB, 0xCD, 0xEF, /* X2-flags START, src_qpn */
            0x11, 0x22, 0x33, 0x44, /* qkey */
            0x9A, 0xBC, 0xDE, 0xF0, /* psn */
            0x00, 0x00, 0x00, 0x00, /* ack_psn */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x9A, 0xBC, 0xDE, 0xF0, /* 28: First PSN */
            0x9A, 0xBC, 0xDE, 0xF0, /* 32: First MSN */
        };
        check_bytes(&h, exp, sizeof(exp));
}

/* The start descriptor comes last, after the origin and everything before. */
Test(dgram, v2_start_after_every_extension)
{
        struct dw_dgram_hdr h = all_ext_hdr();
        h.xflags2 = DW_DGRAM_X2_START;
        h.start_psn = 0x01020300;
        h.start_msn = 7;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, 80);
        cr_assert_eq(buf[8], DW_DGRAM_X2_START);
        static const uint8_t tail[8] = {0x01, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x07};
        cr_assert_arr_eq(buf + 72, tail, 8);
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(buf, (size_t)n, &out, NULL), 80);
        assert_same(&h, &out);
        /* The largest header there is. */
        h.sack_count = 8;
        h.sack[0] = (struct dw_dgram_sack){90, 91};
        for (unsigned i = 1; i < 8; i++)
                h.sack[i] = (struct dw_dgram_sack){100 + 3 * i, 101 + 3 * i};
        h.rail_count = 4;
        h.rails[3] = ip4(10, 0, 3, 1);
        h.xflags2 |= DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE | DW_DGRAM_X2_ACKDELAY;
        h.token = 1;
        h.challenge = 2;
        h.ack_delay_us = 3;
        cr_assert_eq(dw_dgram_hdr_len(&h), DW_DGRAM_HDR_MAX_LEN);
        cr_assert_eq(DW_DGRAM_HDR_MAX_LEN, 152);
}

Test(dgram, v2_start_rules)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.xflags2 = DW_DGRAM_X2_START;
        expect_invalid_why(&h, EBADMSG, "xflags2: START without RD and DATA");
        h = hdr(DW_DGRAM_F_DATA);
        h.xflags2 = DW_DGRAM_X2_START;
        expect_invalid_why(&h, EBADMSG, "xflags2: START without RD and DATA");
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.start_psn = 1;
        expect_invalid_why(&h, EBADMSG, "start: descriptor non-zero without the START flag");
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags2 = 0x20;
        expect_invalid_why(&h, EBADMSG, "xflags2: unknown bits set");

        /* On the wire: a reserved X2 bit, START on an ACK, and a version-1
         * header whose byte 8 is set (the reserved high byte of src_qpn). */
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags2 = DW_DGRAM_X2_START;
        h.start_psn = 5;
        h.start_msn = 6;
        uint8_t buf[64];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, 36);
        buf[8] = 0x21;
        expect_reject_why(buf, (size_t)n, EBADMSG, "xflags2: unknown bits set");
        buf[8] = 0x01;
        buf[1] = DW_DGRAM_F_RD | DW_DGRAM_F_ACK;
        expect_reject_why(buf, (size_t)n, EBADMSG, "xflags2: START without RD and DATA");
        buf[1] = DW_DGRAM_F_RD | DW_DGRAM_F_DATA;
        expect_reject_why(buf, 35, ENODATA, "start: descriptor announced by the START flag");
        buf[0] = DW_DGRAM_VERSION;
        expect_reject_why(buf, (size_t)n, EBADMSG, "src_qpn: reserved high 8 bits set");
        /* Version 2 needs an X-flag or an X2-flag. */
        buf[0] = DW_DGRAM_VERSION2;
        buf[8] = 0;
        expect_reject_why(buf, 28, EBADMSG, "xflags: none set in a version-2 header");
}

/* The token and the challenge: after the start descriptor, in that order,
 * big-endian, never 0, RD only. */
Test(dgram, v2_token_challenge_bytes)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.xflags2 = DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE;
        h.ack_psn = 0x10;
        h.token = 0x0102030405060708ull;
        h.challenge = 0xF1F2F3F4F5F6F7F8ull;
        static const uint8_t exp[44] = {
            0x02, 0x03, 0x00, 0x00,                         /* version 2, flags RD|ACK */
            0x00, 0x12, 0x34, 0x56,                         /* no X-flag, dst_qpn */
            0x06, 0xAB, 0xCD, 0xEF,                         /* X2-flags TOKEN|CHALLENGE, src_qpn */
            0x00, 0x00, 0x00, 0x00,                         /* qkey */
            0x00, 0x00, 0x00, 0x00,                         /* psn */
            0x00, 0x00, 0x00, 0x10,                         /* ack_psn */
            0x00, 0x00, 0x00, 0x00,                         /* credits, rnr_delay */
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, /* 28: token */
            0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8, /* 36: challenge */
        };
        check_bytes(&h, exp, sizeof(exp));
        /* After the start descriptor. */
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags2 = DW_DGRAM_X2_START | DW_DGRAM_X2_TOKEN;
        h.start_psn = 0x11;
        h.start_msn = 0x22;
        h.token = 0x33;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 44);
        static const uint8_t tok[8] = {0, 0, 0, 0, 0, 0, 0, 0x33};
        cr_assert_arr_eq(buf + 36, tok, 8);
        struct dw_dgram_hdr out;
        cr_assert_eq(dw_dgram_decode(buf, 44, &out, NULL), 44);
        assert_same(&h, &out);
        cr_assert_eq(out.token, 0x33);
}

Test(dgram, v2_token_challenge_rules)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_DATA);
        h.xflags2 = DW_DGRAM_X2_TOKEN;
        h.token = 1;
        expect_invalid_why(&h, EBADMSG, "xflags2: TOKEN or CHALLENGE on a UD packet (RD only)");
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.xflags2 = DW_DGRAM_X2_TOKEN;
        expect_invalid_why(&h, EBADMSG, "token: value 0");
        h.xflags2 = 0;
        h.token = 5;
        expect_invalid_why(&h, EBADMSG, "token: non-zero without the TOKEN flag");
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.xflags2 = DW_DGRAM_X2_CHALLENGE;
        expect_invalid_why(&h, EBADMSG, "challenge: value 0");
        h.xflags2 = 0;
        h.challenge = 5;
        expect_invalid_why(&h, EBADMSG, "challenge: non-zero without the CHALLENGE flag");

        /* On the wire: truncated, and a token of 0. */
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.xflags2 = DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE;
        h.token = 7;
        h.challenge = 9;
        uint8_t buf[64];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, 44);
        expect_reject_why(buf, 35, ENODATA, "token: value announced by the TOKEN flag");
        expect_reject_why(buf, 43, ENODATA, "challenge: value announced by the CHALLENGE flag");
        memset(buf + 28, 0, 8);
        expect_reject_why(buf, 44, EBADMSG, "token: value 0");
        cr_assert_eq(rd_both(buf, 44, "token 0", 0, 0), -1);
}

/* The ACK delay: the last extension, after the challenge; RD ACKs only. */
Test(dgram, v2_ack_delay)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK), o;
        h.xflags2 = DW_DGRAM_X2_ACKDELAY;
        h.ack_psn = 0x10;
        h.ack_delay_us = 0x01020304;
        static const uint8_t exp[32] = {
            0x02, 0x03, 0x00, 0x00, /* version 2, flags RD|ACK */
            0x00, 0x12, 0x34, 0x56, /* no X-flag, dst_qpn */
            0x10, 0xAB, 0xCD, 0xEF, /* X2-flag ACKDELAY, src_qpn */
            0x00, 0x00, 0x00, 0x00, /* qkey */
            0x00, 0x00, 0x00, 0x00, /* psn */
            0x00, 0x00, 0x00, 0x10, /* ack_psn */
            0x00, 0x00, 0x00, 0x00, /* credits, rnr_delay */
            0x01, 0x02, 0x03, 0x04, /* 28: ACK delay */
        };
        check_bytes(&h, exp, sizeof(exp));
        /* Through the RD decoder too (it hands it to the full one). */
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        cr_assert_eq(dw_dgram_encode(&h, buf, sizeof(buf)), 32);
        cr_assert_eq(dw_dgram_decode_rd(buf, 32, &o, NULL), 32);
        cr_assert_eq(o.ack_delay_us, 0x01020304);
        cr_assert_eq(o.xflags2, DW_DGRAM_X2_ACKDELAY);
        /* After a SACK block, the token and the challenge. */
        h.flags |= DW_DGRAM_F_SACK;
        h.sack_count = 1;
        h.sack[0] = (struct dw_dgram_sack){0x12, 0x14};
        h.xflags2 |= DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_CHALLENGE;
        h.token = 7;
        h.challenge = 9;
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, 28 + 8 + 8 + 8 + 4);
        static const uint8_t delay[4] = {0x01, 0x02, 0x03, 0x04};
        cr_assert_arr_eq(buf + 52, delay, 4);
        cr_assert_eq(dw_dgram_decode(buf, (size_t)n, &o, NULL), n);
        assert_same(&h, &o);
        expect_reject_why(buf, (size_t)n - 1, ENODATA,
                          "ack delay: value announced by the ACKDELAY flag is truncated");
        /* RD and ACK only; no value without the flag. */
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        h.xflags2 = DW_DGRAM_X2_ACKDELAY;
        expect_invalid_why(&h, EBADMSG, "xflags2: ACKDELAY without RD and ACK");
        h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_ACK);
        h.ack_delay_us = 5;
        expect_invalid_why(&h, EBADMSG, "ack delay: non-zero without the ACKDELAY flag");
}

/* The RD fast decoder takes the token of RC over RD (no other X2-flag, no
 * SACK) itself, with the general decoder's verdict and fields. */
Test(dgram, v2_token_through_the_rd_decoder)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK), o;
        h.xflags2 = DW_DGRAM_X2_TOKEN;
        h.token = 0xCAFEF00DDEADBEEFull;
        h.ack_psn = 3;
        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        cr_assert_eq(n, DW_DGRAM_HDR_LEN + DW_DGRAM_TOKEN_LEN);
        cr_assert_eq(dw_dgram_decode_rd(buf, (size_t)n, &o, NULL), n);
        cr_assert_eq(o.xflags2, DW_DGRAM_X2_TOKEN);
        cr_assert_eq(o.token, 0xCAFEF00DDEADBEEFull);
        cr_assert_eq(rd_both(buf, (size_t)n, "token", 0, 0), 0);
        for (size_t l = 0; l < (size_t)n; l++)
                rd_both(buf, l, "token truncated", l, 0);
}

/* The RD fast decoder hands START datagrams to the full one: same fields. */
Test(dgram, v2_start_through_the_rd_decoder)
{
        struct dw_dgram_hdr h = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA | DW_DGRAM_F_ACK);
        h.xflags = DW_DGRAM_X_NOCRC;
        h.xflags2 = DW_DGRAM_X2_START;
        h.psn = 41;
        h.ack_psn = 9;
        h.start_psn = 40;
        h.start_msn = 40;
        uint8_t buf[64];
        ssize_t n = dw_dgram_encode(&h, buf, sizeof(buf));
        struct dw_dgram_hdr out;
        memset(&out, 0xAA, sizeof(out));
        cr_assert_eq(dw_dgram_decode_rd(buf, (size_t)n, &out, NULL), n);
        assert_same(&h, &out);
        /* A version-1 datagram through the fast path has no descriptor. */
        struct dw_dgram_hdr v1 = hdr(DW_DGRAM_F_RD | DW_DGRAM_F_DATA);
        v1.psn = 3;
        n = dw_dgram_encode(&v1, buf, sizeof(buf));
        memset(&out, 0xAA, sizeof(out));
        cr_assert_eq(dw_dgram_decode_rd(buf, (size_t)n, &out, NULL), DW_DGRAM_HDR_LEN);
        cr_assert_eq(out.xflags2, 0);
        cr_assert_eq(out.start_psn, 0);
        cr_assert_eq(out.start_msn, 0);
}
