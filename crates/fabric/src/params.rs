//! Every capacity and cost of the emulated fabric, with its default and where the default comes
//! from. Nothing in the model has a result written in: throughput, loss and latency emerge from
//! these numbers.
//!
//! Sources, cited per field: **[paper]** is the Spillway paper (Zhejiang University and Alibaba Cloud; testbed:
//! CPU/FPGA DPU with 2x100 Gbps, 64-core host; DPU saturates near 7.0 Mpps and still processes
//! 7.2 Mpps under 9.2 Mpps offered; Elastic VM start 200 ms, rule injection ~10 ms; 2.0 Mpps of
//! overflow on ~2.3 physical cores; CPS doubled with seven physical cores). **[assumed]** marks a
//! value chosen for this model where the paper gives none, with the reasoning beside it; change it
//! in a scenario file to explore.
//!
//! [`FabricParams::validate`] checks every field against a range; `docs/CONFIG.md` lists them.
//!
//! Over 1,000 lines because every field carries its default, its source and its reasoning, and
//! `validate` its range, in one place a reader can check against `docs/CONFIG.md`.

use core::time::Duration;
use serde::Deserialize;

/// Nanoseconds in a `Duration` field, saturating.
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The DPU's limits.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DpuParams {
    /// Packets per second the hardware fast path can process with a flow entry's actions
    /// (lookup, conntrack update, rewrite, encap). [paper]: saturates near 7.0 Mpps and carries
    /// 7.2 Mpps under a 9.2 Mpps burst, so 7.2 Mpps.
    pub hw_pps_limit: f64,
    /// Packets the fast path's input queue holds before it drops (`dpu.hw.overload`).
    /// [assumed]: 4,096 descriptors, a common NIC receive-ring size (~0.6 ms at 7.2 Mpps).
    pub hw_queue_packets: u32,
    /// Fixed latency of a fast-path packet. [assumed]: 2 us, an FPGA pipeline plus DMA.
    #[serde(with = "humantime_us")]
    pub hw_latency: Duration,
    /// Exact-match flow entries in the hardware table (one per direction of a connection).
    /// [assumed]: 2,000,000 (1M connections), the order of current 100G-class DPUs.
    pub hw_entries_max: usize,
    /// Hardware rule insertions per second. [assumed]: 4,000,000/s, so at the SoC's own
    /// connection rate (two entries per connection) insertion is not the DPU-only bottleneck.
    pub insert_rate_limit: f64,
    /// Latency from an insert command to the entry being live. [assumed]: 20 us.
    #[serde(with = "humantime_us")]
    pub insert_latency: Duration,
    /// Pending inserts the hardware queue holds; beyond it an insert is refused and counted.
    /// [assumed]: 65,536.
    pub insert_queue_max: u32,
    /// Latency of installing or removing the redirect rules (a small, high-priority table
    /// written by the control plane). [paper]: rule injection takes about 10 ms.
    #[serde(with = "humantime_us")]
    pub redirect_latency: Duration,
    /// Latency of flipping the live redirect rules from one plane slot's vNIC set to the
    /// other's (a failover to the warm plane): the rules steer through one indirection entry
    /// naming the vNIC set, so a flip is one write and its completion, not the quota's rules
    /// again. Packets steered meanwhile still go to the old set. [assumed]: 1 ms.
    #[serde(with = "humantime_us")]
    pub flip_latency: Duration,
    /// How long a release waits for the plane's `Drained` after asking it to drain; then the
    /// DPU stops the plane anyway (what it had not handed back is kept from the DPU's copies).
    /// A bound, so that a plane that lost a packet of the drain fence cannot hold the release.
    /// [assumed]: 200 ms.
    #[serde(with = "humantime_us")]
    pub drain_timeout: Duration,
    /// Hash buckets the redirect rules split the 5-tuple space into (the overflow quota is a
    /// number of buckets). [assumed]: 256, an RSS indirection table's size.
    pub redirect_buckets: u16,
    /// Packets per second the hardware can steer by a redirect rule or pass from the host back
    /// out (parse + match, no rewrite). [paper]: 2x100 Gbps line rate at 64 B, 297.6 Mpps.
    pub steer_pps_limit: f64,
    /// SoC cores running the slow path. [assumed]: 8 (a BlueField-2-class ARM complex).
    pub soc_cores: u32,
    /// SoC core time for a new connection: policy walk, conntrack create, two entries built and
    /// the insert commands issued. [assumed]: 8 us, so the DPU alone sets up 1.0M connections/s.
    #[serde(with = "humantime_us")]
    pub soc_new_conn_cost: Duration,
    /// SoC core time for a packet of a known connection that missed the hardware (its entry is
    /// pending or was refused). [assumed]: 2 us.
    #[serde(with = "humantime_us")]
    pub soc_miss_cost: Duration,
    /// SoC core time to ingest one state-sync message from the spill plane (the mirror that
    /// keeps the DPU able to fail open). [assumed]: 0.5 us.
    #[serde(with = "humantime_us")]
    pub soc_sync_cost: Duration,
    /// SoC core time for a rule command that a new connection's cost does not cover: each
    /// insert of a recall (the plane handing a flow back) and each delete of an entry (closed,
    /// demoted, shed, rolled back). Each such command, as every insert, is also one message
    /// from the SoC to the switch ASIC (`dpu.rule.msgs`). [assumed]: 0 by default, so the
    /// published figures of the scenarios that do not set it stand; the placement scenarios
    /// set 20 us (a synchronous rule insertion in software).
    #[serde(with = "humantime_us", default)]
    pub soc_rule_cost: Duration,
    /// Packets the slow-path queue holds before it drops (`dpu.soc.queue_full`). [assumed]: 8,192.
    pub soc_queue_packets: u32,
    /// DPU memory for connection state and flow entries. [assumed]: 2 GiB.
    pub mem_bytes: u64,
    /// Memory per tracked connection. [assumed]: 256 B.
    pub mem_per_conn: u64,
    /// Memory per flow entry. [assumed]: 128 B.
    pub mem_per_entry: u64,
    /// Shards the DPU node splits its connections over, by redirect bucket: what a driver
    /// with one forwarding thread per shard runs. The DPU's limits stay one budget for all of
    /// them. [assumed]: 1 (the paper's DPU model has no such split; a simulation with more
    /// checks that the lifecycle works across shards).
    pub shards: u32,
}

