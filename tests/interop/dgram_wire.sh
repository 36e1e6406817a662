#!/bin/bash
# Captures diwarp's wire and decodes it with tshark:
#   - UD, RD and RC-over-RD datagrams with the dissector
#     tools/wireshark/diwarp.lua, which hands DDP/RDMAP to Wireshark's own
#     iWARP dissector: a known set of operations (dgram_traffic: UD Sends and,
#     RC over RD, an RNR NAK, Sends, Send with Immediate, RDMA Write, Read,
#     atomics; dgram_rd_traffic: the same on native RD QPs), native
#     RD under injected loss (SACK blocks, retransmissions) and corruption
#     (bad CRCs), receiver-paced Sends (PULL, PULLREQ), RD without CRC
#     (NOCRC), the credit field of the mailbox receive ring and the
#     dynamic protocol's credit control segments (CCTL), and
#     hand-made datagrams
#     for what the engine never sends (credits, the other NAK codes, ECE, a
#     bad CRC, a datagram on a port outside the range) or sends only with
#     several addresses (the multirail rail list and origin), and one
#     breaking each rule of the decoder, on which the dissector and the
#     engine's own decoder (dgram_verdict) must agree;
#   - RC over TCP (ibv_rc_pingpong, ib_write_bw, rping) with Wireshark's iWARP dissectors
#     alone: every MPA FPDU's CRC must hold.
# dgram_wire_check.py asserts what the decode shows against what the programs
# did. An example pair that fails is shown and run once more: what is checked
# here is the decode, and a second failure fails the test. Everything runs in a network namespace of its own, so the capture on
# its loopback holds only this test's traffic (loopback MTU 1500, so RD cuts
# Ethernet-size segments). Needs tshark (else exit 77: skipped).
#   env: DIWARP DGRAM_TRAFFIC DGRAM_RD_TRAFFIC DGRAM_VERDICT DIWARP_PINGPONG DIWARP_BW
#        DIWARP_LUA BENCH_CREDITS (meson)
here=$(cd "$(dirname "$0")" && pwd)
command -v tshark >/dev/null 2>&1 || { echo "SKIP: tshark not installed" >&2; exit 77; }
command -v dumpcap >/dev/null 2>&1 || { echo "SKIP: dumpcap not installed" >&2; exit 77; }

if [ -z "${DGRAM_WIRE_NETNS:-}" ]; then
        ns=(unshare --net)
        [ "$(id -u)" -eq 0 ] || ns=(unshare --net --map-root-user)
        if ! "${ns[@]}" true 2>/dev/null; then
                echo "SKIP: cannot create a network namespace to capture in" >&2
                exit 77
        fi
        DGRAM_WIRE_NETNS=1 exec "${ns[@]}" bash "$0" "$@"
fi

. "$here/lib.sh"
need ibv_rc_pingpong
: "${DGRAM_TRAFFIC:?}" "${DGRAM_RD_TRAFFIC:?}" "${DGRAM_VERDICT:?}" "${DIWARP_PINGPONG:?}" "${DIWARP_BW:?}" "${DIWARP_LUA:?}" "${BENCH_CREDITS:?}"
ip link set lo up && ip link set lo mtu 1500 || fail "cannot set up loopback in the namespace"

dpid=
kids=()
stop_all() {
        for p in $dpid "${kids[@]}"; do
                kill "$p" 2>/dev/null
        done
}
trap 'rc=$?; stop_all; sanitizer_check || rc=1; rm -rf "$TMPD"; exit $rc' EXIT
trap 'exit 143' TERM

# cap_start FILE FILTER / cap_stop: dumpcap on the namespace's loopback.
cap_start() {
        dumpcap -q -i lo -f "$2" -w "$1" >"$TMPD/dumpcap.log" 2>&1 &
        dpid=$!
        local i=0
        until [ -s "$1" ]; do
                i=$((i + 1))
                [ $i -lt 100 ] || { cat "$TMPD/dumpcap.log" >&2; fail "dumpcap did not start"; }
                kill -0 $dpid 2>/dev/null || { cat "$TMPD/dumpcap.log" >&2; fail "dumpcap exited"; }
                sleep 0.1
        done
        sleep 0.3 # the capture filter is attached before the file is written; margin
}
cap_stop() {
        sleep 0.3
        kill -INT $dpid
        wait $dpid
        dpid=
}

