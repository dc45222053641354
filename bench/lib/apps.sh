# shellcheck shell=bash
# The applications: servers started in namespace b once a mode is up, and the tests whose clients
# run in namespace a. A test appends its figures to "$TMP/results.tsv" (run, mode, metric, value)
# or a reason to "$TMP/failures.tsv"; the report reads both.
#
# Metrics, with the unit in the name's last part:
#   tcp_gbps             iperf3 TCP, receiver side
#   udp64_rx_kpps        iperf3 UDP, 64-byte payloads, unlimited rate: datagrams the server got
#   udp64_tx_kpps        ... datagrams the client sent (shows whether sender or path was the limit)
#   udp_flood_rx_kpps    `spillway traffic gen` flat out (sendmmsg batches of 64, FLOOD_FLOWS
#                        flows, 64-byte payloads) to `spillway traffic sink`: what the sink got
#   udp_flood_tx_kpps    ... datagrams the generator sent
#   udp_flood_switch_cores   ... CPU of the switch's forwarding process over the generator's run
#                        (ovs-vswitchd; Spillway's DPU process), in cores: not for veth (no
#                        switch) nor for the modes whose spill plane may forward part of it
#   udp_flood_per_core_kpps  ... udp_flood_rx_kpps / udp_flood_switch_cores: datagrams
#                        delivered per second per core of the switch
#   http_close_rps       wrk -t1 -c32 with `Connection: close` against nginx (a TCP connection per
#                        request: connection setup is what this measures)
#   http_keepalive_rps   the same with keep-alive                                  (--all-apps)
#   redis_set_rps        redis-benchmark -t set, 50 clients, no pipelining          (--all-apps)
#   redis_get_rps        redis-benchmark -t get                                     (--all-apps)

IPERF_PORT=5201
HTTP_PORT=8080
REDIS_PORT=6380
UDP_LEN=64
FLOOD_PORT=9000
FLOOD_FLOWS=8

record() { printf '%s\t%s\t%s\t%s\n' "$RUN" "$MODE" "$1" "$2" >>"$TMP/results.tsv"; }

FAILED=0
fail() {
    FAILED=1
    printf '%s\t%s\t%s\t%s\n' "$RUN" "$MODE" "$1" "$2" >>"$TMP/failures.tsv"
    log "FAILED run $RUN $MODE $1: $2"
}

# servers_start: iperf3 and nginx (and redis with --all-apps) in namespace b, then wait until a
# reaches b. Returns 1 with a reason in FAIL_REASON.
servers_start() {
    local d=$MODE_DIR www=$MODE_DIR/www
    mkdir -p "$www" "$d/nginx-temp"
    # nginx's worker runs as nobody and must traverse the temp dirs to read the page.
    chmod 755 "$TMP" "$d" "$www"
    printf 'spillway vs-ovs bench\n' >"$www/index.html"
    chmod 644 "$www/index.html"
    cat >"$d/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path $d/nginx-temp/body;
    proxy_temp_path $d/nginx-temp/proxy;
    fastcgi_temp_path $d/nginx-temp/fastcgi;
    uwsgi_temp_path $d/nginx-temp/uwsgi;
    scgi_temp_path $d/nginx-temp/scgi;
    server {
        listen $IP_B:$HTTP_PORT;
        root $www;
    }
}
EOF
    start_bg "$d/iperf3-server.log" ip netns exec "$NS_B" iperf3 -s -p "$IPERF_PORT"
    start_bg "$d/nginx.out" ip netns exec "$NS_B" nginx -e "$d/nginx-error.log" -p "$d" -c "$d/nginx.conf"
    if ((ALL_APPS)); then
        start_bg "$d/redis.out" ip netns exec "$NS_B" redis-server --port "$REDIS_PORT" \
            --bind "$IP_B" --protected-mode no --save '' --appendonly no --daemonize no \
            --dir "$d" --logfile "$d/redis.log"
    fi
    if ! wait_for 10 listening "$NS_B" "$IPERF_PORT"; then
        FAIL_REASON="iperf3 server not listening after 10 s: $(tail_of "$d/iperf3-server.log")"
        return 1
    fi
    if ! wait_for 10 listening "$NS_B" "$HTTP_PORT"; then
        FAIL_REASON="nginx not listening after 10 s: $(tail_of "$d/nginx-error.log") $(tail_of "$d/nginx.out")"
        return 1
    fi
    if ((ALL_APPS)) && ! wait_for 10 listening "$NS_B" "$REDIS_PORT"; then
        FAIL_REASON="redis-server not listening after 10 s: $(tail_of "$d/redis.log")"
        return 1
    fi
    # The first connection also resolves ARP and, for OVS, installs the first datapath flows.
    if ! wait_for 10 reachable "$HTTP_PORT"; then
        FAIL_REASON="$IP_A cannot connect to $IP_B:$HTTP_PORT within 10 s (the switch passes no traffic)"
        return 1
    fi
    return 0
}

