//! What a run records as it goes: the time series (one [`Sample`] per `sample` interval), the
//! lifecycle events, the totals of the measure window and the latency of every window.
//!
//! [`Totals`] is a reading of the fabric's cumulative counters; the sampler keeps the previous
//! reading and turns the difference into rates. At the end, [`Sampler::finish`] hands what
//! was recorded to the report.

use spillway_fabric::dpu::FabricEvent;

use super::SimDpu;
use spillway_fabric::spill::SpillCounters;
use spillway_fabric::stats::{Drops, LatencyHist};
use spillway_vswitch::Instant;

use crate::report::Sample;
use crate::scenario::Scenario;

/// The fabric's cumulative counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Totals {
    pub(super) offered: u64,
    pub(super) dpu: u64,
    pub(super) host: u64,
    pub(super) lost: u64,
    pub(super) new_conn: u64,
    pub(super) closed: u64,
    pub(super) inserts: u64,
    /// Delivered by the hardware fast path (part of `dpu`).
    pub(super) hw: u64,
    pub(super) deletes: u64,
    pub(super) deletes_to_host: u64,
    pub(super) recalls: u64,
    pub(super) demotes: u64,
    pub(super) sheds: u64,
    pub(super) flaps: u64,
    /// Spill-plane worker core-nanoseconds.
    pub(super) busy_ns: u64,
    /// Rule commands from the SoC to the switch ASIC, and the SoC time spent on those a new
    /// connection's cost does not cover, ns.
    pub(super) rule_msgs: u64,
    pub(super) rule_soc_ns: u64,
}

impl Totals {
    /// Reads the counters: `offered` by the sources, `drops` of the whole fabric (both nodes
    /// and the links). The plane's counters survive restarts (they are the plane's metrics,
    /// not its state).
    pub(super) fn read(dpu: &SimDpu, s: &SpillCounters, offered: u64, drops: &Drops) -> Totals {
        let d = dpu.counters();
        Totals {
            offered,
            dpu: d.hw_delivered + d.soc_delivered,
            host: d.host_out + s.direct,
            lost: drops.lost(),
            new_conn: d.soc_new_conn + s.new_conn,
            closed: d.closed + s.closed_direct,
            inserts: dpu.inserts_total(),
            hw: d.hw_delivered,
            deletes: d.deletes,
            deletes_to_host: d.deletes_to_host,
            recalls: d.recalls_ok,
            demotes: d.demotes,
            sheds: d.shed,
            flaps: d.flaps,
            busy_ns: s.busy_ns,
            rule_msgs: d.rule_msgs,
            rule_soc_ns: d.rule_soc_ns,
        }
    }

    /// Adds the change from `last` to `now` of every field.
    fn add_delta(&mut self, now: &Totals, last: &Totals) {
        self.offered += now.offered - last.offered;
        self.dpu += now.dpu - last.dpu;
        self.host += now.host - last.host;
        self.lost += now.lost - last.lost;
        self.new_conn += now.new_conn - last.new_conn;
        self.closed += now.closed - last.closed;
        self.inserts += now.inserts - last.inserts;
        self.hw += now.hw - last.hw;
        self.deletes += now.deletes - last.deletes;
        self.deletes_to_host += now.deletes_to_host - last.deletes_to_host;
        self.recalls += now.recalls - last.recalls;
        self.demotes += now.demotes - last.demotes;
        self.sheds += now.sheds - last.sheds;
        self.flaps += now.flaps - last.flaps;
        self.busy_ns += now.busy_ns - last.busy_ns;
        self.rule_msgs += now.rule_msgs - last.rule_msgs;
        self.rule_soc_ns += now.rule_soc_ns - last.rule_soc_ns;
    }
}

/// What the sampler recorded over a run.
#[derive(Debug)]
pub(super) struct Record {
    /// One sample per interval.
    pub(super) samples: Vec<Sample>,
    /// The lifecycle events, in order.
    pub(super) phases: Vec<FabricEvent>,
    /// The counters' change over the measure window.
    pub(super) window: Totals,
    /// The measure window's length as sampled, seconds.
    pub(super) window_secs: f64,
    /// Fast-path packets of recalled connections at the measure window's start and end.
    pub(super) recalled_hw: [Option<u64>; 2],
    /// The DPU's latency of every closed window.
    pub(super) latency: LatencyHist,
}

