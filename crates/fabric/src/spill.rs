//! The host spill plane (the paper's Elastic VM): the vSwitch on N elastic host workers, its
//! flow cache, the host side of the vNIC set, the reliable delete channel, and placement.
//!
//! # The lifecycle
//!
//! The plane follows the DPU's lifecycle (see [`crate::dpu`]); it never decides a transition
//! itself. Its state is not an enum: it is read off three flags (`up`, `active`,
//! `releasing`), and only the four combinations below occur.
//!
//! ```text
//!            start               Msg::Activated          Msg::Release
//!   Down -------------> Shadow -----------------> Active ---------------> Releasing
//!    ^                    |                         |                       | Msg::Drain:
//!    |                    |                         |                       | answers Drained,
//!    |                    |                         |                       | stays Releasing
//!    +--------------------+-------------------------+-----------------------+
//!          stop: the DPU went Idle (Command::StopPlane), or the process died
//! ```
//!
//! - **Down** (`!up`): messages and timers are ignored and [`SpillPlane::poll_timeout`] is
//!   `None`. Entered at [`SpillPlane::new`], and from Shadow, Active and Releasing by
//!   [`SpillPlane::stop`], which forgets every record, pending delete and queued message and
//!   gives the plane a fresh placement policy.
//! - **Shadow** (`up`, `!active`): heartbeats every `host.heartbeat`; takes the DPU's bulk
//!   sync as copies and echoes its `Msg::SyncDone`, which arrives on the flow vNIC after every
//!   state of the sync. Placement ticks measure flows but move none. Entered from Down only,
//!   by [`SpillPlane::start`] (the driver started the process after `Command::StartPlane`).
//! - **Active** (`active`, `!releasing`): serves the packets the redirect rules steer here,
//!   opens new connections as their owner and mirrors them to the DPU, reports its first
//!   served packet once (`Msg::Absorbing`), applies `Msg::SetWorkers` after
//!   `host.worker_start`, and sends recalls and demotions on placement ticks. Entered from
//!   Shadow only, by `Msg::Activated` (the DPU sends it once per colour, when its redirect rules
//!   go live, and before any `Msg::Release` on the same control channel).
//! - **Releasing** (`releasing`): hands every connection it owns back to the DPU
//!   (`SyncKind::Handover`; it keeps a copy), then sends `Msg::Released` on the flow vNIC behind
//!   them. A connection it opens or is handed from here on goes straight back. Placement moves
//!   nothing. `Msg::Drain` is answered with `Msg::Drained` once its workers, its flow vNIC and
//!   its phy vNIC toward the DPU are idle; the plane stays Releasing until the DPU stops it.
//!   Entered from Active only, by `Msg::Release` (the DPU sends it only from its own Active
//!   phase; a plane released from Shadow is stopped without it).
//!
//! A fail-open (lost heartbeats, or the process died) is local to the DPU: the plane is
//! stopped from whatever state it was in, and a state message of its still in flight is owned
//! by the DPU when it arrives (its colour is older than the DPU's, or the DPU has no plane).
//! In the simulator `stop` and `start` are calls on one `SpillPlane`; in the real-time driver
//! Down is a process that has exited, and each start is a new process with a new
//! `SpillPlane` (`spillway_rt::plane::process`).
//!
//! # Polling order
//!
//! Per event at `now`: one input ([`SpillPlane::handle_msg`] for a message from the DPU,
//! [`SpillPlane::handle_timeout`] when [`SpillPlane::poll_timeout`] is due, [`SpillPlane::start`]
//! when the driver has started the process); then drain [`SpillPlane::poll_transmit`].
//!
//! # What the model charges per packet
//!
//! Every packet costs the workers `pkt_cost` (`new_conn_cost` for an opening or denied one).
//! Then, without vATC (or for the uplink), it goes back to the DPU: the phy vNIC toward the
//! DPU (`phy_vnic_pps_limit`), the PCIe link toward the DPU (its bytes plus `overhead_bytes`
//! at `bandwidth_bytes`) and `pcie.latency`; the DPU passes it through its steering engine
//! again and, for a VM, writes it across the link once more. With vATC a VM-bound packet
//! costs the workers the copy instead: `vatc_copy_cost` + bytes / `copy_bandwidth_bytes` +
//! (1 - `vatc_hit_ratio`) x `vatc_miss_cost` (the expected translation-miss cost, so the run
//! stays deterministic), and is delivered when the worker is done, with no crossing back
//! (`atc.direct`; expected misses in `spill.atc.miss`).
//!
//! # Roles
//!
//! The plane holds each connection it knows as `Owner` (it serves and mirrors it to the DPU, so
//! the DPU can fail open) or `Copy` (shadow-mode mirrors from the DPU, or a connection in
//! transit to the DPU). A packet that reaches the plane for a `Copy` is served from the copy and
//! its state changes are mirrored to the owner: the copy is current, the owner stays the
//! authority.
//!
//! # Placement
//!
//! Every flow keeps a [`FlowCounters`] (packets, bytes, control packets, arrival gaps; a few
//! integers updated per train, no allocation). Every placement tick the plane turns them into
//! each flow's [`placement::Candidate::features`] (bandwidth, packet rate, control-packet
//! share, jitter), asks its [`PlacementPolicy`] for moves within the DPU's last
//! [`Msg::Budget`], and sends recalls on the flow vNIC and demotions (deletes) on the reliable
//! control channel, retransmitted every `control_rto` until acknowledged.
//!
//! Just over 1,000 lines with its tests and this doc; the node's code is under 1,000. A split
//! like `DpuNode`'s (`crate::dpu`) is the way to go when it grows.

