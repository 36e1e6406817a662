#!/usr/bin/python3
"""The decode half of dgram_wire.sh.

  dgram_wire_check.py craft FILE.pcap GSO.pcap
      writes hand-made datagrams (what the engine never sends: credits, the
      NAK codes but RNR, ECE, a D-SACK with SACK blocks, a bad CRC, broken
      headers, a datagram on a port outside the registered range; and what
      it sends only with several addresses, the multirail rail list and
      origin, or with DIWARP_AUTH, the authentication trailer) into FILE,
      and into GSO.pcap UDP GSO buffers whose datagrams' headers differ as
      they do when one QP's batch goes to several streams of a peer device
      (a timing the live captures hit only now and then);
  dgram_wire_check.py check DISSECTOR.lua CAPDIR [DGRAM_VERDICT]
      runs tshark with the dissector over the captures dgram_wire.sh left in
      CAPDIR and checks what it decodes against what the programs did (their
      output lines, NAME.out), and the dissector's verdict on each crafted
      datagram against the engine's (dgram_verdict). Exit 1 with a list of
      failures.
"""
import re
import struct
import subprocess
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


# --------------------------------------------------------------- crafting

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def dgram(version=1, flags=0, nak=0, xflags=0, dst=0x1002, src=0x2, qkey=0, psn=0, ack=0,
          credits=0, rnr=0, sacks=(), tail=b"", crc=True, bad_crc=False, byte4=None):
    b4 = xflags if byte4 is None else byte4
    h = struct.pack(">BBBB", version, flags, len(sacks), nak)
    h += struct.pack(">I", (b4 << 24) | dst) + struct.pack(">I", src)
    h += struct.pack(">IIIHH", qkey, psn, ack, credits, rnr)
    for s, e in sacks:
        h += struct.pack(">II", s, e)
    body = h + tail
    if crc:
        c = crc32c(body) ^ (1 if bad_crc else 0)
        body += struct.pack(">I", c)
    return body


def ipv4_udp(payload, sport, dport):
    udp = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
    return ip + udp


# Flags and X-flags (docs/PROTOCOL.md, "Datagram header").
RD, ACK, SACK, CREDIT, ACKREQ, NAK, DATA, IMM = 1, 2, 4, 8, 0x10, 0x20, 0x40, 0x80
X_NOCRC, X_PULL, X_PULLREQ, X_DSACK, X_ECE = 1, 2, 4, 8, 0x10
X_CCTL, X_RAILS, X_RAIL = 0x20, 0x40, 0x80
# X2-flags: byte 8 of version 2, the high byte of dgram()'s src.
X2_START, X2_TOKEN, X2_CHALLENGE, X2_AUTH, X2_ACKDELAY = 1, 2, 4, 8, 0x10

# The authentication trailer (X2-flag AUTH, docs/PROTOCOL.md "Authentication"):
# nonce (salt 4, counter 8) and a 16-byte tag. The dissector has no key and
# shows it unverified; dgram_verdict takes it as a keyed receiver whose tag
# check passed would.
AUTH_SALT, AUTH_COUNTER, AUTH_TAG = 0xA1B2C3D4, 0x0123456789ABCDEF, bytes(range(16))
AUTH_TRAILER = struct.pack(">IQ", AUTH_SALT, AUTH_COUNTER) + AUTH_TAG


def ip4(a):
    return bytes(int(x) for x in a.split("."))


def rail_list(*addrs, count=None, rsvd=b"\0\0\0"):
    """The RAILS extension: count word (count, 3 reserved bytes), addresses."""
    return bytes([len(addrs) if count is None else count]) + rsvd + b"".join(map(ip4, addrs))

# An untagged RDMAP Send (RFC 5041/5040): DDP control (L, DV 1), RDMAP
# control (RV 1, opcode 3), reserved, QN 0, MSN, MO 0; then the payload.
SEND_SEG = bytes([0x41, 0x43]) + bytes(4) + struct.pack(">III", 0, 9, 0) + b"hello, wire"

# name -> (datagram, UDP destination port, expected decode)
CRAFTED = [
    ("credit", dgram(flags=RD | CREDIT, credits=37, psn=5), 17471,
     {"kind": "CREDIT", "credits": "37", "crc": "1"}),
    ("nak_seq", dgram(flags=RD | NAK, nak=2, ack=70), 17471,
     {"kind": "NAK SEQ", "nak": "2", "ack": "70", "crc": "1"}),
    ("nak_access", dgram(flags=RD | NAK, nak=3, ack=77), 17471,
     {"kind": "NAK REM_ACCESS", "nak": "3", "ack": "77", "crc": "1"}),
    ("nak_op", dgram(flags=RD | NAK, nak=4, ack=78), 17471,
     {"kind": "NAK REM_OP", "nak": "4", "ack": "78", "crc": "1"}),
    ("nak_invalid", dgram(flags=RD | NAK | CREDIT, nak=5, ack=79, credits=3), 17471,
     {"kind": "NAK INVALID", "nak": "5", "ack": "79", "credits": "3", "crc": "1"}),
    ("nak_rnr_delay", dgram(flags=RD | NAK, nak=1, ack=80, rnr=25), 17471,
     {"kind": "NAK RNR", "nak": "1", "rnr_us": "250", "crc": "1"}),
    ("dsack_ece", dgram(version=2, xflags=X_DSACK | X_ECE, flags=RD | ACK | SACK, ack=100,
                        sacks=[(90, 91), (102, 105), (110, 111)]), 17471,
     {"kind": "ACK", "sack_start": "90|102|110", "sack_end": "90|102|110", "crc": "1",
      "dsack": "1|0|0", "ece": "1"}),
    ("bad_crc", dgram(flags=RD | CREDIT, credits=1, bad_crc=True), 17471,
     {"kind": "CREDIT", "crc": "0", "expert": "Bad CRC32c"}),
    ("ud_without_data", dgram(flags=0), 17471,
     {"crc": "1", "expert": "flags: UD packet without DATA"}),
    ("reserved_byte4", dgram(flags=RD | ACK, ack=4, byte4=0x01), 17471,
     {"crc": "1", "expert": "dst_qpn: reserved high 8 bits set"}),
    ("version3", dgram(version=3, flags=RD | ACK, ack=4), 17471,
     {"expert": "unknown version"}),
    ("heuristic_port", dgram(flags=DATA, qkey=0x1234, tail=SEND_SEG), 40000,
     {"kind": "DATA", "crc": "1", "opcode": "0x03"}),
    ("not_diwarp", b"\x01" + bytes(40), 40001, None),
]
CRAFTED[6][3]["sack_end"] = "91|105|111"

