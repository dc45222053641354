//! `spillway bench datapath`: single-core fast-path and slow-path throughput of the vSwitch
//! pipeline on the synthetic workload of [`spillway_vswitch::workload`] (1,000,000 flows,
//! 64 VM ports with 1,000 security-group rules each, 10,000 routes, 64-byte packets).
//!
//! What is measured, all on one pinned core and in one process, so ratios are meaningful:
//!
//! - **slow path**: the first packet of every flow (a new connection: parse, VNI, security group,
//!   conntrack create, two flow entries built and installed, actions applied), in batches, on a
//!   freshly built pipeline per run; connections per second, plus per-chunk rates within a run.
//! - **fast path**: after two untimed warm-up passes (they bring every connection and both of
//!   its flow entries to the steady state), `runs` timed passes over all flows in both directions: VXLAN uplink frames
//!   (decap + deliver) and VM replies (encap toward the remote VTEP), interleaved batch by batch.
//!   Every packet must be a fast-path hit, or the bench fails.
//! - **baseline**: the same loop doing only the frame reload and `parse_frame`.
//! - **small working set**: the fast path over a 10,000-flow workload that fits in cache.
//!
//! Frames are reloaded into a ring of reusable `PacketBuf`s before every batch: that copy stands
//! in for the NIC's DMA write of a fresh packet and is included in every figure (baseline too).
//! `now` is virtual by default (see [`ClockKind`]): 50 ns per packet, so conntrack refreshes come
//! as often per packet as at the 20 Mpps target; `--clock real` uses elapsed time instead.

use std::hint::black_box;
use std::time::{Duration, Instant as StdInstant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use spillway_vswitch::pipeline::{Pipeline, PipelineCounters};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::workload::{
    INNER_FRAME_LEN, UPLINK_FRAME_LEN, UPLINK_PORT, WIRE_PACKET_BYTES, Workload, WorkloadConfig,
};
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};
use spillway_wire::{ParseOptions, parse_frame};

use crate::alloc;
use crate::flags::ranged;

/// Fast-path target: 20 Mpps per core (50 ns per packet).
const TARGET_MPPS: f64 = 20.0;
/// Slow-path target: one million new connections per second per core.
const TARGET_CPS: f64 = 1_000_000.0;
/// Packet buffers in the receive ring (rounded up to whole batches): a NIC-ring-sized set that
/// is reused, so buffers stay cache resident as they would with a real driver's pool.
const RING_BUFFERS: usize = 256;
/// Most flows of a working set `--flows` and `--small-flows` accept (the frames of both
/// directions are held in memory).
const FLOWS_MAX: u64 = 1 << 24;
/// Highest CPU number `--cpu` accepts: the affinity mask's size.
const CPU_MAX: u64 = 1023;
/// Slow-path flows per chunk for the per-chunk rates.
const CHUNK_FLOWS: usize = 1 << 16;

/// Arguments of `spillway bench datapath`.
#[derive(clap::Args, Debug)]
pub struct DatapathArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Number of flows (connections) in the large working set, 1..=16777216 (memory grows
    /// with it: about 1 GB at the default).
    #[arg(long, default_value_t = 1_000_000, value_parser = ranged(1, FLOWS_MAX))]
    pub flows: usize,
    /// Timed fast-path passes (each over all flows, both directions), 1..=1000.
    #[arg(long, default_value_t = 5, value_parser = ranged(1, 1000))]
    pub runs: usize,
    /// Slow-path runs, each on a freshly built pipeline (the last one feeds the fast path),
    /// 1..=100.
    #[arg(long, default_value_t = 3, value_parser = ranged(1, 100))]
    pub slow_runs: usize,
    /// Frames per `process_batch` call, 1..=256 (the receive ring's size).
    #[arg(long, default_value_t = 32, value_parser = ranged(1, RING_BUFFERS as u64))]
    pub batch: usize,
    /// Workload seed (visit order; any u64).
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// Flows of the small (cache-resident) working set, 1..=16777216.
    #[arg(long, default_value_t = 10_000, value_parser = ranged(1, FLOWS_MAX))]
    pub small_flows: usize,
    /// CPU to pin the bench thread to, 0..=1023.
    #[arg(long, default_value_t = 1, value_parser = ranged(0, CPU_MAX))]
    pub cpu: usize,
    /// The pipeline's clock (virtual: 50 ns per packet, the target rate).
    #[arg(long, value_enum, default_value_t = ClockKind::Virtual)]
    pub clock: ClockKind,
    /// Do not advise transparent huge pages for big allocations.
    #[arg(long)]
    pub no_huge_pages: bool,
}

