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
//!   (`SyncKind::Handover`; it keeps a copy), then its per-bucket digest of them
//!   (`Msg::Digest`) and `Msg::Released` on the flow vNIC behind them; a `Msg::SendBack` of a
//!   bucket whose digest the DPU found different hands that bucket's connections back again
//!   and answers `Msg::SentBack`. A connection it opens or is handed from here on goes
//!   straight back. Placement moves nothing. Each shard answers its `Msg::Drain` with
//!   `Msg::Drained` once it has received the packets the drain counts (the DPU shard's steered
//!   to this plane: the request may overtake them) and its workers, its flow vNIC and its phy
//!   vNIC toward the DPU are idle; the plane stays Releasing until the DPU stops it.
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
//! # Control and shards
//!
//! As on the DPU ([`crate::dpu`]), the plane is a control part and shards
//! ([`PlaneShard`], `shard.rs`). The control part, [`SpillPlane`], keeps what concerns the
//! plane as a whole: the lifecycle flags and colour, the workers (one budget, charged by every
//! shard per train), heartbeats, `SetWorkers`, the placement policy with the DPU's budget, and
//! the reliable delete channel. A shard keeps the records of its connections (a connection's
//! shard is its redirect bucket modulo the shard count, as on the DPU), the entries of its
//! connections on the fast path, its counters, drops and latency, and its side of a vNIC set:
//! the outbox, the phy vNIC and the PCIe link toward the DPU. A message about a connection
//! goes straight to its shard with the control part's [`PlaneView`]; the control part reaches
//! the shards only by [`PlaneRequest`]s (a placement tick's candidates, a recall, an
//! acknowledged demotion, release, drain, stop), so that a driver can run each shard on a
//! thread of its own. Its own messages leave on the first shard's channels. The plane has as
//! many shards as the DPU (`dpu.shards`): shard `k` and DPU shard `k` hold the same
//! connections, and each end marker of a lifecycle step (the acknowledgement of a bulk sync,
//! `Released`, `Drained`) names its shard, so that the DPU waits for every shard's.

mod shard;

use std::collections::BTreeMap;

use spillway_sketch::features::FlowCounters;
use spillway_vswitch::{Instant, TenantId};

pub use self::shard::{
    PlaneReply, PlaneRequest, PlaneResources, PlaneResourcesHandle, PlaneShard, PlaneShards,
    PlaneView,
};
use crate::links::ps;
use crate::params::FabricParams;
use crate::placement::{Budget, Candidate, Move, Offloaded, PlacementPolicy};
use crate::records::{Record, Records, Role};
use crate::server::Server;
use crate::stats::{Drops, LatencyHist};
use crate::types::{Channel, Colour, ConnId, ConnState, Msg, Train, Transmit};

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

impl SpillConn {
    /// A record of `state` in `role`, taken at `now`, not yet measured.
    pub(crate) fn new(state: ConnState, role: Role, now: Instant) -> SpillConn {
        SpillConn {
            state,
            role,
            recalling: false,
            counters: FlowCounters::default(),
            pps: -1.0,
            since: now,
        }
    }
}