use std::collections::BTreeMap;

use spillway_sketch::features::FlowCounters;
use spillway_vswitch::Instant;

use crate::links::{PcieLink, PhyVnic, at_ps, ps};
use crate::params::{FabricParams, ns};
use crate::placement::{Budget, Candidate, Move, Offloaded, PlacementPolicy};
use crate::records::Role;
use crate::records::{Outbox, Record, Records};
use crate::server::{PS_PER_NS, Server};
use crate::stats::{Drops, FabricDrop, LatencyHist};
use crate::types::{
    Channel, Colour, ConnId, ConnPhase, ConnState, Dest, Kind, Msg, SyncKind, Train, Transmit,
};

/// The plane's record of a connection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpillConn {
    /// Its state.
    pub state: ConnState,
    /// Owner or copy.
    pub role: Role,
    /// A recall is in flight.
    pub recalling: bool,
    /// This placement tick's per-flow counters (packets, bytes, control packets, arrival
    /// gaps): what [`placement::Candidate::features`] is made of.
    pub counters: FlowCounters,
    /// Rate over the last full tick, packets/s (negative: not yet measured).
    pub pps: f64,
    /// When the plane took it.
    pub since: Instant,
}

impl Record for SpillConn {
    fn role(&self) -> Role {
        self.role
    }
    fn set_role(&mut self, role: Role) {
        self.role = role;
    }
}

spillway_vswitch::counters! {
    /// Plane counters (dotted names in [`SpillCounters::iter`]).
    #[derive(Copy, PartialEq)]
    pub struct SpillCounters {
        /// Packets received from the DPU.
        rx => "spill.rx.packets",
        /// Packets the workers processed.
        processed => "spill.processed",
        /// Connections opened on the plane.
        new_conn => "spill.new_conn",
        /// Packets sent back to the DPU.
        to_dpu => "spill.tx.dpu",
        /// Packets delivered straight into VM memory (vATC).
        direct => "atc.direct",
        /// Packets sent the vATC way that the driver could not deliver (no translation yet, no
        /// receive buffer) and that went back through the DPU instead.
        direct_refused => "atc.direct_refused",
        /// vATC translation misses the cost model charged (the expectation at
        /// `host.vatc_hit_ratio`, accumulated and counted whole).
        atc_miss => "spill.atc.miss",
        /// Recalls sent.
        recalls_sent => "spill.recall.sent",
        /// Recalls acknowledged live.
        recalls_ok => "spill.recall.ok",
        /// Recalls refused.
        recalls_refused => "spill.recall.refused",
        /// Deletes sent (first transmissions).
        deletes_sent => "spill.delete.sent",
        /// Delete retransmissions.
        delete_retx => "spill.delete.retx",
        /// Deletes acknowledged.
        deletes_acked => "spill.delete.acked",
        /// State messages sent.
        sync_tx => "spill.sync.tx",
        /// Connections handed to the DPU.
        handovers => "spill.handover",
        /// Packets handed back to the DPU for lack of state.
        punted => "spill.punt",
        /// Opening packets the plane dropped.
        open_dropped => "spill.open_dropped",
        /// Connections whose last packet the plane delivered itself.
        closed_direct => "spill.conn.closed_direct",
        /// Core-nanoseconds of work the workers were given (packets admitted times their cost): the
        /// host CPU the plane spends. Per second of a window, cores busy.
        busy_ns => "spill.busy_ns",
    }
}

#[derive(Clone, Copy, Debug)]
struct PendingDelete {
    conn: ConnId,
    retx_at: Instant,
    /// The recall waiting for the entries this delete frees (a swap).
    then_recall: Option<(ConnId, f64, f64)>,
}

