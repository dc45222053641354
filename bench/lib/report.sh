# shellcheck shell=bash
# report JSON_FILE_OR_EMPTY: the table of medians, min-max and ratios from "$TMP/results.tsv",
# the failures and skipped modes; with a file name, the same plus every raw value as JSON.
# Ratios are of medians measured in the same interleaved run.
report() {
    python3 - "$TMP" "${1:-}" <<'PY'
import csv, json, math, os, statistics, sys

tmp, json_path = sys.argv[1], sys.argv[2]
env = os.environ


def rows(name):
    path = os.path.join(tmp, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]


modes = env["BENCH_MODES"].split(",")
runs = int(env["BENCH_RUNS"])
metric_order = [
    "tcp_gbps", "udp64_rx_kpps", "udp64_tx_kpps", "udp_flood_rx_kpps", "udp_flood_tx_kpps",
    "udp_flood_switch_cores", "udp_flood_per_core_kpps", "http_close_rps",
    "http_keepalive_rps", "redis_set_rps", "redis_get_rps",
]
units = {"gbps": "Gbit/s", "kpps": "kpps", "rps": "req/s", "cores": "cores"}

raw = {}  # mode -> metric -> [value or None per run]
for run, mode, metric, value in rows("results.tsv"):
    v = float(value)
    raw.setdefault(mode, {}).setdefault(metric, [None] * runs)[int(run) - 1] = None if math.isnan(v) else v
failures = [dict(zip(("run", "mode", "test", "reason"), r)) for r in rows("failures.tsv")]
for f in failures:
    f["run"] = int(f["run"])
skipped = {mode: reason for mode, reason in rows("skipped.tsv")}
orders = {int(run): order.split(",") for run, order in rows("order.tsv")}
metrics = [m for m in metric_order if any(m in raw.get(mode, {}) for mode in modes)]

summary = {}  # mode -> metric -> {median, min, max, n}
for mode in modes:
    for metric, values in raw.get(mode, {}).items():
        got = [v for v in values if v is not None]
        if got:
            summary.setdefault(mode, {})[metric] = {
                "median": statistics.median(got), "min": min(got), "max": max(got), "n": len(got),
            }

pairs = [
    ("spillway", "ovs"), ("spillway", "ovs-tso"), ("spillway", "veth"), ("elastic", "dpu-only"),
    ("spillway-2t", "spillway"), ("spillway-2t", "ovs"), ("spillway-2t", "ovs-tso"),
    ("ovs", "veth"), ("ovs-tso", "veth"), ("ovs-tso", "ovs"),
]
ratios = {}
for num, den in pairs:
    if num in summary and den in summary:
        r = {}
        for metric in metrics:
            a, b = summary[num].get(metric), summary[den].get(metric)
            if a and b and b["median"]:
                r[metric] = a["median"] / b["median"]
        if r:
            ratios[f"{num}/{den}"] = r


def fmt(x):
    if x is None or math.isnan(x):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def label(metric):
    name, unit = metric.rsplit("_", 1)
    return name, units.get(unit, unit)


shown = [m for m in modes if m in summary]
print()
print(f"vs-ovs: medians of {runs} interleaved runs, {env['BENCH_DURATION']} s per test "
      f"[min-max]; {env['BENCH_CPUS']} CPUs shared by apps, kernel and switch; nothing pinned")
if shown:
    w = 24
    print(f"{'test':<20}{'unit':<8}" + "".join(f"{m:>{w}}" for m in shown))
    for metric in metrics:
        name, unit = label(metric)
        cells = []
        for mode in shown:
            s = summary[mode].get(metric)
            cell = "-" if s is None else f"{fmt(s['median'])} [{fmt(s['min'])}-{fmt(s['max'])}]"
            if s is not None and s["n"] < runs:
                cell += f" n={s['n']}"
            cells.append(f"{cell:>{w}}")
        print(f"{name:<20}{unit:<8}" + "".join(cells))
if ratios:
    print()
    print("ratios of medians")
    w = max(15, max(len(p) for p in ratios) + 2)
    print(f"{'test':<24}" + "".join(f"{p:>{w}}" for p in ratios))
    for metric in metrics:
        name, _ = label(metric)
        print(f"{name:<24}" + "".join(f"{fmt(r.get(metric)):>{w}}" for r in ratios.values()))
for mode, reason in skipped.items():
    print(f"skipped {mode}: {reason}")
if failures:
    print()
    print(f"{len(failures)} failure(s):")
    for f in failures:
        print(f"  run {f['run']} {f['mode']} {f['test']}: {f['reason']}")

if json_path:
    doc = {
        "bench": "vs-ovs",
        "date": env["BENCH_DATE"],
        "host": {"cpus": int(env["BENCH_CPUS"]), "kernel": env["BENCH_KERNEL"]},
        "duration_s": int(env["BENCH_DURATION"]),
        "runs": runs,
        "modes": modes,
        "skipped": skipped,
        "order": {str(k): v for k, v in sorted(orders.items())},
        "raw": raw,
        "median": {m: {k: v["median"] for k, v in s.items()} for m, s in summary.items()},
        "min": {m: {k: v["min"] for k, v in s.items()} for m, s in summary.items()},
        "max": {m: {k: v["max"] for k, v in s.items()} for m, s in summary.items()},
        "ratios": ratios,
        "failures": failures,
    }
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=2, allow_nan=False, default=str)
        f.write("\n")
    print(f"\nJSON written to {json_path}")
PY
}
