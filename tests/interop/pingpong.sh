#!/bin/bash
# Runs an rdma-core pingpong (server + client on loopback) under diwarp:
#   pingpong.sh PROGRAM [EXTRA ARGS...]   e.g. ibv_ud_pingpong -e
# Both must exit 0, report their transfer, and agree on each other's QPN.
# PINGPONG_REPEAT=N runs the pair N times (default 1), each run bounded;
# the first failed run fails the test (races that show once in tens of runs).
. "$(dirname "$0")/lib.sh"
prog=$1
shift
need "$prog"

srv=$TMPD/server
cli=$TMPD/client
# The server listens on its side-channel port once its QP exists.
S=("$prog" -g 0 -p @PORT@ "$@")
runs=${PINGPONG_REPEAT:-1}
for run in $(seq 1 "$runs"); do
        serve "$DIWARP" run
        timeout 60 "$DIWARP" run "$prog" -g 0 -p "$port" "$@" 127.0.0.1 >"$cli" 2>&1
        crc=$?
        wait $spid
        src=$?
        if [ $src -ne 0 ] || [ $crc -ne 0 ] || [ "$run" -eq "$runs" ]; then
                echo "--- server ($src), run $run of $runs:"; cat "$srv"
                echo "--- client ($crc), run $run of $runs:"; cat "$cli"
        fi
        [ $src -eq 0 ] || fail "$prog server exited $src (run $run of $runs)"
        [ $crc -eq 0 ] || fail "$prog client exited $crc (run $run of $runs)"
done
# GID 0: the host's first address (ibv_devinfo -v under diwarp run).
g0=$(timeout 30 "$DIWARP" run ibv_devinfo -v -d diwarp0 2>/dev/null |
        sed -n 's/^[[:space:]]*GID\[ *0\]:[[:space:]]*::ffff:\([0-9.]*\),.*/\1/p')
[ -n "$g0" ] || fail "ibv_devinfo -v shows no GID 0"
for f in "$srv" "$cli"; do
        expect "$f" '^[0-9]+ bytes in [0-9.]+ seconds' "$prog reports its transfer"
        expect "$f" '^[0-9]+ iters in [0-9.]+ seconds' "$prog reports its iterations"
        expect "$f" "local address: .*GID ::ffff:${g0//./\\.}\$" "$prog uses GID 0 ($g0)"
        expect "$f" "remote address: .*GID ::ffff:${g0//./\\.}\$" "$prog sees the peer's GID 0"
done
sq=$(sed -n 's/.*local address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$srv")
cq=$(sed -n 's/.*remote address: .*QPN \(0x[0-9a-f]*\).*/\1/p' "$cli")
[ -n "$sq" ] && [ "$sq" = "$cq" ] || fail "client saw server QPN '$cq', server has '$sq'"
# -t (ibv_rc_pingpong): receives polled from an extended CQ with completion
# timestamps; the gaps it prints between them must be real (non-zero).
case " $* " in
*" -t "*)
        for f in "$srv" "$cli"; do
                expect "$f" '^Min receive completion clock cycles = [1-9][0-9]*$' \
                        "$prog reports timestamped receive completions"
        done
        ;;
esac
echo "ok"