# One datagram per rule of the decoder (docs/PROTOCOL.md, "Rules the decoder
# enforces"): the dissector must name the rule, and the engine refuse it.
PULL_DESC = struct.pack(">II", 100, 40)
BROKEN = [
    ("v2_no_xflag", dgram(version=2, flags=RD | ACK, ack=1), "version 2 with no X-flag"),
    # Stream start (X2-flag START, byte 8 of version 2): RD DATA only; its
    # descriptor (First PSN, First MSN) must be there; other X2 bits reserved.
    ("start_on_ack", dgram(version=2, flags=RD | ACK, ack=1, src=0x01000002,
                           tail=struct.pack(">II", 5, 5)), "xflags2: START without RD and DATA"),
    ("start_truncated", dgram(version=2, flags=RD | ACK, ack=1, src=0x01000002),
     "shorter than its header"),
    # 0x08 is AUTH, 0x10 ACKDELAY (below); 0x20 is still reserved.
    ("x2_reserved", dgram(version=2, flags=RD | ACK, ack=1, src=0x20000002),
     "xflags2: unknown bits set"),
    # AUTH: its trailer replaces the CRC, so never with NOCRC; a datagram
    # too short for header and trailer.
    ("auth_with_nocrc", dgram(version=2, xflags=X_NOCRC, flags=RD | ACK, ack=1,
                              src=(X2_AUTH << 24) | 2, tail=AUTH_TRAILER, crc=False),
     "AUTH with NOCRC"),
    ("auth_truncated", dgram(version=2, flags=RD | ACK, ack=1, src=(X2_AUTH << 24) | 2,
                             tail=AUTH_TRAILER[:20], crc=False), "shorter than"),
    # ACK delay (X2-flag ACKDELAY): RD with ACK only (DATA, CREDIT or a UD
    # Send without ACK has none to delay); its 4-byte value must be there.
    ("ackdelay_on_data", dgram(version=2, flags=RD | DATA, psn=7, src=(X2_ACKDELAY << 24) | 2,
                               tail=struct.pack(">I", 40) + SEND_SEG),
     "xflags2: ACKDELAY without RD and ACK"),
    ("ackdelay_on_credit", dgram(version=2, flags=RD | CREDIT, credits=3,
                                 src=(X2_ACKDELAY << 24) | 2, tail=struct.pack(">I", 40)),
     "xflags2: ACKDELAY without RD and ACK"),
    ("ackdelay_on_ud", dgram(version=2, flags=DATA, qkey=0x1234, src=(X2_ACKDELAY << 24) | 2,
                             tail=struct.pack(">I", 40) + SEND_SEG),
     "xflags2: ACKDELAY without RD and ACK"),
    ("ackdelay_truncated", dgram(version=2, flags=RD | ACK, ack=1, src=(X2_ACKDELAY << 24) | 2,
                                 tail=b"\0\0"), "shorter than its header"),
    ("nine_sacks", dgram(flags=RD | ACK | SACK, ack=1, sacks=[(3 + 2 * i, 4 + 2 * i) for i in range(9)]),
     "more than 8"),
    ("src_qpn_high", dgram(flags=RD | ACK, ack=1, src=0x01000002), "src_qpn: reserved"),
    ("ud_with_ack", dgram(flags=DATA | ACK, ack=1, tail=SEND_SEG), "UD packet with"),
    ("sack_without_ack", dgram(flags=RD | SACK | CREDIT, credits=1, sacks=[(5, 6)]),
     "SACK without ACK"),
    ("nak_with_data", dgram(flags=RD | NAK | DATA, nak=1, ack=1, tail=SEND_SEG), "NAK and DATA"),
    ("nak_with_ack", dgram(flags=RD | NAK | ACK, nak=1, ack=1), "NAK and ACK"),
    ("imm_without_data", dgram(flags=RD | ACK | IMM, ack=1), "IMM without DATA"),
    ("control_without_reason", dgram(flags=RD | ACKREQ), "control-only packet without"),
    ("sacks_without_flag", dgram(flags=RD | ACK, ack=1, sacks=[(5, 6)]), "non-zero without SACK"),
    ("sack_flag_no_blocks", dgram(flags=RD | ACK | SACK, ack=1), "zero with SACK"),
    ("nak_code_zero", dgram(flags=RD | NAK, nak=0, ack=1), "zero with the NAK flag"),
    ("nak_code_six", dgram(flags=RD | NAK, nak=6, ack=1), "unknown code"),
    ("nak_code_without_nak", dgram(flags=RD | ACK, nak=2, ack=1), "non-zero without the NAK flag"),
    ("rnr_delay_not_rnr", dgram(flags=RD | NAK, nak=3, ack=1, rnr=5), "rnr_delay"),
    ("ack_psn_without_ack", dgram(flags=RD | CREDIT, credits=1, ack=5), "ack_psn: non-zero"),
    ("credits_without_flag", dgram(flags=RD | ACK, ack=1, credits=4), "credits: non-zero"),
    # 0x40 and 0x80 were reserved; now RAILS and RAIL announce extensions.
    ("rails_missing", dgram(version=2, xflags=X_RAILS, flags=RD | ACK, ack=1),
     "shorter than its header"),
    ("origin_missing", dgram(version=2, xflags=X_RAIL, flags=RD | ACK, ack=1),
     "shorter than its header"),
    ("rails_count_zero", dgram(version=2, xflags=X_RAILS, flags=RD | DATA,
                               tail=rail_list(count=0) + SEND_SEG), "rails: count not within"),
    ("rails_count_five", dgram(version=2, xflags=X_RAILS, flags=RD | DATA,
                               tail=rail_list(*["10.0.%d.1" % i for i in range(5)]) + SEND_SEG),
     "rails: count not within"),
    ("rails_reserved", dgram(version=2, xflags=X_RAILS, flags=RD | DATA,
                             tail=rail_list("10.0.0.1", rsvd=b"\0\1\0") + SEND_SEG),
     "rails: reserved bytes"),
    ("rails_zero_addr", dgram(version=2, xflags=X_RAILS, flags=RD | ACK, ack=1,
                              tail=rail_list("10.0.0.1", "0.0.0.0")), "rails: address 0.0.0.0"),
    ("origin_zero", dgram(version=2, xflags=X_RAIL, flags=RD | DATA,
                          tail=ip4("0.0.0.0") + SEND_SEG), "rail: origin address 0.0.0.0"),
    ("rail_on_ud", dgram(version=2, xflags=X_RAIL, flags=DATA, tail=ip4("10.0.0.1") + SEND_SEG),
     "RAILS or RAIL on a UD packet"),
    ("xflag_cctl_no_data", dgram(version=2, xflags=0x20, flags=RD | ACK, ack=1), "CCTL"),
    ("nocrc_on_ud", dgram(version=2, xflags=X_NOCRC, flags=DATA, tail=SEND_SEG),
     "NOCRC on a UD packet"),
    ("pull_and_pullreq", dgram(version=2, xflags=X_PULL | X_PULLREQ, flags=RD | DATA,
                               tail=PULL_DESC + SEND_SEG), "PULL and PULLREQ"),
    ("pullreq_without_data", dgram(version=2, xflags=X_PULLREQ, flags=RD | ACK, ack=1),
     "without RD and DATA"),
    ("dsack_without_sack", dgram(version=2, xflags=X_DSACK, flags=RD | ACK, ack=1),
     "DSACK without"),
    ("ece_without_ack", dgram(version=2, xflags=X_ECE, flags=RD | CREDIT, credits=1),
     "ECE without ACK"),
    ("pull_pushed_all", dgram(version=2, xflags=X_PULL, flags=RD | DATA,
                              tail=struct.pack(">II", 100, 100) + SEND_SEG), "pull: pushed"),
    ("sack_at_ack", dgram(flags=RD | ACK | SACK, ack=10, sacks=[(10, 12)]), "not after ack_psn"),
    ("sack_touching", dgram(flags=RD | ACK | SACK, ack=10, sacks=[(12, 14), (14, 16)]),
     "ascending order"),
    ("sack_reversed", dgram(flags=RD | ACK | SACK, ack=10, sacks=[(14, 12)]), "before its start"),
    ("dsack_empty", dgram(version=2, xflags=X_DSACK, flags=RD | ACK | SACK, ack=10,
                          sacks=[(5, 5)]), "empty D-SACK"),
    ("control_with_bytes", dgram(flags=RD | ACK, ack=1, tail=b"xx"), "bytes after its header"),
    ("segment_too_short", dgram(flags=RD | DATA, psn=1, tail=b"short"), "shorter than a DDP"),
    ("too_short", bytes([1, RD | ACK]) + bytes(18), "shorter than"),
]
for name, d, why in BROKEN:
    CRAFTED.append((name, d, 17471, {"expert": why}))
# Accepted by both: a NOCRC ACK, a PULL first segment.
CRAFTED.append(("nocrc_ack", dgram(version=2, xflags=X_NOCRC, flags=RD | ACK, ack=3, crc=False),
                17471, {"kind": "ACK", "crc": "3", "ack": "3"}))
CRAFTED.append(("pull_first", dgram(version=2, xflags=X_PULL, flags=RD | DATA, psn=9,
                                    tail=PULL_DESC + bytes([0x01, 0x43]) + bytes(4) +
                                    struct.pack(">III", 0, 3, 0) + bytes(40)),
                17471, {"kind": "DATA", "crc": "1", "opcode": "0x03"}))
