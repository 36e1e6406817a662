/* The trailer of a diwarp datagram: the one place where a datagram's
 * integrity is written (seal) and checked (open), for UD and RD alike.
 *
 * A datagram ends with
 *   - CRC32c (4 bytes, network order) over every byte before it: the default;
 *   - nothing: a version-2 RD datagram with the NOCRC X-flag
 *     (DIWARP_RD_CRC=0), taken only by a receiver whose seal allows it;
 *   - with a key (DIWARP_AUTH): the X2-flag AUTH in its header and the
 *     authentication trailer, a 12-byte nonce and a 16-byte AES-GMAC tag
 *     (AES-GCM with the datagram as additional data and no plaintext,
 *     through libcrypto's EVP) over every byte before the trailer. A keyed
 *     receiver takes nothing else; a receiver without a key refuses these.
 * The header alone says which, so senders only build headers.
 * docs/PROTOCOL.md, "Packet layout" and "Authentication".
 *
 * Nonces. GCM must never see the same nonce twice under one key: a repeat
 * reveals the XOR of two keystreams and, worse for a MAC, lets an observer
 * solve for the hash key and forge tags. Every device that reads the same
 * key file shares the key, and a process may open devices many times, so
 * no single counter can be kept across all of them. Each seal therefore
 * starts at a nonce its caller draws from getrandom(): a 32-bit salt and a
 * 64-bit counter, both random, and adds one to the counter per datagram it
 * seals (never resent: a retransmission is sealed anew). Within one seal a
 * nonce never repeats (2^64 datagrams); two seals repeat one only if their
 * random starting points fall within the number of datagrams either sends
 * of each other in the 96-bit space: for D seals that each seal at most P
 * datagrams, a probability below D^2 * P / 2^96 (2^-24 for 65 536 device
 * opens of 2^40 datagrams each). The nonce travels in the trailer, so the
 * receiver needs no state per sender. */
#ifndef DIWARP_WIRE_SEAL_H
#define DIWARP_WIRE_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "dgram.h"

/* The longest trailer any datagram has. */
#define DW_SEAL_TRAILER_MAX DW_DGRAM_AUTH_LEN
/* Key lengths: AES-128 or AES-256. */
#define DW_SEAL_KEY_MAX 32

/* One device's integrity policy (owned by the caller; one per device, used
 * under its lock: a seal in progress lives in the keyed context). */
struct dw_seal {
        bool nocrc; /* accept RD datagrams without CRC32c (the sender's NOCRC) */
        bool mac;   /* keyed: AUTH trailer on every datagram, nothing else taken */
        /* Keyed: libcrypto's GCM mode state (GCM128_CONTEXT), [DW_SEAL_ENC]
         * for sealing, [DW_SEAL_DEC] for opening, each over its own AES
         * block cipher (blk: an EVP_CIPHER_CTX, AES-ECB), set up once. */
        void *gcm[2];
        void *blk[2];
        uint8_t nonce[DW_DGRAM_AUTH_NONCE_LEN]; /* the next one: salt (4) || counter (8, BE) */
};

enum { DW_SEAL_ENC, DW_SEAL_DEC };

/* One datagram being sealed: the running state over the bytes added so far.
 * Without a key, a run over a prefix may be kept and continued for several
 * datagrams (dw_seal_keeps_runs). */
struct dw_seal_run {
        uint32_t crc;
        uint8_t nonce[DW_DGRAM_AUTH_NONCE_LEN];
};

/* key NULL (keylen 0): CRC32c, NOCRC as nocrc says. Otherwise a key of 16
 * or 32 bytes, and start: the first nonce, DW_DGRAM_AUTH_NONCE_LEN random
 * bytes (see above); nocrc is then ignored (the tag covers integrity).
 * Returns 0, -EINVAL (key length) or -ENOMEM with *why. */
int dw_seal_init(struct dw_seal *s, bool nocrc, const uint8_t *key, size_t keylen,
                 const uint8_t *start, const char **why);
