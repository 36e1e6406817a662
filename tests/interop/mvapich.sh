#!/bin/bash
# MVAPICH2 over diwarp between two namespace hosts joined by veth:
#   mvapich.sh MODE
# MODE: rc  RC over TCP, MVAPICH2's librdmacm connection setup
#           (MV2_USE_RDMA_CM=1 MV2_USE_IWARP_MODE=1);
#       rd  the same over RC over RD (DIWARP_RC_TRANSPORT=rd);
#       fpdu  as rc, with FPDUs of up to 16 KiB that span TCP segments
#           (DIWARP_RC_FPDU=16384; the veth's MTU is 1500);
#       ib  RC over TCP, MVAPICH2's default, InfiniBand-style setup
#           (MV2_USE_RDMA_CM=0: QP numbers and GIDs exchanged through the
#           process manager, then ibv_modify_qp; it also connects one QP of
#           each rank to itself).
# MVAPICH2 is built by tools/build-mvapich2.sh into $MVAPICH2_PREFIX (default
# /opt/mvapich2) and run with the settings of docs/USAGE.md ("MVAPICH2");
# Hydra's mpiexec runs in host A (namespace diwarp-mv2A-PID, 10.78.X.1)
# under `diwarp run`, its rsh launcher is tools/mpi-netns-agent, one rank in
# host A and one in host B (diwarp-mv2B-PID, 10.78.X.2). Each host has its
# own hostname and an /etc/netns/NS/hosts naming it, so that gethostid()
# tells the hosts apart, and its address in a DIR/mv2.conf for the rdma_cm
# setup. Twice: with the device pinned to the host's address
# (`diwarp run --addr`) and unpinned (the device takes the namespace's
# addresses, as a NIC).
# Checks, each time:
#  1. osu_latency, osu_bw and osu_bibw with validation (-c), every power of
#     two from 1 B to 4 MiB: each size reported and "Pass", exit 0;
#  2. diwarp carried it: the ranks' device log shows RC QPs connected
#     between A's and B's addresses (over RD in mode rd; in mode ib also a
#     QP connected to itself);
# and once (mode rc): the same job without diwarp finds no device and fails.
# Exit 77 (skipped, with the reason) without root / ip netns, or without
# MVAPICH2 and its OSU benchmarks in the prefix.
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: mvapich.sh rc|rd|ib|fpdu}
fpdu=0
case $mode in
rc) rc_transport=tcp use_cm=1 ;;
rd) rc_transport=rd use_cm=1 ;;
ib) rc_transport=tcp use_cm=0 ;;
fpdu) rc_transport=tcp use_cm=1 fpdu=16384 ;;
*) fail "unknown mode '$mode' (rc, rd, ib or fpdu)" ;;
esac

prefix=${MVAPICH2_PREFIX:-/opt/mvapich2}
osu=$prefix/libexec/osu-micro-benchmarks/mpi/pt2pt
[ -x "$prefix/bin/mpiexec.hydra" ] ||
        skip "MVAPICH2 not installed in $prefix (tools/build-mvapich2.sh SOURCE $prefix; meson option mvapich2_prefix)"
for b in osu_latency osu_bw osu_bibw; do
        [ -x "$osu/$b" ] || skip "no $b in $osu (tools/build-mvapich2.sh builds the OSU benchmarks)"
done
ns_require "MVAPICH2 namespace test" # lib.sh
command -v unshare >/dev/null 2>&1 || skip "unshare (util-linux) not installed"
top=$(cd "$(dirname "$0")/../.." && pwd)
agent=$top/tools/mpi-netns-agent
[ -x "$agent" ] || fail "no rsh agent at $agent"

nsA=diwarp-mv2A-$$
nsB=diwarp-mv2B-$$
X=$(($$ % 250 + 1))
A=10.78.$X.1
B=10.78.$X.2

cleanup() {
        rc=$?
        rm -rf "/etc/netns/$nsA" "/etc/netns/$nsB"
        ns_finish $rc "$nsA" "$nsB" # lib.sh
}
trap cleanup EXIT
exit_traps # lib.sh

