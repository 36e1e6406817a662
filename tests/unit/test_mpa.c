/* MPA FPDU framing and request/reply frames against hand-written RFC 5044 /
 * RFC 6581 byte layouts. CRC values here come from an independent bit-by-bit
 * CRC32c computation, not from the code under test. */
#include <criterion/criterion.h>
#include <string.h>

#include "wire/crc32c.h"
#include "wire/mpa.h"

/* ---- FPDU ---------------------------------------------------------------- */

Test(mpa_fpdu, pad_lengths)
{
        /* Pad makes ULPDU_Length(2) + ULPDU + pad a multiple of 4. */
        const size_t want[] = {2, 1, 0, 3, 2, 1, 0, 3, 2};
        for (size_t n = 0; n < 9; n++)
                cr_assert_eq(dw_mpa_pad_len(n), want[n], "ulpdu %zu", n);
        cr_assert_eq(dw_mpa_pad_len(65535), 3);
        cr_assert_eq(dw_mpa_pad_len(65534), 0);
}

Test(mpa_fpdu, fpdu_lengths_include_crc_field_always)
{
        cr_assert_eq(dw_mpa_fpdu_len(0, true), 8);
        cr_assert_eq(dw_mpa_fpdu_len(1, true), 8);
        cr_assert_eq(dw_mpa_fpdu_len(2, true), 8);
        cr_assert_eq(dw_mpa_fpdu_len(3, true), 12);
        cr_assert_eq(dw_mpa_fpdu_len(5, true), 12);
        cr_assert_eq(dw_mpa_fpdu_len(6, true), 12);
        cr_assert_eq(dw_mpa_fpdu_len(7, true), 16);
        /* RFC 5044 4.1: the CRC field is present even without CRC. */
        for (size_t n = 0; n < 40; n++) {
                cr_assert_eq(dw_mpa_fpdu_len(n, false), dw_mpa_fpdu_len(n, true));
                cr_assert_eq(dw_mpa_fpdu_len(n, true) % 4, 0);
        }
}

static const uint8_t ulpdu5[5] = {0x01, 0x02, 0x03, 0x04, 0x05};

/* ULPDU_Length 0x0005, ULPDU, 1 pad byte, CRC32c(00 05 01 02 03 04 05 00) =
 * 0x7F0D3B5A sent as 5a 3b 0d 7f. */
static const uint8_t fpdu5_crc[12] = {0x00, 0x05, 0x01, 0x02, 0x03, 0x04,
                                      0x05, 0x00, 0x5a, 0x3b, 0x0d, 0x7f};
static const uint8_t fpdu5_nocrc[12] = {0x00, 0x05, 0x01, 0x02, 0x03, 0x04,
                                        0x05, 0x00, 0x00, 0x00, 0x00, 0x00};

/* MULPDU from the effective MSS (RFC 5044): the whole FPDU of a MULPDU-sized
 * ULPDU is exactly the MSS rounded down to 4, so a full FPDU fills a segment. */
Test(mpa_fpdu, mulpdu_from_mss)
{
        const struct {
                uint32_t mss, mulpdu;
        } v[] = {
            {1448, 1442},    /* Ethernet MTU 1500 with TCP timestamps */
            {1460, 1454},    /* Ethernet MTU 1500 without options */
            {1449, 1442},    /* not a multiple of 4: the FPDU stays in the segment */
            {8948, 8942},    /* jumbo frames, MTU 9000 with timestamps */
            {65483, 65474},  /* loopback (MTU 65536) */
            {70000, 0xFFFF}, /* ULPDU_Length is 16 bits */
            {8, 2},          {7, 0}, {0, 0},
        };
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
                uint32_t u = dw_mpa_mulpdu(v[i].mss);
                cr_assert_eq(u, v[i].mulpdu, "MSS %u: MULPDU %u, want %u", v[i].mss, u,
                             v[i].mulpdu);
                if (u && u < 0xFFFF) {
                        cr_assert_eq(dw_mpa_fpdu_len(u, true), v[i].mss & ~3u, "MSS %u", v[i].mss);
                        cr_assert_gt(dw_mpa_fpdu_len(u + 1, true), v[i].mss, "MSS %u", v[i].mss);
                }
        }
}

