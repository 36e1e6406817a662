/* Unit tests for mem/: PD bookkeeping, STag table, access checks,
 * invalidation, status mappings. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "mem/mr.h"

#define NSLOTS 8
#define BUFSZ  4096
#define IOVA   0x10000ull

#define LW         DIWARP_ACCESS_LOCAL_WRITE
#define RW         DIWARP_ACCESS_REMOTE_WRITE
#define RR         DIWARP_ACCESS_REMOTE_READ
#define RA         DIWARP_ACCESS_REMOTE_ATOMIC
#define ALL_REMOTE (LW | RW | RR | RA)

static struct dw_mr_table tab;
static struct dw_pd pd_a, pd_b;
static uint8_t buf[BUFSZ];

static void setup(void)
{
        cr_assert_eq(dw_mr_table_init(&tab, NSLOTS), 0);
        dw_pd_init(&tab, &pd_a, NULL);
        dw_pd_init(&tab, &pd_b, NULL);
}

static void teardown(void)
{
        dw_mr_table_destroy(&tab);
}

static struct dw_mr *reg(struct dw_pd *pd, uint64_t iova, int access)
{
        struct dw_mr *mr = NULL;
        cr_assert_eq(dw_mr_register(&tab, pd, buf, BUFSZ, iova, access, &mr), 0);
        cr_assert_not_null(mr);
        return mr;
}

static enum dw_prot_status rchk(uint32_t stag, const struct dw_pd *pd, int acc, uint64_t to,
                                uint64_t len)
{
        uint8_t *p = (uint8_t *)1; /* must be overwritten */
        enum dw_prot_status st = dw_mr_check_remote(&tab, stag, pd, 0, acc, to, len, &p);
        if (st != DW_PROT_OK)
                cr_assert_null(p, "host_addr must be NULL on failure");
        return st;
}

TestSuite(mr, .init = setup, .fini = teardown);

/* ---- table and PD ---------------------------------------------------- */

Test(mr_table, init_rejects_bad_sizes)
{
        struct dw_mr_table t;
        cr_expect_eq(dw_mr_table_init(&t, 0), -EINVAL);
        cr_expect_eq(dw_mr_table_init(&t, DW_MR_MAX_SLOTS + 1), -EINVAL);
        cr_expect_eq(dw_mr_table_init(NULL, 4), -EINVAL);
        cr_assert_eq(dw_mr_table_init(&t, 1), 0);
        dw_mr_table_destroy(&t);
        dw_mr_table_destroy(&t); /* idempotent */
}

Test(mr, pd_handles_unique_nonzero)
{
        struct dw_pd p;
        dw_pd_init(&tab, &p, NULL);
        cr_expect_neq(pd_a.handle, 0);
        cr_expect_neq(pd_b.handle, 0);
        cr_expect_neq(pd_a.handle, pd_b.handle);
        cr_expect_neq(p.handle, pd_a.handle);
        cr_expect_neq(p.handle, pd_b.handle);
        cr_expect_eq(p.use_count, 0);
}

Test(mr, pd_busy_while_used)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW);
        cr_expect_eq(pd_a.use_count, 1);
        cr_expect_eq(dw_pd_fini(&pd_a), -EBUSY);
        cr_expect_neq(pd_a.handle, 0, "failed fini must change nothing");
        cr_assert_eq(dw_mr_deregister(&tab, mr), 0);
        cr_expect_eq(pd_a.use_count, 0);

        dw_pd_get(&pd_a); /* a QP */
        cr_expect_eq(dw_pd_fini(&pd_a), -EBUSY);
        dw_pd_put(&pd_a);
        cr_expect_eq(dw_pd_fini(&pd_a), 0);
        dw_pd_put(&pd_a); /* never below zero */
        cr_expect_eq(pd_a.use_count, 0);
}

/* ---- registration ---------------------------------------------------- */

Test(mr, register_fields_and_stag_layout)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RR);
        uint32_t idx = dw_stag_index(mr->stag);
        cr_expect(idx >= 1 && idx <= DW_MR_MAX_INDEX, "handle %u", idx);
        cr_expect_eq(mr->stag, idx << 8 | dw_stag_key(mr->stag));
        cr_expect_eq(mr->pd, &pd_a);
        cr_expect_eq(mr->addr, buf);
        cr_expect_eq(mr->length, BUFSZ);
        cr_expect_eq(mr->iova, IOVA);
        cr_expect_eq(mr->access, LW | RR);
        cr_expect(mr->valid);
        cr_expect_eq(tab.count, 1);
        cr_expect_eq(dw_mr_lookup(&tab, mr->stag), mr);
}

Test(mr, register_distinct_stags)
{
        struct dw_mr *m[NSLOTS];
        for (int i = 0; i < NSLOTS; i++) {
                m[i] = reg(&pd_a, IOVA, LW);
                for (int j = 0; j < i; j++)
                        cr_expect_neq(dw_stag_index(m[i]->stag), dw_stag_index(m[j]->stag));
        }
}

Test(mr, register_rejects_bad_arguments)
{
        struct dw_mr *mr = NULL;
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, 1 << 12, &mr), -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, RW, &mr), -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, RA, &mr), -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, RW | RR, &mr), -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, NULL, BUFSZ, IOVA, LW, &mr), -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, NULL, buf, BUFSZ, IOVA, LW, &mr), -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, LW, NULL), -EINVAL);
        /* iova + len must stay representable */
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, UINT64_MAX - BUFSZ + 1, LW, &mr),
                     -EINVAL);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, UINT64_MAX, LW, &mr), -EINVAL);
        /* host address range must not wrap */
        cr_expect_eq(dw_mr_register(&tab, &pd_a, (void *)(UINTPTR_MAX - 10), 100, 0, LW, &mr),
                     -EINVAL);
        cr_expect_null(mr);
        cr_expect_eq(tab.count, 0);
        cr_expect_eq(pd_a.use_count, 0);
        /* read-only rights and MW_BIND alone are fine */
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, RR, &mr), 0);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, 0, &mr), 0);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, DIWARP_ACCESS_MW_BIND, &mr), 0);
}

Test(mr, register_highest_iova_edge)
{
        struct dw_mr *mr = NULL;
        uint64_t iova = UINT64_MAX - BUFSZ; /* last TO = UINT64_MAX - 1 */
        cr_assert_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, iova, LW | RW, &mr), 0);
        uint8_t *p;
        cr_expect_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RW, UINT64_MAX - 1, 1, &p),
                     DW_PROT_OK);
        cr_expect_eq(p, buf + BUFSZ - 1);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, iova, BUFSZ), DW_PROT_OK);
        /* one past: the exclusive end would be 2^64, which wraps */
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, UINT64_MAX, 1), DW_PROT_TO_WRAP);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, iova, BUFSZ + 1), DW_PROT_TO_WRAP);
}

