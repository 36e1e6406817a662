#!/bin/bash
# Multirail (DIWARP_ADDR=a,b[,c]: a rail per address) between two network
# namespaces joined by one veth pair per rail (bench/netns-topo.sh ... rails:
# a subnet and a tbf per rail), with diwarp-bw --validate and multirail_order
# as the traffic. Never a speed, only what must hold at any speed:
#   netns_multirail.sh NETNS-TOPO DIWARP-BW MULTIRAIL-ORDER CASE
#   shares2   MR-1: 2 rails of RATE each. RD Write, Read and Send streams of
#             4 MiB messages: the sending side's RAIL lines give each rail
#             tx_bytes within ±TOL % of an equal share (1/2), and so do the
#             tbf byte counters of that side's veths (which also agree with
#             the RAIL lines within 5 points).
#   shares3   the same with 3 rails (1/3 each).
#   reorder   MR-2: rails of RATE and RATE/4 whose tbf queues hold 3 and 40 ms:
#             segments of one message arrive out of order. RD Write, Send and
#             Read (--validate) and multirail_order order: every byte right,
#             every WR completed once (status=ok, the counts).
#   linkdown  MR-8: during a long RD Write stream (once rail 2 carried 4 MiB
#             of it) A's rail-2 veth goes down, 2 s later up again: the run
#             completes (status=ok, validated), the client's RAIL line of rail
#             1 says downs>=1; once up, the rail carries data again in the
#             same run (its tbf counter grows by 1 MiB, when the run lasts 3 s
#             more), and a second run sends on it (tx_bytes > 0).
#   peerdown  the same with B's end of rail 2 down: A's sends on it still
#             succeed and vanish, so the rail stops being acknowledged.
#   small     64 KiB RD Writes stay on rail 0 (>= 95 % of tx_bytes): below
#             DIWARP_STRIPE_MIN; and 4 MiB Writes with DIWARP_STRIPE_MIN=0.
#   perftest  an unmodified program: ib_write_bw (4 MiB Writes, one MR) under
#             `diwarp run --addr a,b` with its RC QP carried by RD: each of
#             A's veths carries 45-55 % of the bytes (tbf counters).
#   order     MR-3 and MR-4 (multirail_order): a striped Send then a 64-byte
#             Send, repeatedly: receive completions in posting order, right
#             byte_len and contents; one STag taking RDMA Writes (and serving
#             Reads) that left by every rail.
# Each diwarp-bw run: exit 0 and status=ok on both sides, iters as asked,
# one RAIL line per rail on both sides. Skipped (77) without root, ip, tc or
# tbf. Cleanup (namespaces, processes) on exit, SIGTERM and SIGINT
# (netns_lib.sh).
set -u
usage="usage: netns_multirail.sh NETNS-TOPO DIWARP-BW MULTIRAIL-ORDER CASE"
topo=${1:?$usage}
bw=${2:?$usage}
mro=${3:?$usage}
case=${4:?$usage}
RATE=250  # Mbit/s per rail: low enough for 2 cores under ASan
TOL=10    # a rail's share: within TOL % of the equal share (TOL3 on 3 rails)
# Each rail pulls segments as its own window allows (no fixed share): a rail
# whose window a spurious RTO halved (under ASan, with both ends, their
# progress threads and the tbfs' softirqs on 2 cores, ACKs now and then wait
# longer than the 1 ms minimum RTO) carries less until it grows back. On 3
# rails of 1/3 each such a dip moves one rail to 28-30 % in about one run of
# three: the band there is wider, still far from a rail left unused.
TOL3=20
TMO=15000 # diwarp-bw --timeout (ms): the longest wait for one completion
NAME=nmr${case//_/}$$
port=18700
# shellcheck source=tests/integration/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

# rails RATES [OPTS...]: a rails topology; sets A_RAILS, B_RAILS (the
# DIWARP_ADDR lists), NR (rails), A and B (rail 1's addresses).
rails() {
        up "$NAME" rails "$@"
        A_RAILS=$(sed -n 's/.* a_rails=\([0-9.,]*\).*/\1/p' "$TMPD/topo")
        B_RAILS=$(sed -n 's/.* b_rails=\([0-9.,]*\).*/\1/p' "$TMPD/topo")
        NR=$(sed -n 's/.* rails=\([0-9]*\).*/\1/p' "$TMPD/topo")
        if [ -z "$A_RAILS" ] || [ -z "$B_RAILS" ] || [ -z "$NR" ]; then
                fail "no rail lists in the TOPO line"
        fi
}

# tbf_snap FILE: "SIDE RAIL SENT_BYTES" per tbf of the topology.
tbf_snap() {
        "$topo" stats "$NAME" | sed -n 's/.* ns=[^ ]*-\([AB]\) dev=[^ ]* rail=\([0-9]*\) .* sent_bytes=\([0-9]*\) .*/\1 \2 \3/p' >"$1"
}

# tbf_delta TAG SIDE: the bytes each of SIDE's tbfs sent during run TAG, one
# per line in rail order.
tbf_delta() {
        awk -v s="$2" 'NR == FNR { b[$1 " " $2] = $3; next }
                $1 == s { print $3 - b[$1 " " $2] }' "$TMPD/tbf0-$1" "$TMPD/tbf1-$1"
}

# tbf_now SIDE RAIL: SIDE's tbf counter of RAIL now. A read that gives no
# number is tried again (5 times, 0.1 s apart), its error shown; then it
# returns 1 with nothing printed, for the caller to fail naming what it read.
tbf_now() {
        local v err i
        for i in 1 2 3 4 5; do
                err=$("$topo" stats "$NAME" 2>&1 >"$TMPD/tbf-now")
                v=$(sed -n "s/.* ns=[^ ]*-$1 dev=[^ ]* rail=$2 .* sent_bytes=\([0-9]*\) .*/\1/p" "$TMPD/tbf-now")
                case $v in
                '' | *[!0-9]*)
                        echo "tbf_now $1 $2: no byte count (try $i): ${err:-no error} $(tr '\n' ' ' <"$TMPD/tbf-now")" >&2
                        sleep 0.1
                        ;;
                *)
                        echo "$v"
                        return 0
                        ;;
                esac
        done
        return 1
}

