/* wire/seal: the trailer of every datagram. CRC32c and NOCRC as the
 * datagram header says, and with a key AES-GMAC (X2-flag AUTH): a sealed
 * datagram opens; a changed header byte, payload byte, nonce or tag, another
 * key, a missing tag and a tag where no key is set are each refused with
 * their own error. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include <openssl/evp.h>

#include "wire/dgram.h"
#include "wire/rdmap.h"
#include "wire/seal.h"

static const uint8_t key1[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t key2[16] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
static const uint8_t start[DW_DGRAM_AUTH_NONCE_LEN] = {0xa1, 0xa2, 0xa3, 0xa4, 0,    0,
                                                       0,    0,    0,    0,    0xff, 0xfe};

/* A UD Send datagram's header and 64 payload bytes (no trailer); returns its length. */
static size_t ud_dgram(uint8_t *pkt)
{
        struct dw_dgram_hdr h = {
            .flags = DW_DGRAM_F_DATA, .dst_qpn = 0x42, .src_qpn = 0x43, .qkey = 7};
        ssize_t n = dw_dgram_encode(&h, pkt, 64);
        cr_assert_eq(n, DW_DGRAM_HDR_LEN);
        struct dw_rdmap_hdr r;
        cr_assert_eq(dw_rdmap_hdr_init(&r, DW_RDMAP_SEND), 0);
        r.ddp.last = true;
        r.ddp.msn = 1;
        cr_assert_eq(dw_rdmap_encode(&r, pkt + n, 64), DW_DGRAM_DDP_UNTAGGED_LEN);
        for (int i = 0; i < 64; i++)
                pkt[n + DW_DGRAM_DDP_UNTAGGED_LEN + i] = (uint8_t)(i * 3);
        return (size_t)n + DW_DGRAM_DDP_UNTAGGED_LEN + 64;
}

static void keyed(struct dw_seal *s, const uint8_t *key, size_t len)
{
        const char *why = NULL;
        cr_assert_eq(dw_seal_init(s, false, key, len, start, &why), 0, "%s", why ? why : "");
        cr_assert(s->mac);
}

Test(seal, crc_roundtrip_and_corruption)
{
        struct dw_seal s;
        cr_assert_eq(dw_seal_init(&s, false, NULL, 0, NULL, NULL), 0);
        uint8_t pkt[256];
        size_t len = ud_dgram(pkt);
        ssize_t n = dw_seal_packet(&s, pkt, len, sizeof(pkt));
        cr_assert_eq(n, (ssize_t)(len + DW_DGRAM_CRC_LEN));
        cr_assert_eq(dw_seal_open(&s, pkt, (size_t)n, NULL), (ssize_t)len);
        pkt[40] ^= 1;
        cr_assert_eq(dw_seal_open(&s, pkt, (size_t)n, NULL), -EILSEQ);
        dw_seal_fini(&s);
}

Test(seal, mac_roundtrip_marks_header)
{
        struct dw_seal s;
        keyed(&s, key1, sizeof(key1));
        uint8_t pkt[256];
        size_t len = ud_dgram(pkt);
        ssize_t n = dw_seal_packet(&s, pkt, len, sizeof(pkt));
        cr_assert_eq(n, (ssize_t)(len + DW_DGRAM_AUTH_LEN));
        cr_assert_eq(pkt[0], DW_DGRAM_VERSION2);
        cr_assert_eq(pkt[8], DW_DGRAM_X2_AUTH);
        cr_assert_eq(memcmp(pkt + len, start, sizeof(start)), 0, "the first nonce is the start");
        const char *why = NULL;
        cr_assert_eq(dw_seal_open(&s, pkt, (size_t)n, &why), (ssize_t)len, "%s", why);
        /* The header still decodes: UD, version 2 with AUTH alone. */
        struct dw_dgram_ud u, us;
        cr_assert_eq(dw_dgram_decode_ud(pkt, len, &u, &why), 0, "%s", why);
        cr_assert_eq(dw_dgram_decode_ud_strict(pkt, len, &us, &why), 0, "%s", why);
        cr_assert_eq(u.dst_qpn, 0x42);
        cr_assert_eq(u.payload_len, 64);
        /* The next datagram gets the next nonce (counter + 1, carry included). */
        uint8_t pkt2[256];
        len = ud_dgram(pkt2);
        n = dw_seal_packet(&s, pkt2, len, sizeof(pkt2));
        cr_assert_eq(pkt2[len + 11], 0xff);
        cr_assert_eq(pkt2[len + 10], 0xff);
        cr_assert_eq(memcmp(pkt2 + len, start, 10), 0);
        dw_seal_fini(&s);
}

