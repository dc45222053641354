//! Proves that the command line turns absurd input into clear errors instead of panics, silent
//! acceptance or megabytes of echo: it runs the built `spillway` binary (no root, no daemon) with
//! float flags that used to panic (`nan`, `inf`, `1e30`, negatives), with every subcommand's
//! numeric flags out of range, with a ctl socket that does not exist, a testbed file with a type
//! error and a 200 KB value, a `pcap run --ingress-port` the policy does not have, and pcap
//! files with a complete 16 MB record; and asserts the exit status, that the message names the
//! flag or field and the range or limit, and that stderr stays short.

use std::path::{Path, PathBuf};
use std::process::Output;

/// The repository root (examples/ lives there).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn spillway(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .output()
        .expect("running spillway")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A usage error: exit status 2 (clap's), no panic, a message naming `wanted`.
fn assert_usage_error(args: &[&str], wanted: &[&str]) {
    let o = spillway(args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
    for w in wanted {
        assert!(e.contains(w), "{args:?}: expected {w:?} in: {e}");
    }
}

fn example(name: &str) -> String {
    repo_root()
        .join("examples")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn float_flags_are_rejected_with_their_range_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock").display().to_string();
    for t in ["nan", "inf", "1e30", "-1"] {
        assert_usage_error(
            &[
                "ctl",
                "--socket",
                &sock,
                &format!("--timeout={t}"),
                "status",
            ],
            &["--timeout", t, "0.001..=3600"],
        );
    }
    let testbed = example("testbed-shm-vms.toml");
    for d in ["nan", "-5"] {
        assert_usage_error(
            &[
                "vm-endpoint",
                "--config",
                &testbed,
                "--vm",
                "a",
                "--mode",
                "sink",
                &format!("--duration={d}"),
            ],
            &["--duration", d, "0.001..=2592000"],
        );
    }
}

#[test]
fn every_numeric_flag_is_range_checked_at_parse_time() {
    let testbed = example("testbed-shm-vms.toml");
    let endpoint = |flag: &str, v: &str| {
        vec![
            "vm-endpoint".to_string(),
            "--config".into(),
            testbed.clone(),
            "--vm".into(),
            "a".into(),
            "--mode".into(),
            "gen".into(),
            "--dst".into(),
            "b".into(),
            format!("{flag}={v}"),
        ]
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cases: Vec<(Vec<String>, &[&str])> = vec![
        (
            owned(&["ctl", "--socket", "/nonexistent", "flows", "--limit", "0"]),
            &["--limit", "1..=100000"],
        ),
        (
            owned(&[
                "ctl",
                "--socket",
                "/nonexistent",
                "flows",
                "--owner",
                "nobody",
            ]),
            &["--owner", "nobody", "dpu-hw, dpu-soc, spill"],
        ),
        (endpoint("--flows", "0"), &["--flows", "1..=65535"]),
        (
            endpoint("--pps", "1000000000000"),
            &["--pps", "0..=100000000"],
        ),
        (endpoint("--size", "10"), &["--size", "64..=131072"]),
        (
            endpoint("--sport-base", "0"),
            &["--sport-base", "1..=65535"],
        ),
        (endpoint("--queue-size", "0"), &["--queue-size", "8..=4096"]),
        (
            endpoint("--buf-bytes", "1"),
            &["--buf-bytes", "256..=131072"],
        ),
        (
            owned(&["bench", "datapath", "--batch", "0"]),
            &["--batch", "1..=256"],
        ),
        (
            owned(&["bench", "datapath", "--cpu", "5000"]),
            &["--cpu", "0..=1023"],
        ),
        (
            owned(&["bench", "datapath", "--flows", "0"]),
            &["--flows", "1..=16777216"],
        ),
        (
            owned(&["bench", "sim", "--runs", "0"]),
            &["--runs", "1..=100"],
        ),
        (
            owned(&["stability", "rank", "--trace", "t.csv", "--k", "0"]),
            &["--k", "1..=1000000"],
        ),
        (
            owned(&[
                "stability",
                "gen",
                "--seed",
                "1",
                "--ticks",
                "0",
                "--out",
                "x",
            ]),
            &["--ticks", "1..=20000000"],
        ),
        (
            owned(&["stability", "eval", "--k", "5,0"]),
            &["--k", "1..=1000000"],
        ),
        (
            owned(&[
                "spill-plane",
                "--config",
                "x",
                "--vnic-socket",
                "y",
                "--clock-origin-ns",
                "1",
                "--workers",
                "0",
            ]),
            &["--workers", "1..=1024"],
        ),
        (
            owned(&["pcap", "inspect", "x.pcap", "--vxlan-port", "0"]),
            &["--vxlan-port", "1..=65535"],
        ),
    ];
    for (args, wanted) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_usage_error(&args, wanted);
    }
}

#[test]
fn ctl_connect_error_prints_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock");
    let o = spillway(&["ctl", "--socket", sock.to_str().unwrap(), "status"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("cannot connect to control socket"), "{e}");
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
}

/// `examples/testbed-shm-vms.toml` with the second `[[vm]]`'s `port = 2` replaced by `port`,
/// written to `dir`; returns the path and the 1-based line of the replaced line.
fn testbed_with_port(dir: &Path, port: &str) -> (PathBuf, usize) {
    let text = std::fs::read_to_string(example("testbed-shm-vms.toml")).unwrap();
    let at = text
        .find("port = 2\n")
        .expect("the example's second vm has port 2");
    let line = text[..at].matches('\n').count() + 1;
    let text = format!("{}port = {port}\n{}", &text[..at], &text[at + 9..]);
    let path = dir.join("bad.toml");
    std::fs::write(&path, text).unwrap();
    (path, line)
}

#[test]
fn ctl_config_type_error_names_the_field_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let (path, line) = testbed_with_port(dir.path(), "\"two\"");
    let o = spillway(&["ctl", "--config", path.to_str().unwrap(), "status"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    let want = format!(
        "{}:{line}:8: vm[1].port: expected a field of the documented type (docs/CONFIG.md), got invalid type",
        path.display()
    );
    assert!(e.contains(&want), "expected {want:?} in: {e}");
    assert!(!e.contains("at byte"), "{e}");
}

#[test]
fn errors_do_not_echo_a_200_kb_value() {
    let dir = tempfile::tempdir().unwrap();
    let big = "A".repeat(200_000);
    let (path, _) = testbed_with_port(dir.path(), &format!("\"{big}\""));
    let o = spillway(&["ctl", "--config", path.to_str().unwrap(), "status"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{}", &e[..e.len().min(500)]);
    assert!(e.len() < 2_000, "{} bytes of stderr", e.len());
    assert!(
        e.contains("vm[1].port") && e.contains("bytes in all)"),
        "{e}"
    );
    // The same for a value on the command line that clap quotes (the kernel takes at most
    // 128 KiB per argument).
    let o = spillway(&[
        "ctl",
        "--socket",
        "/nonexistent",
        "flows",
        "--owner",
        &big[..100_000],
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(e.len() < 4_000, "{} bytes of stderr", e.len());
    assert!(e.contains("--owner"), "{e}");
}

#[test]
fn pcap_run_rejects_an_ingress_port_the_policy_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.pcap");
    let o = spillway(&[
        "pcap",
        "run",
        "--config",
        &example("policy-basic.toml"),
        "--in",
        &example("pipeline-in.pcap"),
        "--out",
        out.to_str().unwrap(),
        "--ingress-port",
        "4294967295",
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("--ingress-port: expected the uplink port 0 or a VM port of")
            && e.contains("10, 11, 12")
            && e.contains("got 4294967295"),
        "{e}"
    );
    assert!(o.stdout.is_empty(), "no verdicts on a rejected flag");
    // A port the policy has is accepted.
    let o = spillway(&[
        "pcap",
        "run",
        "--config",
        &example("policy-basic.toml"),
        "--in",
        &example("pipeline-in.pcap"),
        "--out",
        out.to_str().unwrap(),
        "--ingress-port",
        "10",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A classic little-endian pcap (snaplen 2^31 - 1) with one record of `len` captured bytes,
/// complete; `extra` bytes are dropped from the end (a truncated file).
fn pcap_with_record(len: u32, missing: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&0x7fff_ffffu32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes()); // Ethernet
    f.extend_from_slice(&[0; 8]); // ts
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(&len.to_le_bytes());
    f.resize(f.len() + len as usize - missing, 0xab);
    f
}

#[test]
fn a_complete_16_mb_pcap_record_is_reported_as_over_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pcap");
    std::fs::write(&path, pcap_with_record(16 << 20, 0)).unwrap();
    let o = spillway(&["pcap", "inspect", path.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("record 0 at byte 24: captured length 16777216 bytes is larger than the limit of 262144 bytes"),
        "{e}"
    );
    assert!(!e.contains("unexpected end of file"), "{e}");

    // A record at the limit is read; a truncated one says how much of it is there.
    std::fs::write(&path, pcap_with_record(262_144, 0)).unwrap();
    let o = spillway(&["pcap", "inspect", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1);
    std::fs::write(&path, pcap_with_record(1000, 10)).unwrap();
    let e = stderr(&spillway(&["pcap", "inspect", path.to_str().unwrap()]));
    assert!(
        e.contains("record 0 at byte 24: the file ends after 990 of its 1000 bytes"),
        "{e}"
    );
}
