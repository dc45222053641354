//! The DPU's side of the sync protocol: the plane's messages (state sync, recalls, deletes on
//! the reliable channel, adoptions, lifecycle replies, heartbeats), the hardware's insert
//! completions that finish a recall, and the stats and budget the DPU reports back.

use spillway_vswitch::Instant;
use spillway_vswitch::flow_table::Inserted;

use super::control::{Comparison, DpuControl, Markers, ShardRequest, Shards};
use super::inserts::PendingInsert;
use super::lifecycle::{DrainStep, EventKind, FabricEvent, Phase, Warm};
use super::resources::SocWork;
use super::shard::{DpuShard, ShardView};
use super::{DpuConn, DpuNode, RecallHistory, ResourcesHandle, Role};
use crate::hw::{HwKey, HwRule};
use crate::types::{Channel, Colour, ConnId, ConnState, Msg, PlaneSlot, Side, SyncKind};

impl<R: ResourcesHandle> DpuNode<R> {
    /// A message from the spill plane: one about a connection ([`Msg::conn`]) goes to the
    /// connection's shard, a lifecycle reply to the control part.
    pub fn handle_msg(&mut self, now: Instant, msg: Msg) {
        let view = self.control.view();
        match msg.conn() {
            Some(conn) => self.shard_for(conn).handle_msg(now, msg, view),
            None => {
                // It delivered nothing (see `delivered_last`).
                self.shards[self.last].delivered_last = 0;
                self.control.handle_msg(
                    now,
                    msg,
                    &mut super::all(&mut self.shards, &mut self.remote),
                );
            }
        }
    }
}

impl<R: ResourcesHandle> DpuNode<R> {
    /// A message from the plane now running in `slot` (the driver knows which process sent
    /// it): the active plane's go to [`DpuNode::handle_msg`], the warm plane's to its own
    /// lifecycle (heartbeats, the acknowledgement of its bulk sync, digests; it sends nothing
    /// about a connection while warm), and anything from a slot with no plane of the DPU's is
    /// fenced. A message about a connection is taken by its shard as [`DpuShard::handle_msg_as`]
    /// says, the rule a driver with a thread per shard applies there too.
    pub fn handle_msg_from(&mut self, now: Instant, slot: PlaneSlot, msg: Msg) {
        if let Some(conn) = msg.conn() {
            let view = self.control.view();
            let shard = self.shard_for(conn);
            shard.handle_msg_as(now, shard.sender(slot), msg, view);
            return;
        }
        let sender = self.sender(slot);
        match sender {
            Sender::Active => self.handle_msg(now, msg),
            Sender::Warm => {
                self.shards[self.last].delivered_last = 0;
                self.control.handle_warm_msg(
                    now,
                    msg,
                    &mut super::all(&mut self.shards, &mut self.remote),
                );
            }
            Sender::Fenced => self.handle_fenced_msg(now, msg),
        }
    }

    /// What the plane in `slot` is to the DPU now, which decides how its messages are taken
    /// ([`DpuNode::handle_msg_from`]).
    pub fn sender(&self, slot: PlaneSlot) -> Sender {
        Sender::of(
            slot,
            self.control.active_slot(),
            self.control.warm() != Warm::Off,
        )
    }

    /// A message from a plane the DPU has stopped (a failed plane's, still in flight, or a
    /// stalled plane's after it resumed): see [`DpuShard::handle_fenced_msg`]. One that names
    /// no connection (a heartbeat, a lifecycle reply) is dropped and counted.
    pub fn handle_fenced_msg(&mut self, now: Instant, msg: Msg) {
        let view = self.control.view();
        match msg.conn() {
            Some(conn) => self.shard_for(conn).handle_fenced_msg(now, msg, view),
            None => {
                let s = &mut self.shards[self.last];
                s.delivered_last = 0;
                s.counters.fenced += 1;
            }
        }
    }
}

/// What a plane slot's sender is to the DPU ([`DpuNode::sender`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sender {
    /// The active plane: the redirect rules steer to it.
    Active,
    /// The warm standby plane (starting, syncing, ready or being flipped to).
    Warm,
    /// No plane of the DPU's: a failed or stopped plane whose messages are still in flight, or
    /// a stalled one that resumed. Its packets are served; its state is taken as an orphan's.
    Fenced,
}