# iperf_figures FILE tcp|udp: print "metric value" lines from an iperf3 -J report, or a reason on
# stderr and status 1.
iperf_figures() {
    python3 - "$1" "$2" "$UDP_LEN" <<'PY'
import json, sys
path, kind, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    with open(path) as f:
        report = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"no iperf3 JSON report ({e})")
if report.get("error"):
    sys.exit(f"iperf3: {report['error']}")
end = report.get("end", {})
received, sent = end.get("sum_received"), end.get("sum_sent")
if not received or not received.get("seconds"):
    sys.exit("iperf3 report has no end.sum_received")
if kind == "tcp":
    print("tcp_gbps", received["bits_per_second"] / 1e9)
else:
    # The receiver's packet count is its highest sequence number, lost ones included; the bytes
    # it got divided by the datagram size is what arrived.
    rx = received["bytes"] / length / received["seconds"]
    tx = sent["packets"] / sent["seconds"] if sent and sent.get("seconds") else float("nan")
    if rx <= 0:
        sys.exit(f"no datagram arrived (sent {sent and sent.get('packets')})")
    print("udp64_rx_kpps", rx / 1e3)
    print("udp64_tx_kpps", tx / 1e3)
PY
}

# record_figures TEST FILE-WITH-"metric value"-LINES
record_figures() {
    local metric value
    while read -r metric value; do
        record "$metric" "$value"
    done <"$2"
}

test_tcp() {
    local out=$MODE_DIR/tcp.json
    run_client $((DURATION + 20)) "$out" ip netns exec "$NS_A" \
        iperf3 -c "$IP_B" -p "$IPERF_PORT" -t "$DURATION" -J --connect-timeout 3000
    if ! iperf_figures "$out" tcp >"$out.figures" 2>"$out.reason"; then
        fail tcp "$(tail_of "$out.reason" 1) $(tail_of "$out.err" 2)"
        return
    fi
    record_figures tcp "$out.figures"
}

test_udp() {
    local out=$MODE_DIR/udp64.json
    run_client $((DURATION + 20)) "$out" ip netns exec "$NS_A" \
        iperf3 -c "$IP_B" -p "$IPERF_PORT" -u -b 0 -l "$UDP_LEN" -t "$DURATION" -J --connect-timeout 3000
    if ! iperf_figures "$out" udp >"$out.figures" 2>"$out.reason"; then
        fail udp64 "$(tail_of "$out.reason" 1) $(tail_of "$out.err" 2)"
        return
    fi
    record_figures udp64 "$out.figures"
}

