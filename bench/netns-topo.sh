#!/bin/bash
# Network namespaces with a bottleneck, for bench-flows (congestion control of
# RD) and for tests. See bench/README.md, "bench-flows and netns-topo.sh".
#
#   netns-topo.sh up NAME router RATE [--latency 2ms] [--burst 64kb] [--mtu 1500] [--both]
#                                     [--owner PID|none]
#       NAME-A -- NAME-R -- NAME-B: A = 10.X.1.1/24, B = 10.X.2.2/24, R (10.X.1.254,
#       10.X.2.254) forwards; tbf RATE on R's egress towards B (--both: towards
#       A too). --latency is tbf's queue limit (the longest a packet may wait).
#   netns-topo.sh up NAME direct RATE [--latency 3ms] [--burst 64kb] [--mtu 1500]
#                                     [--owner PID|none]
#       NAME-A -- NAME-B on one veth pair (A = 10.X.1.1/16, B = 10.X.2.2/16), a tbf
#       on each end's egress: a local queue in front of the link.
#   netns-topo.sh up NAME rails RATE1[,RATE2[,RATE3[,RATE4]]] [--latency 3ms[,L2..]]
#                                     [--burst 64kb[,B2..]] [--mtu 1500] [--owner PID|none]
#       NAME-A -- NAME-B on one veth pair per rate ("rail" k = 1..4, device
#       railk on both sides): A = 10.X.k.1/24, B = 10.X.k.2/24 (a subnet per
#       rail, so the route picks the rail's veth), a tbf of RATEk on each
#       end's egress; --latency / --burst: one value for every rail, or one per rail.
#   netns-topo.sh down NAME          removes it (and whatever runs inside)
#   netns-topo.sh cleanup [--all]    removes topologies whose owner is gone
#                                    (--all: every topology this script made)
#   netns-topo.sh info NAME          prints the TOPO line again
#   netns-topo.sh exec NAME A|R|B CMD...   runs CMD inside NAME-A, -R or -B
#   netns-topo.sh stats NAME         one STATS line per tbf (tc -s qdisc counters;
#                                    rails: A's rails in order, then B's, each with rail=k)
#
# `up` prints one line, e.g.
#   TOPO name=t1 kind=router x=57 a=10.57.1.1 b=10.57.2.2 ns_a=t1-A ns_r=t1-R ns_b=t1-B
#        rate=1gbit latency=2ms burst=64kb mtu=1500 both=0
# rails adds (a= and b= are rail 1's addresses, rate= latency= burst= the lists):
#        rails=2 a_rails=10.57.1.1,10.57.2.1 b_rails=10.57.1.2,10.57.2.2
#        a_dev=rail1,rail2 b_dev=rail1,rail2
# X comes from NAME (the addresses exist only inside the namespaces, so two
# topologies never clash). The owner (default: the calling process; `none`:
# kept until `down` or `cleanup --all`) is the process whose exit makes the
# topology a leftover: `up` and `cleanup` remove the leftovers of killed runs. Only topologies recorded under
# $TOPO_STATE (default /run/diwarp-netns-topo) are ever removed.
#
# No delay is added (this machine has no netem): the path's RTT is the veth
# pairs' (tens of µs), so the tbf queue (--latency × RATE) is the buffer.
#
# Needs root, ip and tc; otherwise (or when namespaces or tbf cannot be made
# here) exits 77 with a SKIP line. Other errors exit 1, usage 2.
set -euo pipefail

STATE=${TOPO_STATE:-/run/diwarp-netns-topo}

usage() {
        sed -n '5,26p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
}
skip() {
        echo "SKIP: $*" >&2
        exit 77
}
die() {
        echo "netns-topo: $*" >&2
        exit 1
}

check_name() {
        [[ $1 =~ ^[A-Za-z0-9_]{1,32}$ ]] || die "bad NAME '$1' (letters, digits, _; at most 32)"
}