impl Sender {
    /// What the plane in `slot` is when the redirect rules steer to `active` and a warm
    /// standby plane is (`warm_on`) or is not kept: the one rule behind
    /// [`DpuNode::sender`] and a shard's own ([`DpuShard::sender`]).
    pub fn of(slot: PlaneSlot, active: PlaneSlot, warm_on: bool) -> Sender {
        if slot == active {
            Sender::Active
        } else if warm_on {
            Sender::Warm
        } else {
            Sender::Fenced
        }
    }
}

impl DpuControl {
    /// A message from the warm standby plane: its heartbeats and the acknowledgement of its
    /// bulk sync. A warm plane sends nothing else; anything else is ignored.
    pub fn handle_warm_msg(&mut self, now: Instant, msg: Msg, sh: &mut dyn Shards) {
        if matches!(msg, Msg::Digest { .. } | Msg::DigestDone { .. }) {
            self.handle_digest(now, msg, sh);
            return;
        }
        match (msg, self.life.warm) {
            (Msg::Heartbeat { .. }, Warm::Starting { colour }) => self.warm_up(now, colour, sh),
            (Msg::Heartbeat { .. }, _) => self.life.warm_heartbeat = now,
            (
                Msg::SyncDone {
                    colour,
                    count,
                    shard,
                },
                Warm::Syncing { colour: c },
            ) if c == colour => {
                if let Some(count) = self.warm_markers.take(shard, count) {
                    self.life.warm = Warm::Ready { colour };
                    self.ask_warm_digests(now, sh);
                    self.try_upgrade(now, sh);
                    self.event(
                        now,
                        EventKind::Warm,
                        format!(
                            "warm plane in {} synced: {count} connections (colour {})",
                            self.life.active.other(),
                            colour.0
                        ),
                    );
                }
            }
            _ => {}
        }
    }

    /// Compares the connection state the DPU holds with the warm plane's copies (see
    /// [`DpuControl::ask_digests`]). Nothing if a comparison is under way or no warm plane is
    /// ready.
    pub(super) fn ask_warm_digests(&mut self, now: Instant, sh: &mut dyn Shards) {
        let Warm::Ready { colour } = self.life.warm else {
            return;
        };
        if self.ask_digests(now, (true, false), colour, sh) {
            self.next_digest = now + self.f.host.digest_interval;
        }
    }

    /// Compares the connection state the DPU holds with the copies of the plane of `colour`,
    /// the warm one (`warm`) or the active slot's before its activation: every shard digests
    /// its buckets and asks (see [`Msg::DigestAsk`]); the answers come to
    /// [`DpuControl::handle_digest`]. False (nothing asked) if that comparison is under way.
    /// The plane digests what it holds when the ask reaches it, behind every state message the
    /// DPU sent before; a plane that owns nothing holds exactly that. So the comparison is
    /// exact for the warm plane, and for the active slot's only while its redirect rules are
    /// not live: an answer that comes later is dropped (`dpu.digest.stale`).
    ///
    /// After a flip (`at_answer`) the active plane owns connections and changes them while the
    /// digests travel: each shard then digests when the answer is in, leaving out the buckets
    /// it sent a state message about meanwhile (`dpu.digest.skipped`), and resyncs a bucket
    /// that differs in both directions (see `DpuShard::resync_owned`).
    pub(super) fn ask_digests(
        &mut self,
        now: Instant,
        (warm, at_answer): (bool, bool),
        colour: Colour,
        sh: &mut dyn Shards,
    ) -> bool {
        let run = &mut self.digests[usize::from(warm)];
        if run.as_ref().is_some_and(|d| d.colour == colour) {
            return false;
        }
        self.digest_round = self.digest_round.checked_add(1).unwrap_or(1);
        let round = self.digest_round;
        sh.digest_ask(now, (warm, at_answer), (colour, round));
        let mut m = Markers::default();
        m.await_all(sh.count());
        *run = Some(Comparison {
            colour,
            round,
            markers: m,
            differ: Vec::new(),
            at_answer,
        });
        true
    }

