#!/bin/bash
# Runs an rdma_cm program pair (server + client, two processes on this
# machine) under diwarp and checks exit codes and the programs' own output:
#   rdmacm.sh CASE      CASE: rping rdma_server rdma_xserver udaddy udaddy_silent
#                       ucmatose ucmatose_migrate cmtime udpong ib_send_bw
#                       ib_write_lat fi_msg fi_rdm
# udaddy_silent: 80 TCP connections to the UD listener that never send their
# request are open when the client connects; it must still get through.
# The rdma_cm emulation lives in verbs-provider/rdmacm.c; udpong runs the
# real librdmacm's datagram rsockets on top of it.
. "$(dirname "$0")/lib.sh"
case=$1

# @PORT@ in S and C stands for the port serve picks (lib.sh).
fixed_port=
addr=127.0.0.1
srv=$TMPD/server
cli=$TMPD/client
server_exits=1 # cmtime's server keeps serving: it is stopped, not awaited

case $case in
rping)
        need rping
        S=(rping -s -a $addr -p @PORT@ -V -C 10)
        C=(rping -c -a $addr -p @PORT@ -V -v -C 10)
        ;;
rdma_server)
        need rdma_server
        S=(rdma_server -p @PORT@)
        C=(rdma_client -s $addr -p @PORT@)
        ;;
rdma_xserver)
        need rdma_xserver
        S=(rdma_xserver -p @PORT@)
        C=(rdma_xclient -s $addr -p @PORT@)
        ;;
udaddy | udaddy_silent)
        need udaddy
        # udaddy has no port option: its port is 7174, so concurrent test runs
        # take turns (port_lock).
        fixed_port=7174
        port_lock $fixed_port
        S=(udaddy -c 2 -C 10 -S 512)
        C=(udaddy -s $addr -c 2 -C 10 -S 512)
        ;;
ucmatose | ucmatose_migrate)
        need ucmatose
        m=()
        [ "$case" = ucmatose_migrate ] && m=(-m)
        S=(ucmatose -p @PORT@ -c 2 -C 10 "${m[@]}")
        C=(ucmatose -s $addr -p @PORT@ -c 2 -C 10 "${m[@]}")
        ;;
cmtime)
        need cmtime
        S=(cmtime -p @PORT@ -c 10)
        C=(cmtime -s $addr -p @PORT@ -c 10)
        server_exits=0
        ;;
udpong)
        need udpong
        # A datagram server: ready once its UDP port is bound; it serves until
        # stopped, and prints only when its stdout is line buffered. The client
        # exits 0 even when a test fails: its result row is the verdict. Echo
        # mode (-T e) makes the row's count exact (every message answered).
        serve_ready=udp_bound
        server_exits=0
        S=(stdbuf -oL udpong -b $addr -p @PORT@)
        C=(udpong -s $addr -p @PORT@ -C 100 -S 1000 -T e)
        ;;
ib_send_bw | ib_write_lat)
        need "$case"
        S=("$case" -R -d diwarp0 -p @PORT@ -n 200)
        C=("$case" -R -d diwarp0 -p @PORT@ -n 200 $addr)
        ;;
fi_msg | fi_rdm)
        need fi_pingpong
        # libfabric's verbs provider only looks at non-loopback interfaces: the
        # device takes this machine's first global IPv4 address.
        addr=$(ip -4 -o addr show scope global 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
        [ -n "$addr" ] || { echo "SKIP: no non-loopback IPv4 address" >&2; exit 77; }
        export DIWARP_ADDR=$addr
        if [ "$case" = fi_msg ]; then p=(-p verbs -e msg); else p=(-p "verbs;ofi_rxm" -e rdm); fi
        S=(fi_pingpong "${p[@]}" -I 100 -S 1024 -B @PORT@)
        C=(fi_pingpong "${p[@]}" -I 100 -S 1024 -P @PORT@ "$addr")
        ;;
*)
        fail "unknown case '$case'"
        ;;
esac

serve "$DIWARP" run --
S=("${S[@]//@PORT@/$port}")
C=("${C[@]//@PORT@/$port}")
silent_pid=
if [ "$case" = udaddy_silent ]; then
        # More silent peers than the emulation keeps places for (64): the
        # oldest are closed to make room, and none may hold up the others.
        python3 -c '
