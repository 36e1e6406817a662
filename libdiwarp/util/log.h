/* Leveled logging to stderr: "diwarp: <level>: <message>\n". */
#ifndef DW_UTIL_LOG_H
#define DW_UTIL_LOG_H

enum dw_log_level {
        DW_LOG_ERROR = 0,
        DW_LOG_WARN = 1,
        DW_LOG_INFO = 2,
        DW_LOG_DEBUG = 3,
};

#define DW_LOG_DEFAULT DW_LOG_WARN

/* The current threshold. The one allowed global besides the device registry;
 * read and written with relaxed atomics (a stale level for one line is harmless).
 * Use dw_log_enabled() rather than touching it. */
extern int dw_log_threshold;

static inline int dw_log_enabled(int level)
{
        return level <= __atomic_load_n(&dw_log_threshold, __ATOMIC_RELAXED);
}

/* Clamps to [DW_LOG_ERROR, DW_LOG_DEBUG]. */
void dw_log_set_level(int level);
int dw_log_get_level(void);

/* "error"|"warn"|"info"|"debug" (case-insensitive; also "warning", "err",
 * "dbg", or a digit 0..3) -> the level; anything else -> -EINVAL. */
int dw_log_level_parse(const char *s);

/* DIWARP_LOG parsed: unset or empty -> DW_LOG_DEFAULT; bad value -> -EINVAL
 * (the caller decides whether to fail or to keep the default). */
int dw_log_level_from_env(void);

/* Formats and writes one line with a single write(2), so lines from several
 * threads never interleave. Long messages are truncated, never split. */
void dw_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The macros test the level before evaluating the arguments or formatting. */
#define dw_log_at(level, ...)                                                                      \
        do {                                                                                       \
                if (dw_log_enabled(level))                                                         \
                        dw_log(level, __VA_ARGS__);                                                \
        } while (0)
#define dw_err(...)  dw_log_at(DW_LOG_ERROR, __VA_ARGS__)
#define dw_warn(...) dw_log_at(DW_LOG_WARN, __VA_ARGS__)
#define dw_info(...) dw_log_at(DW_LOG_INFO, __VA_ARGS__)
#define dw_dbg(...)  dw_log_at(DW_LOG_DEBUG, __VA_ARGS__)

#endif
