#!/bin/bash
# Runs a server/client program pair under diwarp between two network
# namespaces joined by a veth pair:
#   netns.sh CASE
#   CASE: rc_pingpong ud_pingpong send_lat write_bw rping udaddy rdma_server
#         udpong fi_msg fi_rdm example_rc example_ud example_rd
#         example_rc_write example_rc_send
# The server runs in namespace A (device address 10.77.X.1), the client in B
# (10.77.X.2); X comes from this script's PID, the namespaces are named
# diwarp-A-PID / diwarp-B-PID and exist only for this run. The addresses live
# only inside them. Both programs must exit 0 and print their own success
# output. Needs root and `ip netns` (otherwise exit 77: skipped).
#
# NETNS_BREAK=peer   the client targets 10.77.X.3, a host that does not exist
# NETNS_BREAK=addr   the client's device address is A's, absent from B
# make the run fail: `NETNS_BREAK=peer netns.sh rping` must exit 1 (the
# netns_*_broken tests check the script can fail).
#
# NETNS_DAEMON=1     each namespace runs its own host daemon (diwarpd, socket
# in this run's directory) and both programs are its clients
# (DIWARP_PROGRESS=daemon); afterwards each daemon must have served requests
# and hold no client.
. "$(dirname "$0")/lib.sh"
case=${1:?usage: netns.sh CASE}

ns_require "netns test" # lib.sh

nsA=diwarp-A-$$
nsB=diwarp-B-$$
X=$(($$ % 250 + 1))
A=10.77.$X.1
B=10.77.$X.2
spid=
cpid=

cleanup() {
        rc=$?
        for p in $spid $cpid; do
                kill -9 "$p" 2>/dev/null
        done
        ns_finish $rc "$nsA" "$nsB" # lib.sh
}
trap cleanup EXIT
exit_traps # lib.sh

# Namespaces of earlier runs that were killed outright (SIGKILL skips the
# trap): named by a PID that no longer exists.
ns_reap_stale '^diwarp-[AB]-[0-9]+$' # lib.sh

ns_pair "$nsA" "$nsB" "$A" "$B" 2>"$TMPD/setup" || { cat "$TMPD/setup" >&2; skip "cannot create network namespaces / veth here"; }

# ns_udp_bound NS PORT: a UDP socket is bound to PORT inside NS (a datagram
# server has no listening TCP socket).
ns_udp_bound() {
        hex=$(printf '%04X' "$2")
        ip netns exec "$1" awk -v p=":$hex" 'substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
                /proc/net/udp /proc/net/udp6 2>/dev/null
}

# The namespaces are fresh and this run's own: any port is free in them, and
# a concurrent test run (its own namespaces) cannot take it, so the port (and
# udaddy's fixed 7174) need not be picked at run time here.
port=18515
peer=$A          # where the client finds the server
caddr=$B         # the client's device address
case ${NETNS_BREAK:-} in
"") ;;
peer) peer=10.77.$X.3 ;;
addr) caddr=$A ;;
*) fail "unknown NETNS_BREAK '$NETNS_BREAK'" ;;
esac
# perftest prints GIDs as 16 decimal bytes.
gidA=$(printf '00:00:00:00:00:00:00:00:00:00:255:255:10:77:%02d:01' $X)
gidB=$(printf '00:00:00:00:00:00:00:00:00:00:255:255:10:77:%02d:02' $X)
native=0 # 1: a native-API example, run without the preload
ready=ns_listening # how to tell the server is up
server_exits=1     # 0: the server serves until stopped (udpong)

case $case in
rc_pingpong | ud_pingpong)
        prog=ibv_$case
        need "$prog"
        S=("$prog" -g 0 -p $port)
        C=("$prog" -g 0 -p $port "$peer")
        ;;
send_lat | write_bw)
        prog=ib_$case
        need "$prog"
        S=("$prog" -d diwarp0 -x 0 -p $port -n 100)
        C=("$prog" -d diwarp0 -x 0 -p $port -n 100 "$peer")
        ;;
