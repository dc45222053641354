#!/usr/bin/env bash
# vm-vs: guest-to-guest through three switches, side by side. Two QEMU guests (guest/build.sh)
# run the same tests through each mode:
#
#   spillway   Spillway's DPU process as the vhost-user backend of both guests' virtio-net
#              devices (`backend = "vhost-user"`, `spillway run`), the plane released
#   ovs-dpdk   Open vSwitch 3.1 with DPDK (Debian's openvswitch-switch-dpdk): a netdev bridge
#              with two `dpdkvhostuserclient` ports, QEMU the vhost-user server, as OVS-DPDK
#              deployments run it
#   ovs-dpdk-tso  the same with OVS's userspace TSO (`other_config:userspace-tso-enable`,
#              experimental in 3.1): without it OVS-DPDK segments every TCP super-frame a guest
#              sends, which Spillway and the TAP pass whole
#   bridge     the kernel's path: a Linux bridge and a TAP per guest, with vhost-net where
#              /dev/vhost-net exists (QEMU's own virtio-net backend otherwise; the run says which)
#
# Every guest gets the same QEMU machine: 2 vCPUs, 256 MiB of memfd-backed shared memory, a
# virtio-net-pci device with two queue pairs and no MSI-X (`vectors=0`, as `spillway run` gives
# a vhost-user guest: Debian's QEMU 7.2 crashes on a vhost-user MSI-X vector without KVM's
# irqfds). KVM where a probe guest prints on it within 5 s, TCG otherwise (then the guests, not
# the switches, bound every figure: the run says so).
#
# Tests, from guest a to guest b (spillway.bench in guest/build.sh), each --duration seconds:
#   tcp_gbps       iperf3 TCP, the receiver's rate
#   udp64_rx_kpps  iperf3 UDP, 64-byte payloads flat out: datagrams the server received per second
#   udp64_tx_kpps  ... datagrams the client sent per second
#   http_close_rps wrk -t1 -c16 with `Connection: close` against b's busy-box httpd
# and switch_cpu: the CPU seconds per second the switch's processes used over the tests (the DPU
# process; ovs-vswitchd, whose PMD thread polls a core flat out; none for the bridge, whose work is
# the kernel's).
#
#   sudo bash bench/vm-vs.sh [--modes spillway,ovs-dpdk,ovs-dpdk-tso,bridge] [--runs N] [--duration S]
#                            [--json FILE] [--keep-logs DIR]
#
# Modes are interleaved, the order rotating each run; each run boots fresh guests. Needs root,
# qemu-system-x86, python3, iproute2, the guest (`bash guest/build.sh`), target/release/spillway
# (or $SPILLWAY) for the spillway mode, openvswitch-switch-dpdk and librte-mempool-ring23 (its
# mempool driver, only recommended by the package) for ovs-dpdk (2 MiB hugepages
# are reserved for its 1 GiB and given back). A mode whose prerequisite is missing is skipped
# with the reason. Exit status: 0 done; 1 a mode failed (it says why); 2 bad usage.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SPILLWAY:-$ROOT/target/release/spillway}
GUEST=${SPILLWAY_GUEST:-$ROOT/target/guest}
OVS_DPDK=/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk
MODES=spillway,ovs-dpdk,bridge
RUNS=5
DURATION=5
JSON=
KEEP=
while (($#)); do
    case $1 in
        --modes) MODES=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        --keep-logs) KEEP=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "vm-vs: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ && $DURATION =~ ^[1-9][0-9]*$ ]] ||
    { echo "vm-vs: --runs and --duration take whole numbers above 0" >&2; exit 2; }
((EUID == 0)) || { echo "vm-vs: needs root (TAPs, a bridge, hugepages)" >&2; exit 2; }
for tool in qemu-system-x86_64 python3 ip; do
    command -v "$tool" >/dev/null || { echo "vm-vs: $tool is missing" >&2; exit 2; }
done
[[ -f $GUEST/vmlinuz && -f $GUEST/initramfs.cpio.gz ]] ||
    { echo "vm-vs: no guest in $GUEST: bash guest/build.sh" >&2; exit 2; }

