#!/bin/bash
# qperf (Debian's) over diwarp: one server and one client, both under
# `diwarp run`, on loopback. The client runs qperf's TCP tests as the
# baseline and, with -cm1 (rdma_cm), every rc_ test an RNIC supports, in one
# invocation: each must complete with a positive result, and the RDMA latency
# and bandwidth must stay within wide bounds of the TCP ones measured in the
# same run. Without -cm1 qperf names its peer by LID, which an iWARP device has
# not: both ends must refuse with a line that names -cm1; the ud_ tests always
# use LIDs (qperf ignores -cm1 for them): they must fail with a line saying so.
. "$(dirname "$0")/lib.sh"
need qperf

srv=$TMPD/server
cli=$TMPD/client
S=(qperf -lp @PORT@)
serve "$DIWARP" run

# A client that stops while its last Sends wait at the server for a receive
# (rc_bw) is seen by the server child when that stream gives up, after the
# peer timeout; qperf's server takes the next test only once that child is
# gone, and its client waits 5 s by default (-to): a short peer timeout and a
# longer wait keep the sequence from depending on it.
export DIWARP_PEER_TIMEOUT_MS=1000
q() { timeout 300 "$DIWARP" run qperf 127.0.0.1 -lp "$port" -to 30 -uu "$@"; }

rdma=(rc_lat rc_bw rc_bi_bw rc_rdma_write_lat rc_rdma_write_bw rc_rdma_write_poll_lat
        rc_rdma_read_lat rc_rdma_read_bw rc_compare_swap_mr rc_fetch_add_mr
        ver_rc_compare_swap ver_rc_fetch_add)
q -t 1 -cm1 tcp_lat tcp_bw "${rdma[@]}" >"$cli" 2>&1
crc=$?
echo "--- client ($crc):"
cat "$cli"
[ $crc -eq 0 ] || fail "qperf -cm1 exited $crc"

# value TEST FIELD: the number qperf printed for FIELD under TEST's heading.
value() {
        awk -v t="$1:" -v f="$2" '$0 == t { on = 1; next } /^[a-z_]+:$/ { on = 0 }
                on && $1 == f && $2 == "=" { print $3; exit }' "$cli"
}
for t in tcp_lat tcp_bw "${rdma[@]}"; do
        case $t in
        *_lat) f=latency ;;
        *_bw) f=bw ;;
        *) f=msg_rate ;;
        esac
        v=$(value $t $f)
        [[ $v =~ ^[0-9.]+$ ]] && awk -v v="$v" 'BEGIN { exit !(v > 0) }' ||
                fail "$t: no positive $f in qperf's output"
done
if grep -Eqi 'failed|error' "$cli"; then
        fail "qperf reported a failure"
fi

# Bounds against TCP in the same run, wide enough for a sanitized build on a
# busy 2-core machine (measured there: RC latency 5-15 x TCP's, bandwidth
# 0.15-0.5 x); what they catch is an order of magnitude more: an operation
# paced by a timer or a lost wake-up instead of the event that should drive it.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
tl=$(value tcp_lat latency)
tb=$(value tcp_bw bw)
for t in rc_lat rc_rdma_write_lat rc_rdma_read_lat; do
        r=$(ratio "$(value $t latency)" "$tl")
        echo "$t / tcp_lat = $r"
        awk -v r="$r" 'BEGIN { exit !(r <= 100) }' || fail "$t is $r x tcp_lat (bound 100)"
done
for t in rc_bw rc_rdma_write_bw rc_rdma_read_bw; do
        r=$(ratio "$(value $t bw)" "$tb")
        echo "$t / tcp_bw = $r"
        awk -v r="$r" 'BEGIN { exit !(r >= 0.02) }' || fail "$t is $r x tcp_bw (bound 0.02)"
done

# A Write large enough to be read straight into its target (64 KiB, one FPDU
# on loopback) that the other end polls by its last byte and writes over at
# once (rc_rdma_write_poll_lat): the receiver must verify the CRC over the
# bytes that came, not over the target after the program changed it (a
# "MPA CRC mismatch" ended such runs: libdiwarp/rc/README.md, rc_rx.c).
q -t 1 -cm1 -m 64K rc_rdma_write_poll_lat >"$TMPD/poll64" 2>&1 ||
        { cat "$TMPD/poll64" "$srv" >&2; fail "rc_rdma_write_poll_lat of 64 KiB exited non-zero"; }
cat "$TMPD/poll64"
! grep -Eqi 'failed|error|CRC mismatch' "$TMPD/poll64" ||
        fail "rc_rdma_write_poll_lat of 64 KiB reported a failure"
grep -Eq 'latency += +[0-9.]+ ' "$TMPD/poll64" ||
        fail "rc_rdma_write_poll_lat of 64 KiB printed no latency"

# Addressing by LID: a refusal naming the way out, not a hang. The end that
# gets there first refuses and qperf hands its error to the other, so the
# line is in the client's or the server's output.
q -t 1 rc_lat >"$TMPD/lid_rc" 2>&1 && fail "rc_lat without -cm1 succeeded"
expect "$TMPD/lid_rc" 'failed to modify QP to RTR' "rc_lat without -cm1 fails at RTR"
cat "$TMPD/lid_rc" "$srv" >"$TMPD/lid_rc_both"
expect "$TMPD/lid_rc_both" 'has no LIDs.*qperf -cm1' "rc_lat without -cm1 names -cm1"
q -t 1 -cm1 ud_lat >"$TMPD/lid_ud" 2>&1 && fail "ud_lat succeeded"
cat "$TMPD/lid_ud" "$srv" >"$TMPD/lid_ud_both"
expect "$TMPD/lid_ud_both" 'failed to create address handle' "ud_lat fails at its address handle"
expect "$TMPD/lid_ud_both" "has no LIDs.*qperf's ud_ tests use LIDs" "ud_lat says why it cannot run"

# The server is still there and serves the next client.
q -t 1 -cm1 rc_lat >"$TMPD/again" 2>&1 || { cat "$TMPD/again"; fail "server gone after the refusals"; }
kill $spid 2>/dev/null
wait $spid 2>/dev/null
echo "--- server:"
cat "$srv"
echo "ok"