# Start time of a process (field 22 of /proc/PID/stat): a PID reused by
# another process does not keep a leftover alive.
start_time() {
        local s
        s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
        s=${s##*) }
        # after the command name: field 3 is the first, so 22 is the 20th
        read -r -a f <<<"$s"
        echo "${f[19]}"
}

# The value of KEY in NAME's state file.
state_get() {
        sed -n "s/^$2=//p" "$STATE/$1" 2>/dev/null
}

owner_alive() {
        local pid st
        pid=$(state_get "$1" owner_pid)
        st=$(state_get "$1" owner_start)
        [ "$pid" = none ] || { [ -n "$pid" ] && [ "$(start_time "$pid" || true)" = "$st" ]; }
}

remove() {
        local ns pids
        for ns in $1-A $1-R $1-B; do
                ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" || continue
                # whatever still runs inside was started for this topology
                pids=$(ip netns pids "$ns" 2>/dev/null || true)
                # shellcheck disable=SC2086 # one PID per word
                [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
                ip netns del "$ns" 2>/dev/null || true
        done
        rm -f "$STATE/$1"
}

cleanup() {
        local f name
        [ -d "$STATE" ] || return 0
        for f in "$STATE"/*; do
                [ -e "$f" ] || continue
                name=${f##*/}
                if [ "${1:-}" = --all ] || ! owner_alive "$name"; then
                        remove "$name"
                        echo "removed $name"
                fi
        done
}

topo_line() {
        local f=$STATE/$1
        [ -f "$f" ] || die "no topology '$1'"
        echo "TOPO name=$1 kind=$(state_get "$1" kind) x=$(state_get "$1" x)" \
                "a=$(state_get "$1" a) b=$(state_get "$1" b)" \
                "ns_a=$1-A$([ "$(state_get "$1" kind)" = router ] && echo " ns_r=$1-R") ns_b=$1-B" \
                "rate=$(state_get "$1" rate) latency=$(state_get "$1" latency)" \
                "burst=$(state_get "$1" burst) mtu=$(state_get "$1" mtu) both=$(state_get "$1" both)$(
                        [ "$(state_get "$1" kind)" != rails ] ||
                                echo " rails=$(state_get "$1" rails) a_rails=$(state_get "$1" a_rails)" \
                                        "b_rails=$(state_get "$1" b_rails) a_dev=$(state_get "$1" a_dev)" \
                                        "b_dev=$(state_get "$1" b_dev)")"
}

# tbf NS DEV [RATE BURST LATENCY]: the bottleneck queue on DEV's egress
# (default: the topology's rate, burst and latency).
tbf() {
        ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${3:-$rate}" burst "${4:-$burst}" \
                latency "${5:-$latency}"
}

# nth LIST K: the K-th (1-based) item of a comma list, or its only item.
nth() {
        local -a v
        IFS=, read -r -a v <<<"$1"
        if [ ${#v[@]} -eq 1 ]; then echo "${v[0]}"; else echo "${v[$(($2 - 1))]}"; fi
}

# count LIST: the number of items of a comma list.
count() {
        local -a v
        IFS=, read -r -a v <<<"$1"
        echo ${#v[@]}
}

# make_rails NAME X N MTU: the namespaces and N veth pairs of a rails topology.
make_rails() {
        local k
        ip netns add "$1-A" && ip netns add "$1-B" &&
                ip -n "$1-A" link set lo up && ip -n "$1-B" link set lo up || return 1
        for ((k = 1; k <= $3; k++)); do
                ip link add name "rail$k" netns "$1-A" type veth peer name "rail$k" netns "$1-B" &&
                        ip -n "$1-A" addr add "10.$2.$k.1/24" dev "rail$k" &&
                        ip -n "$1-B" addr add "10.$2.$k.2/24" dev "rail$k" &&
                        ip -n "$1-A" link set "rail$k" mtu "$4" up &&
                        ip -n "$1-B" link set "rail$k" mtu "$4" up || return 1
        done
}

up() {
        local name=${1:-} kind=${2:-} rate=${3:-}
        if [ -z "$name" ] || [ -z "$kind" ] || [ -z "$rate" ]; then usage; fi
        shift 3
        check_name "$name"
        local latency='' burst=64kb mtu=1500 both=0 owner=$PPID
        case $kind in
        router) latency=2ms ;;
        direct | rails) latency=3ms ;;
        *) usage ;;
        esac
        while [ $# -gt 0 ]; do
                case $1 in
                --latency) latency=${2:?}; shift 2 ;;
                --burst) burst=${2:?}; shift 2 ;;
                --mtu) mtu=${2:?}; shift 2 ;;
                --both) both=1; shift ;;
                --owner) owner=${2:?}; shift 2 ;;
                *) usage ;;
                esac
        done
        [[ $mtu =~ ^[0-9]+$ ]] || die "bad --mtu '$mtu'"
        [ "$both" = 0 ] || [ "$kind" = router ] || die "--both is for router topologies"
        local nrails=1 k v
        if [ "$kind" = rails ]; then
                [[ $rate =~ ^[^,]+(,[^,]+){0,3}$ ]] ||
                        die "rails: 1 to 4 rates (RATE1,RATE2,...), not '$rate'"
                nrails=$(count "$rate")
                for v in "$latency" "$burst"; do
                        if ! [[ $v =~ ^[^,]+(,[^,]+)*$ ]] ||
                                { [ "$(count "$v")" -ne 1 ] && [ "$(count "$v")" -ne "$nrails" ]; }; then
                                die "rails: --latency and --burst take one value or one per rail ($nrails), not '$v'"
                        fi
                done
        elif [[ $rate$latency$burst == *,* ]]; then
                die "lists of rates, latencies or bursts are for rails topologies"
        fi
        command -v tc >/dev/null 2>&1 || skip "tc (iproute2) not installed"
        mkdir -p "$STATE"
        cleanup >/dev/null
        [ ! -e "$STATE/$name" ] || die "topology '$name' exists (netns-topo.sh down $name)"
        local ns
        for ns in $name-A $name-R $name-B; do
                ! ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" ||
                        die "namespace $ns exists but is not a topology of this script"
        done
        local st=none
        [ "$owner" = none ] || st=$(start_time "$owner") || die "no process $owner (--owner)"
        local x=$(($(printf '%s' "$name" | cksum | cut -d' ' -f1) % 200 + 20))
        local A=10.$x.1.1 B=10.$x.2.2
        local a_rails='' b_rails='' a_dev='' b_dev=''
        if [ "$kind" = rails ]; then
                B=10.$x.1.2
                for ((k = 1; k <= nrails; k++)); do
                        a_rails+=${a_rails:+,}10.$x.$k.1
                        b_rails+=${b_rails:+,}10.$x.$k.2
                        a_dev+=${a_dev:+,}rail$k
                        b_dev+=${b_dev:+,}rail$k
                done
        fi
        # recorded first: a failure below still leaves something `down` removes
        cat >"$STATE/$name" <<EOF