rping)
        need rping
        S=(rping -s -a $A -p $port -V -C 10)
        C=(rping -c -a "$peer" -p $port -V -v -C 10)
        ;;
udaddy)
        need udaddy
        port=7174 # udaddy has no port option
        S=(udaddy -c 2 -C 10 -S 512)
        C=(udaddy -s "$peer" -c 2 -C 10 -S 512)
        ;;
rdma_server)
        need rdma_server
        need rdma_client
        S=(rdma_server -p $port)
        C=(rdma_client -s "$peer" -p $port)
        ;;
udpong)
        # Datagram rsockets (see rdmacm.sh): the server prints only when line
        # buffered, and the client's result row is the verdict.
        need udpong
        ready=ns_udp_bound
        server_exits=0
        S=(stdbuf -oL udpong -b $A -p $port)
        C=(udpong -s "$peer" -p $port -C 100 -S 1000 -T e)
        ;;
fi_msg | fi_rdm)
        # libfabric's verbs provider ignores loopback interfaces; here the
        # device address is the veth's, so it finds diwarp0 on it.
        need fi_pingpong
        if [ "$case" = fi_msg ]; then p=(-p verbs -e msg); else p=(-p "verbs;ofi_rxm" -e rdm); fi
        S=(fi_pingpong "${p[@]}" -I 100 -S 1024 -B $port)
        C=(fi_pingpong "${p[@]}" -I 100 -S 1024 -P $port "$peer")
        ;;
example_rc | example_ud)
        pp=${DIWARP_PINGPONG:-$(dirname "$DIWARP")/../examples/diwarp-pingpong}
        [ -x "$pp" ] || fail "no diwarp-pingpong at $pp (set DIWARP_PINGPONG)"
        native=1
        S=("$pp" --port $port --addr $A)
        C=("$pp" --transport "${case#example_}" --size 4096 --iters 300 --validate
                --port $port --addr "$caddr" "$peer")
        ;;
example_rc_write | example_rc_send)
        # RC bulk over the 1500-byte veth: FPDUs of the stream's MSS (1442
        # bytes), every byte checked at the server.
        bw=$(dirname "${DIWARP_PINGPONG:-$(dirname "$DIWARP")/../examples/diwarp-pingpong}")/diwarp-bw
        [ -x "$bw" ] || fail "no diwarp-bw at $bw (set DIWARP_PINGPONG)"
        native=1
        S=("$bw" --port $port --addr $A)
        C=("$bw" --transport rc --op "${case#example_rc_}" --size 1048576 --iters 50 --validate
                --port $port --addr "$caddr" "$peer")
        ;;
example_rd)
        # RD Write of 1 MiB messages over the 1500-byte veth: every datagram
        # must fit the route's MTU (checked on the client's RESULT below).
        bw=$(dirname "${DIWARP_PINGPONG:-$(dirname "$DIWARP")/../examples/diwarp-pingpong}")/diwarp-bw
        [ -x "$bw" ] || fail "no diwarp-bw at $bw (set DIWARP_PINGPONG)"
        native=1
        S=("$bw" --port $port --addr $A)
        C=("$bw" --transport rd --op write --size 1048576 --iters 50 --validate
                --port $port --addr "$caddr" "$peer")
        ;;
*)
        fail "unknown case '$case'"
        ;;
esac

# The namespaces' daemons (NETNS_DAEMON=1), reachable from both through
# their sockets' paths; killed with everything else in the namespaces.
if [ "${NETNS_DAEMON:-0}" = 1 ]; then
        for ns in "$nsA" "$nsB"; do
                ip netns exec "$ns" env DIWARP_DAEMON_SOCKET="$TMPD/$ns.sock" \
                        "$DIWARP" daemon start >/dev/null ||
                        fail "no daemon in $ns"
        done
fi

