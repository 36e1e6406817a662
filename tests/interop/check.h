/* CHECK and REQUIRE for the interop test programs: a failed check prints its
 * line and errno and counts in `failures`; REQUIRE also exits. Each evaluates
 * its condition once (the calls checked have side effects). */
#ifndef DIWARP_TESTS_INTEROP_CHECK_H
#define DIWARP_TESTS_INTEROP_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK_FAILED(cond)                                                                         \
        do {                                                                                       \
                fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, cond, errno, \
                        strerror(errno));                                                          \
                failures++;                                                                        \
        } while (0)

#define CHECK(cond)                                                                                \
        do {                                                                                       \
                if (!(cond))                                                                       \
                        CHECK_FAILED(#cond);                                                       \
        } while (0)

#define REQUIRE(cond)                                                                              \
        do {                                                                                       \
                if (!(cond)) {                                                                     \
                        CHECK_FAILED(#cond);                                                       \
                        exit(1);                                                                   \
                }                                                                                  \
        } while (0)

#endif
