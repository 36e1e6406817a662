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

"$top/tools/install-packages.sh" setup "${packages[@]}"

cd "$top"
if [[ -f $build/build.ninja ]]; then
        meson configure "$build" "$@" >/dev/null
else
        meson setup "$build" "$@"
fi
ninja -C "$build"
