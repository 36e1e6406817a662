/* The engine's verdict on datagrams, for dgram_wire_check.py to compare with
 * what the Wireshark dissector says about the same bytes. Reads one UDP
 * payload per line of stdin, in hex; for each prints
 *   ok HDR_LEN            accepted (CRC or NOCRC, header, layout)
 *   bad ERRNO REASON      refused, with the decoder's reason
 * taking each as an RD receiver that accepts NOCRC datagrams would:
 * dw_dgram_packet_body, dw_dgram_decode, dw_dgram_layout. A datagram with
 * the X2-flag AUTH is taken as a keyed receiver takes it once its tag
 * verified (the tag is not checked: there is no key here): the trailer of
 * DW_DGRAM_AUTH_LEN bytes comes off, and the rest is decoded. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/dgram.h"

static int hexval(int c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        c = tolower(c);
        return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int main(void)
{
        static char line[2 * 70000];
        static uint8_t pkt[70000];

        while (fgets(line, sizeof(line), stdin)) {
                size_t n = 0;
                for (char *s = line; s[0] && s[1] && hexval(s[0]) >= 0 && hexval(s[1]) >= 0;
                     s += 2) {
                        if (n == sizeof(pkt)) {
                                fprintf(stderr, "datagram longer than %zu bytes\n", sizeof(pkt));
                                return 2;
                        }
                        pkt[n++] = (uint8_t)(hexval(s[0]) << 4 | hexval(s[1]));
                }
                const char *why = "";
                struct dw_dgram_hdr h;
                struct dw_dgram_layout lay;
                ssize_t body;
                if (n >= DW_DGRAM_HDR_LEN && pkt[0] == DW_DGRAM_VERSION2 &&
                    (pkt[8] & DW_DGRAM_X2_AUTH))
                        body = n >= DW_DGRAM_HDR_LEN + DW_DGRAM_AUTH_LEN
                                   ? (ssize_t)(n - DW_DGRAM_AUTH_LEN)
                                   : dw_wire_fail(&why, "auth: shorter than header + tag", ENODATA);
                else
                        body = dw_dgram_packet_body(pkt, n, true, &why);
                ssize_t hl = body < 0 ? body : dw_dgram_decode(pkt, (size_t)body, &h, &why);
                int rc =
                    hl < 0 ? (int)hl : dw_dgram_layout(&h, (size_t)hl, (size_t)body, &lay, &why);
                if (rc < 0)
                        printf("bad %d %s\n", -rc, why ? why : "");
                else
                        printf("ok %zd\n", hl);
        }
        return 0;
}
