#!/usr/bin/env bash
# flood-per-core: packets per second per forwarding core of Spillway's DPU process, for each of
# its TAP I/O paths (`--tap-io io_uring` and `syscalls`, docs/adr/0005-tap-io.md), and what the
# spill plane costs when it carries the flood (`plane`: held active, every redirect bucket live,
# so every packet goes DPU -> plane -> DPU), and the DPU process forwarding on two threads
# (`shards2`: `fabric.dpu.shards = 2`, io_uring, docs/adr/0011-sharded-forwarding.md), and both
# processes on two threads each with the plane carrying the flood (`plane2`); the last two are
# not in the default set. Each run brings up bench/testbed-vs-ovs.toml, floods
# 64-byte UDP from swvs-a to swvs-b with `spillway traffic gen|sink`, and reads the DPU process's
# (and the plane's) CPU time from /proc/<pid>/stat over the generator's run, and the plane's
# resident memory (VmRSS) once it is active, before any traffic, and at the end. Runs are
# interleaved (the mode order rotates each run); the table gives medians [min-max]. With
# --perf DIR, the last run of each mode also records a call-graph profile of the DPU process
# (perf record -g) into DIR.
#
# Needs root, iproute2, python3, target/release/spillway (or SPILLWAY=path); perf for --perf.
# Exit status: 0 done; 1 a run failed (the reason is printed); 2 bad usage.
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SPILLWAY_BIN=${SPILLWAY:-$ROOT/target/release/spillway}
CONFIG=${SPILLWAY_CONFIG:-$ROOT/bench/testbed-vs-ovs.toml}
RUNS=5 DURATION=5 FLOWS=8 PERF_DIR='' JSON_OUT='' RATE='' KEEP=''
MODES=(io_uring syscalls plane)

usage() {
    cat <<EOF
usage: bash bench/flood-per-core.sh [--runs N] [--duration S] [--modes LIST] [--rate PPS]
                                    [--perf DIR] [--json FILE] [--keep-logs DIR]
  --modes LIST   comma-separated, out of io_uring, syscalls, plane, shards2, plane2
                 (default: the first three)
  --rate PPS     pace the generator (default: flat out)
  --keep-logs D  keep each run's spillway log and status under D
EOF
}
while (($#)); do
    case $1 in
    --runs) RUNS=${2:?}; shift ;;
    --duration) DURATION=${2:?}; shift ;;
    --perf) PERF_DIR=${2:?}; shift ;;
    --json) JSON_OUT=${2:?}; shift ;;
    --modes) IFS=, read -r -a MODES <<<"${2:?}"; shift ;;
    --rate) RATE=${2:?}; shift ;;
    --keep-logs) KEEP=${2:?}; mkdir -p "$KEEP"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
    shift
done
[[ $RUNS =~ ^[1-9][0-9]?$ && $DURATION =~ ^[1-9][0-9]?$ ]] || { echo "--runs and --duration: 1..99" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces, TAP devices)" >&2; exit 2; }
[[ -x $SPILLWAY_BIN ]] || { echo "$SPILLWAY_BIN not found (cargo build --release -p spillway)" >&2; exit 2; }
if [[ -n $PERF_DIR ]]; then
    command -v perf >/dev/null || { echo "--perf needs perf (Debian: linux-perf)" >&2; exit 2; }
    mkdir -p "$PERF_DIR"
fi

