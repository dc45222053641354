//! Scenarios: a workload (flow groups, connection-rate generators, host load changes, faults)
//! and the fabric's parameters, read from TOML. The built-in ones live in `scenarios/` at the
//! repository root and are compiled in.
//!
//! A bad file is an error naming the file, the field and what was expected. This module holds
//! the format (the types, the built-in list, loading); `validate` holds the checks of every
//! range, which grow with each new field.

mod validate;

use core::time::Duration;
use serde::Deserialize;
use spillway_fabric::params::{FabricParams, PlacementKind, humantime_us};

/// A duration field: `"10ms"`, `"200us"`, `"2s"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        humantime_us::deserialize(d).map(Dur)
    }
}

impl Dur {
    /// Nanoseconds.
    pub fn ns(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Where a group's packets go.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DestSpec {
    /// Into VMs on this host.
    #[default]
    Vm,
    /// Out of the uplink.
    Wire,
}

/// How a long flow's rate varies over time (see [`crate::shape`] for the processes).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// A constant `pps`, or with `on`/`off` set a fixed square wave: sends for `on`, pauses
    /// for `off`.
    #[default]
    Steady,
    /// `pps x (1 + amplitude x sin(2 pi t / period + phase))`, a random phase per flow
    /// (needs `period` and `amplitude`).
    Periodic,
    /// On/off with exponentially distributed on and off times of means `on` and `off`; sends
    /// at `pps` while on.
    Bursty,
    /// A log-rate random walk: every `step` (default 100 ms) the rate is multiplied by
    /// `exp(volatility x N(0,1) - volatility^2 / 2)` (mean-preserving), clamped to
    /// [`pps` / 10, `pps` x 10] (needs `volatility`).
    RandomWalk,
}

impl Shape {
    /// The name in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Steady => "steady",
            Shape::Periodic => "periodic",
            Shape::Bursty => "bursty",
            Shape::RandomWalk => "random-walk",
        }
    }
}

/// When a group's flows open within its `spread` window.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Arrivals {
    /// Evenly spaced: flow `i` of `count` opens at `start + spread x i / count`.
    #[default]
    Even,
    /// Each flow at an independent uniformly random time in the window (from the flow's own
    /// random stream). Evenly spaced flows whose spacing is a multiple of the train interval
    /// send their trains in lockstep, one burst per interval; real flows do not.
    Random,
}

/// How long each flow of a group lives.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Lifetimes {
    /// Every flow lives `lifetime`.
    #[default]
    Fixed,
    /// Each flow lives an exponentially distributed time of mean `lifetime` (from the flow's
    /// own random stream). `count` flows opening at once and `count / lifetime` opening per
    /// second after them keep `count` flows running: departures are spread, not a wave.
    Exponential,
}

/// A group of long-lived flows (TCP: handshake, data trains, teardown). Short-lived flows
/// ("mice") are groups with a short `lifetime`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FlowGroup {
    /// Flows in the group.
    pub count: u32,
    /// First tenant id; flows are spread round robin over `tenants` tenants from here.
    #[serde(default = "one")]
    pub tenant: u32,
    /// Tenants the group spreads over.
    #[serde(default = "one")]
    pub tenants: u32,
    /// Packets per second of each flow while it sends (the mean of a `periodic` or
    /// `random-walk` flow).
    pub pps: f64,
    /// How the rate varies over time; default `steady`.
    #[serde(default)]
    pub shape: Shape,
    /// When the first flow opens.
    #[serde(default)]
    pub start: Dur,
    /// Flows open over this window after `start` (the load ramps up over it).
    #[serde(default)]
    pub spread: Dur,
    /// How they open over it: `even` (default) or `random`.
    #[serde(default)]
    pub arrivals: Arrivals,
    /// How long each flow lives after it opens (then it tears down); the mean with
    /// `lifetimes = "exponential"`.
    pub lifetime: Dur,
    /// `fixed` (default) or `exponential`.
    #[serde(default)]
    pub lifetimes: Lifetimes,
    /// Where its packets go.
    #[serde(default)]
    pub dest: DestSpec,
    /// Bytes per packet.
    #[serde(default = "bytes64")]
    pub bytes: u32,
    /// On/off bursts: `steady` sends for `on`, then pauses for `off` (both zero: constant);
    /// `bursty` draws on and off times from exponentials of these means.
    #[serde(default)]
    pub on: Dur,
    /// Pause length of an on/off flow (the mean pause of a `bursty` one).
    #[serde(default)]
    pub off: Dur,
    /// `periodic`: the period of the rate's sine.
    #[serde(default)]
    pub period: Option<Dur>,
    /// `periodic`: the sine's amplitude relative to `pps`, 0..=1.
    #[serde(default)]
    pub amplitude: Option<f64>,
    /// `random-walk`: standard deviation of the log-rate change per step, 0..=2.
    #[serde(default)]
    pub volatility: Option<f64>,
    /// `random-walk`: interval between steps (default 100 ms, at least 1 ms).
    #[serde(default)]
    pub step: Option<Dur>,
    /// Relative random variation of each train's size, 0..1 (0: constant rate).
    #[serde(default)]
    pub jitter: f64,
    /// Spacing of the handshake and teardown packets (one RTT leg).
    #[serde(default = "gap20")]
    pub gap: Dur,
}

