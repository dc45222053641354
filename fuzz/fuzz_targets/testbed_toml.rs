//! Loads arbitrary text as a `spillway run` testbed file (and as a bare `[fabric]` table).
//! A load either succeeds, and then the DPU and spill plane build from its fabric parameters
//! without a panic, or fails with an error naming the file and the field with a bounded echo.
//! The property lives in `crates/rt/tests/common/testbed_toml.rs`, which the replay test
//! `crates/rt/tests/testbed_fuzz_regressions.rs` shares. Run with `-malloc_limit_mb` at its
//! default (the RSS limit) so that an absurd allocation is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/rt/tests/common/testbed_toml.rs"]
mod testbed_toml;

fuzz_target!(|data: &[u8]| testbed_toml::check(data));
