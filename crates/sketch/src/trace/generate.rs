//! The labelled trace generator: flows of the five [`FlowClass`]es (their shapes are described
//! in the `trace` module's documentation), each from its own SplitMix64 stream, so a seed gives
//! the same trace on every platform and release.

use super::row::{FlowClass, LabelledRow, TICK_S, TraceRow};
use crate::classifier::FlowId;
use crate::features::FeatureTick;
use crate::rng::{SplitMix64, mix64};

/// Ticks per second (the inverse of [`TICK_S`], exact).
const TICKS_PER_S: f64 = 10.0;

/// A trace family: a generator with its own rate distributions, class mix, shapes and
/// measurement faults. The classifier's constants were chosen on [`Family::Uniform`]; the
/// other two are held out (the `trace` module's documentation describes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Every class draws its mean rate from one log-normal, so size says nothing about the
    /// class; sine-wave periods, exponential on/off, mean-reverting random walks, no faults.
    Uniform,
    /// Gigabit elephants: stable flows of 200 Mbit/s to 2 Gbit/s beside random walks that
    /// reach 5 Gbit/s and more, half the flows mice, and a jittery tick timer.
    Elephants,
    /// Pareto sizes for every class; square-wave periods of 0.6-10 s, heavy-tailed on/off
    /// times, level shifts instead of a smooth walk, mice that live long enough to be scored,
    /// per-flow sampling jitter and whole ticks missing.
    Pareto,
}

impl Family {
    /// Every family, the tuning one first.
    pub const ALL: [Family; 3] = [Family::Uniform, Family::Elephants, Family::Pareto];

    /// The family's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Uniform => "uniform",
            Family::Elephants => "elephants",
            Family::Pareto => "pareto",
        }
    }
}

impl core::fmt::Display for Family {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Family {
    type Err = String;

    fn from_str(s: &str) -> Result<Family, String> {
        Family::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("expected one of uniform, elephants, pareto, got {s:?}"))
    }
}

/// What to generate. [`GenSpec::default`] is the [`Family::Uniform`] mix the constants were
/// chosen on; [`GenSpec::family`] gives each family's own.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    /// The generator.
    pub family: Family,
    /// Flows in all (mice included).
    pub flows: usize,
    /// Ticks (100 ms each).
    pub ticks: u64,
    /// Share of each class, in [`FlowClass::ALL`] order; normalised, so they need not sum
    /// to 1. Counts are rounded by largest remainder.
    pub mix: [f64; 5],
    /// [`Family::Uniform`]: median of the log-normal mean rate, bits/s. Default 10 Mbit/s.
    pub rate_median_bps: f64,
    /// [`Family::Uniform`]: log-standard deviation of the mean rate. Default 1.5: the 99th
    /// percentile is 33x the median, the 1st 1/33 of it (300 kbit/s .. 330 Mbit/s), as in
    /// data-centre flow-size measurements where a few elephants carry most bytes.
    pub rate_sigma: f64,
    /// Each tick really lasts `100 ms × (1 ± tick_jitter)` (uniform, the same for every flow:
    /// the exporter's timer), while rates are reported per nominal tick. 0 for none.
    pub tick_jitter: f64,
    /// Each flow's sample covers `(1 ± sample_jitter)` of the tick (uniform, per flow and
    /// tick: counters read at slightly different moments). 0 for none.
    pub sample_jitter: f64,
    /// Share of ticks missing from the trace: no rows at all (the exporter lost the
    /// interval), while every flow goes on. 0 for none.
    pub missing_ticks: f64,
}

impl Default for GenSpec {
    /// 2,000 flows over 600 ticks (60 s): 30 % steady, 15 % periodic, 20 % bursty, 15 % random
    /// walk, 20 % mice.
    fn default() -> Self {
        GenSpec::family(Family::Uniform)
    }
}