/// A generator of short TCP connections: SYN, SYN-ACK, ACK, FIN, FIN-ACK, ACK (the DASH CPS
/// convention), with Poisson arrivals whose rate ramps linearly.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CpsGroup {
    /// Connections per second at `start`.
    pub rate_from: f64,
    /// Connections per second at `end` (linear in between).
    pub rate_to: f64,
    /// First arrival window start.
    #[serde(default)]
    pub start: Dur,
    /// Arrivals stop here.
    pub end: Dur,
    /// Spacing between a connection's six packets (one RTT leg).
    #[serde(default = "gap20")]
    pub gap: Dur,
    /// First tenant id.
    #[serde(default = "one")]
    pub tenant: u32,
    /// Tenants spread over.
    #[serde(default = "one")]
    pub tenants: u32,
    /// Where its packets go.
    #[serde(default)]
    pub dest: DestSpec,
    /// Share of connections the tenants' security groups deny (dropped by policy, not lost).
    #[serde(default)]
    pub denied_fraction: f64,
}

/// A change of the host cores tenants use (the isolation input of URSched).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostLoad {
    /// When.
    pub at: Dur,
    /// Cores the tenants use from then on.
    pub tenant_cores: u32,
}

/// A fault.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// When it starts.
    pub at: Dur,
    /// What happens.
    pub kind: FaultKind,
    /// How long (for `control_loss`, `delay` and `stall_plane`).
    #[serde(default)]
    pub duration: Dur,
    /// Loss probability (for `control_loss`).
    #[serde(default)]
    pub probability: f64,
}

/// Fault kinds.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The plane's process is killed (kill -9): its queues and in-flight output are lost.
    KillPlane,
    /// Control-channel delete messages and their acks are lost with `probability`.
    ControlLoss,
    /// Flow-vNIC and phy-vNIC messages are delayed by up to `duration` extra (reordering
    /// between channels, never within one).
    Delay,
    /// The active plane's process stops for `duration` (SIGSTOP, or starved of its cores): it
    /// takes no message and runs no timer, so its heartbeats stop; what is sent to it waits in
    /// its vNIC set. The DPU notices the missed heartbeats and fails over or open, which stops
    /// (kills) it; a plane still running when the stall ends carries on.
    StallPlane,
    /// The warm standby plane's process is killed (`host.warm_standby`; nothing happens
    /// without one).
    KillWarm,
    /// Not a fault: an operator asks for an online upgrade (`spillway ctl upgrade`). The plane
    /// in the warm slot (started for it without a standby) replaces the active one.
    Upgrade,
}

