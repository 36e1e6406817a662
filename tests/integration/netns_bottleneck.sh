#!/bin/bash
# Behaviour of RD flows through a bottleneck between network namespaces
# (bench/netns-topo.sh), with bench-flows as the traffic: never a speed, only
# what must hold at any speed (CI runs this under AddressSanitizer on 2
# shared cores):
#   netns_bottleneck.sh NETNS-TOPO BENCH-FLOWS CASE
#   rd2, rd8     N RD Send flows on N client devices (N congestion
#                controllers) through a 1 Gbit/s tbf, with DIWARP_CC=on and
#                then off: both complete every message intact; with CC on no
#                flow starves and the tbf drops at most 1 % of its packets,
#                and fewer than a quarter of what it drops with CC off (when
#                CC off overflowed it at all).
#   incast       8 client devices Send to one server QP through the tbf: no
#                flow starves (1/8 of an equal share).
#   slowrx       4 server processes; the 4th reads at 1/8 of a 200 Mbit/s
#                link (DIWARP_FAULT=slowrx): receiver-paced 256 KiB Sends.
#                The slow flow completes messages, the others 1.5 times as
#                many, its receiver pulled and was throttled, no receive
#                buffer overflowed.
#   slowrx_retx  one flow to that slow receiver alone on a 1 Gbit/s veth:
#                its retransmissions must stay under 2 % of its datagrams.
#   hostpool     3 client processes share DIWARP_INFLIGHT_HOST through a
#                private DIWARP_INFLIGHT_SHM; then one is SIGKILLed while it
#                holds tokens and the others still complete.
#   rc_rd        RC over RD (DIWARP_RC_TRANSPORT=rd) through the tbf.
# No starvation: each flow completes at least 1/4 of an equal share of the
# messages (README.md says why these bounds).
# Every run checks: exit 0 and status=ok on every side, a FLOW line per flow,
# each message validated by the server (flow, order, every byte: bench-flows
# --validate) and as many validated as the client completed, no sanitizer
# report. The tbf counters and retransmissions go to the log.
# Skipped (77) without root, ip, tc or tbf. Cleanup (namespaces, processes,
# the shm object) runs on exit, on SIGTERM (meson's timeout) and on SIGINT;
# a SIGKILLed run's namespaces are removed by the next netns-topo.sh up.
set -u
topo=${1:?usage: netns_bottleneck.sh NETNS-TOPO BENCH-FLOWS CASE}
bf=${2:?usage: netns_bottleneck.sh NETNS-TOPO BENCH-FLOWS CASE}
case=${3:?usage: netns_bottleneck.sh NETNS-TOPO BENCH-FLOWS CASE}
TMO=5000 # bench-flows --timeout: the longest a flow may wait for a completion
NAME=nb${case//_/}$$
shm=
# shellcheck source=tests/integration/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

netns_cleanup_hook() {
        [ -z "$shm" ] || rm -f "/dev/shm/$shm"
}

# tbf KEY: a counter of the bottleneck's tbf (the first STATS line).
tbf() {
        "$topo" stats "$NAME" | head -1 | sed -n "s/.* $1=\([0-9]*\).*/\1/p"
}

# server PORT [VAR=VALUE...]: a bench-flows server in B on side channel PORT,
# output in $TMPD/srv-PORT; sets SPID. Servers run on core 0 (their progress
# threads too), clients on core 1, as bench/README.md says: a busy-polling
# client sharing a core with the servers' progress threads delays their
# acknowledgements (spurious timeouts, one flow backing off for long).
server() {
        local port=$1
        shift
        "$topo" exec "$NAME" B env "$@" "$bf" --addr "$B" --port "$port" --timeout $TMO --cpu 0 \
                >"$TMPD/srv-$port" 2>&1 &
        SPID=$!
}

# client OUT [VAR=VALUE...] -- ARGS...: a bench-flows client in A, in the
# background, output in $TMPD/OUT; sets CPID.
client() {
        local out=$1 env=()
        shift
        while [ "$1" != -- ]; do
                env+=("$1")
                shift
        done
        shift
        "$topo" exec "$NAME" A env "${env[@]}" "$bf" --addr "$A" --timeout $TMO --cpu 1 "$@" \
                >"$TMPD/$out" 2>&1 &
        CPID=$!
}

# await PID WHAT: waits for PID, fails unless it exits 0.
await() {
        wait "$1"
        local rc=$?
        [ $rc -eq 0 ] || { show; fail "$2 exited $rc"; }
}

# show: every output so far, for the log.
show() {
        local f
        for f in "$TMPD"/cli* "$TMPD"/srv*; do
                [ -e "$f" ] || continue
                echo "--- ${f##*/}"
                cat "$f"
        done
}

# val FILE PREFIX KEY: KEY's value on the line of FILE starting with PREFIX.
val() {
        awk -v p="$2" -v k="$3" 'index($0, p) == 1 {
                for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) { print substr($i, length(k) + 2); exit } }' "$1"
}

