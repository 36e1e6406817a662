#include <criterion/criterion.h>
#include <string.h>

#include "wire/rdmap.h"

/* ---- opcode table (RFC 5040 RDMA Message Definitions, RFC 7306) ---- */

Test(rdmap_table, opcode_values)
{
        cr_assert_eq(DW_RDMAP_WRITE, 0);
        cr_assert_eq(DW_RDMAP_READ_REQ, 1);
        cr_assert_eq(DW_RDMAP_READ_RESP, 2);
        cr_assert_eq(DW_RDMAP_SEND, 3);
        cr_assert_eq(DW_RDMAP_SEND_INVAL, 4);
        cr_assert_eq(DW_RDMAP_SEND_SE, 5);
        cr_assert_eq(DW_RDMAP_SEND_SE_INVAL, 6);
        cr_assert_eq(DW_RDMAP_TERMINATE, 7);
        cr_assert_eq(DW_RDMAP_IMM_DATA, 8);
        cr_assert_eq(DW_RDMAP_IMM_DATA_SE, 9);
        cr_assert_eq(DW_RDMAP_ATOMIC_REQ, 10);
        cr_assert_eq(DW_RDMAP_ATOMIC_RESP, 11);
}

Test(rdmap_table, every_opcode)
{
        static const struct {
                bool tagged;
                uint32_t qn;
                bool single;
                bool inval;
                size_t ulp;
        } want[12] = {
            {true, 0, false, false, 0},  {false, 1, true, false, 28}, {true, 0, false, false, 0},
            {false, 0, false, false, 0}, {false, 0, false, true, 0},  {false, 0, false, false, 0},
            {false, 0, false, true, 0},  {false, 2, true, false, 4},  {false, 0, true, false, 8},
            {false, 0, true, false, 8},  {false, 1, true, false, 52}, {false, 3, true, false, 12},
        };
        for (unsigned op = 0; op < 12; op++) {
                const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(op);

                cr_assert_not_null(oi, "op %u", op);
                cr_assert_not_null(oi->name);
                cr_assert_eq(oi->tagged, want[op].tagged, "op %u", op);
                if (!oi->tagged)
                        cr_assert_eq(oi->qn, want[op].qn, "op %u", op);
                cr_assert_eq(oi->single_segment, want[op].single, "op %u", op);
                cr_assert_eq(oi->inval_stag, want[op].inval, "op %u", op);
                cr_assert_eq(oi->ulp_hdr_len, want[op].ulp, "op %u", op);
        }
        for (unsigned op = 12; op < 300; op++)
                cr_assert_null(dw_rdmap_opinfo(op), "op %u", op);
}

Test(rdmap_table, hdr_init)
{
        struct dw_rdmap_hdr h;

        cr_assert_eq(dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_RESP), 0);
        cr_assert_not(h.ddp.tagged);
        cr_assert_eq(h.ddp.qn, 3);
        cr_assert(h.ddp.last);
        cr_assert_eq(dw_rdmap_hdr_init(&h, DW_RDMAP_WRITE), 0);
        cr_assert(h.ddp.tagged);
        cr_assert_not(h.ddp.last);
        cr_assert_eq(dw_rdmap_hdr_init(&h, 12), -EINVAL);
}

/* ---- combined DDP + RDMAP control ---- */

/* RDMA Write, tagged, L=1: ctrl 0xc1, RDMAP ctrl RV=01 opcode 0000 -> 0x40. */
static const uint8_t write_bytes[] = {0xc1, 0x40, 0xca, 0xfe, 0xba, 0xbe, 0x00,
                                      0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00};

/* Send with SE and Invalidate, untagged, L=0, QN 0, MSN 5, MO 4096, Invalidate STag 0x01020304. */
static const uint8_t send_inv_bytes[] = {0x01, 0x46, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
                                         0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x10, 0x00};

Test(rdmap, encode_write_layout)
{
        struct dw_rdmap_hdr h;
        uint8_t buf[32];

        dw_rdmap_hdr_init(&h, DW_RDMAP_WRITE);
        h.ddp.last = true;
        h.ddp.stag = 0xcafebabe;
        h.ddp.to = 0x1000;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), 14);
        cr_assert_arr_eq(buf, write_bytes, sizeof(write_bytes));
}

