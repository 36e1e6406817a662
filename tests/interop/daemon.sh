#!/bin/bash
# The host progress daemon diwarpd: programs as its clients, and its faults.
#   daemon.sh wrap SCRIPT ARGS...  runs another interop script (pingpong.sh,
#                                  perftest.sh, rdmacm.sh, netns.sh) with
#                                  every program a client of a private daemon
#                                  (DIWARP_PROGRESS=daemon); afterwards the
#                                  daemon must be alive, have served requests,
#                                  and hold no client
#   daemon.sh examples             the native examples (UD, RC, RD; Send,
#                                  Write, Read) through the daemon, validated;
#                                  RC Writes between them are one copy
#   daemon.sh kill_daemon          clients of a daemon killed with SIGKILL:
#                                  DEVICE_FATAL (native and verbs), WRs
#                                  flushed, posts fail, nothing hangs; a new
#                                  daemon serves new opens
#   daemon.sh kill_client          a client killed with SIGKILL: the daemon
#                                  frees it within a second, a ping-pong of two
#                                  other clients goes on untouched
#   daemon.sh hostile              malformed and hostile requests (daemon_fault)
#   daemon.sh merge                overlapping registrations merge the client's segments
#   daemon.sh nice                 --nice N: every thread of the daemon (its
#                                  servers too) runs at N and the start line
#                                  says so; --nice inherit and the default
#                                  (auto) start at the inherited nice; a user
#                                  who may not raise its priority gets a
#                                  daemon at the nice it had and a line saying
#                                  why; out of range: exit 2
#   daemon.sh nice_auto            --nice auto: the daemon stays at its nice
#                                  while its own clients keep the cores busy,
#                                  goes to -10 beside a nice-0 `yes` per core
#                                  and back once they end
# Needs DIWARP (tools/diwarp of the build), DAEMON_FAULT, DAEMON_FATAL_VERBS,
# DIWARP_PINGPONG and DIWARP_BW (set by meson).
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
case=${1:?usage: daemon.sh CASE}
shift

# A private daemon: its socket and its log (checked for sanitizer reports
# with everything else in $TMPD) live in this run's directory.
export DIWARP_DAEMON_SOCKET=$TMPD/diwarpd.sock
unset DIWARP_PROGRESS
dpid=
bg=

cleanup() {
        rc=$?
        for p in $bg; do
                kill -9 "$p" 2>/dev/null
        done
        [ -n "$dpid" ] && kill -9 "$dpid" 2>/dev/null
        sanitizer_check || rc=1 # lib.sh
        rm -rf "$TMPD"
        exit $rc
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

start_daemon() {
        out=$("$DIWARP" daemon start "$@") || fail "diwarp daemon start failed"
        dpid=$(echo "$out" | sed -n 's/^diwarpd running: pid \([0-9]*\).*/\1/p')
        [ -n "$dpid" ] || fail "diwarp daemon start said: $out"
}

# stat_field NAME: a number of `diwarp stat`'s first line ("N clients", ...).
stat_clients() {
        "$DIWARP" stat 2>/dev/null | sed -n '1s/.*: \([0-9]*\) client.*/\1/p'
}

# wait_for FILE PATTERN SECONDS
wait_for() {
        local i=0
        while ! grep -Eq -- "$2" "$1" 2>/dev/null; do
                i=$((i + 1))
                [ $i -lt $(($3 * 10)) ] || { cat "$1" >&2; fail "no '$2' within $3 s"; }
                sleep 0.1
        done
}

# no_clients SECONDS: the daemon holds no client within that time.
no_clients() {
        local i=0 n
        while :; do
                n=$(stat_clients)
                [ "$n" = 0 ] && return 0
                i=$((i + 1))
                [ $i -lt $(($1 * 20)) ] || { "$DIWARP" stat >&2; fail "daemon still holds $n clients"; }
                sleep 0.05
        done
}

# pair NAME PROG ARGS...: a native example server and its client through the
# daemon, both validating every byte.
pair() {
        local name=$1
        shift
        srv=$TMPD/$name.srv
        S=("$@" --port @PORT@)
        DIWARP_PROGRESS=daemon serve
        DIWARP_PROGRESS=daemon timeout 60 "$@" --port "$port" 127.0.0.1 >"$TMPD/$name.cli" 2>&1 ||
                { cat "$srv" "$TMPD/$name.cli" >&2; fail "$name client failed"; }
        wait $spid || { cat "$srv" >&2; fail "$name server failed"; }
        expect "$TMPD/$name.cli" 'RESULT .*status=ok' "$name: client validated"
        expect "$srv" 'RESULT .*status=ok' "$name: server validated"
        grep -h RESULT "$TMPD/$name.cli"
}

case $case in
wrap)
        script=${1:?usage: daemon.sh wrap SCRIPT ARGS...}
        shift
        start_daemon
        DIWARP_PROGRESS=daemon bash "$here/$script" "$@" || fail "$script $* failed through the daemon"
        kill -0 "$dpid" 2>/dev/null || fail "the daemon died"
        req=$("$DIWARP" stat | sed -n '1s/.*, \([0-9]*\) requests.*/\1/p')
        [ "${req:-0}" -gt 0 ] || fail "no program went through the daemon"
        no_clients 2
        "$DIWARP" daemon stop >/dev/null || fail "diwarp daemon stop"
        dpid=
        echo "ok: $script $* through the daemon ($req requests)"
        ;;
