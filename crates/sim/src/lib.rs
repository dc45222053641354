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
//! - [`engine::Sim`]: one run; [`run`], [`run_sweep`] and [`run_placement_compare`] wrap it.
//! - [`report::RunReport`]: what a run measured in the model; [`PlacementPoint`]: one policy of
//!   a placement comparison.
//! - [`shape`]: how a flow group's rate varies over time (steady, periodic, bursty, random walk).
//! - [`swarm`]: random scenarios for seed swarms.
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

pub mod engine;
pub mod html;
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
