#!/bin/bash
# diwarp0 as a NIC of its host (network namespace), with no address option:
#   netns_nic.sh CASE
#   CASE: gids     the GID table (ibv_devinfo -v): the default route's
#                  address first, the other interface next, loopback last;
#                  --addr pins one address; a namespace with loopback alone,
#                  and one with nothing up, have 127.0.0.1
#         sysfs    /sys/class/infiniband/diwarp0/device/net/ names the
#                  interface of GID 0 (ls, stat, python), gids/N files, and
#                  a path outside the tree is untouched
#         rd_bw    diwarp-bw --transport rd, RDMA Write, validated
#         send_lat ib_send_lat (unmodified perftest, IB-style connect)
#         rc_pingpong  ibv_rc_pingpong -g 0
#         write_bw_cm  ib_write_bw -R (perftest over rdma_cm)
#         rping    rping (rdma_cm)
#         rping_src  rping -I B2: the client's rdma_cm bound source address
#                  is where its connection comes from (ss in A), although
#                  the route to A leaves through the other interface
# Namespace A has two veth links: x (10.79.X.1, created first, so its
# interface index is the lower one) and v (10.78.X.1), with the default
# route on v. B is A's peer on both (10.78.X.2, 10.79.X.2), default route on
# v too. Programs run as `diwarp run -- PROGRAM` with no --addr, so each
# device answers at every address of its namespace, and the client names the
# server by its default-route address. Names: diwarp-nicA-PID, -nicB-, -nicC-
# (loopback alone), -nicD- (nothing up); deleted on exit. Needs root and `ip
# netns` (else exit 77: skipped).
. "$(dirname "$0")/lib.sh"
case=${1:?usage: netns_nic.sh CASE}

ns_require "netns test" # lib.sh

nsA=diwarp-nicA-$$
nsB=diwarp-nicB-$$
nsC=diwarp-nicC-$$
nsD=diwarp-nicD-$$
X=$(($$ % 250 + 1))
A=10.78.$X.1
B=10.78.$X.2
A2=10.79.$X.1
B2=10.79.$X.2
spid=
cpid=

cleanup() {
        rc=$?
        for p in $spid $cpid; do
                kill -9 "$p" 2>/dev/null
        done
        ns_finish $rc "$nsA" "$nsB" "$nsC" "$nsD" # lib.sh
}
trap cleanup EXIT
exit_traps # lib.sh

# Namespaces of earlier runs killed outright: named by a PID that is gone.
ns_reap_stale '^diwarp-nic[A-D]-[0-9]+$' # lib.sh

setup() {
        ip netns add "$nsA" && ip netns add "$nsB" &&
                ip link add name xA netns "$nsA" type veth peer name xB netns "$nsB" &&
                ip link add name vA netns "$nsA" type veth peer name vB netns "$nsB" &&
                ip -n "$nsA" addr add "$A2/24" dev xA && ip -n "$nsB" addr add "$B2/24" dev xB &&
                ip -n "$nsA" addr add "$A/24" dev vA && ip -n "$nsB" addr add "$B/24" dev vB &&
                for ns in $nsA $nsB; do
                        ip -n "$ns" link set lo up || return 1
                done &&
                ip -n "$nsA" link set xA up && ip -n "$nsB" link set xB up &&
                ip -n "$nsA" link set vA mtu 1500 up && ip -n "$nsB" link set vB mtu 1500 up &&
                ip -n "$nsA" route add default via "$B" dev vA &&
                ip -n "$nsB" route add default via "$A" dev vB
}
setup 2>"$TMPD/setup" || { cat "$TMPD/setup" >&2; skip "cannot create network namespaces / veth here"; }

# in_ns NS CMD...: CMD under diwarp run inside NS (no --addr), bounded.
in_ns() {
        ns=$1
        shift
        timeout 60 ip netns exec "$ns" "$DIWARP" run -- "$@"
}