# Stream start (docs/PROTOCOL.md, "Stream start"): a stream's first Send with
# X2-flag START (byte 8) and its descriptor, First PSN and First MSN.
CRAFTED.append(("start_send", dgram(version=2, flags=RD | DATA, psn=0x9ABCDEF0, src=0x01000002,
                                    qkey=0x1234, tail=struct.pack(">II", 0x9ABCDEF0, 0x9ABCDEF0) +
                                    bytes([0x41, 0x43]) + bytes(4) +
                                    struct.pack(">III", 0, 0x9ABCDEF0, 0) + b"hello, wire"),
                17471, {"kind": "DATA", "crc": "1", "opcode": "0x03"}))
# Multirail (docs/PROTOCOL.md, "Multirail"): a rail list on an ACK, an origin
# on a Send, and every extension at once in its order (SACK blocks, pull
# descriptor, rail list, origin), without CRC.
RAILS3 = ("10.0.0.1", "10.0.1.1", "10.0.2.1")
CRAFTED.append(("rails_ack", dgram(version=2, xflags=X_RAILS, flags=RD | ACK, ack=5,
                                   tail=rail_list(*RAILS3)),
                17471, {"kind": "ACK", "crc": "1", "ack": "5", "rail_count": "3",
                        "rails": "|".join(RAILS3)}))
CRAFTED.append(("rail_send", dgram(version=2, xflags=X_RAIL, flags=RD | DATA, psn=11,
                                   tail=ip4("10.0.0.1") + SEND_SEG),
                17471, {"kind": "DATA", "crc": "1", "opcode": "0x03", "origin": "10.0.0.1"}))
CRAFTED.append(("all_extensions",
                dgram(version=2, xflags=X_NOCRC | X_PULL | X_DSACK | X_RAILS | X_RAIL,
                      flags=RD | ACK | SACK | DATA, psn=12, ack=100, sacks=[(90, 91), (102, 105)],
                      tail=PULL_DESC + rail_list(*RAILS3) + ip4("10.0.0.1") +
                      bytes([0x01, 0x43]) + bytes(4) + struct.pack(">III", 0, 4, 0) + bytes(40),
                      crc=False),
                17471, {"kind": "DATA", "crc": "3", "opcode": "0x03", "dsack": "1|0",
                        "rail_count": "3", "rails": "|".join(RAILS3), "origin": "10.0.0.1"}))
# Authentication (X2-flag AUTH): an RD Send, a UD Send (version 2 with byte 8
# = AUTH alone, byte 4 = 0) and RC over RD's ACK with its token, each ending in
# the trailer instead of the CRC32c.
AUTH_EXP = {"crc": "3", "auth": "1", "auth_salt": "0xa1b2c3d4",
            "auth_counter": str(AUTH_COUNTER), "auth_tag": AUTH_TAG.hex()}
CRAFTED.append(("auth_rd_send", dgram(version=2, flags=RD | DATA, psn=21, src=(X2_AUTH << 24) | 2,
                                      qkey=0x1234, tail=SEND_SEG + AUTH_TRAILER, crc=False),
                17471, dict(AUTH_EXP, kind="DATA", opcode="0x03")))
CRAFTED.append(("auth_ud_send", dgram(version=2, flags=DATA, src=(X2_AUTH << 24) | 2,
                                      qkey=0x1234, tail=SEND_SEG + AUTH_TRAILER, crc=False),
                17471, dict(AUTH_EXP, kind="DATA", opcode="0x03")))
CRAFTED.append(("auth_token_ack", dgram(version=2, flags=RD | ACK, ack=22,
                                        src=((X2_TOKEN | X2_AUTH) << 24) | 2,
                                        tail=struct.pack(">Q", 0x1122334455667788) + AUTH_TRAILER,
                                        crc=False),
                17471, dict(AUTH_EXP, kind="ACK", ack="22")))
# ACK delay (docs/PROTOCOL.md, "ACK delay"): X2-flag ACKDELAY on an RD ACK,
# its 4-byte value (microseconds) the last extension, after the SACK blocks,
# token and challenge, before the CRC32c or the authentication trailer. A
# sender reports at most 1 s; a receiver takes any value, and the flag on an
# ACK that DATA carries too (a sender sets it only on a control-only ACK).
ACK_TOKEN, ACK_CHALLENGE = 0x1122334455667788, 0x99AABBCCDDEEFF01
CRAFTED.append(("ackdelay_ack", dgram(version=2, flags=RD | ACK, ack=5, src=(X2_ACKDELAY << 24) | 2,
                                      tail=struct.pack(">I", 250)),
                17471, {"kind": "ACK", "crc": "1", "ack": "5", "ack_delay": "250"}))
CRAFTED.append(("ackdelay_sack_token_challenge",
                dgram(version=2, flags=RD | ACK | SACK, ack=10, sacks=[(12, 14), (16, 17)],
                      src=((X2_TOKEN | X2_CHALLENGE | X2_ACKDELAY) << 24) | 2,
                      tail=struct.pack(">QQI", ACK_TOKEN, ACK_CHALLENGE, 1000)),
                17471, {"kind": "ACK", "crc": "1", "ack": "10", "sack_start": "12|16",
                        "sack_end": "14|17", "ack_delay": "1000"}))
CRAFTED.append(("ackdelay_over_cap", dgram(version=2, flags=RD | ACK, ack=6,
                                           src=(X2_ACKDELAY << 24) | 2,
                                           tail=struct.pack(">I", 0xFFFFFFFF)),
                17471, {"kind": "ACK", "crc": "1", "ack": "6", "ack_delay": str(0xFFFFFFFF)}))
CRAFTED.append(("ackdelay_with_data", dgram(version=2, flags=RD | ACK | DATA, ack=7, psn=13,
                                            src=(X2_ACKDELAY << 24) | 2,
                                            tail=struct.pack(">I", 40) + SEND_SEG),
                17471, {"kind": "DATA", "crc": "1", "ack": "7", "opcode": "0x03",
                        "ack_delay": "40"}))
CRAFTED.append(("ackdelay_nocrc", dgram(version=2, xflags=X_NOCRC, flags=RD | ACK, ack=8,
                                        src=(X2_ACKDELAY << 24) | 2, tail=struct.pack(">I", 77),
                                        crc=False),
                17471, {"kind": "ACK", "crc": "3", "ack": "8", "ack_delay": "77"}))
CRAFTED.append(("ackdelay_auth", dgram(version=2, flags=RD | ACK, ack=9,
                                       src=((X2_ACKDELAY | X2_AUTH) << 24) | 2,
                                       tail=struct.pack(">I", 99) + AUTH_TRAILER, crc=False),
                17471, dict(AUTH_EXP, kind="ACK", ack="9", ack_delay="99")))


# UDP GSO buffers (several datagrams of one size, the last maybe shorter, as
# one frame: what a capture on loopback sees of rd_send_batch) whose headers
# differ as one QP's batch to several QPs of one peer device makes them
# differ: the X2-flag START (byte 8) on one stream and not on the next, SACK
# blocks on the first and a last datagram no longer than a credit control
# segment. name -> (datagrams, expected decode, one value per datagram).
def cctl_seg(typ, value):
    """A credit control segment (X-flag CCTL): untagged DDP header on queue 3
    with the type in its first RsvdULP byte, MSN 1, MO 0, then the value."""
    return bytes([0x41, typ]) + bytes(4) + struct.pack(">III", 3, 1, 0) + struct.pack(">I", value)


def send_seg(msn, n):
    return bytes([0x41, 0x43]) + bytes(4) + struct.pack(">III", 0, msn, 0) + bytes(range(n))


def start_desc(psn):
    return struct.pack(">II", psn, psn)


