#!/usr/bin/env python3
"""Writes the seeds of fuzz_ipc_req (tests/fuzz/corpus/ipc_req/).

Each seed is one byte, the number of descriptors the message came with (the
target takes it modulo 4), followed by one request as a client sends it on the
daemon's socket (libdiwarp/ipc/ipc.h): struct dw_ipc_hdr and the op's payload,
in host order, written here little-endian (x86-64, arm64). The ops are read
from enum dw_ipc_op in ipc.h; the payload layouts below follow its structs.
There is one valid request for every op, and one input for each rule the
decoder enforces: truncated, wrong magic, unknown op, wrong length (header and
message disagreeing, one byte too many or too few), wrong descriptor count,
and each field check.

    tests/fuzz/gen_ipc_req_corpus.py [OUT_DIR]
"""
import os
import re
import struct

from corpus_gen import write_seeds

MAGIC = 0x31445744
VERSION = 1
PAGE = 4096


def ipc_ops():
    """The ops of enum dw_ipc_op, read from ipc.h so the seeds follow it."""
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "libdiwarp",
                          "ipc", "ipc.h")
    with open(header) as f:
        text = f.read()
    body = re.search(r"enum dw_ipc_op \{(.*?)\};", text, re.S).group(1)
    ops, value = {}, 0
    for m in re.finditer(r"^\s*DW_IPC_(\w+)\s*(?:=\s*(\w+))?\s*,?", body, re.M):
        value = int(m.group(2), 0) if m.group(2) else value + 1
        ops[m.group(1)] = value
    return ops


OP = ipc_ops()
OP_END = OP.pop("OP_END")
OPS = sorted(OP, key=OP.get)

QPT_RC, QPT_UC, QPT_UD, QPT_RD = 2, 3, 4, 0x100
ACCESS_ALL = 0x3F
QP_STATE, QP_AV, QP_DEST_QPN = 1, 1 << 7, 1 << 20
QPS_INIT = 1

# struct diwarp_qp_attr is 96 bytes; the offsets of the fields set below.
QP_ATTR_LEN = 96
QP_ATTR_QP_STATE, QP_ATTR_DEST_QPN, QP_ATTR_DGID = 0, 16, 24


def cap(send_wr=64, recv_wr=64, send_sge=4, recv_sge=4, inline=128):
    return struct.pack("<5I", send_wr, recv_wr, send_sge, recv_sge, inline)


def srq_attr(max_wr=256, max_sge=4, limit=0):
    return struct.pack("<3I", max_wr, max_sge, limit)


def gid(last):
    return bytes(10) + b"\xff\xff" + bytes([10, 0, 0, last])


def open_payload(version=VERSION, addr=b"10.0.0.1", terminated=True):
    raw = addr.ljust(16, b"\0") if terminated else addr.ljust(16, b"x")[:16]
    return struct.pack("<Ii", version, 4242) + raw + struct.pack("<HH", 18515, 0)


def seg_payload(base=0x7F0000000000, length=16 * PAGE, seg_id=1, replace=()):
    ids = list(replace) + [0] * (16 - min(len(replace), 16))
    return struct.pack("<QQII16I", base, length, seg_id, len(replace), *ids[:16])


def mr_payload(addr=0x7F0000001000, length=8192, access=0x7, pd=1, seg=1):
    return struct.pack("<IIQQQiI", pd, seg, addr, length, addr, access, 0)


def cq_payload(cqe=128, channel=0, context=0x1122334455667788):
    return struct.pack("<iIQ", cqe, channel, context)


def qp_payload(qp_type=QPT_RC, send_cq=1, recv_cq=1, srq=0, c=None):
    return struct.pack("<6I", 1, send_cq, recv_cq, srq, qp_type, 0) + (c or cap())


def qp_attr(state=QPS_INIT, dest_qpn=0, dgid=bytes(16)):
    a = bytearray(QP_ATTR_LEN)
    struct.pack_into("<I", a, QP_ATTR_QP_STATE, state)
    struct.pack_into("<I", a, QP_ATTR_DEST_QPN, dest_qpn)
    a[QP_ATTR_DGID:QP_ATTR_DGID + 16] = dgid
    return bytes(a)


