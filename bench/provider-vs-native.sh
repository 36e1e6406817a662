#!/bin/bash
# The same measurement through the verbs provider and through the native API,
# in one run, on this machine.
#
#   bench/provider-vs-native.sh [--build DIR] [--runs N] [--cpus S,C] [--lat-iters N] [--bw-iters N]
#
# Pairs (server on core S, client on core C, `taskset`), native vs provider:
#   RC Send 64 B latency:   bench-native-pingpong vs bench-verbs-pingpong
#                           (one source, bench/verbs_pingpong.c, built for each
#                           API: the same loop lines, examples/pingpong.c's loop)
#   ... perftest's loop:    bench-native-pingpong --loop perftest
#                           vs perftest ib_send_lat -s 64 (t_avg)
#   RC Write bandwidth, 1 MiB: examples/diwarp-bw --transport rc --op write --window 64 (gbps)
#                           vs perftest ib_write_bw -s 1048576 -t 64 --report_gbits (BW average)
# Latency = half the mean round trip of a ping-pong of N messages (t_avg is
# that mean in perftest); bandwidth = payload bits / time of N Writes with at
# most 64 outstanding, timed by the client from first post to last
# completion; neither counts its set-up. perftest's ib_send_lat loop differs
# from the examples' (receive reposted on the round trip, inline Sends
# signaled every 100th, two CQs), so it is paired with the native program
# running that loop, not with the examples' loop; bench-verbs-pingpong
# --loop perftest is shown as a check that the loop is reproduced. The
# provider programs run under `diwarp run` with -d diwarp0 and the provider's
# default progress (the hybrid progress thread: ib_write_bw's server is a
# passive target); the native ones with the same engine setting
# (DIWARP_PROGRESS=thread), so a ratio is the cost of the verbs mapping
# layer. For reference: examples/diwarp-pingpong (the program the twin
# mirrors) and the native default (DIWARP_PROGRESS=app: only the application
# drives progress), which are not part of a ratio. Runs alternate native,
# provider, native, provider... so a shared machine's drift hits both; each
# number is the median of N runs (min-max shown). Ratios: provider/native for
# latency, native/provider for bandwidth (both: > 1 means the provider is
# slower; the target is <= 1.05).
# Exit: 0 measured, 1 a run failed, 2 a program is missing.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build=${DIWARP_BUILD:-$here/build-rel}
runs=5
cpus=0,1
lat_iters=20000
bw_iters=2000
while [ $# -gt 0 ]; do
        case $1 in
        --build) build=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --cpus) cpus=$2; shift 2 ;;
        --lat-iters) lat_iters=$2; shift 2 ;;
        --bw-iters) bw_iters=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
        esac
