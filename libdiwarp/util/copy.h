/* Copies whose last byte is stored last.
 *
 * A program that polls the last byte of a buffer an RDMA Write fills
 * (perftest's latency tests, the examples' write ping-pong) expects every
 * other byte of that Write in place once it sees it, as an RNIC's in-order
 * DMA gives. memcpy does not promise it: it may store its tail first, use
 * fast-string stores another core can see out of order, or non-temporal
 * stores that a release alone does not order. So the last byte goes after
 * a full fence. */
#ifndef DW_UTIL_COPY_H
#define DW_UTIL_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Stores v at last after every store before it is visible. */
static inline void dw_store_last_byte(uint8_t *last, uint8_t v)
{
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        *(volatile uint8_t *)last = v;
}

/* memcpy(dst, src, n), the last byte stored last (n may be 0). */
static inline void dw_copy_last_byte_last(void *dst, const void *src, size_t n)
{
        if (n == 0)
                return;
        memcpy(dst, src, n - 1);
        dw_store_last_byte((uint8_t *)dst + n - 1, ((const uint8_t *)src)[n - 1]);
}

#endif
