//! The placement comparisons (`scenarios/placement.toml`, `scenarios/placement-volatile.toml`)
//! run every policy of their `[compare]`
//! section on the same seed, and what it reports is structurally sound: each policy ran on the
//! same workload (same packets offered), the scenario does what its comments claim (the plane is
//! active through the measure window, the hardware table stays full while the fast path keeps
//! headroom, so free entries bind placement), the window's counters agree with each other and
//! with the run's totals, policies that never demote do not demote (and flap only through sheds),
//! and the threshold policy recalls nothing when no flow reaches its threshold. It does not
//! assert which policy wins: that is the model's result, printed by
//! `spillway sim --scenario placement`. Every run also passes the engine's checkers after every
//! event.

use spillway_fabric::params::PlacementKind;
use spillway_sim::PlacementPoint;
use spillway_sim::scenario::Scenario;

fn compare(sc: &Scenario) -> Vec<PlacementPoint> {
    let t0 = std::time::Instant::now();
    let points =
        spillway_sim::run_placement_compare(sc, sc.seed, &mut |_| {}).unwrap_or_else(|e| {
            panic!(
                "{e}\nrepro: spillway sim --scenario {} --seed {}",
                sc.name, sc.seed
            )
        });
    eprintln!(
        "{} policies in {:.1} s wall",
        points.len(),
        t0.elapsed().as_secs_f64()
    );
    points
}

#[test]
fn every_policy_runs_on_the_same_workload_with_consistent_counters() {
    check_comparison("placement");
}

#[test]
fn the_volatile_mix_is_as_sound_as_the_default_one() {
    check_comparison("placement-volatile");
}