# test_udp-flood: the same 64-byte datagrams as test_udp, but from `spillway traffic gen`, which
# sends batches of 64 per syscall (sendmmsg) from FLOOD_FLOWS sockets, flat out; the sink
# (recvmmsg, 8 MB receive buffer) runs in b and stops 2 s after the last datagram. It uses
# $SPILLWAY_BIN in every mode, veth and ovs included.
test_udp-flood() {
    local out=$MODE_DIR/udp-flood ready=$MODE_DIR/udp-flood.ready sink i
    if [[ ! -x $SPILLWAY_BIN ]]; then
        fail udp-flood "$SPILLWAY_BIN not found (cargo build --release -p spillway, or set SPILLWAY=path)"
        return
    fi
    start_bg "$out.sink" ip netns exec "$NS_B" "$SPILLWAY_BIN" traffic sink \
        --bind "$IP_B:$FLOOD_PORT" --json --idle 2 --wait $((DURATION + 30)) --ready-file "$ready"
    sink=$LAST_PID
    if ! wait_for 10 test -e "$ready"; then
        fail udp-flood "the sink did not bind $IP_B:$FLOOD_PORT within 10 s: $(tail_of "$out.sink")"
        stop_pid "$sink"
        return
    fi
    local spid c0=0 c1=0 t0 t1
    spid=$(switch_pid)
    t0=$(date +%s%N)
    [[ -n $spid ]] && c0=$(ticks "$spid")
    run_client $((DURATION + 20)) "$out.gen" ip netns exec "$NS_A" "$SPILLWAY_BIN" traffic gen \
        --dst "$IP_B:$FLOOD_PORT" --size "$UDP_LEN" --flows "$FLOOD_FLOWS" --duration "$DURATION" --json
    t1=$(date +%s%N)
    [[ -n $spid ]] && c1=$(ticks "$spid")
    # The sink stops on its own 2 s after the last datagram (or --wait after start if none came).
    for ((i = 0; i < 100; i++)); do
        pid_alive "$sink" || break
        sleep 0.1
    done
    if pid_alive "$sink"; then
        fail udp-flood "the sink did not stop 10 s after the generator: $(tail_of "$out.sink")"
        stop_pid "$sink"
        return
    fi
    wait "$sink" 2>/dev/null
    if ! python3 - "$out.gen" "$out.sink" "$spid" $((c1 - c0)) $((t1 - t0)) "$(getconf CLK_TCK)" \
        >"$out.figures" 2>"$out.reason" <<'PY'
import json, sys


def report(path, who):
    # The JSON object is the line starting with "{"; a warning (a capped SO_RCVBUF) may precede it.
    try:
        with open(path) as f:
            lines = [l for l in f if l.startswith("{")]
        return json.loads(lines[-1])
    except (OSError, ValueError, IndexError) as e:
        sys.exit(f"no JSON report from the {who} ({e})")


gen, sink = report(sys.argv[1], "generator"), report(sys.argv[2], "sink")
if gen["sent"] <= 0:
    sys.exit(f"the generator sent nothing ({gen.get('last_send_error')})")
if sink["received"] <= 0:
    sys.exit(f"no datagram arrived (sent {gen['sent']})")
print("udp_flood_rx_kpps", sink["pps"] / 1e3)
print("udp_flood_tx_kpps", gen["pps"] / 1e3)
switch, ticks, ns, hz = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
if switch:
    cores = ticks / hz / (ns / 1e9)
    if cores <= 0:
        sys.exit(f"the switch (pid {switch}) used no CPU during the flood: gone?")
    print("udp_flood_switch_cores", cores)
    print("udp_flood_per_core_kpps", sink["pps"] / 1e3 / cores)
PY
    then
        fail udp-flood "$(tail_of "$out.reason" 1) $(tail_of "$out.gen.err" 2) $(tail_of "$out.sink" 2)"
        return
    fi
    record_figures udp-flood "$out.figures"
}

# wrk_test NAME METRIC [wrk args...]
wrk_test() {
    local name=$1 metric=$2 out=$MODE_DIR/$1.txt rps
    shift 2
    run_client $((DURATION + 20)) "$out" ip netns exec "$NS_A" \
        wrk -t1 -c32 -d "${DURATION}s" "$@" "http://$IP_B:$HTTP_PORT/"
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
    if [[ -z $rps ]]; then
        fail "$name" "wrk printed no Requests/sec: $(tail_of "$out.err") $(tail_of "$out")"
        return
    fi
    if grep -q 'Non-2xx' "$out"; then
        fail "$name" "nginx answered with errors: $(grep 'Non-2xx' "$out")"
        return
    fi
    if awk -v r="$rps" 'BEGIN { exit !(r <= 0) }'; then
        fail "$name" "0 requests/s: $(grep -E 'requests in|Socket errors' "$out" | tr '\n' ' ')"
        return
    fi
    record "$metric" "$rps"
}

test_http_close() { wrk_test http_close http_close_rps -H 'Connection: close'; }
test_http_keepalive() { wrk_test http_keepalive http_keepalive_rps; }

test_redis() {
    local out=$MODE_DIR/redis.csv n
    # redis-benchmark has no duration; about 10k requests per second of test keeps it near one.
    n=$((REDIS_REQUESTS > 0 ? REDIS_REQUESTS : DURATION * 10000))
    run_client $((DURATION * 10 + 60)) "$out" ip netns exec "$NS_A" \
        redis-benchmark -h "$IP_B" -p "$REDIS_PORT" -t set,get -n "$n" -q --csv
    if ! python3 - "$out" >"$out.figures" 2>"$out.reason" <<'PY'
import csv, sys
rows = {}
with open(sys.argv[1]) as f:
    for row in csv.reader(f):
        if len(row) >= 2 and row[0] in ("SET", "GET"):
            rows[row[0]] = float(row[1])
missing = {"SET", "GET"} - rows.keys()
if missing:
    sys.exit(f"redis-benchmark printed no {', '.join(sorted(missing))} line")
for name, rps in sorted(rows.items()):
    print(f"redis_{name.lower()}_rps", rps)
PY
    then
        fail redis "$(tail_of "$out.reason" 1) $(tail_of "$out.err" 2)"
        return
    fi
    record_figures redis "$out.figures"
}

# run_tests: every test, in a fixed order, with a short pause so one test's queues have drained
# before the next starts.
run_tests() {
    local t
    for t in "${TESTS[@]}"; do
        log "run $RUN/$RUNS $MODE: $t"
        "test_$t"
        sleep 0.5
    done
}
