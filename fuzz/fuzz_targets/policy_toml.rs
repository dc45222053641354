//! Compiles arbitrary text as a policy file. Any outcome but a panic is fine: a bad policy must
//! come back as a `ConfigError` naming the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_vswitch::policy::Policy;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = Policy::from_toml_str(text, "fuzz.toml") {
            assert!(e.to_string().starts_with("fuzz.toml"), "error names the file: {e}");
        }
    }
});
