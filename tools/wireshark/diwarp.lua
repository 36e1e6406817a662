-- Wireshark dissector for the diwarp datagram header (UD and RD over UDP,
-- versions 1 and 2; RC QPs carried by RD use the same datagrams).
--
-- Layout and rules: docs/PROTOCOL.md, section "Datagram header". One UDP
-- payload is
--     header (28 + 8*SACK Count [+ 8 pull descriptor] [+ 4 + 4*n rail list]
--             [+ 4 origin] [+ 8 start descriptor] [+ 8 token]
--             [+ 8 challenge] [+ 4 ACK delay]) |
--     DDP/RDMAP segment (DATA only) | [Immediate Data message, 26 (IMM)] |
--     CRC32c (4, big-endian; absent on a version-2 RD datagram with NOCRC)
--     or, with the X2-flag AUTH (DIWARP_AUTH), the authentication trailer:
--     nonce (12: salt 4, counter 8) and AES-GMAC tag (16); the tag cannot
--     be checked here (no key), so it is shown, not verified
-- The DDP/RDMAP segment and the Immediate Data message are handed to
-- Wireshark's own iWARP dissector ("iwarp_ddp_rdmap").
--
-- Use: tshark -X lua_script:tools/wireshark/diwarp.lua -r capture.pcap
-- or copy this file into ~/.local/lib/wireshark/plugins/ (see README.md).
-- Written for Wireshark 3.x/4.x with Lua 5.2 (Debian 12's 4.0): it uses
-- the bit32 library, or Wireshark's own "bit" library where bit32 is absent.

local band, bxor, rshift
if bit32 then
        band, bxor, rshift = bit32.band, bit32.bxor, bit32.rshift
else
        assert(bit, "diwarp.lua needs the bit32 or the bit library")
        -- bit returns signed 32-bit results: bring them back to 0..2^32-1.
        local function u32(f)
                return function(a, b)
                        local r = f(a, b)
                        if r < 0 then r = r + 4294967296 end
                        return r
                end
        end
        band, bxor, rshift = u32(bit.band), u32(bit.bxor), u32(bit.rshift)
end

local HDR_LEN = 28
local SACK_LEN = 8
local MAX_SACK = 8
local PULL_LEN = 8
local MAX_RAILS = 4
local RAIL_LEN = 4 -- the origin address; a rail list is 4 + 4*n
local CRC_LEN = 4
local IMM_MSG_LEN = 26
local DDP_TAGGED_LEN = 14

local F_RD, F_ACK, F_SACK, F_CREDIT = 0x01, 0x02, 0x04, 0x08
local F_ACKREQ, F_NAK, F_DATA, F_IMM = 0x10, 0x20, 0x40, 0x80
local X_NOCRC, X_PULL, X_PULLREQ, X_DSACK, X_ECE = 0x01, 0x02, 0x04, 0x08, 0x10
local X_CCTL, X_RAILS, X_RAIL = 0x20, 0x40, 0x80
local X_ALL = 0xFF
local X2_START = 0x01 -- byte 8 of version 2: the start descriptor follows
local X2_TOKEN = 0x02 -- the token follows (after the start descriptor)
local X2_CHALLENGE = 0x04 -- a challenge follows (after the token)
local X2_AUTH = 0x08 -- the authentication trailer replaces the CRC32c
local X2_ACKDELAY = 0x10 -- RD ACK: the ACK delay follows (after the challenge)
local X2_ALL = 0x1F
local START_LEN = 8
local TOKEN_LEN, CHALLENGE_LEN = 8, 8
local ACK_DELAY_LEN = 4
local ACK_DELAY_MAX_US = 1000000 -- the most a sender reports (1 s)
local AUTH_NONCE_LEN, AUTH_TAG_LEN = 12, 16
local AUTH_LEN = AUTH_NONCE_LEN + AUTH_TAG_LEN

local nak_names = {
        [0] = "none",
        [1] = "RNR (no receive posted)",
        [2] = "sequence error",
        [3] = "remote access error",
        [4] = "remote operation error",
        [5] = "invalid request",
}
local nak_short = { [1] = "RNR", [2] = "SEQ", [3] = "REM_ACCESS", [4] = "REM_OP", [5] = "INVALID" }

-- Checksum status, numbered as Wireshark's own checksum status fields.
local crc_status_names = { [0] = "Bad", [1] = "Good", [2] = "Unverified", [3] = "Not present" }
local CRC_BAD, CRC_GOOD, CRC_UNVERIFIED, CRC_ABSENT = 0, 1, 2, 3

local rdmap_ops = {
        [0x0] = "RDMA Write", [0x1] = "RDMA Read Request", [0x2] = "RDMA Read Response",
        [0x3] = "Send", [0x4] = "Send with Invalidate", [0x5] = "Send with SE",
        [0x6] = "Send with SE and Invalidate", [0x7] = "Terminate",
        [0x8] = "Immediate Data", [0x9] = "Immediate Data with SE",
        [0xA] = "Atomic Request", [0xB] = "Atomic Response",
}

local p = Proto("diwarp", "diwarp datagram (UD/RD over UDP)")

local pf = {
        version = ProtoField.uint8("diwarp.version", "Version", base.DEC),
        flags = ProtoField.uint8("diwarp.flags", "Flags", base.HEX),
        f_imm = ProtoField.bool("diwarp.flags.imm", "IMM (Immediate Data message follows)", 8, nil, F_IMM),
        f_data = ProtoField.bool("diwarp.flags.data", "DATA (DDP/RDMAP segment follows)", 8, nil, F_DATA),
        f_nak = ProtoField.bool("diwarp.flags.nak", "NAK", 8, nil, F_NAK),
        f_ackreq = ProtoField.bool("diwarp.flags.ackreq", "ACKREQ (immediate ACK asked)", 8, nil, F_ACKREQ),
        f_credit = ProtoField.bool("diwarp.flags.credit", "CREDIT (credits valid)", 8, nil, F_CREDIT),
        f_sack = ProtoField.bool("diwarp.flags.sack", "SACK (SACK blocks follow)", 8, nil, F_SACK),
        f_ack = ProtoField.bool("diwarp.flags.ack", "ACK (ACK PSN valid)", 8, nil, F_ACK),
        f_rd = ProtoField.bool("diwarp.flags.rd", "RD (reliable datagram; clear = UD)", 8, nil, F_RD),
        sack_count = ProtoField.uint8("diwarp.sack_count", "SACK Count", base.DEC),
        nak_code = ProtoField.uint8("diwarp.nak_code", "NAK Code", base.DEC, nak_names),
        xflags = ProtoField.uint8("diwarp.xflags", "X-flags", base.HEX),
        x_rail = ProtoField.bool("diwarp.xflags.rail", "RAIL (origin address follows: sent by another rail)", 8, nil, X_RAIL),
        x_rails = ProtoField.bool("diwarp.xflags.rails", "RAILS (the sender's rail list follows)", 8, nil, X_RAILS),
        x_cctl = ProtoField.bool("diwarp.xflags.cctl", "CCTL (credit control message)", 8, nil, X_CCTL),
        cctl_type = ProtoField.uint8("diwarp.cctl.type", "Credit control", base.DEC,
                                     { [1] = "compulsory request", [2] = "compulsory response" }),
        cctl_value = ProtoField.uint32("diwarp.cctl.value", "Given back (cumulative)", base.DEC),
        x_ece = ProtoField.bool("diwarp.xflags.ece", "ECE (congestion experienced echo)", 8, nil, X_ECE),
        x_dsack = ProtoField.bool("diwarp.xflags.dsack", "DSACK (SACK block 0 is a duplicate)", 8, nil, X_DSACK),
        x_pullreq = ProtoField.bool("diwarp.xflags.pullreq", "PULLREQ (Read of a receiver-paced Send)", 8, nil, X_PULLREQ),
        x_pull = ProtoField.bool("diwarp.xflags.pull", "PULL (pull descriptor follows)", 8, nil, X_PULL),
        x_nocrc = ProtoField.bool("diwarp.xflags.nocrc", "NOCRC (no CRC32c trailer)", 8, nil, X_NOCRC),
        xflags2 = ProtoField.uint8("diwarp.xflags2", "X2-flags", base.HEX),
        x2_start = ProtoField.bool("diwarp.xflags2.start", "START (stream start descriptor follows)", 8, nil,
                                   X2_START),
        x2_token = ProtoField.bool("diwarp.xflags2.token", "TOKEN (token follows)", 8, nil, X2_TOKEN),
        x2_challenge = ProtoField.bool("diwarp.xflags2.challenge", "CHALLENGE (challenge follows)", 8,
                                       nil, X2_CHALLENGE),
        x2_auth = ProtoField.bool("diwarp.xflags2.auth", "AUTH (authentication trailer, no CRC32c)", 8,
                                  nil, X2_AUTH),
        x2_ackdelay = ProtoField.bool("diwarp.xflags2.ackdelay", "ACKDELAY (ACK delay follows)", 8,
                                      nil, X2_ACKDELAY),
        auth = ProtoField.bytes("diwarp.auth", "Authentication trailer"),
        auth_salt = ProtoField.uint32("diwarp.auth.salt", "Nonce salt", base.HEX),
        auth_counter = ProtoField.uint64("diwarp.auth.counter", "Nonce counter", base.DEC),
        auth_tag = ProtoField.bytes("diwarp.auth.tag", "AES-GMAC tag (not verified: no key)"),
        token = ProtoField.uint64("diwarp.token", "Token", base.HEX),
        challenge = ProtoField.uint64("diwarp.challenge", "Challenge", base.HEX),
        ack_delay = ProtoField.uint32("diwarp.ack_delay", "ACK Delay (us)", base.DEC),
        start = ProtoField.bytes("diwarp.start", "Start descriptor"),
        start_psn = ProtoField.uint32("diwarp.start.psn", "First PSN", base.DEC),
        start_msn = ProtoField.uint32("diwarp.start.msn", "First MSN", base.DEC),
        reserved = ProtoField.uint8("diwarp.reserved", "Reserved (must be 0)", base.HEX),
        dst_qpn = ProtoField.uint24("diwarp.dst_qpn", "Destination QPN", base.HEX),
        src_qpn = ProtoField.uint24("diwarp.src_qpn", "Source QPN", base.HEX),
        qkey = ProtoField.uint32("diwarp.qkey", "Q_Key", base.HEX),
        psn = ProtoField.uint32("diwarp.psn", "PSN", base.DEC),
        ack_psn = ProtoField.uint32("diwarp.ack_psn", "ACK PSN", base.DEC),
        credits = ProtoField.uint16("diwarp.credits", "Credits", base.DEC),
        rnr_delay = ProtoField.uint16("diwarp.rnr_delay", "RNR Delay (10 us units)", base.DEC),
        rnr_delay_us = ProtoField.uint32("diwarp.rnr_delay_us", "RNR Delay (us)", base.DEC),
        sack = ProtoField.bytes("diwarp.sack", "SACK block"),
        sack_start = ProtoField.uint32("diwarp.sack.start", "Start PSN", base.DEC),
        sack_end = ProtoField.uint32("diwarp.sack.end", "End PSN (exclusive)", base.DEC),
        sack_npsn = ProtoField.uint32("diwarp.sack.npsn", "PSNs in block", base.DEC),
        sack_dsack = ProtoField.bool("diwarp.sack.dsack", "D-SACK block (duplicate received)"),
        pull = ProtoField.bytes("diwarp.pull", "Pull descriptor"),
        pull_len = ProtoField.uint32("diwarp.pull.msg_len", "Message Length", base.DEC),
        pull_pushed = ProtoField.uint32("diwarp.pull.pushed", "Pushed Length", base.DEC),
        rails = ProtoField.bytes("diwarp.rails", "Rail list"),
        rails_count = ProtoField.uint8("diwarp.rails.count", "Rail Count", base.DEC),
        rails_rsvd = ProtoField.uint24("diwarp.rails.reserved", "Reserved (must be 0)", base.HEX),
        rails_addr = ProtoField.ipv4("diwarp.rails.addr", "Rail address"),
        origin = ProtoField.ipv4("diwarp.origin", "Origin address"),
        transport = ProtoField.string("diwarp.transport", "Transport"),
        kind = ProtoField.string("diwarp.kind", "Packet"),
        hdr_len = ProtoField.uint32("diwarp.hdr_len", "Header length", base.DEC),
        seg_len = ProtoField.uint32("diwarp.seg_len", "DDP segment length", base.DEC),
        opcode = ProtoField.uint8("diwarp.rdmap_opcode", "RDMAP opcode", base.HEX, rdmap_ops),
        imm_msg = ProtoField.bytes("diwarp.imm_msg", "Immediate Data message"),
        imm_data = ProtoField.bytes("diwarp.imm.data", "Immediate Data (8 bytes)"),
        imm_value = ProtoField.uint32("diwarp.imm.value", "Immediate (verbs imm_data, bytes 0-3)", base.HEX),
        imm_word2 = ProtoField.uint32("diwarp.imm.word2", "Bytes 4-7 (RD: RDMA Write length, 0 after a Send)", base.DEC),
        gso_segs = ProtoField.uint32("diwarp.gso.segments", "Datagrams in this GSO super-packet", base.DEC),
        gso_size = ProtoField.uint32("diwarp.gso.size", "GSO datagram size", base.DEC),
        retrans = ProtoField.framenum("diwarp.retransmission_of", "Retransmission of PSN first sent in frame"),
        is_retrans = ProtoField.bool("diwarp.retransmission", "Retransmission (PSN seen in an earlier frame)"),
        crc = ProtoField.uint32("diwarp.crc", "CRC32c", base.HEX),
        crc_status = ProtoField.uint8("diwarp.crc.status", "CRC32c status", base.DEC, crc_status_names),
        crc_computed = ProtoField.uint32("diwarp.crc.computed", "CRC32c computed", base.HEX),
}
p.fields = pf

local ef = {
        bad_crc = ProtoExpert.new("diwarp.crc.bad", "Bad CRC32c", expert.group.CHECKSUM,
                                  expert.severity.ERROR),
        malformed = ProtoExpert.new("diwarp.malformed", "Header breaks a datagram rule",
                                    expert.group.MALFORMED, expert.severity.ERROR),
        version = ProtoExpert.new("diwarp.version.unknown", "Unknown datagram version",
                                  expert.group.PROTOCOL, expert.severity.ERROR),
        nak = ProtoExpert.new("diwarp.nak.expert", "NAK", expert.group.SEQUENCE,
                              expert.severity.NOTE),
        retrans = ProtoExpert.new("diwarp.retransmission.expert", "Retransmission (PSN seen before)",
                                  expert.group.SEQUENCE, expert.severity.NOTE),
}
p.experts = { ef.bad_crc, ef.malformed, ef.version, ef.nak, ef.retrans }

local DEFAULT_PORTS = "17471-17534"
p.prefs.ports = Pref.range("UDP ports", DEFAULT_PORTS,
        "UDP ports decoded as diwarp: the device port base (DIWARP_PORT_BASE, 17471) plus "
        .. "the instance number; other ports are found by the heuristic", 65535)
p.prefs.heuristic = Pref.bool("Try heuristic on other UDP ports", true,
        "Recognise diwarp datagrams on any UDP port by their header rules and CRC32c")
p.prefs.check_crc = Pref.bool("Verify CRC32c", true, "Compute and compare the CRC32c trailer")

-- CRC32c (Castagnoli, reflected polynomial 0x82F63B78).
local crc_table = {}
for i = 0, 255 do
        local c = i
        for _ = 1, 8 do
                if band(c, 1) ~= 0 then
                        c = bxor(rshift(c, 1), 0x82F63B78)
                else
                        c = rshift(c, 1)
                end
        end
        crc_table[i] = c
end

local function crc32c(s)
        local c = 0xFFFFFFFF
        local n = #s
        local byte = string.byte
        local i = 1
        while i <= n do
                local j = i + 3999
                if j > n then j = n end
                local chunk = { byte(s, i, j) }
                for k = 1, #chunk do
                        c = bxor(crc_table[band(bxor(c, chunk[k]), 0xFF)], rshift(c, 8))
                end
                i = j + 1
        end
        return bxor(c, 0xFFFFFFFF)
end

-- Distance b - a modulo 2^32, as an unsigned number.
local function psn_dist(a, b)
        local d = b - a
        if d < 0 then d = d + 4294967296 end
        return d
end

-- The rules dw_dgram_hdr_validate enforces; returns nil or the reason.
local function check_rules(h)
        local f, x = h.flags, h.xflags
        if h.version == 2 and x == 0 and h.xflags2 == 0 then return "version 2 with no X-flag set" end
        if h.sack_count > MAX_SACK then return "sack_count: more than 8 blocks" end
        -- The rail list's own shape, where dw_dgram_decode checks it (before the flag rules).
        if band(x, X_RAILS) ~= 0 then
                if h.rails_rsvd == nil or #h.rails < h.rail_count then
                        return "rails: list announced by the RAILS flag is truncated"
                end
                if h.rails_rsvd ~= 0 then return "rails: reserved bytes non-zero" end
                if h.rail_count == 0 or h.rail_count > MAX_RAILS then
                        return "rails: count not within 1..4"
                end
        end
        if band(x, X_RAIL) ~= 0 and h.origin == nil then
                return "rail: origin announced by the RAIL flag is truncated"
        end
        if band(h.xflags2, X2_START) ~= 0 and h.start_psn == nil then
                return "start: descriptor announced by the START flag is truncated"
        end
        if band(h.xflags2, X2_TOKEN) ~= 0 and h.token_zero == nil then
                return "token: value announced by the TOKEN flag is truncated"
        end
        if band(h.xflags2, X2_CHALLENGE) ~= 0 and h.challenge_zero == nil then
                return "challenge: value announced by the CHALLENGE flag is truncated"
        end
        if band(h.xflags2, X2_ACKDELAY) ~= 0 and h.ack_delay == nil then
                return "ack delay: value announced by the ACKDELAY flag is truncated"
        end
        if h.rsvd4 ~= 0 then return "dst_qpn: reserved high 8 bits set" end
        if h.rsvd8 ~= 0 then return "src_qpn: reserved high 8 bits set" end
        if band(f, F_RD) == 0 then
                if band(f, F_DATA) == 0 then return "flags: UD packet without DATA" end
                if band(f, F_ACK + F_SACK + F_CREDIT + F_ACKREQ + F_NAK) ~= 0 then
                        return "flags: UD packet with ACK/SACK/NAK/CREDIT/ACKREQ (RD only)"
                end
        end
        if band(f, F_SACK) ~= 0 and band(f, F_ACK) == 0 then return "flags: SACK without ACK" end
        if band(f, F_NAK) ~= 0 and band(f, F_DATA) ~= 0 then return "flags: NAK and DATA together" end
        if band(f, F_NAK) ~= 0 and band(f, F_ACK) ~= 0 then return "flags: NAK and ACK together" end
        if band(f, F_IMM) ~= 0 and band(f, F_DATA) == 0 then return "flags: IMM without DATA" end
        if band(f, F_DATA + F_ACK + F_NAK + F_CREDIT) == 0 then
                return "flags: control-only packet without ACK, NAK or CREDIT"
        end
        if band(f, F_SACK) == 0 and h.sack_count ~= 0 then return "sack_count: non-zero without SACK" end
        if band(f, F_SACK) ~= 0 and h.sack_count == 0 then return "sack_count: zero with SACK" end
        if band(f, F_NAK) ~= 0 then
                if h.nak_code == 0 then return "nak_code: zero with the NAK flag" end
                if h.nak_code > 5 then return "nak_code: unknown code" end
        elseif h.nak_code ~= 0 then
                return "nak_code: non-zero without the NAK flag"
        end
        if h.rnr_delay ~= 0 and not (band(f, F_NAK) ~= 0 and h.nak_code == 1) then
                return "rnr_delay: non-zero outside an RNR NAK"
        end
        if h.ack_psn ~= 0 and band(f, F_ACK + F_NAK) == 0 then return "ack_psn: non-zero without ACK or NAK" end
        if h.credits ~= 0 and band(f, F_CREDIT) == 0 then return "credits: non-zero without CREDIT" end
        if band(x, 0xFF - X_ALL) ~= 0 then return "xflags: unknown bits set" end
        if band(x, X_NOCRC) ~= 0 and band(f, F_RD) == 0 then return "xflags: NOCRC on a UD packet" end
        if band(x, X_PULL) ~= 0 and band(x, X_PULLREQ) ~= 0 then return "xflags: PULL and PULLREQ together" end
        if band(x, X_PULL + X_PULLREQ) ~= 0 and band(f, F_RD + F_DATA) ~= F_RD + F_DATA then
                return "xflags: PULL or PULLREQ without RD and DATA"
        end
        if band(x, X_DSACK) ~= 0 and band(f, F_ACK + F_SACK) ~= F_ACK + F_SACK then
                return "xflags: DSACK without ACK and SACK"
        end
        if band(x, X_ECE) ~= 0 and band(f, F_ACK) == 0 then return "xflags: ECE without ACK" end
        if band(x, X_CCTL) ~= 0 and (band(f, F_RD + F_DATA) ~= F_RD + F_DATA or band(f, F_IMM) ~= 0 or
                                     band(x, X_PULL + X_PULLREQ) ~= 0) then
                return "xflags: CCTL without RD and DATA, or with IMM, PULL or PULLREQ"
        end
        if band(x, X_RAILS + X_RAIL) ~= 0 and band(f, F_RD) == 0 then
                return "xflags: RAILS or RAIL on a UD packet (RD only)"
        end
        if band(x, X_RAILS) ~= 0 then
                for i = 1, h.rail_count do
                        if h.rails[i] == 0 then return "rails: address 0.0.0.0" end
                end
        end
        if band(x, X_RAIL) ~= 0 and h.origin == 0 then return "rail: origin address 0.0.0.0" end
        if band(h.xflags2, 0xFF - X2_ALL) ~= 0 then return "xflags2: unknown bits set" end
        if band(h.xflags2, X2_START) ~= 0 and band(f, F_RD + F_DATA) ~= F_RD + F_DATA then
                return "xflags2: START without RD and DATA"
        end
        if band(h.xflags2, X2_TOKEN + X2_CHALLENGE) ~= 0 and band(f, F_RD) == 0 then
                return "xflags2: TOKEN or CHALLENGE on a UD packet (RD only)"
        end
        if band(h.xflags2, X2_AUTH) ~= 0 and band(x, X_NOCRC) ~= 0 then
                return "xflags2: AUTH with NOCRC (the tag replaces the CRC)"
        end
        if band(h.xflags2, X2_TOKEN) ~= 0 and h.token_zero then return "token: value 0" end
        if band(h.xflags2, X2_CHALLENGE) ~= 0 and h.challenge_zero then
                return "challenge: value 0"
        end
        if band(h.xflags2, X2_ACKDELAY) ~= 0 and band(f, F_RD + F_ACK) ~= F_RD + F_ACK then
                return "xflags2: ACKDELAY without RD and ACK"
        end
        return nil
end

local function check_sacks(h)
        if #h.sack < h.sack_count then return "sack: blocks run past the datagram" end
        local first = 1
        if band(h.xflags, X_DSACK) ~= 0 and h.sack_count > 0 then
                local l = psn_dist(h.sack[1][1], h.sack[1][2])
                if l == 0 then return "sack: empty D-SACK block" end
                if l > 0x80000000 then return "sack: D-SACK block reversed or longer than 2^31 PSNs" end
                first = 2
        end
        local prev_end
        for i = first, h.sack_count do
                local s = psn_dist(h.ack_psn, h.sack[i][1])
                local e = psn_dist(h.ack_psn, h.sack[i][2])
                if s == 0 or s >= 0x80000000 then return "sack: block start_psn not after ack_psn" end
                if e == s then return "sack: empty block" end
                if e < s then return "sack: block end_psn before its start_psn" end
                if e > 0x80000000 then return "sack: block end_psn more than 2^31 past ack_psn" end
                if prev_end and s <= prev_end then
                        return "sack: blocks not in ascending order with a gap between them"
                end
                prev_end = e
        end
        return nil
end

-- Reads the fixed header; nil when too short or of an unknown version.
local function read_hdr(tvb)
        local len = tvb:len()
        if len < HDR_LEN then return nil, "shorter than the 28-byte header" end
        local h = { version = tvb(0, 1):uint() }
        if h.version ~= 1 and h.version ~= 2 then return nil, "unknown version" end
        h.flags = tvb(1, 1):uint()
        h.sack_count = tvb(2, 1):uint()
        h.nak_code = tvb(3, 1):uint()
        local b4 = tvb(4, 1):uint()
        if h.version == 2 then
                h.xflags, h.rsvd4 = b4, 0
        else
                h.xflags, h.rsvd4 = 0, b4
        end
        h.dst_qpn = tvb(5, 3):uint()
        local b8 = tvb(8, 1):uint()
        if h.version == 2 then
                h.xflags2, h.rsvd8 = b8, 0
        else
                h.xflags2, h.rsvd8 = 0, b8
        end
        h.src_qpn = tvb(9, 3):uint()
        h.qkey = tvb(12, 4):uint()
        h.psn = tvb(16, 4):uint()
        h.ack_psn = tvb(20, 4):uint()
        h.credits = tvb(24, 2):uint()
        h.rnr_delay = tvb(26, 2):uint()
        -- The bytes dw_seal_open reads to decide on the trailer: bytes 0 and
        -- 8 (AUTH), else those dw_dgram_packet_body reads (0, 1, 4: NOCRC).
        h.auth = h.version == 2 and band(b8, X2_AUTH) ~= 0
        h.nocrc = not h.auth and h.version == 2 and band(h.flags, F_RD) ~= 0 and
                band(b4, X_NOCRC) ~= 0 and band(b4, 0xFF - X_ALL) == 0
        h.trailer_len = h.auth and AUTH_LEN or (h.nocrc and 0 or CRC_LEN)
        h.body_len = len - h.trailer_len
        h.hdr_len = HDR_LEN + SACK_LEN * h.sack_count
        if band(h.xflags, X_PULL) ~= 0 then h.hdr_len = h.hdr_len + PULL_LEN end
        -- Multirail: the rail list's length comes from its count byte (as
        -- dw_dgram_decode reads it, before checking it), then the origin.
        h.rails, h.rail_count = {}, 0
        if band(h.xflags, X_RAILS) ~= 0 then
                h.rails_off = h.hdr_len
                if h.hdr_len < h.body_len then h.rail_count = tvb(h.hdr_len, 1):uint() end
                h.hdr_len = h.hdr_len + 4 + 4 * h.rail_count
        end
        if band(h.xflags, X_RAIL) ~= 0 then
                h.origin_off = h.hdr_len
                h.hdr_len = h.hdr_len + RAIL_LEN
        end
        if band(h.xflags2, X2_START) ~= 0 then
                h.start_off = h.hdr_len
                h.hdr_len = h.hdr_len + START_LEN
        end
        if band(h.xflags2, X2_TOKEN) ~= 0 then
                h.token_off = h.hdr_len
                h.hdr_len = h.hdr_len + TOKEN_LEN
        end
        if band(h.xflags2, X2_CHALLENGE) ~= 0 then
                h.challenge_off = h.hdr_len
                h.hdr_len = h.hdr_len + CHALLENGE_LEN
        end
        if band(h.xflags2, X2_ACKDELAY) ~= 0 then
                h.ack_delay_off = h.hdr_len
                h.hdr_len = h.hdr_len + ACK_DELAY_LEN
        end
        h.sack = {}
        if h.hdr_len <= h.body_len then
                for i = 1, h.sack_count do
                        local o = HDR_LEN + (i - 1) * SACK_LEN
                        h.sack[i] = { tvb(o, 4):uint(), tvb(o + 4, 4):uint() }
                end
                if h.rails_off then
                        h.rails_rsvd = tvb(h.rails_off + 1, 3):uint()
                        for i = 1, h.rail_count do
                                h.rails[i] = tvb(h.rails_off + 4 * i, 4):uint()
                        end
                end
                if h.origin_off then h.origin = tvb(h.origin_off, 4):uint() end
                if h.start_off then
                        h.start_psn = tvb(h.start_off, 4):uint()
                        h.start_msn = tvb(h.start_off + 4, 4):uint()
                end
                if h.token_off then
                        h.token_zero = (tvb(h.token_off, 4):uint() + tvb(h.token_off + 4, 4):uint()) == 0
                end
                if h.challenge_off then
                        h.challenge_zero = (tvb(h.challenge_off, 4):uint() +
                                            tvb(h.challenge_off + 4, 4):uint()) == 0
                end
                if h.ack_delay_off then h.ack_delay = tvb(h.ack_delay_off, 4):uint() end
        end
        return h