Test(mpa_fpdu, crc_vector_both_backends)
{
        cr_assert_eq(dw_crc32c(fpdu5_crc, 8), 0x7F0D3B5Au);
        cr_assert_eq(dw_crc32c_final(dw_crc32c_update_portable(dw_crc32c_init(), fpdu5_crc, 8)),
                     0x7F0D3B5Au);
}

Test(mpa_fpdu, encode_exact_bytes_crc)
{
        uint8_t buf[16];
        memset(buf, 0xee, sizeof(buf));
        cr_assert_eq(dw_mpa_fpdu_encode(ulpdu5, 5, true, buf, sizeof(buf)), 12);
        cr_assert_arr_eq(buf, fpdu5_crc, 12);
        cr_assert_eq(buf[12], 0xee, "wrote past the FPDU");
}

Test(mpa_fpdu, encode_exact_bytes_nocrc)
{
        uint8_t buf[12];
        memset(buf, 0xee, sizeof(buf));
        cr_assert_eq(dw_mpa_fpdu_encode(ulpdu5, 5, false, buf, sizeof(buf)), 12);
        cr_assert_arr_eq(buf, fpdu5_nocrc, 12);
}

Test(mpa_fpdu, encode_more_vectors)
{
        /* Empty ULPDU: 00 00, two pad bytes, CRC32c(00 00 00 00) = 0x48674BC7. */
        const uint8_t want0[8] = {0x00, 0x00, 0x00, 0x00, 0xc7, 0x4b, 0x67, 0x48};
        /* Two-byte ULPDU de ad: no pad, CRC32c(00 02 de ad) = 0xD5A1BF49. */
        const uint8_t want2[8] = {0x00, 0x02, 0xde, 0xad, 0x49, 0xbf, 0xa1, 0xd5};
        const uint8_t dead[2] = {0xde, 0xad};
        uint8_t buf[8];
        cr_assert_eq(dw_mpa_fpdu_encode(NULL, 0, true, buf, sizeof(buf)), 8);
        cr_assert_arr_eq(buf, want0, 8);
        cr_assert_eq(dw_mpa_fpdu_encode(dead, 2, true, buf, sizeof(buf)), 8);
        cr_assert_arr_eq(buf, want2, 8);
}

Test(mpa_fpdu, encode_in_place)
{
        uint8_t buf[12] = {0};
        memcpy(buf + 2, ulpdu5, 5);
        cr_assert_eq(dw_mpa_fpdu_encode(buf + 2, 5, true, buf, sizeof(buf)), 12);
        cr_assert_arr_eq(buf, fpdu5_crc, 12);
}

Test(mpa_fpdu, gather_header_iov_trailer)
{
        uint8_t hdr[2], trailer[DW_MPA_TRAILER_MAX];
        cr_assert_eq(dw_mpa_fpdu_hdr_encode(5, hdr, sizeof(hdr)), 2);
        cr_assert_eq(hdr[0], 0x00);
        cr_assert_eq(hdr[1], 0x05);
        struct iovec iov[2] = {{.iov_base = (void *)ulpdu5, .iov_len = 2},
                               {.iov_base = (void *)(ulpdu5 + 2), .iov_len = 3}};
        uint32_t s = dw_crc32c_update(dw_crc32c_init(), hdr, 2);
        s = dw_crc32c_update_iov(s, iov, 2);
        cr_assert_eq(dw_mpa_fpdu_trailer(trailer, 5, s, true), 5);
        cr_assert_arr_eq(trailer, fpdu5_crc + 7, 5);
        cr_assert_eq(dw_mpa_fpdu_trailer(trailer, 5, s, false), 5);
        cr_assert_arr_eq(trailer, fpdu5_nocrc + 7, 5);
        cr_assert_eq(dw_mpa_fpdu_trailer(trailer, 6, s, false), 4);
        cr_assert_eq(dw_mpa_fpdu_trailer(trailer, 7, s, false), 7);
}

