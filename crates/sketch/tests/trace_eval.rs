//! Proves that the stability ranking picks stable flows (steady, periodic) for the scarce DPU
//! entries clearly more often than a bandwidth-only ranking does. For each of three fixed seeds
//! it generates the default labelled mix (`GenSpec::default()`: 2,000 flows over 600 ticks =
//! 60 s; 30 % steady, 15 % periodic, 20 % bursty, 15 % random walk, 20 % mice, every class
//! drawing its mean rate from the same log-normal so bandwidth alone does not reveal the class),
//! feeds it to the classifier with default parameters, and compares at the last tick the
//! precision of the top K (the share of K entries that go to stable flows) of the stability
//! ranking against the long-run bandwidth ranking and the last-tick bandwidth ranking. With
//! 900 stable flows of ~1,600 alive, either bandwidth ranking lands near 0.55-0.6 by
//! construction; measured, the stability ranking reaches 0.96-1.00 at K = 25..200 on seeds
//! 1-5, so the thresholds below (at least 0.9, and at least 0.3 above each baseline at every K
//! of 50, 100, 200) leave room for other seeds. Each seed is its
//! own test so they run in parallel; each prints its table (`--nocapture`).
//!
//! The constants were chosen on that family. The held-out families (`elephants`, `pareto`:
//! other size distributions, class mixes, shapes, tick jitter and missing ticks) must give a
//! top 100 of at least 85 % stable flows and at least 0.3 above the bandwidth-only ranking,
//! the generalisation target (measured: 0.99-1.00 and 0.85-0.90 over seeds 1-5).

use spillway_sketch::classifier::StabilityParams;
use spillway_sketch::trace::{
    EvalRow, Evaluation, Family, GenSpec, class_counts, evaluate, generate,
};

const KS: [usize; 4] = [25, 50, 100, 200];
/// Least precision of the stability ranking's top K, for K in 50, 100, 200.
const PRECISION_MIN: f64 = 0.9;
/// Least lead over each bandwidth ranking, for K in 50, 100, 200.
const MARGIN_MIN: f64 = 0.3;

fn print(seed: u64, e: &Evaluation) {
    eprintln!(
        "seed {seed}: tick {}, {} flows alive ({} stable), {} scored; alive by class {:?}",
        e.tick, e.alive, e.stable_alive, e.scored, e.alive_by_class
    );
    eprintln!("    K  stability P/R  bandwidth P/R  last-tick P/R  stability top-K by class");
    for r in &e.rows {
        eprintln!(
            "  {:3}  {:.2}/{:.2}      {:.2}/{:.2}      {:.2}/{:.2}      {}",
            r.k,
            r.stability.precision,
            r.stability.recall,
            r.by_gain.precision,
            r.by_gain.recall,
            r.by_last_tick.precision,
            r.by_last_tick.recall,
            class_counts(&r.stability.by_class)
        );
    }
}

fn check_seed(seed: u64) {
    let spec = GenSpec::default();
    let rows = generate(&spec, seed);
    let e = evaluate(&rows, &KS, &StabilityParams::default()).expect("valid params and trace");
    print(seed, &e);
    let counts = spec.counts();
    assert_eq!(e.stable_alive, counts[0] + counts[1], "seed {seed}");
    for r in &e.rows {
        let EvalRow {
            k,
            stability,
            by_gain,
            by_last_tick,
        } = *r;
        assert_eq!(
            stability.taken, k,
            "seed {seed}: fewer than {k} flows scored"
        );
        if k < 50 {
            // Small K is a handful of flows: only require not doing worse.
            assert!(
                stability.precision >= by_gain.precision,
                "seed {seed} K {k}: stability {:.2} < bandwidth-only {:.2}",
                stability.precision,
                by_gain.precision
            );
            continue;
        }
        assert!(
            stability.precision >= PRECISION_MIN,
            "seed {seed} K {k}: stability precision {:.2} < {PRECISION_MIN}",
            stability.precision
        );
        for (name, base) in [("bandwidth-only", by_gain), ("last-tick", by_last_tick)] {
            assert!(
                stability.precision >= base.precision + MARGIN_MIN,
                "seed {seed} K {k}: stability precision {:.2} is not {MARGIN_MIN} above {name} {:.2}",
                stability.precision,
                base.precision
            );
        }
        // Recall is measured against min(K, stable alive) = K here, so it equals precision.
        assert!((stability.recall - stability.precision).abs() < 1e-12);
    }
}

#[test]
fn stability_ranking_beats_bandwidth_only_on_seed_1() {
    check_seed(1);
}

#[test]
fn stability_ranking_beats_bandwidth_only_on_seed_2() {
    check_seed(2);
}

#[test]
fn stability_ranking_beats_bandwidth_only_on_seed_3() {
    check_seed(3);
}

/// The same check over ten more seeds (about 15 s): `cargo test -p spillway-sketch --test
/// trace_eval -- --ignored --nocapture`. Run it after tuning the classifier.
#[test]
#[ignore = "slow sweep; run after tuning the classifier"]
fn stability_ranking_beats_bandwidth_only_on_seeds_4_to_13() {
    for seed in 4..=13 {
        check_seed(seed);
    }
}

/// Precision at K = 100 on a held-out family: at least 0.85, and at least 0.3 above the
/// bandwidth-only ranking.
fn check_held_out(family: Family, seed: u64) {
    let spec = GenSpec::family(family);
    let rows = generate(&spec, seed);
    let e = evaluate(&rows, &KS, &StabilityParams::default()).expect("valid params and trace");
    eprint!("{family} ");
    print(seed, &e);
    let r = e.rows[2];
    assert_eq!(r.k, 100);
    assert!(
        r.stability.precision >= 0.85,
        "{family} seed {seed}: precision@100 {:.2} < 0.85",
        r.stability.precision
    );
    assert!(
        r.stability.precision >= r.by_gain.precision + 0.3,
        "{family} seed {seed}: precision@100 {:.2} is not 0.3 above bandwidth-only {:.2}",
        r.stability.precision,
        r.by_gain.precision
    );
}

#[test]
fn held_out_elephants_family_keeps_precision() {
    for seed in 1..=2 {
        check_held_out(Family::Elephants, seed);
    }
}

#[test]
fn held_out_pareto_family_keeps_precision() {
    for seed in 1..=2 {
        check_held_out(Family::Pareto, seed);
    }
}
