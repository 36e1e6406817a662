#!/bin/bash
# An event-driven ping-pong (a completion channel: ibv_req_notify_cq +
# ibv_get_cq_event) against a blocking socket ping-pong measured in the same
# run (bench/raw-sock --block: a thread the kernel wakes per message):
#   events_latency.sh rc|rd|ud
# rc: ibv_rc_pingpong -e against TCP; rd: the same with
# DIWARP_RC_TRANSPORT=rd, against TCP; ud: ibv_ud_pingpong -e against UDP.
# $RAW_SOCK: bench/raw-sock of the build.
#
# Each round runs the socket program, the event-driven ping-pong as it
# comes, and the same with DIWARP_WAIT_SPIN_US=0 (a wait that sleeps at
# once, as every wait whose completion takes longer than the spin). Ratios,
# each against the socket program of the same rounds (rounds alternate the
# programs, so a shared machine's drifts hit all):
# - wake-ups: the voluntary context switches of both processes (every sleep
#   in the kernel: a blocking receive, a poll, a futex wait), per iteration;
#   the fewest of the rounds counts (noise only adds sleeps).
#   Without the spin: the thread waiting in ibv_get_cq_event drives
#   progress itself, so a message wakes it and no other thread, as the
#   socket program's receive is woken: measured x1.0-1.35 of the socket
#   program, release and ASan builds, when the two ends share a core; on
#   two cores both ends sleep every iteration where the socket program's
#   two ends, kept on one core by the kernel, often do not: x1.6-2.0 (rd
#   most). A progress thread woken per message that then wakes the
#   application (and hands the device lock back and forth with it) measured
#   x3-6.5. EVENTS_WAKE_BOUND (default 2.5) is the largest ratio accepted:
#   the test of the second wake-up.
#   With the spin (the default): the waiter still runs when the reply comes,
#   so most messages wake nobody: measured x0.09-0.15 (ASan); a spin that
#   never catches a reply sleeps as often as without it. EVENTS_SPIN_WAKE_BOUND
#   (default 0.5) is the largest ratio accepted: the test of the spin. The
#   spin is off where the waiter shares its core (a busy host), so only rounds
#   whose socket program left a quarter of the host's CPU time idle count.
# - latency (with the spin): the fastest round of each side (noise only adds
#   time); the pingpongs print the round trip per iteration, raw-sock half
#   of it. Once a ping-pong's two ends sit on different cores every sleeping
#   wait costs the wake-up of an idle core (25-60 us on this VM), which the
#   socket program escapes while the kernel keeps its two ends on one core:
#   without the spin ASan builds measured x5.6-9 (rc), x12 (rd), with it
#   x2.2-3.0 (rc), x3.3-3.5 (rd), x3.4-3.5 (ud). EVENTS_BOUND (default rc 8,
#   ud and rd 16) catches a path that crawls (a wait that sleeps to a timer,
#   a lost wake-up) on a loaded machine.
. "$(dirname "$0")/lib.sh"
: "${RAW_SOCK:?RAW_SOCK must name bench/raw-sock of the build}"
mode=${1:?usage: events_latency.sh rc|rd|ud}
rounds=${EVENTS_ROUNDS:-5}
iters=${EVENTS_ITERS:-3000}
wake_bound=${EVENTS_WAKE_BOUND:-2.5}
spin_wake_bound=${EVENTS_SPIN_WAKE_BOUND:-0.5}
spin_idle_min=0.25
size=64
env=()
case $mode in
rc) prog=ibv_rc_pingpong proto=tcp bound=8 ;;
rd) prog=ibv_rc_pingpong proto=tcp bound=16 env=(env DIWARP_RC_TRANSPORT=rd) ;;
ud) prog=ibv_ud_pingpong proto=udp bound=16 ;; # best blocking UDP round trips ranged 7.9-31 us in one CI run
*) fail "unknown mode $mode" ;;
esac
bound=${EVENTS_BOUND:-$bound}
need "$prog"
[ -x /usr/bin/time ] || { echo "SKIP: /usr/bin/time not installed" >&2; exit 77; }
[ -x "$RAW_SOCK" ] || fail "$RAW_SOCK is not a program"