Test(mpa_fpdu, encode_errors)
{
        uint8_t buf[16];
        cr_assert_eq(dw_mpa_fpdu_encode(ulpdu5, 5, true, buf, 11), -ENOSPC);
        cr_assert_eq(dw_mpa_fpdu_encode(ulpdu5, 65536, true, buf, sizeof(buf)), -EINVAL);
        cr_assert_eq(dw_mpa_fpdu_encode(NULL, 5, true, buf, sizeof(buf)), -EINVAL);
        cr_assert_eq(dw_mpa_fpdu_hdr_encode(5, buf, 1), -ENOSPC);
        cr_assert_eq(dw_mpa_fpdu_hdr_encode(65536, buf, 2), -EINVAL);
        cr_assert_eq(dw_mpa_fpdu_hdr_encode(65535, buf, 2), 2);
        cr_assert_eq(buf[0], 0xff);
        cr_assert_eq(buf[1], 0xff);
        cr_assert_eq(dw_mpa_fpdu_trailer(buf, 65536, 0, true), -EINVAL);
}

Test(mpa_fpdu, decode_ok)
{
        struct dw_mpa_fpdu f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_fpdu_decode(fpdu5_crc, 12, true, 100, &f, &why), 12);
        cr_assert_eq(f.ulpdu, fpdu5_crc + 2);
        cr_assert_eq(f.ulpdu_len, 5);
        cr_assert_eq(f.pad_len, 1);
        cr_assert_eq(f.crc, 0x7F0D3B5Au);
        cr_assert_eq(f.need, 12);
        cr_assert_null(why);
}

Test(mpa_fpdu, decode_without_crc_ignores_crc_field)
{
        struct dw_mpa_fpdu f;
        uint8_t b[12];
        memcpy(b, fpdu5_nocrc, 12);
        b[8] = 0x12; /* "may contain any value, and MUST NOT be checked" */
        cr_assert_eq(dw_mpa_fpdu_decode(b, 12, false, 100, &f, NULL), 12);
        cr_assert_eq(f.ulpdu_len, 5);
}

Test(mpa_fpdu, decode_accepts_nonzero_pad)
{
        /* RFC 5044: the receiver ignores pad contents except for the CRC. */
        uint8_t b[12];
        memcpy(b, fpdu5_nocrc, 12);
        b[7] = 0xa5;
        struct dw_mpa_fpdu f;
        cr_assert_eq(dw_mpa_fpdu_decode(b, 12, false, 100, &f, NULL), 12);
        uint32_t c = dw_crc32c(b, 8);
        b[8] = (uint8_t)c;
        b[9] = (uint8_t)(c >> 8);
        b[10] = (uint8_t)(c >> 16);
        b[11] = (uint8_t)(c >> 24);
        cr_assert_eq(dw_mpa_fpdu_decode(b, 12, true, 100, &f, NULL), 12);
}

Test(mpa_fpdu, decode_truncated_reports_need)
{
        struct dw_mpa_fpdu f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_fpdu_decode(fpdu5_crc, 0, true, 100, &f, &why), -ENODATA);
        cr_assert_not_null(why);
        cr_assert_eq(f.need, 2);
        why = NULL;
        cr_assert_eq(dw_mpa_fpdu_decode(fpdu5_crc, 1, true, 100, &f, &why), -ENODATA);
        cr_assert_not_null(why);
        cr_assert_eq(f.need, 2);
        for (size_t n = 2; n < 12; n++) {
                why = NULL;
                cr_assert_eq(dw_mpa_fpdu_decode(fpdu5_crc, n, true, 100, &f, &why), -ENODATA);
                cr_assert_not_null(why);
                cr_assert_eq(f.need, 12, "len %zu", n);
        }
}

Test(mpa_fpdu, decode_oversized)
{
        struct dw_mpa_fpdu f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_fpdu_decode(fpdu5_crc, 12, true, 4, &f, &why), -EMSGSIZE);
        cr_assert_not_null(why);
        cr_assert_eq(dw_mpa_fpdu_decode(fpdu5_crc, 12, true, 5, &f, NULL), 12);
}