GSO_SRC = 0x3007
CRAFTED_GSO = [
    ("gso_cctl_start_then_synced",
     [dgram(version=2, xflags=X_CCTL, flags=RD | DATA | ACKREQ, dst=0x1010,
            src=(X2_START << 24) | GSO_SRC, psn=500, tail=start_desc(500) + cctl_seg(2, 3)),
      dgram(version=2, xflags=X_CCTL, flags=RD | DATA | ACKREQ, dst=0x1011, src=GSO_SRC,
            psn=601, tail=cctl_seg(2, 5))],
     {"kind": "CCTL|CCTL", "crc": "1|1"}),
    ("gso_cctl_sacks_then_plain",
     [dgram(version=2, xflags=X_CCTL, flags=RD | ACK | SACK | DATA | ACKREQ, dst=0x1012,
            src=GSO_SRC, psn=700, ack=40, sacks=[(42, 43), (45, 47)], tail=cctl_seg(1, 0)),
      dgram(version=2, xflags=X_CCTL, flags=RD | DATA | ACKREQ, dst=0x1013, src=GSO_SRC,
            psn=801, tail=cctl_seg(1, 0))],
     {"kind": "CCTL|CCTL", "crc": "1|1"}),
    ("gso_send_start_then_synced",
     [dgram(version=2, flags=RD | DATA, dst=0x1014, src=(X2_START << 24) | GSO_SRC, psn=900,
            tail=start_desc(900) + send_seg(900, 64)),
      dgram(flags=RD | DATA, dst=0x1015, src=GSO_SRC, psn=1001, tail=send_seg(1001, 72)),
      dgram(flags=RD | DATA, dst=0x1015, src=GSO_SRC, psn=1002, tail=send_seg(1002, 10))],
     {"kind": "DATA|DATA|DATA", "crc": "1|1|1", "opcode": "0x03|0x03|0x03"}),
    ("gso_nocrc_start_then_synced",
     [dgram(version=2, xflags=X_CCTL | X_NOCRC, flags=RD | DATA | ACKREQ, dst=0x1016,
            src=(X2_START << 24) | GSO_SRC, psn=1100, tail=start_desc(1100) + cctl_seg(2, 1),
            crc=False),
      dgram(version=2, xflags=X_CCTL | X_NOCRC, flags=RD | DATA | ACKREQ, dst=0x1017,
            src=GSO_SRC, psn=1201, tail=cctl_seg(2, 2), crc=False)],
     {"kind": "CCTL|CCTL", "crc": "3|3"}),
    # Split, a datagram with a bad CRC still shows as one.
    ("gso_second_bad_crc",
     [dgram(flags=RD | DATA, dst=0x1018, src=GSO_SRC, psn=1300, tail=send_seg(1300, 40)),
      dgram(flags=RD | DATA, dst=0x1018, src=GSO_SRC, psn=1301, tail=send_seg(1301, 40),
            bad_crc=True)],
     {"kind": "DATA|DATA", "crc": "1|0", "expert": "Bad CRC32c"}),
]


def write_pcap(path, payloads):
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101))  # LINKTYPE_RAW
        for i, (d, sport, dport) in enumerate(payloads):
            pkt = ipv4_udp(d, sport, dport)
            f.write(struct.pack("<IIII", 1000 + i, 0, len(pkt), len(pkt)) + pkt)


def craft(path, gso_path):
    # Outside the registered range both ways: only the heuristic can take it.
    write_pcap(path, [(d, 17472 if port == 17471 else 40002, port)
                      for _, d, port, _ in CRAFTED])
    for _, ds, _ in CRAFTED_GSO:
        assert all(len(d) == len(ds[0]) for d in ds[:-1]) and len(ds[-1]) <= len(ds[0])
    write_pcap(gso_path, [(b"".join(ds), 17472, 17471) for _, ds, _ in CRAFTED_GSO])


# --------------------------------------------------------------- decoding

FIELDS = ["frame.number", "udp.srcport", "udp.dstport", "diwarp.transport", "diwarp.kind",
          "diwarp.version", "diwarp.flags", "diwarp.sack_count", "diwarp.nak_code",
          "diwarp.dst_qpn", "diwarp.src_qpn", "diwarp.qkey", "diwarp.psn", "diwarp.ack_psn",
          "diwarp.credits", "diwarp.rnr_delay", "diwarp.crc.status", "diwarp.seg_len",
          "diwarp.rdmap_opcode", "diwarp.retransmission", "diwarp.sack.start", "diwarp.sack.end",
          "diwarp.sack.dsack", "diwarp.xflags.nocrc", "diwarp.xflags.pull",
          "diwarp.xflags.pullreq", "diwarp.xflags.ece", "diwarp.pull.msg_len",
          "diwarp.pull.pushed", "diwarp.imm.value", "diwarp.imm.word2", "diwarp.rnr_delay_us",
          "diwarp.cctl.type", "diwarp.cctl.value", "diwarp.xflags.rails", "diwarp.xflags.rail",
          "diwarp.rails.count", "diwarp.rails.addr", "diwarp.origin",
          "diwarp.xflags2.auth", "diwarp.auth.salt", "diwarp.auth.counter", "diwarp.auth.tag",
          "diwarp.ack_delay",
          "iwarp_rdma.opcode", "iwarp_ddp.msn", "iwarp_ddp.qn", "iwarp_ddp.last_flag",
          "iwarp_rdma.rdmardsz", "iwarp_rdma.sinkstag", "iwarp_rdma.srcstag",
          "iwarp_rdma.srcto", "iwarp_rdma.atomic.add_data", "iwarp_rdma.atomic.swap_data",
          "iwarp_rdma.atomic.compare_data", "iwarp_rdma.atomic.original_remote_data_value",
          "diwarp.gso.segments", "diwarp.gso.size", "_ws.malformed", "_ws.expert.message"]

# Per datagram (one value each, in order, for every diwarp datagram of a frame).
PER_DGRAM = ["diwarp.transport", "diwarp.kind", "diwarp.version", "diwarp.flags",
             "diwarp.sack_count", "diwarp.nak_code", "diwarp.dst_qpn", "diwarp.src_qpn",
             "diwarp.qkey", "diwarp.psn", "diwarp.ack_psn", "diwarp.credits",
             "diwarp.rnr_delay", "diwarp.crc.status"]
# Per DATA datagram.
PER_DATA = ["diwarp.seg_len", "diwarp.rdmap_opcode"]


def tshark(lua, pcap, extra=()):
    # RPC-over-RDMA's heuristic (under Wireshark's DDP/RDMAP dissector) takes
    # some short Send payloads for its own and throws: application bytes are
    # not what is checked here.
    cmd = ["tshark", "-n", "-r", pcap, "-X", "lua_script:" + lua,
           "--disable-heuristic", "rpcrdma_iwarp"] + list(extra)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    err = "\n".join(l for l in r.stderr.splitlines() if "Running as user" not in l
                    and "could be dangerous" not in l.lower())
    check(r.returncode == 0, f"{pcap}: tshark exited {r.returncode}: {err}")
    check("Lua" not in err and "rror" not in err, f"{pcap}: tshark says: {err}")
    return r.stdout


def decode(lua, pcap, strict=True):
    """Frames (dicts of field -> list of values) and datagrams (dicts).
    strict: every DATA datagram must have been handed on (not strict: a
    capture with corrupted datagrams, whose headers may break the rules)."""
    args = ["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|", "-E", "separator=\t"]
    for f in FIELDS:
        args += ["-e", f]
    frames, dgrams = [], []
    for line in tshark(lua, pcap, args).splitlines():
        vals = line.split("\t")
        fr = {f: (v.split("|") if v else []) for f, v in zip(FIELDS, vals)}
        frames.append(fr)
        n = len(fr["diwarp.transport"])
        if n == 0:
            continue  # not diwarp, or a version this dissector does not know
        for f in PER_DGRAM:
            check(len(fr[f]) == n, f"{pcap} frame {fr['frame.number']}: {f} x{len(fr[f])}, "
                  f"{n} datagrams")
        # DATA datagrams that carry DDP/RDMAP (a CCTL segment is not handed on)
        ndata = sum(1 for fl, k in zip(fr["diwarp.flags"], fr["diwarp.kind"])
                    if int(fl, 16) & DATA and k != "CCTL")
        aligned = all(len(fr[f]) == ndata for f in PER_DATA)
        if strict:
            for f in PER_DATA:
                check(len(fr[f]) == ndata, f"{pcap} frame {fr['frame.number']}: {f} "
                      f"x{len(fr[f])}, {ndata} DATA datagrams")
        rd_data = [i for i in range(n) if int(fr["diwarp.flags"][i], 16) & (RD | DATA) == RD | DATA]
        ret = fr["diwarp.retransmission"]
        if strict:
            check(len(ret) == len(rd_data), f"{pcap} frame {fr['frame.number']}: retransmission "
                  f"flags x{len(ret)}, {len(rd_data)} RD DATA datagrams")
        di = 0
        for i in range(min(n, len(fr["diwarp.flags"]))):
            d = {f: fr[f][i] if i < len(fr[f]) else "" for f in PER_DGRAM}
            d["frame"] = int(fr["frame.number"][0])
            d["flags"] = int(d["diwarp.flags"], 16)
            d["src"] = int(d["diwarp.src_qpn"], 16)
            d["dst"] = int(d["diwarp.dst_qpn"], 16)
            d["psn"] = int(d["diwarp.psn"])
            d["ack"] = int(d["diwarp.ack_psn"])
            if d["flags"] & DATA and d["diwarp.kind"] != "CCTL" and aligned and \
                    di < len(fr["diwarp.seg_len"]):
                d["seg_len"] = int(fr["diwarp.seg_len"][di])
                d["opcode"] = int(fr["diwarp.rdmap_opcode"][di], 16)
                di += 1
            if i in rd_data and len(ret) == len(rd_data):
                d["retx"] = ret[rd_data.index(i)] in ("1", "True")
            dgrams.append(d)
    return frames, dgrams


