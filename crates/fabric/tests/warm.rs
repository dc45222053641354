//! Warm standby and failover (`host.warm_standby`), driven through the nodes' public inputs
//! alone: a DPU node and a real spill plane in each of its two slots, joined by a message pump
//! with no latency (every message is delivered at the instant it is polled; timers run in
//! time order). It proves that the warm plane holds a copy of every connection while it waits,
//! that a failover hands it every connection the failed plane owned with its state, that no
//! connection ever has two owners, that a new warm plane takes the freed slot, that messages
//! from the fenced plane neither change ownership nor resurrect stale state, that without a
//! ready warm plane the DPU still fails open, and that per-bucket digests find a copy that
//! drifted and repair it: the warm plane's, the active slot's before its activation, the new
//! active plane's after a flip (without mistaking a change still on its way for a drift), and
//! what a releasing plane hands back.

use core::time::Duration;

use spillway_fabric::dpu::{Command, DpuNode, EventKind, Hold, Phase, Role, Upgrade, Warm};
use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::SpillPlane;
use spillway_fabric::types::{ConnId, ConnPhase, ConnState, Kind, Msg, PlaneSlot, Side, SyncKind};
use spillway_vswitch::{Instant, TenantId};

#[path = "common/train.rs"]
mod train;
use train::train;

fn at(ms: u64) -> Instant {
    Instant(ms * 1_000_000)
}

/// A DPU node and the planes in its two slots, joined without latency.
struct Fabric {
    f: FabricParams,
    dpu: DpuNode,
    planes: [Option<SpillPlane>; 2],
    now: Instant,
    events: Vec<(EventKind, String)>,
    /// Plane starts asked for, by slot.
    starts: [u32; 2],
    /// State messages from a plane to lose on the way (a full flow ring drops them: the flow
    /// vNIC is not the reliable channel), each once.
    lose: Vec<(ConnId, SyncKind)>,
    /// The same from the DPU to either plane.
    lose_to_plane: Vec<(ConnId, SyncKind)>,
    /// Hold what the DPU sends the active plane from its next `DigestAsk` on (in `paused`,
    /// in order) until [`Fabric::resume`].
    pause_at_ask: bool,
    paused: Vec<Msg>,
    /// Hold the planes' digest answers (in `held`, with their slot, in order) until
    /// [`Fabric::release_answers`].
    hold_answers: bool,
    held: Vec<(PlaneSlot, Msg)>,
}

impl Fabric {
    fn new(warm: bool) -> Fabric {
        let mut f = FabricParams::default();
        f.host.warm_standby = warm;
        Fabric {
            dpu: DpuNode::new(&f),
            planes: [None, None],
            now: Instant::ZERO,
            events: Vec::new(),
            starts: [0, 0],
            lose: Vec::new(),
            lose_to_plane: Vec::new(),
            pause_at_ask: false,
            paused: Vec::new(),
            hold_answers: false,
            held: Vec::new(),
            f,
        }
    }