impl Default for DpuParams {
    fn default() -> Self {
        DpuParams {
            hw_pps_limit: 7.2e6,
            hw_queue_packets: 4096,
            hw_latency: Duration::from_micros(2),
            hw_entries_max: 2_000_000,
            insert_rate_limit: 4.0e6,
            insert_latency: Duration::from_micros(20),
            insert_queue_max: 65_536,
            redirect_latency: Duration::from_millis(10),
            flip_latency: Duration::from_millis(1),
            drain_timeout: Duration::from_millis(200),
            redirect_buckets: 256,
            steer_pps_limit: 297.6e6,
            soc_cores: 8,
            soc_new_conn_cost: Duration::from_micros(8),
            soc_miss_cost: Duration::from_micros(2),
            soc_sync_cost: Duration::from_nanos(500),
            soc_rule_cost: Duration::ZERO,
            soc_queue_packets: 8192,
            mem_bytes: 2 << 30,
            mem_per_conn: 256,
            mem_per_entry: 128,
            shards: 1,
        }
    }
}

/// The PCIe link between DPU and host, and the vNIC set on it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PcieParams {
    /// One-way latency of a crossing. [assumed]: 1 us (DMA + doorbell + descriptor fetch).
    #[serde(with = "humantime_us")]
    pub latency: Duration,
    /// Usable bandwidth per direction, bytes/s. [assumed]: PCIe Gen4 x16, ~25 GB/s after
    /// protocol overhead. Every packet crossing occupies its direction of the link for
    /// `(packet bytes + overhead_bytes) / bandwidth_bytes`: the steered packet to the plane, the
    /// plane's packet back to the DPU, and every packet the DPU writes into a VM (its own and
    /// the plane's), in one shared FIFO per direction (`pcie.link_full` when its queue is full).
    pub bandwidth_bytes: f64,
    /// Bytes of descriptor and TLP overhead per packet crossing. [assumed]: 64.
    pub overhead_bytes: u32,
    /// Packets a direction of the link holds queued. PCIe is lossless: a sender stops feeding a
    /// link that is half full (its phy vNIC ring backs up and drops, `vnic.phy.ring_full`);
    /// only writes into VMs beyond the whole queue are dropped (`pcie.link_full`).
    /// [assumed]: 8,192 (about 0.5 ms of 1,500-byte packets at 25 GB/s).
    pub link_queue_packets: u32,
    /// Packets per second the phy vNIC moves per direction (the DPU's host-queue DMA engine
    /// serving the plane's queue pair; the link bandwidth is charged separately).
    /// [assumed]: 10 Mpps; this is what caps spill-plane CPS (see docs/ARCHITECTURE.md).
    pub phy_vnic_pps_limit: f64,
    /// Packets a phy vNIC ring holds before it drops (`spill.vnic.ring_full`). [assumed]: 4,096.
    pub phy_vnic_ring: u32,
    /// Messages per second on the flow vNIC (inserts and state sync). [assumed]: 20M/s.
    pub flow_vnic_msgs_limit: f64,
    /// Control-channel retransmission timeout for deletions. [assumed]: 1 ms.
    #[serde(with = "humantime_us")]
    pub control_rto: Duration,
}

impl Default for PcieParams {
    fn default() -> Self {
        PcieParams {
            latency: Duration::from_micros(1),
            bandwidth_bytes: 25e9,
            overhead_bytes: 64,
            link_queue_packets: 8192,
            phy_vnic_pps_limit: 10e6,
            phy_vnic_ring: 4096,
            flow_vnic_msgs_limit: 20e6,
            control_rto: Duration::from_millis(1),
        }
    }
}

