//! The DPU's control part: one lifecycle ([`Lifecycle`]: phase, hold, colour, quota, what the
//! plane last reported) and one set of measurement windows with URSched ([`Windows`]),
//! whatever number of shards forward. It decides; the shards act on their records.
//!
//! The control part reaches the shards only by [`ShardRequest`]s, through [`Shards`]: the few
//! things a lifecycle step asks of a shard (a bulk sync, promoting mirrors on a fail-open, a
//! hand-over of buckets, a shed, a window's totals and tenant counts) and of the DPU's
//! resources (through the first shard's handle). Each shard answers with
//! [`super::DpuShard::serve`]. [`super::DpuNode`] carries the requests to the shards it holds
//! by calling them; a driver that runs each shard on its own thread carries each request to
//! the shard's thread at a batch boundary and waits for the reply (lifecycle steps are rare: a
//! window every `sched.window`, a transition now and then). After a step, the driver gives the
//! shards the control part's new [`DpuControl::view`].

use spillway_vswitch::{Instant, TenantId};

use super::lifecycle::{Command, FabricEvent, Hold, Lifecycle, Phase, Upgrade, Warm};
use super::shard::ShardView;
use super::window::{Totals, Utils, Windows};
use crate::params::FabricParams;
use crate::types::{Channel, Colour, ConnId, Msg, PlaneSlot};
use crate::ursched::Load;

