//! A hostile shared-memory VM cannot take another tenant's forwarding away. `spillway run` brings
//! up five VMs on shared-memory ports, with the spill plane active and vATC on: `a` and `b`
//! (tenant 1) are bridged to TAPs in their namespaces and ping each other; `c`, `d` and `e`
//! (tenant 2) are external endpoints. `d` is an ordinary `spillway vm-endpoint` generator sending
//! UDP to `c`, restarted with fresh source ports at every attack round so that its new
//! connections are the plane's to deliver (straight into `c`'s memory) while its older, recalled
//! ones are the DPU's. `c` and `e` are this file's test code speaking the VM-port protocol
//! directly (a memfd with virtqueues, two eventfds, the attach message), and misbehave: `c` keeps
//! every receive buffer of both its queues posted at an address outside every region (each
//! packet `d` sends it is a bad descriptor for whichever plane delivers it), `e` alternates
//! between flooding its port socket and keeping all 256 transmit descriptors posted as chained
//! (bad) descriptors, and attaches again whenever the DPU detaches it.
//!
//! The test pings `a` -> `b` (400 pings at 5 ms) with the hostile VMs quiet and under attack,
//! three rounds each, and requires what issue 13 asks: no ping lost under attack and the median
//! p99 RTT under attack within twice the quiet median p99 (plus 1 ms of slack for a shared
//! 2-core machine's scheduling, stated in the assertion). It also checks the counters that show
//! each budget at work: `e` detached for bad descriptors and for its socket flood, the DPU's
//! per-turn budget hit, `c`'s thousands of bad receive descriptors refused by the DPU without
//! `c` being detached (it stays under the threshold), and on the plane's side thousands of
//! refused deliveries into `c` answered from the negative translation cache: a handful of
//! translation requests in all, not one per packet.
//!
//! Needs root, `ip` and `ping`; under `CI=true` a missing one fails the test.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_rt::dpu::vmport;
use spillway_rt::shm::ring::Doorbell;
use spillway_rt::shm::virtq::{
    DESC_F_NEXT, DESC_F_WRITE, DriverQueue, QUEUE_RX_DPU, QUEUE_RX_PLANE, QUEUE_TX, VmLayout,
    VmMemory,
};
use spillway_rt::testbed::Testbed;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// The testbed: tenant 1 (`a`, `b`, bridged) and tenant 2 (`c`, `d`, `e`, external).
fn testbed_text(name: &str, state: &Path) -> String {
    let port = |id: u32, tenant: u32, ip: &str| {
        format!(
            "[[policy.port]]\nid = {id}\ntenant = {tenant}\nmac = \"02:00:00:00:0{tenant}:{id:02x}\"\n\
             ips = [\"{ip}\"]\nsecurity_groups = [{tenant}]\n"
        )
    };
    let sg = |tenant: u32, net: &str| {
        format!(
            "[[policy.security_group]]\nid = {tenant}\ntenant = {tenant}\n\
             [[policy.security_group.rule]]\ndirection = \"ingress\"\npriority = 1\n\
             action = \"allow\"\nprotocol = \"any\"\nremote = \"{net}\"\n"
        )
    };
    let vm = |name: &str, port: u32, endpoint: &str| {
        format!(
            "[[vm]]\nname = \"{name}\"\nport = {port}\nbackend = \"shm\"\nendpoint = \"{endpoint}\"\n"
        )
    };
    format!(
        r#"
[testbed]
name = "{name}"
state_dir = "{state}"
hold = "active"
[spill]
cpus = "1"
memory_max = "512M"
[fabric.host]
vatc = true
# Fail open only after 300 ms without a beat: the default 5 ms (15 ms) is for an idle host,
# and a plane restarted by a scheduling stall would reset the plane counters checked below.
heartbeat = "100ms"
[policy.host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"
[[policy.tenant]]
id = 1
vni = 100
router_mac = "02:00:00:00:01:fe"
subnets = ["10.68.0.0/24"]
[[policy.tenant]]
id = 2
vni = 200
router_mac = "02:00:00:00:02:fe"
subnets = ["10.69.0.0/24"]
{ports}{sgs}{vms}"#,
        state = state.display(),
        ports = [
            port(1, 1, "10.68.0.1"),
            port(2, 1, "10.68.0.2"),
            port(3, 2, "10.69.0.1"),
            port(4, 2, "10.69.0.2"),
            port(5, 2, "10.69.0.3"),
        ]
        .concat(),
        sgs = [sg(1, "10.68.0.0/24"), sg(2, "10.69.0.0/24")].concat(),
        vms = [
            vm("a", 1, "bridge"),
            vm("b", 2, "bridge"),
            vm("c", 3, "external"),
            vm("d", 4, "external"),
            vm("e", 5, "external"),
        ]
        .concat(),
    )
}

/// The running testbed; stopped (SIGINT, then its own cleanup) when dropped.
struct Bed {
    name: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    daemon: Option<Child>,
}

impl Bed {
    fn start() -> Bed {
        let name = format!("hv{:x}", std::process::id() % 0xfffff);
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("testbed.toml");
        std::fs::write(&config, testbed_text(&name, dir.path())).expect("write testbed");
        let ready = dir.path().join("ready");
        let log = std::fs::File::create(dir.path().join("daemon.log")).expect("log file");
        let daemon = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .arg("--ready-file")
            .arg(&ready)
            .args(["--log", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn spillway run");
        let mut bed = Bed {
            name,
            dir,
            config,
            daemon: Some(daemon),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(s) = bed.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!("spillway run exited ({s}) before ready: {}", bed.log());
            }
            assert!(Instant::now() < deadline, "not ready: {}", bed.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        bed
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    fn status(&self) -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["ctl", "--config"])
            .arg(&self.config)
            .arg("status")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    fn wait_attached(&self, vms: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let s = self.status();
            let ok = vms.iter().all(|vm| {
                s["vm_ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["vm"] == *vm && p["attached"] == true)
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "{vms:?} not attached: {s:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `count` pings from `a` to `b` at `interval_ms`: (lost, RTTs in ms).
    fn ping(&self, count: u32, interval_ms: u32) -> (u32, Vec<f64>) {
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("{}-a", self.name), "ping", "-n"])
            .args(["-c", &count.to_string()])
            .args(["-i", &format!("0.{interval_ms:03}")])
            .args(["-W", "1", "10.68.0.2"])
            .output()
            .expect("ping");
        let text = String::from_utf8_lossy(&out.stdout);
        let rtts: Vec<f64> = text
            .lines()
            .filter_map(|l| l.split("time=").nth(1))
            .filter_map(|t| t.split_whitespace().next()?.parse().ok())
            .collect();
        (count.saturating_sub(rtts.len() as u32), rtts)
    }

    fn stop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signalling our own unreaped child.
            unsafe {
                libc::kill(d.id() as i32, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while d.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        for vm in ["a", "b"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &format!("{}-{vm}", self.name)])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = self.log();
            let tail = log.get(log.len().saturating_sub(8192)..).unwrap_or(&log);
            eprintln!("daemon log (last 8 KiB):\n{tail}");
        }
    }
}

fn counter(s: &serde_json::Value, key: &str) -> u64 {
    s["counters"][key].as_u64().unwrap_or(0)
}

fn p99(rtts: &[f64]) -> f64 {
    let mut v = rtts.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() * 99).div_ceil(100))
        .saturating_sub(1)
        .min(v.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A VM of this test: its memory, doorbells and queues, attached to the DPU's port socket.
struct RawVm {
    mem: VmMemory,
    stream: UnixStream,
    kick: Doorbell,
    _irq: Doorbell,
    queues: [DriverQueue; 3],
}

impl RawVm {
    /// Attaches a fresh memory as `vm` (waits while the DPU keeps the port in quarantine).
    fn attach(tb: &Testbed, vm: &str) -> Option<RawVm> {
        let port = tb.vms.iter().find(|v| v.name == vm).expect("vm").port;
        let layout = VmLayout {
            queue_size: 256,
            buf_bytes: 2048,
            iova_base: (u64::from(port.0) + 1) << 36,
        };
        let mem = VmMemory::create(&format!("hostile-{vm}"), layout).ok()?;
        let kick = Doorbell::new().ok()?;
        let irq = Doorbell::new().ok()?;
        let stream = vmport::attach(&vmport::port_socket(tb, vm), vm, &mem, &kick, &irq).ok()?;
        stream.set_nonblocking(true).ok()?;
        let queues = [
            DriverQueue::new(&mem, QUEUE_TX),
            DriverQueue::new(&mem, QUEUE_RX_DPU),
            DriverQueue::new(&mem, QUEUE_RX_PLANE),
        ];
        Some(RawVm {
            mem,
            stream,
            kick,
            _irq: irq,
            queues,
        })
    }

    /// Posts every free buffer of queue `q` with its descriptor rewritten to `addr` (`None`:
    /// its own buffer) and `flags`; returns how many.
    fn post_all(&mut self, q: usize, addr: Option<u64>, flags: u16) -> usize {
        let mem = &self.mem;
        let dq = &mut self.queues[q];
        while let Ok(Some((id, _))) = dq.reclaim(mem) {
            dq.put_free(id);
        }
        let mut n = 0;
        while let Some(id) = dq.take_free() {
            dq.post(mem, id, 2048);
            // Rewritten after publishing: the device reads the descriptor when it takes it.
            let d = mem.layout().desc_off(q) + 16 * usize::from(id);
            if let Some(a) = addr {
                mem.write_bytes(d, &a.to_le_bytes());
            }
            mem.write_bytes(d + 12, &flags.to_le_bytes());
            n += 1;
        }
        if n > 0 {
            let _ = self.kick.kick();
        }
        n
    }

    /// Whether the DPU closed the port (detached it).
    fn detached(&self) -> bool {
        let mut b = [0u8; 16];
        matches!(
            rustix::net::recv(&self.stream, &mut b, rustix::net::RecvFlags::DONTWAIT),
            Ok((0, _)) | Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET)
        )
    }
}

/// What the attackers did.
#[derive(Default)]
struct Attack {
    on: AtomicBool,
    stop: AtomicBool,
    attaches: AtomicU64,
    flood_bytes: AtomicU64,
    bad_posted: AtomicU64,
}

/// `c`: every receive buffer of both queues at an address outside every region.
fn bad_addresses(tb: Testbed, attack: Arc<Attack>) {
    let outside = 0x1000u64;
    while !attack.stop.load(Ordering::Relaxed) {
        let Some(mut vm) = RawVm::attach(&tb, "c") else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        attack.attaches.fetch_add(1, Ordering::Relaxed);
        while !attack.stop.load(Ordering::Relaxed) && !vm.detached() {
            if attack.on.load(Ordering::Relaxed) {
                let n = vm.post_all(QUEUE_RX_DPU, Some(outside), DESC_F_WRITE)
                    + vm.post_all(QUEUE_RX_PLANE, Some(outside), DESC_F_WRITE);
                attack.bad_posted.fetch_add(n as u64, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// `e`: on odd attaches floods its socket, on even ones keeps 256 chained transmit descriptors
/// posted; attaches again whenever detached.
fn flood_and_loop(tb: Testbed, attack: Arc<Attack>) {
    let chunk = vec![0xa5u8; 64 << 10];
    let mut round = 0u64;
    while !attack.stop.load(Ordering::Relaxed) {
        if !attack.on.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let Some(mut vm) = RawVm::attach(&tb, "e") else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        round += 1;
        attack.attaches.fetch_add(1, Ordering::Relaxed);
        while !attack.stop.load(Ordering::Relaxed) && attack.on.load(Ordering::Relaxed) {
            if round % 2 == 1 {
                match (&vm.stream).write(&chunk) {
                    Ok(n) => {
                        attack.flood_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    Err(_) => break, // detached
                }
            } else {
                let n = vm.post_all(QUEUE_TX, None, DESC_F_NEXT);
                attack.bad_posted.fetch_add(n as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(100));
            }
            if vm.detached() {
                break;
            }
        }
    }
}

#[test]
fn a_hostile_vm_keeps_another_tenants_ping_lossless_and_its_p99_within_twice_quiet() {
    if !spillway_testkit::prerequisites(&["ip", "ping"]) {
        return;
    }
    let mut bed = Bed::start();
    let tb = Testbed::load(&bed.config).expect("testbed");
    bed.wait_attached(&["a", "b"]);
    let attack = Arc::new(Attack::default());
    let threads = [
        {
            let (tb, a) = (tb.clone(), attack.clone());
            std::thread::spawn(move || bad_addresses(tb, a))
        },
        {
            let (tb, a) = (tb.clone(), attack.clone());
            std::thread::spawn(move || flood_and_loop(tb, a))
        },
    ];
    // `d` sends UDP to `c` all along (5,000 pps over 16 flows). Each attack round restarts it
    // with fresh source ports: new connections are the active plane's, so it meets `c`'s bad
    // receive buffers itself (vATC), not only the DPU once the flows are recalled.
    let mut sender = Guard(start_sender(&bed.config, 10_000));
    bed.wait_attached(&["a", "b", "c", "d"]);
    // Warm up: the connection a -> b exists, the plane has it.
    let (lost, _) = bed.ping(20, 10);
    assert_eq!(lost, 0, "warm-up pings lost: {}", bed.log());

    let (mut quiet, mut hostile) = (Vec::new(), Vec::new());
    let mut lost_under_attack = 0;
    let mut before = serde_json::Value::Null;
    for round in 0..3 {
        attack.on.store(false, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        let (lost, rtts) = bed.ping(400, 5);
        assert_eq!(lost, 0, "quiet round {round}: pings lost");
        quiet.push(p99(&rtts));
        if round == 0 {
            before = bed.status();
        }
        attack.on.store(true, Ordering::Relaxed);
        drop(sender);
        sender = Guard(start_sender(&bed.config, 20_000 + 1_000 * round as u16));
        std::thread::sleep(Duration::from_millis(300));
        let (lost, rtts) = bed.ping(400, 5);
        lost_under_attack += lost;
        hostile.push(if rtts.is_empty() {
            f64::MAX
        } else {
            p99(&rtts)
        });
        eprintln!(
            "round {round}: p99 quiet {:.3} ms, under attack {:.3} ms, lost under attack {lost}",
            quiet[round], hostile[round]
        );
    }
    attack.on.store(false, Ordering::Relaxed);
    let after = bed.status();
    attack.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    drop(sender);

    let (q, h) = (median(quiet.clone()), median(hostile.clone()));
    let d = |k: &str| counter(&after, k) - counter(&before, k);
    eprintln!(
        "p99 RTT a->b: quiet {quiet:.3?} (median {q:.3} ms), under attack {hostile:.3?} \
         (median {h:.3} ms); attaches {}, socket flood {} MB, bad descriptors posted {}; \
         detached bad_desc {} socket_flood {}, turn budgets {}, bad descriptors {}, \
         translate requests {}, plane unmapped {}",
        attack.attaches.load(Ordering::Relaxed),
        attack.flood_bytes.load(Ordering::Relaxed) >> 20,
        attack.bad_posted.load(Ordering::Relaxed),
        d("rt.vm.detached.bad_desc"),
        d("rt.vm.detached.socket_flood"),
        d("rt.vm.desc.turn_budget"),
        d("rt.vm.desc.bad"),
        d("rt.atc.requests"),
        after["plane"]["stats"]["counters"]["atc.unmapped"],
    );
    eprintln!(
        "ports {}\nplane {}",
        after["vm_ports"], after["plane"]["stats"]["counters"]
    );
    assert_eq!(lost_under_attack, 0, "pings lost under attack");
    assert!(
        h <= 2.0 * q + 1.0,
        "median p99 under attack {h:.3} ms, quiet {q:.3} ms (allowed: 2x + 1 ms)"
    );
    assert!(d("rt.vm.detached.bad_desc") >= 1, "{after:#}");
    assert!(d("rt.vm.detached.socket_flood") >= 1, "{after:#}");
    assert!(d("rt.vm.desc.turn_budget") >= 1, "{after:#}");
    // The attack on `c` landed (thousands of packets into bad buffers, each refused and
    // counted), and stayed under the detach threshold: bounded, not punished.
    let c = after["vm_ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["vm"] == "c")
        .cloned()
        .unwrap_or_default();
    assert!(
        c["attached"] == true && c["bad_desc"].as_u64().unwrap_or(0) >= 1000,
        "{c:#}"
    );
    // The plane met the bad buffers too (new connections are its own to deliver) and asked for
    // a translation per gap, not per packet: the negative cache answers the rest.
    let plane = |k: &str| {
        after["plane"]["stats"]["counters"][k].as_u64().unwrap_or(0)
            - before["plane"]["stats"]["counters"][k]
                .as_u64()
                .unwrap_or(0)
    };
    assert_eq!(
        d("rt.plane.starts"),
        0,
        "the plane was restarted during the test (fail-open): {:#}",
        after["events"]
    );
    assert!(plane("plane.vatc.bad_desc") >= 1000, "{after:#}");
    assert!(plane("atc.unmapped") >= 1000, "{after:#}");
    assert!(
        d("rt.atc.requests") <= 100,
        "{} translation requests for {} refused deliveries",
        d("rt.atc.requests"),
        plane("plane.vatc.bad_desc")
    );
    assert_eq!(
        plane("plane.drop.vswitch") + plane("plane.drop.ring_full"),
        0,
        "{after:#}"
    );
    bed.stop();
}

/// `d`: UDP to `c` at 5,000 pps from 16 source ports starting at `sport_base`.
fn start_sender(config: &Path, sport_base: u16) -> Child {
    Command::new(BIN)
        .args(["vm-endpoint", "--config"])
        .arg(config)
        .args(["--vm", "d", "--buf-bytes", "2048", "--log", "warn"])
        .args([
            "--mode",
            "gen",
            "--dst",
            "c",
            "--pps",
            "5000",
            "--duration",
            "60",
        ])
        .args(["--sport-base", &sport_base.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vm-endpoint")
}

/// Kills the child when dropped (a failed assertion must not leave the generator running).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