TMP=$(mktemp -d /tmp/spillway-vm-vs.XXXXXX)
PIDS=()
HUGE_BEFORE=$(cat /proc/sys/vm/nr_hugepages)
NAME=vv$(printf %x $(($$ % 0xffffff)))
BR=${NAME}br
# OVS's netdev bridge: its internal port is a persistent TAP of that name (see stop_all).
OVS_BR=${NAME}ovs
IP_A=10.79.0.1
IP_B=10.79.0.2
MAC_A=02:00:00:00:00:0a
MAC_B=02:00:00:00:00:0b
log() { printf '[vm-vs %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

OVS_DIR=
stop_all() {
    local p
    # OVS first, by its own hand: deleting the bridge and asking ovs-vswitchd to exit removes
    # its persistent TAPs (the bridge's and the datapath's `ovs-netdev`), which a kill leaves.
    if [[ -n $OVS_DIR ]]; then
        ovs-vsctl --db="unix:$OVS_DIR/db.sock" --timeout=5 --if-exists del-br "$OVS_BR" >/dev/null 2>&1 || true
        ovs-appctl -t "$OVS_DIR/vswitchd.ctl" --timeout=5 exit >/dev/null 2>&1 || true
        OVS_DIR=
    fi
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    PIDS=()
    ip link del "$BR" 2>/dev/null || true
    ip link del "$OVS_BR" 2>/dev/null || true
    ip link del "${NAME}a" 2>/dev/null || true
    ip link del "${NAME}b" 2>/dev/null || true
}
cleanup() {
    stop_all
    echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages 2>/dev/null || true
    if [[ -n $KEEP ]]; then mkdir -p "$KEEP" && cp -r "$TMP"/. "$KEEP"/; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The accelerator: KVM if a guest prints on it within 5 s (nested virtualisation may open
# /dev/kvm and run nothing), TCG otherwise.
ACCEL=tcg
if [[ -r /dev/kvm && -w /dev/kvm ]]; then
    : >"$TMP/probe.console"
    qemu-system-x86_64 -accel kvm -cpu host,-arch-capabilities -m 128 -nodefaults -no-user-config \
        -display none -no-reboot -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1" -serial "file:$TMP/probe.console" </dev/null \
        >/dev/null 2>&1 &
    probe=$!
    for _ in $(seq 50); do [[ -s $TMP/probe.console ]] && break; sleep 0.1; done
    grep -q "Linux version" "$TMP/probe.console" 2>/dev/null && ACCEL=kvm
    kill -KILL "$probe" 2>/dev/null || true
    wait "$probe" 2>/dev/null || true
fi
log "guests run under $ACCEL"
[[ $ACCEL == tcg ]] &&
    log "under TCG the guests' emulation, not the switches, bounds these figures"

# start_guest NAME CMDLINE NETDEV-ARGS...: one guest, its console in $TMP/NAME.console.
start_guest() {
    local name=$1 cmdline=$2
    shift 2
    local cpu=()
    [[ $ACCEL == kvm ]] && cpu=(-cpu host,-arch-capabilities)
    : >"$TMP/$name.console"
    qemu-system-x86_64 -accel "$ACCEL" "${cpu[@]}" -m 256 -smp 2 -nodefaults -no-user-config \
        -display none -no-reboot -object memory-backend-memfd,id=mem,size=256M,share=on \
        -numa node,memdev=mem -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1 quiet $cmdline" -serial "file:$TMP/$name.console" \
        "$@" </dev/null >/dev/null 2>"$TMP/$name.qemu" &
    PIDS+=($!)
}
# What each guest does (`spillway run` gives its guests their address itself).
BENCH_A="spillway.bench=$IP_B:$DURATION"
BENCH_B="spillway.iperf3s=1"
CMD_A="spillway.ip=$IP_A/24 $BENCH_A"
CMD_B="spillway.ip=$IP_B/24 $BENCH_B"
nic() { echo "virtio-net-pci,netdev=n0,mac=$1,mq=on,vectors=0"; }

# CPU ticks of a process so far (0 if it is gone).
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# Waits for guest a's tests (the bench's budget: boot, a ping, the tests) and samples the
# switch's CPU over them; writes $TMP/$1.cpu.
SWITCH_PID=
wait_bench() {
    local out=$1 limit=$((240 + 6 * DURATION)) t0=0 c0=0 s
    for ((s = 0; s < limit * 5; s++)); do
        if ((t0 == 0)) && grep -q "spillway-guest bench-begin tcp" "$TMP/a.console"; then
            t0=$(date +%s.%N)
            [[ -n $SWITCH_PID ]] && c0=$(ticks "$SWITCH_PID")
        fi
        grep -q "spillway-guest bench-done" "$TMP/a.console" && break
        sleep 0.2
    done
    grep -q "spillway-guest bench-done" "$TMP/a.console" || {
        log "$out: guest a did not finish its tests in ${limit}s: $(tail -c 300 "$TMP/a.console")"
        return 1
    }
    local t1 c1=0
    t1=$(date +%s.%N)
    [[ -n $SWITCH_PID ]] && c1=$(ticks "$SWITCH_PID")
    python3 -c "import os; print(($c1 - $c0) / os.sysconf('SC_CLK_TCK') / ($t1 - $t0) if '$SWITCH_PID' and $t0 else -1)" >"$TMP/$out.cpu"
}

mode_spillway() {
    [[ -x $BIN ]] || { echo "skip: $BIN not found (cargo build --release -p spillway)"; return 0; }
    mkdir -p "$TMP/spillway"
    sed -e "s|^name = \"vmvs\"\$|name = \"$NAME\"|" \
        -e "s|^state_dir = .*|state_dir = \"$TMP/spillway\"\nguest_dir = \"$GUEST\"|" \
        -e "s|spillway.bench=10.79.0.2:5|$BENCH_A|; s|spillway.iperf3s=1|$BENCH_B|" \
        "$ROOT/bench/testbed-vm-vs.toml" >"$TMP/spillway.toml"
    grep -q "^name = \"$NAME\"" "$TMP/spillway.toml" && grep -q "$BENCH_A" "$TMP/spillway.toml" ||
        { echo "fail: bench/testbed-vm-vs.toml is not what this script expects"; return 1; }
    "$BIN" run --config "$TMP/spillway.toml" --ready-file "$TMP/spillway/ready" --log warn \
        2>"$TMP/spillway.log" &
    local d=$!
    PIDS+=("$d")
    SWITCH_PID=$d
    for _ in $(seq 1200); do [[ -e $TMP/spillway/ready ]] && break; sleep 0.1; done
    [[ -e $TMP/spillway/ready ]] || { echo "fail: spillway run did not come up: $(tail -3 "$TMP/spillway.log")"; return 1; }
    ln -sf "$TMP/spillway/$NAME-vm-a.console" "$TMP/a.console"
    ln -sf "$TMP/spillway/$NAME-vm-b.console" "$TMP/b.console"
    wait_bench "$1" || { echo "fail: see the consoles"; return 1; }
    echo ok
}

mode_ovs_dpdk_tso() { OVS_TSO=1 mode_ovs_dpdk "$1"; }

mode_ovs_dpdk() {
    local tso=()
    [[ ${OVS_TSO:-0} == 1 ]] && tso=(other_config:userspace-tso-enable=true)
    [[ -x $OVS_DPDK ]] || { echo "skip: $OVS_DPDK not found (apt-get install openvswitch-switch-dpdk)"; return 0; }
    local o=$TMP/ovs-$1
    mkdir -p "$o"
    OVS_DIR=$o
    # 1 GiB of 2 MiB pages for DPDK's socket memory (mempools per port: the shared default asks
    # for 262,144 buffers and fails in less).
    echo $((HUGE_BEFORE + 560)) >/proc/sys/vm/nr_hugepages
    mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs none /dev/hugepages; }
    export OVS_RUNDIR=$o OVS_DBDIR=$o OVS_LOGDIR=$o OVS_SYSCONFDIR=$o OVS_PKGDATADIR=/usr/share/openvswitch
    local db=unix:$o/db.sock
    ovsdb-tool create "$o/conf.db" /usr/share/openvswitch/vswitch.ovsschema ||
        { echo "fail: ovsdb-tool create"; return 1; }
    ovsdb-server --remote="punix:$o/db.sock" --pidfile="$o/ovsdb.pid" --unixctl="$o/ovsdb.ctl" \
        --log-file="$o/ovsdb.log" "$o/conf.db" 2>>"$o/ovsdb.err" &
    PIDS+=($!)
    for _ in $(seq 50); do [[ -S $o/db.sock ]] && break; sleep 0.1; done
    ovs-vsctl --db="$db" --no-wait init &&
        ovs-vsctl --db="$db" --no-wait set Open_vSwitch . other_config:dpdk-init=true \
            other_config:dpdk-socket-mem=1024 other_config:dpdk-extra=--no-pci \
            other_config:per-port-memory=true "${tso[@]}" ||
        { echo "fail: ovs-vsctl could not configure DPDK: $(tail -2 "$o/ovsdb.log")"; return 1; }
    "$OVS_DPDK" "$db" --pidfile="$o/vswitchd.pid" --unixctl="$o/vswitchd.ctl" \
        --log-file="$o/vswitchd.log" 2>>"$o/vswitchd.err" &
    local v=$!
    PIDS+=("$v")
    SWITCH_PID=$v
    for _ in $(seq 100); do grep -q "DPDK Enabled - initialized" "$o/vswitchd.log" 2>/dev/null && break; sleep 0.1; done
    grep -q "DPDK Enabled - initialized" "$o/vswitchd.log" 2>/dev/null ||
        { echo "fail: DPDK did not initialise: $(tail -3 "$o/vswitchd.log" 2>/dev/null)"; return 1; }
    ovs-vsctl --db="$db" add-br "$OVS_BR" -- set bridge "$OVS_BR" datapath_type=netdev \
        -- add-port "$OVS_BR" vua -- set Interface vua type=dpdkvhostuserclient options:vhost-server-path="$o/a.sock" \
        -- add-port "$OVS_BR" vub -- set Interface vub type=dpdkvhostuserclient options:vhost-server-path="$o/b.sock" ||
        { echo "fail: ovs-vsctl add-br/add-port: $(tail -2 "$o/vswitchd.log")"; return 1; }
    local g
    for g in a b; do
        local cmd=$CMD_A mac=$MAC_A
        [[ $g == b ]] && cmd=$CMD_B mac=$MAC_B
        start_guest "$g" "$cmd" -chardev "socket,id=vu0,path=$o/$g.sock,server=on,wait=off" \
            -netdev vhost-user,id=n0,chardev=vu0,queues=2 -device "$(nic "$mac")"
    done
    wait_bench "$1" || { echo "fail: see the consoles and $o/vswitchd.log"; return 1; }
    echo ok
}

mode_bridge() {
    local vhost=off
    [[ -c /dev/vhost-net ]] && vhost=on
    echo "vhost=$vhost" >"$TMP/bridge.vhost"
    ip link add "$BR" type bridge && ip link set "$BR" up || { echo "fail: no bridge $BR"; return 1; }
    local g
    for g in a b; do
        { ip tuntap add dev "$NAME$g" mode tap multi_queue && ip link set "$NAME$g" master "$BR" up; } ||
            { echo "fail: TAP $NAME$g"; return 1; }
        local cmd=$CMD_A mac=$MAC_A
        [[ $g == b ]] && cmd=$CMD_B mac=$MAC_B
        start_guest "$g" "$cmd" \
            -netdev "tap,id=n0,ifname=$NAME$g,script=no,downscript=no,vhost=$vhost,queues=2" \
            -device "$(nic "$mac")"
    done
    SWITCH_PID=
    wait_bench "$1" || { echo "fail: see the consoles"; return 1; }
    echo ok
}

IFS=, read -r -a modes <<<"$MODES"
for m in "${modes[@]}"; do
    case $m in spillway | ovs-dpdk | ovs-dpdk-tso | bridge) ;; *) echo "vm-vs: unknown mode $m" >&2; exit 2 ;; esac