/// One thing the control part asks of one shard. The driver carries it to the shard (on the
/// shard's thread, at a batch boundary) and the answer back: [`DpuShard::serve`] answers it.
///
/// [`DpuShard::serve`]: super::DpuShard::serve
#[derive(Clone, Debug, PartialEq)]
pub enum ShardRequest {
    /// The bulk sync of an activation of `colour`: a mirror of each connection the shard
    /// owns, then its own end marker. [`ShardReply::Count`]: the mirrors.
    BulkSync {
        /// When.
        now: Instant,
        /// The activation's colour.
        colour: Colour,
        /// The shard's index, which its end marker carries.
        shard: u16,
    },
    /// A fail-open: every copy becomes owned. [`ShardReply::Count`]: how many.
    PromoteCopies,
    /// The warm plane of `colour` is up: relay every state message to it from now on, after
    /// a mirror of every connection the shard holds (owner or copy) and its own end marker.
    /// [`ShardReply::Count`]: the mirrors.
    WarmSync {
        /// When.
        now: Instant,
        /// The warm plane's colour.
        colour: Colour,
        /// The shard's index, which its end marker carries.
        shard: u16,
    },
    /// The warm plane is gone: relay nothing more, forget what was queued for it.
    WarmOff,
    /// The redirect rules now steer to the warm slot, whose plane (of `colour`) becomes the
    /// active one: its vNIC set becomes the shard's, and every connection the failed plane
    /// owned is handed to it (a recall still going live stays with the DPU).
    /// [`ShardReply::Count`]: connections handed over.
    Flip {
        /// When.
        now: Instant,
        /// The new active plane's colour.
        colour: Colour,
    },
    /// Connections of buckets `[from, to)` served on the SoC move to the plane.
    HandOver {
        /// When.
        now: Instant,
        /// The activation's colour.
        colour: Colour,
        /// First bucket.
        from: u16,
        /// One past the last bucket.
        to: u16,
    },
    /// The shard's connections of buckets `[0, quota)` with live entries, with each one's rate
    /// (packets/s, whole) appended to `into`: what a shed chooses from.
    /// [`ShardReply::Candidates`].
    ShedCandidates {
        /// When.
        now: Instant,
        /// Redirected buckets.
        quota: u16,
        /// The vector to append to (it travels with the request and comes back).
        into: Vec<(u64, ConnId)>,
    },
    /// These connections of the shard, chosen by a shed, move to the plane, entries and all.
    Shed {
        /// When.
        now: Instant,
        /// The activation's colour.
        colour: Colour,
        /// The connections, in the order the shed chose them.
        conns: Vec<ConnId>,
    },
    /// The recalled entries' rates to the plane.
    OffloadStats {
        /// When.
        now: Instant,
    },
    /// [`ShardReply::Totals`]: the counts a window's rates are differences of.
    Totals,
    /// [`ShardReply::TenantPackets`]: the packets each tenant sent since the last time,
    /// indexed by tenant id. The shard counts on in `spare` (all zeros), so that the two
    /// vectors change hands and neither side allocates once both have grown to the tenants'
    /// ids.
    TakeTenantPackets {
        /// A zeroed vector for the shard to count in.
        spare: Vec<u64>,
    },
    /// Count a fail-open (asked of the first shard only).
    CountFailOpen,
    /// Count a failover (asked of the first shard only).
    CountFailover,
    /// Count a finished online upgrade (asked of the first shard only).
    CountUpgrade,
    /// Ask the plane to drain: the shard's `Msg::Drain`, with the packets it steered to the
    /// plane since it became the active one, leaving at `at`. [`ShardReply::Done`].
    Drain {
        /// When it leaves.
        at: Instant,
        /// The activation's colour.
        colour: Colour,
        /// The shard's index.
        shard: u16,
    },
    /// Digest the shard's records per bucket and ask the plane (the warm one, or the active
    /// one) for its own, on that plane's flow vNIC. [`ShardReply::Done`].
    DigestAsk {
        /// When.
        now: Instant,
        /// Ask the warm plane (else the active one).
        warm: bool,
        /// The plane owns connections: digest at the answer, not now (see
        /// `shard::DigestCheck`).
        at_answer: bool,
        /// That plane's colour.
        colour: Colour,
        /// Which comparison (0: a sync-back's digest).
        round: u16,
        /// The shard's index.
        shard: u16,
    },
    /// One of the plane's bucket digests ([`crate::types::Msg::Digest`]).
    /// [`ShardReply::Done`].
    DigestPart {
        /// The colour asked with.
        colour: Colour,
        /// Which comparison (0: a sync-back's digest).
        round: u16,
        /// The bucket.
        bucket: u16,
        /// Its records.
        count: u32,
        /// Their digest.
        digest: u64,
    },
    /// The plane has sent all of the shard's digests: compare, and resync every bucket that
    /// differs. [`ShardReply::Buckets`]: those buckets.
    DigestCompare {
        /// When.
        now: Instant,
        /// The colour asked with.
        colour: Colour,
        /// Which comparison (0: a sync-back's digest).
        round: u16,
        /// The shard's index.
        shard: u16,
        /// Shards in all.
        shards: u16,
        /// Drop the comparison (counted) instead: it no longer says anything.
        stale: bool,
    },
    /// A release begins: note what the plane hands back for the sync-back check.
    /// [`ShardReply::Done`].
    SyncBackBegin {
        /// The activation released.
        colour: Colour,
    },
    /// The plane's shard `shard` has handed everything back (its `Released`): compare its
    /// digest of the hand-backs with the shard's records of them, and ask for each bucket that
    /// differs again. [`ShardReply::Buckets`]: those buckets.
    SyncBackCompare {
        /// When.
        now: Instant,
        /// The activation released.
        colour: Colour,
        /// The shard's index.
        shard: u16,
        /// Shards in all.
        shards: u16,
    },
    /// Send one of the control part's own messages to the plane (asked of the first shard).
    Send {
        /// When it leaves.
        at: Instant,
        /// On which channel.
        channel: Channel,
        /// The message.
        msg: Msg,
    },
    /// [`ShardReply::Utils`]: the resources' utilisations since the last time; starts the
    /// next window.
    TakeUtils {
        /// When.
        now: Instant,
    },
    /// The recall headroom of a new window, packets/s.
    SetHeadroom {
        /// Packets/s.
        pps: f64,
    },
    /// [`ShardReply::Budget`]: free hardware entries and recall headroom left.
    Budget,
    /// [`ShardReply::Ps`]: when everything queued toward the host has left, not before `now`.
    HostIdle {
        /// When.
        now: Instant,
    },
}

/// A shard's answer to a [`ShardRequest`].
#[derive(Clone, Debug, PartialEq)]
pub enum ShardReply {
    /// Done; nothing to say.
    Done,
    /// How many.
    Count(u64),
    /// A shed's candidates: rate (packets/s) and connection.
    Candidates(Vec<(u64, ConnId)>),
    /// A window's counts.
    Totals(Totals),
    /// Packets per tenant, indexed by tenant id (ids from `ursched::TENANTS_MAX - 1` up
    /// share the last slot).
    TenantPackets(Vec<u64>),
    /// Utilisations.
    Utils(Utils),
    /// Free hardware entries and recall headroom left, packets/s.
    Budget(usize, f64),
    /// A time, picoseconds.
    Ps(u64),
    /// Redirect buckets.
    Buckets(Vec<u16>),
}

