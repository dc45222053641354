//! The plots: which plots the page shows and their lines ([`PLOTS`]), the axes shared by all
//! runs, the lifecycle phases as bands, and each plot written as inline SVG.

use std::fmt::{self, Write};

use super::axes::{LinearAxis, LogAxis, YAxis, min_max};
use super::text::{class_slug, escape, fmt_f};
use crate::report::{RunReport, Sample};

// Plot geometry, in SVG user units (pixels at 100% zoom).
pub(super) const WIDTH: f64 = 760.0;
pub(super) const HEIGHT: f64 = 230.0;
pub(super) const LEFT: f64 = 66.0;
pub(super) const RIGHT: f64 = 16.0;
pub(super) const TOP: f64 = 36.0;
pub(super) const BOTTOM: f64 = 42.0;
pub(super) const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
pub(super) const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;

/// The lifecycle phases that get a band, in lifecycle order (the order of the band legend).
pub(super) const BANDED_PHASES: [&str; 5] =
    ["preparing", "shadow", "activating", "active", "draining"];

/// Band colour for a lifecycle phase; `None` for `idle`, which is drawn without a band. A phase
/// this page does not know still gets a (grey) band so that it is visible.
pub(super) fn phase_colour(phase: &str) -> Option<&'static str> {
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
pub(super) enum ScaleKind {
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
pub(super) struct LineSpec {
    name: &'static str,
    colour: &'static str,
    value: fn(&Sample) -> f64,
    /// A step line: each sample's value holds over the interval that ends at its `t_s`.
    step: bool,
    dashed: bool,
}

/// One plot: what it shows and how its y axis is chosen.
#[derive(Clone, Copy, Debug)]
pub(super) struct PlotSpec {
    pub(super) slug: &'static str,
    title: &'static str,
    y_title: &'static str,
    scale: ScaleKind,
    lines: &'static [LineSpec],
}

pub(super) const PLOTS: [PlotSpec; 5] = [
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

/// The samples that can be placed in time: finite `t_s`, in the order reported.
pub(super) fn timed(run: &RunReport) -> Vec<&Sample> {
    run.series.iter().filter(|s| s.t_s.is_finite()).collect()
}

/// The time axis shared by all runs: from `min(0, first t_s)` to the last `t_s`.
pub(super) fn x_axis(runs: &[&RunReport]) -> LinearAxis {
    let (lo, hi) = min_max(runs.iter().flat_map(|r| timed(r)).map(|s| s.t_s));
    LinearAxis::new(lo.min(0.0), hi, 0.0)
}

/// A plot's y axis, shared by all runs.
pub(super) fn y_axis(spec: &PlotSpec, runs: &[&RunReport]) -> YAxis {
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

/// A shaded stretch of time in one lifecycle phase.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Band {
    pub(super) phase: &'static str,
    pub(super) from_s: f64,
    pub(super) to_s: f64,
}

/// Bands from contiguous runs of the same `Sample::phase`. A sample's phase holds over its
/// interval, which ends at its `t_s` and starts at the previous sample's `t_s` (for the first
/// sample, one interval earlier, as far as the next sample suggests). `idle` has no band.
pub(super) fn phase_bands(samples: &[&Sample]) -> Vec<Band> {
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
pub(super) fn legend_phases(samples: &[&Sample]) -> Vec<&'static str> {
    let mut phases: Vec<&'static str> = BANDED_PHASES.to_vec();
    for s in samples {
        if phase_colour(s.phase).is_some() && !phases.contains(&s.phase) {
            phases.push(s.phase);
        }
    }
    phases
}

/// Horizontal pixel of a fraction along the x axis.
pub(super) fn px(frac: f64) -> f64 {
    LEFT + frac * PLOT_W
}

/// Vertical pixel of a fraction along the y axis (0 at the bottom).
pub(super) fn py(frac: f64) -> f64 {
    TOP + (1.0 - frac) * PLOT_H
}

pub(super) fn write_plot(
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
pub(super) fn write_line_legend(out: &mut String, spec: &PlotSpec) -> fmt::Result {
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
pub(super) fn line_path(samples: &[&Sample], x: &LinearAxis, y: &YAxis, line: &LineSpec) -> String {
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