/// The host and its spill plane.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HostParams {
    /// Host cores. [paper]: a 64-core host.
    pub cores: u32,
    /// Cores the tenants use (not isolatable). [assumed]: 48, leaving 16 idle.
    pub tenant_cores: u32,
    /// Idle cores kept free for tenants' own bursts; never given to the spill plane.
    /// [assumed]: 2.
    pub reserve_cores: u32,
    /// Most workers the spill plane may have. [assumed]: 16.
    pub workers_max: u32,
    /// Workers the plane starts with. [assumed]: 2 ([paper]: 2.0 Mpps on ~2.3 cores).
    pub workers_initial: u32,
    /// Host core time per packet of an established connection on the spill plane, vNIC I/O
    /// included. [paper]: 2.0 Mpps on ~2.3 physical cores, ~1.15 us per packet.
    #[serde(with = "humantime_us")]
    pub pkt_cost: Duration,
    /// Host core time for a new connection (policy walk, conntrack create, flow-cache entries,
    /// state mirror to the DPU). [assumed]: 2.5 us on an x86 core (our pipeline measures 1.3 us
    /// for the walk alone on the development VM; see the README's benchmark table).
    #[serde(with = "humantime_us")]
    pub new_conn_cost: Duration,
    /// Plane start latency (Idle -> Preparing -> up). [paper]: the Elastic VM activates within
    /// 200 ms.
    #[serde(with = "humantime_us")]
    pub plane_start: Duration,
    /// Latency to add a worker to a running plane. [assumed]: 1 ms (a pinned thread on an
    /// already-isolated core).
    #[serde(with = "humantime_us")]
    pub worker_start: Duration,
    /// Software flow-cache entries in the spill plane. [assumed]: 4,000,000.
    pub flow_cache_max: usize,
    /// Heartbeat period of the plane; the DPU fails open after three missed beats.
    /// [assumed]: 5 ms.
    #[serde(with = "humantime_us")]
    pub heartbeat: Duration,
    /// The heartbeat period the DPU allows a plane on a remote pool host, whose beats cross the
    /// network: it fails after three of these pass without one (the plane still beats every
    /// `heartbeat`). The larger of the two counts. [assumed]: 100 ms (a data-centre round
    /// trip and its scheduling jitter, well inside the seed's 2 s cross-node failover).
    #[serde(with = "humantime_us")]
    pub remote_heartbeat: Duration,
    /// Deliver VM-bound packets straight into VM memory (vATC, issue 6) instead of back through
    /// the DPU. Off by default: the built-in scenarios model the path without it, and the `vatc`
    /// scenario compares the two.
    pub vatc: bool,
    /// Host core time per packet the plane delivers with vATC, on top of `pkt_cost`: the
    /// translation lookup on a hit, the VM's receive descriptor read and its used-ring write.
    /// [assumed]: 50 ns (a few cache misses on the VM's ring).
    #[serde(with = "humantime_us")]
    pub vatc_copy_cost: Duration,
    /// Bytes per second one host core copies into VM memory with vATC (the per-byte part of
    /// the copy). [assumed]: 10 GB/s, a `memcpy` from cache into DRAM on one core.
    pub copy_bandwidth_bytes: f64,
    /// Share of vATC translations that hit the plane's cache. [assumed]: 0.99 (a VM's receive
    /// buffers are few, long-lived regions, so a cache of `atc::AtcConfig::default` entries
    /// holds them; misses follow remaps and new VMs). Charged as its expectation per packet:
    /// deterministic, no random draw.
    pub vatc_hit_ratio: f64,
    /// Host core time of a translation miss: the request to the VM's device model and the fill.
    /// [assumed]: 2 us (a round trip to the device-model thread on another core).
    #[serde(with = "humantime_us")]
    pub vatc_miss_cost: Duration,
    /// Keep a warm standby plane in the second plane slot while a plane is up: started on its
    /// own cores with `warm_workers` workers, bulk-synced and kept current in shadow (every
    /// state message the DPU sends or takes is relayed to it), so that a failed or stalled
    /// active plane is replaced by flipping the redirect rules to the warm slot, with every
    /// connection's state already there. Off by default: it costs the warm plane's cores and
    /// memory for as long as a plane is up. [seed]: two vNIC sets, one active and one warm.
    pub warm_standby: bool,
    /// Workers of the warm standby plane while it waits; at a failover it is asked for the
    /// failed plane's workers (each starts after `worker_start`). [assumed]: 1.
    pub warm_workers: u32,
    /// How often the DPU compares per-bucket digests of the connection state it holds with the
    /// warm plane's copies (also once as soon as the warm plane is synced); a bucket that
    /// differs is resynced. 0: only that first time. [assumed]: 100 ms.
    #[serde(with = "humantime_us")]
    pub digest_interval: Duration,
    /// Per-tenant fairness of the plane's workers: the share of their queue (`pcie.
    /// phy_vnic_ring` packets waiting or in service) one tenant's packets may hold. A packet
    /// past it is dropped (`spill.tenant_share`) while the queue still has room for the
    /// others, so a tenant whose burst saturates the plane loses its own packets rather than a
    /// quiet tenant's. 1 (the default) is off. [assumed]: off.
    pub tenant_worker_share: f64,
}

impl Default for HostParams {
    fn default() -> Self {
        HostParams {
            cores: 64,
            tenant_cores: 48,
            reserve_cores: 2,
            workers_max: 16,
            workers_initial: 2,
            pkt_cost: Duration::from_nanos(1150),
            new_conn_cost: Duration::from_nanos(2500),
            plane_start: Duration::from_millis(200),
            worker_start: Duration::from_millis(1),
            flow_cache_max: 4_000_000,
            heartbeat: Duration::from_millis(5),
            remote_heartbeat: Duration::from_millis(100),
            vatc: false,
            vatc_copy_cost: Duration::from_nanos(50),
            copy_bandwidth_bytes: 10e9,
            vatc_hit_ratio: 0.99,
            vatc_miss_cost: Duration::from_micros(2),
            warm_standby: false,
            warm_workers: 1,
            digest_interval: Duration::from_millis(100),
            tenant_worker_share: 1.0,
        }
    }
}

/// URSched's thresholds.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedParams {
    /// Decision window. [assumed]: 10 ms.
    #[serde(with = "humantime_us")]
    pub window: Duration,
    /// Utilisation (fast path or SoC) above which the DPU is under pressure. [assumed]: 0.85.
    pub pressure_util: f64,
    /// Utilisation (fast path or SoC) above which the plane is prepared (shadow mode, no
    /// forwarding change). Default = `pressure_util`: a cold start at pressure, as in the paper.
    pub prepare_util: f64,
    /// Windows of pressure (N of the last M) before preparing and activating. [assumed]: 3 of 5.
    pub pressure_windows: u32,
    /// The M of "N of the last M windows".
    pub history_windows: u32,
    /// Fast-path and SoC utilisation the placement may fill the DPU up to. [assumed]: 0.98.
    pub dpu_target_util: f64,
    /// Release when the whole load would fit the DPU below this utilisation. [assumed]: 0.75
    /// (10 points of hysteresis below `pressure_util`).
    pub release_util: f64,
    /// Windows of low load before releasing. [assumed]: 50 (0.5 s).
    pub release_windows: u32,
    /// Spill-plane utilisation that adds a worker. [assumed]: 0.80.
    pub worker_add_util: f64,
    /// A tenant is noisy when its variance exceeds the cluster average by this factor.
    /// [paper]: ~25% above, so 1.25.
    pub variance_factor: f64,
    /// Squared coefficient of variation below which no tenant counts as noisy, however quiet
    /// the others are. [assumed]: 0.05 (a rate that varies by less than ~22%).
    pub variance_floor: f64,
    /// Windows of noise (N of the last M) before preparing. [assumed]: 3 of 5.
    pub variance_windows: u32,
    /// Length of a variance sample window. [paper]: 100 ms.
    #[serde(with = "humantime_us")]
    pub variance_window: Duration,
    /// Rate samples per variance estimate. [assumed]: 10 (one second of history).
    pub variance_samples: u32,
    /// DPU memory utilisation that prepares the plane. [paper]: "a threshold"; [assumed]: 0.80.
    pub mem_util: f64,
    /// A prepared (shadow) plane with no pressure for this long is released. [assumed]: 2 s.
    #[serde(with = "humantime_us")]
    pub shadow_idle: Duration,
    /// Buckets added to the overflow quota per pressured window. [assumed]: 8 of 256 (3%), so
    /// the quota tracks the overflow closely.
    pub quota_step: u16,
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams {
            window: Duration::from_millis(10),
            pressure_util: 0.85,
            prepare_util: 0.85,
            pressure_windows: 3,
            history_windows: 5,
            dpu_target_util: 0.98,
            release_util: 0.75,
            release_windows: 50,
            worker_add_util: 0.80,
            variance_factor: 1.25,
            variance_floor: 0.05,
            variance_windows: 3,
            variance_window: Duration::from_millis(100),
            variance_samples: 10,
            mem_util: 0.80,
            shadow_idle: Duration::from_secs(2),
            quota_step: 8,
        }
    }
}

