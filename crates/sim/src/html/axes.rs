//! The axes of the plots: linear axes whose ends and ticks are round numbers, and log axes
//! of whole decades. An axis maps a value to a fraction of the plot (`frac`) and lists its
//! ticks with their labels; every loop here is bounded whatever the data (`TICKS_MAX`,
//! `LOG_EXP_MIN`..`LOG_EXP_MAX`), and a value an axis cannot place is `None`, a gap.

use super::text::fmt_tick;

/// How far (as a fraction of the plot) a mapped value may lie outside the plot area. Values are
/// clipped there anyway; the clamp only keeps coordinates short when a log axis meets an extreme.
pub(super) const FRAC_SLACK: f64 = 0.1;

/// Target number of intervals between ticks on a linear axis.
pub(super) const TICKS_TARGET: f64 = 5.0;

/// At most this many ticks on any axis, whatever the data.
pub(super) const TICKS_MAX: usize = 64;

/// Decades a log axis may span, so the tick loop is bounded for any finite input.
pub(super) const LOG_EXP_MIN: i32 = -9;
pub(super) const LOG_EXP_MAX: i32 = 12;

/// A linear axis whose ends and ticks are round numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct LinearAxis {
    lo: f64,
    hi: f64,
    step: f64,
    decimals: usize,
}

impl LinearAxis {
    /// An axis covering `lo..hi`, widened to multiples of a 1-2-5 step of at least `step_min`.
    pub(super) fn new(lo: f64, hi: f64, step_min: f64) -> Self {
        let (lo, hi) = if lo.is_finite() && hi.is_finite() && (hi - lo).is_finite() {
            if hi > lo { (lo, hi) } else { (lo, lo + 1.0) }
        } else {
            (0.0, 1.0)
        };
        let step = nice_step((hi - lo) / TICKS_TARGET).max(step_min);
        let (lo_round, hi_round) = ((lo / step).floor() * step, (hi / step).ceil() * step);
        if !(step.is_finite() && step > 0.0 && hi_round > lo_round && hi_round.is_finite()) {
            // Only reachable for spans near the limits of f64; two ticks at the ends will do.
            return Self {
                lo,
                hi,
                step: hi - lo,
                decimals: 3,
            };
        }
        let decimals = if step >= 1.0 {
            0
        } else {
            (-step.log10().floor()).clamp(0.0, 9.0) as usize
        };
        Self {
            lo: lo_round,
            hi: hi_round,
            step,
            decimals,
        }
    }

    /// Where `v` lies between the ends, 0 at `lo` and 1 at `hi`.
    pub(super) fn frac(&self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        let f = (v - self.lo) / (self.hi - self.lo);
        f.is_finite()
            .then(|| f.clamp(-FRAC_SLACK, 1.0 + FRAC_SLACK))
    }

    /// Tick values from `lo` to `hi`.
    pub(super) fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round();
        let n = if n.is_finite() && n >= 1.0 {
            (n as usize).min(TICKS_MAX)
        } else {
            1
        };
        (0..=n).map(|k| self.lo + k as f64 * self.step).collect()
    }

    pub(super) fn label(&self, v: f64) -> String {
        fmt_tick(v, self.decimals)
    }
}

/// A base-10 log axis from `10^lo_exp` to `10^hi_exp`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct LogAxis {
    lo_exp: i32,
    hi_exp: i32,
}

impl LogAxis {
    /// Whole decades covering the positive, finite range `min..=max`.
    pub(super) fn new(min: f64, max: f64) -> Self {
        if !(min > 0.0 && max >= min && max.is_finite()) {
            return Self {
                lo_exp: 0,
                hi_exp: 1,
            };
        }
        let lo_exp = (min.log10().floor() as i32).clamp(LOG_EXP_MIN, LOG_EXP_MAX - 1);
        let hi_exp = (max.log10().ceil() as i32).clamp(lo_exp + 1, LOG_EXP_MAX);
        Self { lo_exp, hi_exp }
    }

    pub(super) fn frac(&self, v: f64) -> Option<f64> {
        if !(v > 0.0 && v.is_finite()) {
            return None;
        }
        let f = (v.log10() - f64::from(self.lo_exp)) / f64::from(self.hi_exp - self.lo_exp);
        f.is_finite()
            .then(|| f.clamp(-FRAC_SLACK, 1.0 + FRAC_SLACK))
    }
}

/// A plot's y axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum YAxis {
    Linear(LinearAxis),
    Log(LogAxis),
}

impl YAxis {
    pub(super) fn frac(&self, v: f64) -> Option<f64> {
        match self {
            YAxis::Linear(axis) => axis.frac(v),
            YAxis::Log(axis) => axis.frac(v),
        }
    }

    /// Major ticks as (fraction along the axis, label), and minor gridlines as fractions.
    pub(super) fn ticks(&self) -> (Vec<(f64, String)>, Vec<f64>) {
        match self {
            YAxis::Linear(axis) => {
                let major = axis
                    .ticks()
                    .into_iter()
                    .filter_map(|v| axis.frac(v).map(|f| (f, axis.label(v))))
                    .collect();
                (major, Vec::new())
            }
            YAxis::Log(axis) => {
                let span = f64::from(axis.hi_exp - axis.lo_exp);
                let major = (axis.lo_exp..=axis.hi_exp)
                    .map(|k| {
                        let decimals = usize::try_from(-k).unwrap_or(0);
                        let label = fmt_tick(10f64.powi(k), decimals);
                        (f64::from(k - axis.lo_exp) / span, label)
                    })
                    .collect();
                // Minor gridlines at 2..9 times each decade, only while they stay readable.
                let minor = if span <= 4.0 {
                    (axis.lo_exp..axis.hi_exp)
                        .flat_map(|k| {
                            (2..10).map(move |m| {
                                (f64::from(k - axis.lo_exp) + f64::from(m).log10()) / span
                            })
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                (major, minor)
            }
        }
    }
}

/// The 1-2-5 number nearest above `raw`, e.g. 0.3 -> 0.5, 7 -> 10.
pub(super) fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let base = 10f64.powf(raw.log10().floor());
    let f = raw / base;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * base
}

/// Smallest and largest of finite values; `(0, 0)` when there are none.
pub(super) fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo <= hi { (lo, hi) } else { (0.0, 0.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_axis_ticks_are_round() {
        let axis = LinearAxis::new(0.0, 9.3, 0.0);
        assert_eq!(axis.ticks(), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let axis = LinearAxis::new(0.0, 1.0, 0.0);
        let labels: Vec<String> = axis.ticks().iter().map(|v| axis.label(*v)).collect();
        assert_eq!(labels, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        let axis = LinearAxis::new(0.0, 2.0, 1.0);
        assert_eq!(axis.ticks(), vec![0.0, 1.0, 2.0]);
        assert_eq!(fmt_tick(-0.0001, 2), "0.00");
    }

    #[test]
    fn log_axis_covers_whole_decades() {
        assert_eq!(
            LogAxis::new(3.0, 250.0),
            LogAxis {
                lo_exp: 0,
                hi_exp: 3
            }
        );
        assert_eq!(
            LogAxis::new(10.0, 10.0),
            LogAxis {
                lo_exp: 1,
                hi_exp: 2
            }
        );
        let (major, _) = YAxis::Log(LogAxis {
            lo_exp: -1,
            hi_exp: 1,
        })
        .ticks();
        let labels: Vec<&str> = major.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["0.1", "1", "10"]);
    }
}
