//! The HTML report: one self-contained page (inline CSS and inline SVG, no JavaScript, no
//! external resources) for one or more simulator runs, typically a `spillway` run followed by its
//! `dpu-only` baseline on the same scenario and seed.
//!
//! For each run, in the order given, the page shows:
//! - a header (scenario, seed, baseline, placement, measure window) under a banner saying that
//!   these numbers are a model result of the simulator, not a measurement;
//! - a summary table of the scalar fields of [`RunReport`] and a table of drops by reason;
//! - five plots over virtual time `t_s`: throughput (offered, DPU, host), loss, latency (p50 and
//!   p99 on a log scale), utilisation (hardware table, fast path, SoC) and spill-plane workers
//!   (a step line). Behind every plot the lifecycle phases are shaded as bands, one light colour
//!   per phase, taken from contiguous runs of the same [`Sample::phase`]; `idle` has no band;
//! - the lifecycle events (time, phase, reason) and, folded away, the counters.
//!
//! Every plot of a kind uses the same axes for all runs on the page, so a run and its baseline can
//! be compared by eye. The page is a pure function of the reports: no clock, no randomness, floats
//! in fixed precision, maps in key order. Non-finite values are skipped (a gap in the line, no
//! effect on the axes), never plotted and never a panic.

use crate::report::{RunReport, Sample};
use std::fmt::{self, Write};

/// Renders a self-contained HTML page (inline CSS, inline SVG, no JavaScript required, no
/// external resources) for one or more runs.
///
/// The runs are shown one after another in the order given, with shared axes per plot kind.
/// An empty slice renders a page that says there is nothing to show.
#[must_use]
pub fn render_html(runs: &[&RunReport]) -> String {
    let mut out = String::new();
    write_page(&mut out, runs).expect("writing to a String cannot fail");
    out
}

/// The one label every run carries, so no figure is mistaken for a benchmark.
const MODEL_LABEL: &str = "Model result (simulator), not a measurement";

// Plot geometry, in SVG user units (pixels at 100% zoom).
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 230.0;
const LEFT: f64 = 66.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 42.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;

/// How far (as a fraction of the plot) a mapped value may lie outside the plot area. Values are
/// clipped there anyway; the clamp only keeps coordinates short when a log axis meets an extreme.
const FRAC_SLACK: f64 = 0.1;

/// Target number of intervals between ticks on a linear axis.
const TICKS_TARGET: f64 = 5.0;

/// At most this many ticks on any axis, whatever the data.
const TICKS_MAX: usize = 64;

/// Decades a log axis may span, so the tick loop is bounded for any finite input.
const LOG_EXP_MIN: i32 = -9;
const LOG_EXP_MAX: i32 = 12;

/// The lifecycle phases that get a band, in lifecycle order (the order of the band legend).
const BANDED_PHASES: [&str; 5] = ["preparing", "shadow", "activating", "active", "draining"];

/// Band colour for a lifecycle phase; `None` for `idle`, which is drawn without a band. A phase
/// this page does not know still gets a (grey) band so that it is visible.
fn phase_colour(phase: &str) -> Option<&'static str> {
    match phase {
        "idle" => None,
        "preparing" => Some("#fff1b8"),
        "shadow" => Some("#e8def8"),
        "activating" => Some("#ffdcbc"),
        "active" => Some("#d3f1d3"),
        "draining" => Some("#d3e5fa"),
        _ => Some("#e3e3e3"),
    }
}

/// How a plot's y axis is chosen from the data.
#[derive(Clone, Copy, Debug)]
enum ScaleKind {
    /// Linear from `min(0, data)` to the data's maximum.
    Linear,
    /// Linear, at least `0..1`.
    Fraction,
    /// Linear, at least `0..1`, ticks on whole numbers.
    Count,
    /// Decades covering the positive data; non-positive values are gaps.
    Log,
}

/// One line of a plot.
#[derive(Clone, Copy, Debug)]
struct LineSpec {
    name: &'static str,
    colour: &'static str,
    value: fn(&Sample) -> f64,
    /// A step line: each sample's value holds over the interval that ends at its `t_s`.
    step: bool,
    dashed: bool,
}

/// One plot: what it shows and how its y axis is chosen.
#[derive(Clone, Copy, Debug)]
struct PlotSpec {
    slug: &'static str,
    title: &'static str,
    y_title: &'static str,
    scale: ScaleKind,
    lines: &'static [LineSpec],
}