# gids NS [diwarp run options]: the GID lines of ibv_devinfo -v, as
# "INDEX ADDRESS" (ibv_devinfo prints GID[  0]:  ::ffff:a.b.c.d, RoCE v2).
gids() {
        ns=$1
        shift
        timeout 30 ip netns exec "$ns" "$DIWARP" run "$@" -- ibv_devinfo -v -d diwarp0 >"$TMPD/devinfo" 2>&1 ||
                { cat "$TMPD/devinfo" >&2; fail "ibv_devinfo -v in $ns exited $?"; }
        sed -n 's/^[[:space:]]*GID\[ *\([0-9]*\)\]:[[:space:]]*::ffff:\([0-9.]*\).*/\1 \2/p' "$TMPD/devinfo" |
                tr '\n' ' '
}

port=18515
bwdir=$(dirname "${DIWARP_PINGPONG:-$(dirname "$DIWARP")/../examples/diwarp-pingpong}")

# run_pair S... -- C...: server in A, client in B; both must exit 0.
run_pair() {
        S=()
        while [ "$1" != -- ]; do
                S+=("$1")
                shift
        done
        shift
        C=("$@")
        srv=$TMPD/server
        cli=$TMPD/client
        in_ns "$nsA" "${S[@]}" >"$srv" 2>&1 &
        spid=$!
        i=0
        while ! ns_listening "$nsA" $port; do
                i=$((i + 1))
                [ $i -lt 150 ] || { cat "$srv" >&2; fail "server never listened"; }
                kill -0 $spid 2>/dev/null || { cat "$srv" >&2; fail "server died before listening"; }
                sleep 0.1
        done
        in_ns "$nsB" "${C[@]}" >"$cli" 2>&1 &
        cpid=$!
        wait $cpid
        crc=$?
        cpid=
        i=0
        while kill -0 $spid 2>/dev/null && [ $i -lt 100 ]; do
                i=$((i + 1))
                sleep 0.1
        done
        kill $spid 2>/dev/null
        wait $spid
        src=$?
        spid=
        echo "--- server ($src) in $nsA: ${S[*]}"
        cat "$srv"
        echo "--- client ($crc) in $nsB: ${C[*]}"
        cat "$cli"
        [ $crc -eq 0 ] || fail "$case client exited $crc"
        [ $src -eq 0 ] || fail "$case server exited $src"
}

case $case in
gids)
        need ibv_devinfo
        got=$(gids "$nsA")
        echo "A: $got"
        [ "$got" = "0 $A 1 $A2 2 127.0.0.1 " ] ||
                fail "A's GIDs are '$got', not the default route's $A, then $A2, then 127.0.0.1"
        expect "$TMPD/devinfo" 'transport:[[:space:]]*iWARP' "ibv_devinfo shows an iWARP device"
        got=$(gids "$nsB")
        [ "$got" = "0 $B 1 $B2 2 127.0.0.1 " ] || fail "B's GIDs are '$got'"
        # --addr pins one address, and the table holds it alone.
        got=$(gids "$nsA" --addr "$A2")
        echo "A --addr $A2: $got"
        [ "$got" = "0 $A2 " ] || fail "with --addr $A2 the GIDs are '$got'"
        got=$(DIWARP_ADDR=127.0.0.1 gids "$nsA")
        [ "$got" = "0 127.0.0.1 " ] || fail "with DIWARP_ADDR=127.0.0.1 the GIDs are '$got'"
        # A host with loopback alone, and one with nothing up (a fresh
        # namespace: loopback down): 127.0.0.1.
        ip netns add "$nsC" && ip -n "$nsC" link set lo up || fail "cannot create $nsC"
        got=$(gids "$nsC")
        echo "C (loopback alone): $got"
        [ "$got" = "0 127.0.0.1 " ] || fail "loopback alone: GIDs '$got'"
        ip netns add "$nsD" || fail "cannot create $nsD"
        got=$(gids "$nsD")
        echo "D (nothing up): $got"
        [ "$got" = "0 127.0.0.1 " ] || fail "nothing up: GIDs '$got'"
        ;;
