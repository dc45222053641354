#!/usr/bin/env bash
# failover: the forwarding gap a plane failure or an upgrade costs an established flow, in real
# time. A probe flow of 1,000 UDP datagrams per second (sequence-numbered) runs from swvs-a to
# swvs-b through the spill plane (the testbed is held active, so the flow is the plane's); 1.5 s
# in, one of these happens to the active plane:
#
#   cold     kill -9, no warm standby: the DPU fails open and starts a new plane
#   warm     kill -9 with a warm standby plane ready (`warm_standby = true`): the DPU flips
#   stall    SIGSTOP for 2 s with a warm standby ready: missed heartbeats, fence, flip
#   upgrade  `spillway ctl upgrade`, no warm standby: a new plane is started, synced, the
#            connections handed over, the rules flipped, the old plane retired
#   none     nothing happens: the baseline, what the probe's own scheduling costs on this
#            machine (run with --modes none,... to measure it beside the others)
#
# The receiver reports the largest time between two datagrams (the forwarding gap), the
# datagrams lost (from sequence numbers) and the longest run of consecutive losses; with a warm
# standby, the script also reports what the standby costs while it waits (its resident memory
# and the CPU it used over the 1.5 s before the event). Runs are
# interleaved (the mode order rotates each run); the table gives medians [min-max].
#
#   sudo bash bench/failover.sh [--runs N] [--modes none,cold,warm,stall,upgrade] [--json FILE]
#                               [--shards N]   (forwarding threads, `fabric.dpu.shards`; 1)
#                               [--keep-logs DIR]   (each run's status after it and daemon log)
#
# With --shards N > 1 the probe is 8 such flows (one flow hashes to one thread's shard only);
# the gap and the longest loss run are the worst flow's, the losses all flows'.
#
# Uses target/release/spillway (or $SPILLWAY) and bench/testbed-apps-vs.toml; needs root and
# python3. Exit status: 0 done; 1 a run failed (the reason is printed); 2 bad usage.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPILLWAY:-$ROOT/target/release/spillway}
BASE=$ROOT/bench/testbed-apps-vs.toml
RUNS=5 SHARDS=1
JSON= KEEP=
MODES=(none cold warm stall upgrade)
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) RUNS=${2:?}; shift 2 ;;
        --modes) IFS=, read -r -a MODES <<<"${2:?}"; shift 2 ;;
        --json) JSON=${2:?}; shift 2 ;;
        --keep-logs) KEEP=${2:?}; mkdir -p "$KEEP"; shift 2 ;;
        --shards) SHARDS=${2:?}; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--modes none,cold,warm,stall,upgrade] [--json FILE] [--shards N] [--keep-logs DIR]" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[1-9][0-9]?$ ]] || { echo "--runs: 1..99" >&2; exit 2; }
[[ $SHARDS =~ ^[1-8]$ ]] || { echo "--shards: 1..8" >&2; exit 2; }
for m in "${MODES[@]}"; do
    [[ $m =~ ^(none|cold|warm|stall|upgrade)$ ]] || { echo "unknown mode $m" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces, TAP devices)" >&2; exit 2; }
[[ -x $BIN ]] || { echo "$BIN not found (cargo build --release -p spillway)" >&2; exit 2; }

TMP=$(mktemp -d /tmp/spillway-failover.XXXXXX)
DAEMON= SINK= SEND=
cleanup() {
    for p in $SINK $SEND; do kill "$p" 2>/dev/null || true; done
    stop_daemon
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
CONFIG=$TMP/testbed.toml
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
status_field() { ctl status | python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"; }

# The probe's receiver: prints one JSON object when the sender's datagrams stop for 2 s. Each
# datagram carries its flow's number and its sequence number in that flow; the figures are the
# worst flow's gap and loss run, and the losses of all flows; `rcvbuf_errors` counts what the
# receiver's own socket dropped (its namespace's UDP RcvbufErrors), which is no switch's loss.
SINK_PY='
import json, socket, struct, time
def rcvbuf_errors():
    rows = [l.split() for l in open("/proc/net/snmp") if l.startswith("Udp:")]
    return int(rows[1][rows[0].index("RcvbufErrors")])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# 16 MiB past rmem_max (SO_RCVBUFFORCE, root): what a failover takes back from a plane comes
# as a burst, which the default buffer would drop here rather than in the switch.
s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 16 << 20)
s.bind(("10.77.0.2", 9100))
s.settimeout(2.0)
flows = {}; first = None; errors0 = rcvbuf_errors()
while True:
    try:
        d, _ = s.recvfrom(64)
    except socket.timeout:
        if first is not None:
            break
        continue
    t = time.monotonic()
    if first is None:
        first = t
    f, seq = struct.unpack("!HI", d[:6])
    st = flows.setdefault(f, {"last": None, "gap": 0.0, "gap_at": 0.0, "seen": set()})
    if st["last"] is not None and t - st["last"] > st["gap"]:
        st["gap"], st["gap_at"] = t - st["last"], st["last"] - first
    st["last"] = t
    st["seen"].add(seq)
lost = best = received = top_all = 0; gap = gap_at = 0.0
for st in flows.values():
    top = max(st["seen"]) + 1
    run = 0
    for i in range(top):
        run = 0 if i in st["seen"] else run + 1
        best = max(best, run)
    lost += top - len(st["seen"]); received += len(st["seen"]); top_all += top
    if st["gap"] > gap:
        gap, gap_at = st["gap"], st["gap_at"]
print(json.dumps({"flows": len(flows), "received": received, "sent_seen": top_all,
                  "lost": lost, "longest_loss_run": best, "gap_ms": round(gap * 1000, 2),
                  "gap_at_s": round(gap_at, 3), "rcvbuf_errors": rcvbuf_errors() - errors0}))
'
# The probe's sender: $2 flows (sockets), each 1,000 datagrams a second for $1 seconds, each
# datagram with its flow and its sequence number.
SEND_PY='
import socket, struct, sys, time
flows = int(sys.argv[2])
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(flows)]
n = int(float(sys.argv[1]) * 1000)
t0 = time.monotonic()
for i in range(n):
    while time.monotonic() < t0 + i / 1000:
        pass
    for f, s in enumerate(socks):
        s.sendto(struct.pack("!HI", f, i) + b"x" * 12, ("10.77.0.2", 9100))
