//! The emulated DPU: hardware fast path, SoC slow path, redirect rules, memory, the DPU side of
//! the vNIC set, and the fabric lifecycle that URSched drives.
//!
//! # Polling order
//!
//! A driver calls, for each event at `now`: one `handle_*` input ([`DpuNode::handle_train`] for a
//! packet train from a VM or the uplink, [`DpuNode::handle_msg`] for a message from the spill
//! plane, [`DpuNode::handle_timeout`] when [`DpuNode::poll_timeout`] is due, [`DpuNode::handle_plane_up`]
//! and [`DpuNode::handle_plane_failed`] for the plane's process); then drains
//! [`DpuNode::poll_transmit`] (messages to the plane), [`DpuNode::poll_command`] (start/stop the
//! plane) and [`DpuNode::poll_event`] (lifecycle events with reasons), and re-reads
//! [`DpuNode::poll_timeout`].
//!
//! # The lifecycle
//!
//! ```text
//!            Prepare (URSched)          plane up                 bulk sync acked
//!   Idle ----------------------> Preparing ------> Shadow --------------------+
//!    ^                                              |  ^                      |
//!    | plane drained           shadow idle (release)|  | (synced)             | Activate (URSched)
//!    |                                              v  |                      v
//!  Draining <---- Release (URSched) ---- Active <---- Activating (redirect rules, ~10 ms)
//!    (hand back, remove redirect, drain in flight)
//!   any state with a plane --(heartbeat lost / plane failed)--> FailOpen --> Idle
//! ```
//!
//! Idle is entered at start, from Draining when the plane drained, from Shadow when it idled out,
//! and from a fail-open. Preparing only from Idle; Shadow only from Preparing; Activating only
//! from Shadow; Active only from Activating; Draining from Active.
//!
//! # What the model charges
//!
//! - A train whose connection has live hardware entries is served by the fast path: a FIFO
//!   server at `hw_pps_limit` with a `hw_queue_packets` queue; the excess is `dpu.hw.overload`.
//! - A miss in a redirected bucket is steered to the spill plane (line-rate steering, then the
//!   phy vNIC toward the host at `phy_vnic_pps_limit`, then the PCIe link toward the host).
//! - Every packet the DPU writes into a VM crosses the PCIe link toward the host: it pays
//!   `pcie.latency` and occupies that direction's bandwidth (`(bytes + overhead_bytes) /
//!   bandwidth_bytes`, one FIFO shared with the steered packets). A packet the plane sends back
//!   (no vATC) also passes the steering engine again, and for a VM crosses the link a third
//!   time: `pcie.crossings` counts 1 for the steer, 1 back, 1 into the VM.
//! - Any other miss takes the SoC: `soc_new_conn_cost` for a new connection (then two insert
//!   commands), `soc_miss_cost` for a packet of a known connection, `soc_sync_cost` per state
//!   message ingested from the plane. All on `soc_cores` behind one bounded queue.
//! - Inserts go through an insertion server at `insert_rate_limit` with `insert_latency`; the
//!   entry serves packets only once live. The table refuses inserts when full.

use std::collections::VecDeque;

use spillway_vswitch::flow_table::Inserted;

pub use crate::hw::{DpuHardware, EmulatedHardware, EntryStats, HwKey, HwRule};
use spillway_vswitch::Instant;

use crate::metrics::{Drops, FabricDrop, LatencyHist};
use crate::params::{FabricParams, ns};
use crate::records::{Outbox, Records, Roled};
use crate::server::{PS_PER_NS, Server};
use crate::types::{
    Channel, Colour, ConnId, ConnPhase, ConnState, Dest, Kind, Msg, Owner, Side, SyncKind, Train,
    Transmit,
};
use crate::ursched::{Decision, Load, PlaneView, URSched};
use crate::vnic::{PcieLink, PhyVnic, at_ps, ps};

/// The DPU's record of a connection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DpuConn {
    /// The state (authoritative when `role` is `Owner`, a mirror otherwise).
    pub state: ConnState,
    /// Owner, copy or in transit.
    pub role: Role,
    /// Live hardware entries (0..=2).
    pub hw_live: u8,
    /// Inserts queued for it.
    pub inserts_pending: u8,
    /// Came back from the plane by recall (its rate is reported to the plane's placement).
    pub recalled: bool,
    /// Hardware packet count at the last stats report.
    pub hw_pkts_mark: u64,
    /// When `hw_pkts_mark` was taken (the last report, or the recall that installed the
    /// entries): a flow recalled in the middle of a stats period is reported over the time it
    /// has been on the fast path, not over the whole period.
    pub hw_mark_at: Instant,
    /// Where placement has moved it so far (for counting flaps).
    pub history: RecallHistory,
}

/// Where placement has moved a connection so far: what `dpu.placement.flap` counts from.
///
/// A **flap** is a reversal of an earlier placement of the same connection: after its first
/// recall to the fast path, every move of the connection between the fast path and the host
/// counts once, whichever way it goes and whoever makes it. Leaving the fast path is a
/// demotion by the policy or a shed by the DPU (its fast path overflowed, as when a recalled
/// flow bursts); coming back is a recall. A flow recalled once and kept has no flap; recalled,
/// shed and recalled again has two. Counting sheds makes the figure meaningful for policies
/// that never demote (first come, threshold): what they recall badly, the DPU takes back.
/// Moves of a connection never recalled (a shed of a flow the SoC opened) are not flaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecallHistory {
    /// Never recalled.
    #[default]
    Never,
    /// Recalled, and on the fast path since.
    Recalled,
    /// Recalled once, and left the fast path for the host since (it may be recalled again).
    Left,
}

impl Roled for DpuConn {
    fn role(&self) -> Role {
        self.role
    }
    fn set_role(&mut self, role: Role) {
        self.role = role;
    }
}

/// A plane's relation to a connection's state. Exactly one plane is `Owner`, or the state is in
/// a handover message on its way (then no plane is, and the sender holds a `Copy`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Role {
    /// This plane owns the state.
    Owner,
    /// A mirror kept to fail open (DPU) or to serve misses (plane); the owner is the other side.
    Copy,
}

/// A lifecycle change, with its reason (URSched's, or the protocol step's).
#[derive(Clone, Debug, PartialEq)]
pub struct FabricEvent {
    /// When.
    pub at: Instant,
    /// The phase entered, or what changed.
    pub what: EventKind,
    /// Why.
    pub reason: String,
    /// For [`EventKind::Active`] and [`EventKind::Absorbing`]: when the decision that led to
    /// it was taken (URSched's or the operator's; the prepare decision of a cold start, the
    /// activate decision of a warm plane).
    pub since: Option<Instant>,
}

/// What a [`FabricEvent`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// Plane requested (Idle -> Preparing).
    Preparing,
    /// Plane up; bulk sync started (Preparing -> Shadow).
    Shadow,
    /// Bulk sync acknowledged.
    Synced,
    /// Redirect rules requested (Shadow -> Activating).
    Activating,
    /// Redirect rules live (Activating -> Active).
    Active,
    /// First redirected packet served by the plane (the overflow is being absorbed).
    Absorbing,
    /// Overflow quota changed.
    Quota,
    /// Worker count changed.
    Workers,
    /// Release started (Active -> Draining).
    Draining,
    /// Redirect rules removed.
    RedirectRemoved,
    /// Back to Idle, host resources released.
    Idle,
    /// The plane failed or stalled; traffic fell back to the DPU.
    FailOpen,
    /// Pressure but no safe host capacity.
    Fallback,
    /// An operator set or cleared a hold on the lifecycle ([`DpuNode::handle_hold`]).
    Hold,
}

impl EventKind {
    /// Lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Preparing => "preparing",
            EventKind::Shadow => "shadow",
            EventKind::Synced => "synced",
            EventKind::Activating => "activating",
            EventKind::Active => "active",
            EventKind::Absorbing => "absorbing",
            EventKind::Quota => "quota",
            EventKind::Workers => "workers",
            EventKind::Draining => "draining",
            EventKind::RedirectRemoved => "redirect_removed",
            EventKind::Idle => "idle",
            EventKind::FailOpen => "fail_open",
            EventKind::Fallback => "fallback",
            EventKind::Hold => "hold",
        }
    }
}

/// A command to the driver about the plane's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Start the plane with `workers` workers on isolated cores; report
    /// [`DpuNode::handle_plane_up`] when it runs.
    StartPlane {
        /// Workers.
        workers: u32,
    },
    /// Stop the plane and release its cores.
    StopPlane,
}

/// An operator's hold on the lifecycle (`spillway ctl activate | release | auto`). While a hold
/// is set, URSched's decisions against it are dropped and the DPU moves towards the held state
/// by the same transitions URSched would use; a fail-open under `Active` is followed by a fresh
/// plane at the next window (the fabric recovers without the operator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hold {
    /// No hold: URSched decides.
    #[default]
    Auto,
    /// Keep a plane active with every bucket redirected.
    Active,
    /// Keep the plane released.
    Released,
    /// Keep a plane prepared (started, bulk-synced, in shadow) but not active: a pre-warm, so
    /// that a later activation only installs the redirect rules.
    Shadow,
}