def common_checks(name, frames, dgrams, allow_nocrc=False):
    check(len(dgrams) > 0, f"{name}: no diwarp datagram decoded")
    for fr in frames:
        num = fr["frame.number"][0]
        check(len(fr["diwarp.transport"]) > 0, f"{name} frame {num}: UDP not decoded as diwarp")
        check(not fr["_ws.malformed"], f"{name} frame {num}: malformed")
        bad = [m for m in fr["_ws.expert.message"]
               if "Retransmission" not in m and not m.startswith("NAK")]
        check(not bad, f"{name} frame {num}: expert {bad}")
        # Wireshark's own iWARP dissector decoded every DDP segment we handed it.
        nseg = sum(1 + (1 if int(fl, 16) & IMM else 0)
                   for fl, k in zip(fr["diwarp.flags"], fr["diwarp.kind"])
                   if int(fl, 16) & DATA and k != "CCTL")
        check(len(fr["iwarp_rdma.opcode"]) == nseg,
              f"{name} frame {num}: {len(fr['iwarp_rdma.opcode'])} RDMAP headers, {nseg} expected")
        ours = [o for o in fr["diwarp.rdmap_opcode"]]
        theirs = [o for o in fr["iwarp_rdma.opcode"] if o not in ("0x08", "0x09")]
        check(ours == theirs, f"{name} frame {num}: opcodes {ours} vs Wireshark's {theirs}")
    for d in dgrams:
        st = d["diwarp.crc.status"]
        if allow_nocrc and st == "3":
            check(d["diwarp.version"] == "2", f"{name} frame {d['frame']}: no CRC on version 1")
        else:
            check(st == "1", f"{name} frame {d['frame']}: CRC status {st}, not Good")


def unique(dgrams, **kw):
    """First copy of each PSN among RD DATA datagrams matching kw."""
    seen, out = set(), []
    for d in dgrams:
        if not d["flags"] & DATA or not d["flags"] & RD:
            continue
        if any(d.get(k) != v for k, v in kw.items()):
            continue
        if d["psn"] in seen:
            continue
        seen.add(d["psn"])
        out.append(d)
    return out


def payload(d):
    # DDP/RDMAP header: 14 bytes tagged (Write, Read Response), 18 untagged.
    return d["seg_len"] - (14 if d["opcode"] in (0, 2) else 18)


def contiguous(psns):
    return sorted(psns) == list(range(min(psns), min(psns) + len(psns))) if psns else False


def result(capdir, name):
    line = open(f"{capdir}/{name}.out").read()
    return dict(re.findall(r"(\w+)=(\S+)", line))


def check_traffic(lua, capdir):
    out = open(f"{capdir}/traffic.out").read()
    m = re.search(r"^UD (.*)$", out, re.M)
    r = re.search(r"^RC (.*)$", out, re.M)
    if not check(m and r, "dgram_traffic printed no UD/RC line"):
        return
    ud = dict(kv.split("=") for kv in m.group(1).split())
    rc = dict(kv.split("=") for kv in r.group(1).split())
    frames, dg = decode(lua, f"{capdir}/traffic.pcapng")
    common_checks("traffic", frames, dg)
    check(any(len(f["diwarp.transport"]) > 1 for f in frames), "traffic: no GSO buffer split")

    # UD: one datagram per Send, each a single-segment untagged Send.
    us, ud_dst = int(ud["src"], 16), int(ud["dst"], 16)
    uds = [d for d in dg if d["src"] == us and d["diwarp.transport"] == "UD"]
    check(len(uds) == int(ud["sends"]), f"UD: {len(uds)} datagrams, {ud['sends']} Sends posted")
    for d in uds:
        check(d["dst"] == ud_dst, f"UD frame {d['frame']}: dst QPN {d['dst']:#x}")
        check(d["diwarp.qkey"] == "0x11111111", f"UD frame {d['frame']}: Q_Key {d['diwarp.qkey']}")
        check(d.get("opcode") == 3 and payload(d) == int(ud["len"]),
              f"UD frame {d['frame']}: opcode {d.get('opcode')} payload {d.get('seg_len')}")
    imm = [d for d in uds if d["flags"] & IMM]
    check(len(imm) == 1 and imm[-1] is uds[-1], "UD: the last Send alone carries IMM")
    fr_by = {int(f["frame.number"][0]): f for f in frames}
    if imm:
        f = fr_by[imm[0]["frame"]]
        check(f["diwarp.imm.value"] == [ud["imm"]], f"UD immediate {f['diwarp.imm.value']}")
        check(f["iwarp_rdma.opcode"] == ["0x03", "0x08"], f"UD IMM frame {f['iwarp_rdma.opcode']}")
        m2 = [int(x) for x in f["iwarp_ddp.msn"]]
        check(len(m2) == 2 and m2[1] == (m2[0] + 1) % 2**32,
              f"UD: the Immediate Data message takes the Send's MSN + 1: {m2}")
    msns = [int(fr_by[d["frame"]]["iwarp_ddp.msn"][0]) for d in uds]
    check(all((b - a) % 2**32 == 1 for a, b in zip(msns, msns[1:])), f"UD MSNs {msns}")

    check_reliable("RC over RD", dg, fr_by, rc)


def check_rd_native(lua, capdir):
    out = open(f"{capdir}/rd_native.out").read()
    m = re.search(r"^RD (.*)$", out, re.M)
    if not check(m, "dgram_rd_traffic printed no RD line"):
        return
    rd = dict(kv.split("=") for kv in m.group(1).split())
    frames, dg = decode(lua, f"{capdir}/rd_native.pcapng")
    common_checks("rd_native", frames, dg)
    fr_by = {int(f["frame.number"][0]): f for f in frames}
    check_reliable("RD", dg, fr_by, rd)


