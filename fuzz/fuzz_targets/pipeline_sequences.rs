//! Decodes arbitrary bytes into eight flows (TCP, UDP and ICMP echo among local VMs of two
//! tenants, the overlay and the internet via SNAT, over the shipped example policy) and a
//! sequence of packets, handshakes, clock advances, expiry sweeps and policy reloads, and runs
//! it through a pipeline with its fast path on and one with it off. After every packet both must
//! give the same verdict and the same bytes, keep their invariants (conntrack, flow table,
//! conservation), and never forward one tenant's VM frame to another tenant's VM. Unlike
//! `pipeline_frames` (arbitrary single frames), this explores connection lifecycles: state made
//! by one packet and used by the next. The decoder and checker live in
//! `crates/vswitch/tests/common/sequence.rs`, shared with `tests/path_equivalence.rs` and the
//! replay test `crates/vswitch/tests/sequence_fuzz_regressions.rs`, so a crasher copied into
//! `crates/vswitch/tests/fuzz-regressions/pipeline_sequences/` fails plain `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/vswitch/tests/common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let (flows, ops) = common::sequence::decode(data);
    if let Err(e) = common::sequence::check_sequence(&flows, &ops) {
        panic!("{e}\nflows: {flows:?}\nops: {ops:?}");
    }
});