const PLOTS: [PlotSpec; 5] = [
    PlotSpec {
        slug: "throughput",
        title: "Throughput",
        y_title: "Mpps",
        scale: ScaleKind::Linear,
        lines: &[
            LineSpec {
                name: "offered",
                colour: "#555555",
                value: |s| s.offered_mpps,
                step: false,
                dashed: true,
            },
            LineSpec {
                name: "dpu",
                colour: "#1f77b4",
                value: |s| s.dpu_mpps,
                step: false,
                dashed: false,
            },
            LineSpec {
                name: "host",
                colour: "#d62728",
                value: |s| s.host_mpps,
                step: false,
                dashed: false,
            },
        ],
    },
    PlotSpec {
        slug: "lost",
        title: "Lost packets (all drops except policy)",
        y_title: "Mpps",
        scale: ScaleKind::Linear,
        lines: &[LineSpec {
            name: "lost",
            colour: "#b22222",
            value: |s| s.lost_mpps,
            step: false,
            dashed: false,
        }],
    },
    PlotSpec {
        slug: "latency",
        title: "Latency of delivered packets (log scale)",
        y_title: "\u{b5}s",
        scale: ScaleKind::Log,
        lines: &[
            LineSpec {
                name: "p50",
                colour: "#1f77b4",
                value: |s| s.p50_us,
                step: false,
                dashed: false,
            },
            LineSpec {
                name: "p99",
                colour: "#ff7f0e",
                value: |s| s.p99_us,
                step: false,
                dashed: false,
            },
        ],
    },
    PlotSpec {
        slug: "util",
        title: "Utilisation",
        y_title: "fraction",
        scale: ScaleKind::Fraction,
        lines: &[
            LineSpec {
                name: "hw_table_util",
                colour: "#2ca02c",
                value: |s| s.hw_table_util,
                step: false,
                dashed: false,
            },
            LineSpec {
                name: "hw_util",
                colour: "#1f77b4",
                value: |s| s.hw_util,
                step: false,
                dashed: false,
            },
            LineSpec {
                name: "soc_util",
                colour: "#9467bd",
                value: |s| s.soc_util,
                step: false,
                dashed: false,
            },
        ],
    },
    PlotSpec {
        slug: "workers",
        title: "Spill-plane workers",
        y_title: "workers",
        scale: ScaleKind::Count,
        lines: &[LineSpec {
            name: "workers",
            colour: "#8c564b",
            value: |s| f64::from(s.workers),
            step: true,
            dashed: false,
        }],
    },
];

/// A linear axis whose ends and ticks are round numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LinearAxis {
    lo: f64,
    hi: f64,
    step: f64,
    decimals: usize,
}

impl LinearAxis {
    /// An axis covering `lo..hi`, widened to multiples of a 1-2-5 step of at least `step_min`.
    fn new(lo: f64, hi: f64, step_min: f64) -> Self {
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
    fn frac(&self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        let f = (v - self.lo) / (self.hi - self.lo);
        f.is_finite()
            .then(|| f.clamp(-FRAC_SLACK, 1.0 + FRAC_SLACK))
    }

    /// Tick values from `lo` to `hi`.
    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round();
        let n = if n.is_finite() && n >= 1.0 {
            (n as usize).min(TICKS_MAX)
        } else {
            1
        };
        (0..=n).map(|k| self.lo + k as f64 * self.step).collect()
    }

    fn label(&self, v: f64) -> String {
        fmt_tick(v, self.decimals)
    }
}

/// A base-10 log axis from `10^lo_exp` to `10^hi_exp`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LogAxis {
    lo_exp: i32,
    hi_exp: i32,
}

