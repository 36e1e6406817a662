/* A keyed hash with a random secret, for values a stranger must not be able
 * to predict from what it sees (the first PSN and MSN of an RD
 * pseudo-stream, the first PSN of a native RC-over-RD connection), as
 * RFC 6528 makes TCP's initial sequence numbers: ISN = F(secret, the
 * connection's addresses, a clock). F is SipHash-2-4 with a 128-bit output,
 * from OpenSSL's libcrypto (EVP_MAC "SIPHASH"); the 16-byte secret comes from
 * getrandom() when the state is set up (once per device). No cryptography is
 * written here.
 *
 * Not thread-safe: the caller serializes calls on one state (the device
 * lock). Never on a per-datagram path: once per pseudo-stream.
 */
#ifndef DW_UTIL_KEYHASH_H
#define DW_UTIL_KEYHASH_H

#include <stddef.h>
#include <stdint.h>

#define DW_KEYHASH_KEY_LEN 16
#define DW_KEYHASH_OUT_LEN 16

struct dw_keyhash {
        void *mac; /* EVP_MAC * */
        void *ctx; /* EVP_MAC_CTX *, keyed once */
        uint8_t key[DW_KEYHASH_KEY_LEN];
};

/* Draws the secret and sets up the MAC. 0, -EIO (no randomness), -ENOSYS
 * (libcrypto has no SipHash), -ENOMEM; why (may be NULL) says which. */
int dw_keyhash_init(struct dw_keyhash *k, const char **why);
/* The same with a given secret (tests: known answers). */
int dw_keyhash_init_key(struct dw_keyhash *k, const uint8_t key[DW_KEYHASH_KEY_LEN],
                        const char **why);
void dw_keyhash_fini(struct dw_keyhash *k);

/* len random bytes from getrandom() (the secrets the engine draws: this
 * hash's key, STags, connection tokens and challenges). 0 or -EIO. */
int dw_random(void *buf, size_t len);
/* A random 64-bit value other than 0 (0 means "none" where one is kept). */
int dw_random64(uint64_t *out);

/* out = SipHash-2-4(secret, data[0..len)), 16 bytes. 0 or -EIO. */
int dw_keyhash(struct dw_keyhash *k, const void *data, size_t len, uint8_t out[DW_KEYHASH_OUT_LEN]);

#endif
