#!/bin/bash
# Late ACKs learned together (libdiwarp/rel/README.md): an all-to-all among
# many RD endpoints in two processes (bench-credits: EPS QPs in all, every
# one sending MSGS messages of 2 KiB to every QP of the other process), the
# device as it comes (progress thread), unpinned. Each stream sends only a
# few messages while the other process's threads take the cores by turns,
# so its own RTT estimate says little about how late the peer answers.
# Every message must arrive intact (bench-credits checks sender, sequence
# and bytes of each), in each of two runs, and the datagrams resent
# needlessly (every resend the receivers already held: `dups`) must stay
# at most MAX_PCT (8) % of the datagrams sent in the better run. Under AddressSanitizer on this 2-core test machine,
# 2 to 3 rounds each: 1.7-2.1 % quiet, 2.7-3.5 % beside a nice-19 build
# loop, 4.1-5.1 % beside a nice-0 `yes` per core; before the streams of a
# device learned a peer's late answers together (each stream doubled its
# own probe timeout), 11.7-14.2 %, 10.9-13.9 % and 10.3-12.0 %.
#   rd_late_acks.sh BENCH-CREDITS
set -u
bench=${1:?usage: rd_late_acks.sh BENCH-CREDITS}
MAX_PCT=${LATE_ACKS_MAX_PCT:-8}
EPS=${LATE_ACKS_EPS:-64}
MSGS=${LATE_ACKS_MSGS:-30}
# run N: one all-to-all; its needless resends and datagrams sent left in
# dups_N and tx_N. Fails the test on a run that did not deliver everything.
run() {
        local out rc line
        out=$(DIWARP_CREDIT=static DIWARP_CREDIT_PEERS=$EPS DIWARP_CREDIT_RING=4096 \
                timeout 300 "$bench" --procs 2 --eps "$EPS" --msgs "$MSGS" --size 2048 --rq 4 2>&1)
        rc=$?
        line=$(printf '%s\n' "$out" | grep '^RESULT ')
        if [ $rc -ne 0 ] || [ -z "$line" ]; then
                printf '%s\n' "$out" | tail -20
                echo "FAIL: run $1: bench-credits exit $rc, no RESULT line"
                exit 1
        fi
        echo "run $1: $line"
        local d t
        d=$(printf '%s\n' "$line" | grep -o ' dups=[0-9]*' | cut -d= -f2)
        t=$(printf '%s\n' "$line" | grep -o ' tx_packets=[0-9]*' | cut -d= -f2)
        if [ -z "$d" ] || [ -z "$t" ] || [ "$t" -eq 0 ]; then
                echo "FAIL: run $1: no dups or tx_packets in the RESULT line"
                exit 1
        fi
        eval "dups_$1=$d tx_$1=$t"
}
run 1
run 2
# The better of the two runs is judged: a burst of the host's load during
# one run is forgiven (the CI run beside a build loop measured 7.5 % once),
# while the behaviour before resent more than 10 % in every run measured.
if [ $((dups_1 * tx_2)) -le $((dups_2 * tx_1)) ]; then
        dups=$dups_1 tx=$tx_1
else
        dups=$dups_2 tx=$tx_2
fi
echo "needless resends, the better run: $dups of $tx datagrams, at most $MAX_PCT %"
if [ $((dups * 100)) -gt $((MAX_PCT * tx)) ]; then
        echo "FAIL: $dups of $tx datagrams were resent needlessly (more than $MAX_PCT %)"
        exit 1
fi
echo "ok"