impl GenSpec {
    /// The family's own spec (60 s of ticks each):
    ///
    /// | family | flows | mix (steady, periodic, bursty, random walk, mice) | faults |
    /// |---|---|---|---|
    /// | uniform | 2,000 | 30 / 15 / 20 / 15 / 20 % | none |
    /// | elephants | 4,000 | 15 / 10 / 15 / 10 / 50 % | tick length ± 10 % |
    /// | pareto | 2,000 | 25 / 20 / 25 / 20 / 10 % | per-flow sample ± 15 %, 1 % of ticks missing |
    pub fn family(family: Family) -> GenSpec {
        let base = GenSpec {
            family,
            flows: 2_000,
            ticks: 600,
            mix: [0.30, 0.15, 0.20, 0.15, 0.20],
            rate_median_bps: 10e6,
            rate_sigma: 1.5,
            tick_jitter: 0.0,
            sample_jitter: 0.0,
            missing_ticks: 0.0,
        };
        match family {
            Family::Uniform => base,
            Family::Elephants => GenSpec {
                flows: 4_000,
                mix: [0.15, 0.10, 0.15, 0.10, 0.50],
                tick_jitter: 0.10,
                ..base
            },
            Family::Pareto => GenSpec {
                mix: [0.25, 0.20, 0.25, 0.20, 0.10],
                sample_jitter: 0.15,
                missing_ticks: 0.01,
                ..base
            },
        }
    }

    /// How many flows of each class: largest-remainder rounding of `flows × share`, ties to
    /// the earlier class.
    pub fn counts(&self) -> [usize; 5] {
        let total: f64 = self.mix.iter().map(|s| s.max(0.0)).sum();
        let mut counts = [0usize; 5];
        if total <= 0.0 || self.flows == 0 {
            return counts;
        }
        let mut rem = [(0.0f64, 0usize); 5];
        let mut given = 0;
        for (i, s) in self.mix.iter().enumerate() {
            let exact = self.flows as f64 * s.max(0.0) / total;
            counts[i] = exact.floor() as usize;
            given += counts[i];
            rem[i] = (exact - exact.floor(), i);
        }
        rem.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in rem.iter().take(self.flows.saturating_sub(given)) {
            counts[*i] += 1;
        }
        counts
    }
}

/// How a flow's rate evolves.
#[derive(Clone, Debug)]
enum Shape {
    Steady {
        /// Log-normal noise of each tick's rate.
        noise: f64,
    },
    Periodic {
        period_ticks: f64,
        amplitude: f64,
        phase: f64,
        noise: f64,
        /// A square wave (high and low halves) instead of a sine.
        square: bool,
    },
    Bursty {
        on: bool,
        /// Time left in the current period, seconds.
        left_s: f64,
        mean_on_s: f64,
        mean_off_s: f64,
        /// Length of the current off period so far, seconds (the gap before the next packet).
        off_run_s: f64,
        /// Periods drawn from a Pareto of tail index 1.5 (same means) instead of exponential.
        heavy: bool,
    },
    RandomWalk {
        x: f64,
        /// Mean reversion per tick.
        theta: f64,
        /// Volatility per tick.
        sigma: f64,
        /// Stationary log-standard deviation.
        spread: f64,
    },
    /// A level that holds for an exponential time, then jumps to a new log-normal level.
    LevelShift {
        /// The current level relative to the mean (mean 1).
        level: f64,
        /// Time left at this level, seconds.
        left_s: f64,
        mean_hold_s: f64,
        /// Log-standard deviation of the levels.
        sigma: f64,
        noise: f64,
    },
    Mice {
        born: u64,
        life: u64,
        /// Rate of a full tick, so that the life's mean is the drawn rate.
        body_bps: f64,
        /// Control ratio of the first and last tick.
        edge_ctrl: f64,
    },
}

/// A period of an on/off flow with mean `mean`: exponential, or Pareto of tail index 1.5.
fn period(rng: &mut SplitMix64, mean: f64, heavy: bool) -> f64 {
    if heavy {
        // The mean of a Pareto of index a and scale m is a·m / (a - 1).
        rng.pareto(mean / 3.0, 1.5)
    } else {
        rng.exp(mean)
    }
}

/// An on/off shape with its periods' means, started in its stationary state (on with
/// probability duty, and a full period left), and its gap cv drawn from `cv` (between the
/// two, the order of [`Family::Uniform`]'s first release).
fn bursty(
    rng: &mut SplitMix64,
    mean_on_s: f64,
    mean_off_s: f64,
    heavy: bool,
    cv: (f64, f64),
) -> (f64, Shape) {
    let on = rng.uniform() < mean_on_s / (mean_on_s + mean_off_s);
    let left_s = period(rng, if on { mean_on_s } else { mean_off_s }, heavy);
    let cv = rng.range(cv.0, cv.1);
    let off_run_s = if on {
        0.0
    } else {
        period(rng, mean_off_s, heavy)
    };
    let shape = Shape::Bursty {
        on,
        left_s,
        mean_on_s,
        mean_off_s,
        off_run_s,
        heavy,
    };
    (cv, shape)
}