    /// Delivers every message and command until nothing moves.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            let active = self.dpu.active_slot();
            while let Some(t) = self.dpu.poll_transmit() {
                moved = true;
                if (self.pause_at_ask && matches!(t.msg, Msg::DigestAsk { .. }))
                    || !self.paused.is_empty()
                {
                    self.pause_at_ask = false;
                    self.paused.push(t.msg);
                    continue;
                }
                if !self.lost_to_plane(&t.msg)
                    && let Some(p) = &mut self.planes[active.index()]
                {
                    p.handle_msg(self.now, t.msg);
                }
            }
            while let Some(t) = self.dpu.poll_warm_transmit() {
                moved = true;
                if !self.lost_to_plane(&t.msg)
                    && let Some(p) = &mut self.planes[active.other().index()]
                {
                    p.handle_msg(self.now, t.msg);
                }
            }
            while let Some(c) = self.dpu.poll_command() {
                moved = true;
                match c {
                    Command::StartPlane { slot, workers, .. } => {
                        self.starts[slot.index()] += 1;
                        let mut p = SpillPlane::new(&self.f);
                        p.start(self.now, workers);
                        self.planes[slot.index()] = Some(p);
                        self.dpu.handle_plane_up_in(self.now, slot);
                    }
                    Command::StopPlane { slot, .. } => self.planes[slot.index()] = None,
                }
            }
            for i in 0..2 {
                while let Some(t) = self.planes[i].as_mut().and_then(|p| p.poll_transmit()) {
                    moved = true;
                    if let Msg::Sync { kind, state, .. } = t.msg
                        && let Some(k) = self.lose.iter().position(|&l| l == (state.conn, kind))
                    {
                        self.lose.remove(k);
                        continue;
                    }
                    if self.hold_answers
                        && matches!(t.msg, Msg::Digest { .. } | Msg::DigestDone { .. })
                    {
                        self.held.push((PlaneSlot(i as u8), t.msg));
                        continue;
                    }
                    self.dpu
                        .handle_msg_from(self.now, PlaneSlot(i as u8), t.msg);
                }
            }
            while let Some(e) = self.dpu.poll_event() {
                self.events.push((e.what, e.reason));
            }
            if !moved {
                return;
            }
        }
    }

    /// Delivers the held ask to the active plane, its answer to the DPU, and only then what
    /// the DPU sent behind the ask; then everything else.
    fn resume(&mut self) {
        let mut held = std::mem::take(&mut self.paused).into_iter();
        let active = self.dpu.active_slot();
        let ask = held.next().expect("an ask was held");
        self.planes[active.index()]
            .as_mut()
            .expect("an active plane")
            .handle_msg(self.now, ask);
        while let Some(t) = self.planes[active.index()]
            .as_mut()
            .and_then(|p| p.poll_transmit())
        {
            self.dpu.handle_msg_from(self.now, active, t.msg);
        }
        for msg in held {
            self.planes[active.index()]
                .as_mut()
                .expect("an active plane")
                .handle_msg(self.now, msg);
        }
        self.pump();
    }

    /// Delivers the held digest answers, in order, and what they make move.
    fn release_answers(&mut self) {
        self.hold_answers = false;
        for (slot, msg) in std::mem::take(&mut self.held) {
            self.dpu.handle_msg_from(self.now, slot, msg);
        }
        self.pump();
    }

    /// The active plane in slot 0 is killed and the rules flip to the warm one in slot 1.
    fn fail_over(&mut self) {
        let t = self.now;
        self.planes[0] = None;
        self.dpu.handle_plane_failed_in(t, PlaneSlot(0), "killed");
        self.pump();
        self.advance(t + self.f.dpu.flip_latency);
        assert_eq!(self.dpu.active_slot(), PlaneSlot(1));
    }

    /// A change `state` the failed plane of an older colour sent before it was fenced,
    /// arriving now.
    fn late_update(&mut self, state: ConnState) {
        let msg = Msg::Sync {
            colour: stale_colour(),
            kind: SyncKind::Update,
            state,
        };
        self.dpu.handle_fenced_msg(self.now, msg);
    }

    /// Whether `msg`, from the DPU to a plane, is one of `lose_to_plane` (then lost, once).
    fn lost_to_plane(&mut self, msg: &Msg) -> bool {
        if let Msg::Sync { kind, state, .. } = *msg
            && let Some(k) = self
                .lose_to_plane
                .iter()
                .position(|&l| l == (state.conn, kind))
        {
            self.lose_to_plane.remove(k);
            return true;
        }
        false
    }

    /// Runs every timer due up to `until`, in time order.
    fn advance(&mut self, until: Instant) {
        loop {
            let mut next = self.dpu.poll_timeout().map(|t| (t, None));
            for (i, p) in self.planes.iter().enumerate() {
                if let Some(t) = p.as_ref().and_then(|p| p.poll_timeout())
                    && next.is_none_or(|(n, _)| t < n)
                {
                    next = Some((t, Some(i)));
                }
            }
            let Some((t, who)) = next.filter(|(t, _)| *t <= until) else {
                break;
            };
            self.now = self.now.max(t);
            match who {
                None => self.dpu.handle_timeout(self.now),
                Some(i) => self.planes[i]
                    .as_mut()
                    .expect("a plane with a timer")
                    .handle_timeout(self.now),
            }
            self.pump();
        }
        self.now = self.now.max(until);
    }

    fn offer(&mut self, conn: ConnId, kind: Kind, side: Side) {
        let mut t = train(conn, kind, 1, self.now);
        t.side = side;
        self.dpu.handle_train(self.now, &t);
        self.pump();
    }

    fn plane(&self, slot: PlaneSlot) -> &SpillPlane {
        self.planes[slot.index()]
            .as_ref()
            .expect("a plane in the slot")
    }

    /// Every connection has at most one owner among the DPU and the planes.
    fn assert_one_owner(&self) {
        let mut owners = std::collections::BTreeMap::<ConnId, u32>::new();
        for (c, r) in self.dpu.conns_sorted() {
            if r.role == Role::Owner {
                *owners.entry(c).or_default() += 1;
            }
        }
        for p in self.planes.iter().flatten() {
            for (c, r) in p.conns_sorted() {
                if r.role == Role::Owner {
                    *owners.entry(c).or_default() += 1;
                }
            }
        }
        for (c, n) in owners {
            assert!(n <= 1, "{c} has {n} owners");
        }
    }

    /// A fabric (with a warm standby if `warm`) whose plane is active at 100 ms, every bucket
    /// redirected.
    fn active(warm: bool) -> Fabric {
        let mut fab = Fabric::new(warm);
        fab.dpu.handle_hold(at(1), Hold::Active);
        fab.pump();
        fab.advance(at(100));
        assert!(matches!(fab.dpu.phase(), Phase::Active { .. }));
        fab
    }

    /// A fabric with an active plane in slot 0 (every bucket redirected) and a synced warm
    /// plane in slot 1, and `conns` connections opened and established on the active plane.
    fn active_with_warm(conns: u64) -> Fabric {
        let mut fab = Fabric::active(true);
        assert!(
            matches!(fab.dpu.warm(), Warm::Ready { .. }),
            "{:?}",
            fab.dpu.warm()
        );
        for c in 0..conns {
            fab.offer(ConnId(c), Kind::Open, Side::Orig);
            fab.offer(ConnId(c), Kind::Data, Side::Reply);
        }
        fab.advance(at(120));
        fab
    }
}