# Namespaces (and their /etc/netns files) of earlier runs killed outright.
ns_reap_stale '^diwarp-mv2[AB]-[0-9]+$' # lib.sh
for d in /etc/netns/diwarp-mv2[AB]-*; do
        [ -d "$d" ] && ! kill -0 "${d##*-}" 2>/dev/null && rm -rf "$d"
done

ns_pair "$nsA" "$nsB" "$A" "$B" 2>"$TMPD/setup" || { cat "$TMPD/setup" >&2; skip "cannot create network namespaces / veth here"; }
for h in "$nsA $A" "$nsB $B"; do
        set -- $h
        mkdir -p "/etc/netns/$1"
        printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$A" "$nsA" "$B" "$nsB" >"/etc/netns/$1/hosts"
        # The host's address for MVAPICH2's rdma_cm setup (DIR/mv2.conf,
        # MV2_RDMA_CM_CONF_FILE_PATH=DIR, handed to each host's ranks by the
        # agent's map; docs/USAGE.md says why it is needed).
        mkdir -p "$TMPD/$1" && echo "$2" >"$TMPD/$1/mv2.conf"
done

export TMPDIR=$TMPD
export MV2_USE_RDMA_CM=$use_cm MV2_USE_IWARP_MODE=$use_cm MV2_ENABLE_AFFINITY=0 MV2_FORCE_HCA_TYPE=5
unset MV2_IBA_HCA # see docs/USAGE.md, MVAPICH2: with it set MVAPICH2 2.3.7 reads past its device list
unset MV2_RDMA_CM_CONF_FILE_PATH

# mv2_A OUT diwarp|plain PINNED(1|0) PROGRAM ARGS...: mpiexec in host A,
# rank 0 in A and rank 1 in B, under `diwarp run` (pinned: --addr and the
# agent's map gives each host its device address) or plain; bounded. The
# ranks take their environment from their host's proxy (-genvnone): Hydra
# would otherwise hand A's DIWARP_ADDR to B's rank too.
mv2_A() {
        out=$1
        how=$2
        pinned=$3
        shift 3
        if [ "$pinned" = 1 ]; then
                devA=$A devB=$B
        else
                devA=- devB=-
        fi
        printf '%s %s %s MV2_RDMA_CM_CONF_FILE_PATH=%s\n' "$A" "$nsA" "$devA" "$TMPD/$nsA" \
                "$B" "$nsB" "$devB" "$TMPD/$nsB" >"$TMPD/hosts"
        pre=()
        if [ "$how" = diwarp ]; then
                pre=("$DIWARP" run)
                [ "$pinned" = 0 ] || pre+=(--addr "$A")
                pre+=(--)
        fi
        timeout 150 ip netns exec "$nsA" unshare --uts \
                sh -c 'hostname "$1" && shift && cd "$TMPDIR" && exec "$@"' sh "$nsA" \
                env -u DIWARP_ADDR DIWARP_MPI_HOSTS="$TMPD/hosts" DIWARP_LOG=info \
                MV2_RDMA_CM_CONF_FILE_PATH="$TMPD/$nsA" \
                DIWARP_RC_TRANSPORT=$rc_transport DIWARP_RC_FPDU=$fpdu "${pre[@]}" \
                "$prefix/bin/mpiexec.hydra" -launcher rsh -launcher-exec "$agent" -genvnone \
                -hosts "$A:1,$B:1" -n 2 "$@" >"$out" 2>&1
}