# rail FILE INDEX KEY: KEY of the RAIL line of rail INDEX (0-based) in FILE.
rail() {
        awk -v i="$2" -v k="$3" '/^RAIL / && index($0, " index=" i " ") {
                for (f = 1; f <= NF; f++) if (index($f, k "=") == 1) { print substr($f, length(k) + 2); exit } }' "$1"
}

# show: every output so far, for the log.
show() {
        local f
        for f in "$TMPD"/cli-* "$TMPD"/srv-* "$TMPD"/mro-*; do
                [ -e "$f" ] || continue
                echo "--- ${f##*/}"
                cat "$f"
        done
}

# bw_start TAG OP SIZE ITERS [VAR=VALUE...]: a diwarp-bw server in B (core 0)
# and its client in A (core 1), each with its rail list in DIWARP_ADDR and
# the VAR=VALUEs; outputs in $TMPD/srv-TAG and cli-TAG. Sets SPID, CPID.
bw_start() {
        local tag=$1 op=$2 size=$3 iters=$4
        shift 4
        port=$((port + 1))
        tbf_snap "$TMPD/tbf0-$tag"
        "$topo" exec "$NAME" B env DIWARP_ADDR="$B_RAILS" "$@" taskset -c 0 "$bw" --port $port \
                --timeout $TMO >"$TMPD/srv-$tag" 2>&1 &
        SPID=$!
        "$topo" exec "$NAME" A env DIWARP_ADDR="$A_RAILS" "$@" taskset -c 1 "$bw" --port $port \
                --timeout $TMO --transport rd --op "$op" --size "$size" --iters "$iters" \
                --validate "$B" >"$TMPD/cli-$tag" 2>&1 &
        CPID=$!
        echo "run $tag: DIWARP_ADDR=$A_RAILS $* diwarp-bw --transport rd --op $op --size $size" \
                "--iters $iters --validate $B (server: DIWARP_ADDR=$B_RAILS)"
}