#[test]
fn the_warm_plane_holds_a_copy_of_every_connection_while_it_waits() {
    let fab = Fabric::active_with_warm(40);
    let (active, warm) = (fab.plane(PlaneSlot(0)), fab.plane(PlaneSlot(1)));
    assert_eq!(active.conns_owned(), 40);
    assert_eq!(warm.conns_owned(), 0, "a warm plane owns nothing");
    for c in 0..40 {
        let a = active.conn(ConnId(c)).expect("opened on the active plane");
        let w = warm.conn(ConnId(c)).expect("relayed to the warm plane");
        assert_eq!(w.role, Role::Copy);
        assert_eq!(w.state, a.state, "{c}: the warm copy is current");
        assert_eq!(w.state.phase, ConnPhase::Established);
    }
    assert!(fab.dpu.counters().relayed >= 80, "{:?}", fab.dpu.counters());
    fab.assert_one_owner();
}

#[test]
fn a_failover_hands_every_connection_to_the_warm_plane_and_starts_a_new_one() {
    let mut fab = Fabric::active_with_warm(40);
    let before: Vec<ConnState> = (0..40)
        .map(|c| fab.plane(PlaneSlot(0)).conn(ConnId(c)).unwrap().state)
        .collect();
    let t = fab.now;
    fab.planes[0] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(0), "killed");
    fab.pump();
    // Until the flip is live the rules still steer to the failed slot: what a driver took
    // back from the failed plane waits.
    assert!(matches!(fab.dpu.warm(), Warm::Flipping { .. }));
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(0));
    assert!(!fab.dpu.takes_reoffers());
    fab.advance(t + fab.f.dpu.flip_latency);
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(1));
    assert!(fab.dpu.takes_reoffers());
    assert!(matches!(fab.dpu.phase(), Phase::Active { .. }));
    assert_eq!(fab.dpu.counters().failovers, 1);
    assert_eq!(fab.dpu.counters().fail_opens, 0);
    let new = fab.plane(PlaneSlot(1));
    for (c, st) in before.iter().enumerate() {
        let r = new.conn(ConnId(c as u64)).expect("the warm plane has it");
        assert_eq!(r.role, Role::Owner, "conn {c}");
        assert_eq!(r.state, *st, "conn {c} continues with its state");
        assert_eq!(fab.dpu.conn(ConnId(c as u64)).unwrap().role, Role::Copy);
    }
    fab.assert_one_owner();
    // The new active plane serves the next packets of the old connections itself.
    let rx = new.counters().rx;
    fab.offer(ConnId(3), Kind::Data, Side::Orig);
    assert_eq!(fab.plane(PlaneSlot(1)).counters().rx, rx + 1);
    assert_eq!(fab.plane(PlaneSlot(1)).counters().punted, 0);
    // A new warm plane in the freed slot, synced with every connection.
    assert_eq!(fab.starts, [2, 1]);
    fab.advance(fab.now + Duration::from_millis(20));
    assert!(
        matches!(fab.dpu.warm(), Warm::Ready { .. }),
        "{:?}",
        fab.dpu.warm()
    );
    let warm = fab.plane(PlaneSlot(0));
    assert_eq!(warm.conns_len(), 40);
    assert_eq!(warm.conns_owned(), 0);
    let kinds: Vec<EventKind> = fab.events.iter().map(|e| e.0).collect();
    assert!(kinds.contains(&EventKind::FailOver), "{kinds:?}");
    assert!(!kinds.contains(&EventKind::FailOpen), "{kinds:?}");
}