    /// A plane's digests: each bucket's to its shard, and at a shard's end marker that shard's
    /// comparison. A bucket that differs is resynced by the shard and reported here, once every
    /// shard has answered, with its number.
    fn handle_digest(&mut self, now: Instant, msg: Msg, sh: &mut dyn Shards) {
        let (Msg::Digest { colour, round, .. } | Msg::DigestDone { colour, round, .. }) = msg
        else {
            return;
        };
        let current = |d: &Comparison| d.colour == colour && d.round == round;
        // A bucket's digest goes to its shard: for a comparison under way, or for a releasing
        // plane's sync-back (round 0, compared at that shard's `Released`). An answer to an
        // earlier comparison (a warm plane's, still on its way at the flip that made it the
        // active one, has its colour) is not this one's.
        if let Msg::Digest {
            bucket,
            count,
            digest,
            ..
        } = msg
        {
            let awaited = if round == 0 {
                self.sync_back
                    .as_ref()
                    .is_some_and(|sb| sb.colour == colour)
            } else {
                self.digests.iter().flatten().any(current)
            };
            if awaited {
                let req = ShardRequest::DigestPart {
                    colour,
                    round,
                    bucket,
                    count,
                    digest,
                };
                sh.call(super::shard_of_bucket(bucket, sh.count()), req);
            }
            return;
        }
        let Msg::DigestDone { shard, .. } = msg else {
            return;
        };
        let Some(i) = (0..2).find(|&i| self.digests[i].as_ref().is_some_and(current)) else {
            return;
        };
        let at_answer = self.digests[i].as_ref().is_some_and(|d| d.at_answer);
        let stale = i == 0
            && !at_answer
            && !matches!(
                self.life.phase,
                Phase::Shadow { colour: c, .. } | Phase::Activating { colour: c, .. }
                    if c == colour
            );
        let found = sh.digest_compare(usize::from(shard), now, (colour, round), stale);
        let run = self.digests[i].as_mut().expect("found above");
        run.differ.extend(found);
        if run.markers.take(shard, 0).is_some() {
            let mut differ = self.digests[i].take().expect("found above").differ;
            if !differ.is_empty() {
                differ.sort_unstable();
                let (kind, whose) = match (i, at_answer) {
                    (1, _) => (EventKind::Warm, "the warm plane's"),
                    (_, true) => (EventKind::FailOver, "the new plane's (after the flip)"),
                    _ => (EventKind::Synced, "the plane's (before its activation)"),
                };
                self.event(
                    now,
                    kind,
                    format!(
                        "{whose} digests differed in {} buckets ({differ:?}); resynced",
                        differ.len()
                    ),
                );
            }
        }
    }