# bw_finish TAG ITERS: waits for run TAG; both sides exit 0 with status=ok,
# ITERS messages, NR RAIL lines each.
bw_finish() {
        local tag=$1 iters=$2 crc src f
        wait "$CPID"
        crc=$?
        wait "$SPID"
        src=$?
        tbf_snap "$TMPD/tbf1-$tag"
        echo "--- client ($crc)"
        cat "$TMPD/cli-$tag"
        echo "--- server ($src)"
        cat "$TMPD/srv-$tag"
        if [ $crc -ne 0 ] || [ $src -ne 0 ]; then fail "$tag: diwarp-bw exited $crc (client) / $src (server)"; fi
        for f in cli srv; do
                grep -q "^RESULT transport=rd .* iters=$iters status=ok " "$TMPD/$f-$tag" ||
                        fail "$tag: the $f's RESULT is not status=ok with iters=$iters"
                [ "$(grep -c '^RAIL ' "$TMPD/$f-$tag")" -eq "$NR" ] ||
                        fail "$tag: the $f printed $(grep -c '^RAIL ' "$TMPD/$f-$tag") RAIL lines, want $NR (one per rail)"
        done
}

# bw TAG OP SIZE ITERS [VAR=VALUE...]: bw_start and bw_finish.
bw() {
        bw_start "$@"
        bw_finish "$1" "$4"
}

# pct X: X hundredths of a percent as "12.34".
pct() {
        printf '%d.%02d' $(($1 / 100)) $(($1 % 100))
}