Test(mr, zero_length_registration)
{
        struct dw_mr *mr = NULL;
        cr_assert_eq(dw_mr_register(&tab, &pd_a, buf, 0, IOVA, LW | RW, &mr), 0);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 1), DW_PROT_BOUNDS);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 0), DW_PROT_OK);
        /* NULL address with zero length is accepted, as ibverbs does */
        cr_expect_eq(dw_mr_register(&tab, &pd_a, NULL, 0, 0, LW, &mr), 0);
}

Test(mr, table_exhaustion_and_slot_reuse)
{
        struct dw_mr *m[NSLOTS], *extra = NULL;
        for (int i = 0; i < NSLOTS; i++)
                m[i] = reg(&pd_a, IOVA, LW);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, LW, &extra), -ENOMEM);
        cr_expect_null(extra);
        cr_expect_eq(tab.count, NSLOTS);
        cr_expect_eq(pd_a.use_count, NSLOTS);

        uint32_t old = m[3]->stag;
        cr_assert_eq(dw_mr_deregister(&tab, m[3]), 0);
        cr_assert_eq(dw_mr_register(&tab, &pd_b, buf, BUFSZ, IOVA, LW | RR, &extra), 0);
        cr_expect_eq(extra, m[3], "the only free slot is reused");
        cr_expect_neq(extra->stag, old, "a new STag on reuse");
        cr_expect_eq(rchk(old, &pd_a, 0, IOVA, 1), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(old, &pd_b, RR, IOVA, 1), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(extra->stag, &pd_b, RR, IOVA, 1), DW_PROT_OK);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, LW, &extra), -ENOMEM);

        for (int i = 0; i < NSLOTS; i++)
                cr_expect_eq(dw_mr_deregister(&tab, m[i]), 0);
        cr_expect_eq(tab.count, 0);
        cr_expect_eq(pd_a.use_count, 0);
        cr_expect_eq(pd_b.use_count, 0);
        /* all slots usable again */
        for (int i = 0; i < NSLOTS; i++)
                m[i] = reg(&pd_a, IOVA, LW);
        cr_expect_eq(dw_mr_register(&tab, &pd_a, buf, BUFSZ, IOVA, LW, &extra), -ENOMEM);
}

Test(mr, free_list_is_fifo)
{
        struct dw_mr *a = reg(&pd_a, IOVA, LW);
        cr_assert_eq(dw_mr_deregister(&tab, a), 0);
        /* the freed slot goes to the back: the next NSLOTS-1 registrations
         * use other slots */
        for (int i = 0; i < NSLOTS - 1; i++) {
                struct dw_mr *m = reg(&pd_a, IOVA, LW);
                cr_expect_neq(m, a);
        }
        struct dw_mr *last = reg(&pd_a, IOVA, LW);
        cr_expect_eq(last, a);
}

Test(mr_table, same_slot_never_repeats_key)
{
        struct dw_mr_table t;
        struct dw_pd pd;
        cr_assert_eq(dw_mr_table_init(&t, 1), 0);
        dw_pd_init(&t, &pd, NULL);
        uint32_t prev = 0;
        int keys_seen[256] = {0};
        for (int i = 0; i < 2000; i++) {
                struct dw_mr *mr;
                cr_assert_eq(dw_mr_register(&t, &pd, buf, BUFSZ, 0, LW, &mr), 0);
                cr_assert_neq(mr->stag, prev, "iteration %d repeated the STag", i);
                if (prev)
                        cr_assert_null(dw_mr_lookup(&t, prev));
                keys_seen[dw_stag_key(mr->stag)]++;
                prev = mr->stag;
                cr_assert_eq(dw_mr_deregister(&t, mr), 0);
                uint8_t *p;
                cr_assert_eq(dw_mr_check_local(&t, prev, &pd, 0, 0, 1, &p), DW_PROT_INVALID_STAG,
                             "stale STag after dereg");
        }
        /* keys come from a random source, not a counter: with 2000 draws
         * over 256 values, far more than a handful distinct ones appear */
        int distinct = 0;
        for (int k = 0; k < 256; k++)
                distinct += keys_seen[k] != 0;
        cr_expect_gt(distinct, 128);
        dw_mr_table_destroy(&t);
}

Test(mr, deregister_rejects_bad_pointers)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW);
        struct dw_mr outside = *mr;
        cr_expect_eq(dw_mr_deregister(&tab, &outside), -EINVAL);
        cr_expect_eq(dw_mr_deregister(&tab, &tab.slots[0]), -EINVAL);
        cr_expect_eq(dw_mr_deregister(&tab, &tab.slots[NSLOTS + 1]), -EINVAL);
        cr_expect_eq(dw_mr_deregister(&tab, (struct dw_mr *)((char *)mr + 1)), -EINVAL);
        cr_expect_eq(dw_mr_deregister(&tab, NULL), -EINVAL);
        cr_expect_eq(dw_mr_deregister(&tab, mr), 0);
        cr_expect_eq(dw_mr_deregister(&tab, mr), -EINVAL, "double dereg");
        cr_expect_eq(pd_a.use_count, 0);
        cr_expect_eq(tab.count, 0);
}

/* ---- STag validity --------------------------------------------------- */

Test(mr, stag_zero_never_valid)
{
        struct dw_mr *mr = reg(&pd_a, 0, ALL_REMOTE | DIWARP_ACCESS_ZERO_BASED);
        cr_expect_neq(mr->stag, 0);
        cr_expect_eq(rchk(0, &pd_a, 0, 0, 1), DW_PROT_INVALID_STAG);
        for (uint32_t k = 0; k < 256; k++)
                cr_expect_eq(rchk(k, &pd_a, 0, 0, 1), DW_PROT_INVALID_STAG, "index 0 key %u", k);
        cr_expect_null(dw_mr_lookup(&tab, 0));
        cr_expect_eq(dw_mr_invalidate(&tab, 0, &pd_a, 0), -EINVAL);
}

Test(mr, stale_stag_after_dereg)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        uint32_t stag = mr->stag;
        cr_expect_eq(rchk(stag, &pd_a, RW, IOVA, 1), DW_PROT_OK);
        cr_assert_eq(dw_mr_deregister(&tab, mr), 0);
        cr_expect_eq(rchk(stag, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
        uint8_t *p;
        cr_expect_eq(dw_mr_check_local(&tab, stag, &pd_a, 0, IOVA, 1, &p), DW_PROT_INVALID_STAG);
        cr_expect_null(dw_mr_lookup(&tab, stag));
        cr_expect_eq(dw_mr_invalidate(&tab, stag, &pd_a, 0), -EINVAL);
}

Test(mr, guessed_keys_fail)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        uint32_t idx = dw_stag_index(mr->stag);
        int ok = 0;
        for (uint32_t k = 0; k < 256; k++) {
                enum dw_prot_status st = rchk(idx << 8 | k, &pd_a, RW, IOVA, 1);
                if (k == dw_stag_key(mr->stag))
                        cr_expect_eq(st, DW_PROT_OK);
                else
                        cr_expect_eq(st, DW_PROT_INVALID_STAG, "key %u", k);
                ok += st == DW_PROT_OK;
        }
        cr_expect_eq(ok, 1);
}