#[test]
fn messages_from_the_fenced_plane_change_no_owner() {
    let mut fab = Fabric::active_with_warm(8);
    let stale = fab.plane(PlaneSlot(0)).conn(ConnId(2)).unwrap().state;
    let t = fab.now;
    fab.planes[0] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(0), "stalled");
    fab.advance(t + fab.f.dpu.flip_latency);
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(1));
    // The stalled plane resumes: a recall, a delete, a heartbeat and an old state.
    let fenced = fab.dpu.counters().fenced;
    fab.dpu.handle_fenced_msg(
        fab.now,
        Msg::Recall {
            state: stale,
            pps: 1.0,
            replaces_pps: 0.0,
        },
    );
    fab.dpu.handle_fenced_msg(
        fab.now,
        Msg::Delete {
            seq: 99,
            conn: ConnId(2),
        },
    );
    fab.dpu.handle_fenced_msg(
        fab.now,
        Msg::Heartbeat {
            workers: 1,
            util: 0.0,
        },
    );
    fab.dpu.handle_fenced_msg(
        fab.now,
        Msg::Sync {
            colour: stale_colour(),
            kind: SyncKind::Mirror,
            state: stale,
        },
    );
    fab.pump();
    assert_eq!(fab.dpu.counters().fenced, fenced + 3);
    assert_eq!(fab.dpu.conn(ConnId(2)).unwrap().role, Role::Copy);
    assert_eq!(fab.dpu.conn(ConnId(2)).unwrap().hw_live, 0);
    assert_eq!(
        fab.plane(PlaneSlot(1)).conn(ConnId(2)).unwrap().role,
        Role::Owner
    );
    // A newer state from it (sent before it was fenced) goes on to the new owner.
    let newer = ConnState {
        packets: stale.packets + 5,
        version: stale.version + 1,
        ..stale
    };
    fab.late_update(newer);
    fab.pump();
    assert_eq!(fab.dpu.conn(ConnId(2)).unwrap().role, Role::Copy);
    assert_eq!(
        fab.plane(PlaneSlot(1)).conn(ConnId(2)).unwrap().state,
        newer
    );
    fab.assert_one_owner();
}

fn stale_colour() -> spillway_fabric::types::Colour {
    spillway_fabric::types::Colour(1)
}

#[test]
fn a_failed_warm_plane_is_replaced_and_the_active_one_keeps_serving() {
    let mut fab = Fabric::active_with_warm(4);
    let t = fab.now;
    fab.planes[1] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(1), "killed");
    fab.pump();
    assert_eq!(fab.dpu.warm(), Warm::Off);
    assert!(matches!(fab.dpu.phase(), Phase::Active { .. }));
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(0));
    // The next window asks for a new one, which syncs every connection.
    fab.advance(t + fab.f.sched.window + Duration::from_millis(5));
    assert_eq!(fab.starts[1], 2);
    assert!(
        matches!(fab.dpu.warm(), Warm::Ready { .. }),
        "{:?}",
        fab.dpu.warm()
    );
    assert_eq!(fab.plane(PlaneSlot(1)).conns_len(), 4);
    fab.assert_one_owner();
}

#[test]
fn without_a_ready_warm_plane_the_dpu_fails_open() {
    let mut fab = Fabric::active_with_warm(4);
    // The warm plane dies first; the active one dies before a new warm plane is ready.
    let t = fab.now;
    fab.planes[1] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(1), "killed");
    fab.planes[0] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(0), "killed");
    fab.pump();
    assert_eq!(fab.dpu.phase(), Phase::Idle);
    assert_eq!(fab.dpu.counters().fail_opens, 1);
    assert_eq!(fab.dpu.counters().failovers, 0);
    for c in 0..4 {
        assert_eq!(fab.dpu.conn(ConnId(c)).unwrap().role, Role::Owner);
    }
}

#[test]
fn the_warm_plane_failing_during_the_flip_fails_open_with_every_connection() {
    let mut fab = Fabric::active_with_warm(6);
    let t = fab.now;
    fab.planes[0] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(0), "killed");
    fab.pump();
    assert!(matches!(fab.dpu.warm(), Warm::Flipping { .. }));
    fab.planes[1] = None;
    fab.dpu.handle_plane_failed_in(t, PlaneSlot(1), "killed");
    fab.pump();
    assert_eq!(fab.dpu.phase(), Phase::Idle);
    for c in 0..6 {
        assert_eq!(fab.dpu.conn(ConnId(c)).unwrap().role, Role::Owner);
    }
}