# flowsum FILE KEY: sum of KEY over the FLOW lines; flowmin likewise.
flowsum() {
        awk -v k="$2" '/^FLOW / { for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) s += substr($i, length(k) + 2) }
                END { print s + 0 }' "$1"
}
flowmin() {
        awk -v k="$2" '/^FLOW / { for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) { v = substr($i, length(k) + 2) + 0; if (m == "" || v < m) m = v } }
                END { print m + 0 }' "$1"
}

# check OUT N SERVER-OUTS...: the client and servers succeeded, N flows, every
# message the client completed was validated by a server.
check() {
        local out=$TMPD/$1 n=$2 f v=0
        shift 2
        grep -q '^RESULT .* status=ok ' "$out" || { show; fail "$1: client RESULT not ok"; }
        [ "$(grep -c '^FLOW ' "$out")" -eq "$n" ] || { show; fail "$1: not $n FLOW lines"; }
        for f in "$@"; do
                grep -q '^RESULT role=server .* status=ok' "$TMPD/$f" ||
                        { show; fail "$f: server RESULT not ok"; }
                v=$((v + $(val "$TMPD/$f" 'RESULT role=server' validated)))
        done
        local ndone
        ndone=$(flowsum "$out" "done")
        [ "$ndone" -gt 0 ] || { show; fail "$1: no message completed"; }
        [ "$v" -eq "$ndone" ] ||
                { show; fail "$1: the servers validated $v messages, the client completed $ndone"; }
        [ "$(val "$out" RESULT validated)" -eq "$ndone" ] ||
                { show; fail "$1: RESULT validated= differs from the messages completed"; }
}

# fair OUT N DIV: no flow starves: each completed (msgs, the measured
# interval) at least 1/DIV of an equal share of all the flows' messages.
fair() {
        local out=$TMPD/$1 n=$2 div=$3 total mn
        total=$(flowsum "$out" msgs)
        mn=$(flowmin "$out" msgs)
        echo "fairness $1: $n flows, $total messages, the fewest $mn (bound: 1/$div of $((total / n)))"
        [ $((mn * n * div)) -ge "$total" ] ||
                { show; fail "$1: a flow starved: $mn messages of $total over $n flows (< 1/$div of an equal share)"; }
}

