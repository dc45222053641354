//! The classifier's steady state allocates nothing: once its flows are known and hold their
//! sketch slots, a tick (every flow's counters recorded and turned into features, observed, the
//! tick closed with FD inserts and shrinks, the ranking written into a reused vector) makes no
//! allocation. Proved with the counting global allocator, over enough ticks for every sketch to
//! shrink several times and for sketch slots to change hands between flows whose rates cross
//! (before slots were reset in place, those hand-overs allocated a fresh sketch: 28 in this
//! test).

use core::time::Duration;

use spillway_sketch::classifier::{Classifier, StabilityParams};
use spillway_sketch::features::FlowCounters;
use spillway_sketch::rng::SplitMix64;

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

const FLOWS: usize = 2_000;

#[test]
fn a_steady_state_tick_allocates_nothing() {
    let mut rng = SplitMix64::new(7);
    let mut counters = vec![FlowCounters::default(); FLOWS];
    let rates: Vec<u32> = (0..FLOWS)
        .map(|_| 1 + (rng.uniform() * 50.0) as u32)
        .collect();
    let mut c = Classifier::new(StabilityParams {
        sketched_max: 1_000,
        ..StabilityParams::default()
    })
    .unwrap();
    let mut ranked = Vec::with_capacity(FLOWS);
    let mut tick = |c: &mut Classifier, rng: &mut SplitMix64, t: u64, ranked: &mut Vec<_>| {
        for (i, ctr) in counters.iter_mut().enumerate() {
            // Bursty flows (every third) are silent half the time.
            if i % 3 == 0 && rng.uniform() < 0.5 {
                continue;
            }
            ctr.record(t * 100_000_000, rates[i], u64::from(rates[i]) * 700, 0);
            ctr.record(
                t * 100_000_000 + 50_000_000,
                rates[i],
                u64::from(rates[i]) * 700,
                1,
            );
        }
        for (i, ctr) in counters.iter_mut().enumerate() {
            let f = ctr.take(Duration::from_millis(100));
            c.observe(i as u64, &f);
        }
        c.end_tick();
        c.rank(ranked);
    };
    for t in 0..60 {
        tick(&mut c, &mut rng, t, &mut ranked);
    }
    assert_eq!(c.sketched(), 1_000);
    assert!(!ranked.is_empty());
    let before = spillway_testkit::allocations();
    for t in 60..160 {
        tick(&mut c, &mut rng, t, &mut ranked);
    }
    let after = spillway_testkit::allocations();
    c.check_invariants().unwrap();
    assert_eq!(after - before, 0, "allocations in 100 steady-state ticks");
}