    /// A lifecycle reply from the plane (a message [`Msg::conn`] names no connection of).
    pub fn handle_msg(&mut self, now: Instant, msg: Msg, sh: &mut dyn Shards) {
        match msg {
            Msg::SyncDone {
                colour,
                count,
                shard,
            } => {
                // Every shard sends its own end marker: synced when all are acknowledged.
                if let Phase::Shadow {
                    colour: c,
                    synced: false,
                } = self.life.phase
                    && c == colour
                    && let Some(count) = self.take_marker(shard, count)
                {
                    self.life.phase = Phase::Shadow {
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
                    // Verified before the plane owns anything: its copies against the DPU's.
                    self.ask_digests(now, (false, false), colour, sh);
                    self.enforce_hold(now, sh);
                }
            }
            Msg::Released {
                colour,
                count,
                shard,
            } => {
                // Every shard of the plane hands its connections back, then its digest of
                // them, then says so: compare at once, then wait for every shard.
                if let Phase::Draining {
                    colour: c,
                    step: DrainStep::HandBack,
                } = self.life.phase
                    && c == colour
                    && self.markers.awaits(shard)
                {
                    let differ = sh.sync_back_compare(usize::from(shard), now, colour);
                    let total = self.take_marker(shard, count);
                    if let Some(sb) = self.sync_back.as_mut().filter(|sb| sb.colour == colour) {
                        sb.pending += differ.len();
                        sb.differ.extend(differ);
                        sb.handed = total;
                        if total.is_some() && sb.pending > 0 {
                            self.life.drain_deadline = Some(now + self.f.dpu.drain_timeout);
                        }
                    }
                    self.hand_back_done(now, sh);
                }
            }
            Msg::SentBack {
                colour,
                bucket,
                count,
            } => {
                if let Some(sb) = self.sync_back.as_mut().filter(|sb| sb.colour == colour)
                    && sb.pending > 0
                    && sb.differ.contains(&bucket)
                {
                    sb.pending -= 1;
                    sb.sent += u64::from(count);
                    self.hand_back_done(now, sh);
                }
            }
            Msg::Heartbeat { workers, util } => {
                self.life.last_heartbeat = now;
                self.life.plane_workers = workers;
                self.life.plane_util = util;
                if let Phase::Preparing { colour } = self.life.phase {
                    self.enter_shadow(now, colour, sh);
                }
            }
            Msg::Absorbing => {
                if !self.life.absorbed {
                    self.life.absorbed = true;
                    let since = self.life.trigger.take();
                    let reason = match since {
                        Some(t) => format!(
                            "first redirected packet served by the plane, {:.1} ms after the trigger",
                            (now - t).as_secs_f64() * 1e3
                        ),
                        None => "first redirected packet served by the plane".to_string(),
                    };
                    self.life.events.push_back(FabricEvent {
                        at: now,
                        what: EventKind::Absorbing,
                        reason,
                        since,
                    });
                }
            }
            Msg::Drained { colour, shard } => {
                if let Phase::Draining {
                    colour: c,
                    step: DrainStep::Drain,
                } = self.life.phase
                    && c == colour
                    && self.take_marker(shard, 0).is_some()
                {
                    self.go_idle(now, "plane drained; host cores released".into(), false, sh);
                }
            }
            // Messages about a connection go to its shard; DPU-to-plane messages never come
            // back this way.
            Msg::Packets(_)
            | Msg::Punt(_)
            | Msg::Sync { .. }
            | Msg::Recall { .. }
            | Msg::Adopted { .. }
            | Msg::Delete { .. }
            | Msg::RecallDone { .. }
            | Msg::DeleteAck { .. }
            | Msg::Release { .. }
            | Msg::SetWorkers { .. }
            | Msg::Activated { .. }
            | Msg::OffloadStats { .. }
            | Msg::Budget { .. }
            | Msg::Drain { .. } => {}
            // The active slot's plane answers the digests it was asked for before its
            // activation; the DPU sends the rest.
            Msg::Digest { .. } | Msg::DigestDone { .. } => self.handle_digest(now, msg, sh),
            Msg::DigestAsk { .. }
            | Msg::Resync { .. }
            | Msg::Remirror { .. }
            | Msg::SendBack { .. } => {}
        }
    }
}

impl<R: ResourcesHandle> DpuShard<R> {
    /// A message from the plane about one of this shard's connections.
    pub fn handle_msg(&mut self, now: Instant, msg: Msg, view: ShardView) {
        self.delivered_last = 0;
        match msg {
            Msg::Packets(t) => self.handle_returned(now, &t),
            Msg::Punt(t) => {
                // The plane had no state for it: the slow path serves it as the owner. It
                // crossed the link back.
                self.counters.pcie_crossings += u64::from(t.packets);
                self.counters.punted_in += u64::from(t.packets);
                self.slow_path(now, &t, true, view);
            }
            Msg::Sync {
                kind,
                state,
                colour,
            } => {
                self.counters.sync_rx += 1;
                self.res.write().soc(now, SocWork::Sync, 1);
                // A message of an older colour comes from a plane that has since failed or
                // been released: nobody but the DPU can own what it carries.
                let orphan = !view.phase.has_plane() || colour < view.colour;
                self.ingest_sync(now, kind, state, orphan, view);
                if kind == SyncKind::Handover && !orphan {
                    self.note_handed_back(state.conn);
                }
            }
            Msg::Recall {
                state,
                pps,
                replaces_pps,
            } => self.handle_recall(now, state, pps, replaces_pps),
            // The plane has the state now: its packets may miss the fast path.
            Msg::Adopted { conn }
                if self.conns.get(&conn).is_some_and(|c| c.role == Role::Copy) =>
            {
                self.strip_entries(now, conn);
            }
            Msg::Delete { seq, conn } => self.handle_delete(now, seq, conn),
            // Lifecycle replies are the control part's; DPU-to-plane messages never come back.
            _ => {}
        }
    }

