//! The end of a run: its [`RunReport`], built from the final state of the nodes and what the
//! sampler recorded. Every figure here is a model result.
//!
//! It owns nothing: [`Ending`] gathers what a finished run hands over, and [`run_report`]
//! turns it into the report (phase timings, window figures, latency, counters).

use std::collections::BTreeMap;

use spillway_fabric::dpu::{EventKind, FabricEvent};

use super::SimDpu;
use super::plane::Planes;
use spillway_fabric::stats::{Drops, FabricDrop};
use spillway_vswitch::Instant;

use super::checkers::Checkers;
use super::sampling::{Record, Totals};
use crate::report::{
    LatencyUs, PhaseEvent, RunReport, Sample, TakeoverFigures, TenantFigures, WindowFigures,
};
use crate::scenario::{FaultKind, Scenario};

/// What a finished run hands to its report.
pub(super) struct Ending<'a> {
    pub(super) scenario: &'a Scenario,
    pub(super) seed: u64,
    /// The run had no spill plane.
    pub(super) dpu_only: bool,
    pub(super) dpu: &'a SimDpu,
    pub(super) planes: &'a Planes,
    pub(super) checkers: &'a Checkers,
    /// Events processed.
    pub(super) events: u64,
    /// The counters at the end.
    pub(super) totals: Totals,
    /// Every drop of the fabric, by reason.
    pub(super) drops: Drops,
    pub(super) record: Record,
}

/// Milliseconds from `a` to `b`, if both happened in that order.
fn ms(a: Option<Instant>, b: Option<Instant>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b >= a => Some((b.0 - a.0) as f64 / 1e6),
        _ => None,
    }
}

/// The report of a finished run.
pub(super) fn run_report(end: Ending<'_>) -> RunReport {
    let Ending {
        scenario,
        seed,
        dpu_only,
        dpu,
        planes,
        checkers,
        events,
        totals: t,
        drops,
        record,
    } = end;
    let secs = record.window_secs.max(1e-9);
    let m = record.window;
    let phases = &record.phases;
    let ev = |k: EventKind| phases.iter().find(|e| e.what == k).map(|e| e.at);
    let absorbing_ev = phases.iter().find(|e| e.what == EventKind::Absorbing);
    let prepare = absorbing_ev.and_then(|e| e.since);
    let absorbing = absorbing_ev.map(|e| e.at);
    let activating = ev(EventKind::Activating);
    let active = ev(EventKind::Active);
    let release = phases
        .iter()
        .find(|e| e.what == EventKind::Draining && e.reason.starts_with("release"))
        .map(|e| e.at);
    let idle_after = release.and_then(|r| {
        phases
            .iter()
            .find(|e| e.what == EventKind::Idle && e.at >= r)
            .map(|e| e.at)
    });
    let mut latency = record.latency.clone();
    latency.merge(&planes.latency());
    let d = dpu.counters();
    let delivered = t.dpu + t.host;
    let mut counters = BTreeMap::new();
    for (k, v) in d.iter().chain(planes.counters().iter()) {
        counters.insert(k, v);
    }
    counters.insert("dpu.hw.packets.recalled", dpu.recalled_hw_packets());
    counters.insert("sim.events", events);
    counters.insert("sim.path_checks", checkers.path().checks());
    counters.insert(
        "sim.path_checks.hw_hits",
        checkers.path().hw_fast_path_hits(),
    );
    let hw_overload_by_tenant = dpu
        .hw_lost_by_tenant()
        .into_iter()
        .map(|(t, n)| (t.0, n))
        .collect();
    let mut tenants = dpu.tenant_stats();
    tenants.merge(&planes.tenant_stats());
    let by_tenant = tenants
        .iter()
        .map(|(t, s)| {
            let figures = TenantFigures {
                delivered: s.delivered,
                lost: s.lost,
                latency_us: LatencyUs {
                    p50: s.latency.quantile(0.5) as f64 / 1e3,
                    p99: s.latency.quantile(0.99) as f64 / 1e3,
                    mean: s.latency.mean() / 1e3,
                },
            };
            (t, figures)
        })
        .collect();
    RunReport {
        hw_overload_by_tenant,
        by_tenant,
        kind: "model",
        scenario: scenario.name.clone(),
        seed,
        baseline: if dpu_only { "dpu-only" } else { "spillway" },
        placement: if dpu_only {
            "none"
        } else {
            planes.policy_name()
        },
        measure_s: [
            scenario.measure[0].0.as_secs_f64(),
            scenario.measure[1].0.as_secs_f64(),
        ],
        offered_mpps: m.offered as f64 / secs / 1e6,
        delivered_mpps: (m.dpu + m.host) as f64 / secs / 1e6,
        dpu_mpps: m.dpu as f64 / secs / 1e6,
        host_mpps: m.host as f64 / secs / 1e6,
        cps: m.closed as f64 / secs,
        offered_packets: t.offered,
        delivered_packets: delivered,
        lost_packets: t.offered - delivered - drops.get(FabricDrop::Policy),
        drops: drops.iter().collect(),
        activation_ms: ms(prepare, absorbing),
        rule_injection_ms: ms(activating, active),
        release_ms: ms(release, idle_after),
        latency_us: LatencyUs {
            p50: latency.quantile(0.5) as f64 / 1e3,
            p99: latency.quantile(0.99) as f64 / 1e3,
            mean: latency.mean() / 1e3,
        },
        offload_ratio: if delivered > 0 {
            d.hw_delivered as f64 / delivered as f64
        } else {
            0.0
        },
        pcie_crossings_per_packet: if delivered > 0 {
            d.pcie_crossings as f64 / delivered as f64
        } else {
            0.0
        },
        window: window_figures(&m, secs, record.recalled_hw),
        phases: phases
            .iter()
            .map(|e| PhaseEvent {
                phase: e.what.name(),
                t_s: e.at.0 as f64 / 1e9,
                reason: e.reason.clone(),
            })
            .collect(),
        counters,
        checks: checkers.checks(),
        events,
        zero_loss_cps: None,
        takeover: takeover_figures(
            phases,
            &record.samples,
            (
                &|acted| {
                    scenario
                        .faults
                        .iter()
                        .filter(|f| matches!(f.kind, FaultKind::KillPlane | FaultKind::StallPlane))
                        .map(|f| f.at.0.as_secs_f64())
                        .filter(|&at| at <= acted + 1e-9)
                        .reduce(f64::max)
                },
                scenario.sample.0.as_secs_f64(),
            ),
            if scenario.fabric.host.warm_standby && !dpu_only {
                scenario.fabric.host.warm_workers
            } else {
                0
            },
        ),
        series: record.samples,
        explain: None,
    }
}