Test(seal, mac_refuses_every_changed_byte)
{
        struct dw_seal s;
        keyed(&s, key1, sizeof(key1));
        uint8_t pkt[256], orig[256];
        size_t len = ud_dgram(pkt);
        size_t n = (size_t)dw_seal_packet(&s, pkt, len, sizeof(pkt));
        memcpy(orig, pkt, n);
        /* Header bytes, payload bytes, nonce, tag: each flip is refused. */
        for (size_t i = 0; i < n; i++) {
                if (i == 0 || i == 8)
                        continue; /* the AUTH marks: a flip there is "no tag" (below) */
                memcpy(pkt, orig, n);
                pkt[i] ^= 0x10;
                cr_assert_eq(dw_seal_open(&s, pkt, n, NULL), -EKEYREJECTED, "byte %zu", i);
        }
        memcpy(pkt, orig, n);
        pkt[8] &= (uint8_t)~DW_DGRAM_X2_AUTH;
        cr_assert_eq(dw_seal_open(&s, pkt, n, NULL), -ENOKEY);
        /* Truncated. */
        cr_assert_eq(dw_seal_open(&s, orig, DW_DGRAM_HDR_LEN + 4, NULL), -ENODATA);
        dw_seal_fini(&s);
}

Test(seal, wrong_key_missing_tag_and_no_key)
{
        struct dw_seal a, b, plain;
        keyed(&a, key1, sizeof(key1));
        keyed(&b, key2, sizeof(key2));
        cr_assert_eq(dw_seal_init(&plain, false, NULL, 0, NULL, NULL), 0);
        uint8_t pkt[256];
        size_t len = ud_dgram(pkt);
        size_t n = (size_t)dw_seal_packet(&a, pkt, len, sizeof(pkt));
        const char *why = NULL;
        cr_assert_eq(dw_seal_open(&b, pkt, n, &why), -EKEYREJECTED);
        cr_assert(strstr(why, "another key"));
        cr_assert_eq(dw_seal_open(&plain, pkt, n, &why), -ENOPROTOOPT);
        /* A CRC datagram at a keyed receiver: no tag. */
        uint8_t c[256];
        len = ud_dgram(c);
        n = (size_t)dw_seal_packet(&plain, c, len, sizeof(c));
        cr_assert_eq(dw_seal_open(&a, c, n, &why), -ENOKEY);
        cr_assert(strstr(why, "without a tag"));
        /* Bad key lengths are refused. */
        struct dw_seal x;
        cr_assert_eq(dw_seal_init(&x, false, key1, 20, start, NULL), -EINVAL);
        dw_seal_fini(&a);
        dw_seal_fini(&b);
        dw_seal_fini(&plain);
}

/* Sealed in pieces (gathered) equals sealed whole; opened in pieces too. */
Test(seal, pieces_equal_whole)
{
        struct dw_seal s1, s2;
        keyed(&s1, key1, sizeof(key1));
        keyed(&s2, key1, sizeof(key1));
        uint8_t a[256], b[256];
        size_t len = ud_dgram(a);
        ud_dgram(b);
        size_t n = (size_t)dw_seal_packet(&s1, a, len, sizeof(a));
        struct dw_seal_run r;
        dw_seal_begin(&s2, &r, b);
        struct iovec iov[3] = {{b, 10}, {b + 10, 0}, {b + 10, len - 10}};
        dw_seal_add_iov(&s2, &r, iov, 3);
        size_t tl = dw_seal_end(&s2, &r, b, b + len);
        cr_assert_eq(tl, DW_DGRAM_AUTH_LEN);
        cr_assert_eq(memcmp(a, b, n), 0);
        struct iovec body[2] = {{b, 40}, {b + 40, len - 40}};
        cr_assert_eq(dw_seal_open_iov(&s1, body, 2, b + len, tl, NULL), 0);
        b[50] ^= 1;
        cr_assert_eq(dw_seal_open_iov(&s1, body, 2, b + len, tl, NULL), -EKEYREJECTED);
        dw_seal_fini(&s1);
        dw_seal_fini(&s2);
}