# in_ns NS ADDR CMD...: CMD inside NS with the device at ADDR, bounded.
in_ns() {
        ns=$1
        addr=$2
        shift 2
        local env=()
        [ "${NETNS_DAEMON:-0}" = 1 ] &&
                env=(env DIWARP_PROGRESS=daemon DIWARP_DAEMON_SOCKET="$TMPD/$ns.sock")
        if [ $native = 1 ]; then
                timeout 60 ip netns exec "$ns" "${env[@]}" "$@"
        else
                timeout 60 ip netns exec "$ns" "${env[@]}" "$DIWARP" run --addr "$addr" -- "$@"
        fi
}

srv=$TMPD/server
cli=$TMPD/client
in_ns "$nsA" $A "${S[@]}" >"$srv" 2>&1 &
spid=$!
i=0
while ! $ready "$nsA" $port; do
        i=$((i + 1))
        [ $i -lt 150 ] || { cat "$srv" >&2; fail "server never listened"; }
        kill -0 $spid 2>/dev/null || { cat "$srv" >&2; fail "server died before listening"; }
        sleep 0.1
done
# In the background so a signal interrupts the wait at once.
in_ns "$nsB" "$caddr" "${C[@]}" >"$cli" 2>&1 &
cpid=$!
wait $cpid
crc=$?
cpid=
# The server ends soon after its client; one that waits for a client that
# failed is stopped (and counts as failed).
i=0
n=100
[ $crc -eq 0 ] || n=10
[ $server_exits = 1 ] || n=5
while kill -0 $spid 2>/dev/null && [ $i -lt $n ]; do
        i=$((i + 1))
        sleep 0.1
done
if [ $server_exits = 0 ] && kill -0 $spid 2>/dev/null; then
        # Still serving, as it should: stopped, not failed.
        kill $spid 2>/dev/null
        wait $spid
        src=0
else
        kill $spid 2>/dev/null
        wait $spid
        src=$?
fi
spid=
echo "--- server ($src) in $nsA at $A: ${S[*]}"
cat "$srv"
echo "--- client ($crc) in $nsB at $caddr: ${C[*]}"
cat "$cli"
[ $crc -eq 0 ] || fail "$case client exited $crc"
[ $src -eq 0 ] || fail "$case server exited $src"
! grep -q "AddressSanitizer\|runtime error" "$srv" "$cli" || fail "sanitizer report"
if [ "${NETNS_DAEMON:-0}" = 1 ]; then
        for ns in "$nsA" "$nsB"; do
                st=$(DIWARP_DAEMON_SOCKET="$TMPD/$ns.sock" "$DIWARP" stat) ||
                        fail "the daemon of $ns is gone"
                echo "--- daemon of $ns: $(echo "$st" | head -1)"
                req=$(echo "$st" | sed -n '1s/.*, \([0-9]*\) requests.*/\1/p')
                [ "${req:-0}" -gt 0 ] || fail "no program of $ns went through its daemon"
                i=0
                while ! DIWARP_DAEMON_SOCKET="$TMPD/$ns.sock" "$DIWARP" stat |
                        grep -q ': 0 clients'; do
                        i=$((i + 1))
                        [ $i -lt 40 ] || fail "the daemon of $ns still holds clients"
                        sleep 0.05
                done
        done
fi

