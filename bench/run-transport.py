#!/usr/bin/env python3
"""Transport benchmark: diwarp against raw sockets, side by side in one run.

    bench/run-transport.py [--build DIR] [--runs N] [--cases LIST] [--strict]

Cases (each diwarp run is followed by its baseline run, A B A B ..., round
after round, so slow drifts of a shared machine hit both sides alike):

  ud-pingpong   diwarp-pingpong --transport ud, 64 B     vs raw-sock udp pingpong
  rc-pingpong   diwarp-pingpong --transport rc --op send vs raw-sock tcp pingpong
  rc-write      diwarp-bw --transport rc --op write, 1 MiB, DIWARP_RC_CRC=0 and =1
                vs raw-sock tcp stream of 1 MiB messages (one baseline per round,
                shared by both CRC settings and run between them)
  rd-pingpong   diwarp-pingpong --transport rd --op send, 64 B vs raw-sock udp pingpong
                (target <= 1.20)
  rd-write      diwarp-bw --transport rd --op write, 1 MiB vs raw-sock tcp stream of
                1 MiB messages (target >= 1.0)
  rc-rd-write   rc-write with DIWARP_RC_TRANSPORT=rd (RC QPs carried by RD), CRC
                at its default, vs the same tcp stream (reported, no target)

Server and client are pinned to different cores (taskset -c, --cpus) and both
busy-poll. The device runs as it comes (DIWARP_PROGRESS=thread, its default:
a progress thread that parks while the program polls); --progress app
measures application-driven progress alone, the arrangement these numbers
were taken in before 2026-11-30: it leaves out the 0.3-0.45 us a half round
trip that the parked thread's looks cost a pinned ping-pong
(docs/PERFORMANCE.md, "The parked thread's look"). Every run must
exit 0 and print `status=ok` (client and server); otherwise the script stops
with a message and a non-zero status and reports no number. The ratio is
the median of the per-round
diwarp/baseline ratios (each diwarp run against the baseline run next to it),
with best/best (fastest against fastest run) beside it; latency targets are upper bounds,
bandwidth targets lower bounds. Exit status: 0 measured (targets may be
missed; --strict turns a missed target into exit 3), 1 a run failed,
2 a program is missing or bad usage. Python 3 standard library only.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

MiB = 1 << 20


class RunFailed(Exception):
    pass


def fail(msg, code):
    print(f"run-transport: {msg}", file=sys.stderr)
    sys.exit(code)


class Runner:
    def __init__(self, args):
        self.args = args
        self.port = args.port
        self.server_cpu, self.client_cpu = args.cpus.split(",")
        self.log = args.verbose

    def next_port(self):
        # A fresh port per run: no TIME_WAIT or half-closed listener from the
        # previous run can make a bind fail.
        self.port += 1
        if self.port > 65000:
            self.port = self.args.port
        return self.port

    def run_pair(self, label, server_argv, client_argv, env_extra, expect):
        """Runs one server/client pair; returns the client's RESULT fields."""
        env = dict(os.environ)
        for k in ("DIWARP_FAULT", "DIWARP_PROGRESS", "DIWARP_RC_CRC", "DIWARP_IO",
                  "DIWARP_RC_TRANSPORT"):
            env.pop(k, None)
        env["DIWARP_PROGRESS"] = self.args.progress
        env.update(env_extra)
        port = str(self.next_port())
        srv = ["taskset", "-c", self.server_cpu] + server_argv + ["--port", port]
        cli = ["taskset", "-c", self.client_cpu] + client_argv + ["--port", port, "127.0.0.1"]
        if self.log:
            envs = " ".join(f"{k}={v}" for k, v in env_extra.items())
            print(f"# {label}: {envs} {' '.join(srv)} & {' '.join(cli)}", file=sys.stderr)
        s = subprocess.Popen(srv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        time.sleep(0.05)
        c = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        outs = {}
        try:
            for name, p in (("client", c), ("server", s)):
                outs[name] = p.communicate(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            for p in (c, s):
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            raise RunFailed(f"{label}: timed out after {self.args.timeout} s\n"
                            f"  client: {' '.join(cli)}\n  server: {' '.join(srv)}")

        def show():
            txt = ""
            for name, p, argv in (("client", c, cli), ("server", s, srv)):
                o, e = outs[name]
                txt += (f"\n  {name} (exit {p.returncode}): {' '.join(argv)}\n"
                        f"    stdout: {o.strip()[-600:]!r}\n    stderr: {e.strip()[-600:]!r}")
            return txt

        if c.returncode != 0 or s.returncode != 0:
            raise RunFailed(f"{label}: a process failed" + show())
        res = parse_result(outs["client"][0])
        if res is None or res.get("status") != "ok":
            raise RunFailed(f"{label}: client did not print status=ok" + show())
        # diwarp servers print their own RESULT line; raw-sock servers print none.
        srv_res = parse_result(outs["server"][0])
        if srv_res is not None and srv_res.get("status") != "ok":
            raise RunFailed(f"{label}: server did not print status=ok" + show())
        for k, v in expect.items():
            if res.get(k) != v:
                raise RunFailed(f"{label}: RESULT has {k}={res.get(k)}, expected {v}" + show())
        return res


def parse_result(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT")]
    if not lines:
        return None
    return dict(re.findall(r"(\w+)=(\S+)", lines[-1]))


def build_cases(a, prog):
    pp, bw, raw = prog["diwarp-pingpong"], prog["diwarp-bw"], prog["raw-sock"]
    n_pp, n_st = str(a.pp_iters), str(a.stream_iters)
    size = str(a.size)
    big = str(a.stream_size)

    def diwarp(label, server, client_args, env, metric, expect):
        return dict(label=label, server=[server], client=[server] + client_args, env=env,
                    metric=metric, expect=expect)

    def rawcase(label, proto, mode, sz, iters, metric):
        argv = [raw, "--proto", proto, "--mode", mode, "--size", sz, "--iters", iters]
        return dict(label=label, server=argv, client=argv, env={}, metric=metric,
                    expect=dict(proto=proto, mode=mode, size=sz))

    udp = rawcase("raw UDP pingpong", "udp", "pingpong", size, n_pp, "lat_us")
    tcp = rawcase("raw TCP pingpong", "tcp", "pingpong", size, n_pp, "lat_us")
    tcps = rawcase("raw TCP stream", "tcp", "stream", big, n_st, "gbps")
    cases = {
        "ud-pingpong": dict(
            title=f"UD send pingpong {size} B, half RTT (us)", lower_better=True,
            pairs=[(diwarp("diwarp UD pingpong", pp,
                           ["--transport", "ud", "--op", "send", "--size", size, "--iters", n_pp],
                           {}, "lat_us", dict(transport="ud", op="send", size=size)),
                    1.10)],
            baseline=udp),
        "rc-pingpong": dict(
            title=f"RC send pingpong {size} B, half RTT (us)", lower_better=True,
            pairs=[(diwarp("diwarp RC pingpong", pp,
                           ["--transport", "rc", "--op", "send", "--size", size, "--iters", n_pp],
                           {}, "lat_us", dict(transport="rc", op="send", size=size)),
                    1.15)],
            baseline=tcp),
        "rc-write": dict(
            title=f"RC RDMA Write stream {a.stream_size} B (Gbit/s)", lower_better=False,
            pairs=[(diwarp(f"diwarp RC write CRC {crc}", bw,
                           ["--transport", "rc", "--op", "write", "--size", big, "--iters", n_st],
                           {"DIWARP_RC_CRC": crc}, "gbps",
                           dict(transport="rc", op="write", size=big)), target)
                   for crc, target in (("0", 0.85), ("1", 0.75))],
            baseline=tcps),
        "rd-pingpong": dict(
            title=f"RD send pingpong {size} B, half RTT (us)", lower_better=True,
            pairs=[(diwarp("diwarp RD pingpong", pp,
                           ["--transport", "rd", "--op", "send", "--size", size, "--iters", n_pp],
                           {}, "lat_us", dict(transport="rd", op="send", size=size)),
                    1.15)],
            baseline=udp),
        "rd-write": dict(
            title=f"RD RDMA Write stream {a.stream_size} B (Gbit/s)", lower_better=False,
            pairs=[(diwarp("diwarp RD write", bw,
                           ["--transport", "rd", "--op", "write", "--size", big, "--iters", n_st],
                           {}, "gbps", dict(transport="rd", op="write", size=big)), 1.0)],
            baseline=tcps),
        "rc-rd-write": dict(
            title=f"RC-over-RD RDMA Write stream {a.stream_size} B (Gbit/s)", lower_better=False,
            pairs=[(diwarp("diwarp RC-over-RD write", bw,
                           ["--transport", "rc", "--op", "write", "--size", big, "--iters", n_st],
                           {"DIWARP_RC_TRANSPORT": "rd"}, "gbps",
                           dict(transport="rc", op="write", size=big)), None)],
            baseline=tcps),
    }
    return cases


def fmt_stats(vals):
    return (f"{statistics.median(vals):.2f}", f"{min(vals):.2f}", f"{max(vals):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="meson build dir (default: build)")
    ap.add_argument("--runs", type=int, default=5, help="runs per point (default 5)")
    ap.add_argument("--cases", default="ud-pingpong,rc-pingpong,rc-write")
    ap.add_argument("--size", type=int, default=64, help="pingpong message size")
    ap.add_argument("--pp-iters", type=int, default=20000)
    ap.add_argument("--stream-size", type=int, default=MiB)
    ap.add_argument("--stream-iters", type=int, default=2000)
    ap.add_argument("--cpus", default="0,1", help="server,client cores (default 0,1)")
    ap.add_argument("--port", type=int, default=18700, help="first TCP port (one per run)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run")
    ap.add_argument("--progress", choices=("thread", "app"), default="thread",
                    help="DIWARP_PROGRESS of both ends (default thread, the device's own)")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command")
    a = ap.parse_args()
    if a.runs < 1 or not re.fullmatch(r"\d+,\d+", a.cpus):
        fail("bad --runs or --cpus", 2)

    if not shutil.which("taskset"):
        fail("taskset (util-linux) not found", 2)
    prog = {}
    for name, sub in (("diwarp-pingpong", "examples"), ("diwarp-bw", "examples"),
                      ("raw-sock", "bench")):
        p = os.path.join(a.build, sub, name)
        if not (os.path.isfile(p) and os.access(p, os.X_OK)):
            fail(f"program missing: {p} (build first: ninja -C {a.build})", 2)
        prog[name] = os.path.abspath(p)

    all_cases = build_cases(a, prog)
    wanted = [c for c in a.cases.split(",") if c]
    for c in wanted:
        if c not in all_cases:
            fail(f"unknown case {c!r} (known: {', '.join(all_cases)})", 2)

    r = Runner(a)
    # values[case][label] = list of numbers
    values = {c: {} for c in wanted}
    try:
        for rnd in range(a.runs):
            for cname in wanted:
                case = all_cases[cname]
                runs = [p[0] for p in case["pairs"]]
                # A B A B: the baseline sits between/after the diwarp runs
                order = [runs[0], case["baseline"]] + runs[1:]
                for spec in order:
                    res = r.run_pair(f"{cname} round {rnd + 1}: {spec['label']}", spec["server"],
                                     spec["client"], spec["env"], spec["expect"])
                    v = float(res[spec["metric"]])
                    if not v > 0:
                        raise RunFailed(f"{spec['label']}: {spec['metric']}={v} is not positive")
                    values[cname].setdefault(spec["label"], []).append(v)
                    print(f"# round {rnd + 1} {spec['label']}: {spec['metric']}={v}",
                          file=sys.stderr)
    except RunFailed as e:
        fail(f"FAILED, no numbers reported: {e}", 1)

    missed = 0
    sys.stderr.flush()
    print(f"\n{a.runs} runs per point, DIWARP_PROGRESS={a.progress}, server on core "
          f"{r.server_cpu}, client on core {r.client_cpu}; value = median (min-max); ratio = median of the per-round "
          f"diwarp/baseline ratios (met/missed judged on it); best/best = fastest diwarp "
          f"run / fastest baseline run\n")
    print("| case | diwarp | baseline | ratio | best/best | target | result |")
    print("|---|---|---|---|---|---|---|")
    for cname in wanted:
        case = all_cases[cname]
        base = values[cname][case["baseline"]["label"]]
        bmed, bmin, bmax = fmt_stats(base)
        for spec, target in case["pairs"]:
            dv = values[cname][spec["label"]]
            dmed, dmin, dmax = fmt_stats(dv)
            # Each diwarp run is paired with the baseline run of the same round
            # (adjacent in time): the median of the per-round ratios cancels
            # slow load drifts better than a ratio of medians.
            ratio = statistics.median(d / b for d, b in zip(dv, base))
            # Least-disturbed runs on both sides: the cost without preemption.
            if case["lower_better"]:
                best = min(dv) / min(base)
                ok = target is None or ratio <= target
            else:
                best = max(dv) / max(base)
                ok = target is None or ratio >= target
            missed += not ok
            title = case["title"]
            if "DIWARP_RC_CRC" in spec["env"]:
                title += f", CRC {'on' if spec['env']['DIWARP_RC_CRC'] == '1' else 'off'}"
            if target is None:
                tgt, verdict = "-", "reported"
            else:
                tgt = f"{'<=' if case['lower_better'] else '>='} {target:.2f}"
                verdict = "met" if ok else "MISSED"
            print(f"| {title} | {dmed} ({dmin}-{dmax}) | {bmed} ({bmin}-{bmax}) | {ratio:.3f} | {best:.3f} | "
                  f"{tgt} | {verdict} |")
    if missed and a.strict:
        sys.exit(3)


if __name__ == "__main__":
    main()
