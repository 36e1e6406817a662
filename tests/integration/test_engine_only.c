/* diwarpdv_engine_only (include/diwarp/diwarpdv.h): a process that asked for
 * the engine runs it whatever DIWARP_PROGRESS says, and one that became a
 * daemon client before is told so. DIWARP_PROGRESS=daemon names a socket
 * where no daemon answers: a device opens only if the engine runs here.
 * Criterion runs each test in a process of its own, so each makes the
 * process's choice afresh. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

static char dir[256];

/* DIWARP_PROGRESS=daemon with a socket path nothing listens on. */
static void no_daemon(void)
{
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/diwarp-engine-only-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        cr_assert_not_null(mkdtemp(dir));
        char path[300];
        snprintf(path, sizeof(path), "%s/none.sock", dir);
        setenv("DIWARP_DAEMON_SOCKET", path, 1);
        setenv("DIWARP_PROGRESS", "daemon", 1);
}

static void cleanup(void)
{
        rmdir(dir);
}

Test(engine_only, despite_the_environment, .init = no_daemon, .fini = cleanup)
{
        cr_assert_eq(diwarpdv_engine_only(), 0);
        cr_assert_eq(diwarpdv_engine_only(), 0, "a second call is harmless");
        struct diwarp_device *dev = NULL;
        cr_assert_eq(diwarp_device_open(NULL, &dev), 0, "the engine runs here");
        /* Only the engine's devices can be driven from the program's loop. */
        cr_assert_geq(diwarpdv_external_progress(dev), 0);
        cr_assert_eq(diwarp_device_close(dev), 0);
}

Test(engine_only, after_the_client_was_chosen, .init = no_daemon, .fini = cleanup)
{
        struct diwarp_device *dev = NULL;
        cr_assert_lt(diwarp_device_open(NULL, &dev), 0, "a daemon client without a daemon");
        cr_assert_eq(diwarpdv_engine_only(), -EBUSY);
        cr_assert_lt(diwarp_device_open(NULL, &dev), 0, "still a daemon client");
}
