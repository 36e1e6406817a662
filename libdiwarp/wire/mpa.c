#include "wire/mpa.h"

#include <string.h>

#include "wire/crc32c.h"

const uint8_t dw_mpa_key_req[DW_MPA_KEY_LEN] = {'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R',
                                                'e', 'q', ' ', 'F', 'r', 'a', 'm', 'e'};
const uint8_t dw_mpa_key_rep[DW_MPA_KEY_LEN] = {'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R',
                                                'e', 'p', ' ', 'F', 'r', 'a', 'm', 'e'};

size_t dw_mpa_pad_len(size_t ulpdu_len)
{
        return (4u - ((DW_MPA_HDR_LEN + ulpdu_len) & 3u)) & 3u;
}

uint32_t dw_mpa_mulpdu(uint32_t emss)
{
        uint32_t fpdu = emss & ~3u;

        if (fpdu < DW_MPA_HDR_LEN + DW_MPA_CRC_LEN + 2)
                return 0;
        uint32_t u = fpdu - DW_MPA_HDR_LEN - DW_MPA_CRC_LEN; /* 2 + u: a multiple of 4, pad 0 */
        return u > DW_MPA_ULPDU_MAX ? DW_MPA_ULPDU_MAX : u;
}

size_t dw_mpa_fpdu_len(size_t ulpdu_len, bool crc)
{
        (void)crc;
        return DW_MPA_HDR_LEN + ulpdu_len + dw_mpa_pad_len(ulpdu_len) + DW_MPA_CRC_LEN;
}

ssize_t dw_mpa_fpdu_hdr_encode(size_t ulpdu_len, uint8_t *buf, size_t cap)
{
        if (ulpdu_len > DW_MPA_ULPDU_MAX)
                return -EINVAL;
        if (cap < DW_MPA_HDR_LEN)
                return -ENOSPC;
        dw_put_be16(buf, (uint16_t)ulpdu_len);
        return DW_MPA_HDR_LEN;
}

/* The CRC travels least-significant byte first: that is how RFC 3720 B.4 (the
 * CRC definition MPA refers to) lays out 0x8A9136AA, as aa 36 91 8a. */
