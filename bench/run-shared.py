#!/usr/bin/env python3
"""RD on a shared host, against TCP under the same load, side by side in one run.

    bench/run-shared.py [--build DIR] [--pairs 2,4,8] [--rates 1gbit,2gbit]
                        [--iters N] [--stacks rd-thread,rd-app,rcrd-thread]
                        [--rails RATE] [--build-loop DIR] [--json FILE] [--quick]

Each end of each pair is its own process, unpinned, as independent
applications are (diwarp-bw --transport rd --op write 1 MiB against raw-sock
--proto tcp --mode stream 1 MiB), from namespace A to B through a forwarding
namespace R with a tbf of RATE each way (bench/netns-topo.sh up NAME router
RATE --both). Cases, each run for every diwarp stack given and for TCP
right after:

  pairs-N@RATE   N independent pairs at once
  hog@RATE       one pair beside a nice-0 `yes` per core
  build@RATE     one pair beside a nice-19 build loop on every core
                 (--build-loop DIR: a configured meson build directory of
                 this tree, cleaned and rebuilt over and over)

Stacks: rc (RC over TCP as it comes, for comparison), rd-thread (RD Writes, the progress thread as it comes), rd-app
(DIWARP_PROGRESS=app: the application alone drives progress, the old way),
rcrd-thread and rcrd-app (diwarp-bw --transport rc with
DIWARP_RC_TRANSPORT=rd: RC QPs carried by RD), rd-daemon and rcrd-daemon
(the same through one host daemon per namespace, `diwarpd`, every program
its client: DIWARP_PROGRESS=daemon).

--rails RATE runs the same cases once more on two rails instead of the
router: A and B joined by two veth pairs, each with a tbf of RATE each way
(bench/netns-topo.sh up NAME rails RATE,RATE), with the stack rd-2rail (RD
Writes, the device of each end pinned to both of its rails: DIWARP_ADDR=
rail1,rail2, every message striped) against TCP pairs spread over the rails
(pair i on rail i mod 2). --json FILE writes every
result (case, stack, gbps, ratio, jain, retx_pct, takeovers, failed) for
bench/run.py's `shared` group.

Printed per case: aggregate Gbit/s, the ratio to TCP's aggregate in the same
round, Jain's fairness index over the pairs, retransmissions per 100
datagrams of payload sent (every RD resend here is spurious unless the tbf
dropped: the receivers count duplicates) and the progress thread's
take-overs. A pair that fails is reported as failed, never as a number, and
the script exits 1. Needs root, ip and tc (netns-topo.sh); Python 3
standard library only.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOPO = os.path.join(HERE, "netns-topo.sh")
MiB = 1 << 20


def topo(*args):
    return subprocess.run([TOPO, *args], check=True, capture_output=True, text=True).stdout


def kv(line, key):
    m = re.search(r"\b%s=([0-9.]+)" % key, line)
    return float(m.group(1)) if m else None


STACKS = {  # name -> (diwarp-bw --transport, extra environment)
    "rc": ("rc", {}),
    "rd-thread": ("rd", {}),
    "rd-app": ("rd", {"DIWARP_PROGRESS": "app"}),
    "rcrd-thread": ("rc", {"DIWARP_RC_TRANSPORT": "rd"}),
    "rcrd-app": ("rc", {"DIWARP_RC_TRANSPORT": "rd", "DIWARP_PROGRESS": "app"}),
    "rd-daemon": ("rd", {"DIWARP_PROGRESS": "daemon"}),
    "rcrd-daemon": ("rc", {"DIWARP_RC_TRANSPORT": "rd", "DIWARP_PROGRESS": "daemon"}),
    "rd-2rail": ("rd", {"RAILS": "1"}),  # --rails only: both rails of each end
}


def daemons_start(a, name, env):
    """One diwarpd in each of A and B (the engine settings of env); returns
    (processes, {side: socket})."""
    d = os.path.join("/tmp", f"diwarp-shared-{os.getpid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    procs, socks = [], {}
    for side in ("A", "B"):
        sock = os.path.join(d, f"{name}-{side}.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        e = {k: v for k, v in env.items() if k != "DIWARP_PROGRESS"}
        procs.append(subprocess.Popen([TOPO, "exec", name, side,
                                       os.path.join(a.build, "daemon", "diwarpd"),
                                       "--socket", sock], env=e,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        socks[side] = sock
    deadline = time.monotonic() + 10
    while not all(os.path.exists(s) for s in socks.values()):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            daemons_stop(procs)
            raise RuntimeError("diwarpd did not start")
        time.sleep(0.02)
    return procs, socks


def daemons_stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_pairs(a, name, addrs, stack, n, port0):
    """n pairs at once of `stack` (a STACKS name, or "tcp"); addrs: the
    topology's {"b": [B's address per rail], "a": [A's]} (one entry without
    rails); the clients' RESULT lines, None for a pair that failed."""
    env = dict(os.environ)
    for k in ("DIWARP_PROGRESS", "DIWARP_RC_TRANSPORT", "DIWARP_ADDR"):
        env.pop(k, None)
    kind, extra = STACKS.get(stack, ("tcp", {}))
    env.update({k: v for k, v in extra.items() if k != "RAILS"})
    envA, envB, daemons = env, env, []
    if extra.get("RAILS"):
        envA = dict(env, DIWARP_ADDR=",".join(addrs["a"]))
        envB = dict(env, DIWARP_ADDR=",".join(addrs["b"]))
    # TCP and single-rail stacks spread their pairs over the rails.
    b_addrs = addrs["b"][:1] if extra.get("RAILS") else addrs["b"]
    if extra.get("DIWARP_PROGRESS") == "daemon":
        daemons, socks = daemons_start(a, name, env)
        envA = dict(env, DIWARP_DAEMON_SOCKET=socks["A"])
        envB = dict(env, DIWARP_DAEMON_SOCKET=socks["B"])
    try:
        return run_pairs_in(a, name, b_addrs, kind, n, port0, envA, envB)
    finally:
        daemons_stop(daemons)