def check_reliable(name, dg, fr_by, rc):
    """The operations dgram_traffic (RC over RD) or dgram_rd_traffic (RD)
    posted, from QP src to QP dst, as the capture shows them. RD requests
    carry the WR's Q_Key, responses and RC over RD 0 (docs/PROTOCOL.md)."""
    c, dq = int(rc["src"], 16), int(rc["dst"], 16)
    req = [d for d in dg if d["src"] == c and d["dst"] == dq]
    rsp = [d for d in dg if d["src"] == dq and d["dst"] == c]
    check(req and rsp, f"{name}: no datagram between QPs {c:#x} and {dq:#x}")
    check(all(d["diwarp.transport"] == "RD" for d in req + rsp), f"{name}: non-RD datagram")
    qkey = rc.get("qkey", "0x00000000")
    check(all(d["diwarp.qkey"] == qkey for d in req if d["flags"] & DATA),
          f"{name}: requests carry Q_Key {set(d['diwarp.qkey'] for d in req)}, not {qkey}")
    check(all(d["diwarp.qkey"] == "0x00000000" for d in rsp if d["flags"] & DATA),
          f"{name}: responses carry Q_Key {set(d['diwarp.qkey'] for d in rsp)}, not 0")
    if not req:
        return
    first = min(d["psn"] for d in req if d["flags"] & DATA)
    rnr = [d for d in rsp if d["diwarp.kind"] == "NAK RNR"]
    check(len(rnr) >= 1, f"{name}: no RNR NAK")
    check(all(d["diwarp.nak_code"] == "1" and d["ack"] == first for d in rnr),
          f"{name}: RNR NAKs name PSN {[d['ack'] for d in rnr]}, the first Send is {first}")
    check(any(d.get("retx") and d["psn"] == first for d in req),
          f"{name}: the Send refused by RNR was not resent")
    u = unique(req)
    check(contiguous([d["psn"] for d in u]), f"{name}: request PSNs not contiguous")
    sends = [d for d in u if d["opcode"] == 3]
    nsend = int(rc["rnr_sends"]) + int(rc["sends"]) + int(rc["imm_sends"])
    check(len(sends) == nsend, f"{name}: {len(sends)} Sends, {nsend} posted")
    check(all(payload(d) == int(rc["len"]) for d in sends), f"{name}: Send payload length")
    ims = [d for d in sends if d["flags"] & IMM]
    check(len(ims) == 1 and fr_by[ims[0]["frame"]]["diwarp.imm.value"] == [rc["imm"]],
          f"{name}: Send with Immediate")
    if ims:
        m2 = fr_by[ims[0]["frame"]]["iwarp_ddp.msn"]
        check(len(m2) == 2 and m2[0] == m2[1],
              f"{name}: the Immediate Data message carries the Send's MSN: {m2}")
    writes = [d for d in u if d["opcode"] == 0]
    check(sum(payload(d) for d in writes) == int(rc["write_len"]),
          f"{name} RDMA Write: {sum(payload(d) for d in writes)} bytes, {rc['write_len']} written")
    rreq = [d for d in u if d["opcode"] == 1]
    check(len(rreq) == 1 and fr_by[rreq[0]["frame"]]["iwarp_rdma.rdmardsz"] == [rc["read_len"]],
          f"{name}: RDMA Read Request size")
    ur = unique(rsp)
    rresp = [d for d in ur if d["opcode"] == 2]
    check(sum(payload(d) for d in rresp) == int(rc["read_len"]), f"{name}: Read Response bytes")
    # Atomics: add=A to old0, then compare old0+A and swap in S.
    add, old0, swap = int(rc["add"]), int(rc["old"]), int(rc["swap"])
    areq = [fr_by[d["frame"]] for d in u if d["opcode"] == 0xA]
    check(len(areq) == 2, f"{name}: {len(areq)} Atomic Requests")
    check(any(f["iwarp_rdma.atomic.add_data"] == [str(add)] for f in areq),
          f"{name}: Fetch-and-Add of {add}")
    check(any(f["iwarp_rdma.atomic.swap_data"] == [str(swap)] and
              f["iwarp_rdma.atomic.compare_data"] == [str(old0 + add)] for f in areq),
          f"{name}: Compare-and-Swap {old0 + add} -> {swap}")
    aresp = [fr_by[d["frame"]] for d in ur if d["opcode"] == 0xB]
    vals = sorted(int(f["iwarp_rdma.atomic.original_remote_data_value"][0]) for f in aresp)
    check(vals == [old0, old0 + add], f"{name}: Atomic Responses carry {vals}")
    check(any(d["flags"] & ACK and d["ack"] == max(x["psn"] for x in u) + 1 for d in rsp),
          f"{name}: the last request PSN is acknowledged")


def check_faults(lua, capdir):
    # RDMA Writes under loss: SACK blocks, retransmissions, every byte once.
    res = result(capdir, "rd_write")
    frames, dg = decode(lua, f"{capdir}/rd_write.pcapng")
    common_checks("rd_write", frames, dg)
    writes = [d for d in dg if d["flags"] & DATA and d["opcode"] == 0]
    client = writes[0]["src"] if writes else None
    u = unique(dg, src=client)
    check(contiguous([d["psn"] for d in u]), "rd_write: PSNs not contiguous")
    total = sum(payload(d) for d in u if d["opcode"] == 0)
    check(total == int(res["size"]) * int(res["iters"]), f"rd_write: {total} bytes written")
    # A datagram the fault drops never reaches the capture: its resend shows
    # as a PSN first seen after higher ones. A resend of one that did arrive
    # (reorder, a spurious timeout) is marked as a retransmission.
    top, late = None, 0
    for d in u:
        if top is not None and d["psn"] < top:
            late += 1
        top = d["psn"] if top is None else max(top, d["psn"])
    nretx = sum(1 for d in dg if d.get("retx"))
    check(late or nretx, "rd_write: no resend seen")
    print(f"rd_write: {late} PSNs first seen after higher ones, {nretx} marked retransmissions, "
          f"{sum(1 for d in dg if int(d['diwarp.sack_count']) > 0)} ACKs with SACK blocks")
    sacked = [d for d in dg if int(d["diwarp.sack_count"]) > 0]
    check(sacked, "rd_write: no SACK block")
    fr_by = {int(f["frame.number"][0]): f for f in frames}
    for d in sacked:
        f = fr_by[d["frame"]]
        starts = [int(x) for x in f["diwarp.sack.start"]]
        ends = [int(x) for x in f["diwarp.sack.end"]]
        ds = f["diwarp.sack.dsack"]
        check(len(starts) == int(d["diwarp.sack_count"]), f"rd_write frame {d['frame']}: blocks")
        for s, e, dup in zip(starts, ends, ds):
            if dup in ("1", "True"):
                continue
            check(d["ack"] < s < e, f"rd_write frame {d['frame']}: block [{s},{e}) vs ack {d['ack']}")

    res = result(capdir, "rd_read")
    frames, dg = decode(lua, f"{capdir}/rd_read.pcapng")
    common_checks("rd_read", frames, dg)
    rreq = unique([d for d in dg if d.get("opcode") == 1])
    check(len(rreq) == int(res["iters"]), f"rd_read: {len(rreq)} Read Requests")
    if rreq:
        server = rreq[0]["dst"]
        got = sum(payload(d) for d in unique(dg, src=server) if d["opcode"] == 2)
        check(got == int(res["size"]) * int(res["iters"]), f"rd_read: {got} bytes read")

    # Receiver-paced Sends: PULL with its descriptor, PULLREQ Reads.
    res = result(capdir, "rd_pull")
    frames, dg = decode(lua, f"{capdir}/rd_pull.pcapng")
    common_checks("rd_pull", frames, dg)
    pulls = [f for f in frames if "1" in f["diwarp.xflags.pull"] or "True" in f["diwarp.xflags.pull"]]
    check(pulls, "rd_pull: no PULL datagram")
    for f in pulls:
        check(f["diwarp.pull.msg_len"] == [res["size"]] and f["diwarp.pull.pushed"] == [res["chunk"]],
              f"rd_pull frame {f['frame.number'][0]}: descriptor {f['diwarp.pull.msg_len']} "
              f"{f['diwarp.pull.pushed']}")
    sender = [d["src"] for d in dg if d.get("opcode") == 3]
    if check(sender, "rd_pull: no Send"):
        pulled = sum(payload(d) for d in unique(dg, src=sender[0]) if d["opcode"] == 2)
        want = int(res["iters"]) * (int(res["size"]) - int(res["chunk"]))
        check(pulled == want, f"rd_pull: {pulled} bytes pulled, {want} expected")
    preq = [f for f in frames if any(x in ("1", "True") for x in f["diwarp.xflags.pullreq"])]
    check(preq and all(set(f["iwarp_rdma.opcode"]) == {"0x01"} for f in preq),
          "rd_pull: PULLREQ datagrams are Read Requests")

    res = result(capdir, "rd_nocrc")
    frames, dg = decode(lua, f"{capdir}/rd_nocrc.pcapng")
    common_checks("rd_nocrc", frames, dg, allow_nocrc=True)
    check(all(d["diwarp.crc.status"] == "3" for d in dg), "rd_nocrc: a datagram with a CRC")
    sends = unique([d for d in dg if d.get("opcode") == 3])
    check(len(sends) >= 2 * int(res["iters"]), f"rd_nocrc: {len(sends)} Sends")

    # GSO buffers without CRCs are split by the header rules alone.
    res = result(capdir, "rd_nocrc_write")
    frames, dg = decode(lua, f"{capdir}/rd_nocrc_write.pcapng")
    common_checks("rd_nocrc_write", frames, dg, allow_nocrc=True)
    check(all(d["diwarp.crc.status"] == "3" for d in dg), "rd_nocrc_write: a datagram with a CRC")
    check(any(len(f["diwarp.transport"]) > 1 for f in frames), "rd_nocrc_write: no GSO buffer")
    writes = [d for d in dg if d.get("opcode") == 0]
    if check(writes, "rd_nocrc_write: no RDMA Write"):
        total = sum(payload(d) for d in unique(dg, src=writes[0]["src"]) if d["opcode"] == 0)
        check(total == int(res["size"]) * int(res["iters"]), f"rd_nocrc_write: {total} bytes")

    # DIWARP_AUTH: AUTH on every datagram, its trailer shown, no CRC; GSO
    # buffers split by the header rules.
    res = result(capdir, "rd_auth")
    frames, dg = decode(lua, f"{capdir}/rd_auth.pcapng")
    common_checks("rd_auth", frames, dg, allow_nocrc=True)
    check(all(d["diwarp.crc.status"] == "3" for d in dg), "rd_auth: a datagram with a CRC")
    auth = [a for f in frames for a in f["diwarp.xflags2.auth"]]
    check(len(auth) == len(dg) and all(a in ("1", "True") for a in auth),
          f"rd_auth: {len(auth)} of {len(dg)} datagrams decoded with AUTH")
    tags = [t for f in frames for t in f["diwarp.auth.tag"]]
    check(len(tags) == len(dg), f"rd_auth: {len(tags)} tags shown for {len(dg)} datagrams")
    check(any(len(f["diwarp.transport"]) > 1 for f in frames), "rd_auth: no GSO buffer")
    writes = [d for d in dg if d.get("opcode") == 0]
    if check(writes, "rd_auth: no RDMA Write"):
        total = sum(payload(d) for d in unique(dg, src=writes[0]["src"]) if d["opcode"] == 0)
        check(total == int(res["size"]) * int(res["iters"]), f"rd_auth: {total} bytes")

    res = result(capdir, "ud_pingpong")
    frames, dg = decode(lua, f"{capdir}/ud_pingpong.pcapng")
    common_checks("ud_pingpong", frames, dg)
    check(len(dg) >= 2 * int(res["iters"]), f"ud_pingpong: {len(dg)} datagrams")
    check(all(d["diwarp.transport"] == "UD" and payload(d) == int(res["size"]) for d in dg),
          "ud_pingpong: UD Sends of the size asked")


