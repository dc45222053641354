#!/usr/bin/env bash
# remote-spill: how long a host with no core to isolate takes to have its overflow served by a
# spill plane on a pool host's cores, and, in the same run, how long a plane on its own cores
# takes once they are free (docs/adr/0014-remote-plane.md).
#
# Each run starts a fresh etcd-backed pair of hosts on this machine: an underlay namespace with
# a bridge, each host's own namespace on it (192.0.2.101, .102), host P offering 2 pool cores
# (its service on 192.0.2.102:7400) and host A with 4 cores, all sold or reserved, and a 400 pps
# DPU fast path. A ping flood in A's first VM is the pressure. Figures, from A's own events:
#   remote_trigger_s   URSched's fallback (no core here) -> first packet the remote plane served
#   remote_start_s     the core's decision to start the remote plane -> first packet it served
#   local_start_s      after `ctl tenant-cores 0` frees two cores: the decision to start a local
#                      plane -> first packet it served
#
#   sudo bash bench/remote-spill.sh [--runs N] [--json FILE]
#
# Uses target/release/spillway built with the etcd client (or $SPILLWAY):
#   cargo build --release -p spillway --features etcd
# Needs root, etcd (Debian's etcd-server), python3 and ping. Prints median [min - max] of each
# figure over the runs. Removes what it made at exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPILLWAY:-$ROOT/target/release/spillway}
RUNS=5
JSON=
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--json FILE]" >&2; exit 2 ;;
    esac
