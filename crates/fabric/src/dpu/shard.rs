//! A shard of the DPU: the connections of its buckets and everything kept per connection or
//! per packet (records, inserts in flight, the delete log, the outbox toward the plane,
//! counters, drops, latency), and the handle to the DPU's one [`Resources`] budget.
//!
//! The lifecycle is not the shard's: the node's control part (phase, hold, colour, quota,
//! URSched) decides, and the shard executes over its own records (a bulk sync, promoting
//! mirrors on a fail-open, handing over buckets, shedding). What the shard needs to know of the
//! lifecycle to serve a packet is a [`ShardView`]: the phase, the colour and the quota. This is
//! the split ADR 0011 plans for several forwarding threads: a [`super::DpuNode`] holds its
//! shards and the control part and calls them in turn ([`Local`]); a driver with a thread per
//! shard calls a shard's inputs on its thread and carries the control part's requests to it.
//!
//! [`Resources`]: super::Resources

use crate::dpu::resources::SocWork;
use crate::links::at_ps;
use crate::stats::TenantStats;
use crate::types::Train;
use spillway_vswitch::{Instant, TenantId};

use super::control::{ShardReply, ShardRequest, Shards};
use super::deletes::DeleteLog;
use super::inserts::InsertQueue;
use super::lifecycle::Phase;
use super::window::Totals;
use super::{DpuConn, DpuCounters, RecallHistory, ResourcesHandle, Role};
use crate::hw::HwKey;
use crate::params::{FabricParams, ns};
use crate::records::{Outbox, Records};
use crate::server::PS_PER_NS;
use crate::stats::{Drops, FabricDrop, LatencyHist};
use crate::types::{Channel, Colour, ConnId, ConnState, Msg, PlaneSlot, Side, SyncKind, Transmit};
use crate::ursched::TENANTS_MAX;

/// What a shard knows of the lifecycle: enough to serve a packet and to colour a message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardView {
    /// The phase.
    pub phase: Phase,
    /// The colour of the current (or last) activation: what state messages carry.
    pub colour: Colour,
    /// Redirected buckets.
    pub quota: u16,
}

impl ShardView {
    /// True when `conn` (its bucket among `buckets`) is redirected to the plane now. The
    /// bucket's hash is computed only while redirect rules are live.
    pub fn redirects(&self, conn: ConnId, buckets: u16) -> bool {
        self.phase.redirect_live() && conn.bucket(buckets) < self.quota
    }
}

/// How many of its most recently closed connections a shard remembers: a packet of one that
/// arrives after its close (reordered across two paths) is counted as `fabric.after_close`, not
/// as lost state. The model's TIME_WAIT; a bound, not a time, so that it costs a fixed 32 KiB.
pub const CLOSED_KEPT: usize = 4096;

/// The last [`CLOSED_KEPT`] connections a shard closed: a ring, written once per close, searched
/// only for a packet that found no state.
#[derive(Debug, Default)]
pub(crate) struct ClosedRing {
    ring: Vec<ConnId>,
    next: usize,
}

impl ClosedRing {
    pub(crate) fn note(&mut self, conn: ConnId) {
        if self.ring.len() < CLOSED_KEPT {
            self.ring.push(conn);
        } else {
            self.ring[self.next] = conn;
            self.next = (self.next + 1) % CLOSED_KEPT;
        }
    }

    pub(crate) fn contains(&self, conn: ConnId) -> bool {
        self.ring.contains(&conn)
    }
}

/// A comparison of per-bucket digests with a plane (`ShardRequest::DigestAsk`): the shard's own
/// digests, and the plane's as they arrive (none: an empty bucket).
///
/// A plane that owns nothing (the warm one, or the active slot's before its activation) only
/// takes the DPU's messages, so the shard digests when it asks: the plane digests when the ask
/// reaches it, behind the same messages. A plane that owns connections (after a flip) changes
/// them itself, and mirrors each change before its answer; so the shard digests when the answer
/// is in, and leaves out every bucket it sent a state message about since it asked (`dirty`):
/// the only changes the plane's digest cannot have seen.
#[derive(Debug)]
pub(crate) struct DigestCheck {
    /// With the warm plane (else the active one).
    warm: bool,
    colour: Colour,
    /// Which comparison (see [`Msg::DigestAsk`]).
    round: u16,
    /// Digested at the answer (see above); `mine` is empty until then.
    at_answer: bool,
    mine: Vec<(u32, u64)>,
    theirs: Vec<(u32, u64)>,
    /// Buckets the shard sent a state message about since it asked (`at_answer` only).
    dirty: Vec<bool>,
}