# run_pair NAME "SERVER ENV" "CLIENT ENV" PROGRAM ARGS...: the example
# program as server and as client (side channel on a fixed port: the
# namespace is ours), captured into CAP/NAME.pcapng. 1 when either fails.
run_pair() {
        local name=$1 senv=$2 cenv=$3 prog=$4
        shift 4
        cap_start "$cap/$name.pcapng" udp
        env $senv timeout 30 "$prog" --port 18515 --timeout 10000 >"$TMPD/$name.srv" 2>&1 &
        local sp=$! rc=0
        kids+=($sp)
        local i=0
        until listening 18515; do
                i=$((i + 1))
                [ $i -lt 100 ] || { cat "$TMPD/$name.srv" >&2; fail "$name: server never listened"; }
                sleep 0.1
        done
        env $cenv timeout 30 "$prog" --port 18515 --timeout 10000 "$@" 127.0.0.1 >"$TMPD/$name.cli" 2>&1 ||
                rc=1
        [ $rc -eq 0 ] || kill $sp 2>/dev/null
        wait $sp || rc=1
        cap_stop
        grep -q '^RESULT .*status=ok' "$TMPD/$name.cli" || rc=1
        if [ $rc -ne 0 ]; then
                echo "--- $name server:" >&2
                cat "$TMPD/$name.srv" >&2
                echo "--- $name client:" >&2
                cat "$TMPD/$name.cli" >&2
                return 1
        fi
        tail -n 1 "$TMPD/$name.cli" >"$cap/$name.out"
        echo "$name: $(cat "$cap/$name.out")"
}

# pair: run_pair, once more if it fails. What is checked is the decode of
# the wire; a run that fails (output above, kept for the sanitizer check)
# is an engine or program failure, which the second run must not repeat.
pair() {
        run_pair "$@" && return 0
        mv "$TMPD/$1.srv" "$TMPD/$1.srv.first"
        mv "$TMPD/$1.cli" "$TMPD/$1.cli.first"
        echo "WARN: $1 failed (output above); running it once more" >&2
        run_pair "$@" || fail "$1: failed twice"
}

# 1. Datagrams, one capture per run (CAP/NAME.pcapng). Without credits
# (DIWARP_CREDIT=off) but in rd_credit: the checks of the others name the
# exact flags of each datagram and expect RNR NAKs.
export DIWARP_CREDIT=off
cap=$TMPD/cap
mkdir -p "$cap"
cap_start "$cap/traffic.pcapng" udp
DIWARP_RC_TRANSPORT=rd timeout 30 "$DIWARP" run "$DGRAM_TRAFFIC" >"$TMPD/traffic.out" 2>&1 ||
        { cat "$TMPD/traffic.out" >&2; fail "dgram_traffic failed"; }
cap_stop
cat "$TMPD/traffic.out"
cp "$TMPD/traffic.out" "$cap/traffic.out"
cap_start "$cap/rd_native.pcapng" udp
timeout 30 "$DGRAM_RD_TRAFFIC" >"$TMPD/rd_native.out" 2>&1 ||
        { cat "$TMPD/rd_native.out" >&2; fail "dgram_rd_traffic failed"; }
cap_stop
cat "$TMPD/rd_native.out"
cp "$TMPD/rd_native.out" "$cap/rd_native.out"
fault="DIWARP_FAULT=drop:3%,reorder:3% DIWARP_FAULT_SEED=7"
pair rd_write "$fault" "$fault" "$DIWARP_BW" --transport rd --op write --size 16384 --iters 20
pair rd_read "$fault" "$fault" "$DIWARP_BW" --transport rd --op read --size 8000 --iters 10
pull="DIWARP_RD_PULL_MIN=65536 DIWARP_RD_PULL_CHUNK=16384"
pair rd_pull "$pull" "$pull" "$DIWARP_BW" --transport rd --op send --size 100000 --iters 2
echo "chunk=16384" >>"$cap/rd_pull.out"
# DIWARP_CC=off: with the CRC off and congestion control on, the last pong
# of this ping-pong was seen never to leave its sender (the capture shows the
# last ping acknowledged and nothing after it); this run checks the format.
nocrc="DIWARP_RD_CRC=0 DIWARP_CC=off"
pair rd_nocrc "$nocrc" "$nocrc" "$DIWARP_PINGPONG" --transport rd --op send --size 64 --iters 10
pair rd_nocrc_write "$nocrc" "$nocrc" "$DIWARP_BW" --transport rd --op write --size 32768 --iters 4
# DIWARP_AUTH: every datagram ends in the authentication trailer (nonce and
# tag) instead of the CRC32c, GSO buffers included.
head -c 32 /dev/urandom >"$TMPD/auth.key" && chmod 600 "$TMPD/auth.key"
auth="DIWARP_AUTH=file:$TMPD/auth.key"
pair rd_auth "$auth" "$auth" "$DIWARP_BW" --transport rd --op write --size 32768 --iters 4
pair ud_pingpong "" "" "$DIWARP_PINGPONG" --transport ud --op send --size 512 --iters 10
credit="DIWARP_CREDIT=static DIWARP_CREDIT_RING=256"
pair rd_credit "$credit" "$credit" "$DIWARP_BW" --transport rd --op send --size 4000 --iters 300
# The dynamic protocol: 4 of 8 endpoints sending to the 4 after each through
# rings of 2 slots per sender, so quotas move and idle senders are asked for
# their credits (compulsory requests and responses, X-flag CCTL).
cap_start "$cap/rd_credit_dyn.pcapng" udp
DIWARP_CREDIT=dynamic DIWARP_CREDIT_MIN_QUOTA=1 DIWARP_CREDIT_PEERS=8 DIWARP_CREDIT_RING=16 \
        timeout 60 "$BENCH_CREDITS" --eps 8 --msgs 50 --active 4 --dests 4 --rq 4 \
        >"$TMPD/rd_credit_dyn.out" 2>&1 || { cat "$TMPD/rd_credit_dyn.out" >&2; fail "bench-credits failed"; }