/// Which placement policy recalls spill-plane flows to the DPU fast path.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementKind {
    /// Offload every host flow, first come first served, while entries and headroom last.
    FirstCome,
    /// Open vSwitch `offload-rebalance`: every 3 s, while the table is full, swap the
    /// lowest-pps offloaded flow for the highest-pps pending one.
    OvsRebalance,
    /// A bandwidth threshold (Andromeda's Hoverboard): recall the flows whose measured rate
    /// exceeds `threshold_pps`, fastest first, while entries last; never evict.
    Threshold,
    /// Stability-based Top-K: recall the flows with the best recent bandwidth x (1 -
    /// instability), judged by per-flow Frequent Directions sketches; swap with hysteresis
    /// when the table is full (`crate::stable_placement`).
    Stability,
    /// Never recall (the host keeps what it absorbed).
    None,
}

impl PlacementKind {
    /// Every policy, by the name config files and `--placement` use.
    pub const NAMES: [(&'static str, PlacementKind); 5] = [
        ("first-come", PlacementKind::FirstCome),
        ("ovs-rebalance", PlacementKind::OvsRebalance),
        ("threshold", PlacementKind::Threshold),
        ("stability", PlacementKind::Stability),
        ("none", PlacementKind::None),
    ];

    /// The name config files, `--placement` and reports use.
    pub fn name(self) -> &'static str {
        PlacementKind::NAMES
            .iter()
            .find(|(_, k)| *k == self)
            .map(|(n, _)| *n)
            .expect("every kind is in NAMES")
    }
}

impl core::str::FromStr for PlacementKind {
    type Err = String;
    fn from_str(s: &str) -> Result<PlacementKind, String> {
        PlacementKind::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                let names: Vec<&str> = PlacementKind::NAMES.iter().map(|(n, _)| *n).collect();
                format!("expected one of {}, got {s:?}", names.join(", "))
            })
    }
}

/// Placement settings.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementParams {
    /// The policy.
    pub policy: PlacementKind,
    /// Sampling tick of the spill plane's per-flow rates. [paper]: 100 ms.
    #[serde(with = "humantime_us")]
    pub tick: Duration,
    /// Period of OVS's rebalance. [OVS]: 3 s (`other_config:offload-rebalance`).
    #[serde(with = "humantime_us")]
    pub rebalance_period: Duration,
    /// Most recalls per tick. [assumed]: 50,000.
    pub recalls_per_tick_max: u32,
    /// The `threshold` policy recalls flows whose rate over the last tick exceeds this,
    /// packets/s. Andromeda's Hoverboard gives a flow the offloaded path once its measured
    /// usage exceeds a threshold; the threshold is a fleet setting, tuned to the flow-size
    /// distribution, not a universal number. [assumed]: 2,000 pps, twice the 1 kpps flows of
    /// the built-in scenarios: a flow must carry more than the typical one to spend an entry
    /// (at the host's 1.15 us per packet it costs the plane 0.23% of a core or more).
    pub threshold_pps: f64,
    /// Per-tenant fairness of recalls: the share of the plane's recall room one tenant's
    /// recalled connections may hold, whatever the policy chooses. The room is the connections
    /// already recalled plus what the free entries take; the tenant's recalled packets/s are
    /// held to the same share of the recalled rate plus the fast-path headroom. A recall past
    /// it is not made (`spill.placement.tenant_quota`), so one tenant's flows cannot fill the
    /// fast path the others share. 1 (the default) is off. [assumed]: off.
    pub tenant_recall_share: f64,
    /// Settings of the `stability` policy.
    pub stability: StabilityConfig,
}

/// Settings of the `stability` placement policy (`[fabric.placement.stability]`); the
/// classifier's other parameters keep their documented defaults
/// (`spillway_sketch::classifier::StabilityParams`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StabilityConfig {
    /// An offloaded flow is not swapped out before it has been on the fast path this long.
    /// [assumed]: 2 s.
    #[serde(with = "humantime_us")]
    pub dwell_min: Duration,
    /// A demoted flow is not recalled again for this long. [assumed]: 5 s.
    #[serde(with = "humantime_us")]
    pub cooldown: Duration,
    /// A swap needs the newcomer's score to exceed the incumbent's value by this factor.
    /// [assumed]: 1.5.
    pub swap_margin: f64,
    /// Most swaps per placement tick. [assumed]: 256.
    pub swaps_per_tick_max: u32,
    /// Flows with a sketch (the candidate set's bound). [assumed]: 4,096.
    pub sketched_max: usize,
    /// Ticks of sketch history before a flow is scored. [assumed]: 10 (1 s).
    pub min_ticks: u32,
}

