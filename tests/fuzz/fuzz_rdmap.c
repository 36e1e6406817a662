/* Feeds arbitrary bytes to the RDMAP decoders: the DDP + RDMAP control header,
 * then the opcode's own header from the bytes after it. Every accepted header
 * must re-encode to the bytes it was decoded from (decode(encode(x)) == x). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/rdmap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ulp(unsigned int opcode, const uint8_t *p, size_t len)
{
        uint8_t buf[64];
        ssize_t n, m;

        switch (opcode) {
        case DW_RDMAP_READ_REQ: {
                struct dw_rdmap_rreq r, r2;

                n = dw_rdmap_rreq_decode(p, len, &r, NULL);
                if (n < 0)
                        return;
                m = dw_rdmap_rreq_encode(&r, buf, sizeof(buf));
                if (m != n || memcmp(buf, p, (size_t)n) != 0)
                        abort();
                if (dw_rdmap_rreq_decode(buf, (size_t)m, &r2, NULL) != n ||
                    r2.sink_stag != r.sink_stag || r2.sink_to != r.sink_to ||
                    r2.rdma_rd_sz != r.rdma_rd_sz || r2.src_stag != r.src_stag ||
                    r2.src_to != r.src_to)
                        abort();
                return;
        }
        case DW_RDMAP_TERMINATE: {
                struct dw_rdmap_term t, t2;
                const char *why = NULL;

                n = dw_rdmap_term_decode(p, len, &t, &why);
                if (n < 0) {
                        if (!why)
                                abort();
                        return;
                }
                m = dw_rdmap_term_encode(&t, buf, sizeof(buf));
                if (m != n || memcmp(buf, p, (size_t)n) != 0)
                        abort();
                if (dw_rdmap_term_decode(buf, (size_t)m, &t2, NULL) != n || t2.layer != t.layer ||
                    t2.etype != t.etype || t2.ecode != t.ecode || t2.ddp_seg_len != t.ddp_seg_len ||
                    t2.ddp_hdr_len != t.ddp_hdr_len)
                        abort();
                return;
        }
        case DW_RDMAP_IMM_DATA:
        case DW_RDMAP_IMM_DATA_SE: {
                struct dw_rdmap_imm im;

                n = dw_rdmap_imm_decode(p, len, &im, NULL);
                if (n < 0)
                        return;
                m = dw_rdmap_imm_encode(&im, buf, sizeof(buf));
                if (m != n || memcmp(buf, p, (size_t)n) != 0)
                        abort();
                return;
        }
        case DW_RDMAP_ATOMIC_REQ: {
                struct dw_rdmap_atomic_req a, a2;
                const char *why = NULL;

                n = dw_rdmap_atomic_req_decode(p, len, &a, &why);
                if (n < 0) {
                        if (!why)
                                abort();
                        return;
                }
                m = dw_rdmap_atomic_req_encode(&a, buf, sizeof(buf));
                if (m != n || memcmp(buf, p, (size_t)n) != 0)
                        abort();
                if (dw_rdmap_atomic_req_decode(buf, (size_t)m, &a2, NULL) != n ||
                    a2.aopcode != a.aopcode || a2.req_id != a.req_id ||
                    a2.compare_mask != a.compare_mask)
                        abort();
                return;
        }
        case DW_RDMAP_ATOMIC_RESP: {
                struct dw_rdmap_atomic_resp a;

                n = dw_rdmap_atomic_resp_decode(p, len, &a, NULL);
                if (n < 0)
                        return;
                m = dw_rdmap_atomic_resp_encode(&a, buf, sizeof(buf));
                if (m != n || memcmp(buf, p, (size_t)n) != 0)
                        abort();
                return;
        }
        default:
                return;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct dw_rdmap_hdr h, h2;
        const char *why = NULL;
        ssize_t n = dw_rdmap_decode(data, size, &h, &why);

        if (n < 0) {
                if (!why)
                        abort();
                /* The per-opcode headers must survive garbage on their own too. */
                if (size > 0)
                        check_ulp(data[0] & 0x0f, data + 1, size - 1);
                return 0;
        }
        if ((size_t)n > size || dw_rdmap_opinfo(h.opcode) == NULL)
                abort();

        uint8_t buf[DW_DDP_MAX_HDR_LEN];
        ssize_t m = dw_rdmap_encode(&h, buf, sizeof(buf));

        if (m != n || memcmp(buf, data, (size_t)n) != 0)
                abort();
        if (dw_rdmap_decode(buf, (size_t)m, &h2, NULL) != n || h2.opcode != h.opcode ||
            h2.inval_stag != h.inval_stag || h2.ddp.msn != h.ddp.msn || h2.ddp.to != h.ddp.to)
                abort();
        check_ulp(h.opcode, data + n, size - (size_t)n);
        return 0;
}