impl LogAxis {
    /// Whole decades covering the positive, finite range `min..=max`.
    fn new(min: f64, max: f64) -> Self {
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

    fn frac(&self, v: f64) -> Option<f64> {
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
enum YAxis {
    Linear(LinearAxis),
    Log(LogAxis),
}

impl YAxis {
    fn frac(&self, v: f64) -> Option<f64> {
        match self {
            YAxis::Linear(axis) => axis.frac(v),
            YAxis::Log(axis) => axis.frac(v),
        }
    }

    /// Major ticks as (fraction along the axis, label), and minor gridlines as fractions.
    fn ticks(&self) -> (Vec<(f64, String)>, Vec<f64>) {
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
fn nice_step(raw: f64) -> f64 {
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

/// A tick label in fixed precision, never "-0".
fn fmt_tick(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => s,
    }
}

/// A summary value in fixed precision, or "n/a" when it is not a number.
fn fmt_f(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        fmt_tick(v, decimals)
    } else {
        "n/a".to_string()
    }
}

/// An optional summary value; `None` is shown as "n/a".
fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| fmt_f(v, decimals))
}

/// Escapes text for HTML element content and double- or single-quoted attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A phase name reduced to the characters safe in a CSS class name.
fn class_slug(phase: &str) -> String {
    phase
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The samples that can be placed in time: finite `t_s`, in the order reported.
fn timed(run: &RunReport) -> Vec<&Sample> {
    run.series.iter().filter(|s| s.t_s.is_finite()).collect()
}

/// The time axis shared by all runs: from `min(0, first t_s)` to the last `t_s`.
fn x_axis(runs: &[&RunReport]) -> LinearAxis {
    let (lo, hi) = min_max(runs.iter().flat_map(|r| timed(r)).map(|s| s.t_s));
    LinearAxis::new(lo.min(0.0), hi, 0.0)
}

/// A plot's y axis, shared by all runs.
fn y_axis(spec: &PlotSpec, runs: &[&RunReport]) -> YAxis {
    let values = || {
        runs.iter()
            .flat_map(|r| timed(r))
            .flat_map(|s| spec.lines.iter().map(move |l| (l.value)(s)))
            .filter(|v| v.is_finite())
    };
    match spec.scale {
        ScaleKind::Linear => {
            let (lo, hi) = min_max(values());
            YAxis::Linear(LinearAxis::new(lo.min(0.0), hi.max(0.0), 0.0))
        }
        ScaleKind::Fraction => {
            let (lo, hi) = min_max(values());
            YAxis::Linear(LinearAxis::new(lo.min(0.0), hi.max(1.0), 0.0))
        }
        ScaleKind::Count => {
            let (lo, hi) = min_max(values());
            YAxis::Linear(LinearAxis::new(lo.min(0.0), hi.max(1.0), 1.0))
        }
        ScaleKind::Log => {
            let positive = || values().filter(|v| *v > 0.0);
            let (lo, hi) = min_max(positive());
            YAxis::Log(LogAxis::new(lo, hi))
        }
    }
}

/// Smallest and largest of finite values; `(0, 0)` when there are none.
fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo <= hi { (lo, hi) } else { (0.0, 0.0) }
}

/// A shaded stretch of time in one lifecycle phase.
#[derive(Clone, Debug, PartialEq)]
struct Band {
    phase: &'static str,
    from_s: f64,
    to_s: f64,
}

/// Bands from contiguous runs of the same `Sample::phase`. A sample's phase holds over its
/// interval, which ends at its `t_s` and starts at the previous sample's `t_s` (for the first
/// sample, one interval earlier, as far as the next sample suggests). `idle` has no band.
fn phase_bands(samples: &[&Sample]) -> Vec<Band> {
    let mut bands = Vec::new();
    let mut i = 0;
    while i < samples.len() {
        let phase = samples[i].phase;
        let mut j = i;
        while j + 1 < samples.len() && samples[j + 1].phase == phase {
            j += 1;
        }
        let from_s = if i > 0 {
            samples[i - 1].t_s
        } else if let Some(next) = samples.get(1) {
            samples[0].t_s - (next.t_s - samples[0].t_s).max(0.0)
        } else {
            samples[0].t_s
        };
        let to_s = samples[j].t_s;
        if phase_colour(phase).is_some() && to_s > from_s {
            bands.push(Band {
                phase,
                from_s,
                to_s,
            });
        }
        i = j + 1;
    }
    bands
}

/// The banded phases to list in a run's legend: the known ones in lifecycle order, then any
/// others the run shows, in order of first appearance.
fn legend_phases(samples: &[&Sample]) -> Vec<&'static str> {
    let mut phases: Vec<&'static str> = BANDED_PHASES.to_vec();
    for s in samples {
        if phase_colour(s.phase).is_some() && !phases.contains(&s.phase) {
            phases.push(s.phase);
        }
    }
    phases
}

const CSS: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#222;\
margin:0 auto;max-width:820px;padding:16px 20px 48px;line-height:1.4}
h1{font-size:1.5em;margin:.4em 0}
h2{font-size:1.25em;margin:1.6em 0 .4em;padding-top:.6em;border-top:2px solid #ccc}
h3{font-size:1.05em;margin:1.2em 0 .4em}
.model{display:inline-block;background:#fff4d6;border:2px solid #d9a300;color:#6b4e00;\
font-weight:700;padding:6px 12px;border-radius:4px;margin:.4em 0}
table{border-collapse:collapse;margin:.4em 0;font-size:.92em}
th,td{border:1px solid #d0d0d0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:.92em;color:#555}
.meta td:first-child{font-weight:600}
.legend{font-size:.9em;margin:.4em 0}
.swatch{display:inline-block;width:14px;height:10px;border:1px solid #999;\
margin:0 4px 0 10px;vertical-align:baseline}
figure{margin:.6em 0}
svg text{font-family:inherit;font-size:11px;fill:#333}
svg text.title{font-size:13px;font-weight:700}
svg text.axis-title{font-size:11px;fill:#555}
svg text.empty{font-size:13px;fill:#888}
svg .grid{stroke:#e2e2e2;stroke-width:1}
svg .grid.minor{stroke:#f0f0f0}
svg .frame{fill:none;stroke:#888;stroke-width:1}
svg .tick{stroke:#888;stroke-width:1}
svg .series{fill:none;stroke-width:1.8;stroke-linejoin:round;stroke-linecap:round}
.note{color:#666;font-size:.88em}
";

fn write_page(out: &mut String, runs: &[&RunReport]) -> fmt::Result {
    let names: Vec<String> = runs
        .iter()
        .map(|r| format!("{} ({}, seed {})", r.scenario, run_label(r), r.seed))
        .collect();
    let title = if names.is_empty() {
        "Spillway simulator report".to_string()
    } else {
        format!("Spillway simulator report: {}", names.join(" vs "))
    };
    writeln!(out, "<!DOCTYPE html>")?;
    writeln!(out, "<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">")?;
    writeln!(
        out,
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
    )?;
    writeln!(out, "<title>{}</title>", escape(&title))?;
    writeln!(out, "<style>\n{CSS}</style>\n</head>\n<body>")?;
    writeln!(out, "<h1>Spillway simulator report</h1>")?;
    writeln!(out, "<p class=\"model\">{}</p>", escape(MODEL_LABEL))?;
    if runs.is_empty() {
        writeln!(out, "<p>No runs to show.</p>")?;
    } else {
        writeln!(
            out,
            "<p>Runs on this page (plots of a kind share their axes):</p>\n<ul>"
        )?;
        for (i, name) in names.iter().enumerate() {
            writeln!(out, "<li><a href=\"#run-{i}\">{}</a></li>", escape(name))?;
        }
        writeln!(out, "</ul>")?;
        let x = x_axis(runs);
        let ys: Vec<YAxis> = PLOTS.iter().map(|spec| y_axis(spec, runs)).collect();
        for (i, run) in runs.iter().enumerate() {
            write_run(out, i, run, &x, &ys)?;
        }
    }
    writeln!(out, "</body>\n</html>")
}

/// The baseline, and for a Spillway run its placement policy (a placement comparison puts one
/// run per policy on a page).
fn run_label(r: &RunReport) -> String {
    if r.baseline == "spillway" {
        format!("spillway, placement {}", r.placement)
    } else {
        r.baseline.to_string()
    }
}

fn write_run(
    out: &mut String,
    index: usize,
    run: &RunReport,
    x: &LinearAxis,
    ys: &[YAxis],
) -> fmt::Result {
    writeln!(
        out,
        "<section id=\"run-{index}\">\n<h2>{} &mdash; {}</h2>",
        escape(&run.scenario),
        escape(&run_label(run))
    )?;
    writeln!(out, "<p class=\"model\">{}</p>", escape(MODEL_LABEL))?;
    writeln!(out, "<table class=\"meta\">")?;
    let meta = [
        ("scenario", escape(&run.scenario)),
        ("seed", run.seed.to_string()),
        ("baseline", escape(run.baseline)),
        ("placement", escape(run.placement)),
        ("kind", escape(run.kind)),
        (
            "measure window",
            format!(
                "{} s to {} s",
                fmt_f(run.measure_s[0], 3),
                fmt_f(run.measure_s[1], 3)
            ),
        ),
    ];
    for (name, value) in meta {
        writeln!(out, "<tr><td>{name}</td><td>{value}</td></tr>")?;
    }
    writeln!(out, "</table>")?;

    write_summary(out, run)?;
    write_drops(out, run)?;

    let samples = timed(run);
    let bands = phase_bands(&samples);
    writeln!(out, "<h3>Time series</h3>")?;
    write!(out, "<p class=\"legend\">Phase bands:")?;
    for phase in legend_phases(&samples) {
        let colour = phase_colour(phase).expect("legend lists banded phases only");
        write!(
            out,
            "<span class=\"swatch\" style=\"background:{colour}\"></span>{}",
            escape(phase)
        )?;
    }
    writeln!(out, " <span class=\"note\">(idle: no band)</span></p>")?;
    if samples.is_empty() {
        writeln!(out, "<p class=\"note\">This run reported no samples.</p>")?;
    }
    for (spec, y) in PLOTS.iter().zip(ys) {
        let id = format!("run{index}-{}", spec.slug);
        write_plot(out, &id, spec, x, y, &samples, &bands)?;
    }

    write_phase_events(out, run)?;
    write_counters(out, run)?;
    writeln!(out, "</section>")
}

fn write_summary(out: &mut String, run: &RunReport) -> fmt::Result {
    let rows: [(&str, &str, String); 19] = [
        (
            "offered",
            "offered_mpps",
            format!("{} Mpps", fmt_f(run.offered_mpps, 3)),
        ),
        (
            "delivered",
            "delivered_mpps",
            format!("{} Mpps", fmt_f(run.delivered_mpps, 3)),
        ),
        (
            "delivered by the DPU",
            "dpu_mpps",
            format!("{} Mpps", fmt_f(run.dpu_mpps, 3)),
        ),
        (
            "delivered by the host",
            "host_mpps",
            format!("{} Mpps", fmt_f(run.host_mpps, 3)),
        ),
        (
            "connections completed",
            "cps",
            format!("{} /s", fmt_f(run.cps, 0)),
        ),
        (
            "packets offered",
            "offered_packets",
            run.offered_packets.to_string(),
        ),
        (
            "packets delivered",
            "delivered_packets",
            run.delivered_packets.to_string(),
        ),
        ("packets lost", "lost_packets", run.lost_packets.to_string()),
        (
            "activation",
            "activation_ms",
            format!("{} ms", fmt_opt(run.activation_ms, 3)),
        ),
        (
            "rule injection",
            "rule_injection_ms",
            format!("{} ms", fmt_opt(run.rule_injection_ms, 3)),
        ),
        (
            "release",
            "release_ms",
            format!("{} ms", fmt_opt(run.release_ms, 3)),
        ),
        (
            "latency p50",
            "latency_us.p50",
            format!("{} \u{b5}s", fmt_f(run.latency_us.p50, 2)),
        ),
        (
            "latency p99",
            "latency_us.p99",
            format!("{} \u{b5}s", fmt_f(run.latency_us.p99, 2)),
        ),
        (
            "offload ratio",
            "offload_ratio",
            fmt_f(run.offload_ratio, 4),
        ),
        (
            "PCIe crossings per packet",
            "pcie_crossings_per_packet",
            fmt_f(run.pcie_crossings_per_packet, 3),
        ),
        ("lifecycle events", "phases", run.phases.len().to_string()),
        ("samples", "series", run.series.len().to_string()),
        ("invariant checks", "checks", run.checks.to_string()),
        ("events processed", "events", run.events.to_string()),
    ];
    writeln!(out, "<h3>Summary</h3>")?;
    writeln!(
        out,
        "<p class=\"note\">Rates are averaged over the measure window; packet counts, latency \
         and ratios cover the whole run.</p>"
    )?;
    writeln!(out, "<table class=\"summary\">")?;
    writeln!(
        out,
        "<tr><th>quantity</th><th>field</th><th>value</th></tr>"
    )?;
    for (name, field, value) in rows {
        writeln!(
            out,
            "<tr><td>{name}</td><td><code>{field}</code></td><td class=\"num\">{value}</td></tr>"
        )?;
    }
    writeln!(out, "</table>")
}

fn write_drops(out: &mut String, run: &RunReport) -> fmt::Result {
    writeln!(out, "<h3>Drops by reason</h3>")?;
    writeln!(out, "<table class=\"drops\">")?;
    writeln!(out, "<tr><th>reason</th><th>packets</th></tr>")?;
    if run.drops.is_empty() {
        writeln!(out, "<tr><td colspan=\"2\">none</td></tr>")?;
    }
    let mut total: u64 = 0;
    for (reason, count) in &run.drops {
        total = total.saturating_add(*count);
        writeln!(
            out,
            "<tr><td><code>{}</code></td><td class=\"num\">{count}</td></tr>",
            escape(reason)
        )?;
    }
    if run.drops.len() > 1 {
        writeln!(out, "<tr><th>total</th><td class=\"num\">{total}</td></tr>")?;
    }
    writeln!(out, "</table>")
}

fn write_phase_events(out: &mut String, run: &RunReport) -> fmt::Result {
    writeln!(out, "<h3>Lifecycle events</h3>")?;
    if run.phases.is_empty() {
        return writeln!(out, "<p class=\"note\">No lifecycle events.</p>");
    }
    writeln!(out, "<table class=\"phases\">")?;
    writeln!(out, "<tr><th>t (s)</th><th>phase</th><th>reason</th></tr>")?;
    for event in &run.phases {
        let swatch = phase_colour(event.phase).map_or_else(String::new, |colour| {
            format!("<span class=\"swatch\" style=\"background:{colour};margin-left:0\"></span>")
        });
        writeln!(
            out,
            "<tr><td class=\"num\">{}</td><td>{swatch}{}</td><td>{}</td></tr>",
            fmt_f(event.t_s, 3),
            escape(event.phase),
            escape(&event.reason)
        )?;
    }
    writeln!(out, "</table>")
}

fn write_counters(out: &mut String, run: &RunReport) -> fmt::Result {
    writeln!(
        out,
        "<details>\n<summary>Counters ({})</summary>",
        run.counters.len()
    )?;
    writeln!(out, "<table class=\"counters\">")?;
    writeln!(out, "<tr><th>counter</th><th>value</th></tr>")?;
    for (name, value) in &run.counters {
        writeln!(
            out,
            "<tr><td><code>{}</code></td><td class=\"num\">{value}</td></tr>",
            escape(name)
        )?;
    }
    writeln!(out, "</table>\n</details>")
}

/// Horizontal pixel of a fraction along the x axis.
fn px(frac: f64) -> f64 {
    LEFT + frac * PLOT_W
}

/// Vertical pixel of a fraction along the y axis (0 at the bottom).
fn py(frac: f64) -> f64 {
    TOP + (1.0 - frac) * PLOT_H
}

fn write_plot(
    out: &mut String,
    id: &str,
    spec: &PlotSpec,
    x: &LinearAxis,
    y: &YAxis,
    samples: &[&Sample],
    bands: &[Band],
) -> fmt::Result {
    let title = escape(spec.title);
    writeln!(out, "<figure>")?;
    writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"{id}\" width=\"{WIDTH:.0}\" \
         height=\"{HEIGHT:.0}\" viewBox=\"0 0 {WIDTH:.0} {HEIGHT:.0}\" role=\"img\" \
         aria-label=\"{title}\">"
    )?;
    writeln!(out, "<title>{title}</title>")?;
    writeln!(
        out,
        "<defs><clipPath id=\"{id}-clip\"><rect x=\"{LEFT:.2}\" y=\"{TOP:.2}\" \
         width=\"{PLOT_W:.2}\" height=\"{PLOT_H:.2}\"/></clipPath></defs>"
    )?;
    writeln!(
        out,
        "<text class=\"title\" x=\"{LEFT:.2}\" y=\"16\">{title}</text>"
    )?;
    write_line_legend(out, spec)?;

    // Phase bands first, so that grid and lines are drawn over them.
    writeln!(out, "<g clip-path=\"url(#{id}-clip)\">")?;
    for band in bands {
        let (Some(from), Some(to)) = (x.frac(band.from_s), x.frac(band.to_s)) else {
            continue;
        };
        let colour = phase_colour(band.phase).expect("bands are made for banded phases only");
        writeln!(
            out,
            "<rect class=\"band phase-{}\" x=\"{:.2}\" y=\"{TOP:.2}\" width=\"{:.2}\" \
             height=\"{PLOT_H:.2}\" fill=\"{colour}\"><title>{} {} s to {} s</title></rect>",
            class_slug(band.phase),
            px(from),
            (px(to) - px(from)).max(0.0),
            escape(band.phase),
            fmt_f(band.from_s, 3),
            fmt_f(band.to_s, 3),
        )?;
    }
    writeln!(out, "</g>")?;

    // Grid and y ticks.
    let (major, minor) = y.ticks();
    for f in minor {
        let yy = py(f);
        writeln!(
            out,
            "<line class=\"grid minor\" x1=\"{LEFT:.2}\" y1=\"{yy:.2}\" x2=\"{:.2}\" y2=\"{yy:.2}\"/>",
            LEFT + PLOT_W
        )?;
    }
    for (f, label) in &major {
        let yy = py(*f);
        writeln!(
            out,
            "<line class=\"grid\" x1=\"{LEFT:.2}\" y1=\"{yy:.2}\" x2=\"{:.2}\" y2=\"{yy:.2}\"/>",
            LEFT + PLOT_W
        )?;
        writeln!(
            out,
            "<line class=\"tick\" x1=\"{:.2}\" y1=\"{yy:.2}\" x2=\"{LEFT:.2}\" y2=\"{yy:.2}\"/>\
             <text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"end\">{}</text>",
            LEFT - 4.0,
            LEFT - 6.0,
            yy + 3.5,
            escape(label)
        )?;
    }
    // X ticks.
    let bottom = TOP + PLOT_H;
    for v in x.ticks() {
        let Some(f) = x.frac(v) else { continue };
        let xx = px(f);
        writeln!(
            out,
            "<line class=\"tick\" x1=\"{xx:.2}\" y1=\"{bottom:.2}\" x2=\"{xx:.2}\" y2=\"{:.2}\"/>\
             <text x=\"{xx:.2}\" y=\"{:.2}\" text-anchor=\"middle\">{}</text>",
            bottom + 4.0,
            bottom + 16.0,
            escape(&x.label(v))
        )?;
    }
    writeln!(
        out,
        "<rect class=\"frame\" x=\"{LEFT:.2}\" y=\"{TOP:.2}\" width=\"{PLOT_W:.2}\" \
         height=\"{PLOT_H:.2}\"/>"
    )?;

    // Lines.
    writeln!(out, "<g clip-path=\"url(#{id}-clip)\">")?;
    for line in spec.lines {
        let d = line_path(samples, x, y, line);
        if d.is_empty() {
            continue;
        }
        let dash = if line.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        writeln!(
            out,
            "<path class=\"series\" d=\"{d}\" stroke=\"{}\"{dash}><title>{}</title></path>",
            line.colour,
            escape(line.name)
        )?;
    }
    writeln!(out, "</g>")?;
    if samples.is_empty() {
        writeln!(
            out,
            "<text class=\"empty\" x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"middle\">no samples</text>",
            LEFT + PLOT_W / 2.0,
            TOP + PLOT_H / 2.0
        )?;
    }

    // Axis titles.
    writeln!(
        out,
        "<text class=\"axis-title\" x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"middle\">virtual time \
         t (s)</text>",
        LEFT + PLOT_W / 2.0,
        HEIGHT - 6.0
    )?;
    let (tx, ty) = (14.0, TOP + PLOT_H / 2.0);
    writeln!(
        out,
        "<text class=\"axis-title\" x=\"{tx:.2}\" y=\"{ty:.2}\" text-anchor=\"middle\" \
         transform=\"rotate(-90 {tx:.2} {ty:.2})\">{}</text>",
        escape(spec.y_title)
    )?;
    writeln!(out, "</svg>\n</figure>")
}

/// The legend of a plot's lines, right-aligned in the top margin. Text widths are estimated
/// (about 6.5 units per character), which is deterministic and close enough at 11px.
fn write_line_legend(out: &mut String, spec: &PlotSpec) -> fmt::Result {
    const SWATCH: f64 = 18.0;
    const GAP: f64 = 14.0;
    let width = |name: &str| SWATCH + 4.0 + 6.5 * name.chars().count() as f64 + GAP;
    let total: f64 = spec.lines.iter().map(|l| width(l.name)).sum::<f64>() - GAP;
    let mut xx = (WIDTH - RIGHT - total).max(LEFT);
    let yy = 28.0;
    for line in spec.lines {
        let dash = if line.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        writeln!(
            out,
            "<line x1=\"{xx:.2}\" y1=\"{:.2}\" x2=\"{:.2}\" y2=\"{:.2}\" stroke=\"{}\" \
             stroke-width=\"2\"{dash}/><text x=\"{:.2}\" y=\"{yy:.2}\">{}</text>",
            yy - 4.0,
            xx + SWATCH,
            yy - 4.0,
            line.colour,
            xx + SWATCH + 4.0,
            escape(line.name)
        )?;
        xx += width(line.name);
    }
    Ok(())
}

/// The SVG path of one line. Samples whose value cannot be placed (not finite, or not positive
/// on a log axis) break the line; a point with no neighbour on either side becomes a dot.
fn line_path(samples: &[&Sample], x: &LinearAxis, y: &YAxis, line: &LineSpec) -> String {
    let mut d = String::new();
    // Points in the subpath being drawn; a lone point needs a zero-length segment to show.
    let mut open = 0usize;
    let close = |d: &mut String, open: usize| {
        if open == 1 {
            d.push_str(" l0,0");
        }
    };
    for s in samples {
        let point = x
            .frac(s.t_s)
            .zip(y.frac((line.value)(s)))
            .map(|(fx, fy)| (px(fx), py(fy)));
        let Some((xx, yy)) = point else {
            close(&mut d, open);
            open = 0;
            continue;
        };
        // Writing to a String cannot fail.
        let _ = match (open, line.step) {
            (0, _) => write!(d, "{}M{xx:.2},{yy:.2}", if d.is_empty() { "" } else { " " }),
            // The value at t_s holds over the interval that ends at t_s: rise, then run.
            (_, true) => write!(d, " V{yy:.2} H{xx:.2}"),
            (_, false) => write!(d, " L{xx:.2},{yy:.2}"),
        };
        open += 1;
    }
    close(&mut d, open);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{LatencyUs, PhaseEvent};
    use std::collections::BTreeMap;

    fn sample(t_s: f64, phase: &'static str, workers: u32) -> Sample {
        Sample {
            t_s,
            offered_mpps: 10.0,
            dpu_mpps: 8.0,
            host_mpps: 1.5,
            lost_mpps: 0.5,
            new_conn_mcps: 0.2,
            offered_mcps: 0.2,
            done_mcps: 0.2,
            p50_us: 4.0,
            p99_us: 40.0,
            hw_table_util: 0.9,
            hw_util: 0.7,
            soc_util: 0.95,
            workers,
            phase,
        }
    }

    fn report(series: Vec<Sample>) -> RunReport {
        RunReport {
            kind: "model",
            scenario: "burst-new-conns".to_string(),
            seed: 7,
            baseline: "spillway",
            placement: "stability",
            measure_s: [1.0, 3.0],
            offered_mpps: 10.0,
            delivered_mpps: 9.5,
            dpu_mpps: 8.0,
            host_mpps: 1.5,
            cps: 200_000.0,
            offered_packets: 40_000_000,
            delivered_packets: 38_000_000,
            lost_packets: 1_900_000,
            drops: BTreeMap::from([("policy.deny", 100_000), ("dpu.soc.queue_full", 1_900_000)]),
            activation_ms: Some(1.25),
            rule_injection_ms: Some(0.4),
            release_ms: None,
            latency_us: LatencyUs {
                p50: 4.0,
                p99: 40.0,
                mean: 6.0,
            },
            offload_ratio: 0.84,
            pcie_crossings_per_packet: 0.3,
            window: Default::default(),
            zero_loss_cps: None,
            phases: vec![
                PhaseEvent {
                    phase: "preparing",
                    t_s: 0.5,
                    reason: "soc_util > 0.9".to_string(),
                },
                PhaseEvent {
                    phase: "active",
                    t_s: 1.0,
                    reason: "rules <b>& live".to_string(),
                },
                PhaseEvent {
                    phase: "idle",
                    t_s: 3.5,
                    reason: "released".to_string(),
                },
            ],
            counters: BTreeMap::from([("dpu.hw.hit", 30_000_000), ("spill.redirect.new_conn", 9)]),
            checks: 1234,
            events: 5678,
            series,
        }
    }

    fn lifecycle_series() -> Vec<Sample> {
        vec![
            sample(0.5, "idle", 0),
            sample(1.0, "preparing", 1),
            sample(1.5, "active", 2),
            sample(2.0, "active", 2),
            sample(2.5, "draining", 1),
            sample(3.0, "idle", 0),
        ]
    }

    #[test]
    fn page_is_a_self_contained_document_with_plots() {
        let run = report(lifecycle_series());
        let html = render_html(&[&run]);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<svg"));
        assert_eq!(html.matches("<svg").count(), PLOTS.len());
        assert!(html.contains(MODEL_LABEL));
        assert!(html.trim_end().ends_with("</html>"));
        assert!(!html.contains("<script"));
        assert!(!html.contains("src=\""));
        assert!(!html.contains("NaN"));
    }

    #[test]
    fn active_phase_is_drawn_as_a_band_and_idle_is_not() {
        let run = report(lifecycle_series());
        let html = render_html(&[&run]);
        assert!(html.contains("class=\"band phase-active\""));
        assert!(html.contains("class=\"band phase-preparing\""));
        assert!(html.contains("class=\"band phase-draining\""));
        assert!(!html.contains("phase-idle"));
    }

    #[test]
    fn contiguous_samples_of_a_phase_make_one_band_over_their_intervals() {
        let series = lifecycle_series();
        let samples: Vec<&Sample> = series.iter().collect();
        let bands = phase_bands(&samples);
        assert_eq!(
            bands,
            vec![
                Band {
                    phase: "preparing",
                    from_s: 0.5,
                    to_s: 1.0
                },
                Band {
                    phase: "active",
                    from_s: 1.0,
                    to_s: 2.0
                },
                Band {
                    phase: "draining",
                    from_s: 2.0,
                    to_s: 2.5
                },
            ]
        );
    }

    #[test]
    fn text_is_escaped() {
        let mut run = report(lifecycle_series());
        run.scenario = "a\"b<c>".to_string();
        let html = render_html(&[&run]);
        assert!(html.contains("rules &lt;b&gt;&amp; live"));
        assert!(!html.contains("<b>&"));
        assert!(html.contains("a&quot;b&lt;c&gt;"));
        assert!(!html.contains("b<c>"));
        assert_eq!(escape("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
    }

    #[test]
    fn empty_series_renders_axes_without_lines() {
        let run = report(Vec::new());
        let html = render_html(&[&run]);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<svg"));
        assert!(html.contains("no samples"));
        assert!(!html.contains("class=\"series\""));
        assert!(!html.contains("class=\"band "));
    }

    #[test]
    fn no_runs_renders_a_page_that_says_so() {
        let html = render_html(&[]);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("No runs to show."));
    }

    #[test]
    fn non_finite_values_are_skipped() {
        let mut series = lifecycle_series();
        series[1].dpu_mpps = f64::NAN;
        series[2].p99_us = f64::INFINITY;
        series[3].p50_us = 0.0; // not placeable on a log axis
        series[4].t_s = f64::NAN;
        series[5].offered_mpps = f64::NEG_INFINITY;
        let mut run = report(series);
        run.offload_ratio = f64::NAN;
        run.measure_s = [f64::NEG_INFINITY, f64::INFINITY];
        let html = render_html(&[&run]);
        assert!(!html.contains("NaN"));
        assert!(!html.contains("inf"));
        assert!(html.contains("n/a"));
    }

    #[test]
    fn all_nan_series_renders() {
        let nan = Sample {
            t_s: f64::NAN,
            ..Sample::default()
        };
        let mut weird = sample(1.0, "", u32::MAX);
        weird.offered_mpps = f64::MAX;
        weird.dpu_mpps = -f64::MAX;
        weird.p50_us = f64::MIN_POSITIVE;
        weird.p99_us = f64::MAX;
        let a = report(vec![nan.clone(), nan]);
        let b = report(vec![weird.clone(), weird]);
        let html = render_html(&[&a, &b]);
        assert!(html.contains("<svg"));
        assert!(!html.contains("NaN"));
    }

    #[test]
    fn runs_share_axes_and_have_unique_ids() {
        let spillway = report(lifecycle_series());
        let mut baseline = report(lifecycle_series()[..3].to_vec());
        baseline.baseline = "dpu-only";
        let html = render_html(&[&spillway, &baseline]);
        assert_eq!(html.matches("<svg").count(), 2 * PLOTS.len());
        assert!(html.contains("id=\"run0-throughput-clip\""));
        assert!(html.contains("id=\"run1-throughput-clip\""));
        assert!(html.find("spillway").unwrap() < html.find("dpu-only").unwrap());
        // The baseline ends at 1.5 s but shares the 0..3 s axis, so its last tick is 3.
        let second = &html[html.find("id=\"run-1\"").unwrap()..];
        assert!(second.contains(">3</text>"));
    }

    #[test]
    fn rendering_is_deterministic() {
        let run = report(lifecycle_series());
        assert_eq!(render_html(&[&run]), render_html(&[&run]));
    }

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