/// One batch of the schedule: `len` frames from `first` of one direction's frame set.
#[derive(Clone, Copy, Debug)]
struct Batch {
    port: PortId,
    uplink: bool,
    first: usize,
    len: usize,
}

/// Batches of one fast-path pass: an uplink batch, then a batch of the next VM port with frames
/// left (round robin, like a poll loop over receive queues), until both directions are done.
fn fast_schedule(w: &Workload, b: usize) -> Vec<Batch> {
    let mut segs: Vec<(PortId, usize, usize)> = w.reply_segments().collect();
    let mut out = Vec::with_capacity(2 * w.uplink().len() / b + segs.len() + 2);
    let (mut up, n_up) = (0, w.uplink().len());
    let mut port = 0;
    loop {
        let mut progressed = false;
        if up < n_up {
            let len = b.min(n_up - up);
            out.push(Batch {
                port: UPLINK_PORT,
                uplink: true,
                first: up,
                len,
            });
            up += len;
            progressed = true;
        }
        for _ in 0..segs.len() {
            let n_segs = segs.len();
            let s = &mut segs[port];
            port = (port + 1) % n_segs;
            if s.1 < s.2 {
                let len = b.min(s.2 - s.1);
                out.push(Batch {
                    port: s.0,
                    uplink: false,
                    first: s.1,
                    len,
                });
                s.1 += len;
                progressed = true;
                break;
            }
        }
        if !progressed {
            return out;
        }
    }
}

/// Uplink batches only: the first packet of every flow.
fn slow_schedule(w: &Workload, b: usize) -> Vec<Batch> {
    let n = w.uplink().len();
    (0..n)
        .step_by(b)
        .map(|first| Batch {
            port: UPLINK_PORT,
            uplink: true,
            first,
            len: b.min(n - first),
        })
        .collect()
}

/// The receive ring and verdict scratch the passes share.
struct Ring {
    bufs: Vec<PacketBuf>,
    verdicts: Vec<Verdict>,
    next: usize,
    batch: usize,
}

impl Ring {
    fn new(batch: usize) -> Ring {
        let n = RING_BUFFERS.div_ceil(batch) * batch;
        Ring {
            bufs: (0..n).map(|_| PacketBuf::default()).collect(),
            verdicts: vec![Verdict::Forward(UPLINK_PORT); batch],
            next: 0,
            batch,
        }
    }

    /// Load the batch's frames (the stand-in for the NIC's DMA) into the next ring slots.
    #[inline]
    fn load(&mut self, w: &Workload, b: &Batch) -> (&mut [PacketBuf], &mut [Verdict]) {
        let start = self.next;
        self.next = (self.next + self.batch) % self.bufs.len();
        let set = if b.uplink { w.uplink() } else { w.replies() };
        let bufs = &mut self.bufs[start..start + b.len];
        for (k, buf) in bufs.iter_mut().enumerate() {
            buf.load(set.get(b.first + k))
                .expect("workload frames fit a default buffer");
        }
        (bufs, &mut self.verdicts[..b.len])
    }
}

/// How the bench drives the pipeline's `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockKind {
    /// Virtual time advancing [`VIRTUAL_NS_PER_PACKET`] per packet: the clock of a core running
    /// at exactly the 20 Mpps target, so per-flow timers (the 1 s conntrack refresh) fire as
    /// often per packet as they would at that rate (each flow is hit once per pass, a pass of
    /// 2M packets lasts 100 ms, so a refresh comes every tenth pass).
    Virtual,
    /// Real elapsed time, read once per batch. Couples timer work to the measured speed: a
    /// pass slower than the refresh interval refreshes conntrack on every packet.
    Real,
}

/// Virtual nanoseconds per packet of [`ClockKind::Virtual`]: the fast-path target.
const VIRTUAL_NS_PER_PACKET: u64 = 50;

/// The pipeline's clock; see [`ClockKind`].
struct Clock {
    kind: ClockKind,
    start: StdInstant,
    virtual_ns: std::cell::Cell<u64>,
}