/// A scenario file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// One paragraph: what it shows.
    #[serde(default)]
    pub description: String,
    /// Virtual time to run (sources stop here; in-flight packets then drain).
    pub duration: Dur,
    /// Window the headline rates are averaged over.
    pub measure: [Dur; 2],
    /// Time-series sample interval.
    #[serde(default = "ms10")]
    pub sample: Dur,
    /// Interval between a long flow's trains.
    #[serde(default = "ms5")]
    pub train: Dur,
    /// Default seed.
    #[serde(default = "one64")]
    pub seed: u64,
    /// Fabric parameters (defaults documented in `spillway_fabric::params`).
    #[serde(default)]
    pub fabric: FabricParams,
    /// Long-flow groups.
    #[serde(default)]
    pub flows: Vec<FlowGroup>,
    /// Short-connection generators.
    #[serde(default)]
    pub cps: Vec<CpsGroup>,
    /// Host load changes.
    #[serde(default)]
    pub host_load: Vec<HostLoad>,
    /// Faults.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// A zero-loss connection-rate sweep over the plane's size (see [`Sweep`]).
    #[serde(default)]
    pub sweep: Option<Sweep>,
    /// A comparison of placement policies on this workload (see [`Compare`]).
    #[serde(default)]
    pub compare: Option<Compare>,
    /// An operator hold set at time zero (`auto`, the default: URSched decides; `active`: a
    /// plane is started at once and activated with every bucket redirected as soon as it is
    /// synced, as `spillway ctl activate` does). Ignored by the DPU-only baseline.
    #[serde(default)]
    pub hold: HoldSpec,
    /// A with/without-vATC comparison on this workload (see [`VatcCompare`]).
    #[serde(default)]
    pub vatc: Option<VatcCompare>,
    /// Most work one run may take, in estimated events (see [`Scenario::work`]); default
    /// [`WORK_MAX_DEFAULT`], at most [`WORK_MAX_LIMIT`]. A scenario over the default is
    /// rejected before it runs: raise this to run it anyway.
    #[serde(default)]
    pub work_max: Option<f64>,
}

/// Default bound on the estimated events of one run ([`Scenario::work`]): a few minutes of a
/// release build (the built-in `release` scenario estimates 2.4e7 and took 75 s on a loaded
/// 2-core machine); every built-in scenario stays under a quarter of it.
pub const WORK_MAX_DEFAULT: f64 = 1e8;
/// Largest `work_max` a scenario may set: hours of run time, and the event queue and samples
/// grow with it.
pub const WORK_MAX_LIMIT: f64 = 2e10;
/// Most flows all `[[flows]]` groups together may hold: each is simulated state (about 200
/// bytes) for the whole run.
pub const FLOWS_TOTAL_MAX: u64 = 10_000_000;
/// Longest time any duration field of a scenario may name (a start, an end, a lifetime): the
/// bound on `duration`.
pub const HORIZON_MAX: Duration = Duration::from_secs(3600);

/// The estimated work of one run, by source (see [`Scenario::work`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Work {
    /// Estimated events in all.
    pub total: f64,
    /// The source contributing most, by field (`flows[2]`, `cps[0]`,
    /// `fabric.host.heartbeat`, ...), and its events.
    pub largest: (String, f64),
}

/// The operator hold a scenario starts with.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum HoldSpec {
    /// URSched decides.
    #[default]
    Auto,
    /// Keep a plane active with every bucket redirected.
    Active,
}

/// The vATC comparison (`crate::run_vatc_compare`): the workload runs three times with the same
/// seed: on the DPU alone (the baseline), through the plane without vATC and with it; then, for
/// each parameter of `sensitivity`, the two plane runs again with the parameter divided and
/// multiplied by `factor`, to find the parameter the without/with ratio depends on most.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VatcCompare {
    /// Parameters to vary, by dotted name (one of [`SENSITIVITY_PARAMS`]).
    #[serde(default)]
    pub sensitivity: Vec<String>,
    /// The factor each is divided and multiplied by; default 2.
    #[serde(default = "two")]
    pub factor: f64,
    /// Latency is measured in a second set of runs of the three paths with every flow group's
    /// and connection generator's rate scaled by this (default 0.25), a load every path carries:
    /// at saturation latency is only the length of the fullest queue.
    #[serde(default = "quarter")]
    pub latency_load: f64,
}