static void put_crc(uint8_t *p, uint32_t v)
{
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
        p[2] = (uint8_t)(v >> 16);
        p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_crc(const uint8_t *p)
{
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

ssize_t dw_mpa_fpdu_trailer(uint8_t *trailer, size_t ulpdu_len, uint32_t crc_state, bool crc)
{
        if (ulpdu_len > DW_MPA_ULPDU_MAX)
                return -EINVAL;
        size_t pad = dw_mpa_pad_len(ulpdu_len);

        memset(trailer, 0, pad);
        uint32_t v = 0;
        if (crc)
                v = dw_crc32c_final(dw_crc32c_update(crc_state, trailer, pad));
        put_crc(trailer + pad, v);
        return (ssize_t)(pad + DW_MPA_CRC_LEN);
}

ssize_t dw_mpa_fpdu_encode(const void *ulpdu, size_t len, bool crc, uint8_t *buf, size_t cap)
{
        if (len > DW_MPA_ULPDU_MAX || (len && !ulpdu))
                return -EINVAL;
        size_t total = dw_mpa_fpdu_len(len, crc);
        if (cap < total)
                return -ENOSPC;

        if (len)
                memmove(buf + DW_MPA_HDR_LEN, ulpdu, len);
        dw_put_be16(buf, (uint16_t)len);
        uint32_t s = 0;
        if (crc)
                s = dw_crc32c_update(dw_crc32c_init(), buf, DW_MPA_HDR_LEN + len);
        ssize_t t = dw_mpa_fpdu_trailer(buf + DW_MPA_HDR_LEN + len, len, s, crc);
        if (t < 0)
                return t;
        return (ssize_t)total;
}

ssize_t dw_mpa_fpdu_peek(const uint8_t *buf, size_t len, size_t max_ulpdu, size_t *ulpdu_len,
                         const char **why)
{
        if (len < DW_MPA_HDR_LEN)
                return dw_wire_fail(why, "MPA FPDU: fewer than 2 bytes, ULPDU_Length incomplete",
                                    ENODATA);
        size_t ulen = dw_get_be16(buf);
        if (ulen > max_ulpdu)
                return dw_wire_fail(why, "MPA FPDU: ULPDU_Length exceeds the receiver's MULPDU",
                                    EMSGSIZE);
        if (ulpdu_len)
                *ulpdu_len = ulen;
        return (ssize_t)dw_mpa_fpdu_len(ulen, true);
}

ssize_t dw_mpa_fpdu_decode(const uint8_t *buf, size_t len, bool crc, size_t max_ulpdu,
                           struct dw_mpa_fpdu *out, const char **why)
{
        size_t ulen = 0;

        memset(out, 0, sizeof(*out));
        out->need = DW_MPA_HDR_LEN;
        ssize_t total = dw_mpa_fpdu_peek(buf, len, max_ulpdu, &ulen, why);
        if (total < 0)
                return total;
        out->need = (size_t)total;
        if (len < (size_t)total)
                return dw_wire_fail(
                    why, "MPA FPDU: buffer ends before pad/CRC of the announced ULPDU", ENODATA);

        size_t pad = dw_mpa_pad_len(ulen);
        const uint8_t *crc_field = buf + DW_MPA_HDR_LEN + ulen + pad;
        out->ulpdu = buf + DW_MPA_HDR_LEN;
        out->ulpdu_len = (uint16_t)ulen;
        out->pad_len = (uint8_t)pad;
        out->crc = get_crc(crc_field);

        if (crc) {
                size_t covered = (size_t)(crc_field - buf);
                if (dw_crc32c(buf, covered) != out->crc)
                        return dw_wire_fail(why, "MPA FPDU: CRC does not match the FPDU contents",
                                            EILSEQ);
        }
        return total;
}

/* Which key a (possibly partial) prefix can still become: bit 0 request, bit 1 reply. */
static unsigned key_candidates(const uint8_t *buf, size_t len)
{
        size_t n = len < DW_MPA_KEY_LEN ? len : DW_MPA_KEY_LEN;
        unsigned m = 0;

        if (n == 0)
                return 3u;
        if (memcmp(buf, dw_mpa_key_req, n) == 0)
                m |= 1u;
        if (memcmp(buf, dw_mpa_key_rep, n) == 0)
                m |= 2u;
        return m;
}

ssize_t dw_mpa_frame_decode(const uint8_t *buf, size_t len, struct dw_mpa_frame *out,
                            const char **why)
{
        memset(out, 0, sizeof(*out));
        out->need = DW_MPA_FRAME_HDR_LEN;

        /* Check the key before waiting for more bytes, so a peer that does not
         * speak MPA is refused on its first bytes rather than after 20. */
        unsigned keys = key_candidates(buf, len);
        if (!keys)
                return dw_wire_fail(why,
                                    "MPA frame: Key is neither \"MPA ID Req Frame\" nor "
                                    "\"MPA ID Rep Frame\"",
                                    EPROTO);
        if (len < DW_MPA_FRAME_HDR_LEN)
                return dw_wire_fail(why, "MPA frame: fewer than 20 bytes, header incomplete",
                                    ENODATA);

        uint8_t flags = buf[16];
        uint8_t rev = buf[17];
        uint16_t pd_len = dw_get_be16(buf + 18);

        out->is_reply = keys == 2u;
        if (rev != 1 && rev != 2)
                return dw_wire_fail(why, "MPA frame: Rev is not 1 or 2", EPROTO);
        if (flags & DW_MPA_FLAG_RESERVED)
                return dw_wire_fail(why, "MPA frame: Res bits in the flags byte are not zero",
                                    EBADMSG);
        if ((flags & DW_MPA_FLAG_R) && !out->is_reply)
                return dw_wire_fail(why, "MPA frame: R (reject) flag set in a request", EBADMSG);
        if (pd_len > DW_MPA_PD_MAX)
                return dw_wire_fail(why, "MPA frame: PD_Length exceeds 512", EMSGSIZE);
        if (rev == 2 && pd_len < DW_MPA_V2_LEN)
                return dw_wire_fail(why,
                                    "MPA frame: Rev 2 PD_Length shorter than the 4-byte "
                                    "IRD/ORD block",
                                    EBADMSG);

        size_t total = DW_MPA_FRAME_HDR_LEN + (size_t)pd_len;
        out->need = total;
        if (len < total)
                return dw_wire_fail(why, "MPA frame: buffer ends inside the private data", ENODATA);

        out->markers = flags & DW_MPA_FLAG_M;
        out->crc = flags & DW_MPA_FLAG_C;
        out->reject = flags & DW_MPA_FLAG_R;
        out->revision = rev;

        const uint8_t *pd = buf + DW_MPA_FRAME_HDR_LEN;
        if (rev == 2) {
                uint16_t w_ird = dw_get_be16(pd);
                uint16_t w_ord = dw_get_be16(pd + 2);

                out->enhanced = true;
                out->peer2peer = w_ird & DW_MPA_V2_P2P;
                out->rtr_send = w_ird & DW_MPA_V2_RTR_SEND;
                out->ird = w_ird & DW_MPA_IRD_ORD_MAX;
                out->rtr_write = w_ord & DW_MPA_V2_RTR_WRITE;
                out->rtr_read = w_ord & DW_MPA_V2_RTR_READ;
                out->ord = w_ord & DW_MPA_IRD_ORD_MAX;
                pd += DW_MPA_V2_LEN;
                pd_len -= DW_MPA_V2_LEN;
        }
        out->private_data = pd_len ? pd : NULL;
        out->private_data_len = pd_len;
        return (ssize_t)total;
}

ssize_t dw_mpa_frame_encode(const struct dw_mpa_frame *in, uint8_t *buf, size_t cap)
{
        if (in->revision != 1 && in->revision != 2)
                return -EINVAL;
        bool v2 = in->revision == 2;
        if (in->enhanced != v2)
                return -EINVAL;
        if (in->reject && !in->is_reply)
                return -EINVAL;
        if (v2) {
                if (in->ird > DW_MPA_IRD_ORD_MAX || in->ord > DW_MPA_IRD_ORD_MAX)
                        return -EINVAL;
        } else if (in->ird || in->ord || in->peer2peer || in->rtr_send || in->rtr_write ||
                   in->rtr_read) {
                return -EINVAL;
        }
        if (in->private_data_len && !in->private_data)
                return -EINVAL;

        size_t pd_len = (size_t)in->private_data_len + (v2 ? DW_MPA_V2_LEN : 0);
        if (pd_len > DW_MPA_PD_MAX)
                return -EINVAL;
        size_t total = DW_MPA_FRAME_HDR_LEN + pd_len;
        if (cap < total)
                return -ENOSPC;

        uint8_t *pd = buf + DW_MPA_FRAME_HDR_LEN;
        if (in->private_data_len)
                memmove(pd + (v2 ? DW_MPA_V2_LEN : 0), in->private_data, in->private_data_len);
        memcpy(buf, in->is_reply ? dw_mpa_key_rep : dw_mpa_key_req, DW_MPA_KEY_LEN);
        buf[16] = (uint8_t)((in->markers ? DW_MPA_FLAG_M : 0) | (in->crc ? DW_MPA_FLAG_C : 0) |
                            (in->reject ? DW_MPA_FLAG_R : 0));
        buf[17] = in->revision;
        dw_put_be16(buf + 18, (uint16_t)pd_len);
        if (v2) {
                dw_put_be16(pd, (uint16_t)((in->peer2peer ? DW_MPA_V2_P2P : 0) |
                                           (in->rtr_send ? DW_MPA_V2_RTR_SEND : 0) | in->ird));
                dw_put_be16(pd + 2, (uint16_t)((in->rtr_write ? DW_MPA_V2_RTR_WRITE : 0) |
                                               (in->rtr_read ? DW_MPA_V2_RTR_READ : 0) | in->ord));
        }
        return (ssize_t)total;
}
