# Shared helpers of the interop tests (sourced). The tests run unmodified
# rdma-core programs under `diwarp run` and check what they print.
# $DIWARP: the diwarp command of the build under test (set by meson).
set -u

: "${DIWARP:?DIWARP must name the diwarp command of the build}"
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/diwarp-interop.XXXXXX")
trap 'rm -rf "$TMPD"' EXIT

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

# A TCP port nobody listens on now, for the pingpongs' side channel.
free_port() {
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# listening PORT: true once a TCP socket listens on PORT (read from /proc, so
# nothing connects to the server and steals its one side-channel accept).
listening() {
        hex=$(printf '%04X' "$1")
        awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
                /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
