#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# vs-ovs: the same application tests through three ways of joining two network namespaces: a direct
# veth pair (the upper bound), Open vSwitch 3.1's userspace datapath (optionally with its
# experimental userspace TSO), and Spillway's real-time driver. Runs are interleaved (run r brings
# every mode up in turn, in an order rotated by r, runs every test, and tears the mode down) so that
# the noise of a shared machine falls on every mode alike; the table gives per-mode medians with
# min-max and ratios of medians. See bench/README.md for what each mode is and the caveats.
#
# Needs root, iproute2, iperf3, wrk, nginx, python3; redis for --all-apps; openvswitch-switch for
# the ovs modes; target/release/spillway and bench/testbed-vs-ovs.toml for the spillway mode. A mode
# whose prerequisite is missing is skipped with the reason. The udp-flood test runs
# `spillway traffic gen|sink` (target/release/spillway) in every mode and fails without it.
#
# Exit status: 0 all tests passed; 1 some test or teardown failed (reasons printed); 2 bad usage,
# missing tools or nothing to run; 130 interrupted (everything is cleaned up first).

set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/common.sh
source "$ROOT/bench/lib/common.sh"
# shellcheck source=lib/apps.sh
source "$ROOT/bench/lib/apps.sh"
# shellcheck source=lib/modes.sh
source "$ROOT/bench/lib/modes.sh"
# shellcheck source=lib/report.sh
source "$ROOT/bench/lib/report.sh"

ALL_MODES=(veth ovs ovs-tso spillway spillway-2t spillway-syscalls dpu-only elastic)
LOCK_FILE=/run/swvs-bench.lock
TMP_PREFIX=/tmp/swvs-bench.

usage() {
    cat <<EOF
usage: bash bench/vs-ovs.sh [options]

  --modes LIST      comma-separated modes out of: ${ALL_MODES[*]}
                    (default: veth,ovs,spillway; with --tso also ovs-tso)
  --tso             add ovs-tso (OVS with other_config:userspace-tso-enable=true) to the default
  --runs N          interleaved runs (default 5)
  --duration S      seconds per test (default 10)
  --quick           3 seconds per test
  --all-apps        also wrk keep-alive and redis-benchmark get/set
  --redis-requests N  requests per redis-benchmark test (default 10000 per second of --duration)
  --json FILE       write raw values, medians, min/max, ratios and failures as JSON
  --keep-logs DIR   keep each mode's logs and raw client output under DIR
  -h, --help        this text

environment:
  SPILLWAY          spillway binary (default: target/release/spillway in the repository)
  SPILLWAY_CONFIG   its config (default: bench/testbed-vs-ovs.toml in the repository)
EOF
}

# absolute PATH: PATH resolved against the directory the script was started from.
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }

MODES_ARG='' TSO=0 RUNS=5 DURATION=10 QUICK=0 DURATION_SET=0 ALL_APPS=0 REDIS_REQUESTS=0
JSON_OUT='' KEEP_LOGS=''
while (($#)); do
    case $1 in
    --modes) MODES_ARG=${2:?--modes needs a list}; shift ;;
    --modes=*) MODES_ARG=${1#*=} ;;
    --tso) TSO=1 ;;
    --runs) RUNS=${2:?--runs needs a number}; shift ;;
    --runs=*) RUNS=${1#*=} ;;
    --duration) DURATION=${2:?--duration needs seconds}; DURATION_SET=1; shift ;;
    --duration=*) DURATION=${1#*=}; DURATION_SET=1 ;;
    --quick) QUICK=1 ;;
    --all-apps) ALL_APPS=1 ;;
    --redis-requests) REDIS_REQUESTS=${2:?--redis-requests needs a number}; shift ;;
    --json) JSON_OUT=$(absolute "${2:?--json needs a file}"); shift ;;
    --json=*) JSON_OUT=$(absolute "${1#*=}") ;;
    --keep-logs) KEEP_LOGS=$(absolute "${2:?--keep-logs needs a directory}"); shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
    shift