/// How the control part reaches the shards: one request to one shard, one reply. See the
/// module doc. What the control part makes of the replies (sums, a shed that moves on to the
/// shed's choice over every shard's candidates) is written once, here, whatever carries them.
pub trait Shards {
    /// How many shards there are (at least one).
    fn count(&self) -> usize;
    /// Asks shard `shard` and returns its reply.
    fn call(&mut self, shard: usize, req: ShardRequest) -> ShardReply;
}

/// A reply that is not the one the request asks for is a driver's bug.
fn mismatch(req: &str, reply: &ShardReply) -> ! {
    panic!("a shard answered {req} with {reply:?}")
}

impl dyn Shards + '_ {
    fn count_all(&mut self, req: impl Fn(usize) -> ShardRequest) -> u64 {
        (0..self.count())
            .map(|i| match self.call(i, req(i)) {
                ShardReply::Count(n) => n,
                r => mismatch("a count", &r),
            })
            .sum()
    }

    fn each(&mut self, req: impl Fn() -> ShardRequest) {
        for i in 0..self.count() {
            self.call(i, req());
        }
    }

    pub(crate) fn bulk_sync(&mut self, now: Instant, colour: Colour) -> u64 {
        self.count_all(|i| ShardRequest::BulkSync {
            now,
            colour,
            shard: i as u16,
        })
    }

    pub(crate) fn promote_copies(&mut self) -> usize {
        self.count_all(|_| ShardRequest::PromoteCopies) as usize
    }

    pub(crate) fn warm_sync(&mut self, now: Instant, colour: Colour) -> u64 {
        self.count_all(|i| ShardRequest::WarmSync {
            now,
            colour,
            shard: i as u16,
        })
    }

    pub(crate) fn warm_off(&mut self) {
        self.each(|| ShardRequest::WarmOff);
    }

    pub(crate) fn flip(&mut self, now: Instant, colour: Colour) -> u64 {
        self.count_all(|_| ShardRequest::Flip { now, colour })
    }

    pub(crate) fn hand_over_buckets(&mut self, now: Instant, colour: Colour, from: u16, to: u16) {
        self.each(|| ShardRequest::HandOver {
            now,
            colour,
            from,
            to,
        });
    }

    /// Hands connections with live entries in the redirected buckets `[0, quota)` to the
    /// plane until `excess` packets/s are covered: highest rate first over every shard (fewest
    /// entries moved), ties by connection id. Every shard names its candidates, the choice is
    /// made here, and each shard moves its own. `buckets` is the redirect bucket count (a
    /// connection's shard is [`super::shard_of`] it). Returns how many moved and their rate.
    pub(crate) fn shed(
        &mut self,
        now: Instant,
        (colour, quota, buckets): (Colour, u16, u16),
        excess: f64,
    ) -> (u64, f64) {
        let n = self.count();
        let mut all = Vec::new();
        for i in 0..n {
            let req = ShardRequest::ShedCandidates {
                now,
                quota,
                into: core::mem::take(&mut all),
            };
            match self.call(i, req) {
                ShardReply::Candidates(v) => all = v,
                r => mismatch("shed candidates", &r),
            }
        }
        all.sort_unstable_by(|a, b| b.cmp(a));
        let mut chosen: Vec<Vec<ConnId>> = vec![Vec::new(); n];
        let (mut moved, mut shed) = (0u64, 0.0);
        for (pps, conn) in all {
            if shed >= excess || pps == 0 {
                break;
            }
            shed += pps as f64;
            moved += 1;
            chosen[super::shard_of(conn, buckets, n)].push(conn);
        }
        for (i, conns) in chosen.into_iter().enumerate() {
            if !conns.is_empty() {
                self.call(i, ShardRequest::Shed { now, colour, conns });
            }
        }
        (moved, shed)
    }

    pub(crate) fn send_offload_stats(&mut self, now: Instant) {
        self.each(|| ShardRequest::OffloadStats { now });
    }

    pub(crate) fn totals(&mut self) -> Totals {
        let mut t = Totals::default();
        for i in 0..self.count() {
            match self.call(i, ShardRequest::Totals) {
                ShardReply::Totals(s) => t.add(&s),
                r => mismatch("totals", &r),
            }
        }
        t
    }

    /// Each shard's packets per tenant since the last call, into `into`; `spare` is the
    /// zeroed vector handed to the first shard, and the last shard's (zeroed) afterwards.
    pub(crate) fn drain_tenant_packets(
        &mut self,
        spare: &mut Vec<u64>,
        into: &mut dyn FnMut(TenantId, u64),
    ) {
        for i in 0..self.count() {
            let req = ShardRequest::TakeTenantPackets {
                spare: core::mem::take(spare),
            };
            match self.call(i, req) {
                ShardReply::TenantPackets(mut v) => {
                    for (tenant, n) in v.iter_mut().enumerate() {
                        if *n > 0 {
                            into(TenantId(tenant as u32), *n);
                            *n = 0;
                        }
                    }
                    *spare = v;
                }
                r => mismatch("tenant packets", &r),
            }
        }
    }

    pub(crate) fn count_fail_open(&mut self) {
        self.call(0, ShardRequest::CountFailOpen);
    }

    pub(crate) fn drain(&mut self, at: Instant, colour: Colour) {
        for i in 0..self.count() {
            let req = ShardRequest::Drain {
                at,
                colour,
                shard: i as u16,
            };
            self.call(i, req);
        }
    }

    pub(crate) fn count_failover(&mut self) {
        self.call(0, ShardRequest::CountFailover);
    }

    pub(crate) fn count_upgrade(&mut self) {
        self.call(0, ShardRequest::CountUpgrade);
    }

    pub(crate) fn digest_ask(
        &mut self,
        now: Instant,
        (warm, at_answer): (bool, bool),
        (colour, round): (Colour, u16),
    ) {
        for i in 0..self.count() {
            let req = ShardRequest::DigestAsk {
                now,
                warm,
                at_answer,
                colour,
                round,
                shard: i as u16,
            };
            self.call(i, req);
        }
    }

    /// Shard `shard`'s comparison of its digests; the buckets that differed (none if `stale`:
    /// the comparison is dropped).
    pub(crate) fn digest_compare(
        &mut self,
        shard: usize,
        now: Instant,
        (colour, round): (Colour, u16),
        stale: bool,
    ) -> Vec<u16> {
        let req = ShardRequest::DigestCompare {
            now,
            colour,
            round,
            shard: shard as u16,
            shards: self.count() as u16,
            stale,
        };
        match self.call(shard, req) {
            ShardReply::Buckets(v) => v,
            r => mismatch("buckets", &r),
        }
    }

    pub(crate) fn sync_back_begin(&mut self, colour: Colour) {
        self.each(|| ShardRequest::SyncBackBegin { colour });
    }

    /// Shard `shard`'s sync-back comparison; the buckets asked for again.
    pub(crate) fn sync_back_compare(
        &mut self,
        shard: usize,
        now: Instant,
        colour: Colour,
    ) -> Vec<u16> {
        let req = ShardRequest::SyncBackCompare {
            now,
            colour,
            shard: shard as u16,
            shards: self.count() as u16,
        };
        match self.call(shard, req) {
            ShardReply::Buckets(v) => v,
            r => mismatch("buckets", &r),
        }
    }

    pub(crate) fn send(&mut self, at: Instant, channel: Channel, msg: Msg) {
        self.call(0, ShardRequest::Send { at, channel, msg });
    }

    pub(crate) fn take_utils(&mut self, now: Instant) -> Utils {
        match self.call(0, ShardRequest::TakeUtils { now }) {
            ShardReply::Utils(u) => u,
            r => mismatch("utilisations", &r),
        }
    }

    pub(crate) fn set_headroom(&mut self, pps: f64) {
        self.call(0, ShardRequest::SetHeadroom { pps });
    }

    pub(crate) fn budget(&mut self) -> (usize, f64) {
        match self.call(0, ShardRequest::Budget) {
            ShardReply::Budget(free, headroom) => (free, headroom),
            r => mismatch("a budget", &r),
        }
    }

    pub(crate) fn host_idle_ps(&mut self, now: Instant) -> u64 {
        match self.call(0, ShardRequest::HostIdle { now }) {
            ShardReply::Ps(ps) => ps,
            r => mismatch("a time", &r),
        }
    }
}

