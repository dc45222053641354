#!/usr/bin/env bash
# etcd-load: can one etcd on this machine carry a 3,000-host cluster's control plane? N simulated
# host agents (default 3,000) each hold a lease (10 s TTL, kept alive every 3 s) and publish
# their load record (about 200 bytes: per-tenant rate and variance, spare cores, plane state)
# under it once a second, spread evenly over the second; one aggregator watches every record
# (the cluster baseline's input) and `--watchers` agents watch the baseline key it rewrites
# once a second. Measured: the write rate reached, put latency, watch latency (from the put's
# send time in the record to the watch event's arrival), and etcd's CPU and resident memory.
#
#   sudo bash bench/etcd-load.sh [--agents N] [--duration S] [--watchers W] [--json FILE]
#                                [--etcd-log FILE]    (etcd's warnings: slow disk syncs, ...)
#                                [--data-in DIR]      (where etcd's data goes; default /tmp, on
#                                                      disk here; /dev/shm takes the disk out)
#
# Starts its own etcd (Debian's etcd-server: `apt-get install etcd-server`) on loopback with a
# temporary data folder, and removes both at exit. Talks to etcd's JSON gateway (/v3/...) over
# HTTP/1.1 keep-alive connections from one Python asyncio process; that process shares the
# machine's two cores with etcd, and the report gives its CPU too so a client-bound run can be
# told from an etcd-bound one.
set -euo pipefail
AGENTS=3000
DURATION=30
WATCHERS=100
JSON=
ETCD_LOG=
DATA_IN=/tmp
while [[ $# -gt 0 ]]; do
    case $1 in
        --agents) AGENTS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --watchers) WATCHERS=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        --etcd-log) ETCD_LOG=$2; shift 2 ;;
        --data-in) DATA_IN=$2; shift 2 ;;
        *) echo "usage: $0 [--agents N] [--duration S] [--watchers W] [--json FILE] [--etcd-log FILE]" >&2; exit 2 ;;
    esac
done
command -v etcd >/dev/null || { echo "etcd is missing: apt-get install etcd-server" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 is missing" >&2; exit 2; }
TMP=$(mktemp -d "$DATA_IN/spillway-etcd.XXXXXX")
ETCD=
cleanup() {
    if [[ -n $ETCD ]]; then
        kill "$ETCD" 2>/dev/null || true
        wait "$ETCD" 2>/dev/null || true
    fi
    if [[ -n $ETCD_LOG && -f $TMP/etcd.log ]]; then
        cp "$TMP/etcd.log" "$ETCD_LOG"
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
# A port of its own: the first free one from a pid-derived start.
PORT=$((20000 + ($$ % 20000)))
while ss -ltn | grep -q ":$PORT "; do PORT=$((PORT + 2)); done
etcd --name bench --data-dir "$TMP/data" \
    --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((PORT + 1))" \
    --quota-backend-bytes $((2 << 30)) --log-level warn >"$TMP/etcd.log" 2>&1 &
ETCD=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "etcd did not start: $(tail -3 "$TMP/etcd.log")" >&2; exit 1; }

python3 - "$PORT" "$AGENTS" "$DURATION" "$WATCHERS" "$ETCD" "${JSON:-}" <<'EOF'
import asyncio, base64, json, os, statistics, sys, time

port, agents, duration, watchers, etcd_pid = (int(x) for x in sys.argv[1:6])
out = sys.argv[6]
CONNS = 64

def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()

def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])

def rss_mib(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) / 1024
    return 0.0

