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
//! A plane runs on this host's isolatable cores, or on a remote pool host that granted this
//! host cores ([`DpuNode::set_remote_grant`]) when URSched prepared it there: the node keeps
//! where ([`DpuNode::plane_remote`]) from the prepare until Idle, passes it on in every
//! [`Command::StartPlane`] of that plane (the warm standby's too) and shows it to URSched,
//! whose rules alone decide (see [`crate::ursched`]).
//!
//! # Layout
//!
//! [`DpuNode`] composes parts, each a leaf module that knows nothing of the node:
//! `resources` (everything the DPU can run out of: fast path and table, SoC, steering, phy
//! vNIC, PCIe, memory, the insertion engine; one budget for the whole DPU, reached through a
//! [`ResourcesHandle`] so that several shards can share it), `inserts` (a shard's inserts in
//! flight, in order), `lifecycle` (phase, hold, colour, quota, the plane's last report, events
//! and commands), `window` (measurement windows and URSched) and `deletes` (duplicate
//! suppression for the reliable channel).
//!
//! The node is a control part ([`DpuControl`], `control`: `lifecycle` and `window`) and one
//! or more shards ([`DpuShard`], `shard`: the connection records of their buckets, inserts,
//! delete log, outbox, counters and latency, with a handle to the resources). A shard sees the
//! lifecycle only as a [`ShardView`] (phase, colour, quota); the control part decides and asks
//! the shards, through [`Shards`], to act on their records (a bulk sync, a fail-open's
//! promotion of mirrors, a hand-over of buckets, a shed, a window's totals). The node calls
//! its shards in turn; a driver with a thread per shard (ADR 0011) implements [`Shards`] over
//! its threads instead. The methods are split by input: `datapath` (trains, the shard's),
//! `protocol` (the plane's messages: lifecycle replies to the control part, per-connection
//! messages and insert completions to the connection's shard, by [`Msg::conn`]) and
//! `transitions` (the control part's lifecycle steps, timers, windows, the operator's hold).
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

mod control;
mod datapath;
mod deletes;
mod inserts;
mod lifecycle;
mod protocol;
mod resources;
mod shard;
mod transitions;
mod window;

use spillway_vswitch::{Instant, TenantId};

pub use crate::hw::{DpuHardware, EmulatedHardware, EntryStats, HwKey, HwRule};
pub use crate::records::Role;
pub use control::{DpuControl, ShardReply, ShardRequest, Shards};
pub use lifecycle::{Command, DrainStep, EventKind, FabricEvent, Hold, Phase, Upgrade, Warm};
pub use protocol::Sender;
pub use resources::{Resources, ResourcesHandle, ShardCell};
pub use shard::{DpuShard, ShardView};
pub use window::{Totals, Utils};

use crate::params::FabricParams;
use crate::records::{Record, Records};
use crate::stats::{Drops, LatencyHist};
use crate::types::{ConnId, ConnState, Owner, PlaneSlot, Transmit};
use crate::ursched::Load;
use shard::Local;

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

impl DpuConn {
    /// The DPU owns it and it is on the hardware fast path or on its way there (entries live
    /// or queued): it stays on the DPU when its bucket is redirected. A hand-over leaves it
    /// (the fast path carries it), and its packets that miss the table meanwhile (an entry not
    /// live yet, after an activation or a recall) are the SoC's, which has its state, not the
    /// plane's, which would only punt them back: sent there, they could still be on their way
    /// when the connection's close took the fast path and removed the state they need.
    pub fn stays_on_dpu(&self) -> bool {
        self.role == Role::Owner && (self.hw_live > 0 || self.inserts_pending > 0)
    }
}