Test(mpa_fpdu, decode_crc_mismatch_every_byte)
{
        /* Any byte of header, ULPDU, pad or CRC flipped must be caught; a
         * flipped length byte changes the frame size, so skip byte 0/1 here. */
        for (size_t i = 2; i < 12; i++) {
                uint8_t b[12];
                memcpy(b, fpdu5_crc, 12);
                b[i] ^= 0x01;
                struct dw_mpa_fpdu f;
                const char *why = NULL;
                cr_assert_eq(dw_mpa_fpdu_decode(b, 12, true, 100, &f, &why), -EILSEQ, "byte %zu",
                             i);
                cr_assert_not_null(why);
        }
}

Test(mpa_fpdu, decode_crc_covers_length_field)
{
        /* Same total size (ULPDU 5 -> 6 keeps 12 bytes) but a different
         * ULPDU_Length: the CRC covers the header, so this is caught. */
        uint8_t b[12];
        memcpy(b, fpdu5_crc, 12);
        b[1] = 0x06;
        struct dw_mpa_fpdu f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_fpdu_decode(b, 12, true, 100, &f, &why), -EILSEQ);
        cr_assert_not_null(why);
}

Test(mpa_fpdu, decode_stream_of_two)
{
        uint8_t s[24];
        memcpy(s, fpdu5_crc, 12);
        memcpy(s + 12, fpdu5_crc, 12);
        struct dw_mpa_fpdu f;
        cr_assert_eq(dw_mpa_fpdu_decode(s, sizeof(s), true, 100, &f, NULL), 12);
        cr_assert_eq(dw_mpa_fpdu_decode(s + 12, sizeof(s) - 12, true, 100, &f, NULL), 12);
        cr_assert_eq(f.ulpdu, s + 14);
}

Test(mpa_fpdu, peek)
{
        size_t ul = 0;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_fpdu_peek(fpdu5_crc, 2, 100, &ul, &why), 12);
        cr_assert_eq(ul, 5);
        cr_assert_eq(dw_mpa_fpdu_peek(fpdu5_crc, 2, 100, NULL, NULL), 12);
        cr_assert_eq(dw_mpa_fpdu_peek(fpdu5_crc, 1, 100, &ul, &why), -ENODATA);
        cr_assert_not_null(why);
        why = NULL;
        cr_assert_eq(dw_mpa_fpdu_peek(fpdu5_crc, 2, 4, &ul, &why), -EMSGSIZE);
        cr_assert_not_null(why);
        const uint8_t big[2] = {0xff, 0xff};
        cr_assert_eq(dw_mpa_fpdu_peek(big, 2, 65535, &ul, NULL), 2 + 65535 + 3 + 4);
}

/* ---- request / reply frames ------------------------------------------------ */

#define KEY_REQ                                                                                    \
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,  \
            0x65
#define KEY_REP                                                                                    \
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,  \
            0x65

/* Rev 1 request, C set, PD "abc". */
static const uint8_t req_v1[23] = {KEY_REQ, 0x40, 0x01, 0x00, 0x03, 'a', 'b', 'c'};
/* Rev 2 reply, C and R set; P2P, IRD 0x10; RTR read, ORD 0x3fff; PD "hi". */
static const uint8_t rep_v2[26] = {KEY_REP, 0x60, 0x02, 0x00, 0x06, 0x80,
                                   0x10,    0x7f, 0xff, 'h',  'i'};
/* Rev 2 request, M set, no ULP private data; RTR send, IRD 1; RTR write+read, ORD 2. */
static const uint8_t req_v2[24] = {KEY_REQ, 0x80, 0x02, 0x00, 0x04, 0x40, 0x01, 0xc0, 0x02};

Test(mpa_frame, keys_are_the_rfc_strings)
{
        cr_assert_arr_eq(dw_mpa_key_req, "MPA ID Req Frame", 16);
        cr_assert_arr_eq(dw_mpa_key_rep, "MPA ID Rep Frame", 16);
}

Test(mpa_frame, encode_request_v1)
{
        struct dw_mpa_frame f = {.crc = true,
                                 .revision = 1,
                                 .private_data = (const uint8_t *)"abc",
                                 .private_data_len = 3};
        uint8_t buf[64];
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), 23);
        cr_assert_arr_eq(buf, req_v1, 23);
}