/// A mean-reverting log-rate walk of volatility `sigma` per tick and stationary spread
/// `spread`, started in its stationary state.
fn random_walk(rng: &mut SplitMix64, sigma: f64, spread: f64) -> Shape {
    // Stationary variance of x' = (1 - θ) x + σ ε is σ² / (2θ - θ²).
    let theta = 1.0 - (1.0 - (sigma / spread).powi(2)).sqrt();
    Shape::RandomWalk {
        x: spread * rng.normal(),
        theta,
        sigma,
        spread,
    }
}

/// A mouse of `life` ticks (at most the trace) with mean rate `rate_bps`, born at `born`.
fn mice(rng: &mut SplitMix64, life: u64, born: u64, rate_bps: f64, ticks: u64) -> Shape {
    let life = life.min(ticks.max(1));
    // Half a tick's worth in the first and the last tick (handshake, slow start, the tail):
    // the full ticks carry rate × life / (life - 1).
    let weight = (life as f64 - 1.0).max(1.0);
    Shape::Mice {
        born,
        life,
        body_bps: rate_bps * life as f64 / weight,
        edge_ctrl: rng.range(0.3, 0.8),
    }
}

/// A birth tick for a mouse of `life` ticks, uniform over the trace.
fn birth(rng: &mut SplitMix64, life: u64, ticks: u64) -> u64 {
    rng.int(0, ticks.saturating_sub(life.min(ticks.max(1))))
}

/// One generated flow.
#[derive(Clone, Debug)]
struct FlowGen {
    id: FlowId,
    class: FlowClass,
    rate_bps: f64,
    size_bytes: f64,
    /// Coefficient of variation of its regular gaps.
    cv: f64,
    /// Its base control ratio.
    ctrl: f64,
    rng: SplitMix64,
    shape: Shape,
}

/// Standard deviation of a set of gaps: `regular` gaps of mean `g` and coefficient of variation
/// `cv`, plus the `big` gaps; 0 with fewer than two gaps (as [`crate::features::FlowCounters`]
/// reports).
fn gap_std(regular: f64, g: f64, cv: f64, big: &[f64]) -> f64 {
    let n = regular + big.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let sum = regular * g + big.iter().sum::<f64>();
    let sq = regular * g * g * (1.0 + cv * cv) + big.iter().map(|b| b * b).sum::<f64>();
    let mean = sum / n;
    (sq / n - mean * mean).max(0.0).sqrt()
}

