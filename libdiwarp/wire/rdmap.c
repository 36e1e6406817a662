#include <string.h>

#include "rdmap.h"

/* RFC 5040's RDMA Message Definitions table and its RFC 7306 extension. Single-segment
 * messages carry no ULP payload beyond their RDMAP header (or 8 bytes of
 * immediate data), so RDMAP never cuts them into several DDP segments. */
static const struct dw_rdmap_opinfo opinfo[] = {
    [DW_RDMAP_WRITE] = {"RDMA Write", true, 0, false, false, 0},
    [DW_RDMAP_READ_REQ] = {"RDMA Read Request", false, DW_RDMAP_QN_READ_REQ, true, false,
                           DW_RDMAP_RREQ_HDR_LEN},
    [DW_RDMAP_READ_RESP] = {"RDMA Read Response", true, 0, false, false, 0},
    [DW_RDMAP_SEND] = {"Send", false, DW_RDMAP_QN_SEND, false, false, 0},
    [DW_RDMAP_SEND_INVAL] = {"Send with Invalidate", false, DW_RDMAP_QN_SEND, false, true, 0},
    [DW_RDMAP_SEND_SE] = {"Send with Solicited Event", false, DW_RDMAP_QN_SEND, false, false, 0},
    [DW_RDMAP_SEND_SE_INVAL] = {"Send with Solicited Event and Invalidate", false, DW_RDMAP_QN_SEND,
                                false, true, 0},
    [DW_RDMAP_TERMINATE] = {"Terminate", false, DW_RDMAP_QN_TERMINATE, true, false,
                            DW_RDMAP_TERM_CTRL_LEN},
    [DW_RDMAP_IMM_DATA] = {"Immediate Data", false, DW_RDMAP_QN_SEND, true, false,
                           DW_RDMAP_IMM_HDR_LEN},
    [DW_RDMAP_IMM_DATA_SE] = {"Immediate Data with Solicited Event", false, DW_RDMAP_QN_SEND, true,
                              false, DW_RDMAP_IMM_HDR_LEN},
    [DW_RDMAP_ATOMIC_REQ] = {"Atomic Request", false, DW_RDMAP_QN_READ_REQ, true, false,
                             DW_RDMAP_ATOMIC_REQ_HDR_LEN},
    [DW_RDMAP_ATOMIC_RESP] = {"Atomic Response", false, DW_RDMAP_QN_ATOMIC_RESP, true, false,
                              DW_RDMAP_ATOMIC_RESP_HDR_LEN},
};

const struct dw_rdmap_opinfo *dw_rdmap_opinfo(unsigned int opcode)
{
        if (opcode >= sizeof(opinfo) / sizeof(opinfo[0]))
                return NULL;
        return &opinfo[opcode];
}

int dw_rdmap_hdr_init(struct dw_rdmap_hdr *h, unsigned int opcode)
{
        const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(opcode);

        if (!oi)
                return -EINVAL;
        memset(h, 0, sizeof(*h));
        h->opcode = (uint8_t)opcode;
        h->ddp.tagged = oi->tagged;
        h->ddp.qn = oi->qn;
        h->ddp.last = oi->single_segment;
        return 0;
}

ssize_t dw_rdmap_encode(const struct dw_rdmap_hdr *in, uint8_t *buf, size_t cap)
{
        const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(in->opcode);

        if (!oi)
                return -EINVAL;
        if (in->ddp.tagged != oi->tagged)
                return -EINVAL;
        if (!oi->tagged && in->ddp.qn != oi->qn)
                return -EINVAL;
        if (oi->single_segment && (!in->ddp.last || in->ddp.mo != 0))
                return -EINVAL;

        struct dw_ddp_hdr d = in->ddp;

        d.ulp_ctrl = (uint8_t)(DW_RDMAP_VERSION << 6 | in->opcode);
        d.rsvdulp = oi->inval_stag ? in->inval_stag : 0;
        return dw_ddp_encode(&d, buf, cap);
}

