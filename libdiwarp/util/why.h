/* The reason a setting or argument was refused, for callers that print it. */
#ifndef DW_UTIL_WHY_H
#define DW_UTIL_WHY_H

#include <stddef.h>

/* Formats the reason into why (nothing when why is NULL or whylen 0) and
 * returns rc (a negative errno), so a check reads
 * `return dw_why(why, whylen, -EINVAL, "ring_slots %u < npeers %u", r, n);`. */
__attribute__((format(printf, 4, 5))) int dw_why(char *why, size_t whylen, int rc, const char *fmt,
                                                 ...);

#endif