Test(rdmap, encode_send_inval_layout)
{
        struct dw_rdmap_hdr h;
        uint8_t buf[32];

        dw_rdmap_hdr_init(&h, DW_RDMAP_SEND_SE_INVAL);
        h.ddp.msn = 5;
        h.ddp.mo = 4096;
        h.inval_stag = 0x01020304;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), 18);
        cr_assert_arr_eq(buf, send_inv_bytes, sizeof(send_inv_bytes));
}

Test(rdmap, encode_clears_rsvdulp_without_invalidate)
{
        struct dw_rdmap_hdr h;
        uint8_t buf[32];

        dw_rdmap_hdr_init(&h, DW_RDMAP_SEND);
        h.inval_stag = 0x99999999;
        h.ddp.rsvdulp = 0x12345678;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), 18);
        cr_assert_eq(buf[1], 0x43);
        cr_assert_eq(dw_get_be32(buf + 2), 0);
}

Test(rdmap, decode_write)
{
        struct dw_rdmap_hdr h;

        cr_assert_eq(dw_rdmap_decode(write_bytes, sizeof(write_bytes), &h, NULL), 14);
        cr_assert_eq(h.opcode, DW_RDMAP_WRITE);
        cr_assert(h.ddp.tagged);
        cr_assert(h.ddp.last);
        cr_assert_eq(h.ddp.stag, 0xcafebabe);
        cr_assert_eq(h.ddp.to, 0x1000);
        cr_assert_eq(h.inval_stag, 0);
}

Test(rdmap, decode_send_inval)
{
        struct dw_rdmap_hdr h;

        cr_assert_eq(dw_rdmap_decode(send_inv_bytes, sizeof(send_inv_bytes), &h, NULL), 18);
        cr_assert_eq(h.opcode, DW_RDMAP_SEND_SE_INVAL);
        cr_assert_eq(h.inval_stag, 0x01020304);
        cr_assert_eq(h.ddp.qn, 0);
        cr_assert_eq(h.ddp.msn, 5);
        cr_assert_eq(h.ddp.mo, 4096);
        cr_assert_not(h.ddp.last);
}

Test(rdmap, roundtrip_every_opcode)
{
        for (unsigned op = 0; op < 12; op++) {
                struct dw_rdmap_hdr in, out;
                uint8_t buf[32];

                cr_assert_eq(dw_rdmap_hdr_init(&in, op), 0);
                if (in.ddp.tagged) {
                        in.ddp.stag = 0x100 + op;
                        in.ddp.to = 0xffff000000000000ull + op;
                } else {
                        in.ddp.msn = 77 + op;
                }
                if (dw_rdmap_opinfo(op)->inval_stag)
                        in.inval_stag = 0xabcd0000 + op;
                ssize_t n = dw_rdmap_encode(&in, buf, sizeof(buf));

                cr_assert_eq(n, in.ddp.tagged ? 14 : 18, "op %u", op);
                cr_assert_eq(buf[1], 0x40 | op, "op %u", op);
                cr_assert_eq(dw_rdmap_decode(buf, (size_t)n, &out, NULL), n, "op %u", op);
                cr_assert_eq(out.opcode, op);
                cr_assert_eq(out.inval_stag, in.inval_stag);
                cr_assert_eq(out.ddp.tagged, in.ddp.tagged);
                cr_assert_eq(out.ddp.last, in.ddp.last);
                cr_assert_eq(out.ddp.qn, in.ddp.qn);
                cr_assert_eq(out.ddp.msn, in.ddp.msn);
                cr_assert_eq(out.ddp.stag, in.ddp.stag);
                cr_assert_eq(out.ddp.to, in.ddp.to);
        }
}

Test(rdmap, decode_propagates_ddp_errors)
{
        uint8_t b[18];
        const char *why = NULL;
        struct dw_rdmap_hdr h;

        memcpy(b, send_inv_bytes, sizeof(b));
        cr_assert_eq(dw_rdmap_decode(b, 17, &h, &why), -ENODATA);
        cr_assert_not_null(why);
        b[0] = 0x02;
        why = NULL;
        cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EPROTO);
        cr_assert_not_null(why);
        b[0] = 0x05;
        why = NULL;
        cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EBADMSG);
        cr_assert_not_null(why);
}

