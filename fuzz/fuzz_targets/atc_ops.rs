//! Decodes arbitrary bytes into a sequence of vATC operations (`map`, `unmap`, `remove_vm` on the
//! `RegionTable`; `fill`, `translate` with READ/WRITE/RW, the fill-and-retry loop, `invalidate`,
//! `invalidate_vm`, `invalidate_all` on the `Atc`) over three VMs with disjoint host windows, and
//! checks every step against a reference model: a hit covers exactly the asked range inside
//! regions currently mapped to that VM with the right host offset and permission (never another
//! VM's memory), no stale or invalidated entry is ever used, a miss names exactly the uncovered
//! bytes, and both invariant checkers hold. The decoder and checker live in
//! `crates/fabric/tests/common/atc_ops.rs`, shared with the replay test
//! `crates/fabric/tests/atc_fuzz_regressions.rs`, so a crasher copied into
//! `crates/fabric/tests/fuzz-regressions/atc_ops/` fails plain `cargo test` the same way. Any
//! panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

// `Outcomes::add` only serves the replay test's smoke totals.
#[allow(dead_code)]
#[path = "../../crates/fabric/tests/common/atc_ops.rs"]
mod atc_ops;

fuzz_target!(|data: &[u8]| {
    atc_ops::run(&atc_ops::decode(data));
});