Test(mr, guessed_indices_fail)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        uint8_t key = dw_stag_key(mr->stag);
        uint32_t idx = dw_stag_index(mr->stag);
        /* small handles (an index would have been one of them), with the
         * live key */
        for (uint32_t i = 0; i <= NSLOTS + 2; i++)
                if (i != idx)
                        cr_expect_eq(rchk(i << 8 | key, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG,
                                     "handle %u", i);
        /* every other handle of the STag's hash bucket */
        for (uint32_t hi = 0; hi <= DW_MR_MAX_INDEX; hi += tab.hmask + 1)
                if ((hi | (idx & tab.hmask)) != idx)
                        cr_expect_eq(rchk((hi | (idx & tab.hmask)) << 8 | key, &pd_a, RW, IOVA, 1),
                                     DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(DW_MR_MAX_INDEX << 8 | key, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(UINT32_MAX, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
}

Test(mr, pd_mismatch)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        uint8_t *p;
        cr_expect_eq(rchk(mr->stag, &pd_b, RW, IOVA, 1), DW_PROT_PD_MISMATCH);
        cr_expect_eq(rchk(mr->stag, NULL, RW, IOVA, 1), DW_PROT_PD_MISMATCH);
        cr_expect_eq(dw_mr_check_local(&tab, mr->stag, &pd_b, LW, IOVA, 1, &p),
                     DW_PROT_PD_MISMATCH);
        /* PD is checked before rights and bounds */
        cr_expect_eq(rchk(mr->stag, &pd_b, RW, 0, 1), DW_PROT_PD_MISMATCH);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 1), DW_PROT_OK);
}

/* ---- access rights --------------------------------------------------- */

Test(mr, each_remote_access_bit)
{
        const int rights[] = {RR, RW, RA};
        for (unsigned i = 0; i < 3; i++) {
                struct dw_mr *mr = reg(&pd_a, IOVA, LW | rights[i]);
                for (unsigned j = 0; j < 3; j++) {
                        enum dw_prot_status want = i == j ? DW_PROT_OK : DW_PROT_ACCESS;
                        cr_expect_eq(rchk(mr->stag, &pd_a, rights[j], IOVA, 8), want,
                                     "granted %#x needed %#x", rights[i], rights[j]);
                }
                /* several needed bits: all must be granted */
                cr_expect_eq(rchk(mr->stag, &pd_a, RR | RW, IOVA, 8), DW_PROT_ACCESS);
                cr_assert_eq(dw_mr_deregister(&tab, mr), 0);
        }
        struct dw_mr *both = reg(&pd_a, IOVA, LW | RR | RW);
        cr_expect_eq(rchk(both->stag, &pd_a, RR | RW, IOVA, 8), DW_PROT_OK);
        cr_expect_eq(rchk(both->stag, &pd_a, RR | RW | RA, IOVA, 8), DW_PROT_ACCESS);
}

Test(mr, local_only_mr_refuses_remote)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW);
        cr_expect_eq(rchk(mr->stag, &pd_a, RR, IOVA, 1), DW_PROT_ACCESS);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 1), DW_PROT_ACCESS);
        cr_expect_eq(rchk(mr->stag, &pd_a, RA, IOVA, 8), DW_PROT_ACCESS);
}

Test(mr, local_write_bit)
{
        struct dw_mr *ro = reg(&pd_a, IOVA, 0);
        struct dw_mr *rr = reg(&pd_a, IOVA, RR);
        struct dw_mr *rw = reg(&pd_a, IOVA, LW);
        uint8_t *p;
        /* send source: any registration may be read locally */
        cr_expect_eq(dw_mr_check_local(&tab, ro->stag, &pd_a, 0, IOVA, BUFSZ, &p), DW_PROT_OK);
        cr_expect_eq(p, buf);
        cr_expect_eq(dw_mr_check_local(&tab, rr->stag, &pd_a, 0, IOVA, BUFSZ, &p), DW_PROT_OK);
        /* receive buffer / read sink needs LOCAL_WRITE */
        cr_expect_eq(dw_mr_check_local(&tab, ro->stag, &pd_a, LW, IOVA, 1, &p), DW_PROT_ACCESS);
        cr_expect_null(p);
        cr_expect_eq(dw_mr_check_local(&tab, rr->stag, &pd_a, LW, IOVA, 1, &p), DW_PROT_ACCESS);
        cr_expect_eq(dw_mr_check_local(&tab, rw->stag, &pd_a, LW, IOVA + 10, 5, &p), DW_PROT_OK);
        cr_expect_eq(p, buf + 10);
}

/* ---- bounds ---------------------------------------------------------- */

Test(mr, bounds_exact_edges)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        uint32_t s = mr->stag;
        uint8_t *p;

        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 0, RW, IOVA, 1, &p), DW_PROT_OK);
        cr_expect_eq(p, buf, "first byte");
        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 0, RW, IOVA + BUFSZ - 1, 1, &p),
                     DW_PROT_OK);
        cr_expect_eq(p, buf + BUFSZ - 1, "last byte");
        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 0, RW, IOVA, BUFSZ, &p), DW_PROT_OK);
        cr_expect_eq(p, buf, "whole region");
        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 0, RW, IOVA + 100, BUFSZ - 100, &p),
                     DW_PROT_OK, "tail up to the last byte");

        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + BUFSZ, 1), DW_PROT_BOUNDS, "one past the end");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA - 1, 1), DW_PROT_BOUNDS, "one before");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA - 1, 2), DW_PROT_BOUNDS, "straddles the start");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA, BUFSZ + 1), DW_PROT_BOUNDS, "one byte too long");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + BUFSZ - 1, 2), DW_PROT_BOUNDS, "straddles the end");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 100, BUFSZ - 99), DW_PROT_BOUNDS);
        cr_expect_eq(rchk(s, &pd_a, RW, 0, IOVA + BUFSZ), DW_PROT_BOUNDS, "covers from 0");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 2 * BUFSZ, 1), DW_PROT_BOUNDS, "far beyond");

        /* local checks use the same arithmetic */
        cr_expect_eq(dw_mr_check_local(&tab, s, &pd_a, LW, IOVA + BUFSZ - 1, 1, &p), DW_PROT_OK);
        cr_expect_eq(dw_mr_check_local(&tab, s, &pd_a, LW, IOVA + BUFSZ, 1, &p), DW_PROT_BOUNDS);
        cr_expect_eq(dw_mr_check_local(&tab, s, &pd_a, LW, IOVA - 1, 1, &p), DW_PROT_BOUNDS);
}