Test(mpa_frame, encode_reply_v2)
{
        struct dw_mpa_frame f = {.is_reply = true,
                                 .crc = true,
                                 .reject = true,
                                 .revision = 2,
                                 .enhanced = true,
                                 .ird = 0x10,
                                 .ord = 0x3fff,
                                 .peer2peer = true,
                                 .rtr_read = true,
                                 .private_data = (const uint8_t *)"hi",
                                 .private_data_len = 2};
        uint8_t buf[64];
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), 26);
        cr_assert_arr_eq(buf, rep_v2, 26);
}

Test(mpa_frame, encode_request_v2_flags)
{
        struct dw_mpa_frame f = {.markers = true,
                                 .revision = 2,
                                 .enhanced = true,
                                 .ird = 1,
                                 .ord = 2,
                                 .rtr_send = true,
                                 .rtr_write = true,
                                 .rtr_read = true};
        uint8_t buf[24];
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), 24);
        cr_assert_arr_eq(buf, req_v2, 24);
}

Test(mpa_frame, decode_request_v1)
{
        struct dw_mpa_frame f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_frame_decode(req_v1, sizeof(req_v1), &f, &why), 23);
        cr_assert_null(why);
        cr_assert_not(f.is_reply);
        cr_assert_not(f.markers);
        cr_assert(f.crc);
        cr_assert_not(f.reject);
        cr_assert_eq(f.revision, 1);
        cr_assert_not(f.enhanced);
        cr_assert_eq(f.ird, 0);
        cr_assert_eq(f.ord, 0);
        cr_assert_eq(f.private_data, req_v1 + 20);
        cr_assert_eq(f.private_data_len, 3);
}

Test(mpa_frame, decode_reply_v2)
{
        struct dw_mpa_frame f;
        cr_assert_eq(dw_mpa_frame_decode(rep_v2, sizeof(rep_v2), &f, NULL), 26);
        cr_assert(f.is_reply);
        cr_assert(f.crc);
        cr_assert(f.reject);
        cr_assert_not(f.markers);
        cr_assert_eq(f.revision, 2);
        cr_assert(f.enhanced);
        cr_assert(f.peer2peer);
        cr_assert_not(f.rtr_send);
        cr_assert_not(f.rtr_write);
        cr_assert(f.rtr_read);
        cr_assert_eq(f.ird, 0x10);
        cr_assert_eq(f.ord, 0x3fff);
        cr_assert_eq(f.private_data, rep_v2 + 24);
        cr_assert_eq(f.private_data_len, 2);
}

Test(mpa_frame, decode_request_v2_markers_parsed)
{
        struct dw_mpa_frame f;
        cr_assert_eq(dw_mpa_frame_decode(req_v2, sizeof(req_v2), &f, NULL), 24);
        cr_assert(f.markers);
        cr_assert_not(f.crc);
        cr_assert_not(f.peer2peer);
        cr_assert(f.rtr_send);
        cr_assert(f.rtr_write);
        cr_assert(f.rtr_read);
        cr_assert_eq(f.ird, 1);
        cr_assert_eq(f.ord, 2);
        cr_assert_null(f.private_data);
        cr_assert_eq(f.private_data_len, 0);
}

Test(mpa_frame, decode_trailing_bytes_not_consumed)
{
        uint8_t b[30];
        memcpy(b, req_v1, 23);
        memset(b + 23, 0x77, 7);
        struct dw_mpa_frame f;
        cr_assert_eq(dw_mpa_frame_decode(b, sizeof(b), &f, NULL), 23);
}

static void expect_decode_err(const uint8_t *b, size_t len, int err)
{
        struct dw_mpa_frame f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_frame_decode(b, len, &f, &why), -err);
        cr_assert_not_null(why);
}

Test(mpa_frame, reject_wrong_key)
{
        uint8_t b[23];
        memcpy(b, req_v1, 23);
        b[9] = 'x'; /* "MPA ID Rxq Frame" */
        expect_decode_err(b, 23, EPROTO);
        /* A wrong prefix is refused before 20 bytes have arrived. */
        expect_decode_err((const uint8_t *)"GET /", 5, EPROTO);
        b[15] = 'E';
        b[9] = 'q';
        expect_decode_err(b, 23, EPROTO);
}

