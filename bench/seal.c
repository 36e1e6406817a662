/* bench-seal: the CPU time of one datagram's trailer, sealed (in two pieces,
 * header and payload, as the RD transmit path gathers them) and opened
 * (contiguous, as the receive path checks a staged datagram), with
 * CRC32c and with DIWARP_AUTH's AES-GMAC, at a small and the largest
 * loopback datagram. Each figure is the fastest of 15 repetitions: on a busy
 * host that is the closest to the cost itself.
 *
 *   bench-seal [REPS]      prints one line per (trailer, size):
 *   SEAL mode=auth size=100 seal_us=0.215 open_us=0.142 gbps_seal=3.7 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wire/seal.h"

static double now(void)
{
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint8_t pkt[65536];

int main(int argc, char **argv)
{
        int reps = argc > 1 ? atoi(argv[1]) : 15;
        static const uint8_t key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
        static const uint8_t start[DW_DGRAM_AUTH_NONCE_LEN] = {7, 7, 7, 7};
        /* A small Send and the largest datagram over loopback (65507 B of
         * UDP payload), each without its trailer. */
        static const size_t sizes[] = {100, 65507 - DW_DGRAM_AUTH_LEN};
        const char *why = NULL;
        for (int mode = 0; mode < 2; mode++) {
                struct dw_seal s;
                if (dw_seal_init(&s, false, mode ? key : NULL, mode ? sizeof(key) : 0, start,
                                 &why) < 0) {
                        fprintf(stderr, "bench-seal: %s\n", why);
                        return 1;
                }
                for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
                        size_t len = sizes[z];
                        int it = len > 4096 ? 2000 : 200000;
                        struct dw_dgram_hdr h = {.flags = DW_DGRAM_F_DATA, .dst_qpn = 2};
                        if (dw_dgram_encode(&h, pkt, sizeof(pkt)) < 0)
                                return 1;
                        for (size_t i = DW_DGRAM_HDR_LEN; i < len; i++)
                                pkt[i] = (uint8_t)i;
                        double best_s = 1e9, best_o = 1e9;
                        size_t tl = 0;
                        for (int r = 0; r < reps; r++) {
                                double t0 = now();
                                for (int i = 0; i < it; i++) {
                                        struct dw_seal_run run;
                                        struct iovec iov[2] = {
                                            {pkt, DW_DGRAM_HDR_LEN},
                                            {pkt + DW_DGRAM_HDR_LEN, len - DW_DGRAM_HDR_LEN}};
                                        dw_seal_begin(&s, &run, pkt);
                                        dw_seal_add_iov(&s, &run, iov, 2);
                                        tl = dw_seal_end(&s, &run, pkt, pkt + len);
                                }
                                double t = (now() - t0) / it;
                                best_s = t < best_s ? t : best_s;
                                t0 = now();
                                for (int i = 0; i < it; i++)
                                        if (dw_seal_open(&s, pkt, len + tl, &why) < 0) {
                                                fprintf(stderr, "bench-seal: open: %s\n", why);
                                                return 1;
                                        }
                                t = (now() - t0) / it;
                                best_o = t < best_o ? t : best_o;
                        }
                        printf("SEAL mode=%s size=%zu seal_us=%.3f open_us=%.3f gbps_seal=%.1f\n",
                               mode ? "auth" : "crc", len, best_s * 1e6, best_o * 1e6,
                               (double)len * 8 / best_s / 1e9);
                }
                dw_seal_fini(&s);
        }
        return 0;
}