class Conn:
    """One keep-alive HTTP/1.1 connection to etcd's gateway, one request at a time."""
    def __init__(self):
        self.r = self.w = None
        self.lock = asyncio.Lock()
    async def post(self, path, doc):
        body = json.dumps(doc).encode()
        async with self.lock:
            if self.w is None:
                self.r, self.w = await asyncio.open_connection("127.0.0.1", port)
            self.w.write(f"POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await self.w.drain()
            status = await self.r.readline()
            length, chunked = 0, False
            while True:
                h = await self.r.readline()
                if h in (b"\r\n", b""):
                    break
                k, _, v = h.decode().partition(":")
                if k.lower() == "content-length":
                    length = int(v)
                elif k.lower() == "transfer-encoding" and "chunked" in v.lower():
                    chunked = True
            if chunked:
                data = b""
                while True:
                    size = int((await self.r.readline()).strip() or b"0", 16)
                    if size == 0:
                        await self.r.readline()
                        break
                    data += await self.r.readexactly(size)
                    await self.r.readline()
            else:
                data = await self.r.readexactly(length)
            if not status.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{path}: {status!r} {data[:200]!r}")
            return json.loads(data)

async def watch(key, prefix, on_event, ready):
    """A watch stream on the gateway (chunked, one JSON document per message)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    end = key[:-1] + chr(ord(key[-1]) + 1) if prefix else None
    req = {"create_request": {"key": b64(key)}}
    if end:
        req["create_request"]["range_end"] = b64(end)
    body = json.dumps(req).encode()
    w.write(f"POST /v3/watch HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await w.drain()
    while (await r.readline()) not in (b"\r\n", b""):
        pass
    buf = b""
    ready.set()
    while True:
        size = int((await r.readline()).strip() or b"0", 16)
        if size == 0:
            return
        buf += await r.readexactly(size)
        await r.readline()
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                now = time.monotonic()
                for ev in json.loads(line).get("result", {}).get("events", []):
                    on_event(now, base64.b64decode(ev["kv"]["value"]))

async def main():
    conns = [Conn() for _ in range(CONNS)]
    put_lat, watch_lat, base_lat = [], [], []
    errors = [0]
    # Leases: one per agent.
    leases = []
    for i in range(agents):
        r = await conns[i % CONNS].post("/v3/lease/grant", {"TTL": 10})
        leases.append(r["ID"])
    stop = time.monotonic() + duration
    measuring = [False]
    def on_record(now, value):
        if measuring[0]:
            watch_lat.append(now - json.loads(value)["sent"])
    def on_baseline(now, value):
        if measuring[0]:
            base_lat.append(now - json.loads(value)["sent"])
    ready = [asyncio.Event() for _ in range(1 + watchers)]
    tasks = [asyncio.create_task(watch("/spillway/hosts/", True, on_record, ready[0]))]
    for k in range(watchers):
        tasks.append(asyncio.create_task(watch("/spillway/baseline", False, on_baseline, ready[k + 1])))
    for e in ready:
        await e.wait()
    puts = [0]
    async def agent(i):
        c = conns[i % CONNS]
        start = time.monotonic()
        await asyncio.sleep(i / agents)
        n = 0
        while time.monotonic() < stop:
            sent = time.monotonic()
            doc = {"sent": sent, "host": i, "tenants": {"t1": [123456.0, 0.12], "t2": [78901.0, 0.03]},
                   "spare_cores": 6, "plane": "idle", "seq": n}
            try:
                await c.post("/v3/kv/put", {"key": b64(f"/spillway/hosts/{i:05}"), "value": b64(json.dumps(doc)), "lease": leases[i]})
                if measuring[0]:
                    put_lat.append(time.monotonic() - sent)
                    puts[0] += 1
                if n % 3 == 0:
                    await c.post("/v3/lease/keepalive", {"ID": leases[i]})
            except Exception:
                errors[0] += 1
            n += 1
            await asyncio.sleep(max(0.0, start + i / agents + n - time.monotonic()))
    async def aggregator():
        c = conns[0]
        while time.monotonic() < stop:
            await asyncio.sleep(1.0)
            await c.post("/v3/kv/put", {"key": b64("/spillway/baseline"), "value": b64(json.dumps({"sent": time.monotonic(), "cv2": 0.02}))})
    async def window():
        # The first seconds (connections opening, the agents' first records) are left out;
        # the window ends when the agents stop sending.
        await asyncio.sleep(min(5.0, duration / 4))
        measuring[0] = True
        a = (time.monotonic(), ticks(etcd_pid), ticks(os.getpid()))
        await asyncio.sleep(max(0.0, stop - time.monotonic()))
        measuring[0] = False
        return a, (time.monotonic(), ticks(etcd_pid), ticks(os.getpid()))
    w = asyncio.create_task(window())
    await asyncio.gather(aggregator(), *[agent(i) for i in range(agents)])
    (t0, e0, p0), (t1, e1, p1) = await w
    for t in tasks:
        t.cancel()
    hz = os.sysconf("SC_CLK_TCK")
    q = lambda xs, p: statistics.quantiles(xs, n=1000)[int(p * 1000) - 1] * 1e3 if len(xs) > 10 else None
    doc = {
        "bench": "etcd-load", "etcd": "3.4 (Debian etcd-server)", "agents": agents, "duration_s": duration,
        "watchers": watchers, "window_s": t1 - t0,
        "puts_per_s": puts[0] / (t1 - t0), "offered_puts_per_s": agents,
        "put_ms": {"p50": q(put_lat, 0.5), "p99": q(put_lat, 0.99)},
        "watch_all_records_ms": {"p50": q(watch_lat, 0.5), "p99": q(watch_lat, 0.99), "events": len(watch_lat)},
        "watch_baseline_ms": {"p50": q(base_lat, 0.5), "p99": q(base_lat, 0.99), "events": len(base_lat)},
        "etcd_cpu_cores": (e1 - e0) / hz / (t1 - t0), "client_cpu_cores": (p1 - p0) / hz / (t1 - t0),
        "etcd_rss_mib": rss_mib(etcd_pid), "errors": errors[0],
    }
    if out:
        json.dump(doc, open(out, "w"), indent=1)
    print(json.dumps(doc, indent=1))

asyncio.run(main())
EOF
