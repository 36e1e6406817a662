/* The RC connection state machine (rc/rc.c, dw_rc_set_state) against the
 * transitions rc/README.md lists: every listed move is taken, every other
 * one is refused and leaves the state as it was. */
#include <criterion/criterion.h>
#include <string.h>

#include "rc/rc.h"
#include "util/log.h"

#define N_STATES 5

static const enum dw_rc_conn_state all[N_STATES] = {DW_RC_IDLE, DW_RC_CONNECTING, DW_RC_UP,
                                                    DW_RC_CLOSING, DW_RC_CLOSED};

/* [from][to]: 1 where rc/README.md ("One writer of the connection state")
 * allows the move. */
static const int listed[N_STATES][N_STATES] = {
    /*               IDLE CONN UP CLOSING CLOSED */
    /* IDLE */ {0, 1, 1, 0, 0},
    /* CONNECTING */ {1, 0, 1, 0, 1},
    /* UP */ {0, 0, 0, 1, 1},
    /* CLOSING */ {0, 0, 0, 0, 1},
    /* CLOSED */ {1, 0, 0, 0, 0},
};

static void init(void)
{
        dw_log_set_level(DW_LOG_ERROR); /* the refusals' warn lines */
}

Test(rc_state, listed_moves_taken_others_refused, .init = init)
{
        static struct dw_qp qp;
        static struct dw_rc_conn c;

        qp.qpn = 0x2a;
        for (int f = 0; f < N_STATES; f++)
                for (int t = 0; t < N_STATES; t++) {
                        memset(&c, 0, sizeof(c));
                        c.qp = &qp;
                        c.state = all[f];
                        bool ok = dw_rc_set_state(&c, all[t], "test");
                        if (f == t) {
                                cr_assert(ok, "staying in %d is no transition", f);
                                cr_assert_eq(c.state, all[f]);
                        } else if (listed[f][t]) {
                                cr_assert(ok, "%d -> %d is listed but refused", f, t);
                                cr_assert_eq(c.state, all[t], "%d -> %d not taken", f, t);
                        } else {
                                cr_assert(!ok, "%d -> %d is not listed but taken", f, t);
                                cr_assert_eq(c.state, all[f], "%d -> %d changed the state", f, t);
                        }
                }
}

Test(rc_state, a_whole_stream_life, .init = init)
{
        static struct dw_qp qp;
        static struct dw_rc_conn c;

        qp.qpn = 0x2b;
        c.qp = &qp;
        c.state = DW_RC_IDLE;
        const enum dw_rc_conn_state life[] = {DW_RC_CONNECTING, DW_RC_UP, DW_RC_CLOSING,
                                              DW_RC_CLOSED, DW_RC_IDLE};
        for (size_t i = 0; i < sizeof(life) / sizeof(life[0]); i++) {
                cr_assert(dw_rc_set_state(&c, life[i], "test"), "step %zu", i);
                cr_assert_eq(c.state, life[i]);
        }
        /* A closed stream does not come back up without a reset. */
        cr_assert(dw_rc_set_state(&c, DW_RC_UP, "test"));
        cr_assert(dw_rc_set_state(&c, DW_RC_CLOSED, "test"));
        cr_assert(!dw_rc_set_state(&c, DW_RC_UP, "test"));
        cr_assert_eq(c.state, DW_RC_CLOSED);
}
