//! Per-tenant fairness.
//!
//! - Of recalls (`placement.tenant_recall_share`) on `noisy-tenant` with first-come
//!   placement: without it the bursty tenant's recalled flows overflow the fast path (and,
//!   here, the loss is all its own); with half the recall room per tenant nothing is lost, the
//!   quota is what held recalls back, and the loss accounting by tenant agrees with the drops.
//! - Of the plane's workers (`host.tenant_worker_share`) on `two-tenants`: without it the
//!   noisy tenant's flood fills the workers' queue and the quiet tenant loses packets there;
//!   with it the quiet tenant loses none, and the per-tenant figures add up to the run's.

use spillway_fabric::params::PlacementKind;
use spillway_sim::scenario::Scenario;

/// Runs built-in scenario `name` after `tweak`, at its own seed.
fn run_with(name: &str, tweak: impl FnOnce(&mut Scenario)) -> spillway_sim::report::RunReport {
    let mut sc = Scenario::builtin(name).unwrap();
    tweak(&mut sc);
    spillway_sim::run(&sc, sc.seed, false, &mut |_| {}).unwrap_or_else(|e| {
        panic!(
            "{e}\nrepro: spillway sim --scenario {name} --seed {}",
            sc.seed
        )
    })
}

fn run(share: f64) -> spillway_sim::report::RunReport {
    run_with("noisy-tenant", |sc| {
        sc.fabric.placement.policy = PlacementKind::FirstCome;
        sc.fabric.placement.tenant_recall_share = share;
    })
}

#[test]
fn a_tenant_share_of_the_recall_room_keeps_the_bursty_tenant_off_the_fast_path() {
    let off = run(1.0);
    let on = run(0.5);
    eprintln!(
        "off: lost {} {:?} p99 {:.0} us; on: lost {} held back {} p99 {:.0} us",
        off.lost_packets,
        off.hw_overload_by_tenant,
        off.latency_us.p99,
        on.lost_packets,
        on.counters["spill.placement.tenant_quota"],
        on.latency_us.p99
    );
    assert!(off.drops["dpu.hw.overload"] > 0, "{:?}", off.drops);
    assert_eq!(off.counters["spill.placement.tenant_quota"], 0);
    // Whose packets the overload cost adds up to the overload's drops.
    let by_tenant: u64 = off.hw_overload_by_tenant.values().sum();
    assert_eq!(by_tenant, off.drops["dpu.hw.overload"]);
    assert_eq!(on.lost_packets, 0, "{:?}", on.drops);
    assert!(on.hw_overload_by_tenant.is_empty());
    assert!(on.counters["spill.placement.tenant_quota"] > 0);
    assert!(on.counters["dpu.recall.ok"] < off.counters["dpu.recall.ok"]);
}

fn two_tenants(worker_share: f64) -> spillway_sim::report::RunReport {
    run_with("two-tenants", |sc| {
        sc.fabric.host.tenant_worker_share = worker_share
    })
}

#[test]
fn a_tenant_share_of_the_plane_workers_keeps_the_quiet_tenant_whole() {
    let on_share = Scenario::builtin("two-tenants")
        .unwrap()
        .fabric
        .host
        .tenant_worker_share;
    assert!(on_share < 1.0, "the scenario ships with the share on");
    let off = two_tenants(1.0);
    let on = two_tenants(on_share);
    for (name, r) in [("off", &off), ("on", &on)] {
        let quiet = &r.by_tenant[&1];
        let noisy = &r.by_tenant[&2];
        eprintln!(
            "{name}: quiet lost {} p99 {:.0} us; noisy lost {} p99 {:.0} us; drops {:?}",
            quiet.lost, quiet.latency_us.p99, noisy.lost, noisy.latency_us.p99, r.drops
        );
        // Every packet delivered and every loss to a full resource belongs to one tenant.
        let delivered: u64 = r.by_tenant.values().map(|t| t.delivered).sum();
        let lost: u64 = r.by_tenant.values().map(|t| t.lost).sum();
        assert_eq!(delivered, r.delivered_packets, "{name}");
        assert_eq!(lost, r.lost_packets, "{name}: {:?}", r.drops);
    }
    // Without the share the flood costs the quiet tenant packets at the full queue.
    assert!(off.drops["spill.queue_full"] > 0, "{:?}", off.drops);
    assert!(off.by_tenant[&1].lost > 0);
    assert_eq!(off.drops["spill.tenant_share"], 0);
    // With it the noisy tenant loses its own packets, the quiet tenant none, and no packet
    // finds the queue full.
    assert_eq!(on.by_tenant[&1].lost, 0, "{:?}", on.drops);
    assert_eq!(on.by_tenant[&2].lost, on.drops["spill.tenant_share"]);
    assert_eq!(on.drops["spill.queue_full"], 0);
    // The noisy tenant's queue stays short: its tail latency falls too.
    assert!(on.by_tenant[&2].latency_us.p99 < off.by_tenant[&2].latency_us.p99);
}
