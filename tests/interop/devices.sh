#!/bin/bash
# ibv_devices and ibv_devinfo [-v] see diwarp0 as an iWARP RNIC on Ethernet.
. "$(dirname "$0")/lib.sh"
need ibv_devices
need ibv_devinfo

out=$TMPD/out
timeout 30 "$DIWARP" devices >"$out" 2>&1 || { cat "$out" >&2; fail "diwarp devices exited $?"; }
expect "$out" '^[[:space:]]*diwarp0[[:space:]]+0244570[0-9a-f]{9}$' "diwarp devices lists diwarp0 with its GUID"

timeout 30 "$DIWARP" run ibv_devinfo >"$out" 2>&1 || { cat "$out" >&2; fail "ibv_devinfo exited $?"; }
expect "$out" '^hca_id:[[:space:]]+diwarp0$' "ibv_devinfo names diwarp0"
expect "$out" 'transport:[[:space:]]+iWARP \(1\)' "transport iWARP"
expect "$out" 'vendor_id:[[:space:]]+0x444957' "our own vendor id"
expect "$out" 'board_id:[[:space:]]+DIWARP_SOFT_RNIC' "board_id via ibv_read_sysfs_file"
expect "$out" 'state:[[:space:]]+PORT_ACTIVE \(4\)' "port active"
expect "$out" 'link_layer:[[:space:]]+Ethernet' "link layer Ethernet"

timeout 30 "$DIWARP" run ibv_devinfo -v >"$out" 2>&1 || { cat "$out" >&2; fail "ibv_devinfo -v exited $?"; }
expect "$out" 'GID\[ *0\]:[[:space:]]+::ffff:[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+' "GID[0] is an IPv4-mapped address"
# The host's addresses: the default route's interface first, 127.0.0.1 last.
last=$(grep -E 'GID\[ *[0-9]+\]:' "$out" | tail -1)
case $last in
*::ffff:127.0.0.1,*) ;;
*) cat "$out" >&2; fail "the last GID is not 127.0.0.1: $last" ;;
esac
defif=$(ip -4 route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
if [ -n "$defif" ]; then
        a=$(ip -4 -o addr show dev "$defif" | awk '{ sub("/.*", "", $4); print $4; exit }')
        expect "$out" "GID\\[ *0\\]:[[:space:]]+::ffff:${a//./\\.}," "GID[0] is $defif's $a (default route)"
fi
expect "$out" 'atomic_cap:[[:space:]]+ATOMIC_HCA' "atomics advertised"
expect "$out" 'max_qp_wr:[[:space:]]+[1-9]' "nonzero max_qp_wr"
expect "$out" 'phys_port_cnt:[[:space:]]+1' "one port"

# Another address: the GID follows DIWARP_ADDR (--addr).
timeout 30 "$DIWARP" run --addr 127.0.0.2 ibv_devinfo -v >"$out" 2>&1 ||
        { cat "$out" >&2; fail "ibv_devinfo -v with --addr exited $?"; }
expect "$out" 'GID\[ *0\]:[[:space:]]+::ffff:127\.0\.0\.2' "GID[0] follows --addr"

# --transport ib: the report changes (transport, node type in sysfs), the
# link layer does not; auto (the default) is iWARP outside Open MPI's ofi
# MTL; a value that is none of iwarp, ib, auto is refused.
timeout 30 "$DIWARP" run --transport ib ibv_devinfo >"$out" 2>&1 ||
        { cat "$out" >&2; fail "ibv_devinfo with --transport ib exited $?"; }
expect "$out" 'transport:[[:space:]]+InfiniBand \(0\)' "--transport ib: transport InfiniBand"
expect "$out" 'link_layer:[[:space:]]+Ethernet' "--transport ib: link layer still Ethernet"
timeout 30 "$DIWARP" run --transport ib cat /sys/class/infiniband/diwarp0/node_type >"$out" 2>&1 ||
        { cat "$out" >&2; fail "reading node_type with --transport ib exited $?"; }
expect "$out" '^1: CA$' "--transport ib: sysfs node_type 1: CA"
timeout 30 "$DIWARP" run cat /sys/class/infiniband/diwarp0/node_type >"$out" 2>&1 ||
        { cat "$out" >&2; fail "reading node_type exited $?"; }
expect "$out" '^4: RNIC$' "default: sysfs node_type 4: RNIC"
timeout 30 "$DIWARP" run --transport auto ibv_devinfo >"$out" 2>&1 ||
        { cat "$out" >&2; fail "ibv_devinfo with --transport auto exited $?"; }
expect "$out" 'transport:[[:space:]]+iWARP \(1\)' "--transport auto: iWARP outside Open MPI"
r=0
timeout 30 "$DIWARP" run --transport roce true >"$out" 2>&1 || r=$?
[ $r -eq 2 ] || { cat "$out" >&2; fail "--transport roce: exit $r, want 2"; }
expect "$out" 'want iwarp, ib or auto' "--transport roce refused with a reason"
DIWARP_TRANSPORT=roce timeout 30 "$DIWARP" run ibv_devinfo >"$out" 2>&1 ||
        { cat "$out" >&2; fail "ibv_devinfo with DIWARP_TRANSPORT=roce exited $?"; }
expect "$out" 'DIWARP_TRANSPORT=roce: not iwarp, ib or auto' "a bad DIWARP_TRANSPORT is named"
expect "$out" 'transport:[[:space:]]+iWARP \(1\)' "a bad DIWARP_TRANSPORT keeps iWARP"

# Without the preload the device must not appear (the test can fail).
if ibv_devices 2>/dev/null | grep -q diwarp0; then
        fail "diwarp0 visible without the preload"
fi
echo "ok"