impl Default for StabilityConfig {
    fn default() -> Self {
        let c = spillway_sketch::classifier::StabilityParams::default();
        let p = crate::stable_placement::StabilityPlacementParams::default();
        StabilityConfig {
            dwell_min: p.dwell_min,
            cooldown: p.cooldown,
            swap_margin: p.swap_margin,
            swaps_per_tick_max: p.swaps_per_tick_max,
            sketched_max: c.sketched_max,
            min_ticks: c.min_ticks,
        }
    }
}

impl StabilityConfig {
    /// The classifier's parameters.
    pub fn classifier(&self) -> spillway_sketch::classifier::StabilityParams {
        spillway_sketch::classifier::StabilityParams {
            sketched_max: self.sketched_max,
            min_ticks: self.min_ticks,
            ..Default::default()
        }
    }

    /// The policy's parameters.
    pub fn policy(&self) -> crate::stable_placement::StabilityPlacementParams {
        crate::stable_placement::StabilityPlacementParams {
            dwell_min: self.dwell_min,
            cooldown: self.cooldown,
            swap_margin: self.swap_margin,
            swaps_per_tick_max: self.swaps_per_tick_max,
        }
    }
}

impl PlacementParams {
    /// The policy these settings name, ready to run.
    pub fn build(&self) -> Box<dyn crate::placement::PlacementPolicy + Send> {
        use crate::placement::{FirstCome, NoRecall, OvsRebalance, Threshold};
        match self.policy {
            PlacementKind::FirstCome => Box::new(FirstCome::default()),
            PlacementKind::OvsRebalance => Box::new(OvsRebalance::new(self.rebalance_period)),
            PlacementKind::Threshold => Box::new(Threshold::new(self.threshold_pps)),
            PlacementKind::Stability => Box::new(crate::stable_placement::StabilityPlacement::new(
                self.stability.classifier(),
                self.stability.policy(),
            )),
            PlacementKind::None => Box::new(NoRecall),
        }
    }
}

impl Default for PlacementParams {
    fn default() -> Self {
        PlacementParams {
            policy: PlacementKind::FirstCome,
            tick: Duration::from_millis(100),
            rebalance_period: Duration::from_secs(3),
            recalls_per_tick_max: 50_000,
            threshold_pps: 2_000.0,
            tenant_recall_share: 1.0,
            stability: StabilityConfig::default(),
        }
    }
}

/// All fabric parameters.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FabricParams {
    /// DPU limits.
    pub dpu: DpuParams,
    /// PCIe link and vNICs.
    pub pcie: PcieParams,
    /// Host and spill plane.
    pub host: HostParams,
    /// URSched thresholds.
    pub sched: SchedParams,
    /// Placement back to the DPU.
    pub placement: PlacementParams,
    /// No spill plane at all (the DPU-only baseline).
    pub dpu_only: bool,
}

/// A parameter outside its range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: expected {expected}, got {actual}")]
pub struct ParamError {
    /// Dotted field path, e.g. `dpu.hw_pps_limit`.
    pub field: &'static str,
    /// What was expected.
    pub expected: &'static str,
    /// What was found.
    pub actual: String,
}

/// Checks one integer field against an inclusive range written as literals, so the message
/// carries the range the docs (`docs/CONFIG.md`) list.
macro_rules! int_in {
    ($field:literal, $v:expr, $min:literal ..= $max:literal) => {{
        // Widened to u64 (usize fields fit on every supported target): no wrap in the check.
        let v = u64::try_from($v).unwrap_or(u64::MAX);
        if !($min..=$max).contains(&v) {
            return Err(ParamError {
                field: $field,
                expected: concat!("an integer in ", $min, "..=", $max),
                actual: v.to_string(),
            });
        }
    }};
}

/// Checks a duration field against an inclusive range of nanoseconds; `$text` is the range as
/// an operator writes it (`"1ms..=10s"`).
macro_rules! duration_in {
    ($field:literal, $v:expr, $min_ns:literal ..= $max_ns:literal, $text:literal) => {{
        let v: Duration = $v;
        if !($min_ns..=$max_ns).contains(&ns(v)) {
            return Err(ParamError {
                field: $field,
                expected: concat!("a duration in ", $text),
                actual: format!("{v:?}"),
            });
        }
    }};
}

/// Checks a float field: finite and inside an inclusive range (`> min` makes the lower bound
/// exclusive, for fractions that must be positive).
macro_rules! float_in {
    ($field:literal, $v:expr, > $min:literal ..= $max:literal) => {{
        let v: f64 = $v;
        if !(v.is_finite() && v > $min && v <= $max) {
            return Err(ParamError {
                field: $field,
                expected: concat!("a number in (", $min, ", ", $max, "]"),
                actual: v.to_string(),
            });
        }
    }};
    ($field:literal, $v:expr, $min:literal ..= $max:literal) => {{
        let v: f64 = $v;
        if !(v.is_finite() && ($min..=$max).contains(&v)) {
            return Err(ParamError {
                field: $field,
                expected: concat!("a number in [", $min, ", ", $max, "]"),
                actual: v.to_string(),
            });
        }
    }};
}