Test(rdmap, reject_rv)
{
        static const uint8_t rvs[] = {0x00, 0x80, 0xc0};

        for (size_t i = 0; i < sizeof(rvs); i++) {
                uint8_t b[14];
                const char *why = NULL;
                struct dw_rdmap_hdr h;

                memcpy(b, write_bytes, sizeof(b));
                b[1] = rvs[i];
                cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EPROTO);
                cr_assert_not_null(why);
        }
}

Test(rdmap, reject_control_reserved)
{
        static const uint8_t bits[] = {0x10, 0x20};

        for (size_t i = 0; i < sizeof(bits); i++) {
                uint8_t b[14];
                const char *why = NULL;
                struct dw_rdmap_hdr h;

                memcpy(b, write_bytes, sizeof(b));
                b[1] |= bits[i];
                cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EBADMSG);
                cr_assert_not_null(why);
        }
}

Test(rdmap, reject_unknown_opcode)
{
        for (unsigned op = 12; op < 16; op++) {
                uint8_t b[18];
                const char *why = NULL;
                struct dw_rdmap_hdr h;

                memcpy(b, send_inv_bytes, sizeof(b));
                b[0] = 0x41;
                b[1] = (uint8_t)(0x40 | op);
                cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EPROTO, "op %u", op);
                cr_assert_not_null(why);
        }
}

/* Builds a valid untagged (or tagged) segment for op, then lets the test break one field. */
static void make_seg(unsigned op, uint8_t *buf)
{
        struct dw_rdmap_hdr h;

        cr_assert_eq(dw_rdmap_hdr_init(&h, op), 0);
        cr_assert_gt(dw_rdmap_encode(&h, buf, 18), 0);
}

Test(rdmap, reject_wrong_t_flag_every_opcode)
{
        for (unsigned op = 0; op < 12; op++) {
                uint8_t b[18] = {0};
                const char *why = NULL;
                struct dw_rdmap_hdr h;
                bool tagged = dw_rdmap_opinfo(op)->tagged;

                /* Flip the model but keep the header long enough for either. */
                b[0] = (uint8_t)((tagged ? 0x00 : DW_DDP_CTRL_T) | DW_DDP_CTRL_L | 1);
                b[1] = (uint8_t)(0x40 | op);
                cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EBADMSG, "op %u", op);
                cr_assert_not_null(why);
        }
}

Test(rdmap, reject_wrong_qn_every_untagged_opcode)
{
        for (unsigned op = 0; op < 12; op++) {
                const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(op);

                if (oi->tagged)
                        continue;
                for (uint32_t qn = 0; qn < 6; qn++) {
                        uint8_t b[18];
                        const char *why = NULL;
                        struct dw_rdmap_hdr h;

                        make_seg(op, b);
                        dw_put_be32(b + 6, qn);
                        ssize_t r = dw_rdmap_decode(b, sizeof(b), &h, &why);

                        if (qn == oi->qn) {
                                cr_assert_eq(r, 18, "op %u qn %u", op, qn);
                        } else {
                                cr_assert_eq(r, -EBADMSG, "op %u qn %u", op, qn);
                                cr_assert_not_null(why);
                        }
                }
        }
}

Test(rdmap, single_segment_needs_last)
{
        for (unsigned op = 0; op < 12; op++) {
                const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(op);
                uint8_t b[18];
                const char *why = NULL;
                struct dw_rdmap_hdr h;

                make_seg(op, b);
                b[0] &= (uint8_t)~DW_DDP_CTRL_L;
                ssize_t r = dw_rdmap_decode(b, sizeof(b), &h, &why);

                if (oi->single_segment) {
                        cr_assert_eq(r, -EBADMSG, "op %u", op);
                        cr_assert_not_null(why);
                } else {
                        cr_assert_gt(r, 0, "op %u", op);
                }
        }
}

