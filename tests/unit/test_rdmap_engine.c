/* Unit tests for rdmap/: the error classification shared by RC's Terminate
 * and RD's error NAK. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>

#include "rdmap/rdmap.h"

static const enum dw_prot_status all_fail[] = {
    DW_PROT_INVALID_STAG,
    DW_PROT_PD_MISMATCH,
    DW_PROT_ACCESS,
    DW_PROT_BOUNDS,
    DW_PROT_INVALIDATED,
    DW_PROT_TO_WRAP,
    DW_PROT_NOT_INVALIDATABLE,
};
#define NFAIL (sizeof(all_fail) / sizeof(all_fail[0]))

struct term_case {
        enum dw_prot_status st;
        enum dw_prot_ctx ctx;
        uint8_t layer, etype, ecode;
};

Test(rdmap_class, terminate_errors)
{
        const struct term_case cases[] = {
            /* tagged placement: DDP Tagged Buffer Error (RFC 5041) */
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x00},
            {DW_PROT_INVALIDATED, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x00},
            {DW_PROT_BOUNDS, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x01},
            {DW_PROT_PD_MISMATCH, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x02},
            {DW_PROT_TO_WRAP, DW_PROT_CTX_TAGGED_SINK, 1, 1, 0x03},
            /* no DDP code for rights: RDMAP Remote Protection / access */
            {DW_PROT_ACCESS, DW_PROT_CTX_TAGGED_SINK, 0, 1, 0x02},
            /* Read Request source: RDMAP Remote Protection Error */
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x00},
            {DW_PROT_INVALIDATED, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x00},
            {DW_PROT_BOUNDS, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x01},
            {DW_PROT_ACCESS, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x02},
            {DW_PROT_PD_MISMATCH, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x03},
            {DW_PROT_TO_WRAP, DW_PROT_CTX_READ_SOURCE, 0, 1, 0x04},
            {DW_PROT_ACCESS, DW_PROT_CTX_ATOMIC, 0, 1, 0x02},
            {DW_PROT_BOUNDS, DW_PROT_CTX_ATOMIC, 0, 1, 0x01},
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_ATOMIC, 0, 1, 0x00},
            /* Send with Invalidate: STag cannot be invalidated */
            {DW_PROT_INVALID_STAG, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
            {DW_PROT_INVALIDATED, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
            {DW_PROT_PD_MISMATCH, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
            {DW_PROT_NOT_INVALIDATABLE, DW_PROT_CTX_INVALIDATE, 0, 1, 0x09},
        };
        for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct dw_term_error e = {0xee, 0xee, 0xee};
                cr_assert_eq(dw_prot_status_to_term(cases[i].st, cases[i].ctx, &e), 0, "case %u",
                             i);
                cr_expect_eq(e.layer, cases[i].layer, "case %u layer", i);
                cr_expect_eq(e.etype, cases[i].etype, "case %u etype", i);
                cr_expect_eq(e.ecode, cases[i].ecode, "case %u ecode", i);
        }
        /* every failing status maps in every access context */
        const enum dw_prot_ctx ctxs[] = {DW_PROT_CTX_TAGGED_SINK, DW_PROT_CTX_READ_SOURCE,
                                         DW_PROT_CTX_ATOMIC};
        for (unsigned c = 0; c < 3; c++)
                for (unsigned i = 0; i < NFAIL; i++) {
                        struct dw_term_error e;
                        cr_expect_eq(dw_prot_status_to_term(all_fail[i], ctxs[c], &e), 0);
                }
}

Test(rdmap_class, terminate_rejects_nonsense)
{
        struct dw_term_error e;
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_OK, DW_PROT_CTX_TAGGED_SINK, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_ACCESS, DW_PROT_CTX_INVALIDATE, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_BOUNDS, DW_PROT_CTX_INVALIDATE, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_BOUNDS, (enum dw_prot_ctx)42, &e), -EINVAL);
        cr_expect_eq(dw_prot_status_to_term((enum dw_prot_status)77, DW_PROT_CTX_READ_SOURCE, &e),
                     -EINVAL);
        cr_expect_eq(dw_prot_status_to_term(DW_PROT_BOUNDS, DW_PROT_CTX_READ_SOURCE, NULL),
                     -EINVAL);
}

Test(rdmap_class, vendor_err_encoding)
{
        struct dw_term_error e = {.layer = 1, .etype = 1, .ecode = 3};
        cr_expect_eq(dw_term_vendor_err(e), 0x1103u);
        struct dw_term_error f = {.layer = 0, .etype = 2, .ecode = 0xff};
        cr_expect_eq(dw_term_vendor_err(f), 0x02ffu);
}
