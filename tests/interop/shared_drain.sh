#!/bin/bash
# Programs that drain their CQ before they act on what it held, on a host
# where more busy programs than cores share one core:
#   shared_drain.sh rc|rd
# Two ping-pong pairs of libfabric's fi_pingpong (`verbs;ofi_rxm`, RDM
# endpoints: ofi_rxm polls the verbs CQ until it finds it empty after every
# completion, and only then sends the reply), every process under
# `diwarp run` and all four on one core, server in namespace A and client in
# B (a veth pair: libfabric's verbs provider ignores loopback). rd: the same
# with DIWARP_RC_TRANSPORT=rd. The baseline, in the same rounds: two pairs of
# blocking TCP ping-pongs (bench/raw-sock --block, $RAW_SOCK) on the same
# core between the same namespaces.
#
# The pollers wait for the core, so each device turns shared (the progress
# thread makes the progress, an empty poll naps: progress/README.md, "Shared
# hosts"); the test checks that the device did. A nap in the empty poll that
# ends a drain held the reply back until the nap's bound ran out: x18-19
# (rc) and x22-23 (rd) of the TCP pairs' latency, release and ASan builds
# (RC 284-296 us a transfer, RC over RD 346-399, TCP 15.8-17.4); exempting
# the first empty polls after a completion, x6.6 and x9.3 (release), x8.0
# and x11.6 (ASan). Each round's ratio is taken within the round, and the
# median of the rounds' ratios counts: a busy host's scheduler can hand one
# round's TCP pairs a lucky run (9.2 us against 22 and 30 in the other
# rounds of one CI run beside a build loop, fi_pingpong 143-172 us in all
# three), and the best-of-each-side ratio it replaced read x15.6 there.
# How large that ratio is depends on the host as much as on diwarp: on
# another VM (2026-12-02) the same code read x12-16 (rc) and x13-14 (rd),
# the TCP pairs at 28-40 us, and with the polls napping at once
# (DIWARP_SHARED_NAP_AFTER=0) x50-56 for both. So each round also runs the
# fi_pingpong pairs with DIWARP_SHARED_NAP_AFTER=0, and the median of the
# rounds' ratios of the default to that (SHARED_DRAIN_NAP_BOUND, default
# 0.6; measured 0.24-0.28 here, about 0.43 on the first host) is what must
# hold; the ratio to TCP stays bounded loosely (SHARED_DRAIN_BOUND, default
# 30) against a collapse that hits both variants. Needs root, `ip netns` and
# fi_pingpong, else skipped.
#
# While the fi_pingpong pairs run, `diwarp stat` is sampled: of the naps
# that drove the devices, at most 2 % may have been ended by a transport's
# timer rather than data (progress_timer_wakes against progress_nap_drives;
# SHARED_DRAIN_TIMER_PCT). RD's earliest deadline kept a probe timer that
# an ACK had already moved later, and the processes woke for nothing: 10.5 %
# of the naps here (rd, release), a context switch each on this core; with
# exact deadlines (rd/README.md) 0.4 % (release), 0.3 % (ASan), rc 0.
. "$(dirname "$0")/lib.sh"
: "${RAW_SOCK:?RAW_SOCK must name bench/raw-sock of the build}"
mode=${1:?usage: shared_drain.sh rc|rd}
rounds=${SHARED_DRAIN_ROUNDS:-3}
iters=${SHARED_DRAIN_ITERS:-2000}
env=()
case $mode in
rc) ;;
rd) env=(DIWARP_RC_TRANSPORT=rd) ;;
*) fail "unknown mode $mode" ;;
esac
bound=${SHARED_DRAIN_BOUND:-30}
nap_bound=${SHARED_DRAIN_NAP_BOUND:-0.6}
timer_pct=${SHARED_DRAIN_TIMER_PCT:-2}

ns_require "shared_drain" # lib.sh
need fi_pingpong
[ -x "$RAW_SOCK" ] || fail "$RAW_SOCK is not a program"