# osu_check OUT NAME: every power of two 1 B .. 4 MiB reported, positive,
# and validated ("Pass"); no "Fail".
osu_check() {
        awk -v what="$2" '
            $1 ~ /^[0-9]+$/ && NF >= 3 {
                if ($3 != "Pass") bad = bad " " $1 ":" $3
                # a latency is positive; a bandwidth may print 0.00 when a
                # window of 2-byte messages takes tens of ms (a loaded host)
                if ($2 !~ /^[0-9]+(\.[0-9]+)?$/ || (what ~ /latency/ && !($2 > 0))) bad = bad " " $1 ":value " $2
                seen[$1] = 1
            }
            END {
                for (s = 1; s <= 4194304; s *= 2) if (!(s in seen)) bad = bad " " s ":missing"
                if (bad != "") { print what ":" bad; exit 1 }
            }' "$1" || { cat "$1" >&2; fail "$2: sizes missing or not validated"; }
}

# Mode ib runs pinned only. MVAPICH2 2.3.7 picks the GID of an Ethernet-
# type port from its sysfs "types" files, and its loop keeps the last
# "RoCE v2" entry it reads rather than the first; an unpinned device's table
# ends with 127.0.0.1 (docs/USAGE.md, "MVAPICH2"), so the peer would be told
# to connect to its own loopback. A pinned device has one GID.
pins="1 0"
[ $mode != ib ] || pins=1
for pinned in $pins; do
        tag=$([ $pinned = 1 ] && echo pinned || echo unpinned)
        # window and iterations kept small: validation checks every byte
        for b in "osu_latency -i 20 -x 2" "osu_bw -i 4 -x 1 -W 8" "osu_bibw -i 4 -x 1 -W 8"; do
                set -- $b
                out=$TMPD/$1.$tag.out
                mv2_A "$out" diwarp $pinned "$osu/$1" -c -m 1:4194304 "${@:2}"
                r=$?
                echo "--- $1 ($tag, $mode): exit $r"
                grep -Ev '^diwarp: ' "$out" | head -40
                [ $r -eq 0 ] || { cat "$out" >&2; fail "$1 over diwarp ($tag, $mode) exited $r"; }
                osu_check "$out" "$1 ($tag, $mode)"
                if [ $mode = rd ]; then
                        expect "$out" "RC QP 0x[0-9a-f]+ connected over RD to $B:" \
                                "$1 ($tag): a QP of A connects over RD to B"
                        expect "$out" "RC QP 0x[0-9a-f]+ connected over RD to $A:" \
                                "$1 ($tag): a QP of B connects over RD to A"
                else
                        [ $mode != ib ] || expect "$out" "RC QP (0x[0-9a-f]+) connected to [0-9.:]+ \(peer QP \1," \
                                "$1 ($tag): each rank's QP to itself (IB-style setup)"
                        expect "$out" "RC QP 0x[0-9a-f]+ connected to $B:" \
                                "$1 ($tag): a QP of A connects to B over diwarp"
                        expect "$out" "RC QP 0x[0-9a-f]+ connected to $A:" \
                                "$1 ($tag): a QP of B connects to A over diwarp"
                        ! grep -q "connected over RD" "$out" || fail "RC over TCP mode connected over RD"
                        [ $mode != fpdu ] || expect "$out" "RC QP 0x[0-9a-f]+ connected to $B:.*MULPDU 16378\)" \
                                "$1 ($tag): A's QP to B sends FPDUs of 16 KiB (DIWARP_RC_FPDU)"
                        [ $mode != fpdu ] || expect "$out" "RC QP 0x[0-9a-f]+ connected to $A:.*MULPDU 16378\)" \
                                "$1 ($tag): B's QP to A sends FPDUs of 16 KiB (DIWARP_RC_FPDU)"
                fi
        done
done

# Without diwarp there is no verbs device: the job cannot run.
if [ $mode = rc ]; then
        neg=$TMPD/plain.out
        mv2_A "$neg" plain 1 "$osu/osu_latency" -c -m 1:1
        r=$?
        echo "--- osu_latency without diwarp: exit $r"
        tail -5 "$neg"
        [ $r -ne 0 ] || fail "mpiexec without diwarp exited 0 (want a failure)"
        ! grep -Eq '^1 +[0-9.]+ +Pass' "$neg" || fail "the job ran without diwarp"
fi
echo "ok"