ssize_t dw_rdmap_decode(const uint8_t *buf, size_t len, struct dw_rdmap_hdr *out, const char **why)
{
        struct dw_ddp_hdr d;
        ssize_t n = dw_ddp_decode(buf, len, &d, why);

        if (n < 0)
                return n;
        if ((d.ulp_ctrl & DW_RDMAP_CTRL_RV) >> 6 != DW_RDMAP_VERSION)
                return dw_wire_fail(why, "RDMAP control field: RV is not 1", EPROTO);
        if (d.ulp_ctrl & DW_RDMAP_CTRL_RSVD)
                return dw_wire_fail(why, "RDMAP control field: reserved bits set", EBADMSG);

        unsigned int opcode = d.ulp_ctrl & DW_RDMAP_CTRL_OPCODE;
        const struct dw_rdmap_opinfo *oi = dw_rdmap_opinfo(opcode);

        if (!oi)
                return dw_wire_fail(why, "RDMAP control field: unknown opcode", EPROTO);
        if (d.tagged != oi->tagged)
                return dw_wire_fail(why,
                                    oi->tagged ? "DDP T flag: opcode needs the tagged model"
                                               : "DDP T flag: opcode needs the untagged model",
                                    EBADMSG);
        if (!d.tagged && d.qn != oi->qn)
                return dw_wire_fail(why, "DDP QN: wrong queue for the opcode", EBADMSG);
        if (oi->single_segment && !d.last)
                return dw_wire_fail(why, "DDP L flag: single-segment opcode with L = 0", EBADMSG);
        if (oi->single_segment && d.mo != 0)
                return dw_wire_fail(why, "DDP MO: single-segment opcode with MO != 0", EBADMSG);
        if (!d.tagged && !oi->inval_stag && d.rsvdulp != 0)
                return dw_wire_fail(why, "RDMAP Invalidate STag: reserved word is not zero",
                                    EBADMSG);

        out->ddp = d;
        out->opcode = (uint8_t)opcode;
        out->inval_stag = oi->inval_stag ? d.rsvdulp : 0;
        return n;
}

ssize_t dw_rdmap_rreq_encode(const struct dw_rdmap_rreq *in, uint8_t *buf, size_t cap)
{
        if (cap < DW_RDMAP_RREQ_HDR_LEN)
                return -ENOSPC;
        dw_put_be32(buf, in->sink_stag);
        dw_put_be64(buf + 4, in->sink_to);
        dw_put_be32(buf + 12, in->rdma_rd_sz);
        dw_put_be32(buf + 16, in->src_stag);
        dw_put_be64(buf + 20, in->src_to);
        return DW_RDMAP_RREQ_HDR_LEN;
}

ssize_t dw_rdmap_rreq_decode(const uint8_t *buf, size_t len, struct dw_rdmap_rreq *out,
                             const char **why)
{
        if (len < DW_RDMAP_RREQ_HDR_LEN)
                return dw_wire_fail(why, "RDMA Read Request header: shorter than 28 bytes",
                                    ENODATA);
        out->sink_stag = dw_get_be32(buf);
        out->sink_to = dw_get_be64(buf + 4);
        out->rdma_rd_sz = dw_get_be32(buf + 12);
        out->src_stag = dw_get_be32(buf + 16);
        out->src_to = dw_get_be64(buf + 20);
        return DW_RDMAP_RREQ_HDR_LEN;
}