/// Rounds to a multiple of `1 / scale` (`scale` a power of ten), so that the CSV's shortest
/// decimal form reads back as the same value.
fn round_to(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

impl FlowGen {
    fn new(id: FlowId, class: FlowClass, spec: &GenSpec, seed: u64) -> FlowGen {
        // Each flow's stream from the seed and its id, independent of the other flows.
        let mut rng = SplitMix64::new(mix64(seed ^ mix64(id ^ 0x5851_F42D_4C95_7F2D)));
        let (rate_bps, size_bytes, ctrl, cv, shape) = match spec.family {
            Family::Uniform => Self::uniform(class, spec, &mut rng),
            Family::Elephants => Self::elephants(class, spec, &mut rng),
            Family::Pareto => Self::pareto(class, spec, &mut rng),
        };
        FlowGen {
            id,
            class,
            rate_bps,
            size_bytes,
            cv,
            ctrl,
            rng,
            shape,
        }
    }

    /// [`Family::Uniform`]: (mean rate, packet size, control ratio, gap cv, shape).
    fn uniform(
        class: FlowClass,
        spec: &GenSpec,
        rng: &mut SplitMix64,
    ) -> (f64, f64, f64, f64, Shape) {
        // The draws keep the order of this family's first release (see `bursty`, `birth`),
        // so its seeds give the traces the README's figures were measured on.
        let rate_bps = spec.rate_median_bps * (spec.rate_sigma * rng.normal()).exp();
        let size_bytes = rng.log_range(64.0, 1500.0).round();
        let ctrl = rng.range(0.0, 0.05);
        let (cv, shape) = match class {
            FlowClass::Steady => (rng.range(0.05, 0.3), Shape::Steady { noise: 0.05 }),
            FlowClass::Periodic => (
                rng.range(0.05, 0.3),
                Shape::Periodic {
                    period_ticks: rng.range(1.0, 5.0) * TICKS_PER_S,
                    amplitude: rng.range(0.3, 0.8),
                    phase: rng.range(0.0, 2.0 * core::f64::consts::PI),
                    noise: 0.05,
                    square: false,
                },
            ),
            FlowClass::Bursty => {
                let mean_on_s = rng.log_range(0.2, 3.0);
                let mean_off_s = rng.log_range(0.2, 3.0);
                bursty(rng, mean_on_s, mean_off_s, false, (0.05, 0.3))
            }
            FlowClass::RandomWalk => {
                let sigma = rng.range(0.1, 0.3);
                let spread = rng.range(0.5, 1.0);
                (rng.range(0.1, 0.5), random_walk(rng, sigma, spread))
            }
            FlowClass::Mice => {
                let life = rng.int(2, 15);
                let born = birth(rng, life, spec.ticks);
                let cv = rng.range(1.0, 3.0);
                (cv, mice(rng, life, born, rate_bps, spec.ticks))
            }
        };
        (rate_bps, size_bytes, ctrl, cv, shape)
    }

    /// [`Family::Elephants`]: sizes by class, from mice of 100 kbit/s to walks past 5 Gbit/s.
    fn elephants(
        class: FlowClass,
        spec: &GenSpec,
        rng: &mut SplitMix64,
    ) -> (f64, f64, f64, f64, Shape) {
        let ctrl = rng.range(0.0, 0.03);
        let cv = rng.range(0.1, 0.4);
        match class {
            FlowClass::Steady => {
                let rate = rng.log_range(200e6, 2e9);
                let size = rng.range(1_000.0, 1_500.0).round();
                (rate, size, ctrl, cv, Shape::Steady { noise: 0.08 })
            }
            FlowClass::Periodic => {
                let rate = rng.log_range(200e6, 2e9);
                let size = rng.range(1_000.0, 1_500.0).round();
                let shape = Shape::Periodic {
                    period_ticks: rng.range(2.0, 8.0) * TICKS_PER_S,
                    amplitude: rng.range(0.2, 0.6),
                    phase: rng.range(0.0, 2.0 * core::f64::consts::PI),
                    noise: 0.08,
                    square: false,
                };
                (rate, size, ctrl, cv, shape)
            }
            FlowClass::Bursty => {
                let on_bps = rng.log_range(100e6, 3e9);
                let mean_on_s = rng.log_range(0.5, 5.0);
                let mean_off_s = rng.log_range(0.5, 5.0);
                let duty = mean_on_s / (mean_on_s + mean_off_s);
                let size = rng.log_range(200.0, 1_500.0).round();
                let (cv, shape) = bursty(rng, mean_on_s, mean_off_s, false, (0.1, 0.4));
                (on_bps * duty, size, ctrl, cv, shape)
            }
            FlowClass::RandomWalk => {
                let rate = rng.log_range(300e6, 2e9);
                let size = rng.range(1_000.0, 1_500.0).round();
                let sigma = rng.range(0.15, 0.35);
                let spread = rng.range(0.8, 1.2);
                let cv = rng.range(0.2, 0.6);
                (rate, size, ctrl, cv, random_walk(rng, sigma, spread))
            }
            FlowClass::Mice => {
                let rate = rng.log_range(100e3, 50e6);
                let size = rng.log_range(64.0, 1_500.0).round();
                let life = rng.int(2, 30);
                let born = birth(rng, life, spec.ticks);
                let cv = rng.range(1.0, 3.0);
                (
                    rate,
                    size,
                    ctrl,
                    cv,
                    mice(rng, life, born, rate, spec.ticks),
                )
            }
        }
    }

    /// [`Family::Pareto`]: one Pareto size distribution (tail index 1.3 from 2 Mbit/s, capped
    /// at 10 Gbit/s) for every class.
    fn pareto(
        class: FlowClass,
        spec: &GenSpec,
        rng: &mut SplitMix64,
    ) -> (f64, f64, f64, f64, Shape) {
        let rate_bps = rng.pareto(2e6, 1.3).min(10e9);
        let size_bytes = rng.log_range(64.0, 1500.0).round();
        let ctrl = rng.range(0.0, 0.05);
        let cv = rng.range(0.1, 0.6);
        let shape = match class {
            FlowClass::Steady => Shape::Steady { noise: 0.10 },
            FlowClass::Periodic => Shape::Periodic {
                period_ticks: rng.log_range(0.6, 10.0) * TICKS_PER_S,
                amplitude: rng.range(0.3, 0.7),
                phase: rng.range(0.0, 2.0 * core::f64::consts::PI),
                noise: 0.05,
                square: true,
            },
            FlowClass::Bursty => {
                let mean_on_s = rng.log_range(0.3, 4.0);
                let mean_off_s = rng.log_range(0.3, 4.0);
                let (_, shape) = bursty(rng, mean_on_s, mean_off_s, true, (0.1, 0.6));
                shape
            }
            FlowClass::RandomWalk => {
                let mean_hold_s = rng.log_range(1.0, 10.0);
                let sigma: f64 = rng.range(0.5, 1.2);
                Shape::LevelShift {
                    level: (sigma * rng.normal() - 0.5 * sigma * sigma).exp(),
                    left_s: rng.exp(mean_hold_s),
                    mean_hold_s,
                    sigma,
                    noise: 0.05,
                }
            }
            FlowClass::Mice => {
                let life = rng.int(2, 40);
                let born = birth(rng, life, spec.ticks);
                return (
                    rate_bps,
                    size_bytes,
                    ctrl,
                    rng.range(1.0, 3.0),
                    mice(rng, life, born, rate_bps, spec.ticks),
                );
            }
        };
        (rate_bps, size_bytes, ctrl, cv, shape)
    }

    /// Whole packets for an expected (fractional) count, by unbiased random rounding.
    fn packets(rng: &mut SplitMix64, expected: f64) -> f64 {
        (expected.max(0.0) + rng.uniform()).floor()
    }

    /// The flow's row in `tick`, or `None` when it is not alive. The tick really lasted
    /// `tick_scale` nominal ticks, and the flow's sample covers `1 ± sample_jitter` of it;
    /// rates are reported per nominal tick.
    fn step(&mut self, tick: u64, tick_scale: f64, sample_jitter: f64) -> Option<FeatureTick> {
        let bits = self.size_bytes * 8.0;
        let rng = &mut self.rng;
        let scale = if sample_jitter > 0.0 {
            tick_scale * rng.range(1.0 - sample_jitter, 1.0 + sample_jitter)
        } else {
            tick_scale
        };
        // Expected packets at `bw` over the (scaled) tick.
        let expect = |bw: f64| bw * TICK_S * scale / bits;
        // (packets, mean regular gap in us, cv, big gaps in us, control ratio)
        let mut big = [0.0f64; 8];
        let mut nbig = 0;
        let (n, gap_us, cv, ctrl) = match &mut self.shape {
            Shape::Steady { noise } => {
                let bw = self.rate_bps * rng.lognormal_noise(*noise);
                let n = Self::packets(rng, expect(bw));
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::Periodic {
                period_ticks,
                amplitude,
                phase,
                noise,
                square,
            } => {
                let angle = 2.0 * core::f64::consts::PI * tick as f64 / *period_ticks + *phase;
                let wave = if *square {
                    angle.sin().signum()
                } else {
                    angle.sin()
                };
                let bw = self.rate_bps * (1.0 + *amplitude * wave) * rng.lognormal_noise(*noise);
                let n = Self::packets(rng, expect(bw));
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::Bursty {
                on,
                left_s,
                mean_on_s,
                mean_off_s,
                off_run_s,
                heavy,
            } => {
                // Walk the on/off periods through the tick; each off period that ends inside
                // it is one long gap before the first packet of the next on period.
                let duty = *mean_on_s / (*mean_on_s + *mean_off_s);
                let on_bps = self.rate_bps / duty;
                let mut t = 0.0;
                let mut on_s = 0.0;
                while t < TICK_S {
                    let span = left_s.min(TICK_S - t);
                    if *on {
                        on_s += span;
                    } else {
                        *off_run_s += span;
                    }
                    t += span;
                    *left_s -= span;
                    if *left_s <= 0.0 {
                        if !*on {
                            if nbig < big.len() {
                                big[nbig] = *off_run_s * 1e6;
                                nbig += 1;
                            }
                            *off_run_s = 0.0;
                        }
                        *on = !*on;
                        *left_s = period(rng, if *on { *mean_on_s } else { *mean_off_s }, *heavy);
                    }
                }
                let n = Self::packets(rng, on_bps * on_s * scale / bits);
                (n, 1e6 * bits / on_bps, self.cv, self.ctrl)
            }
            Shape::RandomWalk {
                x,
                theta,
                sigma,
                spread,
            } => {
                *x = (1.0 - *theta) * *x + *sigma * rng.normal();
                let bw = self.rate_bps * (*x - 0.5 * *spread * *spread).exp();
                let n = Self::packets(rng, expect(bw));
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::LevelShift {
                level,
                left_s,
                mean_hold_s,
                sigma,
                noise,
            } => {
                *left_s -= TICK_S;
                if *left_s <= 0.0 {
                    *level = (*sigma * rng.normal() - 0.5 * *sigma * *sigma).exp();
                    *left_s += rng.exp(*mean_hold_s);
                }
                let bw = self.rate_bps * *level * rng.lognormal_noise(*noise);
                let n = Self::packets(rng, expect(bw));
                (n, 1e6 * bits / bw, self.cv, self.ctrl)
            }
            Shape::Mice {
                born,
                life,
                body_bps,
                edge_ctrl,
            } => {
                if tick < *born || tick >= *born + *life {
                    return None;
                }
                let edge = tick == *born || tick + 1 == *born + *life;
                let full = *body_bps * rng.lognormal_noise(0.2);
                let bw = if edge { 0.5 * full } else { full };
                let bw = if *life == 1 { *body_bps } else { bw };
                let n = Self::packets(rng, expect(bw));
                let ctrl = if edge { *edge_ctrl } else { self.ctrl };
                (n, 1e6 * bits / full.max(1.0), self.cv, ctrl)
            }
        };
        if n <= 0.0 {
            // A silent tick: no packets, nothing to measure.
            return Some(FeatureTick::default());
        }
        let nbig = nbig.min(n as usize);
        let regular = n - nbig as f64;
        let jitter = gap_std(
            regular,
            gap_us,
            cv * self.rng.lognormal_noise(0.1),
            &big[..nbig],
        );
        let ctrl = (ctrl * self.rng.range(0.5, 1.5)).clamp(0.0, 1.0);
        Some(FeatureTick {
            // Whole packets of a whole size: exact integers (ticks per second is exact).
            bw_bps: n * bits * TICKS_PER_S,
            pps: n * TICKS_PER_S,
            ctrl_ratio: round_to(ctrl, 1e4),
            jitter_us: round_to(jitter, 1e3),
        })
    }
}

/// Generates a labelled trace: every live flow's row at every tick, in tick order (flows by
/// id within a tick). Flow ids are 0..flows with the classes shuffled over them, so an id says
/// nothing about its class. The same `spec` and `seed` give the same rows.
pub fn generate(spec: &GenSpec, seed: u64) -> Vec<LabelledRow> {
    let counts = spec.counts();
    let mut classes: Vec<FlowClass> = FlowClass::ALL
        .iter()
        .zip(counts)
        .flat_map(|(c, n)| core::iter::repeat_n(*c, n))
        .collect();
    // Fisher-Yates with the trace's own stream.
    let mut rng = SplitMix64::new(mix64(seed ^ 0xC1A5_5E5D_0F0F_1234));
    for i in (1..classes.len()).rev() {
        let j = rng.int(0, i as u64) as usize;
        classes.swap(i, j);
    }
    let mut flows: Vec<FlowGen> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| FlowGen::new(i as FlowId, *c, spec, seed))
        .collect();
    let mut rows = Vec::with_capacity(flows.len() * spec.ticks as usize);
    // The measurement faults, from their own stream so that they do not move the flows'.
    let mut faults = SplitMix64::new(mix64(seed ^ 0x7A11_0F7E_C0DE_0001));
    for tick in 0..spec.ticks {
        let tick_scale = if spec.tick_jitter > 0.0 {
            faults.range(1.0 - spec.tick_jitter, 1.0 + spec.tick_jitter)
        } else {
            1.0
        };
        let missing = spec.missing_ticks > 0.0 && faults.uniform() < spec.missing_ticks;
        for f in flows.iter_mut() {
            let row = f.step(tick, tick_scale, spec.sample_jitter);
            if missing {
                continue;
            }
            if let Some(features) = row {
                rows.push(LabelledRow {
                    row: TraceRow {
                        flow_id: f.id,
                        tick,
                        features,
                    },
                    class: f.class,
                });
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    /// Sum of every `bw_bps` of `uniform_family_is_the_default_and_keeps_its_traces`' trace.
    const FINGERPRINT_BW_SUM: f64 = 24_260_818_400.0;

    #[test]
    fn generator_is_reproducible_for_a_seed_and_differs_across_seeds() {
        let spec = GenSpec {
            flows: 200,
            ticks: 100,
            ..GenSpec::default()
        };
        let a = generate(&spec, 42);
        assert_eq!(a, generate(&spec, 42));
        assert_ne!(a, generate(&spec, 43));
        // Rows are in tick order and each live flow has one row per tick.
        assert!(a.windows(2).all(|w| w[0].row.tick <= w[1].row.tick));
        assert!(a.iter().all(|r| r.row.features.is_valid()));
        // The class counts follow the mix exactly (largest remainder).
        let counts = spec.counts();
        assert_eq!(counts, [60, 30, 40, 30, 40]);
        let mut per_class = [0usize; 5];
        let mut seen = HashSet::new();
        for r in &a {
            if seen.insert(r.row.flow_id) {
                per_class[r.class.index()] += 1;
            }
        }
        assert_eq!(per_class, counts);
    }

    #[test]
    fn rate_distribution_is_the_same_for_every_class() {
        // The drawn mean rates' median per class is near the spec's median whatever the
        // class: bandwidth alone does not give the class away.
        let spec = GenSpec {
            flows: 2_500,
            ticks: 1,
            mix: [1.0; 5],
            ..GenSpec::default()
        };
        let mut rates: [Vec<f64>; 5] = Default::default();
        for (i, c) in FlowClass::ALL.iter().cycle().take(spec.flows).enumerate() {
            let f = FlowGen::new(i as FlowId, *c, &spec, 3);
            rates[c.index()].push(f.rate_bps);
        }
        for (c, r) in FlowClass::ALL.iter().zip(rates.iter_mut()) {
            r.sort_by(f64::total_cmp);
            let median = r[r.len() / 2];
            assert!(
                (median / spec.rate_median_bps).ln().abs() < 0.25,
                "{c}: median {median}"
            );
        }
    }

    #[test]
    fn each_class_carries_its_drawn_mean_rate() {
        let spec = GenSpec {
            flows: 1_000,
            ticks: 600,
            ..GenSpec::default()
        };
        let seed = 11;
        let counts = spec.counts();
        let mut classes: Vec<FlowClass> = Vec::new();
        for (c, n) in FlowClass::ALL.iter().zip(counts) {
            classes.extend(core::iter::repeat_n(*c, n));
        }
        // Per class: the mean over flows of (empirical mean rate while alive / drawn rate).
        for (i, class) in FlowClass::ALL.iter().enumerate() {
            let mut ratio_sum = 0.0;
            let mut flows = 0.0;
            for (id, _) in classes.iter().enumerate().filter(|(_, c)| *c == class) {
                let mut f = FlowGen::new(id as FlowId, *class, &spec, seed);
                let drawn = f.rate_bps;
                let (mut sum, mut n) = (0.0, 0.0);
                for t in 0..spec.ticks {
                    if let Some(x) = f.step(t, 1.0, 0.0) {
                        sum += x.bw_bps;
                        n += 1.0;
                    }
                }
                ratio_sum += sum / n / drawn;
                flows += 1.0;
            }
            let ratio = ratio_sum / flows;
            // Random walks and on/off flows average fewer independent samples per flow.
            let tol = [0.02, 0.03, 0.10, 0.15, 0.05][i];
            assert!(
                (ratio - 1.0).abs() < tol,
                "{class}: empirical / drawn mean rate {ratio:.3} over {flows} flows"
            );
        }
    }

    #[test]
    fn mice_are_short_with_control_heavy_edges_and_bursty_flows_go_silent() {
        let spec = GenSpec {
            flows: 300,
            ticks: 300,
            ..GenSpec::default()
        };
        let rows = generate(&spec, 5);
        let mut life: HashMap<FlowId, (u64, u64, Vec<f64>)> = HashMap::new();
        let mut silent_bursty = 0;
        for r in &rows {
            match r.class {
                FlowClass::Mice => {
                    let e = life
                        .entry(r.row.flow_id)
                        .or_insert((u64::MAX, 0, Vec::new()));
                    e.0 = e.0.min(r.row.tick);
                    e.1 = e.1.max(r.row.tick);
                    e.2.push(r.row.features.ctrl_ratio);
                }
                FlowClass::Bursty if r.row.features.bw_bps == 0.0 => silent_bursty += 1,
                _ => {}
            }
        }
        assert_eq!(life.len(), spec.counts()[4]);
        for (first, last, ctrl) in life.values() {
            let n = last - first + 1;
            assert!((2..=15).contains(&n), "life {n}");
            assert_eq!(ctrl.len() as u64, n, "one row per live tick");
            let edge = ctrl[0].min(ctrl[ctrl.len() - 1]);
            assert!(edge >= 0.15, "edge control ratio {edge}");
        }
        assert!(
            silent_bursty > 0,
            "bursty flows have off ticks with zero rows"
        );
    }

    #[test]
    fn uniform_family_is_the_default_and_keeps_its_traces() {
        assert_eq!(GenSpec::default(), GenSpec::family(Family::Uniform));
        // A fingerprint of seed 1's first rows, as generated before the families existed.
        let spec = GenSpec {
            flows: 50,
            ticks: 30,
            ..GenSpec::default()
        };
        let rows = generate(&spec, 1);
        let sum: f64 = rows.iter().map(|r| r.row.features.bw_bps).sum();
        assert_eq!(rows.len(), 1_276);
        assert_eq!(sum, FINGERPRINT_BW_SUM);
    }

    #[test]
    fn families_differ_in_sizes_mix_and_faults() {
        for f in Family::ALL {
            assert_eq!(f.name().parse::<Family>(), Ok(f));
            let spec = GenSpec {
                flows: 400,
                ticks: 300,
                ..GenSpec::family(f)
            };
            let a = generate(&spec, 9);
            assert_eq!(a, generate(&spec, 9), "{f}: reproducible");
            assert!(a.iter().all(|r| r.row.features.is_valid()), "{f}");
            let ticks: HashSet<u64> = a.iter().map(|r| r.row.tick).collect();
            let missing = spec.ticks as usize - ticks.len();
            // Elephants: every stable flow carries tens of Mbit/s even at its trough (a 200 Mbit/s
            // periodic flow at 0.4 of its mean, with a short tick), and some random walk
            // passes 5 Gbit/s; pareto: ticks are missing.
            let stable_min = a
                .iter()
                .filter(|r| r.class.is_stable())
                .map(|r| r.row.features.bw_bps)
                .fold(f64::INFINITY, f64::min);
            let walk_max = a
                .iter()
                .filter(|r| r.class == FlowClass::RandomWalk)
                .map(|r| r.row.features.bw_bps)
                .fold(0.0, f64::max);
            match f {
                Family::Uniform => {
                    assert_eq!(missing, 0);
                    assert!(stable_min < 1e6, "{f}: small stable flows {stable_min}");
                }
                Family::Elephants => {
                    assert_eq!(missing, 0);
                    assert!(stable_min > 50e6, "{f}: stable minimum {stable_min}");
                    assert!(walk_max > 5e9, "{f}: random-walk maximum {walk_max}");
                }
                Family::Pareto => {
                    // 1 % of 300 ticks: a few, not none.
                    assert!((1..=10).contains(&missing), "{f}: {missing} ticks missing");
                }
            }
        }
        assert!("gaussian".parse::<Family>().is_err());
    }

    #[test]
    fn gap_std_matches_a_direct_computation() {
        assert_eq!(gap_std(1.0, 10.0, 0.0, &[]), 0.0);
        assert!((gap_std(10.0, 10.0, 0.2, &[]) - 2.0).abs() < 1e-9);
        // Nine gaps of 10 and one of 110: mean 20, variance (9·100 + 8100)/10 = 900.
        assert!((gap_std(9.0, 10.0, 0.0, &[110.0]) - 30.0).abs() < 1e-9);
    }
}