Test(mr, to_plus_len_wrap)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        uint32_t s = mr->stag;
        uint8_t *p;
        cr_expect_eq(rchk(s, &pd_a, RW, UINT64_MAX, 1), DW_PROT_TO_WRAP);
        cr_expect_eq(rchk(s, &pd_a, RW, UINT64_MAX - 9, 10), DW_PROT_TO_WRAP);
        cr_expect_eq(rchk(s, &pd_a, RW, UINT64_MAX - 9, 9), DW_PROT_BOUNDS, "no wrap: bounds");
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA, UINT64_MAX), DW_PROT_TO_WRAP);
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 1, UINT64_MAX - IOVA), DW_PROT_TO_WRAP);
        /* a wrapped sum that lands inside the region must not pass */
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 8, UINT64_MAX - 3), DW_PROT_TO_WRAP);
        cr_expect_eq(dw_mr_check_local(&tab, s, &pd_a, LW, UINT64_MAX - 1, 4, &p), DW_PROT_TO_WRAP);
        cr_expect_null(p);
}

Test(mr, zero_based)
{
        struct dw_mr *mr = reg(&pd_a, 0xdead0000, LW | RW | RR | DIWARP_ACCESS_ZERO_BASED);
        uint8_t *p;
        cr_expect_eq(mr->iova, 0, "iova ignored with ZERO_BASED");
        cr_expect_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RW, 0, 1, &p), DW_PROT_OK);
        cr_expect_eq(p, buf);
        cr_expect_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RR, BUFSZ - 1, 1, &p),
                     DW_PROT_OK);
        cr_expect_eq(p, buf + BUFSZ - 1);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, BUFSZ, 1), DW_PROT_BOUNDS);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, 0xdead0000, 1), DW_PROT_BOUNDS,
                     "the given iova is not an address of a zero-based MR");
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, (uintptr_t)buf, 1), DW_PROT_BOUNDS);
        cr_expect_eq(dw_mr_check_local(&tab, mr->stag, &pd_a, LW, 16, 16, &p), DW_PROT_OK);
        cr_expect_eq(p, buf + 16);
}

Test(mr, iova_equals_address)
{
        /* plain ibv_reg_mr: the engine passes the host address as iova */
        uint64_t va = (uintptr_t)buf;
        struct dw_mr *mr = reg(&pd_a, va, LW | RW);
        uint8_t *p;
        cr_expect_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RW, va + 123, 7, &p), DW_PROT_OK);
        cr_expect_eq(p, buf + 123);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, 123, 7), DW_PROT_BOUNDS);
}

Test(mr, zero_length_always_ok)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW);
        uint8_t *p = buf;
        const uint32_t stags[] = {0, 0xffffffffu, mr->stag ^ 1, mr->stag};
        for (unsigned i = 0; i < 4; i++) {
                p = buf;
                cr_expect_eq(
                    dw_mr_check_remote(&tab, stags[i], &pd_b, 0, RW | RR | RA, UINT64_MAX, 0, &p),
                    DW_PROT_OK);
                cr_expect_null(p, "no address for a zero-length access");
                p = buf;
                cr_expect_eq(dw_mr_check_local(&tab, stags[i], NULL, LW, 0, 0, &p), DW_PROT_OK);
                cr_expect_null(p);
        }
        cr_assert_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 0), 0);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 0), DW_PROT_OK);
}

Test(mr, host_addr_may_be_null)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        cr_expect_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RW, IOVA, 1, NULL), DW_PROT_OK);
        cr_expect_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RW, 0, 1, NULL), DW_PROT_BOUNDS);
        cr_expect_eq(dw_mr_check_local(&tab, mr->stag, &pd_a, LW, IOVA, 1, NULL), DW_PROT_OK);
}

Test(mr, check_order)
{
        /* first failure wins: STag, invalidated, PD, access, wrap, bounds */
        struct dw_mr *mr = reg(&pd_a, IOVA, LW);
        uint32_t s = mr->stag;
        cr_expect_eq(rchk(s ^ 0x80, &pd_b, RW, UINT64_MAX, 2), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(s, &pd_b, RW, UINT64_MAX, 2), DW_PROT_PD_MISMATCH);
        cr_expect_eq(rchk(s, &pd_a, RW, UINT64_MAX, 2), DW_PROT_ACCESS);
        cr_expect_eq(rchk(s, &pd_a, 0, UINT64_MAX, 2), DW_PROT_TO_WRAP);
        cr_expect_eq(rchk(s, &pd_a, 0, 0, 2), DW_PROT_BOUNDS);
        cr_assert_eq(dw_mr_invalidate(&tab, s, &pd_a, 0), 0);
        cr_expect_eq(rchk(s, &pd_b, RW, UINT64_MAX, 2), DW_PROT_INVALIDATED);
}

/* ---- invalidation ---------------------------------------------------- */

Test(mr, invalidate_blocks_all_access)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        uint8_t *p;
        cr_assert_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 0), 0);
        cr_expect_not(mr->valid);
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 1), DW_PROT_INVALIDATED);
        cr_expect_eq(rchk(mr->stag, &pd_a, RR, IOVA, 1), DW_PROT_INVALIDATED);
        cr_expect_eq(rchk(mr->stag, &pd_a, 0, IOVA, 1), DW_PROT_INVALIDATED);
        /* lkey = rkey: the local side is invalid too */
        cr_expect_eq(dw_mr_check_local(&tab, mr->stag, &pd_a, 0, IOVA, 1, &p), DW_PROT_INVALIDATED);
        cr_expect_null(p);
        /* still registered: lookup finds it, the slot is not free */
        cr_expect_eq(dw_mr_lookup(&tab, mr->stag), mr);
        cr_expect_eq(tab.count, 1);
        cr_expect_eq(pd_a.use_count, 1);
        /* a second invalidation fails */
        cr_expect_eq(dw_mr_invalidate_status(&tab, mr->stag, &pd_a, 0), DW_PROT_INVALIDATED);
        cr_expect_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 0), -EINVAL);
        /* only deregistration ends it; the slot's next STag works */
        uint32_t old = mr->stag;
        cr_assert_eq(dw_mr_deregister(&tab, mr), 0);
        cr_expect_eq(pd_a.use_count, 0);
        struct dw_mr *again = reg(&pd_a, IOVA, ALL_REMOTE);
        cr_expect_eq(rchk(again->stag, &pd_a, RW, IOVA, 1), DW_PROT_OK);
        cr_expect_eq(rchk(old, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
}

Test(mr, invalidate_other_pd_refused)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        cr_expect_eq(dw_mr_invalidate_status(&tab, mr->stag, &pd_b, 0), DW_PROT_PD_MISMATCH);
        cr_expect_eq(dw_mr_invalidate(&tab, mr->stag, &pd_b, 0), -EACCES);
        cr_expect_eq(dw_mr_invalidate(&tab, mr->stag, NULL, 0), -EACCES);
        cr_expect(mr->valid, "a refused invalidate changes nothing");
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA, 1), DW_PROT_OK);
        cr_expect_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 0), 0);
}