kind=$kind
x=$x
a=$A
b=$B
rate=$rate
latency=$latency
burst=$burst
mtu=$mtu
both=$both
owner_pid=$owner
owner_start=$st
EOF
        [ "$kind" != rails ] || cat >>"$STATE/$name" <<EOF
rails=$nrails
a_rails=$a_rails
b_rails=$b_rails
a_dev=$a_dev
b_dev=$b_dev
EOF
        err=$(mktemp)
        trap 'rm -f "$err"' EXIT
        if [ "$kind" = router ]; then
                if ! {
                        ip netns add "$name-A" && ip netns add "$name-R" && ip netns add "$name-B" &&
                                ip link add name toA netns "$name-R" type veth peer name eth0 netns "$name-A" &&
                                ip link add name toB netns "$name-R" type veth peer name eth0 netns "$name-B" &&
                                ip -n "$name-A" addr add "$A/24" dev eth0 &&
                                ip -n "$name-B" addr add "$B/24" dev eth0 &&
                                ip -n "$name-R" addr add "10.$x.1.254/24" dev toA &&
                                ip -n "$name-R" addr add "10.$x.2.254/24" dev toB &&
                                ip -n "$name-A" link set lo up && ip -n "$name-R" link set lo up &&
                                ip -n "$name-B" link set lo up &&
                                ip -n "$name-A" link set eth0 mtu "$mtu" up &&
                                ip -n "$name-B" link set eth0 mtu "$mtu" up &&
                                ip -n "$name-R" link set toA mtu "$mtu" up &&
                                ip -n "$name-R" link set toB mtu "$mtu" up &&
                                ip -n "$name-A" route add default via "10.$x.1.254" &&
                                ip -n "$name-B" route add default via "10.$x.2.254" &&
                                ip netns exec "$name-R" sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
                } 2>"$err"; then
                        cat "$err" >&2
                        remove "$name"
                        skip "cannot create network namespaces / veth here"
                fi
                if ! { tbf "$name-R" toB && { [ "$both" = 0 ] || tbf "$name-R" toA; }; } 2>"$err"; then
                        cat "$err" >&2
                        remove "$name"
                        grep -qi 'unknown qdisc\|not supported\|No such file' "$err" &&
                                skip "no tbf qdisc here"
                        die "tc qdisc add tbf rate $rate burst $burst latency $latency failed"
                fi
        elif [ "$kind" = rails ]; then
                if ! make_rails "$name" "$x" "$nrails" "$mtu" 2>"$err"; then
                        cat "$err" >&2
                        remove "$name"
                        skip "cannot create network namespaces / veth here"
                fi
                local r b l
                for ((k = 1; k <= nrails; k++)); do
                        r=$(nth "$rate" $k) b=$(nth "$burst" $k) l=$(nth "$latency" $k)
                        if ! { tbf "$name-A" "rail$k" "$r" "$b" "$l" &&
                                tbf "$name-B" "rail$k" "$r" "$b" "$l"; } 2>"$err"; then
                                cat "$err" >&2
                                remove "$name"
                                grep -qi 'unknown qdisc\|not supported\|No such file' "$err" &&
                                        skip "no tbf qdisc here"
                                die "rail $k: tc qdisc add tbf rate $r burst $b latency $l failed"
                        fi
                done
        else
                if ! {
                        ip netns add "$name-A" && ip netns add "$name-B" &&
                                ip link add name eth0 netns "$name-A" type veth peer name eth0 netns "$name-B" &&
                                ip -n "$name-A" addr add "$A/16" dev eth0 &&
                                ip -n "$name-B" addr add "$B/16" dev eth0 &&
                                ip -n "$name-A" link set lo up && ip -n "$name-B" link set lo up &&
                                ip -n "$name-A" link set eth0 mtu "$mtu" up &&
                                ip -n "$name-B" link set eth0 mtu "$mtu" up
                } 2>"$err"; then
                        cat "$err" >&2
                        remove "$name"
                        skip "cannot create network namespaces / veth here"
                fi
                if ! { tbf "$name-A" eth0 && tbf "$name-B" eth0; } 2>"$err"; then
                        cat "$err" >&2
                        remove "$name"
                        grep -qi 'unknown qdisc\|not supported\|No such file' "$err" &&
                                skip "no tbf qdisc here"
                        die "tc qdisc add tbf rate $rate burst $burst latency $latency failed"
                fi
        fi
        topo_line "$name"
}

