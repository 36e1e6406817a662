#!/usr/bin/env python3
"""Writes the version-2 seeds of fuzz_dgram (tests/fuzz/corpus/dgram/v2_*,
bad_v2_*, bad_version3).

Each seed is one UDP payload as a receiver gets it: the datagram header
(docs/PROTOCOL.md, "Datagram header"), for DATA a DDP (RFC 5041) / RDMAP
(RFC 5040, RFC 7306) segment, and the CRC32c trailer in network byte order,
which a datagram with the NOCRC X-flag does not have. The version-1 seeds
beside them were written by hand before this script and are left as they are.

    tests/fuzz/gen_dgram_corpus.py [OUT_DIR]
"""
import struct

from corpus_gen import crc32c, write_seeds

# flags (byte 1)
RD, ACK, SACK, CREDIT, ACKREQ, NAK, DATA, IMM = (1 << i for i in range(8))
# X-flags (byte 4 of version 2)
NOCRC, PULL, PULLREQ, DSACK, ECE, CCTL, RAILS, RAIL = (1 << i for i in range(8))
# X2-flags (byte 8 of version 2)
START = 0x01

DST, SRC = 0x123456, 0xABCDEF
SEND, READ_REQ, IMM_DATA = 3, 1, 8


def header(flags, xflags=0, psn=0, ack=0, sacks=(), pull=None, qkey=0, version=None,
           rails=None, origin=None, xflags2=0, start=None):
    if version is None:
        version = 2 if xflags or xflags2 else 1
    b = struct.pack(">BBBB", version, flags, len(sacks), 0)
    b += bytes([xflags]) + DST.to_bytes(3, "big")  # version 1: reserved, 0
    b += bytes([xflags2]) + SRC.to_bytes(3, "big")  # version 1: reserved, 0
    b += struct.pack(">IIIHH", qkey, psn, ack, 0, 0)
    for s, e in sacks:
        b += struct.pack(">II", s & 0xFFFFFFFF, e & 0xFFFFFFFF)
    if pull is not None:
        b += struct.pack(">II", *pull)
    if rails is not None:  # multirail: count word, then the addresses
        b += bytes([len(rails), 0, 0, 0]) + b"".join(bytes(a) for a in rails)
    if origin is not None:
        b += bytes(origin)
    if start is not None:  # stream start: First PSN, First MSN
        b += struct.pack(">II", *start)
    return b


def untagged(op, qn, msn, mo, payload=b"", last=True):
    ctrl = bytes([(0x40 if last else 0) | 1, (1 << 6) | op])
    return ctrl + struct.pack(">IIII", 0, qn, msn, mo) + payload


def read_request(msn, sink_stag, sink_to, size, src_stag, src_to):
    return untagged(READ_REQ, 1, msn, 0,
                    struct.pack(">IQIIQ", sink_stag, sink_to, size, src_stag, src_to))


def imm_message(msn, value):
    return untagged(IMM_DATA, 0, msn, 0, value + bytes(4))