nsA=diwarp-dA-$$
nsB=diwarp-dB-$$
X=$(($$ % 250 + 1))
A=10.78.$X.1
B=10.78.$X.2
cleanup() {
        rc=$?
        ns_finish $rc "$nsA" "$nsB" # lib.sh
}
trap cleanup EXIT
exit_traps # lib.sh
ns_reap_stale '^diwarp-d[AB]-[0-9]+$' # lib.sh
ns_pair "$nsA" "$nsB" "$A" "$B" 2>"$TMPD/setup" ||
        { cat "$TMPD/setup" >&2; skip "cannot create network namespaces / veth here"; }

core=0
# pairs NAME SERVER... -- CLIENT...: runs two pairs at once on $core, the
# servers in A (port @PORT@: 19701 and 19702), the clients in B; each
# client's output in $TMPD/NAME.PAIR, each server's in $TMPD/NAME.PAIR.srv.
pairs() {
        local name=$1 i port sv=() cl=() pids=() cpids=() rc=0
        shift
        while [ "$1" != -- ]; do sv+=("$1"); shift; done
        shift
        cl=("$@")
        for i in 1 2; do
                port=$((19700 + i))
                ip netns exec "$nsA" timeout 120 taskset -c $core "${sv[@]//@PORT@/$port}" \
                        >"$TMPD/$name.$i.srv" 2>&1 &
                pids+=($!)
        done
        for i in 1 2; do
                port=$((19700 + i))
                local n=0
                until ns_listening "$nsA" $port; do
                        n=$((n + 1))
                        [ $n -lt 150 ] || { cat "$TMPD/$name.$i.srv" >&2; fail "$name server $i never listened"; }
                        sleep 0.1
                done
        done
        for i in 1 2; do
                port=$((19700 + i))
                ip netns exec "$nsB" timeout 120 taskset -c $core "${cl[@]//@PORT@/$port}" \
                        >"$TMPD/$name.$i" 2>&1 &
                cpids+=($!)
        done
        for i in 0 1; do
                wait ${cpids[$i]} || { rc=1; cat "$TMPD/$name.$((i + 1))" >&2; }
                wait ${pids[$i]} || { rc=1; cat "$TMPD/$name.$((i + 1)).srv" >&2; }
        done
        [ $rc -eq 0 ] || fail "$name: a program failed"
}
# slowest NAME SED: the larger value SED extracts from the two clients'
# outputs (the pair the core served worst).
slowest() {
        local i v out=
        for i in 1 2; do
                v=$(sed -n "$2" "$TMPD/$1.$i")
                [ -n "$v" ] || { cat "$TMPD/$1.$i" >&2; fail "$1 pair $i printed no latency"; }
                out=$(awk -v a="$v" -v b="$out" 'BEGIN { print (b == "" || a + 0 > b + 0) ? a : b }')
        done
        echo "$out"
}

