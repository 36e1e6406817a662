/* Leveled logging to stderr: "diwarp: <level>: <message>\n". */
#ifndef DW_UTIL_LOG_H
#define DW_UTIL_LOG_H

#include <stdbool.h>
#include <stdint.h>

#include <diwarp/diwarpdv.h>

#include "util/time.h"

/* The levels and the rate limiter are the public ones (diwarpdv.h's
 * diwarpdv_log*, which are these functions for programs on the library). */
enum dw_log_level {
        DW_LOG_ERROR = DIWARPDV_LOG_ERROR,
        DW_LOG_WARN = DIWARPDV_LOG_WARN,
        DW_LOG_INFO = DIWARPDV_LOG_INFO,
        DW_LOG_DEBUG = DIWARPDV_LOG_DEBUG,
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

/* Rate limit for lines a peer can cause once per datagram (a refused STag, a
 * forged NAK, a Send too long for its receive WR): a stranger must not be
 * able to flood the log. The first DW_LOG_LIMIT_BURST lines of a period of
 * DW_LOG_LIMIT_PERIOD_NS go out; the rest are counted, and the first line
 * let through in a later period is preceded by one line saying how many
 * were suppressed. One state per device (struct dw_device.log_limit), under
 * the device lock, for every such line of that device; zeroed is ready. */
#define DW_LOG_LIMIT_BURST     DIWARPDV_LOG_LIMIT_BURST
#define DW_LOG_LIMIT_PERIOD_NS (DIWARPDV_LOG_LIMIT_PERIOD_S * 1000000000ull)

struct dw_log_limit {
        struct diwarpdv_log_limit s;
};

/* Whether the next line may go out at now_ns (it is counted either way).
 * When a new period starts with lines suppressed, writes the count first
 * (at level). */
bool dw_log_limit_pass(struct dw_log_limit *l, int level, uint64_t now_ns);

/* Whether a warning through this limiter goes out now: the level is on and
 * the limiter lets it through. A caller that builds its line in pieces
 * formats them only when this said yes. */
static inline bool dw_warn_limit_pass(struct dw_log_limit *l)
{
        return dw_log_enabled(DW_LOG_WARN) && dw_log_limit_pass(l, DW_LOG_WARN, dw_now_ns());
}

/* dw_warn through a limiter; nothing is formatted for a line held back. */
#define dw_warn_limited(limit, ...)                                                                \
        do {                                                                                       \
                if (dw_warn_limit_pass(limit))                                                     \
                        dw_log(DW_LOG_WARN, __VA_ARGS__);                                          \
        } while (0)

#endif
