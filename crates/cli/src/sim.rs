//! `spillway sim` (one scenario run, a worker sweep, or a comparison of placement policies) and
//! `spillway bench sim` (simulator speed). Every figure `sim` prints is a model result and is
//! labelled so.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant as StdInstant;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use spillway_sim::report::RunReport;
use spillway_sim::scenario::{self, Scenario};

/// Baselines `--baseline` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// The DPU alone: no spill plane.
    DpuOnly,
}

/// `spillway sim` arguments.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// A built-in scenario (see `--list`); default: micro-burst.
    #[arg(long, conflicts_with = "config")]
    pub scenario: Option<String>,
    /// A scenario file (TOML; see scenarios/ for the format).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The seed (default: the scenario's; any u64).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object instead of the summary table.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report with plots.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Run a baseline instead of Spillway.
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
    /// Placement policy override: first-come, ovs-rebalance, threshold, stability, none. On a scenario
    /// with a [compare] section, runs that one policy instead of the comparison.
    #[arg(long)]
    pub placement: Option<spillway_fabric::params::PlacementKind>,
    /// Print every train and message of this connection id to stderr (debugging a run; any
    /// u64).
    #[arg(long)]
    pub trace_conn: Option<u64>,
    /// Tell this connection's story after the run: why it went to the spill plane, when and
    /// why it was or was not recalled to the fast path, every move with its reason (any u64;
    /// on a comparison scenario, with --placement).
    #[arg(long)]
    pub explain: Option<u64>,
    /// List the built-in scenarios and exit.
    #[arg(long)]
    pub list: bool,
    /// A seed swarm instead of one scenario.
    #[command(subcommand)]
    pub command: Option<SimCommand>,
}

/// `spillway sim` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Run many seeds, each a random scenario with faults, every checker after every event; a
    /// failure prints the line that replays it (model results).
    Swarm(SwarmArgs),
    /// A co-located tenant's request latency and throughput beside a busy spill plane, under
    /// each isolation step (pinning, CAT, MBA), against no plane (model results).
    Isolation(IsolationArgs),
    /// A cluster of DPU hosts, per tick: the vCPUs it can sell at equal loss with spill planes
    /// (local, then a remote pool) absorbing bursts, against no spill (model results).
    Cluster(ClusterArgs),
}

/// `spillway sim cluster` arguments.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Hosts in the cluster.
    #[arg(long, default_value_t = 3000)]
    pub hosts: usize,
    /// Ticks of 100 ms simulated.
    #[arg(long, default_value_t = 600)]
    pub ticks: usize,
    /// Seeds `seed..seed + seeds`: the gain's confidence interval is over them.
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also vary each main parameter one at a time (3 seeds each, at a third of the hosts).
    #[arg(long)]
    pub sensitivity: bool,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// `spillway sim isolation` arguments.
#[derive(clap::Args, Debug)]
pub struct IsolationArgs {
    /// Spilled packets per second the plane carries (the paper: 2.0 Mpps).
    #[arg(long, default_value_t = 2.0e6)]
    pub pps: f64,
    /// Tenant load per core, 0 to 1 (utilisation without the plane).
    #[arg(long, default_value_t = 0.5)]
    pub tenant_load: f64,
    /// Requests simulated per step.
    #[arg(long, default_value_t = 200_000)]
    pub requests: usize,
    /// The node's last-level cache, MiB.
    #[arg(long, default_value_t = 48.0)]
    pub llc_mib: f64,
    /// Cache ways CAT gives the plane (of 12).
    #[arg(long, default_value_t = 2)]
    pub cat_ways: u32,
    /// The seed of the draws (the same for every step).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// Swarm generators `--kind` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SwarmKindArg {
    /// Workload mixes with plane kills, control loss and delays.
    Plain,
    /// Flow shapes, arrivals, lifetimes and every placement policy.
    Shaped,
    /// Warm standby with every fault class: kills and stalls of the active plane, kills of the
    /// warm one, control loss, delays, online upgrades.
    Standby,
    /// The three, each seed in each.
    All,
}

/// `spillway sim swarm` arguments.
#[derive(clap::Args, Debug)]
pub struct SwarmArgs {
    /// Seeds to run.
    #[arg(long, default_value_t = 1000)]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub base: u64,
    /// Which generator.
    #[arg(long, value_enum, default_value_t = SwarmKindArg::Standby)]
    pub kind: SwarmKindArg,
    /// Threads (default: the machine's CPUs).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Print one JSON object (the summary and every failure) instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Print every train and message of this connection id to stderr (with `--seeds 1`).
    #[arg(long)]
    pub trace_conn: Option<u64>,
}