/// A release's sync-back check (`ShardRequest::SyncBackBegin`): the connections the plane
/// handed back to this shard, as they arrived, and the plane's per-bucket digest of them, sent
/// just before its `Released` (none: an empty bucket). At the `Released` both sides have
/// seen exactly these hand-backs, so the comparison is exact.
#[derive(Debug)]
pub(crate) struct SyncBackCheck {
    colour: Colour,
    handed: Vec<ConnId>,
    theirs: Vec<(u32, u64)>,
}

/// A shard. See the module doc.
#[derive(Debug)]
pub struct DpuShard<R: ResourcesHandle> {
    pub(crate) f: FabricParams,
    pub(crate) res: R,
    /// `pcie.latency`, converted once rather than per train.
    pub(crate) pcie_latency_ns: u64,
    /// `dpu.hw_latency` in picoseconds.
    pub(crate) hw_latency_ps: u64,
    /// Packets the current input delivered (see [`super::DpuNode::delivered_last`]).
    pub(crate) delivered_last: u32,
    pub(crate) conns: Records<DpuConn>,
    pub(crate) inserts: InsertQueue,
    pub(crate) deletes: DeleteLog,
    pub(crate) out: Outbox,
    /// The outbox toward the warm standby plane's slot (see [`DpuShard::relay`]).
    pub(crate) warm_out: Outbox,
    /// The warm plane's colour while state messages are relayed to it.
    pub(crate) warm: Option<Colour>,
    /// The slot `out` is for (see [`DpuShard::active_slot`]).
    pub(crate) active: PlaneSlot,
    /// Digest comparisons under way (see [`DigestCheck`]): `[0]` with the active slot's plane
    /// before its activation, `[1]` with the warm plane.
    pub(crate) digests: [Option<DigestCheck>; 2],
    /// The release under way's sync-back check (see [`SyncBackCheck`]).
    pub(crate) sync_back: Option<SyncBackCheck>,
    /// The connections this shard closed most recently (see [`CLOSED_KEPT`]).
    pub(crate) closed_recently: ClosedRing,
    /// Packets steered to the active plane since it became the active one: the drain fence
    /// (`Msg::Drain::packets`).
    pub(crate) steered_active: u64,
    pub(crate) insert_refused_at_completion: u64,
    pub(crate) first_no_state: Option<ConnId>,
    /// Packets matched by recalled entries that are gone or no longer recalled (see
    /// [`super::DpuNode::recalled_hw_packets`]).
    pub(crate) recalled_hw_retired: u64,
    pub(crate) counters: DpuCounters,
    pub(crate) drops: Drops,
    pub(crate) latency: LatencyHist,
    pub(crate) latency_window: LatencyHist,
    /// Packets per tenant since URSched's variance window last took them (indexed by id;
    /// ids from `TENANTS_MAX - 1` up share the last slot, as URSched's own table does).
    pub(crate) tenant_packets: Vec<u64>,
    /// Packets the fast path refused (`dpu.hw.overload`), by tenant over the whole run
    /// (indexed as `tenant_packets`): whose packets an overload cost.
    pub(crate) tenant_hw_lost: Vec<u64>,
    /// Delivery, loss and latency by tenant.
    pub(crate) tenants: TenantStats,
}

/// Adds `packets` to `tenant`'s slot of a per-tenant table (indexed by id; ids from
/// `TENANTS_MAX - 1` up share the last slot, as URSched's own table does).
fn add_by_tenant(v: &mut Vec<u64>, tenant: TenantId, packets: u32) {
    let i = (tenant.0 as usize).min(TENANTS_MAX - 1);
    if i >= v.len() {
        // Grows once per new tenant, never per packet of a known one.
        v.resize(i + 1, 0);
    }
    v[i] += u64::from(packets);
}

impl<R: ResourcesHandle> DpuShard<R> {
    pub(crate) fn new(f: &FabricParams, res: R) -> DpuShard<R> {
        DpuShard {
            res,
            pcie_latency_ns: ns(f.pcie.latency),
            hw_latency_ps: ns(f.dpu.hw_latency) * PS_PER_NS,
            delivered_last: 0,
            conns: Records::new(7),
            inserts: InsertQueue::new(f),
            deletes: DeleteLog::default(),
            out: Outbox::new(f),
            warm_out: Outbox::new(f),
            warm: None,
            active: PlaneSlot(0),
            digests: [None, None],
            sync_back: None,
            closed_recently: ClosedRing::default(),
            steered_active: 0,
            insert_refused_at_completion: 0,
            first_no_state: None,
            recalled_hw_retired: 0,
            counters: DpuCounters::default(),
            drops: Drops::default(),
            latency: LatencyHist::default(),
            latency_window: LatencyHist::default(),
            tenant_packets: Vec::new(),
            tenant_hw_lost: Vec::new(),
            tenants: TenantStats::default(),
            f: f.clone(),
        }
    }