/// The spill plane. See the module doc.
#[derive(Debug)]
pub struct SpillPlane {
    f: FabricParams,
    up: bool,
    workers: Server,
    pending_workers: Option<(Instant, u32)>,
    pkt_ps: u64,
    new_ps: u64,
    /// vATC: fixed cost per packet (copy setup plus the expected miss cost), ps.
    vatc_ps: u64,
    /// vATC: copy cost per byte, ps.
    copy_ps_per_byte: f64,
    /// Expected translation misses not yet counted whole.
    atc_miss_acc: f64,
    to_dpu: PhyVnic,
    /// The PCIe link toward the DPU.
    link_up: PcieLink,
    conns: Records<SpillConn>,
    colour: Colour,
    active: bool,
    releasing: bool,
    absorbed_sent: bool,
    next_heartbeat: Instant,
    next_tick: Instant,
    budget: Budget,
    offloaded: BTreeMap<ConnId, f64>,
    deletes: BTreeMap<u64, PendingDelete>,
    next_seq: u64,
    policy: Box<dyn PlacementPolicy + Send>,
    moves: Vec<Move>,
    cands: Vec<Candidate>,
    offl: Vec<Offloaded>,
    first_no_state: Option<ConnId>,
    out: Outbox,
    counters: SpillCounters,
    /// Packets the current input sent the vATC way (see [`SpillPlane::direct_last`]).
    direct_last: u32,
    drops: Drops,
    latency: LatencyHist,
}

impl SpillPlane {
    /// A plane (not yet started) with the fabric's parameters.
    pub fn new(f: &FabricParams) -> SpillPlane {
        let per_ps = |d: core::time::Duration| ns(d) * PS_PER_NS;
        SpillPlane {
            up: false,
            workers: Server::new(f.host.workers_initial, f.pcie.phy_vnic_ring),
            pending_workers: None,
            pkt_ps: per_ps(f.host.pkt_cost),
            new_ps: per_ps(f.host.new_conn_cost),
            vatc_ps: per_ps(f.host.vatc_copy_cost)
                + ((1.0 - f.host.vatc_hit_ratio) * per_ps(f.host.vatc_miss_cost) as f64) as u64,
            copy_ps_per_byte: 1e12 / f.host.copy_bandwidth_bytes,
            atc_miss_acc: 0.0,
            to_dpu: PhyVnic::new(f),
            link_up: PcieLink::new(f),
            conns: Records::new(11),
            colour: Colour(0),
            active: false,
            releasing: false,
            absorbed_sent: false,
            next_heartbeat: Instant::ZERO,
            next_tick: Instant::ZERO,
            budget: Budget {
                free_entries: 0,
                headroom_pps: 0.0,
                recalls_max: f.placement.recalls_per_tick_max,
            },
            offloaded: BTreeMap::new(),
            deletes: BTreeMap::new(),
            next_seq: 1,
            policy: f.placement.build(),
            moves: Vec::new(),
            cands: Vec::new(),
            offl: Vec::new(),
            first_no_state: None,
            out: Outbox::new(f),
            counters: SpillCounters::default(),
            direct_last: 0,
            drops: Drops::default(),
            latency: LatencyHist::default(),
            f: f.clone(),
        }
    }

    // ---- getters ---------------------------------------------------------------------------

    /// The process runs.
    pub fn is_up(&self) -> bool {
        self.up
    }
    /// Workers running.
    pub fn workers(&self) -> u32 {
        self.workers.parallel()
    }
    /// Counters.
    pub fn counters(&self) -> &SpillCounters {
        &self.counters
    }
    /// Drops by reason.
    pub fn drops(&self) -> &Drops {
        &self.drops
    }
    /// Latency of packets the plane delivered itself (vATC), ns.
    pub fn latency(&self) -> &LatencyHist {
        &self.latency
    }
    /// The first connection a packet of which found no state here.
    pub fn first_no_state(&self) -> Option<ConnId> {
        self.first_no_state
    }
    /// The plane's record of `conn`.
    pub fn conn(&self, conn: ConnId) -> Option<&SpillConn> {
        self.conns.get(&conn)
    }
    /// Records held.
    pub fn conns_len(&self) -> usize {
        self.conns.len()
    }
    /// Connections owned.
    pub fn conns_owned(&self) -> u64 {
        self.conns.owned()
    }
    /// Every record, sorted by connection.
    pub fn conns_sorted(&self) -> Vec<(ConnId, SpillConn)> {
        self.conns.sorted()
    }
    /// The placement policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }
    /// Unacknowledged deletes.
    pub fn deletes_pending(&self) -> usize {
        self.deletes.len()
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// The next message for the DPU.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop()
    }