done
[[ -x $BIN ]] || { echo "$BIN not found (cargo build --release -p spillway --features etcd)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "etcd is missing: apt-get install etcd-server" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "needs root (namespaces, TAPs, cgroups)" >&2; exit 2; }

ID=$(printf '%x' $(($$ % 0xffff)))
UL=ur-b$ID HA=ha-b$ID HP=hp-b$ID
TMP=$(mktemp -d /tmp/spillway-remote.XXXXXX)
ETCD= DA= DP= FLOOD=
# stop PID: SIGINT (a daemon removes what it made), then until it is gone (10 s at most; the
# daemons are not this shell's children: `up` runs in a command substitution).
stop() {
    if [[ -n $1 ]]; then
        kill -INT "$1" 2>/dev/null || true
        for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
    fi
}
cleanup() {
    if [[ -n $FLOOD ]]; then kill "$FLOOD" 2>/dev/null || true; fi
    stop "$DA"
    stop "$DP"
    stop "$ETCD"
    for ns in $UL $HA $HP; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# The underlay, and each host's namespace on it.
for ns in $UL $HA $HP; do ip netns add "$ns"; done
ip -n "$UL" link add br0 type bridge
ip -n "$UL" link set br0 up
i=1
for ns in $HA $HP; do
    ip link add "v$i$ID" type veth peer name "w$i$ID"
    ip link set "v$i$ID" netns "$UL"
    ip link set "w$i$ID" netns "$ns"
    ip -n "$UL" link set "v$i$ID" master br0 up
    ip -n "$ns" addr add "192.0.2.10$i/24" dev "w$i$ID"
    ip -n "$ns" link set "w$i$ID" up
    ip -n "$ns" link set lo up
    i=$((i + 1))
done

PORT=$((20000 + ($$ % 20000)))
while ss -ltn | grep -q ":$PORT "; do PORT=$((PORT + 2)); done
etcd --name bench --data-dir "$TMP/etcd" \
    --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((PORT + 1))" --log-level warn >"$TMP/etcd.log" 2>&1 &
ETCD=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
done

# testbed NAME HOST NETNS EXTRA: one host's testbed (written to $TMP/NAME.toml).
testbed() {
    cat >"$TMP/$1.toml" <<EOF
[testbed]
name = "$1"
state_dir = "$TMP/$1"
[spill]
cpus = "1"
memory_max = "512M"
[cluster]
host = "$2"
etcd = ["http://127.0.0.1:$PORT"]
lease_ttl_s = 5
netns = "$3"
$4
EOF
}
testbed "p$ID" pool-b$ID "$HP" 'pool_cores = 2
pool_listen = "192.0.2.102:7400"
pool_cpus = "0-1"'
cat "$ROOT/bench/remote-host-p.toml" >>"$TMP/p$ID.toml"
testbed "a$ID" host-b$ID "$HA" ''
cat "$ROOT/bench/remote-host-a.toml" >>"$TMP/a$ID.toml"

# up NAME: starts `spillway run` on NAME's testbed; prints its pid.
up() {
    rm -f "$TMP/$1.ready"
    # Its report (stdout) to a file: the caller's command substitution would wait for the pipe.
    "$BIN" run --config "$TMP/$1.toml" --ready-file "$TMP/$1.ready" --log warn \
        >"$TMP/$1.report" 2>>"$TMP/$1.log" &
    local pid=$!
    for _ in $(seq 100); do [[ -e $TMP/$1.ready ]] && break; sleep 0.1; done
    [[ -e $TMP/$1.ready ]] || { echo "spillway run $1 did not come up: $(tail -3 "$TMP/$1.log")" >&2; exit 1; }
    echo "$pid"
}
# starts NAME: the seconds from each plane decision (`preparing`) to the first packet that plane
# served (`absorbing`), oldest first, and from the fallback to the first of them.
starts() {
    "$BIN" ctl --config "$TMP/$1.toml" status | python3 -c '
import json, sys
ev = list(reversed(json.load(sys.stdin)["events"]))
fb = next((e["at_s"] for e in ev if e["event"] == "fallback"), None)
out, prep = [], None
for e in ev:
    if e["event"] == "preparing": prep = e["at_s"]
    elif e["event"] == "absorbing" and prep is not None: out.append(e["at_s"] - prep); prep = None
first = next((e["at_s"] for e in ev if e["event"] == "absorbing"), None)
print(json.dumps({"trigger": None if fb is None or first is None else first - fb, "starts": out}))'
}
# wait_starts NAME N: until N planes have served their first packet (30 s at most).
wait_starts() {
    for _ in $(seq 300); do
        [[ $(starts "$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["starts"]))') -ge $2 ]] && return 0
        sleep 0.1
    done
    echo "run $r: $2 plane start(s) not seen on $1; its log: $(tail -5 "$TMP/$1.log")" >&2
    exit 1
}

: >"$TMP/results.jsonl"
for ((r = 1; r <= RUNS; r++)); do
    DP=$(up "p$ID")
    DA=$(up "a$ID")
    ip netns exec "a$ID-a" ping -i 0.002 -q 10.74.0.2 >/dev/null 2>&1 &
    FLOOD=$!
    wait_starts "a$ID" 1
    "$BIN" ctl --config "$TMP/a$ID.toml" tenant-cores 0 >/dev/null
    wait_starts "a$ID" 2
    starts "a$ID" >>"$TMP/results.jsonl"
    echo "run $r: $(tail -1 "$TMP/results.jsonl")" >&2
    kill "$FLOOD" 2>/dev/null || true; wait "$FLOOD" 2>/dev/null || true; FLOOD=
    stop "$DA"; DA=
    stop "$DP"; DP=
done

python3 - "$TMP/results.jsonl" "$RUNS" "${JSON:-}" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
figures = {
    "remote_trigger_s": [r["trigger"] for r in rows],
    "remote_start_s": [r["starts"][0] for r in rows],
    "local_start_s": [r["starts"][1] for r in rows],
}
out = {"runs": int(sys.argv[2])}
for k, v in figures.items():
    out[k] = {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v}
    print(f"{k:18} {statistics.median(v):.3f} [{min(v):.3f} - {max(v):.3f}] s")
if sys.argv[3]:
    json.dump(out, open(sys.argv[3], "w"), indent=1)
EOF
