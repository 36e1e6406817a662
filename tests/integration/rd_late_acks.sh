#!/bin/bash
# Late ACKs learned together (libdiwarp/rel/README.md): an all-to-all among
# many RD endpoints in two processes (bench-credits: EPS QPs in all, every
# one sending MSGS messages of 2 KiB to every QP of the other process), the
# device as it comes (progress thread), unpinned. Each stream sends only a
# few messages while the other process's threads take the cores by turns,
# so its own RTT estimate says little about how late the peer answers.
# Every message must arrive intact (bench-credits checks sender, sequence
# and bytes of each), and the datagrams resent needlessly (every resend the
# receivers already held: `dups`) are compared with the same all-to-all
# whose streams each probe by their own RTT alone (DIWARP_RD_LATE_ACKS=
# stream), run right before it under the same load: in the better of two
# rounds the device's learning must resend at most MAX_RATIO_PCT (60) % as
# large a share of its datagrams. Under AddressSanitizer on this 2-core test
# machine, the learning's share against the baseline's in the same round:
# quiet, 2.3 % against 27.9 % and 1.4 against 19.8 (ratios 0.07-0.08);
# beside a nice-19 build of MVAPICH2 (make -j2), 8.4 % against 37.7 % and
# 6.8 against 23.5 (ratios 0.22-0.29); beside that build, a build loop of
# this tree and the test suite at once (load 10-12), 11.3-14.8 % against
# 33.5-45.5 % (0.32-0.38). The absolute bound it had before (8 %) failed in
# both: the share grows with the host's load whatever the code does.
#   rd_late_acks.sh BENCH-CREDITS
set -u
bench=${1:?usage: rd_late_acks.sh BENCH-CREDITS}
MAX_RATIO_PCT=${LATE_ACKS_MAX_RATIO_PCT:-60}
EPS=${LATE_ACKS_EPS:-64}
MSGS=${LATE_ACKS_MSGS:-30}
# run NAME MODE: one all-to-all with DIWARP_RD_LATE_ACKS=MODE; its needless
# resends and datagrams sent left in dups_NAME and tx_NAME. Fails the test
# on a run that did not deliver everything.
run() {
        local out rc line
        out=$(DIWARP_RD_LATE_ACKS=$2 DIWARP_CREDIT=static DIWARP_CREDIT_PEERS=$EPS \
                DIWARP_CREDIT_RING=4096 \
                timeout 300 "$bench" --procs 2 --eps "$EPS" --msgs "$MSGS" --size 2048 --rq 4 2>&1)
        rc=$?
        line=$(printf '%s\n' "$out" | grep '^RESULT ')
        if [ $rc -ne 0 ] || [ -z "$line" ]; then
                printf '%s\n' "$out" | tail -20
                echo "FAIL: run $1 ($2): bench-credits exit $rc, no RESULT line"
                exit 1
        fi
        local d t
        d=$(printf '%s\n' "$line" | grep -o ' dups=[0-9]*' | cut -d= -f2)
        t=$(printf '%s\n' "$line" | grep -o ' tx_packets=[0-9]*' | cut -d= -f2)
        if [ -z "$d" ] || [ -z "$t" ] || [ "$t" -eq 0 ]; then
                echo "FAIL: run $1 ($2): no dups or tx_packets in the RESULT line"
                exit 1
        fi
        echo "run $1 ($2): $line"
        echo "  needless resends: $d of $t datagrams ($((d * 1000 / t / 10)).$((d * 1000 / t % 10)) %)"
        eval "dups_$1=$d tx_$1=$t"
}
# A round: the baseline, then the device's learning, back to back. Its
# ratio (the learning's share of needless resends over the baseline's, in
# per mille) is left in ratio_N.
round() {
        run "s$1" stream
        run "d$1" device
        local ds ts dd td
        eval "ds=\$dups_s$1 ts=\$tx_s$1 dd=\$dups_d$1 td=\$tx_d$1"
        if [ "$ds" -eq 0 ]; then
                # Nothing resent needlessly without the learning: nothing to
                # compare; the learning must not resend either.
                eval "ratio_$1=$((dd == 0 ? 0 : 1000000))"
        else
                eval "ratio_$1=$((dd * ts * 1000 / (td * ds)))"
        fi
}
round 1
round 2
# The better round is judged: a burst of the host's load during one run is
# forgiven.
ratio=$((ratio_1 < ratio_2 ? ratio_1 : ratio_2))
echo "needless resends with the device's learning against without, the better round:" \
        "$ratio per mille (at most $((MAX_RATIO_PCT * 10)))"
if [ "$ratio" -gt $((MAX_RATIO_PCT * 10)) ]; then
        echo "FAIL: the device's learning resent $ratio per mille of the baseline's share" \
                "(more than $MAX_RATIO_PCT %)"
        exit 1
fi
echo "ok"