examples)
        : "${DIWARP_PINGPONG:?}" "${DIWARP_BW:?}"
        start_daemon
        for t in ud rc rd; do
                pair pp_$t "$DIWARP_PINGPONG" --transport $t --size 4096 --iters 300 --validate
        done
        for op in write read; do
                for t in rc rd; do
                        pair pp_${t}_$op "$DIWARP_PINGPONG" --transport $t --op $op --size 4096 \
                                --iters 300 --validate
                done
        done
        pair bw_rc "$DIWARP_BW" --transport rc --op write --size 1048576 --iters 100 --validate
        # Between two clients of one daemon, RC Writes and Reads are one copy
        # (DIWARP_LOCAL_COPY): at least the 100 MiB just written.
        lc=$("$DIWARP" stat | sed -n 's/.* local_copy_bytes \([0-9]*\).*/\1/p' | head -n 1)
        [ "${lc:-0}" -ge $((100 << 20)) ] ||
                { "$DIWARP" stat >&2; fail "RC Writes between clients were not one copy"; }
        echo "one copy: $lc bytes"
        pair bw_rd "$DIWARP_BW" --transport rd --op write --size 1048576 --iters 100 --validate
        pair bw_ud "$DIWARP_BW" --transport ud --size 8192 --iters 1000 --validate
        no_clients 2
        ;;
kill_daemon)
        : "${DAEMON_FAULT:?}" "${DAEMON_FATAL_VERBS:?}"
        start_daemon
        DIWARP_PROGRESS=daemon timeout 40 "$DAEMON_FAULT" fatal >"$TMPD/fatal" 2>&1 &
        f1=$!
        DIWARP_PROGRESS=daemon timeout 40 "$DAEMON_FAULT" fatal_poll >"$TMPD/fatal_poll" 2>&1 &
        f2=$!
        DIWARP_PROGRESS=daemon timeout 40 "$DIWARP" run "$DAEMON_FATAL_VERBS" >"$TMPD/fatal_verbs" 2>&1 &
        f3=$!
        bg="$f1 $f2 $f3"
        for f in fatal fatal_poll fatal_verbs; do
                wait_for "$TMPD/$f" READY 20
        done
        kill -9 "$dpid"
        dpid=
        t0=$(date +%s)
        for p in $f1 $f2 $f3; do
                wait $p || { tail -n 30 "$TMPD"/fatal* >&2; fail "a client failed or hung (pid $p)"; }
        done
        [ $(($(date +%s) - t0)) -le 20 ] || fail "clients took more than 20 s to see the loss"
        bg=
        expect "$TMPD/fatal" '^OK fatal' "native client saw DEVICE_FATAL"
        expect "$TMPD/fatal_poll" '^OK fatal' "busy-polling client saw its WRs flushed"
        expect "$TMPD/fatal_verbs" '^OK device fatal' "verbs client saw IBV_EVENT_DEVICE_FATAL"
        expect "$TMPD/fatal" 'connection to diwarpd was lost' "the loss is logged by name"
        # A restarted daemon serves new opens.
        start_daemon
        DIWARP_PROGRESS=daemon timeout 30 "$DAEMON_FAULT" reopen >"$TMPD/reopen" 2>&1 ||
                { cat "$TMPD/reopen" >&2; fail "open after a restart"; }
        expect "$TMPD/reopen" '^OK reopen' "a message through the restarted daemon"
        cat "$TMPD"/fatal "$TMPD"/fatal_poll "$TMPD"/fatal_verbs "$TMPD"/reopen | grep '^OK'
        ;;
