//! End to end: what `spillway run` trusts at start-up. Each test writes a testbed with names
//! unique to the test and process and starts the real binary: a `ctl_socket` that names an
//! ordinary file, or the socket of another running testbed, fails the start and leaves that
//! file, socket and lock as they were; under `umask 000` the sockets still get mode 0600 (a VM
//! port's owned by the uid the testbed names), an unprivileged process and a root process that
//! is not the plane, both connecting to the vNIC socket in a loop during `ctl activate`, get no
//! file descriptor, and the real plane still attaches. Needs root, `ip` and `python3` (the
//! connectors); under `CI=true` a missing one fails the test.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::fs::PermissionsExt as _;

static SERIAL: Mutex<()> = Mutex::new(());
static NEXT: AtomicU32 = AtomicU32::new(0);

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const PYTHON: &str = "/usr/bin/python3";

/// A testbed file with VMs `a` and `b`; `ops` goes into `[ops]`, `vm_b` into VM `b`'s table.
fn testbed(dir: &Path, ops: &str, vm_b: &str) -> (String, PathBuf) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("t{:x}", (std::process::id() % 0xffff) * 16 + n % 16);
    let config = dir.join(format!("{name}.toml"));
    let text = format!(
        r#"
[testbed]
name = "{name}"
state_dir = "{state}"
hold = "released"
[ops]
{ops}
[spill]
cpus = "0"
memory_max = "256M"
{policy}
[[vm]]
name = "a"
port = 1
[[vm]]
name = "b"
port = 2
{vm_b}
"#,
        policy = common::two_port_policy("10.67.0", None),
        state = dir.display(),
    );
    std::fs::write(&config, text).unwrap();
    (name, config)
}

