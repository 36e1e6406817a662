/* Monotonic time for timers and fault-injection hold deadlines. */
#ifndef DW_UTIL_TIME_H
#define DW_UTIL_TIME_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds: never jumps with wall-clock changes, so
 * timeouts and delays computed from it stay correct. vDSO-backed, no syscall. */
static inline uint64_t dw_now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
