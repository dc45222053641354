# shellcheck shell=bash
# Helpers shared by bench/vs-ovs.sh: logging, the processes a run starts (tracked by pid, so that
# cleanup ends exactly those and nothing else), and the two network namespaces every mode provides.
#
# Every process this script starts is recorded in "$TMP/pids" as "pid comm" before anything else
# happens, so that a later run can end the leftovers of a crashed one by id (checking /proc/PID/comm
# first, so a recycled pid is never hit).

NS_A=swvs-a
NS_B=swvs-b
IP_A=10.77.0.1
IP_B=10.77.0.2
PREFIX_LEN=24
MTU=1500

log() { printf '[vs-ovs %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 2; }

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
    local state
    [[ -r /proc/$1/stat ]] || return 1
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# ticks PID: the CPU time the process has used so far, every thread of it, in clock ticks (0 if
# it is gone).
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# pid_comm PID: the process's command name, empty if it is gone.
pid_comm() { cat "/proc/$1/comm" 2>/dev/null; }

# remember_pid PID CMD...: record a process this run is responsible for (see the header) under the
# name the kernel will give it once it has exec'd: that of CMD, looking through `ip netns exec NS`.
remember_pid() {
    local pid=$1
    shift
    if [[ $1 == ip && $2 == netns && $3 == exec ]]; then shift 4; fi
    local comm=${1##*/}
    printf '%s %s\n' "$pid" "${comm:0:15}" >>"$TMP/pids"
}

# stop_pid PID [SIGNAL] [GRACE_SECONDS]: send SIGNAL (TERM), wait up to GRACE seconds (5) for the
# process to go, then SIGKILL it. Reaps it when it is our child. Returns 1 if SIGKILL was needed.
stop_pid() {
    local pid=$1 sig=${2:-TERM} grace=${3:-5} i rc=0
    [[ -n $pid ]] || return 0
    if pid_alive "$pid"; then
        kill "-$sig" "$pid" 2>/dev/null
        for ((i = 0; i < grace * 10; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        if pid_alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null
            rc=1
            for ((i = 0; i < 20; i++)); do
                pid_alive "$pid" || break
                sleep 0.1
            done
        fi
    fi
    wait "$pid" 2>/dev/null
    return "$rc"
}

# await_reaped PIDFILE: a daemon we stopped (not our child) stays a zombie until init reaps it;
# wait up to 3 s in all for the processes listed in PIDFILE to vanish, so that a `pgrep` right
# after the run comes back empty.
await_reaped() {
    local pid comm i
    [[ -f $1 ]] || return 0
    while read -r pid comm; do
        for ((i = 0; i < 30; i++)); do
            [[ -e /proc/$pid && $(pid_comm "$pid") == "$comm" ]] || break
            sleep 0.1
        done
    done <"$1"
}

# start_bg LOG CMD...: start CMD in the background with stdout+stderr in LOG; the pid is left in
# LAST_PID and added to BG_PIDS (stopped by stop_bg or the exit trap). start_bg_in DIR LOG CMD...
# does the same from directory DIR. The subshell execs CMD, so the pid is CMD's own, and resets
# SIGINT, which bash would otherwise leave ignored in a background command: `spillway run` is
# stopped with SIGINT.
BG_PIDS=()
start_bg() { start_bg_in . "$@"; }
start_bg_in() {
    local dir=$1 out=$2
    shift 2
    (
        trap - INT QUIT
        exec 9>&- # the run's lock, see vs-ovs.sh
        cd "$dir" && exec "$@"
    ) >"$out" 2>&1 &
    LAST_PID=$!
    BG_PIDS+=("$LAST_PID")
    remember_pid "$LAST_PID" "$@"
}

# stop_bg: stop every process start_bg started, newest first.
stop_bg() {
    local i
    for ((i = ${#BG_PIDS[@]} - 1; i >= 0; i--)); do
        stop_pid "${BG_PIDS[i]}"
    done
    BG_PIDS=()
}

# run_client TIMEOUT OUT CMD...: run a test client to completion (stdout in OUT, stderr in
# OUT.err), killed after TIMEOUT seconds. It runs in the background and we `wait` for it, so that
# Ctrl-C runs the trap at once instead of after the client finishes.
CLIENT_PID=
run_client() {
    local limit=$1 out=$2 rc
    shift 2
    timeout -k 5 "$limit" "$@" >"$out" 2>"$out.err" 9>&- &
    CLIENT_PID=$!
    remember_pid "$CLIENT_PID" timeout
    wait "$CLIENT_PID"
    rc=$?
    CLIENT_PID=
    return "$rc"
}

# nsx NS CMD...: run CMD inside namespace NS.
nsx() {
    local ns=$1
    shift
    ip netns exec "$ns" "$@"
}

ns_exists() { ip netns list 2>/dev/null | awk '{ print $1 }' | grep -qx "$1"; }

# ns_configure NS ADDR: the common interface setup inside a namespace whose eth0 already exists.
ns_configure() {
    local ns=$1 addr=$2
    ip -n "$ns" link set lo up &&
        ip -n "$ns" link set eth0 mtu "$MTU" &&
        ip -n "$ns" addr add "$addr/$PREFIX_LEN" dev eth0 &&
        ip -n "$ns" link set eth0 up
}

# ns_delete NS: end the processes we know inside NS (a deleted namespace lives on while a process
# holds it), then delete it. Processes with other names are reported, not killed.
OUR_COMMS='^(iperf3|nginx|redis-server|redis-benchmark|wrk|timeout|spillway)$'
ns_delete() {
    local ns=$1 pid comm
    ns_exists "$ns" || return 0
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
        comm=$(pid_comm "$pid")
        if [[ $comm =~ $OUR_COMMS ]]; then
            stop_pid "$pid"
        else
            log "warning: process $pid ($comm) in namespace $ns is not ours; left running"
        fi
    done
    ip netns del "$ns" 2>/dev/null || log "warning: could not delete namespace $ns"
}

# root_links_delete: delete links named swvs-* in the root namespace (a crashed OVS mode can leave
# its persistent TAP devices behind).
root_links_delete() {
    local dev
    for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep '^swvs-'); do
        log "removing leftover link $dev"
        ip link del "$dev" 2>/dev/null || log "warning: could not delete link $dev"
    done
}

# wait_for SECONDS CMD...: poll CMD every 0.1 s until it succeeds; 1 if it never does.
wait_for() {
    local limit=$1 i
    shift
    for ((i = 0; i < limit * 10; i++)); do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}

# listening NS PORT: something listens on TCP PORT inside NS.
listening() { [[ -n $(ip netns exec "$1" ss -Hltn "sport = :$2" 2>/dev/null) ]]; }

# reachable PORT: a TCP connection from a to b:PORT succeeds (there is no ping on the machine).
reachable() {
    timeout 2 ip netns exec "$NS_A" bash -c "exec 3<>/dev/tcp/$IP_B/$1" 2>/dev/null
}

# tail_of FILE: the last lines of FILE on one line, for failure reasons.
tail_of() {
    [[ -s $1 ]] || { echo "(${1##*/} empty)"; return; }
    tail -n "${2:-3}" "$1" | tr '\n' ' ' | cut -c1-400
}