/// What the first take-over of the active plane's work cost (see [`TakeoverFigures`]);
/// `None` if nothing took over. `fault_s` gives when the fault behind a failure acted on at a
/// time was injected (the last plane kill or stall of the scenario at or before it), `step_s`
/// is the sample interval.
fn takeover_figures(
    phases: &[FabricEvent],
    samples: &[Sample],
    (fault_s, step_s): (&dyn Fn(f64) -> Option<f64>, f64),
    standby_cores: u32,
) -> Option<TakeoverFigures> {
    let (i, first) = phases.iter().enumerate().find(|(_, e)| {
        matches!(
            e.what,
            EventKind::FailOver | EventKind::FailOpen | EventKind::UpgradeAsked
        )
    })?;
    let acted = first.at.0 as f64 / 1e9;
    let upgrade = first.what == EventKind::UpgradeAsked;
    let t = if upgrade {
        acted
    } else {
        fault_s(acted).unwrap_or(acted)
    };
    let gap_ms = phases[i..]
        .iter()
        .find(|e| e.what == EventKind::Absorbing)
        .map(|e| {
            let from = match (upgrade, e.since) {
                (true, Some(flip)) => flip.0 as f64 / 1e9,
                _ => t,
            };
            (e.at.0 as f64 / 1e9 - from) * 1e3
        });
    let (mut lost, mut last_loss_end) = (0.0, None);
    for s in samples {
        // The samples that end after the fault and begin within a second of it.
        if s.t_s <= t || s.t_s - step_s > t + 1.0 {
            continue;
        }
        if s.lost_mpps > 0.0 {
            lost += s.lost_mpps * 1e6 * step_s;
            last_loss_end = Some(s.t_s);
        }
    }
    Some(TakeoverFigures {
        kind: if upgrade {
            "upgrade"
        } else {
            first.what.name()
        },
        t_s: t,
        detected_ms: (acted - t) * 1e3,
        gap_ms,
        lost_packets: lost.round() as u64,
        full_capacity_ms: last_loss_end.map_or(0.0, |e| (e - t) * 1e3),
        standby_cores,
    })
}

/// What placement did over the measure window: `m` is the window's change of the counters
/// over `secs` seconds, `recalled_hw` the fast-path packets of recalled connections at its
/// edges.
fn window_figures(m: &Totals, secs: f64, recalled_hw: [Option<u64>; 2]) -> WindowFigures {
    let per_s = |n: u64| n as f64 / secs;
    let hw_recalled = match recalled_hw {
        [Some(a), Some(b)] => b.saturating_sub(a),
        _ => 0,
    };
    let plane = hw_recalled + m.host;
    WindowFigures {
        offload_ratio: if m.dpu + m.host > 0 {
            m.hw as f64 / (m.dpu + m.host) as f64
        } else {
            0.0
        },
        plane_offload_ratio: (plane > 0).then(|| hw_recalled as f64 / plane as f64),
        inserts_per_s: per_s(m.inserts),
        deletes_per_s: per_s(m.deletes),
        deletes_to_host_per_s: per_s(m.deletes_to_host),
        recalls: m.recalls,
        demotions: m.demotes,
        sheds: m.sheds,
        flaps: m.flaps,
        host_cpu_cores: m.busy_ns as f64 / 1e9 / secs,
        rule_msgs_per_s: per_s(m.rule_msgs),
        soc_rule_cores: m.rule_soc_ns as f64 / 1e9 / secs,
    }
}