ssize_t dw_rdmap_term_encode(const struct dw_rdmap_term *in, uint8_t *buf, size_t cap)
{
        if (in->layer > DW_TERM_LAYER_LLP || in->etype > 0xf)
                return -EINVAL;
        if (in->has_ddp_hdr) {
                bool tagged = (in->ddp_hdr[0] & DW_DDP_CTRL_T) != 0;

                if (in->ddp_hdr_len != dw_ddp_hdr_len(tagged))
                        return -EINVAL;
        }

        size_t n = DW_RDMAP_TERM_CTRL_LEN;

        if (in->seglen_valid || in->has_ddp_hdr)
                n += DW_RDMAP_TERM_SEGLEN_LEN;
        if (in->has_ddp_hdr)
                n += in->ddp_hdr_len;
        if (in->has_rdmap_hdr)
                n += DW_RDMAP_RREQ_HDR_LEN;
        if (cap < n)
                return -ENOSPC;

        uint8_t *p = buf;

        p[0] = (uint8_t)(in->layer << 4 | in->etype);
        p[1] = in->ecode;
        p[2] = (uint8_t)((in->seglen_valid ? DW_TERM_HDRCT_M : 0) |
                         (in->has_ddp_hdr ? DW_TERM_HDRCT_D : 0) |
                         (in->has_rdmap_hdr ? DW_TERM_HDRCT_R : 0));
        p[3] = 0;
        p += DW_RDMAP_TERM_CTRL_LEN;
        if (in->seglen_valid || in->has_ddp_hdr) {
                dw_put_be16(p, in->ddp_seg_len);
                p += DW_RDMAP_TERM_SEGLEN_LEN;
        }
        if (in->has_ddp_hdr) {
                memcpy(p, in->ddp_hdr, in->ddp_hdr_len);
                p += in->ddp_hdr_len;
        }
        if (in->has_rdmap_hdr) {
                memcpy(p, in->rdmap_hdr, DW_RDMAP_RREQ_HDR_LEN);
                p += DW_RDMAP_RREQ_HDR_LEN;
        }
        return (ssize_t)n;
}

ssize_t dw_rdmap_term_decode(const uint8_t *buf, size_t len, struct dw_rdmap_term *out,
                             const char **why)
{
        if (len < DW_RDMAP_TERM_CTRL_LEN)
                return dw_wire_fail(why, "Terminate Control: shorter than 4 bytes", ENODATA);

        uint8_t layer = buf[0] >> 4;

        if (layer > DW_TERM_LAYER_LLP)
                return dw_wire_fail(why, "Terminate Control: unknown Layer", EPROTO);
        /* HdrCt takes the top 3 bits of byte 2; the other 13 bits are reserved. */
        if ((buf[2] & 0x1f) != 0 || buf[3] != 0)
                return dw_wire_fail(why, "Terminate Control: reserved bits set", EBADMSG);

        struct dw_rdmap_term t;

        memset(&t, 0, sizeof(t));
        t.layer = layer;
        t.etype = buf[0] & 0x0f;
        t.ecode = buf[1];
        t.seglen_valid = (buf[2] & DW_TERM_HDRCT_M) != 0;
        t.has_ddp_hdr = (buf[2] & DW_TERM_HDRCT_D) != 0;
        t.has_rdmap_hdr = (buf[2] & DW_TERM_HDRCT_R) != 0;

        size_t off = DW_RDMAP_TERM_CTRL_LEN;

        if (t.seglen_valid || t.has_ddp_hdr) {
                if (len - off < DW_RDMAP_TERM_SEGLEN_LEN)
                        return dw_wire_fail(why, "Terminate DDP Segment Length: truncated",
                                            ENODATA);
                t.ddp_seg_len = dw_get_be16(buf + off);
                off += DW_RDMAP_TERM_SEGLEN_LEN;
        }
        if (t.has_ddp_hdr) {
                if (len - off < 1)
                        return dw_wire_fail(why, "Terminated DDP Header: missing", ENODATA);
                /* Only the T bit is trusted: the carried header may be the very
                 * one rejected for a bad version or reserved bits. */
                size_t hl = dw_ddp_hdr_len((buf[off] & DW_DDP_CTRL_T) != 0);

                if (len - off < hl)
                        return dw_wire_fail(why, "Terminated DDP Header: truncated", ENODATA);
                t.ddp_hdr_len = (uint8_t)hl;
                memcpy(t.ddp_hdr, buf + off, hl);
                off += hl;
        }
        if (t.has_rdmap_hdr) {
                if (len - off < DW_RDMAP_RREQ_HDR_LEN)
                        return dw_wire_fail(why, "Terminated RDMAP Header: truncated", ENODATA);
                memcpy(t.rdmap_hdr, buf + off, DW_RDMAP_RREQ_HDR_LEN);
                off += DW_RDMAP_RREQ_HDR_LEN;
        }
        *out = t;
        return (ssize_t)off;
}

