//! # spillway-sim
//!
//! The deterministic discrete-event simulator of the Spillway fabric: the sans-IO nodes of
//! `spillway-fabric` (emulated DPU, spill plane, URSched) driven in virtual time by workloads
//! from scenario files, with fault injection, invariant checkers after every event, and reports
//! (JSON summary, HTML page with SVG plots). Every result it prints is a **model result**.
//!
//! ## Main types
//!
//! - [`scenario::Scenario`]: the workload and the fabric parameters, from TOML (built-in ones
//!   under `scenarios/`).
//! - [`engine::Sim`]: one run; [`run`], [`run_sweep`], [`run_placement_compare`] and
//!   [`run_vatc_compare`] wrap it.
//! - [`report::RunReport`]: what a run measured in the model; [`PlacementPoint`]: one policy of
//!   a placement comparison.
//! - [`shape`]: how a flow group's rate varies over time (steady, periodic, bursty, random walk).
//! - [`swarm`]: random scenarios for seed swarms.
//! - [`isolation`]: a co-located tenant beside a busy plane, under each isolation step.
//!
//! ## Determinism
//!
//! The event queue orders by `(time, sequence number)`; all randomness is SplitMix64 seeded
//! from the run's seed (one stream for the run, one per long flow derived from the seed and the
//! flow's id); no hash-map order reaches an output. The same scenario and seed give the same
//! report, byte for byte, and the same workload whatever the placement policy.
//!
//! ## Example
//!
//! ```
//! use spillway_sim::scenario::Scenario;
//! let sc = Scenario::from_toml_str(r#"
//!     name = "tiny"
//!     duration = "50ms"
//!     measure = ["10ms", "50ms"]
//!     [[flows]]
//!     count = 10
//!     pps = 1000.0
//!     lifetime = "1s"
//! "#, "tiny.toml").unwrap();
//! let r = spillway_sim::run(&sc, 7, false, &mut |_| {}).unwrap();
//! assert_eq!(r.lost_packets, 0);
//! assert!(r.offered_packets > 0);
//! ```

#![deny(unsafe_code)]

pub mod cluster;
pub mod engine;
pub mod html;
pub mod isolation;
pub mod pathcheck;
pub mod report;
pub mod scenario;
pub mod shape;
pub mod swarm;

use engine::{RunOptions, Sim, SimFailure};
use report::RunReport;
use scenario::Scenario;

/// Runs `sc` once with `seed`; `dpu_only` removes the spill plane.
pub fn run(
    sc: &Scenario,
    seed: u64,
    dpu_only: bool,
    progress: &mut dyn FnMut(f64),
) -> Result<RunReport, SimFailure> {
    run_with(
        sc,
        RunOptions {
            seed,
            dpu_only,
            trace_conn: None,
            explain_conn: None,
        },
        progress,
    )
}

/// [`run`] with every option (a connection to trace, for debugging a failed seed).
pub fn run_with(
    sc: &Scenario,
    opts: RunOptions,
    progress: &mut dyn FnMut(f64),
) -> Result<RunReport, SimFailure> {
    let mut r = Sim::new(sc, opts).run(progress)?;
    if !sc.cps.is_empty() {
        r.zero_loss_cps = engine::zero_loss_cps(
            &r,
            sc.measure[0].0.as_secs_f64(),
            sc.measure[1].0.as_secs_f64(),
        );
    }
    Ok(r)
}

/// One point of a worker sweep.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct SweepPoint {
    /// Host workers the plane may use (0: DPU only).
    pub workers: u32,
    /// The highest trial rate carried with zero loss, connections/s (`None`: not even `low`).
    pub zero_loss_cps: Option<f64>,
    /// Gain over the 0-worker point, as a fraction (0.9 = +90%).
    pub gain: Option<f64>,
    /// Trials run: `(rate, lost packets)`.
    pub trials: Vec<(f64, u64)>,
    /// The run of the best passing trial (or of the last trial if none passed).
    pub run: RunReport,
}