/* The RD fast decoder takes AUTH beside TOKEN; AUTH with NOCRC is refused. */
Test(seal, rd_headers_with_auth)
{
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK,
                                 .xflags2 = DW_DGRAM_X2_TOKEN | DW_DGRAM_X2_AUTH,
                                 .dst_qpn = 5,
                                 .src_qpn = 6,
                                 .ack_psn = 9,
                                 .token = 0x1122334455667788ull};
        uint8_t b[128];
        ssize_t n = dw_dgram_encode(&h, b, sizeof(b));
        cr_assert_eq(n, DW_DGRAM_HDR_LEN + DW_DGRAM_TOKEN_LEN);
        struct dw_dgram_hdr f, g;
        cr_assert_eq(dw_dgram_decode_rd(b, (size_t)n, &f, NULL), n);
        cr_assert_eq(dw_dgram_decode(b, (size_t)n, &g, NULL), n);
        cr_assert_eq(f.token, h.token);
        cr_assert_eq(f.xflags2, h.xflags2);
        h.xflags = DW_DGRAM_X_NOCRC;
        cr_assert_eq(dw_dgram_encode(&h, b, sizeof(b)), -EINVAL);
}

/* RC over RD: the connection key. Both ends derive the same one whichever
 * token is theirs; another token, or the file key mixed in, gives another;
 * a datagram sealed under one opens only under it. A token of 0 and a file
 * key of another length are refused. */
Test(seal, conn_key)
{
        uint8_t a[DW_SEAL_CONN_KEY_LEN], b[DW_SEAL_CONN_KEY_LEN], c[DW_SEAL_CONN_KEY_LEN],
            f[DW_SEAL_CONN_KEY_LEN], f2[DW_SEAL_CONN_KEY_LEN];
        const char *why = NULL;
        uint64_t t1 = 0x1122334455667788ull, t2 = 0x8877665544332211ull;
        cr_assert_eq(dw_seal_conn_key(t1, t2, NULL, 0, a, &why), 0, "%s", why ? why : "");
        cr_assert_eq(dw_seal_conn_key(t2, t1, NULL, 0, b, &why), 0);
        cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "the two ends derive different keys");
        cr_assert_eq(dw_seal_conn_key(t1, t2 + 1, NULL, 0, c, &why), 0);
        cr_assert_neq(memcmp(a, c, sizeof(a)), 0, "another token, the same key");
        cr_assert_eq(dw_seal_conn_key(t1, t2, key1, 32, f, &why), 0);
        cr_assert_neq(memcmp(a, f, sizeof(a)), 0, "the file key changes nothing");
        cr_assert_eq(dw_seal_conn_key(t1, t2, key2, 16, f2, &why), 0);
        cr_assert_neq(memcmp(f, f2, sizeof(f)), 0, "another file key, the same key");
        /* A datagram of one connection key opens under it, not another. */
        struct dw_seal s1, s2;
        keyed(&s1, a, sizeof(a));
        keyed(&s2, c, sizeof(c));
        uint8_t pkt[256];
        size_t len = ud_dgram(pkt);
        ssize_t n = dw_seal_packet(&s1, pkt, len, sizeof(pkt));
        cr_assert_eq(n, (ssize_t)(len + DW_DGRAM_AUTH_LEN));
        cr_assert_eq(dw_seal_open(&s1, pkt, (size_t)n, NULL), (ssize_t)len);
        cr_assert_eq(dw_seal_open(&s2, pkt, (size_t)n, NULL), -EKEYREJECTED);
        dw_seal_fini(&s1);
        dw_seal_fini(&s2);
        cr_assert_eq(dw_seal_conn_key(0, t2, NULL, 0, c, &why), -EINVAL);
        cr_assert(strstr(why, "connection key"), "%s", why);
        cr_assert_eq(dw_seal_conn_key(t1, t2, key1, 20, c, &why), -EINVAL);
}