    /// A shard of a DPU with the limits in `f`, charging the resources `res` reaches.
    pub fn with_resources(f: &FabricParams, res: R) -> DpuShard<R> {
        DpuShard::new(f, res)
    }

    /// Counts a tenant's packets for URSched's variance trigger.
    pub(crate) fn count_tenant(&mut self, tenant: TenantId, packets: u32) {
        add_by_tenant(&mut self.tenant_packets, tenant, packets);
    }

    /// `offered - admitted` packets of `t` refused by a full resource: counted by `reason`
    /// and against `t`'s tenant.
    pub(crate) fn refuse(&mut self, t: &Train, reason: FabricDrop, offered: u32, admitted: u32) {
        self.drops.add_refused(reason, offered, admitted);
        self.tenants
            .lost(t.tenant.0, offered.saturating_sub(admitted));
    }

    /// `packets` of `tenant` the fast path refused.
    pub(crate) fn count_tenant_hw_lost(&mut self, tenant: TenantId, packets: u32) {
        add_by_tenant(&mut self.tenant_hw_lost, tenant, packets);
    }

    /// The shard's counters.
    pub fn counters(&self) -> &DpuCounters {
        &self.counters
    }

    /// The shard's drops by reason.
    pub fn drops(&self) -> &Drops {
        &self.drops
    }

    /// The shard's record of `conn`.
    pub fn conn(&self, conn: ConnId) -> Option<&DpuConn> {
        self.conns.get(&conn)
    }

    /// Connections the shard holds a record of.
    pub fn conns_len(&self) -> usize {
        self.conns.len()
    }

    /// Every record, sorted by connection (for dumps; O(n log n)).
    pub fn conns_sorted(&self) -> Vec<(ConnId, DpuConn)> {
        self.conns.sorted()
    }