impl Hold {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Hold::Auto => "auto",
            Hold::Active => "active",
            Hold::Released => "released",
            Hold::Shadow => "shadow",
        }
    }
}

/// Lifecycle phase. See the module doc's diagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No plane.
    Idle,
    /// Plane starting.
    Preparing {
        /// Colour of this activation.
        colour: Colour,
    },
    /// Plane up, bulk sync running or done; forwarding untouched.
    Shadow {
        /// Colour.
        colour: Colour,
        /// The plane acknowledged the bulk sync of this colour.
        synced: bool,
    },
    /// Redirect rules being installed.
    Activating {
        /// Colour.
        colour: Colour,
        /// When they are live.
        live_at: Instant,
    },
    /// Redirect rules live.
    Active {
        /// Colour.
        colour: Colour,
    },
    /// Releasing.
    Draining {
        /// Colour.
        colour: Colour,
        /// Where the release is.
        step: DrainStep,
    },
}

/// Steps of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// Waiting for the plane to hand every connection back.
    HandBack,
    /// Redirect rules being removed; live until `done_at`.
    RemoveRedirect {
        /// When they are gone.
        done_at: Instant,
    },
    /// Waiting for the plane's in-flight packets.
    Drain,
}

impl Phase {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Preparing { .. } => "preparing",
            Phase::Shadow { .. } => "shadow",
            Phase::Activating { .. } => "activating",
            Phase::Active { .. } => "active",
            Phase::Draining { .. } => "draining",
        }
    }

    pub(crate) fn has_plane(self) -> bool {
        !matches!(self, Phase::Idle | Phase::Preparing { .. })
    }

    /// Redirect rules steer packets.
    pub fn redirect_live(self) -> bool {
        matches!(
            self,
            Phase::Active { .. }
                | Phase::Draining {
                    step: DrainStep::HandBack | DrainStep::RemoveRedirect { .. },
                    ..
                }
        )
    }
}

spillway_vswitch::counters! {
    /// DPU counters (dotted names in [`DpuCounters::iter`]).
    #[derive(Copy, PartialEq)]
    pub struct DpuCounters {
        /// Packets offered by VMs and the uplink.
        offered => "dpu.rx.packets",
        /// Delivered by the hardware fast path.
        hw_delivered => "dpu.hw.packets",
        /// Delivered by the SoC slow path.
        soc_delivered => "dpu.soc.packets",
        /// Spill-plane packets the DPU sent on to VMs or the uplink.
        host_out => "dpu.host_out.packets",
        /// Packets steered to the spill plane by redirect rules.
        steered => "dpu.steer.packets",
        /// New connections steered to the plane.
        steered_new_conn => "spill.redirect.new_conn",
        /// Connections opened on the SoC.
        soc_new_conn => "dpu.soc.new_conn",
        /// Entries that went live.
        inserts => "dpu.hw.insert",
        /// Inserts refused (table full or insert queue full).
        insert_rejected => "dpu.hw.insert_rejected",
        /// Entries removed.
        deletes => "dpu.hw.delete",
        /// Recalls whose entries went live.
        recalls_ok => "dpu.recall.ok",
        /// Recalls refused.
        recalls_refused => "dpu.recall.refused",
        /// Entries demoted back to the plane (rebalance swaps).
        demotes => "dpu.demote",
        /// Entries removed because their connection moved to the host plane (demoted by placement
        /// or shed under overload), not because it closed. Part of `dpu.hw.delete`.
        deletes_to_host => "dpu.hw.delete.to_host",
        /// Placement reversals (see [`RecallHistory`]).
        flaps => "dpu.placement.flap",
        /// State messages sent to the plane.
        sync_tx => "dpu.sync.tx",
        /// State messages received from the plane.
        sync_rx => "dpu.sync.rx",
        /// Packet crossings of the PCIe link (each delivered packet, each way).
        pcie_crossings => "pcie.crossings",
        /// Fail-opens.
        fail_opens => "dpu.failopen",
        /// Duplicate deletes (retransmissions) ignored.
        delete_dups => "control.delete.dup",
        /// Plane state not mirrored for lack of DPU memory.
        mirror_skipped => "dpu.mirror.skipped",
        /// Packets the plane handed back for lack of state.
        punted_in => "dpu.punt_in",
        /// Established connections handed to the plane because the fast path was over capacity.
        shed => "dpu.shed",
        /// Connections whose last packet was delivered (by either plane).
        closed => "fabric.conn.closed",
        /// Opening packets the DPU dropped (their connection never starts).
        open_dropped => "dpu.open_dropped",
    }
}

#[derive(Clone, Copy, Debug)]
struct PendingInsert {
    due: Instant,
    key: HwKey,
    recall: bool,
}

/// The emulated DPU node. See the module doc.
#[derive(Debug)]
pub struct DpuNode {
    f: FabricParams,
    /// Packets the current input delivered (see [`DpuNode::delivered_last`]).
    delivered_last: u32,
    hw: Box<dyn DpuHardware>,
    soc: Server,
    soc_new_ps: u64,
    soc_miss_ps: u64,
    soc_sync_ps: u64,
    ins_srv: Server,
    ins_ps: u64,
    pending: VecDeque<PendingInsert>,
    steer: Server,
    steer_ps: u64,
    to_host: PhyVnic,
    /// The PCIe link toward the host: steered packets and every write into a VM.
    link_down: PcieLink,
    conns: Records<DpuConn>,
    /// `pcie.latency` and `dpu.hw_latency` converted once, not per train.
    pcie_latency_ns: u64,
    hw_latency_ps: u64,
    mem_used: u64,
    phase: Phase,
    hold: Hold,
    colour: Colour,
    quota: u16,
    sched: URSched,
    decisions: Vec<Decision>,
    next_window: Instant,
    next_variance: Instant,
    last_heartbeat: Instant,
    plane_workers: u32,
    plane_util: f64,
    tenant_cores: u32,
    absorbed: bool,
    trigger: Option<Instant>,
    insert_refused_at_completion: u64,
    first_no_state: Option<ConnId>,
    window_drops_base: u64,
    window_steered_base: u64,
    window_steered_new_base: u64,
    window_soc_new_base: u64,
    headroom_pps: f64,
    recalled_pps: f64,
    /// Packets matched by recalled entries that are gone or no longer recalled (see
    /// [`DpuNode::recalled_hw_packets`]).
    recalled_hw_retired: u64,
    seen_delete: std::collections::BTreeMap<u64, Option<ConnState>>,
    next_stats: Instant,
    last_load: Load,
    out: Outbox,
    commands: VecDeque<Command>,
    events: VecDeque<FabricEvent>,
    counters: DpuCounters,
    drops: Drops,
    latency: LatencyHist,
    latency_window: LatencyHist,
}

impl DpuNode {
    /// A DPU with the limits in `f` (validated by the caller with [`FabricParams::validate`]).
    pub fn new(f: &FabricParams) -> DpuNode {
        DpuNode::with_hardware(f, Box::new(EmulatedHardware::new(f)))
    }

    /// A DPU node over other hardware (a real backend, or a test double).
    pub fn with_hardware(f: &FabricParams, hw: Box<dyn DpuHardware>) -> DpuNode {
        let d = &f.dpu;
        let per_ps = |d: core::time::Duration| ns(d) * PS_PER_NS;
        DpuNode {
            hw,
            soc: Server::new(d.soc_cores, d.soc_queue_packets),
            soc_new_ps: per_ps(d.soc_new_conn_cost),
            soc_miss_ps: per_ps(d.soc_miss_cost),
            soc_sync_ps: per_ps(d.soc_sync_cost),
            ins_srv: Server::new(1, d.insert_queue_max),
            ins_ps: (1e12 / d.insert_rate_limit) as u64,
            // Grows to `insert_queue_max` under load rather than reserving it up front: a
            // large queue bound must not cost its whole memory at start.
            pending: VecDeque::with_capacity(d.insert_queue_max.min(1 << 16) as usize),
            steer: Server::new(1, 1 << 16),
            steer_ps: (1e12 / d.steer_pps_limit).max(1.0) as u64,
            to_host: PhyVnic::new(f),
            link_down: PcieLink::new(f),
            conns: Records::new(7),
            pcie_latency_ns: ns(f.pcie.latency),
            hw_latency_ps: ns(d.hw_latency) * PS_PER_NS,
            mem_used: 0,
            phase: Phase::Idle,
            hold: Hold::Auto,
            colour: Colour(0),
            quota: 0,
            sched: URSched::new(f),
            decisions: Vec::new(),
            next_window: Instant::ZERO + f.sched.window,
            next_variance: Instant::ZERO + f.sched.variance_window,
            last_heartbeat: Instant::ZERO,
            plane_workers: 0,
            plane_util: 0.0,
            tenant_cores: f.host.tenant_cores,
            absorbed: false,
            trigger: None,
            insert_refused_at_completion: 0,
            first_no_state: None,
            window_drops_base: 0,
            window_steered_base: 0,
            window_steered_new_base: 0,
            delivered_last: 0,
            window_soc_new_base: 0,
            headroom_pps: 0.0,
            recalled_pps: 0.0,
            recalled_hw_retired: 0,
            seen_delete: Default::default(),
            next_stats: Instant::ZERO + f.placement.rebalance_period,
            last_load: Load::default(),
            out: Outbox::new(f),
            commands: VecDeque::new(),
            events: VecDeque::new(),
            counters: DpuCounters::default(),
            drops: Drops::default(),
            latency: LatencyHist::default(),
            latency_window: LatencyHist::default(),
            f: f.clone(),
        }
    }