done
failed=0
for ((r = 0; r < RUNS; r++)); do
    n=${#modes[@]}
    for ((k = 0; k < n; k++)); do
        m=${modes[$(((r + k) % n))]}
        run=$m-$r
        rm -f "$TMP/a.console" "$TMP/b.console"
        SWITCH_PID=
        # Not in a subshell: the mode's processes go into PIDS, which stop_all ends.
        "mode_${m//-/_}" "$run" >"$TMP/$run.out" 2>>"$TMP/$run.err" ||
            echo "fail: $(tail -2 "$TMP/$run.err" | tr '\n' ' ')" >>"$TMP/$run.out"
        verdict=$(tail -1 "$TMP/$run.out")
        if [[ $verdict == ok ]]; then
            cp "$TMP/a.console" "$TMP/$run.console"
            log "run $((r + 1)) $m: done"
        else
            log "run $((r + 1)) $m: $verdict"
            echo "$verdict" >"$TMP/$run.verdict"
            [[ $verdict == skip* ]] || failed=1
        fi
        stop_all
        echo "$HUGE_BEFORE" >/proc/sys/vm/nr_hugepages
    done
done

python3 - "$TMP" "$RUNS" "$DURATION" "$ACCEL" "$MODES" "${JSON:-}" <<'EOF'
import json, os, re, statistics, sys
tmp, runs, duration, accel, modes, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5].split(","), sys.argv[6]