def data(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def packet(body, crc=True):
    return body + struct.pack(">I", crc32c(body)) if crc else body


def seeds():
    s = {}
    send = untagged(SEND, 0, 1, 0, data(24, 1))
    s["v2_rd_data_nocrc"] = packet(header(RD | DATA, NOCRC, psn=7) + send, crc=False)
    s["v2_rd_ack_nocrc"] = packet(header(RD | ACK, NOCRC, psn=9, ack=100), crc=False)
    s["v2_rd_data_ack_imm_nocrc"] = packet(
        header(RD | DATA | ACK | ACKREQ | IMM, NOCRC, psn=8, ack=3)
        + untagged(SEND, 0, 2, 0, data(5, 2)) + imm_message(2, b"\xde\xad\xbe\xef"),
        crc=False)
    # First segment (MO 0, L = 0) of a receiver-paced Send of 1 MiB, 1396 bytes pushed.
    first = untagged(SEND, 0, 3, 0, data(32, 3), last=False)
    s["v2_pull"] = packet(header(RD | DATA | ACKREQ, PULL, psn=10, pull=(1 << 20, 1396)) + first)
    s["v2_pull_sack_nocrc"] = packet(
        header(RD | DATA | ACK | SACK, PULL | NOCRC, psn=11, ack=50,
               sacks=((52, 55), (60, 61)), pull=(100000, 32)) + first, crc=False)
    # Read Request of the pulled part: Data Source STag = the Send's MSN, TO = offset.
    s["v2_pullreq"] = packet(
        header(RD | DATA, PULLREQ, psn=12) + read_request(1, 1, 0, 4096, 3, 1396))
    s["v2_dsack"] = packet(header(RD | ACK | SACK, DSACK, psn=13, ack=100,
                                  sacks=((90, 91), (102, 105))))
    s["v2_dsack_only_nocrc"] = packet(
        header(RD | ACK | SACK, DSACK | NOCRC, psn=14, ack=100, sacks=((99, 100),)), crc=False)
    s["v2_dsack_wrap"] = packet(header(RD | ACK | SACK, DSACK, ack=2,
                                       sacks=((-2, 1), (4, 6), (8, 9))))
    s["v2_ece_ack"] = packet(header(RD | ACK, ECE, psn=15, ack=77))
    s["v2_all_nocrc"] = packet(
        header(RD | DATA | ACK | SACK | ACKREQ | IMM, NOCRC | PULL | DSACK | ECE, psn=16,
               ack=200, sacks=((150, 152), (203, 204)), pull=(65536, 16))
        + untagged(SEND, 0, 4, 0, data(16, 4), last=False)
        + imm_message(4, b"\x01\x02\x03\x04"), crc=False)

    s["bad_version3"] = packet(header(RD | DATA, version=3) + send)
    r1, r2 = (10, 1, 1, 1), (10, 1, 2, 1)
    s["v2_rails_ack"] = packet(header(RD | ACK, RAILS, ack=9, rails=(r1, r2)))
    s["v2_rails_data"] = packet(header(RD | DATA, RAILS, psn=3, rails=(r1, r2)) + send)
    s["v2_rail_origin_data"] = packet(header(RD | DATA, RAIL, psn=4, origin=r1) + send)
    s["v2_rail_origin_ack_nocrc"] = packet(header(RD | ACK, NOCRC | RAIL, ack=9, origin=r1),
                                           crc=False)
    s["bad_v2_rail_truncated"] = packet(header(RD | DATA, NOCRC | RAIL) + send[:2], crc=False)
    s["bad_v2_rail_origin_zero"] = packet(header(RD | ACK, RAIL, ack=9, origin=(0, 0, 0, 0)))
    s["bad_v2_rails_count5"] = packet(header(RD | ACK, RAILS, ack=9, rails=(r1, r2) * 2 + (r1,)))
    s["bad_v2_rails_ud"] = packet(header(DATA, RAILS, rails=(r1,)) + send)
    s["bad_v2_nocrc_ud"] = packet(header(DATA, NOCRC) + send)
    s["bad_v2_nocrc_ud_no_trailer"] = packet(header(DATA, NOCRC) + send, crc=False)
    s["bad_v2_pull_truncated"] = packet(header(RD | DATA, PULL, pull=(1000, 10))[:32])
    s["bad_v2_pull_pushed_zero"] = packet(header(RD | DATA, PULL, pull=(1000, 0)) + first)
    s["bad_v2_pull_pushed_all"] = packet(header(RD | DATA, PULL, pull=(1000, 1000)) + first)
    s["bad_v2_pull_pullreq"] = packet(header(RD | DATA, PULL | PULLREQ, pull=(1000, 10)) + first)
    s["bad_v2_pullreq_ack_only"] = packet(header(RD | ACK, PULLREQ, ack=5))
    s["bad_v2_dsack_empty"] = packet(header(RD | ACK | SACK, DSACK, ack=100, sacks=((90, 90),)))
    s["bad_v2_dsack_no_sack"] = packet(header(RD | ACK, DSACK, ack=100))
    s["bad_v2_ece_no_ack"] = packet(header(RD | DATA, ECE) + send)
    # Stream start (X2-flag START): the first Send of a stream, its PSN and
    # MSN those of the descriptor; with NOCRC, the rail list and the origin.
    isn = 0x9ABCDEF0
    first_send = untagged(SEND, 0, isn, 0, data(24, 5))
    s["v2_start_data"] = packet(header(RD | DATA | ACKREQ, psn=isn, qkey=0x11223344,
                                       xflags2=START, start=(isn, isn)) + first_send)
    s["v2_start_rails_origin_nocrc"] = packet(
        header(RD | DATA | ACK, NOCRC | RAILS | RAIL, psn=isn + 1, ack=77, rails=(r1, r2),
               origin=r1, xflags2=START, start=(isn, isn)) + first_send, crc=False)
    s["bad_v2_start_truncated"] = packet(header(RD | DATA, xflags2=START, psn=isn)
                                         + struct.pack(">I", isn))
    s["bad_v2_start_on_ack"] = packet(header(RD | ACK, ack=5, xflags2=START, start=(isn, isn)))
    s["bad_v2_start_ud"] = packet(header(DATA, xflags2=START, start=(isn, isn)) + send)
    s["bad_v2_x2_reserved"] = packet(header(RD | DATA, xflags2=0x02, psn=3) + send)
    s["bad_v2_start_in_version1"] = packet(header(RD | DATA, version=1, xflags2=START, start=(isn, isn))
                                     + first_send)
    return s


def main():
    write_seeds("dgram", seeds())


if __name__ == "__main__":
    main()