def qpm_payload(mask=QP_STATE, attr=None):
    # The payload struct is 8-byte aligned: 4 bytes of padding follow the mask.
    return (attr or qp_attr()) + struct.pack("<iI", mask, 0)


def srq_payload(attr=None):
    return struct.pack("<I", 1) + (attr or srq_attr())


def srqm_payload(mask=1, attr=None):
    return (attr or srq_attr(limit=16)) + struct.pack("<i", mask)


def ah_payload(pd=1, last=2):
    return struct.pack("<II", pd, 0) + gid(last)


def path_payload(ah=0, qpn=0x42, qkey=0x11111111):
    return struct.pack("<III", ah, qpn, qkey)


def listen_payload(port=18515, backlog=128):
    return struct.pack("<HHi", port, 0, backlog)


def conn_payload(listener=8, qp=5, req_id=1, port=18515, pd=b"hello", pd_len=None, sgid=None,
                 timeout=-1):
    """struct dw_ipc_conn: 62 bytes of fields, 512 of private data, padded to 576."""
    n = len(pd) if pd_len is None else pd_len
    head = struct.pack("<IIQ", listener, qp, req_id) + gid(1) + (sgid or bytes(16))
    head += struct.pack("<HBBB3xiH", port, 4, 4, 1 if sgid else 0, timeout, n)
    return head + pd.ljust(512, b"\0") + bytes(2)


def request(op, payload=b"", seq=1, handle=0, magic=MAGIC, length=None):
    if length is None:
        length = 16 + len(payload)
    return struct.pack("<IHHII", magic, op, length, seq, handle) + payload


def seed(msg, nfds=0):
    return bytes([nfds]) + msg


def valid():
    """One well-formed request per op, with the descriptors it takes."""
    payloads = {
        "OPEN": open_payload(),
        "SEG_ADD": seg_payload(),
        "MR_REG": mr_payload(),
        "CQ_CREATE": cq_payload(),
        "QP_CREATE": qp_payload(),
        "QP_MODIFY": qpm_payload(),
        "SRQ_CREATE": srq_payload(),
        "SRQ_MODIFY": srqm_payload(),
        "AH_CREATE": ah_payload(),
        "RD_PATH": path_payload(),
        "LISTEN": listen_payload(),
        "ACCEPT": conn_payload(),
        "REJECT": conn_payload(qp=0),
        "CONNECT": conn_payload(listener=0, sgid=gid(9), timeout=5000),
    }
    handles = {"PD_DEALLOC": 1, "MR_DEREG": 2, "CHANNEL_DESTROY": 3, "CQ_DESTROY": 4,
               "QP_DESTROY": 5, "QP_MODIFY": 5, "QP_QUERY": 5, "SRQ_DESTROY": 6,
               "SRQ_MODIFY": 6, "SRQ_QUERY": 6, "AH_DESTROY": 7, "COUNTERS": 5,
               "RD_PATH": 5, "LISTENER_DESTROY": 8, "GET_REQUEST": 8, "DISCONNECT": 5}
    s = {}
    for i, name in enumerate(OPS):
        msg = request(OP[name], payloads.get(name, b""), seq=i + 1, handle=handles.get(name, 0))
        s[name] = (msg, 1 if name == "SEG_ADD" else 0)
    return s