done
((QUICK && !DURATION_SET)) && DURATION=3
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive integer, not '$RUNS'"
[[ $DURATION =~ ^[1-9][0-9]*$ ]] || die "--duration must be a positive integer, not '$DURATION'"
[[ $REDIS_REQUESTS =~ ^[0-9]+$ ]] || die "--redis-requests must be an integer"
[[ -z $JSON_OUT || -d ${JSON_OUT%/*} ]] || die "--json: directory ${JSON_OUT%/*} does not exist"

if [[ -n $MODES_ARG ]]; then
    IFS=, read -r -a MODES <<<"$MODES_ARG"
else
    MODES=(veth ovs spillway)
    ((TSO)) && MODES=(veth ovs ovs-tso spillway)
fi
for m in "${MODES[@]}"; do
    [[ " ${ALL_MODES[*]} " == *" $m "* ]] || die "unknown mode '$m' (modes: ${ALL_MODES[*]})"
done

if [[ -n ${SPILLWAY:-} && $SPILLWAY == */* ]]; then
    SPILLWAY_BIN=$(absolute "$SPILLWAY")
elif [[ -n ${SPILLWAY:-} ]]; then
    SPILLWAY_BIN=$(command -v "$SPILLWAY" || echo "$SPILLWAY")
else
    SPILLWAY_BIN=$ROOT/target/release/spillway
fi
SPILLWAY_CONFIG=$(absolute "${SPILLWAY_CONFIG:-$ROOT/bench/testbed-vs-ovs.toml}")
APPS_CONFIG=$(absolute "${APPS_CONFIG:-$ROOT/bench/testbed-apps-vs.toml}")

TESTS=(tcp udp udp-flood http_close)
((ALL_APPS)) && TESTS+=(http_keepalive redis)

# ---- preflight ----------------------------------------------------------------------------------

((EUID == 0)) || die "must run as root (network namespaces, TAP devices)"
need=(ip ss timeout flock iperf3 wrk nginx python3)
((ALL_APPS)) && need+=(redis-server redis-benchmark)
for c in "${need[@]}"; do
    command -v "$c" >/dev/null || die "$c is not installed"
done

# One run at a time on the machine: the namespace names are fixed. The lock's descriptor (9) is
# closed in everything we start (start_bg, run_client, the OVS daemons), so a daemon that outlives
# a crash cannot hold it.
exec 9>"$LOCK_FILE"
flock -n 9 || die "another vs-ovs run holds $LOCK_FILE"

# cleanup_stale: what a crashed or killed run left behind. Holding the lock, every $TMP_PREFIX*
# directory belongs to a dead run; its pids file names the processes it started, each ended only
# if its command name still matches (pids get reused).
cleanup_stale() {
    local d pid comm sig
    for d in "$TMP_PREFIX"*; do
        [[ -d $d ]] || continue
        if [[ -f $d/pids ]]; then
            while read -r pid comm; do
                [[ -n $pid && $(pid_comm "$pid") == "$comm" ]] || continue
                pid_alive "$pid" || continue
                sig=TERM
                [[ $comm == spillway* ]] && sig=INT
                log "ending leftover $comm (pid $pid) from $d"
                stop_pid "$pid" "$sig" 10
            done <"$d/pids"
            await_reaped "$d/pids"
        fi
        log "removing leftover $d"
        rm -rf "$d"
    done
    for d in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep '^swvs-'); do
        log "removing leftover namespace $d"
        ns_delete "$d"
    done
    root_links_delete
}

# leak_check: after a mode's teardown nothing of it may remain; anything that does is a failure of
# that run (a teardown bug) and is removed so the next mode starts clean.
leak_check() {
    local left pid comm
    left=$(ip netns list 2>/dev/null | awk '{ print $1 }' | grep '^swvs-' | tr '\n' ' ')
    [[ -n $left ]] && fail teardown "namespaces left: $left"
    left=$(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep '^swvs-' | tr '\n' ' ')
    [[ -n $left ]] && fail teardown "links left in the root namespace: $left"
    while read -r pid comm; do
        if [[ $(pid_comm "$pid") == "$comm" ]] && pid_alive "$pid"; then
            fail teardown "process left running: $comm (pid $pid)"
            stop_pid "$pid" KILL 1
        fi
    done <"$TMP/pids"
    cleanup_namespaces_and_links
}
cleanup_namespaces_and_links() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep '^swvs-'); do ns_delete "$ns"; done
    root_links_delete
}