fn check_comparison(name: &str) {
    let sc = Scenario::builtin(name).unwrap();
    let policies = sc.compare.as_ref().unwrap().policies.clone();
    assert!(
        policies.contains(&PlacementKind::FirstCome)
            && policies.contains(&PlacementKind::OvsRebalance)
            && policies.contains(&PlacementKind::Threshold),
        "{policies:?}"
    );
    let points = compare(&sc);
    assert_eq!(points.len(), policies.len());
    let secs = sc.measure[1].0.as_secs_f64() - sc.measure[0].0.as_secs_f64();
    let (from, to) = (sc.measure[0].0.as_secs_f64(), sc.measure[1].0.as_secs_f64());
    for (p, k) in points.iter().zip(&policies) {
        eprintln!(
            "{:<14} offload {:.3} plane {:?} inserts/s {:.0} deletes/s {:.0} (to host {:.0}) host cpu {:.2} recalls {} demotions {} sheds {} flaps {} lost {}",
            p.policy,
            p.window.offload_ratio,
            p.window.plane_offload_ratio,
            p.window.inserts_per_s,
            p.window.deletes_per_s,
            p.window.deletes_to_host_per_s,
            p.window.host_cpu_cores,
            p.window.recalls,
            p.window.demotions,
            p.window.sheds,
            p.window.flaps,
            p.lost_packets
        );
        let r = &p.run;
        let c = &r.counters;
        // The policy that ran is the one asked for.
        assert_eq!(p.policy, k.name());
        assert_eq!(r.placement, k.name());
        // The same workload for every policy.
        assert_eq!(
            r.offered_packets, points[0].run.offered_packets,
            "{}",
            p.policy
        );
        // Conservation after the drain.
        assert_eq!(
            r.offered_packets,
            r.delivered_packets + r.drops.values().sum::<u64>(),
            "{}",
            p.policy
        );

        // The scenario's claims. The plane is active from before the window to its end.
        let active = r
            .phases
            .iter()
            .find(|e| e.phase == "active")
            .expect("the plane activates");
        assert!(active.t_s < from, "{}: active at {}", p.policy, active.t_s);
        assert!(
            !r.phases
                .iter()
                .any(|e| matches!(e.phase, "draining" | "idle" | "fail_open")),
            "{}: {:?}",
            p.policy,
            r.phases
        );
        // Free entries bind: the table stays (nearly) full while the fast path has headroom.
        let window: Vec<_> = r
            .series
            .iter()
            .filter(|s| s.t_s > from && s.t_s <= to)
            .collect();
        let mean = |f: &dyn Fn(&spillway_sim::report::Sample) -> f64| {
            window.iter().map(|s| f(s)).sum::<f64>() / window.len() as f64
        };
        let table = mean(&|s| s.hw_table_util);
        let hw = mean(&|s| s.hw_util);
        assert!(table > 0.97, "{}: table {table:.3}", p.policy);
        let target = sc.fabric.sched.dpu_target_util;
        assert!(hw < target - 0.1, "{}: fast path {hw:.2}", p.policy);
        assert!(window.iter().all(|s| s.phase == "active"));

        // The window's figures are in range and agree with each other and the run.
        let w = &r.window;
        assert!((0.0..=1.0).contains(&p.window.offload_ratio));
        let plane = p
            .window
            .plane_offload_ratio
            .expect("the plane carried traffic");
        assert!((0.0..=1.0).contains(&plane));
        assert!(
            p.window.host_cpu_cores > 0.0
                && p.window.host_cpu_cores <= f64::from(sc.fabric.host.workers_max)
        );
        assert!(p.window.deletes_to_host_per_s <= p.window.deletes_per_s);
        let inserts = (p.window.inserts_per_s * secs).round() as u64;
        assert!(
            inserts + 2 >= 2 * p.window.recalls,
            "{}: {inserts} inserts for {} recalls",
            p.policy,
            p.window.recalls
        );
        assert_eq!(p.window.flaps, w.flaps);
        assert!(p.window.recalls <= c["dpu.recall.ok"]);
        assert!(p.window.demotions <= c["dpu.demote"]);
        assert!(p.window.flaps <= c["dpu.placement.flap"]);
        assert!(p.window.demotions <= p.window.recalls + p.window.flaps);
        // Every demotion is of a recalled flow, so it is a flap; every flap is a move.
        assert!(p.window.flaps >= p.window.demotions, "{}", p.policy);
        assert!(
            p.window.flaps <= p.window.demotions + p.window.sheds + p.window.recalls,
            "{}",
            p.policy
        );
        assert_eq!(c["spill.recall.ok"], c["dpu.recall.ok"], "{}", p.policy);
        assert!(c["dpu.hw.delete.to_host"] <= c["dpu.hw.delete"]);
        assert!(c["dpu.hw.packets.recalled"] <= c["dpu.hw.packets"]);
        assert!(
            p.window.recalls > 0,
            "{}: placement recalled nothing",
            p.policy
        );

        match k {
            PlacementKind::FirstCome | PlacementKind::Threshold => {
                // Neither ever demotes; they flap only when the DPU sheds what they recalled.
                assert_eq!(c["dpu.demote"], 0, "{}", p.policy);
                assert_eq!(c["spill.delete.sent"], 0, "{}", p.policy);
                assert!(
                    c["dpu.placement.flap"] <= 2 * c["dpu.shed"],
                    "{}: {} flaps, {} sheds",
                    p.policy,
                    c["dpu.placement.flap"],
                    c["dpu.shed"]
                );
            }
            PlacementKind::OvsRebalance | PlacementKind::Stability => {
                // Swaps only: a demotion is always followed by the recall it made room for.
                assert!(c["dpu.demote"] <= c["dpu.recall.ok"], "{}", p.policy);
            }
            _ => {}
        }
    }
}

#[test]
fn threshold_recalls_nothing_when_no_flow_reaches_it() {
    // The placement scenario's workload, cut to the first 3 s (the plane is active from
    // ~0.4 s and the flash crowd's end frees entries at ~2.7 s), with a threshold above every
    // flow's rate (the fastest, a random walk at its clamp, sends 25 kpps).
    let mut sc = Scenario::builtin("placement").unwrap();
    sc.duration = spillway_sim::scenario::Dur(core::time::Duration::from_secs(3));
    sc.measure = [
        spillway_sim::scenario::Dur(core::time::Duration::from_secs(1)),
        sc.duration,
    ];
    sc.fabric.placement.threshold_pps = 100_000.0;
    sc.compare = Some(spillway_sim::scenario::Compare {
        policies: vec![PlacementKind::Threshold, PlacementKind::FirstCome],
    });
    let points = compare(&sc);
    let (threshold, first) = (&points[0], &points[1]);
    assert!(threshold.run.activation_ms.is_some());
    assert_eq!(threshold.run.counters["spill.recall.sent"], 0);
    assert_eq!(threshold.run.counters["dpu.hw.packets.recalled"], 0);
    assert_eq!(threshold.window.plane_offload_ratio, Some(0.0));
    // The same run with first come recalls: the threshold, not a lack of room, held it back.
    assert!(first.run.counters["dpu.recall.ok"] > 0);
}
