//! The acceptance figures, as model results: the built-in scenarios run at paper scale
//! and their reports are checked against the paper's numbers (micro-burst split, zero loss,
//! activation and release timing), against the DPU-only baseline on the same seed, and for the
//! connection-rate sweep (scaled by 1/10 in every rate and cost, so the ratios are the same and
//! the test is fast). Every run also passes the engine's checkers after every event.

use spillway_sim::scenario::Scenario;

fn run(name: &str, dpu_only: bool) -> spillway_sim::report::RunReport {
    let sc = Scenario::builtin(name).unwrap();
    spillway_sim::run(&sc, sc.seed, dpu_only, &mut |_| {}).unwrap_or_else(|e| {
        panic!(
            "{name}: {e}\nrepro: spillway sim --scenario {name} --seed {}",
            sc.seed
        )
    })
}

#[test]
fn micro_burst_dpu_carries_its_limit_and_the_plane_the_rest_without_loss() {
    let r = run("micro-burst", false);
    assert!(
        (9.1..9.3).contains(&r.offered_mpps),
        "offered {}",
        r.offered_mpps
    );
    assert!((6.9..=7.2).contains(&r.dpu_mpps), "dpu {}", r.dpu_mpps);
    assert!((1.9..=2.3).contains(&r.host_mpps), "host {}", r.host_mpps);
    assert_eq!(r.lost_packets, 0, "drops {:?}", r.drops);
    // Cold activation: plane start (200 ms) + sync + rule injection (10 ms).
    let act = r.activation_ms.expect("the plane absorbed the overflow");
    assert!((205.0..260.0).contains(&act), "activation {act} ms");
    assert_eq!(r.rule_injection_ms, Some(10.0));
    assert!(
        r.release_ms.is_some(),
        "the plane is released after the burst"
    );
    assert!(
        r.phases
            .iter()
            .any(|p| p.phase == "idle" && p.reason.contains("drained"))
    );

    let base = run("micro-burst", true);
    assert_eq!(
        base.offered_packets, r.offered_packets,
        "same seed, same workload"
    );
    assert!(
        (7.1..=7.25).contains(&base.dpu_mpps),
        "dpu-only {}",
        base.dpu_mpps
    );
    assert!(
        base.lost_packets > 1_000_000,
        "the DPU alone loses the excess: {}",
        base.lost_packets
    );
    assert!(base.drops["dpu.hw.overload"] > 1_000_000);
}

#[test]
fn activation_and_release_lose_nothing_and_keep_every_connection_state() {
    let r = run("release", false);
    assert_eq!(r.lost_packets, 0, "drops {:?}", r.drops);
    assert_eq!(r.drops["fabric.no_state"], 0);
    assert!(r.activation_ms.is_some());
    assert!(r.release_ms.is_some(), "released: {:?}", r.phases);
    let handed_back = r.counters["spill.handover"];
    assert!(handed_back > 0, "the plane handed connections back");
}

#[test]
fn a_steady_mix_inside_the_dpu_limits_never_starts_the_plane() {
    let r = run("steady-mix", false);
    assert_eq!(r.lost_packets, 0);
    assert!(r.phases.is_empty(), "{:?}", r.phases);
    assert!(
        r.drops["policy.deny"] > 0,
        "denied connections are policy drops, not losses"
    );
}

#[test]
fn a_killed_plane_fails_open_and_the_fabric_recovers() {
    let r = run("fail-open", false);
    let kinds: Vec<&str> = r.phases.iter().map(|p| p.phase).collect();
    let fo = kinds
        .iter()
        .position(|k| *k == "fail_open")
        .expect("fail-open happened");
    assert!(
        kinds[fo..].contains(&"absorbing"),
        "a new plane absorbs the overflow again: {kinds:?}"
    );
    // What is lost is counted: the plane's in-flight packets and the overload until the new
    // plane is active; no connection lost its state.
    assert_eq!(r.drops["fabric.no_state"], 0);
    assert!(
        r.lost_packets < r.offered_packets / 50,
        "lost {}",
        r.lost_packets
    );
}

