//! What the stability classifier costs per placement tick, at the scale: 100,000
//! spill-plane flows, 10 ticks per second. One iteration is one whole tick: every flow's
//! counters turned into features (`FlowCounters::take`), every flow observed by the cheap
//! tier, and `end_tick` (idle samples, slot admission, one sketch row and residual per
//! sketched flow, FD shrinks as they fall due) plus the ranking placement reads. The budget is
//! 10% of one core, i.e. 10 ms per tick; `sketch/classifier/tick/100k` reports the time per
//! tick against it. `sketch/classifier/cheap_tier/100k` is the same tick with no sketch slots
//! (`sketched_max` 1), so the sketch tier's share is the difference.
//!
//! The flows are a fixed-seed mix: most small, a heavy tail of large ones, a quarter of them
//! bursty; the classifier is warmed for 40 ticks first so the sketch pool is full and FD
//! shrinks happen at their steady-state rate (one per `ell` rows per flow).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use spillway_sketch::classifier::{Classifier, Score, StabilityParams};
use spillway_sketch::features::FlowCounters;
use spillway_sketch::rng::SplitMix64;

const FLOWS: usize = 100_000;
const TICK: Duration = Duration::from_millis(100);

struct World {
    counters: Vec<FlowCounters>,
    /// Packets per tick of each flow while it sends (heavy-tailed).
    per_tick: Vec<u32>,
    bursty: Vec<bool>,
    rng: SplitMix64,
    tick: u64,
}

impl World {
    fn new() -> World {
        let mut rng = SplitMix64::new(0x5eed);
        let mut per_tick = Vec::with_capacity(FLOWS);
        let mut bursty = Vec::with_capacity(FLOWS);
        for _ in 0..FLOWS {
            // Pareto-like: most flows send a few packets a tick, a few send thousands.
            let u = rng.uniform_open().max(1e-9);
            per_tick.push((2.0 / u.powf(0.8)).min(20_000.0) as u32);
            bursty.push(rng.uniform_open() < 0.25);
        }
        World {
            counters: vec![FlowCounters::default(); FLOWS],
            per_tick,
            bursty,
            rng,
            tick: 0,
        }
    }

    /// The traffic of one tick: four arrivals per flow (outside the measured part).
    fn traffic(&mut self) {
        let base = self.tick * 100_000_000;
        for i in 0..FLOWS {
            if self.bursty[i] && self.rng.uniform_open() < 0.5 {
                continue;
            }
            let n = self.per_tick[i].div_ceil(4).max(1);
            for a in 0..4u64 {
                self.counters[i].record(base + a * 25_000_000, n, u64::from(n) * 512, 0);
            }
        }
        self.tick += 1;
    }

    /// The measured part: features for every flow, the classifier's tick, the ranking.
    fn classify(&mut self, c: &mut Classifier, ranked: &mut Vec<Score>) {
        for (i, ctr) in self.counters.iter_mut().enumerate() {
            let f = ctr.take(TICK);
            c.observe(i as u64, &f);
        }
        c.end_tick();
        c.rank(ranked);
    }
}

fn bench(c: &mut Criterion, name: &str, p: StabilityParams) {
    let mut w = World::new();
    let mut cls = Classifier::new(p).expect("valid parameters");
    let mut ranked = Vec::new();
    for _ in 0..40 {
        w.traffic();
        w.classify(&mut cls, &mut ranked);
    }
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                w.traffic();
                let t = std::time::Instant::now();
                w.classify(&mut cls, &mut ranked);
                spent += t.elapsed();
                black_box(ranked.len());
            }
            spent
        })
    });
}

fn classifier(c: &mut Criterion) {
    bench(c, "sketch/classifier/tick/100k", StabilityParams::default());
    bench(
        c,
        "sketch/classifier/cheap_tier/100k",
        StabilityParams {
            sketched_max: 1,
            ..StabilityParams::default()
        },
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(8));
    targets = classifier
}
criterion_main!(benches);