case $case in
rc_pingpong | ud_pingpong)
        for f in "$srv" "$cli"; do
                expect "$f" '^[0-9]+ bytes in [0-9.]+ seconds' "$prog reports its transfer"
                expect "$f" '^[0-9]+ iters in [0-9.]+ seconds' "$prog reports its iterations"
        done
        expect "$srv" "local address: .*GID ::ffff:10\.77\.$X\.1\$" "server GID is A's address"
        expect "$srv" "remote address: .*GID ::ffff:10\.77\.$X\.2\$" "server sees B's GID"
        expect "$cli" "local address: .*GID ::ffff:10\.77\.$X\.2\$" "client GID is B's address"
        expect "$cli" "remote address: .*GID ::ffff:10\.77\.$X\.1\$" "client sees A's GID"
        sq=$(sed -n 's/.*local address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$srv")
        cq=$(sed -n 's/.*remote address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$cli")
        [ -n "$sq" ] && [ "$sq" = "$cq" ] || fail "client saw server QPN '$cq', server has '$sq'"
        ;;
send_lat | write_bw)
        case $prog in
        *_lat) row=$PERFTEST_LAT_ROW ;; # lib.sh
        *) row=$PERFTEST_BW_ROW ;;
        esac
        for f in "$srv" "$cli"; do
                expect "$f" 'Transport type : IW' "$prog sees an iWARP device"
                expect "$f" "GID: $gidA" "$prog shows A's GID"
                expect "$f" "GID: $gidB" "$prog shows B's GID"
                expect "$f" "$row" "$prog prints its result row"
        done
        if grep -Eqi 'completion with error|failed status' "$srv" "$cli"; then
                fail "$prog reported an error completion"
        fi
        ;;
rping)
        [ "$(grep -c '^ping data: rdma-ping-[0-9]' "$cli")" -eq 10 ] || fail "rping: 10 verified pings"
        ;;
udaddy)
        for f in "$srv" "$cli"; do
                expect "$f" '^data transfers complete' "udaddy transfers its data"
                expect "$f" '^return status 0' "udaddy reports success"
        done
        ;;
rdma_server)
        expect "$srv" '^rdma_server: end 0' "rdma_server succeeds"
        expect "$cli" '^rdma_client: end 0' "rdma_client succeeds"
        ;;
udpong)
        expect "$srv" "^client login from 10\.77\.$X\.2\$" "udpong server sees B's address"
        expect "$cli" '^custom +1000 +200 +195k +[0-9.]+s' "udpong echoes 100 messages"
        ;;
fi_msg | fi_rdm)
        for f in "$srv" "$cli"; do
                expect "$f" '^1k +100 +=100 ' "fi_pingpong completes 100 transfers"
        done
        if [ "$case" = fi_msg ] && command -v fi_info >/dev/null; then
                # fi_info lists diwarp0 as a verbs domain on the veth's address.
                fi=$TMPD/fi_info
                in_ns "$nsB" "$caddr" fi_info -p verbs >"$fi" 2>&1 ||
                        { cat "$fi" >&2; fail "fi_info -p verbs exited $?"; }
                expect "$fi" '^ *domain: diwarp0' "fi_info -p verbs shows diwarp0"
                expect "$fi" '^ *provider: verbs' "fi_info names the verbs provider"
        fi
        ;;
example_rc | example_ud)
        t=${case#example_}
        for f in "$srv" "$cli"; do
                expect "$f" "^RESULT transport=$t op=send size=4096 iters=300 status=ok" \
                        "diwarp-pingpong $t succeeds"
        done
        ;;
example_rc_write | example_rc_send)
        for f in "$srv" "$cli"; do
                expect "$f" "^RESULT transport=rc op=${case#example_rc_} size=1048576 iters=50 status=ok" \
                        "diwarp-bw rc ${case#example_rc_} succeeds, data checked"
        done
        ;;
example_rd)
        expect "$cli" "^RESULT transport=rd op=write size=1048576 iters=50 status=ok" \
                "diwarp-bw rd write succeeds"
        dg=$(sed -n 's/^RESULT .* dgram=\([0-9]*\) sent_max=\([0-9]*\).*/\1 \2/p' "$cli")
        set -- $dg
        [ -n "${1:-}" ] && [ "$1" -le 1472 ] && [ "$1" -ge 1400 ] ||
                fail "RD stream datagram size '${1:-}' does not follow the 1500-byte MTU"
        [ "${2:-0}" -gt 0 ] && [ "$2" -le 1472 ] || fail "RD sent a datagram of ${2:-?} bytes"
        ;;
esac
echo "ok"