Test(mr, invalidate_bad_stags)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, ALL_REMOTE);
        uint32_t idx = dw_stag_index(mr->stag);
        for (uint32_t k = 0; k < 256; k++) {
                if (k == dw_stag_key(mr->stag))
                        continue;
                cr_expect_eq(dw_mr_invalidate_status(&tab, idx << 8 | k, &pd_a, 0),
                             DW_PROT_INVALID_STAG);
        }
        cr_expect_eq(dw_mr_invalidate(&tab, (idx + 1) << 8, &pd_a, 0), -EINVAL);
        cr_expect_eq(dw_mr_invalidate(&tab, UINT32_MAX, &pd_a, 0), -EINVAL);
        cr_expect(mr->valid, "guessed STags invalidate nothing");
}

Test(mr, invalidate_one_leaves_others)
{
        struct dw_mr *a = reg(&pd_a, IOVA, ALL_REMOTE);
        struct dw_mr *b = reg(&pd_a, IOVA, ALL_REMOTE);
        cr_assert_eq(dw_mr_invalidate(&tab, a->stag, &pd_a, 0), 0);
        cr_expect_eq(rchk(b->stag, &pd_a, RW, IOVA, 1), DW_PROT_OK);
        cr_expect_eq(rchk(a->stag, &pd_a, RW, IOVA, 1), DW_PROT_INVALIDATED);
}

/* ---- mappings -------------------------------------------------------- */

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

Test(mr_map, status_str)
{
        cr_expect_str_eq(dw_prot_status_str(DW_PROT_OK), "ok");
        for (unsigned i = 0; i < NFAIL; i++) {
                const char *s = dw_prot_status_str(all_fail[i]);
                cr_assert_not_null(s);
                cr_expect_str_neq(s, "ok");
                cr_expect_str_neq(s, "unknown protection status");
                for (unsigned j = 0; j < i; j++)
                        cr_expect_str_neq(s, dw_prot_status_str(all_fail[j]));
        }
        cr_expect_str_eq(dw_prot_status_str((enum dw_prot_status)99), "unknown protection status");
}

Test(mr_map, wc_status)
{
        cr_expect_eq(dw_prot_status_to_wc(DW_PROT_OK, true), DIWARP_WC_SUCCESS);
        cr_expect_eq(dw_prot_status_to_wc(DW_PROT_OK, false), DIWARP_WC_SUCCESS);
        for (unsigned i = 0; i < NFAIL; i++) {
                cr_expect_eq(dw_prot_status_to_wc(all_fail[i], true), DIWARP_WC_REM_ACCESS_ERR);
                cr_expect_eq(dw_prot_status_to_wc(all_fail[i], false), DIWARP_WC_LOC_PROT_ERR);
        }
        /* the ibverbs numbers */
        cr_expect_eq(DIWARP_WC_REM_ACCESS_ERR, 10);
        cr_expect_eq(DIWARP_WC_LOC_PROT_ERR, 4);
}

/* ---- re-registration (ibv_rereg_mr) ---------------------------------- */

Test(mr, rereg_access_keeps_stag_and_changes_rights)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        uint32_t stag = mr->stag;
        cr_assert_eq(rchk(stag, &pd_a, RW, IOVA, 64), DW_PROT_OK);
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_ACCESS, NULL, NULL, 0, 0, LW), 0);
        cr_assert_eq(mr->stag, stag, "the STag a peer holds still names the region");
        cr_assert_eq(rchk(stag, &pd_a, RW, IOVA, 64), DW_PROT_ACCESS);
        cr_assert_eq(mr->addr, buf);
        cr_assert_eq(mr->length, BUFSZ);
        cr_assert_eq(mr->iova, IOVA);
}

Test(mr, rereg_pd_moves_the_use_count)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_PD, &pd_b, NULL, 0, 0, 0), 0);
        cr_assert_eq(rchk(mr->stag, &pd_a, RW, IOVA, 64), DW_PROT_PD_MISMATCH);
        cr_assert_eq(rchk(mr->stag, &pd_b, RW, IOVA, 64), DW_PROT_OK);
        cr_assert_eq(dw_pd_fini(&pd_a), 0, "the old PD has no user left");
        cr_assert_eq(dw_pd_fini(&pd_b), -EBUSY);
        cr_assert_eq(dw_mr_deregister(&tab, mr), 0);
        cr_assert_eq(dw_pd_fini(&pd_b), 0);
}

Test(mr, rereg_translation_moves_the_bounds)
{
        static uint8_t other[2 * BUFSZ];
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        cr_assert_eq(
            dw_mr_rereg(&tab, mr, DW_MR_REREG_TRANSLATION, NULL, other, sizeof(other), 0x40000, 0),
            0);
        uint8_t *p = NULL;
        cr_assert_eq(dw_mr_check_remote(&tab, mr->stag, &pd_a, 0, RW, 0x40000 + BUFSZ, 16, &p),
                     DW_PROT_OK);
        cr_assert_eq(p, other + BUFSZ);
        cr_assert_eq(rchk(mr->stag, &pd_a, RW, IOVA, 16), DW_PROT_BOUNDS);
        cr_assert_eq(mr->access, LW | RW, "the rights stay");
}

Test(mr, rereg_bad_input_changes_nothing)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        struct dw_mr before = *mr;
        cr_assert_eq(dw_mr_rereg(&tab, mr, 0, NULL, NULL, 0, 0, 0), -EINVAL, "no flag");
        cr_assert_eq(dw_mr_rereg(&tab, mr, 1 << 3, NULL, NULL, 0, 0, 0), -EINVAL, "unknown");
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_PD, NULL, NULL, 0, 0, 0), -EINVAL);
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_ACCESS, NULL, NULL, 0, 0, RW), -EINVAL,
                     "remote write without local write");
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_TRANSLATION, NULL, NULL, 64, 0, 0), -EINVAL,
                     "no address for 64 bytes");
        cr_assert_eq(memcmp(&before, mr, sizeof(before)), 0);
        cr_assert_eq(pd_a.use_count, 1);
        cr_assert_eq(dw_mr_deregister(&tab, mr), 0);
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_ACCESS, NULL, NULL, 0, 0, LW), -EINVAL,
                     "a deregistered region");
}

Test(mr, rereg_revives_an_invalidated_region)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | RW);
        cr_assert_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 0), 0);
        cr_assert_eq(rchk(mr->stag, &pd_a, RW, IOVA, 16), DW_PROT_INVALIDATED);
        cr_assert_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_ACCESS, NULL, NULL, 0, 0, LW | RW), 0);
        cr_assert_eq(rchk(mr->stag, &pd_a, RW, IOVA, 16), DW_PROT_OK);
}

/* ---- memory windows ---------------------------------------------------- */

#define MWB DIWARP_ACCESS_MW_BIND

