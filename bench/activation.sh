#!/usr/bin/env bash
# activation: how long Spillway's real-time fabric takes from a trigger to redirect rules live,
# and to the first redirected packet served by the spill plane, for cold starts (no plane: the
# process is started, maps the rings, bulk-syncs) and warm ones (a plane pre-warmed in shadow by
# `spillway ctl prepare`; the activation installs the redirect rules). The trigger is the
# operator's `spillway ctl activate`. A generator in the first VM opens a new UDP flow (a fresh
# source port) every 0.5 ms, whatever happens to earlier ones, so the first redirected packet
# follows the rules by at most that much plus the fabric's own delay (an application such as wrk
# would add its retransmission timers: its connections stall while the DPU drops SYNs).
#
#   sudo bash bench/activation.sh [--runs N] [--json FILE]
#
# Uses target/release/spillway (or $SPILLWAY) and bench/testbed-apps-vs.toml; needs root and
# python3. Prints the medians [min - max] of each figure over N cold and N warm activations.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPILLWAY:-$ROOT/target/release/spillway}
CONFIG=$ROOT/bench/testbed-apps-vs.toml
RUNS=5
JSON=
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--json FILE]" >&2; exit 2 ;;
    esac
done
TMP=$(mktemp -d /tmp/spillway-activation.XXXXXX)
DAEMON= WRK=
cleanup() {
    [[ -n $WRK ]] && kill "$WRK" 2>/dev/null || true
    stop_daemon
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
absorbed_count() { ctl status | python3 -c 'import json,sys; print(sum(1 for a in json.load(sys.stdin)["activations"] if a.get("first_packet_ms") is not None))'; }

start_daemon --hold released
ip netns exec swvs-a python3 -c '
import socket, time
while True:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x" * 18, ("10.77.0.2", 9))
    s.close()
    time.sleep(0.0005)
' &
WRK=$!
sleep 1
n=0
for kind in cold warm; do
    for ((r = 1; r <= RUNS; r++)); do
        if [[ $kind == warm ]]; then
            ctl prepare >/dev/null
            wait_phase shadow
            sleep 0.5
        fi
        ctl activate >/dev/null
        wait_phase active
        n=$((n + 1))
        for _ in $(seq 100); do (( $(absorbed_count) >= n )) && break; sleep 0.05; done
        sleep 0.3
        ctl release >/dev/null
        wait_phase idle
        sleep 0.5
    done
done
ctl status >"$TMP/status.json"
python3 - "$TMP/status.json" "$JSON" <<'PY'
import json, statistics, sys
acts = json.load(open(sys.argv[1]))["activations"]
out = {}
for kind, cold in (("cold", True), ("warm", False)):
    rows = [a for a in acts if a["cold"] == cold]
    for fig in ("rules_live_ms", "first_packet_ms"):
        vals = [a[fig] for a in rows if a.get(fig) is not None]
        if vals:
            out[f"{kind}.{fig}"] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
for k, v in out.items():
    print(f"{k:<28} {v['median']:8.1f} ms  [{v['min']:.1f} - {v['max']:.1f}]  n={v['n']}")
if sys.argv[2]:
    json.dump({"activations": acts, "summary": out}, open(sys.argv[2], "w"), indent=2)
PY
