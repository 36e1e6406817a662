#!/usr/bin/env bash
# rdma-core's own test suite (Debian python3-pyverbs, its tests under
# /usr/share/doc/rdma-core/tests) under `diwarp run --dev diwarp0`: every test
# that is not vendor-specific (mlx5, efa, CUDA) in a process of its own, so
# that one crash cannot hide the rest. It passes when no test crashes, hangs,
# errs or fails; the skips are listed with their reasons in
# verbs-provider/README.md ("rdma-core's test suite").

# Its rdma_cm tests listen on fixed ports. As root the suite runs in a network
# namespace of its own, so both variants run at once and beside other tests;
# without one, a lock file keeps two runs of the suite apart. The namespace
# has a veth pair with a documentation address (192.0.2.1/24) as well as its
# loopback, as a host has an interface: with only 127.0.0.1, the suite's
# rdma_cm tests crash inside pyverbs (SIGSEGV in its device module).
if [ -z "${DIWARP_SUITE_NETNS:-}" ] && [ "$(id -u)" = 0 ] &&
        unshare -n true 2>/dev/null; then
        export DIWARP_SUITE_NETNS=1
        exec unshare -n bash -c 'ip link set lo up &&
                ip link add dwsuite0 type veth peer name dwsuite1 &&
                ip addr add 192.0.2.1/24 dev dwsuite0 &&
                ip link set dwsuite1 up && ip link set dwsuite0 up &&
                exec bash "$0" "$@"' "$0" "$@"
fi
if [ -z "${DIWARP_SUITE_NETNS:-}" ] &&
        exec 9>>"${TMPDIR:-/tmp}/diwarp-rdma-core-suite.$(id -u).lock"; then
        flock 9
fi
. "$(dirname "$0")/lib.sh"

src=/usr/share/doc/rdma-core/tests
py=/usr/bin/python3 # pyverbs is a Debian package: the system interpreter
[ -f "$src/run_tests.py" ] && "$py" -c 'import pyverbs' 2>/dev/null ||
        { echo "SKIP: python3-pyverbs not installed" >&2; exit 77; }

suite=$TMPD/suite
mkdir -p "$suite"
cp -r "$src" "$suite/"
gunzip -f "$suite"/tests/*.gz
cd "$suite/tests" || fail "no copy of the suite"
"$py" run_tests.py --list-tests 2>/dev/null | grep -vE 'mlx5|efa|cuda' >"$TMPD/list" ||
        fail "run_tests.py --list-tests failed"
total=$(wc -l <"$TMPD/list")
[ "$total" -gt 100 ] || fail "only $total tests listed"

# A test that fails is shown and run once more: some of the suite's
# rdma_cm tests race their two processes against each other (the reply to a
# Send may come before the peer posted its receive, with rnr_retry 0), which
# a loaded machine loses now and then; a failure that comes back counts.
ok=0 skip=0 bad=0 again=0
run1() { # test log -> sets rc
        timeout 120 "$DIWARP" run -- "$py" run_tests.py --dev diwarp0 -v "$1" >"$2" 2>&1
        rc=$?
}
while read -r t; do
        log=$TMPD/$t.log
        run1 "$t" "$log"
        if [ $rc -ne 0 ] || ! grep -qE '^OK( \(skipped|$)' "$log"; then
                echo "--- $t: exit $rc; running it once more" >&2
                tail -20 "$log" >&2
                mv "$log" "$log.first"
                run1 "$t" "$log"
                again=$((again + 1))
        fi
        if [ $rc -eq 0 ] && grep -q '^OK (skipped' "$log"; then
                skip=$((skip + 1))
                continue
        fi
        if [ $rc -eq 0 ] && grep -q '^OK$' "$log"; then
                ok=$((ok + 1))
                continue
        fi
        bad=$((bad + 1))
        echo "--- $t: exit $rc (second run)" >&2
        tail -20 "$log" >&2
done <"$TMPD/list"
echo "rdma-core tests: $total run, $ok ok, $skip skipped, $bad failed ($again run twice)"
[ $bad -eq 0 ] || fail "$bad rdma-core test(s) failed, erred, crashed or hung"
[ $ok -ge 40 ] || fail "only $ok tests passed"