Test(rdmap, single_segment_needs_mo_zero)
{
        uint8_t b[18];
        const char *why = NULL;
        struct dw_rdmap_hdr h;

        make_seg(DW_RDMAP_READ_REQ, b);
        dw_put_be32(b + 14, 1);
        cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EBADMSG);
        cr_assert_not_null(why);
        make_seg(DW_RDMAP_SEND, b);
        dw_put_be32(b + 14, 1);
        cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, NULL), 18);
}

Test(rdmap, reject_rsvdulp_word_without_invalidate)
{
        uint8_t b[18];
        const char *why = NULL;
        struct dw_rdmap_hdr h;

        make_seg(DW_RDMAP_SEND, b);
        b[5] = 1;
        cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, &why), -EBADMSG);
        cr_assert_not_null(why);
        make_seg(DW_RDMAP_SEND_INVAL, b);
        b[5] = 1;
        cr_assert_eq(dw_rdmap_decode(b, sizeof(b), &h, NULL), 18);
        cr_assert_eq(h.inval_stag, 1);
}

Test(rdmap, encode_rejects_inconsistent)
{
        struct dw_rdmap_hdr h;
        uint8_t buf[32];

        dw_rdmap_hdr_init(&h, DW_RDMAP_SEND);
        h.opcode = 13;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), -EINVAL);
        dw_rdmap_hdr_init(&h, DW_RDMAP_SEND);
        h.ddp.tagged = true;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), -EINVAL);
        dw_rdmap_hdr_init(&h, DW_RDMAP_TERMINATE);
        h.ddp.qn = 0;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), -EINVAL);
        dw_rdmap_hdr_init(&h, DW_RDMAP_READ_REQ);
        h.ddp.last = false;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), -EINVAL);
        dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_REQ);
        h.ddp.mo = 8;
        cr_assert_eq(dw_rdmap_encode(&h, buf, sizeof(buf)), -EINVAL);
        dw_rdmap_hdr_init(&h, DW_RDMAP_SEND);
        cr_assert_eq(dw_rdmap_encode(&h, buf, 17), -ENOSPC);
}

/* ---- RDMA Read Request header (RFC 5040 section 4.4) ---- */

static const uint8_t rreq_bytes[28] = {
    0x11, 0x11, 0x11, 0x11,                         /* Data Sink STag */
    0x22, 0x22, 0x22, 0x22, 0x33, 0x33, 0x33, 0x33, /* Data Sink Tagged Offset */
    0x00, 0x01, 0x00, 0x00,                         /* RDMA Read Message Size */
    0x44, 0x44, 0x44, 0x44,                         /* Data Source STag */
    0x55, 0x55, 0x55, 0x55, 0x66, 0x66, 0x66, 0x66, /* Data Source Tagged Offset */
};

Test(rdmap_rreq, encode_layout)
{
        struct dw_rdmap_rreq r = {.sink_stag = 0x11111111,
                                  .sink_to = 0x2222222233333333ull,
                                  .rdma_rd_sz = 65536,
                                  .src_stag = 0x44444444,
                                  .src_to = 0x5555555566666666ull};
        uint8_t buf[28];

        cr_assert_eq(dw_rdmap_rreq_encode(&r, buf, sizeof(buf)), 28);
        cr_assert_arr_eq(buf, rreq_bytes, 28);
        cr_assert_eq(dw_rdmap_rreq_encode(&r, buf, 27), -ENOSPC);
}

Test(rdmap_rreq, decode_fields)
{
        struct dw_rdmap_rreq r;

        cr_assert_eq(dw_rdmap_rreq_decode(rreq_bytes, 28, &r, NULL), 28);
        cr_assert_eq(r.sink_stag, 0x11111111);
        cr_assert_eq(r.sink_to, 0x2222222233333333ull);
        cr_assert_eq(r.rdma_rd_sz, 65536);
        cr_assert_eq(r.src_stag, 0x44444444);
        cr_assert_eq(r.src_to, 0x5555555566666666ull);
}

Test(rdmap_rreq, reject_truncated)
{
        const char *why = NULL;
        struct dw_rdmap_rreq r;

        cr_assert_eq(dw_rdmap_rreq_decode(rreq_bytes, 27, &r, &why), -ENODATA);
        cr_assert_not_null(why);
}