kill_client)
        : "${DAEMON_FAULT:?}" "${DIWARP_PINGPONG:?}"
        start_daemon
        DIWARP_PROGRESS=daemon timeout 60 "$DAEMON_FAULT" holder >"$TMPD/holder" 2>&1 &
        bg=$!
        wait_for "$TMPD/holder" READY 20
        h=$(sed -n 's/^READY pid \([0-9]*\)$/\1/p' "$TMPD/holder")
        # Two other clients in a long ping-pong across the kill: it must
        # still run when the kill comes. Its rate through the daemon spans
        # two orders of magnitude (50 000 round trips took 0.5 s on a quiet
        # host, over a minute on a busy one under the sanitizers), so its
        # length comes from a short one just before, under the same load:
        # about 5 s of round trips.
        srv=$TMPD/pp.srv
        S=("$DIWARP_PINGPONG" --transport rc --iters 20000 --validate --port @PORT@)
        DIWARP_PROGRESS=daemon serve
        t0=$(date +%s%N)
        DIWARP_PROGRESS=daemon timeout 60 "$DIWARP_PINGPONG" --transport rc --iters 20000 \
                --validate --port "$port" 127.0.0.1 >"$TMPD/pp.cli" 2>&1 ||
                { cat "$TMPD/pp.cli" "$srv" >&2; fail "the calibrating ping-pong failed"; }
        ms=$((($(date +%s%N) - t0) / 1000000 + 1))
        wait $spid || { cat "$srv" >&2; fail "the calibrating ping-pong's server failed"; }
        iters=$((20000 * 5000 / ms))
        [ $iters -ge 20000 ] || iters=20000
        [ $iters -le 2000000 ] || iters=2000000
        S=("$DIWARP_PINGPONG" --transport rc --iters $iters --validate --port @PORT@)
        DIWARP_PROGRESS=daemon serve
        DIWARP_PROGRESS=daemon timeout 150 "$DIWARP_PINGPONG" --transport rc --iters $iters \
                --validate --port "$port" 127.0.0.1 >"$TMPD/pp.cli" 2>&1 &
        c=$!
        bg="$bg $spid $c"
        sleep 0.5
        "$DIWARP" stat | grep -q "client pid $h " || fail "the holder is not listed by diwarp stat"
        kill -0 $c 2>/dev/null || fail "the ping-pong ended before the kill: nothing to go on across it"
        kill -9 $h
        t0=$(date +%s%N)
        while "$DIWARP" stat | grep -q "client pid $h "; do
                [ $(($(date +%s%N) - t0)) -lt 1000000000 ] ||
                        fail "the daemon still holds the killed client after 1 s"
                sleep 0.02
        done
        ms=$((($(date +%s%N) - t0) / 1000000))
        # The other clients were kept: their ping-pong completes (a dropped
        # client's QPs are freed, its next round trip would fail). Counting
        # the clients instead raced with the ping-pong's own end beside CPU
        # hogs (3 -> 0).
        wait $c || { cat "$TMPD/pp.cli" >&2; fail "the other clients' ping-pong failed"; }
        wait $spid || { cat "$srv" >&2; fail "the other clients' server failed"; }
        bg=
        expect "$TMPD/pp.cli" 'RESULT .*status=ok' "the ping-pong went on"
        no_clients 2
        echo "ok: killed client freed within $ms ms; the ping-pong beside it ($iters round trips) completed"
        ;;
hostile)
        : "${DAEMON_FAULT:?}"
        start_daemon
        timeout 30 "$DAEMON_FAULT" hostile >"$TMPD/hostile" 2>&1 ||
                { cat "$TMPD/hostile" >&2; fail "hostile requests"; }
        kill -0 "$dpid" 2>/dev/null || fail "the daemon died"
        expect "$TMPD/hostile" '^OK hostile' "every hostile request refused"
        expect "$TMPD/diwarpd.log" 'request rejected: ' "rejections are logged with a reason"
        grep '^OK' "$TMPD/hostile"
        ;;
merge)
        : "${DAEMON_FAULT:?}"
        start_daemon
        DIWARP_PROGRESS=daemon timeout 30 "$DAEMON_FAULT" merge >"$TMPD/merge" 2>&1 ||
                { cat "$TMPD/merge" >&2; fail "overlapping registrations"; }
        expect "$TMPD/merge" '^OK merge' "merged segments kept their contents and carried messages"
        grep '^OK' "$TMPD/merge"
        ;;