# qdisc_stats NAME NS DEV [RAIL]: one STATS line from `tc -s qdisc show dev DEV`
# (with RAIL: rail=RAIL after dev=).
qdisc_stats() {
        ip netns exec "$2" tc -s qdisc show dev "$3" |
                awk -v name="$1" -v ns="$2" -v dev="$3${4:+ rail=$4}" '
                function bytes(s,  n) {
                        n = s + 0
                        if (s ~ /Kb$/) n *= 1024
                        else if (s ~ /Mb$/) n *= 1048576
                        else if (s ~ /Gb$/) n *= 1073741824
                        return int(n)
                }
                $1 == "qdisc" && $2 == "tbf" { q = 1; next }
                $1 == "qdisc" { q = 0 }
                q && $1 == "Sent" {
                        sb = $2; sp = $4; d = $7; o = $9
                        sub(/,$/, "", d); sub(/\)$/, "", o)
                }
                q && $1 == "backlog" { bb = bytes($2); bp = $3; sub(/p$/, "", bp) }
                END {
                        if (sb == "") exit 1
                        printf "STATS name=%s ns=%s dev=%s qdisc=tbf sent_bytes=%s sent_pkts=%s " \
                               "dropped=%s overlimits=%s backlog_bytes=%s backlog_pkts=%s\n",
                               name, ns, dev, sb, sp, d, o, bb, bp
                }'
}

stats() {
        local name=${1:-}
        [ -n "$name" ] || usage
        [ -f "$STATE/$name" ] || die "no topology '$name'"
        local kind k side
        kind=$(state_get "$name" kind)
        if [ "$kind" = router ]; then
                qdisc_stats "$name" "$name-R" toB
                [ "$(state_get "$name" both)" = 0 ] || qdisc_stats "$name" "$name-R" toA
        elif [ "$kind" = rails ]; then
                for side in A B; do
                        for ((k = 1; k <= $(state_get "$name" rails); k++)); do
                                qdisc_stats "$name" "$name-$side" "rail$k" $k
                        done
                done
        else
                qdisc_stats "$name" "$name-A" eth0
                qdisc_stats "$name" "$name-B" eth0
        fi
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
case $cmd in
-h | --help | help) usage ;;
esac
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) not installed"

case $cmd in
up) up "$@" ;;
down)
        [ -n "${1:-}" ] || usage
        check_name "$1"
        [ -f "$STATE/$1" ] || die "no topology '$1'"
        remove "$1"
        ;;
cleanup)
        [ $# -eq 0 ] || [ "$1" = --all ] || usage
        cleanup "${1:-}"
        ;;
info)
        [ -n "${1:-}" ] || usage
        topo_line "$1"
        ;;
exec)
        [ $# -ge 3 ] || usage
        name=$1 side=$2
        shift 2
        [ -f "$STATE/$name" ] || die "no topology '$name'"
        case $side in
        A | B) ;;
        R) [ "$(state_get "$name" kind)" = router ] ||
                die "'$name' is $(state_get "$name" kind): no R" ;;
        *) usage ;;
        esac
        exec ip netns exec "$name-$side" "$@"
        ;;
stats) stats "$@" ;;
*) usage ;;
esac