/* ---- Terminate header (RFC 5040 section 4.8) ---- */

Test(rdmap_term, encode_control_only)
{
        struct dw_rdmap_term t = {.layer = DW_TERM_LAYER_RDMAP,
                                  .etype = DW_TERM_RDMAP_REMOTE_OPERATION,
                                  .ecode = DW_TERM_RDMAP_UNEXPECTED_OPCODE};
        uint8_t buf[8];
        static const uint8_t want[] = {0x02, 0x06, 0x00, 0x00};

        cr_assert_eq(dw_rdmap_term_encode(&t, buf, sizeof(buf)), 4);
        cr_assert_arr_eq(buf, want, 4);
}

/* DDP layer, untagged buffer error, invalid MSN / no buffer, M+D, carrying an untagged
 * DDP header of a Send; 4 + 2 + 18 bytes. */
static const uint8_t term_ddp_bytes[] = {
    0x12, 0x02, 0xc0, 0x00,                               /* Layer 1, EType 2, code 2, M D */
    0x00, 0x40,                                           /* DDP Segment Length 64 */
    0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* terminated DDP header ... */
    0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00,
};

Test(rdmap_term, decode_ddp_error_with_header)
{
        struct dw_rdmap_term t;

        cr_assert_eq(sizeof(term_ddp_bytes), 24);
        cr_assert_eq(dw_rdmap_term_decode(term_ddp_bytes, sizeof(term_ddp_bytes), &t, NULL), 24);
        cr_assert_eq(t.layer, DW_TERM_LAYER_DDP);
        cr_assert_eq(t.etype, DW_TERM_DDP_UNTAGGED);
        cr_assert_eq(t.ecode, DW_TERM_DDP_U_NO_BUFFER);
        cr_assert(t.seglen_valid);
        cr_assert(t.has_ddp_hdr);
        cr_assert_not(t.has_rdmap_hdr);
        cr_assert_eq(t.ddp_seg_len, 64);
        cr_assert_eq(t.ddp_hdr_len, 18);
        cr_assert_arr_eq(t.ddp_hdr, term_ddp_bytes + 6, 18);

        uint8_t buf[DW_RDMAP_TERM_MAX_LEN];

        cr_assert_eq(dw_rdmap_term_encode(&t, buf, sizeof(buf)), 24);
        cr_assert_arr_eq(buf, term_ddp_bytes, 24);
}

Test(rdmap_term, roundtrip_read_request_error)
{
        /* Invalid STag in an RDMA Read Request: M D R, tagged-length check on the
         * carried untagged header, then the 28-byte Read Request header. */
        struct dw_rdmap_term t = {.layer = DW_TERM_LAYER_RDMAP,
                                  .etype = DW_TERM_RDMAP_REMOTE_PROTECTION,
                                  .ecode = DW_TERM_RDMAP_INVALID_STAG,
                                  .seglen_valid = true,
                                  .has_ddp_hdr = true,
                                  .has_rdmap_hdr = true,
                                  .ddp_seg_len = 46,
                                  .ddp_hdr_len = 18};
        t.ddp_hdr[0] = 0x41;
        t.ddp_hdr[1] = 0x41;
        memcpy(t.rdmap_hdr, rreq_bytes, 28);
        uint8_t buf[DW_RDMAP_TERM_MAX_LEN];

        cr_assert_eq(dw_rdmap_term_encode(&t, buf, sizeof(buf)), 52);
        cr_assert_eq(buf[0], 0x01);
        cr_assert_eq(buf[1], 0x00);
        cr_assert_eq(buf[2], 0xe0);
        cr_assert_eq(buf[3], 0x00);
        cr_assert_eq(dw_get_be16(buf + 4), 46);
        cr_assert_arr_eq(buf + 24, rreq_bytes, 28);

        struct dw_rdmap_term o;

        cr_assert_eq(dw_rdmap_term_decode(buf, 52, &o, NULL), 52);
        cr_assert_eq(o.layer, t.layer);
        cr_assert_eq(o.etype, t.etype);
        cr_assert_eq(o.ecode, t.ecode);
        cr_assert(o.has_rdmap_hdr);
        cr_assert_arr_eq(o.rdmap_hdr, rreq_bytes, 28);
}