#[test]
fn warm_standby_off_asks_for_one_slot_only() {
    let mut fab = Fabric::new(false);
    fab.dpu.handle_hold(at(1), Hold::Active);
    fab.pump();
    fab.advance(at(100));
    assert!(matches!(fab.dpu.phase(), Phase::Active { .. }));
    assert_eq!(fab.starts, [1, 0]);
    assert_eq!(fab.dpu.warm(), Warm::Off);
    let _ = TenantId(1);
}

#[test]
fn an_online_upgrade_moves_every_connection_to_the_new_plane_and_retires_the_old() {
    let mut fab = Fabric::active_with_warm(30);
    let before: Vec<ConnState> = (0..30)
        .map(|c| fab.plane(PlaneSlot(0)).conn(ConnId(c)).unwrap().state)
        .collect();
    let t = fab.now;
    fab.dpu.handle_upgrade(t);
    fab.pump();
    // The old plane handed everything back; the flip is on its way.
    assert!(
        matches!(fab.dpu.warm(), Warm::Flipping { .. }),
        "{:?}",
        fab.dpu.warm()
    );
    assert_eq!(fab.dpu.upgrade(), Upgrade::Releasing);
    assert_eq!(fab.plane(PlaneSlot(0)).conns_owned(), 0);
    fab.advance(t + fab.f.dpu.flip_latency);
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(1));
    assert!(matches!(fab.dpu.phase(), Phase::Active { .. }));
    assert!(matches!(fab.dpu.upgrade(), Upgrade::Retiring { .. }));
    for (c, st) in before.iter().enumerate() {
        let r = fab.plane(PlaneSlot(1)).conn(ConnId(c as u64)).unwrap();
        assert_eq!(r.role, Role::Owner, "conn {c}");
        assert_eq!(r.state.version, st.version, "conn {c}");
    }
    fab.assert_one_owner();
    // Still there while it retires; stopped a window later, and a new warm plane follows.
    assert!(fab.planes[0].is_some());
    fab.advance(fab.now + fab.f.sched.window + Duration::from_millis(1));
    assert_eq!(fab.dpu.upgrade(), Upgrade::None);
    assert_eq!(fab.starts, [2, 1], "a new warm plane in the old slot");
    fab.advance(fab.now + Duration::from_millis(20));
    assert!(matches!(fab.dpu.warm(), Warm::Ready { .. }));
    assert_eq!(fab.dpu.counters().fail_opens, 0);
    assert_eq!(fab.dpu.counters().failovers, 0);
    fab.assert_one_owner();
    let kinds: Vec<EventKind> = fab.events.iter().map(|e| e.0).collect();
    assert!(kinds.contains(&EventKind::Upgrade), "{kinds:?}");
}

#[test]
fn an_upgrade_without_a_standby_starts_the_new_plane_first_and_one_without_a_plane_is_refused() {
    let mut fab = Fabric::new(false);
    fab.dpu.handle_upgrade(at(1));
    fab.pump();
    assert_eq!(fab.dpu.upgrade(), Upgrade::None);
    assert!(
        fab.events
            .iter()
            .any(|e| e.1.starts_with("upgrade refused")),
        "{:?}",
        fab.events
    );
    fab.dpu.handle_hold(at(2), Hold::Active);
    fab.pump();
    fab.advance(at(100));
    assert_eq!(fab.starts, [1, 0]);
    fab.offer(ConnId(7), Kind::Open, Side::Orig);
    let t = fab.now;
    fab.dpu.handle_upgrade(t);
    fab.pump();
    // The new plane was started for the upgrade, synced, and took over.
    assert_eq!(fab.starts, [1, 1]);
    fab.advance(t + Duration::from_millis(50));
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(1));
    assert_eq!(fab.dpu.upgrade(), Upgrade::None);
    assert_eq!(
        fab.plane(PlaneSlot(1)).conn(ConnId(7)).unwrap().role,
        Role::Owner
    );
    // Without warm standby no new warm plane follows.
    assert_eq!(fab.starts, [1, 1]);
    assert_eq!(fab.dpu.warm(), Warm::Off);
    fab.assert_one_owner();
}