impl Record for DpuConn {
    fn role(&self) -> Role {
        self.role
    }
    fn set_role(&mut self, role: Role) {
        self.role = role;
    }
    fn state(&self) -> &ConnState {
        &self.state
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
        /// Rule commands from the SoC to the switch ASIC (each insert issued, each delete):
        /// one message each.
        rule_msgs => "dpu.rule.msgs",
        /// SoC time spent on rule commands a new connection's cost does not cover (recall
        /// inserts, deletes; `dpu.soc_rule_cost` each), ns.
        rule_soc_ns => "dpu.rule.soc_ns",
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
        /// State messages relayed to the warm standby plane (its bulk sync included).
        relayed => "dpu.sync.relay",
        /// Failovers: the redirect rules flipped to the warm plane's slot.
        failovers => "dpu.failover",
        /// Online upgrades finished: the new plane active, the old one stopped.
        upgrades => "dpu.upgrade",
        /// Messages from a fenced plane (one that is no longer the active or the warm one)
        /// that could have changed an owner's state, dropped.
        fenced => "dpu.fenced",
        /// Redirect buckets whose digests the DPU compared with a plane's: the warm plane's,
        /// or the active slot's before its activation.
        digest_buckets => "dpu.digest.buckets",
        /// Compared buckets whose digests differed, and were resynced.
        digest_mismatch => "dpu.digest.mismatch",
        /// Comparisons (per shard) dropped because the plane's answer came after its redirect
        /// rules went live: it could own connections by then, and the comparison would not be
        /// exact.
        digest_stale => "dpu.digest.stale",
        /// Buckets left out of a comparison with a plane that owns connections (after a flip)
        /// because the DPU sent a state message about one of them while the digests travelled:
        /// the plane's digest could not have seen it.
        digest_skipped => "dpu.digest.skipped",
    }
}

/// The shard of `shards` that holds `conn`: its redirect bucket (of `redirect_buckets`) modulo
/// the number of shards, so that a frame of either direction names its shard before any state
/// is looked up, and the overflow quota (a bucket range) splits over the shards.
pub fn shard_of(conn: ConnId, redirect_buckets: u16, shards: usize) -> usize {
    match shards {
        0 | 1 => 0,
        _ => shard_of_bucket(conn.bucket(redirect_buckets), shards),
    }
}

/// The shard of `shards` that holds redirect bucket `bucket`'s connections.
pub fn shard_of_bucket(bucket: u16, shards: usize) -> usize {
    usize::from(bucket) % shards.max(1)
}

/// The emulated DPU node. See the module doc.
///
/// A control part ([`DpuControl`]: the lifecycle's phase, hold, colour, quota and what the
/// plane last reported; measurement windows and URSched) and one or more [`DpuShard`]s, each
/// with the
/// connections of its buckets and everything kept per connection or per packet. The shards
/// charge one [`Resources`] through their [`ResourcesHandle`]s: the node's own by default (one
/// shard), or handles to one shared object (several shards, as a driver that forwards on
/// several threads has). `datapath.rs` serves trains, `protocol.rs` the plane's messages and
/// the hardware's completions, `transitions.rs` the lifecycle's steps.
#[derive(Debug)]
pub struct DpuNode<R: ResourcesHandle = Resources> {
    control: DpuControl,
    /// The shards; a connection's is [`DpuNode::shard_of`] it. At least one.
    shards: Vec<DpuShard<R>>,
    /// The shard the last input went to (whose `delivered_last` the driver asks for).
    last: usize,
    /// Shards served elsewhere (other threads of a driver that forwards on several), numbered
    /// after `shards`: the control part reaches them through this, and the driver gives them
    /// their connections' inputs itself. See [`DpuNode::with_remote`].
    remote: Option<Remote>,
}

/// The shards the control part asks: the node's own, then the remote ones.
fn all<'a, R: ResourcesHandle>(
    shards: &'a mut [DpuShard<R>],
    remote: &'a mut Option<Remote>,
) -> Local<'a, R> {
    Local(
        shards,
        remote.as_mut().map(|r| &mut *r.0 as &mut dyn Shards),
    )
}

/// The transport to a node's shards served elsewhere.
struct Remote(Box<dyn Shards>);

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("shards", &self.0.count())
            .finish()
    }
}

impl DpuNode {
    /// A DPU with the limits in `f` (validated by the caller with [`FabricParams::validate`]).
    pub fn new(f: &FabricParams) -> DpuNode {
        DpuNode::with_hardware(f, Box::new(EmulatedHardware::new(f)))
    }