Test(rdmap_term, carried_tagged_header_is_14)
{
        uint8_t b[4 + 2 + 14];

        memset(b, 0, sizeof(b));
        b[0] = 0x11; /* DDP, tagged buffer error */
        b[2] = DW_TERM_HDRCT_D;
        b[6] = 0xc1;
        struct dw_rdmap_term t;

        cr_assert_eq(dw_rdmap_term_decode(b, sizeof(b), &t, NULL), 20);
        cr_assert_eq(t.ddp_hdr_len, 14);
        cr_assert_not(t.seglen_valid);
}

Test(rdmap_term, carried_header_may_be_malformed)
{
        /* DV = 3 and reserved bits in the carried header: still carried as is. */
        uint8_t b[4 + 2 + 18] = {0x12, 0x06, 0x40, 0x00, 0x00, 0x12, 0x3f};
        struct dw_rdmap_term t;

        cr_assert_eq(dw_rdmap_term_decode(b, sizeof(b), &t, NULL), 24);
        cr_assert_eq(t.ddp_hdr[0], 0x3f);
}

Test(rdmap_term, m_alone_carries_length)
{
        uint8_t b[6] = {0x20, 0x02, 0x80, 0x00, 0x01, 0x00};
        struct dw_rdmap_term t;

        cr_assert_eq(dw_rdmap_term_decode(b, sizeof(b), &t, NULL), 6);
        cr_assert_eq(t.layer, DW_TERM_LAYER_LLP);
        cr_assert_eq(t.ecode, DW_TERM_LLP_CRC);
        cr_assert_eq(t.ddp_seg_len, 256);
}

Test(rdmap_term, reject_truncations)
{
        static const size_t lens[] = {0, 3, 5, 6, 23};

        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
                const char *why = NULL;
                struct dw_rdmap_term t;

                cr_assert_eq(dw_rdmap_term_decode(term_ddp_bytes, lens[i], &t, &why), -ENODATA,
                             "len %zu", lens[i]);
                cr_assert_not_null(why);
        }
        uint8_t b[4 + 2 + 18 + 27] = {0x00, 0x00, 0xe0, 0x00, 0, 0, 0x41};
        const char *why = NULL;
        struct dw_rdmap_term t;

        cr_assert_eq(dw_rdmap_term_decode(b, sizeof(b), &t, &why), -ENODATA);
        cr_assert_not_null(why);
}

Test(rdmap_term, reject_unknown_layer)
{
        for (unsigned layer = 3; layer < 16; layer++) {
                uint8_t b[4] = {(uint8_t)(layer << 4), 0, 0, 0};
                const char *why = NULL;
                struct dw_rdmap_term t;

                cr_assert_eq(dw_rdmap_term_decode(b, 4, &t, &why), -EPROTO, "layer %u", layer);
                cr_assert_not_null(why);
        }
}

Test(rdmap_term, reject_reserved_bits)
{
        for (int bit = 0; bit < 13; bit++) {
                uint8_t b[4] = {0, 0, 0, 0};
                const char *why = NULL;
                struct dw_rdmap_term t;

                /* Reserved bits are the low 13 of bytes 2-3. */
                uint16_t v = (uint16_t)(1u << bit);

                b[2] = (uint8_t)(v >> 8);
                b[3] = (uint8_t)v;
                cr_assert_eq(dw_rdmap_term_decode(b, 4, &t, &why), -EBADMSG, "bit %d", bit);
                cr_assert_not_null(why);
        }
}

Test(rdmap_term, encode_rejects)
{
        struct dw_rdmap_term t = {.layer = 3};
        uint8_t buf[DW_RDMAP_TERM_MAX_LEN];

        cr_assert_eq(dw_rdmap_term_encode(&t, buf, sizeof(buf)), -EINVAL);
        t.layer = 0;
        t.etype = 16;
        cr_assert_eq(dw_rdmap_term_encode(&t, buf, sizeof(buf)), -EINVAL);
        t.etype = 0;
        t.has_ddp_hdr = true;
        t.ddp_hdr[0] = 0xc1; /* tagged: must be 14 */
        t.ddp_hdr_len = 18;
        cr_assert_eq(dw_rdmap_term_encode(&t, buf, sizeof(buf)), -EINVAL);
        t.ddp_hdr_len = 14;
        cr_assert_eq(dw_rdmap_term_encode(&t, buf, 19), -ENOSPC);
        cr_assert_eq(dw_rdmap_term_encode(&t, buf, 20), 20);
}

