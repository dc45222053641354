//! The operator's hold (`spillway ctl activate | release | auto`): driven through the DPU node's
//! public inputs alone, an `Active` hold starts a plane, activates it as soon as its bulk sync is
//! acknowledged with every bucket redirected, and keeps it active through idle URSched windows
//! that would otherwise release it; a `Released` hold releases it; after a fail-open under an
//! `Active` hold, the next window prepares a fresh plane.

use core::time::Duration;
use spillway_fabric::dpu::{Command, DpuNode, EventKind, Hold, Phase, Role};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::{Colour, ConnId, Kind, Msg, PlaneSlot};
use spillway_vswitch::Instant;

#[path = "common/train.rs"]
mod train;
use train::train;

fn at(ms: u64) -> Instant {
    Instant(ms * 1_000_000)
}

/// Runs every timer of `dpu` due up to `until`, answering heartbeats as a live plane would.
fn run_until(dpu: &mut DpuNode, until: Instant, heartbeat: bool) {
    while let Some(t) = dpu.poll_timeout() {
        if t > until {
            break;
        }
        if heartbeat {
            dpu.handle_msg(
                t,
                Msg::Heartbeat {
                    workers: 1,
                    util: 0.0,
                },
            );
        }
        dpu.handle_timeout(t);
        while dpu.poll_transmit().is_some() {}
    }
}

fn events(dpu: &mut DpuNode) -> Vec<EventKind> {
    std::iter::from_fn(|| dpu.poll_event())
        .map(|e| e.what)
        .collect()
}

#[test]
fn active_hold_activates_keeps_and_recovers_the_plane() {
    let f = FabricParams::default();
    let mut dpu = DpuNode::new(&f);
    dpu.handle_hold(at(1), Hold::Active);
    assert_eq!(
        dpu.poll_command(),
        Some(Command::StartPlane {
            slot: PlaneSlot(0),
            workers: f.host.workers_initial,
            remote: false,
        })
    );
    assert!(matches!(dpu.phase(), Phase::Preparing { .. }));
    dpu.handle_plane_up(at(50));
    // The bulk sync's end marker goes to the plane; the plane acknowledges it.
    let colour = match dpu.phase() {
        Phase::Shadow { colour, .. } => colour,
        p => panic!("{p:?}"),
    };
    dpu.handle_msg(
        at(51),
        Msg::SyncDone {
            colour,
            count: 0,
            shard: 0,
        },
    );
    let live_at = match dpu.phase() {
        Phase::Activating { live_at, .. } => live_at,
        p => panic!("activation must follow the sync at once: {p:?}"),
    };
    assert_eq!(live_at, at(51) + f.dpu.redirect_latency);
    dpu.handle_timeout(live_at);
    assert!(matches!(dpu.phase(), Phase::Active { .. }));
    assert_eq!(dpu.quota(), f.dpu.redirect_buckets);
    let ev = events(&mut dpu);
    assert!(
        ev.contains(&EventKind::Hold) && ev.contains(&EventKind::Active),
        "{ev:?}"
    );

    // Ten idle seconds: URSched would release, the hold keeps the plane.
    run_until(&mut dpu, at(10_000), true);
    assert!(
        matches!(dpu.phase(), Phase::Active { .. }),
        "{:?}",
        dpu.phase()
    );

    // The plane dies: fail-open, then a fresh plane at the next window.
    dpu.handle_plane_failed(at(10_001), "killed");
    assert_eq!(dpu.phase(), Phase::Idle);
    while dpu.poll_command().is_some() {}
    run_until(
        &mut dpu,
        at(10_001) + f.sched.window + Duration::from_millis(1),
        false,
    );
    assert!(matches!(dpu.phase(), Phase::Preparing { colour } if colour > Colour(1)));
    assert!(matches!(
        dpu.poll_command(),
        Some(Command::StartPlane { .. })
    ));
}

#[test]
fn released_hold_releases_an_active_plane() {
    let f = FabricParams::default();
    let mut dpu = DpuNode::new(&f);
    dpu.handle_hold(at(1), Hold::Active);
    dpu.handle_plane_up(at(2));
    let Phase::Shadow { colour, .. } = dpu.phase() else {
        panic!()
    };
    dpu.handle_msg(
        at(3),
        Msg::SyncDone {
            colour,
            count: 0,
            shard: 0,
        },
    );
    dpu.handle_timeout(at(3) + f.dpu.redirect_latency);
    assert!(matches!(dpu.phase(), Phase::Active { .. }));
    while dpu.poll_transmit().is_some() {}
    dpu.handle_hold(at(20), Hold::Released);
    assert!(
        matches!(dpu.phase(), Phase::Draining { .. }),
        "{:?}",
        dpu.phase()
    );
    assert_eq!(dpu.hold(), Hold::Released);
    assert_eq!(
        dpu.poll_transmit().map(|t| t.msg),
        Some(Msg::Release { colour })
    );
}

