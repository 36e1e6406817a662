/* The keyed hash of keyhash.h over libcrypto's EVP_MAC SipHash. */
#include "util/keyhash.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

static int fail(const char **why, const char *reason, int err)
{
        if (why)
                *why = reason;
        return -err;
}

int dw_random(void *buf, size_t len)
{
        size_t got = 0;
        while (got < len) {
                ssize_t n = getrandom((uint8_t *)buf + got, len - got, 0);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return -EIO;
                got += (size_t)n;
        }
        return 0;
}

int dw_random64(uint64_t *out)
{
        do {
                if (dw_random(out, sizeof(*out)) < 0)
                        return -EIO;
        } while (*out == 0);
        return 0;
}

int dw_keyhash_init(struct dw_keyhash *k, const char **why)
{
        uint8_t key[DW_KEYHASH_KEY_LEN];
        memset(k, 0, sizeof(*k));
        if (dw_random(key, sizeof(key)) < 0)
                return fail(why, "keyed hash: getrandom() failed", EIO);
        int rc = dw_keyhash_init_key(k, key, why);
        explicit_bzero(key, sizeof(key));
        return rc;
}

int dw_keyhash_init_key(struct dw_keyhash *k, const uint8_t key[DW_KEYHASH_KEY_LEN],
                        const char **why)
{
        memset(k, 0, sizeof(*k));
        memcpy(k->key, key, sizeof(k->key));
        EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
        if (!mac) {
                dw_keyhash_fini(k);
                return fail(why, "keyed hash: libcrypto has no SIPHASH MAC", ENOSYS);
        }
        EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
        if (!ctx) {
                EVP_MAC_free(mac);
                dw_keyhash_fini(k);
                return fail(why, "keyed hash: no memory for the MAC context", ENOMEM);
        }
        size_t outlen = DW_KEYHASH_OUT_LEN;
        OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &outlen),
                               OSSL_PARAM_construct_end()};
        if (!EVP_MAC_init(ctx, k->key, sizeof(k->key), params)) {
                EVP_MAC_CTX_free(ctx);
                EVP_MAC_free(mac);
                dw_keyhash_fini(k);
                return fail(why, "keyed hash: SIPHASH refused its key", EIO);
        }
        k->mac = mac;
        k->ctx = ctx;
        return 0;
}

void dw_keyhash_fini(struct dw_keyhash *k)
{
        if (!k)
                return;
        EVP_MAC_CTX_free(k->ctx);
        EVP_MAC_free(k->mac);
        k->ctx = NULL;
        k->mac = NULL;
        /* The secret must not outlive its use in freed memory. */
        explicit_bzero(k->key, sizeof(k->key));
}

int dw_keyhash(struct dw_keyhash *k, const void *data, size_t len, uint8_t out[DW_KEYHASH_OUT_LEN])
{
        size_t outlen = DW_KEYHASH_OUT_LEN, got = 0;
        OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &outlen),
                               OSSL_PARAM_construct_end()};
        /* A fresh computation each time, keyed anew (SipHash's key setup is
         * a few additions). */
        if (!k->ctx || !EVP_MAC_init(k->ctx, k->key, sizeof(k->key), params) ||
            !EVP_MAC_update(k->ctx, data, len) ||
            !EVP_MAC_final(k->ctx, out, &got, DW_KEYHASH_OUT_LEN) || got != DW_KEYHASH_OUT_LEN)
                return -EIO;
        return 0;
}