Test(rdmap_term, error_code_values)
{
        cr_assert_eq(DW_TERM_RDMAP_STAG_NOT_ON_STREAM, 0x03);
        cr_assert_eq(DW_TERM_RDMAP_CATASTROPHIC_GLOBAL, 0x08);
        cr_assert_eq(DW_TERM_RDMAP_UNSPECIFIED, 0xff);
        cr_assert_eq(DW_TERM_DDP_T_INVALID_VERSION, 0x04);
        cr_assert_eq(DW_TERM_DDP_U_MSG_TOO_LONG, 0x05);
        cr_assert_eq(DW_TERM_DDP_U_INVALID_VERSION, 0x06);
        cr_assert_eq(DW_TERM_LLP_NO_RTR, 0x07);
}

/* ---- RFC 7306 headers ---- */

Test(rdmap_imm, layout_and_roundtrip)
{
        struct dw_rdmap_imm in = {.data = {1, 2, 3, 4, 5, 6, 7, 8}}, out;
        uint8_t buf[8];

        cr_assert_eq(dw_rdmap_imm_encode(&in, buf, sizeof(buf)), 8);
        cr_assert_arr_eq(buf, in.data, 8);
        cr_assert_eq(dw_rdmap_imm_decode(buf, 8, &out, NULL), 8);
        cr_assert_arr_eq(out.data, in.data, 8);
        cr_assert_eq(dw_rdmap_imm_encode(&in, buf, 7), -ENOSPC);

        const char *why = NULL;

        cr_assert_eq(dw_rdmap_imm_decode(buf, 7, &out, &why), -ENODATA);
        cr_assert_not_null(why);
}

static const uint8_t atomic_req_bytes[52] = {
    0x00, 0x00, 0x00, 0x02,                         /* reserved 28 | AOpCode CmpSwap */
    0x00, 0x00, 0x00, 0x2a,                         /* Request Identifier */
    0xaa, 0xbb, 0xcc, 0xdd,                         /* Remote STag */
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, /* Remote Tagged Offset */
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, /* Add or Swap Data */
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* Add or Swap Mask */
    0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, /* Compare Data */
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, /* Compare Mask */
};

Test(rdmap_atomic, request_encode_layout)
{
        struct dw_rdmap_atomic_req r = {.aopcode = DW_ATOMIC_CMP_SWAP,
                                        .req_id = 42,
                                        .remote_stag = 0xaabbccdd,
                                        .remote_to = 0x00007f0000001000ull,
                                        .add_swap_data = 0x0101010101010101ull,
                                        .add_swap_mask = ~0ull,
                                        .compare_data = 0x0202020202020202ull,
                                        .compare_mask = 0xffffffff00000000ull};
        uint8_t buf[52];

        cr_assert_eq(dw_rdmap_atomic_req_encode(&r, buf, sizeof(buf)), 52);
        cr_assert_arr_eq(buf, atomic_req_bytes, 52);
        cr_assert_eq(dw_rdmap_atomic_req_encode(&r, buf, 51), -ENOSPC);
        r.aopcode = 3;
        cr_assert_eq(dw_rdmap_atomic_req_encode(&r, buf, sizeof(buf)), -EINVAL);
}

Test(rdmap_atomic, request_decode_fields)
{
        struct dw_rdmap_atomic_req r;

        cr_assert_eq(dw_rdmap_atomic_req_decode(atomic_req_bytes, 52, &r, NULL), 52);
        cr_assert_eq(r.aopcode, DW_ATOMIC_CMP_SWAP);
        cr_assert_eq(r.req_id, 42);
        cr_assert_eq(r.remote_stag, 0xaabbccdd);
        cr_assert_eq(r.remote_to, 0x00007f0000001000ull);
        cr_assert_eq(r.add_swap_data, 0x0101010101010101ull);
        cr_assert_eq(r.add_swap_mask, ~0ull);
        cr_assert_eq(r.compare_data, 0x0202020202020202ull);
        cr_assert_eq(r.compare_mask, 0xffffffff00000000ull);
}

