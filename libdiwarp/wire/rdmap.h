/* RDMAP header codecs (RFC 5040 section 4, RFC 7306).
 *
 * RDMAP rides in the DDP header: the RsvdULP byte is the RDMAP control field
 * (RV, reserved, opcode) and, for untagged messages, the 32-bit RsvdULP word is
 * the Invalidate STag. Some messages then carry an RDMAP header of their own
 * right after the DDP header (Read Request, Terminate, Immediate Data, Atomic
 * Request / Response); each has its codec here.
 */
#ifndef DIWARP_WIRE_RDMAP_H
#define DIWARP_WIRE_RDMAP_H

#include <stdbool.h>

#include "ddp.h"
#include "wire.h"

/* RDMAP control field (DDP RsvdULP byte). */
#define DW_RDMAP_CTRL_RV     0xc0 /* RDMA Version */
#define DW_RDMAP_CTRL_RSVD   0x30 /* Reserved, must be zero */
#define DW_RDMAP_CTRL_OPCODE 0x0f
#define DW_RDMAP_VERSION     1

enum dw_rdmap_opcode {
        DW_RDMAP_WRITE = 0x0,         /* RFC 5040 */
        DW_RDMAP_READ_REQ = 0x1,      /* RFC 5040 */
        DW_RDMAP_READ_RESP = 0x2,     /* RFC 5040 */
        DW_RDMAP_SEND = 0x3,          /* RFC 5040 */
        DW_RDMAP_SEND_INVAL = 0x4,    /* RFC 5040 */
        DW_RDMAP_SEND_SE = 0x5,       /* RFC 5040 */
        DW_RDMAP_SEND_SE_INVAL = 0x6, /* RFC 5040 */
        DW_RDMAP_TERMINATE = 0x7,     /* RFC 5040 */
        DW_RDMAP_IMM_DATA = 0x8,      /* RFC 7306 */
        DW_RDMAP_IMM_DATA_SE = 0x9,   /* RFC 7306 */
        DW_RDMAP_ATOMIC_REQ = 0xa,    /* RFC 7306 */
        DW_RDMAP_ATOMIC_RESP = 0xb,   /* RFC 7306 */
};

/* Untagged DDP queues RDMAP uses (RFC 5040, RFC 7306). */
enum dw_rdmap_qn {
        DW_RDMAP_QN_SEND = 0,        /* Send*, Immediate Data* */
        DW_RDMAP_QN_READ_REQ = 1,    /* RDMA Read Request, Atomic Request */
        DW_RDMAP_QN_TERMINATE = 2,   /* Terminate */
        DW_RDMAP_QN_ATOMIC_RESP = 3, /* Atomic Response */
};

/* What each opcode requires of its DDP header. */
struct dw_rdmap_opinfo {
        const char *name;
        bool tagged;         /* T flag the message must carry */
        uint32_t qn;         /* DDP queue (untagged only) */
        bool single_segment; /* message is one DDP segment: L = 1 and MO = 0 */
        bool inval_stag;     /* RsvdULP word is an Invalidate STag (else reserved, zero) */
        size_t ulp_hdr_len;  /* RDMAP header after the DDP header (Terminate: minimum) */
};

/* Table entry for opcode, or NULL for an opcode no RFC defines. */
const struct dw_rdmap_opinfo *dw_rdmap_opinfo(unsigned int opcode);

struct dw_rdmap_hdr {
        struct dw_ddp_hdr ddp;
        uint8_t opcode;      /* enum dw_rdmap_opcode */
        uint32_t inval_stag; /* Send with (SE and) Invalidate only; 0 otherwise */
};

/* Fills h for opcode from the table (T, QN, L for single-segment messages);
 * the caller sets STag/TO or MSN/MO. Returns 0 or -EINVAL (unknown opcode). */
int dw_rdmap_hdr_init(struct dw_rdmap_hdr *h, unsigned int opcode);

/* Encodes DDP + RDMAP control. ddp.ulp_ctrl and ddp.rsvdulp are derived from
 * opcode and inval_stag. Returns bytes written, -ENOSPC, or -EINVAL when the
 * opcode is unknown or the DDP fields contradict the opcode table. */
ssize_t dw_rdmap_encode(const struct dw_rdmap_hdr *in, uint8_t *buf, size_t cap);

/* Decodes and checks DDP + RDMAP control. Returns the DDP header length, or
 * the DDP errors, -EPROTO (RV != 1, unknown opcode), -EBADMSG (reserved bits,
 * wrong T flag / QN, L = 0 or MO != 0 for a single-segment message, nonzero
 * reserved RsvdULP word). */
ssize_t dw_rdmap_decode(const uint8_t *buf, size_t len, struct dw_rdmap_hdr *out, const char **why);

/* ---- RDMA Read Request header (RFC 5040 section 4.4), 28 bytes ---- */
#define DW_RDMAP_RREQ_HDR_LEN 28

