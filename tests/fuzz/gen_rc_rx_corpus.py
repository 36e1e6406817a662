#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_rc_rx (tests/fuzz/corpus/rc_rx/).

Each seed is one mode byte (bit 0: CRC on, bit 1: QP in RTR, bit 2 with bit 0:
the target writes the CRCs, bits 3-5: size of the pieces written) followed by the byte stream a peer sends on an
established RC stream: MPA FPDUs (RFC 5044) carrying DDP (RFC 5041) / RDMAP
(RFC 5040, RFC 7306) messages. The STags,
TOs and buffer sizes are the fixed layout fuzz_rc_rx.c sets up.

    tests/fuzz/gen_rc_rx_corpus.py [OUT_DIR]
"""
import struct

from corpus_gen import crc32c, write_seeds

R1, R2, R3 = 0x15A, 0x25A, 0x35A  # STags: index << 8 | fixed key byte
R1_IOVA, R2_IOVA, R3_IOVA = 0x100000, 0x200000, 0x300000
R1_LEN = 128 << 10
READ_SINK, READ_LEN = 2048, 256

WRITE, READ_REQ, READ_RESP, SEND, SEND_INV = 0, 1, 2, 3, 4
TERMINATE, IMM_DATA, ATOMIC_REQ, ATOMIC_RESP = 7, 8, 0xA, 0xB


def fpdu(ulpdu, crc=True, bad_crc=False):
    b = struct.pack(">H", len(ulpdu)) + ulpdu
    b += bytes(-len(b) % 4)
    c = crc32c(b) if crc else 0
    if bad_crc:
        c ^= 1
    # MPA puts the CRC on the wire in the order RFC 3385 defines (little end first)
    return b + struct.pack("<I", c)


def ctrl(tagged, last, op, version=1):
    return bytes([(0x80 if tagged else 0) | (0x40 if last else 0) | 1, (version << 6) | op])


def untagged(op, qn, msn, mo, payload=b"", last=True, ulp=0, version=1):
    return ctrl(False, last, op, version) + struct.pack(">IIII", ulp, qn, msn, mo) + payload


def tagged(op, stag, to, payload, last=True):
    return ctrl(True, last, op) + struct.pack(">IQ", stag, to) + payload


def data(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def seeds():
    s = {}
    # mode 0x09: written one byte per progress step
    s["send_small"] = b"\x09" + fpdu(untagged(SEND, 0, 1, 0, data(100, 1)))
    # mode 5: CRC on, the target fills in the CRCs (written here as zero)
    s["send_two_segments_two_msgs"] = b"\x05" + (
        fpdu(untagged(SEND, 0, 1, 0, data(100, 2), last=False), crc=False)
        + fpdu(untagged(SEND, 0, 1, 100, data(50, 3)), crc=False)
        + fpdu(untagged(SEND, 0, 2, 0, data(200, 4)), crc=False)
    )
    s["send_no_crc"] = b"\x00" + fpdu(untagged(SEND, 0, 1, 0, data(64, 5)), crc=False)
    s["send_in_rtr"] = b"\x03" + fpdu(untagged(SEND, 0, 1, 0, data(32, 6)))
    # two full-size tagged segments (payload read straight into R1)
    s["write_tagged"] = b"\x01" + (
        fpdu(tagged(WRITE, R1, R1_IOVA + 100, data(30000, 7), last=False))
        + fpdu(tagged(WRITE, R1, R1_IOVA + 30100, data(30000, 8)))
    )
    s["write_with_imm"] = b"\x01" + (
        fpdu(tagged(WRITE, R1, R1_IOVA, data(64, 8)))
        + fpdu(untagged(IMM_DATA, 0, 1, 0, struct.pack(">I", 0xDEADBEEF) + bytes(4)))
    )
    rreq = struct.pack(">IQIIQ", 0x77, 0x4000, 1000, R2, R2_IOVA)
    s["read_request"] = b"\x01" + fpdu(untagged(READ_REQ, 1, 1, 0, rreq))
    areq = struct.pack(">IIIQQQQQ", 0, 5, R1, R1_IOVA + 8, 3, 0, 0, 0)
    s["atomic_request"] = b"\x01" + fpdu(untagged(ATOMIC_REQ, 1, 1, 0, areq))
    # Read Response to our Read, then the Atomic Response to our Atomic
    s["read_and_atomic_response"] = b"\x21" + (  # 61-byte pieces
        fpdu(tagged(READ_RESP, R3, R3_IOVA + READ_SINK, data(READ_LEN, 10)))
        + fpdu(untagged(ATOMIC_RESP, 3, 1, 0, struct.pack(">IQ", 1, 0x1122334455667788)))
    )
    term = bytes([(0 << 4) | 2, 6, 0, 0])  # RDMAP, remote operation, unexpected opcode
    s["terminate"] = b"\x01" + fpdu(untagged(TERMINATE, 2, 1, 0, term))
    s["bad_write_read_only_mr"] = b"\x01" + fpdu(tagged(WRITE, R2, R2_IOVA, data(16, 11)))
    s["bad_write_bounds"] = b"\x01" + fpdu(tagged(WRITE, R1, R1_IOVA + R1_LEN - 100, data(200, 12)))
    s["bad_crc"] = b"\x01" + fpdu(untagged(SEND, 0, 1, 0, data(40, 13)), bad_crc=True)
    s["bad_version_and_msn"] = b"\x01" + (
        fpdu(untagged(SEND, 0, 1, 0, data(8, 14), version=0))
        + fpdu(untagged(SEND, 0, 9, 0, data(8, 15)))
    )
    s["send_inval_then_write"] = b"\x01" + (
        fpdu(untagged(SEND_INV, 0, 1, 0, data(10, 16), ulp=R1))
        + fpdu(tagged(WRITE, R1, R1_IOVA, data(10, 17)))
    )
    return s


def main():
    write_seeds("rc_rx", seeds())


if __name__ == "__main__":
    main()
