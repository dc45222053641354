#!/usr/bin/env bash
# vatc: what the spill plane's direct delivery into VM memory (vATC) buys, measured on the
# real-time fabric with shared-memory VM ports (bench/testbed-vatc.toml). A UDP generator in VM a
# (`spillway vm-endpoint --mode gen`) sends 64-byte frames to a sink in VM b, over three paths:
#
#   dpu    the plane released: the DPU carries everything (the baseline)
#   plane  the plane active, vATC off: the DPU steers each packet to the plane, the plane sends
#          it back over the phy vNIC, the DPU writes it into VM b's memory
#   vatc   the plane active, vATC on: the plane translates VM b's receive buffer and copies the
#          packet in itself
#
# Each run of a mode does two measurements: the packet rate the path sustains (the generator
# sends as fast as its transmit queue takes frames; the sink's received packets per second) and
# the one-way latency at a fixed offered rate (--lat-pps; p50 and p99 over every packet). PCIe
# crossings per packet are the DPU model's `pcie.crossings` delta over the packets received.
# Modes are interleaved, the order rotating each run; every run uses fresh flows.
#
# With --sink guest, VM b is a real guest instead (bench/testbed-vatc-guest.toml: a QEMU guest
# built by guest/build.sh on a vhost-user port): the plane's direct delivery goes into the
# guest's receive queue 1, which the DPU process lends it, and the packet rate is the guest's
# own count of what eth0 received (it prints it every half second with its uptime; the rate is
# taken between the second and the second-to-last of those lines printed while the generator
# ran), at --lat-pps and flat out. No latency then (the guest has no timestamping sink).
#
#   sudo bash bench/vatc.sh [--runs N] [--duration S] [--lat-pps R] [--sink endpoint|guest] [--json FILE]
#
# Uses target/release/spillway (or $SPILLWAY); needs root and python3. Prints per-mode
# median [min - max] and the ratio of each mode's packet rate to the dpu baseline's.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPILLWAY:-$ROOT/target/release/spillway}
CONFIG=$ROOT/bench/testbed-vatc.toml
RUNS=5
DURATION=5
LAT_PPS=20000
JSON=
SINK=endpoint
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --lat-pps) LAT_PPS=$2; shift 2 ;;
        --sink) SINK=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--duration S] [--lat-pps R] [--sink endpoint|guest] [--json FILE]" >&2; exit 2 ;;
    esac
done
case $SINK in
    endpoint) ;;
    guest)
        CONFIG=$ROOT/bench/testbed-vatc-guest.toml
        CONSOLE=/run/spillway-vatc-guest/swatg-vm-b.console
        # The guest's kernel and initramfs (target/guest, relative to the working folder).
        cd "$ROOT"
        [[ -f target/guest/vmlinuz ]] || { echo "no guest: sudo bash guest/build.sh first" >&2; exit 2; }
        # QEMU under TCG boots in about 15 s (after up to 5 s probing KVM).
        export READY_WAIT_S=120
        ;;
    *) echo "--sink endpoint or guest" >&2; exit 2 ;;
esac
[[ -x $BIN ]] || { echo "$BIN not found: cargo build --release first" >&2; exit 2; }
TMP=$(mktemp -d /tmp/spillway-vatc.XXXXXX)
DAEMON=
cleanup() {
    stop_daemon
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
# The DPU model's PCIe crossings and packets in, and the CPU time (ticks) of the DPU process
# and of the plane's process so far.
counters() {
    ctl status | python3 -c '
import json, os, sys
d = json.load(sys.stdin); c = d["counters"]
def ticks(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, TypeError):
        return 0
plane = d["plane"]["pid"] if d.get("plane") else None
print(c.get("pcie.crossings", 0), c.get("dpu.rx.packets", 0), ticks('"$DAEMON"'), ticks(plane))'
}

start_daemon
wait_phase active
if [[ $SINK == guest ]]; then
    for _ in $(seq 600); do grep -q "spillway-guest ready" "$CONSOLE" 2>/dev/null && break; sleep 0.2; done
    grep -q "spillway-guest ready" "$CONSOLE" || { echo "the guest did not come up: $(tail -3 "$CONSOLE")" >&2; exit 1; }
fi

set_mode() {
    case $1 in
        dpu) ctl release >/dev/null; wait_phase idle ;;
        plane) ctl vatc off >/dev/null; ctl activate >/dev/null; wait_phase active ;;
        vatc) ctl vatc on >/dev/null; ctl activate >/dev/null; wait_phase active ;;
    esac
}

