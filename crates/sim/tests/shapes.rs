//! Flow shapes through the engine: a group of each shape (steady, periodic, bursty, random walk)
//! offers the mean rate its fields promise (measured as the packets the DPU was offered in the
//! measure window, on a DPU with room for all of it), exponential lifetimes thin a cohort as
//! `e^(-t / L)`, random arrivals spread a group's openings over its window, and the same seed
//! gives the same packets while another seed gives other ones. `crate::shape`'s unit tests check
//! the processes themselves.

use spillway_sim::scenario::Scenario;

/// 400 flows of 1 kpps opening over 100 ms and living 60 s, with `group`'s fields on top.
fn scenario(group: &str) -> Scenario {
    let lifetime = if group.contains("lifetime =") {
        ""
    } else {
        "lifetime = \"60s\"\n"
    };
    Scenario::from_toml_str(
        &format!(
            "name = \"shape\"\nduration = \"6s\"\nmeasure = [\"1s\", \"6s\"]\n[[flows]]\ncount = 400\ntenants = 4\npps = 1000.0\nspread = \"100ms\"\n{lifetime}{group}"
        ),
        "shape.toml",
    )
    .unwrap()
}

fn offered_mpps(sc: &Scenario, seed: u64) -> (f64, u64) {
    let r = spillway_sim::run(sc, seed, true, &mut |_| {}).unwrap();
    assert_eq!(r.lost_packets, 0, "{:?}", r.drops);
    (r.offered_mpps, r.offered_packets)
}

#[test]
fn each_shape_offers_its_mean_rate() {
    let cases = [
        ("", 1.0),
        ("jitter = 0.3\n", 1.0),
        ("on = \"50ms\"\noff = \"150ms\"\n", 0.25),
        (
            "shape = \"periodic\"\nperiod = \"1s\"\namplitude = 0.8\njitter = 0.2\n",
            1.0,
        ),
        ("shape = \"bursty\"\non = \"50ms\"\noff = \"150ms\"\n", 0.25),
        (
            "shape = \"random-walk\"\nvolatility = 0.1\narrivals = \"random\"\n",
            1.0,
        ),
    ];
    for (group, factor) in cases {
        let (mpps, _) = offered_mpps(&scenario(group), 1);
        let want = 400.0 * 1000.0 * factor / 1e6;
        assert!(
            (mpps / want - 1.0).abs() < 0.04,
            "{group:?}: offered {mpps:.4} Mpps, want {want:.4}"
        );
    }
}

#[test]
fn exponential_lifetimes_thin_a_cohort_and_random_arrivals_spread_it() {
    // 400 flows of mean lifetime 2 s opening at once: e^(-t/2) of them are left at t, so the
    // window [1 s, 6 s] carries 2 s x (e^(-1/2) - e^(-3)) x 400 kpps of flow-seconds.
    let sc = scenario("lifetimes = \"exponential\"\nlifetime = \"2s\"\n");
    let (mpps, _) = offered_mpps(&sc, 3);
    let want = 0.4 * 2.0 * ((-0.5f64).exp() - (-3.0f64).exp()) / 5.0;
    assert!((mpps / want - 1.0).abs() < 0.08, "{mpps} vs {want}");
    // Random arrivals over 4 s: by the window's start (1 s) about a quarter have opened, so the
    // window sees a ramp from 1/4 to all (mean 0.76 of the group over [1 s, 6 s]).
    let mut sc = scenario("arrivals = \"random\"\n");
    sc.flows[0].spread = spillway_sim::scenario::Dur(core::time::Duration::from_secs(4));
    let (mpps, _) = offered_mpps(&sc, 3);
    // Flow-seconds in [1, 6] of a flow opening at u ~ U(0, 4): 5 - max(u - 1, 0) on average
    // 5 - 9/8.
    let want = 0.4 * (5.0 - 9.0 / 8.0) / 5.0;
    assert!((mpps / want - 1.0).abs() < 0.05, "{mpps} vs {want}");
}

#[test]
fn the_same_seed_offers_the_same_packets() {
    let sc = scenario(
        "shape = \"bursty\"\non = \"20ms\"\noff = \"60ms\"\njitter = 0.5\narrivals = \"random\"\nlifetimes = \"exponential\"\nlifetime = \"3s\"\n",
    );
    let a = spillway_sim::run(&sc, 11, true, &mut |_| {}).unwrap();
    let b = spillway_sim::run(&sc, 11, true, &mut |_| {}).unwrap();
    assert_eq!(a.offered_packets, b.offered_packets);
    assert_eq!(a.series, b.series);
    let c = spillway_sim::run(&sc, 12, true, &mut |_| {}).unwrap();
    assert_ne!(a.offered_packets, c.offered_packets);
}
