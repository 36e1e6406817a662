/* Fuzzes the datagram header decoder (versions 1 and 2), the body layout
 * and the CRC stage with and without NOCRC. A header that decodes must
 * re-encode to the same bytes and decode to the same struct; anything else
 * is a codec bug, so abort(). The fast-path decoders (dw_dgram_decode_ud,
 * dw_dgram_decode_rd) must agree with their reference routes on every
 * input: same verdict, errno, reason and fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/dgram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_hdr(const struct dw_dgram_hdr *a, const struct dw_dgram_hdr *b)
{
        if (a->flags != b->flags || a->xflags != b->xflags || a->sack_count != b->sack_count ||
            a->nak_code != b->nak_code || a->dst_qpn != b->dst_qpn || a->src_qpn != b->src_qpn ||
            a->qkey != b->qkey || a->psn != b->psn || a->ack_psn != b->ack_psn ||
            a->credits != b->credits || a->rnr_delay != b->rnr_delay ||
            a->pull_len != b->pull_len || a->pull_pushed != b->pull_pushed ||
            a->rail_count != b->rail_count || a->origin != b->origin || a->xflags2 != b->xflags2 ||
            a->start_psn != b->start_psn || a->start_msn != b->start_msn)
                return 0;
        for (unsigned i = 0; i < a->rail_count && i < DW_DGRAM_MAX_RAILS; i++)
                if (a->rails[i] != b->rails[i])
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

/* A fast path (rf, wf) and its reference route (rs, ws) give the same
 * result, and the same reason when they refuse. True when both accept. */
static bool same_verdict(ssize_t rf, ssize_t rs, const char *wf, const char *ws)
{
        if (rf != rs)
                abort();
        if (rf >= 0)
                return true;
        if (!wf || !ws || strcmp(wf, ws) != 0)
                abort();
        return false;
}

/* Fast path against the strict route; an accepted datagram's parts must lie
 * inside it: header, Send header, payload, [Immediate Data message]. */
static void check_ud(const uint8_t *data, size_t len)
{
        struct dw_dgram_ud f, s;
        const char *wf = NULL, *ws = NULL;
        int rf = dw_dgram_decode_ud(data, len, &f, &wf);
        int rs = dw_dgram_decode_ud_strict(data, len, &s, &ws);
        if (!same_verdict(rf, rs, wf, ws))
                return;
        if (rf != 0 || !same_ud(&f, &s) || data[0] != DW_DGRAM_VERSION)
                abort();
        size_t imm = f.with_imm ? DW_DGRAM_IMM_MSG_LEN : 0;
        if (f.payload_off != DW_DGRAM_HDR_LEN + DW_DGRAM_DDP_UNTAGGED_LEN ||
            (size_t)f.payload_off + f.payload_len + imm != len)
                abort();
}

/* The RD fast path against dw_dgram_decode. */
static void check_rd(const uint8_t *data, size_t len)
{
        struct dw_dgram_hdr f, s;
        const char *wf = NULL, *ws = NULL;
        ssize_t rf = dw_dgram_decode_rd(data, len, &f, &wf);
        ssize_t rs = dw_dgram_decode(data, len, &s, &ws);
        if (same_verdict(rf, rs, wf, ws) && !same_hdr(&f, &s))
                abort();
}

/* The receiver's view of which datagrams have no trailer, restated from
 * docs/PROTOCOL.md: version 2, RD, NOCRC and no unknown X-flag (every bit
 * is defined since RAILS and RAIL, so the last test always holds). */
static int nocrc_shape(const uint8_t *data, size_t size)
{
        return size >= DW_DGRAM_HDR_LEN && data[0] == DW_DGRAM_VERSION2 &&
               (data[1] & DW_DGRAM_F_RD) && (data[4] & DW_DGRAM_X_NOCRC) &&
               !(data[4] & ~DW_DGRAM_X_ALL);
}

/* dw_dgram_packet_body both ways against dw_dgram_packet_check's verdict
 * (checked): NOCRC datagrams are taken whole or refused, every other one
 * gets exactly packet_check's answer. Returns the accepted body length. */
