//! A plane on a remote pool host, driven through the DPU node's public inputs alone: an
//! overloaded DPU (a train of far more packets a millisecond than the fast path serves) on a
//! host whose tenants leave no isolatable core falls back and wants cores from the pool; once
//! the driver reports the pool's grant, URSched prepares the plane there and the node's
//! `StartPlane` says so, as does the warm standby plane's. When the host has isolatable cores
//! again for `release_windows` windows the remote plane is released and stopped, while the
//! pool's cores stay wanted until the idle countdown ends. With isolatable cores of its own
//! the host starts its plane locally, grant or not.

use spillway_fabric::dpu::{Command, DpuNode, EventKind, Phase};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::{ConnId, Kind, Msg, PlaneSlot};
use spillway_vswitch::Instant;

#[path = "common/train.rs"]
mod train;
use train::train;

fn at(ms: u64) -> Instant {
    Instant(ms * 1_000_000)
}

/// Overloads `dpu` every millisecond of `from..to` (timers run in time order), and returns
/// the commands and events it emitted.
fn overload(dpu: &mut DpuNode, from: u64, to: u64) -> (Vec<Command>, Vec<(EventKind, String)>) {
    let (mut commands, mut events) = (Vec::new(), Vec::new());
    for ms in from..to {
        while let Some(t) = dpu.poll_timeout() {
            if t > at(ms) {
                break;
            }
            dpu.handle_timeout(t);
        }
        let kind = if ms == 0 { Kind::Open } else { Kind::Data };
        dpu.handle_train(at(ms), &train(ConnId(1), kind, 20_000, at(ms)));
        while dpu.poll_transmit().is_some() {}
        commands.extend(std::iter::from_fn(|| dpu.poll_command()));
        events.extend(std::iter::from_fn(|| dpu.poll_event()).map(|e| (e.what, e.reason)));
    }
    (commands, events)
}

/// Runs every timer of `dpu` due up to `until`, answering heartbeats as a live plane would;
/// returns the commands and events.
fn idle_until(dpu: &mut DpuNode, until: Instant) -> (Vec<Command>, Vec<(EventKind, String)>) {
    let (mut commands, mut events) = (Vec::new(), Vec::new());
    while let Some(t) = dpu.poll_timeout() {
        if t > until {
            break;
        }
        let heartbeat = Msg::Heartbeat {
            workers: 2,
            util: 0.0,
        };
        dpu.handle_msg(t, heartbeat);
        dpu.handle_timeout(t);
        while dpu.poll_transmit().is_some() {}
        commands.extend(std::iter::from_fn(|| dpu.poll_command()));
        events.extend(std::iter::from_fn(|| dpu.poll_event()).map(|e| (e.what, e.reason)));
    }
    (commands, events)
}

#[test]
fn a_pool_grant_starts_the_plane_and_its_warm_standby_on_the_pool() {
    let mut f = FabricParams::default();
    f.host.warm_standby = true;
    let mut dpu = DpuNode::new(&f);
    dpu.set_tenant_cores(f.host.cores - f.host.reserve_cores);
    assert_eq!(dpu.isolatable_cores(), 0);

    // No grant yet: a fallback, noted once, and the cores wanted from the pool.
    let (commands, events) = overload(&mut dpu, 0, 100);
    assert!(commands.is_empty(), "{commands:?}");
    let fallbacks = events
        .iter()
        .filter(|(what, _)| *what == EventKind::Fallback)
        .count();
    assert_eq!(fallbacks, 1, "{events:?}");
    assert_eq!(dpu.phase(), Phase::Idle);
    assert_eq!(dpu.remote_wanted(), Some(f.host.workers_initial));

    // The pool grants two cores: the plane starts there.
    dpu.set_remote_grant(Some(2));
    let (commands, events) = overload(&mut dpu, 100, 120);
    assert_eq!(
        commands,
        [Command::StartPlane {
            slot: PlaneSlot(0),
            workers: 2,
            remote: true,
        }]
    );
    assert!(dpu.plane_remote());
    assert!(matches!(dpu.phase(), Phase::Preparing { .. }));
    let (_, reason) = events
        .iter()
        .find(|(what, _)| *what == EventKind::Preparing)
        .expect("a preparing event");
    assert!(
        reason.contains("to 2 remote pool cores because 0 isolatable host cores")
            && reason.ends_with("starting plane with 2 workers on the remote pool"),
        "{reason}"
    );
    assert!(!events.iter().any(|(what, _)| *what == EventKind::Fallback));
    assert_eq!(dpu.remote_wanted(), Some(f.host.workers_initial));

    // Up: the warm standby plane starts where the active one runs.
    dpu.handle_plane_up(at(120));
    assert_eq!(
        dpu.poll_command(),
        Some(Command::StartPlane {
            slot: PlaneSlot(1),
            workers: f.host.warm_workers,
            remote: true,
        })
    );
    dpu.check_invariants().unwrap();
}

#[test]
fn a_host_with_cores_of_its_own_starts_its_plane_locally_grant_or_not() {
    let f = FabricParams::default();
    let mut dpu = DpuNode::new(&f);
    assert!(dpu.isolatable_cores() > 0);
    dpu.set_remote_grant(Some(2));
    let (commands, _) = overload(&mut dpu, 0, 100);
    assert_eq!(
        commands,
        [Command::StartPlane {
            slot: PlaneSlot(0),
            workers: f.host.workers_initial,
            remote: false,
        }]
    );
    assert!(!dpu.plane_remote());
    assert_eq!(dpu.remote_wanted(), None);
}