# shares TAG cli|srv: each rail's share of what the sending side's rails
# carried in run TAG (its RAIL lines' tx_bytes, and the tbf counters of its
# veths) is within TOL % of 1/NR, and the two agree within 5 points.
shares() {
        local tag=$1 who=$2 side i tx s ts addr total=0 ttotal=0 bad='' lo hi
        local -a t
        side=$([ "$who" = cli ] && echo A || echo B)
        mapfile -t t < <(tbf_delta "$tag" "$side")
        [ ${#t[@]} -eq "$NR" ] || fail "$tag: ${#t[@]} tbf counters of side $side, want $NR"
        for ((i = 0; i < NR; i++)); do
                tx=$(rail "$TMPD/$who-$tag" $i tx_bytes)
                [ -n "$tx" ] || fail "$tag: no tx_bytes on the $who's RAIL line of rail $i"
                total=$((total + tx))
                ttotal=$((ttotal + t[i]))
        done
        [ $total -gt 0 ] || fail "$tag: the $who's rails sent nothing (tx_bytes all 0)"
        [ $ttotal -gt 0 ] || fail "$tag: the tbfs of side $side sent nothing"
        lo=$((10000 * (100 - TOL) / 100 / NR)) # hundredths of a percent
        hi=$((10000 * (100 + TOL) / 100 / NR))
        for ((i = 0; i < NR; i++)); do
                tx=$(rail "$TMPD/$who-$tag" $i tx_bytes)
                addr=$(rail "$TMPD/$who-$tag" $i addr)
                s=$((10000 * tx / total))
                ts=$((10000 * t[i] / ttotal))
                echo "$tag: rail $i ($addr): $who tx_bytes $tx ($(pct $s) %), tbf of $NAME-$side" \
                        "rail$((i + 1)) ${t[i]} bytes ($(pct $ts) %)"
                if [ $s -lt $lo ] || [ $s -gt $hi ]; then
                        bad+=" rail $i ($addr) carried $(pct $s) % of the $total bytes the $who's"
                        bad+=" rails sent (tx_bytes $tx), want $(pct $lo)-$(pct $hi) %;"
                fi
                if [ $ts -lt $lo ] || [ $ts -gt $hi ]; then
                        bad+=" the tbf of $side's rail$((i + 1)) sent $(pct $ts) % of the $ttotal"
                        bad+=" bytes of side $side's tbfs (${t[i]}), want $(pct $lo)-$(pct $hi) %;"
                fi
                if [ $((s - ts)) -gt 500 ] || [ $((ts - s)) -gt 500 ]; then
                        bad+=" rail $i: RAIL share $(pct $s) % and tbf share $(pct $ts) %"
                        bad+=" differ by more than 5 points;"
                fi
        done
        [ -z "$bad" ] || fail "$tag ($NR rails of $RATES):$bad"
}

# mro TAG MODE: multirail_order MODE, server in B, client in A.
mro() {
        local tag=$1 mode=$2 crc src
        port=$((port + 1))
        tbf_snap "$TMPD/tbf0-$tag"
        "$topo" exec "$NAME" B env DIWARP_ADDR="$B_RAILS" taskset -c 0 "$mro" "$mode" $port \
                >"$TMPD/mro-$tag-srv" 2>&1 &
        local spid=$!
        "$topo" exec "$NAME" A env DIWARP_ADDR="$A_RAILS" taskset -c 1 "$mro" "$mode" $port "$B" \
                >"$TMPD/mro-$tag-cli" 2>&1 &
        local cpid=$!
        wait $cpid
        crc=$?
        wait $spid
        src=$?
        tbf_snap "$TMPD/tbf1-$tag"
        echo "--- multirail_order $mode: client ($crc)"
        cat "$TMPD/mro-$tag-cli"
        echo "--- server ($src)"
        cat "$TMPD/mro-$tag-srv"
        echo "tbf bytes during $tag: side A $(tbf_delta "$tag" A | paste -sd' '), side B $(tbf_delta "$tag" B | paste -sd' ')"
        if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
                fail "$tag: multirail_order $mode exited $crc (client) / $src (server): $(grep -h 'FAIL' "$TMPD/mro-$tag-cli" "$TMPD/mro-$tag-srv" | head -2)"
        fi
        grep -q "^RESULT role=client mode=$mode rails=$NR .* status=ok" "$TMPD/mro-$tag-cli" ||
                fail "$tag: the client's RESULT is not status=ok with rails=$NR"
        grep -q "^RESULT role=server mode=$mode rails=$NR .* status=ok" "$TMPD/mro-$tag-srv" ||
                fail "$tag: the server's RESULT is not status=ok with rails=$NR"
}

MiB=1048576
case $case in
shares2 | shares3)
        n=${case#shares}
        [ "$n" -eq 3 ] && TOL=$TOL3
        RATES=$RATE"mbit"
        for ((i = 1; i < n; i++)); do RATES+=,$RATE"mbit"; done
        rails "$RATES"
        # 4 MiB messages, 192 MiB a run (about 4 s under ASan on 2 rails,
        # at 0.4 Gbit/s). A run's shares include its start, when only rail
        # 0 sends (the rail lists are not known yet), and any dip of one
        # rail's window: shorter runs on 3 rails put one rail at 30-31 % now
        # and then, and 96 MiB on 2 rails gave one 43.75 % in a fresh-clone
        # CI run (1 019 delay responses, 90 spurious RTOs on a quiet host).
        iters=48
        bw write write $((4 * MiB)) $iters
        shares write cli
        bw read read $((4 * MiB)) $iters
        shares read srv
        bw send send $((4 * MiB)) $iters
        shares send cli
        ;;
reorder)
        RATES=$RATE"mbit,$((RATE / 4))mbit"
        rails "$RATES" --latency 3ms,40ms
        bw write write $((4 * MiB)) 16
        bw send send $((4 * MiB)) 16
        bw read read $((4 * MiB)) 16
        # every message checked: 512 KiB + 3 Sends pushed, 2 MiB ones pulled
        bw send512k send $((512 * 1024 + 3)) 64
        mro order order
        for t in write send read send512k; do
                echo "$t: retransmissions client $(sed -n 's/^RESULT .* retx=\([0-9]*\).*/\1/p' "$TMPD/cli-$t")," \
                        "rail 1 tx_bytes client $(rail "$TMPD/cli-$t" 1 tx_bytes) server $(rail "$TMPD/srv-$t" 1 tx_bytes)"
        done
        # the slow rail was used (else nothing arrived out of order)
        for t in write send; do
                [ "$(rail "$TMPD/cli-$t" 1 tx_bytes)" -gt 0 ] ||
                        fail "$t: the slow rail (rail 1) carried nothing: no reordering tested"
        done
        ;;
linkdown | peerdown)
        RATES=$RATE"mbit,$RATE""mbit"
        rails "$RATES"
        side=$([ "$case" = linkdown ] && echo A || echo B)
        # 4 MiB x 64 = 256 MiB: about 5 s on both rails in a release build,
        # tens of seconds under ASan. The rail goes down once it carried
        # 4 MiB of this run (mid-transfer, whatever the speed), for 2 s.
        iters=64
        t0=$(tbf_now A 2) || fail "no tbf byte count of A's rail 2 before the run"
        bw_start long write $((4 * MiB)) $iters
        while :; do
                now=$(tbf_now A 2) || fail "no tbf byte count of A's rail 2 during the run"
                [ $((now - t0)) -lt $((4 * MiB)) ] || break
                kill -0 "$CPID" 2>/dev/null ||
                        { bw_finish long $iters; fail "the run ended before rail 2 carried 4 MiB (A's rail2 tbf: $((now - t0)) bytes of it)"; }
                sleep 0.1
        done
        t_down=$(tbf_now A 2) || fail "no tbf byte count of A's rail 2 before it went down"
        ip -n "$NAME-$side" link set rail2 down || fail "ip link set rail2 down in $NAME-$side"
        echo "$(date +%T.%N | cut -c1-12) $NAME-$side rail2 down (A's rail2 tbf: $((t_down - t0)) bytes of this run)"
        sleep 2
        t_mid=$(tbf_now A 2) || fail "no tbf byte count of A's rail 2 while it was down"
        ip -n "$NAME-$side" link set rail2 up || fail "ip link set rail2 up in $NAME-$side"
        echo "$(date +%T.%N | cut -c1-12) $NAME-$side rail2 up (A's rail2 tbf: $((t_mid - t0)) bytes of this run)"
        kill -0 "$CPID" 2>/dev/null ||
                echo "the run ended while rail 2 was down: too short to see the rail come back in it"
        t_up=$(date +%s%N)
        reused=
        while kill -0 "$CPID" 2>/dev/null; do
                now=$(tbf_now A 2) || fail "no tbf byte count of A's rail 2 after it came up"
                if [ -z "$reused" ] && [ $((now - t_mid)) -ge $MiB ]; then
                        reused=$((($(date +%s%N) - t_up) / 1000000))
                        echo "rail 2 carries data again $reused ms after it came up"
                fi
                sleep 0.1
        done
        t_end=$((($(date +%s%N) - t_up) / 1000000))
        bw_finish long $iters
        downs=$(rail "$TMPD/cli-long" 1 downs)
        echo "client rail 1: downs=$downs state=$(rail "$TMPD/cli-long" 1 state)" \
                "tx_bytes=$(rail "$TMPD/cli-long" 1 tx_bytes) retransmits=$(rail "$TMPD/cli-long" 1 retransmits);" \
                "rail 0 retransmits=$(rail "$TMPD/cli-long" 0 retransmits) downs=$(rail "$TMPD/cli-long" 0 downs)"
        [ "${downs:-0}" -ge 1 ] ||
                fail "$NAME-$side rail2 was down 2 s in the middle of the run, but the client's RAIL line of rail 1 says downs=${downs:-?}"
        if [ -z "$reused" ]; then
                # On a busy host one stats call can take a second or more: the
                # run may end between two polls. The byte count it left says
                # whether the rail carried data again, if not when.
                after=$(($(tbf_now A 2) - t_mid))
                if [ "$after" -ge $MiB ]; then
                        echo "rail 2 carried $after bytes again after it came up (the run ended $t_end ms after; no poll in between saw it)"
                else
                        [ "$t_end" -lt 3000 ] ||
                                fail "rail 2 was up again for $t_end ms before the run ended, but A's rail2 tbf sent $after bytes (< 1 MiB): not used again"
                        echo "the run ended $t_end ms after rail 2 came up: too early to see it used again in the run"
                fi
        fi
        # a second run: the rail carries its share again
        bw again write $((4 * MiB)) 24
        tx=$(rail "$TMPD/cli-again" 1 tx_bytes)
        [ "${tx:-0}" -gt 0 ] || fail "the second run sent nothing on rail 1 (tx_bytes=${tx:-?}) after rail2 came up again"
        [ "$(rail "$TMPD/cli-again" 1 state)" = up ] || fail "the second run ended with rail 1 down"
        ;;