fn quarter() -> f64 {
    0.25
}

fn two() -> f64 {
    2.0
}

/// The parameters a [`VatcCompare`] may vary: the costs on the two paths.
pub const SENSITIVITY_PARAMS: [&str; 8] = [
    "pcie.bandwidth_bytes",
    "pcie.overhead_bytes",
    "pcie.phy_vnic_pps_limit",
    "pcie.latency",
    "dpu.steer_pps_limit",
    "host.pkt_cost",
    "host.vatc_copy_cost",
    "host.copy_bandwidth_bytes",
];

/// Whether a larger value of the parameter `name` (one of [`SENSITIVITY_PARAMS`]) makes its
/// resource more capable (a rate or a bandwidth) rather than dearer (a cost or a latency).
pub fn larger_is_better(name: &str) -> bool {
    matches!(
        name,
        "pcie.bandwidth_bytes"
            | "pcie.phy_vnic_pps_limit"
            | "dpu.steer_pps_limit"
            | "host.copy_bandwidth_bytes"
    )
}

/// `f` with the parameter `name` (one of [`SENSITIVITY_PARAMS`]) scaled by `factor`.
pub fn scale_param(f: &FabricParams, name: &str, factor: f64) -> Option<FabricParams> {
    let mut f = f.clone();
    let dur = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() * factor);
    match name {
        "pcie.bandwidth_bytes" => f.pcie.bandwidth_bytes *= factor,
        "pcie.overhead_bytes" => {
            f.pcie.overhead_bytes = (f64::from(f.pcie.overhead_bytes) * factor).round() as u32;
        }
        "pcie.phy_vnic_pps_limit" => f.pcie.phy_vnic_pps_limit *= factor,
        "pcie.latency" => f.pcie.latency = dur(f.pcie.latency),
        "dpu.steer_pps_limit" => f.dpu.steer_pps_limit *= factor,
        "host.pkt_cost" => f.host.pkt_cost = dur(f.host.pkt_cost),
        "host.vatc_copy_cost" => f.host.vatc_copy_cost = dur(f.host.vatc_copy_cost),
        "host.copy_bandwidth_bytes" => f.host.copy_bandwidth_bytes *= factor,
        _ => return None,
    }
    Some(f)
}

/// A comparison of placement policies: the scenario runs once per policy with the same seed,
/// so every policy sees the same workload, hardware table and insertion budget
/// (`crate::run_placement_compare`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Compare {
    /// The policies, by the names `--placement` takes (`first-come`, `ovs-rebalance`,
    /// `threshold`, ...), in report order.
    #[serde(deserialize_with = "policy_names")]
    pub policies: Vec<PlacementKind>,
}

fn policy_names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PlacementKind>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    names
        .iter()
        .map(|n| n.parse::<PlacementKind>().map_err(serde::de::Error::custom))
        .collect()
}

/// A zero-loss CPS sweep (RFC 2544 style): for each worker count, binary search for the highest
/// constant connection rate that a trial carries with no lost packet. A trial offers
/// `warmup_rate` for `warmup` (the SoC near saturation, so URSched activates the plane), then
/// ramps to the trial rate over `ramp` and holds it for `trial`. Connections take the shape of the scenario's first `[[cps]]`
/// group (tenants, gap, destination); its rates are ignored.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// Worker counts (0: the DPU-only baseline).
    pub workers: Vec<u32>,
    /// Rate during the warm-up, connections/s.
    pub warmup_rate: f64,
    /// Warm-up length.
    pub warmup: Dur,
    /// The rate then ramps linearly to the trial rate over this long (URSched tracks a ramp; a
    /// step of several hundred thousand connections per second would overflow the SoC's queue
    /// within one 10 ms decision window).
    #[serde(default = "ms100")]
    pub ramp: Dur,
    /// Trial length (at the trial rate, after the ramp).
    pub trial: Dur,
    /// Lowest rate searched.
    pub low: f64,
    /// Highest rate searched.
    pub high: f64,
    /// Bisection steps (resolution (high - low) / 2^iterations).
    pub iterations: u32,
}