impl Record for SpillConn {
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
        /// Recalls (with the demotion a swap pairs them with) the policy chose and the
        /// per-tenant share (`placement.tenant_recall_share`) held back.
        tenant_quota => "spill.placement.tenant_quota",
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

/// The spill plane: its control part (lifecycle, workers, heartbeats, placement, the reliable
/// delete channel) and its shards. See the module doc.
#[derive(Debug)]
pub struct SpillPlane<R: PlaneResourcesHandle = PlaneResources> {
    f: FabricParams,
    up: bool,
    res: R,
    pending_workers: Option<(Instant, u32)>,
    colour: Colour,
    active: bool,
    releasing: bool,
    next_heartbeat: Instant,
    next_tick: Instant,
    budget: Budget,
    deletes: BTreeMap<u64, PendingDelete>,
    next_seq: u64,
    policy: Box<dyn PlacementPolicy + Send>,
    moves: Vec<Move>,
    cands: Vec<Candidate>,
    offl: Vec<Offloaded>,
    closed: Vec<ConnId>,
    /// The control part's counters (deletes); the shards count the rest.
    counters: SpillCounters,
    /// The shards held here: all of them, or the first (see [`SpillPlane::with_remote`]).
    shards: Vec<PlaneShard>,
    /// The shards served elsewhere: shard `shards.len() + i` is this transport's `i`.
    remote: Option<Box<dyn PlaneShards + Send>>,
    /// The shard the last input went to.
    last: usize,
}

impl SpillPlane {
    /// A plane (not yet started) with the fabric's parameters: as many shards as the DPU
    /// has (`dpu.shards`), shard `k` at the other end of DPU shard `k`'s vNIC set.
    pub fn new(f: &FabricParams) -> SpillPlane {
        let n = f.dpu.shards.max(1) as usize;
        SpillPlane::build(f, PlaneResources::new(f, f.host.workers_initial), n, None)
    }
}

impl<R: PlaneResourcesHandle> SpillPlane<R> {
    /// A plane that holds shard 0 itself and reaches shards `1..` through `remote` (shard `i`
    /// is `remote`'s `i - 1`), all charging the resources behind `res`: the control thread of
    /// a driver that runs the plane's shards on threads, each of the others with a
    /// [`PlaneShard`] of its own. Its inputs about a connection must be of shard 0's (the
    /// driver hands the others' to their threads); the lifecycle (timers, the DPU's lifecycle
    /// messages) asks every shard.
    pub fn with_remote(
        f: &FabricParams,
        res: R,
        remote: Box<dyn PlaneShards + Send>,
    ) -> SpillPlane<R> {
        let n = 1 + remote.count();
        SpillPlane::build(f, res, n, Some(remote))
    }