    /// A DPU node over other hardware (a real backend, or a test double).
    pub fn with_hardware(f: &FabricParams, hw: Box<dyn DpuHardware>) -> DpuNode {
        DpuNode::with_resources(f, Resources::new(f, hw))
    }
}

impl DpuNode<ShardCell> {
    /// A DPU with the limits in `f` over the emulated hardware, its connections split over
    /// `f.dpu.shards` shards served in turn in one thread (the simulator's).
    pub fn sharded(f: &FabricParams) -> DpuNode<ShardCell> {
        let cell = ShardCell::new(Resources::new(f, Box::new(EmulatedHardware::new(f))));
        let shards = (0..f.dpu.shards.max(1)).map(|_| cell.clone()).collect();
        DpuNode::with_shards(f, shards)
    }
}

impl<R: ResourcesHandle> DpuNode<R> {
    /// A DPU node of one shard that charges the resources `res` reaches (built from the same
    /// `f`).
    pub fn with_resources(f: &FabricParams, res: R) -> DpuNode<R> {
        DpuNode::with_shards(f, vec![res])
    }

    /// A DPU node of one shard per handle in `res`, every handle reaching the same resources
    /// (built from the same `f`).
    ///
    /// # Panics
    ///
    /// If `res` is empty.
    pub fn with_shards(f: &FabricParams, res: Vec<R>) -> DpuNode<R> {
        assert!(!res.is_empty(), "a DPU node has at least one shard");
        DpuNode {
            control: DpuControl::new(f),
            shards: res.into_iter().map(|r| DpuShard::new(f, r)).collect(),
            last: 0,
            remote: None,
        }
    }

    /// A DPU node that holds shard 0 itself, charging `res`, and reaches shards `1..` through
    /// `remote` (shard `i` is `remote`'s `i - 1`), every shard charging the same resources:
    /// the control thread of a driver that forwards on several threads, each of the others
    /// with a [`DpuShard`] of its own. The node's inputs must be of shard 0's connections
    /// (the driver hands the others' to their threads); its getters report shard 0, and the
    /// lifecycle (timers, the plane's replies, holds) asks every shard.
    pub fn with_remote(f: &FabricParams, res: R, remote: Box<dyn Shards>) -> DpuNode<R> {
        let mut node = DpuNode::with_resources(f, res);
        node.remote = Some(Remote(remote));
        node
    }

    /// How many shards the DPU has, here and elsewhere.
    fn shards_total(&self) -> usize {
        self.shards.len() + self.remote.as_ref().map_or(0, |r| r.0.count())
    }

    /// The shard that holds `conn` (see [`shard_of`]).
    pub fn shard_of(&self, conn: ConnId) -> usize {
        shard_of(
            conn,
            self.control.f.dpu.redirect_buckets,
            self.shards_total(),
        )
    }

    /// The shard of `conn`, which becomes the one the driver asks about the input.
    ///
    /// # Panics
    ///
    /// If `conn` belongs to a shard served elsewhere: its thread, not this node, takes its
    /// inputs, and a driver that gives them here has routed them wrong.
    fn shard_for(&mut self, conn: ConnId) -> &mut DpuShard<R> {
        self.last = self.shard_of(conn);
        let here = self.shards.len();
        self.shards
            .get_mut(self.last)
            .unwrap_or_else(|| panic!("an input for shard {} given to a node of {here}", self.last))
    }