WORK=$(mktemp -d /tmp/swvs-flood.XXXXXX)
SPW_PID=''
cleanup() {
    if [[ -n $SPW_PID ]] && kill -0 "$SPW_PID" 2>/dev/null; then
        kill -INT "$SPW_PID"
        for _ in $(seq 200); do kill -0 "$SPW_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SPW_PID" 2>/dev/null
    fi
    SPW_PID=''
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# One run of mode $1 (run number $2): prints "mode rx_kpps tx_kpps dpu_cores plane_cores
# plane_rss_cold_kb plane_rss_end_kb plane_replaced" (the plane's figures 0 without a plane;
# plane_replaced 1 when the plane measured at the start was gone at the end: the DPU failed
# open and started another, so that run's plane figures measure nothing and are left out).
one_run() {
    local mode=$1 run=$2 ready=$WORK/ready log=$WORK/spillway.log config=$CONFIG
    local args=(--hold released --tap-io "$mode")
    [[ $mode == plane ]] && args=(--hold active --tap-io io_uring)
    if [[ $mode == shards2 || $mode == plane2 ]]; then
        args=(--hold released --tap-io io_uring)
        [[ $mode == plane2 ]] && args=(--hold active --tap-io io_uring)
        config=$WORK/shards2.toml
        sed 's/^\[fabric\.dpu\]$/[fabric.dpu]\nshards = 2/' "$CONFIG" >"$config"
        grep -q '^shards = 2$' "$config" || { echo "$CONFIG has no [fabric.dpu] section" >&2; return 1; }
    fi
    rm -f "$ready"
    (cd "$ROOT" && exec "$SPILLWAY_BIN" run --config "$config" "${args[@]}" \
        --ready-file "$ready" --log info) >"$log" 2>&1 &
    SPW_PID=$!
    for _ in $(seq 300); do [[ -s $ready ]] && break; sleep 0.1; done
    [[ -s $ready ]] || { echo "spillway not ready: $(tail -3 "$log")" >&2; return 1; }
    local dpu plane=0 rss_cold=0 rss_end=0 p0=0 p1=0 replaced=0
    dpu=$(cat "$ready")
    if [[ $mode == plane || $mode == plane2 ]]; then
        for _ in $(seq 200); do
            "$SPILLWAY_BIN" ctl --config "$CONFIG" status 2>/dev/null | grep -q '"phase": *"active"' && break
            sleep 0.1
        done
        plane=$(pgrep -P "$dpu" -f spill-plane | head -1)
        [[ -n $plane ]] || { echo "no plane under $dpu: $(tail -3 "$log")" >&2; return 1; }
        rss_cold=$(rss_kb "$plane")
    fi
    ip netns exec swvs-b "$SPILLWAY_BIN" traffic sink --bind 10.77.0.2:9000 --json --idle 2 \
        --wait $((DURATION + 30)) >"$WORK/sink.json" 2>&1 &
    local sink=$!
    sleep 0.5
    local t0 c0 t1 c1 perf_pid=''
    t0=$(date +%s%N) c0=$(ticks "$dpu")
    ((plane)) && p0=$(ticks "$plane")
    if [[ -n $PERF_DIR && $run == "$RUNS" ]]; then
        perf record -g -o "$PERF_DIR/dpu-$mode.data" -p "$dpu" -- sleep $((DURATION - 1)) \
            >/dev/null 2>&1 &
        perf_pid=$!
    fi
    ip netns exec swvs-a "$SPILLWAY_BIN" traffic gen --dst 10.77.0.2:9000 --size 18 \
        --flows "$FLOWS" --duration "$DURATION" ${RATE:+--rate "$RATE"} --json >"$WORK/gen.json" 2>&1
    t1=$(date +%s%N) c1=$(ticks "$dpu")
    if ((plane)); then
        p1=$(ticks "$plane")
        rss_end=$(rss_kb "$plane")
        if ! kill -0 "$plane" 2>/dev/null || ((p1 < p0)); then
            replaced=1
            echo "[flood-per-core] run $run: the plane (pid $plane) was replaced during the run (a fail-open); its figures are left out" >&2
        fi
    fi
    [[ -n $perf_pid ]] && wait "$perf_pid"
    wait "$sink"
    if [[ -n $KEEP ]]; then
        "$SPILLWAY_BIN" ctl --config "$CONFIG" status >"$KEEP/status-$mode-$run.json" 2>&1
    fi
    kill -INT "$SPW_PID"
    wait "$SPW_PID" 2>/dev/null
    SPW_PID=''
    [[ -n $KEEP ]] && cp "$log" "$KEEP/spillway-$mode-$run.log"
    python3 - "$mode" "$WORK/gen.json" "$WORK/sink.json" "$((c1 - c0))" "$((t1 - t0))" \
        "$(getconf CLK_TCK)" "$((p1 - p0))" "$rss_cold" "$rss_end" "$replaced" <<'PY'
import json, sys
mode, gen_f, sink_f, ticks, ns, hz, pticks, rss_cold, rss_end, replaced = sys.argv[1:]
def last(path):
    with open(path) as f:
        return json.loads([l for l in f if l.startswith("{")][-1])
gen, sink = last(gen_f), last(sink_f)
secs = int(ns) / 1e9
print(mode, sink["pps"] / 1e3, gen["pps"] / 1e3, int(ticks) / int(hz) / secs,
      int(pticks) / int(hz) / secs, rss_cold, rss_end, replaced)
PY
}

: >"$WORK/results"
for ((r = 1; r <= RUNS; r++)); do
    for ((k = 0; k < ${#MODES[@]}; k++)); do
        mode=${MODES[$(((k + r) % ${#MODES[@]}))]}
        echo "[flood-per-core] run $r/$RUNS $mode" >&2
        one_run "$mode" "$r" >>"$WORK/results" || exit 1
    done
done

python3 - "$WORK/results" "$JSON_OUT" "$RUNS" "$DURATION" <<'PY'
import json, statistics, sys
path, json_out, runs, duration = sys.argv[1:]
rows = {}
names = ["rx_kpps", "tx_kpps", "dpu_cores", "kpps_per_dpu_core", "plane_cores",
         "plane_rss_cold_mib", "plane_rss_end_mib"]
replaced = {}
for line in open(path):
    mode, rx, tx, cores, pcores, cold, end, gone = line.split()
    # A run whose plane was replaced keeps its rates; its plane figures are None (left out).
    plane = (None, None) if gone == "1" else (float(pcores), int(end) / 1024)
    replaced.setdefault(mode, []).append(gone == "1")
    rows.setdefault(mode, []).append((float(rx), float(tx), float(cores), float(rx) / float(cores),
                                      plane[0], int(cold) / 1024, plane[1]))
def fmt(xs, f="{:.0f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{f.format(statistics.median(xs))} [{f.format(min(xs))}-{f.format(max(xs))}]"
def stats(xs):
    kept = [x for x in xs if x is not None]
    if not kept:
        return {"median": None, "min": None, "max": None, "runs": list(xs)}
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept), "runs": list(xs)}
print(f"flood-per-core: medians of {runs} interleaved runs, {duration} s each [min-max]")
print(f"{'mode':9} {'rx kpps':>15} {'tx kpps':>15} {'DPU cores':>17} {'kpps/DPU core':>15}"
      f" {'plane cores':>17} {'plane RSS MiB: cold':>20} {'end':>15}")
out = {}
for mode, v in rows.items():
    c = list(zip(*v))
    print(f"{mode:9} {fmt(c[0]):>15} {fmt(c[1]):>15} {fmt(c[2], '{:.2f}'):>17} {fmt(c[3]):>15}"
          f" {fmt(c[4], '{:.2f}'):>17} {fmt(c[5], '{:.1f}'):>20} {fmt(c[6], '{:.1f}'):>15}")
    out[mode] = {k: stats(x) for k, x in zip(names, c)}
    out[mode]["plane_replaced_runs"] = sum(replaced[mode])
    if any(replaced[mode]):
        print(f"  {mode}: in {sum(replaced[mode])} of {len(replaced[mode])} runs the plane failed "
              "open and was replaced; those runs' plane figures are left out")
if json_out:
    with open(json_out, "w") as f:
        json.dump(out, f, indent=1)
PY
