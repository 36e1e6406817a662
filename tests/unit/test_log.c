/* The library's public log and clock (include/diwarp/diwarpdv.h): the
 * threshold from DIWARP_LOG, the line format, the rate limiter, and the
 * clock. Lines are read back from a pipe that stands in for stderr. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <diwarp/diwarp.h>
#include <diwarp/diwarpdv.h>

static int pipe_rd = -1, saved_err = -1;

/* stderr into a non-blocking pipe. */
static void capture(void)
{
        int p[2];
        cr_assert_eq(pipe2(p, O_NONBLOCK), 0);
        saved_err = dup(STDERR_FILENO);
        cr_assert_geq(saved_err, 0);
        cr_assert_eq(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
        close(p[1]);
        pipe_rd = p[0];
}

static void release(void)
{
        dup2(saved_err, STDERR_FILENO);
        close(saved_err);
        close(pipe_rd);
}

/* What was written since the last call ("" if nothing). */
static const char *drain(void)
{
        static char buf[8192];
        ssize_t n = read(pipe_rd, buf, sizeof(buf) - 1);
        cr_assert(n >= 0 || errno == EAGAIN);
        buf[n > 0 ? n : 0] = 0;
        return buf;
}

static void set_env_level(const char *v)
{
        setenv("DIWARP_LOG", v, 1);
        cr_assert_eq(diwarpdv_log_from_env(), 0, "DIWARP_LOG=%s", v);
}

Test(log, threshold_from_env)
{
        set_env_level("debug");
        cr_assert(diwarpdv_log_enabled(DIWARPDV_LOG_DEBUG));
        setenv("DIWARP_LOG", "loud", 1);
        cr_assert_eq(diwarpdv_log_from_env(), -EINVAL);
        cr_assert(diwarpdv_log_enabled(DIWARPDV_LOG_DEBUG), "a bad value changed the threshold");
        set_env_level("error");
        cr_assert(diwarpdv_log_enabled(DIWARPDV_LOG_ERROR));
        cr_assert_not(diwarpdv_log_enabled(DIWARPDV_LOG_WARN));
        cr_assert(diwarpdv_log_enabled(-4), "below ERROR counts as ERROR");
        unsetenv("DIWARP_LOG");
        cr_assert_eq(diwarpdv_log_from_env(), 0);
        cr_assert(diwarpdv_log_enabled(DIWARPDV_LOG_WARN), "unset: warn");
        cr_assert_not(diwarpdv_log_enabled(DIWARPDV_LOG_INFO));
        cr_assert_not(diwarpdv_log_enabled(99), "above DEBUG counts as DEBUG");
}

Test(log, lines, .init = capture, .fini = release)
{
        set_env_level("warn");
        diwarpdv_log(DIWARPDV_LOG_WARN, "port %d refused", 42);
        cr_assert_str_eq(drain(), "diwarp: warn: port 42 refused\n");
        diwarpdv_log(DIWARPDV_LOG_ERROR, "ends with a newline\n");
        cr_assert_str_eq(drain(), "diwarp: error: ends with a newline\n");
        diwarpdv_log(DIWARPDV_LOG_INFO, "not written");
        diwarpdv_info("not written either");
        cr_assert_str_eq(drain(), "");
        diwarpdv_log(-1, "clamped");
        cr_assert_str_eq(drain(), "diwarp: error: clamped\n");
        char big[3000];
        memset(big, 'x', sizeof(big) - 1);
        big[sizeof(big) - 1] = 0;
        diwarpdv_warn("%s", big);
        const char *l = drain();
        cr_assert_lt(strlen(l), 1025u, "one line of at most 1 KiB");
        cr_assert_eq(l[strlen(l) - 1], '\n');
        cr_assert_eq(strchr(l, '\n'), l + strlen(l) - 1, "one line");
}

static int evaluated;
static int side_effect(void)
{
        return ++evaluated;
}

Test(log, rate_limit, .init = capture, .fini = release)
{
        set_env_level("warn");
        struct diwarpdv_log_limit lim = {0};
        for (unsigned i = 0; i < DIWARPDV_LOG_LIMIT_BURST; i++)
                cr_assert(diwarpdv_log_limit_pass(&lim, DIWARPDV_LOG_WARN), "line %u", i);
        cr_assert_not(diwarpdv_log_limit_pass(&lim, DIWARPDV_LOG_WARN));
        diwarpdv_warn_limited(&lim, "held back %d", side_effect());
        cr_assert_eq(evaluated, 0, "a held-back line's arguments were evaluated");
        cr_assert_eq(lim.suppressed, 2u);
        cr_assert_eq(lim.total_suppressed, 2u);
        cr_assert_str_eq(drain(), "");
        /* The period is over: the report, then the line. */
        lim.period_start -= (uint64_t)DIWARPDV_LOG_LIMIT_PERIOD_S * 1000000000ull + 1;
        diwarpdv_warn_limited(&lim, "let through %d", side_effect());
        cr_assert_eq(evaluated, 1);
        const char *out = drain();
        cr_assert(strstr(out, "diwarp: warn: 2 similar lines suppressed") == out, "%s", out);
        cr_assert_not_null(strstr(out, "\ndiwarp: warn: let through 1\n"), "%s", out);
        cr_assert_eq(lim.suppressed, 0u);
        cr_assert_eq(lim.total_suppressed, 2u);
}

Test(log, clock)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t before = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        uint64_t a = diwarpdv_now_ns();
        uint64_t b = diwarpdv_now_ns();
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t after = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        cr_assert(before <= a && a <= b && b <= after, "CLOCK_MONOTONIC in ns");
}