struct dw_rdmap_rreq {
        uint32_t sink_stag;
        uint64_t sink_to;
        uint32_t rdma_rd_sz; /* RDMA Read Message Size */
        uint32_t src_stag;
        uint64_t src_to;
};

ssize_t dw_rdmap_rreq_encode(const struct dw_rdmap_rreq *in, uint8_t *buf, size_t cap);
ssize_t dw_rdmap_rreq_decode(const uint8_t *buf, size_t len, struct dw_rdmap_rreq *out,
                             const char **why);

/* ---- Terminate header (RFC 5040 section 4.8) ---- */
#define DW_RDMAP_TERM_CTRL_LEN   4 /* Terminate Control: Layer, EType, Error Code, HdrCt */
#define DW_RDMAP_TERM_SEGLEN_LEN 2
#define DW_RDMAP_TERM_MAX_LEN                                                                      \
        (DW_RDMAP_TERM_CTRL_LEN + DW_RDMAP_TERM_SEGLEN_LEN + DW_DDP_UNTAGGED_HDR_LEN +             \
         DW_RDMAP_RREQ_HDR_LEN)

/* HdrCt bits, byte 2 of the Terminate Control field. */
#define DW_TERM_HDRCT_M 0x80 /* DDP Segment Length valid */
#define DW_TERM_HDRCT_D 0x40 /* DDP Header Included */
#define DW_TERM_HDRCT_R 0x20 /* RDMAP Header Included */

enum dw_term_layer {
        DW_TERM_LAYER_RDMAP = 0x0,
        DW_TERM_LAYER_DDP = 0x1,
        DW_TERM_LAYER_LLP = 0x2, /* MPA (RFC 5044, RFC 6581) */
};

/* RDMAP layer error types and codes (RFC 5040 section 4.8). */
enum dw_term_rdmap_etype {
        DW_TERM_RDMAP_LOCAL_CATASTROPHIC = 0x0,
        DW_TERM_RDMAP_REMOTE_PROTECTION = 0x1,
        DW_TERM_RDMAP_REMOTE_OPERATION = 0x2,
};

enum dw_term_rdmap_code {
        DW_TERM_RDMAP_INVALID_STAG = 0x00,
        DW_TERM_RDMAP_BASE_BOUNDS = 0x01,          /* base or bounds violation */
        DW_TERM_RDMAP_ACCESS_RIGHTS = 0x02,        /* access rights violation */
        DW_TERM_RDMAP_STAG_NOT_ON_STREAM = 0x03,   /* STag not associated with RDMAP Stream */
        DW_TERM_RDMAP_TO_WRAP = 0x04,              /* TO wrap */
        DW_TERM_RDMAP_INVALID_VERSION = 0x05,      /* invalid RDMAP version */
        DW_TERM_RDMAP_UNEXPECTED_OPCODE = 0x06,    /* unexpected OpCode */
        DW_TERM_RDMAP_CATASTROPHIC_STREAM = 0x07,  /* catastrophic error, localized to stream */
        DW_TERM_RDMAP_CATASTROPHIC_GLOBAL = 0x08,  /* catastrophic error, global */
        DW_TERM_RDMAP_STAG_NOT_INVALIDATED = 0x09, /* STag cannot be invalidated */
        DW_TERM_RDMAP_UNSPECIFIED = 0xff,          /* unspecified error */
};

/* DDP layer error types and codes (RFC 5041, carried in the RDMAP Terminate). */
enum dw_term_ddp_etype {
        DW_TERM_DDP_LOCAL_CATASTROPHIC = 0x0,
        DW_TERM_DDP_TAGGED = 0x1,   /* tagged buffer error */
        DW_TERM_DDP_UNTAGGED = 0x2, /* untagged buffer error */
        DW_TERM_DDP_RSVD_LLP = 0x3, /* reserved for the use by the LLP */
};

enum dw_term_ddp_tagged_code {
        DW_TERM_DDP_T_INVALID_STAG = 0x00,
        DW_TERM_DDP_T_BASE_BOUNDS = 0x01,
        DW_TERM_DDP_T_STAG_NOT_ON_STREAM = 0x02, /* STag not associated with DDP Stream */
        DW_TERM_DDP_T_TO_WRAP = 0x03,
        DW_TERM_DDP_T_INVALID_VERSION = 0x04,
};

enum dw_term_ddp_untagged_code {
        DW_TERM_DDP_U_INVALID_QN = 0x01,
        DW_TERM_DDP_U_NO_BUFFER = 0x02,       /* invalid MSN: no buffer available */
        DW_TERM_DDP_U_MSN_RANGE = 0x03,       /* invalid MSN: MSN range is not valid */
        DW_TERM_DDP_U_INVALID_MO = 0x04,      /* invalid MO */
        DW_TERM_DDP_U_MSG_TOO_LONG = 0x05,    /* DDP message too long for available buffer */
        DW_TERM_DDP_U_INVALID_VERSION = 0x06, /* invalid DDP version */
};

/* LLP (MPA) layer: error type 0 is "MPA error" (RFC 5044, RFC 6581). */
enum dw_term_llp_etype {
        DW_TERM_LLP_MPA = 0x0,
};

