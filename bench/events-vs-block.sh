#!/bin/bash
# Event-driven programs (a completion channel: ibv_req_notify_cq +
# ibv_get_cq_event) against a blocking socket ping-pong (raw-sock --block: a
# thread the kernel wakes per message), in one run, on this machine.
#
#   bench/events-vs-block.sh [--build DIR] [--runs N] [--iters N] [--size B]
#                            [--cpus S,C | --unpinned] [--lib NAME=PATH]... [--all]
#
# Each round runs, one after the other (so a shared machine's drift hits all):
#   tcp-block   raw-sock --proto tcp --mode pingpong --block (round trip = 2 x lat_us)
#   rc-events   ibv_rc_pingpong -e under `diwarp run` (usec/iter: a round trip)
#   rc-poll     ibv_rc_pingpong (busy-polling its CQ), to see that path too
#   lat-events  ib_send_lat -e (t_avg: half a round trip), against tcp-block's lat_us
# and with --all also
#   rcrd-events ibv_rc_pingpong -e with DIWARP_RC_TRANSPORT=rd
#   udp-block   raw-sock --proto udp --mode pingpong --block
#   ud-events   ibv_ud_pingpong -e (against udp-block)
# The diwarp rows run once per provider library: the build's, and each
# --lib NAME=PATH (e.g. the library of an older build, for a before/after in
# the same run). Server on core S, client on core C (taskset; default 0,1),
# or --unpinned. Prints each round, then the median (min-max) of each row and
# its ratio to the blocking baseline of the same rounds (median of the
# per-round ratios: > 1 means slower than the blocking socket).
# Exit: 0 measured, 1 a run failed, 2 a program is missing.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build=${DIWARP_BUILD:-$here/build-rel}
runs=5
iters=20000
size=64
cpus=0,1
all=0
libs=()
while [ $# -gt 0 ]; do
        case $1 in
        --build) build=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --cpus) cpus=$2; shift 2 ;;
        --unpinned) cpus=; shift ;;
        --lib) libs+=("$2"); shift 2 ;;
        --all) all=1; shift ;;
        -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
        esac
done
dw=$build/tools/diwarp
raw=$build/bench/raw-sock
for p in "$dw" "$raw" "$(command -v ibv_rc_pingpong)" "$(command -v ib_send_lat)" \
        "$(command -v taskset)"; do
        [ -n "$p" ] && [ -x "$p" ] || { echo "missing: ${p:-a program} (build $build, rdma-core, perftest)" >&2; exit 2; }
done
libs=("build=$("$dw" lib)" "${libs[@]}")
if [ -n "$cpus" ]; then
        spin=(taskset -c "${cpus%,*}")
        cpin=(taskset -c "${cpus#*,}")
else
        spin=()
        cpin=()
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/events-vs-block.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
port=$((20000 + RANDOM % 10000))

# pair NAME AWK SERVER... -- CLIENT...: runs one server/client pair, appends
# the client's number (the awk program prints it) to $tmp/NAME.
pair() {
        local name=$1 expr=$2 s=() c=() v
        shift 2
        while [ "$1" != -- ]; do s+=("$1"); shift; done
        shift
        c=("$@")
        port=$((port + 1))
        [ $port -lt 32000 ] || port=20000
        "${spin[@]}" "${s[@]//@PORT@/$port}" >"$tmp/srv" 2>&1 &
        local spid=$!
        sleep 0.4
        timeout 300 "${cpin[@]}" "${c[@]//@PORT@/$port}" >"$tmp/cli" 2>&1
        local crc=$?
        wait $spid
        local src=$?
        v=$(awk "$expr" "$tmp/cli")
        if [ $crc -ne 0 ] || [ $src -ne 0 ] || [ -z "$v" ]; then
                echo "$name: failed (server $src, client $crc)" >&2
                tail -n 5 "$tmp/srv" "$tmp/cli" >&2
                exit 1
        fi
        echo "$v" >>"$tmp/$name"
        printf '  %-22s %s\n' "$name" "$v"
}

