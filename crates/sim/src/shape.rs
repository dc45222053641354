//! How a long flow's rate varies over time: the `shape` of a `[[flows]]` group.
//!
//! A flow sends `pps x factor(t)` while it lives (before the per-train `jitter`); this module
//! computes `factor(t)` for the shapes that need state and randomness. `steady` (the default,
//! with its fixed `on`/`off` square wave) stays in the engine exactly as it always was, so
//! scenarios that do not use the other shapes draw the same random numbers as before.
//!
//! | shape         | factor(t)                                                                      | mean |
//! |---------------|--------------------------------------------------------------------------------|------|
//! | `periodic`    | `1 + amplitude x sin(2 pi t / period + phase)`, phase uniform per flow         | 1 over a period |
//! | `bursty`      | 1 while on, 0 while off; on and off last exponential times of means `on`, `off` | `on / (on + off)` |
//! | `random-walk` | every `step`, times `exp(volatility x N(0,1) - volatility^2 / 2)`, clamped to [1/10, 10] | 1 until the clamps bind |
//!
//! The random walk's step has the `- volatility^2 / 2` drift so that it is a martingale: the
//! expected rate stays `pps` at every instant and a scenario's offered load is what its file
//! says. Without it the expected rate would grow as `exp(volatility^2 n / 2)` after `n` steps
//! (x2.7 after 100 steps of 0.14), which no real flow population does; its median drifts down
//! instead (by `exp(-volatility^2 n / 2)`), as a flow population whose rates spread out does.
//! A bursty flow starts on with probability `on / (on + off)`, so the process is stationary
//! from its first train.
//!
//! Each flow draws from its own SplitMix64 stream, seeded from the run's seed and its
//! connection id: its rate trajectory does not depend on any other flow, on event order or on
//! the placement policy, so every policy of a comparison sees the same workload.

use spillway_vswitch::workload::SplitMix64;

use crate::scenario::{FlowGroup, Shape};

/// The state of one flow's shape (not for `steady`, which the engine handles itself).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ShapeState {
    /// `steady`: the engine's fixed square wave.
    Steady,
    /// `periodic`.
    Periodic {
        /// Period, ns.
        period_ns: u64,
        /// Relative amplitude, 0..=1.
        amplitude: f64,
        /// Phase, radians.
        phase: f64,
    },
    /// `bursty`.
    Bursty {
        /// Sending now.
        on: bool,
        /// When the current on or off period ends, ns.
        until_ns: u64,
        /// Mean on time, ns.
        on_mean_ns: f64,
        /// Mean off time, ns.
        off_mean_ns: f64,
    },
    /// `random-walk`.
    RandomWalk {
        /// The current multiplier of `pps`.
        factor: f64,
        /// When the next step is taken, ns.
        next_ns: u64,
        /// Interval between steps, ns.
        step_ns: u64,
        /// Standard deviation of a step's log-rate change.
        volatility: f64,
    },
}

/// Lowest and highest multiplier of a random walk.
pub const WALK_CLAMP: (f64, f64) = (0.1, 10.0);

/// Default `step` of a random walk.
pub const WALK_STEP_NS: u64 = 100_000_000;

/// Uniform in [0, 1).
pub fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Uniform in (0, 1]: safe under a logarithm.
fn unit_open(rng: &mut SplitMix64) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// A standard normal draw (Box-Muller; the second value is discarded).
pub fn normal(rng: &mut SplitMix64) -> f64 {
    let r = (-2.0 * unit_open(rng).ln()).sqrt();
    r * (core::f64::consts::TAU * unit(rng)).cos()
}

/// An exponential draw of mean `mean` (ns), at least 1.
pub fn exp_ns(rng: &mut SplitMix64, mean: f64) -> u64 {
    (-mean * unit_open(rng).ln()).max(1.0) as u64
}

