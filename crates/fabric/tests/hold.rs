//! The operator's hold (`spillway ctl activate | release | auto`): driven through the DPU node's
//! public inputs alone, an `Active` hold starts a plane, activates it as soon as its bulk sync is
//! acknowledged with every bucket redirected, and keeps it active through idle URSched windows
//! that would otherwise release it; a `Released` hold releases it; after a fail-open under an
//! `Active` hold, the next window prepares a fresh plane.

use core::time::Duration;
use spillway_fabric::dpu::{Command, DpuNode, EventKind, Hold, Phase};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::{Colour, Msg};
use spillway_vswitch::Instant;

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
            workers: f.host.workers_initial
        })
    );
    assert!(matches!(dpu.phase(), Phase::Preparing { .. }));
    dpu.handle_plane_up(at(50));
    // The bulk sync's end marker goes to the plane; the plane acknowledges it.
    let colour = match dpu.phase() {
        Phase::Shadow { colour, .. } => colour,
        p => panic!("{p:?}"),
    };
    dpu.handle_msg(at(51), Msg::SyncDone { colour, count: 0 });
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
    dpu.handle_msg(at(3), Msg::SyncDone { colour, count: 0 });
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
    dpu.handle_msg(at(3), Msg::SyncDone { colour, count: 0 });
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