end

local function ip_str(v)
        return string.format("%d.%d.%d.%d", rshift(v, 24), band(rshift(v, 16), 0xFF),
                             band(rshift(v, 8), 0xFF), band(v, 0xFF))
end

-- Retransmission detection: first frame that carried each (stream, PSN).
local first_seen = {}
-- Multirail: every address seen in a rail list -> that device's rail 0
-- (dotted strings), so a stream's datagrams on every rail count as one stream.
local rail_home = {}

local ddp_handle = Dissector.get("iwarp_ddp_rdmap")
local data_handle = Dissector.get("data")

local function kind_of(h)
        local f = h.flags
        if band(f, F_DATA) ~= 0 then
                return band(h.xflags, X_CCTL) ~= 0 and "CCTL" or "DATA"
        end
        if band(f, F_NAK) ~= 0 then return "NAK " .. (nak_short[h.nak_code] or tostring(h.nak_code)) end
        if band(f, F_ACK) ~= 0 then return "ACK" end
        return "CREDIT"
end

local function dissect_one(tvb, pinfo, root, label)
        local len = tvb:len()
        local tree = root:add(p, tvb(), label or "diwarp datagram")
        local h, why = read_hdr(tvb)
        if not h then
                if len >= 1 then tree:add(pf.version, tvb(0, 1)) end
                tree:add_proto_expert_info(why == "unknown version" and ef.version or ef.malformed, why)
                return "diwarp: " .. why
        end
        local f, x = h.flags, h.xflags
        local transport = band(f, F_RD) ~= 0 and "RD" or "UD"
        local kind = kind_of(h)
        tree:append_text(string.format(", %s %s, QPN 0x%06x -> 0x%06x", transport, kind,
                                       h.src_qpn, h.dst_qpn))
        tree:add(pf.transport, transport):set_generated()
        tree:add(pf.kind, kind):set_generated()

        tree:add(pf.version, tvb(0, 1))
        local ft = tree:add(pf.flags, tvb(1, 1))
        for _, k in ipairs({ "f_imm", "f_data", "f_nak", "f_ackreq", "f_credit", "f_sack", "f_ack", "f_rd" }) do
                ft:add(pf[k], tvb(1, 1))
        end
        local names = {}
        for _, fl in ipairs({ { F_RD, "RD" }, { F_ACK, "ACK" }, { F_SACK, "SACK" }, { F_CREDIT, "CREDIT" },
                             { F_ACKREQ, "ACKREQ" }, { F_NAK, "NAK" }, { F_DATA, "DATA" }, { F_IMM, "IMM" } }) do
                if band(f, fl[1]) ~= 0 then names[#names + 1] = fl[2] end
        end
        ft:append_text(" (" .. table.concat(names, ", ") .. ")")
        tree:add(pf.sack_count, tvb(2, 1))
        local nt = tree:add(pf.nak_code, tvb(3, 1))
        if h.version == 2 then
                local xt = tree:add(pf.xflags, tvb(4, 1))
                for _, k in ipairs({ "x_rail", "x_rails", "x_cctl", "x_ece", "x_dsack", "x_pullreq", "x_pull",
                                     "x_nocrc" }) do
                        xt:add(pf[k], tvb(4, 1))
                end
        else
                tree:add(pf.reserved, tvb(4, 1))
        end
        tree:add(pf.dst_qpn, tvb(5, 3))
        if h.version == 2 then
                local x2 = tree:add(pf.xflags2, tvb(8, 1))
                x2:add(pf.x2_start, tvb(8, 1))
                x2:add(pf.x2_token, tvb(8, 1))
                x2:add(pf.x2_challenge, tvb(8, 1))
                x2:add(pf.x2_auth, tvb(8, 1))
                x2:add(pf.x2_ackdelay, tvb(8, 1))
        else
                tree:add(pf.reserved, tvb(8, 1))
        end
        tree:add(pf.src_qpn, tvb(9, 3))
        tree:add(pf.qkey, tvb(12, 4))
        tree:add(pf.psn, tvb(16, 4))
        tree:add(pf.ack_psn, tvb(20, 4))
        tree:add(pf.credits, tvb(24, 2))
        tree:add(pf.rnr_delay, tvb(26, 2))
        if band(f, F_NAK) ~= 0 and h.nak_code == 1 then
                tree:add(pf.rnr_delay_us, h.rnr_delay * 10):set_generated()
        end

        local problem
        if h.hdr_len > h.body_len then
                problem = string.format("datagram (%d bytes) shorter than its header (%d) and %s",
                                        len, h.hdr_len, h.auth and "authentication trailer" or "CRC")
        end
        problem = problem or check_rules(h) or check_sacks(h)
        if not problem and band(f, F_DATA) == 0 and h.body_len > h.hdr_len then
                problem = "control-only packet with bytes after its header"
        end

        if h.hdr_len <= h.body_len then
                for i = 1, h.sack_count do
                        local o = HDR_LEN + (i - 1) * SACK_LEN
                        local st = tree:add(pf.sack, tvb(o, SACK_LEN))
                        local s, e = h.sack[i][1], h.sack[i][2]
                        local dsack = i == 1 and band(x, X_DSACK) ~= 0
                        st:set_text(string.format("%s %d: [%d, %d)", dsack and "D-SACK block" or "SACK block",
                                                  i - 1, s, e))
                        st:add(pf.sack_start, tvb(o, 4))
                        st:add(pf.sack_end, tvb(o + 4, 4))
                        st:add(pf.sack_npsn, psn_dist(s, e)):set_generated()
                        st:add(pf.sack_dsack, dsack):set_generated()
                end
                if band(x, X_PULL) ~= 0 then
                        local o = HDR_LEN + h.sack_count * SACK_LEN
                        local pt = tree:add(pf.pull, tvb(o, PULL_LEN))
                        pt:set_text(string.format("Pull descriptor: Message Length %d, Pushed Length %d",
                                                  tvb(o, 4):uint(), tvb(o + 4, 4):uint()))
                        pt:add(pf.pull_len, tvb(o, 4))
                        pt:add(pf.pull_pushed, tvb(o + 4, 4))
                        local ml, pl = tvb(o, 4):uint(), tvb(o + 4, 4):uint()
                        if not problem and (pl == 0 or pl >= ml) then
                                problem = "pull: pushed length 0 or not below the message length"
                        end
                end
                if h.rails_off then
                        local o, n = h.rails_off, h.rail_count
                        local rt = tree:add(pf.rails, tvb(o, 4 + 4 * n))
                        local names = {}
                        for i = 1, n do names[i] = ip_str(h.rails[i]) end
                        rt:set_text(string.format("Rail list: %d rail%s: %s", n, n == 1 and "" or "s",
                                                  table.concat(names, ", ")))
                        rt:add(pf.rails_count, tvb(o, 1))
                        rt:add(pf.rails_rsvd, tvb(o + 1, 3))
                        for i = 1, n do
                                rt:add(pf.rails_addr, tvb(o + 4 * i, 4)):append_text(
                                        i == 1 and " (rail 0: identity)" or string.format(" (rail %d)", i - 1))
                        end
                        if not problem then
                                for i = 1, n do rail_home[names[i]] = names[1] end
                        end
                end
                if h.origin_off then
                        tree:add(pf.origin, tvb(h.origin_off, 4)):append_text(
                                " (sender's rail 0: the datagram counts as from it)")
                end
                if h.start_off then
                        local st = tree:add(pf.start, tvb(h.start_off, START_LEN))
                        st:set_text(string.format("Start descriptor: First PSN %d, First MSN %d",
                                                  h.start_psn, h.start_msn))
                        st:add(pf.start_psn, tvb(h.start_off, 4))
                        st:add(pf.start_msn, tvb(h.start_off + 4, 4))
                end
                if h.token_off then
                        tree:add(pf.token, tvb(h.token_off, TOKEN_LEN)):append_text(
                                " (the value the receiver gave: RC over RD's connection token, or a rail list's proof)")
                end
                if h.challenge_off then
                        tree:add(pf.challenge, tvb(h.challenge_off, CHALLENGE_LEN)):append_text(
                                " (to be echoed as the token of the receiver's rail lists)")
                end
                if h.ack_delay_off then
                        -- Any value is taken; a sender reports at most 1 s.
                        local t = " (the newest datagram acknowledged waited this long in the receiver's host"
                        if h.ack_delay > ACK_DELAY_MAX_US then t = t .. "; above the 1 s a sender reports" end
                        tree:add(pf.ack_delay, tvb(h.ack_delay_off, ACK_DELAY_LEN)):append_text(t .. ")")
                end
        end
        tree:add(pf.hdr_len, h.hdr_len):set_generated()

        -- The trailer: CRC32c, none (NOCRC), or nonce and tag (AUTH).
        if h.auth then
                tree:add(pf.crc_status, CRC_ABSENT):set_generated()
                if len >= HDR_LEN + AUTH_LEN then
                        local o = len - AUTH_LEN
                        local at = tree:add(pf.auth, tvb(o, AUTH_LEN))
                        at:set_text(string.format("Authentication trailer: nonce salt 0x%08x, counter %s",
                                                  tvb(o, 4):uint(), tostring(tvb(o + 4, 8):uint64())))
                        at:add(pf.auth_salt, tvb(o, 4))
                        at:add(pf.auth_counter, tvb(o + 4, 8))
                        at:add(pf.auth_tag, tvb(o + AUTH_NONCE_LEN, AUTH_TAG_LEN))
                end
        elseif h.nocrc then
                tree:add(pf.crc_status, CRC_ABSENT):set_generated()
        elseif len >= HDR_LEN + CRC_LEN then
                local sent = tvb(len - CRC_LEN, 4):uint()
                local ct = tree:add(pf.crc, tvb(len - CRC_LEN, 4))
                if p.prefs.check_crc then
                        local calc = crc32c(tvb:raw(0, len - CRC_LEN))
                        tree:add(pf.crc_computed, calc):set_generated()
                        if calc == sent then
                                ct:append_text(" [correct]")
                                tree:add(pf.crc_status, CRC_GOOD):set_generated()
                        else
                                ct:append_text(string.format(" [incorrect, should be 0x%08x]", calc))
                                tree:add(pf.crc_status, CRC_BAD):set_generated()
                                ct:add_proto_expert_info(ef.bad_crc)
                        end
                else
                        tree:add(pf.crc_status, CRC_UNVERIFIED):set_generated()
                end
        end

        local info = string.format("%s %s QPN 0x%06x->0x%06x", transport, kind, h.src_qpn, h.dst_qpn)
        if band(f, F_DATA) ~= 0 and transport == "RD" then info = info .. " PSN=" .. h.psn end
        if band(f, F_ACK + F_NAK) ~= 0 then info = info .. " AckPSN=" .. h.ack_psn end
        if h.sack_count > 0 and h.sack[1] then
                local bl = {}
                for i = 1, h.sack_count do
                        bl[#bl + 1] = string.format("%s%d-%d", (i == 1 and band(x, X_DSACK) ~= 0) and "D" or "",
                                                    h.sack[i][1], h.sack[i][2])
                end
                info = info .. " SACK=" .. table.concat(bl, ",")
        end
        if band(f, F_CREDIT) ~= 0 then info = info .. " Credits=" .. h.credits end
        if band(f, F_ACKREQ) ~= 0 then info = info .. " ACKREQ" end
        if band(x, X_PULL) ~= 0 then info = info .. " PULL" end
        if band(x, X_PULLREQ) ~= 0 then info = info .. " PULLREQ" end
        if band(x, X_ECE) ~= 0 then info = info .. " ECE" end
        if h.ack_delay then info = info .. " AckDelay=" .. h.ack_delay .. "us" end
        if band(x, X_RAILS) ~= 0 then
                local names = {}
                for i = 1, #h.rails do names[i] = ip_str(h.rails[i]) end
                info = info .. " RAILS" .. (#names > 0 and "=" .. table.concat(names, ",") or "")
        end
        if band(x, X_RAIL) ~= 0 then info = info .. " RAIL" .. (h.origin and " origin=" .. ip_str(h.origin) or "") end
        if h.nocrc then info = info .. " NOCRC" end
        if h.auth then info = info .. " AUTH" end

        if band(f, F_NAK) ~= 0 then
                nt:add_proto_expert_info(ef.nak, "NAK " .. (nak_names[h.nak_code] or "?") .. " of PSN " .. h.ack_psn)
        end
        if band(f, F_RD + F_DATA) == F_RD + F_DATA then
                -- The stream whatever rail carried it: the origin (or the
                -- rail 0 a rail list named) stands for the address.
                local src, dst = tostring(pinfo.src), tostring(pinfo.dst)
                src = h.origin and ip_str(h.origin) or rail_home[src] or src
                dst = rail_home[dst] or dst
                local key = table.concat({ src, pinfo.src_port, dst, pinfo.dst_port, h.src_qpn, h.dst_qpn,
                                           h.psn }, "/")
                local first = first_seen[key]
                if not first or first > pinfo.number then
                        first_seen[key] = pinfo.number
                        first = pinfo.number
                end
                tree:add(pf.is_retrans, first < pinfo.number):set_generated()
                if first < pinfo.number then
                        tree:add(pf.retrans, first):set_generated()
                        tree:add_proto_expert_info(ef.retrans)
                        info = info .. " [retransmission]"
                end
        end

        if problem then
                tree:add_proto_expert_info(ef.malformed, problem)
                info = info .. " [" .. problem .. "]"
        end

        -- The DDP/RDMAP segment and the Immediate Data message, each handed
        -- to Wireshark's iWARP dissector (its own Info text is kept).
        local sub = {}
        local function hand_off(range)
                pinfo.cols.info = ""
                -- A dissector below (e.g. a ULP heuristic on a Send payload)
                -- may throw; Wireshark marks that frame itself, and the rest
                -- of this datagram (and of a GSO buffer) is still decoded.
                local ok, err = pcall(function()
                        (ddp_handle or data_handle):call(range:tvb(), pinfo, root)
                end)
                local t = tostring(pinfo.cols.info)
                if not ok then t = t .. " [decode below stopped: " .. tostring(err) .. "]" end
                if #t > 0 then sub[#sub + 1] = t end
        end
        if band(f, F_DATA) ~= 0 and not problem then
                local seg_end = h.body_len - (band(f, F_IMM) ~= 0 and IMM_MSG_LEN or 0)
                local seg_len = seg_end - h.hdr_len
                if seg_len < DDP_TAGGED_LEN then
                        tree:add_proto_expert_info(ef.malformed, "DATA segment shorter than a DDP header")
                        info = info .. " [segment shorter than a DDP header]"
                elseif band(x, X_CCTL) ~= 0 then
                        -- Not RDMAP: an untagged DDP message on queue 3 whose first
                        -- RsvdULP byte is the type, then the 4-byte value.
                        tree:add(pf.cctl_type, tvb(h.hdr_len + 1, 1))
                        if seg_len >= 22 then tree:add(pf.cctl_value, tvb(h.hdr_len + 18, 4)) end
                        info = info .. " credit control"
                else
                        tree:add(pf.seg_len, seg_len):set_generated()
                        tree:add(pf.opcode, tvb(h.hdr_len + 1, 1):uint() % 16):set_generated()
                        hand_off(tvb(h.hdr_len, seg_len))
                        if band(f, F_IMM) ~= 0 then
                                -- Wireshark 4.0's RDMAP dissector does not name RFC 7306's
                                -- Immediate Data opcodes (8, 9): the 8 bytes are shown here.
                                local it = tree:add(pf.imm_msg, tvb(seg_end, IMM_MSG_LEN))
                                it:set_text(string.format("Immediate Data message (26 bytes): %s",
                                                          rdmap_ops[tvb(seg_end + 1, 1):uint() % 16] or "?"))
                                it:add(pf.imm_data, tvb(seg_end + 18, 8))
                                it:add(pf.imm_value, tvb(seg_end + 18, 4))
                                it:add(pf.imm_word2, tvb(seg_end + 22, 4))
                                hand_off(tvb(seg_end, IMM_MSG_LEN))
                        end
                end
        end
        if #sub > 0 then info = info .. " | " .. table.concat(sub, " + ") end
        return info
end

-- UDP GSO: a sender may hand the kernel one buffer of several datagrams of
-- one size, the last possibly shorter (UDP_SEGMENT), and a capture on
-- loopback or on a veth sees that super-packet before it is cut. Returns the
-- datagram size when tvb is one: the next header repeats bytes 9-11 (the
-- source QPN: one QP's batch, to one peer device but maybe several of its
-- QPs, so the rest of each header is that datagram's own: version, X-flags,
-- SACK blocks, and byte 8's X2-flags, e.g. START on a stream the peer has
-- not acknowledged yet next to one it has), at every multiple of sz a
-- header starts that passes the rules, is RD DATA (a batch holds segments
-- only) and fits in its datagram with its DDP header and trailer (the last
-- datagram may be as short as a credit control segment), and (unless NOCRC
-- or AUTH) the first datagram's CRC32c holds.
local function gso_part_ok(tvb)
        local h = read_hdr(tvb)
        return h ~= nil and band(h.flags, F_RD + F_DATA) == F_RD + F_DATA and
                h.hdr_len + DDP_TAGGED_LEN + h.trailer_len <= tvb:len() and
                not check_rules(h) and not check_sacks(h)
end

local function gso_size(tvb)
        local len = tvb:len()
        local h = read_hdr(tvb)
        if not h or band(h.flags, F_RD + F_DATA) ~= F_RD + F_DATA then return nil end
        local min = h.hdr_len + DDP_TAGGED_LEN + h.trailer_len
        -- the shortest datagram after the first: a header without extensions
        if len < min + HDR_LEN + DDP_TAGGED_LEN then return nil end
        local raw = tvb:raw()
        local pat = raw:sub(10, 12) -- bytes 9-11: the source QPN
        local init = min + 10
        while true do
                local q = raw:find(pat, init, true)
                if not q then return nil end
                local sz = q - 10
                local ok = true
                for o = sz, len - 1, sz do
                        if not gso_part_ok(tvb(o, math.min(sz, len - o)):tvb()) then
                                ok = false
                                break
                        end
                end
                if ok and h.trailer_len == CRC_LEN then
                        ok = crc32c(raw:sub(1, sz - CRC_LEN)) == tvb(sz - CRC_LEN, 4):uint()
                end
                if ok then return sz end
                init = q + 1
        end
end

local function dissect(tvb, pinfo, root)
        local len = tvb:len()
        local sz = gso_size(tvb)
        local info
        if sz then
                local n = math.ceil(len / sz)
                local infos = {}
                for i = 0, n - 1 do
                        local l = math.min(sz, len - i * sz)
                        local t = dissect_one(tvb(i * sz, l):tvb(), pinfo, root,
                                              string.format("diwarp datagram %d of %d (GSO)", i + 1, n))
                        infos[#infos + 1] = t
                end
                local gt = root:add(p, tvb(), "UDP GSO super-packet")
                gt:add(pf.gso_segs, n):set_generated()
                gt:add(pf.gso_size, sz):set_generated()
                if n > 3 then infos = { infos[1], "...", infos[n] } end
                info = string.format("GSO %d x %d: ", n, sz) .. table.concat(infos, " ; ")
        else
                info = dissect_one(tvb, pinfo, root)
        end
        pinfo.cols.protocol = "diwarp"
        pinfo.cols.info = info
        return len
end

function p.dissector(tvb, pinfo, root)
        return dissect(tvb, pinfo, root)
end

-- Heuristic: the header rules plus a matching CRC32c (or, for a NOCRC or
-- AUTH datagram, the rules alone); a GSO super-packet by its first datagram.
local function heuristic(tvb, pinfo, root)
        if not p.prefs.heuristic then return false end
        local len = tvb:len()
        if len < HDR_LEN then return false end
        local h = read_hdr(tvb)
        if not h or h.hdr_len > h.body_len then return false end
        if check_rules(h) or check_sacks(h) then return false end
        if h.trailer_len == CRC_LEN then
                if len < HDR_LEN + CRC_LEN then return false end
                if crc32c(tvb:raw(0, len - CRC_LEN)) ~= tvb(len - CRC_LEN, 4):uint() and not gso_size(tvb) then
                        return false
                end
        end
        dissect(tvb, pinfo, root)
        return true
end

local udp_table = DissectorTable.get("udp.port")
local registered
local function register_ports()
        if registered then udp_table:remove(registered, p) end
        registered = p.prefs.ports
        udp_table:add(registered, p)
end

function p.prefs_changed()
        register_ports()
end

function p.init()
        first_seen = {}
        rail_home = {}
end

register_ports()
p:register_heuristic("udp", heuristic)