static struct dw_mr *mw_new(struct dw_pd *pd, int kind)
{
        struct dw_mr *mw = NULL;
        cr_assert_eq(dw_mw_alloc(&tab, pd, kind, &mw), 0);
        cr_assert_not_null(mw);
        return mw;
}

/* The window's STag with another key byte (the verbs' ibv_inc_rkey). */
static uint32_t next_key(uint32_t stag)
{
        return (stag & ~0xffu) | (uint8_t)(stag + 1);
}

static int bind(struct dw_mr *mw, const struct dw_pd *pd, uint32_t qpn, uint32_t new_stag,
                const struct dw_mr *mr, uint64_t addr, uint64_t len, int access)
{
        struct dw_mw_bind b = {.new_stag = new_stag,
                               .mr_stag = mr ? mr->stag : 0,
                               .addr = addr,
                               .length = len,
                               .access = access};
        const char *why = NULL;
        int rc = dw_mw_bind(&tab, mw->kind, pd, qpn, &b, &why);
        if (rc)
                cr_assert_not_null(why, "a refused bind says why");
        return rc;
}

static enum dw_prot_status rchk_qp(uint32_t stag, uint32_t qpn, int acc, uint64_t to, uint64_t len)
{
        uint8_t *p = (uint8_t *)1;
        enum dw_prot_status st = dw_mr_check_remote(&tab, stag, &pd_a, qpn, acc, to, len, &p);
        if (st != DW_PROT_OK)
                cr_assert_null(p);
        return st;
}

Test(mr, mw_alloc_is_unbound_and_counts_on_the_pd)
{
        struct dw_mr *mw = NULL;
        cr_expect_eq(dw_mw_alloc(&tab, &pd_a, DW_STAG_MR, &mw), -EINVAL);
        cr_expect_eq(dw_mw_alloc(&tab, &pd_a, 3, &mw), -EINVAL);
        struct dw_mr *w1 = mw_new(&pd_a, DW_STAG_MW1);
        struct dw_mr *w2 = mw_new(&pd_a, DW_STAG_MW2);
        cr_expect_neq(dw_stag_index(w1->stag), dw_stag_index(w2->stag));
        cr_expect_eq(pd_a.use_count, 2);
        cr_expect_eq(dw_pd_fini(&pd_a), -EBUSY);
        /* Unbound: no remote access, and a window is never an lkey. */
        cr_expect_eq(rchk(w1->stag, &pd_a, RW, 0, 1), DW_PROT_INVALIDATED);
        cr_expect_eq(dw_mr_check_local(&tab, w1->stag, &pd_a, 0, 0, 1, NULL), DW_PROT_INVALID_STAG);
        /* Regions and windows do not mix in dereg/dealloc. */
        cr_expect_eq(dw_mr_deregister(&tab, w1), -EINVAL);
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        cr_expect_eq(dw_mw_dealloc(&tab, mr), -EINVAL);
        cr_expect_eq(dw_mw_dealloc(&tab, w1), 0);
        cr_expect_eq(dw_mw_dealloc(&tab, w1), -EINVAL);
        cr_expect_eq(dw_mw_dealloc(&tab, w2), 0);
        cr_expect_eq(dw_mr_deregister(&tab, mr), 0);
        cr_expect_eq(pd_a.use_count, 0);
}

Test(mr, mw_bounds_and_rights)
{
        /* The region grants no remote right itself: the window does. */
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *mw = mw_new(&pd_a, DW_STAG_MW1);
        uint32_t s = next_key(mw->stag);
        cr_assert_eq(bind(mw, &pd_a, 7, s, mr, IOVA + 100, 200, RW | LW), 0);
        cr_expect_eq(mw->stag, s);
        cr_expect_eq(mr->nbound, 1);

        uint8_t *p = NULL;
        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 7, RW, IOVA + 100, 200, &p), DW_PROT_OK);
        cr_expect_eq(p, buf + 100);
        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 9, RW, IOVA + 299, 1, &p), DW_PROT_OK,
                     "type 1 serves any QP of its PD");
        cr_expect_eq(p, buf + 299);
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 99, 1), DW_PROT_BOUNDS);
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 300, 1), DW_PROT_BOUNDS);
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA + 100, 201), DW_PROT_BOUNDS);
        cr_expect_eq(rchk(s, &pd_a, RW, UINT64_MAX, 2), DW_PROT_TO_WRAP);
        cr_expect_eq(rchk(s, &pd_a, RR, IOVA + 100, 1), DW_PROT_ACCESS);
        cr_expect_eq(rchk(s, &pd_a, RA, IOVA + 100, 8), DW_PROT_ACCESS);
        cr_expect_eq(rchk(s, &pd_b, RW, IOVA + 100, 1), DW_PROT_PD_MISMATCH);
        cr_expect_eq(dw_mr_check_local(&tab, s, &pd_a, LW, IOVA + 100, 1, NULL),
                     DW_PROT_INVALID_STAG);
        /* The region itself still refuses remote access. */
        cr_expect_eq(rchk(mr->stag, &pd_a, RW, IOVA + 100, 1), DW_PROT_ACCESS);
}

Test(mr, mw_zero_based)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *mw = mw_new(&pd_a, DW_STAG_MW2);
        uint32_t s = next_key(mw->stag);
        cr_assert_eq(bind(mw, &pd_a, 3, s, mr, IOVA + 64, 64, RR | DIWARP_ACCESS_ZERO_BASED), 0);
        uint8_t *p = NULL;
        cr_expect_eq(dw_mr_check_remote(&tab, s, &pd_a, 3, RR, 0, 64, &p), DW_PROT_OK);
        cr_expect_eq(p, buf + 64);
        cr_expect_eq(rchk_qp(s, 3, RR, 1, 64), DW_PROT_BOUNDS);
        cr_expect_eq(rchk_qp(s, 3, RR, IOVA + 64, 1), DW_PROT_BOUNDS);
}

