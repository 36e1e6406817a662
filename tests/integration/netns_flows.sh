#!/bin/bash
# bench/netns-topo.sh and bench-flows end to end (no timing is checked):
#   netns_flows.sh NETNS-TOPO BENCH-FLOWS
# A router topology at 200 Mbit/s: 2 RD Write flows on 2 devices, 2 TCP
# flows, 2 RC-over-RD Send flows; a direct topology: an RD Send incast of 3
# flows onto one server QP. Each run must end status=ok with a FLOW line per
# flow and traffic through the tbf; `down` must leave no namespace. Skipped
# (77) without root, ip, tc or tbf.
set -u
topo=${1:?usage: netns_flows.sh NETNS-TOPO BENCH-FLOWS}
bf=${2:?usage: netns_flows.sh NETNS-TOPO BENCH-FLOWS}
# shellcheck source=tests/integration/netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

# sent NAME: bytes the tbf towards B has sent so far.
sent() {
        "$topo" stats "$1" | head -1 | sed -n 's/.* sent_bytes=\([0-9]*\) .*/\1/p'
}

# flows NAME NFLOWS ARGS...: a server in B, the client in A; both must succeed.
flows() {
        local name=$1 n=$2
        shift 2
        local before
        before=$(sent "$name")
        "$topo" exec "$name" B timeout 60 "$bf" --addr "$B" --timeout 5000 \
                >"$TMPD/srv" 2>&1 &
        local spid=$!
        "$topo" exec "$name" A timeout 60 "$bf" --addr "$A" --timeout 5000 \
                --duration-ms 1200 --warmup-ms 200 --flows "$n" "$@" "$B" >"$TMPD/cli" 2>&1
        local crc=$?
        wait $spid
        local src=$?
        echo "--- client ($crc): $*"
        cat "$TMPD/cli"
        echo "--- server ($src)"
        cat "$TMPD/srv"
        if [ $crc -ne 0 ] || [ $src -ne 0 ]; then fail "bench-flows $*: exit $crc / $src"; fi
        grep -q '^RESULT .* status=ok ' "$TMPD/cli" || fail "client RESULT not ok"
        grep -q '^RESULT role=server .* status=ok' "$TMPD/srv" || fail "server RESULT not ok"
        [ "$(grep -c '^FLOW ' "$TMPD/cli")" -eq "$n" ] || fail "not $n FLOW lines"
        ! grep -Eq ' gbps=0\.0000 ' "$TMPD/cli" || fail "a flow moved nothing"
        ! grep -q "AddressSanitizer\|runtime error" "$TMPD/cli" "$TMPD/srv" ||
                fail "sanitizer report"
        [ "$(sent "$name")" -gt "$before" ] || fail "no traffic through the tbf"
}

r=nfr$$
up "$r" router 200mbit
flows "$r" 2 --transport rd --op write --devices 2 --size 256k
flows "$r" 2 --transport tcp --size 64k
DIWARP_RC_TRANSPORT=rd flows "$r" 2 --transport rc --op send --size 64k

d=nfd$$
up "$d" direct 200mbit
flows "$d" 3 --transport rd --op send --server-qps 1 --size 64k

for n in "$r" "$d"; do
        "$topo" down "$n" || fail "down $n"
        ! ip netns list | grep -q "^$n-" || fail "namespaces of $n left behind"
done
names=()
echo ok
