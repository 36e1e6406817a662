#include <criterion/criterion.h>
#include <string.h>

#include "wire/ddp.h"

/* RFC 5041 section 4: tagged header = ctrl | RsvdULP | STag | TO. */
static const uint8_t tagged_bytes[] = {
    0xc1,                                          /* T=1 L=1 rsvd=0 DV=01 */
    0x42,                                          /* RsvdULP */
    0x11, 0x22, 0x33, 0x44,                        /* STag */
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08 /* TO */
};

/* Untagged header = ctrl | RsvdULP(8) | RsvdULP(32) | QN | MSN | MO. */
static const uint8_t untagged_bytes[] = {
    0x01,                   /* T=0 L=0 DV=01 */
    0x43,                   /* RsvdULP byte */
    0xde, 0xad, 0xbe, 0xef, /* RsvdULP word */
    0x00, 0x00, 0x00, 0x02, /* QN */
    0x80, 0x00, 0x00, 0x01, /* MSN */
    0x00, 0x01, 0x00, 0x00, /* MO */
};

Test(ddp, hdr_len)
{
        cr_assert_eq(dw_ddp_hdr_len(true), 14);
        cr_assert_eq(dw_ddp_hdr_len(false), 18);
}

Test(ddp, encode_tagged_layout)
{
        struct dw_ddp_hdr h = {.tagged = true,
                               .last = true,
                               .ulp_ctrl = 0x42,
                               .stag = 0x11223344,
                               .to = 0x0102030405060708ull};
        uint8_t buf[32];

        memset(buf, 0xaa, sizeof(buf));
        cr_assert_eq(dw_ddp_encode(&h, buf, sizeof(buf)), 14);
        cr_assert_arr_eq(buf, tagged_bytes, sizeof(tagged_bytes));
        cr_assert_eq(buf[14], 0xaa, "wrote past the header");
}

Test(ddp, encode_untagged_layout)
{
        struct dw_ddp_hdr h = {.tagged = false,
                               .last = false,
                               .ulp_ctrl = 0x43,
                               .rsvdulp = 0xdeadbeef,
                               .qn = 2,
                               .msn = 0x80000001,
                               .mo = 0x10000};
        uint8_t buf[18];

        cr_assert_eq(dw_ddp_encode(&h, buf, sizeof(buf)), 18);
        cr_assert_arr_eq(buf, untagged_bytes, sizeof(untagged_bytes));
}

Test(ddp, encode_flags_bits)
{
        struct dw_ddp_hdr h = {.tagged = true, .last = false};
        uint8_t buf[18];

        cr_assert_eq(dw_ddp_encode(&h, buf, sizeof(buf)), 14);
        cr_assert_eq(buf[0], 0x81);
        h.tagged = false;
        h.last = true;
        cr_assert_eq(dw_ddp_encode(&h, buf, sizeof(buf)), 18);
        cr_assert_eq(buf[0], 0x41);
}

Test(ddp, decode_tagged_fields)
{
        struct dw_ddp_hdr h;

        cr_assert_eq(dw_ddp_decode(tagged_bytes, sizeof(tagged_bytes), &h, NULL), 14);
        cr_assert(h.tagged);
        cr_assert(h.last);
        cr_assert_eq(h.ulp_ctrl, 0x42);
        cr_assert_eq(h.stag, 0x11223344);
        cr_assert_eq(h.to, 0x0102030405060708ull);
        cr_assert_eq(h.qn, 0);
        cr_assert_eq(h.msn, 0);
        cr_assert_eq(h.mo, 0);
        cr_assert_eq(h.rsvdulp, 0);
}

Test(ddp, decode_untagged_fields)
{
        struct dw_ddp_hdr h;

        cr_assert_eq(dw_ddp_decode(untagged_bytes, sizeof(untagged_bytes), &h, NULL), 18);
        cr_assert_not(h.tagged);
        cr_assert_not(h.last);
        cr_assert_eq(h.ulp_ctrl, 0x43);
        cr_assert_eq(h.rsvdulp, 0xdeadbeef);
        cr_assert_eq(h.qn, 2);
        cr_assert_eq(h.msn, 0x80000001);
        cr_assert_eq(h.mo, 0x10000);
        cr_assert_eq(h.stag, 0);
        cr_assert_eq(h.to, 0);
}

Test(ddp, decode_ignores_payload)
{
        uint8_t seg[64];

        memcpy(seg, tagged_bytes, sizeof(tagged_bytes));
        memset(seg + 14, 0x5a, sizeof(seg) - 14);
        struct dw_ddp_hdr h;

        cr_assert_eq(dw_ddp_decode(seg, sizeof(seg), &h, NULL), 14);
}

