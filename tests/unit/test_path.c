/* Unit tests of flow/path's rails (multirail): dw_flow_path_set_rails takes
 * one reference on the path to each of a peer device's other addresses,
 * keeps them while the list is the same, gives them back when the list
 * changes, is cleared, or the canonical path goes. Run under ASan: a path
 * taken off the table and not freed shows as a leak. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <string.h>

#include "flow/path.h"

#define PORT htons(17471)
#define SEG  1500

static uint32_t ip(unsigned last)
{
        return htonl(0x0a000000u | last); /* 10.0.0.last, network order */
}

static void init(struct dw_flow_paths *t)
{
        struct dw_cc_params p;
        dw_cc_params_default(&p);
        dw_flow_paths_init(t, &p);
}

/* The path to ip:PORT if the table has it, without taking a reference:
 * dw_flow_path_get then put, checking get found it rather than making it. */
static struct dw_flow_path *lookup(struct dw_flow_paths *t, uint32_t a)
{
        uint32_t n = t->n;
        struct dw_flow_path *p = dw_flow_path_get(t, a, PORT, SEG);
        cr_assert_not_null(p);
        bool found = t->n == n;
        dw_flow_path_put(t, p);
        return found ? p : NULL;
}

Test(path, set_rails_takes_the_rail_paths)
{
        struct dw_flow_paths t;
        init(&t);
        /* A stream of our own already goes to 10.0.0.2: the rail shares it. */
        struct dw_flow_path *held = dw_flow_path_get(&t, ip(2), PORT, SEG);
        struct dw_flow_path *canon = dw_flow_path_get(&t, ip(1), PORT, SEG);
        cr_assert_eq(t.n, 2);
        uint32_t rails[] = {ip(1), ip(2), ip(3)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, rails, SEG), 0);
        cr_assert_eq(canon->nrails, 3);
        cr_assert_eq(memcmp(canon->rail_ip, rails, sizeof(rails)), 0);
        cr_assert_eq(canon->rail[0], canon, "rail 0 is the canonical path itself");
        cr_assert_eq(canon->refs, 1, "no reference of its own on itself");
        cr_assert_eq(canon->rail[1], held);
        cr_assert_eq(held->refs, 2, "the stream's and the rail's");
        cr_assert_eq(t.n, 3, "the path to 10.0.0.3 made");
        cr_assert_not_null(canon->rail[2]);
        cr_assert_eq(canon->rail[2]->refs, 1);
        for (unsigned i = 1; i < 3; i++) {
                cr_assert_neq(canon->rail[i], canon);
                cr_assert_eq(canon->rail[i]->ip, rails[i]);
                cr_assert_eq(canon->rail[i]->port, canon->port);
                cr_assert_eq(canon->rail[i]->cc.seg, SEG);
                cr_assert_eq(lookup(&t, rails[i]), canon->rail[i], "rail %u findable", i);
        }
        cr_assert_null(canon->rail[3]);

        dw_flow_path_put(&t, held);
        cr_assert_eq(canon->rail[1]->refs, 1, "the rail keeps it");
        cr_assert_eq(t.n, 3);
        dw_flow_path_put(&t, canon);
        cr_assert_eq(t.n, 0);
        dw_flow_paths_fini(&t);
}

Test(path, same_list_changes_nothing)
{
        struct dw_flow_paths t;
        init(&t);
        struct dw_flow_path *canon = dw_flow_path_get(&t, ip(1), PORT, SEG);
        uint32_t rails[] = {ip(1), ip(2), ip(3)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, rails, SEG), 0);
        struct dw_flow_path *r1 = canon->rail[1], *r2 = canon->rail[2];
        uint32_t n = t.n;
        /* State learnt on the rails must survive (a path made anew would
         * not have it, even at the same address). */
        r1->down = true;
        r2->last_ack = 1234;
        canon->rails_told_at = 99;
        for (int k = 0; k < 3; k++) {
                uint32_t again[] = {ip(1), ip(2), ip(3)}; /* an equal list, not the same array */
                cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, again, SEG), 0);
                cr_assert_eq(canon->nrails, 3);
                cr_assert_eq(canon->rail[0], canon);
                cr_assert_eq(canon->rail[1], r1);
                cr_assert_eq(canon->rail[2], r2);
                cr_assert_eq(r1->refs, 1, "no second reference");
                cr_assert_eq(r2->refs, 1);
                cr_assert_eq(canon->refs, 1);
                cr_assert_eq(t.n, n);
                cr_assert(r1->down);
                cr_assert_eq(r2->last_ack, 1234);
                cr_assert_eq(canon->rails_told_at, 99);
        }
        dw_flow_path_put(&t, canon);
        cr_assert_eq(t.n, 0);
        dw_flow_paths_fini(&t);
}