/* A keyed seal clears NOCRC in the header it marks AUTH: the tag replaces
 * the CRC, and the decoder refuses the two together. */
Test(seal, mac_clears_nocrc)
{
        struct dw_seal s;
        keyed(&s, key1, 32);
        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_RD | DW_DGRAM_F_ACK,
                                 .xflags = DW_DGRAM_X_NOCRC,
                                 .dst_qpn = 5,
                                 .src_qpn = 6,
                                 .ack_psn = 9};
        uint8_t pkt[128];
        ssize_t n = dw_dgram_encode(&h, pkt, sizeof(pkt));
        cr_assert_eq(n, DW_DGRAM_HDR_LEN);
        cr_assert(pkt[4] & DW_DGRAM_X_NOCRC);
        ssize_t m = dw_seal_packet(&s, pkt, (size_t)n, sizeof(pkt));
        cr_assert_eq(m, n + DW_DGRAM_AUTH_LEN);
        cr_assert_eq(pkt[4] & DW_DGRAM_X_NOCRC, 0);
        cr_assert_eq(dw_seal_open(&s, pkt, (size_t)m, NULL), n);
        struct dw_dgram_hdr g;
        cr_assert_eq(dw_dgram_decode(pkt, (size_t)n, &g, NULL), n);
        cr_assert(g.xflags2 & DW_DGRAM_X2_AUTH);
        dw_seal_fini(&s);
}

/* The reference: AES-GCM through libcrypto's EVP cipher, the bytes as
 * additional data and nothing encrypted, under key and nonce. */
static void evp_gmac(const uint8_t *key, size_t keylen, const uint8_t *nonce, const uint8_t *p,
                     size_t n, uint8_t tag[DW_DGRAM_AUTH_TAG_LEN])
{
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        uint8_t none[16];
        int ol;
        cr_assert(c);
        cr_assert_eq(EVP_EncryptInit_ex(c, keylen == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm(),
                                        NULL, key, nonce),
                     1);
        cr_assert_eq(EVP_EncryptUpdate(c, NULL, &ol, p, (int)n), 1);
        cr_assert_eq(EVP_EncryptFinal_ex(c, none, &ol), 1);
        cr_assert_eq(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, DW_DGRAM_AUTH_TAG_LEN, tag), 1);
        EVP_CIPHER_CTX_free(c);
}

/* A datagram of len bytes (len >= DW_DGRAM_HDR_LEN): a UD header and a
 * pattern that differs with seed. */
static void pattern_dgram(uint8_t *pkt, size_t len, unsigned seed)
{
        ud_dgram(pkt);
        for (size_t i = DW_DGRAM_HDR_LEN; i < len; i++)
                pkt[i] = (uint8_t)(i * 7 + seed * 13 + (i >> 8));
}

/* The tag on the wire is AES-GCM's (the additional data the datagram, no
 * plaintext): the same as libcrypto's EVP AES-GCM computes, for both key
 * lengths, lengths that end inside and on a 16-byte block, and one nonce
 * after another. */
Test(seal, tag_is_evp_aes_gcm)
{
        static const size_t lens[] = {DW_DGRAM_HDR_LEN, 31, 32, 33, 100, 1024, 4099, 65000};
        static uint8_t pkt[65536];
        for (int k = 0; k < 2; k++) {
                const uint8_t *key = k ? key2 : key1;
                size_t kl = k ? sizeof(key2) : sizeof(key1);
                struct dw_seal s;
                keyed(&s, key, kl);
                for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
                        size_t len = lens[i];
                        pattern_dgram(pkt, len, (unsigned)i);
                        ssize_t n = dw_seal_packet(&s, pkt, len, sizeof(pkt));
                        cr_assert_eq(n, (ssize_t)(len + DW_DGRAM_AUTH_LEN));
                        uint8_t want[DW_DGRAM_AUTH_TAG_LEN];
                        evp_gmac(key, kl, pkt + len, pkt, len, want);
                        cr_assert_eq(
                            memcmp(pkt + len + DW_DGRAM_AUTH_NONCE_LEN, want, sizeof(want)), 0,
                            "key %zu bytes, datagram %zu bytes: tag differs from EVP's", kl, len);
                        cr_assert_eq(dw_seal_open(&s, pkt, (size_t)n, NULL), (ssize_t)len);
                }
                dw_seal_fini(&s);
        }
}