    // ---- getters -------------------------------------------------------------------------

    /// The lifecycle phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// The operator's hold.
    pub fn hold(&self) -> Hold {
        self.hold
    }
    /// Counters.
    pub fn counters(&self) -> &DpuCounters {
        &self.counters
    }
    /// Drops by reason.
    pub fn drops(&self) -> &Drops {
        &self.drops
    }
    /// Latency of every packet the DPU delivered (its own and the plane's), ns.
    pub fn latency(&self) -> &LatencyHist {
        &self.latency
    }
    /// Latency since the last [`DpuNode::take_window_latency`].
    pub fn take_window_latency(&mut self) -> LatencyHist {
        let h = self.latency_window.clone();
        self.latency_window.clear();
        h
    }
    /// Hardware entries in use.
    pub fn hw_entries(&self) -> usize {
        self.hw.len()
    }
    /// Hardware table capacity.
    pub fn hw_capacity(&self) -> usize {
        self.hw.capacity()
    }
    /// DPU memory in use, bytes.
    pub fn mem_used(&self) -> u64 {
        self.mem_used
    }
    /// Redirected buckets (the overflow quota).
    pub fn quota(&self) -> u16 {
        self.quota
    }
    /// The load URSched saw in the last window.
    pub fn last_load(&self) -> &Load {
        &self.last_load
    }
    /// Packets the fast path has matched for connections while they were recalled from the
    /// plane: the hardware counters of live recalled entries plus those of recalled entries
    /// removed (or demoted) before. O(connections): for reports at a window's edges, not per
    /// packet. The entries' counters count matches, so under fast-path overload (a full input
    /// queue) this includes packets the queue then dropped.
    pub fn recalled_hw_packets(&self) -> u64 {
        let live: u64 = self
            .conns
            .iter()
            .filter(|(_, c)| c.recalled && c.hw_live > 0)
            .map(|(k, _)| self.entry_packets(*k))
            .sum();
        self.recalled_hw_retired + live
    }

    /// Packets both of `conn`'s hardware entries have matched since they were installed.
    fn entry_packets(&self, conn: ConnId) -> u64 {
        [Side::Orig, Side::Reply]
            .iter()
            .filter_map(|side| self.hw.stats(&HwKey { conn, side: *side }))
            .map(|e| e.packets)
            .sum()
    }

    /// `conn` stops being recalled (demoted, stripped, rolled back, closed): its entries'
    /// counts so far stay in [`DpuNode::recalled_hw_packets`].
    fn retire_recalled(&mut self, conn: ConnId) {
        if self.conns.get(&conn).is_some_and(|c| c.recalled) {
            self.recalled_hw_retired += self.entry_packets(conn);
        }
    }