/// The control part. See the module doc.
#[derive(Debug)]
pub struct DpuControl {
    pub(crate) f: FabricParams,
    pub(crate) life: Lifecycle,
    pub(crate) win: Windows,
    /// The end markers the current step awaits from the active plane (the acknowledgement of
    /// its bulk sync, its `Released`, its `Drained`).
    pub(crate) markers: Markers,
    /// The end markers of the warm plane's bulk sync.
    pub(crate) warm_markers: Markers,
    /// The digest comparisons under way, `[0]` with the active slot's plane (before its
    /// activation, or after a flip) and `[1]` with the warm plane: the plane's colour, the
    /// shards that have not answered, the buckets that differed so far, and whether the plane
    /// owns connections (after a flip: see `shard::DigestCheck`).
    pub(crate) digests: [Option<Comparison>; 2],
    /// The release under way's sync-back check (see [`SyncBack`]).
    pub(crate) sync_back: Option<SyncBack>,
    /// The last digest comparison's round (never 0 once one was asked).
    pub(crate) digest_round: u16,
    /// When the warm plane's digests are next compared.
    pub(crate) next_digest: Instant,
    /// The zeroed vector the next shard counts tenants' packets in (see
    /// [`ShardRequest::TakeTenantPackets`]).
    pub(crate) tenant_spare: Vec<u64>,
}