small)
        RATES=$RATE"mbit,$RATE""mbit"
        rails "$RATES"
        for run in small64k nostripe; do
                if [ $run = small64k ]; then
                        bw $run write 65536 640
                else
                        bw $run write $((4 * MiB)) 10 DIWARP_STRIPE_MIN=0
                fi
                tx0=$(rail "$TMPD/cli-$run" 0 tx_bytes)
                tx1=$(rail "$TMPD/cli-$run" 1 tx_bytes)
                echo "$run: rail 0 tx_bytes $tx0, rail 1 tx_bytes $tx1"
                [ $((tx0 + tx1)) -gt 0 ] || fail "$run: the client's rails sent nothing"
                [ $((100 * tx1)) -le $((5 * (tx0 + tx1))) ] ||
                        fail "$run: rail 1 carried $tx1 of $((tx0 + tx1)) bytes (> 5 %): messages below DIWARP_STRIPE_MIN (or with it 0) must stay on rail 0"
        done
        ;;
order)
        # one rail 4 times slower with a 40 ms queue: striped segments arrive
        # late on it, the 64-byte Sends (rail 0) early
        RATES=$RATE"mbit,$((RATE / 4))mbit"
        rails "$RATES" --latency 3ms,40ms
        mro order order
        RATES=$RATE"mbit,$RATE""mbit"
        "$topo" down "$NAME" || fail "down $NAME"
        names=()
        rails "$RATES"
        mro write write
        ;;