cleanup_stale

TMP=$(mktemp -d "${TMP_PREFIX}XXXXXX") || die "mktemp failed"
: >"$TMP/pids"
: >"$TMP/results.tsv"
: >"$TMP/failures.tsv"
: >"$TMP/skipped.tsv"
: >"$TMP/order.tsv"

CURRENT_MODE=
# shellcheck disable=SC2317 # the trap handlers below are reached through `trap`
on_exit() {
    local rc=$?
    trap '' INT TERM HUP PIPE
    trap - EXIT
    if [[ -n $CLIENT_PID ]]; then stop_pid "$CLIENT_PID"; fi
    stop_bg
    if [[ -n $CURRENT_MODE ]]; then
        log "cleaning up mode $CURRENT_MODE"
        "mode_down_$CURRENT_MODE"
    fi
    cleanup_namespaces_and_links
    await_reaped "$TMP/pids"
    rm -rf "$TMP"
    exit "$rc"
}
# shellcheck disable=SC2317
on_signal() {
    # Ignore further signals first: with SIGPIPE (stderr piped into `head`, say) the log line below
    # would otherwise raise the same signal again inside its own handler.
    trap '' INT TERM HUP PIPE
    log "interrupted by SIG$1; cleaning up"
    exit 130
}
trap on_exit EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP
trap 'on_signal PIPE' PIPE

# ---- modes that can run here ----------------------------------------------------------------------

RUN_MODES=()
for m in "${MODES[@]}"; do
    why=$("mode_missing_$m")
    if [[ -n $why ]]; then
        log "skipping mode $m: $why"
        printf '%s\t%s\n' "$m" "$why" >>"$TMP/skipped.tsv"
    else
        RUN_MODES+=("$m")
    fi
done
((${#RUN_MODES[@]})) || die "no selected mode can run here (see the skip messages above)"

log "modes ${RUN_MODES[*]}; tests ${TESTS[*]}; $RUNS runs of ${DURATION} s per test; $(nproc) CPUs, nothing pinned"

# ---- interleaved runs ---------------------------------------------------------------------------

n=${#RUN_MODES[@]}
for ((RUN = 1; RUN <= RUNS; RUN++)); do
    order=()
    for ((i = 0; i < n; i++)); do order+=("${RUN_MODES[(i + RUN - 1) % n]}"); done
    printf '%s\t%s\n' "$RUN" "$(IFS=,; echo "${order[*]}")" >>"$TMP/order.tsv"
    for MODE in "${order[@]}"; do
        MODE_DIR=$TMP/run$RUN-$MODE
        mkdir -p "$MODE_DIR"
        CURRENT_MODE=$MODE
        FAIL_REASON=
        log "run $RUN/$RUNS $MODE: up"
        if ! "mode_up_$MODE"; then
            fail setup "${FAIL_REASON:-mode_up_$MODE failed}"
        elif ! servers_start; then
            fail setup "$FAIL_REASON"
        else
            run_tests
        fi
        log "run $RUN/$RUNS $MODE: down"
        stop_bg
        "mode_down_$MODE"
        CURRENT_MODE=
        leak_check
        if [[ -n $KEEP_LOGS ]]; then
            mkdir -p "$KEEP_LOGS/run$RUN-$MODE"
            (cd "$MODE_DIR" && find . -type f ! -name conf.db -exec cp --parents {} "$KEEP_LOGS/run$RUN-$MODE/" \;)
        fi
        rm -rf "$MODE_DIR"
    done
done

# ---- report -------------------------------------------------------------------------------------

BENCH_MODES=$(IFS=,; echo "${RUN_MODES[*]}") BENCH_RUNS=$RUNS BENCH_DURATION=$DURATION \
    BENCH_CPUS=$(nproc) BENCH_KERNEL=$(uname -r) BENCH_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
    report "$JSON_OUT" || FAILED=1
exit $((FAILED ? 1 : 0))