/// A digest comparison under way at the control part (see `DpuControl::ask_digests`).
#[derive(Debug)]
pub(crate) struct Comparison {
    /// The plane's colour.
    pub(crate) colour: Colour,
    /// Which comparison (see `Msg::DigestAsk`).
    pub(crate) round: u16,
    /// The shards that have not answered.
    pub(crate) markers: Markers,
    /// The buckets that differed so far.
    pub(crate) differ: Vec<u16>,
    /// The plane owns connections (after a flip): see `shard::DigestCheck`.
    pub(crate) at_answer: bool,
}

/// A release's sync-back check, at the control part: each shard compares the plane's digest
/// of what it handed back with its own records of it at that shard's `Released`, and asks
/// again for each bucket that differs (`Msg::SendBack`). The release goes on when every shard's
/// `Released` is in and every bucket asked for again was answered (`Msg::SentBack`), or when
/// `dpu.drain_timeout` has passed since the last `Released`.
#[derive(Debug)]
pub(crate) struct SyncBack {
    pub(crate) colour: Colour,
    /// Buckets asked for again and not answered yet.
    pub(crate) pending: usize,
    /// Every bucket asked for again.
    pub(crate) differ: Vec<u16>,
    /// States handed back again.
    pub(crate) sent: u64,
    /// Connections handed back, once every shard's `Released` is in.
    pub(crate) handed: Option<u64>,
}

impl SyncBack {
    pub(crate) fn new(colour: Colour) -> SyncBack {
        SyncBack {
            colour,
            pending: 0,
            differ: Vec::new(),
            sent: 0,
            handed: None,
        }
    }
}

/// The shards whose end marker a step awaits from a plane (bit `k` for shard `k`), and the
/// connections the markers received so far counted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Markers {
    awaited: u64,
    sum: u64,
}

impl Markers {
    /// The step awaits an end marker from each of `shards` shards.
    pub(crate) fn await_all(&mut self, shards: usize) {
        self.awaited = if shards >= 64 {
            u64::MAX
        } else {
            (1u64 << shards) - 1
        };
        self.sum = 0;
    }

    /// Whether shard `shard`'s end marker is awaited.
    pub(crate) fn awaits(&self, shard: u16) -> bool {
        1u64.checked_shl(u32::from(shard))
            .is_some_and(|bit| self.awaited & bit != 0)
    }