nice)
        : "${DIWARPD:?}" "${DIWARP_PINGPONG:?}"
        # thread_nices PID: the nice of each of PID's threads, one per line
        thread_nices() {
                for t in /proc/"$1"/task/*; do
                        awk '{print $19}' "$t/stat"
                done
        }
        start_daemon --nice -7 --servers 2
        log=${DIWARP_DAEMON_SOCKET%.sock}.log
        expect "$log" 'spin [0-9]+ us, nice -7;' "the start line names the nice taken"
        n=$(thread_nices "$dpid" | sort -u)
        echo "nice of the daemon's $(thread_nices "$dpid" | wc -l) threads: $n"
        [ "$n" = -7 ] || fail "threads of the daemon at '$n', not -7 alone"
        # it serves at that priority
        pair pp_nice "$DIWARP_PINGPONG" --transport ud --size 64 --iters 200 --validate
        "$DIWARP" daemon stop >/dev/null || fail "diwarp daemon stop"
        dpid=
        # Inherited, untouched, with --nice inherit; without --nice (auto)
        # it starts there too (nice_auto checks the rest).
        want=$(($(nice) + 3))
        [ $want -le 19 ] || want=19
        for how in "--nice inherit" ""; do
                nice -n 3 "$DIWARP" daemon start $how >/dev/null || fail "daemon start $how under nice +3"
                dpid=$("$DIWARP" daemon status | sed -n 's/^diwarpd running: pid \([0-9]*\).*/\1/p')
                if [ -n "$how" ]; then
                        expect "$log" "spin [0-9]+ us, nice $want;" "with $how the daemon keeps the nice it inherited"
                else
                        expect "$log" "spin [0-9]+ us, nice $want, auto: -10 beside unrelated load;" \
                                "without --nice the daemon starts at the nice it inherited, in auto mode"
                fi
                n=$(thread_nices "$dpid" | sort -u)
                [ "$n" = "$want" ] || fail "daemon ($how) threads at '$n', not $want"
                "$DIWARP" daemon stop >/dev/null
                dpid=
        done
        # Not allowed to raise it: runs on at the nice it had, says why.
        # an array, not a function: run in the background through a function
        # $! would name a subshell, which the kill below would not stop
        as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
        if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
                echo "not root: the unprivileged case is not run"
        elif ! "${as_nobody[@]}" test -x "$DIWARPD"; then
                echo "uid 65534 cannot reach $DIWARPD: the unprivileged case is not run"
        else
                sock=/tmp/diwarp-nice-$$.sock
                # $! is the daemon itself: setpriv execs it
                "${as_nobody[@]}" "$DIWARPD" --socket "$sock" --nice -7 >"$TMPD/unpriv" 2>&1 &
                upid=$!
                bg="$bg $upid"
                wait_for "$TMPD/unpriv" 'listening' 10 || { cat "$TMPD/unpriv" >&2; fail "an unprivileged daemon did not start"; }
                expect "$TMPD/unpriv" "nice $(nice): cannot take -7: Permission denied" \
                        "an unprivileged daemon says it keeps its nice"
                kill "$upid"
                i=0
                while kill -0 "$upid" 2>/dev/null; do
                        i=$((i + 1))
                        [ $i -lt 50 ] || fail "the unprivileged daemon (pid $upid) did not stop on SIGTERM"
                        sleep 0.1
                done
                rm -f "$sock"
        fi
        # Out of range: refused before anything starts.
        for bad in "--nice -21" "--nice 20" "--nice x"; do
                "$DIWARPD" --socket "$TMPD/x.sock" $bad >"$TMPD/bad" 2>&1
                r=$?
                [ $r = 2 ] || fail "diwarpd $bad exited $r, not 2"
                expect "$TMPD/bad" 'nice: -20..19' "diwarpd $bad names the range"
        done
        DIWARPD_NICE=30 "$DIWARPD" --socket "$TMPD/x.sock" >"$TMPD/bad" 2>&1
        [ $? = 2 ] || fail "DIWARPD_NICE=30 was accepted"
        expect "$TMPD/bad" 'DIWARPD_NICE=30: expected -20..19' "DIWARPD_NICE out of range names the range"
        ;;
nice_auto)
        : "${DIWARPD:?}" "${DIWARP_PINGPONG:?}"
        if [ "$(id -u)" != 0 ]; then
                echo "SKIP: not root: the boost may not be allowed" >&2
                exit 77
        fi
        # the nice of every thread of the daemon, sorted and unique
        nices() { for t in /proc/"$dpid"/task/*; do awk '{print $19}' "$t/stat"; done | sort -u; }
        # host_busy: the host's user + nice + system time over 1 s, in
        # hundredths of a core
        host_busy() {
                local a b hz
                hz=$(getconf CLK_TCK)
                a=$(awk '/^cpu /{print $2 + $3 + $4}' /proc/stat)
                sleep 1
                b=$(awk '/^cpu /{print $2 + $3 + $4}' /proc/stat)
                echo $(((b - a) * 100 / hz))
        }
        # until_nices WANT SECONDS: waits for every thread at WANT
        until_nices() {
                local i=0
                while [ "$(nices)" != "$1" ]; do
                        i=$((i + 1))
                        [ $i -le $(($2 * 10)) ] || return 1
                        sleep 0.1
                done
        }
        # autogroup_at NICE: with autogroups on, the daemon's session group
        # (`diwarp daemon start` makes it a session leader) has that nice
        autogroup_at() {
                [ -r /proc/"$dpid"/autogroup ] &&
                        [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ] || return 0
                grep -q "nice $1\$" /proc/"$dpid"/autogroup ||
                        fail "the daemon's autogroup: $(cat /proc/"$dpid"/autogroup), not nice $1"
        }
        base=$(nice)
        DIWARP_LOG=info start_daemon --nice auto
        log=${DIWARP_DAEMON_SOCKET%.sock}.log
        expect "$log" "spin [0-9]+ us, nice $base, auto: -10 beside unrelated load;" \
                "the start line names the auto mode"
        [ "$(nices)" = "$base" ] || fail "the daemon starts at '$(nices)', not $base"
        quiet=$(host_busy)
        if [ "$quiet" -ge 25 ]; then
                echo "the host is busy before the test ($quiet % of a core): the own-load" \
                        "and the return to $base are not checked"
        else
                # Its own clients busy: a ping-pong of two clients, sampled
                # while it runs; the daemon must not raise itself above them.
                (pair pp_own "$DIWARP_PINGPONG" --transport ud --size 64 --iters 150000) &
                ppid=$!
                bg="$bg $ppid"
                samples=0
                while kill -0 "$ppid" 2>/dev/null; do
                        n=$(nices)
                        [ "$n" = "$base" ] || fail "the daemon went to '$n' beside its own clients"
                        samples=$((samples + 1))
                        sleep 0.25
                done
                wait "$ppid" || fail "the ping-pong of its own clients failed"
                echo "own clients busy: $samples samples, the daemon at $base in each"
                [ $samples -ge 8 ] || echo "(the ping-pong lasted less than 2 s: a short check)"
        fi
        # Unrelated load: a nice-0 `yes` per core.
        hogs=
        for _ in $(seq "$(nproc)"); do
                nice -n $((0 - base)) yes >/dev/null &
                hogs="$hogs $!"
        done
        bg="$bg $hogs"
        until_nices -10 5 || { kill $hogs; fail "beside a yes per core the daemon stays at '$(nices)', not -10"; }
        expect "$log" "nice auto: $base -> -10 \(load not the daemon's or its clients': [0-9.]+ cores\)" \
                "the boost is logged with the load"
        autogroup_at -10
        # it serves at that priority
        pair pp_boost "$DIWARP_PINGPONG" --transport ud --size 64 --iters 200 --validate
        kill $hogs
        wait $hogs 2>/dev/null
        if [ "$quiet" -lt 25 ]; then
                until_nices "$base" 8 || fail "the hogs ended, the daemon stays at '$(nices)', not $base"
                autogroup_at "$base"
                expect "$log" "nice auto: -10 -> $base " "the return is logged"
        fi
        # "auto" in the environment, and its refusals.
        "$DIWARP" daemon stop >/dev/null || fail "diwarp daemon stop"
        dpid=
        DIWARPD_NICE=autox "$DIWARPD" --socket "$TMPD/x.sock" >"$TMPD/bad" 2>&1
        [ $? = 2 ] || fail "DIWARPD_NICE=autox was accepted"
        expect "$TMPD/bad" 'expected -20..19, auto or inherit' "a bad DIWARPD_NICE names what is expected"
        ;;
*)
        fail "unknown case $case"
        ;;
esac