ratios=()
naps=()
shared=0
for r in $(seq 1 "$rounds"); do
        raw=("$RAW_SOCK" --proto tcp --mode pingpong --block --size 8 --iters "$iters" --port @PORT@)
        pairs tcp "${raw[@]}" -- "${raw[@]}" "$A"
        tcp=$(slowest tcp 's/.*status=ok lat_us=\([0-9.]*\).*/\1/p')
        fip=(env "${env[@]}" DIWARP_LOG=debug "$DIWARP" run fi_pingpong -p "verbs;ofi_rxm" -e rdm
                -I "$iters" -S 8)
        # The devices' counters as published while the pairs run (a process's
        # vanish as it exits): the last sample that shows the most of the
        # four. Beside CPU hogs a `diwarp stat` can take longer than the
        # pairs run with all four up: a sample that showed all four only
        # came in none of a run's rounds.
        (best=0
        while :; do
                "$DIWARP" stat >"$TMPD/sample" 2>/dev/null
                n=$(grep -c '^process .* comm fi_pingpong ' "$TMPD/sample")
                if [ "$n" -gt 0 ] && [ "$n" -ge "$best" ]; then
                        best=$n
                        mv "$TMPD/sample" "$TMPD/stat.$r"
                fi
                sleep 0.1
        done) &
        sampler=$!
        pairs fi "${fip[@]}" -B @PORT@ -- "${fip[@]}" -P @PORT@ "$A"
        kill $sampler 2>/dev/null
        wait $sampler 2>/dev/null
        # fi_pingpong's line for its size: bytes iters total time MB/sec usec/xfer ...
        f=$(slowest fi 's/^8 \+[^ ]\+ \+[^ ]\+ \+[^ ]\+ \+[^ ]\+ \+[^ ]\+ \+\([0-9.]\+\) .*/\1/p')
        n=$(cat "$TMPD"/fi.* | grep -c "the progress thread makes progress")
        shared=$((shared + n))
        # The same pairs with every empty poll napping at once.
        fin=(env "${env[@]}" DIWARP_SHARED_NAP_AFTER=0 "$DIWARP" run fi_pingpong -p "verbs;ofi_rxm"
                -e rdm -I "$iters" -S 8)
        pairs finap "${fin[@]}" -B @PORT@ -- "${fin[@]}" -P @PORT@ "$A"
        fn=$(slowest finap 's/^8 \+[^ ]\+ \+[^ ]\+ \+[^ ]\+ \+[^ ]\+ \+[^ ]\+ \+\([0-9.]\+\) .*/\1/p')
        echo "round $r: blocking TCP pairs $tcp us one way; fi_pingpong ($mode) $f us a transfer;" \
                "$n devices turned shared; napping at once $fn us"
        ratios+=("$(awk -v f="$f" -v t="$tcp" 'BEGIN { printf "%.2f", f / t }')")
        naps+=("$(awk -v f="$f" -v t="$fn" 'BEGIN { printf "%.3f", f / t }')")
done
[ "$shared" -gt 0 ] || fail "no device turned shared: the test did not reach the napping polls"
# counter NAME: the sum over the sampled fi_pingpong processes' devices.
counter() {
        cat "$TMPD"/stat.* 2>/dev/null | awk -v k="$1" '
                $1 == "process" { fi = ($0 ~ / comm fi_pingpong /) }
                $1 == "link" && fi { for (i = 1; i < NF; i++) if ($i == k) s += $(i + 1) }
                END { print s + 0 }'
}
drives=$(counter progress_nap_drives)
twakes=$(counter progress_timer_wakes)
echo "sampled: $drives naps drove the devices, $twakes of them ended by a timer (bound $timer_pct %)"
[ "$drives" -gt 0 ] || fail "no sample of diwarp stat showed the fi_pingpong devices' naps"
awk -v w="$twakes" -v d="$drives" -v p="$timer_pct" 'BEGIN { exit !(w * 100 <= d * p) }' ||
        fail "fi_pingpong over diwarp ($mode): $twakes of $drives driving naps were ended by a transport's timer (bound $timer_pct %): a deadline kept earlier than any peer's?"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio=$(median "${ratios[@]}")
nap=$(median "${naps[@]}")
echo "rounds' ratios of fi_pingpong to blocking TCP: ${ratios[*]}; median x$ratio (bound x$bound)"
echo "rounds' ratios of fi_pingpong to itself napping at once: ${naps[*]}; median x$nap (bound x$nap_bound)"
awk -v r="$nap" -v b="$nap_bound" 'BEGIN { exit !(r <= b) }' ||
        fail "fi_pingpong over diwarp ($mode) took x$nap of its time with every empty poll napping (bound x$nap_bound): the polls that end a drain nap"
awk -v r="$ratio" -v b="$bound" 'BEGIN { exit !(r <= b) }' ||
        fail "fi_pingpong over diwarp ($mode) took x$ratio of blocking TCP pairs on the same core (bound x$bound)"
echo "PASS: shared_drain $mode"