/// The scenario of one sweep trial at `rate` connections/s.
pub fn sweep_trial(sc: &Scenario, workers: u32, rate: f64) -> Scenario {
    let sw = sc.sweep.as_ref().expect("a sweep scenario");
    let mut s = sc.clone();
    if workers > 0 {
        s.fabric.host.workers_initial = workers;
        s.fabric.host.workers_max = workers;
    }
    let template = sc.cps[0].clone();
    let ramp_end = sw.warmup.0 + sw.ramp.0;
    let end = ramp_end + sw.trial.0;
    s.cps = vec![
        scenario::CpsGroup {
            rate_from: sw.warmup_rate,
            rate_to: sw.warmup_rate,
            start: scenario::Dur::default(),
            end: sw.warmup,
            ..template.clone()
        },
        scenario::CpsGroup {
            rate_from: sw.warmup_rate,
            rate_to: rate,
            start: sw.warmup,
            end: scenario::Dur(ramp_end),
            ..template.clone()
        },
        scenario::CpsGroup {
            rate_from: rate,
            rate_to: rate,
            start: scenario::Dur(ramp_end),
            end: scenario::Dur(end),
            ..template
        },
    ];
    s.duration = scenario::Dur(end);
    s.measure = [scenario::Dur(ramp_end), scenario::Dur(end)];
    s.sweep = None;
    s
}

/// Runs the sweep of `sc` (see [`scenario::Sweep`]).
pub fn run_sweep(
    sc: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> Result<Vec<SweepPoint>, SimFailure> {
    let sw = sc.sweep.clone().expect("a sweep scenario");
    let per_point = f64::from(sw.iterations + 1);
    let total = sw.workers.len() as f64 * per_point;
    let mut points: Vec<SweepPoint> = Vec::new();
    let mut done = 0.0;
    for &w in &sw.workers {
        let mut trials = Vec::new();
        let trial = |rate: f64, done: f64, progress: &mut dyn FnMut(f64)| {
            let s = sweep_trial(sc, w, rate);
            let r = run(&s, seed, w == 0, &mut |p| progress((done + p) / total))?;
            Ok::<_, SimFailure>(r)
        };
        let (mut lo, mut hi) = (sw.low, sw.high);
        let first = trial(lo, done, progress)?;
        done += 1.0;
        trials.push((lo, first.lost_packets));
        let mut best: Option<(f64, RunReport)> = None;
        let mut last = first.clone();
        if first.lost_packets == 0 {
            best = Some((lo, first));
            for _ in 0..sw.iterations {
                let mid = (lo + hi) / 2.0;
                let r = trial(mid, done, progress)?;
                done += 1.0;
                trials.push((mid, r.lost_packets));
                if r.lost_packets == 0 {
                    lo = mid;
                    best = Some((mid, r));
                } else {
                    hi = mid;
                    last = r;
                }
            }
        } else {
            done += f64::from(sw.iterations);
        }
        let (zero_loss_cps, run) = match best {
            Some((rate, r)) => (Some(rate), r),
            None => (None, last),
        };
        points.push(SweepPoint {
            workers: w,
            zero_loss_cps,
            gain: None,
            trials,
            run,
        });
    }
    let base = points
        .iter()
        .find(|p| p.workers == 0)
        .and_then(|p| p.zero_loss_cps);
    for p in &mut points {
        p.gain = match (base, p.zero_loss_cps) {
            (Some(b), Some(c)) if b > 0.0 => Some(c / b - 1.0),
            _ => None,
        };
    }
    Ok(points)
}

/// One policy of a placement comparison (see [`run_placement_compare`]): the run's window
/// figures (offload ratio, insertions, deletions, host CPU, flaps: [`report::WindowFigures`],
/// flattened into the point's JSON) and the run itself. Model results.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct PlacementPoint {
    /// The policy's name.
    pub policy: &'static str,
    /// What placement did over the measure window (a copy of `run.window`).
    #[serde(flatten)]
    pub window: report::WindowFigures,
    /// Packets lost over the whole run.
    pub lost_packets: u64,
    /// The run.
    pub run: RunReport,
}