fn load(args: &SimArgs) -> Result<(Scenario, String)> {
    match (&args.config, &args.scenario) {
        (Some(path), _) => Ok((
            Scenario::from_file(path)?,
            format!("--config {}", path.display()),
        )),
        (None, name) => {
            let name = name.as_deref().unwrap_or(scenario::DEFAULT);
            Ok((Scenario::builtin(name)?, format!("--scenario {name}")))
        }
    }
}

struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(label: &str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(1000);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:40}] {percent:>3}% virtual time, {elapsed}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            b.set_prefix(label.to_string());
            b
        });
        Progress { bar }
    }
    fn set(&self, f: f64) {
        if let Some(b) = &self.bar {
            b.set_position((f * 1000.0) as u64);
        }
    }
    fn done(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1} {unit}"))
}

fn print_summary(r: &RunReport, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "MODEL RESULT (simulator, virtual time) - scenario {} - seed {} - {} - placement {}",
        r.scenario, r.seed, r.baseline, r.placement
    )?;
    writeln!(
        out,
        "measure window {:.2}-{:.2} s:",
        r.measure_s[0], r.measure_s[1]
    )?;
    let rows: Vec<(&str, String)> = vec![
        ("offered", format!("{:.3} Mpps", r.offered_mpps)),
        ("delivered", format!("{:.3} Mpps", r.delivered_mpps)),
        ("  by the DPU", format!("{:.3} Mpps", r.dpu_mpps)),
        ("  by the spill plane", format!("{:.3} Mpps", r.host_mpps)),
        ("connections completed", format!("{:.0} /s", r.cps)),
        (
            "zero-loss connection rate",
            opt(r.zero_loss_cps.map(|c| c / 1e3), "k/s"),
        ),
        ("whole run:", String::new()),
        ("offered packets", r.offered_packets.to_string()),
        ("lost packets", r.lost_packets.to_string()),
        (
            "activation (trigger -> absorbing)",
            opt(r.activation_ms, "ms"),
        ),
        ("rule injection", opt(r.rule_injection_ms, "ms")),
        ("release (decision -> idle)", opt(r.release_ms, "ms")),
        (
            "latency p50 / p99",
            format!("{:.1} / {:.1} us", r.latency_us.p50, r.latency_us.p99),
        ),
        ("hardware offload ratio", format!("{:.3}", r.offload_ratio)),
        (
            "PCIe crossings per packet",
            format!("{:.3}", r.pcie_crossings_per_packet),
        ),
    ];
    for (k, v) in rows {
        writeln!(out, "  {k:<36} {v}")?;
    }
    if let Some(f) = &r.takeover {
        writeln!(out, "plane taken over at {:.3} s ({}):", f.t_s, f.kind)?;
        let rows: Vec<(&str, String)> = vec![
            ("detected after", format!("{:.1} ms", f.detected_ms)),
            ("forwarding gap (overflow)", opt(f.gap_ms, "ms")),
            ("lost in the second after", f.lost_packets.to_string()),
            (
                "full capacity again after",
                format!("{:.0} ms", f.full_capacity_ms),
            ),
            (
                "host cores held by the standby",
                f.standby_cores.to_string(),
            ),
        ];
        for (k, v) in rows {
            writeln!(out, "  {k:<36} {v}")?;
        }
    }
    print_tenants(r, out)?;
    let drops: Vec<_> = r.drops.iter().filter(|(_, v)| **v > 0).collect();
    if !drops.is_empty() {
        writeln!(out, "drops:")?;
        for (k, v) in drops {
            writeln!(out, "  {k:<36} {v}")?;
        }
    }
    if !r.phases.is_empty() {
        writeln!(out, "lifecycle:")?;
        for p in &r.phases {
            writeln!(out, "  {:>8.3} s  {:<16} {}", p.t_s, p.phase, p.reason)?;
        }
    }
    Ok(())
}

/// Most tenants printed one per line; the summary prints the first by loss beyond that (the
/// JSON has every tenant).
const TENANT_LINES_MAX: usize = 8;

/// Loss and latency by tenant (whole run): every tenant when there are few, else the ones that
/// lost most.
fn print_tenants(r: &RunReport, out: &mut impl Write) -> Result<()> {
    if r.by_tenant.len() < 2 {
        return Ok(());
    }
    let mut rows: Vec<_> = r.by_tenant.iter().collect();
    let shown = if rows.len() > TENANT_LINES_MAX {
        rows.sort_by(|a, b| b.1.lost.cmp(&a.1.lost).then(a.0.cmp(b.0)));
        rows.retain(|(_, f)| f.lost > 0);
        rows.truncate(TENANT_LINES_MAX);
        format!(
            "{} tenants; the {} that lost most",
            r.by_tenant.len(),
            rows.len()
        )
    } else {
        format!("{} tenants", rows.len())
    };
    let lossless = r.by_tenant.values().filter(|f| f.lost == 0).count();
    writeln!(
        out,
        "by tenant (whole run; {shown}; {lossless} lost nothing):"
    )?;
    for (t, f) in rows {
        let name = if *t == u32::MAX {
            "others".to_string()
        } else {
            t.to_string()
        };
        writeln!(
            out,
            "  tenant {name:<8} delivered {:>11}  lost {:>9}  latency p50 / p99 {:.1} / {:.1} us",
            f.delivered, f.lost, f.latency_us.p50, f.latency_us.p99
        )?;
    }
    Ok(())
}

