//! Helpers shared by the CLI's integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The repository root (examples/ lives there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// True when tshark runs. When it does not: under `CI=true` this panics (CI installs tshark, so
/// its absence is a broken CI image, not a reason to skip); elsewhere it prints a skip message
/// naming `test` and returns false.
pub fn tshark_available(test: &str) -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        other => {
            let why = match other {
                Ok(o) => format!("`tshark --version` exited with {}", o.status),
                Err(e) => format!("cannot run tshark: {e}"),
            };
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{test}: {why}; CI=true requires tshark (.ci/run installs it)");
            }
            eprintln!("SKIPPED {test}: {why}; install tshark to run this comparison");
            false
        }
    }
}

/// A tshark command isolated from any personal Wireshark profile (HOME is `home`).
pub fn tshark(home: &Path) -> Command {
    let mut cmd = Command::new("tshark");
    cmd.env("HOME", home).env("XDG_CONFIG_HOME", home);
    cmd
}

/// `spillway pcap inspect <capture>`: one JSON record per frame.
pub fn inspect_records(capture: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["pcap", "inspect"])
        .arg(capture)
        .output()
        .expect("running spillway");
    assert!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// tshark's `fields` for every frame of `capture`, one tab-separated line per frame, every
/// occurrence of a field comma-separated (outer before inner). Reassembly is off: a capture of
/// single fragments never completes a datagram, and with it on tshark hides the first
/// fragment's transport header, which our parser (and the flow key) reads. HOME is `home`, so
/// no personal Wireshark profile changes the dissection.
pub fn tshark_fields(home: &Path, capture: &Path, fields: &[&str]) -> Vec<String> {
    let mut cmd = tshark(home);
    cmd.arg("-r")
        .arg(capture)
        .args(["-o", "ip.defragment:FALSE", "-o", "ipv6.defragment:FALSE"])
        .args(["-T", "fields", "-E", "occurrence=a", "-E", "separator=/t"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let ts = cmd.output().expect("running tshark");
    assert!(
        ts.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&ts.stderr)
    );
    String::from_utf8(ts.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every occurrence of a tshark field, in tshark's order (outer before inner).
pub fn occurrences(s: &str) -> Vec<&str> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split(',').collect()
    }
}

/// The last (innermost) occurrence of a tshark field.
pub fn last(s: &str) -> Option<&str> {
    occurrences(s).last().copied()
}

/// `program` to run inside network namespace `ns` (`ip netns exec`).
pub fn netns_exec(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// Waits up to 10 s until something listens on TCP `port` in namespace `ns` (asked with `ss`).
pub fn wait_listening(ns: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = netns_exec(ns, "ss")
            .args(["-ltnH"])
            .output()
            .expect("run ss");
        if String::from_utf8_lossy(&out.stdout).contains(&format!(":{port} ")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port} in {ns}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `spillway run` (the binary `bin`) on testbed `config` with `--hold hold` and
/// `--log level`, its log in `dir/daemon.log`, and waits up to `within` for its ready file;
/// panics with the log if it exits or is not ready by then.
pub fn spawn_run(
    bin: &str,
    config: &Path,
    dir: &Path,
    hold: &str,
    level: &str,
    within: Duration,
) -> std::process::Child {
    let ready = dir.join("ready");
    let _ = std::fs::remove_file(&ready);
    let log_path = dir.join("daemon.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut daemon = Command::new(bin)
        .args(["run", "--config"])
        .arg(config)
        .arg("--ready-file")
        .arg(&ready)
        .args(["--hold", hold, "--log", level])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn spillway run");
    let deadline = Instant::now() + within;
    while !ready.exists() {
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(s) = daemon.try_wait().unwrap() {
            panic!("spillway run exited ({s}) before ready: {}", log());
        }
        if Instant::now() >= deadline {
            let _ = daemon.kill();
            let _ = daemon.wait();
            panic!("not ready in {within:?}: {}", log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon
}

/// `spillway ctl --config config args...` (the binary `bin`), its JSON answer; panics with
/// its error output if it fails.
pub fn ctl(bin: &str, config: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin)
        .arg("ctl")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run spillway ctl");
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ctl prints JSON")
}

/// The daemon, stopped with SIGINT (it removes what it made) and reaped when dropped, also
/// when the test fails; [`Daemon::stop`] does it on purpose and returns the exit status.
pub struct Daemon(pub Option<std::process::Child>);

impl Daemon {
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.0.take()?;
        // SAFETY: kill(2) with our own child's pid and SIGINT touches no memory.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A child killed and reaped when dropped.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `within` for `f` to give `Some`.
pub fn wait_for<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The arguments of a throwaway `redis-server` on port 6380: nothing saved, reachable from
/// other namespaces (the fabric's VMs), for the tests' long-lived connections.
pub const REDIS_ARGS: &[&str] = &[
    "--port",
    "6380",
    "--save",
    "",
    "--appendonly",
    "no",
    "--protected-mode",
    "no",
];

/// A Python client in namespace `ns` holding one TCP connection to redis at `server`
/// (`address:port`) for `secs`: a PING every 20 ms, every PONG required within `timeout_s`.
/// It prints the PONGs and the longest time between two (ms), and exits non-zero if the
/// connection breaks or a reply is missing or late.
pub fn redis_pinger(ns: &str, server: &str, secs: u32, timeout_s: u32) -> std::process::Child {
    let (host, port) = server.rsplit_once(':').expect("address:port");
    let script = format!(
        "import socket,time,sys\n\
         s=socket.create_connection(('{host}',{port}),timeout={timeout_s})\n\
         s.settimeout({timeout_s})\n\
         end=time.time()+{secs}\n\
         n=0\n\
         last=None\n\
         gap=0.0\n\
         while time.time()<end:\n\
         \x20   s.sendall(b'PING\\r\\n')\n\
         \x20   r=b''\n\
         \x20   while not r.endswith(b'\\r\\n'):\n\
         \x20       c=s.recv(64)\n\
         \x20       if not c: sys.exit('connection closed after %d replies' % n)\n\
         \x20       r+=c\n\
         \x20   assert r==b'+PONG\\r\\n', r\n\
         \x20   t=time.monotonic()\n\
         \x20   if last is not None: gap=max(gap,t-last)\n\
         \x20   last=t\n\
         \x20   n+=1\n\
         \x20   time.sleep(0.02)\n\
         print(n, round(gap*1000,1))\n"
    );
    netns_exec(ns, "python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3")
}

/// Waits for `c` and returns its standard output; panics with both outputs if it failed.
pub fn finish(mut c: std::process::Child, what: &str) -> String {
    use std::io::Read;
    let status = c.wait().expect("wait");
    let (mut out, mut err) = (String::new(), String::new());
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{what} failed ({status}): {out} {err}");
    out
}

/// The `[policy]` of a testbed host with one tenant (VNI 100) and two ports in `{net}.0/24`:
/// port 1 (`02:00:00:00:00:0a`, `{net}.1`) and port 2 (`02:00:00:00:00:0b`, `{net}.2`). With
/// `allow = Some(protocol)` both ports are in security group 1, which lets `protocol` in from
/// the subnet; with `None` they have no security group.
pub fn two_port_policy(net: &str, allow: Option<&str>) -> String {
    let groups = if allow.is_some() {
        "security_groups = [1]\n"
    } else {
        ""
    };
    let mut s = format!(
        r#"[policy.host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"
[[policy.tenant]]
id = 1
vni = 100
router_mac = "02:00:00:00:01:01"
subnets = ["{net}.0/24"]
[[policy.port]]
id = 1
tenant = 1
mac = "02:00:00:00:00:0a"
ips = ["{net}.1"]
{groups}[[policy.port]]
id = 2
tenant = 1
mac = "02:00:00:00:00:0b"
ips = ["{net}.2"]
{groups}"#
    );
    if let Some(protocol) = allow {
        s.push_str(&format!(
            r#"[[policy.security_group]]
id = 1
tenant = 1
[[policy.security_group.rule]]
direction = "ingress"
priority = 1
action = "allow"
protocol = "{protocol}"
remote = "{net}.0/24"
"#
        ));
    }
    s
}
