//! The `testbed_toml` fuzz target's property, shared with its replay test
//! (`tests/testbed_fuzz_regressions.rs`): arbitrary text given to `Testbed::from_toml_str`
//! either loads, and then everything the daemons build from the fabric parameters builds
//! without a panic, or comes back as an error that names the file, places the field, and echoes
//! a bounded part of the input.

use std::path::Path;

use spillway_fabric::dpu::DpuNode;
use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::SpillPlane;
use spillway_rt::testbed::Testbed;

/// The file name errors must carry.
pub const FILE: &str = "fuzz.toml";

/// Longest error message accepted: the parser message and echoed values are bounded to a few
/// hundred characters each, whatever the input's size.
pub const MESSAGE_BYTES_MAX: usize = 2048;

/// Largest table a check builds: a valid but large capacity allocates its whole table (up to
/// `dpu.hw_entries_max` = 2^24 entries), which is allowed but too slow to do per input.
const BUILD_ENTRIES_MAX: usize = 1 << 16;

/// Runs the property on one input; panics on a violation.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Testbed::from_toml_str(text, Path::new(FILE)) {
        Ok(tb) => {
            tb.fabric
                .validate()
                .expect("a loaded testbed's fabric parameters validate");
            assert!(!tb.vms.is_empty(), "a testbed has VMs");
            let mut ports: Vec<_> = tb.vms.iter().map(|v| v.port).collect();
            ports.sort();
            ports.dedup();
            assert_eq!(ports.len(), tb.vms.len(), "one VM per port");
            build(&tb.fabric);
        }
        Err(e) => {
            assert_eq!(e.file, FILE);
            let msg = e.to_string();
            assert!(msg.starts_with(FILE), "error names the file: {msg}");
            assert!(!e.field.is_empty(), "error names a field: {msg}");
            assert!(
                msg.len() <= MESSAGE_BYTES_MAX,
                "error of {} bytes echoes too much: {}",
                msg.len(),
                &msg[..msg.floor_char_boundary(200)]
            );
        }
    }
    // The `[fabric]` table alone, as `sim` scenarios embed it: validation never panics, and
    // what it accepts builds.
    if let Ok(f) = toml::from_str::<FabricParams>(text)
        && f.validate().is_ok()
    {
        build(&f);
    }
}

/// Builds the DPU and the spill plane from validated parameters, when small enough.
fn build(f: &FabricParams) {
    if f.dpu.hw_entries_max <= BUILD_ENTRIES_MAX
        && f.placement.stability.sketched_max <= BUILD_ENTRIES_MAX
    {
        let _ = DpuNode::new(f);
        let _ = SpillPlane::new(f);
    }
}
