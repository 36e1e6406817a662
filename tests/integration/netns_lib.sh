# shellcheck shell=bash
# Shared by the namespace tests of this folder (sourced after setting $topo,
# the path of bench/netns-topo.sh): a temporary folder $TMPD, topologies that
# go away however the script ends, fail(), up().
#
# At exit (normal, fail, SIGTERM from meson's timeout, SIGINT, SIGHUP) the
# script's children still running are killed, every topology brought up with
# up() goes down (netns-topo.sh kills what still runs inside), a function
# netns_cleanup_hook runs if the script defines one, and a sanitizer report
# in any file of $TMPD fails the test. Scripts wait for their children with
# `wait`, which a trapped signal interrupts at once; a foreground child would
# hold the trap until it ends. A SIGKILLed script's topologies are removed by
# the next `netns-topo.sh up` (their owner is gone).
set -u
: "${topo:?set topo (bench/netns-topo.sh) before sourcing netns_lib.sh}"
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/netns-test.XXXXXX")
names=()

netns_cleanup() {
        local rc=$? p n
        trap '' TERM INT HUP
        # this script's children not reaped yet (so their PIDs are still theirs)
        for p in $(jobs -p); do
                kill -9 "$p" 2>/dev/null
        done
        for n in "${names[@]}"; do
                "$topo" down "$n" >/dev/null 2>&1
        done
        if declare -F netns_cleanup_hook >/dev/null; then
                netns_cleanup_hook
        fi
        if grep -Elq 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)' \
                "$TMPD"/* 2>/dev/null; then
                echo "FAIL: sanitizer report:" >&2
                grep -l -E 'Sanitizer|runtime error:' "$TMPD"/* | xargs cat >&2
                rc=1
        fi
        rm -rf "$TMPD"
        exit $rc
}
trap netns_cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

fail() {
        echo "FAIL: $*" >&2
        exit 1
}

# up NAME KIND RATE [OPTS...]: brings up a topology owned by this script
# (netns-topo.sh up ... --owner $$) and sets A and B, its addresses. Exits
# with netns-topo.sh's status when it fails: 77 (skip) passes through.
up() {
        "$topo" up "$@" --owner $$ >"$TMPD/topo" 2>"$TMPD/topo.err"
        local rc=$?
        cat "$TMPD/topo" "$TMPD/topo.err"
        [ $rc -eq 0 ] || exit $rc
        names+=("$1")
        A=$(sed -n 's/.* a=\([0-9.]*\) .*/\1/p' "$TMPD/topo")
        B=$(sed -n 's/.* b=\([0-9.]*\) .*/\1/p' "$TMPD/topo")
        if [ -z "$A" ] || [ -z "$B" ]; then fail "no addresses in the TOPO line"; fi
}