/// A node whose plane is up at 60 ms after an overload: on the pool (no isolatable core, a
/// grant of 2) or, with `remote` false, on this host. Checks the `StartPlane` said so.
fn plane_up(f: &FabricParams, remote: bool) -> DpuNode {
    let mut dpu = DpuNode::new(f);
    if remote {
        dpu.set_tenant_cores(f.host.cores - f.host.reserve_cores);
        dpu.set_remote_grant(Some(2));
    }
    let (commands, _) = overload(&mut dpu, 0, 60);
    assert!(
        matches!(commands[..], [Command::StartPlane { remote: r, .. }] if r == remote),
        "{commands:?}"
    );
    dpu.handle_plane_up(at(60));
    dpu
}

#[test]
fn a_remote_plane_comes_home_when_the_host_has_cores_again() {
    let f = FabricParams::default();
    let mut dpu = plane_up(&f, true);
    let Phase::Shadow { colour, .. } = dpu.phase() else {
        panic!("{:?}", dpu.phase());
    };
    // The load is gone, the plane synced and kept in shadow (it idles out only after
    // `shadow_idle`); still no core here, so it stays on the pool.
    idle_until(&mut dpu, at(200));
    let synced = Msg::SyncDone {
        colour,
        count: 0,
        shard: 0,
    };
    dpu.handle_msg(at(200), synced);
    assert!(matches!(dpu.phase(), Phase::Shadow { synced: true, .. }));
    assert!(dpu.plane_remote());
    // The tenants free cores: `release_windows` windows later the plane goes home.
    dpu.set_tenant_cores(40);
    let window_ms = f.sched.window.as_millis() as u64;
    let home = 200 + window_ms * u64::from(f.sched.release_windows + 1);
    let (commands, events) = idle_until(&mut dpu, at(home));
    assert_eq!(dpu.phase(), Phase::Idle);
    assert!(!dpu.plane_remote());
    assert_eq!(
        commands,
        [Command::StopPlane {
            slot: PlaneSlot(0),
            failed: false,
        }]
    );
    let (_, reason) = events
        .iter()
        .find(|(what, _)| *what == EventKind::Idle)
        .expect("an idle event");
    assert!(
        reason.contains("16 isolatable host cores again")
            && reason.contains("overflow comes home from the remote pool"),
        "{reason}"
    );
    // The reservation outlives the plane by the idle countdown.
    assert_eq!(dpu.remote_wanted(), Some(f.host.workers_initial));
    let end = home + window_ms * u64::from(f.sched.release_windows + 1);
    idle_until(&mut dpu, at(end));
    assert_eq!(dpu.remote_wanted(), None);
    dpu.check_invariants().unwrap();
}

/// Runs every timer of `dpu` due up to `until` with no heartbeat from the plane; returns the
/// events.
fn silent_until(dpu: &mut DpuNode, until: Instant) -> Vec<(EventKind, String)> {
    let mut events = Vec::new();
    while let Some(t) = dpu.poll_timeout() {
        if t > until {
            break;
        }
        dpu.handle_timeout(t);
        while dpu.poll_transmit().is_some() {}
        while dpu.poll_command().is_some() {}
        events.extend(std::iter::from_fn(|| dpu.poll_event()).map(|e| (e.what, e.reason)));
    }
    events
}

#[test]
fn a_remote_plane_is_allowed_the_remote_heartbeat_and_a_local_one_is_not() {
    let f = FabricParams::default();
    assert!(f.host.remote_heartbeat > f.host.heartbeat * 10);
    let gap_ms = (3 * f.host.heartbeat.as_millis() as u64) * 3;
    assert!(gap_ms < 3 * f.host.remote_heartbeat.as_millis() as u64);
    for (remote, fails) in [(true, false), (false, true)] {
        let mut dpu = plane_up(&f, remote);
        // Three local heartbeats' worth of silence, three times over.
        let events = silent_until(&mut dpu, at(60 + gap_ms));
        let failed = events.iter().any(|(what, _)| *what == EventKind::FailOpen);
        assert_eq!(failed, fails, "remote {remote}: {events:?}");
        if remote {
            // Past three remote periods it fails too.
            let late = 60 + 3 * f.host.remote_heartbeat.as_millis() as u64 + 10;
            let events = silent_until(&mut dpu, at(late));
            assert!(
                events.iter().any(|(what, _)| *what == EventKind::FailOpen),
                "{events:?}"
            );
        }
    }
}

#[test]
fn a_remote_plane_that_fails_voids_the_pools_grant_on_every_path() {
    let f = FabricParams::default();
    // The plane dies (the driver's report), or stalls (its heartbeats stop).
    for died in [true, false] {
        let mut dpu = plane_up(&f, true);
        let end = if died {
            dpu.handle_plane_failed(at(61), "the relay exited");
            61
        } else {
            let late = 60 + 3 * f.host.remote_heartbeat.as_millis() as u64 + 10;
            silent_until(&mut dpu, at(late));
            late
        };
        assert_eq!(dpu.phase(), Phase::Idle, "died {died}");
        // Still overloaded, still no core here: no plane on that pool again, a fallback.
        let (commands, events) = overload(&mut dpu, end + 1, end + 200);
        assert!(
            !commands
                .iter()
                .any(|c| matches!(c, Command::StartPlane { .. })),
            "died {died}: {commands:?}"
        );
        assert!(
            events.iter().any(|(what, _)| *what == EventKind::Fallback),
            "died {died}: {events:?}"
        );
        assert_eq!(dpu.remote_wanted(), Some(f.host.workers_initial));
        // A new grant (another pool) starts one there.
        dpu.set_remote_grant(Some(2));
        let (commands, _) = overload(&mut dpu, end + 200, end + 260);
        assert!(
            commands
                .iter()
                .any(|c| matches!(c, Command::StartPlane { remote: true, .. })),
            "died {died}: {commands:?}"
        );
    }
}