def check_credit(lua, capdir):
    """The mailbox's credits on the wire (docs/PROTOCOL.md, Credits): every RD
    datagram carries CREDIT; each side's cumulative value (16 bits) never
    goes back, starts at the quota, and the sender never sent more slots
    than the receiver's newest value allowed; no RNR NAK."""
    res = result(capdir, "rd_credit")
    frames, dg = decode(lua, f"{capdir}/rd_credit.pcapng")
    common_checks("rd_credit", frames, dg)
    check(all(d["flags"] & CREDIT for d in dg if d["flags"] & RD),
          "rd_credit: an RD datagram without CREDIT")
    check(not [d for d in dg if d["diwarp.kind"] == "NAK RNR"], "rd_credit: an RNR NAK")
    quota = 256 // 16
    sends = unique([d for d in dg if d.get("opcode") == 3])
    if not check(sends, "rd_credit: no Send"):
        return
    sender, receiver = sends[0]["src"], sends[0]["dst"]
    limit, first, sent, over = None, None, 0, []
    for d in dg:
        if not d["flags"] & RD:
            continue
        v = int(d["diwarp.credits"])
        if d["src"] == receiver:
            wide = v if limit is None else limit + ((v - limit + 0x8000) & 0xFFFF) - 0x8000
            check(limit is None or wide >= limit,
                  f"rd_credit frame {d['frame']}: the receiver's credit value went back "
                  f"from {limit} to {wide}")
            if first is None:
                first = wide
            limit = wide if limit is None else max(limit, wide)
        elif d in sends:
            sent += (payload(d) + 2047) // 2048 or 1
            if sent > (limit if limit is not None else quota):
                over.append(d["frame"])
    check(first is not None and first >= quota,
          f"rd_credit: the receiver's first credit value {first}, the quota is {quota}")
    check(not over, f"rd_credit: Sends beyond the credit the receiver gave, frames {over[:5]}")
    check(sent >= int(res["iters"]), f"rd_credit: {sent} slots sent")


def check_credit_dyn(lua, capdir):
    """The dynamic protocol on the wire: credit control segments (X-flag
    CCTL) are version-2 RD DATA with a PSN of their stream, typed request
    (1, value 0) or response (2); a stream's responses give back more and
    more (the value is cumulative). Requests and responses are not paired:
    the engine answers only a request it took (the response is queued by
    dw_credit_on_request alone), yet about one run in a dozen showed two
    responses with no request before them in the capture, which a capture
    on a busy loopback missing or misplacing a datagram would explain."""
    frames, dg = decode(lua, f"{capdir}/rd_credit_dyn.pcapng")
    common_checks("rd_credit_dyn", frames, dg)
    res = result(capdir, "rd_credit_dyn")
    check(int(res.get("rnr", 1)) == 0, "rd_credit_dyn: RNR NAKs")
    types = [t for f in frames for t in f["diwarp.cctl.type"]]
    values = [int(v) for f in frames for v in f["diwarp.cctl.value"]]
    cctl = [d for d in dg if d["diwarp.kind"] == "CCTL"]
    if not check(cctl, "rd_credit_dyn: no credit control segment on the wire"):
        return
    check(len(types) == len(cctl) and len(values) == len(cctl),
          f"rd_credit_dyn: {len(cctl)} CCTL datagrams, {len(types)} types decoded")
    check(all(d["flags"] & (RD | DATA) == RD | DATA and d["diwarp.version"] == "2"
              for d in cctl), "rd_credit_dyn: a CCTL datagram that is not version-2 RD DATA")
    check(set(types) <= {"1", "2"}, f"rd_credit_dyn: types {set(types)}")
    last = {}
    for d, t, v in zip(cctl, types, values):
        if t == "1":
            check(v == 0, f"rd_credit_dyn frame {d['frame']}: a request with value {v}")
            continue
        way = (d["src"], d["dst"])
        check(v >= last.get(way, 0), f"rd_credit_dyn frame {d['frame']}: the give-back "
              f"went from {last.get(way, 0)} to {v}")
        last[way] = max(v, last.get(way, 0))
    check("1" in types and "2" in types, f"rd_credit_dyn: types seen {set(types)}")


def check_corrupt(lua, capdir):
    # DIWARP_FAULT=corrupt flips bytes after the CRC is computed: those
    # datagrams must show Bad (with the expert error), the rest Good, and
    # every Send still arrives intact once.
    res = result(capdir, "rd_corrupt")
    frames, dg = decode(lua, f"{capdir}/rd_corrupt.pcapng", strict=False)
    bad = [d for d in dg if d["diwarp.crc.status"] == "0"]
    good = [d for d in dg if d["diwarp.crc.status"] == "1"]
    check(bad, "rd_corrupt: no Bad CRC32c")
    check(len(bad) + len(good) == len(dg), "rd_corrupt: CRC status neither Good nor Bad")
    fr_by = {int(f["frame.number"][0]): f for f in frames}
    for d in bad:
        check("Bad CRC32c" in fr_by[d["frame"]]["_ws.expert.message"],
              f"rd_corrupt frame {d['frame']}: Bad without its expert error")
    sends = unique([d for d in good if d.get("opcode") == 3])
    check(len(sends) >= 2 * int(res["iters"]), f"rd_corrupt: {len(sends)} intact Sends")
    print(f"rd_corrupt: {len(bad)} Bad, {len(good)} Good CRC32c")