sysfs)
        need ls
        d=/sys/class/infiniband/diwarp0
        # The trees go to a directory of this run's own, checked at the end.
        export XDG_RUNTIME_DIR=$TMPD/run
        mkdir -p "$XDG_RUNTIME_DIR"
        out=$(in_ns "$nsA" ls $d/device/net/) || fail "ls $d/device/net/ failed under diwarp run"
        echo "ls device/net: $out"
        [ "$out" = vA ] || fail "device/net/ lists '$out', not the default route's interface vA"
        out=$(in_ns "$nsA" stat -L -c %F $d/device/net/vA) || fail "stat of device/net/vA failed"
        [ "$out" = directory ] || fail "device/net/vA is '$out'"
        # Through the link, the interface's own sysfs attributes.
        idx=$(ip netns exec "$nsA" cat /sys/class/net/vA/ifindex)
        out=$(in_ns "$nsA" cat $d/device/net/vA/ifindex) || fail "cat device/net/vA/ifindex failed"
        [ "$out" = "$idx" ] || fail "device/net/vA/ifindex is '$out', vA's is $idx"
        out=$(in_ns "$nsA" cat $d/ports/1/gids/0 $d/ports/1/gid_attrs/ndevs/2 $d/node_type | tr '\n' ' ')
        hexA=$(printf '%02x%02x:%02x%02x' 10 78 $X 1)
        [ "$out" = "0000:0000:0000:0000:0000:ffff:$hexA lo 4: RNIC " ] ||
                fail "gids/0, ndevs/2, node_type read '$out'"
        # As rdma-core's tests look (os.path.exists, then ls in a child).
        out=$(in_ns "$nsA" /usr/bin/python3 -c "
import os, subprocess
p = '$d/device/net/'
print(os.path.exists(p), os.path.isdir(p), os.listdir(p),
      subprocess.check_output(['ls', p]).decode().split()[0],
      [t.startswith('diwarp-sysfs-%d-' % os.getpid()) for t in os.listdir('$XDG_RUNTIME_DIR')])") ||
                fail "python could not read $d"
        [ "$out" = "True True ['vA'] vA [True]" ] || fail "python sees '$out'"
        # --addr: the netdev of the pinned address.
        out=$(timeout 30 ip netns exec "$nsA" "$DIWARP" run --addr "$A2" -- ls $d/device/net/)
        [ "$out" = xA ] || fail "with --addr $A2, device/net/ lists '$out', not xA"
        # A path outside the device's directory is untouched.
        a=$(ip netns exec "$nsA" ls /sys/class/net | tr '\n' ' ')
        b=$(in_ns "$nsA" ls /sys/class/net | tr '\n' ' ')
        [ "$a" = "$b" ] || fail "/sys/class/net reads '$b' under diwarp run, '$a' without"
        ! in_ns "$nsA" ls /sys/class/infiniband/diwarp1 >/dev/null 2>&1 ||
                fail "a sibling path of the device's directory exists under diwarp run"
        ! ip netns exec "$nsA" ls $d >/dev/null 2>&1 || fail "$d exists without diwarp run"
        # Each program's private tree is gone once it exits.
        left=$(ls -A "$XDG_RUNTIME_DIR")
        [ -z "$left" ] || fail "sysfs trees left behind in $XDG_RUNTIME_DIR: $left"
        ;;
rd_bw)
        bw=$bwdir/diwarp-bw
        [ -x "$bw" ] || fail "no diwarp-bw at $bw (set DIWARP_PINGPONG)"
        # Native programs: the engine's default is the same as under diwarp run.
        in_ns() {
                ns=$1
                shift
                timeout 60 ip netns exec "$ns" "$@"
        }
        # 64 KiB Writes (44 datagrams each): what this checks is the address,
        # not the rate, and a loaded machine keeps it within the timeout.
        run_pair "$bw" --port $port --timeout 30000 -- \
                "$bw" --transport rd --op write --size 65536 --iters 20 --validate \
                --timeout 30000 --port $port "$A"
        expect "$cli" "^RESULT transport=rd op=write size=65536 iters=20 status=ok" \
                "diwarp-bw rd write succeeds"
        ;;