def seeds():
    s = {}
    ok = valid()
    for name, (msg, nfds) in ok.items():
        s["ok_" + name.lower()] = seed(msg, nfds)

    # Valid variants that reach the decoder's other paths and the ring helpers.
    s["ok_open_default_addr"] = seed(request(OP["OPEN"], open_payload(addr=b"")))
    s["ok_seg_add_replace16"] = seed(
        request(OP["SEG_ADD"], seg_payload(seg_id=17, replace=range(1, 17))), 1)
    s["ok_seg_add_top"] = seed(
        request(OP["SEG_ADD"], seg_payload(base=2**64 - 2 * PAGE, length=PAGE)), 1)
    s["ok_mr_reg_all_access"] = seed(request(OP["MR_REG"], mr_payload(access=ACCESS_ALL)))
    s["ok_mr_reg_top"] = seed(
        request(OP["MR_REG"], mr_payload(addr=2**64 - 4097, length=4096)))
    s["ok_cq_create_1"] = seed(request(OP["CQ_CREATE"], cq_payload(cqe=1)))
    s["ok_cq_create_max"] = seed(request(OP["CQ_CREATE"], cq_payload(cqe=2**31 - 1, channel=3)))
    for t, name in ((QPT_UC, "uc"), (QPT_UD, "ud"), (QPT_RD, "rd")):
        s["ok_qp_create_" + name] = seed(request(OP["QP_CREATE"], qp_payload(qp_type=t)))
    s["ok_qp_create_srq"] = seed(
        request(OP["QP_CREATE"], qp_payload(srq=6, c=cap(recv_wr=0, recv_sge=0))))
    s["ok_qp_create_huge_caps"] = seed(
        request(OP["QP_CREATE"], qp_payload(c=cap(2**32 - 1, 2**31 + 1, 2**32 - 1, 2**32 - 1,
                                                    2**32 - 1))))
    s["ok_qp_create_zero_caps"] = seed(
        request(OP["QP_CREATE"], qp_payload(c=cap(0, 0, 0, 0, 0))))
    s["ok_qp_modify_rtr"] = seed(request(
        OP["QP_MODIFY"], qpm_payload(QP_STATE | QP_AV | QP_DEST_QPN,
                                     qp_attr(state=2, dest_qpn=0x42, dgid=gid(3))), handle=5))
    s["ok_srq_create_huge"] = seed(
        request(OP["SRQ_CREATE"], srq_payload(srq_attr(2**32 - 1, 2**32 - 1))))
    s["ok_rd_path_ah"] = seed(request(OP["RD_PATH"], path_payload(ah=7), handle=5))
    s["ok_connect_pd_max"] = seed(request(OP["CONNECT"], conn_payload(pd=b"x" * 512)))
    s["bad_connect_pd_len"] = seed(request(OP["CONNECT"], conn_payload(pd_len=513)))
    s["bad_accept_pd_len"] = seed(request(OP["ACCEPT"], conn_payload(pd_len=0xffff)))

    # Framing: every op refused when the message is cut, padded or mislabelled.
    open_msg = ok["OPEN"][0]
    seg_msg = ok["SEG_ADD"][0]
    qpm_msg = ok["QP_MODIFY"][0]
    s["bad_empty"] = b""
    s["bad_nfds_only"] = seed(b"")
    s["bad_short_header"] = seed(ok["PD_ALLOC"][0][:15])
    s["bad_truncated_open"] = seed(open_msg[:30])
    s["bad_truncated_qp_modify"] = seed(qpm_msg[:-1])
    s["bad_magic"] = seed(request(OP["PD_ALLOC"], magic=0x31445745))
    s["bad_magic_swapped"] = seed(request(OP["PD_ALLOC"], magic=0x44574431))
    s["bad_op_zero"] = seed(request(0))
    s["bad_op_end"] = seed(request(OP_END))
    s["bad_op_rsp"] = seed(request(OP["PD_ALLOC"] | 0x8000))
    s["bad_len_field_short"] = seed(request(OP["OPEN"], open_payload(), length=43))
    s["bad_len_field_long"] = seed(request(OP["OPEN"], open_payload(), length=45))
    s["bad_len_field_zero"] = seed(request(OP["PD_ALLOC"], length=0))
    s["bad_one_more"] = seed(request(OP["PD_ALLOC"], b"\0"))
    s["bad_one_less"] = seed(request(OP["CQ_CREATE"], cq_payload()[:-1]))
    s["bad_len_of_other_op"] = seed(request(OP["PD_ALLOC"], cq_payload()))
    s["bad_max_msg"] = seed(request(OP["STAT"], bytes(4096 - 16), length=4096))
    s["bad_seg_add_no_fd"] = seed(seg_msg, 0)
    s["bad_seg_add_two_fds"] = seed(seg_msg, 2)
    s["bad_open_with_fd"] = seed(open_msg, 1)
    s["bad_shutdown_three_fds"] = seed(ok["SHUTDOWN"][0], 3)

    # Fields.
    s["bad_open_version0"] = seed(request(OP["OPEN"], open_payload(version=0)))
    s["bad_open_version2"] = seed(request(OP["OPEN"], open_payload(version=2)))
    s["bad_open_addr_unterminated"] = seed(
        request(OP["OPEN"], open_payload(addr=b"1234567890123456", terminated=False)))
    s["bad_seg_id0"] = seed(request(OP["SEG_ADD"], seg_payload(seg_id=0)), 1)
    s["bad_seg_len0"] = seed(request(OP["SEG_ADD"], seg_payload(length=0)), 1)
    s["bad_seg_base_unaligned"] = seed(
        request(OP["SEG_ADD"], seg_payload(base=0x7F0000000800)), 1)
    s["bad_seg_len_unaligned"] = seed(request(OP["SEG_ADD"], seg_payload(length=PAGE + 1)), 1)
    s["bad_seg_wrap"] = seed(
        request(OP["SEG_ADD"], seg_payload(base=2**64 - PAGE, length=2 * PAGE)), 1)
    s["bad_seg_end_at_top"] = seed(
        request(OP["SEG_ADD"], seg_payload(base=2**64 - PAGE, length=PAGE)), 1)
    s["bad_seg_nreplace17"] = seed(request(
        OP["SEG_ADD"], struct.pack("<QQII16I", 0x10000, PAGE, 2, 17, *range(16))), 1)
    s["bad_seg_nreplace_huge"] = seed(request(
        OP["SEG_ADD"], struct.pack("<QQII16I", 0x10000, PAGE, 2, 2**32 - 1, *range(16))), 1)
    s["bad_seg_replace_twice"] = seed(
        request(OP["SEG_ADD"], seg_payload(seg_id=3, replace=(1, 2, 1))), 1)
    s["bad_seg_replace_self"] = seed(
        request(OP["SEG_ADD"], seg_payload(seg_id=3, replace=(1, 3))), 1)
    s["bad_mr_access_bit6"] = seed(request(OP["MR_REG"], mr_payload(access=1 << 6)))
    s["bad_mr_access_negative"] = seed(request(OP["MR_REG"], mr_payload(access=-1)))
    s["bad_mr_wrap"] = seed(request(OP["MR_REG"], mr_payload(addr=2**64 - 4096, length=8192)))
    s["bad_cq_cqe0"] = seed(request(OP["CQ_CREATE"], cq_payload(cqe=0)))
    s["bad_cq_cqe_negative"] = seed(request(OP["CQ_CREATE"], cq_payload(cqe=-(2**31))))
    s["bad_qp_type0"] = seed(request(OP["QP_CREATE"], qp_payload(qp_type=0)))
    s["bad_qp_type_xrc"] = seed(request(OP["QP_CREATE"], qp_payload(qp_type=9)))
    s["bad_qp_type_rd_high"] = seed(request(OP["QP_CREATE"], qp_payload(qp_type=QPT_RD | 2)))
    s["bad_qp_no_send_cq"] = seed(request(OP["QP_CREATE"], qp_payload(send_cq=0)))
    s["bad_qp_no_recv_cq"] = seed(request(OP["QP_CREATE"], qp_payload(recv_cq=0)))
    s["bad_qp_modify_mask0"] = seed(request(OP["QP_MODIFY"], qpm_payload(mask=0), handle=5))
    s["bad_srq_max_wr0"] = seed(request(OP["SRQ_CREATE"], srq_payload(srq_attr(max_wr=0))))
    return s


def main():
    write_seeds("ipc_req", seeds())


if __name__ == "__main__":
    main()
