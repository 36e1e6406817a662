#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with AddressSanitizer and
# UBSan, runs every test, and ends with a line 'N passed, N failed, N skipped'
# (counted from meson's testlog.json: OK and EXPECTEDFAIL pass; SKIP — a test
# that exits 77, e.g. an interop program that is not installed — is skipped;
# everything else, FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS, fails).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${DIWARP_TEST_BUILD:-$top/build-test}

"$top/tools/setup.sh" "$build" -Dsanitize=true -Dtests=true -Db_lundef=false

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

rc=0
# A stale log from an earlier run must not be counted if this one dies early.
rm -f "$build/meson-logs/testlog.json"
meson test -C "$build" --print-errorlogs --num-processes 2 "$@" || rc=$?

python3 - "$build/meson-logs/testlog.json" <<'PY' || rc=1
import json, os, sys
passed = failed = skipped = 0
failures = []
if not os.path.exists(sys.argv[1]):
    print("0 passed, 0 failed, 0 skipped (meson test wrote no log)")
    sys.exit(1)
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
            failures.append(r)
            print("FAILED:", r.get("name"), res)
# Each failed test's own output again, last (its lines that name a failure,
# then its last lines): a log that is cut to its head and tail still shows
# why every test failed.
for r in failures:
    out = ((r.get("stdout") or "") + (r.get("stderr") or "")).splitlines()
    print(f"--- last lines of {r.get('name')} ---")
    lines = [l for l in out if l.strip()]
    marks = ("[FAIL]", "[----]", "Assert", "CRASH", "FAIL:", "Sanitizer", "runtime error")
    why = [l for l in lines if any(m in l for m in marks)][:15]
    for line in why + ["..."] + lines[-15:]:
        print("   ", line[:300])
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
PY
exit $rc
