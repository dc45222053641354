//! The DPU node and the spill plane split over two shards (`fabric.dpu.shards = 2`, ADR
//! 0011): one lifecycle over both, one budget for the DPU's limits and one for the plane's.
//! The built-in scenarios that activate, release and fail open run through the engine's
//! checkers after every event (every connection's state in exactly one owner, resource
//! bounds, memory accounting), and their figures stay those of one shard where the split has
//! nothing to change: the same packets offered, no loss where one shard loses none, the same
//! activation time. Where the split is real they stay close: each shard's flow vNIC carries
//! its own syncs, recalls and acknowledgements at its own rate, so entries reach the fast
//! path at slightly different times (a few packets in millions).

use spillway_sim::report::RunReport;
use spillway_sim::scenario::Scenario;

/// `two` within `rel` of `one`, relatively.
fn assert_close(two: f64, one: f64, rel: f64, what: &str) {
    assert!(
        (two - one).abs() <= rel * one.abs(),
        "{what}: {two} with two shards against {one} with one"
    );
}

fn run(name: &str, shards: u32) -> RunReport {
    let mut sc = Scenario::builtin(name).unwrap();
    sc.fabric.dpu.shards = shards;
    spillway_sim::run(&sc, sc.seed, false, &mut |_| {}).unwrap_or_else(|e| {
        panic!(
            "{name} with {shards} shards: {e}\nrepro: a copy of scenarios/{name}.toml with \
             `[fabric.dpu] shards = {shards}`, run with `spillway sim --config FILE --seed {}`",
            sc.seed
        )
    })
}

#[test]
fn a_micro_burst_over_two_shards_carries_what_one_shard_carries() {
    let (one, two) = (run("micro-burst", 1), run("micro-burst", 2));
    assert_eq!(two.offered_packets, one.offered_packets);
    assert_eq!(two.lost_packets, 0, "drops {:?}", two.drops);
    assert_close(two.dpu_mpps, one.dpu_mpps, 1e-4, "DPU Mpps");
    assert_close(two.host_mpps, one.host_mpps, 1e-4, "plane Mpps");
    assert_eq!(two.activation_ms, one.activation_ms);
    assert!(two.release_ms.is_some(), "released: {:?}", two.phases);
}

#[test]
fn activation_and_release_over_two_shards_lose_nothing() {
    let r = run("release", 2);
    assert_eq!(r.lost_packets, 0, "drops {:?}", r.drops);
    assert_eq!(r.drops["fabric.no_state"], 0);
    assert!(r.release_ms.is_some(), "released: {:?}", r.phases);
    assert!(r.counters["spill.handover"] > 0, "connections handed back");
}

#[test]
fn a_fail_open_over_two_shards_takes_over_every_mirror() {
    let r = run("fail-open", 2);
    let fail = r
        .phases
        .iter()
        .find(|p| p.phase == "fail_open")
        .expect("fail-open happened");
    // "...; redirect rules removed, N connections taken over from mirrors"
    let taken: u64 = fail
        .reason
        .split(", ")
        .last()
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {:?}", fail.reason));
    assert!(taken > 0, "the mirrors of both shards: {}", fail.reason);
    assert_eq!(
        r.drops["fabric.no_state"], 0,
        "no connection lost its state"
    );
    assert!(
        r.phases
            .iter()
            .skip_while(|p| p.phase != "fail_open")
            .any(|p| p.phase == "absorbing"),
        "a new plane absorbs the overflow again: {:?}",
        r.phases
    );
}

/// An overloaded fast path sheds the highest-rate connections over every shard, not shard by
/// shard: the noisy tenant's burst over two shards sheds about as many connections and loses
/// about as many packets as over one. (Shard by shard, it lost 6% fewer: each shard shed its
/// own highest rates, not the DPU's.)
#[test]
fn a_shed_over_two_shards_chooses_what_one_shard_chooses() {
    let (one, two) = (run("noisy-tenant", 1), run("noisy-tenant", 2));
    assert!(one.counters["dpu.shed"] > 0, "the scenario sheds");
    let shed = |r: &RunReport| r.counters["dpu.shed"] as f64;
    assert_close(shed(&two), shed(&one), 0.01, "connections shed");
    assert_close(
        two.lost_packets as f64,
        one.lost_packets as f64,
        0.01,
        "packets lost",
    );
    assert_close(two.dpu_mpps, one.dpu_mpps, 1e-3, "DPU Mpps");
}