/// Runs `sc` once per policy of its `[compare]` section, all with `seed`: the same workload
/// (every flow's rate trajectory depends only on the seed and its id), the same hardware table
/// and insertion budget; only the placement policy differs. Points are in the section's order.
pub fn run_placement_compare(
    sc: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> Result<Vec<PlacementPoint>, SimFailure> {
    let policies = sc
        .compare
        .as_ref()
        .expect("a scenario with a [compare] section")
        .policies
        .clone();
    let total = policies.len() as f64;
    let mut points = Vec::with_capacity(policies.len());
    for (i, kind) in policies.into_iter().enumerate() {
        let mut s = sc.clone();
        s.fabric.placement.policy = kind;
        s.compare = None;
        let done = i as f64;
        let r = run(&s, seed, false, &mut |p| progress((done + p) / total))?;
        points.push(PlacementPoint {
            policy: kind.name(),
            window: r.window,
            lost_packets: r.lost_packets,
            run: r,
        });
    }
    Ok(points)
}

/// One path of a vATC comparison (see [`run_vatc_compare`]). Model results.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct VatcPath {
    /// `dpu-baseline`, `plane-without-vatc` or `plane-with-vatc`.
    pub path: &'static str,
    /// Packets delivered per second over the measure window, Mpps.
    pub pps_mpps: f64,
    /// Of those, delivered by the spill plane, Mpps.
    pub plane_mpps: f64,
    /// `pps_mpps` over the DPU baseline's.
    pub relative_to_dpu: f64,
    /// Latency of every delivered packet of the latency run (the load scaled by
    /// `latency_load`, carried without loss), microseconds.
    pub latency_us: report::LatencyUs,
    /// PCIe crossings per delivered packet of the latency run (`pcie.crossings` / delivered:
    /// exact, since nothing is lost there).
    pub pcie_crossings_per_packet: f64,
    /// Packets the latency run offered and lost (zero when `latency_load` fits the path).
    pub latency_run_lost_packets: u64,
    /// PCIe crossings per delivered packet of the saturated run (a packet dropped after a
    /// crossing raises it).
    pub pcie_crossings_per_packet_saturated: f64,
    /// Packets offered over the run.
    pub offered_packets: u64,
    /// Packets lost over the run (above the path's capacity: the load is meant to saturate).
    pub lost_packets: u64,
    /// The drops, by reason (non-zero ones).
    pub drops: std::collections::BTreeMap<&'static str, u64>,
    /// The counters that tell the paths apart: `pcie.crossings`, `atc.direct`,
    /// `spill.atc.miss`, `dpu.steer.packets`, `dpu.host_out.packets`.
    pub counters: std::collections::BTreeMap<&'static str, u64>,
}

impl VatcPath {
    fn new(path: &'static str, r: &RunReport, lat: &RunReport, dpu_pps: f64) -> VatcPath {
        const KEPT: [&str; 5] = [
            "pcie.crossings",
            "atc.direct",
            "spill.atc.miss",
            "dpu.steer.packets",
            "dpu.host_out.packets",
        ];
        VatcPath {
            path,
            pps_mpps: r.delivered_mpps,
            plane_mpps: r.host_mpps,
            relative_to_dpu: if dpu_pps > 0.0 {
                r.delivered_mpps / dpu_pps
            } else {
                0.0
            },
            latency_us: lat.latency_us,
            pcie_crossings_per_packet: lat.pcie_crossings_per_packet,
            latency_run_lost_packets: lat.lost_packets,
            pcie_crossings_per_packet_saturated: r.pcie_crossings_per_packet,
            offered_packets: r.offered_packets,
            lost_packets: r.lost_packets,
            drops: r
                .drops
                .iter()
                .filter(|(_, v)| **v > 0)
                .map(|(k, v)| (*k, *v))
                .collect(),
            counters: r
                .counters
                .iter()
                .filter(|(k, _)| KEPT.contains(k))
                .map(|(k, v)| (*k, *v))
                .collect(),
        }
    }
}

/// One parameter of a vATC sensitivity: the without/with PPS ratio with the parameter divided
/// and multiplied by the factor.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct VatcSensitivity {
    /// The parameter's dotted name.
    pub param: String,
    /// Without/with PPS ratio at `1/factor` times the parameter.
    pub ratio_low: f64,
    /// Without/with PPS ratio at `factor` times the parameter.
    pub ratio_high: f64,
    /// The ratio with the resource made more capable (a rate times the factor, a cost divided
    /// by it) minus the ratio with it made less capable. Positive: improving the resource
    /// narrows the gap and degrading it widens it, so the gap is that resource's. Negative:
    /// degrading it moves the bottleneck of both paths onto it, which hides the gap rather
    /// than explaining it.
    pub effect: f64,
}

/// The vATC comparison: three paths on one workload and seed, and what drives the gap.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct VatcReport {
    /// Always "model".
    pub kind: &'static str,
    /// The scenario.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The measure window, seconds.
    pub measure_s: [f64; 2],
    /// Bytes per packet of the workload (the first flow group's).
    pub packet_bytes: u32,
    /// Offered load of the saturated runs, Mpps (the DPU baseline's measure window).
    pub offered_mpps: f64,
    /// Offered load of the latency runs, Mpps.
    pub latency_offered_mpps: f64,
    /// The DPU alone, the plane without vATC, the plane with it.
    pub paths: Vec<VatcPath>,
    /// Plane PPS without vATC over plane PPS with it.
    pub ratio_without_over_with: f64,
    /// Mean latency with vATC relative to without, minus one (-0.37: 37% lower).
    pub latency_change_with_vatc: f64,
    /// The factor of the sensitivity.
    pub factor: f64,
    /// One entry per parameter varied, in the scenario's order.
    pub sensitivity: Vec<VatcSensitivity>,
    /// The parameter with the largest positive [`VatcSensitivity::effect`] (the first on a
    /// tie): the resource the path without vATC runs out of first. `None` if none has one.
    pub gap_driver: Option<String>,
}