send_lat)
        need ib_send_lat
        gA=$(printf '00:00:00:00:00:00:00:00:00:00:255:255:10:78:%02d:01' $X)
        gB=$(printf '00:00:00:00:00:00:00:00:00:00:255:255:10:78:%02d:02' $X)
        run_pair ib_send_lat -d diwarp0 -x 0 -p $port -n 100 -- \
                ib_send_lat -d diwarp0 -x 0 -p $port -n 100 "$A"
        for f in "$srv" "$cli"; do
                expect "$f" "GID: $gA" "ib_send_lat shows A's GID"
                expect "$f" "GID: $gB" "ib_send_lat shows B's GID"
                expect "$f" "$PERFTEST_LAT_ROW" "ib_send_lat prints its result row"
        done
        ;;
write_bw_cm)
        need ib_write_bw
        run_pair ib_write_bw -d diwarp0 -R -p $port -n 200 -- \
                ib_write_bw -d diwarp0 -R -p $port -n 200 "$A"
        for f in "$srv" "$cli"; do
                expect "$f" 'Transport type : IW' "ib_write_bw sees an iWARP device"
                expect "$f" "$PERFTEST_BW_ROW" "ib_write_bw prints its result row"
        done
        ;;
rc_pingpong)
        need ibv_rc_pingpong
        run_pair ibv_rc_pingpong -g 0 -p $port -- ibv_rc_pingpong -g 0 -p $port "$A"
        expect "$srv" "local address: .*GID ::ffff:10\.78\.$X\.1\$" "server GID is A's address"
        expect "$cli" "local address: .*GID ::ffff:10\.78\.$X\.2\$" "client GID is B's address"
        expect "$cli" '^[0-9]+ iters in [0-9.]+ seconds' "ibv_rc_pingpong reports its iterations"
        ;;
rping)
        need rping
        run_pair rping -s -a "$A" -p $port -V -C 10 -- rping -c -a "$A" -p $port -V -v -C 10
        [ "$(grep -c '^ping data: rdma-ping-[0-9]' "$cli")" -eq 10 ] || fail "rping: 10 verified pings"
        ;;
rping_src)
        need rping
        need ss
        in_ns "$nsA" rping -s -a "$A" -p $port -C 20000 -S 100 >"$TMPD/server" 2>&1 &
        spid=$!
        i=0
        while ! ns_listening "$nsA" $port; do
                i=$((i + 1))
                [ $i -lt 150 ] || { cat "$TMPD/server" >&2; fail "server never listened"; }
                sleep 0.1
        done
        in_ns "$nsB" rping -c -I "$B2" -a "$A" -p $port -C 20000 -S 100 >"$TMPD/client" 2>&1 &
        cpid=$!
        seen=
        while kill -0 $cpid 2>/dev/null; do
                seen=$(ip netns exec "$nsA" ss -Htn state established "( sport = :$port )" |
                        awk '{ print $4 }' | head -1)
                [ -z "$seen" ] || break
                sleep 0.05
        done
        wait $cpid
        crc=$?
        cpid=
        wait $spid
        src=$?
        spid=
        [ $crc -eq 0 ] && [ $src -eq 0 ] ||
                { cat "$TMPD/server" "$TMPD/client" >&2; fail "rping exited $src/$crc"; }
        echo "A sees the connection from $seen"
        [ -n "$seen" ] || fail "the connection was never seen in A"
        [ "${seen%:*}" = "$B2" ] || fail "the connection came from ${seen%:*}, not the bound $B2"
        ;;
*)
        fail "unknown case '$case'"
        ;;
esac
echo "ok"