fn one() -> u32 {
    1
}
fn one64() -> u64 {
    1
}
fn bytes64() -> u32 {
    64
}
fn gap20() -> Dur {
    Dur(Duration::from_micros(20))
}
fn ms10() -> Dur {
    Dur(Duration::from_millis(10))
}
fn ms100() -> Dur {
    Dur(Duration::from_millis(100))
}
fn ms5() -> Dur {
    Dur(Duration::from_millis(5))
}

/// A scenario that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML did not parse or did not match the schema (the message names the field).
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// The parser's message, with line and field.
        message: String,
    },
    /// A value out of range.
    #[error("{file}: {field}: expected {expected}, got {actual}")]
    Invalid {
        /// The file.
        file: String,
        /// Dotted field path.
        field: String,
        /// What was expected.
        expected: String,
        /// What was found.
        actual: String,
    },
    /// No built-in scenario of that name.
    #[error("no built-in scenario {name:?}; built-in: {known}")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names available.
        known: String,
    },
}

/// The built-in scenarios: `(name, file name, TOML)`.
pub const BUILTIN: &[(&str, &str, &str)] = &[
    (
        "micro-burst",
        "scenarios/micro-burst.toml",
        include_str!("../../../../scenarios/micro-burst.toml"),
    ),
    (
        "steady-mix",
        "scenarios/steady-mix.toml",
        include_str!("../../../../scenarios/steady-mix.toml"),
    ),
    (
        "cps-ramp",
        "scenarios/cps-ramp.toml",
        include_str!("../../../../scenarios/cps-ramp.toml"),
    ),
    (
        "cps-sweep",
        "scenarios/cps-sweep.toml",
        include_str!("../../../../scenarios/cps-sweep.toml"),
    ),
    (
        "noisy-tenant",
        "scenarios/noisy-tenant.toml",
        include_str!("../../../../scenarios/noisy-tenant.toml"),
    ),
    (
        "two-tenants",
        "scenarios/two-tenants.toml",
        include_str!("../../../../scenarios/two-tenants.toml"),
    ),
    (
        "release",
        "scenarios/release.toml",
        include_str!("../../../../scenarios/release.toml"),
    ),
    (
        "fail-open",
        "scenarios/fail-open.toml",
        include_str!("../../../../scenarios/fail-open.toml"),
    ),
    (
        "failover-warm",
        "scenarios/failover-warm.toml",
        include_str!("../../../../scenarios/failover-warm.toml"),
    ),
    (
        "stall",
        "scenarios/stall.toml",
        include_str!("../../../../scenarios/stall.toml"),
    ),
    (
        "upgrade",
        "scenarios/upgrade.toml",
        include_str!("../../../../scenarios/upgrade.toml"),
    ),
    (
        "placement",
        "scenarios/placement.toml",
        include_str!("../../../../scenarios/placement.toml"),
    ),
    (
        "placement-volatile",
        "scenarios/placement-volatile.toml",
        include_str!("../../../../scenarios/placement-volatile.toml"),
    ),
    (
        "vatc",
        "scenarios/vatc.toml",
        include_str!("../../../../scenarios/vatc.toml"),
    ),
];

/// The default scenario.
pub const DEFAULT: &str = "micro-burst";