/// `spillway run` on `config` (through `sh` to set `umask`); stops it with SIGINT when dropped.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    fn spawn(config: &Path, umask: &str) -> Daemon {
        let dir = config.parent().unwrap();
        let stem = config.file_stem().unwrap().to_string_lossy().into_owned();
        let log = dir.join(format!("{stem}.log"));
        let ready = dir.join(format!("{stem}.ready"));
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask}; exec \"$0\" run --config \"$1\" --ready-file \"$2\" --log info"
            ))
            .arg(BIN)
            .arg(config)
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(s) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                panic!("spillway run exited ({s}) before ready: {}", d.log());
            }
            assert!(Instant::now() < deadline, "not ready: {}", d.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own unreaped child.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_once(config: &Path) -> Output {
    Command::new(BIN)
        .args(["run", "--config"])
        .arg(config)
        .args(["--log", "warn"])
        .output()
        .unwrap()
}

fn ctl(config: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["ctl", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn netns_left(name: &str) -> bool {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with(&format!("{name}-")))
}

#[test]
fn a_ctl_socket_at_an_ordinary_file_fails_the_start_and_leaves_the_file() {
    if !spillway_testkit::prerequisites(&["ip", PYTHON]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, "operator's data").unwrap();
    let (name, config) = testbed(
        dir.path(),
        &format!("ctl_socket = \"{}\"", precious.display()),
        "",
    );
    let out = run_once(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started on an ordinary file: {err}");
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap(),
        "operator's data",
        "the file named by ctl_socket must be left as it was"
    );
    assert!(
        !dir.path().join("precious.txt.lock").exists(),
        "no lock file created next to it"
    );
    assert!(!netns_left(&name), "the failed start left namespaces");
    assert!(!dir.path().join(format!("{name}.ledger")).exists());
}

#[test]
fn a_second_testbed_on_a_running_testbeds_ctl_socket_fails_and_leaves_it() {
    if !spillway_testkit::prerequisites(&["ip", PYTHON]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared.ctl");
    let ops = format!("ctl_socket = \"{}\"", shared.display());
    let (_first, config1) = testbed(dir.path(), &ops, "");
    let (second, config2) = testbed(dir.path(), &ops, "");
    let mut d1 = Daemon::spawn(&config1, "022");
    let lock = dir.path().join("shared.ctl.lock");
    let (sock_ino, lock_ino) = (
        std::fs::metadata(&shared).unwrap().ino(),
        std::fs::metadata(&lock).unwrap().ino(),
    );
    let out = run_once(&config2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "two testbeds on one socket: {err}");
    assert!(err.contains("another") || err.contains("running"), "{err}");
    // The first testbed's socket and lock are the same files, and it still answers.
    assert_eq!(std::fs::metadata(&shared).unwrap().ino(), sock_ino);
    assert_eq!(std::fs::metadata(&lock).unwrap().ino(), lock_ino);
    assert!(ctl(&config1, &["status"])["phase"].is_string());
    assert!(!netns_left(&second), "the failed start left namespaces");
    d1.stop();
}

/// A Python loop connecting to `path` for `secs` seconds as `uid`, counting the fds it
/// receives; prints JSON.
fn connector(path: &Path, secs: f64, uid: Option<u32>) -> Child {
    let script = r#"
import socket, sys, time, json
path, secs = sys.argv[1], float(sys.argv[2])
conns = fds = 0
errors = {}
end = time.time() + secs
while time.time() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        errors[str(e.errno)] = errors.get(str(e.errno), 0) + 1
        s.close()
        time.sleep(0.001)
        continue
    conns += 1
    s.settimeout(0.2)
    try:
        msg, anc, flags, addr = s.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += len(data) // 4
    except OSError:
        pass
    s.close()
print(json.dumps({"connects": conns, "fds": fds, "errors": errors}))
"#;
    let mut c = Command::new(PYTHON);
    c.args(["-c", script])
        .arg(path)
        .arg(secs.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt as _;
        c.uid(uid).gid(uid);
    }
    c.spawn().unwrap()
}

fn report(c: Child) -> serde_json::Value {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "connector: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn under_umask_000_only_the_plane_we_started_gets_the_vnic_rings() {
    if !spillway_testkit::prerequisites(&["ip", PYTHON]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // Let other users look inside (as a 0755 run directory does); the sockets must hold.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // VM b: a shared-memory port whose endpoint must run as uid 4242.
    let (name, config) = testbed(
        dir.path(),
        "",
        "backend = \"shm\"\nendpoint = \"external\"\nuid = 4242",
    );
    let mut d = Daemon::spawn(&config, "000");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    let vnic = dir.path().join(format!("{name}-vnic.sock"));
    let vm = dir.path().join(format!("{name}-vm-b.sock"));
    let ctl_sock = dir.path().join(format!("{name}.ctl"));
    assert_eq!(mode(&vnic), 0o600, "vNIC socket under umask 000");
    assert_eq!(mode(&ctl_sock), 0o600, "ctl socket under umask 000");
    assert_eq!(mode(&vm), 0o600, "VM port socket under umask 000");
    assert_eq!(
        std::fs::metadata(&vm).unwrap().uid(),
        4242,
        "owned by the VM's uid"
    );
    assert_eq!(
        mode(&dir.path().join(format!("{name}.ledger"))),
        0o600,
        "ledger under umask 000"
    );
    let nobody = connector(&vnic, 6.0, Some(65534));
    let root = connector(&vnic, 6.0, None);
    // A root process is not the VM's uid 4242 either.
    let vm_root = connector(&vm, 1.0, None);
    std::thread::sleep(Duration::from_millis(500));
    ctl(&config, &["activate"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = ctl(&config, &["status"]);
        if s["phase"] == "active" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the plane did not attach: {s:#}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (nobody, root, vm_root) = (report(nobody), report(root), report(vm_root));
    eprintln!("uid 65534: {nobody}; root: {root}; root on the VM port: {vm_root}");
    assert_eq!(nobody["fds"], 0, "{nobody}");
    assert_eq!(
        nobody["connects"], 0,
        "mode 0600 keeps uid 65534 out: {nobody}"
    );
    assert_eq!(root["fds"], 0, "{root}");
    assert!(root["connects"].as_u64().unwrap() > 0, "{root}");
    let s = ctl(&config, &["status"]);
    assert_eq!(s["phase"], "active", "{s:#}");
    assert!(
        s["counters"]["rt.vnic.rejected"].as_u64().unwrap() > 0,
        "{s:#}"
    );
    assert!(
        s["counters"]["rt.vm.rejected"].as_u64().unwrap() > 0,
        "{s:#}"
    );
    assert_eq!(s["counters"]["rt.plane.failures"], 0, "{s:#}");
    d.stop();
    assert!(!netns_left(&name));
}
