#!/bin/bash
# DIWARP_RC_FPDU between two namespaces on a veth pair of MTU 1500:
#   netns_rc_fpdu.sh NETNS-TOPO DIWARP-BW
# By default an RC stream's FPDUs fill one TCP segment (MULPDU below the
# MTU); with DIWARP_RC_FPDU=16384 at both ends they hold up to 16 KiB and
# span segments. Sends, Writes and Reads of 64 KiB (several such FPDUs a
# message) and of 3000 bytes (one FPDU over two segments) must arrive
# intact (--validate) either way, and each end's connect line must name the
# MULPDU it sends with. No rate is checked. Skipped (77) without root, ip,
# tc or tbf.
set -u
topo=${1:?usage: netns_rc_fpdu.sh NETNS-TOPO DIWARP-BW}
bw=${2:?usage: netns_rc_fpdu.sh NETNS-TOPO DIWARP-BW}
# shellcheck source=tests/integration/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

up rcfpdu direct 10gbit --mtu 1500

port=21700
# run FPDU OP SIZE: one transfer from A to B's server; prints the MULPDU
# both ends' connect lines name (they must agree).
run() {
        local fpdu=$1 op=$2 size=$3
        port=$((port + 1))
        "$topo" exec rcfpdu B env DIWARP_LOG=info DIWARP_RC_FPDU="$fpdu" \
                timeout 60 "$bw" --port $port >"$TMPD/srv" 2>&1 &
        local spid=$!
        sleep 0.3
        "$topo" exec rcfpdu A env DIWARP_LOG=info DIWARP_RC_FPDU="$fpdu" \
                timeout 60 "$bw" --transport rc --op "$op" --size "$size" --iters 300 \
                --validate --port $port "$B" >"$TMPD/cli" 2>&1
        local crc=$?
        wait $spid
        local src=$?
        if [ $crc -ne 0 ] || [ $src -ne 0 ] || ! grep -q 'status=ok' "$TMPD/cli"; then
                cat "$TMPD/cli" "$TMPD/srv" >&2
                fail "DIWARP_RC_FPDU=$fpdu $op $size: exit $crc / $src"
        fi
        local mc ms
        mc=$(sed -n 's/.*RC QP .* connected .*MULPDU \([0-9]*\)).*/\1/p' "$TMPD/cli" | head -1)
        ms=$(sed -n 's/.*RC QP .* connected .*MULPDU \([0-9]*\)).*/\1/p' "$TMPD/srv" | head -1)
        if [ -z "$mc" ] || [ "$mc" != "$ms" ]; then
                cat "$TMPD/cli" "$TMPD/srv" >&2
                fail "DIWARP_RC_FPDU=$fpdu $op $size: connect lines name MULPDU '$mc' and '$ms'"
        fi
        echo "$mc"
}

for op in send write read; do
        for size in 65536 3000; do
                m=$(run 0 $op $size) || exit 1
                [ "$m" -lt 1500 ] || fail "$op $size: MULPDU $m by default, want one segment (< 1500)"
                m=$(run 16384 $op $size) || exit 1
                [ "$m" -eq 16378 ] || fail "$op $size: MULPDU $m with DIWARP_RC_FPDU=16384, want 16378"
                echo "ok: $op $size"
        done
done
echo "netns_rc_fpdu ok"