impl FabricParams {
    /// Checks every field against its documented range (`docs/CONFIG.md` lists them all) and
    /// the relations between fields. The bounds are what keeps the model's arithmetic and
    /// allocations sane: every table and queue is allocated or bounded by one of these
    /// capacities, every duration becomes picoseconds (`ns * 1000`) in `u64`, every rate
    /// becomes a per-packet cost `1e12 / rate` picoseconds. The relations are checked with
    /// overflow-safe arithmetic.
    pub fn validate(&self) -> Result<(), ParamError> {
        let d = &self.dpu;
        float_in!("dpu.hw_pps_limit", d.hw_pps_limit, 1.0..=1e10);
        int_in!("dpu.hw_queue_packets", d.hw_queue_packets, 1..=1048576);
        duration_in!("dpu.hw_latency", d.hw_latency, 0..=1_000_000_000, "0..=1s");
        // The hardware table is allocated whole (`EmulatedHardware::new`): about 86 MB per
        // 2^20 entries measured, so 2^24 is about 1.4 GB, eight times the default table.
        int_in!("dpu.hw_entries_max", d.hw_entries_max, 1..=16777216);
        float_in!("dpu.insert_rate_limit", d.insert_rate_limit, 1.0..=1e10);
        duration_in!(
            "dpu.insert_latency",
            d.insert_latency,
            0..=1_000_000_000,
            "0..=1s"
        );
        int_in!("dpu.insert_queue_max", d.insert_queue_max, 1..=1048576);
        duration_in!(
            "dpu.redirect_latency",
            d.redirect_latency,
            0..=10_000_000_000,
            "0..=10s"
        );
        duration_in!(
            "dpu.drain_timeout",
            d.drain_timeout,
            1_000_000..=60_000_000_000,
            "1ms..=60s"
        );
        duration_in!(
            "dpu.flip_latency",
            d.flip_latency,
            0..=10_000_000_000,
            "0..=10s"
        );
        int_in!("dpu.redirect_buckets", d.redirect_buckets, 1..=65535);
        float_in!("dpu.steer_pps_limit", d.steer_pps_limit, 1.0..=1e10);
        int_in!("dpu.shards", d.shards, 1..=64);
        int_in!("dpu.soc_cores", d.soc_cores, 1..=1024);
        duration_in!(
            "dpu.soc_new_conn_cost",
            d.soc_new_conn_cost,
            1..=1_000_000_000,
            "1ns..=1s"
        );
        duration_in!(
            "dpu.soc_miss_cost",
            d.soc_miss_cost,
            1..=1_000_000_000,
            "1ns..=1s"
        );
        duration_in!(
            "dpu.soc_sync_cost",
            d.soc_sync_cost,
            0..=1_000_000_000,
            "0..=1s"
        );
        duration_in!(
            "dpu.soc_rule_cost",
            d.soc_rule_cost,
            0..=1_000_000_000,
            "0..=1s"
        );
        int_in!("dpu.soc_queue_packets", d.soc_queue_packets, 1..=1048576);
        int_in!("dpu.mem_bytes", d.mem_bytes, 1..=1099511627776);
        // Per-object sizes are bounded so that `mem_used + mem_per_conn` and
        // `mem_per_conn * connections` stay far from u64::MAX, and by the memory itself: a
        // connection that cannot fit even once is a typo, not a model.
        int_in!("dpu.mem_per_conn", d.mem_per_conn, 0..=1048576);
        int_in!("dpu.mem_per_entry", d.mem_per_entry, 0..=1048576);
        for (field, v) in [
            ("dpu.mem_per_conn", d.mem_per_conn),
            ("dpu.mem_per_entry", d.mem_per_entry),
        ] {
            if v > d.mem_bytes {
                return Err(ParamError {
                    field,
                    expected: "at most dpu.mem_bytes",
                    actual: format!("{v} > {}", d.mem_bytes),
                });
            }
        }

        let p = &self.pcie;
        duration_in!("pcie.latency", p.latency, 0..=1_000_000_000, "0..=1s");
        float_in!("pcie.bandwidth_bytes", p.bandwidth_bytes, 1e3..=1e13);
        int_in!("pcie.overhead_bytes", p.overhead_bytes, 0..=65536);
        int_in!("pcie.link_queue_packets", p.link_queue_packets, 2..=1048576);
        float_in!("pcie.phy_vnic_pps_limit", p.phy_vnic_pps_limit, 1.0..=1e10);
        int_in!("pcie.phy_vnic_ring", p.phy_vnic_ring, 1..=1048576);
        float_in!(
            "pcie.flow_vnic_msgs_limit",
            p.flow_vnic_msgs_limit,
            1.0..=1e10
        );
        duration_in!(
            "pcie.control_rto",
            p.control_rto,
            10_000..=10_000_000_000,
            "10us..=10s"
        );

        let h = &self.host;
        int_in!("host.cores", h.cores, 1..=4096);
        int_in!("host.tenant_cores", h.tenant_cores, 0..=4096);
        int_in!("host.reserve_cores", h.reserve_cores, 0..=4096);
        // Checked: u32 addition of two configured values must not wrap past the comparison.
        if h.tenant_cores
            .checked_add(h.reserve_cores)
            .is_none_or(|n| n > h.cores)
        {
            return Err(ParamError {
                field: "host.tenant_cores",
                expected: "tenant_cores + reserve_cores <= cores",
                actual: format!("{} + {} > {}", h.tenant_cores, h.reserve_cores, h.cores),
            });
        }
        int_in!("host.workers_max", h.workers_max, 1..=4096);
        if h.workers_initial == 0 || h.workers_initial > h.workers_max {
            return Err(ParamError {
                field: "host.workers_initial",
                expected: "1..=host.workers_max",
                actual: h.workers_initial.to_string(),
            });
        }
        if h.warm_workers == 0 || h.warm_workers > h.workers_max {
            return Err(ParamError {
                field: "host.warm_workers",
                expected: "1..=host.workers_max",
                actual: h.warm_workers.to_string(),
            });
        }
        duration_in!(
            "host.digest_interval",
            h.digest_interval,
            0..=60_000_000_000,
            "0..=60s"
        );
        duration_in!("host.pkt_cost", h.pkt_cost, 1..=1_000_000_000, "1ns..=1s");
        duration_in!(
            "host.new_conn_cost",
            h.new_conn_cost,
            1..=1_000_000_000,
            "1ns..=1s"
        );
        duration_in!(
            "host.plane_start",
            h.plane_start,
            0..=60_000_000_000,
            "0..=60s"
        );
        duration_in!(
            "host.worker_start",
            h.worker_start,
            0..=60_000_000_000,
            "0..=60s"
        );
        int_in!("host.flow_cache_max", h.flow_cache_max, 1..=67108864);
        // Below a millisecond the plane's liveness depends on scheduler jitter, and each beat
        // is a message on the flow vNIC: `1ns` restarted the plane hundreds of times a second.
        duration_in!(
            "host.heartbeat",
            h.heartbeat,
            1_000_000..=10_000_000_000,
            "1ms..=10s"
        );
        duration_in!(
            "host.remote_heartbeat",
            h.remote_heartbeat,
            1_000_000..=10_000_000_000,
            "1ms..=10s"
        );
        duration_in!(
            "host.vatc_copy_cost",
            h.vatc_copy_cost,
            0..=1_000_000_000,
            "0..=1s"
        );
        float_in!(
            "host.copy_bandwidth_bytes",
            h.copy_bandwidth_bytes,
            1e3..=1e13
        );
        float_in!("host.vatc_hit_ratio", h.vatc_hit_ratio, 0.0..=1.0);
        float_in!("host.tenant_worker_share", h.tenant_worker_share, > 0.0 ..= 1.0);
        duration_in!(
            "host.vatc_miss_cost",
            h.vatc_miss_cost,
            0..=1_000_000_000,
            "0..=1s"
        );

        let s = &self.sched;
        // URSched runs once per window: below 1 ms a decision costs more than it observes.
        duration_in!(
            "sched.window",
            s.window,
            1_000_000..=60_000_000_000,
            "1ms..=60s"
        );
        float_in!("sched.pressure_util", s.pressure_util, > 0.0..=1.0);
        float_in!("sched.prepare_util", s.prepare_util, > 0.0..=1.0);
        if s.prepare_util > s.pressure_util {
            return Err(ParamError {
                field: "sched.prepare_util",
                expected: "at most sched.pressure_util",
                actual: s.prepare_util.to_string(),
            });
        }
        int_in!("sched.history_windows", s.history_windows, 1..=64);
        if s.pressure_windows == 0 || s.pressure_windows > s.history_windows {
            return Err(ParamError {
                field: "sched.pressure_windows",
                expected: "1..=sched.history_windows",
                actual: s.pressure_windows.to_string(),
            });
        }
        float_in!("sched.dpu_target_util", s.dpu_target_util, > 0.0..=1.0);
        float_in!("sched.release_util", s.release_util, > 0.0..=1.0);
        int_in!("sched.release_windows", s.release_windows, 1..=1000000);
        float_in!("sched.worker_add_util", s.worker_add_util, > 0.0..=1.0);
        float_in!("sched.variance_factor", s.variance_factor, > 0.0..=1000.0);
        float_in!("sched.variance_floor", s.variance_floor, 0.0..=1000.0);
        if s.variance_windows == 0 || s.variance_windows > s.history_windows {
            return Err(ParamError {
                field: "sched.variance_windows",
                expected: "1..=sched.history_windows",
                actual: s.variance_windows.to_string(),
            });
        }
        duration_in!(
            "sched.variance_window",
            s.variance_window,
            1_000_000..=60_000_000_000,
            "1ms..=60s"
        );
        int_in!("sched.variance_samples", s.variance_samples, 2..=1000);
        float_in!("sched.mem_util", s.mem_util, > 0.0..=1.0);
        duration_in!(
            "sched.shadow_idle",
            s.shadow_idle,
            0..=3_600_000_000_000,
            "0..=1h"
        );
        if s.quota_step == 0 || s.quota_step > d.redirect_buckets {
            return Err(ParamError {
                field: "sched.quota_step",
                expected: "1..=dpu.redirect_buckets",
                actual: s.quota_step.to_string(),
            });
        }

        let pl = &self.placement;
        duration_in!(
            "placement.tick",
            pl.tick,
            1_000_000..=60_000_000_000,
            "1ms..=60s"
        );
        duration_in!(
            "placement.rebalance_period",
            pl.rebalance_period,
            1_000_000..=3_600_000_000_000,
            "1ms..=1h"
        );
        int_in!(
            "placement.recalls_per_tick_max",
            pl.recalls_per_tick_max,
            0..=16777216
        );
        float_in!("placement.threshold_pps", pl.threshold_pps, 0.0..=1e10);
        float_in!("placement.tenant_recall_share", pl.tenant_recall_share, > 0.0 ..= 1.0);
        let st = &pl.stability;
        duration_in!(
            "placement.stability.dwell_min",
            st.dwell_min,
            0..=3_600_000_000_000,
            "0..=1h"
        );
        duration_in!(
            "placement.stability.cooldown",
            st.cooldown,
            0..=3_600_000_000_000,
            "0..=1h"
        );
        float_in!(
            "placement.stability.swap_margin",
            st.swap_margin,
            1.0..=1000.0
        );
        int_in!(
            "placement.stability.swaps_per_tick_max",
            st.swaps_per_tick_max,
            0..=1048576
        );
        // The classifier allocates a sketch per slot up front.
        int_in!(
            "placement.stability.sketched_max",
            st.sketched_max,
            1..=65536
        );
        int_in!("placement.stability.min_ticks", st.min_ticks, 1..=100000);
        if let Err(e) = st.classifier().validate() {
            return Err(ParamError {
                field: match e.field {
                    "sketched_max" => "placement.stability.sketched_max",
                    _ => "placement.stability.min_ticks",
                },
                expected: e.expected,
                actual: e.actual,
            });
        }
        Ok(())
    }
}