/* Splits a datagram of len bytes at cut points into iov (empty pieces
 * included); returns the count. */
static size_t split(uint8_t *p, size_t len, const size_t *cuts, size_t ncuts, struct iovec *iov)
{
        size_t k = 0, at = 0;
        for (size_t i = 0; i <= ncuts; i++) {
                size_t end = i < ncuts ? cuts[i] : len;
                iov[k++] = (struct iovec){p + at, end - at};
                at = end;
        }
        return k;
}

/* Sealed and opened in pieces, at any split (pieces of 1 byte, empty ones,
 * cuts inside and on 16-byte blocks), the trailer equals the contiguous
 * one; a flipped bit anywhere in the body or trailer, whatever piece holds
 * it, is refused. */
Test(seal, iov_equals_contiguous_and_every_bit_counts)
{
        enum { LEN = 300 };
        static const size_t cut_sets[][6] = {
            {DW_DGRAM_HDR_LEN, DW_DGRAM_HDR_LEN, 33, 34, 35, 299},
            {DW_DGRAM_HDR_LEN, 48, 64, 128, 256, 257},
            {DW_DGRAM_HDR_LEN + 1, 17 + DW_DGRAM_HDR_LEN, 100, 101, 200, 240},
        };
        struct dw_seal whole, parts;
        keyed(&whole, key1, sizeof(key1));
        keyed(&parts, key1, sizeof(key1));
        for (size_t c = 0; c < sizeof(cut_sets) / sizeof(cut_sets[0]); c++) {
                uint8_t a[LEN + DW_DGRAM_AUTH_LEN], b[LEN + DW_DGRAM_AUTH_LEN];
                pattern_dgram(a, LEN, (unsigned)c);
                pattern_dgram(b, LEN, (unsigned)c);
                cr_assert_eq(dw_seal_packet(&whole, a, LEN, sizeof(a)), LEN + DW_DGRAM_AUTH_LEN);
                struct iovec iov[8];
                size_t n = split(b, LEN, cut_sets[c], 6, iov);
                struct dw_seal_run r;
                dw_seal_begin(&parts, &r, b);
                dw_seal_add_iov(&parts, &r, iov, n);
                cr_assert_eq(dw_seal_end(&parts, &r, b, b + LEN), DW_DGRAM_AUTH_LEN);
                cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "cut set %zu: pieces differ from whole",
                             c);
                const char *why = NULL;
                cr_assert_eq(dw_seal_open_iov(&whole, iov, n, b + LEN, DW_DGRAM_AUTH_LEN, &why), 0,
                             "%s", why ? why : "");
                for (size_t byte = 0; byte < sizeof(b); byte++) {
                        if (byte == 0 || byte == 8)
                                continue; /* the AUTH marks: "no tag"
                                             (mac_refuses_every_changed_byte) */
                        for (int bit = 0; bit < 8; bit++) {
                                b[byte] ^= (uint8_t)(1u << bit);
                                cr_assert_eq(dw_seal_open_iov(&whole, iov, n, b + LEN,
                                                              DW_DGRAM_AUTH_LEN, NULL),
                                             -EKEYREJECTED, "cut set %zu, byte %zu bit %d", c, byte,
                                             bit);
                                b[byte] ^= (uint8_t)(1u << bit);
                        }
                }
                cr_assert_eq(dw_seal_open_iov(&whole, iov, n, b + LEN, DW_DGRAM_AUTH_LEN, NULL), 0,
                             "restored datagram refused");
        }
        dw_seal_fini(&whole);
        dw_seal_fini(&parts);
}
