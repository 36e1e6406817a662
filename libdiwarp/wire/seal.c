/* Datagram trailers: seal and open (seal.h). */
#include "seal.h"

#include <errno.h>
#include <string.h>

#include "crc32c.h"

void dw_seal_init(struct dw_seal *s, bool nocrc)
{
        memset(s, 0, sizeof(*s));
        s->nocrc = nocrc;
}

void dw_seal_begin(const struct dw_seal *s, struct dw_seal_run *r, uint8_t *hdr)
{
        (void)s;
        (void)hdr;
        r->crc = dw_crc32c_init();
}

void dw_seal_add(const struct dw_seal *s, struct dw_seal_run *r, const void *p, size_t n)
{
        (void)s;
        r->crc = dw_crc32c_update(r->crc, p, n);
}

void dw_seal_add_iov(const struct dw_seal *s, struct dw_seal_run *r, const struct iovec *iov,
                     size_t n)
{
        (void)s;
        r->crc = dw_crc32c_update_iov(r->crc, iov, n);
}

size_t dw_seal_end(struct dw_seal *s, struct dw_seal_run *r, const uint8_t *hdr, uint8_t *trl)
{
        (void)s;
        if (dw_dgram_nocrc(hdr, DW_DGRAM_HDR_LEN))
                return 0;
        dw_dgram_crc_trailer(trl, r->crc);
        return DW_DGRAM_CRC_LEN;
}

ssize_t dw_seal_packet(struct dw_seal *s, uint8_t *pkt, size_t len, size_t cap)
{
        (void)s;
        return dw_dgram_packet_finish(pkt, len, cap);
}

ssize_t dw_seal_open(const struct dw_seal *s, const uint8_t *pkt, size_t len, const char **why)
{
        return dw_dgram_packet_body(pkt, len, s->nocrc, why);
}

int dw_seal_open_iov(const struct dw_seal *s, const struct iovec *body, size_t n,
                     const uint8_t *trl, size_t trl_len, const char **why)
{
        const uint8_t *hdr = body[0].iov_base;
        if (dw_dgram_nocrc(hdr, body[0].iov_len)) {
                if (!s->nocrc)
                        return dw_wire_fail(why, "crc: datagram without CRC32c refused", ENOTSUP);
                return trl_len == 0
                           ? 0
                           : dw_wire_fail(why, "crc: trailer on a NOCRC datagram", EBADMSG);
        }
        if (trl_len != DW_DGRAM_CRC_LEN)
                return dw_wire_fail(why, "crc: datagram shorter than header + CRC32c", ENODATA);
        uint8_t want[DW_DGRAM_CRC_LEN];
        dw_dgram_crc_trailer(want, dw_crc32c_update_iov(dw_crc32c_init(), body, n));
        if (memcmp(want, trl, sizeof(want)) != 0)
                return dw_wire_fail(why, "crc: CRC32c mismatch", EILSEQ);
        return 0;
}
