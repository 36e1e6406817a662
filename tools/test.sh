#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with AddressSanitizer and
# UBSan, runs every test, and ends with a line 'N passed, N failed'.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${DIWARP_TEST_BUILD:-$top/build-test}

"$top/tools/setup.sh" "$build" -Dsanitize=true -Dtests=true -Db_lundef=false

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

rc=0
meson test -C "$build" --print-errorlogs --num-processes 2 "$@" || rc=$?

python3 - "$build/meson-logs/testlog.json" <<'PY' || rc=1
import json, sys
passed = failed = skipped = 0
with open(sys.argv[1]) as f:
    for line in f:
        r = json.loads(line)
        res = r.get("result")
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
        else:
            failed += 1
            print("FAILED:", r.get("name"), res)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
PY
exit $rc
