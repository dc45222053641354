//! Replays the `pipeline_sequences` fuzz target's kept inputs and a seeded smoke run through the
//! checker the fuzzer uses (`tests/common/sequence.rs`): arbitrary byte strings decode into eight
//! flows (TCP, UDP and ICMP echo among local VMs of two tenants, the overlay and the internet via
//! SNAT) and a sequence of packets, handshakes, clock advances, expiry sweeps and policy reloads,
//! run through a pipeline with its fast path on and one with it off. After every packet both
//! must give the same verdict and bytes, keep their invariants, and never forward one tenant's
//! VM frame to another tenant's VM; at the end both must have counted the same. Every file in
//! `tests/fuzz-regressions/pipeline_sequences/` is replayed (seeds and any crasher), then 600
//! inputs from a SplitMix64 stream with a fixed seed; the smoke run must reach fast-path hits
//! and forwarded packets, so a decoder change that stops exercising them fails here.

mod common;

use common::sequence::{check_sequence, decode};
use spillway_vswitch::workload::SplitMix64;

#[test]
fn fuzz_regressions_replay() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz-regressions/pipeline_sequences"
    );
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("regression dir exists")
        .map(|e| e.expect("dir entry").path())
        .collect();
    // Replay in name order so a failure report is the same on every machine.
    paths.sort();
    for path in &paths {
        let data = std::fs::read(path).expect("readable");
        let (flows, ops) = decode(&data);
        if let Err(e) = check_sequence(&flows, &ops) {
            panic!("{}: {e}\nflows: {flows:?}\nops: {ops:?}", path.display());
        }
    }
    assert!(paths.len() >= 2, "the seed inputs are kept");
}

#[test]
fn seeded_random_inputs_hold_every_property() {
    const SEED: u64 = 0x5eed_5e90;
    const INPUTS: usize = 600;
    let mut rng = SplitMix64(SEED);
    let (mut packets, mut hits, mut forwarded) = (0, 0, 0);
    for i in 0..INPUTS {
        let len = 40 + (rng.next_u64() % 400) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let (flows, ops) = decode(&data);
        match check_sequence(&flows, &ops) {
            Ok(ran) => {
                packets += ran.packets;
                hits += ran.fast_path_hits;
                forwarded += ran.forwarded;
            }
            Err(e) => panic!(
                "smoke input {i} (seed {SEED:#x}) failed: {e}\nsave these bytes under \
                 tests/fuzz-regressions/pipeline_sequences/ to replay: {data:02x?}"
            ),
        }
    }
    eprintln!("smoke: {packets} packets, {hits} fast-path hits, {forwarded} forwarded");
    assert!(hits > 0 && forwarded > 0 && forwarded < packets);
}

#[test]
fn decoding_is_total_and_prefix_stable() {
    // Every prefix of a byte string decodes, and to a prefix of the longer string's ops (the
    // last op of a prefix may differ: its missing arguments read as 0).
    let mut rng = SplitMix64(7);
    let data: Vec<u8> = (0..600).map(|_| rng.next_u64() as u8).collect();
    let (flows, full) = decode(&data);
    for end in 40..data.len() {
        let (f, part) = decode(&data[..end]);
        assert_eq!(format!("{f:?}"), format!("{flows:?}"));
        assert!(part.len() <= full.len());
        let whole = part.len().saturating_sub(1);
        assert_eq!(
            format!("{:?}", &part[..whole]),
            format!("{:?}", &full[..whole])
        );
    }
    let (flows, ops) = decode(&[]);
    assert_eq!(flows.len(), 8);
    assert!(ops.is_empty());
}