/// Runs the vATC comparison of `sc` (its `[vatc]` section): the DPU-only baseline, the plane
/// without vATC and with it, all on `seed`; then the sensitivity runs.
pub fn run_vatc_compare(
    sc: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> Result<VatcReport, SimFailure> {
    let v = sc.vatc.clone().expect("a scenario with a [vatc] section");
    let total = (6 + 4 * v.sensitivity.len()) as f64;
    let mut done = 0.0;
    let mut one = |s: &Scenario, dpu_only: bool, done: &mut f64| {
        let d = *done;
        let r = run(s, seed, dpu_only, &mut |p| progress((d + p) / total))?;
        *done += 1.0;
        Ok::<_, SimFailure>(r)
    };
    let with_vatc = |f: &spillway_fabric::params::FabricParams, on: bool| {
        let mut s = sc.clone();
        s.vatc = None;
        s.fabric = f.clone();
        s.fabric.host.vatc = on;
        s
    };
    let base = one(&with_vatc(&sc.fabric, false), true, &mut done)?;
    let without = one(&with_vatc(&sc.fabric, false), false, &mut done)?;
    let with = one(&with_vatc(&sc.fabric, true), false, &mut done)?;
    let light = |on: bool| {
        let mut s = with_vatc(&sc.fabric, on);
        for g in &mut s.flows {
            g.pps *= v.latency_load;
        }
        for c in &mut s.cps {
            c.rate_from *= v.latency_load;
            c.rate_to *= v.latency_load;
        }
        s
    };
    let base_lat = one(&light(false), true, &mut done)?;
    let without_lat = one(&light(false), false, &mut done)?;
    let with_lat = one(&light(true), false, &mut done)?;
    let ratio = |a: &RunReport, b: &RunReport| {
        if b.delivered_mpps > 0.0 {
            a.delivered_mpps / b.delivered_mpps
        } else {
            0.0
        }
    };
    let mut sensitivity = Vec::with_capacity(v.sensitivity.len());
    for name in &v.sensitivity {
        let mut r = [0.0; 2];
        for (i, factor) in [1.0 / v.factor, v.factor].into_iter().enumerate() {
            let f = scenario::scale_param(&sc.fabric, name, factor)
                .expect("validated: a known parameter");
            let a = one(&with_vatc(&f, false), false, &mut done)?;
            let b = one(&with_vatc(&f, true), false, &mut done)?;
            r[i] = ratio(&a, &b);
        }
        let effect = if scenario::larger_is_better(name) {
            r[1] - r[0]
        } else {
            r[0] - r[1]
        };
        sensitivity.push(VatcSensitivity {
            param: name.clone(),
            ratio_low: r[0],
            ratio_high: r[1],
            effect,
        });
    }
    // The driver: the largest positive effect (the first on a tie); none if no parameter
    // narrows the gap when improved (more than rounding).
    let mut gap_driver: Option<&VatcSensitivity> = None;
    for s in &sensitivity {
        if s.effect > 1e-3 && gap_driver.is_none_or(|d| s.effect > d.effect) {
            gap_driver = Some(s);
        }
    }
    let dpu_pps = base.delivered_mpps;
    Ok(VatcReport {
        kind: "model",
        scenario: sc.name.clone(),
        seed,
        measure_s: base.measure_s,
        packet_bytes: sc.flows.first().map_or(64, |g| g.bytes),
        offered_mpps: base.offered_mpps,
        latency_offered_mpps: base_lat.offered_mpps,
        ratio_without_over_with: ratio(&without, &with),
        latency_change_with_vatc: if without_lat.latency_us.mean > 0.0 {
            with_lat.latency_us.mean / without_lat.latency_us.mean - 1.0
        } else {
            0.0
        },
        paths: vec![
            VatcPath::new("dpu-baseline", &base, &base_lat, dpu_pps),
            VatcPath::new("plane-without-vatc", &without, &without_lat, dpu_pps),
            VatcPath::new("plane-with-vatc", &with, &with_lat, dpu_pps),
        ],
        factor: v.factor,
        gap_driver: gap_driver.map(|d| d.param.clone()),
        sensitivity,
    })
}
