/* util/keyhash: SipHash-2-4 (128-bit output) through libcrypto, keyed with
 * a random secret per state. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "util/keyhash.h"

/* Known answers of SipHash-2-4-128 (the reference vectors: key 00..0f,
 * message 00..len-1). */
Test(keyhash, known_answers)
{
        uint8_t key[DW_KEYHASH_KEY_LEN], msg[3] = {0, 1, 2}, out[DW_KEYHASH_OUT_LEN];
        for (unsigned i = 0; i < sizeof(key); i++)
                key[i] = (uint8_t)i;
        struct dw_keyhash k;
        cr_assert_eq(dw_keyhash_init_key(&k, key, NULL), 0);
        static const uint8_t empty[16] = {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6,
                                          0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93};
        static const uint8_t three[16] = {0x9c, 0x70, 0xb6, 0x0c, 0x52, 0x67, 0xa9, 0x4e,
                                          0x5f, 0x33, 0xb6, 0xb0, 0x29, 0x85, 0xed, 0x51};
        cr_assert_eq(dw_keyhash(&k, msg, 0, out), 0);
        cr_assert_arr_eq(out, empty, sizeof(out));
        cr_assert_eq(dw_keyhash(&k, msg, 3, out), 0);
        cr_assert_arr_eq(out, three, sizeof(out));
        /* Again: each call is a fresh computation. */
        cr_assert_eq(dw_keyhash(&k, msg, 0, out), 0);
        cr_assert_arr_eq(out, empty, sizeof(out));
        dw_keyhash_fini(&k);
        dw_keyhash_fini(&k); /* idempotent */
}

/* Two states draw two secrets: the same input gives other outputs; one state
 * gives the same output for the same input. */
Test(keyhash, random_secret)
{
        struct dw_keyhash a, b;
        const char *why = NULL;
        cr_assert_eq(dw_keyhash_init(&a, &why), 0, "%s", why ? why : "");
        cr_assert_eq(dw_keyhash_init(&b, &why), 0, "%s", why ? why : "");
        uint8_t in[28] = {1, 2, 3}, x[DW_KEYHASH_OUT_LEN], y[DW_KEYHASH_OUT_LEN],
                z[DW_KEYHASH_OUT_LEN];
        cr_assert_eq(dw_keyhash(&a, in, sizeof(in), x), 0);
        cr_assert_eq(dw_keyhash(&a, in, sizeof(in), y), 0);
        cr_assert_eq(dw_keyhash(&b, in, sizeof(in), z), 0);
        cr_assert_arr_eq(x, y, sizeof(x));
        cr_assert_arr_neq(x, z, sizeof(x));
        in[27] ^= 1;
        cr_assert_eq(dw_keyhash(&a, in, sizeof(in), y), 0);
        cr_assert_arr_neq(x, y, sizeof(x));
        dw_keyhash_fini(&a);
        dw_keyhash_fini(&b);
        /* A state that was never set up refuses to hash. */
        struct dw_keyhash none;
        memset(&none, 0, sizeof(none));
        cr_assert_eq(dw_keyhash(&none, in, sizeof(in), x), -EIO);
}
