#!/bin/bash
# diwarp-bw allocates what the operation needs, and refuses what cannot fit:
#   example_sizes.sh CASE
#   CASE: big     RC Write and Send of 64 MiB messages complete, validated;
#                 each process's peak RSS grows over a 64 KiB run of the
#                 same operation (the baseline, in this run) by no more than
#                 one region of the message size for a Write and one per
#                 Send in flight (auto window) plus one for a Send, with
#                 slack for the sanitizers' shadow
#         refuse  a size whose buffers exceed the memory the host has
#                 available (64 Sends in flight of 2 GiB: 128 GiB of
#                 receive slots) is refused by the server before it
#                 allocates anything: both exit non-zero at once, with a
#                 message naming the size and why; a size beyond the
#                 largest message is refused by the option parser
# Peak RSS is /usr/bin/time's %M (getrusage ru_maxrss).
. "$(dirname "$0")/lib.sh"
case=${1:?usage: example_sizes.sh big|refuse}
: "${DIWARP_BW:?DIWARP_BW must name diwarp-bw}"
need /usr/bin/time

# run NAME ARGS...: a server and its client of diwarp-bw; each one's peak RSS
# (KiB) left in $TMPD/NAME.srv.rss / NAME.cli.rss; returns the client's status.
run() {
        local name=$1
        shift
        srv=$TMPD/$name.srv
        S=("$DIWARP_BW" --port @PORT@)
        serve /usr/bin/time -f 'maxrss_kb=%M' -o "$TMPD/$name.srv.rss"
        local rc=0
        timeout 120 /usr/bin/time -f 'maxrss_kb=%M' -o "$TMPD/$name.cli.rss" \
                "$DIWARP_BW" "$@" --port "$port" 127.0.0.1 >"$TMPD/$name.cli" 2>&1 || rc=$?
        wait $spid || { [ $rc -ne 0 ] || rc=1; }
        return $rc
}

rss() {
        sed -n 's/^maxrss_kb=//p' "$1"
}

case $case in
big)
        big=$((64 << 20))
        for op in write send; do
                run base_$op --transport rc --op $op --size 65536 --iters 20 --validate ||
                        { cat "$srv" "$TMPD/base_$op.cli" >&2; fail "$op 64 KiB failed"; }
                run big_$op --transport rc --op $op --size $big --iters 10 --validate ||
                        { cat "$srv" "$TMPD/big_$op.cli" >&2; fail "$op 64 MiB failed"; }
                expect "$TMPD/big_$op.cli" 'RESULT .*size=67108864 .*status=ok' "$op 64 MiB: client"
                expect "$TMPD/big_$op.srv" 'RESULT .*size=67108864 .*status=ok' "$op 64 MiB: server"
                # regions of the message size each side may hold: a Write one
                # per side; a Send one at the client, one per Send in flight
                # (256 MiB / 64 MiB = 4) at the server
                if [ $op = write ]; then srv_regions=1; else srv_regions=4; fi
                for side in cli srv; do
                        b=$(rss "$TMPD/base_$op.$side.rss")
                        g=$(rss "$TMPD/big_$op.$side.rss")
                        [ -n "$b" ] && [ -n "$g" ] || fail "$op: no peak RSS of the $side"
                        n=1
                        [ $side = srv ] && n=$srv_regions
                        # + 1/8 for ASan's shadow, + 32 MiB of slack
                        limit=$(((n * big + n * big / 8) / 1024 + 32768))
                        echo "$op $side: peak RSS ${b} KiB at 64 KiB, ${g} KiB at 64 MiB" \
                                "(growth $((g - b)) KiB, limit $limit KiB)"
                        [ $((g - b)) -le $limit ] ||
                                fail "$op $side: peak RSS grew by $((g - b)) KiB for 64 MiB messages (limit $limit)"
                done
        done
        ;;
refuse)
        # A size beyond one message: refused by the option parser.
        rc=0
        "$DIWARP_BW" --size 3000000000 127.0.0.1 >"$TMPD/parse.out" 2>&1 || rc=$?
        [ $rc -ne 0 ] || fail "--size 3000000000 accepted"
        expect "$TMPD/parse.out" '--size 3000000000: larger than one message can be' \
                "the parser names the size and why"
        avail=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
        need_kb=$((64 * 2 * 1024 * 1024))
        if [ "${avail:-0}" -ge $need_kb ]; then
                echo "SKIP: this host has ${avail} KiB available: 64 x 2 GiB would fit" >&2
                exit 77
        fi
        t0=$(date +%s)
        rc=0
        run huge --transport rc --op send --size 2147483648 --window 64 --iters 1 || rc=$?
        t1=$(date +%s)
        [ $rc -ne 0 ] || fail "a client asking for 128 GiB of receive slots succeeded"
        cat "$TMPD/huge.cli" "$srv"
        expect "$TMPD/huge.cli" 'refused by the server: --size 2147483648 \(rc send\) needs 128\.[0-9]+ GiB' \
                "the client names the size and the server's refusal"
        expect "$TMPD/huge.cli" 'RESULT .*status=fail' "the client reports failure"
        expect "$srv" 'refused: --size 2147483648 \(rc send, 64 receive slots\) needs 128\.[0-9]+ GiB of buffers, more than the [0-9.]+ GiB the host has available \(MemAvailable\)' \
                "the server names the size and why"
        [ $((t1 - t0)) -le 30 ] || fail "the refusal took $((t1 - t0)) s"
        s=$(rss "$TMPD/huge.srv.rss")
        [ -n "$s" ] && [ "$s" -lt $((1024 * 1024)) ] ||
                fail "the refusing server's peak RSS is ${s:-?} KiB: it allocated"
        echo "ok: refused in $((t1 - t0)) s, the server's peak RSS ${s} KiB"
        ;;
*)
        fail "unknown case $case"
        ;;
esac
