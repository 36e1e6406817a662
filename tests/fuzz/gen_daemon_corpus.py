#!/usr/bin/env python3
"""Writes the seeds of fuzz_daemon (tests/fuzz/corpus/daemon/).

Each seed is a sequence of actions in the format fuzz_daemon.c documents:
clients connecting, requests (mostly well-formed templates the target fills
in, some raw bytes), ring scribbles, hang-ups and server turns. The seeds
walk the paths the security review found broken (a replace list naming a
segment twice, requests queued behind a slow CONNECT and a hang-up, devices
opened by short connections, STAT and SHUTDOWN from another uid) and the
ordinary life of each object kind, so the fuzzer starts from deep states.

    tests/fuzz/gen_daemon_corpus.py [OUT_DIR]
"""
import os
import re

from corpus_gen import write_seeds


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
TEMPLATE, MEMFD, SEALED = 8, 1, 2


def new(other_uid=False):
    return bytes([0, 7 if other_uid else 0])


def req(op, handle=0, args=(), client=0, flags=TEMPLATE, raw=None):
    payload = bytes(raw) if raw is not None else bytes(list(args) + [0] * (5 - len(args)))
    return bytes([1, client, OP[op] - 1, handle, flags, len(payload)]) + payload


def seg(args, client=0):
    return req("SEG_ADD", args=args, client=client, flags=TEMPLATE | MEMFD | SEALED)


def scribble(offset_word, value, client=0):
    return bytes([5, client, offset_word]) + value.to_bytes(4, "little")


def hangup(client=0):
    return bytes([6, client])


def turns(n=7):
    return bytes([7, n])


# Handles a fresh client gets in order: 1, 2, 3...
def opened(client=0, port=0):
    return req("OPEN", args=[port], client=client)


def rc_qp(client=0):
    """PD 1, CQ 2, RC QP 3 in INIT."""
    return (req("PD_ALLOC", client=client) + req("CQ_CREATE", args=[7, 0], client=client) +
            req("QP_CREATE", args=[0, 0x11, 0, 0], client=client) +
            req("QP_MODIFY", handle=3, args=[1, 0], client=client))


def seeds():
    s = {}
    s["mr_on_segment"] = (new() + opened() + req("PD_ALLOC") + seg([0, 1, 0, 0]) +
                          req("MR_REG", args=[0, 0, 0, 2]) + req("MR_DEREG", handle=3) +
                          req("PD_DEALLOC", handle=1) + turns())
    # {1, 1}: the first review finding (7).
    s["seg_replace_twice"] = (new() + opened() + req("PD_ALLOC") + seg([0, 0, 0, 0]) +
                              req("MR_REG", args=[0, 0, 0, 1]) + seg([0x00, 0x01, 0x01, 0x02]) +
                              seg([0x00, 0x11, 0x01, 0x01]) + req("MR_DEREG", handle=3) + turns())
    s["seg_unsealed_and_short"] = (new() + opened() +
                                   req("SEG_ADD", args=[0, 3, 0, 0], flags=TEMPLATE | MEMFD) +
                                   req("SEG_ADD", args=[0, 3, 0, 0], flags=TEMPLATE) + turns())
    # Requests queued behind a slow CONNECT, then a hang-up (finding 8).
    s["connect_queue_hangup"] = (new() + opened() + rc_qp() +
                                 req("CONNECT", args=[0, 2, 0, 0, 19]) +
                                 req("CONNECT", args=[0, 2, 0, 0, 19]) + req("QP_DESTROY", handle=3) +
                                 req("CQ_DESTROY", handle=2) + req("PD_DEALLOC", handle=1) + hangup())
    s["connect_then_turns"] = (new() + opened() + rc_qp() + req("CONNECT", args=[0, 2, 0, 0, 3]) +
                               turns() + turns() + req("QP_QUERY", handle=3) +
                               req("DISCONNECT", handle=3) + req("QP_DESTROY", handle=3))
    # Short connections naming new devices (finding 9).
    churn = b""
    for c in range(4):
        churn += new() + opened(client=c, port=c) + hangup(c) + turns(2)
    s["device_churn"] = churn
    s["devices_per_client"] = (new() + opened(port=0) + new() + opened(client=1, port=2 + 16) +
                               new() + opened(client=2, port=2 + 32) + new() +
                               opened(client=3, port=2 + 48) + turns())
    # Another uid (finding 11): its STAT and SHUTDOWN refused.
    s["other_uid_stat_shutdown"] = (new(other_uid=True) + opened() + req("STAT") +
                                    req("STAT_QPS") + req("SHUTDOWN") + req("PD_ALLOC") + new() +
                                    req("STAT", client=1) + req("STAT_QPS", client=1) + turns())
    s["ring_scribble"] = (new() + opened() + req("PD_ALLOC") + req("CQ_CREATE", args=[7, 0]) +
                          req("QP_CREATE", args=[0, 0x11, 0, 1]) + scribble(0, 0x7FFFFFFF) +
                          turns())
    s["cq_scribble"] = (new() + opened() + req("CQ_CREATE", args=[3, 0]) +
                        scribble(16, 0xFFFFFFF0) + scribble(32, 2) + turns())
    s["listen_accept_reject"] = (new() + opened() + rc_qp() + req("LISTEN") +
                                 req("GET_REQUEST", handle=5) + req("ACCEPT", args=[4, 2, 1]) +
                                 req("REJECT", args=[4, 2, 1]) + req("LISTENER_DESTROY", handle=5) +
                                 turns())
    s["srq_ah_rd"] = (new() + opened() + req("PD_ALLOC") + req("SRQ_CREATE", args=[0, 3]) +
                      req("CQ_CREATE", args=[7, 0]) + req("QP_CREATE", args=[0, 0x22, 0x13, 2]) +
                      req("SRQ_MODIFY", handle=2, args=[1, 1]) + req("SRQ_QUERY", handle=2) +
                      req("AH_CREATE", args=[0]) + req("RD_PATH", handle=4, args=[5, 1]) +
                      req("PD_DEALLOC", handle=1) + req("SRQ_DESTROY", handle=2) +
                      req("QP_DESTROY", handle=4) + req("SRQ_DESTROY", handle=2) + turns())
    s["channel_cq"] = (new() + opened() + req("CHANNEL_CREATE") + req("CQ_CREATE", args=[3, 1]) +
                       req("CHANNEL_DESTROY", handle=1) + req("CQ_DESTROY", handle=2) +
                       req("CHANNEL_DESTROY", handle=1) + req("COUNTERS") + turns())
    s["cross_client_handles"] = (new() + opened() + req("PD_ALLOC") + new() +
                                 opened(client=1) + req("PD_DEALLOC", handle=1, client=1) +
                                 req("MR_REG", args=[0, 1, 0, 1], client=1) +
                                 req("QP_CREATE", args=[0, 0x11, 0, 0], client=1) + hangup(0) +
                                 req("PD_ALLOC", client=1) + turns())
    s["raw_garbage"] = (new() + req("OPEN", raw=b"\x01\x00\x00\x00" + b"\xff" * 40) +
                        req("QP_CREATE", raw=bytes(range(64)), flags=0x30) +
                        req("SEG_ADD", raw=b"\x00" * 8 + b"\x00\x10" + b"\x00" * 6 + b"\x01",
                            flags=MEMFD | 0x90) + req("PD_ALLOC", flags=0xF0) + turns())
    s["before_open"] = new() + req("PD_ALLOC") + req("QP_DESTROY", handle=1) + opened() + opened()
    return s


if __name__ == "__main__":
    write_seeds("daemon", seeds())
