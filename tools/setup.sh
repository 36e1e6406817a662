#!/usr/bin/env bash
# Installs what diwarp needs from Debian's packages (only what is missing),
# then configures and builds one build directory.
#   tools/setup.sh BUILD_DIR [meson options...]
# Running it again is cheap: installed packages are skipped, meson reconfigures
# only when needed, and ninja rebuilds only what changed.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: tools/setup.sh BUILD_DIR [meson options...]}
shift

packages=(
        build-essential meson ninja-build pkg-config clang libclang-rt-14-dev llvm
        libisal-dev libcriterion-dev liburing-dev libssl-dev
        libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest qperf libfabric-bin iperf3
        python3-pyverbs
        openmpi-bin libopenmpi-dev netpipe-openmpi
        iproute2 procps time valgrind gnuplot-nox
        tshark
)

missing=()
for p in "${packages[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]})); then
        echo "setup: installing ${missing[*]}"
        sudo=()
        if [[ $(id -u) -ne 0 ]]; then
                command -v sudo >/dev/null || {
                        echo "setup: need root or sudo to install: ${missing[*]}" >&2
                        exit 1
                }
                sudo=(sudo)
        fi
        export DEBIAN_FRONTEND=noninteractive
        # tshark's wireshark-common asks whether non-root users may capture:
        # no (dumpcap stays root-only; the capture test runs in a namespace).
        if [[ " ${missing[*]} " == *" tshark "* ]] && command -v debconf-set-selections >/dev/null; then
                echo "wireshark-common wireshark-common/install-setuid boolean false" |
                        "${sudo[@]}" debconf-set-selections
        fi
        "${sudo[@]}" apt-get update -q
        "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cd "$top"
if [[ -f $build/build.ninja ]]; then
        meson configure "$build" "$@" >/dev/null
else
        meson setup "$build" "$@"
fi
ninja -C "$build"