impl Scenario {
    /// An upper estimate of one run's events, the simulator's unit of work: each long flow's
    /// trains (one per `train` while it lives), the six packets of each connection a `[[cps]]`
    /// group opens and of each long flow's handshake and teardown, and the periodic timers
    /// (`sample`, the plane's `fabric.host.heartbeat`, URSched's `fabric.sched.window` and
    /// `variance_window`) over `duration`. Each counts a small constant number of queue events
    /// in the engine; the estimate is for bounding absurd inputs, not for prediction.
    pub fn work(&self) -> Work {
        let secs = |d: Dur| d.0.as_secs_f64();
        let horizon = secs(self.duration);
        let train = secs(self.train);
        let mut parts: Vec<(String, f64)> = Vec::new();
        for (i, g) in self.flows.iter().enumerate() {
            let active = secs(g.lifetime).min((horizon - secs(g.start)).max(0.0));
            let count = f64::from(g.count);
            parts.push((format!("flows[{i}]"), count * (active / train + 6.0)));
        }
        for (i, c) in self.cps.iter().enumerate() {
            let span = (secs(c.end).min(horizon) - secs(c.start)).max(0.0);
            parts.push((
                format!("cps[{i}]"),
                6.0 * (c.rate_from + c.rate_to) / 2.0 * span,
            ));
        }
        let timers = [
            ("sample", self.sample.0),
            ("fabric.host.heartbeat", self.fabric.host.heartbeat),
            ("fabric.sched.window", self.fabric.sched.window),
            (
                "fabric.sched.variance_window",
                self.fabric.sched.variance_window,
            ),
        ];
        for (name, period) in timers {
            // Validation rejects zero periods before this is used; guard the division anyway.
            parts.push((name.to_string(), horizon / period.as_secs_f64().max(1e-9)));
        }
        let total = parts.iter().map(|(_, w)| w).sum();
        let largest = parts
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("the timers are always there");
        Work { total, largest }
    }

