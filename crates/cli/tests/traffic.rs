//! `spillway traffic gen|sink` end to end, with the real binary inside a network namespace the
//! test creates (named from the test's pid and a counter, with only `lo`, removed on drop, also
//! when a test panics). Proves: (1) at a fixed rate (20,000 pps for 1 s, 4 flows, 64-byte
//! payloads) the generator sends between 50 % and 100 % of rate x duration (the pacer never
//! exceeds the rate; a loaded 2-core machine may make it fall short) and the sink, with an 8 MB
//! SO_RCVBUF, receives exactly what was sent on all 4 flows with nothing lost or reordered;
//! (2) flat out for 1 s both report a positive rate and every documented JSON field;
//! (3) a sink stopped by SIGTERM before its idle timeout still prints its report, with what it
//! got; (4) bad arguments (`--dst nonsense`, `--size 5000`) exit with status 2 and a message
//! naming the flag, without needing root.
//!
//! (1) to (3) need root and `ip`; under `CI=true` a missing one fails the test, elsewhere it
//! prints why it skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const SINK: &str = "127.0.0.1:9000";

/// A network namespace with `lo` up; deleted when dropped (after a panic too).
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "swtr-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name };
        run_ok(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]));
        ns
    }

    /// `spillway ARGS` inside the namespace.
    fn spillway(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, BIN]).args(args);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run_ok(c: &mut Command) {
    let out = c.output().expect("spawn");
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sink started in the background; killed when dropped if still running.
struct Sink {
    child: Option<Child>,
}

impl Sink {
    fn start(ns: &Netns, dir: &Path) -> Sink {
        Sink::start_idle(ns, dir, "1")
    }

    fn start_idle(ns: &Netns, dir: &Path, idle: &str) -> Sink {
        let ready: PathBuf = dir.join("ready");
        let child = ns
            .spillway(&["traffic", "sink", "--bind", SINK, "--json", "--idle", idle])
            .args(["--rcvbuf", "8388608", "--wait", "30", "--ready-file"])
            .arg(&ready)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sink");
        let mut sink = Sink { child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            if let Some(s) = sink
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let out = sink.child.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "sink exited ({s}) before ready: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(Instant::now() < deadline, "sink not ready in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        sink
    }

    /// Waits for the sink to stop on its idle timeout; its JSON report.
    fn report(mut self) -> Value {
        let out = self.child.take().unwrap().wait_with_output().expect("sink");
        json_of("sink", &out)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn json_of(what: &str, out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}): {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: not one JSON object ({e}): {stdout}"))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer {key:?} in {v}"))
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key:?} in {v}"))
}

#[test]
fn paced_run_on_loopback_loses_nothing_and_never_exceeds_the_rate() {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let ns = Netns::new();
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start(&ns, dir.path());
    let out = ns
        .spillway(&["traffic", "gen", "--dst", SINK, "--rate", "20000"])
        .args(["--duration", "1", "--flows", "4", "--size", "64", "--json"])
        .output()
        .expect("gen");
    let g = json_of("gen", &out);
    let s = sink.report();
    let sent = u(&g, "sent");
    // The token bucket starts empty, so 1 s at 20,000 pps is at most 20,000 datagrams; half of
    // that is the floor a starved sender on a loaded machine still reaches.
    assert!((10_000..=20_000).contains(&sent), "sent {sent}: {g}");
    assert_eq!(u(&g, "send_errors"), 0, "{g}");
    assert_eq!(u(&g, "flows"), 4, "{g}");
    assert_eq!(u(&g, "size"), 64, "{g}");
    assert_eq!(u(&g, "bytes"), sent * 64, "{g}");
    assert!(
        s["rcvbuf_capped"] == Value::Bool(false),
        "the kernel capped the sink's SO_RCVBUF, loss would not mean anything: {s}"
    );
    assert_eq!(u(&s, "received"), sent, "sink {s} gen {g}");
    assert_eq!(u(&s, "bytes"), sent * 64, "{s}");
    assert_eq!(u(&s, "lost"), 0, "{s}");
    assert_eq!(u(&s, "reordered"), 0, "{s}");
    assert_eq!(u(&s, "foreign"), 0, "{s}");
    assert_eq!(u(&s, "flows"), 4, "{s}");
    assert_eq!(s["stopped_by"], "idle", "{s}");
}

