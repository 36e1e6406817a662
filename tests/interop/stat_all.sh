#!/bin/bash
# `diwarp stat` lists every process of the host that drives its own diwarp
# devices (no daemon): two example programs exchanging messages both show,
# each with its device counters moving and its RTS QP naming the other; the
# object of a killed program is not listed and is removed; one that exits
# removes its own. An RC QP set up through rdma_cm (rping under `diwarp
# run`) names its peer's address with an unknown QPN as ADDRESS/-.
. "$(dirname "$0")/lib.sh"
: "${DIWARP_PINGPONG:?DIWARP_PINGPONG must name diwarp-pingpong}"
need pgrep

# link_field FILE PID NAME: a counter of PID's link line
link_field() {
        sed -n "/^link diwarp0\/1 pid $2 /{s/.* $3 \([0-9]*\).*/\1/p}" "$1"
}

shm_of() {
        ls /dev/shm/diwarp-stat-"$(id -u)"-"$1"-* 2>/dev/null
}

srv=$TMPD/pp.srv
S=("$DIWARP_PINGPONG" --transport rc --iters 100000000 --timeout 2000 --port @PORT@)
serve
timeout 60 "$DIWARP_PINGPONG" --transport rc --iters 100000000 --timeout 2000 \
        --port "$port" 127.0.0.1 >"$TMPD/pp.cli" 2>&1 &
cwrap=$!
trap 'rc=$?; kill $spid $cwrap 2>/dev/null; sanitizer_check || rc=1; rm -rf "$TMPD"; exit $rc' EXIT
# the programs themselves (children of timeout)
i=0
while :; do
        s=$(pgrep -P "$spid" | head -1)
        c=$(pgrep -P "$cwrap" | head -1)
        [ -n "$s" ] && [ -n "$c" ] && [ -n "$(shm_of "$s")" ] && [ -n "$(shm_of "$c")" ] && break
        i=$((i + 1))
        [ $i -lt 200 ] || { cat "$srv" "$TMPD/pp.cli" >&2; fail "the programs did not publish their devices"; }
        sleep 0.05
done
ls -l /dev/shm/diwarp-stat-"$(id -u)"-"$s"-* /dev/shm/diwarp-stat-"$(id -u)"-"$c"-*
perm=$(stat -c %a "$(shm_of "$s")")
[ "$perm" = 600 ] || fail "the object of PID $s has mode $perm, not 600"

# counters move: once both show traffic, two looks 0.6 s apart (the owner
# refreshes every 0.25 s)
i=0
while :; do
        "$DIWARP" stat >"$TMPD/stat1" 2>"$TMPD/stat1.err"
        [ -n "$(link_field "$TMPD/stat1" "$s" tx_bytes)" ] &&
                [ -n "$(link_field "$TMPD/stat1" "$c" tx_bytes)" ] && break
        i=$((i + 1))
        [ $i -lt 100 ] || { cat "$TMPD/stat1" >&2; fail "no traffic shown in 10 s"; }
        sleep 0.1
done
sleep 0.6
"$DIWARP" stat >"$TMPD/stat2" 2>"$TMPD/stat2.err"
cat "$TMPD/stat2"
for p in $s $c; do
        expect "$TMPD/stat2" "^process pid $p comm diwarp-pingpon" "PID $p is listed"
        expect "$TMPD/stat2" "^qp 0x[0-9a-f]+ pid $p type RC state RTS peer [0-9.]+/0x" "PID $p's QP"
        b1=$(link_field "$TMPD/stat1" "$p" tx_bytes)
        b2=$(link_field "$TMPD/stat2" "$p" tx_bytes)
        r2=$(link_field "$TMPD/stat2" "$p" rx_bytes)
        [ "${b1:-0}" -gt 0 ] && [ "${r2:-0}" -gt 0 ] || fail "PID $p: counters at zero (tx ${b1:-?}, rx ${r2:-?})"
        [ "${b2:-0}" -gt "$b1" ] || fail "PID $p: tx_bytes did not move ($b1, then ${b2:-?})"
        echo "PID $p: tx_bytes $b1 -> $b2, rx_bytes $r2"
done
# each QP names the other's QPN as its peer
sq=$(sed -n "s/^qp \(0x[0-9a-f]*\) pid $s .*/\1/p" "$TMPD/stat2")
cq=$(sed -n "s/^qp \(0x[0-9a-f]*\) pid $c .*/\1/p" "$TMPD/stat2")
grep -Eq "^qp $sq pid $s .* peer [0-9.]+/$cq " "$TMPD/stat2" || fail "the server's QP does not name the client's ($cq)"
grep -Eq "^qp $cq pid $c .* peer [0-9.]+/$sq " "$TMPD/stat2" || fail "the client's QP does not name the server's ($sq)"

# a killed program: its object stays until a reader finds its PID gone
kill -9 "$c"
wait $cwrap 2>/dev/null
[ -n "$(shm_of "$c")" ] || fail "the killed program's object vanished by itself"
"$DIWARP" stat >"$TMPD/stat3" 2>/dev/null
grep -q "^process pid $c " "$TMPD/stat3" && fail "the killed PID $c is still listed"
[ -z "$(shm_of "$c")" ] || fail "the killed program's object was not removed"
# the server gives up (no message for 2 s) and closes its device
wait $spid
[ -z "$(shm_of "$s")" ] || fail "the server's object outlived its device"
"$DIWARP" stat >"$TMPD/stat4" 2>/dev/null
grep -q "^process pid $s " "$TMPD/stat4" && fail "the exited PID $s is still listed"

# An RC QP connected through rdma_cm knows its peer's address but not its QP
# number (MPA carries none): its line says ADDRESS/-, not a QPN of 0.
if command -v rping >/dev/null 2>&1; then
        srv=$TMPD/rping.srv
        S=("$DIWARP" run -- rping -s -a 127.0.0.1 -p @PORT@ -C 1000000)
        serve
        timeout 60 "$DIWARP" run -- rping -c -a 127.0.0.1 -p "$port" -C 1000000 >"$TMPD/rping.cli" 2>&1 &
        rwrap=$!
        i=0
        while :; do
                "$DIWARP" stat >"$TMPD/stat5" 2>/dev/null
                grep -Eq "^qp 0x[0-9a-f]+ pid [0-9]+ type RC state RTS peer 127\.0\.0\.1/" "$TMPD/stat5" && break
                i=$((i + 1))
                [ $i -lt 100 ] || { cat "$TMPD/stat5" "$srv" "$TMPD/rping.cli" >&2; fail "rping's QPs never showed in diwarp stat"; }
                sleep 0.1
        done
        grep -E "type RC state RTS" "$TMPD/stat5"
        grep -Eq "type RC state RTS peer 127\.0\.0\.1/- " "$TMPD/stat5" ||
                fail "an rdma_cm QP does not show its unknown peer QPN as '-'"
        ! grep -Eq "type RC .* peer [0-9.]+/0x000000 " "$TMPD/stat5" || fail "a QP shows peer QPN 0x000000"
        kill $rwrap $spid 2>/dev/null
        pkill -P $rwrap 2>/dev/null
        pkill -P $spid 2>/dev/null
        wait $rwrap $spid 2>/dev/null
        echo "rping's RC QPs: peer 127.0.0.1/-"
else
        echo "rping not installed: the rdma_cm case is not run"
fi
echo "ok: both programs listed with moving counters; a killed one's object removed, an exited one's gone; an rdma_cm QP's unknown peer QPN shown as '-'"
