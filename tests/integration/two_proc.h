/* What the two-process integration programs (a parent and the child it
 * forks, talking over pipes) share: a clock, failure with the program's
 * name that also kills the other process, and whole pipe reads and writes.
 * The includer sets `who` (its name, changed per role) and child_pid. */
#ifndef DIWARP_TESTS_INTEGRATION_TWO_PROC_H
#define DIWARP_TESTS_INTEGRATION_TWO_PROC_H

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *who;
static pid_t child_pid; /* killed when this process fails */

static uint64_t now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void die(const char *fmt, ...)
{
        va_list ap;
        fprintf(stderr, "%s: FAIL: ", who);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        if (child_pid > 0) {
                kill(child_pid, SIGKILL);
                waitpid(child_pid, NULL, 0);
        }
        exit(1);
}

/* A native call's negative errno fails the program. */
#define CHECK(call)                                                                                \
        do {                                                                                       \
                int _e = (call);                                                                   \
                if (_e < 0)                                                                        \
                        die("%s: %s", #call, strerror(-_e));                                       \
        } while (0)

static void xwrite(int fd, const void *p, size_t n)
{
        if (write(fd, p, n) != (ssize_t)n)
                die("pipe write: %s", strerror(errno));
}

static void xread(int fd, void *p, size_t n)
{
        size_t got = 0;
        while (got < n) {
                ssize_t r = read(fd, (uint8_t *)p + got, n - got);
                if (r <= 0)
                        die("pipe read: %s", r ? strerror(errno) : "peer gone");
                got += (size_t)r;
        }
}

#endif