/// The `--json` object of a placement comparison.
fn compare_json(sc: &Scenario, seed: u64, points: &[spillway_sim::PlacementPoint]) -> Value {
    json!({
        "kind": "model",
        "scenario": sc.name,
        "seed": seed,
        "policies": points,
    })
}

fn print_compare(
    sc: &Scenario,
    seed: u64,
    points: &[spillway_sim::PlacementPoint],
    out: &mut impl Write,
) -> Result<()> {
    writeln!(
        out,
        "MODEL RESULT (simulator) - scenario {} - seed {seed}: placement policies, measure window {:.2}-{:.2} s",
        sc.name,
        sc.measure[0].0.as_secs_f64(),
        sc.measure[1].0.as_secs_f64()
    )?;
    writeln!(
        out,
        "  {:<14} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7} {:>6} {:>7}",
        "policy",
        "offload",
        "plane",
        "insert/s",
        "delete/s",
        "to host/s",
        "rule msg/s",
        "soc rules",
        "host cpu",
        "recalls",
        "demote",
        "shed",
        "flaps",
        "lost"
    )?;
    for p in points {
        writeln!(
            out,
            "  {:<14} {:>8.3} {:>8} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>9.4} {:>8.2} {:>7} {:>7} {:>7} {:>6} {:>7}",
            p.policy,
            p.window.offload_ratio,
            p.window
                .plane_offload_ratio
                .map_or("-".into(), |r| format!("{r:.3}")),
            p.window.inserts_per_s,
            p.window.deletes_per_s,
            p.window.deletes_to_host_per_s,
            p.window.rule_msgs_per_s,
            p.window.soc_rule_cores,
            p.window.host_cpu_cores,
            p.window.recalls,
            p.window.demotions,
            p.window.sheds,
            p.window.flaps,
            p.lost_packets
        )?;
    }
    writeln!(
        out,
        "  offload: fast-path share of delivered packets; plane: the same among the traffic the plane took on; rule msg/s: SoC-to-ASIC rule commands (inserts issued, deletes); soc rules: SoC cores busy with recall inserts and deletes (dpu.soc_rule_cost); host cpu: plane worker cores busy; counts are over the window, lost over the run"
    )?;
    Ok(())
}

/// The human summary of a vATC comparison.
fn print_vatc(r: &spillway_sim::VatcReport, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "MODEL RESULT (simulator) - scenario {} - seed {}: the spill plane with and without vATC, {}-byte packets, measure window {:.2}-{:.2} s",
        r.scenario, r.seed, r.packet_bytes, r.measure_s[0], r.measure_s[1]
    )?;
    writeln!(
        out,
        "  offered {:.3} Mpps (saturating); latency and crossings from runs at {:.3} Mpps",
        r.offered_mpps, r.latency_offered_mpps
    )?;
    writeln!(
        out,
        "  {:<20} {:>9} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "path", "Mpps", "vs DPU", "p50 us", "p99 us", "mean us", "crossings", "lost"
    )?;
    for p in &r.paths {
        writeln!(
            out,
            "  {:<20} {:>9.3} {:>7.0}% {:>9.2} {:>9.2} {:>9.2} {:>10.3} {:>10}",
            p.path,
            p.pps_mpps,
            p.relative_to_dpu * 100.0,
            p.latency_us.p50,
            p.latency_us.p99,
            p.latency_us.mean,
            p.pcie_crossings_per_packet,
            p.lost_packets
        )?;
        if p.latency_run_lost_packets > 0 {
            writeln!(
                out,
                "    (the latency run lost {} packets: its latency is not an unloaded one)",
                p.latency_run_lost_packets
            )?;
        }
    }
    writeln!(
        out,
        "  without/with vATC: {:.3} of the PPS; mean latency with vATC {:+.0}%",
        r.ratio_without_over_with,
        r.latency_change_with_vatc * 100.0
    )?;
    if !r.sensitivity.is_empty() {
        writeln!(
            out,
            "  sensitivity of the without/with ratio (each parameter at 1/{f} and {f}x; effect: the ratio with the resource improved minus degraded):",
            f = r.factor
        )?;
        for s in &r.sensitivity {
            writeln!(
                out,
                "    {:<28} {:>7.3} .. {:<7.3} effect {:+.3}",
                s.param, s.ratio_low, s.ratio_high, s.effect
            )?;
        }
        match &r.gap_driver {
            Some(d) => writeln!(out, "  the gap is driven by: {d}")?,
            None => writeln!(out, "  no parameter varied drives the gap")?,
        }
    }
    Ok(())
}