def check_crafted(lua, capdir):
    frames, _ = decode(lua, f"{capdir}/crafted.pcap", strict=False)
    if not check(len(frames) == len(CRAFTED), f"crafted: {len(frames)} frames"):
        return
    for (name, _, _, exp), f in zip(CRAFTED, frames):
        if exp is None:
            check(not f["diwarp.transport"] and not f["diwarp.version"],
                  f"crafted {name}: taken for diwarp")
            continue
        got = {"kind": f["diwarp.kind"], "credits": f["diwarp.credits"],
               "crc": f["diwarp.crc.status"], "nak": f["diwarp.nak_code"],
               "ack": f["diwarp.ack_psn"], "rnr_us": f["diwarp.rnr_delay_us"],
               "sack_start": f["diwarp.sack.start"], "sack_end": f["diwarp.sack.end"],
               "dsack": f["diwarp.sack.dsack"], "ece": f["diwarp.xflags.ece"],
               "opcode": f["iwarp_rdma.opcode"], "rail_count": f["diwarp.rails.count"],
               "rails": f["diwarp.rails.addr"], "origin": f["diwarp.origin"],
               "auth": f["diwarp.xflags2.auth"], "auth_salt": f["diwarp.auth.salt"],
               "auth_counter": f["diwarp.auth.counter"],
               "auth_tag": [t.replace(":", "") for t in f["diwarp.auth.tag"]],
               "ack_delay": f["diwarp.ack_delay"]}
        for k, v in exp.items():
            if k == "expert":
                check(any(v in m for m in f["_ws.expert.message"]),
                      f"crafted {name}: no expert '{v}' in {f['_ws.expert.message']}")
                continue
            want = v.split("|")
            have = [{"True": "1", "False": "0"}.get(x, x) for x in got[k]]
            check(have == want, f"crafted {name}: {k} = {have}, expected {want}")
        if "expert" not in exp:
            check(not [m for m in f["_ws.expert.message"] if not m.startswith("NAK")]
                  and not f["_ws.malformed"],
                  f"crafted {name}: unexpected expert {f['_ws.expert.message']}")


def check_crafted_gso(lua, capdir, verdict=None):
    """Each GSO buffer is split into its datagrams, each decoded with its own
    header and CRC; the engine takes each datagram as the kernel cuts it."""
    frames, _ = decode(lua, f"{capdir}/crafted_gso.pcap", strict=False)
    if not check(len(frames) == len(CRAFTED_GSO), f"crafted GSO: {len(frames)} frames"):
        return
    for (name, ds, exp), f in zip(CRAFTED_GSO, frames):
        check(f["diwarp.gso.segments"] == [str(len(ds))] and
              f["diwarp.gso.size"] == [str(len(ds[0]))],
              f"crafted {name}: GSO {f['diwarp.gso.segments']} x {f['diwarp.gso.size']}, "
              f"expected {len(ds)} x {len(ds[0])}")
        got = {"kind": f["diwarp.kind"], "crc": f["diwarp.crc.status"],
               "opcode": f["iwarp_rdma.opcode"]}
        for k, v in exp.items():
            if k == "expert":
                continue
            check(got[k] == v.split("|"), f"crafted {name}: {k} = {got[k]}, expected {v}")
        want = [exp["expert"]] if "expert" in exp else []
        bad = [m for m in f["_ws.expert.message"] if "Retransmission" not in m]
        check(bad == want and not f["_ws.malformed"], f"crafted {name}: expert {bad}, "
              f"expected {want}")
    if not verdict:
        return
    # The engine's decoder on each datagram: taken, but the one with the bad CRC.
    flat = [(name, d, "expert" in exp and i == len(ds) - 1)
            for name, ds, exp in CRAFTED_GSO for i, d in enumerate(ds)]
    r = subprocess.run([verdict], input="".join(d.hex() + "\n" for _, d, _ in flat),
                       stdout=subprocess.PIPE, text=True, timeout=30)
    lines = r.stdout.splitlines()
    if not check(r.returncode == 0 and len(lines) == len(flat),
                 f"dgram_verdict (GSO): exit {r.returncode}, {len(lines)} verdicts"):
        return
    for (name, _, bad), v in zip(flat, lines):
        check(v.startswith("bad") == bad, f"crafted {name}: engine says '{v}'")


def check_verdicts(lua, capdir, verdict):
    # The engine's decoder and the dissector agree on every crafted datagram.
    hexes = "".join(d.hex() + "\n" for _, d, _, _ in CRAFTED)
    r = subprocess.run([verdict], input=hexes, stdout=subprocess.PIPE, text=True, timeout=30)
    lines = r.stdout.splitlines()
    if not check(r.returncode == 0 and len(lines) == len(CRAFTED),
                 f"dgram_verdict: exit {r.returncode}, {len(lines)} verdicts"):
        return
    frames, _ = decode(lua, f"{capdir}/crafted.pcap", strict=False)
    for (name, _, _, _), f, v in zip(CRAFTED, frames, lines):
        flagged = [m for m in f["_ws.expert.message"] if not m.startswith("NAK")]
        lua_bad = bool(flagged) or not f["diwarp.transport"]
        check(lua_bad == v.startswith("bad"),
              f"crafted {name}: engine says '{v}', dissector says {flagged or 'nothing'}")


def check_rc_tcp(lua, capdir):
    # Wireshark's own MPA + DDP/RDMAP dissectors on RC over TCP.
    text = tshark(lua, f"{capdir}/rc_tcp.pcapng", ["-V"])
    crc_lines = re.findall(r"^\s*CRC check: .*$", text, re.M)
    good = [l for l in crc_lines if "(Good CRC32)" in l]
    check(len(crc_lines) >= 40, f"rc_tcp: only {len(crc_lines)} MPA FPDUs decoded")
    check(len(good) == len(crc_lines), f"rc_tcp: {len(crc_lines) - len(good)} MPA CRCs not Good")
    check("MPA Request Frame" in text or "Request frame header" in text, "rc_tcp: no MPA Request")
    check("Malformed" not in text and "Lua Error" not in text, "rc_tcp: malformed frame")
    ops = set(re.findall(r"OpCode: ([A-Za-z ]+) \(0x", text))
    check({"Send", "Write", "Read Request", "Read Response"} <= ops, f"rc_tcp: RDMAP opcodes {ops}")
    # FPDUs are sized from the stream's MSS (RFC 5044 MULPDU): on this
    # namespace's loopback of MTU 1500 (MSS 1448) a full FPDU's ULPDU is
    # 1442 bytes, and the bulk Writes are made of them.
    ulens = [int(x) for x in re.findall(r"ULPDU length: (\d+) bytes", text)]
    full = max(ulens) if ulens else 0
    check(full == 1442 and ulens.count(full) >= 20,
          f"rc_tcp: largest ULPDU {full} bytes ({ulens.count(full)} of them), want 1442 from MSS 1448")
    print(f"rc_tcp: {len(crc_lines)} MPA FPDUs, all CRC Good; RDMAP opcodes {sorted(ops)}")


def main():
    if sys.argv[1] == "craft":
        craft(sys.argv[2], sys.argv[3])
        return 0
    lua, capdir = sys.argv[2], sys.argv[3]
    check_crafted(lua, capdir)
    check_crafted_gso(lua, capdir, sys.argv[4] if len(sys.argv) > 4 else None)
    if len(sys.argv) > 4:
        check_verdicts(lua, capdir, sys.argv[4])
    check_traffic(lua, capdir)
    check_rd_native(lua, capdir)
    check_faults(lua, capdir)
    check_credit(lua, capdir)
    check_credit_dyn(lua, capdir)
    check_corrupt(lua, capdir)
    check_rc_tcp(lua, capdir)
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