/// Durations in config files are written as microseconds with a unit suffix: `"200ms"`,
/// `"10us"`, `"1s"`, `"500ns"`.
pub mod humantime_us {
    use core::time::Duration;
    use serde::{Deserialize, Deserializer};

    /// Parses `"<number><unit>"` with unit one of `ns`, `us`, `ms`, `s`.
    pub fn parse(s: &str) -> Result<Duration, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("expected a duration like \"10ms\", got {s:?}"))?;
        let (num, unit) = s.split_at(split);
        let v: f64 = num
            .parse()
            .map_err(|_| format!("expected a duration like \"10ms\", got {s:?}"))?;
        let mult = match unit {
            "ns" => 1e-9,
            "us" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            _ => return Err(format!("expected a unit ns, us, ms or s, got {s:?}")),
        };
        let secs = v * mult;
        if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
            return Err(format!("duration out of range: {s:?}"));
        }
        Ok(Duration::from_secs_f64(secs))
    }

    /// Serde adapter.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        FabricParams::default().validate().unwrap();
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            humantime_us::parse("200ms").unwrap(),
            Duration::from_millis(200)
        );
        assert_eq!(
            humantime_us::parse("1.5us").unwrap(),
            Duration::from_nanos(1500)
        );
        assert!(humantime_us::parse("10").is_err());
        assert!(humantime_us::parse("10 parsecs").is_err());
    }

    #[test]
    fn placement_names_round_trip_and_a_bad_one_lists_them_all() {
        for (name, kind) in PlacementKind::NAMES {
            assert_eq!(name.parse::<PlacementKind>().unwrap(), kind);
            assert_eq!(kind.name(), name);
        }
        let e = "best".parse::<PlacementKind>().unwrap_err();
        assert!(e.contains("threshold") && e.contains("\"best\""), "{e}");
        let mut p = FabricParams::default();
        p.placement.threshold_pps = f64::NAN;
        assert_eq!(p.validate().unwrap_err().field, "placement.threshold_pps");
    }

    #[test]
    fn validate_names_the_field() {
        let mut p = FabricParams::default();
        p.sched.pressure_util = 1.5;
        let e = p.validate().unwrap_err();
        assert_eq!(e.field, "sched.pressure_util");
    }
}