# rd_flows N SIZE: rd2 / rd8.
rd_flows() {
        local n=$1 size=$2 cc p0 d0 p1 d1 dur
        local -A pkts drops
        up "$NAME" router 1gbit
        # CC on runs longer: its fairness is measured over 2.2 s
        for cc in on off; do
                dur=$([ $cc = on ] && echo 2500 || echo 1200)
                p0=$(tbf sent_pkts)
                d0=$(tbf dropped)
                server 18600 DIWARP_CC=$cc
                spid=$SPID
                client cli-$cc DIWARP_CC=$cc -- --transport rd --op send --flows "$n" --devices "$n" \
                        --size "$size" --duration-ms "$dur" --warmup-ms 300 --validate "$B:18600"
                await $CPID "client (CC $cc)"
                await $spid "server (CC $cc)"
                p1=$(tbf sent_pkts)
                d1=$(tbf dropped)
                pkts[$cc]=$((p1 - p0 + d1 - d0))
                drops[$cc]=$((d1 - d0))
                check cli-$cc "$n" srv-18600
                mv "$TMPD/srv-18600" "$TMPD/srv-18600-$cc"
                echo "CC $cc: tbf packets ${pkts[$cc]}, dropped ${drops[$cc]}; client" \
                        "retransmissions $(val "$TMPD/cli-$cc" RESULT retx)" \
                        "($(val "$TMPD/cli-$cc" RESULT retx_pct) %), sent $(val "$TMPD/cli-$cc" RESULT sent_dgrams)"
        done
        show
        fair cli-on "$n" 4
        [ $((drops[on] * 100)) -le "${pkts[on]}" ] ||
                fail "CC on: the tbf dropped ${drops[on]} of ${pkts[on]} packets (> 1 %)"
        if [ $((drops[off] * 100)) -ge "${pkts[off]}" ]; then
                [ $((drops[on] * 4)) -le "${drops[off]}" ] ||
                        fail "CC on dropped ${drops[on]} packets at the tbf, CC off ${drops[off]}: not 4 times fewer"
        else
                echo "CC off dropped under 1 % (${drops[off]} of ${pkts[off]}): the sender did not" \
                        "overflow the tbf, no comparison"
        fi
}

# rcvbuf_errors: datagrams B's UDP sockets dropped for a full receive buffer.
rcvbuf_errors() {
        # shellcheck disable=SC2016 # awk's own $6
        ip netns exec "$NAME-B" awk '/^Udp:/ { n++ } /^Udp:/ && n == 2 { print $6 }' /proc/net/snmp
}

# slow_run: 4 servers, the 4th slow; 256 KiB Sends (pulled: PULL below).
slow_run() {
        local s hosts=() spids=() r0 r1 d0
        up "$NAME" router 200mbit
        r0=$(rcvbuf_errors)
        d0=$(tbf dropped)
        for s in 0 1 2 3; do
                if [ $s -eq 3 ]; then
                        server $((18600 + 2 * s)) "${PULL[@]}" DIWARP_FAULT=slowrx:$SLOW
                else
                        server $((18600 + 2 * s)) "${PULL[@]}"
                fi
                spids+=("$SPID")
                hosts+=("$B:$((18600 + 2 * s))")
        done
        client cli "${PULL[@]}" -- --transport rd --op send --flows 4 --devices 4 --size 256k \
                --duration-ms 2000 --warmup-ms 300 --validate "${hosts[@]}"
        await $CPID client
        for s in 0 1 2 3; do
                await "${spids[s]}" "server $s"
        done
        show
        r1=$(rcvbuf_errors)
        RCVBUF_ERRORS=$((r1 - r0))
        echo "tbf dropped $(($(tbf dropped) - d0)); UDP receive buffer errors in B: $RCVBUF_ERRORS"
        check cli 4 srv-18600 srv-18602 srv-18604 srv-18606
        for s in 0 1 2 3; do
                [ "$(val "$TMPD/srv-$((18600 + 2 * s))" 'RESULT role=server' validated)" -eq \
                        "$(val "$TMPD/cli" "FLOW $s " "done")" ] ||
                        fail "server $s did not validate every message of flow $s"
        done
}

# pool CMD ARGS...: the host pool's state (python3 reads the shm object,
# layout version 1 of libdiwarp/flow/README.md): `show` prints a POOL line and
# a SLOT line per process; `hold PID TIMEOUT_S` waits until PID holds a token.
pool() {
        python3 - "/dev/shm/$shm" "$@" <<'PY'
import struct, sys, time
path, cmd = sys.argv[1], sys.argv[2]
def read():
    b = open(path, 'rb').read()
    magic, ver, hdr, ssz, nslots, cap = struct.unpack_from('<QIIIII', b, 0)
    if magic != 0x4649505241574944 or ver != 1 or len(b) < hdr + nslots * ssz:
        sys.exit(f"{path}: not a version-1 in-flight pool")
    free, = struct.unpack_from('<q', b, 72)
    qlen, = struct.unpack_from('<I', b, 96)
    reclaimed, reaped = struct.unpack_from('<QQ', b, 136)
    slots = {}
    for i in range(nslots):
        state, gen, pid, inuse, granted, need = struct.unpack_from('<6I', b, hdr + i * ssz)
        if state == 1:
            slots[pid] = (inuse, granted, need)
    return dict(capacity=cap, free=free, queue=qlen, reclaimed=reclaimed, reaped=reaped), slots
def show(p, slots):
    print("POOL " + " ".join(f"{k}={v}" for k, v in p.items()) + f" processes={len(slots)}")
    for pid, (inuse, granted, need) in slots.items():
        print(f"SLOT pid={pid} inuse={inuse} granted={granted} need={need}")
if cmd == "show":
    show(*read())
    sys.exit(0)
pid, end = int(sys.argv[3]), time.monotonic() + float(sys.argv[4])
while True:
    p, slots = read()
    held = sum(slots.get(pid, (0, 0))[:2])
    if held or time.monotonic() > end:
        show(p, slots)
        print(f"HELD {held}")
        sys.exit(0 if held else 1)
    time.sleep(0.002)
PY
}

