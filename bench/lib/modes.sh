# shellcheck shell=bash
# The modes: each provides namespaces swvs-a (10.77.0.1/24) and swvs-b (10.77.0.2/24), each with
# an `eth0` at MTU 1500, joined by a different switch. `mode_up_M` builds everything (status 1 and
# FAIL_REASON on failure), `mode_down_M` removes everything it may have built and must be safe to
# call at any point of `mode_up_M`, and again. `mode_missing_M` prints why the mode cannot run on
# this machine (and nothing when it can).

# ---- veth: the upper bound, no switch at all --------------------------------------------------

mode_missing_veth() { :; }

mode_up_veth() {
    if ! { ip netns add "$NS_A" && ip netns add "$NS_B" &&
        ip link add name eth0 netns "$NS_A" type veth peer name eth0 netns "$NS_B" &&
        ns_configure "$NS_A" "$IP_A" && ns_configure "$NS_B" "$IP_B"; }; then
        FAIL_REASON="could not build the veth pair"
        return 1
    fi
}

mode_down_veth() {
    ns_delete "$NS_A"
    ns_delete "$NS_B"
}

# ---- ovs, ovs-tso: Open vSwitch's userspace datapath ------------------------------------------
#
# The daemons run by hand with every file (database, sockets, pidfiles, logs) in the mode's temp
# dir; OVS_RUNDIR and friends point there too, so nothing touches the system's
# /var/run/openvswitch. There is no openvswitch kernel module, hence datapath_type=netdev.
#
# Ports are `type=tap`: ovs-vswitchd creates each TAP device and keeps its file descriptor; we then
# move the device into a namespace and rename it eth0. The descriptor is what OVS reads and writes
# frames through, so forwarding keeps working after the move (checked by servers_start's connection
# test). OVS's ioctls by device name fail from then on ("ioctl(SIOCGIFINDEX) on swvs-ta device
# failed: No such device" in vswitchd.log); they only serve stats and link state, which the
# namespace side sets itself.

OVS_SCHEMA=/usr/share/openvswitch/vswitch.ovsschema
OVS_BRIDGE=swvs-br

mode_missing_ovs() {
    local c
    for c in ovsdb-tool ovsdb-server ovs-vswitchd ovs-vsctl ovs-appctl; do
        command -v "$c" >/dev/null || { echo "$c not installed (apt-get install openvswitch-switch)"; return; }
    done
    [[ -r $OVS_SCHEMA ]] || { echo "$OVS_SCHEMA missing"; return; }
    [[ -c /dev/net/tun ]] || echo "/dev/net/tun missing"
}
mode_missing_ovs-tso() { mode_missing_ovs; }

ovs_vsctl() { ovs-vsctl --db="unix:$OVS_DIR/db.sock" --timeout=10 "$@"; }

# ovs_daemon_pid NAME: the pid in NAME.pid, recorded for stale cleanup.
ovs_daemon_pid() {
    local pid
    pid=$(cat "$OVS_DIR/$1.pid" 2>/dev/null) || return 1
    printf '%s %s\n' "$pid" "$2" >>"$TMP/pids"
    echo "$pid"
}

