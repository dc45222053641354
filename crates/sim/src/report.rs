//! What a simulator run reports: the summary the CLI prints as JSON, and the time series the
//! HTML report plots. Everything here is a **model result**.

use serde::Serialize;
use std::collections::BTreeMap;

/// One sample of the time series (one per `sample` interval of virtual time).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Sample {
    /// End of the interval, seconds of virtual time.
    pub t_s: f64,
    /// Offered load, Mpps.
    pub offered_mpps: f64,
    /// Delivered by the DPU (fast path + SoC), Mpps.
    pub dpu_mpps: f64,
    /// Delivered by the spill plane, Mpps.
    pub host_mpps: f64,
    /// Packets lost in the interval (all drops except policy), per second, in Mpps.
    pub lost_mpps: f64,
    /// Connections opened per second (DPU SoC + plane), millions.
    pub new_conn_mcps: f64,
    /// Connections offered per second by the workload, millions.
    pub offered_mcps: f64,
    /// Connections completed per second (last packet delivered), millions.
    pub done_mcps: f64,
    /// Latency percentiles of packets delivered in the interval, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Hardware table occupancy, fraction of capacity.
    pub hw_table_util: f64,
    /// Fast-path utilisation URSched saw in its last window.
    pub hw_util: f64,
    /// SoC utilisation URSched saw in its last window.
    pub soc_util: f64,
    /// Spill-plane workers running (0 when no plane).
    pub workers: u32,
    /// Lifecycle phase at the end of the interval.
    pub phase: &'static str,
}

/// A lifecycle event, as reported.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PhaseEvent {
    /// The phase entered or what changed.
    pub phase: &'static str,
    /// When, seconds of virtual time.
    pub t_s: f64,
    /// Why.
    pub reason: String,
}

/// What the first take-over of the active plane's work cost: a failover to the warm plane, a
/// fail-open, or an online upgrade; from the lifecycle events and the `sample` time series.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TakeoverFigures {
    /// `fail_over` (a warm plane took over a failed one), `fail_open` (the DPU took every
    /// connection back) or `upgrade` (an operator's online upgrade).
    pub kind: &'static str,
    /// When it started, seconds of virtual time: for a failure, the scenario's last
    /// `kill_plane` or `stall_plane` fault before the DPU acted (or when it acted, if no fault
    /// explains it); for an upgrade, when it was asked for.
    pub t_s: f64,
    /// From the failure to the DPU acting on it (a kill is seen at once, a stall by missed
    /// heartbeats), milliseconds; 0 for an upgrade.
    pub detected_ms: f64,
    /// The forwarding gap of the overflow, milliseconds: for a failure, from the failure to the
    /// first redirected packet a plane served again (the warm plane after a flip; a newly
    /// started plane after a fail-open); for an upgrade, from the flip (the old plane serves
    /// until then) to the new plane's first. Null if no plane served again.
    pub gap_ms: Option<f64>,
    /// Packets lost (every reason but policy) in the samples from the failure to one second
    /// after it (whole samples: up to one sample interval before the failure counts too).
    pub lost_packets: u64,
    /// From the failure to the end of the last sample with a loss in that second: when the
    /// fabric carried its full load again, milliseconds (0 if nothing was lost).
    pub full_capacity_ms: f64,
    /// Host cores the warm standby plane holds while a plane is up
    /// (`fabric.host.warm_workers`, 0 without a standby): the standby's price.
    pub standby_cores: u32,
}

/// Latency summary.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct LatencyUs {
    /// Median, microseconds.
    pub p50: f64,
    /// 99th percentile, microseconds.
    pub p99: f64,
    /// Mean, microseconds.
    pub mean: f64,
}

/// One tenant's packets over the whole run.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct TenantFigures {
    /// Packets delivered (into a VM or onto the wire).
    pub delivered: u64,
    /// Packets lost to a full shared resource: the fast path, the SoC, steering, the vNIC
    /// rings, the PCIe link, the plane's workers or the tenant's share of them.
    pub lost: u64,
    /// Latency of its delivered packets.
    pub latency_us: LatencyUs,
}