/// The random stream of the flow `conn` in a run seeded with `seed`.
pub fn flow_rng(seed: u64, conn: u64) -> SplitMix64 {
    let mut r = SplitMix64(seed ^ 0x5a4e_f10e_0000_0000 ^ conn.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // One step mixes the seed and the id before the first value is used.
    r.next_u64();
    r
}

impl ShapeState {
    /// The state of a flow of group `g` that opens at `open_ns`.
    pub fn new(g: &FlowGroup, open_ns: u64, rng: &mut SplitMix64) -> ShapeState {
        match g.shape {
            Shape::Steady => ShapeState::Steady,
            Shape::Periodic => ShapeState::Periodic {
                period_ns: g.period.map_or(1, |d| d.ns().max(1)),
                amplitude: g.amplitude.unwrap_or(0.0),
                phase: core::f64::consts::TAU * unit(rng),
            },
            Shape::Bursty => {
                let on_mean_ns = g.on.ns().max(1) as f64;
                let off_mean_ns = g.off.ns().max(1) as f64;
                let on = unit(rng) < on_mean_ns / (on_mean_ns + off_mean_ns);
                let mean = if on { on_mean_ns } else { off_mean_ns };
                ShapeState::Bursty {
                    on,
                    until_ns: open_ns + exp_ns(rng, mean),
                    on_mean_ns,
                    off_mean_ns,
                }
            }
            Shape::RandomWalk => {
                let step_ns = g.step.map_or(WALK_STEP_NS, |d| d.ns().max(1));
                ShapeState::RandomWalk {
                    factor: 1.0,
                    next_ns: open_ns + step_ns,
                    step_ns,
                    volatility: g.volatility.unwrap_or(0.0),
                }
            }
        }
    }

    /// The rate multiplier at `now_ns` (times are non-decreasing across calls). `None` while
    /// a bursty flow is off (it sends nothing and draws no jitter).
    pub fn factor(&mut self, now_ns: u64, rng: &mut SplitMix64) -> Option<f64> {
        match self {
            ShapeState::Steady => Some(1.0),
            ShapeState::Periodic {
                period_ns,
                amplitude,
                phase,
            } => {
                let x = (now_ns % *period_ns) as f64 / *period_ns as f64;
                Some(1.0 + *amplitude * (core::f64::consts::TAU * x + *phase).sin())
            }
            ShapeState::Bursty {
                on,
                until_ns,
                on_mean_ns,
                off_mean_ns,
            } => {
                while now_ns >= *until_ns {
                    *on = !*on;
                    let mean = if *on { *on_mean_ns } else { *off_mean_ns };
                    *until_ns += exp_ns(rng, mean);
                }
                on.then_some(1.0)
            }
            ShapeState::RandomWalk {
                factor,
                next_ns,
                step_ns,
                volatility,
            } => {
                while now_ns >= *next_ns {
                    let v = *volatility;
                    *factor = (*factor * (v * normal(rng) - v * v / 2.0).exp())
                        .clamp(WALK_CLAMP.0, WALK_CLAMP.1);
                    *next_ns += *step_ns;
                }
                Some(*factor)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn group(extra: &str) -> FlowGroup {
        let text = format!(
            "name = \"t\"\nduration = \"1s\"\nmeasure = [\"0s\", \"1s\"]\n[[flows]]\ncount = 1\npps = 1000.0\nlifetime = \"1s\"\n{extra}"
        );
        Scenario::from_toml_str(&text, "t.toml").unwrap().flows[0].clone()
    }

    /// Mean factor of `flows` flows over `secs` seconds sampled every 5 ms (a train), and the
    /// factors of the first flow.
    fn mean_factor(g: &FlowGroup, flows: u64, secs: u64, seed: u64) -> (f64, Vec<f64>) {
        let step = 5_000_000;
        let mut sum = 0.0;
        let mut n = 0u64;
        let mut first = Vec::new();
        for conn in 0..flows {
            let mut rng = flow_rng(seed, conn);
            let mut s = ShapeState::new(g, 0, &mut rng);
            let mut t = 0;
            while t < secs * 1_000_000_000 {
                let f = s.factor(t, &mut rng).unwrap_or(0.0);
                assert!(f.is_finite() && f >= 0.0, "{f}");
                if conn == 0 {
                    first.push(f);
                }
                sum += f;
                n += 1;
                t += step;
            }
        }
        (sum / n as f64, first)
    }

    #[test]
    fn periodic_mean_is_one_and_it_swings_by_the_amplitude() {
        let g = group("shape = \"periodic\"\nperiod = \"2s\"\namplitude = 0.8\n");
        let (m, first) = mean_factor(&g, 50, 10, 1);
        assert!((m - 1.0).abs() < 0.01, "mean {m}");
        let max = first.iter().copied().fold(0.0, f64::max);
        let min = first.iter().copied().fold(9.0, f64::min);
        assert!((1.75..=1.8 + 1e-9).contains(&max), "max {max}");
        assert!((0.2 - 1e-9..0.25).contains(&min), "min {min}");
    }

    #[test]
    fn bursty_mean_is_the_duty_cycle_and_periods_are_random() {
        let g = group("shape = \"bursty\"\non = \"50ms\"\noff = \"150ms\"\n");
        let (m, first) = mean_factor(&g, 200, 20, 3);
        assert!((m - 0.25).abs() < 0.02, "mean {m}");
        // Only on and off, and the on periods do not all have one length.
        assert!(first.iter().all(|f| *f == 0.0 || *f == 1.0));
        let mut runs = Vec::new();
        let mut len = 0;
        for f in &first {
            if *f == 1.0 {
                len += 1;
            } else if len > 0 {
                runs.push(len);
                len = 0;
            }
        }
        runs.sort_unstable();
        runs.dedup();
        assert!(runs.len() > 5, "on-run lengths {runs:?}");
    }

    #[test]
    fn random_walk_keeps_its_mean_and_stays_within_the_clamps() {
        let g = group("shape = \"random-walk\"\nvolatility = 0.1\n");
        let (m, first) = mean_factor(&g, 2000, 3, 5);
        assert!((m - 1.0).abs() < 0.03, "mean {m}");
        // It moves once per step (100 ms = 20 trains), not between steps.
        assert!(first[..20].iter().all(|f| *f == 1.0));
        assert_ne!(first[20], 1.0);
        assert_eq!(first[20], first[39]);
        // A wild walk stays in the clamps.
        let g = group("shape = \"random-walk\"\nvolatility = 2.0\nstep = \"10ms\"\n");
        let (_, first) = mean_factor(&g, 1, 5, 5);
        assert!(
            first
                .iter()
                .all(|f| (WALK_CLAMP.0..=WALK_CLAMP.1).contains(f))
        );
        assert!(first.contains(&WALK_CLAMP.0) || first.contains(&WALK_CLAMP.1));
    }

    #[test]
    fn a_flow_stream_depends_only_on_the_seed_and_the_connection() {
        let g = group("shape = \"random-walk\"\nvolatility = 0.3\n");
        let (_, a) = mean_factor(&g, 1, 2, 9);
        let (_, b) = mean_factor(&g, 1, 2, 9);
        assert_eq!(a, b);
        let (_, c) = mean_factor(&g, 1, 2, 10);
        assert_ne!(a, c);
        let mut r1 = flow_rng(9, 1);
        let mut r2 = flow_rng(9, 2);
        assert_ne!(r1.next_u64(), r2.next_u64());
    }

    #[test]
    fn normal_draws_have_unit_variance() {
        let mut rng = SplitMix64(42);
        let n = 200_000;
        let (mut s, mut s2) = (0.0, 0.0);
        for _ in 0..n {
            let z = normal(&mut rng);
            s += z;
            s2 += z * z;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.02, "{var}");
    }
}
