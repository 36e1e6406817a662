/* Feeds arbitrary bytes to the DDP header decoder. When it accepts, the header
 * must re-encode to exactly the bytes it consumed and decode again to the same
 * fields; anything else is a codec bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/ddp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(const struct dw_ddp_hdr *a, const struct dw_ddp_hdr *b)
{
        return a->tagged == b->tagged && a->last == b->last && a->ulp_ctrl == b->ulp_ctrl &&
               a->stag == b->stag && a->to == b->to && a->rsvdulp == b->rsvdulp && a->qn == b->qn &&
               a->msn == b->msn && a->mo == b->mo;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct dw_ddp_hdr h, h2;
        const char *why = NULL;
        ssize_t n = dw_ddp_decode(data, size, &h, &why);

        if (n < 0) {
                if (!why)
                        abort();
                return 0;
        }
        if ((size_t)n > size || (size_t)n != dw_ddp_hdr_len(h.tagged))
                abort();

        uint8_t buf[DW_DDP_MAX_HDR_LEN];
        ssize_t m = dw_ddp_encode(&h, buf, sizeof(buf));

        if (m != n || memcmp(buf, data, (size_t)n) != 0)
                abort();
        if (dw_ddp_decode(buf, (size_t)m, &h2, NULL) != n || !same(&h, &h2))
                abort();
        return 0;
}
