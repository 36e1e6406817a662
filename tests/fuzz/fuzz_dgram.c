/* Fuzzes the datagram header decoder, the body layout and the CRC check.
 * A header that decodes must re-encode to the same bytes and decode to the
 * same struct; anything else is a codec bug, so abort(). The UD fast-path
 * decoder (dw_dgram_decode_ud) must agree with the strict route on every
 * input: same verdict, errno, reason and fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/dgram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_hdr(const struct dw_dgram_hdr *a, const struct dw_dgram_hdr *b)
{
        if (a->flags != b->flags || a->sack_count != b->sack_count || a->nak_code != b->nak_code ||
            a->dst_qpn != b->dst_qpn || a->src_qpn != b->src_qpn || a->qkey != b->qkey ||
            a->psn != b->psn || a->ack_psn != b->ack_psn || a->credits != b->credits ||
            a->rnr_delay != b->rnr_delay)
                return 0;
        for (unsigned i = 0; i < a->sack_count && i < DW_DGRAM_MAX_SACK; i++)
                if (a->sack[i].start != b->sack[i].start || a->sack[i].end != b->sack[i].end)
                        return 0;
        return 1;
}

static int same_ud(const struct dw_dgram_ud *a, const struct dw_dgram_ud *b)
{
        return a->dst_qpn == b->dst_qpn && a->src_qpn == b->src_qpn && a->qkey == b->qkey &&
               a->msn == b->msn && a->payload_off == b->payload_off &&
               a->payload_len == b->payload_len && a->imm_data == b->imm_data &&
               a->with_imm == b->with_imm && a->se == b->se;
}

/* Fast path against the strict route; an accepted datagram's parts must lie
 * inside it: header, Send header, payload, [Immediate Data message]. */
static void check_ud(const uint8_t *data, size_t len)
{
        struct dw_dgram_ud f, s;
        const char *wf = NULL, *ws = NULL;
        int rf = dw_dgram_decode_ud(data, len, &f, &wf);
        int rs = dw_dgram_decode_ud_strict(data, len, &s, &ws);
        if (rf != rs)
                abort();
        if (rf < 0) {
                if (!wf || !ws || strcmp(wf, ws) != 0)
                        abort();
                return;
        }
        if (rf != 0 || !same_ud(&f, &s))
                abort();
        size_t imm = f.with_imm ? DW_DGRAM_IMM_MSG_LEN : 0;
        if (f.payload_off != DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN ||
            (size_t)f.payload_off + f.payload_len + imm != len)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        const char *why = NULL;

        /* The CRC path sees every input; its verdict must be one of three. */
        ssize_t body = dw_dgram_packet_check(data, size, &why);
        if (body >= 0) {
                if ((size_t)body != size - DW_DGRAM_CRC_LEN)
                        abort();
        } else if (body != -ENODATA && body != -EILSEQ) {
                abort();
        } else if (!why) {
                abort();
        }

        /* With a good CRC the datagram body ends before it; otherwise feed the
         * whole input so the decoder sees everything libFuzzer makes. */
        size_t plen = body >= 0 ? (size_t)body : size;

        check_ud(data, plen);

        struct dw_dgram_hdr h;
        why = NULL;
        ssize_t n = dw_dgram_decode(data, plen, &h, &why);
        if (n < 0) {
                if (!why)
                        abort();
                return 0;
        }
        if ((size_t)n > plen || n != dw_dgram_hdr_len(&h) || dw_dgram_hdr_validate(&h, NULL))
                abort();

        uint8_t buf[DW_DGRAM_HDR_MAX_LEN];
        ssize_t m = dw_dgram_encode(&h, buf, sizeof(buf));
        if (m != n || memcmp(buf, data, (size_t)n) != 0)
                abort();
        struct dw_dgram_hdr again;
        if (dw_dgram_decode(buf, (size_t)m, &again, NULL) != m || !same_hdr(&h, &again))
                abort();

        struct dw_dgram_layout l;
        why = NULL;
        if (dw_dgram_layout(&h, (size_t)n, plen, &l, &why) == 0) {
                if (l.seg_off + l.seg_len > plen)
                        abort();
                if (l.imm_off && l.imm_off + DW_DGRAM_IMM_MSG_LEN != plen)
                        abort();
        } else if (!why) {
                abort();
        }
        return 0;
}
