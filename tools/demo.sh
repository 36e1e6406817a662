#!/usr/bin/env bash
# Builds diwarp (tools/setup.sh build-demo -Dtests=false) and runs the example
# programs server + client over UD on loopback with --validate, printing their
# RESULT lines. Exits non-zero if any run does not end with status=ok.
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

if ((status)); then
        echo "demo: FAILED" >&2
else
        echo "demo: all runs status=ok"
fi
exit $status