srv=$TMPD/server
cli=$TMPD/client
best_sock=
best_ev=
wake_sock=
wake_ev=
wake_spin=
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a + 0 < b + 0) ? a : b }'; }
# wakes: voluntary context switches per iteration of the two processes
# (/usr/bin/time -f %w, written to $TMPD/*.w).
wakes() {
        local s c
        s=$(tail -n 1 "$TMPD/srv.w")
        c=$(tail -n 1 "$TMPD/cli.w")
        [[ $s =~ ^[0-9]+$ && $c =~ ^[0-9]+$ ]] || fail "no context switch count ($s/$c)"
        awk -v s="$s" -v c="$c" -v n="$iters" 'BEGIN { printf "%.3f", (s + c) / n }'
}
tm_srv=(/usr/bin/time -o "$TMPD/srv.w" -f %w)
tm_cli=(/usr/bin/time -o "$TMPD/cli.w" -f %w)
# cpu_idle: the host's idle and total CPU time so far (/proc/stat ticks).
cpu_idle() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t; exit }' /proc/stat; }
for r in $(seq 1 "$rounds"); do
        read -r idle0 total0 < <(cpu_idle)
        # raw-sock serves one run on --port. A UDP server has no listener:
        # it is ready once it holds its port.
        S=("$RAW_SOCK" --proto $proto --mode pingpong --block --size $size --iters "$iters"
                --port @PORT@)
        if [ $proto = udp ]; then
                serve_ready=udp_bound serve "${tm_srv[@]}"
        else
                serve_ready= serve "${tm_srv[@]}"
        fi
        timeout 60 "${tm_cli[@]}" "$RAW_SOCK" --proto $proto --mode pingpong --block --size $size \
                --iters "$iters" --port "$port" 127.0.0.1 >"$cli" 2>&1
        crc=$?
        wait $spid
        [ $crc -eq 0 ] || { cat "$cli"; fail "raw-sock client exited $crc"; }
        half=$(sed -n 's/.*status=ok lat_us=\([0-9.]*\).*/\1/p' "$cli")
        [ -n "$half" ] || { cat "$cli"; fail "raw-sock printed no latency"; }
        sock=$(awk -v h="$half" 'BEGIN { printf "%.3f", 2 * h }')
        # The share of the host idle while the socket program ran (it keeps
        # one core busy, its two ends on one core): did a spinner have a core?
        read -r idle1 total1 < <(cpu_idle)
        idle=$(awk -v i=$((idle1 - idle0)) -v t=$((total1 - total0)) 'BEGIN { printf "%.2f", (t > 0 ? i / t : 0) }')
        wsock=$(wakes)

        # events SPIN_US: one run of the event-driven ping-pong with
        # DIWARP_WAIT_SPIN_US=SPIN_US (empty: the default); sets ev, wev.
        events() {
                local spin=()
                [ -n "$1" ] && spin=(env DIWARP_WAIT_SPIN_US="$1")
                S=("$prog" -g 0 -p @PORT@ -n "$iters" -s $size -e)
                serve_ready= serve "${tm_srv[@]}" "${spin[@]}" "${env[@]}" "$DIWARP" run
                timeout 120 "${tm_cli[@]}" "${spin[@]}" "${env[@]}" "$DIWARP" run "$prog" -g 0 \
                        -p "$port" -n "$iters" -s $size -e 127.0.0.1 >"$cli" 2>&1
                crc=$?
                wait $spid
                src=$?
                [ $src -eq 0 ] && [ $crc -eq 0 ] ||
                        { cat "$srv" "$cli"; fail "$prog -e exited $src/$crc"; }
                ev=$(sed -n 's/^[0-9]* iters in [0-9.]* seconds = \([0-9.]*\) usec\/iter$/\1/p' "$cli")
                [ -n "$ev" ] || { cat "$cli"; fail "$prog printed no usec/iter"; }
                wev=$(wakes)
        }
        events ""
        spin_ev=$ev
        spin_wev=$wev
        events 0
        echo "round $r: blocking ${proto^^} round trip $sock us, $wsock wake-ups/iteration" \
                "(host idle $idle); $prog -e ($mode) $spin_ev us, $spin_wev; without the spin $ev us, $wev"
        ev=$spin_ev
        awk -v i="$idle" -v m="$spin_idle_min" 'BEGIN { exit !(i >= m) }' &&
                wake_spin=$(min "$spin_wev" "$wake_spin")
        best_sock=$(min "$sock" "$best_sock")
        best_ev=$(min "$ev" "$best_ev")
        wake_sock=$(min "$wsock" "$wake_sock")
        wake_ev=$(min "$wev" "$wake_ev")
done
ratio=$(awk -v e="$best_ev" -v t="$best_sock" 'BEGIN { printf "%.2f", e / t }')
wratio=$(awk -v e="$wake_ev" -v t="$wake_sock" 'BEGIN { printf "%.2f", e / (t > 0 ? t : 1e-9) }')
echo "best: $prog -e $best_ev us, blocking ${proto^^} $best_sock us: ratio $ratio (bound $bound)"
echo "fewest wake-ups per iteration without the spin: $prog -e $wake_ev, blocking ${proto^^} $wake_sock:" \
        "ratio $wratio (bound $wake_bound)"
if [ -n "$wake_spin" ]; then
        sratio=$(awk -v e="$wake_spin" -v t="$wake_sock" 'BEGIN { printf "%.2f", e / (t > 0 ? t : 1e-9) }')
        echo "fewest wake-ups per iteration with the spin (rounds with the host idle" \
                ">= $spin_idle_min): $prog -e $wake_spin: ratio $sratio (bound $spin_wake_bound)"
        awk -v r="$sratio" -v b="$spin_wake_bound" 'BEGIN { exit !(r <= b) }' ||
                fail "event-driven ping-pong ($mode) with the spin sleeps x$sratio as often as a blocking ${proto^^} ping-pong (bound x$spin_wake_bound): the spin catches no reply"
else
        echo "the spin's wake-ups not judged: no round found the host idle >= $spin_idle_min" \
                "(a busy host, where waits sleep at once by design)"
fi
awk -v r="$wratio" -v b="$wake_bound" 'BEGIN { exit !(r <= b) }' ||
        fail "event-driven ping-pong ($mode) sleeps x$wratio as often as a blocking ${proto^^} ping-pong (bound x$wake_bound)"
awk -v r="$ratio" -v b="$bound" 'BEGIN { exit !(r <= b) }' ||
        fail "event-driven ping-pong ($mode) is x$ratio of a blocking ${proto^^} ping-pong (bound x$bound)"
echo "ok"