def run_pairs_in(a, name, b_addrs, kind, n, port0, envA, envB):
    bw = os.path.join(a.build, "examples", "diwarp-bw")
    raw = os.path.join(a.build, "bench", "raw-sock")
    srv, cli = [], []
    for i in range(n):
        port = str(port0 + i)
        if kind == "tcp":
            s = [raw, "--proto", "tcp", "--mode", "stream", "--size", str(MiB), "--iters",
                 str(a.iters), "--port", port]
        else:
            s = [bw, "--transport", kind, "--op", "write", "--size", str(MiB), "--iters",
                 str(a.iters), "--port", port, "--timeout", "30000"]
        srv.append(subprocess.Popen([TOPO, "exec", name, "B", *s], env=envB,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)
    for i in range(n):
        port = str(port0 + i)
        b_addr = b_addrs[i % len(b_addrs)]
        if kind == "tcp":
            c = [raw, "--proto", "tcp", "--mode", "stream", "--size", str(MiB), "--iters",
                 str(a.iters), "--port", port, b_addr]
        else:
            c = [bw, "--transport", kind, "--op", "write", "--size", str(MiB), "--iters",
                 str(a.iters), "--port", port, "--timeout", "30000", b_addr]
        cli.append(subprocess.Popen([TOPO, "exec", name, "A", *c], env=envA,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for i, p in enumerate(cli):
        try:
            text, _ = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            text = "timeout"
        line = next((l for l in text.splitlines() if l.startswith("RESULT")), "")
        if p.returncode != 0 or "status=ok" not in line:
            out.append(None)
            print(f"    {kind} pair {i + 1} failed: {text.strip()[-300:]}", file=sys.stderr)
        else:
            out.append(line)
    for p in srv:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    return out


def summary(lines):
    if any(l is None for l in lines):
        return None
    g = [kv(l, "gbps") for l in lines]
    rates = sum(g)
    jain = rates * rates / (len(g) * sum(x * x for x in g)) if rates > 0 else 0
    # The aggregate is all the bytes over the longest transfer (the pairs
    # start together): a sum of the pairs' rates would count the link twice
    # once a fast pair finished and left it to the others.
    total = len(g) / max(1 / x for x in g) if all(x > 0 for x in g) else 0
    retx = sum(kv(l, "retx") or 0 for l in lines)
    sent = sum(a_iters * MiB / 1442 for a_iters in [ARGS.iters] * len(lines))
    takeovers = sum(kv(l, "takeovers") or 0 for l in lines)
    return {"gbps": total, "jain": jain, "retx_pct": 100.0 * retx / sent,
            "takeovers": takeovers}


def load_start(kind, build_dir):
    procs = []
    if kind == "hog":
        for _ in range(os.cpu_count() or 2):
            procs.append(subprocess.Popen(["yes"], stdout=subprocess.DEVNULL))
    elif kind == "build":
        loop = (f"while true; do ninja -C '{build_dir}' clean >/dev/null 2>&1; "
                f"ninja -C '{build_dir}' >/dev/null 2>&1; done")
        procs.append(subprocess.Popen(["nice", "-n", "19", "bash", "-c", loop],
                                      start_new_session=True))
    time.sleep(1)
    return procs


def load_stop(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL) if p.args[0] == "nice" else p.kill()
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()


ARGS = None


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build-rel")
    ap.add_argument("--pairs", default="2,4,8")
    ap.add_argument("--rates", default="1gbit,2gbit")
    ap.add_argument("--stacks", default="rd-thread,rd-app,rcrd-thread",
                    help="comma list of: " + ",".join(STACKS))
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--rails", default="",
                    help="also run the cases on two rails of this rate each (rd-2rail vs TCP)")
    ap.add_argument("--build-loop", default="")
    ap.add_argument("--json", default="", help="write the results to this file")
    ap.add_argument("--quick", action="store_true", help="pairs 2,4 at 2gbit, 150 MiB each")
    a = ap.parse_args()
    ARGS = a
    if a.quick:
        a.pairs, a.rates, a.iters = "2,4", "2gbit", 150
    stacks = [s for s in a.stacks.split(",") if s]
    for s in stacks:
        if s not in STACKS:
            ap.error(f"unknown stack {s!r} (known: {', '.join(STACKS)})")
        if STACKS[s][1].get("RAILS"):
            ap.error(f"stack {s} runs with --rails RATE, on the rails topology")
    results = []
    cases = [("pairs", int(n)) for n in a.pairs.split(",") if n] + [("hog", 1)]
    if a.build_loop:
        cases.append(("build", 1))
    failed = False
    print(f"{'case':<16} {'stack':<12} {'Gbit/s':>7} {'x TCP':>6} {'Jain':>5} "
          f"{'retx %':>7} {'takeovers':>9}")
    # (label suffix, topology arguments, stacks) per topology
    topos = [(rate, ["router", rate, "--both", "--latency", "3ms", "--burst", "64kb"],
              [s for s in stacks if not STACKS[s][1].get("RAILS")])
             for rate in a.rates.split(",")]
    if a.rails:
        topos.append((f"2x{a.rails}", ["rails", f"{a.rails},{a.rails}", "--latency", "3ms",
                                        "--burst", "64kb"], ["rd-2rail"]))
    for where, targs, tstacks in topos:
        name = f"sh{os.getpid() % 10000}"
        info = topo("up", name, *targs)
        t = dict(kv.split("=", 1) for kv in info.split()[1:])
        addrs = ({"a": t["a_rails"].split(","), "b": t["b_rails"].split(",")} if "a_rails" in t
                 else {"a": [t["a"]], "b": [t["b"]]})
        try:
            port = 23000
            for kind, n in cases:
                label = f"{kind}-{n}@{where}" if kind == "pairs" else f"{kind}@{where}"
                load = load_start(kind, a.build_loop) if kind != "pairs" else []
                try:
                    res = {}
                    for stack in tstacks:
                        res[stack] = summary(run_pairs(a, name, addrs, stack, n, port))
                        port += 16
                    tcp = summary(run_pairs(a, name, addrs, "tcp", n, port))
                    port += 16
                finally:
                    load_stop(load)
                for stack, s in list(res.items()) + [("tcp", tcp)]:
                    if s is None:
                        failed = True
                        print(f"{label:<16} {stack:<12} failed")
                        results.append({"case": label, "stack": stack, "failed": True})
                        continue
                    ratio = s["gbps"] / tcp["gbps"] if tcp and tcp["gbps"] > 0 else float("nan")
                    results.append({"case": label, "stack": stack, "failed": False,
                                    "ratio": None if ratio != ratio else ratio, **s})
                    retx = f"{s['retx_pct']:.2f}" if stack != "tcp" else "-"
                    tko = f"{s['takeovers']:.0f}" if stack != "tcp" else "-"
                    print(f"{label:<16} {stack:<12} {s['gbps']:7.3f} {ratio:6.2f} "
                          f"{s['jain']:5.2f} {retx:>7} {tko:>9}", flush=True)
        finally:
            topo("down", name)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
