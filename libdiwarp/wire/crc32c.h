/* CRC32c (Castagnoli), as iSCSI (RFC 3720) and MPA (RFC 5044) use it.
 * Backed by ISA-L's crc32_iscsi when available, otherwise by a table fallback;
 * both are pinned by the RFC 3720 B.4 vectors in tests/unit/test_crc32c.c.
 *
 * Incremental use, so a checksum can run over a header and scattered payload:
 *     uint32_t s = dw_crc32c_init();
 *     s = dw_crc32c_update(s, hdr, hdr_len);
 *     s = dw_crc32c_update(s, payload, payload_len);
 *     uint32_t crc = dw_crc32c_final(s);
 */
#ifndef DIWARP_WIRE_CRC32C_H
#define DIWARP_WIRE_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

static inline uint32_t dw_crc32c_init(void)
{
        return 0xFFFFFFFFu;
}

uint32_t dw_crc32c_update(uint32_t state, const void *buf, size_t len);

static inline uint32_t dw_crc32c_final(uint32_t state)
{
        return ~state;
}

/* One-shot CRC32c of a buffer. */
uint32_t dw_crc32c(const void *buf, size_t len);

/* CRC32c state advanced over an iovec array (for gathered sends). */
uint32_t dw_crc32c_update_iov(uint32_t state, const struct iovec *iov, size_t iovcnt);

/* The portable table implementation, exposed so tests can check it against the
 * vectors even when ISA-L is the one in use. */
uint32_t dw_crc32c_update_portable(uint32_t state, const void *buf, size_t len);

/* "isa-l" or "portable". */
const char *dw_crc32c_backend(void);

#endif