    /// The resources (any shard's handle reaches them).
    fn res(&self) -> R::Read<'_> {
        self.shards[0].res.read()
    }

    // ---- getters -------------------------------------------------------------------------

    /// Shards this node holds itself (see [`DpuNode::with_remote`]).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
    /// What the shards see of the lifecycle now: a driver with shards on other threads
    /// ([`DpuNode::with_remote`]) passes it on after every lifecycle input.
    pub fn view(&self) -> ShardView {
        self.control.view()
    }
    /// The lifecycle phase.
    pub fn phase(&self) -> Phase {
        self.control.phase()
    }
    /// The operator's hold.
    pub fn hold(&self) -> Hold {
        self.control.hold()
    }
    /// Counters, summed over the shards.
    pub fn counters(&self) -> DpuCounters {
        let mut c = self.shards[0].counters;
        for s in &self.shards[1..] {
            c.add(&s.counters);
        }
        // The SoC's rule time is the whole DPU's, kept with its resources.
        c.rule_soc_ns = self.res().rule_soc_ps / 1000;
        c
    }
    /// Counters of shard `i`.
    pub fn shard_counters(&self, i: usize) -> &DpuCounters {
        &self.shards[i].counters
    }
    /// Packets the fast path refused (`dpu.hw.overload`), by tenant, summed over the shards:
    /// `(tenant, packets)` for every tenant that lost any, by tenant id (ids from
    /// `ursched::TENANTS_MAX - 1` up are counted together under that id).
    pub fn hw_lost_by_tenant(&self) -> Vec<(TenantId, u64)> {
        let mut v: Vec<u64> = Vec::new();
        for s in &self.shards {
            if s.tenant_hw_lost.len() > v.len() {
                v.resize(s.tenant_hw_lost.len(), 0);
            }
            for (a, b) in v.iter_mut().zip(&s.tenant_hw_lost) {
                *a += b;
            }
        }
        v.into_iter()
            .enumerate()
            .filter(|(_, n)| *n > 0)
            .map(|(i, n)| (TenantId(i as u32), n))
            .collect()
    }
    /// Delivery, loss and latency by tenant, summed over the shards (the packets the DPU
    /// delivered, its own and the plane's it sent on).
    pub fn tenant_stats(&self) -> crate::stats::TenantStats {
        let mut t = crate::stats::TenantStats::default();
        for s in &self.shards {
            t.merge(&s.tenants);
        }
        t
    }
    /// Each tenant's delivered and lost packets, summed over the shards, into `out`
    /// (cleared first; `(tenant, delivered, lost)` in tenant order).
    pub fn tenant_totals(&self, out: &mut Vec<(u32, u64, u64)>) {
        out.clear();
        for s in &self.shards {
            s.tenants.add_totals(out);
        }
    }
    /// Drops by reason, summed over the shards.
    pub fn drops(&self) -> Drops {
        self.shards[1..]
            .iter()
            .fold(self.shards[0].drops, |d, s| d.merged(&s.drops))
    }
    /// Latency of every packet the DPU delivered (its own and the plane's), ns.
    pub fn latency(&self) -> LatencyHist {
        let mut h = self.shards[0].latency.clone();
        for s in &self.shards[1..] {
            h.merge(&s.latency);
        }
        h
    }
    /// Latency since the last [`DpuNode::take_window_latency`].
    pub fn take_window_latency(&mut self) -> LatencyHist {
        let mut h = self.shards[0].latency_window.clone();
        for s in &self.shards[1..] {
            h.merge(&s.latency_window);
        }
        for s in &mut self.shards {
            s.latency_window.clear();
        }
        h
    }
    /// Hardware entries in use.
    pub fn hw_entries(&self) -> usize {
        self.res().entries()
    }
    /// Hardware table capacity.
    pub fn hw_capacity(&self) -> usize {
        self.res().capacity()
    }
    /// DPU memory in use, bytes.
    pub fn mem_used(&self) -> u64 {
        self.res().mem_used()
    }
    /// Redirected buckets (the overflow quota).
    pub fn quota(&self) -> u16 {
        self.control.quota()
    }
    /// The load URSched saw in the last window.
    pub fn last_load(&self) -> &Load {
        self.control.last_load()
    }
    /// Packets the fast path has matched for connections while they were recalled from the
    /// plane: the hardware counters of live recalled entries plus those of recalled entries
    /// removed (or demoted) before. O(connections): for reports at a window's edges, not per
    /// packet. The entries' counters count matches, so under fast-path overload (a full input
    /// queue) this includes packets the queue then dropped.
    pub fn recalled_hw_packets(&self) -> u64 {
        self.shards.iter().map(DpuShard::recalled_hw_packets).sum()
    }

    /// Insert commands the hardware has executed (live or refused by a full table); the
    /// insertion-budget checker reads it.
    pub fn inserts_total(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.counters.inserts + s.insert_refused_at_completion)
            .sum()
    }
    /// The first connection a packet of which found no state here (for diagnosing a failed
    /// continuity check; with several shards, the first shard's that has one).
    pub fn first_no_state(&self) -> Option<ConnId> {
        self.shards.iter().find_map(|s| s.first_no_state)
    }
    /// The DPU's record of `conn`.
    pub fn conn(&self, conn: ConnId) -> Option<&DpuConn> {
        self.shards.get(self.shard_of(conn))?.conns.get(&conn)
    }
    /// Connections the DPU has a record of.
    pub fn conns_len(&self) -> usize {
        self.shards.iter().map(|s| s.conns.len()).sum()
    }
    /// Connections the DPU owns.
    pub fn conns_owned(&self) -> u64 {
        self.shards.iter().map(|s| s.conns.owned()).sum()
    }
    /// Every record, sorted by connection (for checkers and dumps; O(n log n)).
    pub fn conns_sorted(&self) -> Vec<(ConnId, DpuConn)> {
        Records::sorted_over(self.shards.iter().map(|s| &s.conns))
    }
    /// Where `conn` is served: `None` if the DPU has no record.
    pub fn owner_view(&self, conn: ConnId) -> Option<Owner> {
        self.conn(conn).map(|c| match c.role {
            Role::Owner if c.hw_live == 2 => Owner::DpuHw,
            Role::Owner => Owner::DpuSoc,
            Role::Copy => Owner::Spill,
        })
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// The next message for the active plane (in [`DpuNode::active_slot`]): the first
    /// shard's first, then the next shard's.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.shards.iter_mut().find_map(|s| s.out.pop())
    }
    /// The next message for the warm standby plane (in the other slot).
    pub fn poll_warm_transmit(&mut self) -> Option<Transmit> {
        self.shards.iter_mut().find_map(|s| s.warm_out.pop())
    }
    /// The slot whose plane the redirect rules steer to: where [`DpuNode::poll_transmit`]'s
    /// messages go. Read it after the input: a failover changes it.
    pub fn active_slot(&self) -> PlaneSlot {
        self.control.active_slot()
    }
    /// The warm standby plane's state.
    pub fn warm(&self) -> Warm {
        self.control.warm()
    }
    /// Whether frames a driver took back from a failed plane may be offered again now: not
    /// while a flip is under way, since the redirect rules still steer to the failed slot
    /// until it is live (they would go to the dead plane again).
    pub fn takes_reoffers(&self) -> bool {
        !matches!(self.control.warm(), Warm::Flipping { .. })
    }
    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.control.poll_command()
    }
    /// The next lifecycle event.
    pub fn poll_event(&mut self) -> Option<FabricEvent> {
        self.control.poll_event()
    }
    /// When [`DpuNode::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.control.poll_timeout();
        for s in &self.shards {
            if let Some(due) = s.poll_timeout() {
                t = t.min(due);
            }
        }
        Some(t)
    }

    /// The driver's report of how many host cores the tenants use (isolation input).
    pub fn set_tenant_cores(&mut self, cores: u32) {
        self.control.set_tenant_cores(cores);
    }

    /// The cluster's baseline for URSched's variance trigger, from the control plane
    /// (`None`: compare with this host's aggregate).
    pub fn set_cluster_baseline(&mut self, cv2: Option<f64>) {
        self.control.set_cluster_baseline(cv2);
    }

    /// Every tenant's load as of URSched's last variance window: what the host publishes.
    pub fn tenant_loads(&self) -> &[crate::ursched::TenantLoad] {
        self.control.tenant_loads()
    }

    /// Host cores wanted from a remote pool while URSched's fallback (no isolatable core
    /// here) or a plane on the pool lasts: what the cluster agent reserves on a pool host.
    pub fn remote_wanted(&self) -> Option<u32> {
        self.control.remote_wanted()
    }

    /// The cluster agent's report of the cores a remote pool host has granted this host (its
    /// reservation), or `None` (0 is none). With a grant, URSched prepares the plane on the
    /// pool when this host has no isolatable core, and [`Command::StartPlane`] says
    /// `remote: true`.
    pub fn set_remote_grant(&mut self, cores: Option<u32>) {
        self.control.set_remote_grant(cores);
    }

    /// The plane (the active one and the warm one alike) runs on a remote pool host: what the
    /// last [`Command::StartPlane`] of this plane said. False with no plane.
    pub fn plane_remote(&self) -> bool {
        self.control.plane_remote()
    }

    /// Host cores a plane could take now (URSched's rule): what the host publishes as spare.
    pub fn isolatable_cores(&self) -> u32 {
        self.control.isolatable_cores()
    }

    // ---- lifecycle inputs ------------------------------------------------------------------

    /// The plane's process runs (the driver's report after [`Command::StartPlane`]).
    pub fn handle_plane_up(&mut self, now: Instant) {
        self.control
            .handle_plane_up(now, &mut all(&mut self.shards, &mut self.remote));
    }

    /// The plane's process died (the driver saw it exit). Same as a lost heartbeat.
    pub fn handle_plane_failed(&mut self, now: Instant, reason: &str) {
        self.control
            .handle_plane_failed(now, reason, &mut all(&mut self.shards, &mut self.remote));
    }

    /// An operator asks for an online upgrade: see [`Upgrade`].
    pub fn handle_upgrade(&mut self, now: Instant) {
        self.control
            .handle_upgrade(now, false, &mut all(&mut self.shards, &mut self.remote));
    }

    /// An online upgrade to another binary: a warm plane already up runs the old one, so it is
    /// stopped and a plane is started for the upgrade, as without warm standby.
    pub fn handle_upgrade_fresh(&mut self, now: Instant) {
        self.control
            .handle_upgrade(now, true, &mut all(&mut self.shards, &mut self.remote));
    }

    /// The online upgrade under way.
    pub fn upgrade(&self) -> Upgrade {
        self.control.upgrade()
    }

    /// The plane in `slot` runs (the driver's report after [`Command::StartPlane`]).
    pub fn handle_plane_up_in(&mut self, now: Instant, slot: PlaneSlot) {
        self.control
            .handle_plane_up_in(now, slot, &mut all(&mut self.shards, &mut self.remote));
    }

    /// The plane in `slot` died (the driver saw it exit): the active one fails over to a
    /// ready warm plane, or open; a warm one is replaced.
    pub fn handle_plane_failed_in(&mut self, now: Instant, slot: PlaneSlot, reason: &str) {
        self.control.handle_plane_failed_in(
            now,
            slot,
            reason,
            &mut all(&mut self.shards, &mut self.remote),
        );
    }

    /// Timers: insert completions, redirect install/removal, URSched windows.
    pub fn handle_timeout(&mut self, now: Instant) {
        for s in &mut self.shards {
            s.complete_due_inserts(now);
        }
        self.control
            .handle_timeout(now, &mut all(&mut self.shards, &mut self.remote));
    }

    /// An operator sets (or clears, with [`Hold::Auto`]) a hold on the lifecycle. The DPU takes
    /// the next step towards it at once where one is possible (prepare a plane, activate a
    /// synced one, release an active one), and the rest as the protocol completes.
    pub fn handle_hold(&mut self, now: Instant, hold: Hold) {
        self.control
            .handle_hold(now, hold, &mut all(&mut self.shards, &mut self.remote));
    }

    /// The recall budget the DPU sends the plane every window (`Msg::Budget`): free hardware
    /// entries and the fast-path headroom left, pps.
    pub fn recall_budget(&self) -> (usize, f64) {
        self.res().recall_budget()
    }

    /// Checks the DPU's own invariants: table and queue bounds, memory and owner accounting,
    /// a remote plane's reservation. O(connections).
    pub fn check_invariants(&self) -> Result<(), String> {
        for s in &self.shards {
            s.check_invariants()?;
        }
        // A plane on the pool stands on a reservation there, kept as long as the plane lives.
        if self.plane_remote() && (self.phase() == Phase::Idle || self.remote_wanted().is_none()) {
            return Err(format!(
                "dpu: a remote plane in phase {} with {:?} cores wanted from the pool",
                self.phase().name(),
                self.remote_wanted()
            ));
        }
        let (held, counted) = (self.conns_len() as u64, self.res().conns());
        if R::EXCLUSIVE && held != counted {
            return Err(format!(
                "dpu: resources count {counted} records, the shards hold {held}"
            ));
        }
        Ok(())
    }

    /// Cheap checks after every event: table within capacity, queues within bounds.
    pub fn check_cheap(&self) -> Result<(), String> {
        self.res().check_cheap()
    }
}

