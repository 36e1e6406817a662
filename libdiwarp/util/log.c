/* Leveled logging to stderr. See log.h. */
#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int dw_log_threshold = DW_LOG_DEFAULT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void dw_log_set_level(int level)
{
        if (level < DW_LOG_ERROR)
                level = DW_LOG_ERROR;
        if (level > DW_LOG_DEBUG)
                level = DW_LOG_DEBUG;
        __atomic_store_n(&dw_log_threshold, level, __ATOMIC_RELAXED);
}

int dw_log_get_level(void)
{
        return __atomic_load_n(&dw_log_threshold, __ATOMIC_RELAXED);
}

int dw_log_level_parse(const char *s)
{
        static const struct {
                const char *name;
                int level;
        } names[] = {
            {"error", DW_LOG_ERROR},  {"err", DW_LOG_ERROR}, {"warn", DW_LOG_WARN},
            {"warning", DW_LOG_WARN}, {"info", DW_LOG_INFO}, {"debug", DW_LOG_DEBUG},
            {"dbg", DW_LOG_DEBUG},    {"0", DW_LOG_ERROR},   {"1", DW_LOG_WARN},
            {"2", DW_LOG_INFO},       {"3", DW_LOG_DEBUG},
        };

        if (!s)
                return -EINVAL;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
                if (strcasecmp(s, names[i].name) == 0)
                        return names[i].level;
        return -EINVAL;
}

int dw_log_level_from_env(void)
{
        const char *v = getenv("DIWARP_LOG");

        if (!v || !*v)
                return DW_LOG_DEFAULT;
        return dw_log_level_parse(v);
}

static void dw_vlog(int level, const char *fmt, va_list ap)
{
        char line[1024];
        int n, m;

        if (level < DW_LOG_ERROR)
                level = DW_LOG_ERROR;
        if (level > DW_LOG_DEBUG)
                level = DW_LOG_DEBUG;
        n = snprintf(line, sizeof(line), "diwarp: %s: ", level_names[level]);
        m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
        if (m < 0)
                m = 0;
        n += m;
        /* Truncated: vsnprintf left the buffer NUL-terminated at size - 2. */
        if ((size_t)n > sizeof(line) - 2)
                n = (int)sizeof(line) - 2;
        /* Callers may or may not end the message with a newline; emit exactly one. */
        if (n > 0 && line[n - 1] == '\n')
                n--;
        line[n++] = '\n';
        /* One write so concurrent lines never interleave; the result is ignored
         * because there is nowhere left to report a failure to write stderr. */
        ssize_t w = write(STDERR_FILENO, line, (size_t)n);
        (void)w;
}

void dw_log(int level, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        dw_vlog(level, fmt, ap);
        va_end(ap);
}

static bool limit_pass(struct diwarpdv_log_limit *l, int level, uint64_t now_ns)
{
        if (!l)
                return true;
        if (l->period_start == 0 || now_ns - l->period_start >= DW_LOG_LIMIT_PERIOD_NS) {
                if (l->suppressed)
                        dw_log(level,
                               "%u similar lines suppressed in the last %llu s (rate limit: %u "
                               "per %llu s)",
                               l->suppressed,
                               (unsigned long long)((now_ns - l->period_start) / 1000000000ull),
                               DW_LOG_LIMIT_BURST,
                               (unsigned long long)(DW_LOG_LIMIT_PERIOD_NS / 1000000000ull));
                l->period_start = now_ns ? now_ns : 1;
                l->passed = 0;
                l->suppressed = 0;
        }
        if (l->passed < DW_LOG_LIMIT_BURST) {
                l->passed++;
                return true;
        }
        l->suppressed++;
        l->total_suppressed++;
        return false;
}

bool dw_log_limit_pass(struct dw_log_limit *l, int level, uint64_t now_ns)
{
        return limit_pass(l ? &l->s : NULL, level, now_ns);
}

/* ---- the public calls (diwarpdv.h) ---- */

static int clamp(int level)
{
        return level < DW_LOG_ERROR ? DW_LOG_ERROR : level > DW_LOG_DEBUG ? DW_LOG_DEBUG : level;
}

bool diwarpdv_log_enabled(int level)
{
        return dw_log_enabled(clamp(level));
}

void diwarpdv_log(int level, const char *fmt, ...)
{
        level = clamp(level);
        if (!dw_log_enabled(level))
                return;
        va_list ap;
        va_start(ap, fmt);
        dw_vlog(level, fmt, ap);
        va_end(ap);
}

int diwarpdv_log_from_env(void)
{
        int lvl = dw_log_level_from_env();
        if (lvl < 0)
                return lvl;
        dw_log_set_level(lvl);
        return 0;
}

bool diwarpdv_log_limit_pass(struct diwarpdv_log_limit *l, int level)
{
        return limit_pass(l, level, dw_now_ns());
}