    /// A message about one of this shard's connections from a plane that is `sender` to the
    /// DPU: the active plane's is taken ([`DpuShard::handle_msg`]), a fenced one's as
    /// [`DpuShard::handle_fenced_msg`] says; a warm plane owns nothing and sends nothing about
    /// a connection, so one from it is dropped and counted (`dpu.fenced`). So is a message
    /// that names no connection: it is the control part's (a lifecycle reply, a digest), and a
    /// driver that gave it to a shard misrouted it.
    pub fn handle_msg_as(&mut self, now: Instant, sender: Sender, msg: Msg, view: ShardView) {
        match (sender, msg.conn()) {
            (Sender::Active, Some(_)) => self.handle_msg(now, msg, view),
            (Sender::Fenced, Some(_)) => self.handle_fenced_msg(now, msg, view),
            (Sender::Warm, _) | (_, None) => {
                self.delivered_last = 0;
                self.counters.fenced += 1;
            }
        }
    }

    /// The slot whose plane this shard's redirect rules steer to and whose plane its
    /// [`DpuShard::poll_transmit`] is for; the other's is [`DpuShard::poll_warm_transmit`]'s.
    /// It changes at a flip ([`ShardRequest::Flip`]), with the outboxes, so a driver with a
    /// thread per shard pairs each outbox with its slot's lane from here, never from a view
    /// that may be a turn late.
    pub fn active_slot(&self) -> PlaneSlot {
        self.active
    }

    /// What the plane in `slot` is to this shard now ([`Sender::of`], with the shard's own
    /// active slot and whether it relays to a warm plane): both change with the control
    /// part's requests (`WarmSync`, `WarmOff`, `Flip`), in step with its lifecycle, never a
    /// turn late as a published view can be. Read from a view, the old plane of an upgrade
    /// was still "warm" on a forwarding thread for a turn after the flip, and its last
    /// packets were dropped instead of served as a fenced plane's.
    pub fn sender(&self, slot: PlaneSlot) -> Sender {
        Sender::of(slot, self.active, self.warm.is_some())
    }

    /// A message about one of this shard's connections from a plane that has been fenced
    /// (the failed plane of a slot the DPU flipped away from, still in flight, or sent by a
    /// stalled plane that resumed). Its packets are real and are served. Its state is an
    /// orphan's (see `DpuShard::ingest_sync`). Anything that would change who owns a
    /// connection or its entries (a recall, a delete, an adoption) is dropped and counted
    /// (`dpu.fenced`): the plane it concerned no longer holds the connection.
    pub fn handle_fenced_msg(&mut self, now: Instant, msg: Msg, view: ShardView) {
        match msg {
            Msg::Packets(_) | Msg::Punt(_) => self.handle_msg(now, msg, view),
            Msg::Sync { kind, state, .. } => {
                self.delivered_last = 0;
                self.counters.sync_rx += 1;
                self.res.write().soc(now, SocWork::Sync, 1);
                self.ingest_sync(now, kind, state, true, view);
            }
            _ => {
                self.delivered_last = 0;
                self.counters.fenced += 1;
            }
        }
    }
    /// Takes a state message from a plane. `orphan`: it comes from a plane that is no longer
    /// the active one (an older colour, or a fenced slot). An orphan's state is the DPU's to
    /// own, as at a fail-open, unless a plane runs now and the DPU holds the connection as a
    /// copy: then the current plane owns it (it was handed to it), and the orphan's state, if
    /// newer, goes on to it as an update instead of making a second owner.
    pub(super) fn ingest_sync(
        &mut self,
        now: Instant,
        kind: SyncKind,
        state: ConnState,
        orphan: bool,
        view: ShardView,
    ) {
        self.relay(now, kind, state);
        if kind == SyncKind::Closed {
            // The connection's last packet went through the plane: forget it, entries and all.
            self.close_conn(now, state.conn);
            return;
        }
        if orphan
            && view.phase.has_plane()
            && let Some(c) = self.conns.get_mut(&state.conn)
            && c.role == Role::Copy
        {
            if state.version > c.state.version {
                c.state = state;
                self.send_sync(now, view.colour, SyncKind::Update, state);
            }
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
                let rec = DpuConn {
                    state,
                    role,
                    hw_live: 0,
                    inserts_pending: 0,
                    recalled: false,
                    hw_pkts_mark: 0,
                    hw_mark_at: Instant::ZERO,
                    history: RecallHistory::Never,
                };
                if role == Role::Owner {
                    self.add_conn(state.conn, rec);
                } else if self.res.write().reserve_conn() {
                    self.add_reserved(state.conn, rec);
                } else {
                    self.counters.mirror_skipped += 1;
                }
            }
        }
        if orphan {
            self.pass_on_orphan(now, state.conn, view);
        }
    }

