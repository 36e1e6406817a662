#!/usr/bin/env bash
# Runs every libFuzzer target (clang, ASan + UBSan) for SECONDS each (default 60).
#   tools/fuzz.sh [SECONDS] [TARGET...]
# DIWARP_FUZZ_BUILD names the build directory (default build-fuzz).
# New inputs go to a scratch directory; inputs that add coverage are merged into
# the committed corpus only with --merge. Crashes are written to build-fuzz/.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
merge=0
args=()
for a in "$@"; do
        if [[ $a == --merge ]]; then merge=1; else args+=("$a"); fi
done
seconds=${args[0]:-60}
targets=("${args[@]:1}")
if ((${#targets[@]} == 0)); then
        targets=(ddp rdmap mpa_fpdu mpa_frame dgram rc_rx ipc_req daemon)
fi

build=${DIWARP_FUZZ_BUILD:-$top/build-fuzz}
CC=clang "$top/tools/setup.sh" "$build" -Dfuzz=true -Dsanitize=true -Db_lundef=false

status=0
for t in "${targets[@]}"; do
        corpus=$top/tests/fuzz/corpus/$t
        scratch=$build/fuzz-scratch/$t
        mkdir -p "$scratch"
        echo "== fuzz_$t for ${seconds}s"
        if ! (cd "$build" && "./tests/fuzz/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 \
                "$scratch" "$corpus" 2>&1 | grep -E 'stat::number_of_executed_units|stat::new_units_added|ERROR|SUMMARY|Done' ); then
                :
        fi
        if ls "$build"/crash-* "$build"/leak-* "$build"/timeout-* >/dev/null 2>&1; then
                echo "fuzz_$t: found failing inputs in $build" >&2
                status=1
        fi
        if ((merge)); then
                "$build/tests/fuzz/fuzz_$t" -merge=1 "$corpus" "$scratch" >/dev/null 2>&1
        fi
done
exit $status