# hostpool: 3 client processes (--block: they wait on completion channels,
# so no core is spun) in A, each with its own server in B, share a host pool
# of 4 tokens (DIWARP_INFLIGHT_HOST) named for this run only.
hostpool() {
        local s run dur d cpids=() spids=() env
        up "$NAME" direct 1gbit
        # the pools of earlier runs that were killed outright
        for f in /dev/shm/diwarp-test-pool-*; do
                [ -e "$f" ] || continue
                kill -0 "${f##*-}" 2>/dev/null || rm -f "$f"
        done
        shm=diwarp-test-pool-$$
        env=(DIWARP_INFLIGHT_HOST=4 "DIWARP_INFLIGHT_SHM=$shm")
        for run in all kill; do
                # kill: clients 0 and 1 must still run when client 2 is
                # killed, to reclaim its tokens; catching it holding one can
                # take seconds on a busy host (a CI run once found both done
                # at 2500 ms, and the pool kept the dead client's tokens)
                dur=$([ $run = all ] && echo 1500 || echo 8000)
                cpids=()
                spids=()
                for s in 0 1 2; do
                        server $((18600 + 2 * s))
                        spids+=("$SPID")
                done
                for s in 0 1 2; do
                        # the one killed must not give up on its stopped
                        # server before it is killed, nor end its run before
                        # the server is stopped (a busy host may start it late)
                        d=$dur
                        [ $run = kill ] && [ $s -eq 2 ] && d=30000
                        client cli-$run-$s "${env[@]}" DIWARP_PEER_TIMEOUT_MS=30000 -- --block \
                                --port $((18600 + 2 * s)) --transport rd --op send --validate --flows 2 \
                                --devices 2 --size 128k --duration-ms "$d" \
                                --warmup-ms 200 "$B:$((18600 + 2 * s))"
                        cpids+=("$CPID")
                done
                if [ $run = kill ]; then
                        # Client 2 dies holding tokens. It is stopped at a
                        # moment it holds one (a stopped process gives none
                        # back) and killed; a moment it held none after all
                        # (it gave it back before the stop arrived) lets it
                        # run on and try again. Waiting on its traffic, not a
                        # fixed delay: a busy host may start it late, and
                        # whether it holds a token at a given moment depends
                        # on its credits and its window as much as its server.
                        caught=
                        for try in $(seq 1 100); do
                                pool hold "${cpids[2]}" 30 >"$TMPD/pool-start" ||
                                        { cat "$TMPD/pool-start"; show; fail "client 2 never started its traffic"; }
                                kill -STOP "${cpids[2]}"
                                if pool hold "${cpids[2]}" 0 >"$TMPD/pool-kill"; then
                                        caught=$try
                                        break
                                fi
                                kill -CONT "${cpids[2]}"
                        done
                        [ -n "$caught" ] ||
                                { cat "$TMPD/pool-kill"; show; fail "client 2 never held a token while stopped (100 tries)"; }
                        kill -0 "${cpids[0]}" 2>/dev/null || kill -0 "${cpids[1]}" 2>/dev/null ||
                                { show; fail "kill: clients 0 and 1 ended before client 2 was caught holding a token ($caught tries): nobody left to reclaim it"; }
                        kill -9 "${cpids[2]}"
                        cat "$TMPD/pool-kill"
                        held=$(sed -n 's/^HELD //p' "$TMPD/pool-kill")
                        echo "killed client 2 (pid ${cpids[2]}) holding $held token(s)"
                        wait "${cpids[2]}" 2>/dev/null
                        kill -9 "${spids[2]}"
                        wait "${spids[2]}" 2>/dev/null
                fi
                for s in 0 1 2; do
                        [ $run = kill ] && [ $s -eq 2 ] && continue
                        await "${cpids[s]}" "$run: client $s"
                        await "${spids[s]}" "$run: server $s"
                        check cli-$run-$s 2 srv-$((18600 + 2 * s))
                        fair cli-$run-$s 2 4
                        [ "$(val "$TMPD/cli-$run-$s" RESULT inflight_waits)" -gt 0 ] ||
                                fail "$run: client $s never waited for a token (the pool did not cap it)"
                        mv "$TMPD/srv-$((18600 + 2 * s))" "$TMPD/srv-$run-$s"
                done
                pool show >"$TMPD/pool-$run" || fail "no pool /dev/shm/$shm"
                cat "$TMPD/pool-$run"
                # everything given back, nobody attached any more
                grep -q '^POOL capacity=4 free=4 queue=0 .* processes=0$' "$TMPD/pool-$run" ||
                        fail "$run: the pool did not get all its tokens back"
        done
        show
        grep -q ' reclaimed=0 reaped=0 ' "$TMPD/pool-all" || fail "all: tokens reclaimed with nobody dead"
        reclaimed=$(sed -n 's/.* reclaimed=\([0-9]*\) .*/\1/p' "$TMPD/pool-kill")
        reaped=$(sed -n 's/.* reaped=\([0-9]*\) .*/\1/p' "$TMPD/pool-kill")
        if [ "$reaped" -lt 1 ] || [ "$reclaimed" -lt "$held" ]; then
                fail "kill: the dead client's $held token(s) not reclaimed (reclaimed $reclaimed, reaped $reaped)"
        fi
        rm "/dev/shm/$shm" || fail "cannot unlink /dev/shm/$shm"
        [ ! -e "/dev/shm/$shm" ] || fail "/dev/shm/$shm still there"
        shm=
}

