# Shared helpers of the interop tests (sourced). The tests run unmodified
# rdma-core programs under `diwarp run` and check what they print.
# $DIWARP: the diwarp command of the build under test (set by meson).
set -u

: "${DIWARP:?DIWARP must name the diwarp command of the build}"
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/diwarp-interop.XXXXXX")

# sanitizer_check: fails the test when a program's output (every file in
# $TMPD) holds an AddressSanitizer / UBSan report. Under `diwarp run` the
# provider is ASan-instrumented (-Dsanitize=true) inside an uninstrumented
# program: a report goes to the program's stderr, which the scripts capture,
# and the program aborts (tools/test.sh: abort_on_error=1) or exits 1 (ASan's
# default exitcode) — which a script that accepts some nonzero exit, or stops
# a server instead of awaiting it, could miss. So every script checks, at exit.
sanitizer_check() {
        local f
        f=$(grep -El 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)' \
                "$TMPD"/* 2>/dev/null) || return 0
        for x in $f; do
                echo "--- sanitizer report in ${x##*/}:" >&2
                cat "$x" >&2
        done
        echo "FAIL: sanitizer report" >&2
        return 1
}
trap 'rc=$?; sanitizer_check || rc=1; rm -rf "$TMPD"; exit $rc' EXIT

fail() {
        echo "FAIL: $*" >&2
        exit 1
}

# Exit 77 (meson: skipped) when a program is not installed.
need() {
        command -v "$1" >/dev/null 2>&1 || { echo "SKIP: $1 not installed" >&2; exit 77; }
}

# expect FILE PATTERN DESCRIPTION: an extended regex must match a line of FILE.
expect() {
        grep -Eq -- "$2" "$1" || { echo "--- $1:" >&2; cat "$1" >&2; fail "$3"; }
}

# free_port: a port that nothing holds now over TCP (not even in TIME_WAIT:
# the probe does not set SO_REUSEADDR) nor UDP, for a server's side channel or
# rdma_cm port. Drawn at random from 22000..32767: above the diwarp device
# ports (DIWARP_PORT_BASE 17471 + instance) and below the kernel's ephemeral
# range, so neither a device nor the source port of some connect() of a
# concurrent test run takes it before the server binds it. A server that
# still loses it is retried on another port (serve below).
free_port() {
        python3 -c '
import random, socket
for _ in range(200):
    p = random.randint(22000, 32767)
    try:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("0.0.0.0", p))
    except OSError:
        continue
    print(p)
    break
else:
    raise SystemExit("no free port in 22000..32767")
'
}

# perftest's result rows. A latency row: bytes iterations t_min t_max
# t_typical t_avg t_stdev p99 p99.9. perftest squares each sample's deviation
# from the mean into an int, which overflows once samples stray 46 341 us or
# more (stalls of a busy host), and then prints t_stdev as -nan: perftest's
# arithmetic, not a lost message, so the row counts, in that column only.
PERFTEST_LAT_ROW='^ *[0-9]+([[:space:]]+[0-9.]+){5}[[:space:]]+(-?nan|[0-9.]+)([[:space:]]+[0-9.]+){2}'
# A bandwidth row: bytes iterations BW-peak BW-average MsgRate.
PERFTEST_BW_ROW='^ *[0-9]+([[:space:]]+[0-9.]+){4}'

# port_lock PORT: for a program whose port is fixed (udaddy: 7174), holds a
# machine-wide lock for the rest of this script so concurrent test runs take
# turns, then waits until nothing else listens on PORT.
port_lock() {
        exec 9>"/tmp/diwarp-test-port-$1.lock"
        flock -w 100 9 || fail "port $1 stayed locked by another test run for 100 s"
        i=0
        while listening "$1"; do
                i=$((i + 1))
                [ $i -lt 100 ] || fail "port $1 (fixed by the program) is held by another process"
                sleep 0.1
        done
}

