//! Plays a hostile VM against the DPU's end of a shared-memory port: arbitrary bytes decode into
//! what a VM controls (descriptor tables, available rings, flag words, the device's used-ring
//! words, socket bytes) interleaved with the DPU's turns (`begin_turn` + `recv`), sends into
//! receive queue 1 (`fill_rx`), socket checks (`endpoint_gone`) and notification handshakes.
//! After every DPU step: no panic, no write outside the used rings and (for a frame reported
//! written) one window of receive queue 1's buffers, the per-turn budgets held, and the
//! misbehaviour verdict equal to a reference count's. The decoder and checker live in
//! `crates/rt/tests/common/vm_port.rs`, shared with `crates/rt/tests/vm_port_fuzz.rs`, so an input
//! copied into `crates/rt/tests/fuzz-regressions/vm_port/` fails plain `cargo test` the same way.
#![no_main]

use libfuzzer_sys::fuzz_target;

// `Outcomes::add` only serves the replay test's totals.
#[allow(dead_code)]
#[path = "../../crates/rt/tests/common/vm_port.rs"]
mod vm_port;

fuzz_target!(|data: &[u8]| {
    vm_port::run(data);
});