    /// Takes shard `shard`'s end marker, which counted `count` connections: `Some(total)` when
    /// it was the last one awaited, `None` while others are, or if it was not awaited (a
    /// duplicate, or no step awaits one).
    pub(crate) fn take(&mut self, shard: u16, count: u64) -> Option<u64> {
        let bit = 1u64.checked_shl(u32::from(shard))?;
        if self.awaited & bit == 0 {
            return None;
        }
        self.awaited &= !bit;
        self.sum += count;
        (self.awaited == 0).then_some(self.sum)
    }
}

impl DpuControl {
    /// The next step awaits an end marker from each of `shards` shards of the active plane.
    pub(crate) fn await_markers(&mut self, shards: usize) {
        self.markers.await_all(shards);
    }

    /// Takes the active plane's end marker of shard `shard` (see [`Markers::take`]).
    pub(crate) fn take_marker(&mut self, shard: u16, count: u64) -> Option<u64> {
        self.markers.take(shard, count)
    }

    /// The control part of a DPU with the limits in `f`.
    pub fn new(f: &FabricParams) -> DpuControl {
        DpuControl {
            life: Lifecycle::new(),
            win: Windows::new(f),
            markers: Markers::default(),
            warm_markers: Markers::default(),
            digests: [None, None],
            sync_back: None,
            digest_round: 0,
            next_digest: Instant::ZERO,
            tenant_spare: Vec::new(),
            f: f.clone(),
        }
    }

    /// What the shards must know of the lifecycle to serve a packet.
    pub fn view(&self) -> ShardView {
        ShardView {
            phase: self.life.phase,
            colour: self.life.colour,
            quota: self.life.quota,
        }
    }

    /// The lifecycle phase.
    pub fn phase(&self) -> Phase {
        self.life.phase
    }
    /// The operator's hold.
    pub fn hold(&self) -> Hold {
        self.life.hold
    }
    /// The slot whose plane the redirect rules steer to.
    pub fn active_slot(&self) -> PlaneSlot {
        self.life.active
    }
    /// The warm standby plane's state.
    pub fn warm(&self) -> Warm {
        self.life.warm
    }
    /// The online upgrade under way.
    pub fn upgrade(&self) -> Upgrade {
        self.life.upgrade
    }
    /// Redirected buckets (the overflow quota).
    pub fn quota(&self) -> u16 {
        self.life.quota
    }
    /// The load URSched saw in the last window.
    pub fn last_load(&self) -> &Load {
        self.win.last_load()
    }
    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.life.commands.pop_front()
    }
    /// The next lifecycle event.
    pub fn poll_event(&mut self) -> Option<FabricEvent> {
        self.life.events.pop_front()
    }
    /// When [`DpuControl::handle_timeout`] must next run (the shards' own timers apart).
    pub fn poll_timeout(&self) -> Instant {
        let t = self.win.next_edge();
        match self.life.next_timer() {
            Some(at) => t.min(at),
            None => t,
        }
    }
    /// The driver's report of how many host cores the tenants use (isolation input).
    pub fn set_tenant_cores(&mut self, cores: u32) {
        self.win.set_tenant_cores(cores);
    }
    /// The cluster's baseline for URSched's variance trigger
    /// ([`crate::ursched::URSched::set_cluster_baseline`]).
    pub fn set_cluster_baseline(&mut self, cv2: Option<f64>) {
        self.win.sched_mut().set_cluster_baseline(cv2);
    }
    /// Every tenant's load as of URSched's last variance window.
    pub fn tenant_loads(&self) -> &[crate::ursched::TenantLoad] {
        self.win.sched().tenant_loads()
    }
    /// Cores wanted from a remote pool while URSched's fallback or a remote plane lasts.
    pub fn remote_wanted(&self) -> Option<u32> {
        self.win.remote_wanted()
    }
    /// The cores a remote pool host granted this host, or `None`
    /// ([`crate::ursched::URSched::set_remote_grant`]).
    pub fn set_remote_grant(&mut self, cores: Option<u32>) {
        self.win.sched_mut().set_remote_grant(cores);
    }
    /// The plane (active and warm) runs on a remote pool host.
    pub fn plane_remote(&self) -> bool {
        self.life.remote
    }
    /// Host cores a plane could take now.
    pub fn isolatable_cores(&self) -> u32 {
        self.win.isolatable_cores()
    }

    pub(crate) fn event(&mut self, at: Instant, what: super::EventKind, reason: impl Into<String>) {
        self.life.event(at, what, reason);
    }
}
