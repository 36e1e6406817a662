/* Monotonic time for timers and fault-injection hold deadlines, and the
 * pause of a short spin on a lock. */
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

/* One pause in a spin on a lock another thread holds for a moment: tells
 * the core (and a hyperthread sibling) that this thread only waits. */
static inline void dw_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield" ::: "memory");
#else
        __asm__ __volatile__("" ::: "memory");
#endif
}

#endif