# The slow receiver reads 1/8 of the link: 200 Mbit/s / 8 = 3 125 000 bytes/s.
SLOW=3125000
# 256 KiB Sends pulled in 64 KiB chunks (the defaults, 1 MiB and 128 KiB,
# would give the slow flow a handful of messages in a 2 s run).
PULL=(DIWARP_RD_PULL_MIN=262144 DIWARP_RD_PULL_CHUNK=65536)

case $case in
rd2) rd_flows 2 128k ;;
rd8) rd_flows 8 128k ;;
incast)
        up "$NAME" router 1gbit
        p0=$(tbf sent_pkts)
        d0=$(tbf dropped)
        server 18600
        spid=$SPID
        client cli -- --transport rd --op send --flows 8 --devices 8 --server-qps 1 --size 64k \
                --duration-ms 2500 --warmup-ms 300 --validate "$B:18600"
        await $CPID client
        await $spid server
        show
        echo "tbf packets $(($(tbf sent_pkts) - p0 + $(tbf dropped) - d0)), dropped $(($(tbf dropped) - d0));" \
                "retransmissions $(val "$TMPD/cli" RESULT retx), RNR NAKs $(val "$TMPD/cli" RESULT rnr)"
        check cli 8 srv-18600
        fair cli 8 8
        ;;