# One measurement into the guest: the generator in a; the guest's received-packet lines printed
# meanwhile give the rate.
measure_guest() {
    local pps=$1 out=$2
    SPORT=$((SPORT + 64))
    local l0; l0=$(wc -l <"$CONSOLE")
    local c0; c0=$(counters)
    "$BIN" vm-endpoint --config "$CONFIG" --vm a --mode gen --dst b --pps "$pps" --flows 16 \
        --sport-base "$SPORT" --buf-bytes 2048 --log warn --duration "$DURATION" >"$TMP/gen.json"
    local c1; c1=$(counters)
    local l1; l1=$(wc -l <"$CONSOLE")
    python3 - "$CONSOLE" "$l0" "$l1" "$TMP/gen.json" "$c0" "$c1" "$(ctl status)" >"$out" <<'EOF'
import json, os, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()[int(sys.argv[2]):int(sys.argv[3])]
rx = [(int(w[2]), float(w[3])) for w in (l.split() for l in lines)
      if len(w) == 4 and w[0] == "spillway-guest" and w[1] == "rx"]
# The first and last lines straddle the generator's start and end.
rx = rx[1:-1]
g = json.load(open(sys.argv[4]))
a = [int(x) for x in sys.argv[5].split()]; b = [int(x) for x in sys.argv[6].split()]
st = json.loads(sys.argv[7])
packets = b[1] - a[1]
tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
s = {"sent": g["tx_frames"], "dpu_packets": packets}
s["rx_pps"] = (rx[-1][0] - rx[0][0]) / (rx[-1][1] - rx[0][1]) if len(rx) >= 2 else 0.0
s["rx_window_s"] = rx[-1][1] - rx[0][1] if len(rx) >= 2 else 0.0
s["crossings_per_packet"] = (b[0] - a[0]) / packets if packets else None
s["dpu_cpu_us_per_packet"] = (b[2] - a[2]) * tick_us / packets if packets else None
plane = b[3] - a[3] if b[3] >= a[3] else 0
s["plane_cpu_us_per_packet"] = plane * tick_us / packets if packets else None
pc = (st.get("plane") or {}).get("stats", {}).get("counters", {})
s["plane_vatc_delivered"] = pc.get("plane.vatc.delivered", 0)
s["plane_vatc_no_buffer"] = pc.get("plane.vatc.no_buffer", 0)
print(json.dumps(s))
EOF
}

# One measurement: sink in b, generator in a; prints the sink's report with the crossings delta.
SPORT=20000
measure() {
    local pps=$1 out=$2
    if [[ $SINK == guest ]]; then
        measure_guest "$pps" "$out"
        return
    fi
    SPORT=$((SPORT + 64))
    "$BIN" vm-endpoint --config "$CONFIG" --vm b --mode sink --buf-bytes 2048 --queue-size 1024 --log warn \
        --duration "$(python3 -c "print($DURATION + 2)")" >"$TMP/sink.json" &
    local sink=$!
    sleep 0.5
    local c0; c0=$(counters)
    "$BIN" vm-endpoint --config "$CONFIG" --vm a --mode gen --dst b --pps "$pps" --flows 16 \
        --sport-base "$SPORT" --buf-bytes 2048 --log warn --duration "$DURATION" >"$TMP/gen.json"
    wait "$sink"
    local c1; c1=$(counters)
    python3 - "$TMP/sink.json" "$TMP/gen.json" "$c0" "$c1" >"$out" <<'EOF'
import json, os, sys
s = json.load(open(sys.argv[1])); g = json.load(open(sys.argv[2]))
a = [int(x) for x in sys.argv[3].split()]; b = [int(x) for x in sys.argv[4].split()]
packets = b[1] - a[1]  # packets the DPU took in
tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
s["sent"] = g["tx_frames"]
s["dpu_packets"] = packets
s["crossings_per_packet"] = (b[0] - a[0]) / packets if packets else None
s["dpu_cpu_us_per_packet"] = (b[2] - a[2]) * tick_us / packets if packets else None
# A plane process that was (re)started in between has no comparable counter: 0 then.
plane = b[3] - a[3] if b[3] >= a[3] else 0
s["plane_cpu_us_per_packet"] = plane * tick_us / packets if packets else None
print(json.dumps(s))
EOF
}

modes=(dpu plane vatc)
for ((r = 0; r < RUNS; r++)); do
    for ((k = 0; k < 3; k++)); do
        m=${modes[$(((r + k) % 3))]}
        set_mode "$m"
        if [[ $SINK == guest ]]; then
            # At a fixed rate the guest keeps up with, then flat out.
            measure "$LAT_PPS" "$TMP/lat-$m-$r.json"
            sleep 1
            measure 0 "$TMP/rate-$m-$r.json"
            for kind in lat rate; do
                echo "run $((r + 1)) $m $kind: $(python3 -c "import json; a=json.load(open('$TMP/$kind-$m-$r.json')); print(f\"{a['rx_pps']:.0f} pps into the guest over {a['rx_window_s']:.1f} s (sent {a['sent']}), {a['crossings_per_packet']:.2f} crossings/pkt, the plane's direct deliveries so far {a['plane_vatc_delivered']} (no buffer {a['plane_vatc_no_buffer']})\")")" >&2
            done
            continue
        fi
        # Latency first, on a fabric that has not just been flooded; then the packet rate.
        measure "$LAT_PPS" "$TMP/lat-$m-$r.json"
        sleep 1
        measure 0 "$TMP/rate-$m-$r.json"
        echo "run $((r + 1)) $m: $(python3 -c "import json; a=json.load(open('$TMP/rate-$m-$r.json')); b=json.load(open('$TMP/lat-$m-$r.json')); print(f\"{a['rx_pps']:.0f} pps, plane queue {a['rx_plane']}/{a['rx_plane']+a['rx_dpu']}, {a['crossings_per_packet']:.2f} crossings/pkt, DPU {a['dpu_cpu_us_per_packet']:.2f} us/pkt, plane {a['plane_cpu_us_per_packet']:.2f} us/pkt; at $LAT_PPS pps p50 {b['latency_us']['p50']:.0f} us p99 {b['latency_us']['p99']:.0f} us, lost {b['lost']}\")")" >&2
    done