impl Clock {
    fn new(kind: ClockKind) -> Clock {
        Clock {
            kind,
            start: StdInstant::now(),
            virtual_ns: std::cell::Cell::new(1),
        }
    }

    /// `now` for a batch of `packets` packets.
    #[inline]
    fn now(&self, packets: usize) -> Instant {
        match self.kind {
            ClockKind::Real => Instant(self.start.elapsed().as_nanos() as u64 + 1),
            ClockKind::Virtual => {
                let t = self.virtual_ns.get();
                self.virtual_ns
                    .set(t + packets as u64 * VIRTUAL_NS_PER_PACKET);
                Instant(t)
            }
        }
    }
}

/// One pass of the pipeline over `sched`; returns the elapsed time.
fn pipeline_pass(
    p: &mut Pipeline,
    w: &Workload,
    sched: &[Batch],
    ring: &mut Ring,
    clock: &Clock,
) -> Duration {
    let t0 = StdInstant::now();
    for b in sched {
        let now = clock.now(b.len);
        let (bufs, verdicts) = ring.load(w, b);
        p.process_batch(now, b.port, bufs, verdicts);
    }
    t0.elapsed()
}

/// The baseline pass: reload and parse only.
fn parse_pass(w: &Workload, sched: &[Batch], ring: &mut Ring, opts: &ParseOptions) -> Duration {
    let t0 = StdInstant::now();
    for b in sched {
        let (bufs, _) = ring.load(w, b);
        for buf in bufs.iter() {
            let _ = black_box(parse_frame(black_box(buf.data()), opts));
        }
    }
    t0.elapsed()
}

fn delta(after: &PipelineCounters, before: &PipelineCounters) -> PipelineCounters {
    PipelineCounters {
        rx_packets: after.rx_packets - before.rx_packets,
        fast_path_hits: after.fast_path_hits - before.fast_path_hits,
        slow_path_packets: after.slow_path_packets - before.slow_path_packets,
        stale_epoch: after.stale_epoch - before.stale_epoch,
        new_connections: after.new_connections - before.new_connections,
        flows_installed: after.flows_installed - before.flows_installed,
        flows_evicted: after.flows_evicted - before.flows_evicted,
        flows_rejected: after.flows_rejected - before.flows_rejected,
        icmp_related: after.icmp_related - before.icmp_related,
        conn_cut: after.conn_cut - before.conn_cut,
        forwarded: after.forwarded - before.forwarded,
        dropped: after.dropped - before.dropped,
    }
}

/// Median, min, max of `v` (the median of an even count is the mean of the middle two).
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

/// Per-run figures of a packet-rate measurement.
struct Rate {
    mpps: Vec<f64>,
    ns: Vec<f64>,
}

impl Rate {
    fn new() -> Rate {
        Rate {
            mpps: Vec::new(),
            ns: Vec::new(),
        }
    }

    fn add(&mut self, packets: usize, t: Duration) {
        let ns = t.as_nanos() as f64 / packets as f64;
        self.ns.push(ns);
        self.mpps.push(1e3 / ns);
    }

    fn median_ns(&self) -> f64 {
        stats(&self.ns).0
    }

    fn json(&self) -> Value {
        let (m, lo, hi) = stats(&self.mpps);
        let (nm, nlo, nhi) = stats(&self.ns);
        json!({
            "runs": self.mpps.iter().zip(&self.ns)
                .map(|(m, n)| json!({"mpps": round(*m, 3), "ns_per_packet": round(*n, 2)}))
                .collect::<Vec<_>>(),
            "mpps": {"median": round(m, 3), "min": round(lo, 3), "max": round(hi, 3)},
            "ns_per_packet": {"median": round(nm, 2), "min": round(nlo, 2), "max": round(nhi, 2)},
        })
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Pin this thread to `cpu` (rustix `sched_setaffinity`); the error text when it fails.
fn pin(cpu: usize) -> Result<usize, String> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| format!("{e}"))?;
    Ok(cpu)
}

/// A built pipeline plus its slow-path figures.
struct SlowRun {
    pipeline: Pipeline,
    cps: f64,
    chunk_cps: Vec<f64>,
}