cap_stop
tail -n 1 "$TMPD/rd_credit_dyn.out" | tee "$cap/rd_credit_dyn.out"
corrupt="DIWARP_FAULT=corrupt:20% DIWARP_FAULT_SEED=1 DIWARP_CC=off" # CC: see nocrc above
pair rd_corrupt "$corrupt" "$corrupt" "$DIWARP_PINGPONG" --transport rd --op send --size 64 --iters 20

# Hand-made datagrams (a pcap written by the checker).
/usr/bin/python3 "$here/dgram_wire_check.py" craft "$cap/crafted.pcap" "$cap/crafted_gso.pcap" || fail "crafting failed"

# 2. RC over TCP (MPA) with Wireshark's own dissectors.
cap_start "$cap/rc_tcp.pcapng" tcp
S=(ibv_rc_pingpong -g 0 -p 18600 -n 20 -s 4096)
timeout 30 "$DIWARP" run "${S[@]}" >"$TMPD/rcpp.srv" 2>&1 &
sp=$!
kids+=($sp)
i=0
until listening 18600; do
        i=$((i + 1))
        [ $i -lt 100 ] || { cat "$TMPD/rcpp.srv" >&2; fail "ibv_rc_pingpong server never listened"; }
        sleep 0.1
done
timeout 30 "$DIWARP" run "${S[@]}" 127.0.0.1 >"$TMPD/rcpp.cli" 2>&1 ||
        { cat "$TMPD/rcpp.srv" "$TMPD/rcpp.cli" >&2; fail "ibv_rc_pingpong client failed"; }
wait $sp || { cat "$TMPD/rcpp.srv" >&2; fail "ibv_rc_pingpong server failed"; }
if command -v ib_write_bw >/dev/null 2>&1; then
        # perftest: Writes of 200 000 bytes, FPDUs of 65 024 bytes across
        # TCP segments (Wireshark reassembles them).
        P=(ib_write_bw -d diwarp0 -x 0 -p 18602 -s 200000 -n 5)
        timeout 30 "$DIWARP" run "${P[@]}" >"$TMPD/wbw.srv" 2>&1 &
        sp=$!
        kids+=($sp)
        i=0
        until listening 18602; do
                i=$((i + 1))
                [ $i -lt 100 ] || { cat "$TMPD/wbw.srv" >&2; fail "ib_write_bw server never listened"; }
                sleep 0.1
        done
        timeout 30 "$DIWARP" run "${P[@]}" 127.0.0.1 >"$TMPD/wbw.cli" 2>&1 ||
                { cat "$TMPD/wbw.srv" "$TMPD/wbw.cli" >&2; fail "ib_write_bw client failed"; }
        wait $sp || { cat "$TMPD/wbw.srv" >&2; fail "ib_write_bw server failed"; }
fi
if command -v rping >/dev/null 2>&1; then
        timeout 30 "$DIWARP" run rping -s -a 127.0.0.1 -p 18601 -V -C 5 >"$TMPD/rping.srv" 2>&1 &
        sp=$!
        kids+=($sp)
        i=0
        until listening 18601; do
                i=$((i + 1))
                [ $i -lt 100 ] || { cat "$TMPD/rping.srv" >&2; fail "rping server never listened"; }
                sleep 0.1
        done
        timeout 30 "$DIWARP" run rping -c -a 127.0.0.1 -p 18601 -V -v -C 5 >"$TMPD/rping.cli" 2>&1 ||
                { cat "$TMPD/rping.srv" "$TMPD/rping.cli" >&2; fail "rping client failed"; }
        wait $sp || { cat "$TMPD/rping.srv" >&2; fail "rping server failed"; }
        [ "$(grep -c '^ping data: rdma-ping-[0-9]' "$TMPD/rping.cli")" -eq 5 ] || fail "rping: 5 pings"
fi
cap_stop

[ -z "${DGRAM_WIRE_KEEP:-}" ] || cp -r "$cap" "$DGRAM_WIRE_KEEP"
/usr/bin/python3 "$here/dgram_wire_check.py" check "$DIWARP_LUA" "$cap" "$DGRAM_VERDICT" ||
        fail "decode check"
echo ok
