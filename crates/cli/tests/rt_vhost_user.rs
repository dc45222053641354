//! End to end with real guests: `spillway run` boots two QEMU guests (the small guest
//! `guest/build.sh` makes from Debian packages) whose virtio-net devices are vhost-user ports of
//! the DPU process. Guest a pings guest b, fetches b's web page (busybox `httpd`) and keeps long
//! TCP connections to b's echo server across the fabric, with the DPU alone, then with the
//! spill plane active (vATC on, off and on again: the plane writing into the guests' receive
//! queue 1 itself), then across a `kill -9` of the plane, which a connection the plane owned
//! survives; on the way out no QEMU, socket or ledger is left.
//!
//! Needs root and QEMU (`.ci/run` installs it and builds the guest). The guests run on KVM
//! where `/dev/kvm` runs a guest and under TCG otherwise (this machine's nested KVM prints
//! nothing, and the probe falls back to TCG); the daemon's log says which.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Child;

use spillway_rt::vm::qemu::{Accel, GuestSpec, QemuGuest, vhost_user_nic};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// The guest's kernel and initramfs, built by `guest/build.sh` if they are not up to date.
fn guest_dir() -> Option<PathBuf> {
    spillway_testkit::small_guest(&common::repo_root())
}

struct Bed {
    name: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    daemon: Option<Child>,
}

impl Bed {
    /// A testbed of guests a and b; `b_extra` is more of b's `[[vm]]` table.
    fn start(guests: &Path, b_extra: &str) -> Bed {
        Bed::start_on(guests, b_extra, 1)
    }

    /// [`Bed::start`] with the DPU process forwarding on `threads` threads (one per shard).
    fn start_on(guests: &Path, b_extra: &str, threads: u32) -> Bed {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("vu{:x}", (std::process::id() % 0xffff) * 16 + n % 16);
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("testbed.toml");
        let text = format!(
            r#"
[testbed]
name = "{name}"
state_dir = "{state}"
guest_dir = "{guests}"
[spill]
cpus = "1"
memory_max = "512M"
[fabric.host]
heartbeat = "100ms"
vatc = true
# The plane keeps what it takes (no recall): the kill below hits connections it owns.
[fabric.placement]
policy = "none"
[fabric.dpu]
shards = {threads}
{policy}
[[vm]]
name = "a"
port = 1
backend = "vhost-user"
guest_cmdline = "spillway.ping=10.67.0.2 spillway.fetch=10.67.0.2 spillway.fetchbig=10.67.0.2 spillway.hold=10.67.0.2:9000"
[[vm]]
name = "b"
port = 2
backend = "vhost-user"
{b_extra}
"#,
            policy = common::two_port_policy("10.67.0", Some("any")),
            state = dir.path().display(),
            guests = guests.display(),
        );
        std::fs::write(&config, text).expect("write testbed");
        let mut bed = Bed {
            name,
            dir,
            config,
            daemon: None,
        };
        bed.run();
        bed
    }