Test(path, another_list_replaces_the_rails)
{
        struct dw_flow_paths t;
        init(&t);
        struct dw_flow_path *held = dw_flow_path_get(&t, ip(3), PORT, SEG);
        struct dw_flow_path *canon = dw_flow_path_get(&t, ip(1), PORT, SEG);
        uint32_t a[] = {ip(1), ip(2), ip(3)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, a, SEG), 0);
        cr_assert_eq(t.n, 3);
        cr_assert_eq(held->refs, 2);

        /* 10.0.0.2 and the rail's hold on 10.0.0.3 go, 10.0.0.4 and .5 come. */
        uint32_t b[] = {ip(1), ip(4), ip(5)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, b, SEG), 0);
        cr_assert_eq(canon->nrails, 3);
        cr_assert_eq(memcmp(canon->rail_ip, b, sizeof(b)), 0);
        cr_assert_eq(canon->rail[0], canon);
        cr_assert_eq(canon->rail[1]->ip, ip(4));
        cr_assert_eq(canon->rail[2]->ip, ip(5));
        cr_assert_eq(held->refs, 1, "the old rail's reference given back");
        cr_assert_null(lookup(&t, ip(2)), "the old rail path freed");
        cr_assert_eq(t.n, 4, "canon, held, .4, .5");

        /* The same addresses in another order is another list. */
        uint32_t c[] = {ip(1), ip(5), ip(4)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, c, SEG), 0);
        cr_assert_eq(canon->rail[1]->ip, ip(5));
        cr_assert_eq(canon->rail[2]->ip, ip(4));
        cr_assert_eq(canon->rail[1]->refs, 1);
        cr_assert_eq(canon->rail[2]->refs, 1);
        cr_assert_eq(t.n, 4);

        /* A prefix of the list is another list too: 10.0.0.4 goes. */
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 2, c, SEG), 0);
        cr_assert_eq(canon->nrails, 2);
        cr_assert_eq(canon->rail[1]->ip, ip(5));
        cr_assert_null(canon->rail[2]);
        cr_assert_eq(t.n, 3);
        cr_assert_null(lookup(&t, ip(4)));

        /* Four rails at most: a longer list is cut. */
        uint32_t d[] = {ip(1), ip(2), ip(3), ip(4), ip(5), ip(6)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 6, d, SEG), 0);
        cr_assert_eq(canon->nrails, DW_FLOW_MAX_RAILS);
        cr_assert_eq(canon->rail[3]->ip, ip(4));
        cr_assert_eq(held->refs, 2);
        cr_assert_null(lookup(&t, ip(5)));
        cr_assert_null(lookup(&t, ip(6)));
        cr_assert_eq(t.n, 4, "canon, .2, held .3, .4");

        dw_flow_path_put(&t, canon);
        cr_assert_eq(t.n, 1);
        cr_assert_eq(held->refs, 1);
        dw_flow_path_put(&t, held);
        cr_assert_eq(t.n, 0);
        dw_flow_paths_fini(&t);
}

Test(path, fewer_than_two_clears)
{
        for (unsigned n = 0; n < 2; n++) {
                struct dw_flow_paths t;
                init(&t);
                struct dw_flow_path *canon = dw_flow_path_get(&t, ip(1), PORT, SEG);
                uint32_t a[] = {ip(1), ip(2), ip(3), ip(4)};
                cr_assert_eq(dw_flow_path_set_rails(&t, canon, 4, a, SEG), 0);
                cr_assert_eq(t.n, 4);
                cr_assert_eq(dw_flow_path_set_rails(&t, canon, n, a, SEG), 0);
                cr_assert_eq(canon->nrails, 0, "n=%u", n);
                for (unsigned i = 0; i < DW_FLOW_MAX_RAILS; i++)
                        cr_assert_null(canon->rail[i], "n=%u: rail %u kept", n, i);
                cr_assert_eq(t.n, 1, "n=%u: the rail paths freed", n);
                cr_assert_eq(canon->refs, 1);
                /* And set again from nothing. */
                cr_assert_eq(dw_flow_path_set_rails(&t, canon, 2, a, SEG), 0);
                cr_assert_eq(canon->nrails, 2);
                cr_assert_eq(t.n, 2);
                dw_flow_path_put(&t, canon);
                cr_assert_eq(t.n, 0);
                dw_flow_paths_fini(&t);
        }
}

Test(path, last_reference_releases_the_rails)
{
        struct dw_flow_paths t;
        init(&t);
        struct dw_flow_path *other = dw_flow_path_get(&t, ip(9), PORT, SEG);
        uint32_t n0 = t.n;
        struct dw_flow_path *canon = dw_flow_path_get(&t, ip(1), PORT, SEG);
        cr_assert_eq(dw_flow_path_get(&t, ip(1), PORT, SEG), canon);
        cr_assert_eq(canon->refs, 2);
        uint32_t a[] = {ip(1), ip(2), ip(3)};
        cr_assert_eq(dw_flow_path_set_rails(&t, canon, 3, a, SEG), 0);
        cr_assert_eq(t.n, n0 + 3);
        dw_flow_path_put(&t, canon);
        cr_assert_eq(t.n, n0 + 3, "a reference left: the rails stay");
        cr_assert_eq(canon->nrails, 3);
        cr_assert_eq(canon->rail[1]->refs, 1);
        dw_flow_path_put(&t, canon);
        cr_assert_eq(t.n, n0, "the canonical path and its rails gone");
        cr_assert_null(lookup(&t, ip(2)));
        cr_assert_null(lookup(&t, ip(3)));
        cr_assert_eq(other->refs, 1);
        dw_flow_path_put(&t, other);
        cr_assert_eq(t.n, 0);
        dw_flow_paths_fini(&t);
}