#[test]
fn a_warm_copy_that_drifted_is_found_by_its_bucket_digest_and_resynced() {
    let mut fab = Fabric::active_with_warm(20);
    let checked = fab.dpu.counters().digest_buckets;
    assert!(
        checked >= u64::from(fab.f.dpu.redirect_buckets),
        "{checked}"
    );
    assert_eq!(fab.dpu.counters().digest_mismatch, 0);
    // The warm plane loses one copy and keeps a stale one of a connection nobody has.
    let lost = fab.plane(PlaneSlot(1)).conn(ConnId(4)).unwrap().state;
    let ghost = ConnState {
        conn: ConnId(9_999),
        tenant: TenantId(1),
        phase: ConnPhase::Established,
        packets: 1,
        version: 2,
        opened: fab.now,
    };
    let warm = fab.planes[1].as_mut().unwrap();
    let colour = spillway_fabric::types::Colour(2);
    for (kind, state) in [(SyncKind::Closed, lost), (SyncKind::Mirror, ghost)] {
        warm.handle_msg(
            fab.now,
            Msg::Sync {
                colour,
                kind,
                state,
            },
        );
    }
    assert!(fab.plane(PlaneSlot(1)).conn(ConnId(4)).is_none());
    // The next comparison (every `host.digest_interval`) finds both buckets and resyncs them.
    fab.advance(fab.now + fab.f.host.digest_interval + fab.f.sched.window);
    let c = fab.dpu.counters();
    let buckets = [ConnId(4), ConnId(9_999)].map(|c| c.bucket(fab.f.dpu.redirect_buckets));
    let differ = if buckets[0] == buckets[1] { 1 } else { 2 };
    assert_eq!(c.digest_mismatch, differ, "{c:?}");
    let warm = fab.plane(PlaneSlot(1));
    assert_eq!(warm.conn(ConnId(4)).map(|r| r.state), Some(lost));
    assert!(warm.conn(ConnId(9_999)).is_none(), "the ghost copy is gone");
    assert!(
        fab.events
            .iter()
            .any(|e| e.0 == EventKind::Warm && e.1.contains("digests differed")),
        "{:?}",
        fab.events
    );
    // And the next comparison finds nothing.
    fab.advance(fab.now + fab.f.host.digest_interval + fab.f.sched.window);
    assert_eq!(fab.dpu.counters().digest_mismatch, differ);
}

#[test]
fn a_mirror_lost_in_the_bulk_sync_is_found_by_the_digests_before_activation() {
    let mut fab = Fabric::new(false);
    for c in 0..20 {
        fab.offer(ConnId(c), Kind::Open, Side::Orig);
    }
    fab.advance(at(10));
    // A pre-warm: the plane starts in slot 0 and is bulk-synced, and the mirror of connection
    // 7 is lost on the way (a full flow ring drops it: the flow vNIC is not the reliable
    // channel).
    fab.dpu.handle_hold(fab.now, Hold::Shadow);
    let Some(Command::StartPlane { slot, workers, .. }) = fab.dpu.poll_command() else {
        panic!("no plane asked for");
    };
    let mut p = SpillPlane::new(&fab.f);
    p.start(fab.now, workers);
    fab.planes[slot.index()] = Some(p);
    fab.dpu.handle_plane_up_in(fab.now, slot);
    let mut lost = 0;
    while let Some(t) = fab.dpu.poll_transmit() {
        if let Msg::Sync { state, .. } = t.msg
            && state.conn == ConnId(7)
        {
            lost += 1;
            continue;
        }
        fab.planes[slot.index()]
            .as_mut()
            .unwrap()
            .handle_msg(fab.now, t.msg);
    }
    assert_eq!(lost, 1);
    assert!(fab.plane(slot).conn(ConnId(7)).is_none());
    // Its acknowledgement of the bulk sync makes the DPU compare digests before any
    // activation: the bucket of connection 7 differs and is resynced.
    fab.pump();
    fab.advance(fab.now + Duration::from_millis(50));
    assert!(matches!(
        fab.dpu.phase(),
        Phase::Shadow { synced: true, .. }
    ));
    let c = fab.dpu.counters();
    assert_eq!(c.digest_mismatch, 1, "{c:?}");
    assert_eq!(c.digest_stale, 0, "{c:?}");
    assert!(c.digest_buckets >= u64::from(fab.f.dpu.redirect_buckets));
    assert_eq!(
        fab.plane(slot).conn(ConnId(7)).map(|r| r.state),
        fab.dpu.conn(ConnId(7)).map(|r| r.state),
        "the copy is back"
    );
    assert!(
        fab.events
            .iter()
            .any(|e| e.0 == EventKind::Synced && e.1.contains("before its activation")),
        "{:?}",
        fab.events
    );
    fab.assert_one_owner();
}

