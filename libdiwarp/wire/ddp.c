#include <string.h>

#include "ddp.h"

size_t dw_ddp_hdr_len(bool tagged)
{
        return tagged ? DW_DDP_TAGGED_HDR_LEN : DW_DDP_UNTAGGED_HDR_LEN;
}

ssize_t dw_ddp_encode(const struct dw_ddp_hdr *in, uint8_t *buf, size_t cap)
{
        size_t n = dw_ddp_hdr_len(in->tagged);

        if (cap < n)
                return -ENOSPC;
        buf[0] = (uint8_t)((in->tagged ? DW_DDP_CTRL_T : 0) | (in->last ? DW_DDP_CTRL_L : 0) |
                           DW_DDP_VERSION);
        buf[1] = in->ulp_ctrl;
        if (in->tagged) {
                dw_put_be32(buf + 2, in->stag);
                dw_put_be64(buf + 6, in->to);
        } else {
                dw_put_be32(buf + 2, in->rsvdulp);
                dw_put_be32(buf + 6, in->qn);
                dw_put_be32(buf + 10, in->msn);
                dw_put_be32(buf + 14, in->mo);
        }
        return (ssize_t)n;
}

ssize_t dw_ddp_decode(const uint8_t *buf, size_t len, struct dw_ddp_hdr *out, const char **why)
{
        if (len < 1)
                return dw_wire_fail(why, "DDP control field: segment is empty", ENODATA);
        /* The version is checked before anything else: a peer speaking another
         * DDP version may lay out the rest differently (RFC 5041). */
        if ((buf[0] & DW_DDP_CTRL_DV) != DW_DDP_VERSION)
                return dw_wire_fail(why, "DDP control field: DV is not 1", EPROTO);
        if (buf[0] & DW_DDP_CTRL_RSVD)
                return dw_wire_fail(why, "DDP control field: reserved bits set", EBADMSG);

        bool tagged = (buf[0] & DW_DDP_CTRL_T) != 0;
        size_t n = dw_ddp_hdr_len(tagged);

        if (len < n)
                return dw_wire_fail(why,
                                    tagged ? "DDP tagged header: shorter than 14 bytes"
                                           : "DDP untagged header: shorter than 18 bytes",
                                    ENODATA);
        memset(out, 0, sizeof(*out));
        out->tagged = tagged;
        out->last = (buf[0] & DW_DDP_CTRL_L) != 0;
        out->ulp_ctrl = buf[1];
        if (tagged) {
                out->stag = dw_get_be32(buf + 2);
                out->to = dw_get_be64(buf + 6);
        } else {
                out->rsvdulp = dw_get_be32(buf + 2);
                out->qn = dw_get_be32(buf + 6);
                out->msn = dw_get_be32(buf + 10);
                out->mo = dw_get_be32(buf + 14);
        }
        return (ssize_t)n;
}