# ovs_up TSO(0|1)
ovs_up() {
    local tso=$1 i
    OVS_DIR=$MODE_DIR/ovs
    mkdir -p "$OVS_DIR"
    export OVS_RUNDIR=$OVS_DIR OVS_DBDIR=$OVS_DIR OVS_LOGDIR=$OVS_DIR OVS_SYSCONFDIR=$OVS_DIR
    export OVS_PKGDATADIR=/usr/share/openvswitch
    ovsdb-tool create "$OVS_DIR/conf.db" "$OVS_SCHEMA" 2>"$OVS_DIR/ovsdb-tool.err" ||
        { FAIL_REASON="ovsdb-tool create: $(tail_of "$OVS_DIR/ovsdb-tool.err")"; return 1; }
    ovsdb-server --remote="punix:$OVS_DIR/db.sock" --pidfile="$OVS_DIR/ovsdb.pid" \
        --unixctl="$OVS_DIR/ovsdb.ctl" --detach --log-file="$OVS_DIR/ovsdb.log" \
        "$OVS_DIR/conf.db" 2>>"$OVS_DIR/ovsdb.err" 9>&- ||
        { FAIL_REASON="ovsdb-server did not start: $(tail_of "$OVS_DIR/ovsdb.log")"; return 1; }
    OVSDB_PID=$(ovs_daemon_pid ovsdb ovsdb-server)
    ovs_vsctl --no-wait init ||
        { FAIL_REASON="ovs-vsctl init failed"; return 1; }
    if ((tso)); then
        # Read once when ovs-vswitchd starts (experimental in 3.1), so it goes in first.
        ovs_vsctl --no-wait set Open_vSwitch . other_config:userspace-tso-enable=true ||
            { FAIL_REASON="could not set userspace-tso-enable"; return 1; }
    fi
    ovs-vswitchd "unix:$OVS_DIR/db.sock" --pidfile="$OVS_DIR/vswitchd.pid" \
        --unixctl="$OVS_DIR/vswitchd.ctl" --detach --log-file="$OVS_DIR/vswitchd.log" \
        2>>"$OVS_DIR/vswitchd.err" 9>&- ||
        { FAIL_REASON="ovs-vswitchd did not start: $(tail_of "$OVS_DIR/vswitchd.log")"; return 1; }
    VSWITCHD_PID=$(ovs_daemon_pid vswitchd ovs-vswitchd)
    if ((tso)) && ! grep -q 'TCP Segmentation Offloading support enabled' "$OVS_DIR/vswitchd.log"; then
        FAIL_REASON="ovs-vswitchd did not enable userspace TSO: $(tail_of "$OVS_DIR/vswitchd.log")"
        return 1
    fi
    ovs_vsctl add-br "$OVS_BRIDGE" -- set bridge "$OVS_BRIDGE" datapath_type=netdev \
        -- add-port "$OVS_BRIDGE" swvs-ta -- set interface swvs-ta type=tap \
        -- add-port "$OVS_BRIDGE" swvs-tb -- set interface swvs-tb type=tap \
        >"$OVS_DIR/vsctl.out" 2>&1 ||
        { FAIL_REASON="ovs-vsctl add-br/add-port: $(tail_of "$OVS_DIR/vsctl.out") $(tail_of "$OVS_DIR/vswitchd.log")"; return 1; }
    for i in a b; do
        if ! wait_for 5 ip link show "swvs-t$i" >/dev/null 2>&1; then
            FAIL_REASON="OVS did not create TAP swvs-t$i: $(tail_of "$OVS_DIR/vswitchd.log")"
            return 1
        fi
    done
    if ! { ip netns add "$NS_A" && ip netns add "$NS_B" &&
        ip link set swvs-ta netns "$NS_A" && ip -n "$NS_A" link set swvs-ta name eth0 &&
        ip link set swvs-tb netns "$NS_B" && ip -n "$NS_B" link set swvs-tb name eth0 &&
        ns_configure "$NS_A" "$IP_A" && ns_configure "$NS_B" "$IP_B"; }; then
        FAIL_REASON="could not move the OVS TAP ports into the namespaces"
        return 1
    fi
}

ovs_down() {
    [[ -n ${OVS_DIR:-} ]] || return 0
    # Deleting the bridge makes ovs-vswitchd drop the persistence of its TAP devices; killing it
    # first would leave swvs-br behind in the root namespace.
    if [[ -n ${VSWITCHD_PID:-} ]] && pid_alive "$VSWITCHD_PID"; then
        ovs_vsctl --if-exists del-br "$OVS_BRIDGE" >/dev/null 2>&1
        ovs-appctl -t "$OVS_DIR/vswitchd.ctl" exit >/dev/null 2>&1
        stop_pid "$VSWITCHD_PID"
    fi
    [[ -n ${OVSDB_PID:-} ]] && stop_pid "$OVSDB_PID"
    ns_delete "$NS_A"
    ns_delete "$NS_B"
    root_links_delete
    unset OVS_RUNDIR OVS_DBDIR OVS_LOGDIR OVS_SYSCONFDIR OVS_PKGDATADIR
    OVS_DIR='' VSWITCHD_PID='' OVSDB_PID=''
}

mode_up_ovs() { ovs_up 0; }
mode_down_ovs() { ovs_down; }
mode_up_ovs-tso() { ovs_up 1; }
mode_down_ovs-tso() { ovs_down; }

# ---- spillway: Spillway's real-time driver ----------------------------------------------------
#
# `spillway run` builds the namespaces itself from bench/testbed-vs-ovs.toml, creates the ready
# file once traffic can flow, and on SIGINT removes everything it built and exits.

SPILLWAY_READY_SECONDS=30
SPILLWAY_EXIT_SECONDS=20

# switch_pid: the process that does all of the mode's forwarding, whose CPU the flood's figures
# per core divide by; nothing for veth (no switch) and for dpu-only and elastic (a spill plane may
# forward part of it in a process of its own).
switch_pid() {
    case $MODE in
    ovs | ovs-tso) echo "${VSWITCHD_PID:-}" ;;
    spillway | spillway-syscalls | spillway-2t) echo "${SPILLWAY_PID:-}" ;;
    esac
}

mode_missing_spillway() {
    [[ -x $SPILLWAY_BIN ]] || { echo "$SPILLWAY_BIN not found or not executable (cargo build --release, or set SPILLWAY=path)"; return; }
    [[ -r $SPILLWAY_CONFIG ]] || echo "$SPILLWAY_CONFIG not found (set SPILLWAY_CONFIG=path)"
}

mode_up_spillway() { spillway_up "$SPILLWAY_CONFIG"; }