    /// Starts `spillway run` on the bed.
    fn run(&mut self) {
        // Two guests, each probed on KVM for up to 5 s before TCG.
        let within = Duration::from_secs(60);
        let d = common::spawn_run(
            BIN,
            &self.config,
            self.dir.path(),
            "released",
            "info",
            within,
        );
        self.daemon = Some(d);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    fn console(&self, vm: &str) -> String {
        let p = self
            .dir
            .path()
            .join(format!("{}-vm-{vm}.console", self.name));
        std::fs::read_to_string(p).unwrap_or_default()
    }

    fn ctl(&self, args: &[&str]) -> serde_json::Value {
        common::ctl(BIN, &self.config, args)
    }

    /// Waits until guest a's console has `n` more lines starting with `what` than `since`
    /// counted; returns the new count.
    fn wait_lines(&self, what: &str, since: usize, n: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let got = self.console("a").matches(what).count();
            if got >= since + n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{got} x {what:?} (wanted {}) after {within:?}; console a: {}\nconsole b: {}\ndaemon: {}",
                since + n,
                self.console("a"),
                self.console("b"),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until guest a has fetched all of b's 256 KiB `/big` (with the response's headers).
    fn wait_big_fetch(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let console = self.console("a");
            let full = console
                .lines()
                .filter_map(|l| l.trim().strip_prefix("spillway-guest fetched-big "))
                .filter_map(|n| n.trim().parse::<u64>().ok())
                .any(|n| n >= 256 * 1024);
            if full {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no full 256 KiB fetch in {within:?}; console a: {console}\ndaemon: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Guest a's long connections: the last echo seen on each, by connection number.
    fn held(&self) -> std::collections::BTreeMap<u32, u32> {
        let mut m = std::collections::BTreeMap::new();
        for l in self.console("a").lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if let ["spillway-guest", "held", n, k] = w[..]
                && let (Ok(n), Ok(k)) = (n.parse::<u32>(), k.parse::<u32>())
            {
                let e = m.entry(n).or_insert(0);
                *e = (*e).max(k);
            }
        }
        m
    }

    /// Waits for the latest long connection whose first echo is past byte `from` of guest a's
    /// console and whose number `pick` accepts to have `echoes` echoes; returns (number, last
    /// echo).
    fn wait_held(
        &self,
        from: usize,
        pick: impl Fn(u32) -> bool,
        echoes: u32,
        within: Duration,
    ) -> (u32, u32) {
        let deadline = Instant::now() + within;
        loop {
            let console = self.console("a");
            let started: Vec<u32> = console
                .get(from..)
                .unwrap_or("")
                .lines()
                .filter_map(|l| l.trim().strip_prefix("spillway-guest held "))
                .filter_map(|r| r.strip_suffix(" 0"))
                .filter_map(|n| n.parse().ok())
                .filter(|&n| pick(n))
                .collect();
            let held = self.held();
            if let Some(&n) = started.iter().max()
                && held.get(&n).is_some_and(|&k| k >= echoes)
            {
                return (n, held[&n]);
            }
            assert!(
                Instant::now() < deadline,
                "no long connection with {echoes} echoes after byte {from} in {within:?}: {held:?}\nconsole a: {console}\nconsole b: {}",
                self.console("b")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until long connection `n` has echoed `k` times.
    fn wait_held_past(&self, n: u32, k: u32, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let held = self.held();
            if held.get(&n).is_some_and(|&got| got >= k) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "long connection {n} stopped short of {k} echoes: {held:?}\ndaemon: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the plane's own stats say its direct delivery is `on`.
    fn wait_plane_vatc(&self, on: bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.ctl(&["status"]);
            if s["plane"]["stats"]["vatc"] == on {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the plane's vatc is not {on}: {s:#}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_phase(&self, phase: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let s = self.ctl(&["status"]);
            if s["phase"] == phase {
                return;
            }
            assert!(Instant::now() < deadline, "not {phase}: {s:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut d = self.daemon.take()?;
        // SAFETY: signalling our own unreaped child.
        unsafe {
            libc::kill(d.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = d.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = d.kill();
                return d.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.stop();
    }
}

const PONG: &str = "spillway-guest pong";

fn counter(s: &serde_json::Value, key: &str) -> u64 {
    s["counters"][key].as_u64().unwrap_or(0)
}

fn plane_counter(s: &serde_json::Value, key: &str) -> u64 {
    s["plane"]["stats"]["counters"][key].as_u64().unwrap_or(0)
}
const FETCHED: &str = "spillway-guest fetched hello from a spillway guest";

#[test]
fn two_guests_ping_and_fetch_across_vhost_user_ports_through_plane_and_kill() {
    let Some(guests) = guest_dir() else {
        return;
    };
    // b echoes what a's long TCP connections send (a new one every 10 s, each 90 s long).
    let mut bed = Bed::start(&guests, "guest_cmdline = \"spillway.echo=9000\"");
    let s = bed.ctl(&["status"]);
    let ports = s["vm_ports"].as_array().expect("vm_ports").clone();
    assert_eq!(ports.len(), 2, "{s:#}");
    let pids: Vec<u64> = ports
        .iter()
        .filter_map(|p| p["guest_pid"].as_u64())
        .collect();
    assert_eq!(pids.len(), 2, "both guests run: {s:#}");
    eprintln!(
        "guests on {:?}",
        ports.iter().map(|p| p["accel"].clone()).collect::<Vec<_>>()
    );

    // The DPU alone: ICMP and an HTTP fetch (TCP) from a to b.
    let pongs = bed.wait_lines(PONG, 0, 3, Duration::from_secs(120));
    let fetched = bed.wait_lines(FETCHED, 0, 1, Duration::from_secs(60));
    // 256 KiB from b's httpd: with TSO both ways, as 64 KiB super-frames that cross whole.
    bed.wait_big_fetch(Duration::from_secs(60));
    let s = bed.ctl(&["status"]);
    for p in s["vm_ports"].as_array().unwrap() {
        assert_eq!(p["attached"], true, "{s:#}");
        // Linux takes mergeable receive buffers when offered: a super-frame then spans pages.
        assert_eq!(p["mergeable_rx"], true, "{s:#}");
        // And event indices (VIRTIO_RING_F_EVENT_IDX, bit 29): interrupts and kicks at the
        // entries each side asks for.
        let acked = p["features"]
            .as_str()
            .and_then(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok())
            .expect("features");
        assert_ne!(acked & (1 << 29), 0, "{s:#}");
    }
    let c = &s["counters"];
    eprintln!(
        "after the 256 KiB fetch: {} frames from the guests, {} GSO; {} GSO into them, {} \
         across several buffers",
        c["rt.rx.frames"],
        c["rt.vm.from_guest.gso"],
        c["rt.vm.to_guest.gso"],
        c["rt.vm.to_guest.merged"]
    );
    for k in [
        "rt.vm.from_guest.gso",
        "rt.vm.to_guest.gso",
        "rt.vm.to_guest.merged",
    ] {
        assert!(c[k].as_u64().unwrap_or(0) > 0, "no {k}: {s:#}");
    }
    for k in [
        "rt.vm.desc.bad",
        "rt.vm.rx.offload_refused",
        "rt.vm.detached",
    ] {
        assert_eq!(c[k].as_u64().unwrap_or(0), 0, "{k}: {s:#}");
    }

    // The plane active: every new connection goes through it.
    // A long connection opened with the DPU alone: it stays the DPU's through activation.
    let dpu_era = bed.wait_held(0, |_| true, 4, Duration::from_secs(30));
    let activated_at = bed.console("a").len();
    bed.ctl(&["activate"]);
    bed.wait_phase("active", Duration::from_secs(20));
    let pongs = bed.wait_lines(PONG, pongs, 3, Duration::from_secs(30));
    let fetched = bed.wait_lines(FETCHED, fetched, 2, Duration::from_secs(30));
    let s = bed.ctl(&["status"]);
    assert!(
        s["counters"]["rt.steered.frames"].as_u64().unwrap_or(0) > 0,
        "nothing went through the plane: {s:#}"
    );

    // vATC on (the testbed's default here): the plane writes the frames it processed straight
    // into each guest's receive queue 1, lent by the DPU process, translating through its
    // vATC; off, they go back through the DPU. Crossings per packet the DPU took in, over
    // the same traffic both ways.
    let window = |bed: &Bed, pongs: usize, fetched: usize| {
        let before = bed.ctl(&["status"]);
        let p = bed.wait_lines(PONG, pongs, 3, Duration::from_secs(30));
        let f = bed.wait_lines(FETCHED, fetched, 1, Duration::from_secs(30));
        let after = bed.ctl(&["status"]);
        let d = |k: &str| counter(&after, k) - counter(&before, k);
        let per_packet = d("pcie.crossings") as f64 / d("dpu.rx.packets").max(1) as f64;
        let delivered = plane_counter(&after, "plane.vatc.delivered")
            - plane_counter(&before, "plane.vatc.delivered");
        (p, f, per_packet, delivered, after)
    };
    let (pongs, fetched, on, delivered, s) = window(&bed, pongs, fetched);
    assert!(
        delivered > 0,
        "nothing delivered by the plane into a guest: {s:#}"
    );
    for k in [
        "plane.vatc.bad_desc",
        "plane.vatc.broken",
        "plane.vatc.not_lent",
    ] {
        assert_eq!(plane_counter(&s, k), 0, "{k}: {s:#}");
    }
    let r = bed.ctl(&["vatc", "off"]);
    assert_eq!(r["vatc"], false, "{r:#}");
    // The plane takes the switch on its control channel: the window starts once it says so.
    bed.wait_plane_vatc(false);
    let (pongs, fetched, off, delivered_off, s) = window(&bed, pongs, fetched);
    assert_eq!(delivered_off, 0, "vATC off, yet the plane delivered: {s:#}");
    eprintln!(
        "crossings per packet the DPU took in: {on:.2} with vATC ({delivered} frames into guests \
         by the plane), {off:.2} without"
    );
    assert!(on < off, "vATC saves no crossing: {on:.2} on, {off:.2} off");
    bed.ctl(&["vatc", "on"]);
    bed.wait_plane_vatc(true);
    let (pongs, fetched, _, delivered, s) = window(&bed, pongs, fetched);
    assert!(delivered > 0, "vATC on again, nothing delivered: {s:#}");

    // A long connection opened while the plane is active (the latest, so the longest left to
    // run): the plane owns it, with its state mirrored to the DPU.
    let plane_era = bed.wait_held(activated_at, |n| n > dpu_era.0, 4, Duration::from_secs(30));
    let before = bed.held();
    assert!(
        before[&dpu_era.0] > dpu_era.1,
        "the connection opened before activation broke: {before:?}"
    );
    // The plane owns long connections to b's echo port (opened while its buckets are live).
    let flows = bed.ctl(&["flows", "--owner", "spill"]);
    assert!(
        flows["flows"]
            .as_array()
            .is_some_and(|f| f.iter().any(|r| r["flow"]
                .as_str()
                .is_some_and(|k| k.contains("> 10.67.0.2:9000")))),
        "no long connection owned by the plane: {flows:#}"
    );

    // kill -9 of the plane: the DPU fails open, a new plane comes up, the guests go on.
    let pid = s["plane"]["pid"].as_u64().expect("a plane runs");
    // SAFETY: kill(2) with a pid read from the daemon; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let pongs = bed.wait_lines(PONG, pongs, 3, Duration::from_secs(30));
    let fetched = bed.wait_lines(FETCHED, fetched, 2, Duration::from_secs(30));
    let s = bed.ctl(&["status"]);
    assert!(
        s["counters"]["dpu.failopen"].as_u64().unwrap_or(0) >= 1,
        "{s:#}"
    );
    // The connection the dead plane owned goes on (the DPU failed open with its state).
    bed.wait_held_past(
        plane_era.0,
        before[&plane_era.0] + 6,
        Duration::from_secs(30),
    );
    // The new plane is lent the guests' queues in turn (the old one held none when it died,
    // or its hold was cleared) and delivers into them.
    bed.wait_phase("active", Duration::from_secs(20));
    let (_, _, _, delivered, s) = window(&bed, pongs, fetched);
    assert!(
        delivered > 0,
        "the new plane delivered nothing into a guest: {s:#}"
    );

    let status = bed.stop().expect("the daemon ran");
    assert!(
        status.success(),
        "spillway run exited with {status}: {}",
        bed.log()
    );
    for pid in pids {
        assert!(
            !spillway_testkit::process_alive(pid),
            "QEMU {pid} outlived the run"
        );
    }
    let left: Vec<_> = std::fs::read_dir(bed.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock") || n.ends_with(".ledger"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Two forwarding threads (`fabric.dpu.shards = 2`) in front of vhost-user guests. A guest's
/// receive queue has one producer, so thread 0 writes every frame into the guests: thread 1
/// hands it those of its connections (`rt.handoff.to_port`), and thread 0 hands thread 1 the
/// frames it reads from the guests that are thread 1's (`rt.handoff.frames`). With the plane
/// active, its two threads deliver into the guests' lent queue 1 under one vATC; after
/// `kill -9` of the plane the DPU fails open and the guests go on.
#[test]
fn two_guests_across_vhost_user_ports_on_two_forwarding_threads() {
    let Some(guests) = guest_dir() else {
        return;
    };
    let mut bed = Bed::start_on(&guests, "guest_cmdline = \"spillway.echo=9000\"", 2);
    // A new TCP connection for every fetch (one a second), another every 10 s to the echo
    // port: a dozen connections over the two shards.
    let pongs = bed.wait_lines(PONG, 0, 3, Duration::from_secs(120));
    let fetched = bed.wait_lines(FETCHED, 0, 8, Duration::from_secs(60));
    bed.wait_big_fetch(Duration::from_secs(60));
    let held = bed.wait_held(0, |_| true, 4, Duration::from_secs(30));
    let s = bed.ctl(&["status"]);
    let per_thread = s["conns_per_thread"].as_array().expect("conns_per_thread");
    assert_eq!(per_thread.len(), 2, "{s:#}");
    for k in ["rt.handoff.to_port", "rt.handoff.frames"] {
        assert!(counter(&s, k) > 0, "no {k}: {s:#}");
    }
    for k in [
        "rt.handoff.full",
        "rt.lane.misrouted",
        "rt.vm.desc.bad",
        "rt.vm.detached",
    ] {
        assert_eq!(counter(&s, k), 0, "{k}: {s:#}");
    }
    eprintln!(
        "DPU alone on two threads: connections per thread {per_thread:?}, {} frames handed to \
         thread 0 for the guests, {} handed between threads from them",
        counter(&s, "rt.handoff.to_port"),
        counter(&s, "rt.handoff.frames")
    );

    bed.ctl(&["activate"]);
    bed.wait_phase("active", Duration::from_secs(20));
    let pongs = bed.wait_lines(PONG, pongs, 3, Duration::from_secs(30));
    let fetched = bed.wait_lines(FETCHED, fetched, 4, Duration::from_secs(30));
    let s = bed.ctl(&["status"]);
    assert!(
        counter(&s, "rt.steered.frames") > 0,
        "nothing steered: {s:#}"
    );
    assert!(
        plane_counter(&s, "plane.vatc.delivered") > 0,
        "the plane delivered nothing into a guest: {s:#}"
    );
    for k in ["rt.handoff.full", "rt.lane.misrouted"] {
        assert_eq!(counter(&s, k), 0, "{k}: {s:#}");
    }
    for k in ["plane.vatc.bad_desc", "plane.vatc.broken"] {
        assert_eq!(plane_counter(&s, k), 0, "{k}: {s:#}");
    }

    let pid = s["plane"]["pid"].as_u64().expect("a plane runs");
    let before = bed.held();
    // SAFETY: kill(2) with a pid read from the daemon; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    bed.wait_lines(PONG, pongs, 3, Duration::from_secs(30));
    bed.wait_lines(FETCHED, fetched, 2, Duration::from_secs(30));
    // The long connection opened with the DPU alone carries on through all of it.
    bed.wait_held_past(held.0, before[&held.0] + 4, Duration::from_secs(30));
    let s = bed.ctl(&["status"]);
    assert!(counter(&s, "dpu.failopen") >= 1, "{s:#}");
    bed.wait_phase("active", Duration::from_secs(20));

    let status = bed.stop().expect("the daemon ran");
    assert!(
        status.success(),
        "spillway run exited with {status}: {}",
        bed.log()
    );
}

/// Guest b run by the test (`endpoint = "external"`), on the socket the DPU process connects to.
fn external_guest(bed: &Bed, guests: &Path, n: u32) -> QemuGuest {
    let sock = bed.dir.path().join(format!("{}-vm-b.vhost.sock", bed.name));
    let spec = GuestSpec {
        qemu: "qemu-system-x86_64".into(),
        kernel: guests.join("vmlinuz"),
        initrd: guests.join("initramfs.cpio.gz"),
        memory_mib: 256,
        cpus: 2,
        cmdline: "spillway.ip=10.67.0.2/24".into(),
        console_log: bed.dir.path().join(format!("external-b-{n}.console")),
        accel: Accel::Auto,
        netdev: vhost_user_nic(&sock, "02:00:00:00:00:0b"),
    };
    let mut g = QemuGuest::start(&spec).expect("QEMU starts");
    g.wait_for("spillway-guest ready", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}"));
    g
}

/// Either side of a vhost-user port restarts under the other: QEMU (the DPU process connects
/// to its new socket) and the DPU process (it connects to the running QEMU's socket again, which
/// its exit left in place); guest a's pings to b resume each time.
#[test]
fn qemu_and_the_dpu_process_each_restart_under_the_other() {
    let Some(guests) = guest_dir() else {
        return;
    };
    let mut bed = Bed::start(&guests, "endpoint = \"external\"");
    let b = external_guest(&bed, &guests, 1);
    let pongs = bed.wait_lines(PONG, 0, 3, Duration::from_secs(120));

    // QEMU restarts: a new guest b on a new socket at the same path.
    drop(b);
    let b = external_guest(&bed, &guests, 2);
    bed.wait_lines(PONG, pongs, 3, Duration::from_secs(60));
    let s = bed.ctl(&["status"]);
    let port_b = &s["vm_ports"][1];
    assert!(port_b["connections"].as_u64().unwrap() >= 2, "{s:#}");

    // The DPU process restarts (guest a, its own, with it); b runs on.
    let status = bed.stop().expect("the daemon ran");
    assert!(status.success(), "{}", bed.log());
    let sock = bed.dir.path().join(format!("{}-vm-b.vhost.sock", bed.name));
    assert!(sock.exists(), "the run removed the external QEMU's socket");
    assert!(
        b.pid()
            .is_some_and(|p| spillway_testkit::process_alive(p.into()))
    );
    bed.run();
    bed.wait_lines(PONG, 0, 3, Duration::from_secs(120));
    drop(b);
}
