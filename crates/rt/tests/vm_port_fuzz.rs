//! Replays the `vm_port` fuzz target's kept inputs and a seeded smoke run through the same
//! decoder and checker the fuzzer uses (`tests/common/vm_port.rs`): arbitrary bytes play a
//! hostile VM (any descriptor, index, flag word, used-ring word and socket bytes) against the
//! DPU's end of a shared-memory port, and after every DPU step the checker proves the DPU wrote
//! only the used rings and, for a frame it reported written, one window of receive queue 1's
//! buffers; that no turn refused more than the bad-descriptor budget and no socket read took more
//! than its budget; and that the port was judged misbehaving exactly when a reference count
//! says so. Every file in `tests/fuzz-regressions/vm_port/` is replayed (seeds and crashers),
//! then 1,500 inputs from a SplitMix64 stream with a fixed seed (kept inputs with a few bytes
//! changed, and random bytes), which must reach every outcome
//! (frames taken, bad descriptors, turn budgets, frames written, broken queues, both
//! misbehaviour verdicts), so a decoder change that stops exercising a path fails here.

#[path = "common/vm_port.rs"]
mod vm_port;

use vm_port::{Outcomes, run};

#[test]
fn fuzz_regressions_replay() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz-regressions/vm_port"
    );
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("regression dir exists")
        .map(|e| e.expect("dir entry").path())
        .collect();
    paths.sort();
    let mut total = Outcomes::default();
    for path in &paths {
        eprintln!("replaying {}", path.display());
        let out = run(&std::fs::read(path).expect("readable"));
        eprintln!("  -> {out:?}");
        total.add(&out);
    }
    assert!(paths.len() >= 4, "the seed inputs are kept");
    assert!(
        total.bad_desc_detach >= 1 && total.flood_detach >= 1,
        "{total:?}"
    );
}

/// SplitMix64 (Steele, Lea, Flood 2014): a fixed, stable generator.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[test]
fn seeded_random_inputs_hold_every_property() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz-regressions/vm_port"
    );
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .expect("regression dir exists")
        .map(|e| std::fs::read(e.expect("dir entry").path()).expect("readable"))
        .collect();
    seeds.sort();
    let mut rng = SplitMix64(0x5eed_0b0e);
    let mut total = Outcomes::default();
    for i in 0..1500 {
        // Two in three: a kept input with a few bytes changed (as the fuzzer mutates); else
        // random bytes, which mostly break a queue at once.
        let data: Vec<u8> = if i % 3 != 2 {
            let mut d = seeds[i % seeds.len()].clone();
            for _ in 0..=rng.next() % 8 {
                let at = (rng.next() as usize) % d.len();
                d[at] = rng.next() as u8;
            }
            d
        } else {
            let len = (rng.next() % 3000) as usize;
            (0..len).map(|_| rng.next() as u8).collect()
        };
        total.add(&run(&data));
    }
    eprintln!("{total:?}");
    assert!(total.frames > 0 && total.written > 0, "{total:?}");
    assert!(total.bad > 0 && total.turn_budget > 0, "{total:?}");
    assert!(total.broken > 0, "{total:?}");
    assert!(
        total.bad_desc_detach > 0 && total.flood_detach > 0,
        "{total:?}"
    );
}