raw_lat='/status=ok/ { for (i = 1; i <= NF; i++) if (sub(/^lat_us=/, "", $i)) v = $i }
         END { if (v != "") print v }'
pp_iter='/ iters in .* usec\/iter$/ { v = $(NF - 1) } END { if (v != "") print v }'
# perftest: the row of numbers under the header; t_avg is the 6th column.
pt_avg='$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 6 { v = $6 } END { if (v != "") print v }'
for r in $(seq 1 "$runs"); do
        echo "round $r"
        pair tcp-block "$raw_lat" "$raw" --proto tcp --mode pingpong --block --size "$size" \
                --iters "$iters" --port @PORT@ -- \
                "$raw" --proto tcp --mode pingpong --block --size "$size" --iters "$iters" \
                --port @PORT@ 127.0.0.1
        [ $all = 1 ] && pair udp-block "$raw_lat" "$raw" --proto udp --mode pingpong --block \
                --size "$size" --iters "$iters" --port @PORT@ -- \
                "$raw" --proto udp --mode pingpong --block --size "$size" --iters "$iters" \
                --port @PORT@ 127.0.0.1
        for l in "${libs[@]}"; do
                n=${l%%=*}
                export DIWARP_VERBS_LIB=${l#*=}
                pp=(ibv_rc_pingpong -g 0 -p @PORT@ -n "$iters" -s "$size")
                pair "rc-events.$n" "$pp_iter" "$dw" run "${pp[@]}" -e -- \
                        "$dw" run "${pp[@]}" -e 127.0.0.1
                pair "rc-poll.$n" "$pp_iter" "$dw" run "${pp[@]}" -- "$dw" run "${pp[@]}" 127.0.0.1
                lt=(ib_send_lat -d diwarp0 -e -s "$size" -n "$iters" -p @PORT@)
                pair "lat-events.$n" "$pt_avg" "$dw" run "${lt[@]}" -- "$dw" run "${lt[@]}" 127.0.0.1
                if [ $all = 1 ]; then
                        pair "rcrd-events.$n" "$pp_iter" env DIWARP_RC_TRANSPORT=rd "$dw" run \
                                "${pp[@]}" -e -- env DIWARP_RC_TRANSPORT=rd "$dw" run "${pp[@]}" -e \
                                127.0.0.1
                        ud=(ibv_ud_pingpong -g 0 -p @PORT@ -n "$iters" -s "$size")
                        pair "ud-events.$n" "$pp_iter" "$dw" run "${ud[@]}" -e -- \
                                "$dw" run "${ud[@]}" -e 127.0.0.1
                fi
                unset DIWARP_VERBS_LIB
        done
done

# summary NAME BASE FACTOR: median (min-max) of NAME and the median of the
# per-round ratios NAME / (FACTOR x BASE).
summary() {
        local name=$1 base=$2 f=$3
        [ -s "$tmp/$name" ] || return 0
        paste "$tmp/$name" "$tmp/$base" | awk -v n="$name" -v b="$base" -v f="$f" '
                { v[NR] = $1; q[NR] = $1 / (f * $2) }
                function med(a, k,   i, j, t) {
                        for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++)
                                if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
                }
                END {
                        m = med(v, NR); lo = v[1]; hi = v[NR]; r = med(q, NR)
                        printf "%-22s %9.2f us (%.2f-%.2f)   x%.2f of %s%s (ratio range %.2f-%.2f)\n",
                               n, m, lo, hi, r, f == 2 ? "2 x " : "", b, q[1], q[NR]
                }'
}
echo
where=unpinned
[ -n "$cpus" ] && where="server on core ${cpus%,*}, client on core ${cpus#*,}"
echo "medians of $runs rounds, $iters iterations of $size B, $where:"
for f in tcp-block udp-block; do
        [ -s "$tmp/$f" ] && summary "$f" "$f" 1
done
for l in "${libs[@]}"; do
        n=${l%%=*}
        summary "rc-events.$n" tcp-block 2
        summary "rc-poll.$n" tcp-block 2
        summary "lat-events.$n" tcp-block 1
        summary "rcrd-events.$n" tcp-block 2
        summary "ud-events.$n" udp-block 2
done