#[cfg(test)]
mod tests {
    use spillway_vswitch::TenantId;

    use super::*;
    use crate::types::{ConnPhase, Dest, Kind, Msg, Side, Train};

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
    fn a_message_travels_on_its_connections_shards_lane_and_a_marker_on_the_one_it_names() {
        let (buckets, shards) = (64, 4);
        let conn = (0..1000u64)
            .map(ConnId)
            .find(|&c| shard_of(c, buckets, shards) == 3)
            .expect("some connection of shard 3");
        let packets = Msg::Packets(data(conn, Instant::ZERO, 1));
        assert_eq!(packets.lane(buckets, shards), 3);
        assert_eq!(Msg::Adopted { conn }.lane(buckets, shards), 3);
        let c = crate::types::Colour(1);
        let released = Msg::Released {
            colour: c,
            count: 9,
            shard: 2,
        };
        assert_eq!(released.lane(buckets, shards), 2);
        let drained = Msg::Drained {
            colour: c,
            shard: 1,
        };
        assert_eq!(drained.lane(buckets, shards), 1);
        // The plane as a whole: lane 0; so is a marker naming a shard that does not exist.
        let hb = Msg::Heartbeat {
            workers: 1,
            util: 0.0,
        };
        assert_eq!(hb.lane(buckets, shards), 0);
        let stray = Msg::SyncDone {
            colour: c,
            count: 0,
            shard: 9,
        };
        assert_eq!(stray.lane(buckets, shards), 0);
        // One shard: everything on lane 0.
        assert_eq!(packets.lane(buckets, 1), 0);
        assert_eq!(released.lane(buckets, 1), 0);
    }