import socket, sys, time
held = []
for i in range(80):
    held.append(socket.create_connection(("'$addr'", '$port'), timeout=5))
print("held", len(held), flush=True)
time.sleep(60)
' >"$TMPD/silent" 2>&1 &
        silent_pid=$!
        for _ in $(seq 100); do grep -q '^held 80' "$TMPD/silent" && break; sleep 0.1; done
        grep -q '^held 80' "$TMPD/silent" || fail "could not open 80 silent connections: $(cat "$TMPD/silent")"
fi
t0=$(date +%s.%N)
timeout 60 "$DIWARP" run -- "${C[@]}" >"$cli" 2>&1
crc=$?
t1=$(date +%s.%N)
[ -z "$silent_pid" ] || kill $silent_pid 2>/dev/null
if [ $server_exits = 1 ]; then
        wait $spid
        src=$?
else
        sleep 0.5
        kill $spid 2>/dev/null
        wait $spid 2>/dev/null
        src=0
fi
echo "--- server ($src): ${S[*]}"
cat "$srv"
echo "--- client ($crc): ${C[*]}"
cat "$cli"
[ $src -eq 0 ] || fail "$case server exited $src"
[ $crc -eq 0 ] || fail "$case client exited $crc"
! grep -q "AddressSanitizer\|runtime error" "$srv" "$cli" || fail "sanitizer report"

case $case in
rping)
        [ "$(grep -c '^ping data: rdma-ping-[0-9]' "$cli")" -eq 10 ] || fail "rping: 10 verified pings"
        ;;
rdma_server)
        expect "$srv" '^rdma_server: end 0' "rdma_server succeeds"
        expect "$cli" '^rdma_client: end 0' "rdma_client succeeds"
        ;;
rdma_xserver)
        expect "$srv" '^rdma_xserver: end 0' "rdma_xserver succeeds"
        expect "$cli" '^rdma_xclient: end 0' "rdma_xclient succeeds"
        ;;
udaddy | udaddy_silent | ucmatose | ucmatose_migrate)
        for f in "$srv" "$cli"; do
                expect "$f" '^data transfers complete' "$case transfers its data"
                expect "$f" '^return status 0' "$case reports success"
        done
        [ "$case" != ucmatose_migrate ] || expect "$cli" 'migrating to new event channel' "ids migrate"
        if [ "$case" = udaddy_silent ]; then
                expect "$srv" 'closed unfinished to make room' "the oldest silent peer makes room"
                # Each silent peer used to hold the helper thread for 1 s
                # (80 s in all, past the client's timeout).
                awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 30) }' ||
                        fail "udaddy took $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') s beside 80 silent peers"
        fi
        ;;
cmtime)
        expect "$cli" '^connect +: +[0-9.]+' "cmtime times its connects"
        expect "$cli" '^disconnect +: +[0-9.]+' "cmtime times its disconnects"
        ;;
udpong)
        expect "$srv" "^client login from $addr\$" "udpong server sees its client"
        # name, size, transfers (100 echoed both ways), bytes, seconds...
        expect "$cli" '^custom +1000 +200 +195k +[0-9.]+s' "udpong echoes 100 messages"
        ;;
ib_send_bw)
        for f in "$srv" "$cli"; do
                expect "$f" 'Data ex. method : rdma_cm' "rdma_cm is used"
                expect "$f" '^ *65536 +200 +[0-9.]+ +[0-9.]+' "$case reports its bandwidth"
        done
        ;;
ib_write_lat)
        for f in "$srv" "$cli"; do
                expect "$f" 'Data ex. method : rdma_cm' "rdma_cm is used"
                expect "$f" '^ *2 +200 +[0-9.]+ +[0-9.]+' "$case reports its latency"
        done
        ;;
fi_msg | fi_rdm)
        for f in "$srv" "$cli"; do
                expect "$f" '^1k +100 +=100 ' "fi_pingpong completes 100 transfers"
        done
        ;;
esac
echo "ok"