static ssize_t check_body(const uint8_t *data, size_t size, ssize_t checked,
                          const char *checked_why)
{
        const char *wa = NULL, *wr = NULL;
        ssize_t acc = dw_dgram_packet_body(data, size, true, &wa);
        ssize_t rej = dw_dgram_packet_body(data, size, false, &wr);
        if (nocrc_shape(data, size)) {
                if (acc != (ssize_t)size || rej != -ENOTSUP || !wr)
                        abort();
                return acc;
        }
        if (acc != checked || rej != checked)
                abort();
        if (checked < 0 && (!wa || !wr || strcmp(wa, checked_why) || strcmp(wr, checked_why)))
                abort();
        return acc;
}

/* Sealing as the header asks and reading back gives the same body. */
static void check_finish(const uint8_t *data, size_t len, const struct dw_dgram_hdr *h)
{
        static uint8_t pkt[DW_UDP_MAX_PAYLOAD + DW_DGRAM_CRC_LEN];
        if (len > DW_UDP_MAX_PAYLOAD)
                return;
        memcpy(pkt, data, len);
        ssize_t n = dw_dgram_packet_finish(pkt, len, sizeof(pkt));
        bool nocrc = (h->xflags & DW_DGRAM_X_NOCRC) != 0;
        if (n != (ssize_t)(nocrc ? len : len + DW_DGRAM_CRC_LEN))
                abort();
        if (dw_dgram_packet_body(pkt, (size_t)n, true, NULL) != (ssize_t)len)
                abort();
        if (dw_dgram_packet_body(pkt, (size_t)n, false, NULL) != (nocrc ? -ENOTSUP : (ssize_t)len))
                abort();
}

/* Every decoder on one candidate body (the datagram without its trailer). */
static void check_datagram(const uint8_t *data, size_t plen)
{
        check_ud(data, plen);
        check_rd(data, plen);

        struct dw_dgram_hdr h;
        const char *why = NULL;
        ssize_t n = dw_dgram_decode(data, plen, &h, &why);
        if (n < 0) {
                if (!why)
                        abort();
                return;
        }
        if ((size_t)n > plen || n != dw_dgram_hdr_len(&h) || dw_dgram_hdr_validate(&h, NULL))
                abort();
        /* Version 2 exactly when an X-flag or X2-flag is set; NOCRC, RAILS
         * and RAIL only on RD, START only on RD DATA; a rail list of 1..4
         * non-zero addresses, a non-zero origin. */
        if (data[0] != (h.xflags || h.xflags2 ? DW_DGRAM_VERSION2 : DW_DGRAM_VERSION))
                abort();
        if ((h.xflags2 & DW_DGRAM_X2_START) &&
            (h.flags & (DW_DGRAM_F_RD | DW_DGRAM_F_DATA)) != (DW_DGRAM_F_RD | DW_DGRAM_F_DATA))
                abort();
        if ((h.xflags & (DW_DGRAM_X_NOCRC | DW_DGRAM_X_RAILS | DW_DGRAM_X_RAIL)) &&
            !(h.flags & DW_DGRAM_F_RD))
                abort();
        if ((h.xflags & DW_DGRAM_X_RAILS) ? h.rail_count < 1 || h.rail_count > DW_DGRAM_MAX_RAILS
                                          : h.rail_count != 0)
                abort();
        for (unsigned i = 0; i < h.rail_count && i < DW_DGRAM_MAX_RAILS; i++)
                if (h.rails[i] == 0)
                        abort();
        if (((h.xflags & DW_DGRAM_X_RAIL) != 0) != (h.origin != 0))
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
                if ((h.flags & DW_DGRAM_F_DATA) && l.seg_off != (size_t)n)
                        abort();
        } else if (!why) {
                abort();
        }
        check_finish(data, plen, &h);
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
        ssize_t nbody = check_body(data, size, body, why);

        /* With a good CRC the datagram body ends before it; otherwise feed the
         * whole input so the decoder sees everything libFuzzer makes. A
         * NOCRC datagram whose last bytes happen to be a good CRC is also
         * read whole, as a receiver accepting NOCRC reads it. */
        size_t plen = body >= 0 ? (size_t)body : size;
        check_datagram(data, plen);
        if (nbody >= 0 && (size_t)nbody != plen)
                check_datagram(data, (size_t)nbody);
        return 0;
}