slowrx_retx)
        # One flow to a receiver that reads at $SLOW bytes/s, alone on a
        # 1 Gbit/s veth: nothing is lost on the way (the tbf and the receive
        # buffer drop nothing), so every retransmission is spurious. At most
        # 2 % in each of 2 runs (ASan's scheduling makes about 1 % on other
        # flows).
        up "$NAME" direct 1gbit
        bad=
        for run in 1 2; do
                d0=$(tbf dropped)
                r0=$(rcvbuf_errors)
                server 18600 "${PULL[@]}" DIWARP_FAULT=slowrx:$SLOW
                spid=$SPID
                client cli-$run "${PULL[@]}" -- --transport rd --op send --flows 1 --devices 1 --size 256k \
                        --duration-ms 2000 --warmup-ms 300 --validate "$B:18600"
                await $CPID "client ($run)"
                await $spid "server ($run)"
                check cli-$run 1 srv-18600
                mv "$TMPD/srv-18600" "$TMPD/srv-$run"
                sent=$(val "$TMPD/cli-$run" "FLOW 0 " sent_dgrams)
                retx=$(val "$TMPD/cli-$run" "FLOW 0 " retx)
                echo "run $run: $retx retransmissions of $sent datagrams; tbf dropped" \
                        "$(($(tbf dropped) - d0)), receive buffers $(($(rcvbuf_errors) - r0));" \
                        "the receiver's duplicates: $(val "$TMPD/srv-$run" 'RESULT role=server' dup)"
                [ $((retx * 50)) -le "$sent" ] || bad+=" run $run: $retx of $sent;"
        done
        show
        [ -z "$bad" ] || fail "the flow to the slow receiver retransmitted more than 2 % of its datagrams:$bad"
        ;;
slowrx)
        slow_run
        slow_msgs=$(val "$TMPD/cli" "FLOW 3 " msgs)
        slow_done=$(val "$TMPD/cli" "FLOW 3 " "done")
        slow_sent=$(val "$TMPD/cli" "FLOW 3 " sent_dgrams)
        slow_retx=$(val "$TMPD/cli" "FLOW 3 " retx)
        echo "slow flow: $slow_done messages ($slow_msgs measured), $slow_retx retransmissions of" \
                "$slow_sent datagrams; its server: $(grep '^RESULT' "$TMPD/srv-18606")"
        # It completes messages: at least a quarter of what its receiver's
        # rate allows in the run (2 s at $SLOW bytes/s, 256 KiB each).
        [ $((slow_done * 4 * 262144)) -ge $((SLOW * 2)) ] ||
                fail "the slow flow completed $slow_done messages (< 1/4 of what $SLOW bytes/s allows)"
        # The others are not held back to its pace (that would make them about
        # as many): each completes at least 1.5 times as many.
        for s in 0 1 2; do
                m=$(val "$TMPD/cli" "FLOW $s " msgs)
                if [ $((2 * m)) -lt $((3 * slow_msgs)) ] || [ "$m" -eq 0 ]; then
                        fail "flow $s completed $m messages, not 1.5 times the slow flow's $slow_msgs"
                fi
        done
        # Its Sends were pulled by the receiver, which was throttled; nothing
        # overflowed a receive buffer.
        [ "$(val "$TMPD/srv-18606" 'RESULT role=server' pulls)" -gt 0 ] ||
                fail "the slow receiver pulled nothing (receiver-paced Sends not used)"
        [ "$(val "$TMPD/srv-18606" 'RESULT role=server' slowrx_waits)" -gt 0 ] ||
                fail "the slow receiver was never throttled"
        [ "$RCVBUF_ERRORS" -eq 0 ] || fail "$RCVBUF_ERRORS datagrams overflowed a receive buffer in B"
        ;;
hostpool) hostpool ;;
rc_rd)
        up "$NAME" router 1gbit
        server 18600 DIWARP_RC_TRANSPORT=rd
        spid=$SPID
        client cli DIWARP_RC_TRANSPORT=rd -- --transport rc --op send --flows 4 --devices 4 \
                --size 128k --duration-ms 2000 --warmup-ms 300 --validate "$B:18600"
        await $CPID client
        await $spid server
        show
        check cli 4 srv-18600
        grep -q '^RESULT .* rc_transport=rd ' "$TMPD/cli" || fail "RC is not carried by RD"
        # every flow reports its RD path (window, RTT): RC rides RD's congestion control
        [ "$(grep -c '^FLOW .* cwnd=' "$TMPD/cli")" -eq 4 ] || fail "an RC QP without an RD path"
        echo "retransmissions $(val "$TMPD/cli" RESULT retx) of $(val "$TMPD/cli" RESULT sent_dgrams)"
        fair cli 4 4
        ;;
*)
        fail "unknown case '$case'"
        ;;
esac
echo ok