    fn build(
        f: &FabricParams,
        res: R,
        n: usize,
        remote: Option<Box<dyn PlaneShards + Send>>,
    ) -> SpillPlane<R> {
        let here = if remote.is_some() { 1 } else { n };
        SpillPlane {
            up: false,
            res,
            pending_workers: None,
            colour: Colour(0),
            active: false,
            releasing: false,
            next_heartbeat: Instant::ZERO,
            next_tick: Instant::ZERO,
            budget: Budget {
                free_entries: 0,
                headroom_pps: 0.0,
                recalls_max: f.placement.recalls_per_tick_max,
            },
            deletes: BTreeMap::new(),
            next_seq: 1,
            policy: f.placement.build(),
            moves: Vec::new(),
            cands: Vec::new(),
            offl: Vec::new(),
            closed: Vec::new(),
            counters: SpillCounters::default(),
            shards: (0..here).map(|i| PlaneShard::new(f, i as u16, n)).collect(),
            remote,
            last: 0,
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
        self.res.read().workers.parallel()
    }
    /// Counters, summed over the control part and the shards held here.
    pub fn counters(&self) -> SpillCounters {
        let mut c = self.counters;
        for s in &self.shards {
            c.add(&s.counters);
        }
        c
    }
    /// Delivery (vATC), loss and latency by tenant, summed over the shards held here.
    pub fn tenant_stats(&self) -> crate::stats::TenantStats {
        let mut t = crate::stats::TenantStats::default();
        for s in &self.shards {
            t.merge(&s.tenants);
        }
        t
    }
    /// Drops by reason, summed over the shards held here.
    pub fn drops(&self) -> Drops {
        self.shards[1..]
            .iter()
            .fold(self.shards[0].drops, |d, s| d.merged(&s.drops))
    }
    /// Latency of packets the plane delivered itself (vATC), ns.
    pub fn latency(&self) -> LatencyHist {
        let mut h = self.shards[0].latency.clone();
        for s in &self.shards[1..] {
            h.merge(&s.latency);
        }
        h
    }
    /// The first connection a packet of which found no state here (and was punted back).
    pub fn first_no_state(&self) -> Option<ConnId> {
        self.shards.iter().find_map(|s| s.first_no_state)
    }
    /// The plane's record of `conn`.
    pub fn conn(&self, conn: ConnId) -> Option<&SpillConn> {
        self.shards.get(self.shard_of(conn))?.conns.get(&conn)
    }
    /// Records held.
    pub fn conns_len(&self) -> usize {
        self.shards.iter().map(|s| s.conns.len()).sum()
    }
    /// Connections owned.
    pub fn conns_owned(&self) -> u64 {
        self.shards.iter().map(|s| s.conns.owned()).sum()
    }
    /// Every record, sorted by connection.
    pub fn conns_sorted(&self) -> Vec<(ConnId, SpillConn)> {
        Records::sorted_over(self.shards.iter().map(|s| &s.conns))
    }
    /// The placement policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }
    /// Unacknowledged deletes.
    pub fn deletes_pending(&self) -> usize {
        self.deletes.len()
    }
    /// The shard that holds `conn`: its redirect bucket modulo the shard count, as on the DPU
    /// ([`crate::dpu::shard_of`]).
    pub fn shard_of(&self, conn: ConnId) -> usize {
        crate::dpu::shard_of(conn, self.f.dpu.redirect_buckets, self.total())
    }

    /// The shard a message from the DPU about a connection goes to: its connection's, except
    /// a delete's acknowledgement, which the control part's reliable channel takes.
    fn conn_shard(&self, msg: &Msg) -> Option<usize> {
        match msg {
            Msg::DeleteAck { .. } => None,
            _ => msg.conn().map(|c| self.shard_of(c)),
        }
    }

    /// Which shard's thread takes `msg` from the DPU when a driver runs the plane's shards on
    /// threads ([`SpillPlane::with_remote`]): its connection's shard's, or 0 (this plane: the
    /// control part and shard 0; the end of another shard's bulk sync too, which the control
    /// part asks that shard to acknowledge).
    pub fn thread_of_msg(&self, msg: &Msg) -> usize {
        self.conn_shard(msg).unwrap_or(0)
    }

    /// How many shards the plane has, here and elsewhere.
    fn total(&self) -> usize {
        self.shards.len() + self.remote.as_ref().map_or(0, |r| r.count())
    }

    /// Shard `i`, which must be held here.
    ///
    /// # Panics
    ///
    /// If shard `i` is served elsewhere: its thread, not this plane, takes the inputs about
    /// its connections, and a driver that gives them here has routed them wrong.
    fn here(&mut self, i: usize) -> &mut PlaneShard {
        let held = self.shards.len();
        self.last = i;
        self.shards.get_mut(i).unwrap_or_else(|| {
            panic!("an input for shard {i}, which is served elsewhere (this plane holds {held})")
        })
    }
    /// What the shards know of the lifecycle.
    pub fn view(&self) -> PlaneView {
        PlaneView {
            colour: self.colour,
            active: self.active,
            releasing: self.releasing,
            vatc: self.f.host.vatc,
        }
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// The next message for the DPU.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.shards.iter_mut().find_map(PlaneShard::poll_transmit)
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

    /// The control part's own messages leave on the first shard's channels.
    fn send(&mut self, at: Instant, channel: Channel, msg: Msg) {
        self.call(0, PlaneRequest::Send { at, channel, msg });
    }

    /// The same request to every shard, here and elsewhere.
    fn each(&mut self, req: impl Fn() -> PlaneRequest) {
        for i in 0..self.total() {
            self.call(i, req());
        }
    }

    fn call(&mut self, shard: usize, req: PlaneRequest) -> PlaneReply {
        let held = self.shards.len();
        match self.shards.get_mut(shard) {
            Some(s) => s.serve(req),
            None => self
                .remote
                .as_mut()
                .expect("a shard index below the count")
                .call(shard - held, req),
        }
    }

    // ---- inputs ----------------------------------------------------------------------------

    /// The driver started the process with `workers` workers.
    pub fn start(&mut self, now: Instant, workers: u32) {
        self.up = true;
        let mut res = self.res.write();
        res.workers = Server::new(workers.max(1), self.f.pcie.phy_vnic_ring);
        res.workers.take_util(ps(now));
        drop(res);
        self.next_heartbeat = now;
        self.next_tick = now + self.f.placement.tick;
        self.active = false;
        self.releasing = false;
        self.budget.free_entries = 0;
        self.budget.headroom_pps = 0.0;
        self.send_heartbeat(now);
    }

    /// The process was stopped (released) or killed. Everything it held is gone; returns the
    /// packets that were queued in its workers (lost if it was killed).
    pub fn stop(&mut self, now: Instant) -> u32 {
        let lost = self.res.write().fail_workers(ps(now));
        self.up = false;
        self.each(|| PlaneRequest::Stop);
        self.deletes.clear();
        self.pending_workers = None;
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
        self.shards[self.last].direct_last
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
        let i = self.shard_of(t.conn);
        let mut res = self.res.write();
        let shard = self
            .shards
            .get_mut(i)
            .expect("an input of a shard held here");
        shard.handle_direct_refused(now, t, &mut res);
    }

    fn send_heartbeat(&mut self, now: Instant) {
        let mut res = self.res.write();
        let util = res.workers.take_util(ps(now));
        let workers = res.workers.parallel();
        drop(res);
        self.send(now, Channel::Control, Msg::Heartbeat { workers, util });
        self.next_heartbeat = now + self.f.host.heartbeat;
    }

    /// A message from the DPU. One about a connection ([`Msg::conn`]) goes to its shard, the
    /// end of a bulk sync to the shard it names (the one whose vNIC set carried the states);
    /// the rest are the control part's.
    pub fn handle_msg(&mut self, now: Instant, msg: Msg) {
        // Only the shard of the last input can have sent packets the vATC way.
        self.shards[self.last].direct_last = 0;
        if !self.up {
            return;
        }
        if let Msg::Sync { colour, .. } = msg {
            self.colour = self.colour.max(colour);
        }
        let shard = match msg {
            // A shard the plane does not have: nobody waits for its acknowledgement.
            Msg::SyncDone { shard, .. }
            | Msg::DigestAsk { shard, .. }
            | Msg::Drain { shard, .. } => Some(usize::from(shard)).filter(|&s| s < self.total()),
            Msg::Resync { bucket, .. }
            | Msg::Remirror { bucket, .. }
            | Msg::SendBack { bucket, .. } => {
                Some(crate::dpu::shard_of_bucket(bucket, self.total()))
            }
            _ => self.conn_shard(&msg),
        };
        if let Some(i) = shard {
            if i >= self.shards.len() {
                let req = match msg {
                    Msg::SyncDone { colour, count, .. } => {
                        Some(PlaneRequest::AckSync { now, colour, count })
                    }
                    Msg::DigestAsk { colour, round, .. } => {
                        Some(PlaneRequest::Digest { now, colour, round })
                    }
                    Msg::Drain {
                        colour, packets, ..
                    } => Some(PlaneRequest::Drain {
                        now,
                        colour,
                        host_idle_ps: self.res.read().idle_at_ps(),
                        packets,
                    }),
                    Msg::Resync { bucket, .. } => Some(PlaneRequest::Resync { bucket }),
                    Msg::Remirror { colour, bucket } => Some(PlaneRequest::Remirror {
                        now,
                        colour,
                        bucket,
                    }),
                    Msg::SendBack { colour, bucket } => Some(PlaneRequest::SendBack {
                        now,
                        colour,
                        bucket,
                    }),
                    _ => None,
                };
                if let Some(req) = req {
                    self.call(i, req);
                    return;
                }
            }
            let view = self.view();
            self.here(i);
            let mut res = self.res.write();
            self.shards[i].handle_msg(now, msg, &view, &mut res);
            return;
        }
        match msg {
            Msg::Activated { colour } => {
                self.colour = colour;
                self.active = true;
            }
            Msg::DeleteAck { seq, state } => {
                let Some(d) = self.deletes.remove(&seq) else {
                    return; // a duplicate ack of a retransmission
                };
                self.counters.deletes_acked += 1;
                let conn = d.conn;
                let demoted = self.shard_of(conn);
                self.call(demoted, PlaneRequest::Demoted { now, conn, state });
                if let Some((conn, pps, replaces_pps)) = d.then_recall {
                    // A swap: the recall follows the adoption on the same (FIFO) channel, the
                    // demoted connection's shard's, whichever shard holds the recalled one,
                    // so the DPU has freed the demoted entries when it reads the recall.
                    let req = PlaneRequest::SwapRecall {
                        conn,
                        pps,
                        replaces_pps,
                    };
                    if let PlaneReply::Msg(Some(msg)) = self.call(self.shard_of(conn), req) {
                        let channel = Channel::Control;
                        self.call(
                            demoted,
                            PlaneRequest::Send {
                                at: now,
                                channel,
                                msg,
                            },
                        );
                    }
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
                let sync_colour = self.colour;
                self.each(|| PlaneRequest::Release {
                    now,
                    colour,
                    sync_colour,
                });
            }
            Msg::SetWorkers { workers } => {
                self.pending_workers = Some((now + self.f.host.worker_start, workers));
            }
            // Messages about a connection went to its shard; plane-to-DPU messages never
            // arrive here.
            Msg::Packets(_)
            | Msg::Sync { .. }
            | Msg::SyncDone { .. }
            | Msg::RecallDone { .. }
            | Msg::OffloadStats { .. }
            | Msg::Recall { .. }
            | Msg::Punt(_)
            | Msg::Delete { .. }
            | Msg::Released { .. }
            | Msg::Heartbeat { .. }
            | Msg::Drained { .. }
            | Msg::Adopted { .. }
            | Msg::Absorbing
            | Msg::Drain { .. }
            | Msg::DigestAsk { .. }
            | Msg::Digest { .. }
            | Msg::DigestDone { .. }
            | Msg::Resync { .. }
            | Msg::Remirror { .. }
            | Msg::SendBack { .. }
            | Msg::SentBack { .. } => {}
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
            self.res.write().workers.set_parallel(w.max(1));
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

    /// Every shard turns its flows' counters into features and names its candidates, its
    /// entries on the fast path and the connections it closed; the policy forgets the closed
    /// ones and chooses over all of them within the one budget; each move goes to its
    /// connection's shard (recalls) or onto the reliable channel (demotions).
    fn placement_tick(&mut self, now: Instant) {
        self.cands.clear();
        self.offl.clear();
        self.closed.clear();
        for i in 0..self.total() {
            let req = PlaneRequest::Tick {
                now,
                cands: core::mem::take(&mut self.cands),
                offl: core::mem::take(&mut self.offl),
                closed: core::mem::take(&mut self.closed),
            };
            match self.call(i, req) {
                PlaneReply::Tick {
                    cands,
                    offl,
                    closed,
                } => (self.cands, self.offl, self.closed) = (cands, offl, closed),
                r => unreachable!("a tick answered with {r:?}"),
            }
        }
        for &conn in &self.closed {
            self.policy.closed(conn);
        }
        if !self.active || self.releasing {
            return;
        }
        // The policy takes both lists in connection order, whatever shard each entry came from.
        self.cands.sort_unstable_by_key(|c| c.conn);
        self.offl.sort_unstable_by_key(|o| o.conn);
        self.moves.clear();
        let mut moves = core::mem::take(&mut self.moves);
        self.policy
            .tick(now, &self.cands, &self.offl, self.budget, &mut moves);
        if self.f.placement.tenant_recall_share < 1.0 {
            self.counters.tenant_quota += hold_to_tenant_share(
                self.f.placement.tenant_recall_share,
                &self.cands,
                &self.offl,
                self.budget,
                &mut moves,
            );
        }
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
                } => {
                    let req = PlaneRequest::Recall {
                        now,
                        conn,
                        pps,
                        replaces_pps,
                    };
                    self.call(self.shard_of(conn), req);
                }
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
        for s in &self.shards {
            s.check_invariants()?;
        }
        self.res.read().workers.check_invariants()
    }
}

/// Drops from `moves` the recalls that would take a tenant past `share` of the plane's recall
/// room: the connections already recalled (`offl`) plus those the free entries take, and the
/// recalled rate plus the fast-path headroom. A swap's demotion goes with its recall, and frees
/// its tenant's place first. Returns how many recalls were held back. `cands` and `offl` are
/// sorted by connection.
fn hold_to_tenant_share(
    share: f64,
    cands: &[Candidate],
    offl: &[Offloaded],
    budget: Budget,
    moves: &mut Vec<Move>,
) -> u64 {
    use std::collections::BTreeMap;
    let room_conns = offl.len() as f64 + (budget.free_entries / 2) as f64;
    let room_pps = offl.iter().map(|o| o.pps.max(0.0)).sum::<f64>() + budget.headroom_pps;
    // At least one connection per tenant, so a share below one connection still lets a
    // tenant's flows come back.
    let cap_conns = (share * room_conns).floor().max(1.0);
    let cap_pps = share * room_pps;
    let mut held: BTreeMap<TenantId, (f64, f64)> = BTreeMap::new();
    for o in offl {
        let e = held.entry(o.tenant).or_default();
        e.0 += 1.0;
        e.1 += o.pps.max(0.0);
    }
    let tenant_of = |conn: ConnId| {
        cands
            .binary_search_by_key(&conn, |c| c.conn)
            .ok()
            .map(|i| cands[i].tenant)
    };
    let offloaded = |conn: ConnId| {
        offl.binary_search_by_key(&conn, |o| o.conn)
            .ok()
            .map(|i| offl[i])
    };
    let mut kept = Vec::with_capacity(moves.len());
    let mut refused = 0;
    let mut i = 0;
    while i < moves.len() {
        let (demote, recall) = match moves[i] {
            Move::Demote { conn } => match moves.get(i + 1) {
                Some(r @ Move::Recall { .. }) => {
                    i += 1;
                    (Some(conn), *r)
                }
                _ => {
                    kept.push(moves[i]);
                    i += 1;
                    continue;
                }
            },
            r => (None, r),
        };
        i += 1;
        let Move::Recall { conn, pps, .. } = recall else {
            unreachable!("paired above")
        };
        let Some(tenant) = tenant_of(conn) else {
            // Not a candidate of this tick: the policy's business, left as it is.
            kept.extend(demote.map(|conn| Move::Demote { conn }));
            kept.push(recall);
            continue;
        };
        // The demoted flow's place goes back to its tenant first.
        let freed = demote.and_then(offloaded);
        if let Some(o) = freed {
            let e = held.entry(o.tenant).or_default();
            e.0 -= 1.0;
            e.1 -= o.pps.max(0.0);
        }
        let e = held.entry(tenant).or_default();
        if e.0 + 1.0 <= cap_conns && e.1 + pps.max(0.0) <= cap_pps {
            e.0 += 1.0;
            e.1 += pps.max(0.0);
            kept.extend(demote.map(|conn| Move::Demote { conn }));
            kept.push(recall);
        } else {
            refused += 1;
            if let Some(o) = freed {
                let e = held.entry(o.tenant).or_default();
                e.0 += 1.0;
                e.1 += o.pps.max(0.0);
            }
        }
    }
    *moves = kept;
    refused
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use spillway_vswitch::TenantId;

    use super::*;

    /// The per-tenant share: a tenant's recalls stop at its share of the room (connections
    /// and rate), another tenant's go on, and a swap's demotion goes with its refused recall.
    #[test]
    fn recalls_past_a_tenants_share_are_held_back_with_their_swap() {
        use crate::placement::{Budget, Candidate, Move, Offloaded};
        use spillway_sketch::features::FeatureTick;
        let cand = |id: u64, tenant: u32| Candidate {
            conn: ConnId(id),
            tenant: TenantId(tenant),
            since: Instant(0),
            features: FeatureTick {
                pps: 100.0,
                ..FeatureTick::default()
            },
        };
        let recall = |id: u64| Move::Recall {
            conn: ConnId(id),
            pps: 100.0,
            replaces_pps: 0.0,
        };
        // Tenant 1 already holds 2 recalled connections; the room is 2 + 8 free = 10.
        let offl = [
            Offloaded {
                conn: ConnId(1),
                tenant: TenantId(1),
                pps: 100.0,
            },
            Offloaded {
                conn: ConnId(2),
                tenant: TenantId(1),
                pps: 100.0,
            },
        ];
        let cands: Vec<Candidate> = (10..20)
            .map(|i| cand(i, if i < 16 { 1 } else { 2 }))
            .collect();
        let budget = Budget {
            free_entries: 16,
            headroom_pps: 1e9,
            recalls_max: 100,
        };
        let mut moves: Vec<Move> = (10..20).map(recall).collect();
        // Share 0.3: 3 connections a tenant. Tenant 1 gets one more, tenant 2 three.
        let held = hold_to_tenant_share(0.3, &cands, &offl, budget, &mut moves);
        assert_eq!(moves, vec![recall(10), recall(16), recall(17), recall(18)]);
        assert_eq!(held, 6);
        // A swap for tenant 1 that frees one of its own places goes through; the same swap
        // when tenant 1 is over its share without it is refused whole.
        let mut moves = vec![Move::Demote { conn: ConnId(1) }, recall(11)];
        assert_eq!(
            hold_to_tenant_share(0.2, &cands, &offl, budget, &mut moves),
            0
        );
        assert_eq!(moves.len(), 2);
        let mut moves = vec![recall(11)];
        assert_eq!(
            hold_to_tenant_share(0.2, &cands, &offl, budget, &mut moves),
            1
        );
        assert!(moves.is_empty());
        // Rate: one tenant's recalled rate held to its share of recalled rate + headroom.
        let tight = Budget {
            headroom_pps: 200.0,
            ..budget
        };
        let mut moves = vec![recall(16), recall(17), recall(18)];
        // Room 200 + 200 pps, share 0.5: tenant 2 may take 200 pps, two flows.
        assert_eq!(
            hold_to_tenant_share(0.5, &cands, &offl, tight, &mut moves),
            1
        );
        assert_eq!(moves, vec![recall(16), recall(17)]);
    }
    use crate::params::ns;
    use crate::types::{Dest, Kind, Side};

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

    /// The state of `conn` as the DPU hands it over when it opened at 0.
    fn opened(conn: ConnId) -> ConnState {
        let t = Train {
            conn,
            tenant: TenantId(1),
            side: Side::Orig,
            dest: Dest::Wire,
            kind: Kind::Open,
            packets: 1,
            packet_bytes: 64,
            born: Instant(0),
            denied: false,
        };
        ConnState::open(Instant(0), &t)
    }

    /// A plane of two shards: connections go to the shard of their bucket, a release hands
    /// each shard's owned connections back and ends with a `Released` per shard naming it and
    /// its count, a drain with a `Drained` per shard, and a bulk sync's acknowledgement goes
    /// back from the shard it names.
    #[test]
    fn a_plane_of_two_shards_ends_each_step_with_a_marker_per_shard() {
        let mut f = FabricParams::default();
        f.dpu.shards = 2;
        let mut plane = SpillPlane::new(&f);
        plane.start(Instant(0), 2);
        let colour = Colour(1);
        plane.handle_msg(Instant(0), Msg::Activated { colour });
        // Handed over from the DPU: enough connections that both shards hold some.
        let conns: Vec<ConnId> = (1..=16).map(ConnId).collect();
        for &conn in &conns {
            let state = opened(conn);
            let kind = crate::types::SyncKind::Handover;
            plane.handle_msg(
                Instant(0),
                Msg::Sync {
                    colour,
                    kind,
                    state,
                },
            );
        }
        let per_shard =
            |p: &SpillPlane, i: usize| conns.iter().filter(|&&c| p.shard_of(c) == i).count() as u64;
        let (n0, n1) = (per_shard(&plane, 0), per_shard(&plane, 1));
        assert!(n0 > 0 && n1 > 0, "{n0} + {n1}");
        assert_eq!(plane.conns_owned(), 16);
        while plane.poll_transmit().is_some() {}

        let ack = |shard| Msg::SyncDone {
            colour,
            count: 3,
            shard,
        };
        plane.handle_msg(Instant(1), ack(1));
        plane.handle_msg(Instant(1), ack(9)); // a shard the plane does not have
        let acks: Vec<Msg> = std::iter::from_fn(|| plane.poll_transmit())
            .map(|t| t.msg)
            .collect();
        assert_eq!(acks, [ack(1)]);

        plane.handle_msg(Instant(2), Msg::Release { colour });
        let mut released = Vec::new();
        let mut handovers = 0;
        while let Some(t) = plane.poll_transmit() {
            match t.msg {
                Msg::Released { count, shard, .. } => released.push((shard, count)),
                Msg::Sync { .. } => handovers += 1,
                _ => {}
            }
        }
        released.sort_unstable();
        assert_eq!(released, [(0, n0), (1, n1)]);
        assert_eq!(handovers, 16);
        assert_eq!(plane.conns_owned(), 0);

        for shard in [0, 1] {
            let drain = Msg::Drain {
                colour,
                shard,
                packets: 0,
            };
            plane.handle_msg(Instant(3), drain);
        }
        let mut drained: Vec<u16> = std::iter::from_fn(|| plane.poll_transmit())
            .filter_map(|t| match t.msg {
                Msg::Drained { shard, .. } => Some(shard),
                _ => None,
            })
            .collect();
        drained.sort_unstable();
        assert_eq!(drained, [0, 1]);
    }

    #[test]
    fn a_drain_waits_for_the_packets_steered_before_it_and_hands_back_what_they_open() {
        let mut plane = SpillPlane::new(&FabricParams::default());
        plane.start(Instant(0), 1);
        let colour = Colour(1);
        plane.handle_msg(Instant(0), Msg::Activated { colour });
        plane.handle_msg(Instant(1), Msg::Release { colour });
        while plane.poll_transmit().is_some() {}
        // The drain request overtook one steered packet, a new connection's first.
        let drain = Msg::Drain {
            colour,
            shard: 0,
            packets: 1,
        };
        plane.handle_msg(Instant(2), drain);
        let early: Vec<Msg> = std::iter::from_fn(|| plane.poll_transmit())
            .map(|t| t.msg)
            .collect();
        assert!(
            !early.iter().any(|m| matches!(m, Msg::Drained { .. })),
            "{early:?}"
        );
        let open = Train {
            conn: ConnId(77),
            tenant: spillway_vswitch::TenantId(1),
            side: crate::types::Side::Orig,
            dest: crate::types::Dest::Wire,
            kind: crate::types::Kind::Open,
            packets: 1,
            packet_bytes: 64,
            born: Instant(1),
            denied: false,
        };
        plane.handle_msg(Instant(3), Msg::Packets(open));
        let out: Vec<Transmit> = std::iter::from_fn(|| plane.poll_transmit()).collect();
        let handback = out
            .iter()
            .position(|t| {
                matches!(t.msg, Msg::Sync { kind: crate::types::SyncKind::Handover, state, .. } if state.conn == ConnId(77))
            })
            .expect("the releasing plane hands the new connection back");
        let drained = out
            .iter()
            .position(|t| matches!(t.msg, Msg::Drained { shard: 0, .. }))
            .expect("answered once the packet is in");
        assert!(handback < drained, "{out:?}");
        assert_eq!(out[drained].channel, Channel::FlowVnic);
        assert!(out[drained].at >= out[handback].at);
    }

    /// Demotes `a` and recalls `b` in its place at its first tick.
    #[derive(Debug)]
    struct Swapper {
        a: ConnId,
        b: ConnId,
        done: bool,
    }

    impl PlacementPolicy for Swapper {
        fn name(&self) -> &'static str {
            "swapper"
        }
        fn tick(
            &mut self,
            _: Instant,
            _: &[Candidate],
            _: &[Offloaded],
            _: Budget,
            out: &mut Vec<Move>,
        ) {
            if !std::mem::replace(&mut self.done, true) {
                out.push(Move::Demote { conn: self.a });
                out.push(Move::Recall {
                    conn: self.b,
                    pps: 1000.0,
                    replaces_pps: 10.0,
                });
            }
        }
    }

    /// A swap whose two connections are on different shards: the recall still follows the
    /// adoption of the demoted connection on one control channel (the demoted one's shard's),
    /// so the DPU has freed the demoted entries when it reads the recall.
    #[test]
    fn a_swap_across_shards_sends_the_recall_behind_the_adoption() {
        let mut f = FabricParams::default();
        f.dpu.shards = 2;
        let mut plane = SpillPlane::new(&f);
        let on = |plane: &SpillPlane, shard| {
            (1..)
                .map(ConnId)
                .find(|&c| plane.shard_of(c) == shard)
                .expect("a connection of the shard")
        };
        // The demoted connection on the shard polled last, the recalled one on the first, so
        // that a recall sent from its own shard would leave first.
        let (a, b) = (on(&plane, 1), on(&plane, 0));
        plane.policy = Box::new(Swapper { a, b, done: false });
        plane.start(Instant(0), 2);
        let colour = Colour(1);
        plane.handle_msg(Instant(0), Msg::Activated { colour });
        let kind = crate::types::SyncKind::Handover;
        for conn in [a, b] {
            let state = opened(conn);
            plane.handle_msg(
                Instant(0),
                Msg::Sync {
                    colour,
                    kind,
                    state,
                },
            );
        }
        while plane.poll_transmit().is_some() {}
        let tick = Instant(ns(f.placement.tick));
        plane.handle_timeout(tick);
        let seq = std::iter::from_fn(|| plane.poll_transmit())
            .find_map(|t| match t.msg {
                Msg::Delete { seq, conn } if conn == a => Some(seq),
                _ => None,
            })
            .expect("a's demotion");
        let ack = Msg::DeleteAck {
            seq,
            state: Some(opened(a)),
        };
        plane.handle_msg(tick, ack);
        let out: Vec<Transmit> = std::iter::from_fn(|| plane.poll_transmit()).collect();
        let at = |want: &dyn Fn(&Msg) -> bool| {
            out.iter()
                .position(|t| want(&t.msg) && t.channel == Channel::Control)
                .unwrap_or_else(|| panic!("not on the control channel: {out:?}"))
        };
        let adopted = at(&|m| matches!(m, Msg::Adopted { conn } if *conn == a));
        let recall = at(&|m| matches!(m, Msg::Recall { state, .. } if state.conn == b));
        assert!(adopted < recall, "the recall left first: {out:?}");
        assert_eq!(plane.conn(b).map(|c| c.role), Some(Role::Copy));
        assert_eq!(plane.counters().recalls_sent, 1);
    }
}
