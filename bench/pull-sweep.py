#!/usr/bin/env python3
"""Sweep of the receiver-paced Send parameters (DIWARP_RD_PULL_MIN, _CHUNK,
_DEPTH): the measurements that chose their defaults (docs/PERFORMANCE.md).

    bench/pull-sweep.py [--build DIR] [--runs N] [--parts loopback,slow,shared]

loopback  RD Sends between two busy-polling processes on loopback (server on
          core 0, client on core 1), diwarp-bw --op send: pushed (PULL_MIN=0)
          against pulled with each chunk and depth, at 256 KiB, 1 MiB and
          4 MiB. What pulling costs a receiver that keeps up.
slow      the same through the 1 Gbit/s router bottleneck of
          bench/netns-topo.sh, to a receiver with DIWARP_FAULT=slowrx at
          1/8 of the link (15.6 MB/s): goodput against the receiver's rate,
          and the retransmissions a pushed Send needs where a pulled one
          needs none. Needs root (skipped otherwise).
shared    that slow receiver beside three at full speed, as the contention
          group's rd-slowrx case (bench-flows, 4 server processes, one
          client with 4 flows of 1 MiB Sends): the slow flow's goodput
          against its receiver's payload rate while the other three keep
          the link full. Needs root.

Each point is the median of --runs runs, the cases alternating within a
round. Python 3 standard library only; a failed run stops the sweep.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

KiB, MiB = 1 << 10, 1 << 20
SLOW_RATE = 15625000  # 1/8 of 1 Gbit/s, bytes per second
TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kv(line, key):
    m = re.search(r"\b%s=([0-9.]+)" % key, line)
    return float(m.group(1)) if m else None


class Sweep:
    def __init__(self, a):
        self.a = a
        self.bw = os.path.join(a.build, "examples", "diwarp-bw")
        self.port = 24100
        if not os.access(self.bw, os.X_OK):
            sys.exit(f"pull-sweep: {self.bw} missing (build {a.build} first)")

    def pair(self, env, size, iters, server_ns=None, client_ns=None, srv_env=None,
             addrs=("127.0.0.1", "127.0.0.1")):
        self.port += 1
        base = {k: v for k, v in os.environ.items() if not k.startswith("DIWARP_")}
        senv = dict(base, DIWARP_PROGRESS="app", **env, **(srv_env or {}))
        cenv = dict(base, DIWARP_PROGRESS="app", **env)
        wrap = lambda ns: ["ip", "netns", "exec", ns] if ns else []
        srv = wrap(server_ns) + ["taskset", "-c", "0", self.bw, "--port", str(self.port),
                                 "--addr", addrs[1]]
        cli = wrap(client_ns) + ["taskset", "-c", "1", self.bw, "--transport", "rd", "--op",
                                 "send", "--size", str(size), "--iters", str(iters),
                                 "--port", str(self.port), "--addr", addrs[0], addrs[1]]
        s = subprocess.Popen(srv, env=senv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        time.sleep(0.3)
        c = subprocess.run(cli, env=cenv, capture_output=True, text=True, timeout=120)
        so, se = s.communicate(timeout=30)
        res = [l for l in c.stdout.splitlines() if l.startswith("RESULT")]
        if c.returncode or s.returncode or not res or "status=ok" not in res[-1]:
            sys.exit(f"pull-sweep: run failed ({env} size {size}):\n{c.stdout[-800:]}"
                     f"{c.stderr[-800:]}{so[-400:]}{se[-400:]}")
        line = res[-1]
        return {"gbps": kv(line, "gbps"), "retx": kv(line, "retx") or 0}

    def points(self, cases, size, iters, **kw):
        """cases: [(label, env)]; returns {label: (median gbps, median retx)}."""
        got = {l: [] for l, _ in cases}
        for _ in range(self.a.runs):
            for label, env in cases:
                got[label].append(self.pair(env, size, iters, **kw))
        out = {}
        for l, rs in got.items():
            out[l] = (statistics.median(r["gbps"] for r in rs),
                      statistics.median(r["retx"] for r in rs),
                      min(r["gbps"] for r in rs), max(r["gbps"] for r in rs))
        return out

    def cases(self):
        c = [("pushed", {"DIWARP_RD_PULL_MIN": "0"})]
        for chunk in (16 * KiB, 64 * KiB, 128 * KiB, 256 * KiB, 1 * MiB):
            for depth in (1, 2, 4, 8):
                c.append((f"chunk {chunk // KiB} KiB depth {depth}",
                          {"DIWARP_RD_PULL_MIN": str(chunk + 1),
                           "DIWARP_RD_PULL_CHUNK": str(chunk),
                           "DIWARP_RD_PULL_DEPTH": str(depth)}))
        return c

    def table(self, title, res, base=None, rate=None):
        print(f"\n### {title}\n")
        print("| case | Gbit/s (min–max) | × pushed | retransmissions |")
        print("|---|---|---|---|")
        for l, (g, r, lo, hi) in res.items():
            ratio = f"{g / base:.2f}" if base else "-"
            extra = f" ({g * 1e9 / 8 / rate:.2f} × the receiver's rate)" if rate else ""
            print(f"| {l} | {g:.3f} ({lo:.3f}–{hi:.3f}){extra} | {ratio} | {r:.0f} |")

    def loopback(self):
        for size, iters in ((256 * KiB, 4000), (1 * MiB, 1500), (4 * MiB, 400)):
            cases = [c for c in self.cases()
                     if c[0] == "pushed" or int(c[1]["DIWARP_RD_PULL_CHUNK"]) < size]
            res = self.points(cases, size, iters)
            self.table(f"loopback, {size // KiB} KiB Sends", res, base=res["pushed"][0])

    def topology(self, title, run):
        """Runs run(name, a, b) in the 1 Gbit/s router topology 'pullsw'."""
        if os.geteuid() != 0:
            print(f"\n### {title}: not available (needs root for network namespaces)")
            return
        topo = os.path.join(TOP, "bench", "netns-topo.sh")
        name = "pullsw"
        # a topology an interrupted sweep left behind
        subprocess.run([topo, "down", name], capture_output=True)
        up = subprocess.run([topo, "up", name, "router", "1gbit", "--latency", "2ms",
                             "--burst", "64kb", "--owner", "none"], capture_output=True,
                            text=True)
        if up.returncode:
            print(f"\n### {title}: not available ({up.stderr.strip()[-200:]})")
            return
        try:
            a = re.search(r"\ba=([0-9.]+)", up.stdout).group(1)
            b = re.search(r"\bb=([0-9.]+)", up.stdout).group(1)
            run(name, a, b)
        finally:
            subprocess.run([topo, "down", name], capture_output=True)

    def slow(self):
        self.topology("slow receiver", self.slow_run)

    def slow_run(self, name, a, b):
        rate = SLOW_RATE
        cases = [c for c in self.cases()
                 if c[0] == "pushed" or c[1]["DIWARP_RD_PULL_DEPTH"] in ("1", "2", "4")]
        res = self.points(cases, 1 * MiB, 40, server_ns=f"{name}-B", client_ns=f"{name}-A",
                          srv_env={"DIWARP_FAULT": f"slowrx:{rate}"}, addrs=(a, b))
        self.table("slow receiver (slowrx at 1/8 of a 1 Gbit/s bottleneck), 1 MiB Sends",
                   res, base=res["pushed"][0], rate=rate)

    def shared(self):
        self.topology("slow receiver beside three others", self.shared_run)

    def shared_run(self, name, a, b):
        flows = os.path.join(self.a.build, "bench", "bench-flows")
        base = {k: v for k, v in os.environ.items() if not k.startswith("DIWARP_")}
        cases = [c for c in self.cases()
                 if c[0] == "pushed" or (c[1]["DIWARP_RD_PULL_DEPTH"] == "4"
                                         and int(c[1]["DIWARP_RD_PULL_CHUNK"]) < MiB)]
        got = {l: [] for l, _ in cases}
        for _ in range(self.a.runs):
            for label, env in cases:
                self.port += 8
                env = dict(env, DIWARP_RD_PULL_MIN="1048576") if label != "pushed" else env
                srvs, hosts = [], []
                for i in range(4):
                    port = self.port + 2 * i
                    e = dict(base, **env)
                    if i == 3:
                        e["DIWARP_FAULT"] = f"slowrx:{SLOW_RATE}"
                    srvs.append(subprocess.Popen(
                        ["ip", "netns", "exec", f"{name}-B", "taskset", "-c", "0", flows,
                         "--addr", b, "--cpu", "0", "--port", str(port)], env=e,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                    hosts.append(f"{b}:{port}")
                time.sleep(0.5)
                c = subprocess.run(["ip", "netns", "exec", f"{name}-A", "taskset", "-c", "1",
                                    flows, "--addr", a, "--cpu", "1", "--transport", "rd",
                                    "--op", "send", "--flows", "4", "--devices", "4", "--size",
                                    str(MiB), "--duration-ms", "3000", "--warmup-ms", "1000"]
                                   + hosts, env=dict(base, **env), capture_output=True,
                                   text=True, timeout=120)
                for sp in srvs:
                    sp.communicate(timeout=30)
                fl = {int(m.group(1)): float(m.group(2)) for m in
                      re.finditer(r"^FLOW (\d+) .*?\bgbps=([0-9.]+)", c.stdout, re.M)}
                if c.returncode or len(fl) != 4:
                    sys.exit(f"pull-sweep: shared run failed ({env}):\n{c.stdout[-800:]}"
                             f"{c.stderr[-800:]}")
                got[label].append((fl[3], min(fl[0], fl[1], fl[2])))
        pay = SLOW_RATE * 8 / 1e9 * 0.968  # Gbit/s of payload the slow receiver takes
        print("\n### slow receiver beside three at full speed (1 Gbit/s bottleneck, "
              "1 MiB Sends, depth 4)\n")
        print("| case | slow flow Gbit/s (min–max) | × its receiver's rate | "
              "slowest other Gbit/s |")
        print("|---|---|---|---|")
        for l, rs in got.items():
            g = statistics.median(r[0] for r in rs)
            o = statistics.median(r[1] for r in rs)
            print(f"| {l} | {g:.4f} ({min(r[0] for r in rs):.4f}–"
                  f"{max(r[0] for r in rs):.4f}) | {g / pay:.2f} | {o:.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("DIWARP_BUILD", "build-rel"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parts", default="loopback,slow,shared")
    a = ap.parse_args()
    s = Sweep(a)
    for part in a.parts.split(","):
        getattr(s, part)()


if __name__ == "__main__":
    main()