done

python3 - "$TMP" "$RUNS" "$LAT_PPS" "$DURATION" "${JSON:-}" "$SINK" <<'EOF'
import json, statistics, sys
tmp, runs, lat_pps, duration, out, sink = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
modes = ["dpu", "plane", "vatc"]
guest = sink == "guest"
raw = {m: {"rate": [json.load(open(f"{tmp}/rate-{m}-{r}.json")) for r in range(runs)],
           "latency": [json.load(open(f"{tmp}/lat-{m}-{r}.json")) for r in range(runs)]}
       for m in modes}
def stat(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
summary = {}
for m in modes:
    summary[m] = {
        "rx_pps": stat([x["rx_pps"] for x in raw[m]["rate"]]),
        "crossings_per_packet": stat([x["crossings_per_packet"] for x in raw[m]["rate"]]),
        "dpu_cpu_us_per_packet": stat([x["dpu_cpu_us_per_packet"] for x in raw[m]["rate"]]),
        "plane_cpu_us_per_packet": stat([x["plane_cpu_us_per_packet"] for x in raw[m]["rate"]]),
    }
    if guest:
        summary[m].update({
            "fixed_rx_pps": stat([x["rx_pps"] for x in raw[m]["latency"]]),
            "fixed_crossings_per_packet": stat([x["crossings_per_packet"] for x in raw[m]["latency"]]),
        })
    else:
        summary[m].update({
            "plane_queue_share": stat([x["rx_plane"] / max(1, x["rx_plane"] + x["rx_dpu"]) for x in raw[m]["rate"]]),
            "p50_us": stat([x["latency_us"]["p50"] for x in raw[m]["latency"]]),
            "p99_us": stat([x["latency_us"]["p99"] for x in raw[m]["latency"]]),
            "lost_at_fixed_rate": stat([x["lost"] for x in raw[m]["latency"]]),
        })
base = summary["dpu"]["rx_pps"]["median"]
for m in modes:
    summary[m]["rx_pps_vs_dpu"] = summary[m]["rx_pps"]["median"] / base if base else None
doc = {"bench": "vatc", "sink": sink, "runs": runs, "duration_s": duration, "latency_offered_pps": lat_pps,
       "summary": summary, "raw": raw}
if out:
    json.dump(doc, open(out, "w"), indent=1)
f = lambda s, fmt="{:.0f}": f"{fmt.format(s['median'])} [{fmt.format(s['min'])}-{fmt.format(s['max'])}]"
into = "into a QEMU guest (its eth0 count)" if guest else "into a shared-memory VM"
print(f"MEASUREMENT: vATC {into}, {runs} interleaved runs of {duration:g} s, 64-byte UDP, medians [min-max]")
if guest:
    print(f"{'path':6} {'rx pps':>24} {'/dpu':>6} {'crossings/pkt':>20} {'DPU cpu us/pkt':>20} {'plane cpu us/pkt':>20} {'rx pps @'+str(lat_pps):>24} {'crossings/pkt':>20}")
    for m in modes:
        s = summary[m]
        g = lambda k: f(s[k], '{:.2f}')
        print(f"{m:6} {f(s['rx_pps']):>24} {s['rx_pps_vs_dpu']:6.2f} {g('crossings_per_packet'):>20} {g('dpu_cpu_us_per_packet'):>20} {g('plane_cpu_us_per_packet'):>20} {f(s['fixed_rx_pps']):>24} {g('fixed_crossings_per_packet'):>20}")
    sys.exit(0)
print(f"{'path':6} {'rx pps':>24} {'/dpu':>6} {'crossings/pkt':>20} {'DPU cpu us/pkt':>20} {'plane cpu us/pkt':>20} {'p50 us @'+str(lat_pps):>22} {'p99 us':>22}")
for m in modes:
    s = summary[m]
    g = lambda k: f(s[k], '{:.2f}')
    print(f"{m:6} {f(s['rx_pps']):>24} {s['rx_pps_vs_dpu']:6.2f} {g('crossings_per_packet'):>20} {g('dpu_cpu_us_per_packet'):>20} {g('plane_cpu_us_per_packet'):>20} {f(s['p50_us']):>22} {f(s['p99_us']):>22}")
EOF