#[test]
fn shadow_hold_keeps_a_synced_plane_warm_and_a_later_activation_is_timed_from_its_command() {
    let f = FabricParams::default();
    let mut dpu = DpuNode::new(&f);
    dpu.handle_hold(at(1), Hold::Shadow);
    assert!(matches!(
        dpu.poll_command(),
        Some(Command::StartPlane { .. })
    ));
    dpu.handle_plane_up(at(2));
    let Phase::Shadow { colour, .. } = dpu.phase() else {
        panic!()
    };
    dpu.handle_msg(
        at(3),
        Msg::SyncDone {
            colour,
            count: 0,
            shard: 0,
        },
    );
    // Longer than the shadow idle-out: the hold keeps the plane warm and inactive.
    let until = at(3) + f.sched.shadow_idle + Duration::from_secs(1);
    run_until(&mut dpu, until, true);
    assert!(
        matches!(dpu.phase(), Phase::Shadow { synced: true, .. }),
        "{:?}",
        dpu.phase()
    );
    while dpu.poll_event().is_some() {}
    dpu.handle_hold(until, Hold::Active);
    let Phase::Activating { live_at, .. } = dpu.phase() else {
        panic!("{:?}", dpu.phase())
    };
    dpu.handle_timeout(live_at);
    let active = std::iter::from_fn(|| dpu.poll_event())
        .find(|e| e.what == EventKind::Active)
        .expect("active");
    // Warm: timed from the operator's command, not from the pre-warm.
    assert_eq!(active.since, Some(until));
    assert_eq!(active.at - until, f.dpu.redirect_latency);
}

/// A connection the DPU's SoC opened just before an activation still has its hardware inserts
/// queued when every bucket is redirected; the hand-over leaves it on the DPU (it is on its way
/// to the fast path), and its packets that miss the table until the entries are live are the
/// SoC's: steered, the plane would only punt them back, and they could still be on their way
/// when the connection's close took the fast path and removed their state.
#[test]
fn a_connection_whose_entries_are_on_their_way_stays_on_the_dpu_when_redirected() {
    let mut f = FabricParams::default();
    // Inserts slower than the redirect rules: the entries are still queued when they go live
    // (as with a busy insertion engine, or a recall just before a quota change).
    f.dpu.insert_latency = f.dpu.redirect_latency * 4;
    f.validate().expect("valid parameters");
    let mut dpu = DpuNode::new(&f);
    let conn = ConnId(7);
    dpu.handle_train(at(0), &train(conn, Kind::Open, 1, at(0)));
    dpu.handle_hold(at(0), Hold::Active);
    dpu.handle_plane_up(at(0));
    let colour = match dpu.phase() {
        Phase::Shadow { colour, .. } => colour,
        p => panic!("{p:?}"),
    };
    dpu.handle_msg(
        at(0),
        Msg::SyncDone {
            colour,
            count: 1,
            shard: 0,
        },
    );
    let live_at = match dpu.phase() {
        Phase::Activating { live_at, .. } => live_at,
        p => panic!("{p:?}"),
    };
    dpu.handle_timeout(live_at);
    assert!(matches!(dpu.phase(), Phase::Active { .. }));
    assert_eq!(
        dpu.quota(),
        f.dpu.redirect_buckets,
        "every bucket redirected"
    );
    let c = dpu.conn(conn).expect("the DPU keeps it");
    assert!(
        c.role == Role::Owner && c.hw_live == 0 && c.inserts_pending > 0,
        "still on its way to the table: {c:?}"
    );
    let steered = dpu.counters().steered;
    dpu.handle_train(live_at, &train(conn, Kind::Data, 5, live_at));
    assert_eq!(dpu.delivered_last(), 5, "the SoC served the miss");
    assert_eq!(dpu.counters().steered, steered, "nothing went to the plane");
    // A new connection in a redirected bucket still goes to the plane.
    dpu.handle_train(live_at, &train(ConnId(8), Kind::Open, 1, live_at));
    assert_eq!(dpu.counters().steered, steered + 1);
}
