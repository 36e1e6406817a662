/* Feeds a byte stream to the MPA FPDU decoder the way the TCP receive path
 * does: decode FPDUs back to back until one fails. The first input byte picks
 * CRC on/off and the MULPDU limit so both modes and the size check are reached.
 * Every decoded FPDU is re-encoded and must decode to the same ULPDU; with
 * CRC on and zero pad the re-encoding must reproduce the input bytes. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/crc32c.h"
#include "wire/mpa.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SCRATCH_LEN (DW_MPA_HDR_LEN + DW_MPA_ULPDU_MAX + DW_MPA_TRAILER_MAX)

static void check_one(uint8_t *scratch, const uint8_t *p, ssize_t n, const struct dw_mpa_fpdu *f,
                      bool crc, size_t max_ulpdu)
{
        if ((size_t)n != dw_mpa_fpdu_len(f->ulpdu_len, crc) || f->ulpdu != p + DW_MPA_HDR_LEN ||
            f->pad_len != dw_mpa_pad_len(f->ulpdu_len) || f->ulpdu_len > max_ulpdu)
                abort();

        size_t ul = 0;
        if (dw_mpa_fpdu_peek(p, (size_t)n, max_ulpdu, &ul, NULL) != n || ul != f->ulpdu_len)
                abort();

        ssize_t m = dw_mpa_fpdu_encode(f->ulpdu, f->ulpdu_len, crc, scratch, SCRATCH_LEN);
        if (m != n)
                abort();
        if (memcmp(scratch, p, DW_MPA_HDR_LEN + f->ulpdu_len) != 0)
                abort();

        bool pad_zero = true;
        for (size_t i = 0; i < f->pad_len; i++)
                pad_zero &= p[DW_MPA_HDR_LEN + f->ulpdu_len + i] == 0;
        if (crc && pad_zero && memcmp(scratch, p, (size_t)n) != 0)
                abort();

        struct dw_mpa_fpdu g;
        if (dw_mpa_fpdu_decode(scratch, (size_t)m, crc, max_ulpdu, &g, NULL) != m)
                abort();
        if (g.ulpdu_len != f->ulpdu_len || memcmp(g.ulpdu, f->ulpdu, f->ulpdu_len) != 0)
                abort();
        /* The encoder's CRC must be what the one-shot CRC says; without CRC
         * the field is sent as zero. */
        if (g.crc != (crc ? dw_crc32c(scratch, (size_t)m - DW_MPA_CRC_LEN) : 0))
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (size < 1)
                return 0;
        bool crc = data[0] & 1;
        size_t max_ulpdu = (data[0] & 2) ? 64 : DW_MPA_ULPDU_MAX;
        const uint8_t *p = data + 1;
        uint8_t scratch[SCRATCH_LEN];
        size_t left = size - 1;

        for (;;) {
                struct dw_mpa_fpdu f;
                const char *why = NULL;
                ssize_t n = dw_mpa_fpdu_decode(p, left, crc, max_ulpdu, &f, &why);
                if (n < 0) {
                        if (!why)
                                abort();
                        if (n == -ENODATA && (f.need <= left || f.need < DW_MPA_HDR_LEN))
                                abort();
                        if (n != -ENODATA && n != -EMSGSIZE && n != -EILSEQ)
                                abort();
                        break;
                }
                if ((size_t)n > left)
                        abort();
                check_one(scratch, p, n, &f, crc, max_ulpdu);
                p += n;
                left -= (size_t)n;
        }
        return 0;
}