/// Build a pipeline and open every flow's connection through the slow path.
fn slow_run(
    policy: &Policy,
    w: &Workload,
    batch: usize,
    ring: &mut Ring,
    clock: &Clock,
) -> Result<SlowRun> {
    let mut p =
        Pipeline::new(policy.clone(), w.pipeline_config()).context("building the pipeline")?;
    let sched = slow_schedule(w, batch);
    let before = p.counters().clone();
    let mut chunk_cps = Vec::new();
    let (mut chunk_start, mut chunk_flows) = (StdInstant::now(), 0usize);
    let t0 = StdInstant::now();
    for b in &sched {
        let now = clock.now(b.len);
        let (bufs, verdicts) = ring.load(w, b);
        p.process_batch(now, b.port, bufs, verdicts);
        chunk_flows += b.len;
        if chunk_flows >= CHUNK_FLOWS {
            chunk_cps.push(chunk_flows as f64 / chunk_start.elapsed().as_secs_f64());
            (chunk_start, chunk_flows) = (StdInstant::now(), 0);
        }
    }
    let t = t0.elapsed();
    if chunk_flows > 0 && chunk_cps.is_empty() {
        chunk_cps.push(chunk_flows as f64 / chunk_start.elapsed().as_secs_f64());
    }
    let d = delta(p.counters(), &before);
    let n = w.uplink().len() as u64;
    ensure!(
        d.new_connections == n && d.slow_path_packets == n && d.forwarded == n,
        "slow path: expected {n} new connections, forwarded; got {d:?} (drops {:?})",
        p.drops()
    );
    ensure!(
        d.flows_installed == 2 * n,
        "slow path: expected {} flow entries, got {d:?}",
        2 * n
    );
    Ok(SlowRun {
        pipeline: p,
        cps: n as f64 / t.as_secs_f64(),
        chunk_cps,
    })
}

/// Warm up, then `runs` timed fast-path passes; fails unless every packet was a fast-path hit.
fn fast_runs(
    p: &mut Pipeline,
    w: &Workload,
    batch: usize,
    runs: usize,
    ring: &mut Ring,
    clock: &Clock,
) -> Result<Rate> {
    let sched = fast_schedule(w, batch);
    let packets = w.uplink().len() + w.replies().len();
    // Warm-up, two passes: in the first the replies move every connection to its steady state,
    // in the second every forward entry observes that once (one conntrack update each); after
    // that a hit only touches conntrack for the 1 s refresh.
    pipeline_pass(p, w, &sched, ring, clock);
    pipeline_pass(p, w, &sched, ring, clock);
    let mut rate = Rate::new();
    for run in 0..runs {
        let before = p.counters().clone();
        let t = pipeline_pass(p, w, &sched, ring, clock);
        let d = delta(p.counters(), &before);
        let n = packets as u64;
        if d.fast_path_hits != n || d.forwarded != n || d.slow_path_packets != 0 {
            bail!(
                "fast path run {run}: expected {n} fast-path hits and forwards, got {d:?}: \
                 the bench would measure the wrong thing"
            );
        }
        rate.add(packets, t);
    }
    Ok(rate)
}

