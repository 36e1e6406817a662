#!/bin/bash
# The private sysfs trees (verbs-provider/sysfs.c) of processes killed before
# their exit are removed at the next device open under the preload, and
# nothing else is: not a tree of a live process, not one whose lock a live
# process holds (an owner in another PID namespace), not another user's,
# not a symlink named like a tree, and never what a link inside a tree
# points to. The trees go to $XDG_RUNTIME_DIR, here a directory of this
# test, so concurrent runs do not meet.
. "$(dirname "$0")/lib.sh"
need ibv_devinfo
need python3
need flock

export XDG_RUNTIME_DIR=$TMPD/run
mkdir -m 700 "$XDG_RUNTIME_DIR"
run=$XDG_RUNTIME_DIR

# A PID that ran and is gone (not reused within this test: the kernel hands
# PIDs out in increasing order until it wraps).
dead_pid() {
        sh -c 'echo $$'
}
dead=$(dead_pid)
dead2=$(dead_pid)
dead3=$(dead_pid)
dead4=$(dead_pid)
for p in $dead $dead2 $dead3 $dead4; do
        kill -0 "$p" 2>/dev/null && fail "PID $p is alive"
done

# something outside every tree that links inside point to
mkdir "$TMPD/outside"
echo keep >"$TMPD/outside/canary"

# 1. a stale tree (dead PID, ours), with a link to the outside inside it
stale=$run/diwarp-sysfs-$dead-aaaaaa
mkdir -p "$stale/diwarp0/device/net" "$stale/diwarp0/ports/1/gids"
echo 0x1 >"$stale/diwarp0/node_guid"
echo 0 >"$stale/diwarp0/ports/1/gids/0"
ln -s "$TMPD/outside" "$stale/diwarp0/device/net/eth0"
ln -s "$TMPD/outside/canary" "$stale/diwarp0/link_to_file"
# 2. a live process's tree
sleep 120 >/dev/null 2>&1 &
live=$!
livetree=$run/diwarp-sysfs-$live-bbbbbb
mkdir -p "$livetree/diwarp0"
# 3. a dead PID, but a live process holds its lock (another PID namespace)
locked=$run/diwarp-sysfs-$dead2-cccccc
mkdir -p "$locked/diwarp0"
flock -x "$locked" sleep 120 >/dev/null 2>&1 &
holder=$!
# 4. a dead PID, another user's
other=$run/diwarp-sysfs-$dead3-dddddd
mkdir -p "$other/diwarp0"
chown -R nobody "$other" 2>/dev/null || other=
# 5. a symlink named like a tree, to a directory outside
ln -s "$TMPD/outside" "$run/diwarp-sysfs-$dead4-eeeeee"
# 6. a name that only looks alike
odd=$run/diwarp-sysfs-$dead4-toolongsuffix
mkdir -p "$odd"
trap 'rc=$?; kill $live $holder 2>/dev/null; sanitizer_check || rc=1; rm -rf "$TMPD"; exit $rc' EXIT
i=0
until ! flock -n -x "$locked" true; do # the holder has its lock
        i=$((i + 1))
        [ $i -lt 100 ] || fail "flock never took the lock of $locked"
        sleep 0.05
done

"$DIWARP" run -- ibv_devinfo >"$TMPD/devinfo.out" 2>&1 || { cat "$TMPD/devinfo.out" >&2; fail "ibv_devinfo failed"; }
expect "$TMPD/devinfo.out" 'hca_id:[[:space:]]*diwarp0' "ibv_devinfo lists diwarp0"

[ ! -e "$stale" ] || { ls -laR "$stale" >&2; fail "the stale tree of PID $dead is still there"; }
[ -f "$TMPD/outside/canary" ] || fail "a file a link in the stale tree pointed to is gone"
[ -d "$livetree/diwarp0" ] || fail "the tree of a live process was removed"
[ -d "$locked/diwarp0" ] || fail "a tree whose lock a live process holds was removed"
[ -z "$other" ] || [ -d "$other/diwarp0" ] || fail "another user's tree was removed"
[ -L "$run/diwarp-sysfs-$dead4-eeeeee" ] || fail "a symlink named like a tree was removed"
[ -d "$odd" ] || fail "a directory whose name only looks like a tree's was removed"
echo "ok: the stale tree is gone; live, locked, other user's, symlink and look-alike stay"

# A program that made its tree and was killed (no exit handler): its tree
# stays until the next program under the preload opens the device.
"$DIWARP" run -- python3 -c '
import os, signal
open("/sys/class/infiniband/diwarp0/node_guid").read()
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
' >"$TMPD/killed.out" 2>&1 && fail "the program was not killed"
kpid=$(head -1 "$TMPD/killed.out")
case $kpid in '' | *[!0-9]*) cat "$TMPD/killed.out" >&2; fail "no PID from the killed program" ;; esac
ls -d "$run"/diwarp-sysfs-"$kpid"-* >/dev/null 2>&1 ||
        fail "the killed program (PID $kpid) made no tree (or it was removed although killed)"
"$DIWARP" run -- ibv_devinfo >/dev/null 2>&1 || fail "ibv_devinfo failed (second run)"
if ls -d "$run"/diwarp-sysfs-"$kpid"-* >/dev/null 2>&1; then
        fail "the tree of the killed program (PID $kpid) is still there"
fi
# A program that exits normally removes its own tree.
out=$("$DIWARP" run -- python3 -c '
import os
open("/sys/class/infiniband/diwarp0/node_guid").read()
print(os.getpid())
') || fail "reading node_guid failed"
ls -d "$run"/diwarp-sysfs-"$out"-* >/dev/null 2>&1 && fail "a program's tree outlived its exit"
[ -d "$livetree/diwarp0" ] && [ -d "$locked/diwarp0" ] || fail "a kept tree went in a later run"
kill $live $holder 2>/dev/null
wait $live $holder 2>/dev/null
echo "ok: a killed program's tree removed by the next one; a normal exit removes its own"