#[cfg(test)]
mod range_tests {
    //! Every bound `validate` enforces for the defects of issue 13: values that used to pass
    //! and then panicked, aborted on an allocation, wrapped, or ran the model absurdly fast.
    use super::*;

    fn rejects(f: impl FnOnce(&mut FabricParams), field: &str) -> ParamError {
        let mut p = FabricParams::default();
        f(&mut p);
        let e = p.validate().expect_err("must be rejected");
        assert_eq!(e.field, field, "{e}");
        e
    }

    #[test]
    fn table_and_queue_capacities_have_a_maximum() {
        let e = rejects(
            |p| p.dpu.hw_entries_max = 4_294_967_295,
            "dpu.hw_entries_max",
        );
        assert_eq!(e.expected, "an integer in 1..=16777216");
        assert_eq!(e.actual, "4294967295");
        rejects(
            |p| p.dpu.hw_entries_max = 4_000_000_000,
            "dpu.hw_entries_max",
        );
        rejects(
            |p| p.dpu.insert_queue_max = u32::MAX,
            "dpu.insert_queue_max",
        );
        rejects(
            |p| p.host.flow_cache_max = usize::MAX,
            "host.flow_cache_max",
        );
        rejects(
            |p| p.placement.stability.sketched_max = 1 << 40,
            "placement.stability.sketched_max",
        );
        let mut p = FabricParams::default();
        p.dpu.hw_entries_max = 16_777_216;
        p.dpu.insert_queue_max = 1_048_576;
        p.validate().unwrap();
    }

    #[test]
    fn core_counts_are_added_without_wrapping() {
        let e = rejects(
            |p| {
                p.host.tenant_cores = u32::MAX;
                p.host.reserve_cores = 5;
            },
            "host.tenant_cores",
        );
        assert!(e.actual.contains("4294967295"), "{e}");
        let e = rejects(
            |p| {
                p.host.cores = 4096;
                p.host.tenant_cores = 4000;
                p.host.reserve_cores = 97;
            },
            "host.tenant_cores",
        );
        assert_eq!(e.actual, "4000 + 97 > 4096");
    }

    #[test]
    fn durations_have_sane_minimums() {
        let e = rejects(
            |p| p.host.heartbeat = Duration::from_nanos(1),
            "host.heartbeat",
        );
        assert_eq!(e.expected, "a duration in 1ms..=10s");
        rejects(|p| p.sched.window = Duration::from_nanos(1), "sched.window");
        rejects(
            |p| p.placement.tick = Duration::from_micros(10),
            "placement.tick",
        );
        rejects(
            |p| p.host.heartbeat = Duration::from_secs(1_000_000),
            "host.heartbeat",
        );
        rejects(
            |p| p.pcie.latency = Duration::from_secs(1_000_000_000),
            "pcie.latency",
        );
    }

    #[test]
    fn huge_memory_per_connection_is_named() {
        let e = rejects(|p| p.dpu.mem_per_conn = u64::MAX, "dpu.mem_per_conn");
        assert!(
            e.to_string().starts_with("dpu.mem_per_conn: expected"),
            "{e}"
        );
        let e = rejects(
            |p| {
                p.dpu.mem_bytes = 1000;
                p.dpu.mem_per_conn = 4096;
            },
            "dpu.mem_per_conn",
        );
        assert_eq!(e.expected, "at most dpu.mem_bytes");
        rejects(|p| p.dpu.mem_bytes = u64::MAX, "dpu.mem_bytes");
    }

    #[test]
    fn rates_are_bounded_both_ways() {
        rejects(|p| p.dpu.hw_pps_limit = 1e300, "dpu.hw_pps_limit");
        rejects(|p| p.dpu.hw_pps_limit = 1e-300, "dpu.hw_pps_limit");
        rejects(
            |p| p.pcie.bandwidth_bytes = f64::INFINITY,
            "pcie.bandwidth_bytes",
        );
        rejects(|p| p.sched.quota_step = 300, "sched.quota_step");
    }
}
