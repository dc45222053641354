# Helpers the bench scripts share (sourced, not run): starting and stopping `spillway run`,
# `ctl`, the fabric's phase, and waiting for a phase. They expect BIN (the spillway binary),
# CONFIG (the testbed) and TMP (a scratch folder) to be set.
ctl() { "$BIN" ctl --config "$CONFIG" "$@"; }
phase() { ctl status | python3 -c 'import json,sys; print(json.load(sys.stdin)["phase"])'; }
wait_phase() {
    local want=$1 i
    for ((i = 0; i < 200; i++)); do
        [[ $(phase) == "$want" ]] && return 0
        sleep 0.05
    done
    echo "phase $(phase), wanted $want" >&2
    return 1
}

# Starts `spillway run` on CONFIG with the extra arguments given (its log in $TMP/daemon.log),
# sets DAEMON to its pid and waits until the testbed is up (READY_WAIT_S, default 10 s, at most;
# a testbed with QEMU guests under TCG needs more).
start_daemon() {
    "$BIN" run --config "$CONFIG" --ready-file "$TMP/ready" --log warn "$@" 2>"$TMP/daemon.log" &
    DAEMON=$!
    for _ in $(seq $((${READY_WAIT_S:-10} * 10))); do [[ -e $TMP/ready ]] && break; sleep 0.1; done
    [[ -e $TMP/ready ]] || { echo "spillway run did not come up: $(tail -5 "$TMP/daemon.log")" >&2; exit 1; }
}

# Stops the daemon started by start_daemon (SIGINT: it removes everything it created).
stop_daemon() {
    if [[ -n ${DAEMON:-} ]]; then
        kill -INT "$DAEMON" 2>/dev/null || true
        wait "$DAEMON" 2>/dev/null || true
    fi
}
