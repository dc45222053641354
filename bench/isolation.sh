#!/usr/bin/env bash
# isolation: does a busy spill plane, pinned to its cpuset, disturb a co-located tenant? A
# tenant's redis (server and redis-benchmark, pinned to CPU 0, on loopback: it never crosses the
# fabric) is measured while the testbed carries a steady UDP load (64-byte datagrams from
# swvs-a to swvs-b at --rate pps over 8 flows, above the emulated DPU's 30 kpps fast path) in
# three states, interleaved:
#
#   quiet     no testbed at all: the tenant alone
#   released  the testbed up, the plane released (`--hold released`): the DPU process carries
#             what its limits admit and drops the rest
#   active    the plane held active: the plane process, in its cgroup with cpuset "1",
#             carries the overflow
#
# Everything of the fabric (the DPU process, hence the plane it starts, the generator and the
# sink) is pinned to CPU 1, the tenant to CPU 0: on this 2-core machine that is the nearest to
# the seed's set-up (the plane on idle isolated host cores, tenants on theirs, the DPU on its
# own SoC). The figure is the tenant's p99 latency with the plane active against released.
#
#   sudo bash bench/isolation.sh [--runs N] [--rate PPS] [--requests N] [--json FILE]
#
# Uses target/release/spillway (or $SPILLWAY) and bench/testbed-apps-vs.toml; needs root,
# python3, redis-server, redis-benchmark, taskset. Prints medians [min-max] per state.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPILLWAY:-$ROOT/target/release/spillway}
CONFIG=$ROOT/bench/testbed-apps-vs.toml
RUNS=5 RATE=60000 REQUESTS=200000 JSON=
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) RUNS=${2:?}; shift 2 ;;
        --rate) RATE=${2:?}; shift 2 ;;
        --requests) REQUESTS=${2:?}; shift 2 ;;
        --json) JSON=${2:?}; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--rate PPS] [--requests N] [--json FILE]" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[1-9][0-9]?$ && $RATE =~ ^[1-9][0-9]*$ && $REQUESTS =~ ^[1-9][0-9]*$ ]] ||
    { echo "--runs 1..99, --rate and --requests positive integers" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces, TAP devices)" >&2; exit 2; }
[[ -x $BIN ]] || { echo "$BIN not found (cargo build --release -p spillway)" >&2; exit 2; }
for p in redis-server redis-benchmark redis-cli taskset python3; do
    command -v $p >/dev/null || { echo "needs $p" >&2; exit 2; }
done
(($(nproc) >= 2)) || { echo "needs 2 CPUs" >&2; exit 2; }

TMP=$(mktemp -d /tmp/spillway-isolation.XXXXXX)
DAEMON= GEN= SINK= REDIS_PORT=6391
cleanup() {
    for p in $GEN $SINK; do kill "$p" 2>/dev/null || true; done
    stop_daemon
    redis-cli -p $REDIS_PORT shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

# The tenant: its own redis on CPU 0.
taskset -c 0 redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --logfile "$TMP/redis.log" --dir "$TMP"
for _ in $(seq 50); do redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p $REDIS_PORT set key value >/dev/null

# The tenant's latency now: prints "p50 p99 rps".
tenant() {
    taskset -c 0 redis-benchmark -p $REDIS_PORT -t get -n "$REQUESTS" -c 10 --csv 2>/dev/null |
        python3 -c 'import csv,sys; r=list(csv.DictReader(sys.stdin))[0]; print(r["p50_latency_ms"], r["p99_latency_ms"], r["rps"])'
}

# One run in state $1: prints "state p50 p99 rps plane_cores".
one_run() {
    local state=$1 plane_pid=0 t0=0 t1=0 secs
    if [[ $state != quiet ]]; then
        rm -f "$TMP/ready"
        # The DPU process (and so the plane it starts) on CPU 1; the plane's cgroup says "1" too.
        taskset -c 1 "$BIN" run --config "$CONFIG" --ready-file "$TMP/ready" --log warn --hold "$state" \
            >/dev/null 2>"$TMP/daemon.log" &
        DAEMON=$!
        for _ in $(seq 100); do [[ -e $TMP/ready ]] && break; sleep 0.1; done
        [[ -e $TMP/ready ]] || { echo "spillway run did not come up" >&2; return 1; }
        [[ $state == active ]] && wait_phase active
        ip netns exec swvs-b taskset -c 1 "$BIN" traffic sink --bind 10.77.0.2:9000 --idle 2 >/dev/null &
        SINK=$!
        ip netns exec swvs-a taskset -c 1 "$BIN" traffic gen --dst 10.77.0.2:9000 --size 18 \
            --flows 8 --rate "$RATE" --duration 60 >/dev/null &
        GEN=$!
        sleep 1
        if [[ $state == active ]]; then
            plane_pid=$(ctl status | python3 -c 'import json,sys; print(json.load(sys.stdin)["plane"]["pid"])')
            t0=$(awk '{print $14 + $15}' "/proc/$plane_pid/stat")
        fi
    fi
    local start=$SECONDS out
    out=$(tenant)
    secs=$((SECONDS - start > 0 ? SECONDS - start : 1))
    local cores=0
    if [[ $plane_pid != 0 ]]; then
        t1=$(awk '{print $14 + $15}' "/proc/$plane_pid/stat")
        cores=$(python3 -c "print(round(($t1 - $t0) / $(getconf CLK_TCK) / $secs, 2))")
    fi
    if [[ $state != quiet ]]; then
        kill "$GEN" 2>/dev/null || true; wait "$GEN" 2>/dev/null || true; GEN=
        kill "$SINK" 2>/dev/null || true; wait "$SINK" 2>/dev/null || true; SINK=
        stop_daemon; DAEMON=
    fi
    echo "$state $out $cores"
}

: >"$TMP/runs.txt"
STATES=(quiet released active)
for ((r = 0; r < RUNS; r++)); do
    for ((k = 0; k < 3; k++)); do
        line=$(one_run "${STATES[$(((r + k) % 3))]}") || { echo "run $((r + 1)) failed" >&2; exit 1; }
        echo "$line" | tee -a "$TMP/runs.txt" >&2
    done
done
python3 - "$TMP/runs.txt" "$JSON" "$RATE" <<'PY'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
out = {}
for st in ("quiet", "released", "active"):
    rs = [r for r in rows if r[0] == st]
    fig = {}
    for i, k in ((1, "p50_ms"), (2, "p99_ms"), (3, "rps"), (4, "plane_cores")):
        v = [float(r[i]) for r in rs]
        fig[k] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
    out[st] = fig
print(f"tenant redis GET on CPU 0; fabric on CPU 1 carrying {sys.argv[3]} pps of 64-byte UDP")
print(f"{'state':<9} {'p50 ms':>22} {'p99 ms':>22} {'req/s':>28} {'plane cores':>20}")
cell = lambda f, d=3: f"{f['median']:.{d}f} [{f['min']:.{d}f}-{f['max']:.{d}f}]"
for st, f in out.items():
    print(f"{st:<9} {cell(f['p50_ms']):>22} {cell(f['p99_ms']):>22} {cell(f['rps'], 0):>28} {cell(f['plane_cores'], 2):>20}")
ratio = out["active"]["p99_ms"]["median"] / out["released"]["p99_ms"]["median"]
print(f"p99 active / released: {ratio:.3f}")
if sys.argv[2]:
    json.dump({"runs": rows, "summary": out, "p99_active_over_released": ratio}, open(sys.argv[2], "w"), indent=2)
PY