Test(ddp, roundtrip_both_models)
{
        struct dw_ddp_hdr in[] = {
            {.tagged = true, .last = false, .ulp_ctrl = 0x40, .stag = 1, .to = ~0ull},
            {.tagged = false,
             .last = true,
             .ulp_ctrl = 0x44,
             .rsvdulp = 7,
             .qn = 3,
             .msn = ~0u,
             .mo = 12345},
        };
        for (size_t i = 0; i < 2; i++) {
                uint8_t buf[18];
                struct dw_ddp_hdr out;
                ssize_t n = dw_ddp_encode(&in[i], buf, sizeof(buf));

                cr_assert_gt(n, 0);
                cr_assert_eq(dw_ddp_decode(buf, (size_t)n, &out, NULL), n);
                cr_assert_eq(out.tagged, in[i].tagged);
                cr_assert_eq(out.last, in[i].last);
                cr_assert_eq(out.ulp_ctrl, in[i].ulp_ctrl);
                cr_assert_eq(out.stag, in[i].stag);
                cr_assert_eq(out.to, in[i].to);
                cr_assert_eq(out.rsvdulp, in[i].rsvdulp);
                cr_assert_eq(out.qn, in[i].qn);
                cr_assert_eq(out.msn, in[i].msn);
                cr_assert_eq(out.mo, in[i].mo);
        }
}

Test(ddp, encode_enospc)
{
        struct dw_ddp_hdr h = {.tagged = true};
        uint8_t buf[18];

        cr_assert_eq(dw_ddp_encode(&h, buf, 13), -ENOSPC);
        h.tagged = false;
        cr_assert_eq(dw_ddp_encode(&h, buf, 17), -ENOSPC);
        cr_assert_eq(dw_ddp_encode(&h, buf, 18), 18);
}

Test(ddp, reject_empty)
{
        const char *why = NULL;
        struct dw_ddp_hdr h;

        cr_assert_eq(dw_ddp_decode(tagged_bytes, 0, &h, &why), -ENODATA);
        cr_assert_not_null(why);
}

Test(ddp, reject_truncated_tagged)
{
        for (size_t len = 1; len < 14; len++) {
                const char *why = NULL;
                struct dw_ddp_hdr h;

                cr_assert_eq(dw_ddp_decode(tagged_bytes, len, &h, &why), -ENODATA, "len %zu", len);
                cr_assert_not_null(why);
        }
}

Test(ddp, reject_truncated_untagged)
{
        /* 14 bytes would be enough for a tagged header, not an untagged one. */
        for (size_t len = 1; len < 18; len++) {
                const char *why = NULL;
                struct dw_ddp_hdr h;

                cr_assert_eq(dw_ddp_decode(untagged_bytes, len, &h, &why), -ENODATA, "len %zu",
                             len);
                cr_assert_not_null(why);
        }
}

Test(ddp, reject_wrong_version)
{
        static const uint8_t dvs[] = {0x00, 0x02, 0x03};

        for (size_t i = 0; i < sizeof(dvs); i++) {
                uint8_t b[14];
                const char *why = NULL;
                struct dw_ddp_hdr h;

                memcpy(b, tagged_bytes, sizeof(b));
                b[0] = (uint8_t)((b[0] & ~DW_DDP_CTRL_DV) | dvs[i]);
                cr_assert_eq(dw_ddp_decode(b, sizeof(b), &h, &why), -EPROTO);
                cr_assert_not_null(why);
        }
}

Test(ddp, reject_reserved_bits)
{
        for (int bit = 2; bit < 6; bit++) {
                uint8_t b[18];
                const char *why = NULL;
                struct dw_ddp_hdr h;

                memcpy(b, untagged_bytes, sizeof(b));
                b[0] |= (uint8_t)(1u << bit);
                cr_assert_eq(dw_ddp_decode(b, sizeof(b), &h, &why), -EBADMSG, "bit %d", bit);
                cr_assert_not_null(why);
        }
}

Test(ddp, version_checked_before_length)
{
        /* A one-byte segment with DV=2 is a version error, not a truncation. */
        uint8_t b[1] = {0x82};
        const char *why = NULL;
        struct dw_ddp_hdr h;

        cr_assert_eq(dw_ddp_decode(b, 1, &h, &why), -EPROTO);
        cr_assert_not_null(why);
}

Test(ddp, why_may_be_null)
{
        uint8_t b[1] = {0x00};
        struct dw_ddp_hdr h;

        cr_assert_eq(dw_ddp_decode(b, 1, &h, NULL), -EPROTO);
}