def section(text, name):
    m = re.search(rf"spillway-guest bench-begin {name}\r?\n(.*?)spillway-guest bench-end {name}", text, re.S)
    return m.group(1) if m else ""

def iperf(s):
    i = s.find("{")
    try:
        return json.loads(s[i:s.rfind("}") + 1]) if i >= 0 else None
    except json.JSONDecodeError:
        return None

def figures(console):
    text = open(console, errors="replace").read()
    f = {}
    t = iperf(section(text, "tcp"))
    if t and "end" in t and t["end"].get("sum_received"):
        f["tcp_gbps"] = t["end"]["sum_received"]["bits_per_second"] / 1e9
    u = iperf(section(text, "udp64"))
    if u and "end" in u:
        rx, tx = u["end"].get("sum_received"), u["end"].get("sum_sent")
        if rx and rx.get("seconds"):
            f["udp64_rx_kpps"] = rx["bytes"] / 64 / rx["seconds"] / 1e3
        if tx and tx.get("seconds"):
            f["udp64_tx_kpps"] = tx["packets"] / tx["seconds"] / 1e3
    h = re.search(r"Requests/sec:\s*([0-9.]+)", section(text, "http"))
    if h:
        f["http_close_rps"] = float(h.group(1))
    return f

raw, verdicts = {}, {}
for m in modes:
    raw[m] = []
    for r in range(runs):
        run = f"{m}-{r}"
        v = os.path.join(tmp, run + ".verdict")
        if os.path.exists(v):
            verdicts[run] = open(v).read().strip()
            continue
        f = figures(os.path.join(tmp, run + ".console"))
        cpu = os.path.join(tmp, run + ".cpu")
        if os.path.exists(cpu):
            c = float(open(cpu).read())
            if c >= 0:
                f["switch_cpu"] = c
        raw[m].append(f)