perftest)
        # An unmodified program: perftest's ib_write_bw under `diwarp run
        # --addr a,b`, its RC QP carried by RD (DIWARP_RC_TRANSPORT=rd). One
        # MR, 4 MiB Writes: both rails carry them (tbf counters of A's veths).
        command -v ib_write_bw >/dev/null || {
                echo "SKIP: ib_write_bw (perftest) is not installed"
                exit 77
        }
        diwarp=$(dirname "$bw")/../tools/diwarp
        RATES=$RATE"mbit,$RATE""mbit"
        rails "$RATES"
        port=$((port + 1))
        tbf_snap "$TMPD/tbf0-pt"
        "$topo" exec "$NAME" B env DIWARP_RC_TRANSPORT=rd taskset -c 0 timeout 60 "$diwarp" run \
                --addr "$B_RAILS" -- ib_write_bw -x 0 -p $port -s $((4 * MiB)) -n 40 \
                >"$TMPD/srv-pt" 2>&1 &
        spid=$!
        for ((i = 0; i < 100; i++)); do
                "$topo" exec "$NAME" B ss -ltn 2>/dev/null | grep -q ":$port " && break
                sleep 0.1
        done
        "$topo" exec "$NAME" A env DIWARP_RC_TRANSPORT=rd taskset -c 1 timeout 60 "$diwarp" run \
                --addr "$A_RAILS" -- ib_write_bw -x 0 -p $port -s $((4 * MiB)) -n 40 "$B" \
                >"$TMPD/cli-pt" 2>&1 &
        cpid=$!
        wait $cpid
        crc=$?
        wait $spid
        src=$?
        tbf_snap "$TMPD/tbf1-pt"
        show
        [ $crc -eq 0 ] && [ $src -eq 0 ] || fail "ib_write_bw exited $crc (client) / $src (server)"
        grep -Eq "^ *$((4 * MiB)) +40 " "$TMPD/cli-pt" || fail "ib_write_bw printed no result line"
        mapfile -t t < <(tbf_delta pt A)
        [ ${#t[@]} -eq 2 ] || fail "perftest: ${#t[@]} tbf counters of side A, want 2"
        total=$((t[0] + t[1]))
        [ $total -gt $((160 * MiB)) ] || fail "perftest: A's tbfs sent $total bytes, want > 160 MiB"
        for i in 0 1; do
                sh=$((10000 * t[i] / total))
                echo "perftest: rail $i: tbf of $NAME-A rail$((i + 1)) ${t[i]} bytes ($(pct $sh) %)"
                [ $sh -ge $((10000 * (100 - TOL) / 200)) ] && [ $sh -le $((10000 * (100 + TOL) / 200)) ] ||
                        fail "perftest: rail $i carried $(pct $sh) % of ib_write_bw's $total bytes, want 45-55 %"
        done
        ;;
*)
        fail "unknown case '$case'"
        ;;
esac
echo ok