    /// The next message for the active plane.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop()
    }

    /// The next message for the warm standby plane.
    pub fn poll_warm_transmit(&mut self) -> Option<Transmit> {
        self.warm_out.pop()
    }

    /// When the shard's next insert reaches the hardware ([`DpuShard::complete_due_inserts`]).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.inserts.next_due()
    }

    /// Packets the last input delivered at once (see [`super::DpuNode::delivered_last`]).
    pub fn delivered_last(&self) -> u32 {
        self.delivered_last
    }

    /// The counts a window's rates are differences of.
    pub(crate) fn totals(&self) -> Totals {
        Totals {
            drops: self.drops.get(FabricDrop::HwOverload)
                + self.drops.get(FabricDrop::SocQueueFull),
            steered: self.counters.steered,
            steered_new: self.counters.steered_new_conn,
            soc_new: self.counters.soc_new_conn,
        }
    }

    pub(crate) fn send(&mut self, at: Instant, channel: Channel, msg: Msg) {
        if let Some(conn) = msg.state_conn() {
            self.touched(conn);
        }
        self.out.send(at, channel, msg);
    }

    /// A state message about `conn` goes to the active plane: a comparison digested at the
    /// answer leaves its bucket out (see [`DigestCheck`]).
    fn touched(&mut self, conn: ConnId) {
        if let Some(d) = &mut self.digests[0]
            && d.at_answer
            && let Some(b) = d
                .dirty
                .get_mut(usize::from(conn.bucket(self.f.dpu.redirect_buckets)))
        {
            *b = true;
        }
    }

    /// Sends a state message of `colour` on the flow vNIC (rate-limited; never refused: the
    /// sync queue is sized for a bulk sync and a full one only delays).
    pub(crate) fn send_sync(
        &mut self,
        now: Instant,
        colour: Colour,
        kind: SyncKind,
        st: ConnState,
    ) {
        self.counters.sync_tx += 1;
        self.touched(st.conn);
        self.out.sync(now, colour, kind, st);
        self.relay(now, kind, st);
    }

    /// Relays a state message the DPU sent or took to the warm standby plane, if one is
    /// listening, so that it holds a current copy of every connection: a mirror of what the
    /// active plane or the DPU hands over (the warm plane owns nothing until a flip), the rest
    /// as it is. The warm plane's vNIC set is FIFO like the active's, so the relays arrive in
    /// the order the DPU saw the changes, behind its bulk sync.
    pub(crate) fn relay(&mut self, now: Instant, kind: SyncKind, st: ConnState) {
        let Some(colour) = self.warm else {
            return;
        };
        let kind = match kind {
            SyncKind::Handover | SyncKind::Mirror => SyncKind::Mirror,
            SyncKind::Update => SyncKind::Update,
            SyncKind::Closed => SyncKind::Closed,
        };
        self.counters.relayed += 1;
        self.warm_out.sync(now, colour, kind, st);
    }

    /// The warm plane of `colour` is up: a mirror of every connection the shard holds (owner
    /// or copy), in connection order, then the end marker naming the shard; every state
    /// message after it is relayed. Returns how many.
    pub(crate) fn warm_sync(&mut self, now: Instant, colour: Colour, shard: u16) -> u64 {
        self.warm = Some(colour);
        self.warm_out = Outbox::new(&self.f);
        let states = self.states_where(|_| true);
        let count = states.len() as u64;
        for st in states {
            self.relay(now, SyncKind::Mirror, st);
        }
        let at = self.warm_out.flow_idle_at(now);
        let done = Msg::SyncDone {
            colour,
            count,
            shard,
        };
        self.warm_out.send(at, Channel::FlowVnic, done);
        count
    }

    /// Digests every bucket of the shard's records and asks the plane (warm or active) for
    /// its own, on that plane's flow vNIC behind every state message sent to it so far.
    pub(crate) fn digest_ask(
        &mut self,
        now: Instant,
        (warm, at_answer): (bool, bool),
        (colour, round): (Colour, u16),
        shard: u16,
    ) {
        let buckets = self.f.dpu.redirect_buckets;
        let at_answer = at_answer && !warm;
        let mine = if at_answer {
            Vec::new()
        } else {
            self.conns.digests(buckets)
        };
        let dirty = if at_answer {
            vec![false; usize::from(buckets)]
        } else {
            Vec::new()
        };
        self.digests[usize::from(warm)] = Some(DigestCheck {
            warm,
            colour,
            round,
            at_answer,
            mine,
            theirs: vec![(0, 0); usize::from(buckets)],
            dirty,
        });
        let out = if warm {
            &mut self.warm_out
        } else {
            &mut self.out
        };
        out.send_flow(
            now,
            Msg::DigestAsk {
                colour,
                shard,
                round,
            },
        );
    }

    /// Takes one of the plane's bucket digests: a sync-back's (round 0), or an asked
    /// comparison's.
    pub(crate) fn digest_part(
        &mut self,
        (colour, round): (Colour, u16),
        bucket: u16,
        count: u32,
        digest: u64,
    ) {
        let theirs = if round == 0 {
            self.sync_back
                .as_mut()
                .filter(|sb| sb.colour == colour)
                .map(|sb| &mut sb.theirs)
        } else {
            self.digests
                .iter_mut()
                .flatten()
                .find(|d| d.colour == colour && d.round == round)
                .map(|d| &mut d.theirs)
        };
        if let Some(t) = theirs.and_then(|t| t.get_mut(usize::from(bucket))) {
            *t = (count, digest);
        }
    }

    /// A release of the activation `colour` begins: note each connection the plane hands back
    /// until its `Released` (see [`SyncBackCheck`]).
    pub(crate) fn sync_back_begin(&mut self, colour: Colour) {
        self.sync_back = Some(SyncBackCheck {
            colour,
            handed: Vec::new(),
            theirs: vec![(0, 0); usize::from(self.f.dpu.redirect_buckets)],
        });
    }

    /// A hand-back of `conn` by the active plane, taken while a release's sync-back check runs
    /// (from the control part's `SyncBackBegin` to this shard's `Released`; the shard's view
    /// of the phase may lag the control part's, so it is not asked). A check a fail-open cut
    /// short stays until the next release replaces it: only a release makes a plane hand
    /// connections back, and a plane's state after a fail-open is an orphan's, not noted.
    pub(crate) fn note_handed_back(&mut self, conn: ConnId) {
        if let Some(sb) = &mut self.sync_back {
            sb.handed.push(conn);
        }
    }

    /// The plane's shard sent its `Released`, behind its hand-backs and its digest of them
    /// (this is shard `index` of `shards`): digests the DPU's records of the connections
    /// handed back, per bucket, and asks the plane to hand each bucket that differs back again
    /// (`Msg::SendBack`; the DPU takes each state by version). Returns those buckets.
    pub(crate) fn sync_back_compare(
        &mut self,
        now: Instant,
        colour: Colour,
        (index, shards): (usize, usize),
    ) -> Vec<u16> {
        let Some(mut sb) = self.sync_back.take_if(|sb| sb.colour == colour) else {
            return Vec::new();
        };
        let mine = self
            .conns
            .digests_of(&mut sb.handed, self.f.dpu.redirect_buckets);
        let differ = self.differing_buckets(&mine, &sb.theirs, (index, shards), &[]);
        for &bucket in &differ {
            self.out.send_flow(now, Msg::SendBack { colour, bucket });
        }
        differ
    }

    /// The buckets of shard `index` of `shards` whose digests differ between `mine` and
    /// `theirs`, leaving out those marked in `skip` (a bucket the plane's digest cannot have
    /// seen a change of): every comparison's one rule, counted (`dpu.digest.buckets`,
    /// `.skipped`, `.mismatch`).
    fn differing_buckets(
        &mut self,
        mine: &[(u32, u64)],
        theirs: &[(u32, u64)],
        (index, shards): (usize, usize),
        skip: &[bool],
    ) -> Vec<u16> {
        let mut differ = Vec::new();
        for (b, (mine, theirs)) in mine.iter().zip(theirs).enumerate() {
            // Only this shard's buckets: the others are other shards' to compare.
            if super::shard_of_bucket(b as u16, shards) != index {
                continue;
            }
            if skip.get(b).copied().unwrap_or(false) {
                self.counters.digest_skipped += 1;
                continue;
            }
            self.counters.digest_buckets += 1;
            if mine != theirs {
                self.counters.digest_mismatch += 1;
                differ.push(b as u16);
            }
        }
        differ
    }

    /// The plane has sent every digest of this shard (`index` of `shards`): compares them with
    /// the shard's own, and resyncs each bucket that differs (a `Resync`, then a mirror of
    /// every record of the bucket, in connection order). Returns those buckets. A `stale`
    /// comparison (the plane could own connections by the time it digested) is dropped and
    /// counted instead.
    pub(crate) fn digest_compare(
        &mut self,
        now: Instant,
        (colour, round): (Colour, u16),
        (index, shards): (usize, usize),
        stale: bool,
    ) -> Vec<u16> {
        let Some(d) = self
            .digests
            .iter_mut()
            .find_map(|d| d.take_if(|d| d.colour == colour && d.round == round))
        else {
            return Vec::new();
        };
        if stale {
            self.counters.digest_stale += 1;
            return Vec::new();
        }
        let buckets = self.f.dpu.redirect_buckets;
        let mine = if d.at_answer {
            self.conns.digests(buckets)
        } else {
            d.mine
        };
        let differ = self.differing_buckets(&mine, &d.theirs, (index, shards), &d.dirty);
        for &bucket in &differ {
            if d.at_answer {
                self.resync_owned(now, colour, bucket);
                continue;
            }
            let states = self.states_where(|c| c.state.conn.bucket(buckets) == bucket);
            let out = if d.warm {
                &mut self.warm_out
            } else {
                &mut self.out
            };
            out.send_flow(now, Msg::Resync { colour, bucket });
            for st in states {
                out.sync(now, colour, SyncKind::Mirror, st);
            }
        }
        differ
    }

    /// Resyncs `bucket` with a plane that owns connections, moving no ownership (a hand-over
    /// here could cross a recall the plane has on its way and leave two owners): the plane
    /// forgets its copies in it (not one it is recalling), the DPU mirrors every record it
    /// holds there, and a `Remirror` makes the plane mirror what it owns there back; each side
    /// takes a state by version, so a newer one is kept.
    fn resync_owned(&mut self, now: Instant, colour: Colour, bucket: u16) {
        let buckets = self.f.dpu.redirect_buckets;
        self.out.send_flow(now, Msg::Resync { colour, bucket });
        for st in self.states_where(|c| c.state.conn.bucket(buckets) == bucket) {
            self.out.sync(now, colour, SyncKind::Mirror, st);
        }
        self.out.send_flow(now, Msg::Remirror { colour, bucket });
    }

    /// The redirect rules steer to the warm slot now (see [`ShardRequest::Flip`]): its outbox
    /// becomes the shard's, and every connection the failed plane owned (the shard's copies)
    /// is handed to the new plane with the DPU's mirror of its state, in connection order,
    /// behind the relays already on their way. A copy with a recall going live stays with the
    /// DPU: the recall's entries make it the DPU's, as a fail-open would. Returns how many
    /// were handed over.
    pub(crate) fn flip(&mut self, now: Instant, colour: Colour) -> u64 {
        core::mem::swap(&mut self.out, &mut self.warm_out);
        self.active = self.active.other();
        // What was queued for the failed plane is lost with it.
        self.warm_out = Outbox::new(&self.f);
        self.warm = None;
        self.digests = [None, None];
        self.steered_active = 0;
        let copies = self.conns.keys_where(|_, c| c.role == Role::Copy);
        let mut handed = 0;
        for conn in copies {
            let c = self.conns[&conn];
            if c.inserts_pending > 0 {
                self.set_role(conn, Role::Owner);
            } else {
                handed += 1;
                self.send_sync(now, colour, SyncKind::Handover, c.state);
            }
        }
        handed
    }

    pub(crate) fn add_conn(&mut self, conn: ConnId, rec: DpuConn) {
        if self.conns.insert(conn, rec).is_none() {
            self.res.write().conn_added();
        }
    }

    /// Adds the record of a connection whose memory [`Resources::reserve_conn`] took.
    ///
    /// [`Resources::reserve_conn`]: super::Resources
    pub(crate) fn add_reserved(&mut self, conn: ConnId, rec: DpuConn) {
        if self.conns.insert(conn, rec).is_some() {
            // It had a record after all: that one's memory is the reservation's.
            self.res.write().conn_removed();
        }
    }

    /// The states of the records `keep` selects, in connection order (what a sync sends, so
    /// that hash-map order never reaches the wire).
    fn states_where(&self, mut keep: impl FnMut(&DpuConn) -> bool) -> Vec<ConnState> {
        let mut v: Vec<ConnState> = self
            .conns
            .values()
            .filter(|c| keep(c))
            .map(|c| c.state)
            .collect();
        v.sort_unstable_by_key(|st| st.conn);
        v
    }

    /// The connection closed (its last packet was delivered, here or by the plane): its
    /// record goes, and it is remembered as closed.
    pub(crate) fn close_conn(&mut self, now: Instant, conn: ConnId) {
        self.remove_conn(now, conn);
        self.closed_recently.note(conn);
    }

    pub(crate) fn remove_conn(&mut self, now: Instant, conn: ConnId) -> Option<DpuConn> {
        self.retire_recalled(conn);
        let rec = self.conns.remove(conn)?;
        let mut res = self.res.write();
        res.conn_removed();
        let removed = res.remove_entries(now, conn);
        self.counters.deletes += removed;
        self.counters.rule_msgs += removed;
        Some(rec)
    }

    pub(crate) fn set_role(&mut self, conn: ConnId, role: Role) {
        self.conns.set_role(conn, role);
    }

    /// `conn` stops being recalled (demoted, stripped, rolled back, closed): its entries'
    /// counts so far stay in [`DpuShard::recalled_hw_packets`].
    pub(crate) fn retire_recalled(&mut self, conn: ConnId) {
        if self.conns.get(&conn).is_some_and(|c| c.recalled) {
            self.recalled_hw_retired += self.res.read().entry_packets(conn);
        }
    }

    /// See [`super::DpuNode::recalled_hw_packets`].
    pub(crate) fn recalled_hw_packets(&self) -> u64 {
        let res = self.res.read();
        let live: u64 = self
            .conns
            .iter()
            .filter(|(_, c)| c.recalled && c.hw_live > 0)
            .map(|(k, _)| res.entry_packets(*k))
            .sum();
        self.recalled_hw_retired + live
    }

    /// Hardware entries neither installed nor promised to an insert on its way (of any
    /// shard).
    pub(crate) fn free_entries(&self) -> usize {
        self.res.read().free_entries()
    }

    /// Queues the two insert commands of `conn`; returns how many were queued. A recall's
    /// inserts are rule commands on the SoC first ([`SocWork::Rule`]; a new connection's are
    /// part of its own cost): the insertion engine takes each when the SoC has built it, and
    /// one the SoC's queue has no room for is refused.
    pub(crate) fn queue_inserts(&mut self, now: Instant, conn: ConnId, recall: bool) -> u8 {
        let mut queued = 0;
        for side in [Side::Orig, Side::Reply] {
            let mut at = now;
            if recall {
                let built = self.res.write().soc(now, SocWork::Rule, 1);
                if built.count == 0 {
                    self.counters.insert_rejected += 1;
                    continue;
                }
                at = at_ps(built.finish_ps);
            }
            let engine = self.res.write().insert_slot(at);
            if self.inserts.push(engine, HwKey { conn, side }, recall) {
                queued += 1;
                self.counters.rule_msgs += 1;
            } else {
                self.counters.insert_rejected += 1;
            }
        }
        queued
    }

    // ---- what the control part asks of a shard -----------------------------------------

    /// The bulk sync of an activation of `colour`: a mirror of every connection the shard
    /// owns, in connection order, then the end marker naming the shard (`shard`). Returns how
    /// many.
    pub(crate) fn bulk_sync(&mut self, now: Instant, colour: Colour, shard: u16) -> u64 {
        // A new active plane: nothing was steered to it yet.
        self.steered_active = 0;
        let states = self.states_where(|c| c.role == Role::Owner);
        let count = states.len() as u64;
        for st in states {
            self.send_sync(now, colour, SyncKind::Mirror, st);
        }
        let at = self.out.flow_idle_at(now);
        let done = Msg::SyncDone {
            colour,
            count,
            shard,
        };
        self.send(at, Channel::FlowVnic, done);
        count
    }

    /// A fail-open: every copy becomes owned (the mirror is the state). Returns how many.
    pub(crate) fn promote_copies(&mut self) -> usize {
        let copies = self.conns.keys_where(|_, c| c.role == Role::Copy);
        let n = copies.len();
        for c in copies {
            self.set_role(c, Role::Owner);
            self.retire_recalled(c);
            if let Some(r) = self.conns.get_mut(&c) {
                r.recalled = false;
            }
        }
        n
    }

    /// At activation or a quota increase: connections of buckets `[from, to)` the shard
    /// serves on the SoC (no live entries, none pending) move to the plane, which serves those
    /// buckets now.
    pub(crate) fn hand_over_buckets(&mut self, now: Instant, colour: Colour, from: u16, to: u16) {
        let buckets = self.f.dpu.redirect_buckets;
        let moving = self.conns.keys_where(|k, c| {
            let b = k.bucket(buckets);
            b >= from && b < to && c.role == Role::Owner && !c.stays_on_dpu()
        });
        for conn in moving {
            let st = self.conns[&conn].state;
            self.set_role(conn, Role::Copy);
            self.send_sync(now, colour, SyncKind::Handover, st);
        }
    }

    /// Appends to `into` this shard's connections of the redirected buckets `[0, quota)` with
    /// live entries, each with its rate over its life in the table (hardware counters since
    /// install), packets/s: what a shed chooses from ([`Shards::shed`]).
    pub(crate) fn shed_candidates(&self, now: Instant, quota: u16, into: &mut Vec<(u64, ConnId)>) {
        let secs = self.f.sched.window.as_secs_f64();
        let buckets = self.f.dpu.redirect_buckets;
        let res = self.res.read();
        into.extend(
            self.conns
                .iter()
                .filter(|(k, c)| {
                    c.role == Role::Owner && c.hw_live == 2 && k.bucket(buckets) < quota
                })
                .map(|(k, _)| {
                    let pps: f64 = [Side::Orig, Side::Reply]
                        .iter()
                        .filter_map(|side| {
                            res.entry(&HwKey {
                                conn: *k,
                                side: *side,
                            })
                        })
                        .map(|e| e.packets as f64 / (now - e.installed).as_secs_f64().max(secs))
                        .sum();
                    (pps as u64, *k)
                }),
        );
    }

    /// Hands `conns`, chosen by a shed, to the plane, entries and all (they stay until the
    /// plane adopts it, see `Msg::Adopted`).
    pub(crate) fn shed(&mut self, now: Instant, colour: Colour, conns: &[ConnId]) {
        for conn in conns {
            let Some(st) = self.conns.get(conn).map(|c| c.state) else {
                continue;
            };
            self.set_role(*conn, Role::Copy);
            self.counters.shed += 1;
            self.left_fast_path(*conn);
            self.send_sync(now, colour, SyncKind::Handover, st);
        }
    }

    /// The inserts due at `now` reach the hardware.
    pub fn complete_due_inserts(&mut self, now: Instant) {
        while let Some(p) = self.inserts.pop_due(now) {
            self.res.write().insert_due();
            self.complete_insert(now, p);
        }
    }

    /// `conn` leaves the fast path for the host (demoted or shed): a flap if it had been
    /// recalled (see [`RecallHistory`]).
    pub(crate) fn left_fast_path(&mut self, conn: ConnId) {
        if let Some(r) = self.conns.get_mut(&conn)
            && r.history != RecallHistory::Never
        {
            r.history = RecallHistory::Left;
            self.counters.flaps += 1;
        }
    }

    /// Answers one of the control part's requests (see [`ShardRequest`]).
    pub fn serve(&mut self, req: ShardRequest) -> ShardReply {
        match req {
            ShardRequest::BulkSync { now, colour, shard } => {
                ShardReply::Count(self.bulk_sync(now, colour, shard))
            }
            ShardRequest::PromoteCopies => ShardReply::Count(self.promote_copies() as u64),
            ShardRequest::WarmSync { now, colour, shard } => {
                ShardReply::Count(self.warm_sync(now, colour, shard))
            }
            ShardRequest::WarmOff => {
                self.warm = None;
                self.digests[1] = None;
                self.warm_out = Outbox::new(&self.f);
                ShardReply::Done
            }
            ShardRequest::Flip { now, colour } => ShardReply::Count(self.flip(now, colour)),
            ShardRequest::HandOver {
                now,
                colour,
                from,
                to,
            } => {
                self.hand_over_buckets(now, colour, from, to);
                ShardReply::Done
            }
            ShardRequest::ShedCandidates {
                now,
                quota,
                mut into,
            } => {
                self.shed_candidates(now, quota, &mut into);
                ShardReply::Candidates(into)
            }
            ShardRequest::Shed { now, colour, conns } => {
                self.shed(now, colour, &conns);
                ShardReply::Done
            }
            ShardRequest::OffloadStats { now } => {
                self.send_offload_stats(now);
                ShardReply::Done
            }
            ShardRequest::Totals => ShardReply::Totals(self.totals()),
            ShardRequest::TakeTenantPackets { mut spare } => {
                core::mem::swap(&mut self.tenant_packets, &mut spare);
                ShardReply::TenantPackets(spare)
            }
            ShardRequest::CountFailOpen => {
                self.counters.fail_opens += 1;
                ShardReply::Done
            }
            ShardRequest::Drain { at, colour, shard } => {
                let msg = Msg::Drain {
                    colour,
                    shard,
                    packets: self.steered_active,
                };
                self.send(at, Channel::Control, msg);
                ShardReply::Done
            }
            ShardRequest::CountFailover => {
                self.counters.failovers += 1;
                ShardReply::Done
            }
            ShardRequest::CountUpgrade => {
                self.counters.upgrades += 1;
                ShardReply::Done
            }
            ShardRequest::DigestAsk {
                now,
                warm,
                at_answer,
                colour,
                round,
                shard,
            } => {
                self.digest_ask(now, (warm, at_answer), (colour, round), shard);
                ShardReply::Done
            }
            ShardRequest::DigestPart {
                colour,
                round,
                bucket,
                count,
                digest,
            } => {
                self.digest_part((colour, round), bucket, count, digest);
                ShardReply::Done
            }
            ShardRequest::DigestCompare {
                now,
                colour,
                round,
                shard,
                shards,
                stale,
            } => ShardReply::Buckets(self.digest_compare(
                now,
                (colour, round),
                (usize::from(shard), usize::from(shards)),
                stale,
            )),
            ShardRequest::SyncBackBegin { colour } => {
                self.sync_back_begin(colour);
                ShardReply::Done
            }
            ShardRequest::SyncBackCompare {
                now,
                colour,
                shard,
                shards,
            } => ShardReply::Buckets(self.sync_back_compare(
                now,
                colour,
                (usize::from(shard), usize::from(shards)),
            )),
            ShardRequest::Send { at, channel, msg } => {
                self.send(at, channel, msg);
                ShardReply::Done
            }
            ShardRequest::TakeUtils { now } => ShardReply::Utils(self.res.write().take_utils(now)),
            ShardRequest::SetHeadroom { pps } => {
                self.res.write().set_headroom(pps);
                ShardReply::Done
            }
            ShardRequest::Budget => {
                let (free, headroom) = self.res.read().recall_budget();
                ShardReply::Budget(free, headroom)
            }
            ShardRequest::HostIdle { now } => ShardReply::Ps(self.res.read().host_idle_ps(now)),
        }
    }

    /// Checks the shard's records and the resources. O(connections).
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.res.read().check_invariants()?;
        self.conns.check("dpu")
    }
}

/// The shards of one [`super::DpuNode`]: its own, asked in turn in the node's thread, then
/// those served elsewhere ([`super::DpuNode::with_remote`]), numbered after them.
pub(crate) struct Local<'a, R: ResourcesHandle>(
    pub(crate) &'a mut [DpuShard<R>],
    pub(crate) Option<&'a mut dyn Shards>,
);

impl<R: ResourcesHandle> Shards for Local<'_, R> {
    fn count(&self) -> usize {
        self.0.len() + self.1.as_ref().map_or(0, |r| r.count())
    }
    fn call(&mut self, shard: usize, req: ShardRequest) -> ShardReply {
        match (self.0.get_mut(shard), self.1.as_deref_mut()) {
            (Some(s), _) => s.serve(req),
            (None, Some(remote)) => remote.call(shard - self.0.len(), req),
            (None, None) => panic!("no shard {shard}: the node has {}", self.0.len()),
        }
    }
}