/// Run the data-path benchmark.
pub fn datapath(args: &DatapathArgs) -> Result<()> {
    ensure!(
        args.runs >= 1 && args.slow_runs >= 1,
        "--runs and --slow-runs must be at least 1"
    );
    ensure!(args.batch >= 1, "--batch must be at least 1");
    alloc::set_enabled(!args.no_huge_pages);
    let pinned = pin(args.cpu);
    let clock = Clock::new(args.clock);
    let progress = |s: &str| {
        if !args.json {
            eprintln!("[{:7.1} s] {s}", clock.start.elapsed().as_secs_f64());
        }
    };

    let wcfg = WorkloadConfig {
        flows: args.flows,
        seed: args.seed,
        ..WorkloadConfig::default()
    };
    let w = Workload::new(wcfg).map_err(anyhow::Error::msg)?;
    let small = Workload::new(WorkloadConfig {
        flows: args.small_flows,
        ..wcfg
    })
    .map_err(anyhow::Error::msg)?;
    progress("workload generated");
    let policy = Policy::compile(w.policy_config(), "workload").context("compiling the policy")?;
    progress("policy compiled");
    let mut ring = Ring::new(args.batch);

    // Slow path: a fresh pipeline per run; keep the last for the fast path.
    let mut slow_cps = Vec::new();
    let mut chunk_cps = Vec::new();
    let mut last = None;
    for _ in 0..args.slow_runs {
        drop(last.take());
        let r = slow_run(&policy, &w, args.batch, &mut ring, &clock)?;
        progress(&format!("slow path run: {:.0} connections/s", r.cps));
        slow_cps.push(r.cps);
        chunk_cps.extend(r.chunk_cps);
        last = Some(r.pipeline);
    }
    let mut p = last.expect("at least one slow run");

    let fast = fast_runs(&mut p, &w, args.batch, args.runs, &mut ring, &clock)?;
    progress(&format!(
        "fast path: median {:.1} ns/packet",
        fast.median_ns()
    ));

    let opts = ParseOptions { vxlan_port: 4789 };
    let sched = fast_schedule(&w, args.batch);
    let packets = w.uplink().len() + w.replies().len();
    parse_pass(&w, &sched, &mut ring, &opts);
    let mut parse = Rate::new();
    for _ in 0..args.runs {
        parse.add(packets, parse_pass(&w, &sched, &mut ring, &opts));
    }
    progress(&format!(
        "baseline reload+parse: median {:.1} ns/packet",
        parse.median_ns()
    ));
    let huge_bytes = alloc::anon_huge_bytes();
    let flow_table_len = p.flows().len();
    drop(p);

    let mut sp = slow_run(&policy, &small, args.batch, &mut ring, &clock)?.pipeline;
    let small_rate = fast_runs(&mut sp, &small, args.batch, args.runs, &mut ring, &clock)?;
    progress(&format!(
        "small working set: median {:.1} ns/packet",
        small_rate.median_ns()
    ));
    drop(sp);

    let (fast_ns, parse_ns, small_ns) =
        (fast.median_ns(), parse.median_ns(), small_rate.median_ns());
    let (fast_mpps, fast_lo, fast_hi) = stats(&fast.mpps);
    let (fast_ns_med, fast_ns_lo, fast_ns_hi) = stats(&fast.ns);
    let (cps, cps_lo, cps_hi) = stats(&slow_cps);
    let (ccps, ccps_lo, ccps_hi) = stats(&chunk_cps);
    let (advised, advice_failures) = alloc::advised();
    let report = json!({
        "bench": "datapath",
        "fast_path_mpps_per_core": round(fast_mpps, 3),
        "fast_path_ns_per_packet": round(fast_ns_med, 2),
        "slow_path_cps_per_core": round(cps, 0),
        "flows": args.flows,
        "sg_rules": wcfg.sg_rules,
        "routes": wcfg.routes,
        "vm_ports": wcfg.vm_ports,
        "remote_vteps": wcfg.remote_vteps,
        "packet_bytes": WIRE_PACKET_BYTES,
        "inner_frame_bytes_without_fcs": INNER_FRAME_LEN,
        "uplink_frame_bytes": UPLINK_FRAME_LEN,
        "batch": args.batch,
        "seed": args.seed,
        "flow_table_entries": flow_table_len,
        "runs": fast.json()["runs"].clone(),
        "min_max_are": "the slowest and fastest fast-path runs by Mpps, each with its ns/packet",
        "min": {"mpps": round(fast_lo, 3), "ns_per_packet": round(fast_ns_hi, 2)},
        "median": {"mpps": round(fast_mpps, 3), "ns_per_packet": round(fast_ns_med, 2)},
        "max": {"mpps": round(fast_hi, 3), "ns_per_packet": round(fast_ns_lo, 2)},
        "slow_path": {
            "runs_cps": slow_cps.iter().map(|c| round(*c, 0)).collect::<Vec<_>>(),
            "cps": {"median": round(cps, 0), "min": round(cps_lo, 0), "max": round(cps_hi, 0)},
            "ns_per_connection": round(1e9 / cps, 1),
            "chunk_flows": CHUNK_FLOWS,
            "chunk_cps": {"median": round(ccps, 0), "min": round(ccps_lo, 0), "max": round(ccps_hi, 0)},
        },
        "baseline_reload_parse": parse.json(),
        "small_working_set": {"flows": args.small_flows, "fast_path": small_rate.json()},
        "ratios": {
            "fast_1m_ns_over_parse_ns": round(fast_ns / parse_ns, 2),
            "fast_1m_ns_over_small_ns": round(fast_ns / small_ns, 2),
            "small_ns_over_parse_ns": round(small_ns / parse_ns, 2),
        },
        "breakdown_ns_per_packet": {
            "reload_and_parse": round(parse_ns, 2),
            "lookup_and_actions_in_cache": round(small_ns - parse_ns, 2),
            "memory_bound_extra": round(fast_ns - small_ns, 2),
        },
        "targets": {
            "fast_path_mpps": TARGET_MPPS,
            "slow_path_cps": TARGET_CPS,
            "fast_path_met": fast_mpps >= TARGET_MPPS,
            "slow_path_met": cps >= TARGET_CPS,
        },
        "huge_pages": {
            "enabled": alloc::enabled(),
            "thp_mode": alloc::thp_mode(),
            "advised_bytes_cumulative": advised,
            "advice_failures": advice_failures,
            "anon_huge_bytes_during_1m_fast_path": huge_bytes,
        },
        "clock": format!("{:?}", args.clock).to_lowercase(),
        "pinned_cpu": match &pinned { Ok(c) => json!(c), Err(e) => json!(format!("not pinned: {e}")) },
        "note": "single core; fast path = timed passes over all flows in a seeded shuffled order, \
                 both directions (VXLAN uplink decap+deliver, VM reply encap) interleaved per \
                 batch, after two untimed warm-up passes, pipeline clock virtual at 50 ns/packet unless clock=real; \
                 the 1 s conntrack refresh of an entry comes due 10 passes after the warm-up, \
                 so runs 1-8 contain none (at 20 Mpps over 1M flows, 1 hit in 10 would refresh); \
                 every packet is checked to be a fast-path \
                 hit. Each frame is reloaded into a reused PacketBuf ring before processing as a \
                 stand-in for the NIC's DMA write; that copy is in every figure, baseline \
                 included. packet_bytes counts the 4-byte FCS, buffers hold 60-byte inner frames. \
                 slow path = first packet of every flow on a freshly built pipeline per run \
                 (SG 1,000 rules with the admitting rule last, 10,000 routes, conntrack create, \
                 2 flow entries). Shared 2-core VM: numbers are noisy, compare ratios.",
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Value) {
    let g = |path: &[&str]| {
        let mut v = r;
        for k in path {
            v = &v[*k];
        }
        v.to_string()
    };
    println!(
        "spillway bench datapath: {} flows, {} SG rules/port, {} routes, {}-byte packets, batch {}",
        g(&["flows"]),
        g(&["sg_rules"]),
        g(&["routes"]),
        g(&["packet_bytes"]),
        g(&["batch"])
    );
    println!("{:<34} {:>10} {:>10} {:>10}", "", "median", "min", "max");
    let row = |name: &str, base: &[&str], unit: &str| {
        let mut p: Vec<&str> = base.to_vec();
        p.push(unit);
        let get = |k: &str| {
            let mut q = p.clone();
            q.push(k);
            g(&q)
        };
        println!(
            "{:<34} {:>10} {:>10} {:>10}",
            format!("{name} {unit}"),
            get("median"),
            get("min"),
            get("max")
        );
    };
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "fast path (all flows) Mpps",
        g(&["median", "mpps"]),
        g(&["min", "mpps"]),
        g(&["max", "mpps"])
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "fast path (all flows) ns/pkt (runs)",
        g(&["median", "ns_per_packet"]),
        g(&["min", "ns_per_packet"]),
        g(&["max", "ns_per_packet"])
    );
    row(
        "fast path small",
        &["small_working_set", "fast_path"],
        "ns_per_packet",
    );
    row(
        "baseline reload+parse",
        &["baseline_reload_parse"],
        "ns_per_packet",
    );
    row("slow path", &["slow_path"], "cps");
    row("slow path per-chunk", &["slow_path"], "chunk_cps");
    println!("ratios: {}", r["ratios"]);
    println!("breakdown ns/packet: {}", r["breakdown_ns_per_packet"]);
    println!("targets: {}", r["targets"]);
    println!("huge pages: {}", r["huge_pages"]);
    println!("pinned cpu: {}", r["pinned_cpu"]);
    println!("note: {}", r["note"].as_str().unwrap_or_default());
}