/// What placement did over the measure window: how much traffic the hardware fast path served,
/// what that cost in table churn and host CPU, and how often placement reversed itself. The
/// comparison of placement policies (`spillway sim --scenario placement`) reads these.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct WindowFigures {
    /// Traffic-offload ratio: packets delivered by the hardware fast path / packets
    /// delivered (`dpu.hw.packets` over DPU + plane deliveries). A packet counts as offloaded
    /// only once its entry is live (inserts take `insert_latency` behind the insertion queue).
    pub offload_ratio: f64,
    /// The same for the traffic the spill plane took on: packets the fast path delivered for
    /// recalled connections / (those + packets the plane delivered). `None` without any.
    pub plane_offload_ratio: Option<f64>,
    /// Hardware insert commands executed per second (`dpu.hw.insert` + those refused by a full
    /// table): what spends the insertion budget.
    pub inserts_per_s: f64,
    /// Hardware entries removed per second, for any reason (`dpu.hw.delete`).
    pub deletes_per_s: f64,
    /// Entries removed per second because their connection moved to the host (demoted or
    /// shed), not because it closed (`dpu.hw.delete.to_host`).
    pub deletes_to_host_per_s: f64,
    /// Recalls whose entries went live (`dpu.recall.ok`).
    pub recalls: u64,
    /// Demotions by the placement policy (`dpu.demote`).
    pub demotions: u64,
    /// Connections the DPU shed to the plane because its fast path overflowed (`dpu.shed`).
    pub sheds: u64,
    /// Placement reversals (`dpu.placement.flap`): after a connection's first recall, each of
    /// its moves between the fast path and the host (demotion, shed, recall again).
    pub flaps: u64,
    /// Host CPU of the spill plane: worker core-seconds of work per second (`spill.busy_ns`).
    pub host_cpu_cores: f64,
    /// Rule commands from the DPU's SoC to its switch ASIC per second, one message each: every
    /// insert issued and every delete (`dpu.rule.msgs`).
    pub rule_msgs_per_s: f64,
    /// SoC cores busy with the rule commands a new connection's cost does not cover (recall
    /// inserts and deletes at `dpu.soc_rule_cost`; `dpu.rule.soc_ns`).
    pub soc_rule_cores: f64,
}

/// The summary of one run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    /// Always "model": these are simulator results, not measurements.
    pub kind: &'static str,
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// "spillway" or "dpu-only".
    pub baseline: &'static str,
    /// The placement policy.
    pub placement: &'static str,
    /// The window the rates below are averaged over, seconds `[from, to]`.
    pub measure_s: [f64; 2],
    /// Offered load in the measure window, Mpps.
    pub offered_mpps: f64,
    /// Delivered in the measure window, Mpps.
    pub delivered_mpps: f64,
    /// Delivered by the DPU in the measure window, Mpps.
    pub dpu_mpps: f64,
    /// Delivered by the spill plane in the measure window, Mpps.
    pub host_mpps: f64,
    /// Connections completed per second in the measure window (all six packets delivered).
    pub cps: f64,
    /// Packets offered over the whole run.
    pub offered_packets: u64,
    /// Packets delivered over the whole run.
    pub delivered_packets: u64,
    /// Offered minus delivered minus policy drops, whole run (in-flight at the end counts).
    pub lost_packets: u64,
    /// Drops by reason, whole run (policy drops included, under `policy.deny`).
    pub drops: BTreeMap<&'static str, u64>,
    /// Packets the DPU's fast path refused (`dpu.hw.overload`) by tenant id, whole run: whose
    /// packets an overload cost (tenants that lost none are left out).
    pub hw_overload_by_tenant: BTreeMap<u32, u64>,
    /// Delivered, lost and latency by tenant id, whole run: what one tenant's burst cost the
    /// others. The first 256 tenants seen are apart; any further ones are counted together
    /// under 4294967295.
    pub by_tenant: BTreeMap<u32, TenantFigures>,
    /// Trigger (URSched's decision: prepare for a cold start, activate for a plane already warm
    /// in shadow mode) to the first redirected packet served by the plane, milliseconds; null if
    /// the plane never absorbed anything.
    pub activation_ms: Option<f64>,
    /// Redirect-rule installation (activate decision to rules live), milliseconds.
    pub rule_injection_ms: Option<f64>,
    /// Release decision to idle (host resources released), milliseconds.
    pub release_ms: Option<f64>,
    /// Latency of every delivered packet over the whole run.
    pub latency_us: LatencyUs,
    /// Share of delivered packets served by the hardware fast path.
    pub offload_ratio: f64,
    /// PCIe crossings per delivered packet.
    pub pcie_crossings_per_packet: f64,
    /// Placement and hardware-table figures over the measure window.
    pub window: WindowFigures,
    /// Lifecycle events, in order.
    pub phases: Vec<PhaseEvent>,
    /// Counters by name (DPU, plane, driver), whole run.
    pub counters: BTreeMap<&'static str, u64>,
    /// Invariant checks run (after every event, plus full sweeps).
    pub checks: u64,
    /// Events processed.
    pub events: u64,
    /// For connection-rate runs: the highest offered rate before the first loss (in the
    /// measure window), connections/s.
    pub zero_loss_cps: Option<f64>,
    /// When another plane or the DPU took over the active plane's work (a failure, or an
    /// online upgrade): what it cost. Omitted when nothing did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover: Option<TakeoverFigures>,
    /// The time series (omitted from `--json`).
    #[serde(skip)]
    pub series: Vec<Sample>,
    /// The story of the connection asked about (`--explain`), in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explain: Option<Vec<crate::engine::explain::Chapter>>,
}