ssize_t dw_rdmap_imm_encode(const struct dw_rdmap_imm *in, uint8_t *buf, size_t cap)
{
        if (cap < DW_RDMAP_IMM_HDR_LEN)
                return -ENOSPC;
        memcpy(buf, in->data, DW_RDMAP_IMM_HDR_LEN);
        return DW_RDMAP_IMM_HDR_LEN;
}

ssize_t dw_rdmap_imm_decode(const uint8_t *buf, size_t len, struct dw_rdmap_imm *out,
                            const char **why)
{
        if (len < DW_RDMAP_IMM_HDR_LEN)
                return dw_wire_fail(why, "Immediate Data: shorter than 8 bytes", ENODATA);
        memcpy(out->data, buf, DW_RDMAP_IMM_HDR_LEN);
        return DW_RDMAP_IMM_HDR_LEN;
}

ssize_t dw_rdmap_atomic_req_encode(const struct dw_rdmap_atomic_req *in, uint8_t *buf, size_t cap)
{
        if (in->aopcode > DW_ATOMIC_CMP_SWAP)
                return -EINVAL;
        if (cap < DW_RDMAP_ATOMIC_REQ_HDR_LEN)
                return -ENOSPC;
        dw_put_be32(buf, in->aopcode);
        dw_put_be32(buf + 4, in->req_id);
        dw_put_be32(buf + 8, in->remote_stag);
        dw_put_be64(buf + 12, in->remote_to);
        dw_put_be64(buf + 20, in->add_swap_data);
        dw_put_be64(buf + 28, in->add_swap_mask);
        dw_put_be64(buf + 36, in->compare_data);
        dw_put_be64(buf + 44, in->compare_mask);
        return DW_RDMAP_ATOMIC_REQ_HDR_LEN;
}

ssize_t dw_rdmap_atomic_req_decode(const uint8_t *buf, size_t len, struct dw_rdmap_atomic_req *out,
                                   const char **why)
{
        if (len < DW_RDMAP_ATOMIC_REQ_HDR_LEN)
                return dw_wire_fail(why, "Atomic Request header: shorter than 52 bytes", ENODATA);

        uint32_t w = dw_get_be32(buf);

        if (w & ~DW_RDMAP_ATOMIC_AOPCODE)
                return dw_wire_fail(why, "Atomic Request: reserved bits before AOpCode set",
                                    EBADMSG);
        if (w > DW_ATOMIC_CMP_SWAP)
                return dw_wire_fail(why, "Atomic Request: unknown AOpCode", EPROTO);
        out->aopcode = (uint8_t)w;
        out->req_id = dw_get_be32(buf + 4);
        out->remote_stag = dw_get_be32(buf + 8);
        out->remote_to = dw_get_be64(buf + 12);
        out->add_swap_data = dw_get_be64(buf + 20);
        out->add_swap_mask = dw_get_be64(buf + 28);
        out->compare_data = dw_get_be64(buf + 36);
        out->compare_mask = dw_get_be64(buf + 44);
        return DW_RDMAP_ATOMIC_REQ_HDR_LEN;
}

ssize_t dw_rdmap_atomic_resp_encode(const struct dw_rdmap_atomic_resp *in, uint8_t *buf, size_t cap)
{
        if (cap < DW_RDMAP_ATOMIC_RESP_HDR_LEN)
                return -ENOSPC;
        dw_put_be32(buf, in->req_id);
        dw_put_be64(buf + 4, in->orig_data);
        return DW_RDMAP_ATOMIC_RESP_HDR_LEN;
}

ssize_t dw_rdmap_atomic_resp_decode(const uint8_t *buf, size_t len,
                                    struct dw_rdmap_atomic_resp *out, const char **why)
{
        if (len < DW_RDMAP_ATOMIC_RESP_HDR_LEN)
                return dw_wire_fail(why, "Atomic Response header: shorter than 12 bytes", ENODATA);
        out->req_id = dw_get_be32(buf);
        out->orig_data = dw_get_be64(buf + 4);
        return DW_RDMAP_ATOMIC_RESP_HDR_LEN;
}
