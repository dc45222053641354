//! Replays the `testbed_toml` fuzz target's kept inputs through the same property the fuzzer
//! checks (`tests/common/testbed_toml.rs`): every file in `tests/fuzz-regressions/testbed_toml/`
//! (the shipped testbeds as seeds, the configurations of issue 13 that passed validation and
//! then panicked, aborted on an allocation or wrapped, and any crasher the fuzzer finds) either
//! loads and builds, or is an error naming the file and the field with a bounded echo. The
//! issue's inputs must be rejected, not merely survive, so they are also checked by name.

#[path = "common/testbed_toml.rs"]
mod testbed_toml;

use std::path::Path;

use spillway_rt::testbed::Testbed;

fn kept() -> Vec<std::path::PathBuf> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz-regressions/testbed_toml"
    );
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("regression dir exists")
        .map(|e| e.expect("dir entry").path())
        .collect();
    // Name order, so a failure report is the same on every machine.
    paths.sort();
    paths
}

#[test]
fn fuzz_regressions_replay() {
    let paths = kept();
    for path in &paths {
        eprintln!("replaying {}", path.display());
        testbed_toml::check(&std::fs::read(path).expect("readable"));
    }
    assert!(paths.len() >= 6, "the seed inputs are kept");
}

#[test]
fn issue_inputs_are_rejected_naming_the_field() {
    for (name, field) in [
        (
            "issue13-hw-entries-u32-max.toml",
            "fabric.dpu.hw_entries_max",
        ),
        ("issue13-hw-entries-4e9.toml", "fabric.dpu.hw_entries_max"),
        (
            "issue13-insert-queue-u32-max.toml",
            "fabric.dpu.insert_queue_max",
        ),
        ("issue13-cores-wrap.toml", "fabric.host.tenant_cores"),
        ("issue13-heartbeat-1ns.toml", "fabric.host.heartbeat"),
        ("issue13-two-vms-one-port.toml", "vm[1].port"),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fuzz-regressions/testbed_toml")
            .join(name);
        let text = std::fs::read_to_string(&path).expect("readable");
        let e = Testbed::from_toml_str(&text, Path::new(testbed_toml::FILE))
            .expect_err("the issue's input is rejected");
        assert_eq!(e.field, field, "{name}: {e}");
        assert!(e.place.is_some(), "{name}: {e}");
    }
}