Test(mr, mw_bind_refusals_change_nothing)
{
        struct dw_mr *nobind = reg(&pd_a, IOVA, LW | RW);
        struct dw_mr *noloc = reg(&pd_a, IOVA, MWB | RR);
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *other = reg(&pd_b, IOVA, LW | MWB);
        struct dw_mr *mw = mw_new(&pd_a, DW_STAG_MW1);
        uint32_t old = mw->stag, s = next_key(old);

        cr_expect_eq(bind(mw, &pd_a, 1, s, nobind, IOVA, 10, RW), -EACCES, "no MW_BIND");
        cr_expect_eq(bind(mw, &pd_a, 1, s, noloc, IOVA, 10, RW), -EACCES, "RW without LW");
        cr_expect_eq(bind(mw, &pd_a, 1, s, noloc, IOVA, 10, RA), -EACCES, "RA without LW");
        cr_expect_eq(bind(mw, &pd_a, 1, s, other, IOVA, 10, RW), -EACCES, "region of other PD");
        cr_expect_eq(bind(mw, &pd_b, 1, s, other, IOVA, 10, RW), -EACCES, "window of other PD");
        cr_expect_eq(bind(mw, &pd_a, 1, s, mr, IOVA - 1, 10, RW), -EINVAL);
        cr_expect_eq(bind(mw, &pd_a, 1, s, mr, IOVA + BUFSZ - 9, 10, RW), -EINVAL);
        cr_expect_eq(bind(mw, &pd_a, 1, s, mr, IOVA, BUFSZ + 1, RW), -EINVAL);
        cr_expect_eq(bind(mw, &pd_a, 1, s, mr, IOVA, 10, DIWARP_ACCESS_MW_BIND), -EINVAL);
        cr_expect_eq(bind(mw, &pd_a, 1, old, mr, IOVA, 10, RW), -EINVAL, "same key");
        cr_expect_eq(bind(mw, &pd_a, 1, s, mw, IOVA, 10, RW), -EINVAL, "a window as region");
        /* A bind for a type 2 window names a type 1 one: refused. */
        struct dw_mw_bind b = {.new_stag = s, .mr_stag = mr->stag, .addr = IOVA, .length = 10};
        cr_expect_eq(dw_mw_bind(&tab, DW_STAG_MW2, &pd_a, 1, &b, NULL), -EINVAL);
        b.new_stag = (dw_stag_index(s) ^ (tab.hmask + 1)) << 8 | 1; /* its bucket, not its handle */
        cr_expect_eq(dw_mw_bind(&tab, DW_STAG_MW1, &pd_a, 1, &b, NULL), -EINVAL);
        cr_assert_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 0), 0);
        cr_expect_eq(bind(mw, &pd_a, 1, s, mr, IOVA, 10, RW), -EINVAL, "region invalidated");

        cr_expect_eq(mw->stag, old);
        cr_expect_not(mw->valid);
        cr_expect_eq(mr->nbound + nobind->nbound + noloc->nbound + other->nbound, 0);
        /* Exactly the full region is fine. */
        cr_expect_eq(bind(mw, &pd_a, 1, s, noloc, IOVA, BUFSZ, RR), 0);
        cr_expect_eq(rchk(s, &pd_a, RR, IOVA, BUFSZ), DW_PROT_OK);
}