    /// An orphan the DPU took while a plane is active, in a redirected bucket, and not on the
    /// fast path: its packets go to that plane, so the connection goes there too (as a
    /// hand-over at activation would), rather than every packet of it being punted back to the
    /// SoC. This is how a connection the old plane opened while it handed back during an
    /// upgrade, or whose state was still on its way from a failed plane, reaches the new one.
    fn pass_on_orphan(&mut self, now: Instant, conn: ConnId, view: ShardView) {
        let buckets = self.f.dpu.redirect_buckets;
        if !view.redirects(conn, buckets) {
            return;
        }
        let Some(c) = self.conns.get(&conn).copied() else {
            return;
        };
        if c.role == Role::Owner && !c.stays_on_dpu() {
            self.set_role(conn, Role::Copy);
            self.send_sync(now, view.colour, SyncKind::Handover, c.state);
        }
    }

    pub(super) fn handle_recall(
        &mut self,
        now: Instant,
        state: ConnState,
        pps: f64,
        replaces_pps: f64,
    ) {
        let free = self.free_entries();
        // URSched's headroom binds every policy: a recall may not push the fast path past its
        // target utilisation. A swap is charged only what it adds.
        let charge = (pps - replaces_pps).max(0.0);
        let fits_pps = self.res.read().recall_fits(charge);
        let known = self.conns.contains_key(&state.conn);
        // A new record's memory is taken here, with the check, and used below.
        if free < 2 || !fits_pps || (!known && !self.res.write().reserve_conn()) {
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
        self.res.write().grant(charge);
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
            None => self.add_reserved(
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

    pub(super) fn handle_delete(&mut self, now: Instant, seq: u64, conn: ConnId) {
        if let Some(state) = self.deletes.answered(seq) {
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
        self.deletes.record(seq, state);
        self.send(now, Channel::Control, Msg::DeleteAck { seq, state });
    }

    pub(super) fn finish_recall(&mut self, now: Instant, conn: ConnId, ok: bool) {
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
            let removed = self.res.write().remove_entries(now, conn);
            self.counters.deletes += removed;
            self.counters.rule_msgs += removed;
            if let Some(c) = self.conns.get_mut(&conn) {
                c.hw_live = 0;
                c.recalled = false;
            }
            self.counters.recalls_refused += 1;
        }
        self.send(now, Channel::FlowVnic, Msg::RecallDone { conn, ok });
    }

    pub(super) fn complete_insert(&mut self, now: Instant, p: PendingInsert) {
        // A completion for a record that expects none is stale: the connection was closed and
        // its id's record re-created (say by a late mirror) while the insert was queued.
        let Some(c) = self.conns.get(&p.key.conn).copied() else {
            return; // closed while the insert was queued
        };
        if c.inserts_pending == 0 {
            return;
        }
        let outcome = self
            .res
            .write()
            .insert_entry(now, p.key, HwRule { recalled: p.recall });
        let rec = self.conns.get_mut(&p.key.conn).expect("checked above");
        rec.inserts_pending -= 1;
        match outcome {
            Some(Inserted::Fresh) => {
                rec.hw_live += 1;
                self.counters.inserts += 1;
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

    /// Removes the entries of a connection the plane has adopted (demoted, shed, or handed
    /// over by bucket).
    pub(super) fn strip_entries(&mut self, now: Instant, conn: ConnId) {
        self.retire_recalled(conn);
        let removed = self.res.write().remove_entries(now, conn);
        self.counters.deletes += removed;
        self.counters.rule_msgs += removed;
        self.counters.deletes_to_host += removed;
        if let Some(r) = self.conns.get_mut(&conn) {
            r.hw_live = 0;
            r.recalled = false;
        }
    }

    /// The hardware flow-stats dump: the rate of every recalled entry over the last period,
    /// in connection order.
    pub(super) fn send_offload_stats(&mut self, now: Instant) {
        let res = self.res.read();
        let mut v: Vec<(ConnId, u64)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.recalled && c.role == Role::Owner && c.hw_live == 2)
            .filter_map(|(k, _)| {
                res.entry(&HwKey {
                    conn: *k,
                    side: Side::Orig,
                })
                .map(|e| (*k, e.packets))
            })
            .collect();
        drop(res);
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
}