'
# Probe flows: one, or with several forwarding threads 8, so that every thread's shard has
# some (all 8 on one of two shards: 1 in 128).
FLOWS=1
[[ $SHARDS -gt 1 ]] && FLOWS=8

# One run of mode $1: prints the receiver's JSON with the mode added.
one_run() {
    local mode=$1 warm=false
    [[ $mode == warm || $mode == stall ]] && warm=true
    sed -e "s/^\[fabric.host\]$/[fabric.host]\nwarm_standby = $warm/" \
        -e "s/^\[fabric.dpu\]$/[fabric.dpu]\nshards = $SHARDS/" "$BASE" >"$CONFIG"
    rm -f "$TMP/ready"
    start_daemon --hold active >"$TMP/report.json"
    wait_phase active
    if [[ $warm == true ]]; then
        for _ in $(seq 200); do [[ $(status_field 's["warm"]') == ready ]] && break; sleep 0.05; done
        [[ $(status_field 's["warm"]') == ready ]] || { echo "$mode: no warm plane" >&2; return 1; }
    fi
    ip netns exec swvs-b python3 -c "$SINK_PY" >"$TMP/probe.json" &
    SINK=$!
    sleep 0.3
    ip netns exec swvs-a python3 -c "$SEND_PY" 5 "$FLOWS" &
    SEND=$!
    # What the standby costs while it waits: its resident memory, and the CPU it used over
    # the 1.5 s before the event (with the probe's 1,000 pps on the active plane).
    local wpid t0 standby_rss=0 standby_cpu=0
    wpid=$(status_field '([p["pid"] for p in s["planes"] if p["role"] == "warm"] + [0])[0]')
    [[ $wpid != 0 ]] && t0=$(ticks "$wpid")
    sleep 1.5
    if [[ $wpid != 0 ]]; then
        standby_rss=$(awk '/^VmRSS/ {print $2}' "/proc/$wpid/status")
        standby_cpu=$(( ($(ticks "$wpid") - t0) * 1000 / $(getconf CLK_TCK) ))
    fi
    local pid
    pid=$(status_field 's["plane"]["pid"]')
    case $mode in
        cold | warm) kill -KILL "$pid" ;;
        stall) kill -STOP "$pid"; sleep 2; kill -CONT "$pid" 2>/dev/null || true ;;
        upgrade) ctl upgrade >/dev/null ;;
        none) ;;
    esac
    wait "$SEND"; SEND=
    wait "$SINK"; SINK=
    if [[ -n $KEEP ]]; then
        ctl status >"$KEEP/$mode-$RUN-status.json"
        cp "$TMP/daemon.log" "$KEEP/$mode-$RUN-daemon.log"
    fi
    local events
    events=$(status_field '",".join(e["event"] for e in reversed(s["events"]) if e["event"] in ("fail_open","fail_over","upgrade_asked","upgrade","upgraded"))')
    stop_daemon; DAEMON=
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.update(mode=sys.argv[2], events=sys.argv[3], standby_rss_kb=int(sys.argv[4]), standby_cpu_ms=int(sys.argv[5])); print(json.dumps(d))' \
        "$TMP/probe.json" "$mode" "$events" "$standby_rss" "$standby_cpu"
}

: >"$TMP/runs.jsonl"
for ((r = 0; r < RUNS; r++)); do
    n=${#MODES[@]}
    for ((k = 0; k < n; k++)); do
        mode=${MODES[$(((r + k) % n))]} RUN=$((r + 1))
        line=$(one_run "$mode") || { echo "run $((r + 1)) of $mode failed" >&2; exit 1; }
        echo "$line" | tee -a "$TMP/runs.jsonl" >&2
    done
done
python3 - "$TMP/runs.jsonl" "$JSON" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = {}
keys = ("gap_ms", "lost", "longest_loss_run", "standby_rss_kb", "standby_cpu_ms")
print(f"{'mode':<9}" + "".join(f"{k:>26}" for k in keys))
for mode in dict.fromkeys(r["mode"] for r in rows):
    rs = [r for r in rows if r["mode"] == mode]
    fig = {}
    for k in keys:
        v = [r[k] for r in rs]
        fig[k] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
    out[mode] = {"runs": len(rs), **fig}
    cell = lambda f: f"{f['median']:.1f} [{f['min']:.1f}-{f['max']:.1f}]"
    print(f"{mode:<9}" + "".join(f"{cell(fig[k]):>26}" for k in keys))
if sys.argv[2]:
    json.dump({"runs": rows, "summary": out}, open(sys.argv[2], "w"), indent=2)
PY
