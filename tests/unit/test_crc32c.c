/* CRC32c pinned by RFC 3720 appendix B.4. The RFC prints each CRC as the four
 * bytes sent on the wire; the expected values below are those bytes read
 * least-significant first (e.g. "aa 36 91 8a" -> 0x8A9136AA). */
#include <criterion/criterion.h>
#include <string.h>

#include "wire/crc32c.h"

struct vec {
        const char *name;
        uint8_t data[48];
        size_t len;
        uint32_t crc;
};

static void fill_vectors(struct vec v[5])
{
        memset(v, 0, 5 * sizeof(*v));
        v[0] = (struct vec){.name = "32 x 00", .len = 32, .crc = 0x8A9136AAu};
        v[1] = (struct vec){.name = "32 x ff", .len = 32, .crc = 0x62A8AB43u};
        memset(v[1].data, 0xff, 32);
        v[2] = (struct vec){.name = "00..1f", .len = 32, .crc = 0x46DD794Eu};
        v[3] = (struct vec){.name = "1f..00", .len = 32, .crc = 0x113FDB5Cu};
        for (int i = 0; i < 32; i++) {
                v[2].data[i] = (uint8_t)i;
                v[3].data[i] = (uint8_t)(31 - i);
        }
        /* B.4 "An iSCSI - SCSI Read (10) Command PDU", 48 bytes, CRC 56 3a 96 d9. */
        static const uint8_t read10[48] = {
            0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
            0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        };
        v[4] = (struct vec){.name = "iSCSI Read(10) PDU", .len = 48, .crc = 0xD9963A56u};
        memcpy(v[4].data, read10, 48);
}

Test(crc32c, rfc3720_vectors_default_backend)
{
        struct vec v[5];
        fill_vectors(v);
        for (int i = 0; i < 5; i++)
                cr_assert_eq(dw_crc32c(v[i].data, v[i].len), v[i].crc, "%s: got %08x want %08x",
                             v[i].name, dw_crc32c(v[i].data, v[i].len), v[i].crc);
}

Test(crc32c, rfc3720_vectors_portable_backend)
{
        struct vec v[5];
        fill_vectors(v);
        for (int i = 0; i < 5; i++) {
                uint32_t got = dw_crc32c_final(
                    dw_crc32c_update_portable(dw_crc32c_init(), v[i].data, v[i].len));
                cr_assert_eq(got, v[i].crc, "%s: got %08x want %08x", v[i].name, got, v[i].crc);
        }
}

Test(crc32c, wire_bytes_match_rfc_print)
{
        /* The RFC's "CRC: aa 36 91 8a" is the byte sequence; check the value
         * stored little-endian produces exactly it. */
        uint8_t zero[32] = {0};
        uint32_t c = dw_crc32c(zero, sizeof(zero));
        uint8_t wire[4] = {(uint8_t)c, (uint8_t)(c >> 8), (uint8_t)(c >> 16), (uint8_t)(c >> 24)};
        const uint8_t want[4] = {0xaa, 0x36, 0x91, 0x8a};
        cr_assert_arr_eq(wire, want, 4);
}

Test(crc32c, check_value_123456789)
{
        /* The catalogue check value for CRC-32C over ASCII "123456789". */
        cr_assert_eq(dw_crc32c("123456789", 9), 0xE3069283u);
        cr_assert_eq(dw_crc32c_final(dw_crc32c_update_portable(dw_crc32c_init(), "123456789", 9)),
                     0xE3069283u);
}

Test(crc32c, length_zero)
{
        cr_assert_eq(dw_crc32c(NULL, 0), 0u);
        cr_assert_eq(dw_crc32c_update(0x12345678u, NULL, 0), 0x12345678u);
        cr_assert_eq(dw_crc32c_update_portable(0x12345678u, NULL, 0), 0x12345678u);
        cr_assert_eq(dw_crc32c_update_iov(0x12345678u, NULL, 0), 0x12345678u);
}

Test(crc32c, incremental_equals_oneshot_all_splits)
{
        uint8_t buf[301];
        for (size_t i = 0; i < sizeof(buf); i++)
                buf[i] = (uint8_t)(i * 7 + 3);
        uint32_t whole = dw_crc32c(buf, sizeof(buf));
        for (size_t cut = 0; cut <= sizeof(buf); cut++) {
                uint32_t s = dw_crc32c_init();
                s = dw_crc32c_update(s, buf, cut);
                s = dw_crc32c_update(s, buf + cut, sizeof(buf) - cut);
                cr_assert_eq(dw_crc32c_final(s), whole, "split at %zu", cut);

                uint32_t p = dw_crc32c_init();
                p = dw_crc32c_update_portable(p, buf, cut);
                p = dw_crc32c_update_portable(p, buf + cut, sizeof(buf) - cut);
                cr_assert_eq(dw_crc32c_final(p), whole, "portable split at %zu", cut);
        }
}

Test(crc32c, backends_agree_on_unaligned_lengths)
{
        uint8_t buf[1100];
        for (size_t i = 0; i < sizeof(buf); i++)
                buf[i] = (uint8_t)(i ^ (i >> 3) ^ 0x5a);
        for (size_t off = 0; off < 9; off++)
                for (size_t len = 0; len + off <= sizeof(buf); len += 37) {
                        uint32_t a = dw_crc32c_update(0xdeadbeefu, buf + off, len);
                        uint32_t b = dw_crc32c_update_portable(0xdeadbeefu, buf + off, len);
                        cr_assert_eq(a, b, "off %zu len %zu", off, len);
                }
}

Test(crc32c, iov_equals_contiguous)
{
        struct vec v[5];
        fill_vectors(v);
        const uint8_t *d = v[4].data;
        struct iovec iov[4] = {
            {.iov_base = (void *)d, .iov_len = 5},
            {.iov_base = (void *)(d + 5), .iov_len = 0},
            {.iov_base = (void *)(d + 5), .iov_len = 30},
            {.iov_base = (void *)(d + 35), .iov_len = 13},
        };
        cr_assert_eq(dw_crc32c_final(dw_crc32c_update_iov(dw_crc32c_init(), iov, 4)), 0xD9963A56u);
}

Test(crc32c, backend_name)
{
        const char *b = dw_crc32c_backend();
#ifdef DIWARP_HAVE_ISAL
        cr_assert_str_eq(b, "isa-l");
#else
        cr_assert(strcmp(b, "isa-l") == 0 || strcmp(b, "portable") == 0);
#endif
}