done
scpu=${cpus%,*}
ccpu=${cpus#*,}
pp=$build/examples/diwarp-pingpong
bw=$build/examples/diwarp-bw
dw=$build/tools/diwarp
tn=$build/bench/bench-native-pingpong
tv=$build/bench/bench-verbs-pingpong
for p in "$pp" "$bw" "$dw" "$tn" "$tv" "$(command -v ib_send_lat)" "$(command -v ib_write_bw)" "$(command -v taskset)"; do
        [ -n "$p" ] && [ -x "$p" ] || { echo "missing: ${p:-ib_send_lat/ib_write_bw/taskset (perftest, util-linux)}" >&2; exit 2; }
done
for v in $(env | sed -n 's/^\(DIWARP_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pvn.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
port=$((24000 + RANDOM % 8000))

listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# pair LABEL SERVER_CMD... :: CLIENT_CMD... ('{port}' replaced); outputs in $tmp/s, $tmp/c
pair() {
        local label=$1; shift
        local -a s=() c=()
        while [ "$1" != :: ]; do s+=("$1"); shift; done
        shift
        c=("$@")
        port=$((port + 1))
        s=("${s[@]//\{port\}/$port}")
        c=("${c[@]//\{port\}/$port}")
        timeout 120 taskset -c "$scpu" "${s[@]}" >"$tmp/s" 2>&1 &
        local spid=$! i=0
        while ! listening "$port"; do
                i=$((i + 1))
                if [ $i -gt 200 ] || ! kill -0 $spid 2>/dev/null; then
                        kill $spid 2>/dev/null; echo "$label: server never listened" >&2; cat "$tmp/s" >&2; return 1
                fi
                sleep 0.05
        done
        timeout 120 taskset -c "$ccpu" "${c[@]}" >"$tmp/c" 2>&1
        local crc=$?
        wait $spid
        local src=$?
        if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
                echo "$label: exit server $src client $crc" >&2; tail -5 "$tmp/s" "$tmp/c" >&2; return 1
        fi
}

# perftest row: first line that starts with the size; column N
ptcol() { awk -v s="$1" -v n="$2" '$1 == s && NF >= n { print $n; exit }' "$tmp/c"; }
resv() { sed -n "s/^RESULT .*status=ok.* $1=\([0-9.]*\).*/\1/p" "$tmp/c" | tail -1; }

declare -A val
measure() { # measure CASE RUN -> val[CASE,RUN]
        local v=
        case $1 in
        native-lat | native-app-lat | native-pt-lat)
                [ "$1" = native-app-lat ] && export DIWARP_PROGRESS=app || export DIWARP_PROGRESS=thread
                local loop=example
                [ "$1" = native-pt-lat ] && loop=perftest
                pair "$1" "$tn" --port '{port}' :: "$tn" --loop $loop --size 64 \
                        --iters "$lat_iters" --port '{port}' 127.0.0.1 && v=$(resv lat_us) ;;
        verbs-lat | verbs-pt-lat)
                local loop=example
                [ "$1" = verbs-pt-lat ] && loop=perftest
                pair "$1" "$dw" run -- "$tv" -d diwarp0 --port '{port}' :: "$dw" run -- "$tv" -d diwarp0 \
                        --loop $loop --size 64 --iters "$lat_iters" --port '{port}' 127.0.0.1 &&
                        v=$(resv lat_us) ;;
        example-lat)
                export DIWARP_PROGRESS=thread
                pair "$1" "$pp" --port '{port}' :: "$pp" --transport rc --op send --size 64 \
                        --iters "$lat_iters" --port '{port}' 127.0.0.1 && v=$(resv lat_us) ;;
        perftest-lat)
                pair "$1" "$dw" run -- ib_send_lat -d diwarp0 -x 0 -F -p '{port}' -s 64 -n "$lat_iters" :: \
                        "$dw" run -- ib_send_lat -d diwarp0 -x 0 -F -p '{port}' -s 64 -n "$lat_iters" 127.0.0.1 &&
                        v=$(ptcol 64 6) ;;
        native-bw | native-app-bw)
                [ "$1" = native-bw ] && export DIWARP_PROGRESS=thread || export DIWARP_PROGRESS=app
                pair "$1" "$bw" --port '{port}' :: "$bw" --transport rc --op write --size 1048576 \
                        --iters "$bw_iters" --window 64 --port '{port}' 127.0.0.1 && v=$(resv gbps) ;;
        verbs-bw)
                pair "$1" "$dw" run -- ib_write_bw -d diwarp0 -x 0 -F -p '{port}' -s 1048576 -n "$bw_iters" -t 64 --report_gbits :: \
                        "$dw" run -- ib_write_bw -d diwarp0 -x 0 -F -p '{port}' -s 1048576 -n "$bw_iters" -t 64 --report_gbits 127.0.0.1 &&
                        v=$(ptcol 1048576 4) ;;
        esac
        unset DIWARP_PROGRESS
        [ -n "$v" ] || { echo "$1 run $2: no result" >&2; tail -5 "$tmp/c" >&2; exit 1; }
        val[$1,$2]=$v
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$runs"); do
        for k in native-lat verbs-lat native-pt-lat perftest-lat verbs-pt-lat example-lat \
                native-app-lat native-bw verbs-bw native-app-bw; do
                measure $k "$r"
        done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

stats() { # stats CASE -> "median min max"
        local k=$1
        for r in $(seq 1 "$runs"); do echo "${val[$k,$r]}"; done | sort -g |
                awk '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; print m, a[1], a[NR]}'
}
read -r nl nl0 nl1 <<<"$(stats native-lat)"
read -r vl vl0 vl1 <<<"$(stats verbs-lat)"
read -r ntl ntl0 ntl1 <<<"$(stats native-pt-lat)"
read -r ptl ptl0 ptl1 <<<"$(stats perftest-lat)"
read -r vtl vtl0 vtl1 <<<"$(stats verbs-pt-lat)"
read -r el el0 el1 <<<"$(stats example-lat)"
read -r nb nb0 nb1 <<<"$(stats native-bw)"
read -r vb vb0 vb1 <<<"$(stats verbs-bw)"
read -r al al0 al1 <<<"$(stats native-app-lat)"
read -r ab ab0 ab1 <<<"$(stats native-app-bw)"
row() { printf '%-40s %-26s %-26s %.3f\n' "$1" "$2" "$3" "$(echo "$4" | bc -l)"; }
echo "provider vs native, $runs runs each, alternating; server core $scpu, client core $ccpu"
echo "load average: $load0 (start), $load1 (end); $(nproc) cores"
printf '%-40s %-26s %-26s %s\n' "measurement" "native (median, min-max)" "provider (median, min-max)" "ratio"
row "RC Send 64 B latency, us" "$nl ($nl0-$nl1)" "$vl ($vl0-$vl1)" "$vl / $nl"
row "  perftest's loop (ib_send_lat)" "$ntl ($ntl0-$ntl1)" "$ptl ($ptl0-$ptl1)" "$ptl / $ntl"
row "RC Write 1 MiB bandwidth, Gbit/s" "$nb ($nb0-$nb1)" "$vb ($vb0-$vb1)" "$nb / $vb"
echo "reference (not a target):"
row "  perftest's loop, own verbs program" "$ntl ($ntl0-$ntl1)" "$vtl ($vtl0-$vtl1)" "$vtl / $ntl"
row "  latency, examples/diwarp-pingpong" "$el ($el0-$el1)" "$vl ($vl0-$vl1)" "$vl / $el"
row "  latency, native app progress" "$al ($al0-$al1)" "$vl ($vl0-$vl1)" "$vl / $al"
row "  bandwidth, native app progress" "$ab ($ab0-$ab1)" "$vb ($vb0-$vb1)" "$ab / $vb"
echo "ratio: provider/native latency, native/provider bandwidth (> 1: the provider is slower; target <= 1.05)"
