# Helpers the bench scripts share (sourced, not run): `ctl`, the fabric's phase, and waiting
# for a phase. They expect BIN (the spillway binary) and CONFIG (the testbed) to be set.
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
