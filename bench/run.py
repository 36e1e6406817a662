#!/usr/bin/env python3
"""diwarp benchmark harness: every stack side by side with raw sockets, one run.

    bench/run.py [--quick] [--out DIR] [--build DIR] [--runs N] [--cases LIST]
                 [--groups LIST] [--allow-missing] [--noise X] [-v]

Cases: diwarp native UD / RC (TCP) / RD / RC over RD, the same through the
verbs provider (perftest under `diwarp run`), raw UDP and TCP sockets
(bench/raw-sock), libfabric's fi_pingpong (tcp msg, udp dgram, udp;ofi_rxd
rdm). Metrics: latency 8 B - 1 MiB, bandwidth and CPU seconds per GB
4 KiB - 16 MiB, message rate (8 B, window 64), and the scalability and overlap ones:
multi-QP latency / throughput / Jain's index, registration cost, buffer reuse,
overlap and independent progress, memory per peer, idle CPU of the progress
thread. Group `contention`: RD congestion control against raw TCP (default
congestion control and cubic) through a tbf bottleneck in network namespaces
(bench-flows, netns-topo.sh; root), N = 1 - 32 flows at 1 and 5 Gbit/s,
incast, RC over RD, and a loopback check. Group `multirail` (only when
--groups names it; root): RD striped over 1, 2 and 3 rails (DIWARP_ADDR
lists) between two namespaces joined by a veth pair and a tbf per rail,
against libfabric's ofi_mrail. Group `shared` (only when --groups names
it; root): RD and RC over RD beside other programs, bench/run-shared.py's
independent unpinned pairs, CPU hogs and (--shared-build-loop) a build
loop, each against TCP under the same load. See bench/README.md for definitions and
docs/PERFORMANCE.md for the numbers.

Server on core 0, client on core 1 (--cpus). Each point is the median of
--runs runs (3 with --quick, 5 otherwise), with min and max; runs of all cases
at one point alternate round after round (A B C A B C ...), so slow drifts of
a shared machine hit every case alike. max/min > --noise (1.5) flags the
point as noisy: it is reported, with the flag.

Never a number from a failed run: any run that exits non-zero, times out or
prints no valid result fails its point (no value; the reason is in the
report), the remaining sizes of that case and metric are skipped, and the
harness exits 1 at the end (0 with --allow-missing). A case the engine does
not offer yet (EOPNOTSUPP, or a setting it ignores) is a 'not available' row
and does not change the exit status. Exit 2: bad usage or a missing program
(perftest and fi_pingpong may be missing with --allow-missing: their rows
say so). Python 3 standard library; plots need gnuplot.
"""
import argparse
import concurrent.futures
import csv
import datetime
import fnmatch
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

KiB, MiB = 1 << 10, 1 << 20
UD_MAX = 65431          # diwarp UD max message (docs/USAGE.md)
UDP_MAX = 65507
VERBS_UD_MAX = 4096     # perftest UD: one MTU
FI_DGRAM_MAX = 1024     # fi_pingpong udp dgram fails above 1472 B here; powers of two

# ---------------------------------------------------------------------------
# contention: what a 1500-byte MTU lets through the bottleneck as payload. tbf
# counts L2 bytes (the Ethernet header included); goodput counts payload.

CONT_SIZE = MiB         # message size of every flow through the bottleneck
CONT_MTU = 1500
ETH_HDR, IP_HDR, UDP_HDR = 14, 20, 8
TCP_HDR = 20 + 12       # with timestamps (Linux's default): MSS 1448 at MTU 1500
# RD (libdiwarp/wire/dgram.h; rd_seg_payload in libdiwarp/rd/rd_int.h): a
# segment carries at most MTU - IP - UDP - (28 fixed header + 18 untagged DDP +
# 26 Immediate Data message + 8 stream-start descriptor + 4 CRC) bytes of
# payload, whatever the opcode; an
# RDMA Write segment goes out with the fixed header, a tagged DDP header and
# the CRC (none with DIWARP_RD_CRC=0).
RD_FIXED, RD_DDP_UNTAGGED, RD_DDP_TAGGED, RD_IMM, RD_START, RD_CRC = 28, 18, 14, 26, 8, 4


def rd_seg(mtu=CONT_MTU):
    return mtu - IP_HDR - UDP_HDR - RD_FIXED - RD_DDP_UNTAGGED - RD_IMM - RD_START - RD_CRC


def rd_pull_payload_frac(mtu=CONT_MTU):
    """Payload / UDP payload of the Read Response datagrams that carry a
    receiver-paced Send: what a receiver reading B bytes/s of datagrams
    (DIWARP_FAULT=slowrx:B) can place at most."""
    seg = rd_seg(mtu)
    return seg / (seg + RD_FIXED + RD_DDP_TAGGED + RD_CRC)