#[test]
fn an_upgrade_to_another_binary_replaces_the_ready_warm_plane_before_anything_moves() {
    let mut fab = Fabric::active_with_warm(10);
    assert_eq!(fab.starts, [1, 1]);
    let t = fab.now;
    fab.dpu.handle_upgrade_fresh(t);
    fab.pump();
    // The ready warm plane was stopped and another started in its slot; the active plane
    // handed nothing back before that one was synced.
    assert_eq!(fab.starts, [1, 2], "{:?}", fab.events);
    assert!(
        fab.events
            .iter()
            .any(|e| e.0 == EventKind::Warm && e.1.contains("binary being replaced")),
        "{:?}",
        fab.events
    );
    assert!(
        !fab.events.iter().any(|e| e.1.contains("upgrade abandoned")),
        "{:?}",
        fab.events
    );
    // Synced, handed over, flipped, the old plane retired a window later.
    fab.advance(t + fab.f.sched.window + Duration::from_millis(10));
    assert_eq!(fab.dpu.upgrade(), Upgrade::None);
    assert_eq!(fab.dpu.active_slot(), PlaneSlot(1));
    for c in 0..10 {
        let r = fab.plane(PlaneSlot(1)).conn(ConnId(c)).unwrap();
        assert_eq!(r.role, Role::Owner, "conn {c}");
    }
    assert_eq!(fab.dpu.counters().fail_opens, 0);
    assert_eq!(fab.dpu.counters().upgrades, 1);
    fab.assert_one_owner();
}

#[test]
fn a_hand_back_lost_in_a_release_is_found_by_the_digests_and_sent_again() {
    let mut fab = Fabric::active(false);
    let slot = fab.dpu.active_slot();
    for c in 0..20 {
        fab.offer(ConnId(c), Kind::Open, Side::Orig);
    }
    // Connection 7's change to established never reaches the DPU (its mirror is lost), and
    // neither does its hand-back at the release: the DPU's copy stays as it opened.
    fab.lose = vec![
        (ConnId(7), SyncKind::Mirror),
        (ConnId(7), SyncKind::Handover),
    ];
    for c in 0..20 {
        fab.offer(ConnId(c), Kind::Data, Side::Reply);
    }
    fab.advance(at(120));
    assert_eq!(
        fab.lose,
        [(ConnId(7), SyncKind::Handover)],
        "the mirror was lost"
    );
    let held = fab
        .plane(slot)
        .conn(ConnId(7))
        .expect("the plane owns it")
        .state;
    assert_eq!(held.phase, ConnPhase::Established);
    assert_ne!(fab.dpu.conn(ConnId(7)).map(|r| r.state), Some(held));
    // The release: the hand-back of 7 is lost too; the plane's digest of what it handed back
    // differs from the DPU's records of it in 7's bucket, which the plane sends again.
    fab.dpu.handle_hold(fab.now, Hold::Released);
    fab.pump();
    fab.advance(fab.now + Duration::from_millis(100));
    assert!(fab.lose.is_empty(), "the hand-back was lost");
    assert_eq!(fab.dpu.phase(), Phase::Idle, "{:?}", fab.events);
    let c = fab.dpu.counters();
    assert_eq!(c.digest_mismatch, 1, "{c:?}");
    assert!(c.digest_buckets >= u64::from(fab.f.dpu.redirect_buckets));
    let r = fab.dpu.conn(ConnId(7)).expect("the DPU holds 7");
    assert_eq!(r.state, held, "the plane's state is the DPU's");
    assert_eq!(r.role, Role::Owner);
    let bucket = ConnId(7).bucket(fab.f.dpu.redirect_buckets);
    assert!(
        fab.events.iter().any(|e| e.0 == EventKind::Draining
            && e.1.contains(&format!("differed in 1 buckets ([{bucket}])"))
            && e.1.contains("1 connections handed back again")),
        "{:?}",
        fab.events
    );
    fab.assert_one_owner();
}

#[test]
fn a_release_with_nothing_lost_finds_every_digest_equal() {
    let mut fab = Fabric::active(false);
    for c in 0..50 {
        fab.offer(ConnId(c), Kind::Open, Side::Orig);
        fab.offer(ConnId(c), Kind::Data, Side::Reply);
    }
    fab.advance(at(120));
    fab.dpu.handle_hold(fab.now, Hold::Released);
    fab.pump();
    fab.advance(fab.now + Duration::from_millis(100));
    assert_eq!(fab.dpu.phase(), Phase::Idle, "{:?}", fab.events);
    let c = fab.dpu.counters();
    assert_eq!(c.digest_mismatch, 0, "{c:?}");
    assert!(
        c.digest_buckets >= 2 * u64::from(fab.f.dpu.redirect_buckets),
        "{c:?}"
    );
    for conn in 0..50 {
        assert_eq!(
            fab.dpu.conn(ConnId(conn)).map(|r| r.role),
            Some(Role::Owner)
        );
    }
}