Test(mr, mw_key_change_kills_stale_stags)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *mw = mw_new(&pd_a, DW_STAG_MW1);
        uint32_t s0 = mw->stag, s1 = next_key(s0), s2 = next_key(s1), s3 = next_key(s2);
        cr_assert_eq(bind(mw, &pd_a, 1, s1, mr, IOVA, 100, RW), 0);
        cr_expect_eq(rchk(s1, &pd_a, RW, IOVA, 1), DW_PROT_OK);
        cr_expect_eq(rchk(s0, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
        /* Type 1 rebind: moves the window, kills s1. */
        cr_assert_eq(bind(mw, &pd_a, 1, s2, mr, IOVA + 1000, 100, RW | RR), 0);
        cr_expect_eq(mr->nbound, 1);
        cr_expect_eq(rchk(s1, &pd_a, RW, IOVA + 1000, 1), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(s2, &pd_a, RR, IOVA + 1000, 100), DW_PROT_OK);
        cr_expect_eq(rchk(s2, &pd_a, RR, IOVA, 1), DW_PROT_BOUNDS);
        /* Zero-length bind: unbound, new key. */
        cr_assert_eq(bind(mw, &pd_a, 1, s3, NULL, 0, 0, 0), 0);
        cr_expect_eq(mr->nbound, 0);
        cr_expect_eq(rchk(s2, &pd_a, RW, IOVA + 1000, 1), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk(s3, &pd_a, RW, IOVA + 1000, 1), DW_PROT_INVALIDATED);
        /* Dealloc: the STag dies with the slot. */
        cr_assert_eq(bind(mw, &pd_a, 1, s0, mr, IOVA, 100, RW), 0);
        cr_assert_eq(dw_mw_dealloc(&tab, mw), 0);
        cr_expect_eq(mr->nbound, 0);
        cr_expect_eq(rchk(s0, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
}

Test(mr, mw_type1_refuses_invalidation)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *mw = mw_new(&pd_a, DW_STAG_MW1);
        uint32_t s = next_key(mw->stag);
        cr_assert_eq(bind(mw, &pd_a, 1, s, mr, IOVA, 100, RW), 0);
        cr_expect_eq(dw_mr_invalidate_status(&tab, s, &pd_a, 1), DW_PROT_NOT_INVALIDATABLE);
        cr_expect_eq(dw_mr_invalidate(&tab, s, &pd_a, 1), -EPERM);
        cr_expect_eq(rchk(s, &pd_a, RW, IOVA, 100), DW_PROT_OK, "still bound");
}

Test(mr, mw_type2_qp_invalidation_and_rebind)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *mw = mw_new(&pd_a, DW_STAG_MW2);
        uint32_t s1 = next_key(mw->stag), s2 = next_key(s1);
        cr_assert_eq(bind(mw, &pd_a, 5, s1, mr, IOVA, 100, RW | RR), 0);
        cr_expect_eq(rchk_qp(s1, 5, RW, IOVA, 100), DW_PROT_OK);
        cr_expect_eq(rchk_qp(s1, 6, RW, IOVA, 1), DW_PROT_PD_MISMATCH, "another QP");
        /* Bound: a second bind is refused until it is invalidated. */
        cr_expect_eq(bind(mw, &pd_a, 5, s2, mr, IOVA, 10, RW), -EBUSY);
        cr_expect_eq(dw_mr_invalidate_status(&tab, s1, &pd_a, 6), DW_PROT_PD_MISMATCH);
        cr_expect_eq(dw_mr_invalidate_status(&tab, s1, &pd_b, 5), DW_PROT_PD_MISMATCH);
        cr_expect_eq(dw_mr_invalidate_status(&tab, s1 ^ 0x80, &pd_a, 5), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk_qp(s1, 5, RW, IOVA, 1), DW_PROT_OK, "refusals changed nothing");
        cr_assert_eq(dw_mr_invalidate_status(&tab, s1, &pd_a, 5), DW_PROT_OK);
        cr_expect_eq(mr->nbound, 0);
        cr_expect_eq(rchk_qp(s1, 5, RW, IOVA, 1), DW_PROT_INVALIDATED);
        cr_expect_eq(dw_mr_invalidate_status(&tab, s1, &pd_a, 5), DW_PROT_INVALIDATED);
        /* Rebind needs a new key; the old STag then stays dead. */
        cr_expect_eq(bind(mw, &pd_a, 5, s1, mr, IOVA, 10, RW), -EINVAL);
        cr_assert_eq(bind(mw, &pd_a, 6, s2, mr, IOVA + 8, 8, RR), 0);
        cr_expect_eq(rchk_qp(s1, 6, RR, IOVA + 8, 8), DW_PROT_INVALID_STAG);
        cr_expect_eq(rchk_qp(s2, 6, RR, IOVA + 8, 8), DW_PROT_OK);
        cr_expect_eq(rchk_qp(s2, 5, RR, IOVA + 8, 8), DW_PROT_PD_MISMATCH);
        cr_expect_eq(rchk_qp(s2, 6, RW, IOVA + 8, 8), DW_PROT_ACCESS);
        /* The QP goes away: the window is unbound (its number may return). */
        dw_mw_qp_gone(&tab, 5);
        cr_expect_eq(rchk_qp(s2, 6, RR, IOVA + 8, 8), DW_PROT_OK, "another QP's window stays");
        dw_mw_qp_gone(&tab, 6);
        cr_expect_eq(rchk_qp(s2, 6, RR, IOVA + 8, 8), DW_PROT_INVALIDATED);
        cr_expect_eq(mr->nbound, 0);
        cr_expect_eq(tab.mw2_bound, 0);
}

Test(mr, mw_parent_region_state)
{
        struct dw_mr *mr = reg(&pd_a, IOVA, LW | MWB);
        struct dw_mr *w1 = mw_new(&pd_a, DW_STAG_MW1);
        struct dw_mr *w2 = mw_new(&pd_a, DW_STAG_MW2);
        uint32_t s1 = next_key(w1->stag), s2 = next_key(w2->stag);
        cr_assert_eq(bind(w1, &pd_a, 1, s1, mr, IOVA, 100, RW), 0);
        cr_assert_eq(bind(w2, &pd_a, 1, s2, mr, IOVA, 100, RW), 0);
        cr_expect_eq(mr->nbound, 2);
        /* Decision: no dereg or rereg under bound windows (hardware: EBUSY). */
        cr_expect_eq(dw_mr_deregister(&tab, mr), -EBUSY);
        cr_expect_eq(dw_mr_rereg(&tab, mr, DW_MR_REREG_ACCESS, NULL, NULL, 0, 0, LW), -EBUSY);
        cr_expect_eq(rchk(s1, &pd_a, RW, IOVA, 1), DW_PROT_OK, "refused dereg changed nothing");
        /* Invalidating the region stops access through its windows. */
        cr_assert_eq(dw_mr_invalidate(&tab, mr->stag, &pd_a, 1), 0);
        cr_expect_eq(rchk(s1, &pd_a, RW, IOVA, 1), DW_PROT_INVALIDATED);
        cr_expect_eq(rchk_qp(s2, 1, RW, IOVA, 1), DW_PROT_INVALIDATED);
        cr_expect_eq(dw_mr_deregister(&tab, mr), -EBUSY);
        /* Once no window is bound, the region goes. */
        cr_assert_eq(dw_mr_invalidate(&tab, s2, &pd_a, 1), 0);
        cr_assert_eq(dw_mw_dealloc(&tab, w1), 0);
        cr_expect_eq(dw_mr_deregister(&tab, mr), 0);
        cr_expect_eq(rchk(s1, &pd_a, RW, IOVA, 1), DW_PROT_INVALID_STAG);
}

/* ---- unpredictable STags ---------------------------------------------- */

/* Handles are 24 random bits, not an index counting up: registrations in a
 * row share no pattern a stranger could follow from one STag it saw. */
Test(mr_table, stags_unpredictable)
{
        enum { N = 4096 };
        struct dw_mr_table t;
        struct dw_pd pd;
        cr_assert_eq(dw_mr_table_init(&t, N), 0);
        dw_pd_init(&t, &pd, NULL);
        static uint32_t h[N];
        unsigned small = 0, high = 0, consecutive = 0;
        for (int i = 0; i < N; i++) {
                struct dw_mr *mr;
                cr_assert_eq(dw_mr_register(&t, &pd, buf, BUFSZ, 0, LW, &mr), 0);
                h[i] = dw_stag_index(mr->stag);
                cr_assert_neq(h[i], 0);
                small += h[i] <= N;
                high += h[i] >= 1u << 23;
                if (i && h[i] == h[i - 1] + 1)
                        consecutive++;
                cr_assert_eq(dw_mr_lookup(&t, mr->stag), mr);
        }
        /* With an index, every handle would be <= N and consecutive; random
         * 24-bit handles are almost never (expected N * N / 2^24 = 1). */
        cr_expect_lt(small, 16u, "%u handles among the first %u values", small, (unsigned)N);
        cr_expect_lt(consecutive, 4u);
        /* about half have the top bit */
        cr_expect(high > N / 2 - N / 8 && high < N / 2 + N / 8, "%u of %u with bit 23", high,
                  (unsigned)N);
        for (int i = 0; i < N; i++)
                for (int j = i + 1; j < N; j += 97)
                        cr_expect_neq(h[i], h[j]);
        dw_mr_table_destroy(&t);
}

/* Registrations and deregistrations in any order: every live STag found,
 * the table full at max, no deregistered STag ever valid again. */
Test(mr_table, churn)
{
        enum { N = 64 };
        struct dw_mr_table t;
        struct dw_pd pd;
        cr_assert_eq(dw_mr_table_init(&t, N), 0);
        dw_pd_init(&t, &pd, NULL);
        struct dw_mr *m[N] = {0};
        static uint32_t dead[4096];
        unsigned ndead = 0, x = 12345;
        for (int round = 0; round < 20000; round++) {
                x = x * 1103515245u + 12345u;
                unsigned i = (x >> 16) % N;
                if (m[i]) {
                        if (ndead < sizeof(dead) / sizeof(dead[0]))
                                dead[ndead++] = m[i]->stag;
                        cr_assert_eq(dw_mr_deregister(&t, m[i]), 0);
                        m[i] = NULL;
                } else {
                        cr_assert_eq(dw_mr_register(&t, &pd, buf, BUFSZ, 0, LW, &m[i]), 0);
                }
                if (round % 97 == 0)
                        for (unsigned k = 0; k < N; k++)
                                if (m[k]) {
                                        uint8_t *p;
                                        cr_assert_eq(dw_mr_lookup(&t, m[k]->stag), m[k]);
                                        cr_assert_eq(
                                            dw_mr_check_local(&t, m[k]->stag, &pd, 0, 0, 1, &p),
                                            DW_PROT_OK);
                                }
        }
        for (unsigned k = 0; k < N; k++)
                if (!m[k])
                        cr_assert_eq(dw_mr_register(&t, &pd, buf, BUFSZ, 0, LW, &m[k]), 0);
        struct dw_mr *extra = NULL;
        cr_expect_eq(dw_mr_register(&t, &pd, buf, BUFSZ, 0, LW, &extra), -ENOMEM);
        unsigned live_again = 0;
        for (unsigned k = 0; k < ndead; k++)
                live_again += dw_mr_lookup(&t, dead[k]) != NULL;
        cr_expect_eq(live_again, 0, "a deregistered STag came back");
        dw_mr_table_destroy(&t);
}