/// `spillway sim`.
pub fn sim(args: &SimArgs) -> Result<()> {
    match &args.command {
        Some(SimCommand::Swarm(a)) => return swarm(a),
        Some(SimCommand::Isolation(a)) => return isolation(a),
        Some(SimCommand::Cluster(a)) => return cluster(a),
        None => {}
    }
    if args.list {
        for (name, file, _) in scenario::BUILTIN {
            let s = Scenario::builtin(name)?;
            println!("{name:<14} {file:<30} {}", s.description);
        }
        return Ok(());
    }
    let (mut sc, source) = load(args)?;
    if let Some(p) = args.placement {
        sc.fabric.placement.policy = p;
    }
    let seed = args.seed.unwrap_or(sc.seed);
    let dpu_only = args.baseline == Some(Baseline::DpuOnly);
    let repro = format!(
        "spillway sim {source} --seed {seed}{}",
        if dpu_only { " --baseline dpu-only" } else { "" }
    );
    let progress = Progress::new(&sc.name);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let one_run =
        (sc.compare.is_none() && sc.vatc.is_none()) || dpu_only || args.placement.is_some();
    if args.explain.is_some() && !one_run {
        anyhow::bail!(
            "--explain tells one run's story: on scenario {}, which compares runs, pick one with \
             --placement (or --baseline dpu-only)",
            sc.name
        );
    }
    if sc.compare.is_some() && !dpu_only && args.placement.is_none() {
        let points = spillway_sim::run_placement_compare(&sc, seed, &mut |f| progress.set(f))
            .map_err(|e| anyhow::anyhow!("{e}\nrepro: {repro}"))?;
        progress.done();
        if args.json {
            serde_json::to_writer(&mut out, &compare_json(&sc, seed, &points))?;
            writeln!(out)?;
        } else {
            print_compare(&sc, seed, &points, &mut out)?;
        }
        if let Some(path) = &args.report {
            let runs: Vec<&RunReport> = points.iter().map(|p| &p.run).collect();
            std::fs::write(path, spillway_sim::html::render_html(&runs))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    if sc.vatc.is_some() && !dpu_only && args.placement.is_none() {
        let r = spillway_sim::run_vatc_compare(&sc, seed, &mut |f| progress.set(f))
            .map_err(|e| anyhow::anyhow!("{e}\nrepro: {repro}"))?;
        progress.done();
        if args.json {
            serde_json::to_writer(&mut out, &r)?;
            writeln!(out)?;
        } else {
            print_vatc(&r, &mut out)?;
        }
        return Ok(());
    }
    if sc.sweep.is_some() && !dpu_only {
        let points = spillway_sim::run_sweep(&sc, seed, &mut |f| progress.set(f))
            .map_err(|e| anyhow::anyhow!("{e}\nrepro: {repro}"))?;
        progress.done();
        if args.json {
            let v = json!({
                "kind": "model",
                "scenario": sc.name,
                "seed": seed,
                "points": points.iter().map(|p| json!({
                    "workers": p.workers,
                    "zero_loss_cps": p.zero_loss_cps,
                    "gain": p.gain,
                    "trials": p.trials,
                    "run": p.run,
                })).collect::<Vec<Value>>(),
            });
            serde_json::to_writer(&mut out, &v)?;
            writeln!(out)?;
        } else {
            writeln!(
                out,
                "MODEL RESULT (simulator) - scenario {} - seed {seed}: zero-loss CPS by host workers",
                sc.name
            )?;
            writeln!(
                out,
                "  {:>7}  {:>12}  {:>8}  {:>10}",
                "workers", "cps", "gain", "lost"
            )?;
            for p in &points {
                writeln!(
                    out,
                    "  {:>7}  {:>12}  {:>8}  {:>10}",
                    p.workers,
                    p.zero_loss_cps.map_or("-".into(), |c| format!("{c:.0}")),
                    p.gain.map_or("-".into(), |g| format!("{:+.0}%", g * 100.0)),
                    p.run.lost_packets
                )?;
            }
        }
        if let Some(path) = &args.report {
            let runs: Vec<&RunReport> = points.iter().map(|p| &p.run).collect();
            std::fs::write(path, spillway_sim::html::render_html(&runs))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let opts = spillway_sim::engine::RunOptions {
        seed,
        dpu_only,
        trace_conn: args.trace_conn.map(spillway_fabric::types::ConnId),
        explain_conn: args.explain.map(spillway_fabric::types::ConnId),
    };
    let r = spillway_sim::run_with(&sc, opts, &mut |f| progress.set(f))
        .map_err(|e| anyhow::anyhow!("{e}\nrepro: {repro}"))?;
    progress.done();
    if args.json {
        serde_json::to_writer(&mut out, &json_report(&r))?;
        writeln!(out)?;
    } else {
        print_summary(&r, &mut out)?;
        if let (Some(c), Some(story)) = (args.explain, &r.explain) {
            writeln!(out, "connection {c}:")?;
            for ch in story {
                writeln!(
                    out,
                    "  {:>8.3} s  {:<14} {}",
                    ch.at_s, ch.served_by, ch.what
                )?;
            }
        }
    }
    if let Some(path) = &args.report {
        // The page shows the run and, for comparison, the DPU-only baseline on the same seed.
        let mut runs = vec![r];
        if !dpu_only {
            let base = spillway_sim::run(&sc, seed, true, &mut |_| {})
                .map_err(|e| anyhow::anyhow!("{e}\nrepro: {repro} --baseline dpu-only"))?;
            runs.push(base);
        }
        let refs: Vec<&RunReport> = runs.iter().collect();
        std::fs::write(path, spillway_sim::html::render_html(&refs))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The `--json` object: the report plus the phases as `(phase, time)` pairs.
fn json_report(r: &RunReport) -> Value {
    serde_json::to_value(r).expect("reports serialise")
}

/// `spillway bench sim` arguments.
#[derive(clap::Args, Debug)]
pub struct BenchSimArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Runs (the median is reported), 1..=100.
    #[arg(long, default_value_t = 3, value_parser = crate::flags::ranged(1, 100))]
    pub runs: usize,
    /// Scenario (default: the default scenario).
    #[arg(long)]
    pub scenario: Option<String>,
}

/// `spillway bench sim`: simulated packets and events per wall-clock second on one core.
pub fn bench_sim(args: &BenchSimArgs) -> Result<()> {
    let name = args.scenario.as_deref().unwrap_or(scenario::DEFAULT);
    let sc = Scenario::builtin(name)?;
    let mut pps = Vec::new();
    let mut eps = Vec::new();
    let mut secs = Vec::new();
    let mut packets = 0;
    for _ in 0..args.runs {
        let t0 = StdInstant::now();
        let r = spillway_sim::run(&sc, sc.seed, false, &mut |_| {})
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let s = t0.elapsed().as_secs_f64();
        packets = r.offered_packets;
        pps.push(r.offered_packets as f64 / s);
        eps.push(r.events as f64 / s);
        secs.push(s);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mpps, meps, msecs) = (med(&mut pps) / 1e6, med(&mut eps) / 1e6, med(&mut secs));
    if args.json {
        println!(
            "{}",
            json!({
                "bench": "sim",
                "scenario": name,
                "runs": args.runs,
                "simulated_packets": packets,
                "wall_s_median": msecs,
                "sim_mpps_per_wall_s_median": mpps,
                "events_m_per_wall_s_median": meps,
                "wall_s": secs,
            })
        );
    } else {
        println!(
            "sim {name}: {packets} simulated packets in {msecs:.2} s (median of {}): {mpps:.1} M simulated packets/s, {meps:.2} M events/s",
            args.runs
        );
    }
    Ok(())
}

/// `spillway sim swarm`: the seeds `base..base + seeds` of each chosen generator, on `jobs`
/// threads (each seed is deterministic, so the order they run in changes nothing but the
/// progress bar); failures sorted by generator and seed, each with its replay line. Exits
/// non-zero if any seed failed.
/// `spillway sim cluster`: both designs on every seed, the gain's mean and 95% interval, and
/// with `--sensitivity` the gain as each main parameter moves.
fn cluster(a: &ClusterArgs) -> Result<()> {
    use spillway_sim::cluster::{ClusterParams, mean_ci95, run_seed};
    if a.seeds == 0 || a.seeds > 1000 {
        anyhow::bail!("--seeds: 1 to 1000, got {}", a.seeds);
    }
    let p = ClusterParams {
        hosts: a.hosts,
        ticks: a.ticks,
        ..ClusterParams::default()
    };
    p.validate().map_err(|e| anyhow::anyhow!("--{e}"))?;
    let t0 = std::time::Instant::now();
    let runs: Vec<_> = (a.seed..a.seed + a.seeds)
        .map(|s| run_seed(&p, s))
        .collect();
    let wall = t0.elapsed().as_secs_f64();
    let gains: Vec<f64> = runs.iter().map(|r| r.gain).collect();
    let (gain, ci) = mean_ci95(&gains);
    let mut rows = Vec::new();
    if a.sensitivity {
        let small = ClusterParams {
            hosts: (a.hosts / 3).max(100),
            ..p.clone()
        };
        type Vary = (&'static str, f64, fn(&mut ClusterParams, f64));
        let vary: [Vary; 14] = [
            ("vm_sigma", 0.5, |q, x| q.vm_sigma = x),
            ("vm_sigma", 1.5, |q, x| q.vm_sigma = x),
            ("burst_alpha", 1.2, |q, x| q.burst_alpha = x),
            ("burst_alpha", 2.5, |q, x| q.burst_alpha = x),
            ("burst_start", 0.003, |q, x| q.burst_start = x),
            ("burst_start", 0.03, |q, x| q.burst_start = x),
            ("spill_pps_per_core", 0.5e6, |q, x| q.spill_pps_per_core = x),
            ("spill_pps_per_core", 1.5e6, |q, x| q.spill_pps_per_core = x),
            ("pool_pps", 0.0, |q, x| q.pool_pps = x),
            ("pool_pps", 4.0 * 30.0 * 8.0 * 0.87e6, |q, x| q.pool_pps = x),
            ("remote_delay_ticks", 5.0, |q, x| {
                q.remote_delay_ticks = x as usize
            }),
            ("remote_delay_ticks", 100.0, |q, x| {
                q.remote_delay_ticks = x as usize
            }),
            ("loss_max", 1e-5, |q, x| q.loss_max = x),
            ("loss_max", 1e-3, |q, x| q.loss_max = x),
        ];
        let base: Vec<f64> = (a.seed..a.seed + 3)
            .map(|s| run_seed(&small, s).gain)
            .collect();
        rows.push(("(base)", f64::NAN, mean_ci95(&base)));
        for (name, x, set) in vary {
            let mut q = small.clone();
            set(&mut q, x);
            let g: Vec<f64> = (a.seed..a.seed + 3).map(|s| run_seed(&q, s).gain).collect();
            rows.push((name, x, mean_ci95(&g)));
        }
    }
    if a.json {
        let doc = serde_json::json!({
            "model": "cluster",
            "params": p,
            "seeds": runs,
            "gain": {"mean": gain, "ci95": ci},
            "sensitivity": rows.iter().map(|(n, x, (m, c))| serde_json::json!({
                "param": n, "value": if x.is_nan() { serde_json::Value::Null } else { (*x).into() },
                "gain_mean": m, "gain_ci95": if c.is_nan() { serde_json::Value::Null } else { (*c).into() },
                "hosts": (a.hosts / 3).max(100), "seeds": 3})).collect::<Vec<_>>(),
            "wall_s": wall,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "MODEL RESULT (simulator) - cluster of {} hosts, {} ticks of 100 ms, seeds {}..{}: \
         sellable vCPUs at loss <= {} (and <= {:.0}% of packets remote), DPUs of {:.1} Mpps",
        p.hosts,
        p.ticks,
        a.seed,
        a.seed + a.seeds - 1,
        p.loss_max,
        p.remote_share_max * 100.0,
        p.dpu_pps / 1e6
    );
    println!(
        "{:>5} {:>11} {:>14} {:>10} {:>11} {:>14} {:>10} {:>11} {:>12} {:>8}",
        "seed",
        "peak VMs/h",
        "peak vCPUs",
        "peak util",
        "spill VMs/h",
        "spill vCPUs",
        "spill util",
        "spill cores",
        "remote share",
        "gain"
    );
    for r in &runs {
        println!(
            "{:>5} {:>11.2} {:>14.0} {:>10.3} {:>11.2} {:>14.0} {:>10.3} {:>11.3} {:>12.5} {:>7.1}%",
            r.seed,
            r.peak.vms_per_host,
            r.peak.sellable_vcpus,
            r.peak.dpu_util,
            r.spill.vms_per_host,
            r.spill.sellable_vcpus,
            r.spill.dpu_util,
            r.spill.spill_cores_mean,
            r.spill.remote_share,
            r.gain * 100.0
        );
    }
    println!(
        "gain: {:+.1}% (95% CI +/- {:.1} points over {} seeds); {:.1} s wall",
        gain * 100.0,
        ci * 100.0,
        a.seeds,
        wall
    );
    if !rows.is_empty() {
        println!(
            "sensitivity ({} hosts, 3 seeds each; one parameter moved from the default):",
            (a.hosts / 3).max(100)
        );
        for (n, x, (m, c)) in &rows {
            let x = if x.is_nan() {
                "-".to_string()
            } else {
                format!("{x}")
            };
            println!(
                "  {n:<20} {x:>12}  gain {:+6.1}% +/- {:.1}",
                m * 100.0,
                c * 100.0
            );
        }
    }
    Ok(())
}

/// `spillway sim isolation`: the ladder at the asked load, then how the fully isolated
/// plane's cost moves with the plane's rate and the tenant's load.
fn isolation(a: &IsolationArgs) -> Result<()> {
    use spillway_sim::isolation::{IsolationParams, ladder};
    if !(a.pps >= 0.0 && a.pps.is_finite()) {
        anyhow::bail!(
            "--pps: a rate of 0 or more packets per second, got {}",
            a.pps
        );
    }
    if !(a.tenant_load > 0.0 && a.tenant_load < 1.0) {
        anyhow::bail!("--tenant-load: above 0 and below 1, got {}", a.tenant_load);
    }
    if a.requests < 100 {
        anyhow::bail!("--requests: at least 100, got {}", a.requests);
    }
    let d = IsolationParams::default();
    if !(a.llc_mib >= 1.0 && a.llc_mib <= 4096.0) {
        anyhow::bail!("--llc-mib: 1 to 4096, got {}", a.llc_mib);
    }
    if !(1..d.llc_ways).contains(&a.cat_ways) {
        anyhow::bail!("--cat-ways: 1 to {}, got {}", d.llc_ways - 1, a.cat_ways);
    }
    let p = IsolationParams {
        plane_pps: a.pps,
        tenant_load: a.tenant_load,
        requests: a.requests,
        llc_bytes: a.llc_mib * 1024.0 * 1024.0,
        plane_cat_ways: a.cat_ways,
        ..d
    };
    let rows = ladder(&p, a.seed);
    // The p99 ratios of the pinned and the fully isolated steps as one parameter varies.
    let sweep = |xs: &[f64], vary: &dyn Fn(f64) -> IsolationParams| -> Vec<(f64, f64, f64)> {
        xs.iter()
            .map(|&x| {
                let r = ladder(&vary(x), a.seed);
                (x, r[2].p99_ratio, r[4].p99_ratio)
            })
            .collect()
    };
    let by_pps = sweep(&[0.5e6, 1e6, 2e6, 4e6, 8e6], &|pps| IsolationParams {
        plane_pps: pps,
        ..p.clone()
    });
    let by_load = sweep(&[0.3, 0.5, 0.7, 0.85], &|load| IsolationParams {
        tenant_load: load,
        ..p.clone()
    });
    if a.json {
        let doc = serde_json::json!({
            "model": "isolation",
            "seed": a.seed,
            "params": p,
            "ladder": rows,
            "p99_ratio_by_pps": by_pps.iter().map(|(x, pin, all)| serde_json::json!({"pps": x, "pinned": pin, "pinned_cat_mba": all})).collect::<Vec<_>>(),
            "p99_ratio_by_tenant_load": by_load.iter().map(|(x, pin, all)| serde_json::json!({"tenant_load": x, "pinned": pin, "pinned_cat_mba": all})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "MODEL RESULT (simulator) - isolation - seed {}: a tenant core at load {} beside a plane \
         asked to carry {:.2} Mpps on its node, {} MiB of cache, CAT {} ways of {} ({} requests \
         per step)",
        a.seed,
        a.tenant_load,
        a.pps / 1e6,
        a.llc_mib,
        a.cat_ways,
        p.llc_ways,
        a.requests
    );
    println!(
        "{:<22} {:>10} {:>11} {:>10} {:>8} {:>9} {:>11} {:>10} {:>10} {:>9} {:>9}",
        "step",
        "plane Mpps",
        "plane cores",
        "stolen",
        "LLC MiB",
        "mem util",
        "mem lat ns",
        "service us",
        "throughput",
        "p50",
        "p99"
    );
    for r in &rows {
        let e = &r.effect;
        println!(
            "{:<22} {:>10.2} {:>11.2} {:>9.1}% {:>8.1} {:>8.1}% {:>11.1} {:>10.2} {:>10.4} {:>9.3} {:>9.3}",
            r.step,
            e.plane_pps / 1e6,
            e.plane_cores,
            e.stolen * 100.0,
            e.tenant_llc_mib,
            e.mem_utilisation * 100.0,
            e.mem_latency_ns,
            e.service_us,
            e.throughput_ratio,
            r.p50_ratio,
            r.p99_ratio
        );
    }
    println!("(throughput, p50 and p99: ratios to the baseline)");
    println!("p99 ratio by plane rate:  pinned / pinned + CAT + MBA");
    for (pps, pin, all) in &by_pps {
        println!("  {:>5.1} Mpps  {pin:.3} / {all:.3}", pps / 1e6);
    }
    println!("p99 ratio by tenant load: pinned / pinned + CAT + MBA");
    for (load, pin, all) in &by_load {
        println!("  {load:>5.2}      {pin:.3} / {all:.3}");
    }
    Ok(())
}

fn swarm(a: &SwarmArgs) -> Result<()> {
    use spillway_sim::swarm::{SeedOutcome, SwarmKind, run_seed};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    let kinds: Vec<SwarmKind> = match a.kind {
        SwarmKindArg::Plain => vec![SwarmKind::Plain],
        SwarmKindArg::Shaped => vec![SwarmKind::Shaped],
        SwarmKindArg::Standby => vec![SwarmKind::Standby],
        SwarmKindArg::All => SwarmKind::ALL.to_vec(),
    };
    let end = a
        .base
        .checked_add(a.seeds)
        .context("--base + --seeds overflows a u64")?;
    let total = a.seeds * kinds.len() as u64;
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "swarm [{bar:40}] {pos}/{len} seeds, {msg}, {elapsed} (eta {eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        b
    });
    let next = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    /// The passing seeds' sum, how many activated, and the failures.
    type Results = (SeedOutcome, u64, Vec<(SwarmKind, u64, String)>);
    let results: Mutex<Results> = Mutex::new((SeedOutcome::default(), 0, Vec::new()));
    let started = StdInstant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let kind = kinds[(i / a.seeds) as usize];
                    let seed = a.base + i % a.seeds;
                    let r = run_seed(kind, seed, a.trace_conn);
                    let mut g = results.lock().expect("no thread panics holding it");
                    match r {
                        Ok(o) => {
                            g.0.add(&o);
                            g.1 += u64::from(o.activated);
                        }
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            g.2.push((kind, seed, e));
                        }
                    }
                    drop(g);
                    if let Some(b) = &bar {
                        b.inc(1);
                        b.set_message(format!("{} failed", failed.load(Ordering::Relaxed)));
                    }
                }
            });
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let secs = started.elapsed().as_secs_f64();
    let (sum, activated, mut failures) = results.into_inner().expect("the threads are done");
    failures.sort_by_key(|(k, s, _)| (*k as u8, *s));
    let repro = |k: SwarmKind, s: u64| {
        format!(
            "spillway sim swarm --kind {} --base {s} --seeds 1",
            k.name()
        )
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if a.json {
        let fails: Vec<Value> = failures
            .iter()
            .map(|(k, s, e)| json!({"kind": k.name(), "seed": s, "error": e, "repro": repro(*k, *s)}))
            .collect();
        serde_json::to_writer(
            &mut out,
            &json!({
                "kind": "model",
                "generators": kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
                "base": a.base,
                "seeds": a.seeds,
                "runs": total,
                "passed": total - failures.len() as u64,
                "failed": failures.len(),
                "activated": activated,
                "faults": sum.faults,
                "failovers": sum.failovers,
                "fail_opens": sum.fail_opens,
                "upgrades": sum.upgrades,
                "packets": sum.packets,
                "wall_s": secs,
                "jobs": jobs,
                "failures": fails,
            }),
        )?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "MODEL RESULT (simulator) - swarm {} - seeds {}..{end}",
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
            a.base
        )?;
        for (k, s, e) in &failures {
            writeln!(
                out,
                "FAIL {} seed {s}: {e}\n  repro: {}",
                k.name(),
                repro(*k, *s)
            )?;
        }
        writeln!(
            out,
            "{} runs: {} passed, {} failed; {activated} activated the plane; {} faults injected, {} failovers, {} fail-opens, {} upgrades; {:.2e} packets; {secs:.0} s on {jobs} threads",
            total,
            total - failures.len() as u64,
            failures.len(),
            sum.faults,
            sum.failovers,
            sum.fail_opens,
            sum.upgrades,
            sum.packets as f64
        )?;
    }
    out.flush()?;
    if !failures.is_empty() {
        anyhow::bail!("{} of {total} swarm runs failed", failures.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comparison_prints_one_row_and_one_json_object_per_policy() {
        let sc = Scenario::from_toml_str(
            r#"
            name = "tiny-compare"
            duration = "300ms"
            measure = ["100ms", "300ms"]
            [compare]
            policies = ["first-come", "threshold"]
            [[flows]]
            count = 20
            pps = 1000.0
            lifetime = "1s"
            "#,
            "tiny.toml",
        )
        .unwrap();
        let points = spillway_sim::run_placement_compare(&sc, 3, &mut |_| {}).unwrap();
        let mut text = Vec::new();
        print_compare(&sc, 3, &points, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with("MODEL RESULT"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("first-come "))
        );
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("threshold "))
        );
        let v = compare_json(&sc, 3, &points);
        assert_eq!(v["kind"], "model");
        assert_eq!(v["scenario"], "tiny-compare");
        assert_eq!(v["seed"], 3);
        let p = v["policies"].as_array().unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1]["policy"], "threshold");
        for k in [
            "offload_ratio",
            "plane_offload_ratio",
            "inserts_per_s",
            "deletes_per_s",
            "host_cpu_cores",
            "flaps",
            "recalls",
            "lost_packets",
            "run",
        ] {
            assert!(p[0].get(k).is_some(), "{k} missing: {}", p[0]);
        }
        assert_eq!(p[1]["run"]["placement"], "threshold");
    }
}