keys = ["tcp_gbps", "udp64_rx_kpps", "udp64_tx_kpps", "http_close_rps", "switch_cpu"]
summary = {}
for m in modes:
    summary[m] = {}
    for k in keys:
        xs = [f[k] for f in raw[m] if k in f]
        if xs:
            summary[m][k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
vhost = open(os.path.join(tmp, "bridge.vhost")).read().strip() if os.path.exists(os.path.join(tmp, "bridge.vhost")) else None
doc = {"bench": "vm-vs", "accel": accel, "runs": runs, "duration_s": duration, "bridge": vhost,
       "summary": summary, "raw": raw, "failures": verdicts}
if "spillway" in summary:
    doc["ratios"] = {f"spillway/{m}": {k: summary["spillway"][k]["median"] / summary[m][k]["median"]
                                      for k in keys[:4] if k in summary["spillway"] and k in summary[m] and summary[m][k]["median"]}
                     for m in modes if m != "spillway"}
if out:
    json.dump(doc, open(out, "w"), indent=1)
print(f"MEASUREMENT: guest to guest, {accel}, {runs} interleaved runs of {duration} s, medians [min - max]"
      + (f"; bridge with {vhost}" if vhost else ""))
names = {"tcp_gbps": "TCP Gbit/s", "udp64_rx_kpps": "UDP 64 B received kpps", "udp64_tx_kpps": "UDP 64 B sent kpps",
         "http_close_rps": "HTTP Connection: close req/s", "switch_cpu": "switch CPU (cores)"}
print(f"{'test':30}" + "".join(f"{m:>26}" for m in modes))
for k in keys:
    cells = []
    for m in modes:
        s = summary[m].get(k)
        cells.append(f"{s['median']:.3g} [{s['min']:.3g} - {s['max']:.3g}]" if s else "-")
    print(f"{names[k]:30}" + "".join(f"{c:>26}" for c in cells))
for run, v in sorted(verdicts.items()):
    print(f"{run}: {v}")
EOF
exit $failed