/// The time series of a run.
#[derive(Debug)]
pub(super) struct Sampler {
    /// The sample interval, ns and seconds.
    step_ns: u64,
    step_secs: f64,
    /// The measure window, ns.
    from_ns: u64,
    to_ns: u64,
    /// The reading at the previous sample.
    last: Totals,
    /// Short connections offered at the previous sample.
    last_new_conn_offered: u64,
    record: Record,
}

impl Sampler {
    pub(super) fn new(scenario: &Scenario) -> Sampler {
        Sampler {
            step_ns: scenario.sample.ns(),
            step_secs: scenario.sample.0.as_secs_f64(),
            from_ns: scenario.measure[0].ns(),
            to_ns: scenario.measure[1].ns(),
            last: Totals::default(),
            last_new_conn_offered: 0,
            record: Record {
                samples: Vec::new(),
                phases: Vec::new(),
                window: Totals::default(),
                window_secs: 0.0,
                // `DpuNode::recalled_hw_packets` is a scan, so it is read only at the
                // window's edges; a window opening before the first sample starts at zero.
                recalled_hw: [
                    (scenario.measure[0].ns() < scenario.sample.ns()).then_some(0),
                    None,
                ],
                latency: LatencyHist::default(),
            },
        }
    }

    /// Records a lifecycle event.
    pub(super) fn phase(&mut self, e: FabricEvent) {
        self.record.phases.push(e);
    }

    /// Takes the sample at `now` from the reading `t`; `workers` is the plane's (0 when its
    /// process is not running). Returns the hardware inserts since the previous sample, for
    /// the insertion budget.
    pub(super) fn sample(
        &mut self,
        now: Instant,
        t: Totals,
        new_conn_offered: u64,
        dpu: &mut SimDpu,
        workers: u32,
    ) -> u64 {
        let secs = self.step_secs;
        let d = |a: u64, b: u64| (a - b) as f64 / secs;
        let lat = dpu.take_window_latency();
        self.record.latency.merge(&lat);
        let load = *dpu.last_load();
        let s = Sample {
            t_s: now.0 as f64 / 1e9,
            offered_mpps: d(t.offered, self.last.offered) / 1e6,
            dpu_mpps: d(t.dpu, self.last.dpu) / 1e6,
            host_mpps: d(t.host, self.last.host) / 1e6,
            lost_mpps: d(t.lost, self.last.lost) / 1e6,
            new_conn_mcps: d(t.new_conn, self.last.new_conn) / 1e6,
            offered_mcps: (new_conn_offered - self.last_new_conn_offered) as f64 / secs / 1e6,
            done_mcps: d(t.closed, self.last.closed) / 1e6,
            p50_us: lat.quantile(0.5) as f64 / 1e3,
            p99_us: lat.quantile(0.99) as f64 / 1e3,
            hw_table_util: dpu.hw_entries() as f64 / dpu.hw_capacity() as f64,
            hw_util: load.hw_util,
            soc_util: load.soc_util,
            workers,
            phase: dpu.phase().name(),
        };
        let inserts = t.inserts - self.last.inserts;
        let (from, to) = (self.from_ns, self.to_ns);
        if now.0 > from && now.0 <= to {
            let last = self.last;
            self.record.window.add_delta(&t, &last);
            self.record.window_secs += secs;
        }
        // The window's first delta starts at the last sample at or before `from`, its last
        // delta ends at the last sample at or before `to`.
        let step = self.step_ns;
        if now.0 <= from && now.0 + step > from {
            self.record.recalled_hw[0] = Some(dpu.recalled_hw_packets());
        }
        if now.0 > from && now.0 <= to && now.0 + step > to {
            self.record.recalled_hw[1] = Some(dpu.recalled_hw_packets());
        }
        self.last_new_conn_offered = new_conn_offered;
        self.last = t;
        // Samples are kept in every run: the sweep's zero-loss search reads them too.
        self.record.samples.push(s);
        inserts
    }

    /// The sample interval, seconds.
    pub(super) fn step_secs(&self) -> f64 {
        self.step_secs
    }

    /// What was recorded.
    pub(super) fn finish(self) -> Record {
        self.record
    }
}