enum dw_term_llp_code {
        DW_TERM_LLP_CONN_LOST = 0x01, /* TCP connection closed, terminated or lost */
        DW_TERM_LLP_CRC = 0x02,       /* MPA CRC error */
        DW_TERM_LLP_MARKER = 0x03,    /* MPA Marker and ULPDU Length field mismatch */
        DW_TERM_LLP_BAD_FRAME = 0x04, /* invalid MPA Request or Reply frame */
        DW_TERM_LLP_LOCAL_CATASTROPHIC = 0x05,
        DW_TERM_LLP_NO_IRD = 0x06, /* insufficient IRD resources (RFC 6581) */
        DW_TERM_LLP_NO_RTR = 0x07, /* no matching RTR option (RFC 6581) */
};

struct dw_rdmap_term {
        uint8_t layer;      /* enum dw_term_layer (4 bits) */
        uint8_t etype;      /* per-layer error type (4 bits) */
        uint8_t ecode;      /* per-type error code */
        bool seglen_valid;  /* M */
        bool has_ddp_hdr;   /* D */
        bool has_rdmap_hdr; /* R */
        /* DDP Segment Length of the terminated segment; on the wire when M or D. */
        uint16_t ddp_seg_len;
        /* Terminated DDP header, raw (it may be the malformed one): 14 or 18
         * bytes as its own T bit says; valid when has_ddp_hdr. */
        uint8_t ddp_hdr_len;
        uint8_t ddp_hdr[DW_DDP_UNTAGGED_HDR_LEN];
        /* Terminated RDMAP header (the RDMA Read Request header), raw; valid
         * when has_rdmap_hdr. */
        uint8_t rdmap_hdr[DW_RDMAP_RREQ_HDR_LEN];
};

/* Returns bytes written, -ENOSPC, or -EINVAL (layer/etype out of range, or a
 * carried DDP header whose length does not match its T bit). */
ssize_t dw_rdmap_term_encode(const struct dw_rdmap_term *in, uint8_t *buf, size_t cap);
/* Returns bytes consumed, -ENODATA, -EPROTO (unknown layer), -EBADMSG
 * (reserved bits set). */
ssize_t dw_rdmap_term_decode(const uint8_t *buf, size_t len, struct dw_rdmap_term *out,
                             const char **why);

/* ---- Immediate Data header (RFC 7306), 8 bytes ---- */
#define DW_RDMAP_IMM_HDR_LEN 8

struct dw_rdmap_imm {
        uint8_t data[DW_RDMAP_IMM_HDR_LEN]; /* opaque ULP bytes, carried as is */
};

ssize_t dw_rdmap_imm_encode(const struct dw_rdmap_imm *in, uint8_t *buf, size_t cap);
ssize_t dw_rdmap_imm_decode(const uint8_t *buf, size_t len, struct dw_rdmap_imm *out,
                            const char **why);

/* ---- Atomic Request header (RFC 7306), 52 bytes ---- */
#define DW_RDMAP_ATOMIC_REQ_HDR_LEN 52
#define DW_RDMAP_ATOMIC_AOPCODE     0x0000000fu /* low 4 bits of the first word */

enum dw_rdmap_atomic_op {
        DW_ATOMIC_FETCH_ADD = 0x0,
        DW_ATOMIC_SWAP = 0x1,
        DW_ATOMIC_CMP_SWAP = 0x2,
};

struct dw_rdmap_atomic_req {
        uint8_t aopcode; /* enum dw_rdmap_atomic_op */
        uint32_t req_id; /* Request Identifier, echoed in the response */
        uint32_t remote_stag;
        uint64_t remote_to;
        uint64_t add_swap_data;
        uint64_t add_swap_mask;
        uint64_t compare_data; /* CmpSwap only; carried as is otherwise */
        uint64_t compare_mask; /* CmpSwap only; carried as is otherwise */
};

ssize_t dw_rdmap_atomic_req_encode(const struct dw_rdmap_atomic_req *in, uint8_t *buf, size_t cap);
/* -ENODATA, -EBADMSG (reserved bits of the first word), -EPROTO (AOpCode). */
ssize_t dw_rdmap_atomic_req_decode(const uint8_t *buf, size_t len, struct dw_rdmap_atomic_req *out,
                                   const char **why);

/* ---- Atomic Response header (RFC 7306), 12 bytes ---- */
#define DW_RDMAP_ATOMIC_RESP_HDR_LEN 12

struct dw_rdmap_atomic_resp {
        uint32_t req_id;    /* Original Request Identifier */
        uint64_t orig_data; /* Original Remote Data Value */
};

ssize_t dw_rdmap_atomic_resp_encode(const struct dw_rdmap_atomic_resp *in, uint8_t *buf,
                                    size_t cap);
ssize_t dw_rdmap_atomic_resp_decode(const uint8_t *buf, size_t len,
                                    struct dw_rdmap_atomic_resp *out, const char **why);

#endif