Test(mpa_frame, reject_revision)
{
        uint8_t b[23];
        memcpy(b, req_v1, 23);
        b[17] = 0;
        expect_decode_err(b, 23, EPROTO);
        b[17] = 3;
        expect_decode_err(b, 23, EPROTO);
        b[17] = 0xff;
        expect_decode_err(b, 23, EPROTO);
}

Test(mpa_frame, reject_reserved_bits)
{
        for (unsigned bit = 0x01; bit <= 0x10; bit <<= 1) {
                uint8_t b[23];
                memcpy(b, req_v1, 23);
                b[16] |= (uint8_t)bit;
                expect_decode_err(b, 23, EBADMSG);
        }
}

Test(mpa_frame, reject_r_flag_in_request)
{
        uint8_t b[23];
        memcpy(b, req_v1, 23);
        b[16] |= 0x20;
        expect_decode_err(b, 23, EBADMSG);
}

Test(mpa_frame, reject_pd_length_over_512)
{
        uint8_t b[20 + 513];
        memset(b, 0, sizeof(b));
        memcpy(b, req_v1, 20);
        b[18] = 0x02;
        b[19] = 0x01;
        expect_decode_err(b, sizeof(b), EMSGSIZE);
        b[19] = 0x00; /* exactly 512 is fine */
        struct dw_mpa_frame f;
        cr_assert_eq(dw_mpa_frame_decode(b, sizeof(b), &f, NULL), 532);
        cr_assert_eq(f.private_data_len, 512);
}

Test(mpa_frame, reject_v2_pd_shorter_than_block)
{
        uint8_t b[24];
        memcpy(b, req_v2, 24);
        for (uint8_t n = 0; n < 4; n++) {
                b[19] = n;
                expect_decode_err(b, 24, EBADMSG);
        }
}

Test(mpa_frame, truncated_reports_need)
{
        struct dw_mpa_frame f;
        const char *why = NULL;
        cr_assert_eq(dw_mpa_frame_decode(req_v1, 0, &f, &why), -ENODATA);
        cr_assert_not_null(why);
        cr_assert_eq(f.need, 20);
        for (size_t n = 1; n < 20; n++) {
                why = NULL;
                cr_assert_eq(dw_mpa_frame_decode(req_v1, n, &f, &why), -ENODATA);
                cr_assert_not_null(why);
                cr_assert_eq(f.need, 20);
        }
        for (size_t n = 20; n < 23; n++) {
                why = NULL;
                cr_assert_eq(dw_mpa_frame_decode(req_v1, n, &f, &why), -ENODATA);
                cr_assert_not_null(why);
                cr_assert_eq(f.need, 23);
        }
}

Test(mpa_frame, encode_rejects)
{
        uint8_t buf[600];
        uint8_t pd[600] = {0};
        struct dw_mpa_frame base = {.revision = 2, .enhanced = true, .ird = 4, .ord = 4};
        struct dw_mpa_frame f;

        f = base;
        f.revision = 3;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f = base;
        f.revision = 0;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f = base;
        f.enhanced = false;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f = base;
        f.ird = 0x4000;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f = base;
        f.ord = 0x4000;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f = base;
        f.reject = true;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f.is_reply = true;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), 24);
        f = base;
        f.revision = 1;
        f.enhanced = false;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL, "rev 1 with IRD/ORD");
        f.ird = f.ord = 0;
        f.rtr_send = true;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL, "rev 1 with RTR");
        f = base;
        f.private_data_len = 1;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL, "NULL private data");
        f.private_data = pd;
        f.private_data_len = 509;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL, "rev 2: 4 + 509 > 512");
        f.private_data_len = 508;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), 532);
        f = (struct dw_mpa_frame){.revision = 1, .private_data = pd, .private_data_len = 513};
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), -EINVAL);
        f.private_data_len = 512;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, sizeof(buf)), 532);
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, 531), -ENOSPC);
        f = base;
        cr_assert_eq(dw_mpa_frame_encode(&f, buf, 23), -ENOSPC);
}