    /// When [`SpillPlane::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.up {
            return None;
        }
        let mut t = self.next_heartbeat.min(self.next_tick);
        if let Some((at, _)) = self.pending_workers {
            t = t.min(at);
        }
        if let Some(d) = self.deletes.values().map(|d| d.retx_at).min() {
            t = t.min(d);
        }
        Some(t)
    }

    fn send(&mut self, at: Instant, channel: Channel, msg: Msg) {
        self.out.send(at, channel, msg);
    }

    fn send_sync(&mut self, now: Instant, kind: SyncKind, state: ConnState) {
        self.counters.sync_tx += 1;
        self.out.sync(now, self.colour, kind, state);
    }

    fn set_role(&mut self, conn: ConnId, role: Role) {
        self.conns.set_role(conn, role);
    }

    fn insert_conn(&mut self, conn: ConnId, rec: SpillConn) {
        self.conns.insert(conn, rec);
    }

    fn remove_conn(&mut self, conn: ConnId) -> Option<SpillConn> {
        // A closed connection is no longer on the fast path either: placement must not see it
        // among the offloaded flows (a swap would demote a connection that is gone).
        self.offloaded.remove(&conn);
        self.policy.closed(conn);
        self.conns.remove(conn)
    }

    // ---- inputs ----------------------------------------------------------------------------

    /// The driver started the process with `workers` workers.
    pub fn start(&mut self, now: Instant, workers: u32) {
        self.up = true;
        self.workers = Server::new(workers.max(1), self.f.pcie.phy_vnic_ring);
        self.workers.take_util(ps(now));
        self.next_heartbeat = now;
        self.next_tick = now + self.f.placement.tick;
        self.active = false;
        self.releasing = false;
        self.absorbed_sent = false;
        self.budget.free_entries = 0;
        self.budget.headroom_pps = 0.0;
        self.send_heartbeat(now);
    }

    /// The process was stopped (released) or killed. Everything it held is gone; returns the
    /// packets that were queued in its workers (lost if it was killed).
    pub fn stop(&mut self, now: Instant) -> u32 {
        let lost = self.workers.fail(ps(now));
        self.up = false;
        self.conns.clear();
        self.offloaded.clear();
        self.deletes.clear();
        self.pending_workers = None;
        self.out.clear();
        // A new process starts with a new policy: nothing it learnt about flows survives.
        self.policy = self.f.placement.build();
        lost
    }

    /// Switches the placement policy (an operator's `spillway ctl set-policy`). The new policy
    /// starts with no history, as a restarted plane's would; flows already on the fast path stay
    /// there until it decides otherwise.
    pub fn set_placement(&mut self, kind: crate::params::PlacementKind) {
        self.f.placement.policy = kind;
        self.policy = self.f.placement.build();
    }

    /// Switches the delivery path of VM-bound packets at run time (`spillway ctl vatc on|off`):
    /// straight into VM memory through the vATC, or back through the DPU.
    pub fn set_vatc(&mut self, on: bool) {
        self.f.host.vatc = on;
    }

    /// Packets the last [`SpillPlane::handle_msg`] sent the vATC way: the driver copies them
    /// into VM memory itself (no phy message comes for them), or hands them back with
    /// [`SpillPlane::handle_direct_refused`].
    pub fn direct_last(&self) -> u32 {
        self.direct_last
    }

    /// Whether VM-bound packets take the vATC path.
    pub fn vatc(&self) -> bool {
        self.f.host.vatc
    }

    /// The driver could not deliver packets the plane sent the vATC way (no fresh translation,
    /// no receive buffer posted, a port without shared memory): they go back through the DPU
    /// instead, as without vATC, charged to the phy vNIC and the PCIe link toward the DPU
    /// (`atc.direct_refused`).
    pub fn handle_direct_refused(&mut self, now: Instant, t: &Train) {
        self.counters.direct_refused += u64::from(t.packets);
        if let Some((n, at)) = self.cross_back(ps(now), t) {
            let mut back = *t;
            back.packets = n;
            self.counters.to_dpu += u64::from(n);
            self.send(at, Channel::PhyVnic, Msg::Packets(back));
        }
    }

    fn send_heartbeat(&mut self, now: Instant) {
        let util = self.workers.take_util(ps(now));
        let workers = self.workers.parallel();
        self.send(now, Channel::Control, Msg::Heartbeat { workers, util });
        self.next_heartbeat = now + self.f.host.heartbeat;
    }

    /// A message from the DPU.
    pub fn handle_msg(&mut self, now: Instant, msg: Msg) {
        self.direct_last = 0;
        if !self.up {
            return;
        }
        match msg {
            Msg::Packets(t) => self.handle_packets(now, &t),
            Msg::Sync {
                kind,
                state,
                colour,
            } => {
                self.colour = self.colour.max(colour);
                self.ingest_sync(now, kind, state);
            }
            Msg::SyncDone { colour, count } => {
                // In order on the flow vNIC: every state of the bulk sync is in.
                self.out.send_flow(now, Msg::SyncDone { colour, count });
            }
            Msg::Activated { colour } => {
                self.colour = colour;
                self.active = true;
            }
            Msg::RecallDone { conn, ok } => {
                if ok {
                    self.counters.recalls_ok += 1;
                    // Keep a copy: packets redirected before the entries went live may still
                    // be on their way, and the DPU mirrors the connection's changes to it.
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.recalling = false;
                        self.offloaded.insert(conn, c.pps.max(0.0));
                    }
                } else {
                    self.counters.recalls_refused += 1;
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.recalling = false;
                    }
                    self.set_role(conn, Role::Owner);
                }
            }
            Msg::DeleteAck { seq, state } => {
                let Some(d) = self.deletes.remove(&seq) else {
                    return; // a duplicate ack of a retransmission
                };
                self.counters.deletes_acked += 1;
                self.offloaded.remove(&d.conn);
                if let Some(st) = state {
                    self.send(now, Channel::Control, Msg::Adopted { conn: d.conn });
                    self.insert_conn(
                        d.conn,
                        SpillConn {
                            state: st,
                            role: Role::Owner,
                            recalling: false,
                            counters: FlowCounters::default(),
                            pps: -1.0,
                            since: now,
                        },
                    );
                }
                if let Some((conn, pps, replaces)) = d.then_recall {
                    // A swap: the recall follows the adoption on the same (FIFO) channel, so
                    // the DPU has freed the demoted entries when it reads the recall.
                    self.recall_on(now, conn, pps, replaces, Channel::Control);
                }
            }
            Msg::OffloadStats { conn, pps } => {
                if let Some(v) = self.offloaded.get_mut(&conn) {
                    *v = pps;
                }
            }
            Msg::Budget {
                free_entries,
                headroom_pps,
            } => {
                self.budget.free_entries = free_entries;
                self.budget.headroom_pps = headroom_pps;
            }
            Msg::Release { colour } => {
                self.releasing = true;
                let owned = self.conns.keys_where(|_, c| c.role == Role::Owner);
                let count = owned.len() as u64;
                for conn in owned {
                    self.hand_over(now, conn);
                }
                let at = self.out.flow_idle_at(now);
                // On the flow vNIC, after the handovers, so the DPU has them all first.
                self.send(at, Channel::FlowVnic, Msg::Released { colour, count });
            }
            Msg::Drain { colour } => {
                let done = self
                    .workers
                    .busy_until_ps()
                    .max(ps(self.out.flow_idle_at(now)))
                    .max(self.to_dpu.busy_until_ps())
                    .max(ps(now));
                // On the flow vNIC, behind every handover the plane has sent: the DPU must own
                // all of them before it stops the plane.
                self.send(at_ps(done), Channel::FlowVnic, Msg::Drained { colour });
            }
            Msg::SetWorkers { workers } => {
                self.pending_workers = Some((now + self.f.host.worker_start, workers));
            }
            // Plane-to-DPU messages never arrive here.
            Msg::Recall { .. }
            | Msg::Punt(_)
            | Msg::Delete { .. }
            | Msg::Released { .. }
            | Msg::Heartbeat { .. }
            | Msg::Drained { .. }
            | Msg::Adopted { .. }
            | Msg::Absorbing => {}
        }
    }

    fn hand_over(&mut self, now: Instant, conn: ConnId) {
        let Some(c) = self.conns.get(&conn).copied() else {
            return;
        };
        self.set_role(conn, Role::Copy);
        self.counters.handovers += 1;
        self.send_sync(now, SyncKind::Handover, c.state);
    }

    fn ingest_sync(&mut self, now: Instant, kind: SyncKind, state: ConnState) {
        match kind {
            SyncKind::Closed => {
                // Its last packet went through the DPU: forget it, owner or copy.
                self.remove_conn(state.conn);
            }
            SyncKind::Update => {
                if let Some(c) = self.conns.get_mut(&state.conn)
                    && state.version >= c.state.version
                {
                    c.state = state;
                }
            }
            SyncKind::Mirror | SyncKind::Handover => {
                let role = if kind == SyncKind::Handover {
                    Role::Owner
                } else {
                    Role::Copy
                };
                match self.conns.get_mut(&state.conn) {
                    Some(c) => {
                        if state.version >= c.state.version {
                            c.state = state;
                        }
                        if role == Role::Owner {
                            c.recalling = false;
                            self.set_role(state.conn, Role::Owner);
                        }
                    }
                    None => {
                        if self.conns.len() * 2 + 2 > self.f.host.flow_cache_max {
                            // No room for a mirror: counted; a handover is taken regardless.
                            if role == Role::Copy {
                                self.drops.add(FabricDrop::SpillCacheFull, 0);
                                return;
                            }
                        }
                        self.insert_conn(
                            state.conn,
                            SpillConn {
                                state,
                                role,
                                recalling: false,
                                counters: FlowCounters::default(),
                                pps: -1.0,
                                since: now,
                            },
                        );
                    }
                }
                if role == Role::Owner {
                    self.send(now, Channel::Control, Msg::Adopted { conn: state.conn });
                }
                if role == Role::Owner && self.releasing {
                    // Handed to a releasing plane (a demotion crossing the release): give it
                    // straight back.
                    self.hand_over(now, state.conn);
                }
            }
        }
    }

    fn handle_packets(&mut self, now: Instant, t: &Train) {
        self.counters.rx += u64::from(t.packets);
        // The cost depends on the packet, not on what the plane knows of its connection.
        let direct = self.f.host.vatc && t.dest == Dest::Vm && !t.denied;
        let copy = if direct {
            self.vatc_ps + (f64::from(t.packet_bytes) * self.copy_ps_per_byte) as u64
        } else {
            0
        };
        let cost = copy
            + if t.kind == Kind::Open || t.denied {
                self.new_ps
            } else {
                self.pkt_ps
            };
        let a = self.workers.offer(ps(now), t.packets, cost);
        self.counters.busy_ns += u64::from(a.count) * (cost / PS_PER_NS);
        self.drops
            .add_refused(FabricDrop::SpillQueueFull, t.packets, a.count);
        if a.count == 0 {
            if t.kind == Kind::Open {
                self.counters.open_dropped += 1;
            }
            return;
        }
        if t.denied {
            self.drops.add(FabricDrop::Policy, u64::from(a.count));
            return;
        }
        self.counters.processed += u64::from(a.count);
        let bytes = u64::from(a.count) * u64::from(t.packet_bytes);
        // Control packets: the trains that step the connection (open, control, close).
        let ctrl = if t.kind == Kind::Data { 0 } else { a.count };
        // One lookup of the connection per train.
        match self.conns.get_mut(&t.conn) {
            None if t.kind == Kind::Open => {
                if self.conns.len() * 2 + 2 > self.f.host.flow_cache_max {
                    self.drops
                        .add(FabricDrop::SpillCacheFull, u64::from(a.count));
                    self.counters.open_dropped += 1;
                    return;
                }
                self.counters.new_conn += 1;
                let st = ConnState::open(now, t);
                let mut counters = FlowCounters::default();
                counters.record(now.0, a.count, bytes, ctrl);
                self.insert_conn(
                    t.conn,
                    SpillConn {
                        state: st,
                        role: Role::Owner,
                        recalling: false,
                        counters,
                        pps: -1.0,
                        since: now,
                    },
                );
                if self.releasing {
                    self.hand_over(now, t.conn);
                } else {
                    self.send_sync(now, SyncKind::Mirror, st);
                }
            }
            None => {
                // No state here (yet): the owner's mirror is still on its way, or the DPU kept
                // it. Hand the packets back to the DPU's slow path rather than drop them.
                let mut back = *t;
                back.packets = a.count;
                self.counters.punted += u64::from(a.count);
                if let Some((n, at)) = self.cross_back(a.finish_ps, &back) {
                    back.packets = n;
                    self.send(at, Channel::PhyVnic, Msg::Punt(back));
                }
                return;
            }
            Some(rec) if t.kind == Kind::Close => {
                let mut st = rec.state;
                st.phase = ConnPhase::Closing;
                st.version += 1;
                self.remove_conn(t.conn);
                // Owner or not, the DPU must forget its record of a closed connection.
                self.send_sync(now, SyncKind::Closed, st);
            }
            Some(rec) => {
                rec.counters.record(now.0, a.count, bytes, ctrl);
                if rec.state.apply(t) {
                    let st = rec.state;
                    let kind = if rec.role == Role::Owner {
                        SyncKind::Mirror
                    } else {
                        SyncKind::Update
                    };
                    self.send_sync(now, kind, st);
                }
            }
        }
        if self.active && !self.absorbed_sent {
            self.absorbed_sent = true;
            self.send(at_ps(a.finish_ps), Channel::Control, Msg::Absorbing);
        }
        let mut done = *t;
        done.packets = a.count;
        if direct {
            // Straight into the VM's receive buffer (the copy was part of the workers' cost):
            // no crossing back. Latency to the batch's average packet, like the DPU's.
            let mean_ps = ps(now) + a.wait_sum_ps / u64::from(a.count);
            let lat = (mean_ps / PS_PER_NS).saturating_sub(t.born.0);
            self.latency.record(lat, u64::from(a.count));
            self.counters.direct += u64::from(a.count);
            self.direct_last += a.count;
            self.atc_miss_acc += f64::from(a.count) * (1.0 - self.f.host.vatc_hit_ratio);
            let whole = self.atc_miss_acc.floor();
            self.counters.atc_miss += whole as u64;
            self.atc_miss_acc -= whole;
            if t.kind == Kind::Close {
                self.counters.closed_direct += 1;
            }
            return;
        }
        match self.cross_back(a.finish_ps, &done) {
            Some((n, at)) => {
                done.packets = n;
                self.counters.to_dpu += u64::from(n);
                self.send(at, Channel::PhyVnic, Msg::Packets(done));
            }
            None if t.kind == Kind::Open => self.counters.open_dropped += 1,
            None => {}
        }
    }

    /// Packets of `t` leave for the DPU at `at_ps`: the phy vNIC toward the DPU, then the PCIe
    /// link toward it (the driver adds `pcie.latency`). Returns how many got through and when
    /// the last left; the rest are dropped with their reason.
    fn cross_back(&mut self, at_ps_: u64, t: &Train) -> Option<(u32, Instant)> {
        // A link backed up toward the DPU backs up into the phy vNIC's ring (PCIe is lossless).
        let mut part = *t;
        part.packets = t.packets.min(self.link_up.room(at_ps_));
        let v = self.to_dpu.offer(at_ps_, &part);
        self.drops
            .add_refused(FabricDrop::VnicRingFull, t.packets, v.count);
        if v.count == 0 {
            return None;
        }
        let l = self.link_up.cross(v.finish_ps, v.count, t.packet_bytes);
        self.drops
            .add_refused(FabricDrop::PcieLinkFull, v.count, l.count);
        (l.count > 0).then(|| (l.count, at_ps(l.finish_ps)))
    }

    fn recall(&mut self, now: Instant, conn: ConnId, pps: f64, replaces_pps: f64) {
        self.recall_on(now, conn, pps, replaces_pps, Channel::FlowVnic);
    }

    fn recall_on(
        &mut self,
        now: Instant,
        conn: ConnId,
        pps: f64,
        replaces_pps: f64,
        channel: Channel,
    ) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.role != Role::Owner || c.recalling {
            return;
        }
        c.recalling = true;
        let state = c.state;
        // The state travels with the recall: from here the plane holds a copy.
        self.set_role(conn, Role::Copy);
        self.counters.recalls_sent += 1;
        let msg = Msg::Recall {
            state,
            pps,
            replaces_pps,
        };
        if channel == Channel::FlowVnic {
            self.out.send_flow(now, msg);
        } else {
            self.send(now, channel, msg);
        }
    }

    /// Timers: heartbeats, worker changes, placement ticks, delete retransmissions.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.up {
            return;
        }
        if now >= self.next_heartbeat {
            self.send_heartbeat(now);
        }
        if let Some((at, w)) = self.pending_workers
            && now >= at
        {
            self.workers.set_parallel(w.max(1));
            self.pending_workers = None;
        }
        let due: Vec<u64> = self
            .deletes
            .iter()
            .filter(|(_, d)| d.retx_at <= now)
            .map(|(s, _)| *s)
            .collect();
        for seq in due {
            let d = self.deletes.get_mut(&seq).expect("collected");
            d.retx_at = now + self.f.pcie.control_rto;
            let conn = d.conn;
            self.counters.delete_retx += 1;
            self.send(now, Channel::Control, Msg::Delete { seq, conn });
        }
        if now >= self.next_tick {
            self.next_tick = self.next_tick + self.f.placement.tick;
            self.placement_tick(now);
        }
    }

    fn placement_tick(&mut self, now: Instant) {
        let tick = self.f.placement.tick;
        self.cands.clear();
        for (k, c) in self.conns.iter_mut() {
            let measured = c.pps >= 0.0;
            let features = c.counters.take(tick);
            // A flow joining mid-tick has a partial first sample; it counts from the next one.
            let full_tick = now.0.saturating_sub(c.since.0) >= ns(self.f.placement.tick);
            c.pps = if full_tick { features.pps } else { -1.0 };
            if measured
                && full_tick
                && c.role == Role::Owner
                && !c.recalling
                && c.state.phase == ConnPhase::Established
            {
                self.cands.push(Candidate {
                    conn: *k,
                    since: c.since,
                    features,
                });
            }
        }
        if !self.active || self.releasing {
            return;
        }
        self.cands.sort_unstable_by_key(|c| c.conn);
        self.offl.clear();
        self.offl
            .extend(self.offloaded.iter().map(|(conn, pps)| Offloaded {
                conn: *conn,
                pps: *pps,
            }));
        self.moves.clear();
        let mut moves = core::mem::take(&mut self.moves);
        self.policy
            .tick(now, &self.cands, &self.offl, self.budget, &mut moves);
        let mut i = 0;
        while i < moves.len() {
            match moves[i] {
                Move::Demote { conn } => {
                    // A swap: the recall that follows waits for the delete's ack.
                    let then = match moves.get(i + 1) {
                        Some(Move::Recall {
                            conn: c,
                            pps,
                            replaces_pps,
                        }) => {
                            i += 1;
                            Some((*c, *pps, *replaces_pps))
                        }
                        _ => None,
                    };
                    self.delete(now, conn, then);
                }
                Move::Recall {
                    conn,
                    pps,
                    replaces_pps,
                } => self.recall(now, conn, pps, replaces_pps),
            }
            i += 1;
        }
        self.moves = moves;
    }

    fn delete(&mut self, now: Instant, conn: ConnId, then_recall: Option<(ConnId, f64, f64)>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.counters.deletes_sent += 1;
        self.deletes.insert(
            seq,
            PendingDelete {
                conn,
                retx_at: now + self.f.pcie.control_rto,
                then_recall,
            },
        );
        self.send(now, Channel::Control, Msg::Delete { seq, conn });
    }

    /// Checks owner accounting and queue bounds. O(connections).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.conns.check("spill")?;
        if self.conns.len() * 2 > self.f.host.flow_cache_max {
            return Err(format!(
                "spill: flow cache {} entries > {}",
                self.conns.len() * 2,
                self.f.host.flow_cache_max
            ));
        }
        self.workers.check_invariants()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use spillway_vswitch::TenantId;

    use super::*;
    use crate::types::Side;

    /// Every tick's time and candidates.
    type Ticks = Arc<Mutex<Vec<(Instant, Vec<Candidate>)>>>;

    /// A policy that recalls nothing and keeps every tick's candidates.
    #[derive(Debug, Default)]
    struct Recorder(Ticks);

    impl PlacementPolicy for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn tick(
            &mut self,
            now: Instant,
            candidates: &[Candidate],
            _: &[Offloaded],
            _: Budget,
            _: &mut Vec<Move>,
        ) {
            self.0
                .lock()
                .expect("not poisoned")
                .push((now, candidates.to_vec()));
        }
    }

    #[test]
    fn candidates_carry_each_flows_features_from_its_trains() {
        let f = FabricParams::default();
        let mut plane = SpillPlane::new(&f);
        let seen = Arc::new(Mutex::new(Vec::new()));
        plane.policy = Box::new(Recorder(seen.clone()));
        plane.start(Instant(0), 4);
        plane.handle_msg(Instant(0), Msg::Activated { colour: Colour(1) });
        let base = Train {
            conn: ConnId(7),
            tenant: TenantId(1),
            side: Side::Orig,
            dest: Dest::Wire,
            kind: Kind::Open,
            packets: 1,
            packet_bytes: 500,
            born: Instant(0),
            denied: false,
        };
        let ms = |m: u64| Instant(m * 1_000_000);
        plane.handle_msg(Instant(0), Msg::Packets(base));
        let reply = Train {
            side: Side::Reply,
            kind: Kind::Control,
            ..base
        };
        plane.handle_msg(Instant(20_000), Msg::Packets(reply));
        // Ten packets every 5 ms from 5 ms to 300 ms: 2 kpps of 500 B, evenly spaced.
        for i in 1..=60 {
            let t = Train {
                kind: Kind::Data,
                packets: 10,
                born: ms(5 * i),
                ..base
            };
            plane.handle_msg(ms(5 * i), Msg::Packets(t));
            if (5 * i) % 100 == 0 {
                plane.handle_timeout(ms(5 * i));
            }
        }
        let seen = seen.lock().expect("not poisoned");
        // Ticks at 100, 200 and 300 ms; the flow is a candidate once it has a full measured
        // tick behind a first full one (from 200 ms).
        assert_eq!(seen.len(), 3);
        assert!(seen[0].1.is_empty());
        for (at, c) in &seen[1..] {
            assert_eq!(c.len(), 1, "at {at}");
            let c = c[0];
            assert_eq!(c.conn, ConnId(7));
            assert_eq!(c.pps(), 2000.0);
            assert_eq!(c.features.pps, c.pps());
            assert_eq!(c.features.bw_bps, 2000.0 * 500.0 * 8.0);
            assert_eq!(c.features.ctrl_ratio, 0.0);
            assert!(c.features.jitter_us < 1e-6, "{:?}", c.features);
        }
        // 2 handshake packets and 600 data packets of 1.15 us each (the open costs 2.5 us).
        assert_eq!(plane.counters().busy_ns, 2_500 + 1_150 + 600 * 1_150);
    }
}
