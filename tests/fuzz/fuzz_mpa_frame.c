/* MPA request/reply frame decoder. Decoding is strict (reserved bits, R in a
 * request and short rev-2 private data are refused), so every frame it
 * accepts has exactly one encoding: re-encoding must reproduce the input
 * bytes, and decoding that must give the same fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/mpa.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(const struct dw_mpa_frame *a, const struct dw_mpa_frame *b)
{
        return a->is_reply == b->is_reply && a->markers == b->markers && a->crc == b->crc &&
               a->reject == b->reject && a->revision == b->revision && a->enhanced == b->enhanced &&
               a->ird == b->ird && a->ord == b->ord && a->peer2peer == b->peer2peer &&
               a->rtr_send == b->rtr_send && a->rtr_write == b->rtr_write &&
               a->rtr_read == b->rtr_read && a->private_data_len == b->private_data_len &&
               (a->private_data_len == 0 ||
                memcmp(a->private_data, b->private_data, a->private_data_len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct dw_mpa_frame f;
        const char *why = NULL;
        ssize_t n = dw_mpa_frame_decode(data, size, &f, &why);
        if (n < 0) {
                if (!why)
                        abort();
                if (n == -ENODATA &&
                    (f.need <= size || f.need > DW_MPA_FRAME_HDR_LEN + DW_MPA_PD_MAX))
                        abort();
                return 0;
        }
        if ((size_t)n > size || (size_t)n != f.need)
                abort();

        uint8_t buf[DW_MPA_FRAME_HDR_LEN + DW_MPA_PD_MAX];
        ssize_t m = dw_mpa_frame_encode(&f, buf, sizeof(buf));
        if (m != n || memcmp(buf, data, (size_t)n) != 0)
                abort();

        struct dw_mpa_frame g;
        if (dw_mpa_frame_decode(buf, (size_t)m, &g, NULL) != m || !same(&f, &g))
                abort();
        return 0;
}