    /// A built-in scenario by name.
    pub fn builtin(name: &str) -> Result<Scenario, ScenarioError> {
        let (_, file, text) =
            BUILTIN
                .iter()
                .find(|(n, _, _)| *n == name)
                .ok_or_else(|| ScenarioError::Unknown {
                    name: name.to_string(),
                    known: BUILTIN
                        .iter()
                        .map(|(n, _, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
        Scenario::from_toml_str(text, file)
    }

    /// A scenario from a file.
    pub fn from_file(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            file: file.clone(),
            source,
        })?;
        Scenario::from_toml_str(&text, &file)
    }

    /// A scenario from TOML text; `file` names it in errors.
    pub fn from_toml_str(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            file: file.to_string(),
            // Line, column and the field's dotted path, with quoted values bounded: the
            // message of a value error (a bad duration, say) names neither.
            message: spillway_vswitch::policy::describe(text, &e),
        })?;
        s.validate(file)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_loads() {
        for (name, _, _) in BUILTIN {
            Scenario::builtin(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    const HEAD: &str = "name = \"x\"\nduration = \"1s\"\nmeasure = [\"0s\", \"1s\"]\n";

    #[test]
    fn builtins_stay_inside_a_quarter_of_the_default_work_bound() {
        for (name, _, _) in BUILTIN {
            let s = Scenario::builtin(name).unwrap();
            let w = match &s.sweep {
                Some(sw) => crate::sweep_trial(&s, 0, sw.high).work(),
                None => s.work(),
            };
            assert!(w.total < WORK_MAX_DEFAULT / 4.0, "{name}: {w:?}");
        }
    }

    #[test]
    fn a_nanosecond_heartbeat_or_window_is_rejected_with_its_range() {
        for (section, key, field) in [
            ("fabric.host", "heartbeat", "fabric.host.heartbeat"),
            ("fabric.sched", "window", "fabric.sched.window"),
            (
                "fabric.sched",
                "variance_window",
                "fabric.sched.variance_window",
            ),
        ] {
            for v in ["1ns", "7200s"] {
                let e = Scenario::from_toml_str(
                    &format!("{HEAD}[{section}]\n{key} = \"{v}\"\n"),
                    "s.toml",
                )
                .unwrap_err()
                .to_string();
                // The fabric's own ranges (FabricParams::validate), named by their full path.
                assert!(
                    e.starts_with(&format!("s.toml: {field}: expected a duration in 1ms..=")),
                    "{key} = {v}: {e}"
                );
            }
        }
        let e = Scenario::from_toml_str(&format!("{HEAD}sample = \"1ns\"\n"), "s.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("s.toml: sample: expected at least 100us"),
            "{e}"
        );
        let ok = Scenario::from_toml_str(
            &format!("{HEAD}[fabric.host]\nheartbeat = \"1ms\"\n"),
            "s.toml",
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn absurd_total_work_is_rejected_naming_the_source_and_how_to_raise_it() {
        // 10 M flows at 1e8 pps for an hour: accepted before, then grew without output.
        let text = "name = \"x\"\nduration = \"3600s\"\nmeasure = [\"0s\", \"1s\"]\n\
                    [[flows]]\ncount = 10000000\npps = 1e8\nlifetime = \"3600s\"\n";
        let e = Scenario::from_toml_str(text, "big.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("big.toml: work_max: expected one run within 1.000e8 estimated events (most from flows[0]: 7.200e12)"),
            "{e}"
        );
        assert!(
            e.contains("split the scenario") && e.contains("set work_max"),
            "{e}"
        );
        // A connection rate over a long run, and a sweep whose trial is too big.
        let e = Scenario::from_toml_str(
            &format!("{HEAD}[[cps]]\nrate_from = 1e8\nrate_to = 1e8\nend = \"1s\"\n"),
            "c.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("most from cps[0]: 6.000e8"), "{e}");
        // work_max raises the bound, within its own limit.
        let over = "name = \"x\"\nduration = \"10s\"\nmeasure = [\"0s\", \"1s\"]\n\
                    [[flows]]\ncount = 300000\npps = 1.0\nlifetime = \"10s\"\n";
        assert!(Scenario::from_toml_str(over, "o.toml").is_err());
        let raised = format!("work_max = 1e9\n{over}");
        assert!(Scenario::from_toml_str(&raised, "o.toml").is_ok());
        let e = Scenario::from_toml_str(&format!("work_max = 1e12\n{over}"), "o.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("o.toml: work_max: expected a number of events in [1, 2e10]"),
            "{e}"
        );
    }

    #[test]
    fn flow_totals_tenant_ranges_and_horizons_are_bounded() {
        let e = Scenario::from_toml_str(
            &format!(
                "work_max = 1e10\n{HEAD}[[flows]]\ncount = 6000000\npps = 1.0\nlifetime = \"1ms\"\n\
                 [[flows]]\ncount = 6000000\npps = 1.0\nlifetime = \"1ms\"\n"
            ),
            "f.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("f.toml: flows[*].count: expected at most 10000000"),
            "{e}"
        );
        let e = flows("tenant = 4294967295\ntenants = 2\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("s.toml: flows[0].tenants: expected tenant + tenants - 1"),
            "{e}"
        );
        let e = flows("start = \"7200s\"\n").unwrap_err().to_string();
        assert!(
            e.starts_with("s.toml: flows[0].start: expected at most 1h"),
            "{e}"
        );
        let e = Scenario::from_toml_str(
            &format!("{HEAD}[[host_load]]\nat = \"0s\"\ntenant_cores = 4294967295\n"),
            "s.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "s.toml: host_load[0].tenant_cores: expected at most fabric.host.cores (64)"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_parse_error_names_line_column_and_field_without_echoing_a_huge_line() {
        let big = "9".repeat(200_000);
        let e = Scenario::from_toml_str(&format!("{HEAD}seed = \"{big}\"\n"), "s.toml")
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
        assert!(
            e.starts_with("s.toml: line 4, column 8, field seed: invalid type"),
            "{e}"
        );
    }

    fn flows(extra: &str) -> Result<Scenario, ScenarioError> {
        Scenario::from_toml_str(
            &format!("{HEAD}[[flows]]\ncount = 1\npps = 100.0\nlifetime = \"1s\"\n{extra}"),
            "s.toml",
        )
    }

    #[test]
    fn shapes_parse_with_their_fields() {
        let s = flows("shape = \"periodic\"\nperiod = \"2s\"\namplitude = 0.5\n").unwrap();
        assert_eq!(s.flows[0].shape, Shape::Periodic);
        assert_eq!(s.flows[0].amplitude, Some(0.5));
        let s = flows("shape = \"bursty\"\non = \"10ms\"\noff = \"30ms\"\narrivals = \"random\"\nlifetimes = \"exponential\"\n").unwrap();
        assert_eq!(s.flows[0].shape, Shape::Bursty);
        assert_eq!(s.flows[0].arrivals, Arrivals::Random);
        assert_eq!(s.flows[0].lifetimes, Lifetimes::Exponential);
        let s = flows("shape = \"random-walk\"\nvolatility = 0.2\nstep = \"50ms\"\n").unwrap();
        assert_eq!(s.flows[0].volatility, Some(0.2));
        assert_eq!(flows("").unwrap().flows[0].shape, Shape::Steady);
    }

    #[test]
    fn a_shape_field_that_is_missing_out_of_range_or_foreign_is_named() {
        let cases = [
            ("shape = \"periodic\"\namplitude = 0.5\n", "flows[0].period"),
            (
                "shape = \"periodic\"\nperiod = \"1s\"\n",
                "flows[0].amplitude",
            ),
            (
                "shape = \"periodic\"\nperiod = \"1s\"\namplitude = 1.5\n",
                "flows[0].amplitude",
            ),
            (
                "shape = \"periodic\"\nperiod = \"1s\"\namplitude = 0.5\non = \"1ms\"\noff = \"1ms\"\n",
                "flows[0].on",
            ),
            ("shape = \"bursty\"\n", "flows[0].on"),
            ("shape = \"random-walk\"\n", "flows[0].volatility"),
            (
                "shape = \"random-walk\"\nvolatility = 0.1\nstep = \"10us\"\n",
                "flows[0].step",
            ),
            ("volatility = 0.1\n", "flows[0].volatility"),
            ("period = \"1s\"\n", "flows[0].period"),
            (
                "shape = \"bursty\"\non = \"1ms\"\noff = \"1ms\"\nstep = \"1s\"\n",
                "flows[0].step",
            ),
        ];
        for (extra, field) in cases {
            let e = flows(extra).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("s.toml: {field}: expected")),
                "{extra:?}: {e}"
            );
        }
        let e = flows("shape = \"square\"\n").unwrap_err().to_string();
        assert!(e.contains("s.toml") && e.contains("shape"), "{e}");
    }

    #[test]
    fn compare_names_its_policies_and_rejects_unknown_or_repeated_ones() {
        let s = Scenario::from_toml_str(
            &format!("{HEAD}[compare]\npolicies = [\"threshold\", \"first-come\"]\n"),
            "c.toml",
        )
        .unwrap();
        assert_eq!(
            s.compare.unwrap().policies,
            vec![PlacementKind::Threshold, PlacementKind::FirstCome]
        );
        let e = Scenario::from_toml_str(
            &format!("{HEAD}[compare]\npolicies = [\"first-come\", \"best\"]\n"),
            "c.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("c.toml") && e.contains("policies") && e.contains("\"best\""),
            "{e}"
        );
        let e = Scenario::from_toml_str(
            &format!("{HEAD}[compare]\npolicies = [\"threshold\", \"threshold\"]\n"),
            "c.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("c.toml: compare.policies[1]"), "{e}");
        let e = Scenario::from_toml_str(&format!("{HEAD}[compare]\npolicies = []\n"), "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("c.toml: compare.policies"), "{e}");
    }

    #[test]
    fn a_bad_field_names_file_and_field() {
        let e = Scenario::from_toml_str(
            "name = \"x\"\nduration = \"1s\"\nmeasure = [\"0s\", \"1s\"]\n[[flows]]\ncount = 1\npps = -3.0\nlifetime = \"1s\"\n",
            "bad.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("bad.toml: flows[0].pps: expected"), "{e}");
        let e = Scenario::from_toml_str(
            "name = \"x\"\nduration = \"1 fortnight\"\nmeasure = [\"0s\", \"1s\"]\n",
            "b.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("b.toml") && e.contains("duration"), "{e}");
        let e = Scenario::from_toml_str("name = \"x\"\nduration = \"1s\"\nmeasure = [\"0s\", \"1s\"]\n[fabric.dpu]\nhw_pps = 3\n", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.toml") && e.contains("hw_pps"), "{e}");
    }
}
