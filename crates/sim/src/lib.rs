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
//! - [`engine::Sim`]: one run; [`run`] and [`run_sweep`] wrap it.
//! - [`report::RunReport`]: what a run measured in the model.
//! - [`swarm`]: random scenarios for seed swarms.
//!
//! ## Determinism
//!
//! The event queue orders by `(time, sequence number)`; all randomness is one SplitMix64
//! seeded from the run's seed; no hash-map order reaches an output. The same scenario and seed
//! give the same report, byte for byte.
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
pub mod report;
pub mod scenario;
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
    let sim = Sim::new(
        sc,
        RunOptions {
            seed,
            dpu_only,
            series: true,
        },
    );
    let mut r = sim.run(progress)?;
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
    /// Zero-loss connections per second.
    pub zero_loss_cps: Option<f64>,
    /// Gain over the 0-worker point, as a fraction (0.9 = +90%).
    pub gain: Option<f64>,
    /// The run.
    pub run: RunReport,
}

/// Runs `sc` once per entry of `sc.sweep_workers`: the plane starts with and may grow to that
/// many workers (0 runs DPU-only).
pub fn run_sweep(
    sc: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> Result<Vec<SweepPoint>, SimFailure> {
    let n = sc.sweep_workers.len().max(1) as f64;
    let mut points: Vec<SweepPoint> = Vec::new();
    for (i, &w) in sc.sweep_workers.iter().enumerate() {
        let mut s = sc.clone();
        if w > 0 {
            s.fabric.host.workers_initial = w;
            s.fabric.host.workers_max = w;
        }
        let r = run(&s, seed, w == 0, &mut |p| progress((i as f64 + p) / n))?;
        points.push(SweepPoint {
            workers: w,
            zero_loss_cps: r.zero_loss_cps,
            gain: None,
            run: r,
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
