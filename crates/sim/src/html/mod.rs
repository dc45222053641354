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
//!   per phase, taken from contiguous runs of the same
//!   [`Sample::phase`](crate::report::Sample::phase); `idle` has no band;
//! - the lifecycle events (time, phase, reason) and, folded away, the counters.
//!
//! Every plot of a kind uses the same axes for all runs on the page, so a run and its baseline can
//! be compared by eye. The page is a pure function of the reports: no clock, no randomness, floats
//! in fixed precision, maps in key order. Non-finite values are skipped (a gap in the line, no
//! effect on the axes), never plotted and never a panic.
//!
//! This module writes the page and its tables; `plot` writes the SVG plots (which plots, their
//! lines, the phase bands), `axes` chooses and labels their axes, and `text` formats every
//! number and string the page shows. The SVG is written by hand rather than with a plotting
//! library: the page must be byte-for-byte deterministic, small and dependency-free (see the
//! crate's README).

mod axes;
mod plot;
mod text;

use crate::report::RunReport;
use axes::{LinearAxis, YAxis};
use plot::{PLOTS, legend_phases, phase_bands, phase_colour, timed, write_plot, x_axis, y_axis};
use std::fmt::{self, Write};
use text::{escape, fmt_f, fmt_opt};

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

#[cfg(test)]
mod tests {
    use super::plot::Band;
    use super::*;
    use crate::report::Sample;
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
            takeover: None,
            explain: None,
            hw_overload_by_tenant: BTreeMap::new(),
            by_tenant: BTreeMap::new(),
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
}