void dw_seal_fini(struct dw_seal *s);

static inline bool dw_seal_keeps_runs(const struct dw_seal *s)
{
        return !s->mac;
}

/* Trailer bytes of a datagram this seal writes: RD with NOCRC (nocrc_hdr)
 * has none. */
static inline size_t dw_seal_trailer_len(const struct dw_seal *s, bool nocrc_hdr)
{
        if (s->mac)
                return DW_DGRAM_AUTH_LEN;
        return nocrc_hdr ? 0 : DW_DGRAM_CRC_LEN;
}

/* RC over RD (DIWARP_AUTH, docs/SECURITY.md "Connection keys"): the key of
 * one connection, HKDF-SHA256 (RFC 5869, libcrypto's EVP_KDF "HKDF") with
 * input keying material the two connection tokens, the smaller first, then
 * the file key (fkey, fkeylen 16 or 32; none: NULL, 0), no salt, and the
 * info label "diwarp RC over RD connection key v1". Both ends derive the
 * same DW_SEAL_CONN_KEY_LEN bytes into key. Returns 0, or -EINVAL (a token
 * of 0, a file key of another length) or -ENOMEM (libcrypto) with *why. */
#define DW_SEAL_CONN_KEY_LEN 32
int dw_seal_conn_key(uint64_t tok_a, uint64_t tok_b, const uint8_t *fkey, size_t fkeylen,
                     uint8_t key[DW_SEAL_CONN_KEY_LEN], const char **why);

/* Sealing in pieces: begin over the encoded header hdr (at least
 * DW_DGRAM_HDR_LEN bytes, before any byte of it is added: with a key it
 * marks the header AUTH, version 2, and clears NOCRC: the tag replaces the
 * CRC), add every byte of the datagram in order
 * (the header first), end. end writes the trailer for the datagram whose
 * header starts at hdr into trl (room for DW_SEAL_TRAILER_MAX) and returns
 * its length. With a key, one datagram at a time per seal. */
void dw_seal_begin(struct dw_seal *s, struct dw_seal_run *r, uint8_t *hdr);
void dw_seal_add(struct dw_seal *s, struct dw_seal_run *r, const void *p, size_t n);
void dw_seal_add_iov(struct dw_seal *s, struct dw_seal_run *r, const struct iovec *iov, size_t n);
size_t dw_seal_end(struct dw_seal *s, struct dw_seal_run *r, const uint8_t *hdr, uint8_t *trl);

/* Seals a contiguous datagram of len bytes in a buffer of cap: the trailer
 * goes behind it. Returns the length on the wire, or -ENOSPC. */
ssize_t dw_seal_packet(struct dw_seal *s, uint8_t *pkt, size_t len, size_t cap);

/* Opens a received datagram: checks its trailer. Returns the length without
 * the trailer, or (wire.h) -ENODATA shorter than a header + trailer,
 * -EILSEQ CRC32c mismatch, -ENOTSUP a NOCRC datagram this seal refuses,
 * -ENOKEY (keyed) a datagram without AUTH, -EKEYREJECTED (keyed) a tag that
 * does not verify (another key, or bytes changed), -ENOPROTOOPT (no key) an
 * AUTH datagram. */
ssize_t dw_seal_open(const struct dw_seal *s, const uint8_t *pkt, size_t len, const char **why);

/* The same for a datagram received in pieces: body[0..n) is everything
 * before the trailer, trl its trailer of trl_len bytes (what
 * dw_seal_trailer_len says for the header in body[0], which must hold at
 * least DW_DGRAM_HDR_LEN bytes). Returns 0 or the errors of dw_seal_open.
 * Its caller has already placed the bytes: never with a key (verify, then
 * place). */
int dw_seal_open_iov(const struct dw_seal *s, const struct iovec *body, size_t n,
                     const uint8_t *trl, size_t trl_len, const char **why);

#endif