# serve: starts the server command in the array S, where the word @PORT@
# stands for the port, in the background (output in $srv, PID in $spid), and
# waits until it listens (or, with serve_ready=udp_bound, until it holds its
# UDP port). The port is $fixed_port if set, else a free_port
# (then also left in $port, to build the client's command with). A server that
# exits before it listens (its port was taken after all) is retried on a new
# port, three times in all.
serve() {
        local attempt i
        for attempt in 1 2 3; do
                port=${fixed_port:-$(free_port)} || fail "no free port"
                timeout 60 "$@" "${S[@]//@PORT@/$port}" >"$srv" 2>&1 &
                spid=$!
                i=0
                while kill -0 $spid 2>/dev/null; do
                        ${serve_ready:-listening} "$port" && return 0
                        i=$((i + 1))
                        [ $i -lt 150 ] || { kill $spid 2>/dev/null; cat "$srv" >&2; fail "server never listened"; }
                        sleep 0.1
                done
                wait $spid
                echo "--- server exited $? before listening on port $port (attempt $attempt):" >&2
                cat "$srv" >&2
        done
        fail "server died before listening"
}

# listening PORT: true once a TCP socket listens on PORT (read from /proc, so
# nothing connects to the server and steals its one side-channel accept).
listening() {
        hex=$(printf '%04X' "$1")
        awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
                /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# udp_bound PORT: true once a UDP socket is bound to PORT (a datagram server,
# e.g. udpong, has no listening TCP socket).
udp_bound() {
        hex=$(printf '%04X' "$1")
        awk -v p=":$hex" 'substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
                /proc/net/udp /proc/net/udp6 2>/dev/null
}

# skip REASON: the test cannot run here (exit 77: meson counts it skipped).
skip() {
        echo "SKIP: $*" >&2
        exit 77
}

# ns_require WHAT: root and iproute2 for namespace hosts, else WHAT is skipped.
ns_require() {
        [ "$(id -u)" -eq 0 ] || skip "$1: root needed (ip netns + veth)"
        command -v ip >/dev/null 2>&1 || skip "ip (iproute2) not installed"
}

# exit_traps: a signal (meson's timeout sends SIGTERM) leaves through the
# script's EXIT trap, which cleans up.
exit_traps() {
        trap 'exit 143' TERM
        trap 'exit 130' INT
        trap 'exit 129' HUP
}

# ns_finish RC NS...: the end of a namespace test (its EXIT trap): deletes
# NS... with whatever still runs in them, fails on a sanitizer report, removes
# $TMPD and exits RC (1 after a report).
ns_finish() {
        local rc=$1
        shift
        ns_teardown "$@"
        sanitizer_check || rc=1
        rm -rf "$TMPD"
        exit "$rc"
}

# ns_pair NS_A NS_B ADDR_A ADDR_B: two network namespaces standing for two
# hosts, joined by a veth pair (vethA in NS_A with ADDR_A/24, vethB in NS_B
# with ADDR_B/24), loopback up in both. Nonzero, with the error on stderr,
# where namespaces or veth pairs cannot be made.
ns_pair() {
        ip netns add "$1" && ip netns add "$2" &&
                ip link add name vethA netns "$1" type veth peer name vethB netns "$2" &&
                ip -n "$1" addr add "$3/24" dev vethA && ip -n "$2" addr add "$4/24" dev vethB &&
                ip -n "$1" link set lo up && ip -n "$2" link set lo up &&
                ip -n "$1" link set vethA up && ip -n "$2" link set vethB up
}

# ns_listening NS PORT: a TCP socket listens on PORT inside NS.
ns_listening() {
        hex=$(printf '%04X' "$2")
        ip netns exec "$1" awk -v p=":$hex" \
                '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
                /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# ns_reap_stale REGEX: deletes the namespaces of earlier runs that were
# killed outright (SIGKILL skips their trap): names matching REGEX that end
# in a PID which no longer exists.
ns_reap_stale() {
        for ns in $(ip netns list 2>/dev/null | awk -v re="$1" '$1 ~ re { print $1 }'); do
                kill -0 "${ns##*-}" 2>/dev/null || ip netns del "$ns" 2>/dev/null
        done
}

# ns_teardown NS...: kills whatever still runs inside these namespaces
# (started by this run), then deletes them.
ns_teardown() {
        local ns pids
        for ns in "$@"; do
                pids=$(ip netns pids "$ns" 2>/dev/null)
                [ -z "$pids" ] || kill -9 $pids 2>/dev/null
        done
        for ns in "$@"; do
                ip netns del "$ns" 2>/dev/null
        done
}