#[test]
fn a_warm_standby_takes_over_a_killed_plane_within_a_few_milliseconds() {
    let cold = run("fail-open", false);
    let warm = run("failover-warm", false);
    let kinds: Vec<&str> = warm.phases.iter().map(|p| p.phase).collect();
    assert!(kinds.contains(&"fail_over"), "{kinds:?}");
    assert!(!kinds.contains(&"fail_open"), "{kinds:?}");
    assert_eq!(warm.counters["dpu.failover"], 1);
    assert_eq!(warm.drops["fabric.no_state"], 0);
    let (c, w) = (cold.takeover.unwrap(), warm.takeover.unwrap());
    assert_eq!((c.kind, w.kind), ("fail_open", "fail_over"));
    // The target: a forwarding gap of at most 10 ms in the model, against the cold
    // path's plane start (about 220 ms).
    let gap = w.gap_ms.expect("the warm plane served the overflow");
    assert!(gap <= 10.0, "warm gap {gap} ms");
    assert!(c.gap_ms.unwrap() > 200.0, "{c:?}");
    // Only the packets inside the dead plane and those steered to it during the flip are lost.
    assert!(
        warm.lost_packets * 100 < cold.lost_packets,
        "warm lost {}, cold {}",
        warm.lost_packets,
        cold.lost_packets
    );
    assert_eq!(warm.drops["dpu.hw.overload"], 0);
    assert_eq!(w.standby_cores, 1);
}

#[test]
fn an_online_upgrade_under_load_loses_nothing() {
    let r = run("upgrade", false);
    let kinds: Vec<&str> = r.phases.iter().map(|p| p.phase).collect();
    assert!(
        !kinds.contains(&"fail_open") && !kinds.contains(&"fail_over"),
        "{kinds:?}"
    );
    let u = r.takeover.expect("the upgrade is reported");
    assert_eq!(u.kind, "upgrade");
    assert_eq!(r.lost_packets, 0, "{:?}", r.drops);
    assert_eq!(u.lost_packets, 0);
    let gap = u.gap_ms.expect("the new plane served the overflow");
    assert!(gap <= 10.0, "upgrade gap {gap} ms");
    assert_eq!(r.counters["dpu.failover"], 0);
    assert_eq!(r.counters["dpu.upgrade"], 1, "{kinds:?}");
    assert!(
        kinds.contains(&"upgrade_asked") && kinds.contains(&"upgraded"),
        "{kinds:?}"
    );
}

#[test]
fn a_stalled_plane_is_found_by_its_heartbeats_and_failed_over() {
    let r = run("stall", false);
    let s = r.takeover.expect("the stall is acted on");
    assert_eq!(s.kind, "fail_over");
    // Three missed 5 ms heartbeats, seen at the next 10 ms URSched window.
    assert!(
        s.detected_ms > 15.0 && s.detected_ms <= 25.0,
        "{}",
        s.detected_ms
    );
    let gap = s.gap_ms.unwrap();
    assert!(gap < s.detected_ms + 5.0, "gap {gap} ms");
    assert_eq!(r.drops["fabric.no_state"], 0);
    // What was steered to the stalled plane before it was found is lost, and nothing else.
    assert_eq!(r.lost_packets, r.drops["spill.failed"]);
}

#[test]
fn cps_grows_with_host_workers_until_a_documented_bottleneck_caps_it() {
    // The built-in sweep at full scale on fewer points and a narrower search, so the test stays
    // short: 0 (DPU only), 4 and 16 workers, 0.5M-2.5M connections/s in 6 bisection steps.
    let mut sc = Scenario::builtin("cps-sweep").unwrap();
    let sw = sc.sweep.as_mut().unwrap();
    sw.workers = vec![0, 4, 16];
    sw.low = 500_000.0;
    sw.high = 2_500_000.0;
    sw.iterations = 6;
    let step = (sw.high - sw.low) / 64.0;
    let points = spillway_sim::run_sweep(&sc, sc.seed, &mut |_| {}).unwrap();
    let cps: Vec<f64> = points
        .iter()
        .map(|p| p.zero_loss_cps.unwrap_or(0.0))
        .collect();
    eprintln!("zero-loss cps by workers [0, 4, 16]: {cps:?}");
    let base = cps[0];
    assert!(base > 500_000.0, "DPU-only {base}");
    assert!(cps[1] > base + step, "4 workers add capacity: {cps:?}");
    assert!(cps[2] > cps[1] + step, "16 workers add more: {cps:?}");
    assert!(cps[2] >= 1.9 * base, "16 workers reach +90%: {cps:?}");
}