    /// Insert commands the hardware has executed (live or refused by a full table); the
    /// insertion-budget checker reads it.
    pub fn inserts_total(&self) -> u64 {
        self.counters.inserts + self.insert_refused_at_completion
    }
    /// The first connection a packet of which found no state here (for diagnosing a failed
    /// continuity check).
    pub fn first_no_state(&self) -> Option<ConnId> {
        self.first_no_state
    }
    /// The DPU's record of `conn`.
    pub fn conn(&self, conn: ConnId) -> Option<&DpuConn> {
        self.conns.get(&conn)
    }
    /// Connections the DPU has a record of.
    pub fn conns_len(&self) -> usize {
        self.conns.len()
    }
    /// Connections the DPU owns.
    pub fn conns_owned(&self) -> u64 {
        self.conns.owned()
    }
    /// Every record, sorted by connection (for checkers and dumps; O(n log n)).
    pub fn conns_sorted(&self) -> Vec<(ConnId, DpuConn)> {
        self.conns.sorted()
    }
    /// Where `conn` is served: `None` if the DPU has no record.
    pub fn owner_view(&self, conn: ConnId) -> Option<Owner> {
        self.conns.get(&conn).map(|c| match c.role {
            Role::Owner if c.hw_live == 2 => Owner::DpuHw,
            Role::Owner => Owner::DpuSoc,
            Role::Copy => Owner::Spill,
        })
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// The next message for the plane.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop()
    }
    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }
    /// The next lifecycle event.
    pub fn poll_event(&mut self) -> Option<FabricEvent> {
        self.events.pop_front()
    }
    /// When [`DpuNode::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.next_window.min(self.next_variance);
        if let Some(p) = self.pending.front() {
            t = t.min(p.due);
        }
        match self.phase {
            Phase::Activating { live_at, .. } => t = t.min(live_at),
            Phase::Draining {
                step: DrainStep::RemoveRedirect { done_at },
                ..
            } => t = t.min(done_at),
            _ => {}
        }
        Some(t)
    }

    fn event(&mut self, at: Instant, what: EventKind, reason: impl Into<String>) {
        self.events.push_back(FabricEvent {
            at,
            what,
            reason: reason.into(),
            since: None,
        });
    }

    fn send(&mut self, at: Instant, channel: Channel, msg: Msg) {
        self.out.send(at, channel, msg);
    }

    /// Sends a state message on the flow vNIC (rate-limited; never refused: the sync queue is
    /// sized for a bulk sync and a full one only delays).
    fn send_sync(&mut self, now: Instant, kind: SyncKind, state: ConnState) {
        self.counters.sync_tx += 1;
        self.out.sync(now, self.colour, kind, state);
    }

    /// Delivers `n` packets of `t` that left the fast path or the SoC `latency_ps_sum` after
    /// arriving at `now` (summed over the packets): into a VM across the PCIe link (its latency
    /// and bandwidth), or out of the uplink.
    fn deliver(&mut self, now: Instant, t: &Train, n: u32, latency_ps_sum: u64, hw: bool) {
        let mut latency_ps_sum = latency_ps_sum;
        let mut extra = 0;
        let mut n = n;
        if t.dest == Dest::Vm {
            // The crossing into the VM starts when the batch's average packet is done.
            let at = ps(now) + latency_ps_sum / u64::from(n.max(1));
            let l = self.link_down.cross(at, n, t.packet_bytes);
            self.drops.add_refused(FabricDrop::PcieLinkFull, n, l.count);
            if l.count == 0 {
                return;
            }
            latency_ps_sum = latency_ps_sum / u64::from(n) * u64::from(l.count) + l.wait_sum_ps;
            n = l.count;
            extra = self.pcie_latency_ns;
        }
        self.delivered_last += n;
        let mean_ns = latency_ps_sum / u64::from(n.max(1)) / PS_PER_NS + extra;
        self.latency.record(mean_ns, u64::from(n));
        self.latency_window.record(mean_ns, u64::from(n));
        self.counters.pcie_crossings += u64::from(n);
        if t.kind == Kind::Close {
            self.counters.closed += 1;
        }
        if hw {
            self.counters.hw_delivered += u64::from(n);
        } else {
            self.counters.soc_delivered += u64::from(n);
        }
    }

    fn mem_conn_fits(&self) -> bool {
        self.mem_used + self.f.dpu.mem_per_conn <= self.f.dpu.mem_bytes
    }

    fn add_conn(&mut self, conn: ConnId, rec: DpuConn) {
        if self.conns.insert(conn, rec).is_none() {
            self.mem_used += self.f.dpu.mem_per_conn;
        }
    }

    fn remove_conn(&mut self, conn: ConnId) -> Option<DpuConn> {
        self.retire_recalled(conn);
        let rec = self.conns.remove(conn)?;
        self.mem_used -= self.f.dpu.mem_per_conn;
        for side in [Side::Orig, Side::Reply] {
            if self.hw.remove(&HwKey { conn, side }) {
                self.counters.deletes += 1;
                self.mem_used -= self.f.dpu.mem_per_entry;
            }
        }
        Some(rec)
    }

    fn set_role(&mut self, conn: ConnId, role: Role) {
        self.conns.set_role(conn, role);
    }

    /// Queues the two insert commands of `conn`; returns how many were queued.
    fn queue_inserts(&mut self, now: Instant, conn: ConnId, recall: bool) -> u8 {
        let mut queued = 0;
        for side in [Side::Orig, Side::Reply] {
            let a = self.ins_srv.offer(ps(now), 1, self.ins_ps);
            if a.count == 0 {
                self.counters.insert_rejected += 1;
                continue;
            }
            let due = at_ps(a.finish_ps) + self.f.dpu.insert_latency;
            self.pending.push_back(PendingInsert {
                due,
                key: HwKey { conn, side },
                recall,
            });
            queued += 1;
        }
        queued
    }

    fn plane_view(&self) -> PlaneView {
        match self.phase {
            Phase::Idle => PlaneView::Idle,
            Phase::Preparing { .. } => PlaneView::Preparing { synced: false },
            Phase::Shadow { synced, .. } => PlaneView::Preparing { synced },
            Phase::Activating { .. } | Phase::Draining { .. } => PlaneView::Busy,
            Phase::Active { .. } => PlaneView::Active,
        }
    }

    // ---- inputs ----------------------------------------------------------------------------

    /// The driver's report of how many host cores the tenants use (isolation input).
    pub fn set_tenant_cores(&mut self, cores: u32) {
        self.tenant_cores = cores;
    }

    /// A train from a VM or the uplink.
    pub fn handle_train(&mut self, now: Instant, t: &Train) {
        self.delivered_last = 0;
        self.counters.offered += u64::from(t.packets);
        self.sched.count_tenant(t.tenant, t.packets);
        let key = HwKey {
            conn: t.conn,
            side: t.side,
        };
        let bytes = u64::from(t.packets) * u64::from(t.packet_bytes);
        if let Some(a) = self.hw.offer(now, &key, t.packets, bytes) {
            self.drops
                .add_refused(FabricDrop::HwOverload, t.packets, a.count);
            if a.count > 0 {
                let sum = a.wait_sum_ps + u64::from(a.count) * self.hw_latency_ps;
                self.deliver(now, t, a.count, sum, true);
                // Payload on the hardware path changes no connection state: the entry's own
                // counters count it, and the SoC's record is left alone (as hardware conntrack
                // offload does). Control packets and the close still step the record.
                if t.kind != Kind::Data {
                    self.update_state(now, t);
                }
            }
            return;
        }
        let redirected = self.phase.redirect_live()
            && t.conn.bucket(self.f.dpu.redirect_buckets) < self.quota
            && !self.f.dpu_only;
        if redirected {
            self.steer_to_host(now, t);
            return;
        }
        self.slow_path(now, t, false);
    }

    fn steer_to_host(&mut self, now: Instant, t: &Train) {
        let s = self.steer.offer(ps(now), t.packets, self.steer_ps);
        self.drops
            .add_refused(FabricDrop::SteerOverload, t.packets, s.count);
        if s.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        // A link backed up toward the host backs up into the phy vNIC's ring (PCIe is lossless).
        let room = self.link_down.room(ps(now));
        let mut part = *t;
        part.packets = s.count.min(room);
        self.drops
            .add_refused(FabricDrop::VnicRingFull, s.count, part.packets);
        if part.packets == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        let a = self.to_host.offer(ps(now), &part);
        self.drops
            .add_refused(FabricDrop::VnicRingFull, part.packets, a.count);
        if a.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        let l = self.link_down.cross(a.finish_ps, a.count, t.packet_bytes);
        self.drops
            .add_refused(FabricDrop::PcieLinkFull, a.count, l.count);
        if l.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        part.packets = l.count;
        self.counters.steered += u64::from(l.count);
        if t.kind == Kind::Open {
            self.counters.steered_new_conn += 1;
        }
        self.counters.pcie_crossings += u64::from(l.count);
        self.send(at_ps(l.finish_ps), Channel::PhyVnic, Msg::Packets(part));
    }

    fn slow_path(&mut self, now: Instant, t: &Train, punted: bool) {
        let known = self.conns.get(&t.conn).copied();
        if t.denied {
            // The policy walk runs, then denies: the SoC pays a new-connection walk.
            let a = self.soc.offer(ps(now), t.packets, self.soc_new_ps);
            self.drops
                .add_refused(FabricDrop::SocQueueFull, t.packets, a.count);
            self.drops.add(FabricDrop::Policy, u64::from(a.count));
            return;
        }
        match known {
            None if t.kind == Kind::Open => {
                if !self.mem_conn_fits() {
                    self.drops.add(FabricDrop::MemFull, u64::from(t.packets));
                    self.counters.open_dropped += 1;
                    return;
                }
                let a = self.soc.offer(ps(now), t.packets, self.soc_new_ps);
                self.drops
                    .add_refused(FabricDrop::SocQueueFull, t.packets, a.count);
                if a.count == 0 {
                    self.counters.open_dropped += 1;
                    return;
                }
                self.counters.soc_new_conn += 1;
                let state = ConnState::open(now, t);
                // The insert commands leave when the slow path has finished this packet.
                let queued = self.queue_inserts(at_ps(a.finish_ps), t.conn, false);
                self.add_conn(
                    t.conn,
                    DpuConn {
                        state,
                        role: Role::Owner,
                        hw_live: 0,
                        inserts_pending: queued,
                        recalled: false,
                        hw_pkts_mark: 0,
                        hw_mark_at: Instant::ZERO,
                        history: RecallHistory::Never,
                    },
                );
                self.deliver(now, t, a.count, a.wait_sum_ps, false);
                if self.phase.has_plane() {
                    self.send_sync(now, SyncKind::Mirror, state);
                }
            }
            None if !punted
                && matches!(
                    self.phase,
                    Phase::Draining {
                        step: DrainStep::Drain,
                        ..
                    }
                ) =>
            {
                // The redirect rules are gone but the plane still runs: a connection it opened
                // while releasing may be handed over yet. It has the state; send it there.
                self.steer_to_host(now, t);
            }
            None => {
                self.drops.add(FabricDrop::NoState, u64::from(t.packets));
                self.first_no_state.get_or_insert(t.conn);
            }
            Some(c) => {
                let a = self.soc.offer(ps(now), t.packets, self.soc_miss_ps);
                self.drops
                    .add_refused(FabricDrop::SocQueueFull, t.packets, a.count);
                if a.count == 0 {
                    return;
                }
                // An owned connection without entries (handed back by the plane, or refused
                // earlier): the slow path installs them again while the table has room.
                if c.role == Role::Owner
                    && c.hw_live == 0
                    && c.inserts_pending == 0
                    && t.kind != Kind::Close
                    && self.free_entries() >= 2
                {
                    let queued = self.queue_inserts(at_ps(a.finish_ps), t.conn, false);
                    if let Some(r) = self.conns.get_mut(&t.conn) {
                        r.inserts_pending = queued;
                    }
                }
                self.deliver(now, t, a.count, a.wait_sum_ps, false);
                self.update_state(now, t);
            }
        }
    }

    /// A delivered train of a connection the DPU serves: step its state; mirror changes to
    /// the plane; a Close removes it.
    fn update_state(&mut self, now: Instant, t: &Train) {
        let has_plane = self.phase.has_plane() && !self.f.dpu_only;
        let Some(c) = self.conns.get_mut(&t.conn) else {
            return;
        };
        if t.kind == Kind::Close {
            let mut st = c.state;
            st.phase = ConnPhase::Closing;
            st.version += 1;
            self.remove_conn(t.conn);
            if has_plane {
                // Tell the plane to drop its copy.
                self.send_sync(now, SyncKind::Closed, st);
            }
            return;
        }
        let changed = c.state.apply(t);
        let st = c.state;
        let kind = if c.role == Role::Owner {
            SyncKind::Mirror
        } else {
            SyncKind::Update
        };
        if changed && has_plane {
            self.send_sync(now, kind, st);
        }
    }

    /// Packets the last [`DpuNode::handle_train`] or [`DpuNode::handle_msg`] delivered into
    /// their VM or onto the wire at once (for a plane's `Packets`, those the DPU sent on): how a
    /// driver forwarding real frames learns what became of the one it offered (steered packets
    /// are the phy messages it polls; the rest dropped).
    pub fn delivered_last(&self) -> u32 {
        self.delivered_last
    }

    /// A message from the spill plane.
    pub fn handle_msg(&mut self, now: Instant, msg: Msg) {
        self.delivered_last = 0;
        match msg {
            Msg::Packets(t) => self.handle_returned(now, &t),
            Msg::Punt(t) => {
                // The plane had no state for it: the slow path serves it as the owner. It
                // crossed the link back.
                self.counters.pcie_crossings += u64::from(t.packets);
                self.counters.punted_in += u64::from(t.packets);
                self.slow_path(now, &t, true);
            }
            Msg::Sync {
                kind,
                state,
                colour,
            } => {
                self.counters.sync_rx += 1;
                self.soc.offer(ps(now), 1, self.soc_sync_ps);
                // A message of an older colour comes from a plane that has since failed or
                // been released: nobody but the DPU can own what it carries.
                let orphan = !self.phase.has_plane() || colour < self.colour;
                self.ingest_sync(kind, state, orphan);
            }
            Msg::SyncDone { colour, count } => {
                if let Phase::Shadow {
                    colour: c,
                    synced: false,
                } = self.phase
                    && c == colour
                {
                    self.phase = Phase::Shadow {
                        colour,
                        synced: true,
                    };
                    self.event(
                        now,
                        EventKind::Synced,
                        format!(
                            "bulk sync of colour {} acknowledged: {count} connections",
                            colour.0
                        ),
                    );
                    self.enforce_hold(now);
                }
            }
            Msg::Recall {
                state,
                pps,
                replaces_pps,
            } => self.handle_recall(now, state, pps, replaces_pps),
            Msg::Adopted { conn } => {
                // The plane has the state now: its packets may miss the fast path.
                if self.conns.get(&conn).is_some_and(|c| c.role == Role::Copy) {
                    self.strip_entries(conn);
                }
            }
            Msg::Delete { seq, conn } => self.handle_delete(now, seq, conn),
            Msg::Released { colour, count } => {
                if let Phase::Draining {
                    colour: c,
                    step: DrainStep::HandBack,
                } = self.phase
                    && c == colour
                {
                    let done_at = now + self.f.dpu.redirect_latency;
                    self.phase = Phase::Draining {
                        colour,
                        step: DrainStep::RemoveRedirect { done_at },
                    };
                    self.event(
                        now,
                        EventKind::Draining,
                        format!("{count} connections handed back; removing redirect rules"),
                    );
                }
            }
            Msg::Heartbeat { workers, util } => {
                self.last_heartbeat = now;
                self.plane_workers = workers;
                self.plane_util = util;
                if let Phase::Preparing { colour } = self.phase {
                    self.enter_shadow(now, colour);
                }
            }
            Msg::Absorbing => {
                if !self.absorbed {
                    self.absorbed = true;
                    let since = self.trigger.take();
                    let reason = match since {
                        Some(t) => format!(
                            "first redirected packet served by the plane, {:.1} ms after the trigger",
                            (now - t).as_secs_f64() * 1e3
                        ),
                        None => "first redirected packet served by the plane".to_string(),
                    };
                    self.events.push_back(FabricEvent {
                        at: now,
                        what: EventKind::Absorbing,
                        reason,
                        since,
                    });
                }
            }
            // DPU-to-plane messages never come back this way.
            Msg::RecallDone { .. }
            | Msg::DeleteAck { .. }
            | Msg::Release { .. }
            | Msg::SetWorkers { .. }
            | Msg::Activated { .. }
            | Msg::OffloadStats { .. }
            | Msg::Budget { .. } => {}
            Msg::Drained { colour } => {
                if let Phase::Draining {
                    colour: c,
                    step: DrainStep::Drain,
                } = self.phase
                    && c == colour
                {
                    self.go_idle(now, "plane drained; host cores released".into());
                }
            }
            Msg::Drain { .. } => {}
        }
    }

    /// Packets the plane processed and sent back (the path without vATC): they pass the
    /// steering engine again (parse + match, no rewrite), then go out of the uplink or, for a
    /// VM, cross the PCIe link a third time into it.
    fn handle_returned(&mut self, now: Instant, t: &Train) {
        let s = self.steer.offer(ps(now), t.packets, self.steer_ps);
        self.drops
            .add_refused(FabricDrop::SteerOverload, t.packets, s.count);
        if s.count == 0 {
            return;
        }
        let (n, mean_done_ps, extra) = if t.dest == Dest::Vm {
            let l = self.link_down.cross(s.finish_ps, s.count, t.packet_bytes);
            self.drops
                .add_refused(FabricDrop::PcieLinkFull, s.count, l.count);
            if l.count == 0 {
                return;
            }
            let mean = s.finish_ps + l.wait_sum_ps / u64::from(l.count);
            (l.count, mean, self.pcie_latency_ns)
        } else {
            let mean = ps(now) + s.wait_sum_ps / u64::from(s.count);
            (s.count, mean, 0)
        };
        let lat = (mean_done_ps / PS_PER_NS).saturating_sub(t.born.0) + extra;
        self.latency.record(lat, u64::from(n));
        self.latency_window.record(lat, u64::from(n));
        self.counters.host_out += u64::from(n);
        self.delivered_last += n;
        if t.kind == Kind::Close {
            self.counters.closed += 1;
        }
        // The crossing back (counted here, where it lands), and for a VM the one into it.
        let crossings = if t.dest == Dest::Vm { 2 } else { 1 };
        self.counters.pcie_crossings += u64::from(n) * crossings;
    }

    fn ingest_sync(&mut self, kind: SyncKind, state: ConnState, orphan: bool) {
        if kind == SyncKind::Closed {
            // The connection's last packet went through the plane: forget it, entries and all.
            self.remove_conn(state.conn);
            return;
        }
        match (self.conns.get_mut(&state.conn), kind) {
            (None, SyncKind::Update) => {}
            (Some(c), SyncKind::Mirror | SyncKind::Update) => {
                if state.version >= c.state.version {
                    c.state = state;
                }
                if orphan {
                    self.set_role(state.conn, Role::Owner);
                }
            }
            (Some(c), SyncKind::Handover) => {
                if state.version >= c.state.version {
                    c.state = state;
                }
                self.set_role(state.conn, Role::Owner);
            }
            (_, SyncKind::Closed) => unreachable!("handled above"),
            (None, kind) => {
                // With no plane running (a late message from a plane that failed or was
                // released) the DPU is the only possible owner.
                let role = if kind == SyncKind::Handover || orphan {
                    Role::Owner
                } else {
                    Role::Copy
                };
                // A mirror needs memory like any connection. Without room the DPU keeps no
                // copy and could not fail this connection open (`dpu.mirror.skipped`); a
                // handover is taken regardless, since refusing it would lose the state.
                if role == Role::Copy && !self.mem_conn_fits() {
                    self.counters.mirror_skipped += 1;
                    return;
                }
                self.add_conn(
                    state.conn,
                    DpuConn {
                        state,
                        role,
                        hw_live: 0,
                        inserts_pending: 0,
                        recalled: false,
                        hw_pkts_mark: 0,
                        hw_mark_at: Instant::ZERO,
                        history: RecallHistory::Never,
                    },
                );
            }
        }
    }

    fn handle_recall(&mut self, now: Instant, state: ConnState, pps: f64, replaces_pps: f64) {
        let free = self.free_entries();
        // URSched's headroom binds every policy: a recall may not push the fast path past its
        // target utilisation. A swap is charged only what it adds.
        let charge = (pps - replaces_pps).max(0.0);
        let fits_pps = charge <= self.headroom_pps - self.recalled_pps;
        let known = self.conns.contains_key(&state.conn);
        if free < 2 || !fits_pps || (!known && !self.mem_conn_fits()) {
            self.counters.recalls_refused += 1;
            self.send(
                now,
                Channel::FlowVnic,
                Msg::RecallDone {
                    conn: state.conn,
                    ok: false,
                },
            );
            return;
        }
        self.recalled_pps += charge;
        match self.conns.get_mut(&state.conn) {
            Some(c) => {
                if state.version >= c.state.version {
                    c.state = state;
                }
                c.recalled = true;
                // The entries are new: their counters start from zero now.
                c.hw_pkts_mark = 0;
                c.hw_mark_at = now;
            }
            None => self.add_conn(
                state.conn,
                DpuConn {
                    state,
                    role: Role::Copy,
                    hw_live: 0,
                    inserts_pending: 0,
                    recalled: true,
                    hw_pkts_mark: 0,
                    hw_mark_at: now,
                    history: RecallHistory::Never,
                },
            ),
        }
        let queued = self.queue_inserts(now, state.conn, true);
        if let Some(c) = self.conns.get_mut(&state.conn) {
            c.inserts_pending = queued;
        }
        if queued < 2 {
            // Half-queued: the completion of the queued one finishes the recall (as refused).
            if queued == 0 {
                self.finish_recall(now, state.conn, false);
            }
        }
    }

    fn handle_delete(&mut self, now: Instant, seq: u64, conn: ConnId) {
        if let Some(state) = self.seen_delete.get(&seq).copied() {
            // A retransmission: the first copy already took effect; ack again.
            self.counters.delete_dups += 1;
            self.send(now, Channel::Control, Msg::DeleteAck { seq, state });
            return;
        }
        let state = match self.conns.get(&conn).copied() {
            Some(c) if c.role == Role::Owner => {
                // The entries stay live until the plane has adopted the connection
                // (`Msg::Adopted`): removed now, its next packets would be redirected to a
                // plane that may not have the state yet (the ack travels on another channel).
                self.retire_recalled(conn);
                if let Some(r) = self.conns.get_mut(&conn) {
                    r.recalled = false;
                }
                self.set_role(conn, Role::Copy);
                self.counters.demotes += 1;
                self.left_fast_path(conn);
                Some(c.state)
            }
            _ => None,
        };
        self.seen_delete.insert(seq, state);
        // Bounded memory of seen sequence numbers: the plane never has more than a window of
        // unacknowledged deletes, so old ones can go.
        while self.seen_delete.len() > 65_536 {
            self.seen_delete.pop_first();
        }
        self.send(now, Channel::Control, Msg::DeleteAck { seq, state });
    }

    /// `conn` leaves the fast path for the host (demoted or shed): a flap if it had been
    /// recalled (see [`RecallHistory`]).
    fn left_fast_path(&mut self, conn: ConnId) {
        if let Some(r) = self.conns.get_mut(&conn)
            && r.history != RecallHistory::Never
        {
            r.history = RecallHistory::Left;
            self.counters.flaps += 1;
        }
    }

    fn finish_recall(&mut self, now: Instant, conn: ConnId, ok: bool) {
        if ok {
            self.set_role(conn, Role::Owner);
            self.counters.recalls_ok += 1;
            if let Some(r) = self.conns.get_mut(&conn) {
                if r.history == RecallHistory::Left {
                    self.counters.flaps += 1;
                }
                r.history = RecallHistory::Recalled;
            }
        } else {
            // Roll back whatever went in; the plane keeps the connection.
            self.retire_recalled(conn);
            for side in [Side::Orig, Side::Reply] {
                if self.hw.remove(&HwKey { conn, side }) {
                    self.counters.deletes += 1;
                    self.mem_used -= self.f.dpu.mem_per_entry;
                }
            }
            if let Some(c) = self.conns.get_mut(&conn) {
                c.hw_live = 0;
                c.recalled = false;
            }
            self.counters.recalls_refused += 1;
        }
        self.send(now, Channel::FlowVnic, Msg::RecallDone { conn, ok });
    }

    /// The plane's process runs (the driver's report after [`Command::StartPlane`]).
    pub fn handle_plane_up(&mut self, now: Instant) {
        self.last_heartbeat = now;
        if let Phase::Preparing { colour } = self.phase {
            self.enter_shadow(now, colour);
        }
    }

    fn enter_shadow(&mut self, now: Instant, colour: Colour) {
        self.phase = Phase::Shadow {
            colour,
            synced: false,
        };
        // Bulk sync: every connection the DPU owns, in connection order, then the end marker.
        let mut v: Vec<(ConnId, ConnState)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.role == Role::Owner)
            .map(|(k, c)| (*k, c.state))
            .collect();
        v.sort_unstable_by_key(|(k, _)| *k);
        let count = v.len() as u64;
        for (_, st) in v {
            self.send_sync(now, SyncKind::Mirror, st);
        }
        let at = self.out.flow_idle_at(now);
        self.send(at, Channel::FlowVnic, Msg::SyncDone { colour, count });
        self.event(
            now,
            EventKind::Shadow,
            format!(
                "plane up; bulk sync of {count} connections (colour {})",
                colour.0
            ),
        );
    }

    /// The plane's process died (the driver saw it exit). Same as a lost heartbeat.
    pub fn handle_plane_failed(&mut self, now: Instant, reason: &str) {
        self.fail_open(now, reason.to_string());
    }

    fn fail_open(&mut self, now: Instant, reason: String) {
        if matches!(self.phase, Phase::Idle) {
            return;
        }
        self.counters.fail_opens += 1;
        // Every copy becomes owned: the mirror is the state. Redirect rules go at once (a
        // fail-open is local to the DPU, no handshake).
        let copies = self.conns.keys_where(|_, c| c.role == Role::Copy);
        let n = copies.len();
        for c in copies {
            self.set_role(c, Role::Owner);
            self.retire_recalled(c);
            if let Some(r) = self.conns.get_mut(&c) {
                r.recalled = false;
            }
        }
        self.event(
            now,
            EventKind::FailOpen,
            format!("{reason}; redirect rules removed, {n} connections taken over from mirrors"),
        );
        self.go_idle(now, "fail-open: plane stopped".into());
    }

    fn go_idle(&mut self, now: Instant, reason: String) {
        self.phase = Phase::Idle;
        self.quota = 0;
        self.absorbed = false;
        self.headroom_pps = 0.0;
        self.recalled_pps = 0.0;
        // Copies of connections the plane owned are owned now (release handed them back; a
        // fail-open promoted them). Drop any stale copy flags.
        self.commands.push_back(Command::StopPlane);
        self.plane_workers = 0;
        self.event(now, EventKind::Idle, reason);
    }

    /// Timers: insert completions, redirect install/removal, URSched windows.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(p) = self.pending.front().copied() {
            if p.due > now {
                break;
            }
            self.pending.pop_front();
            self.complete_insert(now, p);
        }
        match self.phase {
            Phase::Activating { colour, live_at } if now >= live_at => {
                self.phase = Phase::Active { colour };
                self.events.push_back(FabricEvent {
                    at: now,
                    what: EventKind::Active,
                    reason: format!(
                        "redirect rules live for {} of {} buckets",
                        self.quota, self.f.dpu.redirect_buckets
                    ),
                    since: self.trigger,
                });
                self.send(now, Channel::Control, Msg::Activated { colour });
                self.hand_over_buckets(now, 0, self.quota);
                self.enforce_hold(now);
            }
            Phase::Draining {
                colour,
                step: DrainStep::RemoveRedirect { done_at },
            } if now >= done_at => {
                self.phase = Phase::Draining {
                    colour,
                    step: DrainStep::Drain,
                };
                self.quota = 0;
                self.event(
                    now,
                    EventKind::RedirectRemoved,
                    "redirect rules removed; draining in-flight packets",
                );
                // After the last redirected packet has left for the plane: the channels are
                // separate, so the drain request must not overtake packets still queued on the
                // phy vNIC.
                let at = at_ps(
                    self.to_host
                        .busy_until_ps()
                        .max(self.link_down.busy_until_ps())
                        .max(ps(now)),
                );
                self.send(at, Channel::Control, Msg::Drain { colour });
            }
            _ => {}
        }
        if now >= self.next_window {
            self.next_window = self.next_window + self.f.sched.window;
            self.window(now);
        }
        if now >= self.next_variance {
            self.next_variance = self.next_variance + self.f.sched.variance_window;
            self.sched
                .variance_window(self.f.sched.variance_window.as_secs_f64());
        }
    }

    fn complete_insert(&mut self, now: Instant, p: PendingInsert) {
        // A completion for a record that expects none is stale: the connection was closed and
        // its id's record re-created (say by a late mirror) while the insert was queued.
        let Some(c) = self.conns.get(&p.key.conn).copied() else {
            return; // closed while the insert was queued
        };
        if c.inserts_pending == 0 {
            return;
        }
        let fits_mem = self.mem_used + self.f.dpu.mem_per_entry <= self.f.dpu.mem_bytes;
        let outcome = if fits_mem {
            self.hw
                .insert(now, p.key, HwRule { recalled: p.recall })
                .ok()
        } else {
            None
        };
        let rec = self.conns.get_mut(&p.key.conn).expect("checked above");
        rec.inserts_pending -= 1;
        match outcome {
            Some(Inserted::Fresh) => {
                rec.hw_live += 1;
                self.counters.inserts += 1;
                self.mem_used += self.f.dpu.mem_per_entry;
            }
            // The entry was already live (an insert raced a re-insert): it stays one entry.
            Some(Inserted::Replaced) => self.counters.inserts += 1,
            Some(Inserted::Evicted { .. }) => {
                unreachable!("the hardware table rejects when full, it never evicts")
            }
            None => {
                self.counters.insert_rejected += 1;
                self.insert_refused_at_completion += 1;
            }
        }
        let rec = *rec;
        if p.recall && rec.inserts_pending == 0 {
            self.finish_recall(now, p.key.conn, rec.hw_live == 2);
        }
    }

    /// At activation or a quota increase: connections of buckets `[from, to)` the DPU serves on
    /// the SoC (no live entries, none pending) move to the plane, which serves those buckets now.
    fn hand_over_buckets(&mut self, now: Instant, from: u16, to: u16) {
        let buckets = self.f.dpu.redirect_buckets;
        let moving = self.conns.keys_where(|k, c| {
            let b = k.bucket(buckets);
            b >= from && b < to && c.role == Role::Owner && c.hw_live == 0 && c.inserts_pending == 0
        });
        for conn in moving {
            let st = self.conns[&conn].state;
            self.set_role(conn, Role::Copy);
            self.send_sync(now, SyncKind::Handover, st);
        }
    }

    fn window(&mut self, now: Instant) {
        let secs = self.f.sched.window.as_secs_f64();
        let drops_now =
            self.drops.get(FabricDrop::HwOverload) + self.drops.get(FabricDrop::SocQueueFull);
        let steered = self.counters.steered - self.window_steered_base;
        let steered_new = self.counters.steered_new_conn - self.window_steered_new_base;
        let load = Load {
            hw_util: self.hw.take_util(now),
            soc_util: self.soc.take_util(ps(now)),
            dpu_drops: drops_now - self.window_drops_base,
            table_util: self.hw.len() as f64 / self.hw.capacity() as f64,
            mem_util: self.mem_used as f64 / self.f.dpu.mem_bytes as f64,
            host_pps: steered as f64 / secs,
            host_cps: steered_new as f64 / secs,
            dpu_cps: (self.counters.soc_new_conn - self.window_soc_new_base) as f64 / secs,
            plane_util: self.plane_util,
            workers: self.plane_workers,
            tenant_cores: self.tenant_cores,
        };
        self.to_host.take_util(ps(now));
        self.window_drops_base = drops_now;
        self.window_steered_base = self.counters.steered;
        self.window_steered_new_base = self.counters.steered_new_conn;
        self.window_soc_new_base = self.counters.soc_new_conn;
        self.last_load = load;
        // Recall headroom for the next window: what the fast path can still take below the
        // target utilisation. Recalls granted in the last window are now in the measurement.
        self.headroom_pps =
            ((self.f.sched.dpu_target_util - load.hw_util) * self.f.dpu.hw_pps_limit).max(0.0);
        self.recalled_pps = 0.0;
        // Fail-open on a stalled plane: three heartbeats missed.
        if self.phase.has_plane()
            && now.0.saturating_sub(self.last_heartbeat.0) > 3 * ns(self.f.host.heartbeat)
        {
            let late = (now - self.last_heartbeat).as_secs_f64() * 1e3;
            self.fail_open(now, format!("no heartbeat from the plane for {late:.1} ms"));
            return;
        }
        if self.f.dpu_only {
            return;
        }
        if let Phase::Active { .. } = self.phase {
            if load.hw_util > 1.0
                || (load.dpu_drops > 0 && load.hw_util > self.f.sched.dpu_target_util)
            {
                self.shed(now, &load);
            }
            let (free, headroom) = self.recall_budget();
            self.send(
                now,
                Channel::Control,
                Msg::Budget {
                    free_entries: free as u64,
                    headroom_pps: headroom,
                },
            );
            if now >= self.next_stats {
                self.next_stats = now + self.f.placement.rebalance_period;
                self.send_offload_stats(now);
            }
        }
        let mut decisions = core::mem::take(&mut self.decisions);
        decisions.clear();
        self.sched.window(&load, self.plane_view(), &mut decisions);
        for d in decisions.drain(..) {
            let against_hold = matches!(
                (self.hold, &d),
                (
                    Hold::Active,
                    Decision::Release { .. } | Decision::Quota { .. }
                ) | (
                    Hold::Released,
                    Decision::Prepare { .. } | Decision::Activate { .. } | Decision::Quota { .. }
                ) | (
                    Hold::Shadow,
                    Decision::Activate { .. } | Decision::Quota { .. } | Decision::Release { .. }
                )
            );
            if !against_hold {
                self.apply(now, d);
            }
        }
        self.decisions = decisions;
        self.enforce_hold(now);
    }

    /// An operator sets (or clears, with [`Hold::Auto`]) a hold on the lifecycle. The DPU takes
    /// the next step towards it at once where one is possible (prepare a plane, activate a
    /// synced one, release an active one), and the rest as the protocol completes.
    pub fn handle_hold(&mut self, now: Instant, hold: Hold) {
        if hold != self.hold {
            self.hold = hold;
            self.event(
                now,
                EventKind::Hold,
                format!("operator set hold {} in {}", hold.name(), self.phase.name()),
            );
        }
        self.enforce_hold(now);
    }

    /// The one step the hold asks for in the current phase, if any.
    fn enforce_hold(&mut self, now: Instant) {
        let buckets = self.f.dpu.redirect_buckets;
        let reason = |what: &str| format!("operator hold: {what}");
        match (self.hold, self.phase) {
            (Hold::Active, Phase::Idle) => self.apply(
                now,
                Decision::Prepare {
                    workers: self.f.host.workers_initial,
                    cause: crate::ursched::Cause::Operator,
                    reason: reason("activate"),
                },
            ),
            (Hold::Shadow, Phase::Idle) => self.apply(
                now,
                Decision::Prepare {
                    workers: self.f.host.workers_initial,
                    // A pre-warm is not a trigger: the activation that follows is.
                    cause: crate::ursched::Cause::Memory,
                    reason: reason("prepare (shadow)"),
                },
            ),
            (Hold::Active, Phase::Shadow { synced: true, .. }) => {
                // The operator's command is the trigger of a warm activation.
                self.trigger.get_or_insert(now);
                self.quota = buckets;
                self.apply(
                    now,
                    Decision::Activate {
                        reason: reason("activate"),
                    },
                );
            }
            (Hold::Active, Phase::Active { .. }) if self.quota < buckets => self.apply(
                now,
                Decision::Quota {
                    buckets,
                    reason: reason("every bucket"),
                },
            ),
            (Hold::Released, Phase::Active { .. } | Phase::Shadow { .. }) => self.apply(
                now,
                Decision::Release {
                    reason: reason("release"),
                },
            ),
            (
                Hold::Auto | Hold::Active | Hold::Released | Hold::Shadow,
                Phase::Idle
                | Phase::Preparing { .. }
                | Phase::Shadow { .. }
                | Phase::Activating { .. }
                | Phase::Active { .. }
                | Phase::Draining { .. },
            ) => {}
        }
    }

    /// The fast path is over its capacity while the plane is active (established flows grew,
    /// or the DPU took a failed plane's connections back): hand connections of redirected
    /// buckets, entries and all, to the plane until the measured excess is covered. Redirect
    /// rules only catch misses, so without this an overloaded fast path would stay overloaded.
    /// Highest rate first (fewest entries moved), ties by connection id; the recall headroom
    /// is zero afterwards, so placement does not bring them straight back.
    fn shed(&mut self, now: Instant, load: &Load) {
        let secs = self.f.sched.window.as_secs_f64();
        let target = self.f.sched.dpu_target_util * self.f.dpu.hw_pps_limit;
        let excess = load.hw_util * self.f.dpu.hw_pps_limit - target;
        if excess <= 0.0 {
            return;
        }
        let buckets = self.f.dpu.redirect_buckets;
        let quota = self.quota;
        // Each entry's rate over its life in the table (hardware counters since install).
        let mut v: Vec<(u64, ConnId)> = self
            .conns
            .iter()
            .filter(|(k, c)| c.role == Role::Owner && c.hw_live == 2 && k.bucket(buckets) < quota)
            .map(|(k, _)| {
                let pps: f64 = [Side::Orig, Side::Reply]
                    .iter()
                    .filter_map(|side| {
                        self.hw.stats(&HwKey {
                            conn: *k,
                            side: *side,
                        })
                    })
                    .map(|e| e.packets as f64 / (now - e.installed).as_secs_f64().max(secs))
                    .sum();
                (pps as u64, *k)
            })
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        let mut shed = 0.0;
        let mut moved = 0u64;
        for (pps, conn) in &v {
            if shed >= excess || *pps == 0 {
                break;
            }
            shed += *pps as f64;
            moved += 1;
            let st = self.conns[conn].state;
            // Entries stay until the plane adopts it (see `Msg::Adopted`).
            self.set_role(*conn, Role::Copy);
            self.counters.shed += 1;
            self.left_fast_path(*conn);
            self.send_sync(now, SyncKind::Handover, st);
        }
        if moved > 0 {
            self.event(
                now,
                EventKind::Quota,
                format!(
                    "fast path over capacity (util {:.2}): {moved} established connections ({:.2} Mpps) handed to the plane",
                    load.hw_util,
                    shed / 1e6
                ),
            );
        }
    }

    /// Removes the entries of a connection the plane has adopted (demoted, shed, or handed
    /// over by bucket).
    fn strip_entries(&mut self, conn: ConnId) {
        self.retire_recalled(conn);
        for side in [Side::Orig, Side::Reply] {
            if self.hw.remove(&HwKey { conn, side }) {
                self.counters.deletes += 1;
                self.counters.deletes_to_host += 1;
                self.mem_used -= self.f.dpu.mem_per_entry;
            }
        }
        if let Some(r) = self.conns.get_mut(&conn) {
            r.hw_live = 0;
            r.recalled = false;
        }
    }

    /// The hardware flow-stats dump: the rate of every recalled entry over the last period,
    /// in connection order.
    fn send_offload_stats(&mut self, now: Instant) {
        let mut v: Vec<(ConnId, u64)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.recalled && c.role == Role::Owner && c.hw_live == 2)
            .filter_map(|(k, _)| {
                self.hw
                    .stats(&HwKey {
                        conn: *k,
                        side: Side::Orig,
                    })
                    .map(|e| (*k, e.packets))
            })
            .collect();
        v.sort_unstable_by_key(|(k, _)| *k);
        for (conn, pkts) in v {
            let c = self.conns.get_mut(&conn).expect("collected from the map");
            let delta = pkts.saturating_sub(c.hw_pkts_mark);
            let secs = now.saturating_since(c.hw_mark_at).as_secs_f64();
            c.hw_pkts_mark = pkts;
            c.hw_mark_at = now;
            if secs <= 0.0 {
                continue;
            }
            let pps = delta as f64 / secs;
            self.send(now, Channel::Control, Msg::OffloadStats { conn, pps });
        }
    }

    fn apply(&mut self, now: Instant, d: Decision) {
        match (self.phase, d) {
            (
                Phase::Idle,
                Decision::Prepare {
                    workers,
                    cause,
                    reason,
                },
            ) => {
                self.trigger = matches!(
                    cause,
                    crate::ursched::Cause::Load | crate::ursched::Cause::Operator
                )
                .then_some(now);
                self.colour = Colour(self.colour.0 + 1);
                self.phase = Phase::Preparing {
                    colour: self.colour,
                };
                self.plane_workers = workers;
                self.commands.push_back(Command::StartPlane { workers });
                self.event(
                    now,
                    EventKind::Preparing,
                    format!("{reason}; starting plane with {workers} workers"),
                );
            }
            (_, Decision::Fallback { reason }) => {
                self.event(now, EventKind::Fallback, reason);
            }
            (
                Phase::Shadow {
                    colour,
                    synced: true,
                },
                Decision::Activate { reason },
            ) => {
                // A warm plane: the activation's trigger is this decision.
                self.trigger.get_or_insert(now);
                let live_at = now + self.f.dpu.redirect_latency;
                self.phase = Phase::Activating { colour, live_at };
                self.event(now, EventKind::Activating, format!("activated: {reason}"));
            }
            (Phase::Activating { .. }, Decision::Quota { buckets, reason }) => {
                self.quota = buckets;
                self.event(
                    now,
                    EventKind::Quota,
                    format!("{buckets} buckets: {reason}"),
                );
            }
            (Phase::Active { .. }, Decision::Quota { buckets, reason }) => {
                let old = self.quota;
                self.quota = buckets;
                self.event(
                    now,
                    EventKind::Quota,
                    format!("{old} -> {buckets} buckets: {reason}"),
                );
                self.hand_over_buckets(now, old, buckets);
            }
            (Phase::Active { .. }, Decision::Workers { workers, reason }) => {
                self.plane_workers = workers;
                self.send(now, Channel::Control, Msg::SetWorkers { workers });
                self.event(
                    now,
                    EventKind::Workers,
                    format!("{workers} workers: {reason}"),
                );
            }
            (Phase::Active { colour }, Decision::Release { reason }) => {
                self.phase = Phase::Draining {
                    colour,
                    step: DrainStep::HandBack,
                };
                self.send(now, Channel::Control, Msg::Release { colour });
                self.event(now, EventKind::Draining, format!("release: {reason}"));
            }
            (Phase::Shadow { .. }, Decision::Release { reason }) => {
                // Nothing was redirected: drop the copies the plane sent and stop it.
                self.go_idle(now, format!("release: {reason}"));
            }
            (phase, d) => {
                // URSched only proposes what fits the phase it was shown; anything else is a
                // bug in the scheduler.
                debug_assert!(false, "decision {d:?} in phase {phase:?}");
            }
        }
    }

    /// The recall budget the DPU sends the plane every window (`Msg::Budget`): free hardware
    /// entries and the fast-path headroom left, pps.
    pub fn recall_budget(&self) -> (usize, f64) {
        (
            self.free_entries(),
            (self.headroom_pps - self.recalled_pps).max(0.0),
        )
    }

    /// Hardware entries neither installed nor promised to a queued insert.
    fn free_entries(&self) -> usize {
        let free = self.hw.capacity() - self.hw.len();
        free - self.pending.len().min(free)
    }

    /// Checks the DPU's own invariants: table and queue bounds, memory and owner accounting.
    /// O(connections).
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.hw.len() > self.hw.capacity() {
            return Err(format!(
                "dpu: hw table {} > capacity {}",
                self.hw.len(),
                self.hw.capacity()
            ));
        }
        self.hw.check_invariants()?;
        self.soc.check_invariants()?;
        self.ins_srv.check_invariants()?;
        self.conns.check("dpu")?;
        let mem = self.conns.len() as u64 * self.f.dpu.mem_per_conn
            + self.hw.len() as u64 * self.f.dpu.mem_per_entry;
        if mem != self.mem_used {
            return Err(format!("dpu: memory {} != recomputed {mem}", self.mem_used));
        }
        Ok(())
    }

    /// Cheap checks after every event: table within capacity, queues within bounds.
    pub fn check_cheap(&self) -> Result<(), String> {
        if self.hw.len() > self.hw.capacity() {
            return Err(format!(
                "dpu: hw table {} > capacity {}",
                self.hw.len(),
                self.hw.capacity()
            ));
        }
        if self.mem_used > self.f.dpu.mem_bytes + self.f.dpu.mem_per_conn * self.conns_len() as u64
        {
            return Err("dpu: memory accounting ran away".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use spillway_vswitch::TenantId;

    use super::*;

    fn data(conn: ConnId, at: Instant, packets: u32) -> Train {
        Train {
            conn,
            tenant: TenantId(1),
            side: Side::Orig,
            dest: Dest::Wire,
            kind: Kind::Data,
            packets,
            packet_bytes: 64,
            born: at,
            denied: false,
        }
    }

    #[test]
    fn recall_demote_recall_is_two_flaps_and_recalled_packets_are_counted() {
        let mut dpu = DpuNode::new(&FabricParams::default());
        let conn = ConnId(5);
        let state = ConnState {
            conn,
            tenant: TenantId(1),
            phase: ConnPhase::Established,
            packets: 10,
            version: 2,
            opened: Instant(0),
        };
        let recall = Msg::Recall {
            state,
            pps: 0.0,
            replaces_pps: 0.0,
        };
        let ms = |m: u64| Instant(m * 1_000_000);
        // Recalled: entries live after the insert latency. Not a flap.
        dpu.handle_msg(ms(1), recall);
        dpu.handle_timeout(ms(2));
        assert_eq!(dpu.owner_view(conn), Some(Owner::DpuHw));
        assert_eq!(dpu.counters().flaps, 0);
        dpu.handle_train(ms(3), &data(conn, ms(3), 40));
        assert_eq!(dpu.recalled_hw_packets(), 40);
        // Demoted: a flap; its entries go when the plane has adopted it.
        dpu.handle_msg(ms(4), Msg::Delete { seq: 1, conn });
        assert_eq!(dpu.counters().flaps, 1);
        assert_eq!(dpu.counters().demotes, 1);
        dpu.handle_msg(ms(5), Msg::Adopted { conn });
        assert_eq!(dpu.counters().deletes_to_host, 2);
        assert_eq!(dpu.counters().deletes, 2);
        // Recalled again: the second flap. Packets of the first stint stay counted.
        dpu.handle_msg(ms(6), recall);
        dpu.handle_timeout(ms(7));
        assert_eq!(dpu.counters().flaps, 2);
        assert_eq!(dpu.counters().recalls_ok, 2);
        dpu.handle_train(ms(8), &data(conn, ms(8), 2));
        assert_eq!(dpu.recalled_hw_packets(), 42);
        assert_eq!(dpu.counters().hw_delivered, 42);
        dpu.check_invariants().unwrap();
    }

    #[test]
    fn a_shed_counts_as_a_flap_only_for_a_recalled_connection() {
        let mut dpu = DpuNode::new(&FabricParams::default());
        // A connection the SoC opened, with live entries (what a shed picks).
        dpu.conns.insert(
            ConnId(1),
            DpuConn {
                state: ConnState {
                    conn: ConnId(1),
                    tenant: TenantId(1),
                    phase: ConnPhase::Established,
                    packets: 0,
                    version: 1,
                    opened: Instant(0),
                },
                role: Role::Owner,
                hw_live: 2,
                inserts_pending: 0,
                recalled: false,
                hw_pkts_mark: 0,
                hw_mark_at: Instant::ZERO,
                history: RecallHistory::Never,
            },
        );
        dpu.left_fast_path(ConnId(1));
        assert_eq!(dpu.counters().flaps, 0);
        assert_eq!(dpu.conns[&ConnId(1)].history, RecallHistory::Never);
        dpu.conns.get_mut(&ConnId(1)).unwrap().history = RecallHistory::Recalled;
        dpu.left_fast_path(ConnId(1));
        assert_eq!(dpu.counters().flaps, 1);
        assert_eq!(dpu.conns[&ConnId(1)].history, RecallHistory::Left);
    }
}