Test(rdmap_atomic, aopcode_values)
{
        cr_assert_eq(DW_ATOMIC_FETCH_ADD, 0);
        cr_assert_eq(DW_ATOMIC_SWAP, 1);
        cr_assert_eq(DW_ATOMIC_CMP_SWAP, 2);
        for (unsigned op = 0; op < 16; op++) {
                uint8_t b[52];
                struct dw_rdmap_atomic_req r;
                const char *why = NULL;

                memcpy(b, atomic_req_bytes, 52);
                b[3] = (uint8_t)op;
                ssize_t n = dw_rdmap_atomic_req_decode(b, 52, &r, &why);

                if (op <= 2) {
                        cr_assert_eq(n, 52);
                        cr_assert_eq(r.aopcode, op);
                } else {
                        cr_assert_eq(n, -EPROTO, "aopcode %u", op);
                        cr_assert_not_null(why);
                }
        }
}

Test(rdmap_atomic, request_rejects)
{
        uint8_t b[52];
        struct dw_rdmap_atomic_req r;
        const char *why = NULL;

        cr_assert_eq(dw_rdmap_atomic_req_decode(atomic_req_bytes, 51, &r, &why), -ENODATA);
        cr_assert_not_null(why);
        for (int bit = 4; bit < 32; bit++) {
                memcpy(b, atomic_req_bytes, 52);
                dw_put_be32(b, 2u | (1u << bit));
                why = NULL;
                cr_assert_eq(dw_rdmap_atomic_req_decode(b, 52, &r, &why), -EBADMSG, "bit %d", bit);
                cr_assert_not_null(why);
        }
}

Test(rdmap_atomic, response_layout_and_rejects)
{
        static const uint8_t want[12] = {0x00, 0x00, 0x00, 0x2a, 0x80, 0x00,
                                         0x00, 0x00, 0x00, 0x00, 0x00, 0x01};
        struct dw_rdmap_atomic_resp r = {.req_id = 42, .orig_data = 0x8000000000000001ull}, o;
        uint8_t buf[12];

        cr_assert_eq(dw_rdmap_atomic_resp_encode(&r, buf, sizeof(buf)), 12);
        cr_assert_arr_eq(buf, want, 12);
        cr_assert_eq(dw_rdmap_atomic_resp_decode(want, 12, &o, NULL), 12);
        cr_assert_eq(o.req_id, 42);
        cr_assert_eq(o.orig_data, 0x8000000000000001ull);
        cr_assert_eq(dw_rdmap_atomic_resp_encode(&r, buf, 11), -ENOSPC);

        const char *why = NULL;

        cr_assert_eq(dw_rdmap_atomic_resp_decode(want, 11, &o, &why), -ENODATA);
        cr_assert_not_null(why);
}

/* A whole Atomic Request segment: DDP/RDMAP untagged header on QN 1 + 52 bytes. */
Test(rdmap_atomic, full_segment)
{
        struct dw_rdmap_hdr h;
        uint8_t seg[18 + 52];

        dw_rdmap_hdr_init(&h, DW_RDMAP_ATOMIC_REQ);
        h.ddp.msn = 9;
        cr_assert_eq(dw_rdmap_encode(&h, seg, sizeof(seg)), 18);
        memcpy(seg + 18, atomic_req_bytes, 52);
        static const uint8_t hdr[18] = {0x41, 0x4a, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 0};

        cr_assert_arr_eq(seg, hdr, 18);

        struct dw_rdmap_hdr o;
        struct dw_rdmap_atomic_req r;
        ssize_t n = dw_rdmap_decode(seg, sizeof(seg), &o, NULL);

        cr_assert_eq(n, 18);
        cr_assert_eq(o.opcode, DW_RDMAP_ATOMIC_REQ);
        cr_assert_eq(dw_rdmap_atomic_req_decode(seg + n, sizeof(seg) - (size_t)n, &r, NULL), 52);
        cr_assert_eq(r.req_id, 42);
}
