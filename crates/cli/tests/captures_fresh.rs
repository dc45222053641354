//! Proves the committed example captures (`examples/varied.pcap`, `examples/pipeline-in.pcap`)
//! are exactly what `examples/make_captures.rs` generates today, so the captures, the generator
//! and the tests that name frames by the generator's labels never drift apart. It includes the
//! generator, writes fresh captures into a per-test temp dir, and compares them byte for byte
//! with the committed files; it also checks that two generations are identical (determinism).

#[allow(dead_code)]
#[path = "../examples/make_captures.rs"]
mod make_captures;

use std::path::Path;

#[test]
fn committed_captures_are_byte_identical_to_regenerated_ones() {
    let dir = tempfile::tempdir().expect("a temp dir");
    make_captures::write_all(dir.path()).expect("writing the captures");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for (name, _) in make_captures::captures() {
        let fresh = std::fs::read(dir.path().join(name)).expect("reading a fresh capture");
        let committed = std::fs::read(examples.join(name)).expect("reading a committed capture");
        assert!(
            fresh == committed,
            "examples/{name} differs from the generator's output ({} vs {} bytes); regenerate with \
             `cargo run -p spillway --example make_captures -- examples/` and commit",
            committed.len(),
            fresh.len()
        );
    }
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(make_captures::captures(), make_captures::captures());
}
