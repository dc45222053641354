//! Replays the `atc_ops` fuzz target's kept inputs and a seeded smoke run through the same
//! checker the fuzzer uses (`tests/common/atc_ops.rs`): arbitrary byte strings decode into
//! sequences of `map`, `unmap`, `remove_vm`, `fill`, `translate` (and the fill-and-retry loop) and
//! `invalidate`/`invalidate_vm`/`invalidate_all` over three VMs with disjoint host windows, and
//! after every step a reference model (each VM's regions and the regions the cache must hold
//! fresh) must agree with `RegionTable` + `Atc`. That proves no translation leaves a region
//! currently mapped to the asking VM, none uses an entry made stale by a map/unmap/remove or
//! dropped by an invalidation, none reaches another VM's host memory, a miss names exactly the
//! uncovered bytes, a permission error comes only once every byte is cached, and both invariant
//! checkers hold. Every file in `tests/fuzz-regressions/atc_ops/` is replayed (the fuzzer's
//! crashers and a few seeds), then 4,000 inputs from a SplitMix64 stream with a fixed seed; the
//! smoke run must reach every outcome (hits, exact and stretched misses, permission denials,
//! segment overflow, invalid ranges, evictions of fresh entries, stale drops), so a decoder change
//! that stops exercising a path fails here rather than going quiet.

#[path = "common/atc_ops.rs"]
mod atc_ops;

use atc_ops::{Outcomes, decode, run};

#[test]
fn fuzz_regressions_replay() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz-regressions/atc_ops"
    );
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("regression dir exists")
        .map(|e| e.expect("dir entry").path())
        .collect();
    // Replay in name order so a failure report is the same on every machine.
    paths.sort();
    for path in &paths {
        let data = std::fs::read(path).expect("readable");
        let input = decode(&data);
        // Shown only when the replay fails: the decoded sequence is the repro.
        eprintln!("replaying {}: {input:?}", path.display());
        let out = run(&input);
        eprintln!("  -> {out:?}");
    }
    assert!(paths.len() >= 3, "the seed inputs are kept");
}

/// SplitMix64 (Steele, Lea, Flood 2014): a fixed, stable generator, so the smoke inputs are the
/// same on every run and machine.
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
    const SEED: u64 = 0x5eed_a7c0;
    const INPUTS: usize = 4_000;
    let mut rng = SplitMix64(SEED);
    let mut total = Outcomes::default();
    for i in 0..INPUTS {
        let len = 16 + (rng.next() % 384) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let input = decode(&data);
        match std::panic::catch_unwind(|| run(&input)) {
            Ok(out) => total.add(&out),
            Err(_) => panic!(
                "smoke input {i} (seed {SEED:#x}) failed; save these bytes under \
                 tests/fuzz-regressions/atc_ops/ to replay: {data:02x?}\ndecoded: {input:?}"
            ),
        }
    }
    eprintln!("smoke outcomes: {total:?}");
    assert!(total.mapped > 0, "{total:?}");
    assert!(total.hit > 0, "{total:?}");
    assert!(total.miss_exact > 0, "{total:?}");
    assert!(total.miss_stretched > 0, "{total:?}");
    assert!(total.permission > 0, "{total:?}");
    assert!(total.too_many_segments > 0, "{total:?}");
    assert!(total.invalid > 0, "{total:?}");
    assert!(total.evicted_fresh > 0, "{total:?}");
    assert!(total.stale > 0, "{total:?}");
}

#[test]
fn decoding_is_total() {
    // Every prefix of a byte string decodes, and to a prefix of the longer string's operations:
    // a record cut short is dropped, never misread.
    let mut rng = SplitMix64(7);
    let data: Vec<u8> = (0..512).map(|_| rng.next() as u8).collect();
    let full = decode(&data);
    for end in 0..data.len() {
        let part = decode(&data[..end]);
        assert!(part.ops.len() <= full.ops.len());
        assert_eq!(part.ops[..], full.ops[..part.ops.len()]);
    }
    assert_eq!(decode(&[]).ops, vec![]);
}