#[test]
fn flat_out_reports_a_rate_and_every_field() {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let ns = Netns::new();
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start(&ns, dir.path());
    let out = ns
        .spillway(&["traffic", "gen", "--dst", SINK, "--duration", "1"])
        .args(["--flows", "8", "--size", "18", "--json"])
        .output()
        .expect("gen");
    let g = json_of("gen", &out);
    let s = sink.report();
    for key in [
        "sent",
        "seconds",
        "pps",
        "bytes",
        "flows",
        "size",
        "send_errors",
    ] {
        assert!(g.get(key).is_some(), "gen JSON lacks {key}: {g}");
    }
    for key in [
        "received",
        "seconds",
        "pps",
        "bytes",
        "lost",
        "reordered",
        "flows",
    ] {
        assert!(s.get(key).is_some(), "sink JSON lacks {key}: {s}");
    }
    assert!(g["rate"].is_null(), "{g}");
    assert_eq!(u(&g, "batch"), 64, "{g}");
    assert!(f(&g, "pps") > 0.0, "{g}");
    assert!(f(&g, "seconds") >= 1.0, "{g}");
    assert!(f(&s, "pps") > 0.0, "{s}");
    // Flat out the sink may fall behind and drop; it can never get more than was sent, and
    // what it counts as lost is what it did not get of what each flow had sent up to its last
    // received datagram.
    assert!(u(&s, "received") <= u(&g, "sent"), "sink {s} gen {g}");
    assert!(
        u(&s, "received") + u(&s, "lost") <= u(&g, "sent"),
        "{s} {g}"
    );
    assert_eq!(u(&s, "flows"), 8, "{s}");
}

#[test]
fn sigterm_stops_the_sink_with_its_report() {
    if !spillway_testkit::prerequisites(&["ip", "kill"]) {
        return;
    }
    let ns = Netns::new();
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start_idle(&ns, dir.path(), "600");
    let out = ns
        .spillway(&["traffic", "gen", "--dst", SINK, "--rate", "1000"])
        .args(["--duration", "0.2", "--flows", "2", "--json"])
        .output()
        .expect("gen");
    let g = json_of("gen", &out);
    // Loopback delivers while `gen` sends; the sink reads its queue well within 0.5 s (it
    // reports what it has read, not what is still queued when the signal comes).
    std::thread::sleep(Duration::from_millis(500));
    // `ip netns exec` execs the program, so the child's pid is the sink's.
    let pid = sink.child.as_ref().unwrap().id().to_string();
    run_ok(Command::new("kill").args(["-TERM", &pid]));
    let started = Instant::now();
    let s = sink.report();
    assert!(started.elapsed() < Duration::from_secs(5), "slow to stop");
    assert_eq!(s["stopped_by"], "signal", "{s}");
    assert_eq!(u(&s, "received"), u(&g, "sent"), "sink {s} gen {g}");
    assert_eq!(u(&s, "lost"), 0, "{s}");
}

#[test]
fn bad_arguments_name_the_flag() {
    for (args, flag) in [
        (
            &["traffic", "gen", "--dst", "nonsense"][..],
            "--dst <IP:PORT>",
        ),
        (&["traffic", "gen", "--dst", "127.0.0.1:0"][..], "--dst"),
        (
            &["traffic", "gen", "--dst", "127.0.0.1:9", "--size", "5000"][..],
            "--size <BYTES>",
        ),
        (
            &["traffic", "gen", "--dst", "127.0.0.1:9", "--size", "17"][..],
            "--size <BYTES>",
        ),
        (
            &["traffic", "gen", "--dst", "127.0.0.1:9", "--batch", "0"][..],
            "--batch",
        ),
        (&["traffic", "sink", "--bind", "10.0.0.1"][..], "--bind"),
        (
            &["traffic", "sink", "--bind", "127.0.0.1:9", "--idle", "nan"][..],
            "--idle",
        ),
    ] {
        let out = Command::new(BIN).args(args).output().expect("spawn");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    // Over IPv6 the payload must fit 1452 bytes: a runtime error (status 1) naming --size.
    let out = Command::new(BIN)
        .args(["traffic", "gen", "--dst", "[::1]:9", "--size", "1472"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--size 1472") && err.contains("1452"), "{err}");
}
