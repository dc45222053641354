//! Per-tenant fairness of recalls (`placement.tenant_recall_share`) on `noisy-tenant` with
//! first-come placement: without it the bursty tenant's recalled flows overflow the fast path
//! (and, here, the loss is all its own); with half the recall room per tenant nothing is lost,
//! the quota is what held recalls back, and the loss accounting by tenant agrees with the drops.

use spillway_fabric::params::PlacementKind;
use spillway_sim::scenario::Scenario;

fn run(share: f64) -> spillway_sim::report::RunReport {
    let mut sc = Scenario::builtin("noisy-tenant").unwrap();
    sc.fabric.placement.policy = PlacementKind::FirstCome;
    sc.fabric.placement.tenant_recall_share = share;
    spillway_sim::run(&sc, sc.seed, false, &mut |_| {}).unwrap_or_else(|e| {
        panic!(
            "{e}\nrepro: spillway sim --scenario noisy-tenant --seed {}",
            sc.seed
        )
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
