#!/usr/bin/env bash
# Builds MVAPICH2 (2.3.x, from its public source tree) for diwarp, with the
# OSU micro-benchmarks it bundles, into a prefix.
#   tools/build-mvapich2.sh SOURCE_DIR [PREFIX]      (PREFIX: /opt/mvapich2)
# Environment: MAKE_JOBS (default 1), BUILD_DIR (default SOURCE_DIR/build-diwarp).
#
# MVAPICH2 is configured for its verbs channel (ch3:mrail, gen2) with
# librdmacm connection setup and without dlopen()ing libibverbs: by default
# it looks every verb up through its own dlopen() handle, which never
# reaches a provider preloaded by `diwarp run` (it then finds 0 devices).
# The bundled OSU benchmarks do not link with --disable-cxx through
# MVAPICH2's own build (automake links some with the C++ compiler), so they
# are built here with the installed mpicc as both compilers.
# Nothing of MVAPICH2's goes into the diwarp tree; the interop test
# (tests/interop/mvapich.sh) and the bench group `mvapich` (bench/run.py)
# use PREFIX (default /opt/mvapich2). The OSU benchmarks are also built
# against Open MPI (if installed) into PREFIX/openmpi-osu, for the baseline.
set -euo pipefail

src=${1:?usage: tools/build-mvapich2.sh SOURCE_DIR [PREFIX]}
prefix=${2:-/opt/mvapich2}
jobs=${MAKE_JOBS:-1}
src=$(cd "$src" && pwd)
build=${BUILD_DIR:-$src/build-diwarp}

[[ -f $src/configure.ac && -d $src/src/mpid/ch3/channels/mrail ]] || {
        echo "build-mvapich2: $src is not an MVAPICH2 source tree (no configure.ac or src/mpid/ch3/channels/mrail)" >&2
        exit 1
}
[[ -d $src/osu_benchmarks ]] || {
        echo "build-mvapich2: $src has no osu_benchmarks directory" >&2
        exit 1
}

# Debian build dependencies (only what is missing). autoconf/automake/libtool
# are needed when the tree has no generated configure (a git checkout).
packages=(build-essential autoconf automake libtool pkg-config bison flex
        libibverbs-dev librdmacm-dev gfortran python3)
"$(dirname "$0")/install-packages.sh" build-mvapich2 "${packages[@]}"

cd "$src"
if [[ ! -x configure ]]; then
        echo "build-mvapich2: generating configure (autogen.sh)"
        ./autogen.sh
fi

mkdir -p "$build"
cd "$build"
if [[ ! -f Makefile ]]; then
        # GCC 10+ rejects the Fortran bindings' argument mismatches unless told.
        "$src/configure" --prefix="$prefix" \
                --with-device=ch3:mrail --with-rdma=gen2 \
                --enable-rdma-cm --disable-ibv-dlopen \
                --disable-cxx --enable-fortran=no \
                --disable-mcast --disable-omb \
                CFLAGS="-O2 -fcommon" FFLAGS="-fallow-argument-mismatch" \
                FCFLAGS="-fallow-argument-mismatch"
fi
# The collective tuning tables (src/mpi/coll/*_tuning.c, 10-150 KB each) are
# functions that fill large arrays once at MPI_Init; gcc -O2 spends over ten
# minutes on each of the big ones on a 2-core host, -O0 about fifteen
# seconds, and the code runs once. Build those objects first at -O0.
tuning=()
for f in "$src"/src/mpi/coll/*_tuning.c; do
        b=$(basename "$f" .c)
        tuning+=("src/mpi/coll/lib_libmpi_la-$b.lo")
done
if ((${#tuning[@]})); then
        make -j"$jobs" "${tuning[@]}" CFLAGS="-O0 -fcommon" ||
                echo "build-mvapich2: the tuning tables did not build ahead at -O0; the main build makes them (slowly)" >&2
fi
make -j"$jobs"
make install

# OSU micro-benchmarks, built stand-alone with the installed compiler wrapper
# (MVAPICH2's embedded build of them is disabled above: it does not link
# without the C++ bindings).
osu=$src/osu_benchmarks
osu_build=$build/osu
mkdir -p "$osu_build"
cd "$osu_build"
if [[ ! -f Makefile ]]; then
        (cd "$osu" && [[ -x configure ]] || autoreconf -fi)
        # Automake links some collective benchmarks with CXX: the C wrapper
        # links them (MVAPICH2 has no mpicxx here, and the system's mpicxx is
        # Open MPI's).
        "$osu/configure" --prefix="$prefix" CC="$prefix/bin/mpicc" CXX="$prefix/bin/mpicc"
fi
make -j"$jobs"
make install
pt2pt=$prefix/libexec/osu-micro-benchmarks/mpi/pt2pt
for b in osu_latency osu_bw osu_bibw; do
        [[ -x $pt2pt/$b ]] || {
                echo "build-mvapich2: $pt2pt/$b missing after the OSU build" >&2
                exit 1
        }
done
echo "build-mvapich2: MVAPICH2 in $prefix, OSU benchmarks in $pt2pt"

# The same benchmarks against Debian's Open MPI, when it is installed: the
# baseline of bench/run.py's group `mvapich` (Open MPI ob1/tcp in the same
# run), in PREFIX/openmpi-osu.
if command -v mpicc.openmpi >/dev/null 2>&1; then
        ompi_build=$build/osu-openmpi
        mkdir -p "$ompi_build"
        cd "$ompi_build"
        [[ -f Makefile ]] ||
                "$osu/configure" --prefix="$prefix/openmpi-osu" CC="$(command -v mpicc.openmpi)" \
                        CXX="$(command -v mpicc.openmpi)"
        make -j"$jobs"
        make install
        echo "build-mvapich2: OSU benchmarks for Open MPI in $prefix/openmpi-osu"
else
        echo "build-mvapich2: no mpicc.openmpi (Debian libopenmpi-dev): no Open MPI OSU baseline"
fi