    /// The plane's recall of an established connection `conn`.
    fn recall_of(conn: ConnId) -> Msg {
        let state = ConnState {
            conn,
            tenant: TenantId(1),
            phase: ConnPhase::Established,
            packets: 10,
            version: 2,
            opened: Instant(0),
        };
        Msg::Recall {
            state,
            pps: 0.0,
            replaces_pps: 0.0,
        }
    }

    #[test]
    fn recall_demote_recall_is_two_flaps_and_recalled_packets_are_counted() {
        let mut dpu = DpuNode::new(&FabricParams::default());
        let conn = ConnId(5);
        let recall = recall_of(conn);
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

    /// A recall's two inserts and every delete are rule commands: one message each, and with
    /// `soc_rule_cost` set, SoC time each, which delays the recall's entries by that time; a new
    /// connection's inserts are messages but cost nothing more (its own cost covers them).
    #[test]
    fn recall_inserts_and_deletes_cost_soc_time_and_a_message_each() {
        let recall_at = |cost_us: u64| {
            let mut f = FabricParams::default();
            f.dpu.soc_rule_cost = std::time::Duration::from_micros(cost_us);
            let mut dpu = DpuNode::new(&f);
            let conn = ConnId(5);
            dpu.handle_msg(Instant(1_000_000), recall_of(conn));
            // The entries go live once the SoC built both commands, the engine took them and
            // the insert latency passed.
            let live = f.dpu.insert_latency.as_nanos() as u64;
            dpu.handle_timeout(Instant(1_000_000 + live + 2_000));
            let early = dpu.owner_view(conn);
            dpu.handle_timeout(Instant(1_000_000 + live + 2 * cost_us * 1_000 / 8 + 2_000));
            assert_eq!(dpu.owner_view(conn), Some(Owner::DpuHw));
            let after_recall = dpu.counters();
            dpu.handle_msg(Instant(5_000_000), Msg::Delete { seq: 1, conn });
            dpu.handle_msg(Instant(6_000_000), Msg::Adopted { conn });
            dpu.check_invariants().unwrap();
            (early, after_recall, dpu.counters())
        };
        let (early, recalled, done) = recall_at(0);
        assert_eq!(early, Some(Owner::DpuHw), "free commands add no delay");
        assert_eq!((recalled.rule_msgs, recalled.rule_soc_ns), (2, 0));
        assert_eq!((done.rule_msgs, done.rule_soc_ns, done.deletes), (4, 0, 2));
        let (early, recalled, done) = recall_at(100);
        assert_ne!(early, Some(Owner::DpuHw), "the SoC's time comes first");
        assert_eq!((recalled.rule_msgs, recalled.rule_soc_ns), (2, 200_000));
        assert_eq!((done.rule_msgs, done.rule_soc_ns), (4, 400_000));
        // A connection the SoC opens: two inserts, two messages, no rule time.
        let mut f = FabricParams::default();
        f.dpu.soc_rule_cost = std::time::Duration::from_micros(100);
        let mut dpu = DpuNode::new(&f);
        let open = Train {
            kind: Kind::Open,
            ..data(ConnId(7), Instant(0), 1)
        };
        dpu.handle_train(Instant(0), &open);
        dpu.handle_timeout(Instant(1_000_000));
        assert_eq!(
            (dpu.counters().rule_msgs, dpu.counters().rule_soc_ns),
            (2, 0)
        );
    }

    #[test]
    fn a_packet_after_its_connections_close_is_told_apart_from_lost_state() {
        use crate::stats::FabricDrop;
        let mut dpu = DpuNode::new(&FabricParams::default());
        let conn = ConnId(9);
        let train = |kind, at| Train {
            kind,
            ..data(conn, at, 1)
        };
        dpu.handle_train(Instant(0), &train(Kind::Open, Instant(0)));
        dpu.handle_train(Instant(1_000), &train(Kind::Close, Instant(1_000)));
        assert!(dpu.conn(conn).is_none());
        // A data packet of it that took a slower path (the plane punts it back) arrives late.
        dpu.handle_msg(Instant(2_000), Msg::Punt(data(conn, Instant(500), 3)));
        assert_eq!(dpu.drops().get(FabricDrop::AfterClose), 3);
        assert_eq!(dpu.drops().get(FabricDrop::NoState), 0);
        // A connection the DPU never knew is lost state.
        dpu.handle_msg(
            Instant(3_000),
            Msg::Punt(data(ConnId(10), Instant(2_500), 2)),
        );
        assert_eq!(dpu.drops().get(FabricDrop::NoState), 2);
        assert_eq!(dpu.first_no_state(), Some(ConnId(10)));
    }

    #[test]
    fn a_shed_counts_as_a_flap_only_for_a_recalled_connection() {
        let mut dpu = DpuNode::new(&FabricParams::default());
        // A connection the SoC opened, with live entries (what a shed picks).
        dpu.shards[0].conns.insert(
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
        dpu.shards[0].left_fast_path(ConnId(1));
        assert_eq!(dpu.counters().flaps, 0);
        assert_eq!(
            dpu.shards[0].conns[&ConnId(1)].history,
            RecallHistory::Never
        );
        dpu.shards[0].conns.get_mut(&ConnId(1)).unwrap().history = RecallHistory::Recalled;
        dpu.shards[0].left_fast_path(ConnId(1));
        assert_eq!(dpu.counters().flaps, 1);
        assert_eq!(dpu.shards[0].conns[&ConnId(1)].history, RecallHistory::Left);
    }
}