#[test]
fn a_stale_copy_left_by_a_flip_is_found_by_the_digests_after_it() {
    let mut fab = Fabric::active_with_warm(10);
    // Connection 3 steps on (a FIN) on the active plane; the relay of that change to the warm
    // plane is lost on the way, and so is the flip's hand-over of 3 to it: the new plane holds
    // a stale copy of 3.
    fab.lose_to_plane = vec![
        (ConnId(3), SyncKind::Mirror),
        (ConnId(3), SyncKind::Handover),
    ];
    fab.offer(ConnId(3), Kind::Control, Side::Orig);
    let current = fab.plane(PlaneSlot(0)).conn(ConnId(3)).unwrap().state;
    assert_ne!(current.phase, ConnPhase::Established, "the FIN stepped it");
    assert_eq!(fab.dpu.conn(ConnId(3)).map(|r| r.state), Some(current));
    assert_eq!(fab.lose_to_plane, [(ConnId(3), SyncKind::Handover)]);
    fab.fail_over();
    assert!(fab.lose_to_plane.is_empty(), "the hand-over was lost");
    fab.advance(fab.now + Duration::from_millis(5));
    // The digests after the flip differ in 3's bucket: the bucket is resynced, both ways,
    // without moving an owner. The digests cover states, not roles: 3 stays a copy on both
    // sides (served from the plane's, promoted by the DPU at the next release or fail-open).
    let c = fab.dpu.counters();
    assert_eq!(c.digest_mismatch, 1, "{c:?}");
    let r = fab
        .plane(PlaneSlot(1))
        .conn(ConnId(3))
        .expect("the new plane has 3");
    assert_eq!(r.state, current, "the stale copy was replaced");
    for conn in (0..10).filter(|&c| c != 3) {
        let r = fab.plane(PlaneSlot(1)).conn(ConnId(conn)).unwrap();
        assert_eq!(r.role, Role::Owner, "{conn}");
    }
    let bucket = ConnId(3).bucket(fab.f.dpu.redirect_buckets);
    assert!(
        fab.events.iter().any(|e| e.0 == EventKind::FailOver
            && e.1.contains(&format!(
                "after the flip) digests differed in 1 buckets ([{bucket}])"
            ))),
        "{:?}",
        fab.events
    );
    fab.assert_one_owner();
}

#[test]
fn a_change_the_dpu_sends_while_the_digests_travel_leaves_its_bucket_out() {
    let mut fab = Fabric::active_with_warm(10);
    let stale = fab.plane(PlaneSlot(0)).conn(ConnId(5)).unwrap().state;
    fab.pause_at_ask = true;
    fab.fail_over();
    assert!(!fab.paused.is_empty(), "the ask after the flip is held");
    // While the ask is on its way, the failed plane's last change of 5 arrives: the DPU takes
    // it and sends it on to the new owner, behind the ask. The new plane's digest cannot
    // have seen it.
    let newer = ConnState {
        version: stale.version + 1,
        phase: ConnPhase::Closing,
        ..stale
    };
    fab.late_update(newer);
    assert_eq!(fab.dpu.conn(ConnId(5)).unwrap().state, newer);
    fab.resume();
    let c = fab.dpu.counters();
    assert_eq!(c.digest_mismatch, 0, "{c:?}");
    assert_eq!(c.digest_skipped, 1, "{c:?}");
    assert_eq!(
        fab.plane(PlaneSlot(1)).conn(ConnId(5)).unwrap().state,
        newer
    );
    fab.assert_one_owner();
}

#[test]
fn an_answer_to_the_warm_planes_digests_still_on_its_way_at_the_flip_is_not_the_new_ones() {
    let mut fab = Fabric::active_with_warm(10);
    // The warm plane answers a periodic comparison; the answer is slow to arrive.
    fab.hold_answers = true;
    let t = fab.now + fab.f.host.digest_interval;
    fab.advance(t);
    assert!(
        fab.held
            .iter()
            .any(|(s, m)| *s == PlaneSlot(1) && matches!(m, Msg::DigestDone { .. })),
        "{:?}",
        fab.held
    );
    // Then connection 3 steps on (relayed to the warm plane too), the active plane fails, and
    // the new active plane (of the same colour as that answer) is asked after the flip.
    fab.offer(ConnId(3), Kind::Control, Side::Orig);
    fab.fail_over();
    let asked = fab.held.len();
    assert!(asked >= 4, "both answers held: {:?}", fab.held);
    // The old answer (which has not seen 3's step) arrives first: it is not the new
    // comparison's, which the new answer completes with nothing different.
    fab.release_answers();
    let c = fab.dpu.counters();
    assert_eq!(c.digest_mismatch, 0, "{c:?}");
    fab.assert_one_owner();
}
