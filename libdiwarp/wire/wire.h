/* Conventions shared by every codec in wire/.
 *
 * Codecs are pure: they read and write caller-provided buffers, never allocate,
 * never do I/O, and never trust a length taken from the input.
 *
 *   ssize_t dw_X_encode(const struct dw_X *in, uint8_t *buf, size_t cap);
 *       bytes written, or -ENOSPC (cap too small) / -EINVAL (field out of range).
 *   ssize_t dw_X_decode(const uint8_t *buf, size_t len, struct dw_X *out, const char **why);
 *       bytes consumed, or a negative errno; *why (if why != NULL) then points to
 *       a static sentence naming the field and the reason.
 *
 * Decode errors:
 *   -ENODATA   input shorter than the header or than a length it announces (truncated)
 *   -EPROTO    wrong version, unknown opcode or key
 *   -EBADMSG   reserved bits set, fields inconsistent with each other
 *   -EMSGSIZE  a length field beyond what the format or the caller allows
 *   -EILSEQ    CRC32c mismatch
 *   -ENOTSUP   a datagram without CRC32c that the caller does not accept
 *              (dw_dgram_packet_body)
 *   -ENOKEY    a datagram without an authentication tag where one is required
 *              (wire/seal.h, DIWARP_AUTH)
 *   -EKEYREJECTED an authentication tag that does not verify
 *   -ENOPROTOOPT  an authenticated datagram where no key is set
 */
#ifndef DIWARP_WIRE_H
#define DIWARP_WIRE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

static inline int dw_wire_fail(const char **why, const char *reason, int err)
{
        if (why)
                *why = reason;
        return -err;
}

static inline void dw_put_be16(uint8_t *p, uint16_t v)
{
        p[0] = (uint8_t)(v >> 8);
        p[1] = (uint8_t)v;
}

static inline void dw_put_be32(uint8_t *p, uint32_t v)
{
        p[0] = (uint8_t)(v >> 24);
        p[1] = (uint8_t)(v >> 16);
        p[2] = (uint8_t)(v >> 8);
        p[3] = (uint8_t)v;
}

static inline void dw_put_be64(uint8_t *p, uint64_t v)
{
        dw_put_be32(p, (uint32_t)(v >> 32));
        dw_put_be32(p + 4, (uint32_t)v);
}

static inline uint16_t dw_get_be16(const uint8_t *p)
{
        return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t dw_get_be32(const uint8_t *p)
{
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t dw_get_be64(const uint8_t *p)
{
        return (uint64_t)dw_get_be32(p) << 32 | dw_get_be32(p + 4);
}

#endif
