#!/usr/bin/env bash
# Builds diwarp (tools/setup.sh build-demo -Dtests=false), runs the native
# example programs (UD, RC, RD) server + client on loopback with --validate,
# then unmodified rdma-core, perftest and rdmacm-utils programs under
# `diwarp run`, and two of them again as clients of the host daemon
# (`diwarp run --daemon`). Exits non-zero if any run fails.
#   tools/demo.sh [BUILD_DIR]
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build-demo}
if ! log=$("$top/tools/setup.sh" "$build" -Dtests=false 2>&1); then
        echo "$log" | tail -n 30 >&2
        echo "demo: build failed" >&2
        exit 1
fi

port=$((20000 + RANDOM % 20000))
status=0

# run NAME PROGRAM CLIENT-ARGS...: server in the background, client in front.
run() {
        local name=$1 prog=$2
        shift 2
        local out
        out=$(mktemp)
        timeout 60 "$build/examples/$prog" --port "$port" >"$out" 2>&1 &
        local spid=$!
        sleep 0.2
        local cres sres
        cres=$(timeout 60 "$build/examples/$prog" --port "$port" "$@" 127.0.0.1 2>&1 | tail -n 1) || true
        wait "$spid" || true
        sres=$(tail -n 1 "$out")
        rm -f "$out"
        echo "== $name"
        echo "client: $cres"
        echo "server: $sres"
        [[ $cres == *status=ok* && $sres == *status=ok* ]] || status=1
        port=$((port + 1))
}

run "pingpong UD send 64 B" diwarp-pingpong --transport ud --size 64 --iters 2000 --validate
run "pingpong UD send 4 KiB" diwarp-pingpong --transport ud --size 4096 --iters 1000 --validate
run "bw UD send 8 KiB" diwarp-bw --transport ud --size 8192 --iters 5000 --validate
run "bw UD send 64 KiB (max UD)" diwarp-bw --transport ud --size 65431 --iters 1000 --validate
run "pingpong RC RDMA Write 4 KiB" diwarp-pingpong --transport rc --op write --size 4096 --iters 1000 --validate
run "pingpong RD send 4 KiB" diwarp-pingpong --transport rd --size 4096 --iters 1000 --validate

# Unmodified rdma-core, rdmacm-utils and perftest programs, through `diwarp run`.
diwarp=$build/tools/diwarp
# unmodified NAME SUCCESS-REGEX SERVER-CMD... -- CLIENT-CMD...
unmodified() {
        local name=$1 want=$2
        shift 2
        local srv=() cli=()
        while [[ $1 != -- ]]; do srv+=("$1"); shift; done
        shift
        cli=("$@")
        local sout cout
        sout=$(mktemp)
        cout=$(mktemp)
        timeout 60 "$diwarp" run ${through_daemon:+--daemon} -- "${srv[@]}" >"$sout" 2>&1 &
        local spid=$!
        sleep 0.5
        local crc=0 src=0
        timeout 60 "$diwarp" run ${through_daemon:+--daemon} -- "${cli[@]}" >"$cout" 2>&1 || crc=$?
        wait "$spid" || src=$?
        echo "== $name (unmodified, under diwarp run${through_daemon:+ --daemon})"
        grep -E "$want" "$cout" | tail -n 3
        if ((crc || src)) || ! grep -qE "$want" "$cout"; then
                echo "client exit $crc, server exit $src" >&2
                tail -n 5 "$sout" "$cout" >&2
                status=1
        fi
        rm -f "$sout" "$cout"
        port=$((port + 1))
}

echo "== ibv_devinfo (unmodified, under diwarp run)"
if ! "$diwarp" run -- ibv_devinfo | grep -E "hca_id|transport|state|link_layer"; then
        status=1
fi
unmodified "ibv_rc_pingpong" "usec/iter" \
        ibv_rc_pingpong -g 0 -p "$port" -- ibv_rc_pingpong -g 0 -p "$port" 127.0.0.1
unmodified "ibv_ud_pingpong" "usec/iter" \
        ibv_ud_pingpong -g 0 -p "$port" -- ibv_ud_pingpong -g 0 -p "$port" 127.0.0.1
unmodified "ib_write_lat (perftest)" "^ *2 +[0-9]+" \
        ib_write_lat -d diwarp0 -x 0 -n 1000 -p "$port" -- \
        ib_write_lat -d diwarp0 -x 0 -n 1000 -p "$port" 127.0.0.1
unmodified "rping (rdmacm-utils)" "ping data" \
        rping -s -a 127.0.0.1 -p "$port" -V -C 5 -- rping -c -a 127.0.0.1 -p "$port" -V -v -C 5

# The same programs as clients of the host daemon (diwarpd owns the sockets
# and makes progress for them), on a private socket.
daemon_dir=$(mktemp -d)
export DIWARP_DAEMON_SOCKET=$daemon_dir/diwarpd.sock
if "$diwarp" daemon start; then
        through_daemon=1
        unmodified "ibv_rc_pingpong" "usec/iter" \
                ibv_rc_pingpong -g 0 -p "$port" -- ibv_rc_pingpong -g 0 -p "$port" 127.0.0.1
        unmodified "rping (rdmacm-utils)" "ping data" \
                rping -s -a 127.0.0.1 -p "$port" -V -C 5 -- \
                rping -c -a 127.0.0.1 -p "$port" -V -v -C 5
        unset through_daemon
        echo "== diwarp stat"
        "$diwarp" stat | head -n 2
        "$diwarp" daemon stop || status=1
else
        status=1
fi
rm -rf "$daemon_dir"

if ((status)); then
        echo "demo: FAILED" >&2
else
        echo "demo: all runs status=ok"
fi
exit $status