# spillway-syscalls: the same with the DPU process's TAP I/O by a read and a write per frame
# instead of io_uring (docs/adr/0005-tap-io.md), to measure one against the other.
mode_missing_spillway-syscalls() { mode_missing_spillway; }
mode_up_spillway-syscalls() { spillway_up "$SPILLWAY_CONFIG" --tap-io syscalls; }
mode_down_spillway-syscalls() { mode_down_spillway; }

# spillway-2t: the same with the DPU process forwarding on two threads, one per shard of the DPU
# model (`fabric.dpu.shards = 2`, docs/adr/0011-sharded-forwarding.md), from a copy of the config.
mode_missing_spillway-2t() {
    mode_missing_spillway
    grep -q '^\[fabric\.dpu\]$' "$SPILLWAY_CONFIG" 2>/dev/null ||
        echo "$SPILLWAY_CONFIG has no [fabric.dpu] section to add shards = 2 to"
}
mode_up_spillway-2t() {
    sed 's/^\[fabric\.dpu\]$/[fabric.dpu]\nshards = 2/' "$SPILLWAY_CONFIG" >"$MODE_DIR/two-threads.toml"
    spillway_up "$MODE_DIR/two-threads.toml"
}
mode_down_spillway-2t() { mode_down_spillway; }

# ---- dpu-only / elastic: Spillway with the DPU's limits scaled down ---------------------------
#
# bench/testbed-apps-vs.toml gives the emulated DPU limits the applications saturate (a slow path
# of about 2,000 connections/s, a 30 kpps fast path). `dpu-only` holds the spill plane released
# (the DPU-only baseline); `elastic` lets URSched start and activate it under pressure.

mode_missing_dpu-only() { SPILLWAY_CONFIG=$APPS_CONFIG mode_missing_spillway; }
mode_missing_elastic() { SPILLWAY_CONFIG=$APPS_CONFIG mode_missing_spillway; }
mode_up_dpu-only() { spillway_up "$APPS_CONFIG" --hold released; }
mode_up_elastic() { spillway_up "$APPS_CONFIG" --hold auto; }
mode_down_dpu-only() { mode_down_spillway; }
mode_down_elastic() { mode_down_spillway; }

spillway_up() {
    local config=$1 ready=$MODE_DIR/ready i
    shift
    # Run from the repository root so paths inside the config resolve as in `spillway run` there.
    start_bg_in "$ROOT" "$MODE_DIR/spillway.log" \
        "$SPILLWAY_BIN" run --config "$config" --ready-file "$ready" "$@"
    SPILLWAY_PID=$LAST_PID
    # Spillway is the mode, not a server: mode_down_spillway stops it (with SIGINT), after the
    # servers have gone, so it leaves the list stop_bg empties.
    unset 'BG_PIDS[-1]'
    for ((i = 0; i < SPILLWAY_READY_SECONDS * 10; i++)); do
        [[ -e $ready ]] && break
        if ! pid_alive "$SPILLWAY_PID"; then
            wait "$SPILLWAY_PID"
            FAIL_REASON="spillway exited with status $? before it was ready: $(tail_of "$MODE_DIR/spillway.log" 5)"
            SPILLWAY_PID=
            return 1
        fi
        sleep 0.1
    done
    if [[ ! -e $ready ]]; then
        FAIL_REASON="spillway not ready after $SPILLWAY_READY_SECONDS s: $(tail_of "$MODE_DIR/spillway.log" 5)"
        return 1
    fi
    for i in "$NS_A" "$NS_B"; do
        if ! ip -n "$i" link show eth0 >/dev/null 2>&1; then
            FAIL_REASON="spillway is ready but namespace $i has no eth0"
            return 1
        fi
    done
}

# Stops spillway with SIGINT and checks it cleaned up after itself; a shortfall is a failure of
# the run (reported), and the leftovers are removed here so the next mode starts clean.
mode_down_spillway() {
    local rc i started=0
    if [[ -n ${SPILLWAY_PID:-} ]]; then
        started=1
        kill -INT "$SPILLWAY_PID" 2>/dev/null
        for ((i = 0; i < SPILLWAY_EXIT_SECONDS * 10; i++)); do
            pid_alive "$SPILLWAY_PID" || break
            sleep 0.1
        done
        if pid_alive "$SPILLWAY_PID"; then
            fail teardown "spillway still running $SPILLWAY_EXIT_SECONDS s after SIGINT; killed"
            stop_pid "$SPILLWAY_PID" KILL 1
        else
            wait "$SPILLWAY_PID"
            rc=$?
            # 130 = 128 + SIGINT: a process that re-raises SIGINT after cleaning up.
            if ((rc != 0 && rc != 130)); then
                fail teardown "spillway exited with status $rc after SIGINT: $(tail_of "$MODE_DIR/spillway.log" 5)"
            fi
        fi
        SPILLWAY_PID=
    fi
    for i in "$NS_A" "$NS_B"; do
        if ns_exists "$i"; then
            ((started)) && fail teardown "spillway left namespace $i behind"
            ns_delete "$i"
        fi
    done
    root_links_delete
}