def rd_write_ceiling(size=CONT_SIZE, mtu=CONT_MTU, crc=True):
    """Payload / tbf bytes of one RD RDMA Write of size bytes."""
    nseg = -(-size // rd_seg(mtu))
    per = ETH_HDR + IP_HDR + UDP_HDR + RD_FIXED + RD_DDP_TAGGED + (RD_CRC if crc else 0)
    return size / (size + nseg * per)


def tcp_ceiling(mtu=CONT_MTU):
    """Payload / tbf bytes of a full-sized TCP segment."""
    return (mtu - IP_HDR - TCP_HDR) / (mtu + ETH_HDR)


def rate_gbps(rate):
    """tc's rate ('1gbit', '500mbit': SI units) in Gbit/s."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(gbit|mbit)", rate)
    return float(m.group(1)) * (1 if m.group(2) == "gbit" else 1e-3)


def cont_duration_ms(pl, rate, n):
    """bench-flows --duration-ms for n flows through a tbf of rate: the
    warm-up, then a measured interval in which each flow completes
    pl['cont_msgs'] messages of CONT_SIZE at its fair share of what RD can
    carry (rd_write_ceiling), at least pl['cont_min_ms'], in steps of 500 ms.
    Jain's index over flows that complete a handful of 1 MiB messages each
    would measure the message granularity, not the sharing."""
    share = rate_gbps(rate) * 1e9 * rd_write_ceiling() / n
    need_ms = pl["cont_msgs"] * CONT_SIZE * 8 / share * 1e3
    return pl["cont_warm_ms"] + max(pl["cont_min_ms"], math.ceil(need_ms / 500) * 500)

# ---------------------------------------------------------------------------
# multirail: rails of MR_RATE Mbit/s each (a tbf on both ends of each veth
# pair), low enough that 3 rails (3 x MR_RATE) never make the CPU the limit on
# 2 cores. MR-9 uses rails of R and 2R against one rail of 3R.

MR_RATE = 300
MR_LAT_RATE = "10gbit"  # MR-7: the latency path, no limit worth the name
MR_PP_SIZE = 4 * MiB    # ping-pong bandwidth beside ofi_mrail


def mr_topos():
    """name suffix -> the rates of a rails topology."""
    R = MR_RATE
    return {"eq": f"{R}mbit,{R}mbit,{R}mbit",
            "mix": f"{R}mbit,{2 * R}mbit,{3 * R}mbit",
            "lat": f"{MR_LAT_RATE},{MR_LAT_RATE}"}

# ---------------------------------------------------------------------------
# configuration of the two modes


def plan(quick):
    """Sizes, iteration budgets and runs of each group."""
    if quick:
        return dict(
            runs=3, seed_runs=3, timeout=30, mpi_reps=20, mpi_lat_reps=500,
            mv2_lat_iters=200, mv2_bw_iters=5,
            lat_sizes=[64],
            bw_sizes=[32 * KiB, MiB],
            bw_bytes=16 * MiB, bw_bytes_big=32 * MiB,
            rate_iters=5000,
            mq_k=[1, 8], mq_lat_size=8, mq_bw_size=8 * KiB, mq_iters=300, mq_ms=200,
            reg_sizes=[4 * KiB, MiB, 64 * MiB, 256 * MiB], reg_reps=11,
            reuse_sizes=[64 * KiB], reuse_iters=100, reuse_pool=16 * MiB,
            ov_size=MiB, ov_reps=5,
            mem_peers=[100],
            idle_ms=300,
            # contention: 1 Gbit/s only, N = 1 and 8 (+ incast, RC over RD at 8),
            # one run, no 1 % drop case (see cont_duration_ms for the time)
            cont_runs=1, cont_links=[("1gbit", "64kb")], cont_latency="2ms",
            cont_n=[1, 8], cont_rcrd_n=[8], cont_msgs=15, cont_min_ms=2000,
            cont_warm_ms=500, cont_drop=False, cont_slow_div=8,
            cr_eps=[16, 64], cr_msgs={16: 60, 64: 12, 256: 2}, cr_slots=[1, 1.25, 1.5, 2, 4, 8],
            cr_act8_msgs=300,
            mr_secs=1.0, mr_sizes=[MiB, 4 * MiB], mr_lat_sizes=[64, 8 * KiB],
        )
    return dict(
        runs=5, seed_runs=3, timeout=180, mpi_reps=100, mpi_lat_reps=2000,
        mv2_lat_iters=2000,
        # None: OSU's own iteration counts (100 up to 8 KiB, 20 above, and its
        # warm-up): -i 20 at every size gave 4-64 KiB runs of a few ms, whose
        # ratios measured the connection's first bursts more than the stack.
        mv2_bw_iters=None,
        lat_sizes=[8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, MiB],
        bw_sizes=[4 * KiB, 32 * KiB, MiB, 16 * MiB],
        bw_bytes=256 * MiB, bw_bytes_big=512 * MiB,
        rate_iters=100000,
        mq_k=[1, 2, 4, 8, 16, 32, 64], mq_lat_size=8, mq_bw_size=8 * KiB, mq_iters=2000,
        mq_ms=1000,
        reg_sizes=[4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB, 256 * MiB], reg_reps=21,
        reuse_sizes=[64, 4 * KiB, 32 * KiB, MiB], reuse_iters=2000, reuse_pool=64 * MiB,
        ov_size=MiB, ov_reps=9,
        mem_peers=[1, 10, 100, 1000],
        idle_ms=2000,
        # contention: burst 320 KB at 5 Gbit/s, the same 0.5 ms of line rate as
        # 64 KB at 1 Gbit/s (bench/README.md, "The contention group")
        cont_runs=5, cont_links=[("1gbit", "64kb"), ("5gbit", "320kb")], cont_latency="2ms",
        cont_n=[1, 2, 8, 32], cont_rcrd_n=[1, 8], cont_msgs=30, cont_min_ms=3000,
        cont_warm_ms=1000, cont_drop=True, cont_slow_div=8,
        cr_eps=[16, 64, 256], cr_msgs={16: 200, 64: 30, 256: 3}, cr_slots=[1, 1.25, 1.5, 2, 4, 8, 16, 32],
        cr_act8_msgs=1000,
        mr_secs=3.0, mr_sizes=[MiB, 4 * MiB, 16 * MiB],
        mr_lat_sizes=[8, 64, 512, 4 * KiB, 8 * KiB],
    )


def lat_iters(size, quick):
    if size <= 512:
        n = 10000
    elif size <= 4 * KiB:
        n = 5000
    elif size <= 32 * KiB:
        n = 2000
    elif size <= 256 * KiB:
        n = 500
    else:
        n = 200
    return max(50, n // 10) if quick else n


def bw_iters(size, pl):
    # Large messages move more bytes: an RDMA Write completes once the socket
    # has the data, so the last few MB in socket buffers are not in the time
    # of diwarp-bw; transfers far larger than those buffers keep that error
    # small. 16 MiB: diwarp-bw's setup touches 128 such slots (2 GiB), so the
    # transfer must also be long enough for its CPU time to stand out.
    budget = pl["bw_bytes_big"] if size >= MiB else pl["bw_bytes"]
    return max(64 if size >= 16 * MiB else 16, budget // size)


# ---------------------------------------------------------------------------
# processes


class RunFailed(Exception):
    pass


class NotAvailable(Exception):
    pass


class Proc:
    """A spawned program whose rusage we collect (wait4 in a thread)."""

    def __init__(self, argv, env, logdir):
        self.argv = argv
        self.out = tempfile.NamedTemporaryFile(dir=logdir, prefix="out-", delete=False)
        self.err = tempfile.NamedTemporaryFile(dir=logdir, prefix="err-", delete=False)
        try:
            self.pid = os.posix_spawnp(argv[0], argv, env, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, self.out.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, self.err.fileno(), 2)])
        except OSError as e:
            raise RunFailed(f"cannot start {argv[0]}: {e}")
        self.code = None
        self.cpu = 0.0
        self.done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self):
        _, status, ru = os.wait4(self.pid, 0)
        self.code = os.waitstatus_to_exitcode(status)
        self.cpu = ru.ru_utime + ru.ru_stime
        self.done.set()

    def kill(self):
        if not self.done.is_set():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.done.wait(5)

    def texts(self):
        res = []
        for f in (self.out, self.err):
            f.flush()
            with open(f.name, errors="replace") as r:
                res.append(r.read())
            f.close()
            os.unlink(f.name)
        return res


def tcp_listening(port):
    hexport = f":{port:04X}"
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[1].endswith(hexport) and parts[3] == "0A":
                        return True
        except OSError:
            pass
    return False


def parse_result(text, tag="RESULT"):
    """key=value fields of the last line that starts with tag."""
    lines = [l for l in text.splitlines() if l.startswith(tag + " ")]
    if not lines:
        return None
    return dict(re.findall(r"(\w+)=(\S+)", lines[-1]))


def parse_table(text, header_re, col):
    """The value in column col of the first data line after a header line."""
    lines = text.splitlines()
    for i, l in enumerate(lines):
        if re.search(header_re, l):
            for d in lines[i + 1:]:
                f = d.split()
                if f and re.fullmatch(r"\d+[kmg]?", f[0]) and len(f) > col:
                    return float(f[col])
    return None


class Runner:
    def __init__(self, a, logdir):
        self.a = a
        self.port = a.port
        self.srv_cpu, self.cli_cpu = a.cpus.split(",")
        self.logdir = logdir
        self.log = open(os.path.join(logdir, "runs.log"), "w")
        self.nruns = 0

    def next_port(self):
        # a fresh port per run: no TIME_WAIT or slow listener of the previous run
        self.port += 1
        if self.port > 60000:
            self.port = self.a.port
        return self.port

    def env(self, extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIWARP_")}
        env["DIWARP_PROGRESS"] = "app"
        for k, v in extra.items():
            # None: leave the variable unset (the verbs provider's own default)
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def record(self, label, procs, note=""):
        txt = f"== {label} {note}\n"
        outs = []
        for name, p in procs:
            o, e = p.texts()
            outs.append((o, e))
            txt += (f"  {name} exit {p.code} cpu {p.cpu:.3f}s: {' '.join(p.argv)}\n"
                    f"    stdout: {o.strip()[-1500:]}\n    stderr: {e.strip()[-1500:]}\n")
        self.log.write(txt)
        self.log.flush()
        return outs, txt

    def run_single(self, label, argv, env_extra, timeout, pin="srv"):
        """pin: "srv", "cli", or a CPU list of its own ("0,1")."""
        cpu = self.srv_cpu if pin == "srv" else self.cli_cpu if pin == "cli" else pin
        p = Proc(["taskset", "-c", cpu] + argv, self.env(env_extra), self.logdir)
        self.nruns += 1
        if not p.done.wait(timeout):
            p.kill()
            self.record(label, [("proc", p)], "TIMEOUT")
            raise RunFailed(f"timed out after {timeout} s: {' '.join(argv)}")
        outs, txt = self.record(label, [("proc", p)])
        return p, outs[0][0], outs[0][1], txt

    def run_pair(self, label, server, client, env_extra, timeout, listen=True,
                 pin=None):
        """server/client: argv without taskset; '{port}' is replaced. server
        may also be a list of argvs (several server processes, all started
        before the client; listen then waits for the first one's port only):
        the result's "servers" holds each one's stdout."""
        port = str(self.next_port())
        servers = server if server and isinstance(server[0], list) else [server]
        servers = [[x.replace("{port}", port) for x in sv] for sv in servers]
        client = [x.replace("{port}", port) for x in client]
        scpu, ccpu = pin or (self.srv_cpu, self.cli_cpu)
        env = self.env(env_extra)
        if self.a.verbose:
            envs = " ".join(f"{k}={v}" for k, v in env_extra.items())
            print(f"# {label}: {envs} {' & '.join(' '.join(sv) for sv in servers)} & "
                  f"{' '.join(client)}", file=sys.stderr)
        t_start = time.monotonic()
        ss = []
        try:
            for sv in servers:
                ss.append(Proc(["taskset", "-c", scpu] + sv, env, self.logdir))
        except RunFailed:
            for s in ss:
                s.kill()
            raise
        self.nruns += 1
        if listen:
            deadline = time.monotonic() + 5
            while (not tcp_listening(int(port)) and not ss[0].done.is_set()
                   and time.monotonic() < deadline):
                time.sleep(0.003)
        else:
            time.sleep(0.02 * len(ss))
        c = Proc(["taskset", "-c", ccpu] + client, env, self.logdir)
        note = ""
        deadline = time.monotonic() + timeout
        # whichever ends first; a failure ends the others at once
        while True:
            if c.done.wait(0.005):
                if c.code != 0:
                    for s in ss:
                        s.kill()
                else:
                    for s in ss:
                        if not s.done.wait(max(1.0, min(10.0, deadline - time.monotonic()))):
                            s.kill()
                            note = "SERVER DID NOT EXIT"
                break
            if any(s.done.is_set() and s.code != 0 for s in ss):
                c.kill()
                for s in ss:
                    s.kill()
                break
            if time.monotonic() > deadline:
                c.kill()
                for s in ss:
                    s.kill()
                note = "TIMEOUT"
                break
        note += f" ({time.monotonic() - t_start:.2f} s)"
        names = ["server"] if len(ss) == 1 else [f"server{i}" for i in range(len(ss))]
        procs = list(zip(names, ss)) + [("client", c)]
        outs, txt = self.record(label, procs, note)
        if note.startswith("TIMEOUT"):
            raise RunFailed(f"timed out after {timeout} s\n{txt}")
        if note.startswith("SERVER"):
            raise RunFailed(f"server did not exit after the client\n{txt}")
        for (name, p), (o, _) in zip(procs, outs):
            r = parse_result(o)
            if p.code == 3 and r and r.get("status") == "unsupported":
                raise NotAvailable("the engine answers EOPNOTSUPP")
        if any(s.code != 0 for s in ss) or c.code != 0:
            raise RunFailed(f"exit status server {' '.join(str(s.code) for s in ss)}, "
                            f"client {c.code}\n{txt}")
        return dict(server=outs[0][0], servers=[o for o, _ in outs[:-1]], client=outs[-1][0],
                    cpu=sum(s.cpu for s in ss) + c.cpu, log=txt)


class Topos:
    """The contention group's bottlenecks: bench/netns-topo.sh router
    topologies (A -- R -- B, a tbf on R's egress towards B), made once per
    group and removed by down_all() (the group calls it in a finally: on a
    failure, Ctrl-C or SIGTERM too). Names carry this process's PID, so
    concurrent harnesses never meet; netns-topo.sh records this process as
    their owner, so if it is killed the next `up` or `cleanup` removes them."""

    def __init__(self, script, log):
        self.script, self.log = script, log
        self.made = []

    def _run(self, args, timeout=60):
        try:
            p = subprocess.run([self.script] + args, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"netns-topo.sh {' '.join(args)}: no answer in {timeout} s")
        if args[0] != "stats":  # stats go into the run's own log lines
            self.log.write(f"== netns-topo.sh {' '.join(args)}: exit {p.returncode}\n"
                           f"    stdout: {p.stdout.strip()[-600:]}\n"
                           f"    stderr: {p.stderr.strip()[-600:]}\n")
            self.log.flush()
        return p

    def up(self, name, rate, latency, burst, kind="router"):
        """The TOPO fields; NotAvailable with the script's SKIP reason (not
        root, no namespaces or tbf here), RunFailed on any other error."""
        self.made.append(name)  # `up` records it before building: ours to remove
        p = self._run(["up", name, kind, rate, "--latency", latency, "--burst", burst,
                       "--mtu", str(CONT_MTU)])
        if p.returncode == 77:
            m = re.search(r"SKIP: (.*)", p.stderr)
            raise NotAvailable("netns-topo.sh: " + (m.group(1) if m else "skipped (exit 77)"))
        t = parse_result(p.stdout, "TOPO") if p.returncode == 0 else None
        if not t or not t.get("a") or not t.get("b"):
            raise RunFailed(f"netns-topo.sh up {name} {kind} {rate}: exit {p.returncode}: "
                            f"{(p.stderr or p.stdout).strip()[-600:]}")
        return t

    def stats(self, name):
        """Cumulative counters of the tbf towards B."""
        p = self._run(["stats", name])
        d = parse_result(p.stdout, "STATS")
        if p.returncode != 0 or not d:
            raise RunFailed(f"netns-topo.sh stats {name}: exit {p.returncode}: "
                            f"{p.stderr.strip()[-300:]}")
        return {k: int(v) for k, v in d.items() if v.isdigit()}

    def stats_rails(self, name):
        """A rails topology's tbf counters: {(side, rail): sent_bytes}."""
        p = self._run(["stats", name])
        out = {}
        for ns, rail, sb in re.findall(r"^STATS .* ns=\S+-([AB]) dev=\S+ rail=(\d+) .*"
                                       r"sent_bytes=(\d+) ", p.stdout, re.M):
            out[(ns, int(rail))] = int(sb)
        if p.returncode != 0 or not out:
            raise RunFailed(f"netns-topo.sh stats {name}: exit {p.returncode}: "
                            f"{p.stderr.strip()[-300:]}")
        return out

    def down_all(self):
        while self.made:
            name = self.made.pop()
            try:
                self._run(["down", name])
            except RunFailed as e:
                print(f"run: {e}; remove it with bench/netns-topo.sh down {name}",
                      file=sys.stderr)


def sigterm_interrupts(signum, frame):
    # the contention group's finally removes its topologies; main reports
    raise KeyboardInterrupt


# ---------------------------------------------------------------------------
# cases


def result_of(text, log, want):
    r = parse_result(text)
    if r is None or r.get("status") != "ok":
        raise RunFailed(f"no 'status=ok' RESULT line\n{log}")
    out = {}
    for key in want:
        try:
            v = float(r[key])
        except (KeyError, ValueError):
            raise RunFailed(f"RESULT has no number {key}\n{log}")
        out[key] = v
    return r, out


def positive(v, what, log):
    if v is None or not math.isfinite(v) or v <= 0:
        raise RunFailed(f"{what}: no positive number in the output\n{log}")
    return v


class Case:
    """One stack configuration. Methods return {metric: value} for one run."""

    def __init__(self, name, family, desc, env=None, avail=None, sizes=None, quick=True,
                 only=None, na=None):
        self.name, self.family, self.desc = name, family, desc
        self.quick_groups = None  # with --quick: only these groups (None: all)
        self.env = env or {}
        self.avail = avail        # None, the reason it is not available, or {group: reason}
        # group -> callable(size) -> None or why the stack cannot do that size
        # (a 'not available' row)
        self.sizes = sizes or {}
        # group -> callable(size) -> bool: the sizes this case is compared at
        # (the others are not part of the case: no row)
        self.only = only or {}
        # group -> why the tool has no such measurement ('not available' rows
        # at every size of the group)
        self.na = na or {}
        self.quick = quick
        self.groups = {}

    def avail_for(self, group):
        if group in self.na:
            return self.na[group]
        return self.avail.get(group) if isinstance(self.avail, dict) else self.avail

    def limit(self, group, size):
        f = self.sizes.get(group)
        return f(size) if f else None

    def selected(self, group, size):
        f = self.only.get(group)
        return f(size) if f else True


def build_cases(h):
    """h: Harness (programs, probes, plan)."""
    P, pl, q = h.prog, h.pl, h.a.quick
    cases = []
    T = h.pl["timeout"]

    def cap(limit, why):
        return lambda s: None if s <= limit else why

    # ---- raw sockets -----------------------------------------------------
    def raw(proto):
        def lat(r, size):
            argv = [P["raw-sock"], "--proto", proto, "--mode", "pingpong", "--size",
                    str(size), "--iters", str(lat_iters(size, q)), "--port", "{port}"]
            o = r.run_pair(f"raw-{proto} lat {size}", argv, argv + ["127.0.0.1"], {}, T,
                           listen=proto == "tcp")
            return {"lat_us": result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]}

        def bw(r, size, iters):
            argv = [P["raw-sock"], "--proto", proto, "--mode", "stream", "--size", str(size),
                    "--iters", str(iters), "--port", "{port}"]
            o = r.run_pair(f"raw-{proto} bw {size}x{iters}", argv, argv + ["127.0.0.1"], {}, T,
                           listen=proto == "tcp")
            return result_of(o["client"], o["log"], ["gbps"])[1]["gbps"], o["cpu"]

        def rate(r, size):
            argv = [P["raw-sock"], "--proto", proto, "--mode", "rate", "--size", str(size),
                    "--window", "64", "--iters", str(pl["rate_iters"]), "--port", "{port}"]
            o = r.run_pair(f"raw-{proto} rate", argv, argv + ["127.0.0.1"], {}, T,
                           listen=proto == "tcp")
            return {"msgrate_mps": result_of(o["client"], o["log"], ["mps"])[1]["mps"]}

        c = Case(f"raw-{proto}", "dgram" if proto == "udp" else "stream",
                 f"bench/raw-sock --proto {proto} (busy-polling sockets)")
        c.groups = dict(lat=lat, bw=bw, rate=rate)
        if proto == "udp":
            c.sizes = dict(lat=cap(UDP_MAX, "above one UDP datagram"),
                           bw=cap(UDP_MAX, "above one UDP datagram"))
        return c

    cases += [raw("udp"), raw("tcp")]

    # ---- diwarp native ----------------------------------------------------
    def native(name, family, desc, transport, lat_op, bw_op, env=None, avail=None,
               rate=True, lat=True, sizes=None, quick=True, only=None, at=None):
        env = env or {}

        def do_lat(r, size):
            cli = [P["diwarp-pingpong"], "--transport", transport, "--op", lat_op, "--size",
                   str(size), "--iters", str(lat_iters(size, q)), "--port", "{port}",
                   "127.0.0.1"]
            o = r.run_pair(f"{name} lat {size}", [P["diwarp-pingpong"], "--port", "{port}"],
                           cli, env, T)
            return {"lat_us": result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]}

        def do_bw(r, size, iters):
            cli = [P["diwarp-bw"], "--transport", transport, "--op", bw_op, "--size", str(size),
                   "--iters", str(iters), "--port", "{port}", "127.0.0.1"]
            o = r.run_pair(f"{name} bw {size}x{iters}", [P["diwarp-bw"], "--port", "{port}"],
                           cli, env, T)
            return result_of(o["client"], o["log"], ["gbps"])[1]["gbps"], o["cpu"]

        def do_rate(r, size):
            cli = [P["bench-msgrate"], "--transport", transport, "--size", str(size),
                   "--window", "64", "--iters", str(pl["rate_iters"]), "--port", "{port}",
                   "127.0.0.1"]
            o = r.run_pair(f"{name} rate", [P["bench-msgrate"], "--port", "{port}"], cli, env, T)
            return {"msgrate_mps": result_of(o["client"], o["log"], ["mps"])[1]["mps"]}

        c = Case(name, family, desc, env, avail, sizes, quick, only=at)
        g = {}
        if lat:
            g["lat"] = do_lat
        if bw_op:
            g["bw"] = do_bw
        if rate:
            g["rate"] = do_rate
        if only:
            g = {k: v for k, v in g.items() if k in only}
        c.groups = g
        return c

    ud_sizes = dict(lat=cap(32 * KiB, "above the UD message limit (65 431 B)"),
                    bw=cap(32 * KiB, "above the UD message limit (65 431 B)"))
    cases.append(native("diwarp-ud", "dgram", "diwarp-pingpong / diwarp-bw --transport ud "
                        "(send); bench-msgrate", "ud", "send", "send", sizes=ud_sizes))
    cases.append(native("diwarp-rc", "stream", "--transport rc --op send (MPA/TCP, CRC on)",
                        "rc", "send", "send"))
    cases.append(native("diwarp-rc-write", "stream", "--transport rc --op write (RDMA Write; "
                        "latency: the target polls the last byte)", "rc", "write", "write",
                        rate=False, quick=True))
    cases.append(native("diwarp-rc-write-nocrc", "stream", "as diwarp-rc-write with "
                        "DIWARP_RC_CRC=0", "rc", "write", "write", env={"DIWARP_RC_CRC": "0"},
                        rate=False, lat=False))
    rd_why = {"lat": h.rd_ex_why, "bw": h.rd_ex_why, "rate": h.rd_why}
    cases.append(native("diwarp-rd", "dgram", "--transport rd (reliable datagrams; RDMA "
                        "Write for bandwidth)", "rd", "send", "write", avail=rd_why))
    cases.append(native("diwarp-rd-drop1", "dgram", "diwarp-rd with DIWARP_FAULT=drop:1% "
                        "(goodput under loss, at the size of its target: 1 MiB)", "rd", "send",
                        "write", env={"DIWARP_FAULT": "drop:1%"}, avail=h.rd_ex_why,
                        only=["bw"], at={"bw": lambda s: s == MiB}, quick=False))
    # run by the contention group only (its loopback check), not by bw
    h.extra_cases = [native("diwarp-rd-nocrc", "dgram", "diwarp-rd with DIWARP_RD_CRC=0 on "
                            "both ends (RDMA Write 1 MiB; the contention group's loopback "
                            "check)", "rd", "send", "write", env={"DIWARP_RD_CRC": "0"},
                            avail=h.rd_ex_why, only=["bw"], at={"bw": lambda s: s == MiB},
                            rate=False, lat=False)]
    cases.append(native("diwarp-rc-rd", "stream", "RC QPs over the RD sublayer "
                        "(DIWARP_RC_TRANSPORT=rd): send latency, RDMA Write bandwidth", "rc",
                        "send", "write", env={"DIWARP_RC_TRANSPORT": "rd"}, avail=h.rcrd_why))
    # io_uring: compared with the plain backend at the sizes of the targets
    tgt = {"lat": lambda s: s == 64, "bw": lambda s: s in (32 * KiB, MiB)}
    ud_tgt = {"lat": tgt["lat"], "bw": lambda s: s == 32 * KiB}
    cases.append(native("diwarp-ud-uring", "dgram", "diwarp-ud with DIWARP_IO=uring (64 B, "
                        "32 KiB)", "ud", "send", "send", env={"DIWARP_IO": "uring"},
                        avail=h.uring_why, at=ud_tgt, rate=False, quick=False))
    cases.append(native("diwarp-rc-uring", "stream", "diwarp-rc (latency) and "
                        "diwarp-rc-write (bandwidth) with DIWARP_IO=uring (64 B; 32 KiB, "
                        "1 MiB)", "rc", "send", "write", env={"DIWARP_IO": "uring"},
                        avail=h.uring_why, at=tgt, rate=False, quick=False))
    # the native side of the provider comparison: the provider runs its
    # hybrid progress thread by default, so the native programs run the same;
    # latency with bench-native-pingpong's copy of ib_send_lat's loop
    # (receive reposted on the round trip, inline Sends signaled every 100th)
    thr_env = {"DIWARP_PROGRESS": "thread"}
    thr = native("diwarp-rc-thread", "stream", "RC with DIWARP_PROGRESS=thread, the "
                 "provider's default, for the provider / native ratios: latency "
                 "bench-native-pingpong --loop perftest (ib_send_lat's loop), bandwidth "
                 "diwarp-bw --op write (64 B; 1 MiB)", "rc", "send", "write", env=thr_env,
                 at={"lat": lambda s: s == 64, "bw": lambda s: s == MiB}, rate=False)

    def thr_lat(r, size):
        cli = [P["bench-native-pingpong"], "--size", str(size), "--iters",
               str(lat_iters(size, q)), "--loop", "perftest", "--port", "{port}", "127.0.0.1"]
        o = r.run_pair(f"diwarp-rc-thread lat {size}",
                       [P["bench-native-pingpong"], "--port", "{port}"], cli, thr_env, T)
        return {"lat_us": result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]}

    thr.groups["lat"] = thr_lat
    thr.quick_groups = {"lat"}  # --quick runs no provider bandwidth to compare with
    cases.append(thr)

    # ---- verbs provider: perftest under `diwarp run` -----------------------
    # The provider's own progress default (the hybrid thread) stays in force:
    # perftest's RDMA Write target is passive and makes no verbs call while
    # it is written, so DIWARP_PROGRESS=app would leave it without progress.
    def verbs(name, family, desc, conn, lat_prog, bw_prog, rate_prog=None, env=None,
              avail=None, sizes=None, na=None, quick=True):
        env = dict(env or {}, DIWARP_PROGRESS=None)
        base = ["-d", "diwarp0", "-x", "0", "-F", "-p", "{port}"]
        if conn == "UD":
            base += ["-c", "UD"]

        def run_pt(r, label, prog, args):
            # ib_send_bw connects through rdma_cm (-R): without it perftest
            # 4.5 never frees its iWARP credit MR, ibv_dealloc_pd fails with
            # EBUSY and it exits 1 after its results
            cm = ["-R"] if prog == "ib_send_bw" else []
            argv = [P["diwarp"], "run", "--", P[prog]] + base + cm + args
            return r.run_pair(label, argv, argv + ["127.0.0.1"], env, T)

        def do_lat(r, size):
            o = run_pt(r, f"{name} lat {size}", lat_prog,
                       ["-s", str(size), "-n", str(lat_iters(size, q))])
            v = parse_table(o["client"], r"#bytes\s+#iterations\s+t_min", 5)
            return {"lat_us": positive(v, "t_avg", o["log"])}

        def do_bw(r, size, iters):
            # -t 64: the window of diwarp-bw
            o = run_pt(r, f"{name} bw {size}x{iters}", bw_prog,
                       ["-s", str(size), "-n", str(max(5, iters)), "-t", "64",
                        "--report_gbits"])
            v = parse_table(o["client"], r"#bytes\s+#iterations\s+BW peak", 3)
            return positive(v, "BW average", o["log"]), o["cpu"]

        def do_rate(r, size):
            o = run_pt(r, f"{name} rate", rate_prog,
                       ["-s", str(size), "-t", "64", "-n", str(pl["rate_iters"]),
                        "--report_gbits"])
            v = parse_table(o["client"], r"#bytes\s+#iterations\s+BW peak", 4)
            return {"msgrate_mps": positive(v, "MsgRate", o["log"])}

        # perftest spends about a second per run on its own start-up (it
        # samples the CPU clock): --quick keeps its latency only
        c = Case(name, family, desc, env, avail, sizes, quick=quick, na=na)
        c.quick_groups = {"lat"}
        c.needs = [p for p in (lat_prog, bw_prog, rate_prog) if p]
        c.groups = {}
        if lat_prog:
            c.groups["lat"] = do_lat
        if bw_prog:
            c.groups["bw"] = do_bw
        if rate_prog:
            c.groups["rate"] = do_rate
        return c

    ud_credit = ("perftest 4.5's ib_send_bw -c UD posts RDMA Writes on the UD QP for its "
                 "iWARP credit flow; a UD QP carries Sends only (EINVAL), so it cannot run")
    vud = dict(lat=cap(VERBS_UD_MAX, "perftest UD: one MTU (4096 B) at most"))
    cases.append(verbs("verbs-ud", "dgram", "perftest ib_send_lat -c UD under `diwarp run`",
                       "UD", "ib_send_lat", None, sizes=vud,
                       na={"bw": ud_credit, "rate": ud_credit}, quick=False))
    vrd = ("libibverbs has no reliable-datagram QP type and perftest no RD test; RD is "
           "measured natively (diwarp-rd) and, through the provider, as RC over RD "
           "(verbs-rc-rd)")
    cases.append(verbs("verbs-rd", "dgram", "RD through the verbs provider", "RC", None, None,
                       na={"lat": vrd, "bw": vrd, "rate": vrd}))
    cases.append(verbs("verbs-rc", "stream", "perftest ib_send_lat, ib_send_bw -R (rdma_cm) "
                       "under `diwarp run`", "RC", "ib_send_lat", "ib_send_bw",
                       rate_prog="ib_send_bw"))
    cases.append(verbs("verbs-rc-write", "stream", "perftest ib_write_bw (RC) under "
                       "`diwarp run`", "RC", None, "ib_write_bw"))
    cases.append(verbs("verbs-rc-rd", "stream", "perftest ib_send_lat, ib_write_bw, "
                       "ib_send_bw -R with DIWARP_RC_TRANSPORT=rd", "RC", "ib_send_lat",
                       "ib_write_bw", rate_prog="ib_send_bw",
                       env={"DIWARP_RC_TRANSPORT": "rd"},
                       avail=h.rcrd_why or {"rate": h.rcrd_cm_why}, quick=False))

    # ---- libfabric fi_pingpong ---------------------------------------------
    def fabric(name, family, prov, ep, sizes=None):
        def do_lat(r, size):
            # rxd's first exchanges set up its reliability state: not too few
            n = max(500 if q else 1000, lat_iters(size, q)) if size <= 4 * KiB \
                else lat_iters(size, q)
            if "rxd" in prov and size >= 32 * KiB:
                # rxd takes tens of ms per MiB each way: 16 MiB per run keeps
                # a run near a second
                n = min(n, max(10, 16 * MiB // size))
            args = ["fi_pingpong", "-p", prov, "-e", ep, "-I", str(n), "-S", str(size)]
            o = r.run_pair(f"{name} lat {size}", [P["fi_pingpong"]] + args[1:] + ["-B", "{port}"],
                           [P["fi_pingpong"]] + args[1:] + ["-P", "{port}", "127.0.0.1"], {}, T)
            v = parse_table(o["client"], r"bytes\s+#sent\s+#ack", 6)
            return {"lat_us": positive(v, "usec/xfer", o["log"])}

        pp = ("libfabric-bin has fi_pingpong only: a ping-pong, no streaming or "
              "message-rate tool")
        c = Case(name, family, f"fi_pingpong -p '{prov}' -e {ep} (libfabric-bin)",
                 sizes=sizes, na={"bw": pp, "rate": pp})
        c.needs = ["fi_pingpong"]
        c.groups = dict(lat=do_lat)
        return c

    cases.append(fabric("fi-tcp", "stream", "tcp", "msg"))
    cases.append(fabric("fi-udp", "dgram", "udp", "dgram",
                        sizes=dict(lat=cap(FI_DGRAM_MAX, "udp dgram: 1472 B at most"))))
    cases.append(fabric("fi-rxd", "dgram", "udp;ofi_rxd", "rdm"))
    return cases


# ---------------------------------------------------------------------------
# results


class Point:
    def __init__(self):
        self.vals = []
        self.status = "ok"
        self.reason = ""
        self.extra = {}


def stats(vals):
    return statistics.median(vals), min(vals), max(vals)


def fmt(v):
    if v is None:
        return ""
    a = abs(v)
    if v == int(v) and a < 1e7:
        return str(int(v))
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 0.01:
        return f"{v:.3f}"
    return f"{v:.3g}"


def size_name(s):
    if s >= MiB and s % MiB == 0:
        return f"{s // MiB} MiB"
    if s >= KiB and s % KiB == 0:
        return f"{s // KiB} KiB"
    return f"{s} B"


class Harness:
    GROUPS = ["lat", "bw", "rate", "mq", "reg", "reuse", "progress", "mem", "idle",
              "contention", "mpi", "mvapich", "credits", "daemon", "multirail", "shared"]

    def __init__(self, a):
        self.a = a
        self.pl = plan(a.quick)
        if a.runs:
            self.pl["runs"] = self.pl["seed_runs"] = self.pl["cont_runs"] = a.runs
        if a.timeout:
            self.pl["timeout"] = a.timeout
        self.points = {}      # (case, metric, size) -> Point
        self.order = []       # keys in insertion order
        self.notes = []       # (case, group, status, reason)
        self.failures = []
        self.missing = []
        self.cpu_dropped = 0
        self.group_time = {}  # group -> wall seconds
        self.cur_group = None
        # contention: case -> its raw TCP baseline case, rows in display
        # order, case -> (rate, burst) of its bottleneck, the default TCP
        # congestion control the runs reported
        self.cont_base = {}
        self.cont_order = []
        self.cont_link = {}
        self.cont_tcp_cc = set()
        self.cont_slow = None  # (rd-4rx case, rd-slowrx case) once the slow receiver ran
        self.extra_cases = []

    # ---- bookkeeping
    def pt(self, case, metric, size):
        k = (case, metric, size)
        if k not in self.points:
            self.points[k] = Point()
            self.order.append(k)
        return self.points[k]

    def note(self, case, group, status, reason):
        self.notes.append((case, group, status, reason))

    def fail_point(self, keys, reason):
        first = reason.strip().splitlines()[0] if reason.strip() else "failed"
        for k in keys:
            p = self.pt(*k)
            p.status, p.reason, p.vals = "failed", first, []
        self.failures.append((keys[0][0], keys[0][1], keys[0][2], reason))
        print(f"run: FAILED {keys[0][0]} {keys[0][1]} size {keys[0][2]}: {first}",
              file=sys.stderr)

    # ---- programs
    def find_programs(self):
        a = self.a
        missing = []
        for tool, pkg in (("taskset", "util-linux"), ("gnuplot", "gnuplot-nox")):
            if not shutil.which(tool):
                missing.append(f"{tool} (Debian package {pkg})")
        prog = {}
        own = [("diwarp-pingpong", "examples"), ("diwarp-bw", "examples"), ("raw-sock", "bench"),
               ("bench-msgrate", "bench"), ("bench-multiqp", "bench"), ("bench-reuse", "bench"),
               ("bench-overlap", "bench"), ("bench-mempeer", "bench"), ("bench-regcost", "bench"),
               ("bench-probe", "bench"), ("bench-native-pingpong", "bench"),
               ("bench-flows", "bench"), ("bench-credits", "bench"),
               ("diwarp", "tools"), ("diwarpd", "daemon")]
        for name, sub in own:
            p = os.path.join(a.build, sub, name)
            if not (os.path.isfile(p) and os.access(p, os.X_OK)):
                missing.append(f"{p} (build first: meson setup {a.build} --buildtype=release "
                               f"-Dtests=false && ninja -C {a.build})")
            prog[name] = os.path.abspath(p)
        if missing:
            for m in missing:
                print(f"run: missing program: {m}", file=sys.stderr)
            sys.exit(2)
        for tool, pkg in (("ib_send_lat", "perftest"), ("ib_send_bw", "perftest"),
                          ("ib_write_bw", "perftest"), ("fi_pingpong", "libfabric-bin")):
            w = shutil.which(tool)
            if w:
                prog[tool] = w
            else:
                self.missing.append(f"{tool} (Debian package {pkg})")
        if self.missing and not a.allow_missing:
            for m in self.missing:
                print(f"run: missing program: {m} (tools/setup.sh installs it; "
                      f"--allow-missing reports its cases as 'missing')", file=sys.stderr)
            sys.exit(2)
        self.prog = prog

    # ---- probes: what the engine offers now
    def probes(self, r):
        def probe(mode, env, extra=()):
            p, out, err, txt = r.run_single(f"probe {mode} {env}",
                                            [self.prog["bench-probe"], "--mode", mode] +
                                            list(extra), env, 30)
            return p.code, parse_result(out) or {}, err.strip()

        code, res, err = probe("rd", {})
        if code == 3:
            self.rd_why = "the engine answers EOPNOTSUPP for RD QPs (libdiwarp/rel is in progress)"
        elif code != 0:
            self.rd_why = "bench-probe --mode rd failed (see Failures)"
            self.failures.append(("diwarp-rd", "probe", 0, f"bench-probe --mode rd: exit "
                                  f"{code}: {err[-600:]}"))
        else:
            self.rd_why = None
        # latency and bandwidth of RD go through the examples: they must speak
        # --transport rd too (bench-msgrate and bench-mempeer do)
        self.rd_ex_why = self.rd_why
        if self.rd_why is None:
            h = subprocess.run([self.prog["diwarp-pingpong"], "--help"], capture_output=True,
                               text=True)
            if not re.search(r"\|rd\b", h.stdout + h.stderr):
                self.rd_ex_why = ("RD QPs exist, but examples/diwarp-pingpong and diwarp-bw "
                                  "have no --transport rd yet")
        code, res, err = probe("rc-rd", {"DIWARP_RC_TRANSPORT": "rd"})
        if code == 0:
            self.rcrd_why = None
        elif code == 3:
            self.rcrd_why = "DIWARP_RC_TRANSPORT=rd: the engine answers EOPNOTSUPP"
        elif code == 4:
            self.rcrd_why = ("DIWARP_RC_TRANSPORT=rd is accepted but ignored: the probe's RC "
                             f"QPs still used {res.get('tcp_connections', '?')} TCP connections")
        else:
            self.rcrd_why = "DIWARP_RC_TRANSPORT=rd: bench-probe --mode rc-rd failed (see Failures)"
            self.failures.append(("diwarp-rc-rd", "probe", 0, f"bench-probe --mode rc-rd: "
                                  f"exit {code}: {err[-600:]}"))
        # the provider's message rate for RC over RD needs ib_send_bw through
        # rdma_cm (see verbs()): ask once whether that connects
        self.rcrd_cm_why = None
        if (self.rcrd_why is None and not self.a.quick and "ib_send_bw" in self.prog
                and self.want_group("rate") and self.want_case("verbs-rc-rd")):
            argv = [self.prog["diwarp"], "run", "--", self.prog["ib_send_bw"], "-d", "diwarp0",
                    "-F", "-p", "{port}", "-R", "-s", "8", "-n", "10"]
            try:
                r.run_pair("probe rdma_cm with DIWARP_RC_TRANSPORT=rd", argv,
                           argv + ["127.0.0.1"],
                           {"DIWARP_RC_TRANSPORT": "rd", "DIWARP_PROGRESS": None}, 30)
            except (RunFailed, NotAvailable) as e:
                m = re.search(r"Unexpected CM event\D*(\d+)", str(e))
                # rdma_cma.h's enum rdma_cm_event_type, as far as a connect goes
                names = ["ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR",
                         "CONNECT_REQUEST", "CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE",
                         "REJECTED", "ESTABLISHED"]
                if m and int(m.group(1)) < len(names):
                    got = f"the client gets RDMA_CM_EVENT_{names[int(m.group(1))]}"
                else:
                    got = str(e).strip().splitlines()[0]
                self.rcrd_cm_why = (
                    "rdma_cm does not connect RC QPs with DIWARP_RC_TRANSPORT=rd "
                    f"(ib_send_bw -R: {got}; RC over RD is set up by the IB-style RTR), and "
                    "ib_send_bw without -R exits 1 (perftest 4.5 leaks its iWARP credit MR)")
        code, res, err = probe("idle-cpu", {"DIWARP_IO": "uring"}, ["--duration-ms", "10"])
        self.uring_why = None if code == 0 else (
            f"DIWARP_IO=uring: device open fails ({err[-200:] or 'exit %d' % code}); "
            "the io_uring backend needs liburing at build time")

    # ---- measurement loops
    # mpi, mvapich: minutes of mpirun start-ups; multirail: minutes of rate-limited
    # transfers (and root): only when named in --groups
    OPT_IN = {"mpi", "mvapich", "multirail", "shared"}

    # --quick without --groups: the smoke run of the transports alone (latency,
    # bandwidth, message rate), so that it ends within 90 s; the other groups
    # run in quick mode when named.
    QUICK_GROUPS = {"lat", "bw", "rate"}

    def want_group(self, g):
        if g in self.OPT_IN:
            return g in self.a.groups
        if self.a.quick and not self.a.groups:
            return g in self.QUICK_GROUPS
        return not self.a.groups or g in self.a.groups

    def want_case(self, name):
        if not self.a.cases:
            return True
        return any(fnmatch.fnmatch(name, pat) for pat in self.a.cases)

    def run_core(self, r, cases):
        """lat, bw (+cpu), rate: points interleaved round by round."""
        pl = self.pl
        groups = [("lat", "lat_us", pl["lat_sizes"]), ("bw", "bw_gbps", pl["bw_sizes"]),
                  ("rate", "msgrate_mps", [8])]
        for g, metric, sizes in groups:
            if not self.want_group(g):
                continue
            self.mark_group(g)
            metrics = [metric] + (["cpu_s_per_gb"] if g == "bw" else [])

            def mark(c, s, status, why):
                for m in metrics:
                    p = self.pt(c.name, m, s)
                    p.status, p.reason = status, why

            active = []
            for c in cases:
                if (g not in c.groups and g not in c.na) or not self.want_case(c.name):
                    continue
                if self.a.quick and (not c.quick or (c.quick_groups and
                                                     g not in c.quick_groups)):
                    continue
                mine = [s for s in sizes if c.selected(g, s) and not self.quick_skip(c, g, s)]
                why = c.avail_for(g)
                if why:
                    self.note(c.name, g, "not available", why)
                    for s in mine:
                        mark(c, s, "n/a", c.limit(g, s) or why)
                    continue
                # sizes the stack cannot carry: 'not available' rows, not gaps
                for s in mine:
                    if c.limit(g, s):
                        mark(c, s, "n/a", c.limit(g, s))
                need = [n for n in getattr(c, "needs", []) if n not in self.prog]
                if need:
                    self.note(c.name, g, "missing", ", ".join(need) + " not installed")
                    for s in mine:
                        if not c.limit(g, s):
                            mark(c, s, "missing", ", ".join(need) + " not installed")
                    continue
                active.append(c)
            broken = set()
            for s in sizes:
                pending_cases = []
                for c in active:
                    if (c.limit(g, s) or not c.selected(g, s) or self.quick_skip(c, g, s)):
                        continue
                    if c.name in broken:
                        mark(c, s, "skipped", "failed at a smaller size")
                        continue
                    pending_cases.append(c)
                # bandwidth: one short run per point first, for the setup CPU
                iters = bw_iters(s, pl) if g == "bw" else None
                short = max(5, iters // 8) if iters else None
                setup_cpu = {}
                for rnd in range(pl["runs"]):
                    for c in list(pending_cases):
                        keys = [(c.name, metric, s)] + ([(c.name, "cpu_s_per_gb", s)]
                                                        if g == "bw" else [])
                        try:
                            if g == "bw":
                                if c.name not in setup_cpu:
                                    setup_cpu[c.name] = c.groups[g](r, s, short)[1]
                                gbps, cpu = c.groups[g](r, s, iters)
                                self.pt(c.name, metric, s).vals.append(gbps)
                                gb = (iters - short) * s / 1e9
                                # a transfer whose CPU time does not clearly exceed
                                # the short run's is not separable from setup noise:
                                # that run gives no CPU number (never a made-up one)
                                if cpu > 1.05 * setup_cpu[c.name]:
                                    cpg = (cpu - setup_cpu[c.name]) / gb
                                    self.pt(c.name, "cpu_s_per_gb", s).vals.append(cpg)
                                else:
                                    self.cpu_dropped += 1
                            else:
                                res = c.groups[g](r, s)
                                for m, v in res.items():
                                    self.pt(c.name, m, s).vals.append(positive(v, m, ""))
                        except NotAvailable as e:
                            for k in keys:
                                p = self.pt(*k)
                                p.status, p.reason, p.vals = "n/a", str(e), []
                            pending_cases.remove(c)
                        except RunFailed as e:
                            self.fail_point(keys, str(e))
                            broken.add(c.name)
                            pending_cases.remove(c)
                    self.progress_line(g, s, rnd)
                if g == "bw":
                    for c in pending_cases:
                        p = self.pt(c.name, "cpu_s_per_gb", s)
                        if p.status == "ok" and not p.vals:
                            p.status, p.reason = "n/a", ("no run moved enough bytes to tell "
                                                         "the transfer's CPU from setup noise")

    def quick_skip(self, c, g, s):
        """--quick measures stream cases' bandwidth at 1 MiB only (the
        targets), datagram cases' at 32 KiB and 1 MiB (as far as they go);
        raw-tcp, the baseline, at both."""
        return (self.a.quick and g == "bw" and c.family == "stream" and c.name != "raw-tcp"
                and s < MiB)

    def mark_group(self, g):
        """Ends the wall-clock account of the group running so far, starts g's
        (None: ends only). The report lists them: the budget of a full run."""
        now = time.monotonic()
        if self.cur_group:
            name, t = self.cur_group
            self.group_time[name] = self.group_time.get(name, 0.0) + now - t
        self.cur_group = (g, now) if g and self.want_group(g) else None

    def progress_line(self, g, s, rnd):
        el = time.monotonic() - self.t0
        n = self.pl["runs"] if g in ("lat", "bw", "rate") else self.pl["seed_runs"]
        print(f"run: {g} {size_name(s) if s else ''} round {rnd + 1}/{n} "
              f"({el:.0f} s)", file=sys.stderr)

    def repeat(self, keys_fn, fn, label):
        """Runs fn() --runs times; fn returns {(case, metric, size): value}."""
        for rnd in range(self.pl["seed_runs"]):
            try:
                res = fn()
            except NotAvailable as e:
                for k in keys_fn():
                    p = self.pt(*k)
                    p.status, p.reason, p.vals = "n/a", str(e), []
                return False
            except RunFailed as e:
                self.fail_point(keys_fn(), str(e))
                return False
            for k, v in res.items():
                self.pt(*k).vals.append(v)
        return True

    def run_seed(self, r):
        pl, P, T = self.pl, self.prog, self.pl["timeout"]
        # --- multi-QP normalized latency and aggregate throughput
        self.mark_group("mq")
        if self.want_group("mq"):
            # RD joins when the engine has it (full runs; --quick keeps RC and UD)
            for tr in ("rc", "ud") + (() if self.a.quick else ("rd",)):
                name = f"diwarp-{tr}"
                if not self.want_case(name):
                    continue
                if tr == "rd" and self.rd_why:
                    for k in pl["mq_k"]:
                        p = self.pt(name, "mq_lat_us", k)
                        p.status, p.reason = "n/a", self.rd_why
                    continue
                broken = False
                for k in pl["mq_k"]:
                    if broken:
                        for m in ("mq_lat_us", "mq_bw_gbps", "mq_jain"):
                            p = self.pt(name, m, k)
                            p.status, p.reason = "skipped", "failed at fewer QPs"
                        continue

                    def lat(k=k, tr=tr, name=name):
                        cli = [P["bench-multiqp"], "--mode", "lat", "--transport", tr, "--qps",
                               str(k), "--size", str(pl["mq_lat_size"]), "--iters",
                               str(max(50, pl["mq_iters"] // k)), "--port", "{port}", "127.0.0.1"]
                        o = r.run_pair(f"{name} mq lat k={k}",
                                       [P["bench-multiqp"], "--port", "{port}"], cli, {}, T)
                        v = result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]
                        return {(name, "mq_lat_us", k): positive(v, "lat_us", o["log"])}

                    def bw(k=k, tr=tr, name=name):
                        cli = [P["bench-multiqp"], "--mode", "bw", "--transport", tr, "--qps",
                               str(k), "--size", str(pl["mq_bw_size"]), "--window", "16",
                               "--duration-ms", str(pl["mq_ms"]), "--bidir", "--port", "{port}",
                               "127.0.0.1"]
                        o = r.run_pair(f"{name} mq bw k={k}",
                                       [P["bench-multiqp"], "--port", "{port}"], cli, {}, T)
                        _, v = result_of(o["client"], o["log"], ["gbps", "jain"])
                        return {(name, "mq_bw_gbps", k): positive(v["gbps"], "gbps", o["log"]),
                                (name, "mq_jain", k): positive(v["jain"], "jain", o["log"])}

                    ok1 = self.repeat(lambda: [(name, "mq_lat_us", k)], lat, "mq lat")
                    ok2 = self.repeat(lambda: [(name, "mq_bw_gbps", k), (name, "mq_jain", k)],
                                      bw, "mq bw")
                    broken = not (ok1 and ok2)
                    self.progress_line(f"multi-QP {tr} k={k}", 0, self.pl["seed_runs"] - 1)
        # --- registration cost
        self.mark_group("reg")
        if self.want_group("reg") and self.want_case("diwarp"):
            sizes = pl["reg_sizes"]

            def reg():
                p, out, err, txt = r.run_single(
                    "regcost", [P["bench-regcost"], "--reps", str(pl["reg_reps"])] +
                    [str(s) for s in sizes], {}, T)
                if p.code != 0:
                    raise RunFailed(f"bench-regcost exit {p.code}\n{txt}")
                res = {}
                for line in out.splitlines():
                    if not line.startswith("RESULT"):
                        continue
                    d = dict(re.findall(r"(\w+)=(\S+)", line))
                    if d.get("status") != "ok":
                        raise RunFailed(f"bench-regcost: {line}\n{txt}")
                    s = int(d["size"])
                    for m in ("reg_us", "dereg_us", "regdereg_us", "cold_reg_us",
                              "cold_dereg_us"):
                        res[("diwarp", m, s)] = positive(float(d[m]), m, txt)
                if len({k[2] for k in res}) != len(sizes):
                    raise RunFailed(f"bench-regcost: a size is missing\n{txt}")
                return res

            self.repeat(lambda: [("diwarp", "regdereg_us", s) for s in sizes], reg, "reg")
            self.progress_line("registration", 0, self.pl["seed_runs"] - 1)
        # --- buffer reuse
        self.mark_group("reuse")
        if self.want_group("reuse"):
            for tr in ("rc", "ud"):
                name = f"diwarp-{tr}"
                if not self.want_case(name):
                    continue
                for s in pl["reuse_sizes"]:
                    if tr == "ud" and s > 32 * KiB:
                        continue

                    def reuse(s=s, tr=tr, name=name):
                        it = max(50, min(pl["reuse_iters"], (64 * MiB) // max(s, 1)))
                        cli = [P["bench-reuse"], "--transport", tr, "--size", str(s), "--iters",
                               str(it), "--pool", str(pl["reuse_pool"]), "--port", "{port}",
                               "127.0.0.1"]
                        o = r.run_pair(f"{name} reuse {s}", [P["bench-reuse"], "--port",
                                                             "{port}"], cli, {}, T)
                        _, v = result_of(o["client"], o["log"],
                                         ["lat_full_us", "lat_half_us", "lat_none_us", "ratio"])
                        return {(name, "reuse_full_us", s): positive(v["lat_full_us"], "", ""),
                                (name, "reuse_half_us", s): positive(v["lat_half_us"], "", ""),
                                (name, "reuse_none_us", s): positive(v["lat_none_us"], "", ""),
                                (name, "reuse_ratio", s): positive(v["ratio"], "", "")}

                    self.repeat(lambda: [(name, "reuse_ratio", s)], reuse, "reuse")
                self.progress_line(f"buffer reuse {tr}", 0, self.pl["seed_runs"] - 1)
        # --- overlap and independent progress, RC RDMA Read
        self.mark_group("progress")
        if self.want_group("progress") and self.want_case("diwarp-rc"):
            s = pl["ov_size"]
            for prog_mode in ("app", "thread"):
                name = f"diwarp-rc-{prog_mode}"
                env = {"DIWARP_PROGRESS": prog_mode}
                block = ["--block"] if prog_mode == "thread" else []
                for mode, metrics in (("progress", ("progress_ratio", "ratio")),
                                      ("overlap", ("overlap_ratio", "overlap"))):
                    def ov(mode=mode, metrics=metrics, name=name, env=env, block=block):
                        # both may use both cores; the main threads are pinned
                        # apart after the device is open (--cpu), so a progress
                        # thread can run beside them
                        srv = [P["bench-overlap"], "--cpu", self.r.srv_cpu, "--port", "{port}"]
                        cli = [P["bench-overlap"], "--mode", mode, "--op", "read", "--size",
                               str(s), "--reps", str(pl["ov_reps"]), "--cpu", self.r.cli_cpu,
                               "--port", "{port}", "127.0.0.1"] + block
                        both = f"{self.r.srv_cpu},{self.r.cli_cpu}"
                        o = r.run_pair(f"{name} {mode}", srv, cli, env, T, pin=(both, both))
                        rr, v = result_of(o["client"], o["log"], [metrics[1]])
                        res = {(name, metrics[0], s): v[metrics[1]]}
                        if mode == "progress":
                            res[(name, "progress_t0_us", s)] = float(rr["t0_us"])
                            res[(name, "progress_tD_us", s)] = float(rr["tD_us"])
                        else:
                            res[(name, "overlap_l0_us", s)] = float(rr["l0_us"])
                        if not math.isfinite(v[metrics[1]]):
                            raise RunFailed(f"{metrics[1]} is not a number\n{o['log']}")
                        return res

                    self.repeat(lambda: [(name, metrics[0], s)], ov, mode)
                self.progress_line(f"overlap/progress {prog_mode}", 0, self.pl["seed_runs"] - 1)
        # --- memory per peer
        self.mark_group("mem")
        if self.want_group("mem"):
            for tr in ("ud", "rd", "rc"):
                name = f"diwarp-{tr}"
                if not self.want_case(name):
                    continue
                broken = None
                for n in pl["mem_peers"]:
                    if broken:
                        p = self.pt(name, "mem_per_peer_b", n)
                        p.status, p.reason = broken
                        continue

                    def mem(n=n, tr=tr, name=name):
                        cli = [P["bench-mempeer"], "--transport", tr, "--qps", str(n),
                               "--port", "{port}", "127.0.0.1"]
                        o = r.run_pair(f"{name} mem {n}", [P["bench-mempeer"], "--port",
                                                           "{port}"], cli, {}, T)
                        rr, v = result_of(o["client"], o["log"],
                                          ["per_peer_b", "rss_per_peer_b", "kern_per_peer_b",
                                           "udp_sockets", "tcp_sockets"])
                        return {(name, "mem_per_peer_b", n): v["per_peer_b"],
                                (name, "mem_rss_per_peer_b", n): v["rss_per_peer_b"],
                                (name, "mem_kern_per_peer_b", n): v["kern_per_peer_b"],
                                (name, "mem_udp_sockets", n): v["udp_sockets"],
                                (name, "mem_tcp_sockets", n): v["tcp_sockets"]}

                    if tr == "rd" and self.rd_why:
                        p = self.pt(name, "mem_per_peer_b", n)
                        p.status, p.reason = "n/a", self.rd_why
                        continue
                    ok = self.repeat(lambda: [(name, "mem_per_peer_b", n)], mem, "mem")
                    if not ok:
                        p = self.pt(name, "mem_per_peer_b", n)
                        broken = ("skipped" if p.status == "failed" else p.status,
                                  "failed with fewer peers" if p.status == "failed" else p.reason)
                self.progress_line(f"memory per peer {tr}", 0, self.pl["seed_runs"] - 1)
        # --- idle CPU of the progress thread
        self.mark_group("idle")
        if self.want_group("idle") and self.want_case("diwarp-rc"):
            def idle():
                p, out, err, txt = r.run_single(
                    "idle-cpu", [P["bench-probe"], "--mode", "idle-cpu", "--duration-ms",
                                 str(pl["idle_ms"])], {"DIWARP_PROGRESS": "thread"}, T)
                rr = parse_result(out) or {}
                if p.code != 0 or rr.get("status") != "ok":
                    raise RunFailed(f"bench-probe idle-cpu failed\n{txt}")
                if int(rr.get("threads", "1")) < 2:
                    raise RunFailed(f"DIWARP_PROGRESS=thread started no thread\n{txt}")
                return {("diwarp-thread", "idle_cpu_pct", 0): float(rr["idle_cpu_pct"])}

            self.repeat(lambda: [("diwarp-thread", "idle_cpu_pct", 0)], idle, "idle")

    # ---- contention: RD congestion control against raw TCP through a bottleneck
    CONT_METRICS = ("cont_gbps", "cont_link_frac", "cont_retx_pct", "cont_dup_pct",
                    "cont_jain", "cont_min_msgs", "cont_tbf_dropped", "cont_tbf_drop_pct",
                    "cont_tbf_overlimits", "cont_tbf_frame_b")

    def cont_cases(self, first_link):
        """(kind, bench-flows client options ({n}: N), env, why not available,
        the N it runs at (None: every N)) at one bottleneck."""
        pl = self.pl
        w = ["--op", "write", "--devices", "{n}"]
        c = [("rd", ["--transport", "rd"] + w, {}, self.rd_why, None)]
        if first_link:
            c += [("rc-rd", ["--transport", "rc"] + w, {"DIWARP_RC_TRANSPORT": "rd"},
                   self.rcrd_why, pl["cont_rcrd_n"]),
                  ("rd-incast", ["--transport", "rd"] + w + ["--server-qps", "1"], {},
                   self.rd_why, [8])]
        c += [("tcp", ["--transport", "tcp"], {}, None, None),
              ("tcp-cubic", ["--transport", "tcp", "--tcp-cc", "cubic"], {}, None, None)]
        return c

    def run_contention(self, r):
        self.mark_group("contention")
        if not self.want_group("contention"):
            return
        topos = Topos(os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns-topo.sh"),
                      r.log)
        old = signal.signal(signal.SIGTERM, sigterm_interrupts)
        try:
            self.cont_bottleneck(r, topos)
            self.cont_loopback(r)
        finally:
            topos.down_all()
            signal.signal(signal.SIGTERM, old)

    def cont_bottleneck(self, r, topos):
        pl = self.pl
        for li, (rate, burst) in enumerate(pl["cont_links"]):
            cases = [(f"{k}@{rate}",) + tuple(rest) for k, *rest in self.cont_cases(li == 0)]
            cases = [c for c in cases if self.want_case(c[0])]
            for name, *_ in cases:
                self.cont_order.append(name)
                self.cont_link[name] = (rate, burst)
                if not name.startswith("tcp"):
                    self.cont_base[name] = f"tcp@{rate}"
            self.cont_base[f"tcp-cubic@{rate}"] = f"tcp@{rate}"
            if not cases and not (li == 0 and any(self.want_case(f"{k}@{rate}")
                                                  for k in ("rd-4rx", "rd-slowrx"))):
                continue

            def mark(name, ns, status, why):
                # the goodput row says why; any other metric that has
                # numbers from an earlier round loses them
                for n in ns:
                    for m in self.CONT_METRICS:
                        if m == "cont_gbps" or (name, m, n) in self.points:
                            p = self.pt(name, m, n)
                            p.status, p.reason, p.vals = status, why, []

            def ns_of(c):
                return [n for n in pl["cont_n"] if c[4] is None or n in c[4]]

            try:
                t = topos.up(f"ct{os.getpid()}_{rate}", rate, pl["cont_latency"], burst)
            except (NotAvailable, RunFailed) as e:
                st = "n/a" if isinstance(e, NotAvailable) else "failed"
                first = str(e).strip().splitlines()[0]
                for c in cases:
                    mark(c[0], ns_of(c), st, first)
                if st == "failed":
                    self.failures.append((cases[0][0], "cont_gbps", 0, str(e)))
                print(f"run: contention {rate}: {first}", file=sys.stderr)
                continue
            active = []
            for c in cases:
                if c[3]:
                    mark(c[0], ns_of(c), "n/a", c[3])
                else:
                    active.append(c)
            broken = set()
            for n in pl["cont_n"]:
                pending = []
                for c in active:
                    if n not in ns_of(c):
                        continue
                    if c[0] in broken:
                        mark(c[0], [n], "skipped", "failed with fewer flows")
                        continue
                    pending.append(c)
                dur = cont_duration_ms(pl, rate, n)
                for rnd in range(pl["cont_runs"]):
                    for c in list(pending):
                        name, args, env = c[0], c[1], c[2]
                        try:
                            res = self.cont_run(r, topos, t, name, n, args, env, dur)
                            for m, v in res.items():
                                self.pt(name, m, n).vals.append(v)
                        except NotAvailable as e:
                            mark(name, [x for x in ns_of(c) if x >= n], "n/a", str(e))
                            pending.remove(c)
                            active.remove(c)
                        except RunFailed as e:
                            self.fail_point([(name, m, n) for m in self.CONT_METRICS], str(e))
                            broken.add(name)
                            pending.remove(c)
                    print(f"run: contention {rate} N={n} round {rnd + 1}/{pl['cont_runs']} "
                          f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)
            if li == 0:
                self.cont_slowrx(r, topos, t, rate)

    def cont_run(self, r, topos, t, name, n, args, env, dur):
        """One bench-flows run through topology t; the tbf's counters around it."""
        exe = [topos.script, "exec", t["name"]]
        flows = self.prog["bench-flows"]
        srv = exe + ["B", flows, "--addr", t["b"], "--cpu", r.srv_cpu, "--port", "{port}"]
        cli = (exe + ["A", flows, "--addr", t["a"], "--cpu", r.cli_cpu, "--port", "{port}",
                      "--flows", str(n), "--size", str(CONT_SIZE),
                      "--duration-ms", str(dur), "--warmup-ms", str(self.pl["cont_warm_ms"])] +
               [x.replace("{n}", str(n)) for x in args] + [t["b"]])
        before = topos.stats(t["name"])
        r.next_port()  # the tcp flows use port + 1: the next run's port is above it
        # the server listens inside B: /proc/net/tcp here cannot see it (the
        # client retries its connect for 10 s)
        o = r.run_pair(f"contention {name} N={n}", srv, cli, env, self.pl["timeout"],
                       listen=False)
        after = topos.stats(t["name"])
        res, v = result_of(o["client"], o["log"], ["gbps", "jain", "retx_pct"])
        flows_out = re.findall(r"^FLOW \d+ .*", o["client"], re.M)
        msgs = [int(m) for m in re.findall(r"\bmsgs=(\d+)", "\n".join(flows_out))]
        d = {k: after.get(k, 0) - before.get(k, 0)
             for k in ("dropped", "overlimits", "sent_pkts", "sent_bytes")}
        r.log.write(f"    tbf {t['rate']} (delta over the run): dropped={d['dropped']} "
                    f"overlimits={d['overlimits']} sent_pkts={d['sent_pkts']} "
                    f"sent_bytes={d['sent_bytes']} backlog_pkts={after.get('backlog_pkts')}\n"
                    + "".join(f"    {f}\n" for f in flows_out))
        r.log.flush()
        if len(msgs) != n:
            raise RunFailed(f"{len(msgs)} FLOW lines for {n} flows\n{o['log']}")
        if d["sent_pkts"] <= 0:
            raise RunFailed(f"nothing went through the bottleneck's tbf\n{o['log']}")
        if name.startswith("tcp-cubic") and res.get("tcp_cc") != "cubic":
            raise RunFailed(f"--tcp-cc cubic: the run reports tcp_cc={res.get('tcp_cc')}\n"
                            f"{o['log']}")
        if name.startswith("tcp@"):
            self.cont_tcp_cc.add(res.get("tcp_cc", "?"))
        if name.startswith("rc-rd") and res.get("rc_transport") != "rd":
            raise RunFailed(f"RC over RD: the run reports rc_transport="
                            f"{res.get('rc_transport')}\n{o['log']}")
        out = {"cont_gbps": v["gbps"],
               "cont_link_frac": v["gbps"] / rate_gbps(t["rate"]),
               "cont_retx_pct": v["retx_pct"]}
        if not name.startswith("tcp"):
            # duplicates the server received: retransmissions that were not needed
            _, dup = result_of(o["client"], o["log"], ["srv_dup", "sent_dgrams"])
            out["cont_dup_pct"] = 100.0 * dup["srv_dup"] / max(dup["sent_dgrams"], 1)
        return dict(out, **{
                "cont_jain": v["jain"],
                "cont_min_msgs": float(min(msgs)),
                "cont_tbf_dropped": float(d["dropped"]),
                "cont_tbf_drop_pct": 100.0 * d["dropped"] / (d["sent_pkts"] + d["dropped"]),
                "cont_tbf_overlimits": float(d["overlimits"]),
                "cont_tbf_frame_b": d["sent_bytes"] / d["sent_pkts"]})

    SLOW_METRICS = ("cont_gbps", "cont_retx_pct", "cont_dup_pct", "slow_rest_gbps",
                    "slow_rest_min_gbps", "slow_flow_gbps", "slow_flow_frac", "slow_keep")

    def cont_slowrx(self, r, topos, t, rate):
        """4 receivers (server processes) in B, flow f of one client to the
        f-th: rd-4rx, all at full speed, and rd-slowrx, the 4th reading at
        1/cont_slow_div of the link rate (DIWARP_FAULT=slowrx), in alternate
        rounds. 1 MiB Sends (receiver-paced). slow_keep: the slowest of the
        three others in an rd-slowrx run over the mean of the same three in
        the rd-4rx run of its round."""
        pl = self.pl
        base, slow = f"rd-4rx@{rate}", f"rd-slowrx@{rate}"
        if not (self.want_case(base) or self.want_case(slow)):
            return
        self.cont_order += [base, slow]
        self.cont_base[slow] = base  # the aggregate's ×ratio: to four at full speed
        self.cont_slow = (base, slow)
        if self.rd_why:
            for name in (base, slow):
                p = self.pt(name, "cont_gbps", 4)
                p.status, p.reason = "n/a", self.rd_why
            return
        bps = int(rate_gbps(rate) * 1e9 / 8 / pl["cont_slow_div"])
        self.cont_slow_bps = bps
        # the slow flow completes cont_msgs messages in the measured interval
        need_ms = pl["cont_msgs"] * CONT_SIZE / (bps * rd_pull_payload_frac()) * 1e3
        dur = pl["cont_warm_ms"] + max(pl["cont_min_ms"], math.ceil(need_ms / 500) * 500)
        self.cont_slow_ms = dur - pl["cont_warm_ms"]
        for rnd in range(pl["cont_runs"]):
            rest = None
            for name, slow_bps in ((base, 0), (slow, bps)):
                try:
                    res = self.cont_slow_run(r, topos, t, name, slow_bps, dur)
                except NotAvailable as e:
                    for m in self.SLOW_METRICS:
                        p = self.pt(name, m, 4)
                        p.status, p.reason, p.vals = "n/a", str(e), []
                    return
                except RunFailed as e:
                    self.fail_point([(name, m, 4) for m in self.SLOW_METRICS], str(e))
                    return
                if name == base:
                    rest = res["slow_rest_gbps"]
                elif rest:
                    res["slow_keep"] = res["slow_rest_min_gbps"] / rest
                for m, v in res.items():
                    self.pt(name, m, 4).vals.append(v)
            print(f"run: contention {rate} slow receiver round {rnd + 1}/{pl['cont_runs']} "
                  f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)

    def cont_slow_run(self, r, topos, t, name, slow_bps, dur):
        exe = [topos.script, "exec", t["name"]]
        flows = self.prog["bench-flows"]
        ports = [r.next_port() for _ in range(8)][::2]  # tcp would take port + 1
        srvs = []
        for i, port in enumerate(ports):
            fault = ["env", f"DIWARP_FAULT=slowrx:{slow_bps}"] if slow_bps and i == 3 else []
            srvs.append(exe + ["B"] + fault + [flows, "--addr", t["b"], "--cpu", r.srv_cpu,
                                                "--port", str(port)])
        cli = (exe + ["A", flows, "--addr", t["a"], "--cpu", r.cli_cpu, "--transport", "rd",
                      "--op", "send", "--flows", "4", "--devices", "4", "--size",
                      str(CONT_SIZE), "--duration-ms", str(dur), "--warmup-ms",
                      str(self.pl["cont_warm_ms"])] + [f"{t['b']}:{p}" for p in ports])
        o = r.run_pair(f"contention {name}", srvs, cli, {}, self.pl["timeout"], listen=False)
        res, v = result_of(o["client"], o["log"], ["gbps", "retx_pct", "srv_dup",
                                                   "sent_dgrams"])
        flows_out = re.findall(r"^FLOW \d+ .*", o["client"], re.M)
        g = [float(x) for x in re.findall(r"\bgbps=([0-9.]+)", "\n".join(flows_out))]
        if len(g) != 4:
            raise RunFailed(f"{len(g)} FLOW lines for 4 flows\n{o['log']}")
        srv3 = parse_result(o["servers"][3]) or {}
        if slow_bps and (int(srv3.get("pulls", 0)) <= 0 or int(srv3.get("slowrx_waits", 0)) <= 0):
            raise RunFailed(f"the slow receiver pulled nothing or was never throttled "
                            f"(pulls={srv3.get('pulls')}, slowrx_waits="
                            f"{srv3.get('slowrx_waits')})\n{o['log']}")
        r.log.write("".join(f"    {f}\n" for f in flows_out))
        out = {"cont_gbps": v["gbps"], "cont_retx_pct": v["retx_pct"],
               "cont_dup_pct": 100.0 * v["srv_dup"] / max(v["sent_dgrams"], 1),
               "slow_rest_gbps": sum(g[:3]) / 3, "slow_rest_min_gbps": min(g[:3]),
               "slow_flow_gbps": g[3]}
        if slow_bps:
            out["slow_flow_frac"] = g[3] / (slow_bps * 8 / 1e9 * rd_pull_payload_frac())
        return out

    def cont_loopback(self, r):
        """No regression from congestion control on loopback: RD Write 1 MiB
        with and without its CRC against raw TCP, RD 64 B ping-pong against raw
        UDP, RD Write under 1 % drop (the existing cases' programs, under the
        metrics lo_bw_gbps and lo_lat_us)."""
        pl = self.pl
        by = {c.name: c for c in self.cases + self.extra_cases}
        iters = bw_iters(CONT_SIZE, pl)
        bw = ["diwarp-rd", "diwarp-rd-nocrc", "raw-tcp"] + (["diwarp-rd-drop1"]
                                                             if pl["cont_drop"] else [])
        points = [("bw", "lo_bw_gbps", CONT_SIZE, bw,
                   lambda c: c.groups["bw"](r, CONT_SIZE, iters)[0]),
                  ("lat", "lo_lat_us", 64, ["diwarp-rd", "raw-udp"],
                   lambda c: c.groups["lat"](r, 64)["lat_us"])]
        for g, metric, size, names, measure in points:
            active = []
            for c in (by[x] for x in names):
                if not self.want_case(c.name):
                    continue
                p = self.pt(c.name, metric, size)
                why = c.avail_for(g)
                if why:
                    p.status, p.reason = "n/a", why
                else:
                    active.append(c)
            for rnd in range(pl["cont_runs"]):
                for c in list(active):
                    try:
                        v = positive(measure(c), metric, "")
                        self.pt(c.name, metric, size).vals.append(v)
                    except NotAvailable as e:
                        p = self.pt(c.name, metric, size)
                        p.status, p.reason, p.vals = "n/a", str(e), []
                        active.remove(c)
                    except RunFailed as e:
                        self.fail_point([(c.name, metric, size)], str(e))
                        active.remove(c)
                print(f"run: contention loopback {metric} round {rnd + 1}/{pl['cont_runs']} "
                      f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)

    # ---- mpi: NetPIPE over Open MPI between two namespace hosts
    # (case, label, Open MPI options, under diwarp run, DIWARP_* settings)
    MPI_CM = ["--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include"]
    MPI_STACKS = [
        ("mpi-ob1-tcp", "Open MPI ob1 + tcp btl", ["--mca", "pml", "ob1", "--mca", "btl",
                                                   "self,tcp"], False, {}),
        ("mpi-ofi-tcp", "libfabric `tcp;ofi_rxm` (mtl ofi)", MPI_CM + ["tcp;ofi_rxm"], False, {}),
        # The USAGE.md recipe as a user runs it: the device as it comes (every
        # address of its namespace, no --addr) and its transport report left
        # to `auto` (InfiniBand-like under Open MPI's ofi MTL).
        ("mpi-diwarp-rc", "diwarp RC (`verbs;ofi_rxm`)", MPI_CM + ["verbs;ofi_rxm"], True, {}),
        ("mpi-diwarp-rc-rd", "diwarp RC over RD (`DIWARP_RC_TRANSPORT=rd`)",
         MPI_CM + ["verbs;ofi_rxm"], True, {"DIWARP_RC_TRANSPORT": "rd"}),
    ]
    MPI_TCP = ("mpi-ob1-tcp", "mpi-ofi-tcp")
    MPI_LAT = 2                   # the latency point: 2-8 B
    MPI_LAT_SIZES = (2, 3, 4, 6, 8)
    MPI_BW = (64 * KiB, MiB, 4 * MiB)

    def mpi_hosts(self, tmp):
        """Two namespaces joined by a veth pair (the addresses exist only inside
        them); returns (namespaces, addresses) or raises NotAvailable."""
        tag = f"mpi{os.getpid() % 100000}"
        ns = [f"bench-{tag}-A", f"bench-{tag}-B"]
        x = os.getpid() % 250 + 1
        addrs = [f"10.81.{x}.1", f"10.81.{x}.2"]
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
            raise NotAvailable("needs root, ip and unshare (network namespaces)")
        cmds = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
                ["ip", "link", "add", "name", "mpiA", "netns", ns[0], "type", "veth", "peer",
                 "name", "mpiB", "netns", ns[1]]]
        for n, a, dev in zip(ns, addrs, ("mpiA", "mpiB")):
            cmds += [["ip", "-n", n, "addr", "add", a + "/24", "dev", dev],
                     ["ip", "-n", n, "link", "set", "lo", "up"],
                     ["ip", "-n", n, "link", "set", dev, "up"]]
        self.mpi_ns = ns
        for c in cmds:
            p = subprocess.run(c, capture_output=True, text=True)
            if p.returncode:
                raise NotAvailable(f"{' '.join(c)}: {p.stderr.strip()}")
        # The device unpinned ("-"): it takes its namespace's addresses.
        with open(os.path.join(tmp, "hosts"), "w") as f:
            for n, a in zip(ns, addrs):
                f.write(f"{a} {n} -\n")
        with open(os.path.join(tmp, "hostfile"), "w") as f:
            f.write("".join(f"{a} slots={self.a.mpi_jobs}\n" for a in addrs))
        return ns, addrs

    def mpi_down(self):
        for n in getattr(self, "mpi_ns", []):
            pids = subprocess.run(["ip", "netns", "pids", n], capture_output=True,
                                  text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        self.mpi_ns = []

    def mpi_netpipe(self, r, tmp, ns, addrs, stack, lo, hi, reps, want):
        """NetPIPE runs of a stack, sizes LO..HI, REPS round trips per size:
        {size: (one-way µs, Gbit/s)}; every size of WANT must have a rate.
        With --mpi-jobs N, N jobs at once (2 N ranks on the host's cores, as
        independent MPI jobs sharing the nodes): the median of their times
        and the sum of their rates."""
        n = self.a.mpi_jobs
        if n == 1:
            return self.mpi_netpipe_job(r, tmp, ns, addrs, stack, lo, hi, reps, want, 0)
        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            runs = list(ex.map(lambda j: self.mpi_netpipe_job(r, tmp, ns, addrs, stack, lo, hi,
                                                              reps, want, j), range(n)))
        return {s: (statistics.median(x[s][0] for x in runs), sum(x[s][1] for x in runs))
                for s in runs[0] if all(s in x for x in runs)}

    def mpi_netpipe_job(self, r, tmp, ns, addrs, stack, lo, hi, reps, want, job):
        """One NetPIPE job of mpi_netpipe (JOB: its number among those at once)."""
        case, _, opts, dw, extra = stack
        agent = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                             "tools", "mpi-netns-agent"))
        out = os.path.join(tmp, f"{case}-{job}.np")
        if os.path.exists(out):
            os.unlink(out)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DIWARP_", "OMPI_", "FI_"))}
        env.update(extra)
        env.update(DIWARP_MPI_HOSTS=os.path.join(tmp, "hosts"), TMPDIR=tmp,
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        pre = [self.prog["diwarp"], "run", "--"] if dw else []
        argv = (["ip", "netns", "exec", ns[0], "unshare", "--uts", "sh", "-c",
                 'hostname "$1" && shift && exec "$@"', "sh", ns[0]] + pre +
                ["mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", agent, "--hostfile",
                 os.path.join(tmp, "hostfile"), "-np", "2", "--bind-to", "none",
                 "--map-by", "node", "--oversubscribe"] + opts +
                ["NPopenmpi", "-p", "0", "-l", str(lo), "-u", str(hi), "-n", str(reps),
                 "-o", out])
        code, o = self.mpi_job(r, f"mpi {case} job {job} {size_name(lo)}-{size_name(hi)}", argv,
                               env, ns, 120)
        res = {}
        if code == 0 and os.path.exists(out):
            for line in open(out):
                f = line.split()
                if len(f) >= 3:
                    res[int(f[0])] = (float(f[2]) * 1e6, float(f[1]) / 1e3)
        if code != 0 or any(s not in res or res[s][1] <= 0 for s in want):
            tail = o.strip().splitlines()[-3:] if o.strip() else []
            raise RunFailed(f"mpirun exit {code}: " + " / ".join(tail))
        return res

    def mpi_down_procs(self, ns):
        for n in ns:
            for p in subprocess.run(["ip", "netns", "pids", n], capture_output=True,
                                    text=True).stdout.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (OSError, ValueError):
                    pass

    def run_mpi(self, r):
        self.mark_group("mpi")
        if not self.want_group("mpi"):
            return
        stacks = [s for s in self.MPI_STACKS if self.want_case(s[0])]
        keys = lambda c: [(c, "mpi_lat_us", self.MPI_LAT)] + [(c, "mpi_bw_gbps", s)
                                                             for s in self.MPI_BW]
        for c in stacks:
            for k in keys(c[0]):
                self.pt(*k)
        why = None
        for tool, pkg in (("mpirun", "openmpi-bin"), ("NPopenmpi", "netpipe-openmpi")):
            if not shutil.which(tool):
                why = f"{tool} missing (Debian package {pkg})"
        # Absolute: Open MPI puts its session directories under TMPDIR, from
        # the namespaces' own working directories.
        tmp = os.path.abspath(tempfile.mkdtemp(prefix="mpi-", dir=r.logdir))
        old = signal.signal(signal.SIGTERM, sigterm_interrupts)
        try:
            if why is None:
                try:
                    ns, addrs = self.mpi_hosts(tmp)
                except NotAvailable as e:
                    why = str(e)
            if why:
                for c in stacks:
                    for k in keys(c[0]):
                        p = self.pt(*k)
                        p.status, p.reason = "n/a", why
                return
            dead = set()
            for rnd in range(self.pl["runs"]):
                for c in stacks:
                    if c[0] in dead:
                        continue
                    try:
                        # NetPIPE's first size pays the warm-up (rxm connects
                        # on the first message: milliseconds): 1 B is measured,
                        # 2-8 B make the latency (the median of the five)
                        lat = self.mpi_netpipe(r, tmp, ns, addrs, c, 1, 8,
                                               self.pl["mpi_lat_reps"], self.MPI_LAT_SIZES)
                        res = {self.MPI_LAT: (statistics.median(lat[s][0] for s in
                                                                self.MPI_LAT_SIZES), 0)}
                        # from a quarter of the smallest size: NetPIPE's first
                        # size pays the warm-up (registration, first rendezvous)
                        res.update(self.mpi_netpipe(r, tmp, ns, addrs, c, min(self.MPI_BW) // 4,
                                                    max(self.MPI_BW), self.pl["mpi_reps"],
                                                    self.MPI_BW))
                    except RunFailed as e:
                        self.fail_point(keys(c[0]), str(e))
                        self.failures.append((c[0], "mpi", str(e)))
                        dead.add(c[0])
                        continue
                    self.pt(c[0], "mpi_lat_us", self.MPI_LAT).vals.append(res[self.MPI_LAT][0])
                    for s in self.MPI_BW:
                        self.pt(c[0], "mpi_bw_gbps", s).vals.append(res[s][1])
                print(f"run: mpi round {rnd + 1}/{self.pl['runs']} "
                      f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)
        finally:
            self.mpi_down()
            shutil.rmtree(tmp, ignore_errors=True)
            signal.signal(signal.SIGTERM, old)

    # ---- mvapich: OSU benchmarks over MVAPICH2 on diwarp, Open MPI ob1/tcp beside
    # (case, label, "mv2" or "ompi", DIWARP_* settings)
    MV2_STACKS = [
        ("mv2-ob1-tcp", "Open MPI ob1 + tcp btl", "ompi", {}),
        ("mv2-diwarp-rc", "MVAPICH2, diwarp RC", "mv2", {}),
        ("mv2-diwarp-rc-fpdu", "MVAPICH2, diwarp RC, `DIWARP_RC_FPDU=16384`", "mv2",
         {"DIWARP_RC_FPDU": "16384"}),
        ("mv2-diwarp-rc-rd", "MVAPICH2, diwarp RC over RD (`DIWARP_RC_TRANSPORT=rd`)", "mv2",
         {"DIWARP_RC_TRANSPORT": "rd"}),
    ]
    MV2_BASE = "mv2-ob1-tcp"
    MV2_BENCH = [("osu_latency", "mv2_lat_us"), ("osu_bw", "mv2_bw_mbs"),
                 ("osu_bibw", "mv2_bibw_mbs")]
    MV2_SIZES = [1 << i for i in range(23)]      # 1 B .. 4 MiB
    # The launch recipe of docs/USAGE.md ("MVAPICH2"), plus MV2_TUNING;
    # MV2_TUNING in the environment replaces it (space-separated NAME=VALUE)
    # to try others.
    MV2_ENV = {"MV2_USE_RDMA_CM": "1", "MV2_USE_IWARP_MODE": "1", "MV2_FORCE_HCA_TYPE": "5",
               "MV2_ENABLE_AFFINITY": "0"}
    MV2_TUNING = {}

    def mv2_prefix(self):
        return os.environ.get("MVAPICH2_PREFIX", "/opt/mvapich2")

    def mv2_osu(self, kind, bench):
        if kind == "mv2":
            return os.path.join(self.mv2_prefix(), "libexec", "osu-micro-benchmarks", "mpi",
                                "pt2pt", bench)
        return os.path.join(self.mv2_prefix(), "openmpi-osu", "libexec", "osu-micro-benchmarks",
                            "mpi", "pt2pt", bench)

    def mv2_tuning(self):
        t = os.environ.get("MV2_TUNING")
        if t is None:
            return dict(self.MV2_TUNING)
        return dict(kv.split("=", 1) for kv in t.split() if "=" in kv)

    def mv2_run(self, r, tmp, ns, addrs, stack, bench, metric):
        """One OSU run of a stack, rank 0 in A on the first --cpus core, rank 1
        in B on the second: {size: value}; every size of MV2_SIZES must have a
        value."""
        case, _, kind, extra = stack
        agent = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                             "tools", "mpi-netns-agent"))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DIWARP_", "OMPI_", "FI_", "MV2_"))}
        env.update(DIWARP_MPI_HOSTS=os.path.join(tmp, "hosts"), TMPDIR=tmp)
        cpu = self.a.cpus.split(",")
        prog = self.mv2_osu(kind, bench)
        it = self.pl["mv2_lat_iters"] if metric == "mv2_lat_us" else self.pl["mv2_bw_iters"]
        args = ["-m", f"1:{max(self.MV2_SIZES)}"]
        if it is not None:
            args += ["-i", str(it), "-x", str(max(1, it // 10))]
        ranks = [["taskset", "-c", cpu[i], prog] + args for i in (0, 1)]
        if kind == "mv2":
            env.update(self.MV2_ENV)
            env["MV2_RDMA_CM_CONF_FILE_PATH"] = os.path.join(tmp, ns[0])
            env.update(self.mv2_tuning())
            env.update(extra)
            launch = [self.prog["diwarp"], "run", "--addr", addrs[0], "--",
                      os.path.join(self.mv2_prefix(), "bin", "mpiexec.hydra"),
                      "-launcher", "rsh", "-launcher-exec", agent, "-genvnone",
                      # -hosts is global in Hydra (a second one is refused):
                      # one slot per host puts rank 0 in A and rank 1 in B
                      "-hosts", f"{addrs[0]}:1,{addrs[1]}:1",
                      "-n", "1"] + ranks[0] + [":", "-n", "1"] + ranks[1]
        else:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            launch = ["mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", agent,
                      "--hostfile", os.path.join(tmp, "hostfile"), "--bind-to", "none",
                      "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
                      "-np", "1", "--host", addrs[0]] + ranks[0] + \
                     [":", "-np", "1", "--host", addrs[1]] + ranks[1]
        argv = ["ip", "netns", "exec", ns[0], "unshare", "--uts", "sh", "-c",
                'hostname "$1" && shift && cd "$TMPDIR" && exec "$@"', "sh", ns[0]] + launch
        code, o = self.mpi_job(r, f"mvapich {case} {bench}", argv, env, ns, 180)
        res = {}
        for line in o.splitlines():
            f = line.split()
            if len(f) >= 2 and f[0].isdigit():
                try:
                    res[int(f[0])] = float(f[1])
                except ValueError:
                    pass
        if code != 0 or any(res.get(s, 0) <= 0 for s in self.MV2_SIZES):
            tail = o.strip().splitlines()[-3:] if o.strip() else []
            raise RunFailed(f"{bench} exit {code}: " + " / ".join(tail))
        return res

    def run_mvapich(self, r):
        self.mark_group("mvapich")
        if not self.want_group("mvapich"):
            return
        stacks = [s for s in self.MV2_STACKS if self.want_case(s[0])]
        keys = lambda c: [(c, m, s) for _, m in self.MV2_BENCH for s in self.MV2_SIZES]
        for c in stacks:
            for k in keys(c[0]):
                self.pt(*k)
        # a stack whose programs are missing is "not available"; the others run
        absent = {}
        for kind in ("mv2", "ompi"):
            launcher = (os.path.join(self.mv2_prefix(), "bin", "mpiexec.hydra")
                        if kind == "mv2" else shutil.which("mpirun") or "mpirun")
            for f in [launcher] + [self.mv2_osu(kind, b) for b, _ in self.MV2_BENCH]:
                if not os.access(f, os.X_OK):
                    absent[kind] = (f"{f} missing: build MVAPICH2 and the OSU benchmarks "
                                    f"with tools/build-mvapich2.sh SOURCE {self.mv2_prefix()} "
                                    "(or set MVAPICH2_PREFIX)")
                    break
        for c in stacks:
            if c[2] in absent:
                for k in keys(c[0]):
                    p = self.pt(*k)
                    p.status, p.reason = "n/a", absent[c[2]]
        stacks = [c for c in stacks if c[2] not in absent]
        why = None if stacks else "nothing to run"
        tmp = os.path.abspath(tempfile.mkdtemp(prefix="mv2-", dir=r.logdir))
        old = signal.signal(signal.SIGTERM, sigterm_interrupts)
        etc = []
        try:
            if why is None:
                try:
                    ns, addrs = self.mpi_hosts(tmp)
                except NotAvailable as e:
                    why = str(e)
            if why:
                for c in stacks:
                    for k in keys(c[0]):
                        p = self.pt(*k)
                        p.status, p.reason = "n/a", why
                return
            # MVAPICH2 tells hosts apart by gethostid(): each namespace host
            # resolves its own name (ip netns exec binds /etc/netns/NS/hosts)
            for n in ns:
                d = os.path.join("/etc/netns", n)
                os.makedirs(d, exist_ok=True)
                etc.append(d)
                with open(os.path.join(d, "hosts"), "w") as f:
                    f.write("127.0.0.1 localhost\n" +
                            "".join(f"{a} {m}\n" for a, m in zip(addrs, ns)))
            # Each host's address for MVAPICH2's rdma_cm setup, in a
            # directory of its own (DIR/mv2.conf), which the agent's map
            # hands to that host's ranks (MV2_RDMA_CM_CONF_FILE_PATH).
            with open(os.path.join(tmp, "hosts"), "w") as f:
                for a, n in zip(addrs, ns):
                    os.makedirs(os.path.join(tmp, n), exist_ok=True)
                    with open(os.path.join(tmp, n, "mv2.conf"), "w") as c:
                        c.write(a + "\n")
                    f.write(f"{a} {n} {a} MV2_RDMA_CM_CONF_FILE_PATH={os.path.join(tmp, n)}\n")
            dead = set()
            for rnd in range(self.pl["runs"]):
                for c in stacks:
                    for bench, metric in self.MV2_BENCH:
                        if (c[0], metric) in dead:
                            continue
                        k = [(c[0], metric, s) for s in self.MV2_SIZES]
                        try:
                            res = self.mv2_run(r, tmp, ns, addrs, c, bench, metric)
                        except RunFailed as e:
                            self.fail_point(k, str(e))
                            dead.add((c[0], metric))
                            continue
                        for s in self.MV2_SIZES:
                            self.pt(c[0], metric, s).vals.append(res[s])
                print(f"run: mvapich round {rnd + 1}/{self.pl['runs']} "
                      f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)
        finally:
            self.mpi_down()
            for d in etc:
                shutil.rmtree(d, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)
            signal.signal(signal.SIGTERM, old)

    # ---- credits: the credit-based mailbox receive ring under all-to-all load
    def credit_cases(self):
        """(case, description, bench-credits args, env). A ring is S slots per
        sender of the QP: DIWARP_CREDIT_RING = S x P, DIWARP_CREDIT_PEERS = P
        (the dynamic protocol with a floor of 1 slot)."""
        out = []

        def family(tag, P, act, m, dests=0):
            base = ["--procs", "2", "--eps", str(P), "--msgs", str(m), "--size", "2048"]
            if act:
                base += ["--active", str(act), "--dests", str(dests)]
            who = f"P={P}" + (f", {act} active, {dests} destinations each" if act else "")
            # Every message a QP can receive: m from each endpoint, or with
            # `act` active senders m from each of the at most min(act, dests)
            # that name it (m x P there asked for 19 208 receives at P = 64,
            # over the device's max_qp_wr of 16 384: the QP was refused).
            senders = min(act, dests) if act else P
            out.append((f"{tag}-prepost", f"{who}, every receive posted first, credits off",
                        base + ["--rq", str(m * senders + 8)], {"DIWARP_CREDIT": "off"}))
            out.append((f"{tag}-off", f"{who}, 4 receives posted, credits off (RNR)",
                        base + ["--rq", "4"], {"DIWARP_CREDIT": "off"}))
            # 64 slots per sender: more than a sender ever has in flight (its
            # SQ holds 64), so no credit binds, but a ring that wraps (as a
            # real one does: a ring never reused pays a page fault per page)
            big = min(32767, 64 * P)
            out.append((f"{tag}-unbounded", f"{who}, 4 receives posted, a ring no sender can "
                        f"fill ({big} slots: the reference)", base + ["--rq", "4"],
                        {"DIWARP_CREDIT": "static", "DIWARP_CREDIT_PEERS": str(P),
                         "DIWARP_CREDIT_RING": str(big)}))
            for proto in ("static", "dynamic"):
                for sl in self.pl["cr_slots"]:
                    if proto == "static" and sl != int(sl):
                        continue  # the quota is whole slots: the same as int(sl)
                    ring = int(sl * P)
                    env = {"DIWARP_CREDIT": proto, "DIWARP_CREDIT_PEERS": str(P),
                           "DIWARP_CREDIT_RING": str(ring)}
                    if proto == "dynamic":
                        env["DIWARP_CREDIT_MIN_QUOTA"] = "1"
                    out.append((f"{tag}-{proto}-{sl:g}", f"{who}, 4 receives posted, {proto}, "
                                f"{sl:g} slot{'s' if sl != 1 else ''} per sender "
                                f"({ring * 2} KiB per QP)", base + ["--rq", "4"], env))

        for P in self.pl["cr_eps"]:
            family(f"a2a-{P}", P, 0, self.pl["cr_msgs"][P])
        family("a2a-64-act8", 64, 8, self.pl["cr_act8_msgs"], dests=8)
        # Each device holds a stream per pair of its QPs and the others:
        # about P x P / 2 with two processes, over the default cap of
        # DIWARP_RD_DEV_PEERS (16384) at P = 256, where every case failed
        # with "new stream refused". The cap is for strangers' streams;
        # this all-to-all is the application's own.
        for name, _desc, args, env in out:
            P = int(args[args.index("--eps") + 1])
            if P * P // 2 > 16384:
                env["DIWARP_RD_DEV_PEERS"] = str(P * P)
        return out

    def run_credits(self, r):
        self.mark_group("credits")
        if not self.want_group("credits"):
            return
        self.cr_res = {}
        cases = [c for c in self.credit_cases() if self.want_case(c[0])]
        dead = set()
        cpus = f"{r.srv_cpu},{r.cli_cpu}"
        for rnd in range(self.pl["runs"]):
            for name, desc, args, env in cases:
                if name in dead:
                    continue
                try:
                    p, out, err, txt = r.run_single(f"credits {name}",
                                                    [self.prog["bench-credits"]] + args, env,
                                                    self.pl["timeout"], pin=cpus)
                    if p.code != 0:
                        raise RunFailed(f"exit {p.code}: {err.strip()[-400:]}")
                    res = parse_result(out)
                    if not res:
                        raise RunFailed(f"no RESULT line: {err.strip()[-400:]}")
                except RunFailed as e:
                    self.failures.append((name, "credits", 0, str(e)))
                    dead.add(name)
                    continue
                self.cr_res.setdefault(name, []).append({k: float(v) for k, v in res.items()})
            # latency: RD ping-pong of 64 B, credits on and off, alternated
            for name, cr in (("lat-rd-credit", "static"), ("lat-rd-off", "off")):
                if not self.want_case(name) or name in dead:
                    continue
                P = self.prog
                cli = [P["diwarp-pingpong"], "--transport", "rd", "--op", "send", "--size", "64",
                       "--iters", str(lat_iters(64, self.a.quick)), "--port", "{port}",
                       "127.0.0.1"]
                try:
                    o = r.run_pair(f"credits {name}", [P["diwarp-pingpong"], "--port", "{port}"],
                                   cli, {"DIWARP_CREDIT": cr}, self.pl["timeout"])
                    lat = result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]
                except RunFailed as e:
                    self.failures.append((name, "credits", 64, str(e)))
                    dead.add(name)
                    continue
                self.cr_res.setdefault(name, []).append({"lat_us": float(lat)})
            print(f"run: credits round {rnd + 1}/{self.pl['runs']} "
                  f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)
        self.cr_desc = {c[0]: c[1] for c in cases}

    def credits_section(self):
        res = getattr(self, "cr_res", None)
        if not res:
            return []
        med = lambda n, k: statistics.median(x[k] for x in res[n]) if n in res else None
        L = ["## Credits: the mailbox receive ring\n",
             "`bench-credits`: P RD QPs (endpoints) in 2 processes on this host, one core each, "
             "each sending its messages of 2 KiB (one slot) to every other endpoint round robin "
             "(at most 64 unacknowledged per QP; `act8`: only the first 8 send, each to the 8 "
             "endpoints after it, so a receiver has 1 to 8 active senders among its 63: an "
             "eighth of the senders active); every endpoint keeps R receive WRs posted and "
             "reposts each as it polls its completion, checking sender, order and every byte. "
             "`prepost`: every receive posted before the start, credits off (nothing waits "
             "for a receive); `off`: R = 4, credits off (early Sends get RNR NAKs); "
             "`unbounded`: R = 4 and a ring of 64 slots per sender (at most 32767), more than "
             "the senders can fill (the reference: a mailbox that never binds); "
             "`static-S` / `dynamic-S`: "
             "R = 4 and a ring of S slots per sender (`DIWARP_CREDIT_RING` = S × P, "
             "`DIWARP_CREDIT_PEERS` = P; dynamic with a floor of 1 slot). Medians of the "
             "rounds; the time ratio is against `unbounded` (overhead = ratio − 1); counters "
             "summed over both devices.\n",
             "| case | ms | × unbounded | RNR NAKs | retransmits | parked | credit msgs "
             "| credit msgs / data datagram | credit stalls | probes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
        order = [c[0] for c in self.credit_cases() if c[0] in res]
        for n in order:
            ms = med(n, "ms")
            fam = re.match(r"(a2a-\d+(-act8)?)-", n).group(1)
            ref = med(fam + "-unbounded", "ms")
            data = med(n, "msgs") * med(n, "active") * med(n, "dests")
            cm = med(n, "credit_msgs")
            L.append(f"| {n}: {self.cr_desc.get(n, '')} | {ms:.0f} | "
                     f"{'×%.2f' % (ms / ref) if ref else '–'} | {med(n, 'rnr'):.0f} | "
                     f"{med(n, 'retx'):.0f} | {med(n, 'parked'):.0f} | {cm:.0f} | "
                     f"{cm / data:.4f} | {med(n, 'credit_stalls'):.0f} | {med(n, 'probes'):.0f} |")
        L.append("")
        # memory for <= 3 % overhead, per protocol
        fams = sorted({re.match(r"(a2a-\d+(-act8)?)-", n).group(1) for n in order},
                      key=lambda f: order.index(f + "-prepost") if f + "-prepost" in order else 0)
        for fam in fams:
            ref = med(fam + "-unbounded", "ms")
            if not ref:
                continue
            best = {}
            for proto in ("static", "dynamic"):
                ok = [sl for sl in self.pl["cr_slots"]
                      if med(f"{fam}-{proto}-{sl:g}", "ms") and
                      med(f"{fam}-{proto}-{sl:g}", "ms") / ref <= 1.03]
                best[proto] = min(ok) if ok else None
            st, dy = best["static"], best["dynamic"]
            tried = ", ".join(f"{x:g}" for x in self.pl["cr_slots"])
            line = (f"- {fam}: smallest ring within 3 % of unbounded: static "
                    f"{f'{st:g}' if st else 'none of ' + tried} slot(s) per sender, "
                    f"dynamic {f'{dy:g}' if dy else 'none of ' + tried}")
            if st and dy:
                line += (f"; dynamic needs ×{dy / st:.2f} of static's memory (target ≤ ×0.25: "
                         f"{'met' if dy / st <= 0.25 else 'missed'})")
            L.append(line)
        L.append("")
        on, off = med("lat-rd-credit", "lat_us"), med("lat-rd-off", "lat_us")
        if on and off:
            L.append(f"RD ping-pong, 64 B (`diwarp-pingpong --transport rd`, alternated): "
                     f"credits on {on:.2f} µs, off {off:.2f} µs, ×{on / off:.3f} "
                     f"(target ≤ ×1.03: {'met' if on / off <= 1.03 else 'missed'}).\n")
        return L

    # ---- daemon: the host progress daemon (diwarpd) against application-driven progress
    def daemon_start(self, r, name, cpus, ns=None, env=None):
        """Starts a diwarpd (pinned to cpus, inside namespace ns, its engine
        configured by env) with its socket in the run's scratch directory;
        returns (Popen, socket)."""
        sock = os.path.join(r.logdir, f"{name}.sock")
        log = open(os.path.join(r.logdir, f"{name}.log"), "w")
        argv = ["taskset", "-c", cpus, self.prog["diwarpd"], "--socket", sock]
        if ns:
            argv = ["ip", "netns", "exec", ns] + argv
        p = subprocess.Popen(argv, env=r.env(env or {}), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 5
        while not os.path.exists(sock):
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise RunFailed(f"diwarpd did not start (see {name}.log)")
            time.sleep(0.01)
        return p, sock

    @staticmethod
    def daemon_stop(p):
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    @staticmethod
    def proc_cpu_s(pid):
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def proc_rss_kib(pid):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def daemon_child_pid(self, p):
        """The diwarpd under taskset / ip netns exec (they exec, so the same pid)."""
        return p.pid

    def run_daemon(self, r):
        self.mark_group("daemon")
        if not self.want_group("daemon"):
            return
        self.dm = {}
        P, T, pl = self.prog, self.pl["timeout"], self.pl
        both = f"{r.srv_cpu},{r.cli_cpu}"

        def add(name, **v):
            self.dm.setdefault(name, []).append(v)

        def guarded(name, fn):
            try:
                fn()
            except (RunFailed, NotAvailable) as e:
                self.failures.append((name, "daemon", 0, str(e)))

        for rnd in range(self.pl["runs"]):
            # 1. independent progress: a 1 MiB RDMA Read against a computing target
            for mode in ("app", "thread", "daemon"):
                def prog_case(mode=mode):
                    env = {"DIWARP_PROGRESS": mode}
                    d = None
                    if mode == "daemon":
                        d, sock = self.daemon_start(r, "dprog", both)
                        env["DIWARP_DAEMON_SOCKET"] = sock
                    try:
                        srv = [P["bench-overlap"], "--cpu", r.srv_cpu, "--port", "{port}"]
                        cli = [P["bench-overlap"], "--mode", "progress", "--op", "read", "--size",
                               str(pl["ov_size"]), "--reps", str(pl["ov_reps"]), "--cpu",
                               r.cli_cpu, "--port", "{port}", "127.0.0.1"]
                        cli += ["--block"] if mode != "app" else []
                        o = r.run_pair(f"daemon progress {mode}", srv, cli, env, T,
                                       pin=(both, both))
                        rr, v = result_of(o["client"], o["log"], ["ratio"])
                        add(f"progress-{mode}", ratio=v["ratio"], t0=float(rr["t0_us"]),
                            tD=float(rr["tD_us"]))
                    finally:
                        if d:
                            self.daemon_stop(d)
                guarded(f"progress-{mode}", prog_case)
            # 2. 64 B Send ping-pong, and 3. host-local 1 MiB Write / Read
            def local_cases():
                lat_n = str(lat_iters(64, self.a.quick))
                bw_n = str(max(50, pl["bw_bytes"] // MiB // 2))
                cases = []
                for tr in ("rc", "ud"):
                    cases.append((f"pingpong-{tr}", ["diwarp-pingpong", "--transport", tr,
                                                     "--size", "64", "--iters", lat_n], "lat_us"))
                for op in ("write", "read"):
                    cases.append((f"local-{op}", ["diwarp-bw", "--transport", "rc", "--op", op,
                                                  "--size", str(MiB), "--iters", bw_n], "gbps"))
                for name, argv, key in cases:
                    hows = ["app", "daemon", "daemon-core"]
                    if name.startswith("local-"):
                        hows.append("daemon-stream")
                    for how in hows:
                        def one(name=name, argv=argv, key=key, how=how):
                            env, pin, d = {}, None, None
                            if how != "app":
                                # daemon: clients pinned apart, the daemon free;
                                # daemon-core: the daemon on one core, both
                                # clients on the other; daemon-stream: as
                                # daemon, without the one-copy path
                                dcpu = r.srv_cpu if how == "daemon-core" else both
                                denv = {"DIWARP_LOCAL_COPY": "0"} if how == "daemon-stream" \
                                    else None
                                d, sock = self.daemon_start(r, "dlocal", dcpu, env=denv)
                                env = {"DIWARP_PROGRESS": "daemon", "DIWARP_DAEMON_SOCKET": sock}
                                if how == "daemon-core":
                                    pin = (r.cli_cpu, r.cli_cpu)
                            try:
                                prog = P[argv[0]]
                                o = r.run_pair(f"daemon {name} {how}", [prog, "--port", "{port}"],
                                               [prog] + argv[1:] + ["--port", "{port}",
                                                                    "127.0.0.1"], env, T, pin=pin)
                                v = result_of(o["client"], o["log"], [key])[1][key]
                                add(f"{name}-{how}", v=v)
                            finally:
                                if d:
                                    self.daemon_stop(d)
                        guarded(f"{name}-{how}", one)
                # raw TCP over loopback, the host-local baseline
                def raw():
                    argv = [P["raw-sock"], "--proto", "tcp", "--mode", "stream", "--size",
                            str(MiB), "--iters", bw_n, "--port", "{port}"]
                    o = r.run_pair("daemon raw tcp", argv, argv + ["127.0.0.1"], {}, T)
                    add("local-tcp", v=result_of(o["client"], o["log"], ["gbps"])[1]["gbps"])
                guarded("local-tcp", raw)
            local_cases()
            # 4. RC and RD 1 MiB Write between two namespaces
            guarded("netns", lambda: self.daemon_netns(r))
            # 5. the daemon idle, a client holding a QP
            def idle():
                d, sock = self.daemon_start(r, "didle", both)
                env = r.env({"DIWARP_PROGRESS": "daemon", "DIWARP_DAEMON_SOCKET": sock})
                c = subprocess.Popen([P["diwarp-pingpong"], "--port", str(r.next_port())],
                                     env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
                try:
                    time.sleep(0.5)  # opened, its QP created, waiting for a peer
                    c0 = self.proc_cpu_s(d.pid)
                    t0 = time.monotonic()
                    time.sleep(pl["idle_ms"] / 1000)
                    c1 = self.proc_cpu_s(d.pid)
                    add("idle", pct=100 * (c1 - c0) / (time.monotonic() - t0))
                finally:
                    c.kill()
                    c.wait()
                    self.daemon_stop(d)
            guarded("idle", idle)
            # 6. 8 client processes all-to-all (RD), with and without the daemon
            for how in ("app", "daemon"):
                def a2a(how=how):
                    env, d = {}, None
                    if how == "daemon":
                        d, sock = self.daemon_start(r, "da2a", both)
                        env = {"DIWARP_PROGRESS": "daemon", "DIWARP_DAEMON_SOCKET": sock}
                        rss0 = self.proc_rss_kib(d.pid)
                    try:
                        msgs = 40 if self.a.quick else 200
                        args = [P["bench-credits"], "--procs", "8", "--eps", "8", "--msgs",
                                str(msgs), "--size", "2048", "--rq", str(msgs * 8 + 8)]
                        peak = [0]
                        stop = threading.Event()

                        def watch():
                            while d and not stop.wait(0.02):
                                peak[0] = max(peak[0], self.proc_rss_kib(d.pid))
                        th = threading.Thread(target=watch, daemon=True)
                        th.start()
                        try:
                            p, out, err, txt = r.run_single(f"daemon a2a {how}", args,
                                                            dict(env, DIWARP_CREDIT="off"), T,
                                                            pin=both)
                        finally:
                            stop.set()
                            th.join()
                        res = parse_result(out)
                        if p.code != 0 or not res:
                            raise RunFailed(f"bench-credits exit {p.code}: {err.strip()[-400:]}")
                        v = dict(rate=float(res["rate"]), ms=float(res["ms"]))
                        if d:
                            v["kib_per_client"] = (peak[0] - rss0) / 8
                        add(f"a2a-{how}", **v)
                    finally:
                        if d:
                            self.daemon_stop(d)
                guarded(f"a2a-{how}", a2a)
            print(f"run: daemon round {rnd + 1}/{self.pl['runs']} "
                  f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)

    def daemon_netns(self, r):
        """RC and RD 1 MiB RDMA Write between two namespaces (a veth pair,
        MTU 1500, no limit worth the name), application-driven and through a
        daemon in each namespace."""
        topo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns-topo.sh")
        name = f"dm{os.getpid() % 10000}"
        up = subprocess.run([topo, "up", name, "direct", "100gbit", "--owner", str(os.getpid())],
                            capture_output=True, text=True)
        if up.returncode != 0:
            raise NotAvailable(f"netns-topo.sh up: {up.stderr.strip()[-200:]}")
        try:
            t = dict(kv.split("=", 1) for kv in up.stdout.split()[1:])
            n = str(max(50, self.pl["bw_bytes"] // MiB // 4))
            for tr in ("rc", "rd"):
                for how in ("app", "daemon"):
                    env, ds = r.env({}), []
                    try:
                        envA, envB = dict(env), dict(env)
                        if how == "daemon":
                            # each daemon free to run on either core (beside
                            # its own program it starves: measured ×0.06 RD)
                            for ns, e in ((t["ns_a"], envA), (t["ns_b"], envB)):
                                d, sock = self.daemon_start(r, f"dn-{ns}",
                                                            f"{r.srv_cpu},{r.cli_cpu}", ns=ns)
                                ds.append(d)
                                e.update(DIWARP_PROGRESS="daemon", DIWARP_DAEMON_SOCKET=sock)
                        port = str(r.next_port())
                        bw = self.prog["diwarp-bw"]
                        srv = subprocess.Popen(
                            ["ip", "netns", "exec", t["ns_a"], "taskset", "-c", r.srv_cpu, bw,
                             "--port", port, "--addr", t["a"]], env=envA,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                        time.sleep(0.3)
                        cli = subprocess.run(
                            ["ip", "netns", "exec", t["ns_b"], "taskset", "-c", r.cli_cpu, bw,
                             "--transport", tr, "--op", "write", "--size", str(MiB), "--iters", n,
                             "--port", port, "--addr", t["b"], t["a"]], env=envB,
                            capture_output=True, text=True, timeout=self.pl["timeout"])
                        try:
                            srv.wait(10)
                        except subprocess.TimeoutExpired:
                            srv.kill()
                        res = parse_result(cli.stdout)
                        r.log.write(f"== daemon netns {tr} {how}\n{cli.stdout[-1500:]}\n"
                                    f"{cli.stderr[-1500:]}\n")
                        if cli.returncode != 0 or not res or res.get("status") != "ok":
                            raise RunFailed(f"netns {tr} {how}: exit {cli.returncode}: "
                                            f"{cli.stderr.strip()[-400:]}")
                        self.dm.setdefault(f"netns-{tr}-{how}", []).append(
                            dict(v=float(res["gbps"])))
                    finally:
                        for d in ds:
                            self.daemon_stop(d)
        finally:
            subprocess.run([topo, "down", name], capture_output=True)

    def daemon_section(self):
        res = getattr(self, "dm", None)
        if not res:
            return []

        def med(n, k="v"):
            return statistics.median(x[k] for x in res[n]) if res.get(n) else None

        def f(x, fmt="%.2f"):
            return fmt % x if x is not None else "–"

        def ratio(a, b):
            return a / b if a is not None and b else None

        def verdict(x, ok):
            return "–" if x is None else ("met" if ok(x) else "missed")

        L = ["## Daemon: the host progress daemon (diwarpd)\n",
             "Each case side by side in one round, medians of the rounds. `app`: "
             "application-driven progress (`DIWARP_PROGRESS=app`), the two programs pinned "
             "to one core each; `daemon`: both programs clients of one `diwarpd` "
             "(`DIWARP_PROGRESS=daemon`), pinned the same, the daemon free to run on either "
             "core; `daemon-core`: the daemon alone on one core, both clients on the other. "
             "With two cores, three busy parties share them.\n",
             "| case | app | thread | daemon | target |", "|---|---|---|---|---|"]
        pa, pt, pd = med("progress-app", "ratio"), med("progress-thread", "ratio"), \
            med("progress-daemon", "ratio")
        L.append(f"| 1 MiB RDMA Read against a target computing D = 10 × t(0): t(D)/t(0) "
                 f"(`bench-overlap --mode progress`) | {f(pa)} | {f(pt)} | {f(pd)} | ≤ 1.1: "
                 f"{verdict(pd, lambda x: x <= 1.1)} |")
        L.append("")
        L.append("| case | app | daemon | daemon-core | daemon / app | daemon-core / app "
                 "| target |")
        L.append("|---|---|---|---|---|---|---|")
        for tr in ("rc", "ud"):
            a, d, dc = med(f"pingpong-{tr}-app"), med(f"pingpong-{tr}-daemon"), \
                med(f"pingpong-{tr}-daemon-core")
            best = min(x for x in (ratio(d, a), ratio(dc, a)) if x is not None) \
                if ratio(d, a) or ratio(dc, a) else None
            L.append(f"| 64 B Send ping-pong, {tr.upper()}, µs (half round trip) | {f(a)} | "
                     f"{f(d)} | {f(dc)} | ×{f(ratio(d, a))} | ×{f(ratio(dc, a))} | ≤ ×1.5: "
                     f"{verdict(best, lambda x: x <= 1.5)} |")
        tcp = med("local-tcp")
        for op in ("write", "read"):
            a, d, dc = med(f"local-{op}-app"), med(f"local-{op}-daemon"), \
                med(f"local-{op}-daemon-core")
            best = max(x for x in (d, dc) if x is not None) if d or dc else None
            L.append(f"| host-local 1 MiB RDMA {op.title()}, RC, Gbit/s (raw TCP loopback "
                     f"{f(tcp)}) | {f(a)} | {f(d)} | {f(dc)} | ×{f(ratio(d, a))} | "
                     f"×{f(ratio(dc, a))} | ≥ 2 × TCP: ×{f(ratio(best, tcp))} "
                     f"{verdict(ratio(best, tcp), lambda x: x >= 2)} |")
        L.append("")
        rows = [(op, med(f"local-{op}-daemon"), med(f"local-{op}-daemon-stream"))
                for op in ("write", "read")]
        if any(s for _, _, s in rows):
            L.append("Host-local, the daemon's one copy against its own loopback stream "
                     "(`DIWARP_LOCAL_COPY=0` in the daemon), same pinning: " +
                     "; ".join(f"{op.title()} {f(d)} against {f(s)} Gbit/s "
                               f"(×{f(ratio(d, s))})" for op, d, s in rows) + ".\n")
        L.append("| between two namespaces (veth, MTU 1500), 1 MiB RDMA Write, Gbit/s | app "
                 "| daemons | daemons / app | target |")
        L.append("|---|---|---|---|---|")
        for tr in ("rc", "rd"):
            a, d = med(f"netns-{tr}-app"), med(f"netns-{tr}-daemon")
            L.append(f"| {tr.upper()} | {f(a)} | {f(d)} | ×{f(ratio(d, a))} | ≥ ×0.9: "
                     f"{verdict(ratio(d, a), lambda x: x >= 0.9)} |")
        L.append("")
        idle = med("idle", "pct")
        L.append(f"Daemon idle with one client holding a device and a QP: {f(idle, '%.3f')} % "
                 f"of a core (target ≤ 0.1 %: {verdict(idle, lambda x: x <= 0.1)}).\n")
        a, d = med("a2a-app", "rate"), med("a2a-daemon", "rate")
        kib = med("a2a-daemon", "kib_per_client")
        L.append(f"8 client processes, all to all over RD (`bench-credits --procs 8 --eps 8`, "
                 f"2 KiB messages): {f(a, '%.0f')} messages/s application-driven, "
                 f"{f(d, '%.0f')} through the daemon (×{f(ratio(d, a))}; target ≥ ×1: "
                 f"{verdict(ratio(d, a), lambda x: x >= 1)}); the daemon's resident memory "
                 f"grew by {f(kib, '%.0f')} KiB per client.\n")
        return L

    # ---- multirail ---------------------------------------------------------
    # (case, metric, topology (mr_topos), rails used (0-based indices into
    # its rail lists), what runs (bw: diwarp-bw RD Writes; lat: diwarp-pingpong
    # RD; pp: one RD Read at a time; fi / fi-tcp: fi_pingpong through diwarp /
    # over libfabric's tcp), sizes)
    def mr_cases(self):
        pl = self.pl
        c = [("mr-1rail", "mr_bw_gbps", "eq", [0], "bw", pl["mr_sizes"]),
             ("mr-2rails", "mr_bw_gbps", "eq", [0, 1], "bw", pl["mr_sizes"]),
             ("mr-3rails", "mr_bw_gbps", "eq", [0, 1, 2], "bw", pl["mr_sizes"]),
             ("mr-R", "mr_bw_gbps", "mix", [0], "bw", [4 * MiB]),
             ("mr-R+2R", "mr_bw_gbps", "mix", [0, 1], "bw", [4 * MiB]),
             ("mr-3R", "mr_bw_gbps", "mix", [2], "bw", [4 * MiB]),
             ("mr-lat-1rail", "mr_lat_us", "lat", [0], "lat", pl["mr_lat_sizes"]),
             ("mr-lat-2rails", "mr_lat_us", "lat", [0, 1], "lat", pl["mr_lat_sizes"]),
             ("mr-pp-1rail", "mr_pp_gbps", "eq", [0], "pp", [MR_PP_SIZE]),
             ("mr-pp-2rails", "mr_pp_gbps", "eq", [0, 1], "pp", [MR_PP_SIZE]),
             ("fi-verbs-1rail", "mr_pp_gbps", "eq", [0], "fi", [MR_PP_SIZE]),
             ("fi-mrail-2rails", "mr_pp_gbps", "eq", [0, 1], "fi", [MR_PP_SIZE]),
             # the control: libfabric's own TCP provider, no diwarp
             ("fi-tcp-1rail", "mr_pp_gbps", "eq", [0], "fi-tcp", [MR_PP_SIZE]),
             ("fi-mrail-tcp-2rails", "mr_pp_gbps", "eq", [0, 1], "fi-tcp", [MR_PP_SIZE])]
        return [x for x in c if self.want_case(x[0])]

    MR_EXTRA = ("mr_prop", "mr_retx", "mr_tbf_prop")

    def run_multirail(self, r):
        self.mark_group("multirail")
        if not self.want_group("multirail"):
            return
        self.mr_fi_why = {}  # case -> the output of its failed run
        topos = Topos(os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns-topo.sh"),
                      r.log)
        old = signal.signal(signal.SIGTERM, sigterm_interrupts)
        try:
            self.mr_all(r, topos)
        finally:
            topos.down_all()
            signal.signal(signal.SIGTERM, old)

    # ---- shared: RD beside other programs (bench/run-shared.py)
    def run_shared(self, r):
        """Runs bench/run-shared.py (independent unpinned pairs through a
        forwarding namespace, a CPU hog, a build loop when --shared-build-loop
        names a build directory) and keeps its results for the report."""
        self.mark_group("shared")
        if not self.want_group("shared"):
            return
        here = os.path.dirname(os.path.abspath(__file__))
        js = os.path.join(r.logdir, "shared.json")
        argv = [sys.executable, os.path.join(here, "run-shared.py"), "--build", self.a.build,
                "--json", js]
        if self.a.quick:
            argv += ["--pairs", "2", "--rates", "2gbit", "--iters", "100",
                     "--stacks", "rd-thread"]
        if self.a.shared_build_loop:
            argv += ["--build-loop", self.a.shared_build_loop]
        print("run: shared: " + " ".join(argv[1:]), file=sys.stderr)
        p = subprocess.run(argv, capture_output=True, text=True)
        r.log.write(f"$ {' '.join(argv)}\n{p.stdout}{p.stderr}\n")
        self.sh_table = p.stdout
        self.sh_res = json.load(open(js)) if os.path.exists(js) else []
        for x in self.sh_res:
            if x["failed"]:
                self.failures.append((f"shared {x['case']} {x['stack']}", "shared", 0,
                                      "a pair failed (runs.log)"))
        if p.returncode != 0 and not self.sh_res:
            self.failures.append(("shared", "shared", 0,
                                  f"run-shared.py exit {p.returncode}: {p.stderr.strip()[-300:]}"))

    def shared_section(self):
        res = getattr(self, "sh_res", None)
        if res is None:
            return []
        L = ["## Shared hosts: RD beside other programs\n",
             "`bench/run-shared.py`: every end of every pair its own process, unpinned, "
             "`diwarp-bw --op write` of 1 MiB against `raw-sock --proto tcp --mode stream` "
             "of 1 MiB, from namespace A to B through a forwarding namespace with a tbf each "
             "way; `pairs-N`: N independent pairs at once, `hog`: one pair beside a `yes` "
             "per core, `build`: one pair beside a nice-19 build loop. Each stack's ratio is "
             "against TCP's aggregate in the same case, run right after it. Targets: pairs "
             "≥ 0.9 × TCP with Jain ≥ 0.9 and resends ≤ 1 % of datagrams, build ≥ 0.9, "
             "hog ≥ 0.7.\n",
             "| case | stack | Gbit/s | × TCP | Jain | resent % | take-overs |",
             "|---|---|---|---|---|---|---|"]
        for x in res:
            if x["failed"]:
                L.append(f"| {x['case']} | {x['stack']} | FAILED | | | | |")
                continue
            tcp = x["stack"] == "tcp"
            ratio = "" if x.get("ratio") is None else f"{x['ratio']:.2f}"
            retx = "" if tcp else f"{x['retx_pct']:.2f}"
            tko = "" if tcp else f"{x['takeovers']:.0f}"
            L.append(f"| {x['case']} | {x['stack']} | {x['gbps']:.3f} | {ratio} | "
                     f"{x['jain']:.2f} | {retx} | {tko} |")
        L.append("")
        return L

    def mr_mark(self, cases, status, why):
        for name, metric, _, _, _, sizes in cases:
            for s in sizes:
                p = self.pt(name, metric, s)
                p.status, p.reason, p.vals = status, why, []

    def mr_all(self, r, topos):
        pl = self.pl
        cases = self.mr_cases()
        if not cases:
            return
        # every point gets a row, whatever happens next
        for name, metric, _, _, _, sizes in cases:
            for s in sizes:
                self.pt(name, metric, s)
        if self.rd_ex_why:
            self.mr_mark(cases, "n/a", self.rd_ex_why)
            return
        if "fi_pingpong" not in self.prog:
            self.mr_mark([c for c in cases if c[4].startswith("fi")], "missing",
                         "fi_pingpong not installed")
            cases = [c for c in cases if not c[4].startswith("fi")]
        self.mr_t = {}
        for key, rates in mr_topos().items():
            if not any(c[2] == key for c in cases):
                continue
            try:
                self.mr_t[key] = topos.up(f"mr{os.getpid() % 100000}{key}", rates, "3ms",
                                          "64kb", kind="rails")
                self.mr_t[key]["script"] = topos.script
            except (NotAvailable, RunFailed) as e:
                st = "n/a" if isinstance(e, NotAvailable) else "failed"
                first = str(e).strip().splitlines()[0]
                self.mr_mark([c for c in cases if c[2] == key], st, first)
                if st == "failed":
                    self.failures.append((f"multirail {key}", "mr", 0, str(e)))
                print(f"run: multirail {key}: {first}", file=sys.stderr)
                cases = [c for c in cases if c[2] != key]
        # does the engine stripe at all? One short 2-rail run first.
        if "eq" in self.mr_t and any(len(c[3]) > 1 and c[4] == "bw" for c in cases):
            try:
                self.mr_bw(r, topos, self.mr_t["eq"], [0, 1], MiB, 0.2, "probe")
            except (RunFailed, NotAvailable) as e:
                # an engine that refuses the list (its complaint quotes
                # DIWARP_ADDR='...') has no multirail: not available
                na = isinstance(e, NotAvailable) or "DIWARP_ADDR='" in str(e)
                why = str(e).strip().splitlines()[0]
                why = f"a 2-rail diwarp-bw run (DIWARP_ADDR=a,b) failed: {why}"
                ours = [c for c in cases if not c[4].startswith("fi")]
                self.mr_mark(ours, "n/a" if na else "failed", why)
                if not na:
                    self.failures.append(("multirail probe", "mr_bw_gbps", MiB, str(e)))
                cases = [c for c in cases if c[4].startswith("fi")]
        broken = {}
        for rnd in range(pl["runs"]):
            for name, metric, key, rails, what, sizes in cases:
                t = self.mr_t[key]
                for s in sizes:
                    p = self.pt(name, metric, s)
                    if p.status != "ok":
                        continue
                    if name in broken and s > broken[name]:
                        p.status, p.reason = "skipped", "failed at a smaller size"
                        continue
                    try:
                        if what == "bw":
                            res = self.mr_bw(r, topos, t, rails, s, pl["mr_secs"], name)
                        elif what == "lat":
                            res = self.mr_lat(r, t, rails, s, name)
                        else:
                            res = self.mr_pp(r, t, rails, s, name, what)
                    except NotAvailable as e:
                        p.status, p.reason, p.vals = "n/a", str(e), []
                        continue
                    except RunFailed as e:
                        if what.startswith("fi"):
                            # libfabric's experimental provider: its failure is a
                            # finding for the report, not a failure of ours
                            first = str(e).strip().splitlines()[0]
                            p.status, p.reason, p.vals = "n/a", f"did not run: {first}", []
                            self.mr_fi_why[name] = str(e)
                            continue
                        self.fail_point([(name, metric, s)] +
                                        [(name, m, s) for m in self.MR_EXTRA
                                         if (name, m, s) in self.points], str(e))
                        broken[name] = min(broken.get(name, s), s)
                        continue
                    for m, v in res.items():
                        self.pt(name, m, s).vals.append(v)
            print(f"run: multirail round {rnd + 1}/{pl['runs']} "
                  f"({time.monotonic() - self.t0:.0f} s)", file=sys.stderr)

    @staticmethod
    def mr_addrs(t, side, rails):
        lst = t[f"{side}_rails"].split(",")
        return ",".join(lst[i] for i in rails)

    @staticmethod
    def mr_rail_lines(text):
        out = []
        for line in text.splitlines():
            if line.startswith("RAIL "):
                out.append(dict(re.findall(r"(\w+)=(\S+)", line)))
        return out

    def mr_bw(self, r, topos, t, rails, size, secs, label):
        """One RD Write stream over the given rails: Gbit/s, and how each
        rail's share of tx_bytes compares with its share of the rate."""
        rates = [rate_gbps(x) for x in t["rate"].split(",")]
        total = sum(rates[i] for i in rails)
        iters = max(4, math.ceil(secs * total * 1e9 * 0.9 / 8 / size))
        window = max(2, min(64, 32 * MiB // size))
        bw = self.prog["diwarp-bw"]
        exe = [t["script"], "exec", t["name"]]
        a, b = self.mr_addrs(t, "a", rails), self.mr_addrs(t, "b", rails)
        srv = exe + ["B", "env", f"DIWARP_ADDR={b}", bw, "--port", "{port}", "--timeout",
                     "20000"]
        cli = exe + ["A", "env", f"DIWARP_ADDR={a}", bw, "--port", "{port}", "--timeout",
                     "20000", "--transport", "rd", "--op", "write", "--size", str(size),
                     "--iters", str(iters), "--window", str(window), t["b"]]
        before = topos.stats_rails(t["name"])
        o = r.run_pair(f"multirail {label} {size_name(size)} x{iters} DIWARP_ADDR={a}", srv,
                       cli, {}, self.pl["timeout"], listen=False)
        after = topos.stats_rails(t["name"])
        res, v = result_of(o["client"], o["log"], ["gbps"])
        out = {"mr_bw_gbps": v["gbps"]}
        if "retx" in res:
            out["mr_retx"] = float(res["retx"])
        tbf = [after.get(("A", i + 1), 0) - before.get(("A", i + 1), 0) for i in rails]
        r.log.write(f"    tbf bytes of A's rails {[i + 1 for i in rails]} over the run: {tbf}\n")
        if len(rails) > 1:
            rl = self.mr_rail_lines(o["client"])
            if len(rl) != len(rails):
                raise RunFailed(f"diwarp-bw printed {len(rl)} RAIL lines for DIWARP_ADDR={a} "
                                f"({len(rails)} rails)\n{o['log']}")
            tx = [int(x.get("tx_bytes", 0)) for x in rl]
            if sum(tx) <= 0 or sum(tbf) <= 0:
                raise RunFailed(f"the rails sent nothing (RAIL tx_bytes {tx}, tbf {tbf})\n"
                                f"{o['log']}")
            want = [rates[i] / total for i in rails]
            out["mr_prop"] = min(x / sum(tx) / w for x, w in zip(tx, want))
            out["mr_tbf_prop"] = min(x / sum(tbf) / w for x, w in zip(tbf, want))
        return out

    def mr_lat(self, r, t, rails, size, label):
        pp = self.prog["diwarp-pingpong"]
        exe = [t["script"], "exec", t["name"]]
        a, b = self.mr_addrs(t, "a", rails), self.mr_addrs(t, "b", rails)
        srv = exe + ["B", "env", f"DIWARP_ADDR={b}", pp, "--port", "{port}"]
        cli = exe + ["A", "env", f"DIWARP_ADDR={a}", pp, "--port", "{port}", "--transport", "rd",
                     "--size", str(size), "--iters", str(lat_iters(size, self.a.quick)), t["b"]]
        o = r.run_pair(f"multirail {label} {size} B DIWARP_ADDR={a}", srv, cli, {},
                       self.pl["timeout"], listen=False)
        return {"mr_lat_us": result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]}

    def mr_pp(self, r, t, rails, size, label, what):
        """One message at a time: size / the time of one. Ours: RDMA Reads
        of size (`diwarp-pingpong --transport rd --op read`, DIWARP_ADDR over
        the rails: the data leaves by the server's rails); libfabric: half the
        round trip of a Send ping-pong, fi_pingpong through `diwarp run`
        (verbs;ofi_rxm on one rail; ofi_mrail with FI_OFI_MRAIL_ADDR over the
        rails, the device unpinned)."""
        rate = sum(rate_gbps(x) for x in t["rate"].split(",")[:len(rails)])
        n = max(4, math.ceil(self.pl["mr_secs"] * rate * 1e9 * 0.9 / 8 / size / 2))
        exe = [t["script"], "exec", t["name"]]
        a, b = self.mr_addrs(t, "a", rails), self.mr_addrs(t, "b", rails)
        if what == "pp":
            pp = self.prog["diwarp-pingpong"]
            srv = exe + ["B", "env", f"DIWARP_ADDR={b}", pp, "--port", "{port}", "--timeout",
                         "20000"]
            # RDMA Reads one at a time: the RD Send ping-pong of large
            # messages is not reliable yet (docs/PERFORMANCE.md "Multirail")
            cli = exe + ["A", "env", f"DIWARP_ADDR={a}", pp, "--port", "{port}", "--timeout",
                         "20000", "--transport", "rd", "--op", "read", "--size", str(size),
                         "--iters", str(n), t["b"]]
            o = r.run_pair(f"multirail {label} {size_name(size)} DIWARP_ADDR={a}", srv, cli, {},
                           self.pl["timeout"], listen=False)
            lat = result_of(o["client"], o["log"], ["lat_us"])[1]["lat_us"]
        else:
            fpp = self.prog["fi_pingpong"]
            base = "verbs;ofi_rxm" if what == "fi" else "tcp;ofi_rxm"
            prov = base + ";ofi_mrail" if len(rails) > 1 else base
            # ofi_mrail: its rails' addresses, and its warnings (why it
            # does not send) in the log
            ea = [f"FI_OFI_MRAIL_ADDR={a}", "FI_LOG_LEVEL=warn"] if len(rails) > 1 else []
            eb = [f"FI_OFI_MRAIL_ADDR={b}", "FI_LOG_LEVEL=warn"] if len(rails) > 1 else []
            args = ["-p", prov, "-e", "rdm", "-I", str(n), "-S", str(size)]
            # through diwarp: one rail with the device pinned to it
            # (unpinned, ofi_rxm's connection is refused); ofi_mrail with the
            # device unpinned (both addresses)
            run, runa, runb = [], [], []
            if what == "fi":
                run = [self.prog["diwarp"], "run"]
                runa, runb = (run + ["--addr", a, "--"], run + ["--addr", b, "--"]) \
                    if len(rails) == 1 else (run + ["--"], run + ["--"])
            srv = exe + ["B", "env"] + eb + runb + [fpp] + args + ["-B", "{port}"]
            # fi_pingpong's client does not retry its connect: the server
            # (behind ip netns exec and diwarp run) gets a second to listen
            cli = exe + ["A", "sh", "-c", 'sleep 1; exec "$@"', "sh", "env"] + ea + runa + \
                [fpp] + args + ["-P", "{port}", t["b"]]
            o = r.run_pair(f"multirail {label} {size_name(size)}", srv, cli,
                           {"DIWARP_PROGRESS": None}, min(self.pl["timeout"], 20),
                           listen=False)
            lat = parse_table(o["client"], r"bytes\s+#sent\s+#ack", 6)
            lat = positive(lat, "usec/xfer", o["log"])
        return {"mr_pp_gbps": size * 8 / (lat * 1e3)}

    def mr_section(self):
        keys = [k for k in self.order if k[1].startswith("mr_")]
        if not keys:
            return []

        def s(case, metric, size):
            return self.summary((case, metric, size)) if (case, metric, size) in self.points \
                else None

        def cell(case, metric, size):
            k = (case, metric, size)
            return self.cell(k, ratio=False) if k in self.points else "–"

        T = []  # (id, text, measured, status, note)

        def target(tid, text, num, den, metric, size, limit, upper):
            a, b = s(num, metric, size), s(den, metric, size)
            if not a or not b:
                why = [self.points[k].reason or self.points[k].status
                       for k in ((num, metric, size), (den, metric, size))
                       if k in self.points and self.points[k].status != "ok"]
                T.append((tid, text, "–", "not measured", "; ".join(why[:1])))
                return
            ratio = a["med"] / b["med"]
            status, note = self.judge(ratio, a["lo"] / b["med"], a["hi"] / b["med"], limit,
                                      upper)
            notes = [note] if note else []
            if a["noisy"] or b["noisy"]:
                notes.append("noisy point")
            T.append((tid, text, f"{ratio:.3f} ({fmt(a['med'])} / {fmt(b['med'])})", status,
                      "; ".join(notes)))

        pl = self.pl
        R = MR_RATE
        for size in [x for x in pl["mr_sizes"] if x > MiB]:
            target("MR-5", f"RD Write {size_name(size)}, 2 rails / 1 rail ≥ 1.7",
                   "mr-2rails", "mr-1rail", "mr_bw_gbps", size, 1.7, False)
            target("MR-5", f"RD Write {size_name(size)}, 3 rails / 1 rail ≥ 2.55",
                   "mr-3rails", "mr-1rail", "mr_bw_gbps", size, 2.55, False)
        target("MR-6", "RD Write 1 MiB (4 chunks of 256 KiB), 3 rails / 2 rails ≥ 1.2",
               "mr-3rails", "mr-2rails", "mr_bw_gbps", MiB, 1.2, False)
        target("MR-9", f"RD Write 4 MiB, rails of {R} + {2 * R} Mbit/s / one rail of {3 * R} "
               "≥ 0.85", "mr-R+2R", "mr-3R", "mr_bw_gbps", 4 * MiB, 0.85, False)
        for size in pl["mr_lat_sizes"]:
            target("MR-7", f"RD ping-pong {size_name(size)}, 2 rails / 1 rail ≤ 1.02",
                   "mr-lat-2rails", "mr-lat-1rail", "mr_lat_us", size, 1.02, True)
        L = ["## Multirail: RD striped over rails\n",
             f"`bench/netns-topo.sh up NAME rails ...`: namespaces A and B joined by one veth "
             f"pair per rail (a subnet each), a tbf on both ends of each. `eq`: 3 rails of {R} "
             f"Mbit/s; `mix`: rails of {R}, {2 * R} and {3 * R} Mbit/s; `lat`: 2 rails of "
             f"{MR_LAT_RATE}. A case uses the rails its DIWARP_ADDR lists (the same list, the "
             "peer's addresses, on the server), on the same topology as the cases it is "
             f"compared with. `diwarp-bw --transport rd --op write` for about {pl['mr_secs']:g} s "
             "of transfer at the rails' rate, `diwarp-pingpong --transport rd`; server on core "
             f"{self.r.srv_cpu}, client on core {self.r.cli_cpu}, application-driven progress. "
             f"Medians of {pl['runs']} rounds, every case of a round side by side.\n",
             "| target | case | measured (ratio of medians) | status | note |",
             "|---|---|---|---|---|"]
        for t in T:
            L.append(f"| {t[0]} | {t[1]} | {t[2]} | {t[3]} | {t[4]} |")
        L.append("")
        sizes = sorted({k[2] for k in keys if k[1] == "mr_bw_gbps" and k[0] in
                        ("mr-1rail", "mr-2rails", "mr-3rails")})
        if sizes:
            L += [f"RD Write Gbit/s, `eq` (rails of {R} Mbit/s): median (min–max); "
                  "prop = the smallest rail share of tx_bytes over its share of the rate "
                  "(1 = striped in proportion), from the client's RAIL lines (tbf: from the "
                  "tbf byte counters of A's veths).\n",
                  "| size | 1 rail | 2 rails | 3 rails | 2 / 1 | 3 / 1 | 3 / 2 | prop 2 (tbf) "
                  "| prop 3 (tbf) |", "|---|---|---|---|---|---|---|---|---|"]
            for size in sizes:
                med = {c: (s(c, "mr_bw_gbps", size) or {}).get("med")
                       for c in ("mr-1rail", "mr-2rails", "mr-3rails")}

                def rt(x, y):
                    return f"×{med[x] / med[y]:.2f}" if med[x] and med[y] else "–"

                def prop(c):
                    a, b = s(c, "mr_prop", size), s(c, "mr_tbf_prop", size)
                    return (f"{a['med']:.2f}" if a else "–") + \
                        (f" ({b['med']:.2f})" if b else "")
                L.append(f"| {size_name(size)} | {cell('mr-1rail', 'mr_bw_gbps', size)} | "
                         f"{cell('mr-2rails', 'mr_bw_gbps', size)} | "
                         f"{cell('mr-3rails', 'mr_bw_gbps', size)} | "
                         f"{rt('mr-2rails', 'mr-1rail')} | {rt('mr-3rails', 'mr-1rail')} | "
                         f"{rt('mr-3rails', 'mr-2rails')} | {prop('mr-2rails')} | "
                         f"{prop('mr-3rails')} |")
            L.append("")
        if any(k[0] in ("mr-R", "mr-R+2R", "mr-3R") for k in keys):
            a, b = s("mr-R", "mr_bw_gbps", 4 * MiB), s("mr-R+2R", "mr_bw_gbps", 4 * MiB)
            p = s("mr-R+2R", "mr_prop", 4 * MiB)
            L.append(f"Unequal rails (`mix`), RD Write 4 MiB, Gbit/s: rails of {R} + {2 * R} "
                     f"Mbit/s {cell('mr-R+2R', 'mr_bw_gbps', 4 * MiB)} (prop " +
                     (f"{p['med']:.2f}" if p else "–") + "; ×" +
                     (f"{b['med'] / a['med']:.2f}" if a and b else "–") +
                     f" one rail of {R}: {cell('mr-R', 'mr_bw_gbps', 4 * MiB)}); one rail of "
                     f"{3 * R}: {cell('mr-3R', 'mr_bw_gbps', 4 * MiB)}.\n")
        lat = sorted({k[2] for k in keys if k[1] == "mr_lat_us"})
        if lat:
            L += [f"RD ping-pong, half the round trip (µs), `lat` (2 rails of {MR_LAT_RATE}): "
                  "messages below DIWARP_STRIPE_MIN stay on rail 0, so this is the cost of "
                  "having a second rail configured.\n",
                  "| size | 1 rail | 2 rails | 2 / 1 |", "|---|---|---|---|"]
            for size in lat:
                a, b = s("mr-lat-1rail", "mr_lat_us", size), s("mr-lat-2rails", "mr_lat_us",
                                                                 size)
                L.append(f"| {size_name(size)} | {cell('mr-lat-1rail', 'mr_lat_us', size)} | "
                         f"{cell('mr-lat-2rails', 'mr_lat_us', size)} | " +
                         (f"×{b['med'] / a['med']:.3f}" if a and b else "–") + " |")
            L.append("")
        if any(k[1] == "mr_pp_gbps" for k in keys):
            L += [f"Beside libfabric's multirail provider: one {size_name(MR_PP_SIZE)} message "
                  "at a time on rails 1 and 2 of `eq`, size / the time of one message (Gbit/s). "
                  "Ours: `diwarp-pingpong --transport rd --op read` (one RDMA Read at a time, "
                  "the data leaving by the server's rails), DIWARP_ADDR one or two rails. "
                  "libfabric: half the round trip of `fi_pingpong -e rdm` through `diwarp run`: "
                  "`-p 'verbs;ofi_rxm'` with the device pinned to rail 1 (`--addr`), `-p "
                  "ofi_mrail` with FI_OFI_MRAIL_ADDR listing both rails' addresses and the device "
                  "unpinned (it has every address of its namespace; one verbs;ofi_rxm endpoint "
                  "per rail, RC QPs); the control: the same over libfabric's own "
                  "`tcp;ofi_rxm`, no diwarp. A libfabric run that fails is not ours: its row "
                  "says \"n/a\" and its output follows the table.\n",
                  "| stack | 1 rail | 2 rails | 2 / 1 |", "|---|---|---|---|"]
            for nm, one, two in (("diwarp RD (ours)", "mr-pp-1rail", "mr-pp-2rails"),
                                 ("libfabric ofi_mrail over verbs;ofi_rxm (diwarp0)",
                                  "fi-verbs-1rail", "fi-mrail-2rails"),
                                 ("libfabric ofi_mrail over tcp;ofi_rxm (no diwarp: the "
                                  "control)", "fi-tcp-1rail", "fi-mrail-tcp-2rails")):
                a, b = s(one, "mr_pp_gbps", MR_PP_SIZE), s(two, "mr_pp_gbps", MR_PP_SIZE)
                L.append(f"| {nm} | {cell(one, 'mr_pp_gbps', MR_PP_SIZE)} | "
                         f"{cell(two, 'mr_pp_gbps', MR_PP_SIZE)} | " +
                         (f"×{b['med'] / a['med']:.2f}" if a and b else "–") + " |")
            L.append("")
            for name, why in self.mr_fi_why.items():
                L.append(f"libfabric: `{name}` did not run; its output:\n\n```\n"
                         f"{why.strip()[:1200]}\n```\n")
        return L

    def mpi_job(self, r, label, argv, env, ns, min_timeout):
        """Runs one MPI launch (argv, started in namespace ns[0]) to its end or
        its timeout (at least min_timeout s; the namespaces' MPI processes are
        then killed); logs it. Returns (exit code or "timeout", output)."""
        r.nruns += 1
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, env=env, capture_output=True, text=True,
                               timeout=max(self.pl["timeout"], min_timeout),
                               start_new_session=True)
            code, o = p.returncode, (p.stdout + p.stderr)
        except subprocess.TimeoutExpired as e:
            code, o = "timeout", str(e.stdout or "") + str(e.stderr or "")
            self.mpi_down_procs(ns)
        r.log.write(f"== {label}: exit {code} wall {time.monotonic() - t0:.1f}s: "
                    f"{' '.join(argv)}\n    output: {o.strip()[-1500:]}\n")
        r.log.flush()
        return code, o

    def mpi_section(self):
        """The report's MPI section (empty when the group did not run)."""
        if not any(k[1].startswith("mpi_") for k in self.order):
            return []
        cases = [s for s in self.MPI_STACKS if any(k[0] == s[0] for k in self.order)]
        L = ["## MPI: NetPIPE over Open MPI between two namespace hosts\n",
             "Open MPI 4.1 `mpirun -np 2 --bind-to none` from namespace A, the second rank "
             "in namespace B (a veth pair, MTU 1500), started by `tools/mpi-netns-agent`, "
             "the diwarp device as it comes (no `--addr`, transport `auto`); "
             + (f"{self.a.mpi_jobs} such jobs at once ({2 * self.a.mpi_jobs} ranks on the "
                "host's cores): latency the median of the jobs', bandwidth their sum; "
                if self.a.mpi_jobs > 1 else "") +
             f"NetPIPE (`NPopenmpi -p 0`): latency from `-l 1 -u 8 -n {self.pl['mpi_lat_reps']}` "
             "(the median of 2, 3, 4, 6 and 8 B: the first size, 1 B, pays the warm-up, "
             "rxm connecting on the first message), "
             f"bandwidth from `-l {min(self.MPI_BW) // 4} -u {max(self.MPI_BW)} -n "
             f"{self.pl['mpi_reps']}` (ping-pong, one-way time = half the round trip, the best "
             "of its trials). "
             "diwarp rows: `diwarp run` with `--mca pml cm --mca mtl ofi --mca "
             "mtl_ofi_provider_include 'verbs;ofi_rxm'`, the provider's default progress. "
             "Each cell: median (min–max) of the rounds, ×ratio against ob1/tcp and against "
             "the best TCP path at that size (the lower latency, the higher bandwidth of "
             "ob1/tcp and libfabric tcp;ofi_rxm).\n"]
        cols = [("mpi_lat_us", self.MPI_LAT, "latency 2–8 B (µs)", min)] + \
               [("mpi_bw_gbps", s, f"{size_name(s)} (Gbit/s)", max) for s in self.MPI_BW]
        L.append("| stack | " + " | ".join(c[2] for c in cols) + " |")
        L.append("|---" * (len(cols) + 1) + "|")
        med = {}
        for c in cases:
            for m, s, _, _ in cols:
                p = self.points.get((c[0], m, s))
                med[(c[0], m, s)] = statistics.median(p.vals) if p and p.status == "ok" and \
                    p.vals else None
        for c in cases:
            cells = []
            for m, s, _, best in cols:
                p = self.points[(c[0], m, s)]
                v = med[(c[0], m, s)]
                if v is None:
                    cells.append(p.status if p.status != "n/a" else "not available")
                    continue
                lo, hi = min(p.vals), max(p.vals)
                cell = f"{fmt(v)} ({fmt(lo)}–{fmt(hi)})"
                if hi / lo > self.a.noise:
                    cell += " ⚠"
                b = med.get(("mpi-ob1-tcp", m, s))
                tcp = [med.get((t, m, s)) for t in self.MPI_TCP]
                tcp = [t for t in tcp if t]
                if b and c[0] != "mpi-ob1-tcp":
                    cell += f" ×{v / b:.2f} ob1"
                if tcp and c[0] not in self.MPI_TCP:
                    cell += f" ×{v / best(tcp):.2f} best TCP"
                cells.append(cell)
            L.append(f"| {c[1]} | " + " | ".join(cells) + " |")
        L.append("")
        # the target: latency <= ob1/tcp's, bandwidth >= the best TCP path's
        for c in cases:
            if c[0] in self.MPI_TCP:
                continue
            miss = []
            for m, s, name, best in cols:
                v = med[(c[0], m, s)]
                ref = [med.get(("mpi-ob1-tcp", m, s))] if m == "mpi_lat_us" else \
                      [med.get((t, m, s)) for t in self.MPI_TCP]
                ref = [x for x in ref if x]
                if v is None or not ref:
                    miss.append(f"{name}: not measured")
                elif (m == "mpi_lat_us" and v > ref[0]) or (m != "mpi_lat_us" and v < max(ref)):
                    miss.append(f"{name} ×{v / (ref[0] if m == 'mpi_lat_us' else max(ref)):.2f}")
            L.append(f"- target (latency ≤ ob1/tcp, bandwidth ≥ best TCP) for {c[1]}: " +
                     ("met at these sizes" if not miss else "missed: " + ", ".join(miss)))
        L.append("")
        return L

    def mvapich_section(self):
        """The report's MVAPICH2 section (empty when the group did not run)."""
        if not any(k[1].startswith("mv2_") for k in self.order):
            return []
        cases = [s for s in self.MV2_STACKS if any(k[0] == s[0] for k in self.order)]
        tune = self.mv2_tuning()
        L = ["## MVAPICH2: OSU benchmarks between two namespace hosts\n",
             "MVAPICH2 (tools/build-mvapich2.sh, `MVAPICH2_PREFIX`) launched by Hydra "
             "(`mpiexec.hydra -launcher rsh`, `tools/mpi-netns-agent`) from namespace A under "
             "`diwarp run --addr`, one rank in A and one in B (a veth pair, MTU 1500), "
             f"ranks pinned to cores {self.a.cpus} (`taskset`); "
             + " ".join(f"`{k}={v}`" for k, v in {**self.MV2_ENV, **tune}.items()) +
             ". Baseline: the same OSU benchmarks built against Open MPI 4.1, `mpirun --mca "
             "pml ob1 --mca btl self,tcp`, launched and pinned alike. "
             f"OSU 5.9 `-i {self.pl['mv2_lat_iters']}` (latency) / "
             + (f"`-i {self.pl['mv2_bw_iters']}`" if self.pl["mv2_bw_iters"] is not None
                else "OSU's own iteration counts (100 up to 8 KiB, 20 above)")
             + " (bandwidth, window 64). Each cell: median "
             "(min–max) of the rounds, ×ratio against ob1/tcp.\n"]
        med = {}
        for c in cases:
            for _, m in self.MV2_BENCH:
                for s in self.MV2_SIZES:
                    p = self.points.get((c[0], m, s))
                    med[(c[0], m, s)] = statistics.median(p.vals) if p and p.status == "ok" \
                        and p.vals else None
        for bench, m in self.MV2_BENCH:
            unit = "µs" if m == "mv2_lat_us" else "MB/s"
            L.append(f"### {bench} ({unit})\n")
            L.append("| size | " + " | ".join(c[1] for c in cases) + " |")
            L.append("|---" * (len(cases) + 1) + "|")
            for s in self.MV2_SIZES:
                cells = []
                for c in cases:
                    p = self.points[(c[0], m, s)]
                    v = med[(c[0], m, s)]
                    if v is None:
                        cells.append(p.status if p.status != "n/a" else "not available")
                        continue
                    lo, hi = min(p.vals), max(p.vals)
                    cell = f"{fmt(v)} ({fmt(lo)}–{fmt(hi)})"
                    if hi / lo > self.a.noise:
                        cell += " ⚠"
                    b = med.get((self.MV2_BASE, m, s))
                    if b and c[0] != self.MV2_BASE:
                        cell += f" ×{v / b:.2f}"
                    cells.append(cell)
                L.append(f"| {size_name(s)} | " + " | ".join(cells) + " |")
            L.append("")
        # the targets: latency <= ob1/tcp's at <= 8 B, bandwidth >= ob1/tcp's from 4 KiB
        for c in cases:
            if c[0] == self.MV2_BASE:
                continue
            miss = []
            for s in self.MV2_SIZES:
                for m, ok in (("mv2_lat_us", s <= 8), ("mv2_bw_mbs", s >= 4 * KiB)):
                    if not ok:
                        continue
                    v, b = med[(c[0], m, s)], med.get((self.MV2_BASE, m, s))
                    if v is None or b is None:
                        miss.append(f"{m} {size_name(s)}: not measured")
                    elif (m == "mv2_lat_us" and v > b) or (m == "mv2_bw_mbs" and v < b):
                        miss.append(f"{'latency' if m == 'mv2_lat_us' else 'bandwidth'} "
                                    f"{size_name(s)} ×{v / b:.2f}")
            L.append(f"- target (latency ≤ ob1/tcp at ≤ 8 B, bandwidth ≥ ob1/tcp from 4 KiB) "
                     f"for {c[1]}: " + ("met" if not miss else "missed: " + ", ".join(miss)))
        L.append("")
        return L

    # ---- output
    BASE = {"lat_us": {"dgram": "raw-udp", "stream": "raw-tcp"},
            "bw_gbps": {"dgram": "raw-tcp", "stream": "raw-tcp"},
            "cpu_s_per_gb": {"dgram": "raw-tcp", "stream": "raw-tcp"},
            "msgrate_mps": {"dgram": "raw-udp", "stream": "raw-tcp"},
            # the contention group's loopback check
            "lo_bw_gbps": {"dgram": "raw-tcp", "stream": "raw-tcp"},
            "lo_lat_us": {"dgram": "raw-udp", "stream": "raw-tcp"}}

    def baseline(self, case, metric, size):
        if metric.startswith("mpi_"):
            b = "mpi-ob1-tcp"  # Open MPI's own TCP path
        elif metric.startswith("mv2_"):
            b = self.MV2_BASE  # Open MPI ob1/tcp, the same OSU benchmarks
        elif metric == "cont_gbps":
            b = self.cont_base.get(case)  # raw TCP (default cc) on the same path
        else:
            fam = self.family.get(case)
            if metric not in self.BASE or fam is None:
                return None
            b = self.BASE[metric][fam]
        if b is None or b == case:
            return None
        p = self.points.get((b, metric, size))
        if not p or p.status != "ok" or not p.vals:
            return None
        return statistics.median(p.vals)

    def summary(self, key):
        p = self.points[key]
        if p.status != "ok" or not p.vals:
            return None
        med, lo, hi = stats(p.vals)
        base = self.baseline(*key)
        ratio = med / base if base else None
        if lo > 0:
            noisy = hi / lo > self.a.noise
        else:  # values that may be 0 or negative (overlap): spread against the median
            noisy = hi - lo > (self.a.noise - 1) * max(abs(med), 1e-12)
        return dict(med=med, lo=lo, hi=hi, base=base, ratio=ratio, n=len(p.vals), noisy=noisy)

    def write_csv(self, path):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "metric", "size", "value", "baseline", "ratio", "runs", "min",
                        "max"])
            for k in self.order:
                p = self.points[k]
                s = self.summary(k)
                if s is None:
                    st = {"n/a": "not-available"}.get(p.status, p.status)
                    w.writerow([k[0], k[1], k[2], st, "", "", 0, "", ""])
                    continue
                w.writerow([k[0], k[1], k[2], f"{s['med']:.6g}",
                            f"{s['base']:.6g}" if s["base"] else "",
                            f"{s['ratio']:.4f}" if s["ratio"] else "", s["n"],
                            f"{s['lo']:.6g}", f"{s['hi']:.6g}"])

    def runs_of(self, metric):
        if metric.startswith(("cont_", "lo_", "slow_")):
            return self.pl["cont_runs"]
        if metric.startswith(("mpi_", "mv2_", "mr_")):
            return self.pl["runs"]
        return self.pl["runs"] if metric in self.BASE else self.pl["seed_runs"]

    def cell(self, key, ratio=True):
        p = self.points.get(key)
        if p is None:
            return ""
        s = self.summary(key)
        if s is None:
            return {"n/a": "n/a", "failed": "**FAILED**", "missing": "missing",
                    "skipped": "skipped"}.get(p.status, p.status)
        txt = f"{fmt(s['med'])} ({fmt(s['lo'])}–{fmt(s['hi'])})"
        want = self.runs_of(key[1])
        if s["n"] < want:
            txt += f" n={s['n']}"  # runs without a number (CPU below setup noise)
        if ratio and s["ratio"]:
            txt += f" ×{s['ratio']:.2f}"
        if s["noisy"]:
            txt += " ⚠"
        return txt

    def table(self, metric, title, unit_note, sizes=None, ratio=True, size_fmt=size_name,
              col="size"):
        keys = [k for k in self.order if k[1] == metric]
        if not keys:
            return ""
        rank = {c.name: i for i, c in enumerate(self.cases + self.extra_cases)}
        rank.update({c: len(rank) + i for i, c in enumerate(self.cont_order)})
        cases = []
        for k in keys:
            if k[0] not in cases:
                cases.append(k[0])
        cases.sort(key=lambda c: rank.get(c, len(rank)))
        sizes = sorted({k[2] for k in keys})
        out = [f"### {title}\n"] + ([unit_note + "\n"] if unit_note else [])
        out.append("| case | " + " | ".join(size_fmt(s) for s in sizes) + " |")
        out.append("|---|" + "---|" * len(sizes))
        for c in cases:
            out.append(f"| {c} | " + " | ".join(self.cell((c, metric, s), ratio) for s in sizes)
                       + " |")
        return "\n".join(out) + "\n"

    def value(self, case, metric, size):
        s = self.summary((case, metric, size)) if (case, metric, size) in self.points else None
        return s

    def judge(self, ratio, lo, hi, limit, upper, digits=2):
        """'met' or 'missed', and a note when the runs straddle the limit. lo,
        hi: the ratio of the fastest and slowest run to the other side's
        median; a limit inside that range is borderline."""
        ok = ratio <= limit if upper else ratio >= limit
        note = ""
        if min(lo, hi) <= limit <= max(lo, hi):
            note = f"borderline: runs span {min(lo, hi):.{digits}f}–{max(lo, hi):.{digits}f}"
        return ("met" if ok else "missed"), note

    def verdict(self, T, area, text, ratio, lo, hi, detail, limit, upper, noisy):
        status, note = self.judge(ratio, lo, hi, limit, upper)
        notes = [note] if note else []
        if noisy:
            notes.append("noisy point")
        T.append((area, text, f"{ratio:.2f} {detail}", status, "; ".join(notes)))

    def ratio_target(self, T, area, text, case, metric, size, limit, upper):
        """The point's ratio to its baseline (Harness.baseline)."""
        k = (case, metric, size)
        p = self.points.get(k)
        s = self.summary(k) if p else None
        if s is None or s["ratio"] is None:
            why = (p.reason if p and p.reason else
                   "not measured in this run" if not p or p.status == "ok" else p.status)
            if p and p.status == "ok" and s and s["ratio"] is None:
                why = "baseline missing"
            T.append((area, text, "", "not yet measurable", why))
            return
        self.verdict(T, area, text, s["ratio"], s["lo"] / s["base"], s["hi"] / s["base"],
                     f"({fmt(s['med'])} vs {fmt(s['base'])})", limit, upper, s["noisy"])

    def pair_target(self, T, area, text, a, b, metric, size, limit, upper, note=""):
        """a / b at one point (two cases of this run)."""
        x, y = self.value(a, metric, size), self.value(b, metric, size)
        if not x or not y:
            miss = (a, metric, size) if not x else (b, metric, size)
            T.append((area, text, "", "not yet measurable", f"{miss[0]}: {self.why(*miss)}"))
            return
        self.verdict(T, area, text, x["med"] / y["med"], x["lo"] / y["med"],
                     x["hi"] / y["med"], f"({fmt(x['med'])} vs {fmt(y['med'])}{note})", limit,
                     upper, x["noisy"] or y["noisy"])

    def targets(self):
        """(area, target, measured, status, why)."""
        T = []

        def ratio_target(*a):
            self.ratio_target(T, *a)

        def pair_target(*a, **kw):
            self.pair_target(T, *a, **kw)

        ratio_target("engine", "UD 64 B send ping-pong ≤ 1.15 × raw UDP", "diwarp-ud", "lat_us", 64,
                     1.15, True)
        ratio_target("engine", "RC 64 B send ping-pong ≤ 1.20 × raw TCP", "diwarp-rc", "lat_us", 64,
                     1.20, True)
        ratio_target("engine", "RC RDMA Write stream 1 MiB, CRC off ≥ 0.85 × raw TCP",
                     "diwarp-rc-write-nocrc", "bw_gbps", MiB, 0.85, False)
        ratio_target("engine", "RC RDMA Write stream 1 MiB, CRC on ≥ 0.75 × raw TCP",
                     "diwarp-rc-write", "bw_gbps", MiB, 0.75, False)
        # progress thread: idle CPU reported; Read against a computing target completes
        s = self.value("diwarp-thread", "idle_cpu_pct", 0)
        if s:
            T.append(("engine", "progress thread idle CPU reported (goal: ≤ 1 % of a core)",
                      f"{s['med']:.3f} %", "met" if s["med"] <= 1 else "missed", ""))
        else:
            T.append(("engine", "progress thread idle CPU reported", "", "not yet measurable",
                      self.why("diwarp-thread", "idle_cpu_pct", 0)))
        # the target computes D = 10 t(0) without calling diwarp: a Read that
        # waits for it takes about 11 t(0); one served meanwhile, about 1
        s = self.value("diwarp-rc-thread", "progress_ratio", self.pl["ov_size"])
        n = self.value("diwarp-rc-app", "progress_ratio", self.pl["ov_size"])
        if s:
            T.append(("engine", "RDMA Read of 1 MiB completes while the target computes "
                      "(DIWARP_PROGRESS=thread; t(D)/t(0) ≤ 2 against ≈ 11 without progress)",
                      f"t(D)/t(0) = {s['med']:.2f} ({fmt(s['lo'])}–{fmt(s['hi'])})" +
                      (f"; application progress {n['med']:.1f}" if n else ""),
                      "met" if s["med"] <= 2 else "missed",
                      ("stricter goal ≤ 1.10: " + ("within" if s["med"] <= 1.10 else "above")) +
                      ("; noisy point" if s["noisy"] else "")))
        else:
            T.append(("engine", "RDMA Read of 1 MiB completes while the target computes", "",
                      "not yet measurable",
                      self.why("diwarp-rc-thread", "progress_ratio", self.pl["ov_size"])))
        u = [k for k in self.order if k[0].endswith("-uring") and k[1] in ("lat_us", "bw_gbps")]
        got = [k for k in u if self.summary(k)]
        if got:
            T.append(("engine", "io_uring backend compared with the plain one in bench/",
                      ", ".join(f"{k[0]} {k[1]} {size_name(k[2])} ×{self.cmp_plain(k)}"
                                for k in got), "met", "ratios are uring / plain"))
        else:
            T.append(("engine", "io_uring backend compared with the plain one", "",
                      "not yet measurable", self.why(*u[0]) if u else "not run"))
        # the verbs provider against the same measurement done natively,
        # both with the hybrid progress thread (the provider's default)
        pair_target("provider", "provider / native latency ≤ 1.05 (RC Send 64 B: ib_send_lat vs "
                    "its loop natively, bench-native-pingpong --loop perftest)", "verbs-rc",
                    "diwarp-rc-thread", "lat_us", 64, 1.05, True, " µs")
        pair_target("provider", "provider / native bandwidth ≥ 1 / 1.05 (RC Write 1 MiB: ib_write_bw "
                    "vs diwarp-bw, window 64)", "verbs-rc-write", "diwarp-rc-thread", "bw_gbps",
                    MiB, 1 / 1.05, False, " Gbit/s")
        ratio_target("RD", "RD RDMA Write stream 1 MiB ≥ 1.0 × raw TCP", "diwarp-rd", "bw_gbps",
                     MiB, 1.0, False)
        ratio_target("RD", "RD 64 B send ping-pong ≤ 1.20 × raw UDP", "diwarp-rd", "lat_us", 64,
                     1.20, True)
        a, b = self.value("diwarp-rd", "mq_lat_us", 1), self.value("diwarp-ud", "mq_lat_us", 1)
        if T[-1][3] == "not yet measurable" and a and b:
            T[-1] = T[-1][:4] + (T[-1][4] + f"; meanwhile bench-multiqp k=1, "
                                 f"{self.pl['mq_lat_size']} B: RD / UD = "
                                 f"{a['med'] / b['med']:.2f}",)
        pair_target("RD", "goodput with 1 % drop ≥ 0.7 × lossless (RD RDMA Write, 1 MiB)",
                    "diwarp-rd-drop1", "diwarp-rd", "bw_gbps", MiB, 0.7, False, " Gbit/s")
        # at the sizes of the other targets (64 B, 1 MiB) when measured there
        lat = self.common("diwarp-rc-rd", "diwarp-rc", "lat_us", 64)
        bw = self.common("diwarp-rc-rd", "diwarp-rc-write", "bw_gbps", MiB)
        got = []
        if lat:
            got.append(f"lat {size_name(lat)} ×{self.cmp('diwarp-rc-rd', 'diwarp-rc', 'lat_us', lat)}")
        if bw:
            got.append(f"bw {size_name(bw)} ×{self.cmp('diwarp-rc-rd', 'diwarp-rc-write', 'bw_gbps', bw)}")
        if lat and bw:
            T.append(("RD", "RC over RD vs RC over TCP, latency and bandwidth, reported",
                      ", ".join(got), "met", "ratios RC-over-RD / RC-over-TCP"))
        else:
            T.append(("RD", "RC over RD vs RC over TCP, latency and bandwidth, reported",
                      ", ".join(got), "not yet measurable",
                      self.why("diwarp-rc-rd", "bw_gbps" if lat else "lat_us",
                               MiB if lat else 64)))
        n = max(self.pl["mem_peers"])
        s = self.value("diwarp-rd", "mem_rss_per_peer_b", n)
        u = self.value("diwarp-ud", "mem_rss_per_peer_b", n)
        if s and u:
            d = s["med"] - u["med"]
            meas = (f"{d:.0f} B per peer at {n} peers (RSS per peer, RD {s['med']:.0f} − UD "
                    f"{u['med']:.0f}: the address handle and QP costs cancel)")
            if n < 1000 or d < 0:
                # RSS moves in 4 KiB pages: a few hundred peers cannot resolve 256 B
                T.append(("RD", "per-peer reliability state ≤ 256 B (heap per peer)", meas,
                          "not yet measurable", "RSS moves in pages: needs 1000 peers (the "
                          "full run)" if n < 1000 else "below the resolution of RSS"))
            else:
                T.append(("RD", "per-peer reliability state ≤ 256 B (heap per peer)", meas,
                          "met" if d <= 256 else "missed",
                          "RSS moves in pages; sizeof belongs to the unit tests"))
        else:
            T.append(("RD", "per-peer reliability state ≤ 256 B", "", "not yet measurable",
                      self.why("diwarp-rd", "mem_per_peer_b", n)))
        s = self.value("diwarp-rd", "mem_udp_sockets", n)
        if s:
            T.append(("RD", "one UDP socket per device instance whatever the peers",
                      f"{s['med']:.0f} UDP socket(s) at {n} peers",
                      "met" if s["med"] == 1 else "missed", ""))
        else:
            u = self.value("diwarp-ud", "mem_udp_sockets", n)
            T.append(("RD", "one UDP socket per device instance whatever the peers", "",
                      "not yet measurable",
                      self.why("diwarp-rd", "mem_per_peer_b", n) +
                      (f" (UD today: {u['med']:.0f} UDP socket at {n} peers)" if u else "")))
        return T

    def cont_check(self, s, limit, upper, scale=1.0, digits=2, unit="", detail=""):
        """One contention criterion of a point summary s (values divided by
        scale): (cell text, status)."""
        med, lo, hi = s["med"] / scale, s["lo"] / scale, s["hi"] / scale
        status, note = self.judge(med, lo, hi, limit, upper, digits)
        notes = [note] if note else []
        if s["noisy"]:
            notes.append("noisy point")
        return (f"{med:.{digits}f}{unit}{detail} {status}" +
                (f" ({'; '.join(notes)})" if notes else ""), status)

    def cont_targets(self):
        """Rows (case, N, goodput, [criterion cells], status) of the
        contention targets: every RD point (RD, incast, RC over RD) against its
        link's tbf rate, raw TCP with the default congestion control on the
        same path, its retransmissions and Jain's index."""
        rows = []
        for name in self.cont_order:
            if name.startswith("tcp") or (self.cont_slow and name in self.cont_slow):
                continue
            base = self.cont_base[name]
            for n in sorted({k[2] for k in self.order if k[:2] == (name, "cont_gbps")}):
                g = self.value(name, "cont_gbps", n)
                if not g:
                    p = self.points[(name, "cont_gbps", n)]
                    st = {"n/a": "not available", "failed": "FAILED"}.get(p.status, p.status)
                    rows.append((name, n, "", ["", "", "", ""], f"not yet measurable ({st}: "
                                 f"{p.reason or 'no run'})"))
                    continue
                cells = [self.cont_check(self.value(name, "cont_link_frac", n), 0.9, False)]
                b = self.value(base, "cont_gbps", n)
                if b:
                    cells.append(self.cont_check(g, 0.95, False, scale=b["med"],
                                                 detail=f" (vs {fmt(b['med'])})"))
                else:
                    cells.append((f"{base}: {self.why(base, 'cont_gbps', n)}",
                                  "not yet measurable"))
                cells.append(self.cont_check(self.value(name, "cont_retx_pct", n), 1.0, True,
                                             unit=" %"))
                if n == 1:
                    cells.append(("1 (one flow)", "met"))
                else:
                    cells.append(self.cont_check(self.value(name, "cont_jain", n), 0.95, False,
                                                 digits=3))
                st = [c[1] for c in cells]
                what = ["× link", "× TCP", "retx", "Jain"]
                if "not yet measurable" in st:
                    status = "not yet measurable"
                elif all(x == "met" for x in st):
                    status = "met"
                else:
                    status = "missed: " + ", ".join(w for w, x in zip(what, st) if x == "missed")
                if any("borderline" in c[0] for c in cells):
                    status += ", borderline"
                rows.append((name, n, f"{fmt(g['med'])} ({fmt(g['lo'])}–{fmt(g['hi'])})",
                             [c[0] for c in cells], status))
        return rows

    def slow_targets(self):
        """The slow receiver's lines of the contention section."""
        if not self.cont_slow:
            return []
        base, slow = self.cont_slow
        pl = self.pl
        bps = getattr(self, "cont_slow_bps", 0)
        L = ["", "### Slow receiver\n",
             f"4 receivers, one server process each in B (`bench-flows HOST:PORT ...`, every "
             f"server on core {self.r.srv_cpu}, asleep on its completion channel), one client "
             f"in A with 4 flows of {size_name(CONT_SIZE)} Sends (window 4, receiver-paced: "
             f"above `DIWARP_RD_PULL_MIN`), flow f to receiver f, through the first bottleneck. "
             f"**{base}**: all four at full speed; **{slow}**: the fourth reads at 1/"
             f"{pl['cont_slow_div']} of the link rate (`DIWARP_FAULT=slowrx:{bps}`, bytes of "
             f"datagrams per second), in alternate rounds, "
             f"{getattr(self, 'cont_slow_ms', 0) / 1e3:g} s measured after the warm-up. The "
             f"slow receiver's rate in payload is that × {rd_pull_payload_frac():.3f} (payload / "
             "UDP payload of a Read Response datagram). \"Without the slow one\" is read as the "
             "same four receivers at full speed: three receivers alone would share the link "
             "three ways, which no fourth flow taking 1/8 of it lets them keep (7/8 ÷ 3 = 0.875 "
             "of 1/3).\n",
             "| target | measured | status |", "|---|---|---|"]
        keep = self.value(slow, "slow_keep", 4)
        frac = self.value(slow, "slow_flow_frac", 4)
        retx = self.value(slow, "cont_retx_pct", 4)
        rows = [("the other three keep ≥ 0.9 × their goodput without the slow one (slowest of "
                 "the three / mean of the same three in the rd-4rx run of the round)", keep,
                 0.9, False, ""),
                ("the slow flow gets ≥ 0.9 × its receiver's rate", frac, 0.9, False, ""),
                ("retransmitted ≤ 1 % of datagrams sent (all four flows)", retx, 1.0, True,
                 " %")]
        for text, v, limit, upper, unit in rows:
            if not v:
                p = self.points.get((slow, "cont_gbps", 4))
                why = (p.reason if p else None) or "no run"
                L.append(f"| {text} | | not yet measurable ({why}) |")
                continue
            cell, st = self.cont_check(v, limit, upper, unit=unit)
            L.append(f"| {text} | {cell} | {st} |")
        return L

    def cont_section(self):
        """The report's contention section (empty when the group did not run)."""
        pl = self.pl
        if not self.cont_order and not any(k[1].startswith("lo_") for k in self.order):
            return []
        warm = pl["cont_warm_ms"] / 1e3
        cc = ", ".join(sorted(self.cont_tcp_cc)) or "the system's default"
        links = []
        for rate, burst in pl["cont_links"]:
            m = re.fullmatch(r"(\d+)(kb|k|mb|m|b?)", burst)
            bb = int(m.group(1)) * {"kb": 1024, "k": 1024, "mb": MiB, "m": MiB}.get(m.group(2), 1)
            lat = float(pl["cont_latency"].rstrip("ms")) / 1e3
            limit = rate_gbps(rate) * 1e9 / 8 * lat + bb
            dur = ", ".join(f"N = {n}: {cont_duration_ms(pl, rate, n) / 1e3 - warm:g} s"
                            for n in pl["cont_n"])
            links.append(f"{rate} (burst {burst}, queue limit {limit / 1e6:.2f} MB; measured "
                         f"{dur})")
        L = ["## Contention: RD congestion control against raw TCP through a bottleneck\n",
             "`bench-flows` from namespace A to namespace B through R (`bench/netns-topo.sh "
             f"up NAME router RATE --latency {pl['cont_latency']} --burst B`: a tbf on R's egress "
             "towards B, no added delay), one topology per rate for the whole group: "
             + "; ".join(links) + f", each after {warm:g} s of warm-up (at least "
             f"{pl['cont_msgs']} messages per flow at its fair share of RD's payload ceiling). "
             "At 5 Gbit/s the burst is 320 KB, the same 0.5 ms of line rate as 64 KB at "
             "1 Gbit/s: 64 KB lasts 105 µs at 5 Gbit/s, less than the timer and softirq slack "
             "of this VM, and the bucket underflows (TCP cubic, N = 2, one run each when this "
             "was set up: 2.69 Gbit/s with 64 KB, 4.72 with 320 KB).\n",
             f"Every flow streams {size_name(CONT_SIZE)} RDMA Writes (window 4); RD with "
             "`--devices N` (N independent congestion controllers, as N TCP connections); "
             "incast: 8 devices onto one server QP (`--server-qps 1`); RC over RD: "
             "`--transport rc --devices N` with `DIWARP_RC_TRANSPORT=rd` on both ends. The "
             f"baseline is raw TCP on the same path in the same round, `bench-flows --transport "
             f"tcp --flows N`, with the default congestion control (**{cc}**, the `tcp@` rows; "
             "×ratio and the target use it) and with cubic (`tcp-cubic@`, ×ratio to the "
             f"default). Server on core {self.r.srv_cpu} (taskset and `--cpu`: it sleeps on its "
             "completion channel, its progress thread moves the data), client on core "
             f"{self.r.cli_cpu} (one thread busy-polls every flow): two busy pollers at most. "
             f"{pl['cont_runs']} run(s) per point, the cases of a point alternating round by "
             "round; median (min–max), ⚠ as elsewhere. Congestion control of RD at its "
             "default (on; every `DIWARP_*` of the caller is dropped).\n",
             f"Link rate = the tbf rate, which counts L2 bytes. Payload ceiling at MTU "
             f"{CONT_MTU}: RD {rd_write_ceiling():.3f} × rate ({rd_seg()} B of payload per "
             f"{rd_seg() + ETH_HDR + IP_HDR + UDP_HDR + RD_FIXED + RD_DDP_TAGGED + RD_CRC}-B "
             f"frame; {rd_write_ceiling(crc=False):.3f} without the CRC), TCP "
             f"{tcp_ceiling():.3f} × rate ({CONT_MTU - IP_HDR - TCP_HDR} / {CONT_MTU + ETH_HDR}): "
             f"0.9 × link is {0.9 / rd_write_ceiling():.3f} of what RD can carry. The tbf's "
             "mean frame size per run (table below) checks the RD figure.\n",
             "### Targets\n",
             "Per RD point: goodput ≥ 0.9 × link rate, ≥ 0.95 × raw TCP (default congestion "
             "control) on the same path, retransmitted ≤ 1 % of datagrams sent, Jain's index "
             "≥ 0.95; borderline when the runs straddle a limit.\n",
             "| case | N | goodput Gbit/s | ≥ 0.9 × link | ≥ 0.95 × raw TCP | retx ≤ 1 % | "
             "Jain ≥ 0.95 | status |", "|---|---|---|---|---|---|---|---|"]
        for name, n, g, cells, status in self.cont_targets():
            L.append(f"| {name} | {n} | {g} | " + " | ".join(cells) + f" | {status} |")
        L += self.slow_targets()
        T = []
        self.ratio_target(T, "", "RD RDMA Write 1 MiB, CRC on ≥ 0.85 × raw TCP", "diwarp-rd",
                          "lo_bw_gbps", CONT_SIZE, 0.85, False)
        self.ratio_target(T, "", "RD RDMA Write 1 MiB, DIWARP_RD_CRC=0 (both ends) ≥ 1.0 × "
                          "raw TCP", "diwarp-rd-nocrc", "lo_bw_gbps", CONT_SIZE, 1.0, False)
        self.ratio_target(T, "", "RD 64 B send ping-pong ≤ 1.20 × raw UDP", "diwarp-rd",
                          "lo_lat_us", 64, 1.20, True)
        self.pair_target(T, "", "RD RDMA Write 1 MiB goodput with DIWARP_FAULT=drop:1% ≥ 0.9 × "
                         "lossless", "diwarp-rd-drop1", "diwarp-rd", "lo_bw_gbps", CONT_SIZE, 0.9,
                         False, " Gbit/s")
        L += ["", "Loopback, no regression from congestion control (`diwarp-bw`, "
              "`diwarp-pingpong`, `raw-sock` as in the bw and lat groups, both sides "
              "busy-polling; congestion control at its default, on):\n",
              "| target | measured | status | note |", "|---|---|---|---|"]
        L += [f"| {t[1]} | {t[2]} | {t[3]} | {t[4]} |" for t in T]
        L.append("")
        nfmt = lambda n: f"N={n}"
        tables = []
        for m, title, note in (
                ("cont_gbps", "Aggregate goodput (Gbit/s)", "×ratio: to raw TCP with the "
                 "default congestion control (`tcp@`) at the same rate and N."),
                ("cont_link_frac", "Goodput / link rate", f"Ceilings: RD "
                 f"{rd_write_ceiling():.3f}, TCP {tcp_ceiling():.3f}."),
                ("cont_retx_pct", "Retransmitted, % of datagrams sent", "RD: QP retransmits / "
                 "data datagrams sent; TCP: tcpi_total_retrans / tcpi_data_segs_out."),
                ("cont_dup_pct", "… of which not needed: duplicates the server received, % "
                 "of datagrams sent", "RD only (`srv_dup`); a retransmission of a datagram "
                 "that was not lost."),
                ("cont_jain", "Jain's index over the flows", ""),
                ("cont_min_msgs", "Messages completed by the slowest flow in the measured "
                 "interval", "What Jain's index rests on."),
                ("cont_tbf_dropped", "tbf drops per run (packets)", "Counter deltas around "
                 "each run (`netns-topo.sh stats`; runs.log has them per run)."),
                ("cont_tbf_drop_pct", "tbf drops, % of packets offered", ""),
                ("cont_tbf_overlimits", "tbf overlimits per run", "Packets the bucket held "
                 "back (not drops)."),
                ("cont_tbf_frame_b", "Mean frame through the tbf (bytes)", "")):
            tables.append(self.table(m, title, note, ratio=m == "cont_gbps", size_fmt=nfmt))
        for m, title in (
                ("slow_rest_gbps", "Slow receiver: mean goodput of the three others (Gbit/s)"),
                ("slow_rest_min_gbps", "Slow receiver: goodput of the slowest of the three "
                 "others (Gbit/s)"),
                ("slow_flow_gbps", "Slow receiver: goodput of the fourth flow (Gbit/s)"),
                ("slow_flow_frac", "Slow receiver: the slow flow's goodput / its receiver's "
                 "payload rate"),
                ("slow_keep", "Slow receiver: slowest other / the same three at full speed")):
            tables.append(self.table(m, title, "", ratio=False, size_fmt=nfmt))
        tables.append(self.table("lo_bw_gbps", "Loopback: RDMA Write 1 MiB (Gbit/s)", "×ratio: to "
                            "raw TCP."))
        tables.append(self.table("lo_lat_us", "Loopback: 64 B ping-pong (µs, half round trip)",
                            "×ratio: to raw UDP."))
        return L + [t for t in tables if t]  # a table without rows comes back empty

    def slope_table(self):
        """Marginal memory per peer between consecutive peer counts, from the
        medians: (total(N2) - total(N1)) / (N2 - N1), total = per_peer * N."""
        rows = []
        ns = self.pl["mem_peers"]
        for c in ("diwarp-ud", "diwarp-rd", "diwarp-rc"):
            cells = []
            for n1, n2 in zip(ns, ns[1:]):
                a = self.value(c, "mem_per_peer_b", n1) if (c, "mem_per_peer_b", n1) in \
                    self.points else None
                b = self.value(c, "mem_per_peer_b", n2) if (c, "mem_per_peer_b", n2) in \
                    self.points else None
                cells.append(fmt((b["med"] * n2 - a["med"] * n1) / (n2 - n1)) if a and b
                             else "")
            if any(cells):
                rows.append(f"| {c} | " + " | ".join(cells) + " |")
        if not rows:
            return ""
        head = " | ".join(f"{a}→{b} peers" for a, b in zip(ns, ns[1:]))
        return ("### Marginal memory per added peer (bytes)\n\nThe slope between peer "
                "counts, from the medians above (goal: UD slope ≤ 1 KB per peer).\n\n"
                f"| case | {head} |\n|---|" + "---|" * (len(ns) - 1) + "\n" +
                "\n".join(rows) + "\n")

    def common(self, a, b, metric, prefer=None):
        """prefer, if both cases have a number there; else the largest size at
        which both have one; else None."""
        sizes = [k[2] for k in self.order if k[0] == a and k[1] == metric and self.summary(k)
                 and (b, metric, k[2]) in self.points and self.summary((b, metric, k[2]))]
        if prefer in sizes:
            return prefer
        return max(sizes) if sizes else None

    def cmp(self, a, b, metric, size):
        x, y = self.value(a, metric, size), self.value(b, metric, size)
        return f"{x['med'] / y['med']:.2f}" if x and y else "?"

    def cmp_plain(self, k):
        plain = {"diwarp-ud-uring": "diwarp-ud", "diwarp-rc-uring": "diwarp-rc"}[k[0]]
        if k[1] == "bw_gbps" and k[0] == "diwarp-rc-uring":
            plain = "diwarp-rc-write"
        return self.cmp(k[0], plain, k[1], k[2])

    def why(self, case, metric, size):
        p = self.points.get((case, metric, size))
        if p is None:
            return "not run (excluded by --cases/--groups or --quick)"
        return f"{p.status}: {p.reason}" if p.reason else p.status

    def write_report(self, path, info):
        pl = self.pl
        L = [f"# diwarp benchmark report\n",
             f"`{info['command']}` — {info['date']}, commit {info['commit']}, "
             f"{info['elapsed']:.0f} s, {self.r.nruns} program runs.\n",
             "Wall time per group: " + (", ".join(f"{g} {t:.0f} s" for g, t in
                                                   self.group_time.items()) or "none") + ".\n",
             "## Machine\n", "```", info["machine"], "```",
             f"Load average at start: {info['load0']}; at end: {info['load1']}.\n",
             "## Method\n",
             f"Server on core {self.r.srv_cpu}, client on core {self.r.cli_cpu} (taskset); every "
             f"process busy-polls (DIWARP_PROGRESS=app) unless stated. Each point: the median of "
             f"{pl['runs']} runs (scalability and overlap metrics: {pl['seed_runs']}), (min–max) beside "
             f"it; runs of all cases at a point alternate "
             f"round by round. ×r = median / median of the raw-socket baseline at the same size "
             f"(latency and message rate: raw-udp for datagram cases, raw-tcp for stream cases; "
             f"bandwidth and CPU: raw-tcp). ⚠ = noisy point: max/min > {self.a.noise}. "
             "Latency is half the round trip (mean over the iterations of one run; perftest: "
             "t_avg; fi_pingpong: usec/xfer). CPU s/GB: user+system time of both processes "
             "(wait4 rusage) for the bytes moved, minus a short run of the same case (setup "
             "cost); busy-polling processes burn a core each, so it tracks 2 / bandwidth. "
             f"{self.cpu_dropped} bandwidth run(s) gave no CPU number (their CPU time was not "
             "above 1.05 × the short run's: setup noise would dominate).\n"]
        L.append("## Targets (the engine, the verbs provider, reliable datagrams)\n")
        L.append("| area | target | measured | status | note |")
        L.append("|---|---|---|---|---|")
        for t in self.targets():
            L.append(f"| {t[0]} | {t[1]} | {t[2]} | {t[3]} | {t[4]} |")
        L.append("")
        L.append("Contention targets (RD congestion control): in the section "
                 "\"Contention\" below." if self.want_group("contention") else
                 "Contention targets: not run (excluded by --groups).")
        L.append("")
        L.append("## Core metrics\n")
        L.append(self.table("lat_us", "Latency (µs, half round trip)", "Lower is better."))
        L.append("![latency](latency.svg)\n" if os.path.exists(os.path.join(os.path.dirname(path), "latency.svg")) else "")
        L.append(self.table("bw_gbps", "Bandwidth (Gbit/s, one way)", "Higher is better; "
                            "ratio to raw TCP streaming."))
        L.append("![bandwidth](bandwidth.svg)\n" if os.path.exists(os.path.join(os.path.dirname(path), "bandwidth.svg")) else "")
        L.append(self.table("cpu_s_per_gb", "CPU seconds per GB (both processes)",
                            "Lower is better."))
        L.append(self.table("msgrate_mps", "Message rate (million messages/s, 8 B, window 64)",
                            "Higher is better."))
        L.append("## Scalability and overlap metrics\n")
        kfmt = lambda k: f"k={k}"
        L.append(self.table("mq_lat_us", f"Multi-QP normalized latency, "
                            f"{pl['mq_lat_size']} B (µs)",
                            "Half round trip per message with one message in flight on each "
                            "of k QPs: elapsed / (iterations · k) / 2.", size_fmt=kfmt))
        L.append(self.table("mq_bw_gbps", f"Multi-QP aggregate throughput, "
                            f"{size_name(pl['mq_bw_size'])}, both ways (Gbit/s)",
                            f"{pl['mq_ms']} ms, window 16 per QP.", size_fmt=kfmt))
        L.append(self.table("mq_jain", "Jain's fairness index over the k QPs",
                            "1 = every QP got the same throughput.", size_fmt=kfmt))
        for m, t in (("regdereg_us", "Registration + deregistration (µs), warm pages"),
                     ("reg_us", "Registration (µs), warm pages"),
                     ("dereg_us", "Deregistration (µs), warm pages"),
                     ("cold_reg_us", "Registration (µs), cold pages (fresh mmap)")):
            L.append(self.table(m, t, "Median of the repetitions inside a run."))
        L.append(self.table("reuse_ratio", "Buffer reuse: latency ratio no reuse / full "
                            "reuse", "Ping-pong over a pool of registered buffers (goal: "
                            "≤ 1.4)."))
        L.append(self.table("reuse_full_us", "Buffer reuse: latency with full reuse (µs)", ""))
        L.append(self.table("reuse_none_us", "Buffer reuse: latency with no reuse (µs)", ""))
        L.append(self.table("progress_ratio", "Independent progress: t(D)/t(0), RDMA "
                            "Read of 1 MiB, target computing D = 10·t(0)",
                            "≈ 1: the read completes while the target computes; ≈ 11: it "
                            "waits for the target's next call."))
        L.append(self.table("progress_t0_us", "Independent progress: t(0) (µs)", ""))
        L.append(self.table("overlap_ratio", "Overlap: initiator computes "
                            "during an RDMA Read of 1 MiB", "1 = the transfer hides entirely "
                            "behind computation, 0 = not at all."))
        L.append(self.table("mem_per_peer_b", "Memory per peer (bytes): RSS + kernel socket "
                            "memory, per added peer", "", size_fmt=lambda n: f"{n} peers"))
        L.append(self.slope_table())
        L.append("![memory per peer](mempeer.svg)\n" if os.path.exists(os.path.join(os.path.dirname(path), "mempeer.svg")) else "")
        L.append(self.table("mem_rss_per_peer_b", "… of which process RSS (bytes per peer)", "",
                            size_fmt=lambda n: f"{n} peers"))
        L.append(self.table("mem_kern_per_peer_b", "… of which kernel socket memory (bytes per "
                            "peer)", "", size_fmt=lambda n: f"{n} peers"))
        L.append(self.table("mem_tcp_sockets", "TCP sockets of the measured process", "",
                            size_fmt=lambda n: f"{n} peers"))
        L.append(self.table("idle_cpu_pct", "Idle CPU of the progress thread (% of one core)",
                            "DIWARP_PROGRESS=thread, a device with one UD QP, "
                            f"{pl['idle_ms']} ms of nothing.", size_fmt=lambda n: ""))
        L += self.cont_section()
        L += self.mpi_section()
        L += self.mvapich_section()
        L += self.credits_section()
        L += self.daemon_section()
        L += self.mr_section()
        L += self.shared_section()
        L.append("## Not available, missing, failed\n")
        rows = {}
        for k in self.order:
            p = self.points[k]
            if p.status != "ok":
                rows.setdefault((k[0], p.status, p.reason), []).append(k)
        label = {"n/a": "not available", "failed": "FAILED"}
        def at(metric, sizes):
            if sizes == [0]:
                return ""
            if metric.startswith("mq_"):
                return " at k = " + ", ".join(str(x) for x in sizes)
            if metric.startswith("cont_"):
                return " at N = " + ", ".join(str(x) for x in sizes)
            if metric.startswith("mem_"):
                return " at " + ", ".join(str(x) for x in sizes) + " peers"
            return " at " + ", ".join(size_name(x) for x in sizes)

        for (c, st, why), ks in rows.items():
            # metrics with the same sizes share one entry
            by_metric = {}
            for k in ks:
                by_metric.setdefault(k[1], []).append(k[2])
            by_sizes = {}
            for m, sz in by_metric.items():
                by_sizes.setdefault(tuple(sorted(sz)), []).append(m)
            what = "; ".join(", ".join(ms) + at(ms[0], list(sz)) for sz, ms in by_sizes.items())
            L.append(f"- **{c}** {what}: {label.get(st, st)}: {why}")
        for m in self.missing:
            L.append(f"- missing program: {m}")
        if self.failures:
            L.append("\n### Failures (first lines of each; full output in runs.log)\n")
            for c, m, s, why in self.failures:
                L.append(f"- {c} {m} size {s}:\n\n```\n{why.strip()[:1500]}\n```")
        L.append("\n## Cases\n")
        for c in self.cases + self.extra_cases:
            L.append(f"- **{c.name}** ({c.family}): {c.desc}")
        if self.cont_order:
            L.append("- contention (bench-flows through a tbf of RATE, section \"Contention\"): "
                     "**rd@RATE** (RD, `--devices N`), **rc-rd@RATE** (RC over RD), "
                     "**rd-incast@RATE** (8 devices onto one server QP), **rd-4rx@RATE** and "
                     "**rd-slowrx@RATE** (4 receivers, the fourth slow), **tcp@RATE** (N TCP "
                     "connections, default congestion control), **tcp-cubic@RATE** (cubic)")
        with open(path, "w") as f:
            f.write("\n".join(L) + "\n")

    def plots(self, out):
        def series(metric):
            data = {}
            for k in self.order:
                if k[1] != metric:
                    continue
                s = self.summary(k)
                if s:
                    data.setdefault(k[0], []).append((k[2], s["med"], s["lo"], s["hi"]))
            return data

        scripts = []
        for metric, fname, title, ylabel, xlabel, logy in (
                ("lat_us", "latency", "Latency (half round trip)", "µs", "message size (bytes)",
                 True),
                ("bw_gbps", "bandwidth", "Bandwidth, one way", "Gbit/s", "message size (bytes)",
                 False),
                ("mem_per_peer_b", "mempeer", "Memory per peer (RSS + kernel socket memory)",
                 "bytes per peer", "peers", True)):
            data = series(metric)
            if not data:
                continue
            plot = []
            for i, (case, pts) in enumerate(sorted(data.items())):
                dat = f"{fname}-{case}.dat"
                with open(os.path.join(out, dat), "w") as f:
                    for x, m, lo, hi in sorted(pts):
                        f.write(f"{x} {m} {lo} {hi}\n")
                # gnuplot cycles through 8 colours: the dash pattern and the
                # point shape tell the cases of one colour apart
                plot.append(f"'{dat}' using 1:2:3:4 with yerrorlines lt {i % 8 + 1} "
                            f"dt {i // 8 + 1} pt {i + 1} title '{case}'")
            # names relative to the output directory: it can be moved as a whole
            gp = [f"set terminal svg size 960,600 dynamic font 'sans,11'",
                  f"set output '{fname}.svg'",
                  f"set title '{title}'", "set logscale x 2", f"set xlabel '{xlabel}'",
                  f"set ylabel '{ylabel}'", "set grid", "set key outside right",
                  "set format x '%.0b%BB'" if metric != "mem_per_peer_b" else "set format x '%g'"]
            if logy:
                gp.append("set logscale y")
            gp.append("plot " + ", \\\n     ".join(plot))
            path = os.path.join(out, fname + ".gp")
            with open(path, "w") as f:
                f.write("\n".join(gp) + "\n")
            scripts.append(path)
        for s in scripts:
            p = subprocess.run(["gnuplot", os.path.basename(s)], capture_output=True, text=True,
                               cwd=out)
            if p.returncode != 0:
                print(f"run: gnuplot failed on {s}:\n{p.stderr}", file=sys.stderr)
                sys.exit(1)


def machine_info():
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, shell=True).stdout.strip()
        except OSError:
            return "?"
    return "\n".join([f"nproc: {sh('nproc')}", sh("lscpu | head -n 14"),
                      f"kernel: {sh('uname -r')}",
                      f"memory: {sh('free -m | sed -n 2p')}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--quick", action="store_true",
                    help="fewer sizes and runs; without --groups only lat, bw and rate "
                         "(a smoke run within 90 s)")
    ap.add_argument("--out", help="output directory (default: BUILD/bench-report)")
    ap.add_argument("--build", default=os.environ.get("DIWARP_BUILD", "build-rel"),
                    help="meson build dir, release, no sanitizers (default: $DIWARP_BUILD or "
                         "build-rel)")
    ap.add_argument("--runs", type=int, help="runs per point (default 3 quick, 5 full)")
    ap.add_argument("--cases", help="comma list of case-name patterns (fnmatch), e.g. 'raw-*,diwarp-rc'")
    ap.add_argument("--groups", help="comma list of: " + ",".join(Harness.GROUPS))
    ap.add_argument("--mpi-jobs", type=int, default=1, choices=range(1, 5),
                    help="mpi group: NetPIPE jobs at once, each 2 ranks, one per namespace "
                         "(2: 4 ranks on a 2-core host; default 1)")
    ap.add_argument("--shared-build-loop", default="",
                    help="shared group: also run one pair beside a nice-19 build loop of this "
                         "configured build directory (cleaned and rebuilt over and over)")
    ap.add_argument("--allow-missing", action="store_true",
                    help="missing perftest/fi_pingpong and failed runs do not make the exit "
                         "status non-zero (they are still reported)")
    ap.add_argument("--noise", type=float, default=1.5, help="max/min above this flags a "
                    "point as noisy (default 1.5)")
    ap.add_argument("--cpus", default="0,1", help="server,client cores (default 0,1)")
    ap.add_argument("--port", type=int, default=19100, help="first TCP port (one per run)")
    ap.add_argument("--timeout", type=float, help="seconds per run (default 30 quick, 180 full)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command")
    a = ap.parse_args()
    if (a.runs is not None and a.runs < 1) or not re.fullmatch(r"\d+,\d+", a.cpus):
        print("run: bad --runs or --cpus", file=sys.stderr)
        sys.exit(2)
    a.cases = [c for c in (a.cases or "").split(",") if c]
    a.groups = [g for g in (a.groups or "").split(",") if g]
    for g in a.groups:
        if g not in Harness.GROUPS:
            print(f"run: unknown group {g!r} (known: {', '.join(Harness.GROUPS)})",
                  file=sys.stderr)
            sys.exit(2)
    out = a.out or os.path.join(a.build, "bench-report")
    os.makedirs(out, exist_ok=True)
    h = Harness(a)
    h.find_programs()
    logdir = tempfile.mkdtemp(prefix="logs-", dir=out)
    r = Runner(a, logdir)
    h.r = r
    h.t0 = time.monotonic()
    load0 = open("/proc/loadavg").read().split()[:3]
    try:
        h.probes(r)
    except RunFailed as e:
        print(f"run: a probe failed: {e}", file=sys.stderr)
        sys.exit(1)
    h.cases = build_cases(h)
    h.family = {c.name: c.family for c in h.cases + h.extra_cases}
    try:
        h.run_core(r, h.cases)
        h.run_seed(r)
        h.run_contention(r)
        h.run_mpi(r)
        h.run_mvapich(r)
        h.run_credits(r)
        h.run_daemon(r)
        h.run_multirail(r)
        h.run_shared(r)
        h.mark_group(None)
    except KeyboardInterrupt:
        h.mark_group(None)
        print("run: interrupted; writing what was measured", file=sys.stderr)
    finally:
        r.log.close()
        # the run log stays; the per-run scratch files are gone already
        os.replace(os.path.join(logdir, "runs.log"), os.path.join(out, "runs.log"))
        shutil.rmtree(logdir, ignore_errors=True)
    load1 = open("/proc/loadavg").read().split()[:3]
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)),
                             "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "?"
    info = dict(command="bench/run.py " + " ".join(sys.argv[1:]),
                date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), commit=commit,
                elapsed=time.monotonic() - h.t0, machine=machine_info(),
                load0=" ".join(load0), load1=" ".join(load1))
    h.write_csv(os.path.join(out, "results.csv"))
    h.plots(out)
    h.write_report(os.path.join(out, "report.md"), info)
    print("run: wall time per group: " + ", ".join(f"{g} {t:.0f} s" for g, t in
                                                  h.group_time.items()), file=sys.stderr)
    print(f"run: {info['elapsed']:.0f} s, {r.nruns} program runs; report {out}/report.md, "
          f"{out}/results.csv, plots {out}/*.svg, log {out}/runs.log", file=sys.stderr)
    bad = [k for k in h.order if h.points[k].status in ("failed", "missing")]
    if (bad or h.missing or h.failures) and not a.allow_missing:
        print(f"run: {len(h.failures)} failed point(s), {len(h.missing)} missing program(s): "
              "exit 1 (see the report)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
